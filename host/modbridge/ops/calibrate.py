"""Calibrating a module's NTC channels: reference points, fits, checks, the session.

The library behind ``modbridge calibrate`` (docs/calibration.md). The physics and the
fits are the firmware's own shared code, run here on the host: ``device.calib``
(models, divider, the lookup table the module builds) and ``modbridge.firmware_host.calib_fit`` (the
fits and their rejections). This module adds what a person needs around them:

- parsing reference points ``T:VALUE`` (``25:32776`` a raw ``read_u16()`` code,
  ``25:10kohm`` a resistance) and evaluation values (:func:`parse_point`,
  :func:`parse_value`);
- the host-side checks of the points (:func:`check_points`: count, range, duplicates,
  codes at the rails, an NTC's falling resistance), raising :class:`InputError`
  (exit 2), before ``calib_fit`` sees them;
- :func:`fit`: the fit, with ``calib_fit``'s rejections and the module's own checks
  (its lookup table, its config validation, the correction band) raising
  :class:`FitRefused` (exit 1) with the reason verbatim; the result
  (:class:`FitResult`) carries the residuals per point, the predicted error over the
  range, the ``cal_write`` fields exactly as they are sent, and the config snippet;
- :class:`GuidedSession`: the bath-by-bath session against a module over a
  :class:`~modbridge.link.session.ModuleLink` (``cal_read``, ``cal_write``,
  ``config_save``), with the person's input injected (``ask``/``confirm``), so tests
  script it;
- :class:`SimBath`: with ``--sim``, the virtual module's probes "in a bath" at the
  temperature the person enters.

Units: temperatures in degC, resistances in ohms, codes on the ``read_u16()`` scale
(0..65535) unless a divider says otherwise.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field

from device import calib
from modbridge.errors import ModbridgeError
from modbridge.firmware_host import calib_fit
from protocol import catalog as C

CHANNELS = tuple(C.CHANNELS)  # ("gpu", "vram", "mos", "amb"): the firmware's order
MODELS = ("steinhart-hart", "beta", "poly")
WIRE_MODEL = {"steinhart-hart": "sh", "beta": "beta", "poly": "poly"}
MIN_POINTS = {"steinhart-hart": 3, "beta": 2}  # poly: its degree + 1
DEFAULT_DEGREE = 3  # the seed's cubic correction
MAX_DEGREE = 7  # cal_write's coeffs hold 8
FULL_SCALE = 65535  # read_u16()
LSB_CODES = 16  # one 12-bit ADC step on the read_u16() scale
RAIL_FRACTION = 0.01  # a code within 1 % of either end of the scale: open or short
REF_ACCURACY_C = 0.1  # the reference thermometer the docs ask for
STEADY_DRIFT_C = 0.1  # reads of one bath whose means differ more: not steady
NOISY_SPREAD_C = 1.0  # samples of one read spread wider than this: noisy
DEFAULT_SAMPLES = 256
DEFAULT_READS = 3
T_MIN_C = calib.T_MIN_C
T_MAX_C = calib.T_MAX_C
CHECK_RANGE_C = calib_fit.CHECK_RANGE_C
_DT = 0.01  # degC: the reference perturbation for the error estimate


class CalibrateError(ModbridgeError):
    """Calibration could not be done; the message says why (exit 1)."""


class InputError(CalibrateError):
    """A point, a value or an option is unusable as given (exit 2)."""

    exit_code = 2


class FitRefused(CalibrateError):
    """The points are readable but the fit would be wrong; ``reason`` says why.

    ``reason`` is ``calib_fit``'s (or the module's check's) message verbatim."""

    def __init__(self, reason: str, channel: str | None = None):
        self.reason = reason
        self.channel = channel
        where = f"channel {channel}: " if channel else ""
        super().__init__(f"{where}fit refused: {reason}")


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Divider:
    """The voltage divider the ADC reads (docs/calibration.md, "The divider")."""

    r_fixed_ohm: float = 10000.0
    ntc_low: bool = True  # NTC from the ADC pin to ground
    full_scale: int = FULL_SCALE

    def ohms(self, code: float) -> float:
        return calib.adc_to_ohms(code, self.r_fixed_ohm, self.ntc_low, self.full_scale)

    def code(self, r_ohm: float) -> float:
        return calib.ohms_to_adc(r_ohm, self.r_fixed_ohm, self.ntc_low, self.full_scale)

    def at_rail(self, code: float) -> str | None:
        """``"open"``/``"short"`` for a code within RAIL_FRACTION of an end, else None."""
        margin = RAIL_FRACTION * self.full_scale
        if code <= margin:
            return "short" if self.ntc_low else "open"
        if code >= self.full_scale - margin:
            return "open" if self.ntc_low else "short"
        return None


@dataclass(frozen=True)
class Value:
    """A reading as typed: a raw ADC code or a resistance (``kind``: code | ohm)."""

    text: str
    kind: str
    number: float

    def ohms(self, divider: Divider) -> float:
        return self.number if self.kind == "ohm" else divider.ohms(self.number)

    def code(self, divider: Divider) -> float:
        return self.number if self.kind == "code" else divider.code(self.number)


_OHM_RE = re.compile(
    r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kKmM]?)\s*(?:ohms?|Ω|Ohms?|OHMS?)\s*$"
)
_NUM_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "m": 1e6}


