"""The GPU side of a decision: power-limit writes and locked clocks, their journals, one
owner per GPU.

Every actuator satisfies :class:`Actuator` (the bridge sees nothing else), and
:func:`make_actuator` is the one place one is built for a GPU from the config:

    lim = make_actuator("clocks", backend, uuid, journal=LimitJournal(state_dir))
    lim.start()                                    # journaled originals restored first
    if lim.wants(d.level, d.target_limit_w):
        lim.apply(d.target_limit_w, "fan_stall", d.values, level=d.level)
    else:
        lim.restore("all clear")

``actuator`` per GPU (config ``[bridge] actuator``, ``[[module]] actuator``): ``power``
(the power limit), ``clocks`` (a locked max graphics clock) or ``both``. With
``fallback`` (the default) the other one stands in when the chosen one is refused
(NotSupported: consumer cards cannot set a power limit; NoPermission; a failed
start), with one alert per episode (docs/bridge.md, "Locked clocks").
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Protocol

from modbridge.actuator.clocks import ClockFractions, ClockLocker, restore_journaled_clocks
from modbridge.actuator.journal import ClockJournal, LimitJournal
from modbridge.actuator.power import (
    BACKOFF_MAX_S,
    ApplyResult,
    PowerLimiter,
)
from modbridge.actuator.power import restore_journaled as restore_journaled_limits
from modbridge.gpu.base import GpuError

_log = logging.getLogger(__name__)

ACTUATORS = ("power", "clocks", "both")
_FAILED = ("refused", "failed")
# While the secondary stands in, the primary is tried again after this, doubling up to
# BACKOFF_MAX_S (the secondary protects the GPU meanwhile: no need to hammer a refusal).
FALLBACK_RETRY_S = 30.0


class Actuator(Protocol):
    """What the bridge needs of one GPU's actuator (PowerLimiter, ClockLocker, Combined)."""

    uuid: str
    dry_run: bool
    on_exit: str
    original_w: float | None
    actions_total: Counter
    refused_total: int

    @property
    def holding(self) -> bool: ...

    def start(self) -> None: ...

    def observe(self, sample) -> None: ...

    def wants(self, level: int, target_w: float | None) -> bool: ...

    def apply(self, target_w, reason: str, values: dict | None = None,
              level: int | None = None) -> ApplyResult: ...  # fmt: skip

    def restore(self, reason: str = "restore", force: bool = False) -> ApplyResult | None: ...

    def close(self, reason: str = "exit") -> ApplyResult | None: ...


