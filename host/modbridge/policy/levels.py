"""Levels, reason codes, and the level state machine of one pair (docs/policy.md).

The names are stable: logs, metrics and alerts use them. :class:`LevelMachine` is the
rule that turns "the worst level any active condition asks for" into the pair's
level: up at once, down one level at a time and only after ``min_hold_s`` at the
current one.
"""

from __future__ import annotations

NORMAL = 0
WARN = 1
CRITICAL = 2
LEVEL_NAMES = ("NORMAL", "WARN", "CRITICAL")

R_GPU_LOST = "gpu_lost"  # GPU unreadable (lost, no permission, driver gone): no actuation
R_CRITICAL_TEMP = "critical_temp"
R_BOTH_FANS_STALLED = "both_fans_stalled"  # every fan of the module stalled
R_MODULE_SILENT = "module_silent"
# the GPU's module cannot be trusted (a duplicate id, none mapped, lost): no working cooling
R_MODULE_UNTRUSTED = "module_untrusted"
R_OVER_TEMP = "over_temp"
R_FAN_STALL = "fan_stall"  # one fan stalled, another still turning
R_UNDER_VOLTAGE = "under_voltage"
R_SENSOR_FAULT = "sensor_fault"  # an NTC open/short/stuck/implausible: module control degraded
R_TACH_IMPLAUSIBLE = "tach_implausible"  # a fan's tach does not fit its duty
R_MANUAL_LOW_DUTY = "manual_low_duty"  # MANUAL below what automatic control would command, hot
R_SENSOR_DISAGREE = "sensor_disagree"
R_EARLY_WARNING = "early_warning"
R_PSU_BUDGET = "psu_budget"  # the PSU guard capped this GPU (does not raise the level)
R_HOLD = "hold"  # level kept above what the conditions ask for: min_hold_s not over

# Level each reason raises to, and the order reasons are listed in (worst first).
REASON_LEVELS = {
    R_GPU_LOST: CRITICAL,
    R_CRITICAL_TEMP: CRITICAL,
    R_BOTH_FANS_STALLED: CRITICAL,
    R_MODULE_SILENT: CRITICAL,
    R_MODULE_UNTRUSTED: CRITICAL,
    R_OVER_TEMP: WARN,
    R_FAN_STALL: WARN,
    R_UNDER_VOLTAGE: WARN,
    R_SENSOR_FAULT: WARN,
    R_TACH_IMPLAUSIBLE: WARN,
    R_MANUAL_LOW_DUTY: WARN,
    R_SENSOR_DISAGREE: WARN,
    R_EARLY_WARNING: WARN,
    R_PSU_BUDGET: NORMAL,
    R_HOLD: NORMAL,
}
REASONS = tuple(REASON_LEVELS)


class LevelMachine:
    """The pair's level: up at once, down one level per ``min_hold_s``.

    >>> m = LevelMachine(min_hold_s=60)
    >>> m.step(0.0, CRITICAL), m.step(30.0, NORMAL), m.step(60.0, NORMAL)
    (2, 2, 1)
    >>> m.held_above(NORMAL)
    True
    """

    def __init__(self, min_hold_s: float):
        self.min_hold_s = min_hold_s
        self.level = NORMAL
        self.since: float | None = None  # None: never changed

    def step(self, now: float, raw: int) -> int:
        """The level after conditions asking for ``raw`` at ``now``."""
        if raw > self.level:
            self.level, self.since = raw, now
        elif raw < self.level and (self.since is None or now - self.since >= self.min_hold_s):
            self.level, self.since = self.level - 1, now
        return self.level

    def held_above(self, raw: int) -> bool:
        """Is the level kept above what the conditions ask for (the hold)?"""
        return self.level > raw


def raw_level(reasons) -> int:
    """The worst level any of ``reasons`` asks for (NORMAL for none)."""
    return max((REASON_LEVELS[r] for r in reasons), default=NORMAL)


def ordered(active) -> list[str]:
    """``active`` reason codes in the order of :data:`REASONS` (worst first)."""
    return [r for r in REASONS if r in active]
