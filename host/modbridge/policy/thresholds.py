"""GPU temperature thresholds: from the config, else the GPU's own (NVML), else fallbacks.

See docs/policy.md, "Thresholds: defaults and where they come from".
"""

from __future__ import annotations

from dataclasses import dataclass

from modbridge.policy.config import PolicyConfig

# Thresholds used when neither the config nor the GPU (NVML) gives one.
FALLBACK_WARN_C = 83.0
FALLBACK_CRITICAL_C = 90.0


@dataclass(frozen=True)
class Thresholds:
    """Effective GPU temperature thresholds and where each came from."""

    warn_c: float
    critical_c: float
    warn_source: str  # "config", "nvml" or "fallback"
    critical_source: str


def effective_thresholds(
    cfg: PolicyConfig,
    slowdown_c: float | None = None,
    shutdown_c: float | None = None,
    max_operating_c: float | None = None,
) -> Thresholds:
    """Warn/critical for the GPU temperature from the config, else the GPU's NVML values.

    >>> t = effective_thresholds(PolicyConfig(), slowdown_c=89, shutdown_c=95,
    ...                          max_operating_c=87)  # an H200
    >>> (t.warn_c, t.critical_c, t.warn_source)
    (84.0, 86.0, 'nvml')
    >>> t = effective_thresholds(PolicyConfig())
    >>> (t.warn_c, t.critical_c, t.warn_source)
    (83.0, 90.0, 'fallback')
    """
    m = cfg.nvml_margin_c
    if cfg.critical_temp_c is not None:
        crit, csrc = cfg.critical_temp_c, "config"
    elif slowdown_c is not None:
        crit, csrc = slowdown_c - m, "nvml"
    elif shutdown_c is not None:
        crit, csrc = shutdown_c - m, "nvml"
    else:
        crit, csrc = FALLBACK_CRITICAL_C, "fallback"
    known = [t for t in (max_operating_c, slowdown_c) if t is not None]
    if cfg.warn_temp_c is not None:
        warn, wsrc = cfg.warn_temp_c, "config"
    elif known:
        warn, wsrc = min(known) - m, "nvml"
    else:
        warn, wsrc = FALLBACK_WARN_C, "fallback"
    if warn >= crit:  # one side derived (config validation rules out both explicit)
        gap = max(m, 1.0)
        if wsrc == "config":
            crit = warn + gap
        else:
            warn = crit - gap
    return Thresholds(float(warn), float(crit), wsrc, csrc)
