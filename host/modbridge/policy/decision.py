"""A pair's decision (:class:`Decision`) and the power limit a level asks for.

``target_limit_w`` None means "the original limit" (restore), unless ``can_actuate``
is False (the GPU is lost: nothing can be written). Limits never leave
[minimum, original]: :func:`target_limit` clamps, and the actuator clamps again.
"""

from __future__ import annotations

from dataclasses import dataclass

from modbridge.policy.levels import CRITICAL, LEVEL_NAMES, NORMAL, WARN


@dataclass
class Decision:
    """What to do with one GPU's power limit, and why.

    ``target_limit_w`` None means "the original limit" (restore) -- unless
    ``can_actuate`` is False (the GPU is lost: nothing can be written at all).
    ``changed`` is True when level, target or reasons differ from the previous decision
    of the same pair; only those go to the event log.
    """

    level: int
    target_limit_w: float | None
    reasons: list[str]
    values: dict
    changed: bool
    eta_s: float | None = None
    module_id: str | None = None
    gpu_uuid: str | None = None
    at: float = 0.0  # the ``now`` it was made at
    previous_level: int = NORMAL
    can_actuate: bool = True
    # ask the module for automatic fan control now (a signed ``fan_mode auto``):
    # ``return_to_auto`` is on and the module is in MANUAL with manual_low_duty;
    # rate-limited by the pair (blindspots.ReturnToAuto)
    want_auto: bool = False

    @property
    def level_name(self) -> str:
        return LEVEL_NAMES[self.level]

    def as_event(self) -> dict:
        """Fields for ``EventLog.write("decision", **fields)``."""
        return {
            "module_id": self.module_id,
            "gpu_uuid": self.gpu_uuid,
            "level": self.level_name,
            "previous_level": LEVEL_NAMES[self.previous_level],
            "target_w": self.target_limit_w,
            "can_actuate": self.can_actuate,
            "reasons": list(self.reasons),
            "eta_s": self.eta_s,
            "values": dict(self.values),
        } | ({"want_auto": True} if self.want_auto else {})


def round_w(w):
    return None if w is None else round(float(w), 3)


def clamp(w, lo, hi):
    if hi is not None:
        w = min(w, hi)
    if lo is not None:
        w = max(w, lo)
    return w


def target_limit(level: int, original_w, min_w, warn_fraction: float, psu_limit_w=None):
    """``(target W or None = original, PSU cap applied or None)`` for ``level``.

    WARN: ``warn_fraction`` x original; CRITICAL: the minimum (the WARN cut when the
    minimum is unknown); a PSU cap lower than the original wins if lower. A target at
    or above the original is None (restore), so a limit is never raised.

    >>> target_limit(WARN, 700.0, 200.0, 0.7), target_limit(CRITICAL, 700.0, 200.0, 0.7)
    ((490.0, None), (200.0, None))
    >>> target_limit(NORMAL, 700.0, 200.0, 0.7, psu_limit_w=900.0)
    (None, None)
    """
    target = None
    if level == WARN and original_w is not None:
        target = clamp(warn_fraction * original_w, min_w, original_w)
    elif level == CRITICAL:
        if min_w is not None:
            target = min_w
        elif original_w is not None:  # no constraints known: the WARN cut at least
            target = warn_fraction * original_w
    cap = None
    if psu_limit_w is not None:
        c = clamp(psu_limit_w, min_w, original_w)
        if original_w is None or c < original_w:
            cap = c
            target = c if target is None else min(target, c)
    if target is not None and original_w is not None and target >= original_w:
        target = None
    if target is not None:  # round for the log, without leaving [min, original]
        target = clamp(round_w(target), min_w, original_w)
    return target, cap
