"""Is the module's telemetry news? Silence, the grace for a module never heard from,
and stale telemetry (frames that keep coming but whose sequence number or uptime does
not advance: byte-identical frames are silence). docs/policy.md, "Blind spots".

Silence is not decided here: the link decides it once (:func:`modbridge.model.grade`,
from what its port delivered, the bridge's own pauses left out) and the policy takes
its verdict, a :class:`~modbridge.model.LinkFreshness`, as a fact. Only a module
without one (a status built by hand, library use) is graded here, by the same
function, against ``module_silent_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from modbridge.model import LinkFreshness, ModuleStatus, grade
from modbridge.policy.config import PolicyConfig

# Default stale_telemetry_s: max(module_silent_s, this). uptime_s counts whole seconds
# and telemetry comes once a second by default: a healthy uptime can rest for ~2 s.
STALE_MIN_S = 3.0


def stale_limit_s(cfg: PolicyConfig) -> float:
    """``stale_telemetry_s``, or its default ``max(module_silent_s, STALE_MIN_S)``."""
    if cfg.stale_telemetry_s is not None:
        return cfg.stale_telemetry_s
    return max(cfg.module_silent_s, STALE_MIN_S)


@dataclass
class Silence:
    """The verdict on one module's telemetry at one instant."""

    silent: bool
    source: str = "module"  # what says so: "module" (no frames), "telemetry_stale"
    link: LinkFreshness | None = None  # the link's verdict it was decided from
    stale_s: float | None = None  # seq/uptime frozen this long (past the limit)
    never_heard_s: float | None = None  # no frame at all since the pair's first evaluation


class TelemetryFreshness:
    """Remembers when the telemetry's sequence number and uptime last advanced."""

    def __init__(self, config: PolicyConfig):
        self.config = config
        self._progress: dict[str, tuple] = {}  # "seq"/"uptime" -> (value, changed at)

    def stale_s(self, now: float, module: ModuleStatus) -> float | None:
        """Seconds the telemetry's sequence number or uptime has not advanced, once that
        exceeds ``stale_telemetry_s`` (else None): frames that repeat are not news."""
        limit = stale_limit_s(self.config)
        worst = None
        for key, v in (("seq", module.telemetry_seq), ("uptime", module.telemetry.get("uptime_s"))):
            if v is None:
                self._progress.pop(key, None)
                continue
            seen = self._progress.get(key)
            if seen is None or seen[0] != v or now < seen[1]:
                self._progress[key] = (v, now)
                continue
            # frozen while frames keep coming: up to the last frame, not to now (frames
            # that stopped are the link's silence, e.g. a bridge paused before a tick)
            until = now if module.last_frame_at is None else min(now, module.last_frame_at)
            frozen = until - seen[1]
            if frozen > limit and (worst is None or frozen > worst):
                worst = frozen
        # whole ms, rounded up: frozen a hair past the limit is reported past it (round()
        # made 3.0002 s into 3.0, a stale time equal to the limit it had exceeded)
        return None if worst is None else math.ceil(worst * 1000) / 1000

    def judge(self, now: float, module: ModuleStatus, age_s: float | None,
              first_at: float, link: LinkFreshness | None = None) -> Silence:  # fmt: skip
        """Silent: the link says so (``link``, else ``module.freshness``; without
        either, :func:`grade` of ``age_s`` against ``module_silent_s``), never heard
        from for ``module_grace_s`` after ``first_at``, or stale telemetry."""
        cfg = self.config
        if age_s is None:
            waited = now - first_at
            return Silence(waited > cfg.module_grace_s, never_heard_s=waited)
        if link is None:
            link = module.freshness or grade(age_s, cfg.module_silent_s)
        stale = self.stale_s(now, module)
        if link.silent:
            return Silence(True, stale_s=stale, link=link)
        return Silence(stale is not None, "telemetry_stale", stale_s=stale, link=link)
