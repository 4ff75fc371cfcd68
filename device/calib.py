"""NTC thermistor models, fitting from reference points, and the ADC lookup table.

Pure functions, no I/O, no numpy: the same file runs on the host (CPython, doubles)
and on the module (MicroPython; single-precision floats on the STM32F4 and RP2040
ports). Floats are used only at boot (``build_lut``) and in commands; the control
tick reads temperatures through ``lut_interp_mc``, which is integer-only.

Models (temperatures in kelvin, resistances in ohms):

- Steinhart-Hart ``1/T = A + B ln R + C (ln R)^3``: params ``(A, B, C)``, model "sh".
- beta ``1/T = 1/T0 + ln(R/R0) / beta``: params ``(beta, r0_ohm, t0_k)``, model "beta".
- an optional additive correction in degC, a polynomial in the model temperature in
  degC (``poly_eval``), fitted by least squares from n >= degree + 1 points.

Reference points are ``[(r_ohm, t_degc), ...]``. Every fit rejects bad input and bad
results with ``CalibrationError`` whose message says what is wrong and what to do.

Numerics: 1/T differences are formed as ``(T1 - T2) / (T1 T2)`` and ln R differences
as ``ln(R2 / R1)``, never as differences of nearly equal large numbers, so the exact
fits keep their accuracy with float32 inputs. The polynomial fit solves on x centred
and scaled to [-1, 1] with Householder QR and only then expands to powers of x.

>>> a, b, c = fit_steinhart_hart([(10000.0, 25.0), (3588.0, 50.0), (1491.6, 75.0)])
>>> round(sh_temp_k(10000.0, a, b, c) - KELVIN, 6)
25.0
"""

import math
from array import array

try:
    from micropython import const
except ImportError:  # CPython
    const = lambda x: x

KELVIN = 273.15
T_MIN_C = -55.0  # widest range a reference point or a LUT entry may have
T_MAX_C = 200.0
# The range where a fitted curve must be monotonic and well conditioned: what the
# module measures (ambient to a hot GPU), with margin.
CHECK_RANGE_C = (0.0, 125.0)

# LUT sentinels. An open NTC reads as "infinitely cold", a shorted one as "infinitely
# hot", whichever side of the divider it is on. Both are far outside -55..200 degC
# and still small ints on a 32-bit MCU (|x| < 2**30).
LUT_OPEN = const(-0x20000000)
LUT_SHORT = const(0x20000000)

# Rejection thresholds (see docs/calibration.md, "What the rejections mean").
MIN_SPACING_C = 2.0  # reference temperatures closer than this are near-duplicates
MIN_LN_RATIO = 0.02  # |ln(R1/R2)| below this (2 %) means "same resistance"
MAX_NOISE_GAIN = 20.0  # worst curve movement per degC of reference error, over CHECK_RANGE_C
BETA_MIN_K = 1500.0  # plausible local beta of a fitted curve (real NTCs: 2000..5000 K)
BETA_MAX_K = 8000.0
MAX_POLY_COND = 1e5  # condition number of the scaled least-squares problem
_SAMPLES = 64  # monotonicity/noise samples over the check range


class CalibrationError(ValueError):
    """A calibration input or result is unusable; the message says why."""


# --------------------------------------------------------------------------- models


def sh_temp_k(r_ohm, a, b, c):
    """Steinhart-Hart: temperature in K of resistance ``r_ohm``."""
    ln_r = math.log(r_ohm)
    return 1.0 / (a + (b + c * ln_r * ln_r) * ln_r)


