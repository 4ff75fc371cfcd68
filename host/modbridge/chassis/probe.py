"""The module's probe -> die model, fitted on the host from ordinary operation.

Per sample (one a heartbeat, ~1 s): the GPU NTC ``g`` and ambient NTC ``a`` (m degC),
the module's input power ``p`` (mW) and fan duty ``d`` (the higher fan) from
telemetry, the GPU's die temperature (m degC) from the host. For every ``lead_ms`` of
:data:`LEADS` the model of :mod:`modbridge.chassis.fw` is linear in its other
parameters::

    die - g_lead = ga * (g_lead - a) + rp * P + rpd * (1 - d) * P + off     (P in W)

so each lead keeps its own normal equations (exponential forgetting, horizon
:data:`HORIZON_S`) and the lead with the smallest training error wins. One minute in
:data:`HOLDOUT_EVERY` is held out: never fitted, it gives the uncertainty
``unc_mc`` = the p95 of |die - est| of the integer formula with the clamped
parameters, over the last :data:`HOLDOUT_KEEP` held-out samples (at least
:data:`UNC_P99_MARGIN` times their p99: conditions the run has not seen are wider).

Converged (:meth:`ProbeFit.converged`; the criterion is documented in
docs/control.md, "The chassis model"):

* enough data: :data:`MIN_TRAIN` fitted and :data:`MIN_HOLDOUT` held-out samples;
* excitation: the input power's p10..p90 span >= max(:data:`MIN_POWER_SPAN_W`,
  :data:`MIN_POWER_SPAN_FRAC` of its p90) and the duty's p5..p95 span >=
  :data:`MIN_DUTY_SPAN` (of the last :data:`SPAN_KEEP` fitted samples);
* small: the held-out p95 <= :data:`MAX_UNC_MC`;
* stable: the last :data:`STABLE_EVALS` evaluations (one per :data:`EVAL_EVERY`
  samples) of ``unc_mc`` lie within max(500 m degC, 25 %) of each other.

Excitation and stability are needed once; from then on the model stays converged
while its held-out p95 stays under :data:`MAX_UNC_MC` (steady load afterwards does
not unlearn it: the forgetting keeps the old, exciting data for hours).
"""

from __future__ import annotations

import math
from collections import deque

from modbridge.chassis import fw
from modbridge.chassis.linalg import NormalEq, percentile

LEADS = (0, 1000, 2000, 3000, 4000, 6000, 8000, 10000, 12000, 15000, 20000)
HORIZON_S = 4 * 3600  # forgetting: old data weighs e^-1 after this many samples
HOLDOUT_EVERY = 5  # minute k is held out when k % 5 == 4
HOLDOUT_KEEP = 1800
SPAN_KEEP = 3600
EVAL_EVERY = 60
MIN_TRAIN = 600
MIN_HOLDOUT = 120
MIN_POWER_SPAN_W = 30.0
MIN_POWER_SPAN_FRAC = 0.25
MIN_DUTY_SPAN = 0.10 * 65535
MAX_UNC_MC = 5000
# unc_mc = max(p95, this x p99) of |die - est| held out: the held-out minutes share
# the run's conditions; a new load mix or room is wider (bench_model's held-out run)
UNC_P99_MARGIN = 1.25
STABLE_EVALS = 3
# plausibility of the inputs: outside -> the sample is skipped
TEMP_MC = (-40000, 150000)
POWER_MW = (0, 4000000)


