"""The locked-clocks actuator: the policy's level as a locked maximum graphics clock.

    journal = ClockJournal(state_dir)            # clocks/<uuid>.json, like the limits
    locker = ClockLocker(backend, uuid, log=events.append, journal=journal)
    locker.start()                               # the original lock (journal first); a
                                                 # GPU a dead run left locked is put back
    locker.apply(None, "fan_stall", level=WARN)  # lock at 0.80 x max, snapped
    locker.restore("module healthy")             # back to the original (idempotent)
    locker.close()                               # on_exit="restore" (default) or "keep"

For GPUs whose power limit cannot be set (NotSupported, common on consumer cards) and
where a clock reacts faster than the power limiter (docs/bridge.md, "Locked clocks").

**The mapping** (``ClockFractions``, config ``[clocks]``): WARN locks the graphics clock
at ``warn_fraction`` (0.80) of the GPU's maximum, CRITICAL at ``critical_fraction``
(0.50), each snapped down to the highest supported clock at or below it (on the H200:
1980 MHz max -> WARN 1575 MHz, CRITICAL 990 MHz). A power target without a raised level
(the PSU guard) locks at the WARN clock. The lock's minimum is the lowest supported
clock, so an idle GPU still clocks down. A lock is never above the original lock.

**Crash safety**, as for power limits: before any lock is written the original
(``null`` = unlocked, or the operator's ``[min, max]``) and the intended max are
journaled and fsync'd (no journal, no write). On start a journaled GPU is put back to
its original first. A journal entry that is corrupt, names another GPU or holds
impossible clocks is set aside and the GPU is **unlocked** (reset): the driver's
default is never below any original and never above the defaults, so a bad journal
can neither leave clocks locked lower than the journal's original nor raise anything
above defaults. A journaled lock above the GPU's max clock means "unlocked".

**The current state is the truth, where the backend can read it.** The virtual GPU
reports the lock in force (``ClockState.lock_known``); NVML and nvidia-smi cannot read
a lock back, so there the original without a journal entry is "unlocked" and an
external change is seen as a graphics clock above the lock we set (someone reset or
raised it). Either is an ``external`` event: not holding, the operator's lock becomes
the original; holding, it becomes the restore target and our lower lock is written
again at the next decision.

Refused writes (ClocksRefused, GpuNoPermission) and failed ones (the journal refused, the
GPU unreachable) back off 1 s doubling to 5 min with one alert per episode, like the power
limit's (a different write, such as the restore after an all-clear, is tried at once);
``dry_run`` logs and writes nothing. Events are ``clocks`` records
with the fields of ``power_limit`` ones (``gpu_uuid``, ``level``, ``action``,
``reason``, ``message``, ``dry_run``) and MHz numbers (``target_mhz``, ``locked``,
``original``, ``current_mhz``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from modbridge.actuator.journal import ClockJournal, JournalError
from modbridge.actuator.power import (
    ActuatorBase,
    ApplyResult,
    restore_each,
)
from modbridge.gpu.base import ClocksRefused, ClockState, GpuBackend, GpuError, GpuNoPermission

_log = logging.getLogger(__name__)

WARN, CRITICAL = 1, 2  # modbridge.policy.engine levels (not imported: no cycle)


@dataclass(frozen=True)
class ClockFractions:
    """Fractions of the max graphics clock each level locks at (config ``[clocks]``)."""

    warn_fraction: float = 0.80
    critical_fraction: float = 0.50

    def __post_init__(self):
        if not 0.0 < self.critical_fraction <= self.warn_fraction < 1.0:
            raise ValueError(
                "clocks: need 0 < critical_fraction <= warn_fraction < 1, got "
                f"{self.critical_fraction} and {self.warn_fraction}"
            )

    def for_level(self, level: int | None, target_w) -> float | None:
        """The fraction for a decision (None: no lock wanted)."""
        if level is not None and level >= CRITICAL:
            return self.critical_fraction
        if (level is not None and level >= WARN) or target_w is not None:
            return self.warn_fraction
        return None


def _fmt(lock) -> str:
    return "unlocked" if lock is None else f"{lock[0]}..{lock[1]} MHz"


class ClockLocker(ActuatorBase):
    """Owns one GPU's locked graphics clocks. See the module docstring."""

    EVENT = "clocks"
    WHAT = "clock-lock"

    def __init__(self, backend: GpuBackend, uuid: str, journal: ClockJournal | None = None,
                 fractions: ClockFractions | None = None, **common):  # fmt: skip
        super().__init__(backend, uuid, **common)  # dry_run, on_exit, log, clock...
        self.journal = journal
        self.fractions = fractions or ClockFractions()
        self.state: ClockState | None = None  # as last read
        self.original: tuple[int, int] | None = None  # the restore target (None: unlocked)
        self.locked: tuple[int, int] | None = None  # what we believe is in force
        self.started = False
        self._dry_lock: tuple[int, int] | None = None
        self.original_w = None  # not a power actuator: the policy uses the GPU's default

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Read the clocks and the original lock: the journaled one (checked) if there is
        one, else the lock in force (unlocked where it cannot be read). A journaled GPU
        is put back to its original first; an unusable entry unlocks it. Raises
        GpuError (ClocksRefused ``not_supported``) when the clocks cannot be read."""
        with self._lock:
            st = self.backend.clock_state(self.uuid)
            self.state = st
            self._closed = False
            self.started = True
            found = st.locked if st.lock_known else None
            entry, problem = self._journal_entry()
            if problem is None and entry is None:
                self.original = self.locked = found
                self._touched = False
                if found is not None:
                    self._event("alert", "start", "start",
                                f"the clocks are locked at {_fmt(found)} and no journal entry "
                                "says why (an operator, or a run without a state directory): "
                                f"kept as the original (unlock with `nvidia-smi -i {self.uuid} "
                                "-rgc`)", original=list(found))  # fmt: skip
                return
            if problem is not None:
                self._event("alert", "journal", "start",
                            f"clock journal entry unusable ({problem}): unlocking the clocks "
                            "(the default is never below any original)")  # fmt: skip
                original = None
            else:
                original = self._checked(entry.original, st)
            self.original = original
            if st.lock_known and found == original:
                self.locked = found
                self._touched = False
                self._clear_journal()
                return
            self.locked = found if st.lock_known else None
            self._touched = True
            self._event("alert", "start", "start",
                        f"a previous run may have died holding the clocks (now "
                        f"{_fmt(found) if st.lock_known else 'unknown'}): restoring the "
                        f"original, {_fmt(original)}, first",
                        original=None if original is None else list(original))  # fmt: skip
            if self.dry_run:
                self._dry_lock = self.locked
            else:
                self.restore("start: journaled original", force=True)

    def _journal_entry(self):
        if self.journal is None:
            return None, None
        try:
            return self.journal.read(self.uuid, quarantine=not self.dry_run)
        except JournalError as e:
            return None, str(e)

    def _checked(self, original, st: ClockState):
        """A journaled lock made safe: snapped *up* to supported clocks (never lowered);
        a max at or above the GPU's max is "unlocked"."""
        if original is None:
            return None
        hi = st.snap_up(original[1])
        if hi >= st.max_mhz:
            return None
        lo = min(st.snap_up(original[0]), hi)
        if (lo, hi) != tuple(original):
            self._event("alert", "journal", "start",
                        f"journaled lock {_fmt(original)} is not on the GPU's supported "
                        f"clocks: {_fmt((lo, hi))} used instead")  # fmt: skip
        return (lo, hi)

    def wants(self, level: int, target_w) -> bool:
        """Does this decision ask for a lock (else: restore)? WARN and above do, and a
        power target (the PSU guard) does."""
        return self.fractions.for_level(level, target_w) is not None

    def target_mhz(self, level: int | None, target_w=None) -> int | None:
        """The lock's max clock for a decision (None: none), never above the original."""
        fraction = self.fractions.for_level(level, target_w)
        if fraction is None or self.state is None:
            return None
        mhz = self.state.snap_down(fraction * self.state.max_mhz)
        ceiling = self.state.max_mhz if self.original is None else self.original[1]
        return mhz if mhz < ceiling else None

    def _lock_for(self, mhz: int) -> tuple[int, int]:
        """``(lowest supported, mhz)``: an idle GPU still clocks down (an operator's
        minimum comes back with the original)."""
        return (min(self.state.min_mhz, mhz), mhz)

    # ------------------------------------------------------------------ the truth

    def observe(self, sample=None) -> None:
        """While a lock of ours is held: re-read the clocks and adopt an external change
        (the GPU sample carries no clocks: one clock read per tick, only when holding)."""
        with self._lock:
            if self._touched and not self.dry_run and self.started:
                self._reread()

    def _read_now(self) -> ClockState:
        return self.backend.clock_state(self.uuid)

    def _adopt(self, st: ClockState) -> None:
        self.state = st
        if st.lock_known:
            if st.locked == self.locked:
                return
            actual, what = st.locked, f"the lock is now {_fmt(st.locked)}"
        elif self._touched and self.locked is not None and st.current_mhz is not None and (
            st.current_mhz > self.locked[1]
        ):
            actual, what = None, (f"the graphics clock reads {st.current_mhz} MHz, above our "
                                  f"lock's {self.locked[1]} MHz: the lock is gone")  # fmt: skip
        else:
            return
        self.external_changes += 1
        held, before = self.locked if self._touched else None, self.original
        self.locked = actual
        self.original = actual
        if held is not None and (actual is None or actual[1] > held[1]):
            kept = f"{_fmt(held)} is written again while the cause lasts"
            jerr = self._journal_write(actual, held[1])
            if jerr is not None:
                kept += f" (journal: {jerr})"
        else:
            kept = "it is the original now"
            self._touched = False
            self._dry_lock = None
            self._clear_journal()
        self._event("alert" if held is not None else "info", "external", "external change",
                    f"the clocks changed outside modbridge: {what} (was original "
                    f"{_fmt(before)}); {kept}",
                    original=None if actual is None else list(actual),
                    current_mhz=st.current_mhz)  # fmt: skip

    # ------------------------------------------------------------------ decisions

    def apply(self, target_w, reason: str, values: dict | None = None,
              level: int | None = None) -> ApplyResult:  # fmt: skip
        """Lock the clocks for ``level`` (or a power target: the WARN clock). Never
        raises a GpuError; ``requested_w``/``clamped_w`` of the result carry MHz."""
        with self._lock:
            self._trying = ("lower", self.fractions.for_level(level, target_w))
            if not self.started:
                try:
                    self.start()
                except GpuError as e:
                    return self._failed(None, reason, e)
            if self._in_backoff():
                return ApplyResult(None, None, None, False, None, "backoff")
            err = None if self.dry_run else self._reread()
            if err is not None:
                return self._failed(None, reason, err)
            mhz = self.target_mhz(level, target_w)
            if mhz is None:
                return self.restore(reason) or ApplyResult(None, None, None, False, None)
            lock = self._lock_for(mhz)
            believed = self._dry_lock if self.dry_run else self.locked
            if believed == lock:
                return ApplyResult(mhz, mhz, mhz, False, None, "skip")
            return self._write(lock, "lower", reason, values)

    def restore(self, reason: str = "restore", force=False) -> ApplyResult | None:
        """Put the original lock back (unlock, or the operator's) if we hold one."""
        with self._lock:
            if not self.started or not (self._touched or self._dry_lock is not None):
                return None
            self._trying = "restore"
            if not force and self._in_backoff():
                return ApplyResult(None, None, None, False, None, "backoff")
            if not self.dry_run:
                self._reread()  # unreadable: try the write anyway, it is the way back
                if not self._touched:
                    return None  # an operator's change put it back meanwhile
            return self._write(self.original, "restore", reason, None)

    def _write(self, lock, action, reason, values) -> ApplyResult:
        mhz = None if lock is None else lock[1]
        numbers = {"target_mhz": mhz, "locked": None if lock is None else list(lock),
                   "original": None if self.original is None else list(self.original),
                   **({"values": values} if values else {})}  # fmt: skip
        what = f"clocks {action}: {_fmt(lock)}"
        if self.dry_run:
            self._dry_lock = None if action == "restore" else lock
            self.actions_total["dry_run"] += 1
            self._event("info", "dry_run", reason, f"dry run: would set {what} ({reason})",
                        **numbers)  # fmt: skip
            return ApplyResult(mhz, mhz, None, False, None, "dry_run")
        if action == "lower":
            jerr = self._journal_write(self.original, mhz)
            if jerr is not None:  # no journal, no write: a crash would lose the original
                return self._failed(mhz, reason, jerr)
        try:
            if lock is None:
                st = self.backend.reset_locked_clocks(self.uuid)
            else:
                st = self.backend.set_locked_clocks_mhz(self.uuid, lock[0], lock[1])
        except (ClocksRefused, GpuNoPermission) as e:
            self._refused(e, reason, f"clock lock {_fmt(lock)}", **numbers)
            if not self._touched:
                self._clear_journal()  # the driver said no: nothing of ours to undo
            return ApplyResult(mhz, mhz, None, False, str(e), "refused")
        except GpuError as e:
            return self._failed(mhz, reason, e)
        self.state = st
        if st.lock_known and st.locked != lock:
            e = ClocksRefused(f"set {_fmt(lock)} but the GPU reads {_fmt(st.locked)}", mhz)
            self.locked = st.locked
            self._refused(e, reason, f"clock lock {_fmt(lock)}", **numbers)
            return ApplyResult(mhz, mhz, None, False, str(e), "refused")
        self.locked = lock
        self.last_write_ts = self._clock()
        self._touched = action != "restore"
        if action == "restore":
            self._clear_journal()  # the original is in force again
        self.actions_total[action] += 1
        self._end_episode(reason)
        self._event("info", action, reason, f"{what} ({reason})",
                    current_mhz=st.current_mhz, **numbers)  # fmt: skip
        return ApplyResult(mhz, mhz, st.current_mhz, True, None, action)

    def _failed(self, mhz, reason, err) -> ApplyResult:
        self._fault("failed", err, reason,
                    f"clock lock {'' if mhz is None else f'{mhz} MHz '}not written",
                    target_mhz=mhz, state=getattr(err, "state", "journal"))  # fmt: skip
        return ApplyResult(mhz, mhz, None, False, str(err), "failed")

    def _keep_message(self) -> str:
        return (f"keeping the clocks at {_fmt(self.locked)} (on_exit=keep; the journal keeps "
                "the original for the next start or `modbridge restore`)")  # fmt: skip

    def counters(self) -> dict:
        """Numbers for the exporter (MHz, wall-clock seconds, counts)."""
        st = self.state
        return {
            "uuid": self.uuid,
            "max_mhz": None if st is None else st.max_mhz,
            "locked": self.locked,
            "original": self.original,
            **self._common_counters(),
        }