def sh_resistance(t_k, a, b, c):
    """Inverse Steinhart-Hart: resistance in ohms at ``t_k`` kelvin.

    Solves ``C L^3 + B L + (A - 1/T) = 0`` for L = ln R with Cardano's formula (the
    cubic has no L^2 term), in the form that avoids cancellation, then polishes with
    three Newton steps. With C = 0 it is the linear (beta-like) solution.
    """
    y = 1.0 / t_k
    lin = (y - a) / b  # the root when C = 0, and the Newton start otherwise
    ln_r = lin
    # Cardano only when the cubic term matters; a negligible C (e.g. an SH fit of
    # pure beta data) would overflow p^3 in float32, and Newton needs no help there.
    if abs(c * lin * lin) > 1e-7 * abs(b):
        p = b / c
        q = (a - y) / c
        disc = 0.25 * q * q + p * p * p / 27.0
        if disc >= 0.0:
            s = math.sqrt(disc)
            w = -0.5 * q + (s if q <= 0.0 else -s)  # the larger-magnitude branch
            u = _cbrt(w)
            if u != 0.0:
                ln_r = u - p / (3.0 * u)
    for _ in range(3):
        f = a + (b + c * ln_r * ln_r) * ln_r - y
        d = b + 3.0 * c * ln_r * ln_r
        if d == 0.0:
            break
        ln_r -= f / d
    return math.exp(ln_r)


def beta_temp_k(r_ohm, beta, r0_ohm, t0_k):
    """Beta model: temperature in K of resistance ``r_ohm``."""
    return 1.0 / (1.0 / t0_k + math.log(r_ohm / r0_ohm) / beta)


def beta_resistance(t_k, beta, r0_ohm, t0_k):
    """Inverse beta model: resistance in ohms at ``t_k`` kelvin."""
    return r0_ohm * math.exp(beta * (t0_k - t_k) / (t_k * t0_k))


def poly_eval(coeffs, x):
    """Horner evaluation of ``coeffs`` (lowest order first) at ``x``; 0.0 if empty.

    >>> poly_eval([1.0, 2.0, 3.0], 2.0)
    17.0
    """
    acc = 0.0
    i = len(coeffs) - 1
    while i >= 0:
        acc = acc * x + coeffs[i]
        i -= 1
    return acc


def model_temp_c(r_ohm, model, params, correction=None):
    """Temperature in degC of ``r_ohm`` under ``model`` ("sh" or "beta"), corrected."""
    if model == "sh":
        t = sh_temp_k(r_ohm, params[0], params[1], params[2]) - KELVIN
    elif model == "beta":
        t = beta_temp_k(r_ohm, params[0], params[1], params[2]) - KELVIN
    else:
        raise CalibrationError("unknown model {!r}: use 'sh' or 'beta'".format(model))
    if correction:
        t += poly_eval(correction, t)
    return t


def model_resistance(t_c, model, params):
    """Resistance in ohms at ``t_c`` degC under ``model`` (no correction)."""
    t_k = t_c + KELVIN
    if model == "sh":
        return sh_resistance(t_k, params[0], params[1], params[2])
    if model == "beta":
        return beta_resistance(t_k, params[0], params[1], params[2])
    raise CalibrationError("unknown model {!r}: use 'sh' or 'beta'".format(model))


def residuals(points, model, params, correction=None):
    """Fitted minus reference temperature in degC, one per point, in input order."""
    return [model_temp_c(r, model, params, correction) - t for r, t in points]


# --------------------------------------------------------------------------- divider


def adc_to_ohms(code, r_fixed_ohm, ntc_on_low_side=True, full_scale=65535):
    """NTC resistance from a ratiometric ADC code (divider and ADC share Vref).

    ``ntc_on_low_side``: NTC from the ADC node to ground, fixed resistor to Vref, so
    ``code / full = R / (R + Rf)``. Otherwise the NTC goes to Vref and the fixed
    resistor to ground: ``code / full = Rf / (R + Rf)``. Returns 0.0 for a short and
    ``inf`` for an open circuit (the codes at the ends of the scale).
    """
    code = float(code)
    if ntc_on_low_side:
        if code >= full_scale:
            return _INF
        if code <= 0.0:
            return 0.0
        return r_fixed_ohm * code / (full_scale - code)
    if code <= 0.0:
        return _INF
    if code >= full_scale:
        return 0.0
    return r_fixed_ohm * (full_scale - code) / code


def ohms_to_adc(r_ohm, r_fixed_ohm, ntc_on_low_side=True, full_scale=65535):
    """ADC code (a float; round it yourself) the divider gives for ``r_ohm``."""
    if r_ohm == _INF:
        return float(full_scale) if ntc_on_low_side else 0.0
    if ntc_on_low_side:
        return full_scale * r_ohm / (r_ohm + r_fixed_ohm)
    return full_scale * r_fixed_ohm / (r_ohm + r_fixed_ohm)