class Combined:
    """Two actuators on one GPU. ``mode="both"`` drives both on every decision.
    ``mode="only"`` drives the primary alone (the secondary only starts, so that what
    its journal holds is restored, and stops). ``mode="fallback"`` drives the primary
    and, while it is refused (or cannot start), the secondary instead: one
    ``fallback`` alert when an episode begins, one ``fallback_end`` event when the
    primary works again (it is retried after 30 s, doubling to 5 min; the secondary's
    hold is then restored). Attributes it does not have (``current_w``, ``min_w``...)
    are the primary's."""

    def __init__(self, primary, secondary, mode="fallback", log=None, monotonic=time.monotonic,
                 backoff_first_s=FALLBACK_RETRY_S, backoff_max_s=BACKOFF_MAX_S):  # fmt: skip
        if mode not in ("fallback", "both", "only"):
            raise ValueError(f"mode must be fallback, both or only, got {mode!r}")
        self.primary, self.secondary, self.mode = primary, secondary, mode
        self.members = (primary, secondary)
        self._emit = log
        self._mono = monotonic
        self.backoff_first_s, self.backoff_max_s = backoff_first_s, backoff_max_s
        self.fallen = False  # in a fallback episode: the secondary acts
        self._stand_in_failed = False  # the secondary failed in this episode (alerted)
        self.episodes = 0
        self._retry_at: float | None = None
        self._delay = 0.0
        self._started: dict[int, bool] = {}
        self._actions: tuple[int, Counter] = (-1, Counter())  # (members' total, their sum)

    def __getattr__(self, name):
        if name in ("primary", "secondary", "members"):
            raise AttributeError(name)
        return getattr(self.primary, name)

    @property
    def holding(self) -> bool:
        return any(m.holding for m in self.members)

    @property
    def original_w(self):
        for m in self.members:
            if isinstance(m, PowerLimiter):
                return m.original_w
        return None

    @property
    def actions_total(self) -> Counter:
        """Both members' counts, summed again only when one has changed (the bridge
        copies them into its pair every tick; counts only ever go up)."""
        a, b = self.primary.actions_total, self.secondary.actions_total
        n = a.total() + b.total()
        if n != self._actions[0]:
            self._actions = (n, a + b)
        return self._actions[1]

    @property
    def refused_total(self) -> int:
        return self.primary.refused_total + self.secondary.refused_total

    def _event(self, level, action, message, **fields):
        (_log.warning if level == "alert" else _log.info)("%s: %s", self.primary.uuid, message)
        if self._emit is None:
            return
        fields = {"gpu_uuid": self.primary.uuid, "level": level, "action": action,
                  "message": message, **fields}  # fmt: skip
        try:
            if hasattr(self._emit, "write"):
                self._emit.write("actuator", **fields)
            else:
                self._emit({"event": "actuator", **fields})
        except Exception:  # noqa: BLE001 - a broken sink must not stop the actuator
            _log.exception("actuator event sink failed")

    def _start(self, m) -> bool:
        try:
            m.start()
        except GpuError as e:
            self._started[id(m)] = False
            _log.info("%s: %s actuator unavailable: %s", m.uuid, type(m).__name__, e)
            return False
        self._started[id(m)] = True
        return True

    def start(self) -> None:
        """Start both (each restores what its journal holds). Raises the primary's
        GpuError only when neither can start."""
        errors = []
        for m in self.members:
            try:
                m.start()
                self._started[id(m)] = True
            except GpuError as e:
                self._started[id(m)] = False
                errors.append(e)
        if len(errors) == 2:
            raise errors[0]
        if self.mode == "fallback" and not self._started[id(self.primary)] and self._fall():
            self._fell(f"cannot start: {errors[0]}",
                       self._started.get(id(self.secondary)) or self._start(self.secondary))

    def _fall(self) -> bool:
        """The primary failed: the secondary acts until the primary's next try (30 s,
        doubling to 5 min). True when this begins a fallback episode."""
        self._delay = self.backoff_first_s if not self.fallen else min(
            self.backoff_max_s, self._delay * 2)  # fmt: skip
        self._retry_at = self._mono() + self._delay
        if self.fallen:
            return False
        self.fallen = True
        self.episodes += 1
        self._stand_in_failed = False
        return True

    def _fell(self, why: str, stands_in: bool, err: str | None = None) -> None:
        """The episode's one alert, once the secondary has tried: what failed and
        whether the secondary stands in (the members' own events are info meanwhile)."""
        other = type(self.secondary).__name__
        self._stand_in_failed = not stands_in
        self._event("alert", "fallback",
                    f"{type(self.primary).__name__} {why}; "
                    + (f"{other} acts instead" if stands_in
                       else f"{other} cannot stand in either ({err or 'cannot start'})")
                    + f" (the primary is tried again after {self._delay:g} s, doubling; "
                    "one alert per episode)", stands_in=bool(stands_in),
                    primary=type(self.primary).__name__,
                    secondary=type(self.secondary).__name__)  # fmt: skip

    def _quiet_apply(self, m, target_w, reason, values, level):
        """A member's apply in a fallback: its failures are counted and backed off by
        the member, alerted here (one alert for the episode of both)."""
        m.quiet = True
        try:
            return self._member_apply(m, target_w, reason, values, level)
        finally:
            m.quiet = False

    def observe(self, sample) -> None:
        for m in self.members:
            if self._started.get(id(m)):
                m.observe(sample)

    def wants(self, level, target_w) -> bool:
        if self.mode == "only":
            return self.primary.wants(level, target_w)
        return any(m.wants(level, target_w) for m in self.members)

    def _member_apply(self, m, target_w, reason, values, level):
        if not self._started.get(id(m)) and not self._start(m):
            return ApplyResult(None, None, None, False, "cannot start", "failed")
        if m.wants(level, target_w):
            return m.apply(target_w, reason, values, level=level)
        return m.restore(reason) or ApplyResult(None, None, None, False)

    def apply(self, target_w, reason, values=None, level=None) -> ApplyResult:
        if self.mode == "both":
            results = [self._member_apply(m, target_w, reason, values, level)
                       for m in self.members]  # fmt: skip
            return next((r for r in results if r.wrote), results[0])
        if self.mode == "only":
            return self._member_apply(self.primary, target_w, reason, values, level)
        args = (target_w, reason, values, level)
        if self.fallen and self._retry_at is not None and self._mono() < self._retry_at:
            return self._stand_in(self._quiet_apply(self.secondary, *args))
        res = self._quiet_apply(self.primary, *args)
        if res.action in _FAILED or (res.action == "backoff" and self.fallen):
            began = self._fall()
            sec = self._quiet_apply(self.secondary, *args)
            if began:
                self._fell(f"{res.action}: {res.error}", sec.action not in _FAILED, sec.error)
                return sec
            return self._stand_in(sec)
        if self.fallen:
            self.fallen = False
            self._retry_at, self._delay = None, 0.0
            self.secondary.restore("fallback over: the primary actuator works again")
            self._event("info", "fallback_end",
                        f"{type(self.primary).__name__} works again: "
                        f"{type(self.secondary).__name__} released")  # fmt: skip
        return res

    def _stand_in(self, res):
        """The secondary's result in an episode: if it fails after it stood in, one
        alert (the GPU has no working actuator now), not one per try."""
        if res.action in _FAILED and not self._stand_in_failed:
            self._stand_in_failed = True
            self._event("alert", "fallback",
                        f"{type(self.secondary).__name__}, standing in, fails too "
                        f"({res.action}: {res.error}); retried with back-off "
                        "(one alert per episode)", stands_in=False,
                        primary=type(self.primary).__name__,
                        secondary=type(self.secondary).__name__)  # fmt: skip
        return res

    def restore(self, reason="restore", force=False):
        results = [m.restore(reason, force=force) for m in self.members
                   if self._started.get(id(m))]  # fmt: skip
        return next((r for r in results if r is not None and r.error), None) or next(
            (r for r in results if r is not None), None)  # fmt: skip

    def close(self, reason="exit"):
        results = [m.close(reason) for m in self.members if self._started.get(id(m))]
        return next((r for r in results if r is not None and r.error), None) or next(
            (r for r in results if r is not None), None)  # fmt: skip

    def counters(self) -> dict:
        return {**self.primary.counters(), "fallen_back": self.fallen,
                "fallback_episodes": self.episodes,
                "secondary": self.secondary.counters()}  # fmt: skip


