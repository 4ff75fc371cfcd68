"""device.control.curve: interpolation, clamps, hysteresis, validation, zero allocation."""

from array import array

from mpcompat import IS_MICROPYTHON, heap_lock, heap_unlock, raises

from device.control.curve import FanCurve

DUAL = True

POINTS = [[40000, 13107], [60000, 32768], [80000, 65535]]


def _exact(points, t):
    """Reference: rational interpolation, rounded half up."""
    if t <= points[0][0]:
        return points[0][1]
    if t >= points[-1][0]:
        return points[-1][1]
    for i in range(len(points) - 1):
        t0, d0 = points[i]
        t1, d1 = points[i + 1]
        if t0 <= t < t1:
            return d0 + ((d1 - d0) * (t - t0) * 2 + (t1 - t0)) // (2 * (t1 - t0))


def test_points_and_interpolation():
    c = FanCurve(POINTS)
    for t, d in POINTS:
        assert c.interpolate(t) == d
    assert abs(c.interpolate(50000) - 22937) <= 1  # 13107 + 19661/2 = 22937.5
    assert abs(c.interpolate(70000) - 49151) <= 1  # half way from 32768 to 65535
    for t in range(40000, 80001, 137):
        got = c.interpolate(t)
        want = _exact(POINTS, t)
        assert abs(got - want) <= 1, (t, got, want)  # 20 degC segments: bound 1


def test_clamps_outside_the_points():
    c = FanCurve(POINTS)
    assert c.interpolate(-(2**29)) == 13107
    assert c.interpolate(39999) == 13107
    assert c.interpolate(80001) == 65535
    assert c.interpolate(2**29) == 65535
    assert c.duty(-(2**29)) == 13107
    assert c.duty(2**29) == 65535


def test_monotonic_and_accurate_on_wide_segments():
    pts = [[-500000, 0], [0, 1], [1000, 1000], [499999, 65534], [500000, 65535]]
    c = FanCurve(pts)
    prev = -1
    t = -500000
    while t <= 500000:
        got = c.interpolate(t)
        assert got >= prev, (t, got, prev)
        # 500 degC, 0..65535 segment: error bound 1/2 + span / 2**(s+1)
        assert abs(got - _exact(pts, t)) <= 1 + 499000 // 16384, (t, got)
        assert got <= 65535
        prev = got
        t += 997


def test_flat_curve_and_sixteen_points():
    assert FanCurve([[0, 30000], [100000, 30000]]).interpolate(50000) == 30000
    pts = [[i * 5000, i * 4000] for i in range(16)]
    c = FanCurve(pts)
    assert c.interpolate(37500) == 30000
    assert c.interpolate(75000) == 60000


def test_hysteresis_up_then_down():
    c = FanCurve(POINTS, hysteresis_mc=3000)
    # rising follows the curve at once
    assert c.duty(50000) == c.interpolate(50000)
    assert c.duty(60000) == 32768
    # small falls (< hysteresis) hold the duty
    for t in (59000, 58000, 57001, 57000, 59500):
        assert c.duty(t) == 32768, t
    # further down it follows the curve shifted by 3 degC
    assert c.duty(56000) == c.interpolate(59000)
    assert c.duty(50000) == c.interpolate(53000)
    assert c.effective_mc == 53000
    # rising again: held until the temperature passes the held point, then the curve
    assert c.duty(52000) == c.interpolate(53000)
    assert c.duty(53000) == c.interpolate(53000)
    assert c.duty(54000) == c.interpolate(54000)
    # dithering by less than the hysteresis never moves the duty
    held = c.duty(54000)
    for t in (53000, 51500, 53900, 51001, 54000):
        assert c.duty(t) == held, t