# --------------------------------------------------------------------------- LUT


def build_lut(
    model,
    params,
    r_fixed_ohm,
    ntc_on_low_side=True,
    correction=None,
    points=257,
    full_scale=65535,
    t_min_c=T_MIN_C,
    t_max_c=T_MAX_C,
):
    """Table of milli-degC at evenly spaced ADC codes, for ``lut_interp_mc``.

    Returns ``(lut, step)``: ``lut`` is an ``array('i')`` of ``points`` entries, entry
    i for code ``i * step``; ``step = ceil((full_scale + 1) / (points - 1))``, so the
    table reaches past full scale (257 points: step 256, codes 0..65536). Entries
    where the divider implies a temperature outside ``t_min_c..t_max_c`` are
    ``LUT_SHORT`` (too hot: R too small) or ``LUT_OPEN`` (too cold: R too large).
    ``points`` must be 17..4097 so the integer interpolation stays below 2**30.
    Raises CalibrationError if the (corrected) curve is not monotonic.
    """
    if points < 17 or points > 4097:
        raise CalibrationError("LUT points must be 17..4097, got {}".format(points))
    step = (full_scale + points - 1) // (points - 1)
    r_mid = model_resistance(25.0, model, params)
    lut = array("i", bytes(4 * points))
    for i in range(points):
        r = adc_to_ohms(i * step, r_fixed_ohm, ntc_on_low_side, full_scale)
        lut[i] = _lut_entry(r, r_mid, model, params, correction, t_min_c, t_max_c)
    _check_lut(lut, ntc_on_low_side)
    return lut, step


def lut_interp_mc(lut, step, code):
    """Milli-degC at ``code`` by linear interpolation; integer-only, no allocation.

    The caller keeps ``code`` inside the valid range (between two non-sentinel
    entries); ``|lut[i+1] - lut[i]| * (step - 1)`` stays below 2**30 there.
    """
    i = code // step
    frac = code - i * step
    lo = lut[i]
    if frac == 0:
        return lo
    return lo + ((lut[i + 1] - lo) * frac + (step >> 1)) // step


def _lut_entry(r, r_mid, model, params, correction, t_min_c, t_max_c):
    if r <= 0.0:
        return LUT_SHORT
    if r == _INF:
        return LUT_OPEN
    try:
        t = model_temp_c(r, model, params, correction)
    except (ValueError, ZeroDivisionError, OverflowError):
        t = None
    if t is None or t != t or t < t_min_c or t > t_max_c:
        # Out of range or outside the model's domain: classify by resistance.
        return LUT_SHORT if r < r_mid else LUT_OPEN
    return int(t * 1000.0 + (0.5 if t >= 0.0 else -0.5))


def _check_lut(lut, ntc_on_low_side):
    prev = None
    runs = 0  # valid runs seen
    in_run = False
    for i in range(len(lut)):
        v = lut[i]
        if v == LUT_OPEN or v == LUT_SHORT:
            in_run = False
            continue
        if not in_run:
            runs += 1
            in_run = True
            prev = None
        if prev is not None and (v > prev if ntc_on_low_side else v < prev):
            raise CalibrationError(
                "non-monotonic curve: the table goes from {} to {} m degC between "
                "neighbouring ADC codes; the coefficients (or the correction) bend "
                "the curve back, refit".format(prev, v)
            )
        prev = v
    if runs != 1:
        raise CalibrationError(
            "the coefficients give no single valid temperature range over the ADC "
            "codes ({} separate ranges); check model and divider settings".format(runs)
        )


# --------------------------------------------------------------------------- fitting


def fit_steinhart_hart(points, check_range_c=CHECK_RANGE_C):
    """Steinhart-Hart ``(A, B, C)`` from reference points ``[(r_ohm, t_degc), ...]``.

    Exactly 3 points: the standard closed-form solution (L = ln R, Y = 1/T,
    gamma2 = (Y2 - Y1)/(L2 - L1), gamma3 = (Y3 - Y1)/(L3 - L1),
    C = (gamma3 - gamma2) / ((L3 - L2)(L1 + L2 + L3)), B = gamma2 - C (L1^2 + L1 L2 + L2^2),
    A = Y1 - (B + C L1^2) L1). More points: least squares on the same model.
    Rejects bad points, a curve that is not monotonic over ``check_range_c`` and
    points too close together for the range they must cover (noise gain).
    """
    pts = _check_points(points, 3, "Steinhart-Hart")
    params = _solve_sh(pts)
    _check_fit(pts, "sh", params, check_range_c, _solve_sh)
    return params


