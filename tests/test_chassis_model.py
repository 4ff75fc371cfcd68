"""The host's chassis model (modbridge.chassis; issue 25 items 1, 5, 6): the probe ->
die fit recovers known parameters, its wire parameters stay in bounds whatever comes
in, the time to throttle matches closed-form cases, the cooling trend sees injected
loss and stays quiet on healthy noise."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modbridge.chassis import ChassisLearner, fw
from modbridge.chassis import dynamic as D
from modbridge.chassis import trend as T
from modbridge.chassis.probe import ProbeFit

# -- the firmware's formula ------------------------------------------------------------


def test_estimate_is_the_design_notes_integer_formula():
    p = fw.clamp({"ok": 1, "lead_ms": 4000, "ga_q12": 1024, "rp_mcw": 40, "rpd_mcw": 20,
                  "off_mc": 500, "unc_mc": 1500, "slow_mc": 87000})  # fmt: skip
    g, gs, a, pw, d = 60000, 58000, 30000, 300000, 32768
    gl = g + 4000 * (g - gs) // 4000  # 62000
    want = gl + ((1024 * (gl - a)) >> 12) + (40 + 20 * (65535 - d) // 65535) * pw // 1000 + 500
    assert fw.estimate(p, g, gs, a, pw, d) == want == 62000 + 8000 + 49 * 300 + 500
    # negative products floor like MicroPython's small ints
    p2 = dict(p, ga_q12=-2048)
    assert fw.estimate(p2, 30001, 30001, 40000, 0, 65535) == 30001 + ((-2048 * -9999) >> 12) + 500


def test_evaluator_filters_like_the_module_and_adds_unc():
    ev = fw.Evaluator({"ok": 1, "lead_ms": 0, "unc_mc": 2000})
    assert ev.step(50000, 25000, 0, 0, 100) == 50000 + 2000  # first sample: g_slow = g
    ev.step(54000, 25000, 0, 0, 100)
    assert ev.g_slow == 50000 + 4000 * 100 // 4100
    assert fw.Evaluator({"ok": 0}).step(50000, 25000, 0, 0, 100) is None


_garbage = st.one_of(
    st.none(), st.booleans(), st.text(max_size=3), st.integers(-10**12, 10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=2),
)  # fmt: skip


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(fw.KEYS + ("junk",)), _garbage))
def test_clamp_always_gives_every_key_in_bounds(params):
    out = fw.clamp(params)
    assert set(out) == set(fw.KEYS)
    for k, v in out.items():
        assert type(v) is int
        lo, hi = fw.BOUNDS[k]
        assert lo <= v <= hi or (k == "slow_mc" and v == 0)
    fields = fw.config_fields(params)
    assert set(fields) == {"model." + k for k in fw.KEYS}
    assert fw.clamp("not a dict") == fw.clamp({}) == fw.NONE


# -- the probe -> die fit ---------------------------------------------------------------


def _synthetic_run(truth, minutes, seed=1, noise_mc=100):
    """Samples whose die is exactly the model ``truth`` (the firmware's formula) plus
    noise, under power and duty that move like ordinary load."""
    rng = random.Random(seed)
    g_slow = None
    g = 45000.0
    out = []
    p_w, d = 100.0, 20000
    for s in range(minutes * 60):
        if s % 90 == 0:
            p_w = rng.uniform(30, 400)
            d = rng.randint(13107, 65535)
        a = 25000 + rng.randint(-300, 300)
        g += ((35000 + 80 * p_w * (1.2 - d / 65535)) - g) / 20.0  # a lagging probe
        gi = int(g)
        g_slow = gi if g_slow is None else g_slow + (gi - g_slow) * 1000 // 5000
        pm = int(p_w * 1000)
        die = fw.estimate(truth, gi, g_slow, a, pm, d) + int(rng.gauss(0, noise_mc))
        out.append((gi, a, pm, d, die))
    return out


def test_fit_recovers_known_parameters():
    truth = fw.clamp({"ok": 1, "lead_ms": 8000, "ga_q12": 600, "rp_mcw": 35, "rpd_mcw": 25,
                      "off_mc": 1200, "unc_mc": 500, "slow_mc": 87000})  # fmt: skip
    fit = ProbeFit()
    for g, a, p, d, die in _synthetic_run(truth, 40):
        assert fit.observe(g, a, p, d, die, 87000, 1000)
    got = fit.params()
    assert fit.converged() and got["ok"] == 1
    assert got["lead_ms"] == 8000
    assert abs(got["ga_q12"] - 600) <= 40
    assert abs(got["rp_mcw"] - 35) <= 2 and abs(got["rpd_mcw"] - 25) <= 3
    assert abs(got["off_mc"] - 1200) <= 400
    assert 500 <= got["unc_mc"] <= 600  # 1.25 x the noise's p99 (|N(0, 100)|: ~260), floored at 500
    assert got["slow_mc"] == 87000


def test_no_convergence_without_excitation():
    fit = ProbeFit()
    truth = fw.clamp({"ok": 1, "rp_mcw": 30})
    for _ in range(3600):  # an hour at one power and one duty
        fit.observe(50000, 25000, 200000, 30000, fw.estimate(truth, 50000, 50000, 25000,
                                                            200000, 30000), None, 1000)  # fmt: skip
    assert not fit.converged()
    assert fit.params()["ok"] == 0


_value = st.one_of(_garbage, st.integers(-200000, 200000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.sampled_from(
    ("t_s", "g", "a", "p_mw", "duties", "rpms", "die_c", "gpu_power_w", "slowdown_c")),
    _value), max_size=80))  # fmt: skip
def test_learner_survives_garbage_and_keeps_bounds(samples):
    lr = ChassisLearner()
    for i, s in enumerate(samples):
        s = dict(s)
        if not isinstance(s.get("duties"), (list, tuple)):
            s.pop("duties", None)
        if not isinstance(s.get("rpms"), (list, tuple)):
            s.pop("rpms", None)
        s.setdefault("t_s", float(i))
        lr.observe(**s)
    r = lr.report()
    for k, v in r.params.items():
        lo, hi = fw.BOUNDS[k]
        assert type(v) is int and (lo <= v <= hi or (k == "slow_mc" and v == 0))
    assert lr.config_fields() is None or lr.config_fields()["model.ok"] == 1
    for v in (r.time_to_throttle_s, r.time_to_throttle_full_s):
        assert v is None or v >= 0


def test_learner_skips_nan_none_and_absurd_samples():
    lr = ChassisLearner()
    lr.observe(t_s=1.0, g=float("nan"), a=None, p_mw=-5, duties=(None, 70000),
               rpms=("x",), die_c=1e9, gpu_power_w=math.inf, slowdown_c=-3)  # fmt: skip
    lr.observe(t_s=float("nan"))
    lr.observe()
    assert lr.probe.n_train + lr.probe.n_holdout == 0
    assert lr.dyn.blocks == 0
    assert lr.report().params == fw.NONE


# -- time to throttle -----------------------------------------------------------------------


def _first_order_learner(r_kw=0.1, tau_s=150.0, amb=25.0, hours=3, seed=3):
    """A die that is one first-order lag (tau_s, one of the model's own time constants)
    of r_kw K/W over a fixed ambient, under seeded power steps."""
    dyn = D.DieDynamics()
    rng = random.Random(seed)
    x = 0.0
    p = 100.0
    for s in range(int(hours * 3600)):
        if s % 400 == 0:
            p = rng.uniform(50, 450) if s < hours * 3600 - 1800 else 100.0  # ends settled
        x += (r_kw * p - x) * (1 - math.exp(-1 / tau_s))
        dyn.observe(amb + x, amb, p, 3000.0, 1.0)
    return dyn, amb + x, p


@pytest.mark.parametrize("power", [300.0, 450.0])
def test_time_to_throttle_matches_the_first_order_closed_form(power):
    dyn, die, _ = _first_order_learner()
    assert dyn.ready() and die == pytest.approx(35.0, abs=0.1)  # settled at 100 W
    ss = 25.0 + 0.1 * power
    for slowdown in (die + 0.5 * (ss - die), die + 0.8 * (ss - die)):
        got = dyn.time_to_throttle(die, slowdown, power, 3000.0, 3000.0)
        want = 150.0 * math.log((ss - die) / (ss - slowdown))
        assert got == pytest.approx(want, rel=0.2), (slowdown, got, want)
    beyond = 25.0 + 1.15 * (ss - 25.0)  # 15 % over the steady rise: never reached
    assert dyn.time_to_throttle(die, beyond, power, 3000.0, 3000.0) == math.inf
    assert dyn.time_to_throttle(die, die - 1.0, power, 3000.0, 3000.0) == 0.0


def test_time_to_throttle_is_none_before_the_model_is_ready():
    dyn = D.DieDynamics()
    dyn.observe(50.0, 25.0, 100.0, 3000.0, 1.0)
    assert not dyn.ready()
    assert dyn.time_to_throttle(50.0, 80.0, 300.0, 3000.0, 3000.0) is None


# -- the cooling trend ------------------------------------------------------------------------


def _feed_trend(trend, hours, r_of, k_of, seed=5, noise=0.03, duties=(26214, 39321, 52428),
                start_h=0):  # fmt: skip
    """Steady measurements every 10 minutes (``r_of(t_h, duty)``), fans each minute."""
    rng = random.Random(seed)
    for minute in range(int(start_h * 60), int((start_h + hours) * 60)):
        t = minute * 60.0
        k = k_of(t / 3600.0)
        if minute % 10 == 0:
            d = duties[(minute // 10) % len(duties)]
            rpm = sum(k) * d / 65535.0
            r = r_of(t / 3600.0, rpm) * (1.0 + rng.gauss(0, noise))
            trend.steady(t, r, d, rpm, k)
        trend.fans_sample(t, k)


def _r(share_of_t, r0=0.03, r1=0.05):
    return lambda t_h, rpm: r0 + r1 * D.phi_of(rpm * share_of_t(t_h))


def test_trend_names_dust_when_the_airflow_falls(tmp_path):
    tr = T.CoolingTrend(tmp_path / "m.json")
    # healthy for a day, then 10 % less airflow a day
    share = lambda t_h: 1.0 if t_h < 24 else max(0.3, 1.0 - 0.1 * (t_h - 24) / 24)  # noqa: E731
    _feed_trend(tr, 24 * 3, _r(share), lambda t_h: [3000.0, 3000.0])
    assert tr.baseline is not None
    assert not tr.degraded  # 20 % less airflow at 72 h... ratio ~0.8
    _feed_trend(tr, 24 * 2, _r(share), lambda t_h: [3000.0, 3000.0], start_h=72)
    assert tr.degraded and tr.cause == "dust" and tr.fan is None
    assert tr.ratio() <= T.DEGRADED_RATIO


def test_trend_names_the_worn_fan():
    tr = T.CoolingTrend()
    wear = lambda t_h: 1.0 if t_h < 24 else max(0.2, 1.0 - 0.1 * (t_h - 24) / 24)  # noqa: E731
    k_of = lambda t_h: [3000.0, 3000.0 * wear(t_h)]  # noqa: E731
    _feed_trend(tr, 24 * 5, _r(lambda t_h: 1.0), k_of)
    assert tr.degraded and tr.cause == "fan_wear" and tr.fan == 2


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.floats(0.0, 0.08))
def test_trend_quiet_on_a_healthy_noisy_chassis(seed, noise):
    tr = T.CoolingTrend()
    rng = random.Random(seed)
    k = 2800.0 + rng.uniform(-200, 200)
    _feed_trend(tr, 72, _r(lambda t_h: 1.0), lambda t_h: [k, k * 1.01], seed=seed, noise=noise)
    assert not tr.degraded
    assert tr.ratio() is None or tr.ratio() > 0.85


def test_trend_persists_and_recovers_from_a_bad_file(tmp_path):
    path = tmp_path / "chassis" / "m.json"
    tr = T.CoolingTrend(path)
    _feed_trend(tr, 30, _r(lambda t_h: 1.0), lambda t_h: [3000.0, 3000.0])
    assert path.is_file() and tr.baseline is not None
    again = T.CoolingTrend(path)
    assert again.baseline == json.loads(path.read_text())["baseline"] == tr.baseline
    assert again.points == tr.points
    path.write_text("{not json")
    fresh = T.CoolingTrend(path)
    assert fresh.baseline is None and fresh.points == []
    path.write_text(json.dumps({"version": T.VERSION, "baseline": {"r0": "x"}, "points": 5}))
    assert T.CoolingTrend(path).baseline is None


def test_fit_baseline_splits_fixed_and_airflow_resistance():
    pts = [(0.03 + 0.05 * p, p) for p in (0.2, 0.3, 0.4, 0.5, 0.8)]
    r0, r1 = T.fit_baseline(pts)
    assert r0 == pytest.approx(0.03) and r1 == pytest.approx(0.05)
    # no spread in phi: the whole resistance counts as airflow (never a false alarm)
    r0, r1 = T.fit_baseline([(0.06, 0.5)] * 5)
    assert r0 == 0.0 and r1 == pytest.approx(0.12)
    assert T.fit_baseline([]) is None


def test_nonneg_least_squares_recovers_and_clips():
    from modbridge.chassis.linalg import NormalEq

    rng = random.Random(2)
    eq = NormalEq(3, 0.9999)
    for _ in range(2000):
        x = [rng.random(), rng.random(), 1.0]
        eq.add(x, 2.0 * x[0] - 0.5 * x[1] + 3.0 + rng.gauss(0, 0.01))
    free = eq.solve(1e-9)
    assert free[0] == pytest.approx(2.0, abs=0.02) and free[1] == pytest.approx(-0.5, abs=0.02)
    nn = eq.solve_nonneg(free=(2,), ridge=1e-9)
    assert nn[1] == 0.0 and nn[0] > 0  # the negative gain clipped, the rest refitted
    assert eq.sse(nn) > eq.sse(free)
