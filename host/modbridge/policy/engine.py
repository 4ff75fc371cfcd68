"""The policy: what a module and its GPU report -> how far to lower the GPU power limit.

Pure: inputs in, :class:`Decision` out. Nothing here reads a clock, a device or a file;
``now`` (``time.monotonic()`` seconds) is passed in, and the only state is what a state
machine needs to remember (its level and when it changed, hysteresis latches, the
sensor-disagreement timer, the temperature history for the early warning). The
bridge applies decisions with the actuator and writes them to the event log; see
docs/policy.md for the table of conditions, the defaults and where they come from.

Three pieces:

``PairPolicy``
    One state machine per (module, GPU) pair with levels NORMAL < WARN < CRITICAL.
    Stepping up is immediate, stepping down goes one level at a time and only after
    ``min_hold_s`` at the current level; temperature conditions clear
    ``hysteresis_c`` below their threshold.
``PsuGuard``
    One per power supply: when the modules' summed 12 V input power exceeds
    ``capacity * margin``, per-GPU caps lowered proportionally (never below a GPU's
    minimum limit) so the total fits; released with hysteresis.
``PolicyEngine``
    Runs the pairs and the guard for one tick, combines them (the lower limit wins)
    and writes every decision that changes something to an event log.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field, fields

from modbridge.errors import ModbridgeError
from modbridge.gpu.base import GpuError, GpuSample
from modbridge.model import ModuleStatus
from protocol import catalog as C

log = logging.getLogger(__name__)

# --- levels and reason codes (stable: logs, metrics and alerts use them) -------------
NORMAL = 0
WARN = 1
CRITICAL = 2
LEVEL_NAMES = ("NORMAL", "WARN", "CRITICAL")

R_GPU_LOST = "gpu_lost"  # GPU unreadable (lost, no permission, driver gone): no actuation
R_CRITICAL_TEMP = "critical_temp"
R_BOTH_FANS_STALLED = "both_fans_stalled"  # every fan of the module stalled
R_MODULE_SILENT = "module_silent"
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

# Thresholds used when neither the config nor the GPU (NVML) gives one.
FALLBACK_WARN_C = 83.0
FALLBACK_CRITICAL_C = 90.0
# Default stale_telemetry_s: max(module_silent_s, this). uptime_s counts whole seconds
# and telemetry comes once a second by default: a healthy uptime can rest for ~2 s.
STALE_MIN_S = 3.0
# tach_implausible counts once it lasted this long: longer than the firmware's stall
# time (fans.stall_ms, 3 s), so a fan stopping is reported as one fan_stall, not as a
# WARN then a CRITICAL (two limit writes). The module floors the fans at once anyway.
TACH_CONFIRM_S = 5.0
# manual_low_duty: a MANUAL duty at or above this ratio is what automatic would command.
MANUAL_FULL_DUTY = 0.98
_SENSOR_REASONS = ("sensor_open", "sensor_short", "sensor_stale", "sensor_stuck",
                   "sensor_implausible")  # fmt: skip
# An early warning clears once the ETA is back above horizon * this (or gone).
EARLY_WARNING_CLEAR_FACTOR = 1.25


class PolicyConfigError(ModbridgeError, ValueError):
    """The ``[policy]`` config section is invalid; the message names the key."""

    exit_code = 2


def _fail(key, msg):
    raise PolicyConfigError(f"policy config: {key} {msg}")


# --- config ----------------------------------------------------------------------------
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
        for f in fields(self):
            v = getattr(self, f.name)
            kind = _KINDS[f.name]
            if v is None:
                if not kind.optional:
                    _fail(f.name, "must be set")
                continue
            if kind.kind == "bool":
                if not isinstance(v, bool):
                    _fail(f.name, f"must be true or false, got {v!r}")
            elif kind.kind == "names":
                if isinstance(v, str) or not all(isinstance(x, str) and x for x in v):
                    _fail(f.name, f"must be a list of GPU uuids / module ids, got {v!r}")
                object.__setattr__(self, f.name, tuple(v))
            else:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    _fail(f.name, f"must be a number, got {v!r}")
                if not math.isfinite(v):
                    _fail(f.name, f"must be finite, got {v!r}")
                lo, hi, lo_open = kind.lo, kind.hi, kind.lo_open
                if lo is not None and (v < lo or (lo_open and v == lo)):
                    _fail(f.name, f"must be {'>' if lo_open else '>='} {lo}, got {v!r}")
                if hi is not None and v > hi:
                    _fail(f.name, f"must be <= {hi}, got {v!r}")
                object.__setattr__(self, f.name, float(v))
        for warn, crit in (
            ("warn_temp_c", "critical_temp_c"),
            ("vram_warn_temp_c", "vram_critical_temp_c"),
            ("mos_warn_temp_c", "mos_critical_temp_c"),
        ):
            w, c = getattr(self, warn), getattr(self, crit)
            if w is not None and c is not None and w >= c:
                _fail(warn, f"({w:g}) must be below {crit} ({c:g})")

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
        unknown = sorted(set(flat) - set(_KINDS))
        if unknown:
            hints = []
            for k in unknown:
                near = difflib.get_close_matches(str(k), list(_KINDS), n=1)
                hints.append(f"{k!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
            raise PolicyConfigError(
                "policy config: unknown key(s) "
                + ", ".join(hints)
                + "; known: "
                + ", ".join(sorted(_KINDS))
            )
        return cls(**flat)


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


# --- thresholds ------------------------------------------------------------------------
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


# --- early warning math ----------------------------------------------------------------
def lsq_slope(points: Iterable[tuple[float, float]]) -> float | None:
    """Least-squares slope dy/dt of ``(t, y)`` points; None for < 2 points or one instant.

    >>> lsq_slope([(0, 50.0), (10, 51.0), (20, 52.0)])
    0.1
    """
    pts = list(points)
    n = len(pts)
    if n < 2:
        return None
    mt = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    stt = sum((p[0] - mt) ** 2 for p in pts)
    if stt <= 0.0:
        return None
    return sum((p[0] - mt) * (p[1] - my) for p in pts) / stt


def time_to_threshold(
    current_c: float | None, threshold_c: float, slope_c_per_s: float | None
) -> float | None:
    """Seconds until ``threshold_c`` at the current slope: 0 if already there, None if
    not heading there (slope <= 0 or unknown).

    >>> time_to_threshold(81.0, 87.0, 0.02)
    300.0
    >>> time_to_threshold(81.0, 87.0, -0.01) is None
    True
    """
    if current_c is None:
        return None
    if current_c >= threshold_c:
        return 0.0
    if slope_c_per_s is None or slope_c_per_s <= 0.0:
        return None
    return (threshold_c - current_c) / slope_c_per_s


# --- decisions -------------------------------------------------------------------------
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
        }


def _round_w(w):
    return None if w is None else round(float(w), 3)


def _clamp(w, lo, hi):
    if hi is not None:
        w = min(w, hi)
    if lo is not None:
        w = max(w, lo)
    return w


# --- the sensor cross-check ------------------------------------------------------------
# Fixed parts of the cross-check (the tunable ones are PolicyConfig.disagree_*).
CROSSCHECK_GAP_S = 10.0  # a gap this long in the readings restarts the window
CROSSCHECK_STEADY_C = 2.0  # steady: the GPU temperature moved at most this over the window
CROSSCHECK_STEADY_W = 25.0  # ... and the power at most this (or 5 % of it, the larger)
CROSSCHECK_STEADY_FRACTION = 0.05
CROSSCHECK_FROZEN_C = 0.05  # "frozen": a reading that moved less than this over the window
CROSSCHECK_MOVING_C = 0.5  # a frozen reading counts again once it moves this much
CROSSCHECK_LOAD_CHANGE_W = 50.0  # "frozen" needs the power to have changed this much
CROSSCHECK_MAX_DT_S = 5.0  # one evaluation counts for at most this long


class SensorCrossCheck:
    """Does the module's GPU NTC agree with the GPU's own temperature? (docs/policy.md)

    The NTC sits on the package or heatsink base, not in the die: a healthy one reads
    below the GPU by an offset that grows with power (6.4 degC at 650 W in the default
    world). So the check learns that offset instead of assuming it:

    * **learned offset**: per bin of GPU power (``disagree_bin_w``), the mean of
      ``NTC - GPU`` over the window while the pair is *steady* (GPU temperature within
      2 degC and power within 25 W / 5 % over ``disagree_window_s``), a running mean
      for the first ``disagree_learn_s`` of steady time, then an EWMA with time
      constant ``disagree_learn_tau_s``. Learning pauses while the residual is above
      half the margin, so a drifting sensor is not learned away.
    * **offset**: steady, in a learned bin, ``|mean(NTC - GPU) - learned|`` above
      ``disagree_margin_c`` for ``disagree_time_s`` of steady time (transients pause
      the count, agreement within half the margin resets it).
    * **frozen**: over a full window one reading moved less than 0.05 degC while the
      other moved at least ``disagree_stuck_c`` within the window's second half and
      the power changed by 50 W or more (a cause for both to move): that sensor is
      frozen (at once; it clears when the frozen one moves 0.5 degC again).
    * **gross**: ``|NTC - GPU|`` above ``disagree_gross_c`` for ``disagree_time_s``,
      learned or not.

    :meth:`update` returns the kind that fires (``"offset"``, ``"ntc_frozen"``,
    ``"gpu_frozen"``, ``"gross"``) or None, and fills ``values``.
    """

    def __init__(self, config: PolicyConfig):
        self.config = config
        self._hist: deque[tuple[float, float, float, float]] = deque()  # t, gpu, ntc, W
        self._bins: dict[int, list[float]] = {}  # bin -> [offset (NTC - GPU), steady s]
        self._over_s = 0.0  # steady time with the residual above the margin
        self._gross_s = 0.0
        self._frozen: str | None = None  # "ntc" / "gpu" while one is latched frozen
        self._last_t: float | None = None

    def reset(self) -> None:
        """Forget the window (a reading is missing): the learned offsets stay."""
        self._hist.clear()
        self._over_s = self._gross_s = 0.0
        self._frozen = None
        self._last_t = None

    def learned(self) -> dict[float, float]:
        """Trusted offsets (NTC - GPU, degC) by the lower edge of their power bin (W)."""
        w = self.config.disagree_bin_w
        lim = self.config.disagree_learn_s
        return {b * w: v for b, (v, s) in sorted(self._bins.items()) if s >= lim}

    def update(
        self, now: float, ntc_c: float | None, gpu_c: float | None, power_w: float | None, values
    ) -> str | None:
        cfg = self.config
        if ntc_c is None or gpu_c is None or power_w is None:
            self.reset()
            return None
        h = self._hist
        if self._last_t is not None and (
            now < self._last_t or now - self._last_t > CROSSCHECK_GAP_S
        ):
            self.reset()
        dt = 0.0 if self._last_t is None else min(now - self._last_t, CROSSCHECK_MAX_DT_S)
        self._last_t = now
        h.append((now, gpu_c, ntc_c, power_w))
        while h[0][0] < now - cfg.disagree_window_s:
            h.popleft()
        diff = ntc_c - gpu_c
        values["disagree_c"] = round(diff, 3)
        # gross: no model at all
        self._gross_s = self._gross_s + dt if abs(diff) > cfg.disagree_gross_c else 0.0
        full = now - h[0][0] >= 0.9 * cfg.disagree_window_s
        kind = None
        if full:
            gpus = [x[1] for x in h]
            ntcs = [x[2] for x in h]
            watts = [x[3] for x in h]
            r_gpu, r_ntc = max(gpus) - min(gpus), max(ntcs) - min(ntcs)
            # frozen: one still for the whole window, the other still moving in its
            # second half (a lagging sensor settling after a step has slowed by then)
            half = now - cfg.disagree_window_s / 2
            late = [x for x in h if x[0] >= half]
            m_gpu = max(x[1] for x in late) - min(x[1] for x in late)
            m_ntc = max(x[2] for x in late) - min(x[2] for x in late)
            if self._frozen == "ntc" and r_ntc >= CROSSCHECK_MOVING_C:
                self._frozen = None
            elif self._frozen == "gpu" and r_gpu >= CROSSCHECK_MOVING_C:
                self._frozen = None
            loaded = max(watts) - min(watts) >= CROSSCHECK_LOAD_CHANGE_W  # a cause to move
            if loaded and r_ntc < CROSSCHECK_FROZEN_C and m_gpu >= cfg.disagree_stuck_c:
                self._frozen = "ntc"
            elif loaded and r_gpu < CROSSCHECK_FROZEN_C and m_ntc >= cfg.disagree_stuck_c:
                self._frozen = "gpu"
            # steady: learn, and compare with what was learned
            mean_w = sum(watts) / len(watts)
            steady = r_gpu <= CROSSCHECK_STEADY_C and max(watts) - min(watts) <= max(
                CROSSCHECK_STEADY_W, CROSSCHECK_STEADY_FRACTION * mean_w
            )
            values["disagree_steady"] = steady
            if steady:
                mean_d = sum(n - g for _, g, n, _ in h) / len(h)
                b = self._bins.setdefault(int(mean_w // cfg.disagree_bin_w), [mean_d, 0.0])
                trusted = b[1] >= cfg.disagree_learn_s
                residual = mean_d - b[0]
                if trusted:
                    values["disagree_expected_c"] = round(b[0], 3)
                    values["disagree_residual_c"] = round(residual, 3)
                    if abs(residual) > cfg.disagree_margin_c:
                        self._over_s += dt
                    elif abs(residual) <= cfg.disagree_margin_c / 2:
                        self._over_s = 0.0
                if self._over_s == 0.0 and (
                    not trusted or abs(residual) <= cfg.disagree_margin_c / 2
                ):
                    b[1] += dt
                    alpha = max(dt / cfg.disagree_learn_tau_s, dt / b[1]) if b[1] > 0 else 1.0
                    b[0] += min(alpha, 1.0) * (mean_d - b[0])
        if self._frozen is not None:
            kind = self._frozen + "_frozen"
        elif self._over_s >= cfg.disagree_time_s:
            kind = "offset"
        elif self._gross_s >= cfg.disagree_time_s:
            kind = "gross"
        if self._over_s:
            values["disagree_for_s"] = round(self._over_s, 3)
        elif self._gross_s:
            values["disagree_for_s"] = round(self._gross_s, 3)
        if kind is not None:
            values["disagree_kind"] = kind
        return kind


class PairPolicy:
    """The state machine of one (module, GPU) pair. Call :meth:`evaluate` every tick."""

    def __init__(
        self,
        config: PolicyConfig | None = None,
        module_id: str | None = None,
        gpu_uuid: str | None = None,
    ):
        self.config = config or PolicyConfig()
        self.module_id = module_id
        self.gpu_uuid = gpu_uuid
        self.level = NORMAL
        self.level_since: float | None = None  # None: never changed
        self.target_limit_w: float | None = None
        self.reasons: list[str] = []
        self._first_at: float | None = None
        self._latched: set[str] = set()
        self._crosscheck = SensorCrossCheck(self.config)
        self._progress: dict[str, tuple] = {}  # "seq"/"uptime" -> (value, changed at)
        self._sticky: dict[str, float] = {}  # reason -> last time its condition held
        self._tach_since: float | None = None  # tach implausible without a break since
        self._early_active = False
        self._history: deque[tuple[float, float]] = deque()
        self._gpu_thresholds: tuple = (None, None, None)  # slowdown, shutdown, max_operating
        self._original_w: float | None = None
        self._min_w: float | None = None

    # -- helpers -----------------------------------------------------------------------
    def _above(self, key, value, threshold, hysteresis):
        """Hysteresis latch: on above ``threshold``, off at or below threshold - hyst."""
        if value is None or threshold is None:
            self._latched.discard(key)
            return False
        on = value > threshold or (key in self._latched and value > threshold - hysteresis)
        (self._latched.add if on else self._latched.discard)(key)
        return on

    def _temperature(self, source, t, warn_c, critical_c, hit, latch_suffix=""):
        """critical_temp or over_temp (not both) for one sensor, with hysteresis."""
        hyst = self.config.hysteresis_c
        crit = self._above(f"crit:{source}{latch_suffix}", t, critical_c, hyst)
        over = self._above(f"warn:{source}{latch_suffix}", t, warn_c, hyst)
        if crit:
            hit(R_CRITICAL_TEMP, source)
        elif over:
            hit(R_OVER_TEMP, source)

    def _below(self, key, value, threshold, hysteresis):
        if value is None:
            self._latched.discard(key)
            return False
        on = value < threshold or (key in self._latched and value < threshold + hysteresis)
        (self._latched.add if on else self._latched.discard)(key)
        return on

    def observe_limits(
        self, gpu: GpuSample | None, original_limit_w: float | None = None
    ) -> tuple[float | None, float | None]:
        """(original, min) limit in W, remembering the last ones a sample gave.

        The original is, in order: the actuator's saved original (``original_limit_w``),
        the GPU's default limit, the first enforced limit this pair saw.
        """
        if isinstance(gpu, GpuSample) and gpu.state == "ok":
            if gpu.default_limit_w is not None:
                self._original_w = gpu.default_limit_w
            elif self._original_w is None and gpu.enforced_limit_w is not None:
                self._original_w = gpu.enforced_limit_w
            if gpu.min_limit_w is not None:
                self._min_w = gpu.min_limit_w
        original = original_limit_w if original_limit_w is not None else self._original_w
        mn = self._min_w
        if mn is not None and original is not None and mn > original:
            mn = original
        return original, mn

    def estimate_eta(self, current_c: float | None, threshold_c: float):
        """(eta_s, slope_c_per_s) from the GPU temperature history of the last
        ``early_warning_window_s``; (None, None) until half a window (and 3 points)."""
        cfg = self.config
        pts = self._history
        if len(pts) < 3 or pts[-1][0] - pts[0][0] < cfg.early_warning_window_s / 2:
            return None, None
        slope = lsq_slope(pts)
        return time_to_threshold(current_c, threshold_c, slope), slope

    def _stale_s(self, now: float, module: ModuleStatus) -> float | None:
        """Seconds the telemetry's sequence number or uptime has not advanced, once that
        exceeds ``stale_telemetry_s`` (else None): frames that repeat are not news."""
        limit = self.config.stale_telemetry_s
        if limit is None:
            limit = max(self.config.module_silent_s, STALE_MIN_S)
        worst = None
        for key, v in (("seq", module.telemetry_seq), ("uptime", module.telemetry.get("uptime_s"))):
            if v is None:
                self._progress.pop(key, None)
                continue
            seen = self._progress.get(key)
            if seen is None or seen[0] != v or now < seen[1]:
                self._progress[key] = (v, now)
                continue
            frozen = now - seen[1]
            if frozen > limit and (worst is None or frozen > worst):
                worst = frozen
        return None if worst is None else round(worst, 3)

    def _sticky_hit(self, reason, on, source, now, hit):
        """``reason`` while ``on``, and ``sensor_clear_s`` after it was last on."""
        if on:
            self._sticky[reason] = now
        last = self._sticky.get(reason)
        if last is None:
            return
        if now - last <= self.config.sensor_clear_s and now >= last:
            hit(reason, source)
        else:
            del self._sticky[reason]

    # -- the tick ----------------------------------------------------------------------
    def evaluate(
        self,
        now: float,
        module: ModuleStatus | None = None,
        gpu: GpuSample | GpuError | None = None,
        *,
        link_up: bool | None = None,
        last_frame_age_s: float | None = None,
        original_limit_w: float | None = None,
        psu_limit_w: float | None = None,
    ) -> Decision:
        """One evaluation at monotonic time ``now``.

        ``module``: the mapped module's status, None when no module is mapped.
        ``link_up`` / ``last_frame_age_s`` override what ``module`` says (None: read it).
        ``gpu``: a sample, the GpuError its backend raised, or None (no reading).
        ``original_limit_w``: the limit saved by the actuator at start, if known.
        ``psu_limit_w``: the PSU guard's cap for this GPU (None: no cap).
        """
        cfg = self.config
        if self._first_at is None:
            self._first_at = now
        active: dict[str, list[str]] = {}  # reason -> sources
        values: dict = {}

        def hit(reason, source):
            active.setdefault(reason, []).append(source)

        # GPU ------------------------------------------------------------------------
        sample = gpu if isinstance(gpu, GpuSample) and gpu.state == "ok" else None
        if sample is None:
            if isinstance(gpu, GpuError):
                state, err = gpu.state, str(gpu)
            elif isinstance(gpu, GpuSample):
                state, err = gpu.state, gpu.error
            else:
                state, err = "missing", "no GPU reading"
            hit(R_GPU_LOST, "gpu")
            values["gpu_state"] = state
            values["gpu_error"] = err
        else:
            known = (sample.slowdown_temp_c, sample.shutdown_temp_c, sample.max_operating_temp_c)
            if any(t is not None for t in known):
                self._gpu_thresholds = known
        th = effective_thresholds(cfg, *self._gpu_thresholds)
        values.update(
            warn_temp_c=th.warn_c,
            critical_temp_c=th.critical_c,
            warn_source=th.warn_source,
            critical_source=th.critical_source,
        )
        gpu_c = sample.temperature_c if sample is not None else None
        values["gpu_temp_c"] = gpu_c
        self._temperature("gpu", gpu_c, th.warn_c, th.critical_c, hit)

        # module ---------------------------------------------------------------------
        ntc_c = None
        if module is not None:
            age = last_frame_age_s if last_frame_age_s is not None else module.last_frame_age_s(now)
            up = module.link_up if link_up is None else link_up
            values["link_up"] = up
            values["last_frame_age_s"] = age
            stale = None
            if age is None:
                waited = now - self._first_at
                silent = waited > cfg.module_grace_s
                values["never_heard_s"] = waited
            else:
                silent = age > cfg.module_silent_s
                stale = self._stale_s(now, module)
                if stale is not None:
                    values["telemetry_stale_s"] = stale
                    if not silent:
                        silent = True
                        hit(R_MODULE_SILENT, "telemetry_stale")
            if silent:
                if R_MODULE_SILENT not in active:
                    hit(R_MODULE_SILENT, "module")
                for key in [k for k in self._latched if k.endswith(":module")]:
                    self._latched.discard(key)
                self._sticky.clear()
            else:  # telemetry is fresh enough to trust
                ntc_c = self._module_conditions(module, th, values, hit, now, gpu_c)
        else:
            values["module"] = None

        # cross-check: the module's GPU NTC against the GPU's own sensor --------------
        power_w = sample.power_w if sample is not None else None
        if power_w is None and ntc_c is not None:
            power_w = module.p_in_w
        kind = self._crosscheck.update(now, ntc_c, gpu_c, power_w, values)
        if kind is not None:
            hit(
                R_SENSOR_DISAGREE,
                {"ntc_frozen": "ntc_gpu", "gpu_frozen": "gpu"}.get(kind, "ntc_gpu"),
            )

        # early warning: time to the warn threshold from the recent slope -------------
        eta = None
        if gpu_c is not None:
            h = self._history
            if h and now < h[-1][0]:
                h.clear()  # time went backwards: start over
            h.append((now, gpu_c))
            while h and h[0][0] < now - cfg.early_warning_window_s:
                h.popleft()
            eta, slope = self.estimate_eta(gpu_c, th.warn_c)
            values["slope_c_per_s"] = None if slope is None else round(slope, 6)
        early = False
        if cfg.early_warning and R_OVER_TEMP not in active and R_CRITICAL_TEMP not in active:
            horizon = cfg.early_warning_horizon_s
            clear_at = horizon * EARLY_WARNING_CLEAR_FACTOR
            if eta is not None and (eta < horizon or (self._early_active and eta <= clear_at)):
                early = True
                hit(R_EARLY_WARNING, "gpu")
                values["early_warning_horizon_s"] = horizon
        self._early_active = early

        # level: up at once, down one level per min_hold_s ----------------------------
        raw = max((REASON_LEVELS[r] for r in active), default=NORMAL)
        prev_level = self.level
        if raw > self.level:
            self.level, self.level_since = raw, now
        elif raw < self.level and (
            self.level_since is None or now - self.level_since >= cfg.min_hold_s
        ):
            self.level, self.level_since = self.level - 1, now
        if self.level > raw:
            values["held_since"] = self.level_since
            values["min_hold_s"] = cfg.min_hold_s

        # target -----------------------------------------------------------------------
        original, mn = self.observe_limits(gpu, original_limit_w)
        values["original_limit_w"] = original
        values["min_limit_w"] = mn
        can_actuate = R_GPU_LOST not in active
        target = None
        if can_actuate:
            if self.level == WARN and original is not None:
                target = _clamp(cfg.warn_limit_fraction * original, mn, original)
            elif self.level == CRITICAL:
                if mn is not None:
                    target = mn
                elif original is not None:  # no constraints known: the WARN cut at least
                    target = cfg.warn_limit_fraction * original
            if psu_limit_w is not None:
                cap = _clamp(psu_limit_w, mn, original)
                if original is None or cap < original:
                    values["psu_limit_w"] = cap
                    hit(R_PSU_BUDGET, "psu")
                    target = cap if target is None else min(target, cap)
            if target is not None and original is not None and target >= original:
                target = None
        if target is not None:  # round for the log, without leaving [min, original]
            target = _clamp(_round_w(target), mn, original)

        reasons = [r for r in REASONS if r in active]
        if self.level > raw:
            reasons.append(R_HOLD)
        values["sources"] = {r: active[r] for r in reasons if r in active}
        changed = (
            self.level != prev_level or target != self.target_limit_w or reasons != self.reasons
        )
        self.target_limit_w = target
        self.reasons = reasons
        return Decision(
            level=self.level,
            target_limit_w=target,
            reasons=reasons,
            values=values,
            changed=changed,
            eta_s=eta,
            module_id=self.module_id or (module.module_id if module is not None else None),
            gpu_uuid=self.gpu_uuid or (sample.uuid if sample is not None else None),
            at=now,
            previous_level=prev_level,
            can_actuate=can_actuate,
        )

    def _module_conditions(self, module: ModuleStatus, th: Thresholds, values, hit, now, gpu_c):
        """Conditions from fresh module telemetry; returns the GPU NTC reading (degC)."""
        cfg = self.config
        faults = module.faults
        values["faults"] = module.fault_names()
        # fans
        stalled = module.stalled_fans()
        n_fans = module.fans or 2
        values["stalled_fans"] = stalled
        if stalled and stalled >= n_fans:
            hit(R_BOTH_FANS_STALLED, "module")
        elif stalled:
            hit(R_FAN_STALL, "module")
        # temperatures: the module's own limits (fault bits), then ours per channel
        if faults & C.FAULT_CRITICAL_TEMP:
            hit(R_CRITICAL_TEMP, "module_fault")
        elif faults & C.FAULT_OVER_TEMP:
            hit(R_OVER_TEMP, "module_fault")
        ntc_c = module.temperature_c("gpu")
        for ch, warn, crit in (
            ("gpu", th.warn_c, th.critical_c),
            ("vram", cfg.vram_warn_temp_c, cfg.vram_critical_temp_c),
            ("mos", cfg.mos_warn_temp_c, cfg.mos_critical_temp_c),
        ):
            t = module.temperature_c(ch)
            values[f"ntc_{ch}_c"] = t
            self._temperature(f"ntc_{ch}", t, warn, crit, hit, latch_suffix=":module")
        # 12 V input
        v = module.v_in_v
        values["v_in_v"] = v
        values["p_in_w"] = module.p_in_w
        if self._below("uv:module", v, cfg.under_voltage_v, cfg.hysteresis_v):
            hit(R_UNDER_VOLTAGE, "v_in")
            values["under_voltage_v"] = cfg.under_voltage_v
        if faults & C.FAULT_UNDER_VOLTAGE:
            hit(R_UNDER_VOLTAGE, "module_fault")
        self._blind_spots(module, th, values, hit, now, gpu_c, ntc_c)
        return ntc_c

    def _blind_spots(self, module: ModuleStatus, th: Thresholds, values, hit, now, gpu_c, ntc_c):
        """What the module does not alarm on but the host must: its control is degraded
        (a sensor fault, a tach it cannot trust) or held below automatic (MANUAL, hot)."""
        cfg = self.config
        faults = module.faults
        state, reason = module.state, module.reason
        # sensor faults: a controlled channel's NTC bit, or FAILSAFE for a sensor reason
        bad = [ch for i, ch in enumerate(C.CHANNELS[:3]) if faults & (1 << i)]
        if state == "FAILSAFE" and reason in _SENSOR_REASONS:
            bad.append(reason)
        if bad:
            kinds = [n for bit, n in ((C.FAULT_NTC_STUCK, "stuck"), (C.FAULT_NTC_IMPLAUSIBLE,
                     "implausible")) if faults & bit]  # fmt: skip
            values["sensor_fault"] = bad + kinds
        self._sticky_hit(R_SENSOR_FAULT, bool(bad), "module", now, hit)
        # implausible tach, confirmed for TACH_CONFIRM_S: a fan spinning down into a
        # stall reads implausible first, and a stall is fan_stall (the stronger verdict)
        tach = [i for i, bit in ((1, C.FAULT_FAN1_TACH), (2, C.FAULT_FAN2_TACH)) if faults & bit]
        if module.stalled_fans():
            tach = []
            self._sticky.pop(R_TACH_IMPLAUSIBLE, None)
        if tach:
            values["tach_implausible_fans"] = tach
            if self._tach_since is None or now < self._tach_since:
                self._tach_since = now
        else:
            self._tach_since = None
        confirmed = bool(tach) and now - self._tach_since >= TACH_CONFIRM_S
        self._sticky_hit(R_TACH_IMPLAUSIBLE, confirmed, "module", now, hit)
        # MANUAL below automatic while hot
        low = False
        if state == "MANUAL":
            hot_c = th.warn_c - cfg.manual_hot_margin_c
            t = gpu_c if gpu_c is not None else ntc_c
            hot = self._above("manual:hot", t, hot_c, cfg.hysteresis_c)
            err = module.target_error_c
            duties = [d for d in (module.fan_duty_ratio(i) for i in (1, 2)) if d is not None]
            duty = min(duties) if duties else None
            # A positive error winds the PID's integrator up: automatic control would
            # command more than any duty below full. No error known: no valid sensor,
            # and automatic control runs the fans at full.
            wants_more = err is None or self._above(
                "manual:err", err, cfg.manual_error_c, cfg.hysteresis_c
            )
            low = hot and wants_more and duty is not None and duty < MANUAL_FULL_DUTY
            values["manual"] = {"duty": duty, "target_error_c": err, "hot_c": hot_c}
        else:
            self._latched.discard("manual:hot")
            self._latched.discard("manual:err")
        self._sticky_hit(R_MANUAL_LOW_DUTY, low, "module", now, hit)


# --- PSU budget guard ------------------------------------------------------------------
@dataclass
class PsuMember:
    """One GPU on the guarded supply. Powers in W; None = unknown."""

    p_in_w: float | None  # the module's measured 12 V input (what the guard sums)
    gpu_power_w: float | None = None  # the GPU's own reading: used when p_in_w is unknown
    min_limit_w: float | None = None
    original_limit_w: float | None = None


@dataclass
class PsuVerdict:
    active: bool
    changed: bool  # active or any cap differs from the previous verdict
    total_w: float
    budget_w: float
    caps_w: dict  # key -> cap in W (only while active)
    values: dict = field(default_factory=dict)


def fit_budget(weights_w: Mapping, floors_w: Mapping, budget_w: float) -> dict:
    """Caps ``max(floor, s * weight)`` with one scale ``s <= 1`` so they sum to the budget.

    Water-filling: members pinned at their floor are taken out and the rest re-scaled.
    When even the floors exceed the budget every member gets its floor.

    >>> fit_budget({"a": 450, "b": 350, "c": 200}, {"a": 100, "b": 100, "c": 150}, 675)
    {'a': 295.3125, 'b': 229.6875, 'c': 150.0}
    """
    keys = list(weights_w)
    floor = {k: float(floors_w.get(k) or 0.0) for k in keys}
    pinned: set = set()
    while True:
        free = [k for k in keys if k not in pinned]
        room = budget_w - sum(floor[k] for k in pinned)
        weight = sum(weights_w[k] for k in free)
        if not free or room <= 0 or weight <= 0:
            return {k: floor[k] if k in pinned or room <= 0 else max(floor[k], 0.0) for k in keys}
        s = min(room / weight, 1.0)
        newly = {k for k in free if s * weights_w[k] < floor[k]}
        if not newly:
            return {k: floor[k] if k in pinned else s * weights_w[k] for k in keys}
        pinned |= newly


class PsuGuard:
    """Keeps the GPUs on one supply within ``capacity_w * margin``.

    Engages when the summed draw exceeds the budget. While engaged every member's cap
    is its original limit scaled by one common factor (floored at its minimum limit,
    rounded down to ``step_w``) so the caps sum to the budget: fair, and stable (the
    caps do not chase a noisy draw). Releases once the demand *as it would be
    uncapped* falls below ``budget * release_fraction`` and ``hold_s`` has passed:
    a GPU drawing within 5 % of its cap is assumed to want its original limit, so a
    capped load does not look like a light one.
    """

    PINNED_FRACTION = 0.95  # draw >= this * cap: the cap is what holds the GPU back

    def __init__(
        self,
        capacity_w: float,
        margin: float = 0.9,
        release_fraction: float = 0.8,
        step_w: float = 5.0,
        hold_s: float = 0.0,
    ):
        if not capacity_w or capacity_w <= 0:
            raise PolicyConfigError("policy config: psu_capacity_w must be > 0")
        self.capacity_w = float(capacity_w)
        self.margin = float(margin)
        self.release_fraction = float(release_fraction)
        self.step_w = float(step_w)
        self.hold_s = float(hold_s)
        self.active = False
        self.active_since: float | None = None
        self.caps_w: dict = {}

    @classmethod
    def from_config(cls, cfg: PolicyConfig) -> PsuGuard | None:
        if cfg.psu_capacity_w is None:
            return None
        return cls(
            cfg.psu_capacity_w,
            cfg.psu_margin,
            cfg.psu_release_fraction,
            cfg.psu_step_w,
            cfg.min_hold_s,
        )

    @property
    def budget_w(self) -> float:
        return self.capacity_w * self.margin

    def evaluate(self, now: float, members: Mapping[Hashable, PsuMember]) -> PsuVerdict:
        """One tick over the members on this supply (keyed as the caller likes)."""
        draws, unmeasured = {}, []
        for key, m in members.items():
            d = m.p_in_w if m.p_in_w is not None else m.gpu_power_w
            if d is None:
                unmeasured.append(key)
                d = 0.0
            draws[key] = max(float(d), 0.0)
        total = sum(draws.values())
        budget = self.budget_w
        was_active, old_caps = self.active, self.caps_w
        demand = total
        if self.active:
            demand = 0.0
            for k, d in draws.items():
                cap, orig = old_caps.get(k), members[k].original_limit_w
                pinned = cap is not None and d >= self.PINNED_FRACTION * cap
                demand += orig if pinned and orig is not None and orig > d else d
        if not self.active and total > budget:
            self.active, self.active_since = True, now
        elif (
            self.active
            and demand < budget * self.release_fraction
            and now - self.active_since >= self.hold_s
        ):
            self.active, self.active_since = False, None
        caps = {}
        if self.active:
            weights = {
                k: m.original_limit_w if m.original_limit_w is not None else draws[k]
                for k, m in members.items()
            }
            floors = {k: m.min_limit_w for k, m in members.items()}
            for k, w in fit_budget(weights, floors, budget).items():
                m = members[k]
                if self.step_w > 0:
                    w = math.floor(w / self.step_w + 1e-9) * self.step_w
                caps[k] = _clamp(_round_w(w), m.min_limit_w, m.original_limit_w)
        self.caps_w = caps
        values = {
            "total_w": round(total, 3),
            "demand_w": round(demand, 3),
            "budget_w": budget,
            "capacity_w": self.capacity_w,
            "release_below_w": budget * self.release_fraction,
        }
        if unmeasured:
            values["unmeasured"] = [str(k) for k in unmeasured]
        if self.active and sum(m.min_limit_w or 0.0 for m in members.values()) > budget:
            values["cannot_fit"] = True  # every GPU at its minimum is still too much
        return PsuVerdict(
            active=self.active,
            changed=self.active != was_active or caps != old_caps,
            total_w=total,
            budget_w=budget,
            caps_w=caps,
            values=values,
        )


# --- the engine: pairs + guard + event log ---------------------------------------------
@dataclass
class PairInput:
    """What the bridge knows about one pair this tick."""

    module_id: str | None
    gpu_uuid: str | None
    module: ModuleStatus | None = None
    gpu: GpuSample | GpuError | None = None
    link_up: bool | None = None
    last_frame_age_s: float | None = None
    original_limit_w: float | None = None  # the actuator's saved original

    @property
    def key(self) -> tuple:
        return (self.module_id, self.gpu_uuid)


class PolicyEngine:
    """Evaluates every pair and the PSU guard for one tick; logs what changed.

    ``log`` is anything with ``write(kind, **fields)`` (an :class:`EventLog`), or None.
    The engine never actuates: the bridge applies the returned decisions.
    """

    def __init__(self, config: PolicyConfig | None = None, log=None):
        self.config = config or PolicyConfig()
        self.log = log
        self.pairs: dict[tuple, PairPolicy] = {}
        self.psu = PsuGuard.from_config(self.config)

    def pair(self, module_id, gpu_uuid) -> PairPolicy:
        key = (module_id, gpu_uuid)
        p = self.pairs.get(key)
        if p is None:
            p = self.pairs[key] = PairPolicy(self.config, module_id, gpu_uuid)
        return p

    def _on_psu(self, inp: PairInput) -> bool:
        names = self.config.psu_gpus
        return names is None or inp.gpu_uuid in names or inp.module_id in names

    def step(self, now: float, inputs: Iterable[PairInput]) -> list[Decision]:
        inputs = list(inputs)
        caps = {}
        if self.psu is not None:
            members = {}
            for inp in inputs:
                if not self._on_psu(inp):
                    continue
                original, mn = self.pair(*inp.key).observe_limits(inp.gpu, inp.original_limit_w)
                sample = inp.gpu if isinstance(inp.gpu, GpuSample) else None
                members[inp.key] = PsuMember(
                    p_in_w=inp.module.p_in_w if inp.module is not None else None,
                    gpu_power_w=sample.power_w if sample is not None else None,
                    min_limit_w=mn,
                    original_limit_w=original,
                )
            verdict = self.psu.evaluate(now, members)
            caps = verdict.caps_w
            if verdict.changed:
                self._write(
                    "psu_guard",
                    active=verdict.active,
                    caps_w={_key_name(k): w for k, w in caps.items()},
                    values=verdict.values,
                )
                if verdict.active:
                    log.warning(
                        "PSU guard: %.0f W drawn over the %.0f W budget: capping %d GPU(s)",
                        verdict.total_w,
                        verdict.budget_w,
                        len(caps),
                    )
        decisions = []
        for inp in inputs:
            d = self.pair(*inp.key).evaluate(
                now,
                inp.module,
                inp.gpu,
                link_up=inp.link_up,
                last_frame_age_s=inp.last_frame_age_s,
                original_limit_w=inp.original_limit_w,
                psu_limit_w=caps.get(inp.key),
            )
            if d.changed:
                self._write("decision", **d.as_event())
                lvl = (
                    logging.WARNING
                    if d.level > NORMAL or d.previous_level > d.level
                    else (logging.INFO)
                )
                log.log(
                    lvl,
                    "policy %s/%s: %s -> %s, target %s W (%s)%s",
                    d.module_id,
                    d.gpu_uuid,
                    LEVEL_NAMES[d.previous_level],
                    d.level_name,
                    "original" if d.target_limit_w is None else f"{d.target_limit_w:g}",
                    ", ".join(d.reasons) or "all clear",
                    ""
                    if d.can_actuate
                    else f"; GPU unusable ({d.values.get('gpu_error')}):"
                    " no power-limit write possible",
                )
            decisions.append(d)
        return decisions

    def _write(self, kind, **fields):
        if self.log is not None:
            self.log.write(kind, **fields)


def _key_name(key) -> str:
    module_id, gpu_uuid = key
    return gpu_uuid if gpu_uuid is not None else str(module_id)