def _num(v, lo, hi):
    """``v`` as a float within lo..hi, else None (None, NaN, bools, strings)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if not math.isfinite(v) or not lo <= v <= hi:
        return None
    return float(v)


class ProbeFit:
    """Fits the module's probe -> die model; see the module docstring."""

    def __init__(self):
        forget = 1.0 - 1.0 / HORIZON_S
        self.eqs = [NormalEq(4, forget) for _ in LEADS]
        self.g_slow = None
        self.t_s = 0.0  # sample time (s) since the start, from the dt given
        self.holdout = deque(maxlen=HOLDOUT_KEEP)  # (g, g_slow, a, p, d, die) ints
        self.spans = deque(maxlen=SPAN_KEEP)  # (P W, d)
        self.n_train = 0
        self.n_holdout = 0
        self.skipped = 0
        self.slow_mc = 0
        self.evals = deque(maxlen=STABLE_EVALS)
        self._since_eval = 0
        self._params = dict(fw.NONE)
        self._converged = False
        self._excited = False  # the excitation and stability were met once

    # -- data ---------------------------------------------------------------------
    def observe(self, g, a, p_mw, duty, die_mc, slowdown_mc=None, dt_ms=1000) -> bool:
        """One sample; False (skipped) if an input is missing or implausible."""
        g = _num(g, *TEMP_MC)
        a = _num(a, *TEMP_MC)
        p = _num(p_mw, *POWER_MW)
        d = _num(duty, 0, fw.DUTY_FULL)
        die = _num(die_mc, *TEMP_MC)
        dt = _num(dt_ms, 1, 600000)
        if None in (g, a, p, d, die, dt):
            self.skipped += 1
            return False
        g, a, p, d, die, dt = (int(round(v)) for v in (g, a, p, d, die, dt))
        s = _num(slowdown_mc, 60000, 100000)
        if s is not None:
            self.slow_mc = int(round(s))
        if self.g_slow is None or dt > 60000:
            self.g_slow = g
        else:
            self.g_slow += (g - self.g_slow) * dt // (fw.FILTER_MS + dt)
        self.t_s += dt / 1000.0
        if int(self.t_s // 60) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1:
            self.holdout.append((g, self.g_slow, a, p, d, die))
            self.n_holdout += 1
        else:
            pw = p / 1000.0
            x2, x3 = pw, (1.0 - d / fw.DUTY_FULL) * pw
            for lead_ms, eq in zip(LEADS, self.eqs, strict=True):
                gl = fw.lead(g, self.g_slow, lead_ms)
                eq.add((gl - a, x2, x3, 1.0), die - gl)
            self.spans.append((pw, d))
            self.n_train += 1
        self._since_eval += 1
        if self._since_eval >= EVAL_EVERY:
            self._since_eval = 0
            self.evaluate()
        return True

    # -- the fit --------------------------------------------------------------------
    def fit(self):
        """(lead_ms, theta, sse) of the best lead, or None before any data."""
        best = None
        for lead_ms, eq in zip(LEADS, self.eqs, strict=True):
            if eq.w < 8:
                continue
            theta = eq.solve(ridge=1e-4)
            if theta is None:
                continue
            theta = _clamp_theta(theta)
            sse = eq.sse(theta)
            if best is None or sse < best[2]:
                best = (lead_ms, theta, sse)
        return best

    def residuals(self, params) -> list[int]:
        """die - est of the held-out samples under ``params`` (clamped), m degC."""
        pr = fw.clamp(params)
        return [die - fw.estimate(pr, g, gs, a, p, d) for g, gs, a, p, d, die in self.holdout]

    def evaluate(self) -> dict:
        """Refit, measure the held-out residual, update :meth:`params`/:meth:`converged`."""
        best = self.fit()
        if best is None:
            return self._params
        lead_ms, theta, _ = best
        params = {
            "ok": 0,
            "lead_ms": lead_ms,
            "ga_q12": int(round(theta[0] * 4096)),
            "rp_mcw": int(round(theta[1])),
            "rpd_mcw": int(round(theta[2])),
            "off_mc": int(round(theta[3])),
            "unc_mc": fw.BOUNDS["unc_mc"][1],
            "slow_mc": self.slow_mc,
        }
        res = self.residuals(params)
        if len(res) >= MIN_HOLDOUT:
            ab = [abs(r) for r in res]
            unc = int(max(percentile(ab, 0.95), UNC_P99_MARGIN * percentile(ab, 0.99)))
            params["unc_mc"] = unc
            self.evals.append(unc)
        params = fw.clamp(params)
        self._converged = self._check(params)
        params["ok"] = 1 if self._converged else 0
        self._params = params
        return params

    def excitation(self) -> tuple[float, float]:
        """(power span W (p10..p90), duty span (p5..p95)) of the recent fitted samples."""
        if len(self.spans) < 10:
            return 0.0, 0.0
        ps = [s[0] for s in self.spans]
        ds = [s[1] for s in self.spans]
        return percentile(ps, 0.9) - percentile(ps, 0.1), percentile(ds, 0.95) - percentile(
            ds, 0.05
        )

    def _check(self, params) -> bool:
        if self.n_train < MIN_TRAIN or len(self.holdout) < MIN_HOLDOUT:
            return False
        if len(self.evals) < STABLE_EVALS or params["unc_mc"] > MAX_UNC_MC:
            return False
        if self._excited:  # once excited, the residual alone keeps it converged
            return True
        p_span, d_span = self.excitation()
        p90 = percentile([s[0] for s in self.spans], 0.9) or 0.0
        if p_span < max(MIN_POWER_SPAN_W, MIN_POWER_SPAN_FRAC * p90) or d_span < MIN_DUTY_SPAN:
            return False
        lo, hi = min(self.evals), max(self.evals)
        self._excited = hi - lo <= max(500, 0.25 * hi)
        return self._excited

    def converged(self) -> bool:
        return self._converged

    def params(self) -> dict:
        """The ``model.*`` parameters (ints, within bounds; ``ok`` 1 once converged),
        keyed without the section (``fw.config_fields`` adds it)."""
        return dict(self._params)


def _clamp_theta(theta):
    """The fitted parameters within the wire's bounds (in their float units)."""
    ga_lo, ga_hi = fw.BOUNDS["ga_q12"]
    out = [
        min(max(theta[0], ga_lo / 4096), ga_hi / 4096),
        min(max(theta[1], fw.BOUNDS["rp_mcw"][0]), fw.BOUNDS["rp_mcw"][1]),
        min(max(theta[2], fw.BOUNDS["rpd_mcw"][0]), fw.BOUNDS["rpd_mcw"][1]),
        min(max(theta[3], fw.BOUNDS["off_mc"][0]), fw.BOUNDS["off_mc"][1]),
    ]
    return out
