"""device.calib (NTC models, divider, LUT) and modbridge.firmware_host.calib_fit (exact
and least-squares fits, rejections).

Reference thermistor: the seed's Semitec 103JT (10 kohm at 25 degC, "B 3950 K"), and
the 103JT resistance table from Semitec's JT datasheet (B25/85 = 3435 K there).
"""

import math
import struct

from mpcompat import IS_MICROPYTHON, raises

from device import calib
from device.calib import CalibrationError
from modbridge.firmware_host import calib_fit

DUAL = True
MPY_TIMEOUT = 600

K = calib.KELVIN
BETA = (3950.0, 10000.0, 25.0 + K)  # seed's NTC as a beta model
# A Steinhart-Hart set for a 10 k NTC with a real (non-zero) C.
SH = (1.125308852e-3, 2.347637e-4, 8.5663516e-8)
# Semitec 103JT datasheet R/T table (kohm), degC -> ohm.
JT_TABLE = ((-50, 367.7e3), (-40, 204.7e3), (-30, 118.5e3), (-20, 71.02e3),
            (-10, 43.67e3), (0, 27.70e3), (10, 18.07e3), (25, 10.0e3))
F32_EPS = 2.0 ** -24  # unit roundoff of float32


def _f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def _close(a, b, rel=1e-9, abs_=0.0):
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_)


def _beta_points(temps, beta=BETA):
    return [(calib.beta_resistance(t + K, *beta), t) for t in temps]


def _sh_points(temps, sh=SH):
    return [(calib.sh_resistance(t + K, *sh), t) for t in temps]


# --------------------------------------------------------------------------- models


def test_beta_model_at_reference_and_inverse():
    assert _close(calib.beta_temp_k(10000.0, *BETA), 298.15)
    # R at 50 degC for B = 3950: 10k * exp(3950 * (1/323.15 - 1/298.15)) = 3588.18 ohm
    r50 = calib.beta_resistance(50.0 + K, *BETA)
    assert abs(r50 - 3588.18) < 0.01, r50
    for t in (-40.0, 0.0, 60.0, 125.0, 199.0):
        r = calib.beta_resistance(t + K, *BETA)
        assert _close(calib.beta_temp_k(r, *BETA), t + K), t


def test_sh_resistance_inverts_sh_temp():
    for t in (-55.0, -20.0, 0.0, 25.0, 77.7, 120.0, 200.0):
        r = calib.sh_resistance(t + K, *SH)
        assert _close(calib.sh_temp_k(r, *SH), t + K, rel=1e-12), (t, r)
    # C = 0 degenerates to the linear solution, still exact.
    a, b = 1.0 / 298.15 - math.log(1e4) / 3950.0, 1.0 / 3950.0
    assert _close(calib.sh_resistance(298.15, a, b, 0.0), 1e4, rel=1e-12)
    # A negligible C (an SH fit of pure beta data): no Cardano overflow, same answer.
    assert _close(calib.sh_resistance(298.15, a, b, 1e-25), 1e4, rel=1e-12)
    assert _close(calib.sh_resistance(298.15, a, b, -1e-20), 1e4, rel=1e-9)
    # With C != 0 it is a real cubic: the Cardano root matches the beta-free value.
    r25 = calib.sh_resistance(298.15, *SH)
    assert abs(r25 - 9981.45) < 0.01, r25


def test_poly_eval_horner_lowest_order_first():
    assert calib.poly_eval([1.0, 2.0, 3.0], 2.0) == 17.0
    assert calib.poly_eval([], 5.0) == 0.0
    assert calib.poly_eval([-0.5], 100.0) == -0.5


def test_model_temp_c_applies_correction():
    t = calib.model_temp_c(10000.0, "beta", BETA, [0.1, 0.01])
    assert _close(t, 25.0 + 0.1 + 0.25), t
    with raises(CalibrationError, match="unknown model 'poly'"):
        calib.model_temp_c(1e4, "poly", BETA)


# --------------------------------------------------------------------------- fits


