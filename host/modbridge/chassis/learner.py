"""One module's chassis learner: the bridge feeds it each heartbeat, it answers with
the module's ``model.*`` parameters, the time to throttle and the cooling trend.

    learner = ChassisLearner(store_path)       # the trend's JSON (None: in memory)
    learner.observe(t_s=..., g=..., a=..., p_mw=..., duties=(d1, d2), rpms=(r1, r2),
                    die_c=..., gpu_power_w=..., slowdown_c=...)
    learner.report()          # a ChassisReport (exported as metrics)
    learner.config_fields()   # {"model.ok": 1, ...} once converged, else None

Every input may be missing (None), NaN or absurd: such a sample is skipped by the
part that needs it; nothing raises.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from modbridge.chassis import fw
from modbridge.chassis.dynamic import DieDynamics
from modbridge.chassis.probe import ProbeFit
from modbridge.chassis.trend import STEADY_S, CoolingTrend

STEADY_POWER_FRAC = 0.05  # steady: power within +-5 % (or 3 W) ...
STEADY_DUTY = 0.02 * 65535  # ... the duty within 2 % ...
STEADY_DIE_C = 1.0  # ... the die within 1 K (the GPU reads whole degrees)
STEADY_MIN_LOAD = 0.3  # ... at >= 30 % of the highest power seen (and 30 W)

FAN_MIN_DUTY = 0.3 * 65535  # RPM per duty is measured above this duty
FAN_K_ALPHA = 0.02  # the RPM-per-duty estimate's smoothing, per sample
TREND_EVERY_S = 60.0


@dataclass(frozen=True)
class ChassisReport:
    """What the learner says about one module (None: not known yet)."""

    converged: bool = False
    params: dict | None = None  # model.* keys (without the section), ints
    unc_c: float | None = None
    time_to_throttle_s: float | None = None  # at the current power and duty
    time_to_throttle_full_s: float | None = None  # at the current power, fans at 100 %
    conductance_ratio: float | None = None  # airflow conductance at the same duty / baseline
    fan_rpm_ratios: tuple = ()  # each fan's RPM per duty / baseline
    cooling_degraded: bool = False
    cause: str | None = None  # "dust" or "fan_wear"
    fan: int | None = None  # the worn fan (1-based)
    throttle_in_days: float | None = None  # at the current trend, full power, fans at 100 %
    inlet_c: float | None = None


def _f(v):
    """A finite float or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


