"""device.control.estimator: the die estimate, its peak envelope, the NTC fallback,
the feed-forward power envelope, the +-2**30 bound (CPython, instrumented) and zero
allocation (MicroPython)."""

from array import array

from mpcompat import IS_MICROPYTHON, heap_lock, heap_unlock

from device.control.estimator import INVALID, WINDOW_MAX_S, DieEstimator

DUAL = True


def _feed(est, seconds, ntc, die, power, fresh=True, dt=100):
    env = INVALID
    for _ in range(seconds * 1000 // dt):
        env = est.update(ntc, die, fresh, power, dt)
    return env


def test_fresh_heartbeat_is_the_estimate_plus_half_a_degree():
    est = DieEstimator()
    env = est.update(60000, 75000, True, 300000, 100)
    assert est.est == 75500 and env == 75500  # NVML truncates whole degrees


def test_envelope_holds_burst_peaks_for_the_window():
    est = DieEstimator(window_s=30)
    # 6 s at 80 degC, 4 s at 60 degC, for 2 minutes: the envelope stays at the peak
    for _ in range(12):
        for _ in range(60):
            env = est.update(55000, 80000, True, 300000, 100)
            assert env == 80500, env
        for _ in range(40):
            env = est.update(55000, 60000, True, 50000, 100)
            assert env == 80500, env
    # a real drop (the last peak was 4 s ago): it leaves the window after 30 s
    env = _feed(est, 25, 50000, 60000, 50000)
    assert env == 80500, env
    env = _feed(est, 2, 50000, 60000, 50000)
    assert env == 60500, env
    # a rise counts at once
    assert est.update(50000, 70000, True, 300000, 100) == 70500


def test_quantised_die_does_not_move_the_envelope():
    est = DieEstimator(window_s=90)
    for i in range(3000):  # NVML toggles between 76 and 77 every few seconds
        env = est.update(60000, 77000 if (i // 37) % 2 else 76000, True, 300000, 100)
        if i > 400:
            assert env == 77500, (i, env)


def test_fallback_learns_the_offset_per_watt_and_stops_without_a_host():
    est = DieEstimator(window_s=0, offset_tau_ms=10000)
    # die 10 degC above the NTC at 250 W: 0.04 degC per W
    _feed(est, 120, 60000, 70000, 250000)
    # heartbeat without a temperature: NTC + learned offset at the current power
    env = est.update(60000, 0, False, 250000, 100)
    assert abs(env - 70500) <= 100, env
    env = est.update(60000, 0, False, 125000, 100)
    assert abs(env - 65250) <= 100, env  # half the power, half the offset
    # no host (no power either): no estimate, the caller uses the NTC channels
    assert est.update(60000, 0, False, 0, 100) == INVALID
    assert est.env == INVALID
    # an open GPU NTC without a fresh die: nothing either
    assert est.update(INVALID, 0, False, 250000, 100) == INVALID


def test_power_envelope_rises_at_once_holds_then_falls_slowly():
    est = DieEstimator(window_s=90, power_tau_ms=300000)
    est.update(50000, 60000, True, 25000, 100)
    assert est.power_f == 25000
    est.update(50000, 60000, True, 320000, 100)
    assert est.power_f == 320000  # a load step: the feed-forward moves at once
    for _ in range(10):  # 30 s / 30 s bursts: held at the peak
        _feed(est, 30, 50000, 60000, 25000)
        assert est.power_f == 320000, est.power_f
        _feed(est, 30, 50000, 60000, 320000)
    _feed(est, 90, 50000, 60000, 25000)  # a real drop: held for the window
    assert est.power_f == 320000, est.power_f
    _feed(est, 900, 50000, 60000, 25000)  # then three time constants
    assert 25000 < est.power_f < 45000, est.power_f


def test_ntc_envelope_holds_burst_peaks_and_never_reads_low():
    # the GPU NTC through its envelope: a rise at once, held for the window, then a
    # fall with NTC_TAU_MS; INVALID with the sensor (and without a host, the same)
    from device.control.estimator import NTC_TAU_MS

    est = DieEstimator(window_s=90)
    est.update(50000, 0, False, 0, 100)
    assert est.ntc_env == 50000
    for _ in range(20):  # 6 s / 4 s bursts: the NTC swings 50..62, the envelope holds 62
        _feed(est, 6, 62000, 70000, 650000)
        assert est.ntc_env == 62000, est.ntc_env
        _feed(est, 4, 50000, 60000, 80000)
        assert est.ntc_env == 62000, est.ntc_env
    _feed(est, 85, 50000, 60000, 80000)  # a real drop (89 s low): held for the window
    assert est.ntc_env == 62000, est.ntc_env
    _feed(est, 1 + 3 * NTC_TAU_MS // 1000, 50000, 60000, 80000)  # then about 3 tau
    assert 50000 < est.ntc_env < 50000 + 12000 // 15, est.ntc_env
    est.update(64000, 0, False, 0, 100)
    assert est.ntc_env == 64000  # a reading above it: at once
    est.update(INVALID, 0, False, 0, 100)
    assert est.ntc_env == INVALID  # an open NTC: no envelope either
    est.update(55000, 0, False, 0, 100)
    assert est.ntc_env == 55000


def test_configure_validates():
    est = DieEstimator()
    for bad in ((-1, 1, 1), (WINDOW_MAX_S + 1, 1, 1), (1, 600001, 1), (1, 1, 1.5)):
        try:
            est.configure(*bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    est.configure(0, 0, 0)
    assert est.update(60000, 70000, True, 200000, 100) == 70500
    assert est.power_f == 200000


def _row(*values):
    # not a constant tuple: frozen into the qemu image, its ints above 0x1FFF would be
    # mpz objects and the estimator's arithmetic on them would allocate (the test
    # would measure its own data; tests/test_frozen_ints.py)
    return values


EXTREMES = (  # rows built at run time: a constant tuple's big ints freeze as mpz
    _row(2**29, 2**29, True, 2**29, 1000),
    _row(-(2**29), -(2**29), True, -(2**29), 1),
    _row(INVALID, 2**29, True, 2**29, 1000),
    _row(2**29, 0, False, 2**29, 1000),
    _row(-(2**29), 0, False, 2097151, 1),
    _row(0, 0, True, 0, -5),
    _row(1048575, -1048575, True, 2097151, 1000),
    _row(-1048575, 1048575, True, 20000, 1000),
)


def _drive(mod, out, begin, end):
    k = 0
    for cfg in ((WINDOW_MAX_S, 600000, 600000), (1, 1, 1), (0, 0, 0), (90, 300000, 1)):
        est = mod.DieEstimator(*cfg)
        begin()
        try:
            for _ in range(3):
                for a in EXTREMES:
                    for _ in range(12):
                        out[k] = est.update(a[0], a[1], a[2], a[3], a[4])
                        r = est.rise_mc()  # the hosted law's guard reads it every tick
                        if not -(2**22) < r < 2**22:
                            out[k] = r  # out of the envelope's range: caught below
                        k += 1
            out[k] = est.power_f
            k += 1
        finally:
            end()
    return k


def test_extremes_stay_small_ints():
    n = 4 * (3 * len(EXTREMES) * 12 + 1)
    out = array("i", [0] * n)
    if IS_MICROPYTHON:
        import device.control.estimator as mod

        count = _drive(mod, out, heap_lock, heap_unlock)
    else:
        from intcheck import load_checked

        mod, chk = load_checked("device/control/estimator.py")
        count = _drive(mod, out, chk.__enter__, chk.__exit__)
        assert chk.count > 1000, chk.count
        assert chk.peak <= 2**30 - 1, chk.peak
    assert count == n
    for v in out:
        assert v == INVALID or -(2**21) <= v <= 2**21 + 1000, v


def test_update_does_not_allocate():
    est = DieEstimator()
    out = array("i", [0] * 600)
    heap_lock()
    try:
        for i in range(600):
            out[i] = est.update(60000 + i, 70000 + (i & 7) * 100, (i % 50) != 0, 300000, 100)
    finally:
        heap_unlock()
    assert out[-1] >= 70500


def test_rise_is_the_envelopes_over_ten_seconds():
    est = DieEstimator(window_s=90)
    _feed(est, 20, 50000, 60000, 300000)
    assert est.rise_mc() == 0, est.rise_mc()  # steady
    die = 60000
    for _ in range(15):  # a die heading up at 1 degC/s
        die += 1000
        _feed(est, 1, 50000, die, 300000)
    assert 9000 <= est.rise_mc() <= 11000, est.rise_mc()
    # bursts under the window: the envelope holds the peak, no rise after the first
    for _ in range(6):
        _feed(est, 6, 50000, die + 5000, 300000)
        _feed(est, 4, 50000, die - 15000, 300000)
    assert est.rise_mc() == 0, est.rise_mc()
    assert DieEstimator(window_s=0).rise_mc() == 0
    est.update(INVALID, 0, False, 0, 100)  # no estimate: no rise
    assert est.rise_mc() == 0