def fit_beta(points, check_range_c=CHECK_RANGE_C):
    """Beta model ``(beta, r0_ohm, t0_k)`` with t0 = 25 degC, from >= 2 points.

    Two points: ``beta = ln(R1/R2) / (1/T1 - 1/T2)``; more: least squares of 1/T on
    ln R. R0 is the fitted resistance at 25 degC (the datasheet R25).
    """
    pts = _check_points(points, 2, "beta")
    params = _solve_beta(pts)
    if not params[0] > 0.0:
        raise CalibrationError("fitted beta {:.1f} K is not positive".format(params[0]))
    _check_fit(pts, "beta", params, check_range_c, _solve_beta)
    return params


def fit_poly(xs, ys, degree):
    """Least-squares polynomial, coefficients in the ORIGINAL x, lowest order first.

    With ``degree = n - 1`` (n distinct x) the polynomial interpolates exactly. Solved
    by Householder QR on x centred and scaled to [-1, 1]; rejects a degree the points
    cannot determine and an ill-conditioned problem (clustered x).
    """
    n = len(xs)
    if n != len(ys):
        raise CalibrationError("fit_poly: {} x values but {} y values".format(n, len(ys)))
    if degree < 0:
        raise CalibrationError("polynomial degree must be >= 0, got {}".format(degree))
    if n < degree + 1:
        raise CalibrationError(
            "degree {} needs at least {} points, got {}: use degree <= {}".format(
                degree, degree + 1, n, n - 1
            )
        )
    distinct = len(set(xs))
    if distinct < degree + 1:
        raise CalibrationError(
            "degree {} needs {} distinct x values, only {} are distinct: too few "
            "distinct points for this degree".format(degree, degree + 1, distinct)
        )
    lo = min(xs)
    hi = max(xs)
    mid = 0.5 * (lo + hi)
    half = 0.5 * (hi - lo) if hi > lo else 1.0
    cols = degree + 1
    rows = [[1.0] * cols for _ in range(n)]
    for i in range(n):
        z = (xs[i] - mid) / half
        for k in range(1, cols):
            rows[i][k] = rows[i][k - 1] * z
    coef_z, cond = _lstsq_qr(rows, [float(y) for y in ys])
    if cond > MAX_POLY_COND:
        raise CalibrationError(
            "ill-conditioned: condition number {:.2g} > {:.0g}; the x values are too "
            "clustered for degree {} (small errors in the readings would swing the "
            "coefficients wildly). Spread the points out or lower the degree".format(
                cond, MAX_POLY_COND, degree
            )
        )
    return _unscale_poly(coef_z, mid, half)


def fit_correction(points, model, params, degree=3, check_range_c=CHECK_RANGE_C):
    """Additive correction (degC, polynomial in the model temperature in degC).

    ``points`` are ``[(r_ohm, t_degc), ...]``; fits ``t_ref - t_model`` against
    ``t_model`` with ``fit_poly`` (a cubic, as in the seed, needs >= 4 points) and
    rejects a correction that makes the curve non-monotonic over ``check_range_c``.
    """
    pts = _check_points(points, degree + 1, "a degree-{} correction".format(degree))
    xs = [model_temp_c(r, model, params) for r, _ in pts]
    ys = [pts[i][1] - xs[i] for i in range(len(pts))]
    coeffs = fit_poly(xs, ys, degree)
    _check_monotonic(model, params, coeffs, check_range_c)
    return coeffs


# --------------------------------------------------------------------------- internals

_INF = float("inf")


def _cbrt(x):
    return x ** (1.0 / 3.0) if x >= 0.0 else -((-x) ** (1.0 / 3.0))


def _fmt_r(r):
    return "{:.4g} kohm".format(r / 1000.0)


