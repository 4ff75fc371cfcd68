"""device.selftest over any fan and any tach noise within the tolerance it claims
(hypothesis, CPython): a healthy fan of the model passes, a stalled or weak one fails
and is named.

Healthy, as the fan model (device/floors.py) defines it: at 100 % at least the model's
``rpm_nominal``, and from the model's ``rpm_check_duty`` up its RPM curve on or above
the line from 0 to full speed (here: a line with an intercept of 0..50 % of full).
The fan runs at 20..100 % of its full speed when the test starts (the firmware never
drives it below ``min_duty``) and moves towards a new duty's RPM by a fraction of the
way per second: 30..100 % (a time constant up to 2.8 s; the simulated fans have 0.8 to
2.5 s) with RPM windows of 0.5 or 1 s, 40..100 % (up to 2 s) with 2 s windows. The
tolerance (device/selftest.py): each reading within 1 tach pulse + 2 % of the speed,
and at most one reading in any six off by anything (a spike or a dropout).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from device import floors
from device import selftest as ST
from protocol import catalog as C

MODELS = sorted(floors.FAN_MODELS)
STALLED = ST.WHY.index("stalled")
WEAK = ST.WHY.index("weak")


class Fan:
    def __init__(self, model, ppr, window_ms):
        self.rpm = 0
        self.duty = 65535
        self.rpm_window_ms = window_ms
        self.pulses_per_rev = ppr
        self.min_duty = 13107
        self.model = floors.FAN_MODELS[model]
        self.rpm_floor = floors.rpm_floor(self.model)


class App:
    def __init__(self, fans):
        self.fans = fans
        self.ntc_open = self.ntc_short = 0
        self.temps = [40000, 45000, 50000, 30000]
        self.pm = [12000, 5000, 60000]
        self.pm_fault = False
        self.pushed = []
        self.events = self
        self.sup = self
        self.state = C.STATE_HOSTED

    def push(self, *a):
        self.pushed.append(a)


@st.composite
def tach(draw, curve_full=None):
    """One fan's tach: (model, ppr, window, full, intercept %, approach %, noise). The
    window is the module's (``_window``): the self-test reads each fan once per window
    of the slowest, so the one-in-six of its readings is that of both fans alike."""
    model = draw(st.sampled_from(MODELS))
    ppr = draw(st.sampled_from([1, 2, 4]))
    window = 1000
    nominal = floors.FAN_MODELS[model][floors.FM_RPM_NOMINAL]
    full = draw(curve_full(model, ppr, window) if curve_full else st.integers(nominal, 20000))
    intercept = draw(st.integers(0, 50))
    approach = draw(st.integers(30, 100))  # % of the way per second (see run)
    start = draw(st.integers(20, 100))  # % of full at the start: never below min_duty
    outlier_pct = draw(st.integers(0, 30))
    rnd = draw(st.randoms(use_true_random=False))
    return model, ppr, window, full, intercept, approach, start, outlier_pct, rnd


def run(tachs, curves, window=1000):
    """Run a SelfTest on fans with these tachs and RPM windows of ``window`` ms;
    ``curves[i](duty)`` the true RPM."""
    # 2 s windows: 10 of them a step, for a time constant up to 2 s (40 % a second)
    tachs = [t[:2] + (window,) + t[3:5] + (max(t[5], 40 if window > 1000 else 0),) + t[6:]
             for t in tachs]  # fmt: skip
    fans = [Fan(t[0], t[1], t[2]) for t in tachs]
    app = App(fans)
    speed = [t[3] * t[6] // 100 for t in tachs]
    last_outlier = [-9, -9]
    k = [0, 0]
    test = ST.SelfTest(0, 1)
    t = 0
    while t < 4 * max(ST.STEP_MAX_MS, 10 * window) + 10000:
        t += 100
        d = test.duty(t)
        for i, f in enumerate(fans):
            f.duty = d
            model, ppr, window, full, _, approach, _, outlier_pct, rnd = tachs[i]
            if t % window:
                continue
            target = curves[i](d)
            left = (1.0 - approach / 100.0) ** (window / 1000.0)  # of the way, after a window
            speed[i] = target + int((speed[i] - target) * left)
            res = 60000 // (ppr * window)
            jitter = res + speed[i] * 2 // 100
            reading = speed[i] + rnd.randint(-jitter, jitter)
            if k[i] - last_outlier[i] >= 6 and rnd.randint(1, 100) <= outlier_pct:
                last_outlier[i] = k[i]
                reading = rnd.randint(0, 2 * full + 1000)
            f.rpm = max(0, reading)
            k[i] += 1
        if test.update(t, app):
            return test, test.report()
    raise AssertionError("the self-test did not end")


def line(full, intercept):
    return lambda d: full * intercept // 100 + full * (100 - intercept) // 100 * d // 65535


WINDOWS = st.sampled_from([500, 1000, 2000])


@settings(max_examples=300, deadline=None)
@given(tach(), tach(), WINDOWS)
def test_a_healthy_fan_with_noise_within_the_tolerance_passes(a, b, window):
    test, r = run([a, b], [line(a[3], a[4]), line(b[3], b[4])], window)
    assert r["passed"], (r, test.flags, test.verdicts)
    assert r["text"] == "all parts passed"


def _weak(model, ppr, window):
    # below the model's floor at 100 % by more than the noise can lift it
    floor = floors.rpm_floor(floors.FAN_MODELS[model])
    res = 60000 // (ppr * 500)  # the shortest window WINDOWS gives: the coarsest
    return st.integers(0, max(0, (floor - res) * 100 // 103))


@settings(max_examples=200, deadline=None)
@given(tach(curve_full=_weak), tach(), st.booleans(), WINDOWS)
def test_a_weak_or_stalled_fan_fails_and_is_named(bad, good, stalled, window):
    full = 0 if stalled else bad[3]
    bad = bad[:3] + (full,) + bad[4:]
    test, r = run([good, bad], [line(good[3], good[4]), line(full, bad[4])], window)
    assert not r["passed"] and r["fans_ok"] == [True, False], (r, test.flags, test.verdicts)
    words = ("fan2 stalled",) if stalled else ("fan2 weak", "fan2 stalled")
    assert any(r["text"].startswith("failed: " + w) for w in words), r["text"]
    assert test.verdicts[1][0] in ((STALLED,) if stalled else (WEAK, STALLED))
