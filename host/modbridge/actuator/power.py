"""The power-limit actuator: the only code in modbridge that changes a GPU setting.

    journal = LimitJournal(state_dir)     # modbridge.actuator.journal: the originals, on disk
    limiter = PowerLimiter(backend, uuid, log=events.append, journal=journal)
    limiter.start()                      # the original (journaled one first), constraints;
                                         # a GPU found below its journaled original is
                                         # restored here, before anything else
    limiter.observe(sample)              # every tick: the current limit is the truth
    limiter.apply(450, "module over-temperature", {"gpu_c": 84.0})
    limiter.restore("module healthy")    # back to the original (idempotent)
    limiter.close()                      # on_exit="restore" (default) or "keep"
    install_signal_handlers([limiter])   # SIGTERM/SIGINT/SIGHUP/SIGQUIT/exit restore too

Crash safety (docs/bridge.md, "Power limits: journal, restore, ownership"): before any
write that takes the limit below the original, the original and the intended limit
are journaled and fsync'd; a journal that cannot be written means no write. The entry
is cleared only once the original is read back as enforced. A journaled original is
never trusted above ``min(default limit, max constraint)``.

The current limit is the truth: the limit is re-read before every write, and
:meth:`observe` compares every tick's reading with what the limiter believes. An
external change (``nvidia-smi -pl 400``) is an ``external`` event; the operator's value
becomes the original (the restore target). While a lowered limit is held, the lower of
the two is kept (the next decision writes the hold again if the operator raised it).
A target is never above the original, so a "lower" can never raise the limit.

Targets are clamped to the GPU's constraints, a write within 1 W of the current limit
is skipped, and the enforced limit is read back after every write. A refused write
(PowerLimitRefused, GpuNoPermission) is an alert event and a count, never an exception
for the caller: the bridge keeps running and the module keeps cooling. Refusals and
failures (the GPU unreachable, the journal refused) back off exponentially (1 s doubling
to 5 min, for that write only: the restore after an all-clear is tried at once) with one
alert per episode; the first write that works ends the episode (a ``recovered`` event).
An operator's limit below the default found at start is the baseline (an ``info``
event), not a fault. ``dry_run`` logs every decision
and writes nothing (not even the journal).

Events go to ``log``: an :class:`modbridge.exporter.eventlog.EventLog` (``write("power_limit",
**fields)``) or any callable taking a dict (``{"event": "power_limit", **fields}``).
Fields: ``gpu_uuid``, ``level`` (``info``/``alert``), ``action`` (lower, restore,
refused, dry_run, failed, keep, start, journal, external, recovered), ``reason``,
``message``, ``dry_run`` and the numbers (``requested_w``, ``clamped_w``,
``current_w``, ``original_w``, ``enforced_w``, ``values``). Everything is also logged
through :mod:`logging`.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass

from modbridge.actuator.journal import JournalError, LimitJournal
from modbridge.gpu.base import GpuBackend, GpuError, GpuNoPermission, GpuSample, PowerLimitRefused

_log = logging.getLogger(__name__)

SKIP_BAND_W = 1.0  # a target within this of the current limit is not written
ON_EXIT = ("restore", "keep")
BACKOFF_FIRST_S = 1.0  # a refused write or restore is tried again after this...
BACKOFF_MAX_S = 300.0  # ...doubling up to this, until one works


def _ending_signals() -> tuple[int, ...]:
    """Every signal whose default action ends the process and that a handler can
    catch: TERM, INT, QUIT, USR1, USR2, ALRM, the timers, XCPU, PWR, IO, the realtime
    ones, and HUP (the bridge does not reload: it stops like TERM). Not the faults of
    the process itself (SEGV, BUS, FPE, ILL, TRAP, SYS, ABRT: Python cannot go on after
    them; the journal covers them, as it covers SIGKILL), nor PIPE and XFSZ (Python
    ignores them: the write fails instead)."""
    names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
             "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGPWR", "SIGIO", "SIGSTKFLT")  # fmt: skip
    sigs = [getattr(signal, n) for n in names if hasattr(signal, n)]
    if hasattr(signal, "SIGRTMIN"):
        sigs += [signal.Signals(n) if n in (signal.SIGRTMIN, signal.SIGRTMAX) else n
                 for n in range(signal.SIGRTMIN, signal.SIGRTMAX + 1)]  # fmt: skip
    return tuple(dict.fromkeys(sigs))


SIGNALS = _ending_signals()  # every one restores the limits like SIGTERM (docs/bridge.md)


def signal_name(signum: int) -> str:
    """``SIGTERM``; a realtime signal as ``SIGRTMIN+3``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


