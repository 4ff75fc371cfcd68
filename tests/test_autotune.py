"""device.control.autotune: the relay math (Ku = 4d/(pi a), Tyreus-Luyben), cycle
measurement on known waveforms, rejection of inconsistent or noise-sized cycles, every
abort (each safety cause, host/mode, too hot, floor, timeout, host abort), start-time
validation, zero allocation (MicroPython) and the +-2**30 bound (CPython,
instrumented), and closed loops on lagging integer plants that the tuned gains settle
without a limit cycle."""

from mpcompat import IS_MICROPYTHON, heap_lock, heap_unlock, raises

from device import safety as S
from device.control import autotune as A
from device.control.autotune import RelayTune, tyreus_luyben, ultimate_gain
from device.control.pid import PID
from protocol import catalog as C

DUAL = True
MPY_TIMEOUT = 600

FLOOR = 13107  # 20 %: the default fans' min_duty
SP = 70000
DT = 100


def _triangle(t_ms, period_ms, amp_mc):
    """A triangle wave of the error: 0 at t = 0 rising, +-amp_mc, ints only."""
    q = period_ms // 4
    ph = t_ms % period_ms
    if ph < q:
        return amp_mc * ph // q
    if ph < 3 * q:
        return amp_mc - 2 * amp_mc * (ph - q) // (2 * q)
    return -amp_mc + amp_mc * (ph - 3 * q) // q


def _drive(tune, err_at, ticks, causes_at=None, hosted=True, floor=FLOOR):
    """Feed ``tune`` ``ticks`` ticks of the error ``err_at(t_ms)``; returns the duties
    it asked for (stops at the first -1)."""
    out = []
    t = 0
    for _ in range(ticks):
        causes = causes_at(t) if causes_at else 0
        d = tune.update(DT, err_at(t), causes, hosted, floor)
        t += DT
        if d < 0:
            break
        out.append(d)
    return out


def _started(**kw):
    tune = RelayTune()
    args = {"bias": 30000, "floor": FLOOR, "settle": False}
    args.update(kw)
    tune.start(**args)
    return tune


def test_ultimate_gain_is_the_describing_function():
    for d in (3277, 13107, 20000, 32767):
        for a in (100, 650, 1234, 5000, 20000):
            want = 1000 * 4 * (100.0 * d / 65535) / (3.141592653589793 * a / 1000)
            got = ultimate_gain(d, a)
            if want >= A.GAIN_MAX:
                assert got == A.GAIN_MAX, (d, a, got)
            else:
                assert abs(got - want) <= 1 + want * 1e-4, (d, a, got, want)
    assert ultimate_gain(13107, 0) == A.GAIN_MAX


def test_tyreus_luyben_rule():
    for ku in (1000, 25464, 120000, 900000):
        for pu in (5000, 60000, 600000):
            kp, ki, kd = tyreus_luyben(ku, pu)
            assert abs(kp - ku / 3.2) <= 1, (ku, kp)
            # ki = kp / Ti with Ti = 2.2 Pu in seconds (milli-units in and out)
            assert abs(ki - kp / (2.2 * pu / 1000)) <= 1, (ku, pu, ki)
            assert kd == 0
    assert tyreus_luyben(10**7, 1000)[0] == A.GAIN_MAX


def test_measures_period_and_amplitude_of_a_known_wave():
    tune = _started()
    duties = _drive(tune, lambda t: _triangle(t, 20000, 1500), 3000)
    assert tune.status == C.TUNE_DONE, C.TUNE_STATUS[tune.status]
    assert abs(tune.pu_ms - 20000) <= DT, tune.pu_ms
    assert abs(tune.a_mc - 1500) <= 30, tune.a_mc
    assert tune.ku == ultimate_gain(tune.d, tune.a_mc)
    assert (tune.kp, tune.ki, tune.kd) == tyreus_luyben(tune.ku, tune.pu_ms)
    # the relay swings bias +- d and nothing else; it took the needed cycles (+1 for
    # the partial first one)
    assert set(duties) == {30000 - A.AMP_DEFAULT, 30000 + A.AMP_DEFAULT}, set(duties)
    assert tune.n == A.CYCLES_DEFAULT
    rep = tune.report()
    assert rep["status"] == C.TUNE_DONE and rep["ku"] == tune.ku and rep["kp"] == tune.kp
    assert rep["pu_ms"] == tune.pu_ms and rep["relay"] == A.AMP_DEFAULT