def _check_points(points, need, what):
    """Validate reference points; return them sorted by temperature as floats."""
    pts = []
    for p in points:
        if len(p) != 2:
            raise CalibrationError("a reference point is (r_ohm, t_degc), got {!r}".format(p))
        pts.append((float(p[0]), float(p[1])))
    if len(pts) < need:
        raise CalibrationError(
            "{} needs at least {} reference points, got {}".format(what, need, len(pts))
        )
    for r, t in pts:
        if not r > 0.0 or r == _INF:
            raise CalibrationError(
                "non-positive or infinite resistance {!r} ohm at {} degC: the channel "
                "reads a short or an open circuit, check the wiring".format(r, t)
            )
        if not (T_MIN_C <= t <= T_MAX_C):
            raise CalibrationError(
                "temperature {} degC outside {}..{} degC: typo, or kelvin instead of degC?".format(
                    t, T_MIN_C, T_MAX_C
                )
            )
    pts.sort(key=lambda p: p[1])
    for i in range(1, len(pts)):
        (r1, t1), (r2, t2) = pts[i - 1], pts[i]
        if t2 - t1 < MIN_SPACING_C:
            raise CalibrationError(
                "duplicate or near-duplicate temperatures {} and {} degC (closer than "
                "{} degC): each reference point must be a different temperature".format(
                    t1, t2, MIN_SPACING_C
                )
            )
    for i in range(1, len(pts)):
        (r1, t1), (r2, t2) = pts[i - 1], pts[i]
        if abs(math.log(r2 / r1)) < MIN_LN_RATIO:
            raise CalibrationError(
                "near-duplicate resistances {} at {} degC and {} at {} degC: the "
                "sensor did not follow the bath (not immersed, wrong channel, or "
                "not settled)".format(_fmt_r(r1), t1, _fmt_r(r2), t2)
            )
        if r2 > r1:
            raise CalibrationError(
                "resistance not decreasing with temperature: {} at {} degC but {} at "
                "{} degC; an NTC must fall monotonically (wrong channel, swapped "
                "points, or a PTC?)".format(_fmt_r(r1), t1, _fmt_r(r2), t2)
            )
    return pts


def _solve_sh(pts):
    if len(pts) == 3:
        (r1, t1), (r2, t2), (r3, t3) = pts
        k1, k2, k3 = t1 + KELVIN, t2 + KELVIN, t3 + KELVIN
        l1 = math.log(r1)
        l2 = math.log(r2)
        l3 = math.log(r3)
        d21 = math.log(r2 / r1)  # L2 - L1 without cancellation
        d31 = math.log(r3 / r1)
        d32 = math.log(r3 / r2)
        g2 = (k1 - k2) / (k1 * k2) / d21  # (Y2 - Y1) / (L2 - L1)
        g3 = (k1 - k3) / (k1 * k3) / d31
        c = (g3 - g2) / (d32 * (l1 + l2 + l3))
        b = g2 - c * (l1 * l1 + l1 * l2 + l2 * l2)
        a = 1.0 / k1 - (b + c * l1 * l1) * l1
        return (a, b, c)
    # Least squares in u = L - L0 with the basis {1, u, u^3 + 3 L0 u^2}; it is the
    # same model (1/T = a' + b' u + C(...)), and far better conditioned than {1, L, L^3}.
    l0 = 0.0
    for r, _ in pts:
        l0 += math.log(r)
    l0 /= len(pts)
    rows = []
    ys = []
    for r, t in pts:
        u = math.log(r) - l0
        rows.append([1.0, u, u * u * u + 3.0 * l0 * u * u])
        ys.append(1.0 / (t + KELVIN))
    (ap, bp, c), _ = _lstsq_qr(rows, ys)
    # u^3 + 3 L0 u^2 = L^3 - 3 L0^2 L + 2 L0^3, so the fit collects to A + B L + C L^3:
    b = bp - 3.0 * c * l0 * l0
    a = ap - bp * l0 + 2.0 * c * l0 * l0 * l0
    return (a, b, c)