def parse_value(text: str, full_scale: int = FULL_SCALE) -> Value:
    """``"32776"`` (a code 0..full_scale, fractions allowed: a mean) or a resistance
    with an ``ohm`` suffix: ``"10000ohm"``, ``"10kohm"``, ``"10k ohm"``, ``"4.1k ohm"``,
    ``"1.2Mohm"`` (``ohms`` and ``Ω`` too; ``k`` = 1e3, ``M`` or ``m`` = 1e6).

    >>> parse_value("4.1k ohm").number
    4100.0
    """
    s = str(text)
    m = _OHM_RE.match(s)
    if m:
        r = float(m.group(1)) * _PREFIX[m.group(2)]
        if not r > 0.0 or not math.isfinite(r):
            raise InputError(f"{s!r}: a resistance must be > 0 ohm")
        return Value(s.strip(), "ohm", r)
    m = _NUM_RE.match(s)
    if m:
        code = float(m.group(1))
        if code > full_scale:
            raise InputError(
                f"{s!r}: a raw ADC code is 0..{full_scale} (read_u16 scale); for a "
                "resistance add 'ohm' (e.g. 10kohm)"
            )
        return Value(s.strip(), "code", code)
    if re.match(r"^\s*[0-9.]+\s*[kKmM]\s*$", s):
        raise InputError(f"{s!r}: a resistance needs the ohm suffix, e.g. {s.strip()}ohm")
    raise InputError(
        f"{s!r} is neither a raw ADC code (0..{full_scale}) nor a resistance with an "
        "ohm suffix (10000ohm, 10kohm, 4.1k ohm)"
    )


def parse_point(text: str, full_scale: int = FULL_SCALE) -> tuple[float, Value]:
    """``"T:VALUE"``: reference temperature in degC, and the reading (:func:`parse_value`)."""
    s = str(text)
    if ":" not in s:
        raise InputError(f"point {s!r}: expected T:VALUE, e.g. 25:32776 or 25:10kohm")
    t_txt, v_txt = s.split(":", 1)
    try:
        t_c = float(t_txt)
    except ValueError:
        raise InputError(f"point {s!r}: {t_txt.strip()!r} is not a temperature in degC") from None
    if not math.isfinite(t_c):
        raise InputError(f"point {s!r}: the temperature must be a finite number of degC")
    if not v_txt.strip():
        raise InputError(f"point {s!r}: the reading after ':' is missing (a code or ohms)")
    try:
        value = parse_value(v_txt, full_scale)
    except InputError as e:
        raise InputError(f"point {s!r}: {e}") from None
    return t_c, value


def parse_temperature(text: str) -> float:
    """A reference temperature typed at the prompt, degC; InputError if unusable."""
    try:
        t = float(str(text).strip().removesuffix("C").removesuffix("degC").strip())
    except ValueError:
        raise InputError(f"{text!r} is not a temperature in degC (or 'done')") from None
    if not math.isfinite(t) or not T_MIN_C <= t <= T_MAX_C:
        raise InputError(
            f"{text.strip()} degC is outside {T_MIN_C:g}..{T_MAX_C:g} degC: typo, or kelvin?"
        )
    return t


def parse_channel(text) -> int:
    """A channel name (gpu, vram, mos, amb) or index 0..3."""
    s = str(text).strip().lower()
    if s in CHANNELS:
        return CHANNELS.index(s)
    if s.isdigit() and int(s) < len(CHANNELS):
        return int(s)
    raise InputError(f"channel {text!r}: one of {', '.join(CHANNELS)} (or 0..{len(CHANNELS) - 1})")


# --------------------------------------------------------------------------- curves


@dataclass(frozen=True)
class Curve:
    """A channel's model as its config holds it: model, params, correction."""

    model: str  # "sh" | "beta"
    params: tuple
    correction: tuple = ()

    def temp_c(self, r_ohm: float, with_correction: bool = True) -> float:
        corr = list(self.correction) if with_correction and self.correction else None
        return calib.model_temp_c(r_ohm, self.model, self.params, corr)

    def describe(self) -> str:
        if self.model == "beta":
            b, r0, t0 = self.params
            txt = f"beta {b:g} K, R0 {r0:g} ohm at {t0 - calib.KELVIN:g} degC"
        else:
            txt = "Steinhart-Hart A {:.6e} B {:.6e} C {:.6e}".format(*self.params)
        if self.correction:
            txt += f", correction of degree {len(self.correction) - 1}"
        return txt


FACTORY_CURVE = Curve("beta", (3950.0, 10000.0, 25.0 + calib.KELVIN))


def channel_config(values: dict, index: int) -> tuple[Divider, Curve]:
    """Divider and curve of channel ``index`` from config values: a ``config_get``
    map (``channels.N.r_fixed``...) or a channel's dict (``r_fixed``...)."""
    pre = f"channels.{index}."

    def get(key, default):
        return values.get(pre + key, values.get(key, default))

    div = Divider(float(get("r_fixed", 10000)), bool(get("ntc_low", True)), FULL_SCALE)
    corr = tuple(float(x) for x in (get("correction", None) or ()))
    if get("model", "beta") == "sh" and get("sh", None):
        curve = Curve("sh", tuple(float(x) for x in get("sh", None)), corr)
    else:
        t0_k = get("t0_mc", 25000) / 1000.0 + calib.KELVIN
        curve = Curve("beta", (float(get("beta", 3950)), float(get("r0", 10000)), t0_k), corr)
    return div, curve