def test_sh_exact_fit_recovers_known_coefficients():
    a, b, c = calib_fit.fit_steinhart_hart(_sh_points((25.0, 50.0, 75.0)))
    assert _close(a, SH[0], rel=1e-9) and _close(b, SH[1], rel=1e-9), (a, b)
    assert _close(c, SH[2], rel=1e-7), c
    # Order of the points does not matter.
    pts = _sh_points((75.0, 25.0, 50.0))
    assert _close(calib_fit.fit_steinhart_hart(pts)[2], SH[2], rel=1e-7)


def test_sh_fit_of_beta_data_is_the_beta_curve():
    # Seed NTC (10 k, B 3950) measured at the seed's 25/50/75 degC water-bath points.
    pts = _beta_points((25.0, 50.0, 75.0))
    a, b, c = calib_fit.fit_steinhart_hart(pts)
    assert _close(b, 1.0 / 3950.0, rel=1e-9), b
    assert abs(c) < 1e-15, c
    assert _close(a, 1.0 / 298.15 - math.log(1e4) / 3950.0, rel=1e-9), a
    for res in calib_fit.residuals(pts, "sh", (a, b, c)):
        assert abs(res) < 1e-9, res


def test_sh_fit_of_semitec_103jt_datasheet_table():
    # Three datasheet points; SH then reproduces the others within 0.15 degC (the table
    # has 4 digits), where the beta model through 0/25 degC is off by 1.4 degC at -40.
    pts = [(r, t) for t, r in JT_TABLE if t in (-40, 0, 25)]
    sh = calib_fit.fit_steinhart_hart(pts, check_range_c=(-40.0, 25.0))
    beta = calib_fit.fit_beta([(r, t) for t, r in JT_TABLE if t in (0, 25)])
    worst = 0.0
    for t, r in JT_TABLE:
        if t >= -40:
            worst = max(worst, abs(calib.model_temp_c(r, "sh", sh) - t))
    assert worst < 0.15, worst
    assert abs(calib.model_temp_c(204.7e3, "beta", beta) - -40.0) > 1.0


def test_beta_from_two_points():
    # B25/85 = 3435 K, the Semitec 103JT datasheet value.
    truth = (3435.0, 10000.0, 298.15)
    beta, r0, t0 = calib_fit.fit_beta(_beta_points((25.0, 85.0), truth))
    assert _close(beta, 3435.0) and _close(r0, 10000.0) and t0 == 298.15, (beta, r0, t0)
    # Hand check, datasheet 0 degC 27.70 k and 25 degC 10.0 k:
    # ln(2.770) / (1/273.15 - 1/298.15) = 1.018847 / 3.06970e-4 = 3319.0 K
    beta, r0, _ = calib_fit.fit_beta([(10000.0, 25.0), (27700.0, 0.0)])
    assert abs(beta - 3319.0) < 0.1 and _close(r0, 10000.0), (beta, r0)
    # R0 is referred to 25 degC even when no point is at 25 degC.
    beta, r0, t0 = calib_fit.fit_beta(_beta_points((40.0, 90.0)))
    assert _close(beta, 3950.0) and _close(r0, 10000.0) and t0 == 298.15


def test_beta_least_squares_from_more_points():
    pts = _beta_points((20.0, 45.0, 70.0, 95.0))
    factors = (1.004, 0.996, 1.004, 0.996)
    noisy = [(pts[i][0] * factors[i], pts[i][1]) for i in range(4)]
    beta, r0, _ = calib_fit.fit_beta(noisy)
    assert abs(beta - 3950.0) < 30.0 and abs(r0 - 10000.0) < 60.0, (beta, r0)
    # Exact data: exact answer.
    beta, r0, _ = calib_fit.fit_beta(pts)
    assert _close(beta, 3950.0, rel=1e-9) and _close(r0, 1e4, rel=1e-9)


def test_sh_least_squares_from_more_points():
    pts = _sh_points((10.0, 30.0, 50.0, 70.0, 90.0))
    a, b, c = calib_fit.fit_steinhart_hart(pts)
    for r, t in pts:
        assert abs(calib.sh_temp_k(r, a, b, c) - K - t) < 1e-6
    assert _close(c, SH[2], rel=1e-5), c