def restore_journaled_clocks(backend: GpuBackend, state_dir, dry_run=False, log=None) -> list:
    """``modbridge restore`` for clocks: every GPU in ``clocks/`` back to its original
    lock (an unusable entry: unlocked), each under its GPU lock. One dict per entry:
    ``uuid``, ``actuator`` ("clocks"), ``original``, ``action`` (restored,
    would_restore, at_original, refused, busy, missing), ``ok``, ``message``."""
    journal = ClockJournal(state_dir)

    def restore_one(uuid, sink, events):
        row = {"uuid": uuid, "actuator": "clocks", "original": None}
        locker = ClockLocker(backend, uuid, dry_run=dry_run, log=sink, journal=journal)
        try:
            locker.start()
        except GpuError as e:
            return {**row, "action": "missing", "ok": False,
                    "message": f"GPU {uuid} clocks cannot be read ({e}): not restored; "
                               "the journal entry is kept"}  # fmt: skip
        row["original"] = None if locker.original is None else list(locker.original)
        target = _fmt(locker.original)
        if dry_run and locker.holding:
            return {**row, "action": "would_restore", "ok": True,
                    "message": f"would restore {target}"}  # fmt: skip
        if locker.holding:
            msg = next((e["message"] for e in reversed(events)
                        if e.get("level") == "alert"), "restore refused")  # fmt: skip
            return {**row, "action": "refused", "ok": False, "message": msg}
        restored = any(e.get("action") == "restore" for e in events)
        return {**row, "action": "restored" if restored else "at_original", "ok": True,
                "message": f"clocks {target}"}  # fmt: skip

    def blank():
        return {"actuator": "clocks", "original": None}

    return restore_each(journal, state_dir, "clocks", log, restore_one, blank,
                        backend.owner_key)