def load_config_file(path, index: int) -> tuple[Divider, Curve, dict]:
    """Divider, curve and channel dict of channel ``index`` from a config JSON file:
    the module's ``config.json`` (``{"config": {...}, "crc": ...}``), a whole config
    (``{"channels": [...], ...}``), or a flat map of dotted keys (``config get``'s, also
    under ``"values"``)."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except OSError as e:
        raise InputError(f"--config {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"--config {path}: not JSON: {e}") from None
    if isinstance(obj, dict) and isinstance(obj.get("config"), dict):
        obj = obj["config"]
    if isinstance(obj, dict) and isinstance(obj.get("values"), dict):
        obj = obj["values"]
    if not isinstance(obj, dict):
        raise InputError(f"--config {path}: expected a JSON object (a module config)")
    if isinstance(obj.get("channels"), list):
        chans = obj["channels"]
        if index >= len(chans) or not isinstance(chans[index], dict):
            raise InputError(f"--config {path}: no channel {index} in 'channels'")
        values = chans[index]
    elif any(k.startswith(f"channels.{index}.") for k in obj):
        values = {k[len(f"channels.{index}.") :]: v for k, v in obj.items()
                  if k.startswith(f"channels.{index}.")}  # fmt: skip
    else:
        raise InputError(
            f"--config {path}: no settings for channel {CHANNELS[index]} (expected "
            "'channels' or 'channels.N.*' keys, as `modbridge config get` prints)"
        )
    try:
        div, curve = channel_config(values, index)
    except (TypeError, ValueError) as e:
        raise InputError(f"--config {path}: channel {CHANNELS[index]}: {e}") from None
    return div, curve, dict(values)


# --------------------------------------------------------------------------- points


@dataclass
class Point:
    """A reference point resolved through the divider."""

    t_c: float
    value: Value
    r_ohm: float
    code: float

    @property
    def text(self) -> str:
        return f"{self.t_c:g}:{self.value.text}"


def resolve(points, divider: Divider) -> list[Point]:
    """``[(t_c, Value), ...]`` -> :class:`Point` list (input order)."""
    out = []
    for t_c, v in points:
        out.append(Point(float(t_c), v, v.ohms(divider), v.code(divider)))
    return out


def needed_points(model: str, degree: int = DEFAULT_DEGREE) -> int:
    return MIN_POINTS.get(model, degree + 1)


def check_points(points: list[Point], model: str, divider: Divider,
                 degree: int = DEFAULT_DEGREE) -> None:  # fmt: skip
    """Host-side checks of the points before any fit; :class:`InputError` names the
    point(s) and what is wrong (too few, outside -55..200 degC, duplicate temperatures,
    a code at the rails, resistance not falling with temperature)."""
    need = needed_points(model, degree)
    if len(points) < need:
        what = model if model != "poly" else f"a degree-{degree} correction (poly)"
        raise InputError(f"{what} needs at least {need} reference points, got {len(points)}")
    for p in points:
        if not T_MIN_C <= p.t_c <= T_MAX_C:
            raise InputError(
                f"point {p.text}: {p.t_c:g} degC is outside {T_MIN_C:g}..{T_MAX_C:g} degC "
                "(typo, or kelvin instead of degC?)"
            )
        rail = divider.at_rail(p.code)
        if rail is not None or not 0.0 < p.r_ohm < math.inf:
            rail = rail or ("short" if p.r_ohm <= 0.0 else "open")
            raise InputError(
                f"point {p.text}: code {p.code:.0f} is at the end of the ADC scale "
                f"(within {RAIL_FRACTION:.0%} of 0..{divider.full_scale}): an {rail} "
                "circuit, or the wrong divider side (--ntc-low/--ntc-high); check the wiring"
            )
    order = sorted(range(len(points)), key=lambda i: points[i].t_c)
    for a, b in zip(order, order[1:], strict=False):
        p, q = points[a], points[b]
        if q.t_c - p.t_c < calib_fit.MIN_SPACING_C:
            same = (
                "the same temperature"
                if q.t_c == p.t_c
                else (f"temperatures less than {calib_fit.MIN_SPACING_C:g} degC apart")
            )
            raise InputError(
                f"points {p.text} and {q.text}: duplicate points ({same}); each bath "
                "must be a different temperature"
            )
    for a, b in zip(order, order[1:], strict=False):
        p, q = points[a], points[b]
        if not q.r_ohm < p.r_ohm:
            raise InputError(
                f"points {p.text} and {q.text}: resistance {_fmt_ohm(q.r_ohm)} at "
                f"{q.t_c:g} degC is not below {_fmt_ohm(p.r_ohm)} at {p.t_c:g} degC; an "
                "NTC's resistance falls as it warms (swapped points, wrong channel, or "
                "the wrong divider side?)"
            )


def _fmt_ohm(r: float) -> str:
    if r >= 1e6:
        return f"{r / 1e6:.4g} Mohm"
    if r >= 1e3:
        return f"{r / 1e3:.4g} kohm"
    return f"{r:.4g} ohm"


# --------------------------------------------------------------------------- fit


@dataclass
class PointResult:
    t_ref_c: float
    value: str
    code: float
    r_ohm: float
    fitted_c: float
    residual_c: float  # fitted minus reference
    module_c: float | None  # what the module's lookup table reads at this code


@dataclass
class RangeError:
    """The predicted error at ``t_c``: ``ref_c`` from the reference readings'
    uncertainty (each point off by ``ref_accuracy`` independently, root sum of
    squares), ``lsb_c`` one 12-bit ADC step there; ``extrapolated`` outside the points."""

    t_c: float
    ref_c: float
    lsb_c: float | None
    extrapolated: bool


@dataclass
class Evaluation:
    value: str
    code: float
    r_ohm: float
    t_c: float | None
    module_c: float | None
    note: str | None = None


@dataclass
class FitResult:
    model: str  # steinhart-hart | beta | poly
    channel: int
    divider: Divider
    curve: Curve  # what the module evaluates after the write (model, params, correction)
    coeffs: list  # cal_write's coeffs, as sent
    correction: list | None  # cal_write's correction field (None: not sent)
    points: list[PointResult] = field(default_factory=list)
    errors: list[RangeError] = field(default_factory=list)
    check_range_c: tuple = CHECK_RANGE_C
    ref_accuracy_c: float = REF_ACCURACY_C
    base: Curve | None = None  # poly: the model under the correction
    _lut: tuple | None = field(default=None, repr=False)

    @property
    def channel_name(self) -> str:
        return CHANNELS[self.channel]

    @property
    def max_residual_c(self) -> float:
        return max((abs(p.residual_c) for p in self.points), default=0.0)

    @property
    def max_error_c(self) -> float:
        """Largest predicted reference-driven error over the check range."""
        return max((e.ref_c for e in self.errors), default=0.0)

    def cal_write_fields(self) -> dict:
        """The ``cal_write`` fields (wire values: ``model`` as its enum index)."""
        f = {
            "channel": self.channel,
            "model": C.CAL_MODELS.index(WIRE_MODEL[self.model]),
            "coeffs": list(self.coeffs),
        }
        if self.correction is not None:
            f["correction"] = list(self.correction)
        return f

    def cal_write_line(self) -> str:
        """The command as a JSON line (unsigned: `modbridge console` signs it)."""
        from protocol import jsonl

        return jsonl.encode_line("cal_write", self.cal_write_fields(), 0).decode().strip()

    def config_snippet(self) -> dict:
        """The same change as config keys (``config_set`` / ``modbridge config set``)."""
        pre = f"channels.{self.channel}."
        c = self.curve
        out = {}
        if self.model == "steinhart-hart":
            out[pre + "model"] = "sh"
            out[pre + "sh"] = list(self.coeffs)
        elif self.model == "beta":
            out[pre + "model"] = "beta"
            out[pre + "beta"], out[pre + "r0"], out[pre + "t0_mc"] = self.coeffs
        out[pre + "correction"] = list(c.correction)
        return out

    def lut(self):
        if self._lut is None:
            c = self.curve
            self._lut = calib.build_lut(
                c.model, c.params, self.divider.r_fixed_ohm, self.divider.ntc_low,
                list(c.correction) or None, full_scale=self.divider.full_scale,
            )  # fmt: skip
        return self._lut

    def module_c(self, code: float) -> float | None:
        """What the module's table reads at ``code`` (None: outside its valid range)."""
        lut, step = self.lut()
        k = int(round(code))
        i = k // step
        if not 0 <= k <= self.divider.full_scale or i + 1 >= len(lut):
            return None
        for j in (i, i + 1):
            if lut[j] in (calib.LUT_OPEN, calib.LUT_SHORT):
                return None
        return calib.lut_interp_mc(lut, step, k) / 1000.0

    def evaluate(self, value: Value) -> Evaluation:
        r = value.ohms(self.divider)
        code = value.code(self.divider)
        if not 0.0 < r < math.inf:
            return Evaluation(value.text, code, r, None, None, "open or short")
        try:
            t = self.curve.temp_c(r)
        except (ValueError, ZeroDivisionError, OverflowError):
            t = None
        note = None
        if t is not None and not self.check_range_c[0] <= t <= self.check_range_c[1]:
            note = "outside the checked range"
        return Evaluation(value.text, code, r, t, self.module_c(code), note)

    def as_dict(self) -> dict:
        return {
            "channel": self.channel_name,
            "model": self.model,
            "curve": {
                "model": self.curve.model,
                "params": list(self.curve.params),
                "correction": list(self.curve.correction),
            },
            "base": None
            if self.base is None
            else {"model": self.base.model, "params": list(self.base.params)},
            "divider": asdict(self.divider),
            "points": [asdict(p) for p in self.points],
            "max_residual_c": self.max_residual_c,
            "predicted_error": [asdict(e) for e in self.errors],
            "max_predicted_error_c": self.max_error_c,
            "ref_accuracy_c": self.ref_accuracy_c,
            "check_range_c": list(self.check_range_c),
            "cal_write": self.cal_write_line(),
            "cal_write_fields": self.cal_write_fields(),
            "config": self.config_snippet(),
        }