def test_poly_exact_for_degree_n_minus_1():
    truth = [102.3, -1.85, 0.0032, -2.1e-6]  # the seed's cubic, lowest order first
    xs = [0.0, 300.0, 700.0, 1000.0]
    ys = [calib.poly_eval(truth, x) for x in xs]
    got = calib_fit.fit_poly(xs, ys, 3)
    for i in range(4):
        assert _close(got[i], truth[i], rel=1e-7), (got, truth)
    assert calib_fit.fit_poly([5.0], [2.5], 0) == [2.5]


def test_poly_true_least_squares_hand_verified():
    # Line through (0,1), (1,3), (2,2), (3,5): slope = Sxy/Sxx = 5.5/5 = 1.1,
    # intercept = 2.75 - 1.1 * 1.5 = 1.1.
    c0, c1 = calib_fit.fit_poly([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 5.0], 1)
    assert _close(c0, 1.1, abs_=1e-12) and _close(c1, 1.1, abs_=1e-12), (c0, c1)
    # Parabola on x = -2..2, y = 4.1 0.9 0.2 1.1 3.9. Normal equations with
    # Sx2 = 10, Sx4 = 34, Sy = 10.2, Sxy = -0.2, Sx2y = 34.0:
    # c1 = -0.2/10 = -0.02; [5 10; 10 34][c0 c2] = [10.2 34] -> c0 = 6.8/70, c2 = 68/70.
    ys = [4.1, 0.9, 0.2, 1.1, 3.9]
    c0, c1, c2 = calib_fit.fit_poly([-2.0, -1.0, 0.0, 1.0, 2.0], ys, 2)
    assert _close(c0, 6.8 / 70, abs_=1e-12) and _close(c1, -0.02, abs_=1e-12), (c0, c1)
    assert _close(c2, 68.0 / 70, abs_=1e-12), c2
    # Same data shifted to x = 998..1002: returned in the ORIGINAL x, still right
    # (solved on centred/scaled x; normal equations in raw x would lose ~12 digits).
    coeffs = calib_fit.fit_poly([998.0, 999.0, 1000.0, 1001.0, 1002.0], ys, 2)
    assert _close(coeffs[2], 68.0 / 70, rel=1e-9), coeffs
    assert _close(coeffs[1], -0.02 - 2000.0 * 68.0 / 70, rel=1e-9), coeffs
    assert _close(calib.poly_eval(coeffs, 1000.0), 6.8 / 70, abs_=1e-6)


def test_fit_correction_cubic_from_four_points():
    # The NTC reads 0.2 degC low plus a curvature: the cubic correction absorbs it.
    pts = [(calib.beta_resistance(t + K, *BETA), t + 0.2 + 1e-4 * t * t)
           for t in (25.0, 50.0, 75.0, 100.0)]
    corr = calib_fit.fit_correction(pts, "beta", BETA, 3)
    assert len(corr) == 4
    for res in calib_fit.residuals(pts, "beta", BETA, corr):
        assert abs(res) < 1e-9, res
    assert _close(corr[0], 0.2, abs_=1e-9) and _close(corr[2], 1e-4, abs_=1e-12), corr


# --------------------------------------------------------------------------- rejections


def test_rejects_too_few_points():
    with raises(CalibrationError, match="Steinhart-Hart needs at least 3 reference points, got 2"):
        calib_fit.fit_steinhart_hart(_beta_points((25.0, 50.0)))
    with raises(CalibrationError, match="beta needs at least 2 reference points, got 1"):
        calib_fit.fit_beta(_beta_points((25.0,)))
    with raises(CalibrationError, match="degree-3 correction needs at least 4"):
        calib_fit.fit_correction(_beta_points((25.0, 50.0, 75.0)), "beta", BETA, 3)


def test_rejects_duplicate_temperatures():
    pts = [(10000.0, 25.0), (9500.0, 25.5), (3588.0, 50.0)]
    with raises(CalibrationError, match="near-duplicate temperatures 25.0 and 25.5"):
        calib_fit.fit_steinhart_hart(pts)