def _solve_beta(pts):
    if len(pts) == 2:
        (r1, t1), (r2, t2) = pts
        k1, k2 = t1 + KELVIN, t2 + KELVIN
        beta = math.log(r1 / r2) * k1 * k2 / (k2 - k1)
        ref_r, ref_k = r1, k1
    else:
        # 1/T = 1/T0 + ln(R/R0)/beta: slope of y = 1/T on x = ln R, centred.
        n = len(pts)
        xs = [math.log(r) for r, _ in pts]
        ys = [1.0 / (t + KELVIN) for _, t in pts]
        mx = sum(xs) / n
        my = sum(ys) / n
        sxy = 0.0
        sxx = 0.0
        for i in range(n):
            sxy += (xs[i] - mx) * (ys[i] - my)
            sxx += (xs[i] - mx) * (xs[i] - mx)
        beta = sxx / sxy
        ref_r, ref_k = math.exp(mx), 1.0 / my
    t0 = 25.0 + KELVIN
    r0 = beta_resistance(t0, beta, ref_r, ref_k)
    return (beta, r0, t0)


def _check_fit(pts, model, params, check_range_c, solve):
    for p in params:
        if p != p or p == _INF or p == -_INF:
            raise CalibrationError("fit produced a non-finite coefficient: {!r}".format(params))
    _check_monotonic(model, params, None, check_range_c)
    # Noise gain: move each reference temperature by DT and see how far the curve
    # moves anywhere in the check range. Points close together, far from the range
    # they have to cover, give a large gain (extrapolation amplifies their errors).
    dt = 0.01
    grid = _r_grid(model, params, check_range_c)
    base = [model_temp_c(r, model, params) for r in grid]
    worst = 0.0
    worst_t = 0.0
    for j in range(len(pts)):
        moved = [(r, t + dt if i == j else t) for i, (r, t) in enumerate(pts)]
        try:
            p2 = solve(moved)
            for k in range(len(grid)):
                d = abs(model_temp_c(grid[k], model, p2) - base[k])
                if d > worst:
                    worst, worst_t = d, base[k]
        except (ValueError, ZeroDivisionError, OverflowError):
            worst = _INF
    gain = worst / dt
    if not gain <= MAX_NOISE_GAIN:
        raise CalibrationError(
            "ill-conditioned: an error of 0.1 degC in one reference reading moves the "
            "fitted curve by up to {:.1f} degC (at {:.0f} degC; noise gain {:.0f} > {:.0f}). "
            "The reference temperatures are too close together for the range {}..{} "
            "degC: spread them out (e.g. 25/50/75 degC)".format(
                0.1 * gain, worst_t, gain, MAX_NOISE_GAIN, check_range_c[0], check_range_c[1]
            )
        )


def _r_grid(model, params, check_range_c):
    lo, hi = check_range_c
    return [
        model_resistance(lo + (hi - lo) * i / (_SAMPLES - 1), model, params)
        for i in range(_SAMPLES)
    ]


def _check_monotonic(model, params, correction, check_range_c):
    """T must fall strictly as R grows over the check range (sampled in ln R)."""
    lo, hi = check_range_c
    # Resistances at the range ends from the uncorrected model, where it is sane;
    # fall back to a generic NTC range if the model misbehaves there.
    try:
        r_hi = model_resistance(lo, model, params)
        r_lo = model_resistance(hi, model, params)
        ok = r_hi == r_hi and r_lo == r_lo and 0.0 < r_lo < r_hi < _INF
    except (ValueError, ZeroDivisionError, OverflowError):
        ok = False
    if not ok:
        raise CalibrationError(
            "non-monotonic curve: the model has no resistance range covering {}..{} "
            "degC; refit with points spanning the range".format(lo, hi)
        )
    l_lo = math.log(r_lo)
    span = math.log(r_hi) - l_lo
    prev = None
    r_prev = 0.0
    for i in range(_SAMPLES):
        r = math.exp(l_lo + span * i / (_SAMPLES - 1))
        try:
            t = model_temp_c(r, model, params, correction)
        except (ValueError, ZeroDivisionError, OverflowError):
            t = None
        if t is None or t != t or t < -KELVIN:
            raise CalibrationError(
                "non-monotonic curve: no valid temperature at {} within {}..{} degC".format(
                    _fmt_r(r), lo, hi
                )
            )
        if prev is not None and not t < prev:
            raise CalibrationError(
                "non-monotonic curve: temperature rises from {:.2f} to {:.2f} degC as "
                "resistance grows to {} (within {}..{} degC); the fit bends back, use "
                "better spread or more points, or a lower correction degree".format(
                    prev, t, _fmt_r(r), lo, hi
                )
            )
        if prev is not None and correction is None:
            # Local beta between neighbouring samples: real NTCs have 2000..5000 K.
            k0, k1 = prev + KELVIN, t + KELVIN
            local = math.log(r / r_prev) * k0 * k1 / (k0 - k1)
            if not BETA_MIN_K <= local <= BETA_MAX_K:
                raise CalibrationError(
                    "implausible curve: local beta {:.0f} K near {:.0f} degC (an NTC has "
                    "{:.0f}..{:.0f} K); the readings do not look like one NTC thermistor, "
                    "check the channel, wiring and bath temperatures".format(
                        local, t, BETA_MIN_K, BETA_MAX_K
                    )
                )
        prev = t
        r_prev = r