def _solve(model, pts, check_range_c, base, degree):
    """(curve, coeffs, correction) for ``pts`` [(r, t)]; CalibrationError from calib_fit."""
    if model == "steinhart-hart":
        a, b, c = calib_fit.fit_steinhart_hart(pts, check_range_c)
        return Curve("sh", (a, b, c)), [a, b, c], []
    if model == "beta":
        beta, r0, t0_k = calib_fit.fit_beta(pts, check_range_c)
        # The module's config holds integers (K, ohm, milli-degC): evaluate what it holds.
        wire = [int(round(beta)), int(round(r0)), int(round((t0_k - calib.KELVIN) * 1000))]
        return (
            Curve("beta", (float(wire[0]), float(wire[1]), wire[2] / 1000.0 + calib.KELVIN)),
            wire,
            [],
        )
    corr = calib_fit.fit_correction(pts, base.model, base.params, degree, check_range_c)
    return Curve(base.model, base.params, tuple(corr)), list(corr), None


def fit(points, model: str = "steinhart-hart", divider: Divider | None = None, *,
        channel: int = 0, degree: int = DEFAULT_DEGREE, base: Curve | None = None,
        check_range_c=CHECK_RANGE_C, ref_accuracy_c: float = REF_ACCURACY_C,
        channel_values: dict | None = None) -> FitResult:  # fmt: skip
    """Fit ``points`` (:class:`Point` list, or ``[(t_c, Value)]``) with ``model``.

    ``base``: for ``poly``, the channel's current curve the correction goes on
    (default: the factory beta 3950 K). ``channel_values``: the channel's config (for
    the module's own validation; default the factory channel with this divider).
    Raises :class:`InputError` (the points) or :class:`FitRefused` (the fit).
    """
    if model not in MODELS:
        raise InputError(f"model {model!r}: one of {', '.join(MODELS)}")
    if not 0 <= degree <= MAX_DEGREE:
        raise InputError(f"--degree must be 0..{MAX_DEGREE}, got {degree}")
    lo, hi = check_range_c
    if not T_MIN_C <= lo < hi <= T_MAX_C:
        raise InputError(
            f"check range {lo:g}..{hi:g} degC: need {T_MIN_C:g} <= lo < hi <= {T_MAX_C:g}"
        )
    divider = divider or Divider()
    if points and not isinstance(points[0], Point):
        points = resolve(points, divider)
    check_points(points, model, divider, degree)
    base = base or FACTORY_CURVE
    pts = [(p.r_ohm, p.t_c) for p in points]
    name = CHANNELS[channel]
    try:
        curve, coeffs, correction = _solve(model, pts, check_range_c, base, degree)
    except calib.CalibrationError as e:
        raise FitRefused(str(e), name) from None
    res = FitResult(model, channel, divider, curve, coeffs, correction,
                    check_range_c=tuple(check_range_c), ref_accuracy_c=ref_accuracy_c,
                    base=base if model == "poly" else None)  # fmt: skip
    _check_module(res, channel_values)
    for p in points:
        t = curve.temp_c(p.r_ohm)
        res.points.append(PointResult(p.t_c, p.value.text, p.code, p.r_ohm, t, t - p.t_c,
                                      res.module_c(p.code)))  # fmt: skip
    res.errors = _range_errors(res, points, model, base, degree)
    return res


