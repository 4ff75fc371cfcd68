"""The host's dynamic model of the die (never sent to the module): time constants,
airflow conductance against fan speed, the inlet temperature; time to throttle.

Samples (one per heartbeat) are averaged into blocks of :data:`BLOCK_S`. The GPU's
power ``P`` drives a bank of first-order filters ``F_i`` (time constants
:data:`TAUS_S`, 0 = P itself): any linear thermal network's response to power is a
sum of such modes, and the bank spans the die's (~1 s), the heatsink's (tens of s) and
the chassis air's (minutes). The airflow enters through ``phi = 1000 / RPM_sum``
(a forced path's resistance goes as 1 / flow; the fans' summed RPM is the flow), so
each mode's gain is ``c_i + d_i phi``. Two regressions, each linear in its
parameters, fitted with exponential forgetting (:data:`HORIZON_S`), every gain
``c_i, d_i, e_i, h_i >= 0`` (a passive thermal network's step response to power is
a positive sum of exponentials; :meth:`NormalEq.solve_nonneg`)::

    die - a = sum_i (c_i + d_i phi) F_i + c_0        (the die over the ambient probe)
    a       = T_in + sum_i (e_i + h_i phi) F_i       (the ambient probe over the inlet)

The second one is the inlet: an ambient probe at the inlet learns e, h ~ 0 and
``T_in`` ~ a; one in the chassis air reads warmer under load, and ``T_in`` is what
is left when its load-driven part is taken off (``inlet_c``).

Steady die rise per watt at ``phi``: ``R(phi) = sum (c_i + e_i) + phi sum (d_i + h_i)``;
its airflow part ``phi sum (d_i + h_i)`` is the conductance trended for dust
(:meth:`DieDynamics.flow_conductance`).

Time to throttle (:meth:`DieDynamics.time_to_throttle`): power and fan speed held, every
filter relaxes to ``P`` (``F_i(t) = P + (F_i - P) e^{-t/tau_i}``), so the die's
prediction is ``die_now + model(t) - model(0)`` (anchored on the measured die): the
first ``t`` where it reaches the slowdown, found on a log grid and bisected; ``inf``
if it never does within :data:`TTT_MAX_S`.
"""

from __future__ import annotations

import math

from modbridge.chassis.linalg import NormalEq

BLOCK_S = 5.0
TAUS_S = (0.0, 10.0, 40.0, 150.0, 600.0, 2400.0)
HORIZON_S = 12 * 3600.0
RIDGE = 1e-3
SWEEPS = 40  # coordinate-descent sweeps per refit (warm-started from the last fit)
MIN_BLOCKS = 360  # 30 minutes before predictions
MIN_POWER_SPAN_W = 30.0
RPM_FLOOR = 200.0
TTT_MAX_S = 6 * 3600.0
N = len(TAUS_S)


def phi_of(rpm_sum: float) -> float:
    """The airflow's resistance feature: 1000 / summed RPM (floored)."""
    return 1000.0 / max(RPM_FLOOR, rpm_sum)