class ChassisLearner:
    def __init__(self, store_path=None, fans: int = 2):
        self.fans = fans
        self.probe = ProbeFit()
        self.dyn = DieDynamics()
        self.trend = CoolingTrend(store_path, fans)
        self.fan_k: list[float | None] = [None] * fans  # RPM per unit duty (RPM at 100 %)
        self._last_t = None
        self._next_trend = None
        self.die_c = None
        self.slowdown_c = None
        self.power_w = None
        self.rpm_sum = None
        self.a_c = None
        self.p_max = 0.0
        self._recent = deque()  # (t, die, a, P, duty, rpm_sum) of the last STEADY_S

    def observe(self, t_s=None, g=None, a=None, p_mw=None, duties=(), rpms=(), die_c=None,
                gpu_power_w=None, slowdown_c=None) -> None:  # fmt: skip
        t = _f(t_s)
        if t is None:
            return
        dt = 1.0 if self._last_t is None else t - self._last_t
        if dt <= 0:
            return
        self._last_t = t
        duties = [_f(d) for d in (duties or ())][: self.fans]
        rpms = [_f(r) for r in (rpms or ())][: self.fans]
        ds = [d for d in duties if d is not None and 0 <= d <= fw.DUTY_FULL]
        duty = max(ds) if ds else None
        die = _f(die_c)
        die = die if die is not None and -40 <= die <= 150 else None
        slow = _f(slowdown_c)
        if slow is not None and 40 <= slow <= 150:
            self.slowdown_c = slow
        self.probe.observe(
            g, a, p_mw, duty, None if die is None else die * 1000.0,
            None if self.slowdown_c is None else self.slowdown_c * 1000.0,
            min(dt, 600.0) * 1000.0,
        )  # fmt: skip
        rs = [r for r in rpms if r is not None and 0 <= r <= 100000]
        rpm_sum = sum(rs) if rs else None
        power = _f(gpu_power_w)
        if power is None and _f(p_mw) is not None:
            power = p_mw / 1000.0
        a_c = None if _f(a) is None else a / 1000.0
        if dt <= 60 and None not in (die, a_c, power, rpm_sum):
            self.dyn.observe(die, a_c, power, rpm_sum, dt)
        self.die_c, self.power_w, self.rpm_sum, self.a_c = die, power, rpm_sum, a_c
        if None not in (die, a_c, power, rpm_sum, duty):
            self._recent.append((t, die, a_c, power, duty, rpm_sum))
            self.p_max = max(self.p_max, power)
        while self._recent and self._recent[0][0] < t - STEADY_S:
            self._recent.popleft()
        for i in range(min(len(duties), len(rpms))):
            d, r = duties[i], rpms[i]
            if d is not None and r is not None and d >= FAN_MIN_DUTY and 0 <= r <= 100000:
                k = r * fw.DUTY_FULL / d
                old = self.fan_k[i]
                self.fan_k[i] = k if old is None else old + FAN_K_ALPHA * (k - old)
        if self._next_trend is None:
            self._next_trend = t + TREND_EVERY_S
        if t >= self._next_trend:
            self._next_trend = t + TREND_EVERY_S
            r = self.steady_resistance()
            if r is not None:
                self.trend.steady(t, r[0], r[1], r[2], list(self.fan_k))
            self.trend.fans_sample(t, list(self.fan_k))

    def steady_resistance(self):
        """``((die - a) / P, duty, rpm_sum)`` means over the last STEADY_S if the
        module was steady all along, else None."""
        rec = self._recent
        if len(rec) < 3 or rec[-1][0] - rec[0][0] < 0.9 * STEADY_S:
            return None
        n = len(rec)
        cols = list(zip(*rec, strict=True))
        die, a, p, d, rpm = (sum(c) / n for c in cols[1:])
        if p < max(30.0, STEADY_MIN_LOAD * self.p_max):
            return None
        if max(cols[3]) - min(cols[3]) > max(3.0, STEADY_POWER_FRAC * p):
            return None
        if max(cols[4]) - min(cols[4]) > STEADY_DUTY:
            return None
        if max(cols[1]) - min(cols[1]) > STEADY_DIE_C:
            return None
        return (die - a) / p, d, rpm

    # -- derived -------------------------------------------------------------------
    def rpm_sum_at(self, duty: float) -> float | None:
        """The fans' summed RPM at ``duty`` (0..65535) from each fan's RPM per duty."""
        ks = [k for k in self.fan_k if k is not None]
        if not ks:
            return None
        return sum(ks) * duty / fw.DUTY_FULL

    def time_to_throttle(self, full: bool = False) -> float | None:
        if None in (self.die_c, self.slowdown_c, self.power_w, self.rpm_sum):
            return None
        rpm = self.rpm_sum
        if full:
            rpm = self.rpm_sum_at(fw.DUTY_FULL)
            if rpm is None:
                return None
            rpm = max(rpm, self.rpm_sum)
        return self.dyn.time_to_throttle(self.die_c, self.slowdown_c, self.power_w,
                                         self.rpm_sum, rpm)  # fmt: skip

    def throttle_in_days(self) -> float | None:
        """Days until, at the airflow conductance's current trend, the highest power
        seen with the fans at 100 % would bring the die to the slowdown (inf: the
        trend is flat or rising; 0: already)."""
        tr = self.trend
        slope, ratio = tr.slope_per_day(), tr.ratio()
        phi = tr.phi_base(fw.DUTY_FULL)
        if None in (slope, ratio, phi, self.slowdown_c, self.a_c) or self.p_max <= 0:
            return None
        r0, r1 = tr.baseline["r0"], tr.baseline["r1"]
        need = (self.slowdown_c - self.a_c) / self.p_max - r0  # airflow resistance allowed
        if need <= 0:
            return 0.0
        q_star = r1 * phi / need  # the conductance ratio at which it throttles
        if ratio <= q_star:
            return 0.0
        if slope >= 0:
            return math.inf
        return (ratio - q_star) / -slope

    def report(self) -> ChassisReport:
        params = self.probe.params()
        t = self.trend
        unc = params.get("unc_mc")
        return ChassisReport(
            converged=self.probe.converged(),
            params=params,
            unc_c=None if unc is None or not self.probe.evals else unc / 1000.0,
            time_to_throttle_s=self.time_to_throttle(False),
            time_to_throttle_full_s=self.time_to_throttle(True),
            conductance_ratio=t.ratio(),
            fan_rpm_ratios=tuple(t.fan_ratios()),
            cooling_degraded=t.degraded,
            cause=t.cause,
            fan=t.fan,
            throttle_in_days=self.throttle_in_days(),
            inlet_c=self.dyn.inlet_c(),
        )

    def config_fields(self) -> dict | None:
        """The ``config_set`` fields to send once converged (None before): every
        ``model.*`` key, clamped to the firmware's bounds, ``model.ok`` = 1."""
        if not self.probe.converged():
            return None
        return fw.config_fields(self.probe.params())