def _check_module(res: FitResult, channel_values: dict | None) -> None:
    """What the module would refuse: its config validation (types, ranges, the
    correction band, an SH curve's shape) and its lookup table's monotonicity."""
    from device import config as devcfg
    from device import floors

    name = res.channel_name
    c = res.curve
    if c.correction:
        band = floors.CAL_BAND_MC / 1000.0
        worst_t, worst = 0, 0.0
        for t in range(-20, 151):
            off = calib.poly_eval(list(c.correction), float(t))
            if abs(off) > abs(worst):
                worst_t, worst = t, off
        if abs(worst) > band:
            raise FitRefused(
                f"the correction moves the reading by {worst:+.2f} degC at {worst_t} degC, "
                f"more than the module's calibration band of +-{band:g} degC: the base "
                "model is too far off; fit steinhart-hart (or beta) instead of a correction",
                name,
            )
    base = devcfg.defaults()
    changes = dict(res.config_snippet())
    pre = f"channels.{res.channel}."
    for k, v in (channel_values or {}).items():
        key = k if k.startswith("channels.") else pre + k
        if key not in changes and key.startswith(pre):
            changes[key] = v
    if not channel_values:
        changes[pre + "r_fixed"] = int(round(res.divider.r_fixed_ohm))
        changes[pre + "ntc_low"] = bool(res.divider.ntc_low)
    try:
        devcfg.merge(base, changes)
    except devcfg.ConfigError as e:
        raise FitRefused(f"the module would refuse it: {e}", name) from None
    try:
        res.lut()
    except calib.CalibrationError as e:
        raise FitRefused(f"the module's lookup table: {e}", name) from None


def _range_errors(res, points, model, base, degree) -> list[RangeError]:
    lo, hi = res.check_range_c
    t_lo = min(p.t_c for p in points)
    t_hi = max(p.t_c for p in points)
    grid = sorted(
        {lo, hi, *[float(t) for t in range(int(math.ceil(lo / 25.0)) * 25, int(hi) + 1, 25)]}
    )
    curve = res.curve
    rs = [curve_resistance(curve, t) for t in grid]
    base_t = [curve.temp_c(r) if r else None for r in rs]
    sums = [0.0] * len(grid)
    for j in range(len(points)):
        moved = [(p.r_ohm, p.t_c + (_DT if i == j else 0.0)) for i, p in enumerate(points)]
        try:
            c2, _, _ = _solve(model, moved, (lo, hi), base, degree)
        except calib.CalibrationError:
            continue
        for k, r in enumerate(rs):
            if r and base_t[k] is not None:
                d = (c2.temp_c(r) - base_t[k]) / _DT
                sums[k] += d * d
    out = []
    for k, t in enumerate(grid):
        lsb = None
        r = rs[k]
        if r:
            code = res.divider.code(r)
            nxt = (
                code + LSB_CODES if code + LSB_CODES < res.divider.full_scale else code - LSB_CODES
            )
            try:
                lsb = abs(curve.temp_c(res.divider.ohms(nxt)) - curve.temp_c(r))
            except (ValueError, ZeroDivisionError, OverflowError):
                lsb = None
        out.append(RangeError(t, res.ref_accuracy_c * math.sqrt(sums[k]), lsb,
                              not t_lo <= t <= t_hi))  # fmt: skip
    return out


