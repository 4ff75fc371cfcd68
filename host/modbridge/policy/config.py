"""The ``[policy]`` config section: :class:`PolicyConfig`, its validation and its keys.

Every setting has its unit in its name; ``None`` means "derive" (docs/policy.md,
"Thresholds: defaults and where they come from"). :meth:`PolicyConfig.from_dict`
refuses unknown keys by name (with a suggestion), non-numbers, booleans used as
numbers, NaN and infinity, values out of range and warn >= critical, each as a
:class:`PolicyConfigError` naming the key.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from modbridge.errors import ModbridgeError


class PolicyConfigError(ModbridgeError, ValueError):
    """The ``[policy]`` config section is invalid. ``problems``: every problem found,
    each naming its key (``config validate`` lists them all); the message joins them."""

    exit_code = 2

    def __init__(self, problems):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


def _problem(key, msg):
    return f"policy config: {key} {msg}"


def _fail(key, msg):
    raise PolicyConfigError(_problem(key, msg))


def _check(name, v):
    """``(value, None)`` with the value normalised, or ``(None, problem)``."""
    kind = _KINDS[name]
    if v is None:
        return (None, None) if kind.optional else (None, _problem(name, "must be set"))
    if kind.kind == "bool":
        if not isinstance(v, bool):
            return None, _problem(name, f"must be true or false, got {v!r}")
        return v, None
    if kind.kind == "names":
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x for x in v):
            return None, _problem(name, f"must be a list of GPU uuids / module ids, got {v!r}")
        return tuple(v), None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None, _problem(name, f"must be a number, got {v!r}")
    if not math.isfinite(v):
        return None, _problem(name, f"must be finite, got {v!r}")
    lo, hi, lo_open = kind.lo, kind.hi, kind.lo_open
    if lo is not None and (v < lo or (lo_open and v == lo)):
        return None, _problem(name, f"must be {'>' if lo_open else '>='} {lo}, got {v!r}")
    if hi is not None and v > hi:
        return None, _problem(name, f"must be <= {hi}, got {v!r}")
    return float(v), None


@dataclass(frozen=True)
class PolicyConfig:
    """Thresholds and timings; units in the names. ``None`` = derive (see docs/policy.md).

    Build from a config-file section with :meth:`from_dict`; invalid values raise
    :class:`PolicyConfigError` naming the key.
    """

    warn_temp_c: float | None = None  # None: NVML max_operating/slowdown - nvml_margin_c
    critical_temp_c: float | None = None  # None: NVML slowdown (or shutdown) - nvml_margin_c
    nvml_margin_c: float = 3.0  # how far below the GPU's own thresholds to act
    vram_warn_temp_c: float | None = None  # module VRAM NTC; None: module's own limits only
    vram_critical_temp_c: float | None = None
    mos_warn_temp_c: float | None = None  # module MOSFET NTC; None: module's own limits only
    mos_critical_temp_c: float | None = None
    hysteresis_c: float = 3.0  # a temperature condition clears this far below its threshold
    warn_limit_fraction: float = 0.7  # WARN target = this * the original limit
    under_voltage_v: float = 11.4  # 12 V input below this -> WARN
    hysteresis_v: float = 0.2  # under-voltage clears at under_voltage_v + this
    # cross-check of the module's GPU NTC against the GPU's own sensor (SensorCrossCheck)
    disagree_margin_c: float = 4.0  # steady (NTC - GPU) this far off the learned offset ...
    disagree_time_s: float = 60.0  # ... for this long (steady time) -> WARN
    disagree_gross_c: float = 25.0  # |NTC - GPU| above this for disagree_time_s -> WARN
    disagree_window_s: float = 60.0  # steadiness / stuck window
    disagree_stuck_c: float = 5.0  # one sensor frozen while the other moved this much
    disagree_learn_s: float = 60.0  # steady time before a power bin's offset is trusted
    disagree_learn_tau_s: float = 1800.0  # the learned offsets follow slow changes this slowly
    disagree_bin_w: float = 50.0  # offsets are learned per bin of GPU power this wide
    module_silent_s: float = 5.0  # no frame for longer than this -> CRITICAL
    stale_telemetry_s: float | None = None  # seq/uptime frozen this long = silent (None: derived)
    sensor_clear_s: float = 10.0  # sensor_fault/tach_implausible/manual_low_duty clear after this
    manual_hot_margin_c: float = 10.0  # "hot" for manual_low_duty: above warn - this
    manual_error_c: float = 1.0  # ... and the module's target error (worst channel) above this
    # manual_low_duty: ask the module for a signed ``fan_mode auto`` (off: MANUAL may be
    # deliberate, e.g. a fan test or an autotune; the WARN cut covers the heat anyway)
    return_to_auto: bool = False
    return_to_auto_retry_s: float = 10.0  # first retry after this, doubling up to 300 s
    module_grace_s: float = 10.0  # a module never heard from: silent after this
    min_hold_s: float = 60.0  # minimum time at a level before stepping down one level
    early_warning: bool = False
    early_warning_horizon_s: float = 300.0  # WARN when the warn threshold is nearer than this
    early_warning_window_s: float = 60.0  # least-squares slope over this much history
    psu_capacity_w: float | None = None  # None: no PSU guard
    psu_margin: float = 0.9  # budget = capacity * margin
    psu_release_fraction: float = 0.8  # released below budget * this (after min_hold_s)
    psu_step_w: float = 5.0  # PSU caps are multiples of this (fewer limit writes)
    psu_gpus: tuple[str, ...] | None = None  # GPU uuids / module ids on the PSU; None: all

    def __post_init__(self):
        problems = []
        bad = set()
        for f in fields(self):
            v, problem = _check(f.name, getattr(self, f.name))
            if problem is not None:
                problems.append(problem)
                bad.add(f.name)
            elif v is not None:
                object.__setattr__(self, f.name, v)
        for warn, crit in (
            ("warn_temp_c", "critical_temp_c"),
            ("vram_warn_temp_c", "vram_critical_temp_c"),
            ("mos_warn_temp_c", "mos_critical_temp_c"),
        ):
            if warn in bad or crit in bad:
                continue
            w, c = getattr(self, warn), getattr(self, crit)
            if w is not None and c is not None and w >= c:
                problems.append(_problem(warn, f"({w:g}) must be below {crit} ({c:g})"))
        if problems:
            raise PolicyConfigError(problems)

    @classmethod
    def from_dict(cls, d: Mapping | None) -> PolicyConfig:
        """From a config-file section. Unknown keys are refused by name.

        ``early_warning`` may also be a table ``{enabled, horizon_s, window_s}``.
        """
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise PolicyConfigError(f"policy config: expected a table, got {type(d).__name__}")
        flat = dict(d)
        ew = flat.get("early_warning")
        if isinstance(ew, Mapping):
            del flat["early_warning"]
            for k, v in ew.items():
                name = "early_warning" if k == "enabled" else f"early_warning_{k}"
                if name in flat:
                    _fail(name, "given twice (flat and in the early_warning table)")
                flat[name] = v
        problems = []
        unknown = sorted(set(flat) - set(_KINDS), key=str)
        if unknown:
            hints = []
            for k in unknown:
                near = difflib.get_close_matches(str(k), list(_KINDS), n=1)
                hints.append(f"{k!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
            problems.append(
                "policy config: unknown key(s) "
                + ", ".join(hints)
                + "; known: "
                + ", ".join(sorted(_KINDS))
            )
        known = {k: v for k, v in flat.items() if k in _KINDS}
        try:
            cfg = cls(**known)
        except PolicyConfigError as e:
            problems += e.problems
        if problems:
            raise PolicyConfigError(problems)
        return cfg


@dataclass(frozen=True)
class _Kind:
    kind: str = "num"  # num, bool, names
    optional: bool = False
    lo: float | None = 0.0
    hi: float | None = None
    lo_open: bool = False


_TEMP = _Kind(optional=True, lo=0.0, hi=150.0, lo_open=True)
_KINDS = {
    "warn_temp_c": _TEMP,
    "critical_temp_c": _TEMP,
    "nvml_margin_c": _Kind(hi=30.0),
    "vram_warn_temp_c": _TEMP,
    "vram_critical_temp_c": _TEMP,
    "mos_warn_temp_c": _TEMP,
    "mos_critical_temp_c": _TEMP,
    "hysteresis_c": _Kind(hi=30.0),
    "warn_limit_fraction": _Kind(hi=1.0, lo_open=True),
    "under_voltage_v": _Kind(hi=40.0),
    "hysteresis_v": _Kind(hi=5.0),
    "disagree_margin_c": _Kind(lo_open=True),
    "disagree_time_s": _Kind(),
    "disagree_gross_c": _Kind(lo_open=True),
    "disagree_window_s": _Kind(lo=1.0),
    "disagree_stuck_c": _Kind(lo_open=True),
    "disagree_learn_s": _Kind(),
    "disagree_learn_tau_s": _Kind(lo_open=True),
    "disagree_bin_w": _Kind(lo_open=True),
    "module_silent_s": _Kind(lo_open=True),
    "stale_telemetry_s": _Kind(optional=True, lo_open=True),
    "sensor_clear_s": _Kind(),
    "manual_hot_margin_c": _Kind(hi=100.0),
    "manual_error_c": _Kind(lo=-50.0, hi=50.0),
    "return_to_auto": _Kind(kind="bool"),
    "return_to_auto_retry_s": _Kind(lo=1.0),
    "module_grace_s": _Kind(),
    "min_hold_s": _Kind(),
    "early_warning": _Kind(kind="bool"),
    "early_warning_horizon_s": _Kind(lo_open=True),
    "early_warning_window_s": _Kind(lo_open=True),
    "psu_capacity_w": _Kind(optional=True, lo_open=True),
    "psu_margin": _Kind(hi=1.0, lo_open=True),
    "psu_release_fraction": _Kind(hi=1.0, lo_open=True),
    "psu_step_w": _Kind(),
    "psu_gpus": _Kind(kind="names", optional=True),
}