def test_relay_switches_with_hysteresis():
    tune = _started(hyst=500)
    hi, lo = tune.hi, tune.lo
    seq = (0, 400, -400, -499, -501, -200, 300, 499, 501, 0)
    want = (hi, hi, hi, hi, lo, lo, lo, lo, hi, hi)
    i = 0
    for e in seq:
        got = tune.update(DT, e, 0, True, FLOOR)
        assert got == want[i], (i, e, got, want[i])
        i += 1


def test_inconsistent_cycles_are_rejected():
    # periods alternate 16 s and 28 s: never three within 15 % of their mean
    def err(t):
        block = t % 44000
        return (
            _triangle(block, 16000, 1500)
            if block < 16000
            else _triangle(block - 16000, 28000, 1500)
        )

    tune = _started()
    _drive(tune, err, 100000)
    assert tune.status == C.TUNE_INCONSISTENT, C.TUNE_STATUS[tune.status]
    assert tune.n == A.MAX_CYCLES
    rep = tune.report()
    assert "ku" not in rep and "kp" not in rep, rep
    # amplitudes that disagree are rejected the same way
    tune = _started()
    _drive(tune, lambda t: _triangle(t, 20000, 900 if (t // 20000) % 2 else 2000), 100000)
    assert tune.status == C.TUNE_INCONSISTENT, C.TUNE_STATUS[tune.status]


def test_cycles_the_size_of_the_noise_are_not_measurements():
    tune = _started(hyst=500)
    _drive(tune, lambda t: _triangle(t, 20000, 600), 100000)
    assert tune.status == C.TUNE_INCONSISTENT, C.TUNE_STATUS[tune.status]
    assert tune.amps[0] == 0 and tune.amps[A.MAX_CYCLES - 1] == 0


def test_aborts_on_each_safety_cause():
    causes = (
        S.CAUSE_BOOT,
        S.CAUSE_HOST_LOST,
        S.CAUSE_SENSOR,
        S.CAUSE_STALL,
        S.CAUSE_OVER,
        S.CAUSE_CRIT,
    )
    for cause in causes:
        tune = _started()
        out = _drive(
            tune,
            lambda t: _triangle(t, 20000, 1500),
            3000,
            lambda t, c=cause: c if t >= 25000 else 0,
        )
        assert tune.status == C.TUNE_SAFETY, (cause, C.TUNE_STATUS[tune.status])
        assert tune.cause == cause and tune.ended and tune.report_pending
        assert len(out) == 250, len(out)  # stopped on the tick the cause appeared
        assert tune.update(DT, 0, 0, True, FLOOR) == -1  # and stays stopped
        assert tune.report()["causes"] == cause


def test_aborts_when_not_hosted_too_hot_or_on_request():
    tune = _started()
    _drive(tune, lambda t: 0, 10)
    assert tune.update(DT, 0, 0, False, FLOOR) == -1
    assert tune.status == C.TUNE_NOT_HOSTED
    tune = _started(max_rise=5000)
    assert tune.update(DT, 5000, 0, True, FLOOR) >= 0
    assert tune.update(DT, 5001, 0, True, FLOOR) == -1
    assert tune.status == C.TUNE_TOO_HOT
    tune = _started()
    tune.abort()
    assert tune.status == C.TUNE_ABORTED and tune.update(DT, 0, 0, True, FLOOR) == -1
    tune.abort(C.TUNE_TIMEOUT)  # not running: nothing changes
    assert tune.status == C.TUNE_ABORTED


def test_times_out_without_oscillation():
    tune = _started(timeout_s=60)
    out = _drive(tune, lambda t: -3000, 10000)  # never hot enough to switch back up
    assert tune.status == C.TUNE_TIMEOUT, C.TUNE_STATUS[tune.status]
    assert len(out) == 599, len(out)
    assert tune.n == 0


def test_a_floor_above_the_relay_aborts():
    tune = _started()
    lo = tune.lo
    # a floor held above the low level: 30 s of clipping ends it
    out = _drive(tune, lambda t: -1000, 1000, floor=lo + 1)
    assert tune.status == C.TUNE_FLOOR, C.TUNE_STATUS[tune.status]
    assert len(out) == A.FLOOR_GRACE_MS // DT, len(out)  # the first tick was high
    # a short clip does not, but the cycle it touched is not a measurement
    tune = _started()
    lo = tune.lo
    t = 0
    for _ in range(3000):
        e = _triangle(t, 20000, 1500)
        f = lo + 1 if 30000 <= t < 35000 else FLOOR
        if tune.update(DT, e, 0, True, f) < 0:
            break
        t += DT
    assert tune.status == C.TUNE_DONE, C.TUNE_STATUS[tune.status]
    assert tune.amps[0] == 0 and tune.n == 4, (list(tune.amps), tune.n)


def test_start_checks_ranges_and_fits_the_swing_above_the_floor():
    tune = RelayTune()
    for kw, name in (
        ({"amp": 100}, "amplitude"),
        ({"hyst": 10}, "hysteresis"),
        ({"max_rise": 50000}, "max_rise"),
        ({"timeout_s": 5}, "timeout_s"),
        ({"cycles": 1}, "cycles"),
    ):
        with raises(ValueError, match=name):
            tune.start(30000, FLOOR, **kw)
        assert tune.status == C.TUNE_IDLE
    tune.start(FLOOR, FLOOR)  # bias at the floor: moved up so bias - d is the floor
    assert (tune.lo, tune.bias, tune.hi) == (
        FLOOR,
        FLOOR + A.AMP_DEFAULT,
        FLOOR + 2 * A.AMP_DEFAULT,
    )
    tune.start(65000, FLOOR)
    assert tune.hi == 65535 and tune.lo == 65535 - 2 * A.AMP_DEFAULT
    tune.start(40000, 45875, amp=32767)  # the boot floor leaves 9830 each side
    assert tune.d == (65535 - 45875) // 2 and tune.lo >= 45875
    with raises(ValueError, match="no room"):
        tune.start(60000, 60000)


def test_update_does_not_allocate():
    tune = _started()
    out = [0] * 2000
    # periods alternating 16 s and 28 s never agree: 200 s of cycles, none the last
    err = [
        _triangle(t * DT % 44000, 16000, 1500)
        if t * DT % 44000 < 16000
        else _triangle(t * DT % 44000 - 16000, 28000, 1500)
        for t in range(2000)
    ]
    heap_lock()
    try:
        i = 0
        while i < 2000:
            out[i] = tune.update(DT, err[i], 0, True, FLOOR)
            i += 1
    finally:
        heap_unlock()
    assert tune.running and tune.n >= 8, (tune.status, tune.n)
    assert min(out) == tune.lo and max(out) == tune.hi


def _drive_extremes(mod, results):
    n = 0
    for amp in (mod.AMP_MIN, mod.AMP_MAX):
        for hyst in (mod.HYST_MIN, mod.HYST_MAX):
            tune = mod.RelayTune()
            tune.start(
                65535,
                0,
                amp=amp,
                hyst=hyst,
                max_rise=mod.RISE_MAX,
                timeout_s=mod.TIMEOUT_MAX_S,
                cycles=2,
            )
            t = 0
            while tune.running:
                e = _triangle(t, 600000, mod.RISE_MAX)
                results[n] = tune.update(mod.DT_MAX_MS, e, 0, True, 0)
                t += mod.DT_MAX_MS
                n += 1
            assert tune.status == C.TUNE_DONE, C.TUNE_STATUS[tune.status]
            assert tune.pu_ms == 600000 and tune.kp > 0 and tune.ki >= 0, (tune.pu_ms, tune.kp)
    return n


def test_extremes_stay_small_ints():
    results = [0] * 40000
    if IS_MICROPYTHON:
        n = _drive_extremes(A, results)
    else:
        from intcheck import load_checked

        mod, chk = load_checked("device/control/autotune.py")
        with chk:
            n = _drive_extremes(mod, results)
            assert mod.ultimate_gain(mod.AMP_MAX, 1) == mod.GAIN_MAX
            assert mod.tyreus_luyben(mod.GAIN_MAX, 7200000)[1] >= 0
        assert chk.count > 10000, chk.count
        assert chk.peak <= 2**30 - 1, chk.peak
    assert n > 1000
    for d in results[:n]:
        assert -1 <= d <= 65535, d


class Plant:
    """Integer thermal plant with lag: C dT/dt = P - G(duty)(T - 25 degC), G = 1 + 9
    duty/65535 W/K, C = 200 J/K; the NTC follows T through a first-order lag
    ``lag_ms`` and a dead time of ``delay`` ticks (micro-degC inside)."""

    def __init__(self, lag_ms, delay, q_mw=300000):
        self.t_u = SP * 1000
        self.n_u = SP * 1000
        self.q = q_mw
        self.lag = lag_ms
        self.buf = [SP] * (delay + 1)

    def advance(self, duty):
        g = 1000 + 9000 * duty // 65535
        self.t_u += (self.q - g * (self.t_u // 1000 - 25000) // 1000) * DT // 200
        self.n_u += (self.t_u - self.n_u) * DT // (self.lag + DT)
        self.buf.append(self.n_u // 1000)
        self.buf.pop(0)

    @property
    def ntc(self):
        return self.buf[0]


def _closed(pid, plant, ticks):
    temps = []
    duties = []
    for _ in range(ticks):
        d = pid.step(plant.ntc, SP, DT)
        plant.advance(d)
        temps.append(plant.ntc)
        duties.append(d)
    return temps, duties


def test_tuned_gains_settle_lagging_plants_without_a_limit_cycle():
    for lag_ms, delay in ((12000, 20), (12000, 0), (6000, 10)):
        plant = Plant(lag_ms, delay)
        pid = PID(kp=5000, ki=100, out_min=FLOOR)
        _closed(pid, plant, 6000)  # settle near the setpoint first
        tune = RelayTune()
        tune.start(pid.duty, FLOOR)
        while True:
            d = tune.update(DT, plant.ntc - SP, 0, True, FLOOR)
            if d < 0:
                break
            plant.advance(d)
        assert tune.status == C.TUNE_DONE, (lag_ms, delay, C.TUNE_STATUS[tune.status])
        pid = PID(kp=tune.kp, ki=tune.ki, kd=tune.kd, out_min=FLOOR)
        pid.track(tune.bias, plant.ntc)
        temps, duties = _closed(pid, plant, 12000)  # 20 min
        tail = temps[-3000:]
        dtail = duties[-3000:]
        # settled: the last 5 minutes within +-0.2 degC and the duty within 1 %
        assert max(tail) - SP <= 200 and SP - min(tail) <= 200, (lag_ms, min(tail), max(tail))
        assert max(dtail) - min(dtail) <= 655, (lag_ms, min(dtail), max(dtail))
        # a load step (300 -> 450 W) is absorbed and settles again: no limit cycle
        plant.q = 450000
        temps, duties = _closed(pid, plant, 18000)
        assert max(temps) - SP < 8000, max(temps)
        tail = temps[-3000:]
        assert max(tail) - min(tail) <= 200, (lag_ms, min(tail), max(tail))


def test_settles_then_switches_about_the_steady_error():
    tune = _started(settle=True)
    held = _drive(tune, lambda t: -5000, A.SETTLE_MIN_MS // DT - 1)
    assert set(held) == {tune.bias} and tune.settling  # the bias, nothing else, so far

    def err(t):  # the wave starts after the settling
        return -5000 + _triangle(t, 20000, 1500)

    _drive(tune, lambda t: -5000, 1)
    assert not tune.settling and tune.center == -5000, (tune.settling, tune.center)
    assert tune.report()["center"] == -5000
    _drive(tune, err, 3000)
    assert tune.status == C.TUNE_DONE, C.TUNE_STATUS[tune.status]
    assert abs(tune.pu_ms - 20000) <= DT and abs(tune.a_mc - 1500) <= 30, (tune.pu_ms, tune.a_mc)


def test_settling_ends_at_its_limit_on_a_drift_and_respects_the_floor():
    tune = _started(settle=True)
    _drive(tune, lambda t: -(t // 10), A.SETTLE_MAX_MS // DT - 1)  # 1 degC per 10 s
    assert tune.settling
    _drive(tune, lambda t: -3000, 1)
    assert not tune.settling and tune.center == -3000 and tune.running
    tune = _started(settle=True)
    out = _drive(tune, lambda t: 0, 1000, floor=tune.bias + 1)
    assert tune.status == C.TUNE_FLOOR and len(out) == A.FLOOR_GRACE_MS // DT - 1, len(out)


def test_settling_outlasts_a_held_peak():
    # an envelope holds its peak for 90 s before it falls: that plateau is no steady
    # state, and with the hold given the relay's center is where the signal settles
    def err(t):
        return -2000 if t < 90000 else -6000

    fooled = _started(settle=True)
    _drive(fooled, err, 2000)
    assert fooled.center == -2000, fooled.center  # without hold_ms: the plateau
    tune = _started(settle=True, hold_ms=90000)
    _drive(tune, err, 2500)
    assert not tune.settling and tune.center == -6000, (tune.settling, tune.center)
    assert tune.t_ms < A.SETTLE_MAX_MS