def curve_resistance(curve: Curve, t_c: float) -> float | None:
    """Resistance where ``curve`` (with its correction) reads ``t_c``; None if none."""
    try:
        r = calib.model_resistance(t_c, curve.model, curve.params)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    if not curve.correction:
        return r
    # Newton in ln R on the corrected curve, from the uncorrected model's resistance.
    ln_r = math.log(r)
    for _ in range(20):
        try:
            f = curve.temp_c(math.exp(ln_r)) - t_c
            d = (curve.temp_c(math.exp(ln_r + 1e-6)) - curve.temp_c(math.exp(ln_r))) / 1e-6
        except (ValueError, ZeroDivisionError, OverflowError):
            return None
        if d == 0.0:
            return None
        step = f / d
        ln_r -= step
        if abs(step) < 1e-12:
            break
    return math.exp(ln_r)


# --------------------------------------------------------------------------- render


def render_fit(res: FitResult) -> list[str]:
    """The fit as text lines: coefficients, residuals per point, the predicted error."""
    c = res.curve
    lines = [f"channel {res.channel_name}: {res.model} fit through {len(res.points)} points"]
    if res.model == "steinhart-hart":
        lines.append("  A {:.9e}  B {:.9e}  C {:.9e}".format(*res.coeffs))
    elif res.model == "beta":
        b, r0, t0 = res.coeffs
        lines.append(f"  beta {b} K, R0 {r0} ohm at {t0 / 1000:g} degC")
    else:
        lines.append(f"  correction on {res.base.describe()}:")
        lines.append("  " + ", ".join(f"c{k} {v:.6g}" for k, v in enumerate(c.correction)))
    lines.append(
        f"  {'ref degC':>9} {'reading':>14} {'ohm':>10} {'fitted':>9} {'residual':>9} {'module':>8}"
    )
    for p in res.points:
        mod = "-" if p.module_c is None else f"{p.module_c:.2f}"
        lines.append(
            f"  {p.t_ref_c:>9.2f} {p.value:>14} {p.r_ohm:>10.1f} {p.fitted_c:>9.3f} "
            f"{p.residual_c:>+9.3f} {mod:>8}"
        )
    lo, hi = res.check_range_c
    lines.append(
        f"  predicted error over {lo:g}..{hi:g} degC (reference +-{res.ref_accuracy_c:g} "
        "degC per point; one 12-bit ADC step):"
    )
    for e in res.errors:
        lsb = "-" if e.lsb_c is None else f"{e.lsb_c:.3f}"
        tag = "  extrapolated" if e.extrapolated else ""
        lines.append(f"  {e.t_c:>7.0f} degC  +-{e.ref_c:.2f} degC   {lsb} degC/LSB{tag}")
    return lines


def render_snippets(res: FitResult) -> list[str]:
    return [
        "cal_write (paste in `modbridge console`, which signs it; then config_save):",
        "  " + res.cal_write_line(),
        "config:",
        "  " + json.dumps(res.config_snippet()),
    ]


def render_eval(ev: Evaluation) -> str:
    if ev.t_c is None:
        return f"{ev.value}: no temperature ({ev.note})"
    mod = "" if ev.module_c is None else f" (module table {ev.module_c:.2f} degC)"
    note = f" [{ev.note}]" if ev.note else ""
    return f"{ev.value}: {ev.t_c:.3f} degC, {_fmt_ohm(ev.r_ohm)}, code {ev.code:.1f}{mod}{note}"


# --------------------------------------------------------------------------- guided


@dataclass
class ChannelSetup:
    index: int
    divider: Divider
    curve: Curve
    values: dict  # the channel's config values (dotted keys)

    @property
    def name(self) -> str:
        return CHANNELS[self.index]


@dataclass
class Reading:
    """One channel in one bath: ``reads`` cal_reads of ``samples`` samples."""

    channel: str
    samples: int
    reads: int
    code: float  # mean of the reads' means, read_u16 scale
    code_min: int
    code_max: int
    r_ohm: float
    spread_c: float | None  # min..max of the samples, in degC (current curve)
    drift_c: float | None  # max - min of the reads' means, in degC
    module_c: float | None  # the module's reading with its current coefficients
    warnings: list = field(default_factory=list)


@dataclass
class Bath:
    t_ref_c: float
    readings: dict  # channel name -> Reading


@dataclass
class SessionResult:
    module_id: str | None
    port: str
    model: str
    baths: list = field(default_factory=list)
    fits: dict = field(default_factory=dict)  # channel name -> FitResult
    refused: dict = field(default_factory=dict)  # channel name -> reason
    written: list = field(default_factory=list)  # channel names
    saved: bool = False
    aborted: bool = False
    check: dict = field(default_factory=dict)  # channel -> degC the module reads after the write

    def as_dict(self) -> dict:
        return {
            "module_id": self.module_id,
            "port": self.port,
            "model": self.model,
            "baths": [
                {"t_ref_c": b.t_ref_c, "readings": {k: asdict(r) for k, r in b.readings.items()}}
                for b in self.baths
            ],
            "fits": {k: f.as_dict() for k, f in self.fits.items()},
            "refused": dict(self.refused),
            "written": list(self.written),
            "saved": self.saved,
            "aborted": self.aborted,
            "check": dict(self.check),
        }