def make_actuator(kind: str, backend, uuid: str, *, fallback: bool = True, dry_run=False,
                  on_exit="restore", log=None, journal: LimitJournal | None = None,
                  monotonic=time.monotonic, fractions: ClockFractions | None = None):  # fmt: skip
    """The actuator for one GPU: ``kind`` in ACTUATORS; ``journal`` the power-limit
    journal (the clock journal lives beside it, in the same state directory)."""
    if kind not in ACTUATORS:
        raise ValueError(f"actuator must be one of {', '.join(ACTUATORS)}, got {kind!r}")
    common = {"dry_run": dry_run, "on_exit": on_exit, "log": log, "monotonic": monotonic}
    power = PowerLimiter(backend, uuid, journal=journal, **common)
    clocks = ClockLocker(backend, uuid, fractions=fractions,
                         journal=None if journal is None else ClockJournal(journal.state_dir),
                         **common)  # fmt: skip
    if kind == "both":
        return Combined(power, clocks, "both", log=log, monotonic=monotonic)
    primary, secondary = (power, clocks) if kind == "power" else (clocks, power)
    mode = "fallback" if fallback else "only"  # "only": the other's journal still restored
    return Combined(primary, secondary, mode, log=log, monotonic=monotonic)


def restore_journaled(backend, state_dir, dry_run=False, log=None) -> list[dict]:
    """``modbridge restore``: every journaled power limit, then every journaled clock
    lock, back to its original (rows of both, see the two functions)."""
    return (restore_journaled_limits(backend, state_dir, dry_run=dry_run, log=log)
            + restore_journaled_clocks(backend, state_dir, dry_run=dry_run, log=log))  # fmt: skip


__all__ = [
    "ACTUATORS",
    "Actuator",
    "ClockFractions",
    "ClockLocker",
    "Combined",
    "PowerLimiter",
    "make_actuator",
    "restore_journaled",
]