def _lstsq_qr(rows, ys):
    """Least squares min |M c - y| by Householder QR; returns (c, cond1 estimate).

    ``rows`` is modified. The condition number is ``|R|_1 |R^-1|_1`` of the
    triangular factor, i.e. of the column-equilibrated system.
    """
    m = len(rows)
    n = len(rows[0])
    # Equilibrate columns (unit 2-norm) so the condition estimate is scale-free.
    scale = [0.0] * n
    for k in range(n):
        s = math.sqrt(sum(rows[i][k] * rows[i][k] for i in range(m)))
        scale[k] = s if s > 0.0 else 1.0
        for i in range(m):
            rows[i][k] /= scale[k]
    y = list(ys)
    for k in range(n):
        norm = math.sqrt(sum(rows[i][k] * rows[i][k] for i in range(k, m)))
        if norm == 0.0:
            return [0.0] * n, _INF
        alpha = -norm if rows[k][k] >= 0.0 else norm
        v = [0.0] * m
        v[k] = rows[k][k] - alpha
        for i in range(k + 1, m):
            v[i] = rows[i][k]
        vv = sum(v[i] * v[i] for i in range(k, m))
        if vv == 0.0:
            continue
        for j in range(k, n):
            f = 2.0 * sum(v[i] * rows[i][j] for i in range(k, m)) / vv
            for i in range(k, m):
                rows[i][j] -= f * v[i]
        f = 2.0 * sum(v[i] * y[i] for i in range(k, m)) / vv
        for i in range(k, m):
            y[i] -= f * v[i]
    # Back substitution R c = Q^T y, and R^-1 for the condition estimate.
    for k in range(n):
        if rows[k][k] == 0.0:
            return [0.0] * n, _INF
    c = [0.0] * n
    for k in range(n - 1, -1, -1):
        s = y[k]
        for j in range(k + 1, n):
            s -= rows[k][j] * c[j]
        c[k] = s / rows[k][k]
    inv = [[0.0] * n for _ in range(n)]
    for col in range(n):
        for k in range(n - 1, -1, -1):
            s = 1.0 if k == col else 0.0
            for j in range(k + 1, n):
                s -= rows[k][j] * inv[j][col]
            inv[k][col] = s / rows[k][k]
    norm_r = max(sum(abs(rows[i][j]) for i in range(j + 1)) for j in range(n))
    norm_inv = max(sum(abs(inv[i][j]) for i in range(n)) for j in range(n))
    return [c[k] / scale[k] for k in range(n)], norm_r * norm_inv


def _unscale_poly(coef_z, mid, half):
    """Coefficients of p(x) = sum c_k ((x - mid)/half)^k in powers of x."""
    n = len(coef_z)
    out = [0.0] * n
    # Horner in the polynomial ring: out = out * ((x - mid)/half) + c_k.
    a0 = -mid / half
    a1 = 1.0 / half
    k = n - 1
    while k >= 0:
        nxt = [0.0] * n
        for j in range(n):
            if out[j] != 0.0:
                nxt[j] += out[j] * a0
                if j + 1 < n:
                    nxt[j + 1] += out[j] * a1
        nxt[0] += coef_z[k]
        out = nxt
        k -= 1
    return out
