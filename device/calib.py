"""NTC thermistor models, the divider, and the ADC lookup table the module reads.

Pure functions, no I/O, no numpy: the same file runs on the host (CPython, doubles)
and on the module (MicroPython; single-precision floats on the STM32F4 and RP2040
ports). Floats are used only at boot (``build_lut``) and in commands; the control
tick reads temperatures through ``lut_interp_mc``, which is integer-only.

Models (temperatures in kelvin, resistances in ohms):

- Steinhart-Hart ``1/T = A + B ln R + C (ln R)^3``: params ``(A, B, C)``, model "sh".
- beta ``1/T = 1/T0 + ln(R/R0) / beta``: params ``(beta, r0_ohm, t0_k)``, model "beta".
- an optional additive correction in degC, a polynomial in the model temperature in
  degC (``poly_eval``).

Fitting those parameters from reference points is
``host/modbridge/firmware_host/calib_fit.py``: shared pure code too (tested on both
interpreters), but run on the host only and never flashed, so its code does not take
the module's RAM (docs/calibration.md).

>>> round(beta_temp_k(10000.0, 3950.0, 10000.0, 298.15) - KELVIN, 6)
25.0
"""

import math
from array import array

# The control tick's interpolation lives with the driver that runs it (this module is
# needed to build a table only: device.app forgets it after configuring).
from device.drivers.ntc import lut_interp_mc  # noqa: F401 - this module's API too

try:
    from micropython import const
except ImportError:  # CPython
    const = lambda x: x

KELVIN = 273.15
T_MIN_C = -55.0  # widest range a reference point or a LUT entry may have
T_MAX_C = 200.0

# LUT entries are int16 (an ``array('h')``, half the RAM of int32: two 257-entry tables
# are resident on a board, the channels' and the spare) in 1/128 degC: -55..200 degC is
# -7,040..25,600, 7.8 m degC a step, and ``lut_interp_mc`` turns them into milli-degC.
LUT_PER_C = const(128)
# LUT sentinels. An open NTC reads as "infinitely cold", a shorted one as "infinitely
# hot", whichever side of the divider it is on: the int16 extremes, outside the range
# of any entry (T_MIN_C..T_MAX_C).
LUT_OPEN = const(-32768)
LUT_SHORT = const(32767)


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
    out=None,
):
    """Table of temperatures at evenly spaced ADC codes, for ``lut_interp_mc``.

    Returns ``(lut, step)``: ``lut`` is an ``array('h')`` of ``points`` entries in
    1/``LUT_PER_C`` degC, entry
    i for code ``i * step``; ``step = ceil((full_scale + 1) / (points - 1))``, so the
    table reaches past full scale (257 points: step 256, codes 0..65536). Entries
    where the divider implies a temperature outside ``t_min_c..t_max_c`` are
    ``LUT_SHORT`` (too hot: R too small) or ``LUT_OPEN`` (too cold: R too large).
    ``points`` must be 17..4097 so the integer interpolation stays below 2**30.
    Raises CalibrationError if the (corrected) curve is not monotonic.

    ``out``: an ``array('h')`` of ``points`` entries to fill instead of a new one (the
    App's spare table: a command builds a table without a fresh 514 B block); on an
    error its content is undefined, so it must be a table nobody reads.
    """
    if points < 17 or points > 4097:
        raise CalibrationError("LUT points must be 17..4097, got {}".format(points))
    step = (full_scale + points - 1) // (points - 1)
    r_mid = model_resistance(25.0, model, params)
    if out is not None and len(out) == points:
        lut = out
    else:
        lut = array("h", range(points))  # sized from len(range): no temporary bytes
    for i in range(points):
        r = adc_to_ohms(i * step, r_fixed_ohm, ntc_on_low_side, full_scale)
        lut[i] = _lut_entry(r, r_mid, model, params, correction, t_min_c, t_max_c)
    _check_lut(lut, ntc_on_low_side)
    return lut, step


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
    return int(t * LUT_PER_C + (0.5 if t >= 0.0 else -0.5))


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


# --------------------------------------------------------------------------- internals

_INF = float("inf")


def _cbrt(x):
    return x ** (1.0 / 3.0) if x >= 0.0 else -((-x) ** (1.0 / 3.0))
