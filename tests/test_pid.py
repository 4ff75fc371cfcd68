"""device.control.pid: closed loop on a simulated plant, anti-windup, bumpless transfer,
slew and output limits, D on measurement, feed-forward, gain validation, dt edge
cases, the +-2**30 bound (CPython, instrumented) and zero allocation (MicroPython)."""

from array import array

from mpcompat import IS_MICROPYTHON, heap_lock, heap_unlock, raises

from device.control.pid import GAIN_MAX, PID, gain, mul

DUAL = True
MPY_TIMEOUT = 600

SP = 65000  # m degC
T_AMB = 25000


class Plant:
    """Integer first-order thermal plant: C dT/dt = Q - G(duty) (T - T_amb).

    C = 200 J/degC; G = 1 + 9 * duty/65535 W/degC (fans at 0 still leave 1 W/degC of
    passive cooling). At 300 W the loop needs ~72 % duty to hold 65 degC; 500 W is
    more than full duty can remove (75 degC at 100 %). T is kept in micro-degC.
    """

    def __init__(self, t_mc=T_AMB, delay_ticks=0):
        self.t_u = t_mc * 1000
        self.q_mw = 0
        self.delay = [t_mc] * (delay_ticks + 1)

    def advance(self, duty, dt_ms):
        g_mw_per_c = 1000 + 9000 * duty // 65535
        net_mw = self.q_mw - g_mw_per_c * (self.t_u // 1000 - T_AMB) // 1000
        self.t_u += net_mw * dt_ms // 200
        self.delay.append(self.t_u // 1000)
        self.delay.pop(0)

    @property
    def t_mc(self):
        return self.delay[0]


def _run(pid, plant, seconds, dt_ms=100, sp=SP, ff=False):
    """Closed loop; return (peak temperature, list of (t_mc, duty) per tick)."""
    trace = []
    peak = -(10**9)
    for _ in range(seconds * 1000 // dt_ms):
        t = plant.t_mc
        duty = pid.step(t, sp, dt_ms, plant.q_mw if ff else 0)
        plant.advance(duty, dt_ms)
        trace.append((t, duty))
        if t > peak:
            peak = t
    return peak, trace


def _tuned(**kw):
    """Brisk tuning for the plant: 15 %/degC, Ti = 7.5 s."""
    return PID(kp=15000, ki=2000, **kw)


def _quiet(**kw):
    """Gentle tuning (4 %/degC, Ti = 10 s): where windup hurts most."""
    return PID(kp=4000, ki=400, **kw)


def _settle_s(trace, band, dt_ms=100):
    """Seconds until the temperature stays within +-band of SP."""
    last = -1
    for i in range(len(trace)):
        if abs(trace[i][0] - SP) > band:
            last = i
    return (last + 1) * dt_ms // 1000


def test_gain_conversion_is_exact_enough():
    # mul(a, *gain(num, den)) == round(a * num / den) within one count
    for num, den in ((3, 2), (1, 3), (536862720 * 5000, 10**8), (7, 10**9), (10**12, 7)):
        g = gain(num, den)
        for a in (0, 1, -1, 1000, -1000, 123457, -131071):
            want = (a * num * 2 + den) // (2 * den)
            if want > 2**29 - 1:
                want = 2**29 - 1
            elif want < -(2**29 - 1):
                want = -(2**29 - 1)
            got = mul(a, *g)
            tol = 1 + abs(want) // 8000  # 14-bit mantissa
            assert abs(got - want) <= tol, (num, den, a, got, want)


def test_units_of_each_term():
    out = array("i", [0, 0, 0, 0])
    # kp 5 %/degC at +5 degC -> 25 % = 16384 duty
    p = PID(kp=5000)
    assert p.step(SP + 5000, SP, 100) == 16384
    # kff 0.1 %/W at 300 W -> 30 % = 19660.5 duty
    p = PID(kff=100)
    d = p.step(SP, SP, 100, 300000)
    assert d in (19660, 19661), d
    # ki 1 %/(degC*s) at +1 degC for 1 s (10 x 100 ms) -> 1 % = 655 duty
    p = PID(ki=1000)
    for _ in range(10):
        d = p.step(SP + 1000, SP, 100)
    assert abs(d - 655) <= 1, d
    # kd 10 %*s/degC at a ramp of 1 degC/s, unfiltered -> 10 % = 6553 duty
    p = PID(kd=10000, d_filter_ms=0)
    t = SP
    for _ in range(5):
        d = p.step(t, SP, 100)
        t += 100
    p.terms(out)
    assert abs(out[2] - 6553) <= 2, out[2]
    assert abs(d - 6553) <= 2, d


def test_closed_loop_settles():
    plant = Plant(t_mc=40000, delay_ticks=5)
    plant.q_mw = 300000
    pid = _tuned()
    peak, trace = _run(pid, plant, 600)
    assert _settle_s(trace, 500) <= 60, _settle_s(trace, 500)
    tail = trace[-600:]  # last 60 s
    for t, _duty in tail:
        assert abs(t - SP) <= 100, (t, SP)
    assert peak < SP + 7000, peak  # from 40 degC at 1.4 degC/s with a 0.5 s delay
    duty = tail[-1][1]
    assert 44000 < duty < 50000, duty  # what 300 W needs at 65 degC


def test_antiwindup_prevents_overshoot_after_long_saturation():
    # Idle GPU far below the setpoint for 20 min: the output sits at the fan minimum.
    # Then a 300 W load step. The integrator must neither have wound down to its
    # clamp (then the fans stay at minimum until P overcomes it) nor have absorbed
    # P into a large positive value (the old back-calculation pinned it at
    # out_min - P: then the output jumps by kp * the idle error at the crossing).
    pid = _quiet(out_min=13107)
    plant = Plant(t_mc=30000, delay_ticks=5)
    plant.q_mw = 50000
    _run(pid, plant, 1200)
    out = array("i", [0, 0, 0, 0])
    pid.terms(out)
    assert out[1] == 0, out[1]  # not wound, not preloaded
    assert pid.duty == 13107
    plant.q_mw = 300000
    peak, trace = _run(pid, plant, 600)
    assert abs(trace[-1][0] - SP) <= 100, trace[-1]
    assert peak < SP + 9000, peak  # measured +8.0 degC: I starts from 0
    # with the feed-forward (which is now never absorbed) the same step overshoots less
    pid = PID(kp=4000, ki=400, kff=150, out_min=13107)
    plant = Plant(t_mc=30000, delay_ticks=5)
    plant.q_mw = 50000
    _run(pid, plant, 1200, ff=True)
    pid.terms(out)
    assert out[1] == 0, out[1]  # held at the bottom: conditional integration
    plant.q_mw = 300000
    peak_ff, trace = _run(pid, plant, 600, ff=True)
    assert abs(trace[-1][0] - SP) <= 100, trace[-1]
    assert peak_ff < peak - 3000, (peak_ff, peak)


def test_integrator_leaks_far_below_the_band():
    # A boot or manual duty leaves a large integrator behind (bumpless track); far
    # below the setpoint it leaks to 0 with Tt instead of holding the fans up.
    pid = PID(kp=4000, ki=400, i_band_mc=5000, slew_down_per_s=655)
    pid.track(45875, SP - 2000)  # within the band: bumpless, I = 70 % - P
    pid.step(SP - 2000, SP, 100)
    out = array("i", [0, 0, 0, 0])
    pid.terms(out)
    assert out[1] > 45000, out
    for _ in range(600):  # 60 s, 20 degC below the setpoint
        pid.step(SP - 20000, SP, 100)
    pid.terms(out)
    assert 0 <= out[1] < 45875 // 8, out  # Tt = Ti = 10 s: 6 time constants
    # a switch from manual far below the band starts from I = 0 (no preload)
    pid.track(45875, SP - 20000)
    pid.step(SP - 20000, SP, 100)
    pid.terms(out)
    assert out[1] == 0, out
    assert pid.duty == 0  # a tracked duty falls at the rise's rate: unlimited here


def test_a_tracked_duty_falls_at_the_rise_rate_then_the_loop_at_its_own():
    # After track() (a boot floor, a fail-safe or manual duty) the output comes down
    # at the rise's rate until it reaches the law's value; from then on every fall is
    # the slow one (the loop's own output near the setpoint: anti-hunting).
    pid = PID(kp=5000, slew_per_s=13107, slew_down_per_s=590, out_min=13107)  # 20 %/s
    pid.track(45875, SP - 20000)  # 70 %, the boot floor
    prev = pid.duty
    for _ in range(30):
        d = pid.step(SP - 20000, SP, 100)  # P = -100 %: the law says the minimum
        assert prev - d <= 1311, (prev, d)  # 2 % per 100 ms tick
        prev = d
    assert d == 13107, d  # 50 % at 20 %/s: 2.5 s
    for _ in range(20):
        d = pid.step(SP + 10000, SP, 100)  # hot: up to P = 50 %
    assert abs(d - 32768) <= 1, d
    prev = d
    for _ in range(50):
        d = pid.step(SP - 20000, SP, 100)  # the loop's own fall: 0.9 %/s
        assert prev - d <= 60, (prev, d)
        prev = d
    assert abs(d - (32768 - 50 * 59)) <= 60, d
    pid.track(45875, SP - 20000)  # a new transfer: the fast fall again
    for _ in range(30):
        d = pid.step(SP - 20000, SP, 100)
    assert d == 13107, d


def test_feed_forward_is_not_absorbed_at_the_minimum():
    # The old back-calculation pinned I at out_min - P - FF while saturated, so a
    # feed-forward step left the output at the minimum. Now FF moves it at once.
    pid = PID(kp=5000, ki=200, kff=100, out_min=13107, i_band_mc=8000)
    for _ in range(3000):
        pid.step(SP - 15000, SP, 100, 25000)  # idle, cold
    assert pid.duty == 13107
    d = pid.step(SP - 15000, SP, 100, 320000)  # a 320 W step
    # FF 0.1 %/W * 320 W = 32 %, P = 5 %/degC * -15 degC = -75 %, I = 0 -> minimum
    assert d == 13107, d
    for _ in range(10):
        d = pid.step(SP - 2000, SP, 100, 320000)  # the heat arrives: P = -10 %
    # 32 - 10 = 22 %, and I -0.4 % (1 s at -2 degC): no wait for the setpoint crossing
    assert abs(d - 65535 * 216 // 1000) <= 40, d


def test_antiwindup_at_the_top():
    # A noise cap of out_max = 45000 cannot hold 300 W at 65 degC: the output sits at
    # the cap for 10 minutes. The integrator does not wind past the cap (held by it,
    # and unwound toward 0 by the back-calculation), so when the load drops to 120 W
    # the loop comes down from the cap at once.
    pid = _quiet(out_max=45000)
    plant = Plant(t_mc=60000, delay_ticks=5)
    plant.q_mw = 300000
    _run(pid, plant, 600)
    assert pid.duty == 45000
    out = array("i", [0, 0, 0, 0])
    pid.terms(out)
    assert 0 <= out[1] <= 45000, out[1]
    plant.q_mw = 120000
    _, trace = _run(pid, plant, 600)
    assert min(t for t, _ in trace) > SP - 6000, min(t for t, _ in trace)
    assert abs(trace[-1][0] - SP) <= 100, trace[-1]


def test_deadband_holds_the_output():
    # Within +-deadband the error counts as 0: sensor noise of +-0.8 degC around
    # the setpoint moves neither P nor I.
    pid = PID(kp=5000, ki=200, deadband_mc=1000)
    pid.track(30000, SP)
    pid.step(SP, SP, 100)
    for i in range(2000):
        d = pid.step(SP + (800 if i & 1 else -800), SP, 100)
        assert d == 30000, (i, d)
    # beyond it the error is reduced by the deadband: continuous, 5 % per degC
    d = pid.step(SP + 3000, SP, 100)
    assert abs(d - 30000 - 65535 * 10 // 100 - 26) <= 3, d  # P 10 %, I 0.2*2*0.1 %


def test_slew_down_is_separate():
    pid = PID(kp=20000, slew_per_s=65535, slew_down_per_s=655)  # up 100 %/s, down 1 %/s
    pid.track(0, SP)
    d = pid.step(SP + 2000, SP, 100)
    assert abs(d - 6553) <= 1, d  # up at 100 %/s toward P = 40 %
    for _ in range(9):
        d = pid.step(SP + 2000, SP, 100)
    assert abs(d - 26214) <= 1, d
    prev = d
    for _ in range(50):
        d = pid.step(SP - 20000, SP, 100)
        assert prev - d <= 66, (prev, d)
        prev = d
    assert abs(d - (26214 - 50 * 655 // 10)) <= 50, d  # 5 s at 1 %/s


def test_integration_is_conditional_on_the_band_and_the_slew():
    # Above the band the integrator runs at the band's rate, not the error's.
    a = PID(kp=0, ki=1000, i_band_mc=2000)
    a.track(0, SP)
    a.step(SP, SP, 100)
    for _ in range(10):
        d = a.step(SP + 20000, SP, 100)
    assert abs(d - 65535 * 2 // 100) <= 2, d  # 1 %/(degC s) * 2 degC * 1 s
    # while the slew limiter holds the output, no integration in that direction
    b = PID(kp=0, ki=1000, slew_per_s=65)  # 0.1 %/s
    b.track(0, SP)
    b.step(SP, SP, 100)
    for _ in range(100):
        d = b.step(SP + 20000, SP, 100)
    out = array("i", [0, 0, 0, 0])
    b.terms(out)
    assert abs(d - 655) <= 10, d  # 10 s at 0.1 %/s
    # one tick's integration (2 %, before the limiter first held), not the 200 % of
    # the integrated error
    assert out[1] <= 1311 + 2, out


def test_bumpless_transfer():
    pid = PID(kp=8000, ki=300, kd=20000, kff=100, slew_per_s=6553)
    # auto for a while, then manual at 40000 with a rising temperature (0.5 degC/s)
    for i in range(50):
        pid.step(60000 + 10 * i, SP, 100, 200000)
    for i in range(30):
        pid.track(40000, 70000 + 50 * i)
    d = pid.step(70000 + 50 * 30, SP, 100, 200000)
    assert d == 40000, d
    # then it moves on from there at most at the slew rate (the rising temperature
    # charges the derivative, so it does move)
    d2 = pid.step(70000 + 50 * 31, SP, 100, 200000)
    assert 40000 <= d2 <= 40000 + 655, d2
    # constant temperature, no slew limit: only the small integral step follows
    pid = PID(kp=8000, ki=300, kd=20000, kff=100)
    pid.set_auto(70000, 12345)
    assert pid.duty == 12345
    assert pid.step(70000, SP, 100, 150000) == 12345
    d = pid.step(70000, SP, 100, 150000)
    assert abs(d - 12345 - 98) <= 2, d  # 0.3 %/(degC*s) * 5 degC * 0.1 s = 98 duty


def test_p_only_switch_is_smoothed_by_slew_not_biased():
    # Without integral action a bias could never be undone: the switch is only
    # rate-limited, and the loop then follows plain P.
    pid = PID(kp=8000, slew_per_s=65535)
    pid.track(30000, SP)
    assert pid.step(SP, SP, 100) == 30000 - 6553  # on its way down to P = 0
    for _ in range(10):
        d = pid.step(SP, SP, 100)
    assert d == 0, d
    d = pid.step(SP + 1000, SP, 1000)
    assert abs(d - 5243) <= 1, d  # 8 % per degC


def test_first_step_after_reset_is_not_slew_limited():
    pid = PID(kp=8000, slew_per_s=100)
    assert pid.duty == 65535  # fail-safe before the first step
    d = pid.step(SP + 5000, SP, 100)
    assert abs(d - 26214) <= 1, d  # 8 %/degC * 5 degC = 40 %, at once
    assert pid.step(SP + 5000, SP, 0) == d


def test_slew_limit():
    pid = PID(kp=20000, slew_per_s=6553)  # 10 %/s
    pid.track(0, SP)
    prev = 0
    for i in range(100):
        t = SP + (20000 if (i // 25) % 2 == 0 else -20000)
        dt = 50 + (i * 37) % 200
        d = pid.step(t, SP, dt)
        assert abs(d - prev) <= 6553 * dt // 1000 + 1, (i, prev, d, dt)
        prev = d
    # and it gets there in the end
    for _ in range(200):
        d = pid.step(SP + 20000, SP, 100)
    assert d == 65535


def test_output_limits():
    pid = PID(kp=20000, ki=500, kd=5000, kff=200, out_min=10000, out_max=50000)
    t = 20000
    for i in range(400):
        t += ((i * 7919) % 2001) - 1000
        d = pid.step(t, SP, 100, (i * 104729) % 700000)
        assert 10000 <= d <= 50000, d
    pid.set_output_limits(30000, 30000)
    assert pid.step(0, SP, 100) == 30000
    assert pid.step(200000, SP, 100) == 30000


def test_safety_floor_per_tick_does_not_wind_the_integrator():
    # The app may raise out_min to a fail-safe floor (60000) for 5 minutes while
    # 300 W needs only ~47000: the temperature sits 7.5 degC below the setpoint.
    # Held at the floor, the integrator neither winds down (conditional
    # integration) nor absorbs the floor; when the floor goes, the loop returns to
    # the setpoint without overshoot.
    pid = _quiet()
    plant = Plant(t_mc=SP, delay_ticks=5)
    plant.q_mw = 300000
    _run(pid, plant, 300)  # settled first
    out = array("i", [0, 0, 0, 0])
    pid.terms(out)
    before = out[1]
    for _ in range(3000):
        pid.set_output_limits(60000, 65535)
        plant.advance(pid.step(plant.t_mc, SP, 100), 100)
    pid.terms(out)
    assert abs(out[1] - before) <= before // 4, (before, out[1])
    pid.set_output_limits(0, 65535)
    peak, trace = _run(pid, plant, 300)
    assert peak < SP + 3000, peak  # measured +2.0 degC
    assert abs(trace[-1][0] - SP) <= 300, trace[-1]


def test_no_derivative_kick_on_setpoint_change():
    out = array("i", [0, 0, 0, 0])
    pid = PID(kp=5000, kd=100000, d_filter_ms=0)
    pid.step(60000, 60000, 100)
    d0 = pid.step(60000, 60000, 100)
    d1 = pid.step(60000, 50000, 100)  # setpoint 10 degC down, measurement constant
    pid.terms(out)
    assert out[2] == 0, out[2]
    assert abs(d1 - d0 - 32768) <= 1, (d0, d1)  # P only: 5 %/degC * 10 degC
    # whereas a measurement step does produce D
    pid.step(61000, 50000, 100)
    pid.terms(out)
    assert out[2] > 0, out[2]


def test_derivative_filter_smooths_and_converges():
    out = array("i", [0, 0, 0, 0])
    raw = PID(kd=10000, d_filter_ms=0)
    filt = PID(kd=10000, d_filter_ms=2000)
    for p in (raw, filt):
        p.step(60000, SP, 100)
        p.step(61000, SP, 100)  # 1 degC in 100 ms = 10 degC/s spike
    raw.terms(out)
    spike_raw = out[2]
    filt.terms(out)
    spike_filt = out[2]
    assert spike_raw == 65536, spike_raw  # 10 %*s/degC * 10 degC/s = 100 %
    assert 0 < spike_filt < spike_raw // 10, spike_filt
    for _ in range(400):
        filt.step(61000, SP, 100)
    filt.terms(out)
    assert out[2] == 0, out[2]  # decays fully, no residue


def test_feed_forward_moves_duty_before_temperature():
    pid = PID(kp=5000, ki=0, kff=100)
    d0 = 0
    for _ in range(5):
        d0 = pid.step(SP, SP, 100, 100000)
    d1 = pid.step(SP, SP, 100, 300000)  # 200 W step, same temperature
    assert abs(d1 - d0 - 13107) <= 1, (d0, d1)
    # with the plant: FF reduces the overshoot of a load step
    peaks = []
    for kff in (0, 200):
        pid = _quiet(kff=kff)
        plant = Plant(t_mc=50000, delay_ticks=5)
        plant.q_mw = 100000
        _run(pid, plant, 900, ff=True)
        plant.q_mw = 350000
        peak, _ = _run(pid, plant, 300, ff=True)
        peaks.append(peak)
    assert peaks[1] < peaks[0] - 500, peaks


def test_gain_validation():
    pid = PID(kp=1, ki=2, kd=3, kff=4)
    bad = (-1, GAIN_MAX + 1, 10**30, 1.5, True, "5", None)
    for pos in range(4):
        for value in bad:
            gains = [10, 20, 30, 40]
            gains[pos] = value
            name = ("kp", "ki", "kd", "kff")[pos]
            with raises(ValueError, match=name + " must be an int in 0..1000000"):
                pid.set_gains(gains[0], gains[1], gains[2], gains[3])
            assert (pid.kp, pid.ki, pid.kd, pid.kff) == (1, 2, 3, 4)  # unchanged
    pid.set_gains(0, 0, 0, 0)
    pid.set_gains(GAIN_MAX, GAIN_MAX, GAIN_MAX, GAIN_MAX)
    with raises(ValueError, match="0.001 %duty/(degC*s)"):
        PID(ki=-5)


def test_other_validation():
    with raises(ValueError, match="out_max must be an int in 40000..65535"):
        PID(out_min=40000, out_max=30000)
    with raises(ValueError, match="out_min must be an int in 0..65535"):
        PID(out_min=-1)
    with raises(ValueError, match="i_max"):
        PID(i_min=100, i_max=0)
    with raises(ValueError, match="slew_per_s"):
        PID(slew_per_s=-1)
    with raises(ValueError, match="d_filter_ms"):
        PID(d_filter_ms=10**6)
    with raises(ValueError, match="tracking_ms"):
        PID(tracking_ms=-1)


def test_dt_edge_cases():
    a = PID(kp=5000, ki=1000, kd=5000)
    b = PID(kp=5000, ki=1000, kd=5000)
    for p in (a, b):
        p.step(60000, SP, 100)
    d = a.step(70000, SP, 100)
    # dt 0 / negative: previous duty, and nothing changes
    assert a.step(99999, SP, 0) == d
    assert a.step(99999, SP, -50) == d
    b.step(70000, SP, 100)
    assert a.step(71000, SP, 100) == b.step(71000, SP, 100)
    # a long stall counts as 1000 ms
    assert a.step(72000, SP, 60000) == b.step(72000, SP, 1000)
    # dt = 1 ms works and stays sane even for a quantisation-noise derivative
    for i in range(100):
        d = a.step(72000 + (i & 1), SP, 1)
        assert 0 <= d <= 65535


# Lists, not constant tuples: a constant tuple's ints beyond 0x1FFF freeze as big ints
# (tests/test_frozen_ints.py), and the PID's arithmetic on one allocates on 32-bit ARM.
EXTREME_INPUTS = [
    [100000, 0, 1, 1000000],
    [-100000, 0, 1, 0],
    [0, 100000, 1000, 0],
    [100000, 0, 1000, 1000000],
    [2**29, -(2**29), 1, 2**29],
    [-(2**29), 2**29, 1000, -(2**29)],
    [2**29, 0, 1, 0],
    [0, 0, 1000, 0],
    [10000, 0, 1, 0],  # 10 degC in 1 ms
    [0, 0, 1, 0],
]

EXTREME_GAINS = [0, 1, 999, 5000, 123457, GAIN_MAX]
KEEPS = [0, 256, 97, 100000]  # step()'s keep_q8: off, full, a share, out of range


def _drive_extremes(mod, results, begin, end):
    """Every gain combination x every extreme input; duties into ``results``.

    ``begin``/``end`` bracket the steps (heap lock, or the CPython int checker).
    """
    k = 0
    for g in EXTREME_GAINS:
        pids = (
            mod.PID(g, g, g, g, slew_per_s=mod.SLEW_MAX, d_filter_ms=0, tracking_ms=0),
            mod.PID(g, 1, GAIN_MAX, 0, slew_per_s=1, d_filter_ms=60000),
            mod.PID(GAIN_MAX, g, 0, GAIN_MAX, tracking_ms=600000, antiwindup=g & 1),
            mod.PID(g, GAIN_MAX, g, 1, out_min=1000, out_max=2000, i_min=-1, i_max=1),
            mod.PID(
                g, g, 0, g, slew_per_s=g, slew_down_per_s=1, deadband_mc=20000, i_band_mc=20000
            ),
        )
        for pid in pids:
            begin()
            try:
                for _ in range(3):
                    for inp in EXTREME_INPUTS:
                        # the feed-forward guard too (device/app.py's hosted law)
                        results[k] = pid.step(inp[0], inp[1], inp[2], inp[3], KEEPS[k & 3])
                        k += 1
                pid.track(65535, 2**29)
                results[k] = pid.step(-(2**29), 2**29, 1, 0)
                k += 1
            finally:
                end()
    return k


def test_extremes_stay_small_ints_and_sane():
    n = len(EXTREME_GAINS) * 5 * (3 * len(EXTREME_INPUTS) + 1)
    results = array("i", [-1] * n)
    if IS_MICROPYTHON:
        import device.control.pid as mod

        count = _drive_extremes(mod, results, heap_lock, heap_unlock)
    else:
        from intcheck import load_checked

        mod, chk = load_checked("device/control/pid.py")
        count = _drive_extremes(mod, results, chk.__enter__, chk.__exit__)
        assert chk.count > 10000, chk.count  # the instrumentation really ran
        assert chk.peak <= 2**30 - 1, chk.peak
    assert count == n
    for d in results:
        assert 0 <= d <= 65535, d
    # full-scale gains on +100 degC -> full duty; -100 degC -> zero
    p = PID(GAIN_MAX, GAIN_MAX, GAIN_MAX, GAIN_MAX)
    assert p.step(100000, 0, 100, 1000000) == 65535
    assert PID(GAIN_MAX, 0, 0, 0).step(-100000, 0, 100) == 0


def test_step_does_not_allocate():
    out = array("i", [0, 0, 0, 0])
    results = array("i", [0] * 400)
    pid = PID(kp=8000, ki=300, kd=20000, kff=100, slew_per_s=6553, out_min=6000)
    pid.set_slew(6553, 655)
    pid.set_deadband(1000, 8000)
    pid.track(30000, 60000)
    heap_lock()
    try:
        for i in range(400):
            if i == 200:
                pid.track(20000, 70000)
                pid.set_output_limits(10000, 65535)
            results[i] = pid.step(60000 + i * 37, SP, 90 + (i & 15), 250000 + i * 100)
            pid.terms(out)
        results[0] = pid.step(0, 0, 0)
    finally:
        heap_unlock()
    for d in results:
        assert 0 <= d <= 65535, d