@dataclass
class ApplyResult:
    """What one ``apply``/``restore`` did. ``action``: lower, restore, refused, dry_run,
    failed (the GPU could not be reached, or the journal not written), backoff (a
    refusal a moment ago: not tried) or skip (already there)."""

    requested_w: float | None
    clamped_w: float | None
    enforced_w: float | None
    wrote: bool
    error: str | None = None
    action: str = "skip"


class ActuatorBase:
    """What every actuator (power limit, locked clocks) shares: identity, dry run and
    ``on_exit``, the event sink, refusal back-off with one alert per episode, and the
    counters the bridge reads. ``EVENT`` is the event-log kind, ``WHAT`` the word in
    messages."""

    EVENT = "power_limit"
    WHAT = "power-limit"

    def __init__(
        self,
        backend: GpuBackend,
        uuid: str,
        dry_run=False,
        on_exit="restore",
        log=None,
        clock=time.time,
        monotonic=time.monotonic,
        backoff_first_s: float = BACKOFF_FIRST_S,
        backoff_max_s: float = BACKOFF_MAX_S,
    ):
        if on_exit not in ON_EXIT:
            raise ValueError(f"on_exit must be one of {ON_EXIT}, got {on_exit!r}")
        self.backend = backend
        self.uuid = uuid
        self.dry_run = dry_run
        self.on_exit = on_exit
        self._emit = log
        self._clock = clock
        self._mono = monotonic
        self.backoff_first_s = backoff_first_s
        self.backoff_max_s = backoff_max_s
        self.backoff_s = 0.0  # the current back-off delay (0: not in a refusal episode)
        self._retry_at: float | None = None
        self.episode_refusals = 0  # refused or failed writes in the current episode
        self._retry_what = None  # what was refused/failed (another write is tried at once)
        self._trying = None  # what the current apply/restore writes: ("lower", x), "restore"
        # True while an owner alerts for this actuator instead (Combined's fallback: one
        # alert for the episode of both members); the events are written at level info
        self.quiet = False
        self.external_changes = 0
        self._lock = threading.RLock()  # the signal handler may restore mid-apply
        self.last_write_ts: float | None = None  # wall clock of the last successful write
        self.actions_total: Counter = Counter()
        self.refused_total = 0
        self._touched = False  # we hold a setting below the original
        self._closed = False
        self.journal = None  # the subclass's journal (LimitJournal, ClockJournal)

    @property
    def holding(self) -> bool:
        """A setting of ours below the original is in force (or was, in a dry run)."""
        return self._touched

    def _event(self, level, action, reason, message, **numbers):
        fields = {
            "gpu_uuid": self.uuid,
            "level": level,
            "action": action,
            "reason": reason,
            "message": message,
            "dry_run": self.dry_run,
            **numbers,
        }
        (_log.warning if level == "alert" else _log.info)("%s: %s", self.uuid, message)
        if self._emit is None:
            return
        try:
            if hasattr(self._emit, "write"):  # an eventlog.EventLog
                self._emit.write(self.EVENT, **fields)
            else:
                self._emit({"event": self.EVENT, **fields})
        except Exception:  # noqa: BLE001 - a broken sink must not stop the actuator
            _log.exception("%s event sink failed", self.WHAT)

    def _reread(self) -> GpuError | None:
        """Read the GPU now (the truth) before a decision, and adopt what it says
        (``_read_now``, ``_adopt``); the error if it cannot be read."""
        try:
            reading = self._read_now()
        except GpuError as e:
            return e
        self._adopt(reading)
        return None

    def _journal_write(self, original, intended) -> JournalError | None:
        """Journal the original before a write (the error, if it cannot: no write)."""
        if self.journal is None or self.dry_run:
            return None
        try:
            self.journal.record(self.uuid, original, intended)
        except JournalError as e:
            return e
        return None

    def _clear_journal(self) -> None:
        if self.journal is None or self.dry_run:
            return
        try:
            self.journal.clear(self.uuid)
        except JournalError as e:
            self._event("alert", "journal", "clear", str(e))

    def _common_counters(self) -> dict:
        """The counters every actuator has (for ``counters()``)."""
        return {
            "last_write_ts": self.last_write_ts,
            "actions_total": dict(self.actions_total),
            "refused_total": self.refused_total,
            "dry_run": self.dry_run,
            "holding": self._touched,
            "backoff_s": self.backoff_s,
            "external_changes": self.external_changes,
        }

    def _in_backoff(self, what=None) -> bool:
        """Is ``what`` (``self._trying`` if None) the write that was refused or failed a
        moment ago, its back-off not over? Another write (the restore after an
        all-clear, a deeper cut) is tried at once."""
        what = self._trying if what is None else what
        return (self._retry_at is not None and self._mono() < self._retry_at
                and what == self._retry_what)  # fmt: skip

    def _refused_backoff(self) -> bool:
        """Count a refused or failed write and push the next try of it out; True for an
        episode's first."""
        first = self.episode_refusals == 0
        self.episode_refusals += 1
        self.backoff_s = (
            self.backoff_first_s if first else min(self.backoff_max_s, self.backoff_s * 2)
        )
        self._retry_at = self._mono() + self.backoff_s
        self._retry_what = self._trying
        return first

    def _refused(self, err, reason, what, **numbers) -> None:
        """A refused write (the driver said no): see :meth:`_fault`."""
        self.refused_total += 1
        self._fault("refused", err, reason, f"{what} refused",
                    not_supported=bool(getattr(err, "not_supported", False)),
                    **numbers)  # fmt: skip

    def _fault(self, action, err, reason, what, **numbers) -> None:
        """A write that did not happen (``refused``; ``failed``: the GPU could not be
        reached, or the journal not written): counted, backed off (1 s doubling to
        5 min, for that write only), alerted once per episode: refusals and failures
        are one episode, which the next write that works ends (``recovered``)."""
        self.actions_total[action] += 1
        if self._refused_backoff():
            self._event(
                "info" if self.quiet else "alert",
                action,
                reason,
                f"{what} ({reason}): {err}; retrying after {self.backoff_s:g} s, "
                f"doubling up to {self.backoff_max_s:g} s (one alert per episode)",
                backoff_s=self.backoff_s,
                **numbers,
            )
        else:
            _log.debug("%s: %s again (%d in this episode, next try in %g s): %s", self.uuid,
                       action, self.episode_refusals, self.backoff_s, err)  # fmt: skip

    def _end_episode(self, reason) -> None:
        if self.episode_refusals:
            self._event(
                "info",
                "recovered",
                reason,
                f"{self.WHAT} writes work again after {self.episode_refusals} refusal(s)",
                refusals=self.episode_refusals,
            )
        self.episode_refusals = 0
        self.backoff_s = 0.0
        self._retry_at = None
        self._retry_what = None

    def close(self, reason: str = "exit"):
        """Obey ``on_exit``: restore the original, or keep the current setting."""
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            if self.on_exit == "restore":
                return self.restore(reason, force=True)
            if self._touched:
                self._event("info", "keep", reason, self._keep_message(),
                            **self._keep_numbers())  # fmt: skip
            return None

    def restore(self, reason: str = "restore", force=False):  # pragma: no cover - abstract
        raise NotImplementedError

    def _keep_message(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _keep_numbers(self) -> dict:
        return {}


class PowerLimiter(ActuatorBase):
    """Owns one GPU's power limit. See the module docstring. Keywords besides
    ``journal``: :class:`ActuatorBase`'s (``dry_run``, ``on_exit``, ``log``, ``clock``,
    ``monotonic``, ``backoff_first_s``, ``backoff_max_s``)."""

    EVENT = "power_limit"
    WHAT = "power-limit"

    def __init__(self, backend: GpuBackend, uuid: str, journal: LimitJournal | None = None,
                 **common):  # fmt: skip
        super().__init__(backend, uuid, **common)
        self.journal = journal
        self.original_w: float | None = None
        self.min_w: float | None = None
        self.max_w: float | None = None
        self.default_w: float | None = None
        self.current_w: float | None = None  # the enforced limit, as last read
        self._dry_target_w: float | None = None

    def wants(self, level: int, target_w: float | None) -> bool:
        """Does this decision ask for a lower limit (else: restore)? The power limiter
        follows the policy's target in W."""
        return target_w is not None

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Save the constraints and the original limit: the journaled one (clamped to
        ``min(default, max)``) if there is one, else the enforced limit now. A GPU
        found below its journaled original is restored first; the entry is cleared
        once the restore reads back as enforced. Raises GpuError when the GPU cannot
        be read (nothing can be restored without the original)."""
        with self._lock:
            sample = self.backend.sample(self.uuid)
            if sample.enforced_limit_w is None:
                raise GpuError(
                    f"GPU {self.uuid} does not report its power limit: the power-limit "
                    "actuator cannot run (use --dry-run, or a GPU with power management)"
                )
            self.current_w = sample.enforced_limit_w
            self.min_w, self.max_w = sample.min_limit_w, sample.max_limit_w
            self.default_w = sample.default_limit_w
            self._closed = False
            journaled = self._journaled_original()
            if journaled is None:
                self.original_w = self.current_w
                self._touched = False
                self._warn_below_default()
                return
            if self.current_w >= journaled - SKIP_BAND_W:
                # at (or above: the operator raised it meanwhile) the journaled original
                self.original_w = self.current_w
                self._touched = False
                self._clear_journal()
                return
            self.original_w = journaled
            self._touched = True
            self._event(
                "alert",
                "start",
                "start",
                f"the limit is {self.current_w:g} W, below the journaled original "
                f"{journaled:g} W (a previous run died holding it): restoring first",
                original_w=journaled,
                current_w=self.current_w,
            )
            if not self.dry_run:
                self.restore("start: journaled original", force=True)
            else:
                self._dry_target_w = self.current_w

    def _ceiling_w(self) -> float | None:
        """The highest limit a journal may restore: ``min(default, max constraint)``."""
        caps = [w for w in (self.default_w, self.max_w) if w is not None]
        return min(caps) if caps else None

    def _journaled_original(self) -> float | None:
        """The journal's original for this GPU, checked (None: none usable)."""
        if self.journal is None:
            return None
        try:
            entry, problem = self.journal.read(self.uuid, quarantine=not self.dry_run)
        except JournalError as e:
            entry, problem = None, str(e)
        if problem is not None:
            self._event("alert", "journal", "start", f"journal entry ignored: {problem}")
        if entry is None:
            return None
        original = entry.original_w
        ceiling = self._ceiling_w()
        if ceiling is not None and original > ceiling + SKIP_BAND_W:
            self._event(
                "alert",
                "journal",
                "start",
                f"journaled original {original:g} W (pid {entry.pid}) is above the GPU's "
                f"default/maximum {ceiling:g} W: ignored, {ceiling:g} W used instead",
                journaled_w=original,
                ceiling_w=ceiling,
            )
            original = ceiling
        if self.min_w is not None and original < self.min_w:
            self._event(
                "alert",
                "journal",
                "start",
                f"journaled original {original:g} W is below the GPU's minimum "
                f"{self.min_w:g} W: {self.min_w:g} W used instead",
                journaled_w=original,
            )
            original = self.min_w
        return original

    def _warn_below_default(self) -> None:
        if self.default_w is not None and self.original_w < self.default_w - SKIP_BAND_W:
            self._event(  # the operator's baseline, not a fault: info, never an alert
                "info",
                "start",
                "start",
                f"the limit is {self.original_w:g} W, below the default "
                f"{self.default_w:g} W, and no journal entry says why (set by an operator, "
                "or by a run without a state directory); it is kept as the original "
                f"(reset with `nvidia-smi -i {self.uuid} -pl {self.default_w:g}`)",
                original_w=self.original_w,
                default_w=self.default_w,
            )

    def clamp(self, watts: float) -> float:
        if self.min_w is not None and watts < self.min_w:
            watts = self.min_w
        if self.max_w is not None and watts > self.max_w:
            watts = self.max_w
        return watts

    def observe(self, sample: GpuSample | None) -> None:
        """Compare a fresh reading with what we believe; adopt an external change.

        Not holding: the operator's value becomes the original. Holding a lowered
        limit: the operator's value becomes the restore target; the lower of the two
        is kept (a later decision writes the hold again if it is the lower)."""
        with self._lock:
            if sample is None or sample.state != "ok" or sample.enforced_limit_w is None:
                return
            if self.original_w is None:
                return
            enforced = sample.enforced_limit_w
            believed = self.current_w
            if believed is None or abs(enforced - believed) <= SKIP_BAND_W:
                self.current_w = enforced
                return
            self.external_changes += 1
            old = self.original_w
            held = believed if self._touched else None
            self.current_w = enforced
            self.original_w = enforced
            if held is not None and enforced > held + SKIP_BAND_W and not self.dry_run:
                what = (
                    f"held {held:g} W; the original is now {enforced:g} W, "
                    f"and {held:g} W is kept while the cause lasts"
                )
                self._journal_write(enforced, held)
            else:
                what = f"the original is now {enforced:g} W"
                self._touched = False
                self._dry_target_w = None
                self._clear_journal()
            self._event(
                "alert" if held is not None else "info",
                "external",
                "external change",
                f"the power limit changed outside modbridge: {believed:g} W -> "
                f"{enforced:g} W (was original {old:g} W); {what}",
                current_w=enforced,
                believed_w=believed,
                previous_original_w=old,
                original_w=enforced,
            )

    def _read_now(self):
        return self.backend.sample(self.uuid)

    def _adopt(self, sample) -> None:
        self.observe(sample)

    def _backing_off(self, requested, clamped) -> ApplyResult | None:
        if self._in_backoff():
            return ApplyResult(requested, clamped, self.current_w, False, None, "backoff")
        return None

    def apply(self, target_w: float, reason: str, values: dict | None = None,
              level: int | None = None) -> ApplyResult:  # fmt: skip
        """Set the limit to ``target_w`` (clamped to the constraints, never above the
        original). Never raises a GpuError. ``level`` (the policy's) is for actuators
        that follow levels (the clocks); the limit follows the watts."""
        with self._lock:
            if self.original_w is None:
                try:
                    self.start()
                except GpuError as e:
                    return self._failed(target_w, None, reason, e, values)
            clamped = min(self.clamp(float(target_w)), self.original_w)
            self._trying = ("lower", round(clamped))
            waiting = self._backing_off(target_w, clamped)
            if waiting is not None:
                return waiting
            err = self._reread()
            if err is not None:
                return self._failed(target_w, clamped, reason, err, values)
            clamped = min(clamped, self.original_w)  # the original may have moved
            if clamped >= self.original_w - SKIP_BAND_W:
                # within the skip band of the original: that is a restore, to the
                # original exactly (699 W "restored" would stay 1 W below it for good)
                return self._write(target_w, self.original_w, "restore", reason, values)
            return self._write(target_w, clamped, "lower", reason, values)

    def restore(self, reason: str = "restore", force=False) -> ApplyResult | None:
        """Write the original limit back if we hold a lower one (idempotent).
        ``force``: also while backing off (exit, start)."""
        with self._lock:
            if self.original_w is None:
                return None
            dry_moved = self._dry_target_w is not None and (
                abs(self._dry_target_w - self.original_w) > SKIP_BAND_W
            )
            if not (self._touched or dry_moved):
                return None
            self._trying = "restore"
            if not force:
                waiting = self._backing_off(self.original_w, self.original_w)
                if waiting is not None:
                    return waiting
            if not self.dry_run:
                self._reread()  # unreadable: try the write anyway, it is the way back
                if not self._touched:
                    return None  # an operator's change put it back (or lower) meanwhile
            result = self._write(self.original_w, self.original_w, "restore", reason, None)
            if result.error is None:
                self._touched = False
            return result

    def _keep_message(self) -> str:
        return (f"keeping the power limit at {self.current_w} W (on_exit=keep; the journal "
                "keeps the original for the next start or `modbridge restore`)")  # fmt: skip

    def _keep_numbers(self) -> dict:
        return {"current_w": self.current_w, "original_w": self.original_w}

    # ------------------------------------------------------------------ the write

    def _write(self, requested, clamped, action, reason, values) -> ApplyResult:
        numbers = {
            "requested_w": requested,
            "clamped_w": clamped,
            "current_w": self.current_w,
            "original_w": self.original_w,
            **({"values": values} if values else {}),
        }
        believed = self.current_w
        if self.dry_run and self._dry_target_w is not None:
            believed = self._dry_target_w  # what the limit would be, had we written
        if believed is not None and abs(clamped - believed) <= SKIP_BAND_W:
            return ApplyResult(requested, clamped, self.current_w, False, None, "skip")
        if self.dry_run:
            self._dry_target_w = clamped
            self.actions_total["dry_run"] += 1
            self._event(
                "info",
                "dry_run",
                reason,
                f"dry run: would {action} the power limit to {clamped:g} W ({reason})",
                **numbers,
            )
            return ApplyResult(requested, clamped, self.current_w, False, None, "dry_run")
        if action == "lower":
            jerr = self._journal_write(self.original_w, clamped)
            if jerr is not None:  # no journal, no write: a crash would lose the original
                return self._failed(requested, clamped, reason, jerr, values)
        try:
            enforced = self.backend.set_power_limit_w(self.uuid, clamped)
        except (PowerLimitRefused, GpuNoPermission) as e:
            if isinstance(e, PowerLimitRefused) and e.enforced_w is not None:
                self.current_w = e.enforced_w
                self._touched = e.enforced_w < self.original_w - SKIP_BAND_W
            self._refused(e, reason, f"power limit {clamped:g} W", **numbers)
            if not self._touched:
                self._clear_journal()  # the write did not take: nothing of ours to undo
            return ApplyResult(requested, clamped, self.current_w, False, str(e), "refused")
        except GpuError as e:
            return self._failed(requested, clamped, reason, e, values)
        self.current_w = enforced
        self.last_write_ts = self._clock()
        self._touched = enforced < self.original_w - SKIP_BAND_W
        if not self._touched and abs(enforced - self.original_w) <= SKIP_BAND_W:
            self._clear_journal()  # the original reads back as enforced
        self.actions_total[action] += 1
        self._end_episode(reason)
        self._event(
            "info",
            action,
            reason,
            f"power limit {action}: {clamped:g} W requested, {enforced:g} W enforced ({reason})",
            enforced_w=enforced,
            **numbers,
        )
        return ApplyResult(requested, clamped, enforced, True, None, action)

    def _failed(self, requested, clamped, reason, err, values) -> ApplyResult:
        self._fault(
            "failed",
            err,
            reason,
            f"power limit {clamped if clamped is not None else requested} W not written",
            requested_w=requested,
            clamped_w=clamped,
            state=getattr(err, "state", "journal"),
            **({"values": values} if values else {}),
        )
        return ApplyResult(requested, clamped, self.current_w, False, str(err), "failed")

    # ------------------------------------------------------------------ exporter

    def counters(self) -> dict:
        """Numbers for the exporter (W, wall-clock seconds, counts)."""
        return {
            "uuid": self.uuid,
            "original_w": self.original_w,
            "min_w": self.min_w,
            "max_w": self.max_w,
            "default_w": self.default_w,
            "current_w": self.current_w,
            **self._common_counters(),
        }


def install_signal_handlers(limiters, signals=SIGNALS):
    """Close every limiter (restoring, unless on_exit="keep") on any of :data:`SIGNALS`
    (every signal that would end the process), then exit with 128 + the signal number;
    and at interpreter exit. Main thread only. Returns a function that puts the previous
    handlers back."""
    limiters = list(limiters)

    def close_all(reason):
        for limiter in limiters:
            try:
                limiter.close(reason)
            except Exception:  # noqa: BLE001 - restore the others whatever one does
                _log.exception("closing the power limiter of %s failed", limiter.uuid)

    def handler(signum, frame):
        close_all(f"signal {signal_name(signum)}")
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    atexit.register(close_all, "exit")

    def uninstall():
        for sig, old in previous.items():
            signal.signal(sig, old)
        atexit.unregister(close_all)

    return uninstall


def restore_each(journal, state_dir, event_kind, log, restore_one, blank=dict,
                 owner_key=None) -> list[dict]:  # fmt: skip
    """``modbridge restore``'s loop over one journal: every GPU locked first (a GPU
    owned by a running bridge is ``busy``: its own stop restores it), then
    ``restore_one(uuid, sink, events)`` returns its row; ``sink`` collects the
    actuator's events into ``events`` and forwards them to ``log``. ``blank()`` gives
    the keys a ``busy`` row has too; ``owner_key(uuid)`` the machine-wide lock's name
    (the backend's, :mod:`modbridge.actuator.gpulock`)."""
    from modbridge.actuator.gpulock import GpuBusy, GpuLock

    out = []
    for uuid in journal.uuids():
        events: list[dict] = []

        def sink(ev, events=events):
            events.append(ev)
            if log is not None:
                (log.write(event_kind, **{k: v for k, v in ev.items() if k != "event"})
                 if hasattr(log, "write") else log(ev))  # fmt: skip

        lock = GpuLock(state_dir, uuid, key=owner_key(uuid) if owner_key else None)
        try:
            lock.acquire()
        except GpuBusy as e:
            out.append({**blank(), "uuid": uuid, "action": "busy", "ok": False,
                        "message": str(e)})  # fmt: skip
            continue
        try:
            out.append(restore_one(uuid, sink, events))
        finally:
            lock.release()
    return out


def restore_journaled(backend: GpuBackend, state_dir, dry_run=False, log=None) -> list[dict]:
    """``modbridge restore``: put every journaled GPU back to its original limit,
    without the loop. Each GPU is locked first (a running bridge owns its GPUs: its
    own stop restores them). Returns one dict per journal file: ``uuid``,
    ``original_w``, ``before_w``, ``after_w``, ``action`` (restored, would_restore,
    at_original, refused, busy, missing, ignored) and ``ok``, ``message``."""
    journal = LimitJournal(state_dir)

    def restore_one(uuid, sink, events):
        row = {"uuid": uuid, "original_w": None, "before_w": None, "after_w": None}
        lim = PowerLimiter(backend, uuid, dry_run=dry_run, log=sink, journal=journal)
        try:
            before = backend.sample(uuid).enforced_limit_w
            row["before_w"] = before
            lim.start()
        except GpuError as e:
            return {**row, "action": "missing", "ok": False,
                    "message": f"GPU {uuid} cannot be read ({e}): not restored; "
                               "the journal entry is kept"}  # fmt: skip
        row["original_w"] = lim.original_w
        row["after_w"] = lim.current_w
        problems = [e["message"] for e in events if e.get("action") == "journal"]
        if problems and not any("used instead" in p for p in problems):
            return {**row, "action": "ignored", "ok": False, "message": "; ".join(problems)}
        if dry_run and lim.holding:
            return {**row, "action": "would_restore", "ok": True,
                    "message": f"would restore {lim.original_w:g} W "
                               f"(now {lim.current_w:g} W)"}  # fmt: skip
        if lim.holding:
            msg = next((e["message"] for e in reversed(events)
                        if e.get("level") == "alert"), "restore refused")  # fmt: skip
            return {**row, "action": "refused", "ok": False, "message": msg}
        restored = before is not None and before < lim.original_w - SKIP_BAND_W
        return {**row, "action": "restored" if restored else "at_original", "ok": True,
                "message": "; ".join([*problems, f"{lim.original_w:g} W enforced"])}  # fmt: skip

    def blank():
        return {"original_w": None, "before_w": None, "after_w": None}

    return restore_each(journal, state_dir, "power_limit", log, restore_one, blank,
                        backend.owner_key)