class DieDynamics:
    """See the module docstring. :meth:`observe` takes one sample; predictions are
    None until :meth:`ready`."""

    def __init__(self):
        forget = math.exp(-BLOCK_S / HORIZON_S)
        self.die_eq = NormalEq(2 * N + 1, forget)
        self.amb_eq = NormalEq(2 * N + 1, forget)
        self.alphas = [1.0 if t <= 0 else 1.0 - math.exp(-BLOCK_S / t) for t in TAUS_S]
        self.f = None  # filter states (W)
        self._acc = [0.0, 0.0, 0.0, 0.0, 0.0]  # die, a, P, rpm_sum, seconds
        self.blocks = 0
        self.p_lo = math.inf
        self.p_hi = -math.inf
        self.die_theta = None
        self.amb_theta = None
        self.last = None  # (die, a, P, rpm_sum) of the last block
        self._fit_due = 0

    def observe(self, die_c, amb_c, power_w, rpm_sum, dt_s=1.0) -> None:
        for v in (die_c, amb_c, power_w, rpm_sum, dt_s):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return
        if not (-40 <= die_c <= 150 and -40 <= amb_c <= 150 and 0 <= power_w <= 5000):
            return
        if not (0 <= rpm_sum <= 100000 and 0 < dt_s <= 60):
            return
        acc = self._acc
        acc[0] += die_c * dt_s
        acc[1] += amb_c * dt_s
        acc[2] += power_w * dt_s
        acc[3] += rpm_sum * dt_s
        acc[4] += dt_s
        if acc[4] >= BLOCK_S:
            s = acc[4]
            self._block(acc[0] / s, acc[1] / s, acc[2] / s, acc[3] / s)
            self._acc = [0.0, 0.0, 0.0, 0.0, 0.0]

    def _block(self, die, a, p, rpm_sum) -> None:
        if self.f is None:
            self.f = [p] * N
        else:
            self.f = [f + al * (p - f) for f, al in zip(self.f, self.alphas, strict=True)]
        phi = phi_of(rpm_sum)
        x = self._x(self.f, phi)
        self.die_eq.add(x + [1.0], die - a)
        self.amb_eq.add(x + [1.0], a)
        self.blocks += 1
        self.p_lo = min(self.p_lo, p)
        self.p_hi = max(self.p_hi, p)
        self.last = (die, a, p, rpm_sum)
        self._fit_due -= 1
        if self._fit_due <= 0:
            self._fit_due = 12  # once a minute
            self.fit()

    @staticmethod
    def _x(f, phi):
        return list(f) + [v * phi for v in f]

    def fit(self) -> None:
        if self.blocks < 2 * N + 2:
            return
        # a passive thermal network's step response to power is a positive sum of
        # exponentials: every mode's gain c_i + d_i phi >= 0 (c_i, d_i >= 0)
        th = self.die_eq.solve_nonneg(free=(2 * N,), ridge=RIDGE, sweeps=SWEEPS,
                                      start=self.die_theta)  # fmt: skip
        ta = self.amb_eq.solve_nonneg(free=(2 * N,), ridge=RIDGE, sweeps=SWEEPS,
                                      start=self.amb_theta)  # fmt: skip
        if th is not None:
            self.die_theta = th
        if ta is not None:
            self.amb_theta = ta

    def ready(self) -> bool:
        return (
            self.blocks >= MIN_BLOCKS
            and self.die_theta is not None
            and self.amb_theta is not None
            and self.p_hi - self.p_lo >= MIN_POWER_SPAN_W
        )

    # -- what the model says ------------------------------------------------------
    def _rise(self, theta, f, phi):
        return sum((theta[i] + theta[N + i] * phi) * f[i] for i in range(N))

    def rise_per_w(self, phi: float) -> float | None:
        """Steady die rise over the inlet per watt at ``phi`` (K/W)."""
        if not self.ready():
            return None
        th, ta = self.die_theta, self.amb_theta
        return sum(th[i] + ta[i] + (th[N + i] + ta[N + i]) * phi for i in range(N))

    def flow_conductance(self, phi: float) -> float | None:
        """The airflow path's conductance at ``phi`` (W/K): 1 / its steady resistance
        ``phi * sum(d_i + h_i)``; None before :meth:`ready` or when the fit finds no
        airflow dependence."""
        if not self.ready():
            return None
        th, ta = self.die_theta, self.amb_theta
        r = phi * sum(th[N + i] + ta[N + i] for i in range(N))
        return 1.0 / r if r > 1e-6 else None

    def inlet_c(self) -> float | None:
        """The inlet (room) temperature: the ambient probe less its load-driven rise."""
        if not self.ready() or self.last is None:
            return None
        phi = phi_of(self.last[3])
        return self.last[1] - self._rise(self.amb_theta, self.f, phi)

    def predict(self, t_s, die_now, power_w, phi_now, phi) -> float:
        """The die (degC) ``t_s`` from now at ``power_w`` and ``phi`` held (anchored
        on ``die_now``, the model's own value at the current state)."""
        th, ta = self.die_theta, self.amb_theta
        f_t = [power_w + (f - power_w) * math.exp(-t_s / tau) if tau > 0 else power_w
               for f, tau in zip(self.f, TAUS_S, strict=True)]  # fmt: skip
        now = self._rise(th, self.f, phi_now) + self._rise(ta, self.f, phi_now)
        then = self._rise(th, f_t, phi) + self._rise(ta, f_t, phi)
        return die_now + then - now

    def time_to_throttle(self, die_now, slowdown_c, power_w, rpm_sum_now, rpm_sum) -> float | None:
        """Seconds until the die reaches ``slowdown_c`` at ``power_w`` and fans at
        ``rpm_sum`` from now on (``inf``: not within TTT_MAX_S); None without a model."""
        if not self.ready():
            return None
        for v in (die_now, slowdown_c, power_w, rpm_sum_now, rpm_sum):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return None
        if die_now >= slowdown_c:
            return 0.0
        p0, p1 = phi_of(rpm_sum_now), phi_of(rpm_sum)
        prev = 0.0
        t = 1.0
        while t <= TTT_MAX_S:
            if self.predict(t, die_now, power_w, p0, p1) >= slowdown_c:
                lo, hi = prev, t
                for _ in range(30):
                    mid = 0.5 * (lo + hi)
                    if self.predict(mid, die_now, power_w, p0, p1) >= slowdown_c:
                        hi = mid
                    else:
                        lo = mid
                return hi
            prev = t
            t *= 1.15
        return math.inf