class GuidedSession:
    """Bath-by-bath calibration of ``channels`` over ``link`` (a started ModuleLink).

    ``bath``: an optional callable ``bath(t_c)`` run before each bath is read (the
    virtual module's :class:`SimBath`). The person's side is injected in :meth:`run`.
    """

    def __init__(self, link, channels, model: str = "steinhart-hart", *,
                 samples: int = DEFAULT_SAMPLES, reads: int = DEFAULT_READS,
                 interval_s: float = 0.5, degree: int = DEFAULT_DEGREE,
                 check_range_c=CHECK_RANGE_C, ref_accuracy_c: float = REF_ACCURACY_C,
                 bath=None):  # fmt: skip
        if model not in MODELS:
            raise InputError(f"model {model!r}: one of {', '.join(MODELS)}")
        if not 1 <= samples <= 4096:
            raise InputError(f"--samples must be 1..4096 (cal_read), got {samples}")
        if not 1 <= reads <= 20:
            raise InputError(f"--reads must be 1..20, got {reads}")
        self.link = link
        self.channels = sorted(set(channels)) or [0]
        self.model = model
        self.samples, self.reads, self.interval_s = samples, reads, interval_s
        self.degree = degree
        self.check_range_c = check_range_c
        self.ref_accuracy_c = ref_accuracy_c
        self.bath = bath
        self.setups: dict[str, ChannelSetup] = {}
        self.baths: list[Bath] = []

    # The steps, each usable alone.

    def setup(self) -> dict:
        """Each channel's divider and curve from the module's config (config_get)."""
        for i in self.channels:
            msg = self.link.request("config_get", {"section": f"channels.{i}"})
            values = dict(msg.fields.get("values", {})) if msg.name == "config" else {}
            if not values:
                raise CalibrateError(
                    f"{self.link.port}: the module sent no config for channel {CHANNELS[i]}"
                )
            div, curve = channel_config(values, i)
            self.setups[CHANNELS[i]] = ChannelSetup(i, div, curve, values)
        return self.setups

    def read(self, t_ref_c: float) -> Bath:
        """Read every channel in the bath at ``t_ref_c`` and keep it as a point."""
        if not self.setups:
            self.setup()
        if self.bath is not None:
            self.bath(t_ref_c)
        out = {}
        for name, s in self.setups.items():
            raws = []
            for k in range(self.reads):
                if k:
                    time.sleep(self.interval_s)
                msg = self.link.request(
                    "cal_read", {"channel": s.index, "samples": self.samples}, timeout=10.0
                )
                raws.append(msg.fields)
            out[name] = _reading(s, raws, self.samples)
        bath = Bath(t_ref_c, out)
        self.baths.append(bath)
        return bath

    def fit(self) -> tuple[dict, dict]:
        """(fits, refused): a :class:`FitResult` or a reason per channel."""
        fits, refused = {}, {}
        for name, s in self.setups.items():
            pts = [(b.t_ref_c, Value(f"{b.readings[name].code:.1f}", "code", b.readings[name].code))
                   for b in self.baths]  # fmt: skip
            try:
                fits[name] = fit(pts, self.model, s.divider, channel=s.index,
                                 degree=self.degree, base=s.curve,
                                 check_range_c=self.check_range_c,
                                 ref_accuracy_c=self.ref_accuracy_c,
                                 channel_values=s.values)  # fmt: skip
            except FitRefused as e:
                refused[name] = e.reason
            except InputError as e:
                refused[name] = str(e)
        return fits, refused

    def write(self, fits: dict) -> list[str]:
        """cal_write each fit (signed), then config_save (signed); channel names written."""
        done = []
        for name, res in fits.items():
            self.link.request("cal_write", res.cal_write_fields())
            done.append(name)
        if done:
            self.link.request("config_save", None, timeout=10.0)
        return done

    def check(self, names) -> dict:
        """What each channel reads now (degC, the module's new coefficients; None on a
        fault): one cal_read each, docs/calibration.md step 7."""
        out = {}
        for name in names:
            s = self.setups[name]
            msg = self.link.request("cal_read", {"channel": s.index, "samples": 16}, timeout=10.0)
            t = msg.fields.get("temp")
            out[name] = None if t is None else t / 1000.0
        return out

    # The person's side.

    def run(self, ask, confirm, emit, yes: bool = False) -> SessionResult:
        """The whole session: ``ask(prompt) -> str`` for each bath's temperature
        (``done`` ends, ``undo`` drops the last bath, ``quit`` aborts),
        ``confirm(question) -> bool`` before writing (skipped with ``yes``),
        ``emit(line)`` for what a person reads."""
        from modbridge.link.session import LinkError

        res = SessionResult(self.link.status.module_id, self.link.port, self.model)
        self.setup()
        for s in self.setups.values():
            side = "low" if s.divider.ntc_low else "high"
            emit(
                f"channel {s.name}: divider {s.divider.r_fixed_ohm:g} ohm, NTC on the {side} "
                f"side; now {s.curve.describe()}"
            )
        need = needed_points(self.model, self.degree)
        emit(
            f"{self.model}: at least {need} baths; put the probe(s) and the reference in "
            "each, wait until both are steady, then type the reference temperature"
        )
        while True:
            n = len(self.baths) + 1
            more = "" if len(self.baths) >= need else f", {need - len(self.baths)} more needed"
            answer = ask(f"bath {n}: reference degC ('done' to fit{more}, 'undo', 'quit')")
            low = answer.strip().lower()
            if low == "undo":
                if self.baths:
                    gone = self.baths.pop()
                    emit(f"dropped bath {n - 1} ({gone.t_ref_c:g} degC)")
                else:
                    emit("no bath to drop")
                continue
            if low in ("quit", "q", "abort"):
                res.aborted = True
                res.baths = list(self.baths)
                emit("aborted: nothing written")
                return res
            if low in ("done", "d", ""):
                if len(self.baths) >= need:
                    break
                emit(f"{self.model} needs at least {need} baths, have {len(self.baths)}")
                continue
            try:
                t = parse_temperature(answer)
                for b in self.baths:
                    if abs(b.t_ref_c - t) < calib_fit.MIN_SPACING_C:
                        raise InputError(
                            f"{t:g} degC is within {calib_fit.MIN_SPACING_C:g} degC of bath "
                            f"{b.t_ref_c:g} degC: each bath must be a different temperature"
                        )
            except InputError as e:
                emit(f"not taken: {e}")
                continue
            try:
                bath = self.read(t)
            except LinkError as e:
                raise CalibrateError(str(e)) from None
            for line in render_bath(bath):
                emit(line)
        res.baths = list(self.baths)
        fits, refused = self.fit()
        res.fits, res.refused = fits, refused
        for f in fits.values():
            for line in render_fit(f):
                emit(line)
        for name, why in refused.items():
            emit(f"channel {name}: fit refused: {why}")
        if not fits:
            return res
        names = ", ".join(fits)
        if yes or confirm(f"write the calibration of {names} to the module and its flash?"):
            try:
                res.written = self.write(fits)
            except LinkError as e:
                raise CalibrateError(str(e)) from None
            res.saved = bool(res.written)
            emit(f"written and saved: {', '.join(res.written)}")
            res.check = self.check(res.written)
            last = self.baths[-1].t_ref_c
            for name, t in res.check.items():
                now = "no reading (fault)" if t is None else f"{t:.2f} degC"
                emit(f"check: {name} now reads {now} (last bath {last:g} degC)")
        else:
            emit("not written")
        return res