def test_rejects_duplicate_resistances():
    pts = [(10000.0, 25.0), (9950.0, 50.0), (1491.0, 75.0)]
    with raises(CalibrationError, match="near-duplicate resistances 10 kohm at 25.0"):
        calib_fit.fit_steinhart_hart(pts)


def test_rejects_resistance_rising_with_temperature():
    pts = [(10000.0, 25.0), (3588.0, 75.0), (1491.0, 50.0)]
    with raises(CalibrationError, match="resistance not decreasing with temperature") as e:
        calib_fit.fit_steinhart_hart(pts)
    assert "1.491 kohm at 50.0 degC but 3.588 kohm at 75.0 degC" in str(e.value)


def test_rejects_non_positive_resistance():
    for bad in (0.0, -5.0):
        with raises(CalibrationError, match="non-positive or infinite resistance"):
            calib_fit.fit_beta([(bad, 25.0), (3588.0, 50.0)])
    with raises(CalibrationError, match="open circuit"):
        calib_fit.fit_beta([(float("inf"), 25.0), (3588.0, 50.0)])


def test_rejects_temperature_out_of_range():
    with raises(CalibrationError, match="temperature 298.15 degC outside -55.0..200.0") as e:
        calib_fit.fit_beta([(10000.0, 298.15), (3588.0, 50.0)])
    assert "kelvin" in str(e.value)
    with raises(CalibrationError, match="outside"):
        calib_fit.fit_beta([(10000.0, -60.0), (3588.0, 50.0)])


def test_rejects_ill_conditioned_spread():
    # 25/35/45 degC must cover 0..125 degC: a 0.1 degC bath error would move the
    # curve by ~7 degC at 125 degC.
    with raises(CalibrationError, match="ill-conditioned: an error of 0.1 degC") as e:
        calib_fit.fit_steinhart_hart(_beta_points((25.0, 35.0, 45.0)))
    assert "at 125 degC" in str(e.value) and "spread them out" in str(e.value)
    # The same points are fine for a range they actually cover.
    calib_fit.fit_steinhart_hart(_beta_points((25.0, 35.0, 45.0)), check_range_c=(20.0, 50.0))


def test_rejects_implausible_curve():
    # Monotonic readings, but 3.6 k -> 3.3 k from 50 to 75 degC is no NTC (beta ~400 K).
    with raises(CalibrationError, match="implausible curve: local beta"):
        calib_fit.fit_steinhart_hart([(10000.0, 25.0), (3600.0, 50.0), (3300.0, 75.0)])


def test_rejects_non_monotonic_fit():
    # Fitted SH whose curve folds back: no resistance range covers the check range.
    with raises(CalibrationError, match="non-monotonic curve: the model has no resistance"):
        calib_fit.fit_steinhart_hart([(10000.0, 25.0), (9000.0, 50.0), (1500.0, 75.0)])
    # A cubic correction through monotonic points that overshoots between them.
    pts = [(calib.beta_resistance(t + K, *BETA), y)
           for t, y in ((25.0, 25.0), (50.0, 60.0), (75.0, 62.0), (100.0, 100.0))]
    with raises(CalibrationError, match="non-monotonic curve: temperature rises from 60.7"):
        calib_fit.fit_correction(pts, "beta", BETA, 3)


def test_poly_rejections():
    with raises(CalibrationError, match="degree 3 needs at least 4 points, got 3: use degree <= 2"):
        calib_fit.fit_poly([0.0, 1.0, 2.0], [0.0, 1.0, 4.0], 3)
    with raises(CalibrationError, match="only 2 are distinct"):
        calib_fit.fit_poly([1.0, 1.0, 2.0, 2.0], [0.0, 0.1, 1.0, 1.1], 2)
    with raises(CalibrationError, match="ill-conditioned: condition number"):
        calib_fit.fit_poly([0.0, 0.001, 0.002, 10.0], [0.0, 1.0, 2.0, 3.0], 3)
    with raises(CalibrationError, match="3 x values but 2 y values"):
        calib_fit.fit_poly([0.0, 1.0, 2.0], [0.0, 1.0], 1)
    with raises(CalibrationError, match="degree must be >= 0"):
        calib_fit.fit_poly([0.0], [0.0], -1)