def test_hysteresis_down_from_hot_is_continuous():
    c = FanCurve(POINTS, hysteresis_mc=2000)
    c.duty(90000)
    prev = 65535
    t = 90000
    while t >= 30000:
        d = c.duty(t)
        assert d <= prev, (t, d, prev)
        assert prev - d <= 200, (t, d, prev)  # no jumps: steps of 100 m degC
        prev = d
        t -= 100
    assert prev == 13107
    c.reset()
    assert c.duty(70000) == c.interpolate(70000)


def test_zero_hysteresis_is_the_plain_curve():
    c = FanCurve(POINTS)
    for t in (70000, 50000, 65000, 41000, 79000):
        assert c.duty(t) == c.interpolate(t)


def test_validation_messages():
    cases = (
        ([[40000, 0]], "needs 2..16 points, got 1"),
        ([[i, 0] for i in range(17)], "needs 2..16 points, got 17"),
        ("40000,0", "list of [temp_mc, duty] pairs"),
        ([[40000, 0], [50000]], "point 1: expected [temp_mc, duty]"),
        ([[40000, 0], 5], "point 1: expected [temp_mc, duty]"),
        ([[40000, 0], [40000, 100]], "point 1: temperatures must rise strictly"),
        ([[40000, 0], [30000, 100]], "(30000 after 40000 m degC)"),
        ([[40000, 50000], [50000, 40000]], "duty falls from 50000 to 40000"),
        ([[40000, 0], [50000, 65536]], "point 1: duty must be an int in 0..65535"),
        ([[40000, -1], [50000, 0]], "point 0: duty must be an int"),
        ([[40000, 0.5], [50000, 1]], "duty must be an int"),
        ([[40.5, 0], [50000, 1]], "temperature must be an int in -500000..500000"),
        ([[40000, 0], [600000, 1]], "point 1: temperature must be an int"),
        ([[True, 0], [50000, 1]], "temperature must be an int"),
    )
    for points, message in cases:
        with raises(ValueError, match=message):
            FanCurve(points)
    with raises(ValueError, match="hysteresis_mc must be an int in 0..20000"):
        FanCurve(POINTS, hysteresis_mc=20001)
    with raises(ValueError, match="hysteresis_mc"):
        FanCurve(POINTS, hysteresis_mc=-1)


def test_failed_configure_keeps_the_old_curve():
    c = FanCurve(POINTS, 1000)
    with raises(ValueError):
        c.configure([[0, 100], [10, 50]], 0)
    assert c.points() == POINTS
    assert c.hysteresis_mc == 1000
    c.configure([(0, 100), (10000, 200)], 500)  # tuples are fine too
    assert c.points() == [[0, 100], [10000, 200]]


def test_duty_does_not_allocate():
    c = FanCurve(POINTS, hysteresis_mc=3000)
    out = array("i", [0] * 200)
    heap_lock()
    try:
        t = 30000
        for i in range(200):
            t += 700 if i < 100 else -700
            out[i] = c.duty(t) + c.interpolate(t) - c.interpolate(t)
    finally:
        heap_unlock()
    assert out[99] == 65535
    assert out[199] == 13107
    for i in range(1, 100):
        assert out[i] >= out[i - 1]
    for i in range(101, 200):
        assert out[i] <= out[i - 1]


def test_intermediates_stay_small_ints():
    if IS_MICROPYTHON:
        return  # the instrumented copy needs CPython's ast; the MCU bound is proven here
    from intcheck import load_checked

    mod, chk = load_checked("device/control/curve.py")
    worst = (
        [[-500000, 0], [500000, 65535]],
        [[-500000, 0], [-499999, 65535], [500000, 65535]],
        [[-500000, 0], [499999, 1], [500000, 65535]],
        [[0, 1], [1, 2], [500000, 65535]],
    )
    for pts in worst:
        c = mod.FanCurve(pts, 20000)
        with chk:
            for t in (-(2**29), -500001, -500000, -1, 0, 1, 499999, 500000, 2**29, -(2**29)):
                d = c.duty(t)
                assert 0 <= d <= 65535
                c.interpolate(t)
    assert chk.count > 100
    assert chk.peak < 2**30