def _reading(s: ChannelSetup, raws: list, samples: int) -> Reading:
    means = [f["raw_mean_x16"] / 16.0 for f in raws]
    code = sum(means) / len(means)
    lo = min(f["raw_min"] for f in raws)
    hi = max(f["raw_max"] for f in raws)
    r = s.divider.ohms(code)
    temp = raws[-1].get("temp")
    warnings = []

    def t_of(c):
        try:
            rr = s.divider.ohms(c)
            return s.curve.temp_c(rr) if 0.0 < rr < math.inf else None
        except (ValueError, ZeroDivisionError, OverflowError):
            return None

    spread = drift = None
    t_lo, t_hi = t_of(lo), t_of(hi)
    if t_lo is not None and t_hi is not None:
        spread = abs(t_hi - t_lo)
    ts = [t_of(m) for m in means]
    if None not in ts:
        drift = max(ts) - min(ts)
    rail = s.divider.at_rail(code)
    if rail:
        warnings.append(f"reads at the end of the ADC scale ({rail} circuit?): check the wiring")
    if drift is not None and drift > STEADY_DRIFT_C:
        warnings.append(
            f"the reads moved by {drift:.2f} degC: the bath is not steady; wait and read again"
        )
    if spread is not None and spread > NOISY_SPREAD_C:
        warnings.append(
            f"samples spread over {spread:.2f} degC: noisy (or still moving); more --samples, "
            "or the ADC pin's capacitor"
        )
    return Reading(s.name, samples, len(raws), code, lo, hi, r, spread, drift,
                   None if temp is None else temp / 1000.0, warnings)  # fmt: skip


def render_bath(bath: Bath) -> list[str]:
    lines = []
    for name, r in bath.readings.items():
        spread = "" if r.spread_c is None else f" ({r.spread_c:.2f} degC)"
        now = "" if r.module_c is None else f"; reads {r.module_c:.2f} degC now"
        lines.append(
            f"  {name}: code {r.code:.1f} (min..max {r.code_min}..{r.code_max}{spread}), "
            f"{_fmt_ohm(r.r_ohm)}{now}"
        )
        for w in r.warnings:
            lines.append(f"  warning: {name}: {w}")
    return lines


# --------------------------------------------------------------------------- sim


class SimBath:
    """The virtual module's probes in a bath: once :meth:`__call__` set a
    temperature, the channels in ``channels`` read an NTC at that temperature
    (``beta`` K, default the world's probe, with the world's R0, divider and ADC
    noise) instead of the simulated machine. :meth:`release` gives them back."""

    def __init__(self, vm, channels, beta: float | None = None, settle_ms: int = 500):
        from modbridge.sim import world as W

        self.vm = vm
        self.world = vm.world
        self.channels = set(channels)
        self.beta = beta
        self.settle_ms = settle_ms
        self.t_c: float | None = None
        self._orig = self.world.adc_ideal
        self._adc_full = W.ADC_FULL
        self._t0_k = W.T0_K
        self.world.adc_ideal = self._ideal  # the world calls self.adc_ideal(ch)

    def _ideal(self, ch):
        t = self.t_c
        if t is None or ch not in self.channels:
            return self._orig(ch)
        p = self.world.params["ntc." + CHANNELS[ch]]
        beta = self.beta if self.beta is not None else p["beta"]
        r = calib.beta_resistance(t + calib.KELVIN, beta, p["r0_ohm"], self._t0_k)
        return calib.ohms_to_adc(r, p["r_fixed_ohm"], p["ntc_low"], self._adc_full)

    def __call__(self, t_c: float, timeout_s: float = 10.0) -> None:
        with self.vm.lock:
            self.t_c = float(t_c)
            start = self.world.now_ms
        deadline = time.monotonic() + timeout_s
        while self.world.now_ms - start < self.settle_ms and time.monotonic() < deadline:
            time.sleep(0.02)

    def release(self) -> None:
        with self.vm.lock:
            self.t_c = None
            self.world.adc_ideal = self._orig


def wait_hosted(link, timeout_s: float) -> bool:
    """True once the module's telemetry says HOSTED within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tel = link.status.telemetry
        if tel and tel.get("state") == C.STATE_HOSTED:
            return True
        time.sleep(0.05)
    return False