def test_build_lut_rejects_bad_curve_and_size():
    with raises(CalibrationError, match="non-monotonic curve: the table goes from"):
        calib.build_lut("beta", BETA, 10000.0, True, [0.0, -2.0])
    with raises(CalibrationError, match="LUT points must be 17..4097"):
        calib.build_lut("beta", BETA, 10000.0, points=9)


# --------------------------------------------------------------------------- divider


def test_adc_ohms_round_trip_both_orientations():
    for low in (True, False):
        for r in (75.0, 1000.0, 10000.0, 33000.0, 1.2e6):
            code = calib.ohms_to_adc(r, 10000.0, low)
            assert _close(calib.adc_to_ohms(code, 10000.0, low), r, rel=1e-9), (low, r)
    # 10 k NTC at 25 degC + 10 k fixed: mid-scale.
    assert calib.ohms_to_adc(10000.0, 10000.0) == 32767.5
    assert calib.adc_to_ohms(32767.5, 10000.0, False) == 10000.0
    # Low side: 0 is a short, full scale an open circuit; high side the reverse.
    assert calib.adc_to_ohms(0, 10000.0, True) == 0.0
    assert calib.adc_to_ohms(65535, 10000.0, True) == float("inf")
    assert calib.adc_to_ohms(0, 10000.0, False) == float("inf")
    assert calib.adc_to_ohms(65535, 10000.0, False) == 0.0
    # A 12-bit ADC read through read_u16 (raw << 4 | raw >> 8) is full scale 65535.
    raw = 1234
    code = (raw << 4) | (raw >> 8)
    assert abs(calib.adc_to_ohms(code, 1e4) - calib.adc_to_ohms(raw, 1e4, True, 4095)) < 0.5


# --------------------------------------------------------------------------- LUT


def _lut_max_error_mc(model, params, low, correction=None, lo_c=0.0, hi_c=120.0, stride=1):
    lut, step = calib.build_lut(model, params, 10000.0, low, correction)
    worst = 0.0
    at = None
    for code in range(1, 65535, stride):
        t = calib.model_temp_c(calib.adc_to_ohms(code, 10000.0, low), model, params, correction)
        if lo_c <= t <= hi_c:
            err = abs(calib.lut_interp_mc(lut, step, code) - t * 1000.0)
            if err > worst:
                worst, at = err, t
    return worst, at


def test_lut_accuracy_vs_direct_model():
    # 257 points (step 256), 10 k NTC + 10 k fixed: measured max |LUT - model| over
    # 0..120 degC is 54.0 m degC (beta 3950) and 59.6 m degC (SH), both at ~118-120
    # degC where the curve is steepest; 1 LSB of a 12-bit ADC there is ~190 m degC.
    stride = 7 if IS_MICROPYTHON else 1
    for model, params in (("beta", BETA), ("sh", SH)):
        for low in (True, False):
            worst, at = _lut_max_error_mc(model, params, low, stride=stride)
            print("LUT max error", model, "low" if low else "high", round(worst, 1),
                  "m degC at", round(at, 1), "degC")
            assert worst < 65.0, (model, low, worst, at)
    worst, _ = _lut_max_error_mc("beta", BETA, True, lo_c=0.0, hi_c=100.0, stride=stride)
    assert worst < 30.0, worst
    worst, _ = _lut_max_error_mc("beta", BETA, True, [0.3, -0.002, 1e-5], stride=stride)
    assert worst < 65.0, worst


