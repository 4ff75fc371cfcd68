"""Calibration fitting: NTC model parameters and corrections from reference points.

Host-side half of ``device/calib.py`` (which holds the models, the divider and the
lookup table the module builds at boot). Pure functions, no I/O, no numpy, and kept
MicroPython-clean: tests/test_calib.py runs it on both interpreters. It is never
flashed (it is not in firmware/allowlist.py): the module only evaluates coefficients,
so fitting code would only take its RAM. Fit on the host, send the result with
``cal_write`` (docs/calibration.md).

Reference points are ``[(r_ohm, t_degc), ...]``. Every fit rejects bad input and bad
results with ``calib.CalibrationError`` (also importable from here) whose message
says what is wrong and what to do.

Numerics: 1/T differences are formed as ``(T1 - T2) / (T1 T2)`` and ln R differences
as ``ln(R2 / R1)``, never as differences of nearly equal large numbers, so the exact
fits keep their accuracy with float32 inputs. The polynomial fit solves on x centred
and scaled to [-1, 1] with Householder QR and only then expands to powers of x.

>>> a, b, c = fit_steinhart_hart([(10000.0, 25.0), (3588.0, 50.0), (1491.6, 75.0)])
>>> round(model_temp_c(10000.0, "sh", (a, b, c)), 6)
25.0
"""

import math

from device.calib import (
    KELVIN,
    T_MAX_C,
    T_MIN_C,
    CalibrationError,
    beta_resistance,
    model_resistance,
    model_temp_c,
)

# The range where a fitted curve must be monotonic and well conditioned: what the
# module measures (ambient to a hot GPU), with margin.
CHECK_RANGE_C = (0.0, 125.0)

# Rejection thresholds (see docs/calibration.md, "What the rejections mean").
MIN_SPACING_C = 2.0  # reference temperatures closer than this are near-duplicates
MIN_LN_RATIO = 0.02  # |ln(R1/R2)| below this (2 %) means "same resistance"
MAX_NOISE_GAIN = 20.0  # worst curve movement per degC of reference error, over CHECK_RANGE_C
BETA_MIN_K = 1500.0  # plausible local beta of a fitted curve (real NTCs: 2000..5000 K)
BETA_MAX_K = 8000.0
MAX_POLY_COND = 1e5  # condition number of the scaled least-squares problem
_SAMPLES = 64  # monotonicity/noise samples over the check range
_INF = float("inf")


def residuals(points, model, params, correction=None):
    """Fitted minus reference temperature in degC, one per point, in input order."""
    return [model_temp_c(r, model, params, correction) - t for r, t in points]


# --------------------------------------------------------------------------- fits


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
