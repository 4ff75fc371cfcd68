"""device.control.chassis: the learned chassis model's fixed-point evaluation against
the design's formula (issue 25; written out here with unbounded ints), its ranges
(every intermediate within +-2**30 on CPython, instrumented; no allocation under
MicroPython's heap_lock) and its inputs' failures."""

from array import array

from mpcompat import heap_lock, heap_unlock, small_ints

from device.control import chassis as M

DUAL = True

INVALID = -0x3FFFFFFF
KEYS = ("ok", "lead_ms", "ga_q12", "rp_mcw", "rpd_mcw", "off_mc", "unc_mc", "slow_mc")


def _params(ok=1, lead=0, ga=0, rp=0, rpd=0, off=0, unc=500, slow=0):
    vals = (ok, lead, ga, rp, rpd, off, unc, slow)
    return {KEYS[i]: vals[i] for i in range(len(KEYS))}


class _Ref:
    """The design note's evaluation, written from its text (Python ints, no splits)."""

    def __init__(self, m):
        self.m = m
        self.g_slow = None

    def update(self, g, a, p, d, dt):
        m = self.m
        if self.g_slow is None:
            self.g_slow = g
        else:
            self.g_slow += (g - self.g_slow) * dt // (4000 + dt)
        g_lead = g + m["lead_ms"] * (g - self.g_slow) // 4000
        est = g_lead + ((m["ga_q12"] * (g_lead - a)) >> 12)
        est += (m["rp_mcw"] + m["rpd_mcw"] * (65535 - d) // 65535) * p // 1000
        est += m["off_mc"]
        return est + m["unc_mc"]


def _lcg(x):
    return (x * 1103515245 + 12345) & 0x7FFFFFFF


def test_keys_and_layout():
    assert M.KEYS == KEYS, M.KEYS
    s = M.new()
    assert len(s) == 10 and s[0] == 0 and s[M.EST] == INVALID
    M.load(s, _params(slow=87000))
    assert s[0] == 1 and s[M.SLOW] == 87000 and s[M.EST] == INVALID
    # device/app.py reads the slowdown at 7 and restarts the filter by writing 8
    assert M.SLOW == 7, M.SLOW
    M.load(s, _params(lead=20000, unc=500))
    M.update(s, 50000, 25000, 0, 0, 100)
    assert M.update(s, 60000, 25000, 0, 0, 100) > 60500
    s[8] = INVALID
    assert M.update(s, 60000, 25000, 0, 0, 100) == 60500


def test_steady_state_is_the_static_model():
    # no change at the probe: no lead; 60 degC NTC, 30 degC inlet, 300 W, half duty
    m = _params(lead=8000, ga=1229, rp=20, rpd=40, off=1500, unc=2000)
    s = M.new()
    M.load(s, m)
    for _ in range(50):
        est = M.update(s, 60000, 30000, 300000, 32768, 100)
    # 60 + 0.3 x 30 + (20 + 40 x 0.5) x 300 / 1000 + 1.5 + 2 degC
    want = 60000 + (1229 * 30000 >> 12) + (20 + 40 * 32767 // 65535) * 300 + 1500 + 2000
    assert est == want, (est, want)
    assert s[M.EST] == est


def test_lead_compensates_a_rising_probe():
    s = M.new()
    M.load(s, _params(lead=10000, unc=500))
    M.update(s, 50000, 25000, 0, 0, 100)
    est = 0
    for i in range(200):  # the probe rises 1 degC a second for 20 s
        est = M.update(s, 50000 + 100 * (i + 1), 25000, 0, 0, 100)
    g = 50000 + 20000
    # a 4 s filter lags a ramp by ~4 degC: the lead adds 10 s / 4 s of that
    assert g + 500 + 9000 < est < g + 500 + 11000, est


def test_matches_the_formula_on_random_inputs():
    x = 12345
    for case in range(12):
        x = _lcg(x)
        m = _params(
            lead=x % 20001,
            ga=(x >> 3) % 10241 - 2048,
            rp=(x >> 5) % 501,
            rpd=(x >> 7) % 1001 - 500,
            off=(x >> 9) % 30001 - 10000,
            unc=500 + (x >> 11) % 14501,
        )
        s = M.new()
        M.load(s, m)
        ref = _Ref(m)
        g = 40000 + case * 3000
        for _ in range(200):
            x = _lcg(x)
            g += (x % 2001) - 1000
            g = 131072 if g > 131072 else g
            a = 20000 + (x >> 4) % 25000
            p = (x >> 6) % 900000
            d = (x >> 3) % 65536
            dt = 50 + (x >> 8) % 951
            got = M.update(s, g, a, p, d, dt)
            want = ref.update(g, a, p, d, dt)
            assert got == want, (case, got, want, m)


def test_invalid_inputs_restart_the_filter():
    s = M.new()
    M.load(s, _params(lead=20000, unc=1000))
    M.update(s, 50000, 25000, 100000, 30000, 100)
    for _ in range(10):
        M.update(s, 70000, 25000, 100000, 30000, 100)  # a step: the lead acts
    assert s[M.EST] > 70000 + 1000
    assert M.update(s, INVALID, 25000, 100000, 30000, 100) == INVALID
    assert s[M.EST] == INVALID
    assert M.update(s, 70000, INVALID, 100000, 30000, 100) == INVALID
    assert M.update(s, 70000, 25000, -1, 30000, 100) == INVALID
    # back: the filter starts at the reading (no lead from before the gap)
    assert M.update(s, 70000, 25000, 0, 30000, 100) == 71000


def _row(*values):
    # built at run time: a constant tuple's ints above 0x1FFF freeze as mpz on qemu
    return values


def _extreme_models():
    out = []
    for lead, ga, rp, rpd, off, unc in (
        (20000, 8192, 500, 500, 20000, 15000),
        (20000, -2048, 0, -500, -10000, 500),
        (0, 8192, 500, -500, 20000, 15000),
        (20000, -2048, 500, 500, -10000, 15000),
    ):
        out.append(_params(1, lead, ga, rp, rpd, off, unc, 100000))
    return out


EXTREMES = (
    _row(2**29, -(2**29), 2**29, 0, 1000),
    _row(-(2**29), 2**29, 2**29, 65535, 1000),
    _row(2**29, -(2**29), 0, 70000, 1),
    _row(-(2**29), -(2**29), 2**22, -5, 0),
    _row(131072, -131072, 4194304, 0, 1000),
    _row(-131072, 131072, 4194304, 65535, 1000),
    _row(0, 0, 999999, 1, 5000),
)


def _drive(mods, out, begin, end):
    k = 0
    for m in _extreme_models():
        s = mods.new()
        mods.load(s, m)
        begin()
        try:
            for _ in range(3):
                for r in EXTREMES:
                    for _ in range(8):
                        out[k] = mods.update(s, r[0], r[1], r[2], r[3], r[4])
                        k += 1
        finally:
            end()
    return k


def test_extremes_stay_small_ints():
    n = 4 * 3 * len(EXTREMES) * 8
    out = array("i", [0] * n)
    count = small_ints(M, "device/control/chassis.py", lambda m, b, e: _drive(m, out, b, e))
    assert count == n
    for v in out:
        assert -(2**23) <= v <= 2**23, v


def test_update_does_not_allocate():
    s = M.new()
    M.load(s, _params(lead=6000, ga=800, rp=30, rpd=-20, off=-2000, unc=3000))
    out = array("i", [0] * 300)
    heap_lock()
    try:
        i = 0
        while i < 300:
            out[i] = M.update(s, 60000 + (i & 15) * 100, 30000, 250000 + i, 40000, 100)
            i += 1
    finally:
        heap_unlock()
    assert out[-1] > 60000


def test_standalone_ticks_on_a_model_alarm_early_and_do_not_allocate():
    # the firmware App, no host, a model that puts the die well above the probe: the
    # estimate raises the GPU channel's alarm the probe (78 degC, warn 85) does not,
    # the PID runs on it, and none of it allocates (on qemu-arm: 31-bit small ints)
    from fakehal import FakeHal, adc_code, run
    from mpcompat import heap_locked

    from device.app import App
    from protocol import catalog as C

    hal = FakeHal(temps_c=(78.0, 70.0, 80.0, 35.0))
    app = App(hal)
    app.boot()
    m = _params(lead=8000, ga=1200, rp=30, rpd=20, off=2000, unc=3000, slow=83000)
    app.apply_changes({"model." + k: m[k] for k in KEYS})
    run(app, hal, 3000, step_ms=100)
    s = app.safety.chassis[0]
    assert s[M.EST] > 83000, s[M.EST]
    assert app.sup.over & 1, (app.sup.over, app.sup.state)
    assert app.sup.state == C.STATE_FAILSAFE, app.sup.state
    codes = [adc_code(t / 10) for t in range(770, 800, 3)]
    n0 = app.ticks

    def ticks():
        k = 0
        while k < 300:
            hal.adc[0].set(codes[k % len(codes)])
            app.step()
            hal.advance(100)
            hal.tx_len = 0
            k += 1

    heap_locked(ticks)
    assert app.failures == 0 and app.ticks - n0 == 300, (app.failures, app.ticks - n0)
    assert s[M.EST] != INVALID and app.sup.over & 1
    assert hal.pwm[0].duty_u16() >= 52428  # the over-temperature floor at least