def test_lut_layout_and_sentinels():
    lut, step = calib.build_lut("beta", BETA, 10000.0, True)
    # array("h") in 1/128 degC: 514 B, half of int32 milli-degC (issue 24's boot RAM)
    assert step == 256 and len(lut) == 257 and len(bytes(lut)) == 2 * 257
    assert calib.LUT_PER_C == 128
    # Entry 128 is code 32768 (~25 degC); code 0 is a short, 65536 an open.
    assert abs(lut[128] - 25 * 128) <= 2, lut[128]
    assert lut[0] == calib.LUT_SHORT and lut[256] == calib.LUT_OPEN
    valid = [v for v in lut if v != calib.LUT_OPEN and v != calib.LUT_SHORT]
    assert min(valid) >= -55 * 128 and max(valid) <= 200 * 128
    assert -32768 == calib.LUT_OPEN < min(valid) and max(valid) < calib.LUT_SHORT == 32767
    assert valid == sorted(valid, reverse=True)
    lut_h, _ = calib.build_lut("beta", BETA, 10000.0, False)
    assert lut_h[0] == calib.LUT_OPEN and lut_h[256] == calib.LUT_SHORT
    # Exactly on an entry, interpolation returns the entry in milli-degC (rounded).
    assert calib.lut_interp_mc(lut, step, 128 * 256) == (lut[128] * 1000 + 64) // 128
    assert calib.lut_interp_mc(lut, step, 128 * 256 + 128) == (
        (lut[128] * 1000 + 64) // 128 + (lut[129] * 1000 + 64) // 128 + 1
    ) // 2
    # Other sizes: 129 points -> step 512; 1025 points -> step 64.
    assert calib.build_lut("beta", BETA, 1e4, points=129)[1] == 512
    assert calib.build_lut("sh", SH, 1e4, points=1025)[1] == 64


# --------------------------------------------------------------------------- float32


def test_float32_inputs_barely_move_the_sh_fit():
    # Every input (R and T in K) perturbed by +-1 float32 ulp in all 64 sign
    # combinations: the curve over 0..125 degC moves by < 1 m degC (measured 0.34).
    pts = _sh_points((25.0, 50.0, 75.0))
    base = calib_fit.fit_steinhart_hart(pts)
    grid = [calib.sh_resistance(t + K, *SH) for t in range(0, 126, 5)]
    worst = 0.0
    for bits in range(64):
        moved = []
        for i in range(3):
            sr = 1.0 if bits >> (2 * i) & 1 else -1.0
            st = 1.0 if bits >> (2 * i + 1) & 1 else -1.0
            r, t = pts[i]
            moved.append((r * (1.0 + sr * F32_EPS), (t + K) * (1.0 + st * F32_EPS) - K))
        p = calib_fit.fit_steinhart_hart(moved)
        for r in grid:
            worst = max(worst, abs(calib.sh_temp_k(r, *p) - calib.sh_temp_k(r, *base)))
    assert worst < 1e-3, worst
    # And with the inputs really rounded to float32.
    p = calib_fit.fit_steinhart_hart([(_f32(r), _f32(t)) for r, t in pts])
    for r in grid:
        assert abs(calib.sh_temp_k(r, *p) - calib.sh_temp_k(r, *base)) < 1e-3


def test_float32_coefficients_and_evaluation():
    # Coefficients stored as float32 and the SH evaluated with every intermediate
    # rounded to float32 (what an STM32F4/RP2040 build does): < 0.2 m degC off.
    a, b, c = (_f32(x) for x in calib_fit.fit_steinhart_hart(_sh_points((25.0, 50.0, 75.0))))
    worst = 0.0
    for i in range(121):
        t = float(i)
        r = _f32(calib.sh_resistance(t + K, *SH))
        ln_r = _f32(math.log(r))
        inner = _f32(b + _f32(_f32(c * ln_r) * ln_r))
        y = _f32(a + _f32(inner * ln_r))
        got = _f32(_f32(1.0 / y) - _f32(K))
        worst = max(worst, abs(got - t))
    assert worst < 2e-4, worst
    # Beta parameters as float32: the table built from them is within 1 m degC.
    lut64, step = calib.build_lut("beta", BETA, 1e4)
    lut32, _ = calib.build_lut("beta", tuple(_f32(x) for x in BETA), _f32(1e4))
    assert max(abs(lut64[i] - lut32[i]) for i in range(len(lut64))) <= 1
