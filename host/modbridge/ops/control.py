"""Module control from the host, liquidctl-like: parse what a person types, check it
against the protocol's ranges, send it (signed) and say what the module answered.

The CLI (:mod:`modbridge.cli.control`) only parses arguments and prints; everything
here returns plain objects (:class:`Outcome`), whose ``lines()`` are the text output
and ``as_dict()`` the ``--json`` output.

Units. A person types percent (``40%``), degC (``70``), gains in % per degC; the
wire carries duty in 1/65535 and milli-degC (``protocol/catalog.py``). Every value
is converted here, checked against the catalog's range (or the module config
schema's, ``device/config.py``) *before* anything is sent (:class:`InputError`, exit
2, naming the field and its range in display units), and every answer is shown in
display units again: a NACK's numbers are converted with the unit of the field it
names (``setpoint gpu: refused: out_of_range: sp_gpu must be 20..110 degC``).

Targets. A command talks to a :class:`Target`: the running bridge through its
control socket (:mod:`modbridge.ops.ctlsock`, the bridge signs), a serial port
directly (:class:`DirectTarget`, a :class:`~modbridge.link.session.ModuleLink`
signing with this host's key store), or a virtual module (``--sim``).
:func:`open_target` picks one: the bridge when its socket answers (unless
``direct``), else the port: given as a path, found by module id (a unique prefix is
enough) among the discoverable ports, or named in the config's ``[[module]]``
mappings (``name = "gpu0"``).

A direct link sends no heartbeats: a heartbeat makes the module count this host as
present, and when the command ends the module would see the host go away (S5 in
docs/safety.md: a MANUAL lease ends when the host is lost). Without a bridge a
``set fan1 40%`` therefore holds for the lease (10 min) on a module that has not
seen a host since it booted; on one whose host went away the module returns to
automatic control at once, and :func:`set_fans` says so from the next telemetry.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from modbridge.errors import ModbridgeError
from modbridge.sanitize import sanitize
from protocol import catalog as C

DUTY_FULL = 65535
TELEMETRY_WAIT_S = 3.0  # after a fan command: the next telemetry shows the applied duty
HELLO_TIMEOUT_S = 5.0
FIND_TIMEOUT_S = 3.0
SETPOINT_CHANNELS = C.CHANNELS  # gpu, vram, mos, amb
PID_GAINS = ("kp", "ki", "kd", "kff")
FAN_MODES = C.FAN_MODES  # auto, manual, curve


# ----------------------------------------------------------------------------- errors


class ControlError(ModbridgeError):
    """A control command could not be carried out (exit 1); the message says why."""

    exit_code = 1


class InputError(ControlError):
    """What was typed is not a valid command or value; nothing was sent (exit 2)."""

    exit_code = 2


class TargetNotFound(ControlError):
    """No module matches the target given (exit 3)."""

    exit_code = 3


class Interrupted(ControlError):
    """Ctrl-C while the module was busy for us; the message says what was undone
    (exit 130, the shell's code for an interrupt)."""

    exit_code = 130


# ------------------------------------------------------------------------------ units


@dataclass(frozen=True)
class Unit:
    """A display unit: ``label`` as shown, ``scale`` display = wire / scale (or, for
    percent, wire * 100 / 65535), ``decimals`` shown at most."""

    label: str
    kind: str  # "pct", "milli", "q12" (wire / 4096), "raw"
    decimals: int = 3

    def to_wire(self, value: float) -> int:
        """Rounded half away from zero, as the firmware's constants are (30 % is
        19661, not round()'s half-to-even 19660)."""
        if self.kind == "pct":
            return _round_half_up(value * DUTY_FULL / 100.0)
        if self.kind == "milli":
            return _round_half_up(value * 1000.0)
        if self.kind == "q12":
            return _round_half_up(value * 4096.0)
        return _round_half_up(value)

    def to_display(self, wire):
        if not isinstance(wire, (int, float)) or isinstance(wire, bool):
            return wire
        if self.kind == "pct":
            return round(wire * 100.0 / DUTY_FULL, 1)
        if self.kind == "milli":
            return round(wire / 1000.0, self.decimals)
        if self.kind == "q12":
            return round(wire / 4096.0, self.decimals)
        return wire

    def show(self, wire) -> str:
        """``wire`` as text in this unit: 26214 -> ``40 %``, 70000 -> ``70 degC``."""
        v = self.to_display(wire)
        text = fmt_num(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
        return f"{text} {self.label}".rstrip() if self.label else text


PCT = Unit("%", "pct", 1)
DEGC = Unit("degC", "milli", 3)
VOLT = Unit("V", "milli", 3)
AMP = Unit("A", "milli", 3)
WATT = Unit("W", "milli", 3)
RAW = Unit("", "raw")

# catalog unit text -> display unit
_CATALOG_UNITS = {
    "1/65535": PCT,
    "m degC": DEGC,
    "mV": VOLT,
    "mA": AMP,
    "mW": WATT,
    "m %/degC": Unit("%/degC", "milli"),
    "m %/(degC s)": Unit("%/(degC s)", "milli"),
    "m % s/degC": Unit("% s/degC", "milli"),
    "m %/W": Unit("%/W", "milli"),
}


def _round_half_up(x: float) -> int:
    # a little slack: 30 * 65535 / 100 is 19660.499999999996 in binary floating point
    x = round(x, 6)
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def fmt_num(v) -> str:
    """A number as a person writes it: 40.0 -> ``40``, 0.25 -> ``0.25``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        text = f"{v:.3f}".rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text
    return str(v)


def catalog_field(msg: str, name: str) -> tuple:
    """The catalog's definition of field ``name`` of message ``msg``."""
    mdef = C.by_name(msg)
    if mdef is None:
        raise KeyError(msg)
    i = C.field_index(mdef, name)
    if i < 0:
        raise KeyError(f"{msg}.{name}")
    return mdef[C.M_FIELDS][i]


def field_unit(msg: str, name: str) -> Unit:
    """The display unit of a catalog field (RAW when it has none)."""
    try:
        fdef = catalog_field(msg, name)
    except KeyError:
        return RAW
    return _CATALOG_UNITS.get(fdef[C.F_UNIT], RAW)


def field_range_text(msg: str, name: str) -> str:
    """``20..110 degC``: a catalog field's range in display units."""
    fdef = catalog_field(msg, name)
    unit = field_unit(msg, name)
    lo, hi = fdef[C.F_LO], fdef[C.F_HI]
    text = f"{fmt_num(unit.to_display(lo))}..{fmt_num(unit.to_display(hi))}"
    return f"{text} {unit.label}".rstrip()


def to_wire(msg: str, name: str, value: float) -> int:
    """A display value of catalog field ``msg.name`` in wire units, checked against the
    catalog's range: InputError (naming the field and the range) outside it."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InputError(f"{name}: a finite number, got {value!r}")
    fdef = catalog_field(msg, name)
    unit = field_unit(msg, name)
    wire = unit.to_wire(value)
    lo, hi = fdef[C.F_LO], fdef[C.F_HI]
    if (lo is not None and wire < lo) or (hi is not None and wire > hi):
        raise InputError(
            f"{name} must be {field_range_text(msg, name)}, got {fmt_num(value)} {unit.label}"
            .rstrip()
        )
    return wire


# ---------------------------------------------------------------------------- parsing

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_PCT_RE = re.compile(rf"^\s*({_NUM})\s*%?\s*$")
_DEGC_RE = re.compile(rf"^\s*({_NUM})\s*(?:°\s*C|degC|degc|C|c)?\s*$")


def parse_percent(text: str, what: str = "duty") -> float:
    """``"40%"``, ``"40 %"``, ``"40"``, ``"37.5%"`` -> 40.0 (percent)."""
    m = _PCT_RE.match(str(text))
    if not m:
        raise InputError(f"{what}: a percentage like 40% expected, got {text!r}")
    return float(m.group(1))


def parse_degc(text: str, what: str = "temperature") -> float:
    """``"70"``, ``"70C"``, ``"70 degC"``, ``"72.5"`` -> degrees Celsius."""
    m = _DEGC_RE.match(str(text))
    if not m:
        raise InputError(f"{what}: a temperature in degC like 70 expected, got {text!r}")
    return float(m.group(1))


def parse_number(text: str, what: str) -> float:
    try:
        v = float(str(text).strip())
    except ValueError:
        raise InputError(f"{what}: a number expected, got {text!r}") from None
    if not math.isfinite(v):
        raise InputError(f"{what}: a finite number expected, got {text!r}")
    return v


def parse_curve(items) -> list[tuple[float, float]]:
    """``["40:30", "60:50", "80:100"]`` (or one string ``"40:30 60:50, 80:100"``) ->
    ``[(40.0, 30.0), ...]``: degC:percent pairs."""
    if isinstance(items, str):
        items = [items]
    pairs = []
    for item in items:
        for tok in re.split(r"[\s,]+", str(item).strip()):
            if not tok:
                continue
            t, sep, d = tok.partition(":")
            if not sep:
                raise InputError(f"curve: points are degC:percent like 60:50, got {tok!r}")
            pairs.append((parse_degc(t, f"curve point {tok}"),
                          parse_percent(d, f"curve point {tok}")))  # fmt: skip
    if not pairs:
        raise InputError("curve: give at least 2 points degC:percent, e.g. 40:30 60:50 80:100")
    return pairs


def curve_fields(points, hysteresis_c: float | None = None) -> dict:
    """``fan_curve`` fields for degC:percent ``points``, checked: 2..16 points, each
    temperature within the protocol's range and above the previous, duty 0..100 %
    and never falling as temperature rises (the module's rule, checked here first)."""
    n = len(points)
    fdef = catalog_field("fan_curve", "points")
    if not fdef[C.F_LO] <= n <= fdef[C.F_HI]:
        raise InputError(f"points: a curve has {fdef[C.F_LO]}..{fdef[C.F_HI]} points, got {n}")
    wire = []
    for i, (t, d) in enumerate(points):
        where = f"points[{i}] {fmt_num(t)}:{fmt_num(d)}"
        if not (math.isfinite(t) and math.isfinite(d)):
            raise InputError(f"{where}: finite numbers expected")
        t_mc = DEGC.to_wire(t)
        if not C.TEMP_MIN_MC <= t_mc <= C.TEMP_MAX_MC:
            raise InputError(f"{where}: temperature must be {C.TEMP_MIN_MC // 1000}.."
                             f"{C.TEMP_MAX_MC // 1000} degC")  # fmt: skip
        if not 0 <= d <= 100:
            raise InputError(f"{where}: duty must be 0..100 %")
        duty = PCT.to_wire(d)
        if wire and t_mc <= wire[-1][0]:
            raise InputError(f"{where}: temperatures must ascend "
                             f"({fmt_num(t)} degC after {DEGC.show(wire[-1][0])})")  # fmt: skip
        if wire and duty < wire[-1][1]:
            raise InputError(f"{where}: duty must not fall as temperature rises "
                             f"({fmt_num(d)} % after {PCT.show(wire[-1][1])})")  # fmt: skip
        wire.append([t_mc, duty])
    out = {"points": wire}
    if hysteresis_c is not None:
        out["hysteresis"] = to_wire("fan_curve", "hysteresis", hysteresis_c)
    return out


def fan_fields(duties: dict[int, float], current: dict | None = None) -> dict:
    """``fan_mode manual`` fields for ``{fan number: percent}``. A fan not given keeps
    the duty it runs at now (``current``: the telemetry's ``fanN_duty``), at least the
    compiled MANUAL minimum; without telemetry both fans get the one duty given."""
    from device import floors

    out = {"mode": FAN_MODES.index("manual")}
    for n, pct in duties.items():
        if n not in (1, 2):
            raise InputError(f"fan{n}: the module has fans 1 and 2")
        name = f"duty{n}"
        wire = to_wire("fan_mode", name, pct)
        if wire < floors.FLOOR_MANUAL:
            raise InputError(
                f"{name} must be {fmt_num(PCT.to_display(floors.FLOOR_MANUAL))}..100 % (the "
                f"module's manual minimum, docs/safety.md), got {fmt_num(pct)} %"
            )
        out[name] = wire
    for n in (1, 2):
        name = f"duty{n}"
        if name in out:
            continue
        now = (current or {}).get(f"fan{n}_duty")
        if isinstance(now, int):
            out[name] = min(DUTY_FULL, max(now, floors.FLOOR_MANUAL))
        else:
            given = [v for k, v in out.items() if k.startswith("duty")]
            if not given:
                raise ControlError("no telemetry from the module, so its fans' duty now is "
                                   "not known: give one (`set MODULE fans 60%`)")  # fmt: skip
            out[name] = given[0]
    return out


# ---------------------------------------------------------------- module config keys
#
# device/config.py's dotted keys (wire units in their names: _mc milli-degC, duties
# 0..65535, gains in milli-units) <-> the keys a person types: channels by name
# (gpu.setpoint), fans by number (fan1.min_duty), values in degC, %, V, A, %/degC.

_GAIN_UNITS = {
    "kp": _CATALOG_UNITS["m %/degC"],
    "ki": _CATALOG_UNITS["m %/(degC s)"],
    "kd": _CATALOG_UNITS["m % s/degC"],
    "kff": _CATALOG_UNITS["m %/W"],
}
# suffix of a config key -> (display unit, strip the suffix from the display key)
_SUFFIX_UNITS = (
    ("_mc", DEGC, True),
    ("_mv", VOLT, True),
    ("_ma", AMP, True),
    ("_pct_s", Unit("%/s", "raw"), False),
    ("_pct_min", Unit("%/min", "raw"), False),
    ("_uohm", Unit("uohm", "raw"), False),
    ("_ms", Unit("ms", "raw"), False),
    ("_us", Unit("us", "raw"), False),
    ("_s", Unit("s", "raw"), False),
)
_OHM_KEYS = ("r0", "r_fixed")
# the chassis model (config section ``model``, device/control/chassis.py): a gain on
# (probe - ambient) in Q12 and m degC per W (= degC per kW), shown without the suffix
_MODEL_UNITS = {
    "ga_q12": ("ga", Unit("degC/degC", "q12", 4)),
    "rp_mcw": ("rp", Unit("degC/kW", "raw")),
    "rpd_mcw": ("rpd", Unit("degC/kW", "raw")),
}
# display sections (config get SECTION) -> the firmware's sections, each small enough
# for one ``config`` message (tests/test_ops_control.py checks that they fit a frame)
SECTIONS = {
    "control": ("control",),
    **{name: (f"channels.{i}",) for i, name in enumerate(C.CHANNELS)},
    "channels": tuple(f"channels.{i}" for i in range(len(C.CHANNELS))),
    "pid": ("pid",),
    "curve": ("curve",),
    "fan1": ("fans.0",),
    "fan2": ("fans.1",),
    "fans": ("fans.0", "fans.1"),
    "safety": ("safety",),
    "ina226": ("ina226",),
    "watchdog": ("watchdog_ms",),
    "model": ("model",),
    "version": ("version",),
}
ALL_SECTIONS = ("version", "control", "channels", "pid", "curve", "fans", "safety",
                "ina226", "watchdog", "model")  # fmt: skip


@dataclass(frozen=True)
class ConfigKey:
    """One module config key: ``key`` the firmware's dotted key, ``display`` the one a
    person types, ``unit`` how its value is shown, ``spec`` the schema entry."""

    key: str
    display: str
    unit: Unit
    spec: tuple

    def show(self, wire) -> str:
        if self.key == "curve.points" and isinstance(wire, list):
            return " ".join(
                f"{fmt_num(DEGC.to_display(p[0]))}:{fmt_num(PCT.to_display(p[1]))}"
                for p in wire if isinstance(p, list) and len(p) == 2
            ) + " (degC:%)"
        if isinstance(wire, (list, dict)) or wire is None:
            return json.dumps(wire)
        if isinstance(wire, bool):
            return "true" if wire else "false"
        return self.unit.show(wire)

    def display_value(self, wire):
        """The value for ``--json``: numbers in display units, a curve as pairs."""
        if self.key == "curve.points" and isinstance(wire, list):
            return [[DEGC.to_display(p[0]), PCT.to_display(p[1])] for p in wire
                    if isinstance(p, list) and len(p) == 2]  # fmt: skip
        return self.unit.to_display(wire)


def _schema_spec(parts: list[str]) -> tuple | None:
    from device import config as dc

    spec = dc.SCHEMA
    for p in parts:
        kind = spec[0]
        if kind == "obj":
            nxt = None
            for k, s in spec[1]:
                if k == p:
                    nxt = s
            if nxt is None:
                return None
            spec = nxt
        elif kind == "list" and p.isdigit():
            spec = spec[1]
        else:
            return None
    return spec


def config_key(key: str) -> ConfigKey:
    """The :class:`ConfigKey` of a firmware dotted key (``channels.0.setpoint_mc``)."""
    parts = key.split(".")
    spec = _schema_spec(parts) or ("any",)
    head, leaf = parts[0], parts[-1]
    disp_parts = list(parts)
    if head == "channels" and len(parts) >= 2 and parts[1].isdigit() and \
            int(parts[1]) < len(C.CHANNELS):  # fmt: skip
        disp_parts = [C.CHANNELS[int(parts[1])]] + parts[2:]
    elif head == "fans" and len(parts) >= 2 and parts[1].isdigit():
        disp_parts = [f"fan{int(parts[1]) + 1}"] + parts[2:]
    elif key == "watchdog_ms":
        disp_parts = ["watchdog_ms"]
    unit = RAW
    if head == "pid" and leaf in _GAIN_UNITS:
        unit = _GAIN_UNITS[leaf]
    elif head == "model" and leaf in _MODEL_UNITS:
        disp_parts[-1], unit = _MODEL_UNITS[leaf]
    elif leaf.endswith("duty") or head == "safety":
        unit = PCT
    elif leaf in _OHM_KEYS:
        unit = Unit("ohm", "raw")
    else:
        for suffix, u, strip in _SUFFIX_UNITS:
            if leaf.endswith(suffix) and (spec[0] == "int" or (spec[0] == "enum" and not strip)):
                unit = u
                if strip:
                    disp_parts[-1] = leaf[: -len(suffix)]
                break
    return ConfigKey(key, ".".join(disp_parts), unit, spec)


def _all_keys() -> dict[str, ConfigKey]:
    from device import config as dc

    flat = dc.flatten(dc.defaults())
    return {k: config_key(k) for k in flat}


_KEYS_CACHE: dict[str, ConfigKey] = {}


def known_keys() -> dict[str, ConfigKey]:
    """Every module config key by its firmware key (from the factory defaults)."""
    if not _KEYS_CACHE:
        _KEYS_CACHE.update(_all_keys())
    return _KEYS_CACHE


def lookup_key(typed: str) -> ConfigKey:
    """The config key a person typed: ``gpu.setpoint``, ``channels.0.setpoint``,
    ``fan1.min_duty``, ``pid.kp``. A firmware key in wire units (``..._mc``) is refused
    with the key to type instead."""
    keys = known_keys()
    by_display = {k.display: k for k in keys.values()}
    if typed in by_display:
        return by_display[typed]
    parts = typed.split(".")
    # channels.0.setpoint / channels.gpu.setpoint / fans.0.min_duty
    if len(parts) >= 3 and parts[0] == "channels":
        ch = parts[1]
        name = C.CHANNELS[int(ch)] if ch.isdigit() and int(ch) < len(C.CHANNELS) else ch
        alt = ".".join([name] + parts[2:])
        if alt in by_display:
            return by_display[alt]
    if len(parts) >= 3 and parts[0] == "fans" and parts[1].isdigit():
        alt = ".".join([f"fan{int(parts[1]) + 1}"] + parts[2:])
        if alt in by_display:
            return by_display[alt]
    if typed in keys and keys[typed].display != typed:
        k = keys[typed]
        raise InputError(f"{typed} is the module's key in wire units: type {k.display}=VALUE "
                         f"in {k.unit.label or 'its units'}")  # fmt: skip
    for suffix in ("_mc", "_mv", "_ma"):  # gpu.setpoint_mc, channels.gpu.setpoint_mc
        if typed.endswith(suffix):
            try:
                k = lookup_key(typed[: -len(suffix)])
            except InputError:
                break
            raise InputError(f"{typed}: type {k.display}=VALUE in {k.unit.label}")
    near = sorted(d for d in by_display if d.split(".")[0] == parts[0])
    hint = f" ({parts[0]} has {', '.join(near)})" if near else (
        f" (sections: {', '.join(sorted(SECTIONS))})"
    )
    raise InputError(f"{typed}: no such module config key{hint}")


def parse_assignment(text: str) -> tuple[ConfigKey, object]:
    """``"gpu.setpoint=72"`` -> (its key, the wire value), checked against the
    schema's type and range (in display units)."""
    name, sep, raw = str(text).partition("=")
    name, raw = name.strip(), raw.strip()
    if not sep or not name:
        raise InputError(f"{text!r}: KEY=VALUE expected, e.g. gpu.setpoint=72")
    k = lookup_key(name)
    return k, parse_config_value(k, raw)


def parse_config_value(k: ConfigKey, raw: str):
    spec = k.spec
    kind = spec[0]
    where = k.display
    if k.key == "curve.points":
        return curve_fields(parse_curve(raw))["points"]
    if kind == "opt":
        if raw.lower() in ("null", "none", ""):
            return None
        spec = spec[1]
        kind = spec[0]
    if kind == "int":
        if k.unit is PCT:
            v = parse_percent(raw, where)
        elif k.unit is DEGC:
            v = parse_degc(raw, where)
        else:
            text = raw
            label = k.unit.label
            if label and text.lower().endswith(label.lower()):
                text = text[: -len(label)]
            v = parse_number(text, where) if not text.strip().lower().startswith("0x") \
                else int(text, 16)  # fmt: skip
        wire = k.unit.to_wire(v)
        if k.unit.kind == "raw" and v != int(v):
            raise InputError(f"{where}: a whole number of {k.unit.label or 'units'} expected, "
                             f"got {raw!r}")  # fmt: skip
        lo, hi = spec[1], spec[2]
        if not lo <= wire <= hi:
            rng = f"{fmt_num(k.unit.to_display(lo))}..{fmt_num(k.unit.to_display(hi))}"
            raise InputError(f"{where} must be {rng} {k.unit.label}".rstrip()
                             + f", got {raw}")  # fmt: skip
        return wire
    if kind == "bool":
        low = raw.lower()
        if low in ("true", "yes", "on", "1"):
            return True
        if low in ("false", "no", "off", "0"):
            return False
        raise InputError(f"{where}: true or false expected, got {raw!r}")
    if kind == "enum":
        choices = spec[1]
        if isinstance(choices[0], int):
            label = k.unit.label
            text = raw[: -len(label)] if label and raw.endswith(label) else raw
            try:
                v = int(text)
            except ValueError:
                v = None
        else:
            v = raw
        if v not in choices:
            raise InputError(f"{where}: one of {', '.join(str(c) for c in choices)} expected, "
                             f"got {raw!r}")  # fmt: skip
        return v
    if kind == "str":
        if not spec[1] <= len(raw) <= spec[2]:
            raise InputError(f"{where}: text of {spec[1]}..{spec[2]} characters expected")
        return raw
    try:  # lists (sh, correction) and anything else: JSON
        return json.loads(raw)
    except ValueError:
        raise InputError(f"{where}: a JSON value expected (e.g. [1.1e-3, 2.4e-4, 7e-8]), "
                         f"got {raw!r}") from None


def section_names(typed: str | None) -> tuple[str, ...]:
    """The firmware sections to ask for display section ``typed`` (None: all)."""
    if typed is None:
        return tuple(s for name in ALL_SECTIONS for s in SECTIONS[name])
    if typed in SECTIONS:
        return SECTIONS[typed]
    try:
        k = lookup_key(typed)
    except InputError:
        raise InputError(f"{typed}: no such config section (sections: "
                         f"{', '.join(sorted(SECTIONS))}; or one key, e.g. gpu.setpoint)"
                         ) from None  # fmt: skip
    return (k.key,)


# ----------------------------------------------------------------- reply rendering

_INT_RE = re.compile(r"(?<![\w\[.])(-?\d+)(?![\w\]]|\s*%|\.\d)")


def _field_unit_for(request: str, fld: str | None) -> tuple[str | None, Unit]:
    """(display name, unit) of a NACK's ``field``: a catalog field of ``request``
    or a module config key."""
    if not fld:
        return None, RAW
    mdef = C.by_name(request)
    if mdef is not None and C.field_index(mdef, fld) >= 0:
        return fld, field_unit(request, fld)
    if fld in known_keys():
        k = known_keys()[fld]
        return k.display, k.unit
    parts = fld.split(".")
    if parts and parts[-1].isdigit():  # curve.points.3 -> curve.points
        return fld, RAW
    try:
        k = config_key(fld)
        return k.display, k.unit
    except Exception:  # noqa: BLE001 - a field we cannot name: shown as it is
        return fld, RAW


def _convert_text(text: str, unit: Unit) -> str:
    """Numbers in a module's text, in wire units of ``unit``, as display values; the
    firmware's key names as a person types them."""
    if unit.kind != "raw":
        text = _INT_RE.sub(lambda m: f"{fmt_num(unit.to_display(int(m.group(1))))} "
                                      f"{unit.label}", text)  # fmt: skip
    for fw, disp in (("_mc", ""), ("_mv", ""), ("_ma", "")):
        text = re.sub(rf"\b([a-z0-9_]+){fw}\b", r"\1" + disp, text)
    # channels[0].warn -> gpu.warn; fans[1].min_duty -> fan2.min_duty
    def channel(m):
        i = int(m.group(1))
        return C.CHANNELS[i] + "." if i < len(C.CHANNELS) else m.group(0)

    text = re.sub(r"channels\[(\d)\]\.?", channel, text)
    text = re.sub(r"fans\[(\d)\]\.?", lambda m: f"fan{int(m.group(1)) + 1}.", text)
    return text


def refusal_text(request: str, fields: dict) -> str:
    """A NACK in words and display units: ``out_of_range: sp_gpu must be 20..110 degC``."""
    code = fields.get("code", 0)
    code_name = C.ERRORS[code] if isinstance(code, int) and 0 <= code < len(C.ERRORS) else str(code)
    fld = fields.get("field")
    fld = sanitize(fld, None) if fld is not None else None
    text = sanitize(fields.get("text") or "", None)
    name, unit = _field_unit_for(request, fld)
    mdef = C.by_name(request)
    if (
        code == C.ERR_OUT_OF_RANGE
        and fld
        and mdef is not None
        and C.field_index(mdef, fld) >= 0
        and re.search(r"outside", text)
    ):
        fdef = catalog_field(request, fld)
        if fdef[C.F_LO] is not None and fdef[C.F_HI] is not None:
            return f"{code_name}: {fld} must be {field_range_text(request, fld)}"
    if text:
        # "channels[0].warn_mc: must be > ..." -> "gpu.warn must be > ..."
        head, sep, rest = text.partition(": ")
        if sep and (head.replace("[", ".").replace("]", "").replace("..", ".") == (fld or "")
                    or head == fld):  # fmt: skip
            text = f"{name} {rest}" if not rest.startswith(name or "") else rest
        text = _convert_text(text, unit)
        if name and name not in text and fld not in text:
            text = f"{name}: {text}"
        return f"{code_name}: {text}"
    return f"{code_name}: {name}" if name else code_name


# ------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    """What one command did: ``status`` ``ack`` (done), ``refused`` (the module's
    NACK), or ``reply`` (data: a config, a self-test report). ``summary`` is what was
    asked in display units; ``notes`` what a person should know about the result."""

    command: str
    summary: str
    status: str
    module_id: str | None = None
    port: str | None = None
    via: str | None = None
    refusal: str | None = None
    nack: dict | None = None  # the module's NACK as received (code, field, text)
    notes: list = field(default_factory=list)
    applied: dict | None = None  # fan duties (%) and state from the next telemetry
    data: dict | None = None  # config values, self-test results
    lines_extra: list = field(default_factory=list)  # text-only detail lines
    failed: bool = False  # a self-test that did not pass (exit 1)
    subject: str | None = None  # what a refusal is about ("setpoint gpu"); None: summary

    @property
    def exit_code(self) -> int:
        return 0 if self.status in ("ack", "reply") and not self.failed else 1

    def lines(self) -> list[str]:
        if self.status == "refused":
            head = f"{self.subject or self.summary}: refused: {self.refusal}"
        elif self.status == "ack":
            head = f"{self.summary} (ack)"
        else:
            head = self.summary
        lines = [head, *self.lines_extra, *(f"note: {n}" for n in self.notes)]
        return [sanitize(line, None) for line in lines]  # module text in them: escaped

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("lines_extra")
        d["ok"] = self.exit_code == 0
        return d


@dataclass
class Reply:
    """A module's answer: ``name`` ack/nack/config/selftest_report/hello, ``fields`` as
    received (wire units); ``telemetry`` the next telemetry after it, when asked."""

    name: str
    fields: dict
    telemetry: dict | None = None


# --------------------------------------------------------------------------- targets


class Target:
    """Something that sends a request to one module and returns its :class:`Reply`."""

    via = "?"
    port: str | None = None
    module_id: str | None = None

    def request(self, name: str, fields: dict | None = None, timeout: float | None = None,
                then_telemetry: bool = False) -> Reply:  # fmt: skip
        raise NotImplementedError

    def telemetry(self) -> dict | None:
        """The module's latest telemetry (wire units), or None."""
        return None

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def quiet_link_class():
    """A :class:`~modbridge.link.session.ModuleLink` that sends no heartbeats (see the
    module docstring) and keeps every ``config`` message by its ``ref`` (a section too
    big for one frame comes in several)."""
    from modbridge.link.session import ModuleLink

    class QuietLink(ModuleLink):
        def __init__(self, *a, quiet: bool = True, **kw):
            super().__init__(*a, **kw)
            self.quiet = quiet
            self.configs: dict[int, list[dict]] = {}

        def _send_heartbeat(self, now: float) -> None:
            if self.quiet:
                self._next_hb = math.inf
            else:
                super()._send_heartbeat(now)

        def _dispatch(self, item, now):
            if getattr(item, "ok", False) and item.name == "config":
                ref = item.fields.get("ref")
                bucket = self.configs.setdefault(ref, [])
                bucket.append(dict(item.fields.get("values") or {}))
                if len(self.configs) > 32:
                    del self.configs[next(iter(self.configs))]
            super()._dispatch(item, now)

    return QuietLink


def link_request(link, name: str, fields: dict | None, timeout: float | None,
                 then_telemetry: bool = False, telemetry_wait_s: float = TELEMETRY_WAIT_S,
                 ) -> Reply:  # fmt: skip
    """``link.request`` as a :class:`Reply` (a NACK is a reply, not an exception);
    with ``then_telemetry`` waits (bounded) for the telemetry that follows the
    answer. The link's other errors (NotPaired, RequestTimeout, LinkDown, BadRequest)
    are raised as ControlError with their message. Used by :class:`DirectTarget` and
    by the bridge's control socket (:mod:`modbridge.ops.ctlsock`)."""
    from modbridge.link.session import CommandRefused, LinkError

    try:
        msg = link.request(name, fields or None, timeout=timeout)
    except CommandRefused as e:
        return Reply("nack", dict(e.nack.fields))
    except LinkError as e:
        raise ControlError(str(e)) from None
    reply = Reply(msg.name, dict(msg.fields))
    if msg.name == "config":
        configs = getattr(link, "configs", None)
        if configs is not None:
            time.sleep(0.05)  # the rest of a split section follows at once
            parts = configs.pop(msg.fields.get("ref"), [])
            merged = {}
            for p in parts:
                merged.update(p)
            reply.fields["values"] = {**(msg.fields.get("values") or {}), **merged}
    if then_telemetry:
        # the module answers in the loop step that handles the command, before the
        # tick that applies it: the first telemetry after the answer shows its effect
        answered = link.status.telemetry_at
        deadline = time.monotonic() + telemetry_wait_s
        while time.monotonic() < deadline and link.status.telemetry_at == answered:
            time.sleep(0.02)
        if link.status.telemetry_at != answered:
            reply.telemetry = dict(link.status.telemetry or {})
    return reply


class DirectTarget(Target):
    """A module on a serial port, through a link of this process (no bridge)."""

    via = "direct"

    def __init__(self, port: str, keys, up_timeout_s: float = HELLO_TIMEOUT_S,
                 on_close: Callable[[], None] | None = None, via: str = "direct",
                 heartbeat_s: float | None = None):  # fmt: skip
        from modbridge.link.session import LinkError

        self.port = port
        self.via = via
        self._on_close = on_close
        self.heartbeats = heartbeat_s is not None
        if not os.path.exists(port):
            self.close()
            raise TargetNotFound(f"{port}: no such port, so no module there (unplugged? "
                                 "`modbridge list` shows the ports)")  # fmt: skip
        from modbridge.link.port import NotASerialPort, check_port

        try:
            check_port(port)  # /dev/null, a file: one line at once, not a hello wait
        except NotASerialPort as e:
            self.close()
            raise ControlError(str(e)) from None
        self.link = quiet_link_class()(port, keys=keys, quiet=not self.heartbeats,
                                       heartbeat_period_s=heartbeat_s or 3600.0)  # fmt: skip
        try:
            self.link.start()
        except LinkError as e:
            self.close()
            raise ControlError(str(e)) from None
        if not self.link.wait_up(up_timeout_s):
            why = self.link.status.last_error or "no hello"
            self.close()
            raise TargetNotFound(f"{port}: no module: {why}")
        self.module_id = self.link.status.module_id

    def request(self, name, fields=None, timeout=None, then_telemetry=False) -> Reply:
        return link_request(self.link, name, fields, timeout, then_telemetry)

    def telemetry(self) -> dict | None:
        deadline = time.monotonic() + TELEMETRY_WAIT_S
        while time.monotonic() < deadline:
            t = self.link.status.telemetry
            hosted = t and t.get("state") in (C.STATE_HOSTED, C.STATE_MANUAL)
            if t and (hosted or not self.heartbeats):
                break
            time.sleep(0.02)
        t = self.link.status.telemetry
        return dict(t) if t else None

    def close(self) -> None:
        link = getattr(self, "link", None)
        if link is not None:
            self.link = None
            link.stop()
        if self._on_close is not None:
            fn, self._on_close = self._on_close, None
            fn()


def open_sim(speed: float = 10.0, world: str = "default", heartbeats: bool = False,
             ) -> DirectTarget:  # fmt: skip
    """A virtual module (the real firmware in MicroPython on a pty) for ``--sim``: it
    lives as long as the target (closed with it)."""
    from modbridge.sim.fleet import SimFleet

    try:
        fleet = SimFleet(1, world=world, speed=speed).start()
    except (ModbridgeError, OSError, ValueError) as e:
        raise ControlError(f"cannot start the virtual module: {e}") from None
    try:
        hb = max(0.05, min(1.0, 2.0 / speed)) if heartbeats else None
        t = DirectTarget(fleet.ports[0], fleet.keys, up_timeout_s=15.0,
                         on_close=fleet.stop, via="sim", heartbeat_s=hb)  # fmt: skip
    except BaseException:
        fleet.stop()
        raise
    # a virtual module has just powered on: wait until it is out of BOOT (a MANUAL
    # command in BOOT ends at once: the boot floor is a safety cause, S5)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        tel = t.link.status.telemetry
        if tel and tel.get("state") not in (None, C.STATE_BOOT):
            break
        time.sleep(0.05)
    return t


def find_port(module_id: str, ports, store, timeout_s: float = FIND_TIMEOUT_S) -> str:
    """The port whose module's hello announces ``module_id`` (or an id starting with
    it, if only one does), among ``ports`` and the auto-discovered ones.
    :class:`TargetNotFound` when none or several match. (``modbridge tune`` too.)"""
    from modbridge.link.discovery import find_modules
    from modbridge.link.session import LinkError

    seen, matches = [], []
    for info in find_modules(list(ports)):
        # no heartbeat: a module that saw one would count its host as lost afterwards
        link = quiet_link_class()(info.device, keys=store, heartbeat_period_s=3600.0)
        try:
            link.start(fail_fast=False)
            if link.wait_up(timeout_s):
                uid = link.status.module_id or ""
                seen.append(f"{info.device}: {uid}")
                if uid == module_id:
                    return info.device
                if uid.startswith(module_id):
                    matches.append(info.device)
        except LinkError:
            pass
        finally:
            link.stop()
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise TargetNotFound(f"module id {module_id} is ambiguous: {', '.join(seen)}; "
                             "give more of it")  # fmt: skip
    raise TargetNotFound(
        f"no module {module_id} found"
        + (f" (seen: {'; '.join(seen)})" if seen else " (no module answered on any port)")
    )


def resolve_name(arg: str, config) -> tuple[str | None, str | None]:
    """A ``[[module]]`` mapping's ``name`` -> (module id, port); (None, None) if
    ``arg`` names none."""
    for m in getattr(config, "modules", None) or ():
        if getattr(m, "name", None) and m.name == arg:
            return m.module_id, m.port
    return None, None


def looks_like_port(arg: str) -> bool:
    return "/" in arg or arg.startswith("tty") or arg.upper().startswith("COM")


def open_target(arg: str | None, *, sim: bool = False, direct: bool = False, config=None,
                keys=None, socket_path: str | None = None, notes: list | None = None,
                sim_speed: float = 10.0, heartbeats: bool = False) -> Target:  # fmt: skip
    """The :class:`Target` for a command: ``--sim``, else the bridge's control socket
    when one answers (unless ``direct``), else the port directly: ``arg`` a port
    path, a ``[[module]]`` name, or a module id (or a unique prefix) looked up on the
    discoverable ports. ``notes`` collects what a person should know (a stale socket).
    ``heartbeats``: a direct link sends them (MANUAL needs a host: ``set fan``)."""
    from modbridge.ops import ctlsock

    notes = notes if notes is not None else []
    if sim:
        return open_sim(sim_speed, heartbeats=heartbeats)
    if not arg:
        raise InputError("give the module: a port path, a module id or a [[module]] name "
                         "(or --sim)")  # fmt: skip
    if not direct:
        for path in ctlsock.client_paths(config, socket_path):
            try:
                client = ctlsock.Client(path)
                if client.ping():
                    return ctlsock.BridgeTarget(client, arg)
            except ctlsock.StaleSocket as e:
                notes.append(str(e))
            except ctlsock.SocketRefused as e:
                raise ControlError(str(e)) from None
            except ctlsock.SocketError as e:
                notes.append(f"{path}: {e}; talking to the port directly")
    mid, port = resolve_name(arg, config)
    if port is None and mid is None:
        if looks_like_port(arg):
            port = arg
        elif re.fullmatch(r"[0-9a-fA-F]{2,64}", arg):
            mid = arg.lower()
        else:
            raise TargetNotFound(f"{arg}: not a port, a module id, or a [[module]] name in "
                                 "the config")  # fmt: skip
    if port is None:
        ports = config.ports() if config is not None else []
        port = find_port(mid, ports, keys)
    target = DirectTarget(port, keys, heartbeat_s=1.0 if heartbeats else None)
    if mid is not None and target.module_id and not target.module_id.startswith(mid):
        got = target.module_id
        target.close()
        raise TargetNotFound(f"{port}: the module there is {got}, not {mid}")
    return target


# ------------------------------------------------------------------------ operations


def _outcome(t: Target, command: str, summary: str, reply: Reply, request: str) -> Outcome:
    o = Outcome(command, summary, "ack", t.module_id, t.port, t.via)
    if reply.name == "nack":
        o.status = "refused"
        o.nack = dict(reply.fields)
        o.refusal = refusal_text(request, reply.fields)
    elif reply.name != "ack":
        o.status = "reply"
    return o


def _state_name(tel: dict) -> str:
    s = tel.get("state")
    return C.STATES[s] if isinstance(s, int) and 0 <= s < len(C.STATES) else str(s)


def _fault_names(mask) -> list[str]:
    if not isinstance(mask, int):
        return []
    return [n for i, n in enumerate(C.FAULT_BITS) if mask & (1 << i)]


def _applied(tel: dict | None) -> dict | None:
    if not tel:
        return None
    out = {"state": _state_name(tel)}
    r = tel.get("reason")
    if isinstance(r, int) and 0 <= r < len(C.REASONS):
        out["reason"] = C.REASONS[r]
    for n in (1, 2):
        d = tel.get(f"fan{n}_duty")
        if isinstance(d, int):
            out[f"fan{n}_duty_pct"] = PCT.to_display(d)
        rpm = tel.get(f"fan{n}_rpm")
        if isinstance(rpm, int):
            out[f"fan{n}_rpm"] = rpm
    out["faults"] = _fault_names(tel.get("faults"))
    return out


def _why_higher(tel: dict) -> str:
    state = _state_name(tel)
    faults = _fault_names(tel.get("faults"))
    if state == "BOOT":
        return "the boot floor (70 %) holds until every sensor has its first readings"
    if state == "FAILSAFE" or faults:
        return "a fault floor: " + (", ".join(faults) or state)
    if state == "STANDALONE":
        return "the host-lost floor (40 %)"
    return "the module's safety hold ramps down at 5 %/s, or the hot floor applies"


def set_fans(t: Target, duties: dict[int, float]) -> Outcome:
    """``set fan1 40%`` / ``fan2`` / ``fans``: manual duty. A fan not named keeps its
    current duty. The next telemetry says what the module applies: a floor above
    what was asked is reported (the module never runs below its floors)."""
    current = t.telemetry() if len(duties) < 2 else None
    fields = fan_fields(duties, current)
    asked = {n: PCT.to_display(fields[f"duty{n}"]) for n in (1, 2)}
    if len(duties) == 2 and asked[1] == asked[2]:
        summary = f"fans: manual {fmt_num(asked[1])} %"
    else:
        summary = ", ".join(f"fan{n}: manual {fmt_num(asked[n])} %" for n in sorted(duties))
    reply = t.request("fan_mode", fields, then_telemetry=True)
    o = _outcome(t, "set fan", summary, reply, "fan_mode")
    if o.status != "ack":
        return o
    for n in (1, 2):
        if n not in duties:
            o.notes.append(f"fan{n} at {fmt_num(asked[n])} % (its duty now, at least the "
                           "manual minimum 30 %)")  # fmt: skip
    if t.via == "bridge":
        o.notes.append("MANUAL is a 10-minute lease (docs/safety.md S5): send it again to "
                       "renew it, `set ... mode auto` to end it")  # fmt: skip
    else:
        o.notes.append("MANUAL needs a host's heartbeats: without a running bridge the module "
                       "returns to automatic control (host-lost floor 40 %) about 5 s after "
                       "this command ends; through `modbridge run` it holds for its lease "
                       "(10 min)")  # fmt: skip
    tel = reply.telemetry
    o.applied = _applied(tel)
    if tel is None:
        o.notes.append("no telemetry after the command: the applied duty is not known")
        return o
    if _state_name(tel) != "MANUAL":
        why = (o.applied or {}).get("reason")
        o.notes.append(
            f"the module is {_state_name(tel)}" + (f" ({why})" if why else "")
            + ", not MANUAL: it returned to automatic control (a MANUAL lease ends on any "
            "safety cause, boot included, and when the host that was seen is lost: "
            "docs/safety.md S5)"
        )
    for n in (1, 2):
        d = tel.get(f"fan{n}_duty")
        if isinstance(d, int) and d > fields[f"duty{n}"] + 66:  # 0.1 %
            o.notes.append(
                f"fan{n} runs at {PCT.show(d)}, above the {fmt_num(asked[n])} % asked: "
                + _why_higher(tel)
            )
    return o


def set_mode(t: Target, mode: str) -> Outcome:
    """``set mode auto|manual|curve``. ``manual`` keeps the fans at their current duty."""
    if mode not in FAN_MODES:
        raise InputError(f"mode: one of {', '.join(FAN_MODES)}, got {mode!r}")
    if mode == "manual":
        o = set_fans(t, {})
        o.command, o.summary = "set mode", f"mode: manual ({o.summary.split(': manual ', 1)[-1]})"
        return o
    reply = t.request("fan_mode", {"mode": FAN_MODES.index(mode)}, then_telemetry=True)
    o = _outcome(t, "set mode", f"mode: {mode}", reply, "fan_mode")
    o.applied = _applied(reply.telemetry)
    return o


def set_setpoint(t: Target, channel: str, degc: float) -> Outcome:
    """``set setpoint gpu 70``: a channel's regulation setpoint (RAM; ``config save``)."""
    if channel not in SETPOINT_CHANNELS:
        raise InputError(f"setpoint: channel one of {', '.join(SETPOINT_CHANNELS)}, "
                         f"got {channel!r}")  # fmt: skip
    name = f"sp_{channel}"
    wire = to_wire("setpoints", name, degc)
    reply = t.request("setpoints", {name: wire})
    o = _outcome(t, "set setpoint", f"setpoint {channel}: {DEGC.show(wire)}", reply, "setpoints")
    o.subject = f"setpoint {channel}"
    if o.status == "ack":
        o.notes.append("in RAM until `modbridge config save`")
    return o


def set_curve(t: Target, points, hysteresis_c: float | None = None) -> Outcome:
    """``set curve 40:30 60:50 80:100 [--hysteresis 2]`` (used in curve mode, and as
    the fallback when the PID has no input)."""
    fields = curve_fields(points, hysteresis_c)
    text = " ".join(f"{fmt_num(DEGC.to_display(a))}:{fmt_num(PCT.to_display(b))}"
                    for a, b in fields["points"])  # fmt: skip
    text += " (degC:%)"
    if "hysteresis" in fields:
        text += f", hysteresis {DEGC.show(fields['hysteresis'])}"
    reply = t.request("fan_curve", fields)
    o = _outcome(t, "set curve", f"curve: {text}", reply, "fan_curve")
    if o.status == "ack":
        low = [p for p in fields["points"] if p[1] < 13107]
        if low:
            o.notes.append("points below 20 % run at the fan's minimum spin (20 %)")
        o.notes.append("in RAM until `modbridge config save`; `set mode curve` uses it")
    return o


def parse_gains(items) -> dict[str, float]:
    """``["kp=5", "ki=0.2"]`` -> ``{"kp": 5.0, "ki": 0.2}`` (display units)."""
    out = {}
    for item in items:
        k, sep, v = str(item).partition("=")
        k = k.strip().lower()
        if not sep or k not in PID_GAINS:
            raise InputError(f"pid: NAME=VALUE with NAME one of {', '.join(PID_GAINS)}, "
                             f"got {item!r}")  # fmt: skip
        out[k] = parse_number(v, k)
    if not out:
        raise InputError("pid: give at least one gain, e.g. kp=5 ki=0.2")
    return out


def set_pid(t: Target, gains: dict[str, float]) -> Outcome:
    """``set pid kp=5 ki=0.2``: PID gains (kp %/degC, ki %/(degC s), kd % s/degC,
    kff %/W)."""
    fields = {k: to_wire("pid_gains", k, v) for k, v in gains.items()}
    text = ", ".join(f"{k} {field_unit('pid_gains', k).show(w)}" for k, w in fields.items())
    reply = t.request("pid_gains", fields)
    o = _outcome(t, "set pid", f"pid: {text}", reply, "pid_gains")
    if o.status == "ack":
        o.notes.append("in RAM until `modbridge config save`")
    return o


def config_get(t: Target, section: str | None = None) -> Outcome:
    """``config get [section]``: the module's running config in display units."""
    wanted = section_names(section)
    values: dict[str, object] = {}
    for sec in wanted:
        reply = t.request("config_get", {"section": sec})
        if reply.name == "nack":
            o = _outcome(t, "config get", f"config {section or 'get'}", reply, "config_get")
            return o
        values.update(reply.fields.get("values") or {})
    rows = {}
    keys = known_keys()
    for k in sorted(values, key=_key_order):
        ck = keys.get(k) or config_key(k)
        rows[ck.display] = (ck, values[k])
    title = f"config of module {t.module_id or '?'}" + (f" ({section})" if section else "")
    o = Outcome("config get", title, "reply", t.module_id, t.port, t.via)
    o.data = {
        "values": {d: ck.display_value(v) for d, (ck, v) in rows.items()},
        "units": {d: ck.unit.label for d, (ck, v) in rows.items() if ck.unit.label},
        "keys": {d: ck.key for d, (ck, v) in rows.items()},
    }
    width = max((len(d) for d in rows), default=0)
    o.lines_extra = [f"  {d:<{width}}  {ck.show(v)}" for d, (ck, v) in rows.items()]
    return o


def _key_order(key: str):
    order = ("version", "control", "channels", "pid", "curve", "fans", "safety", "ina226",
             "watchdog_ms", "model")  # fmt: skip
    head = key.split(".")[0]
    return (order.index(head) if head in order else len(order), key)


def config_set(t: Target, assignments) -> Outcome:
    """``config set key=value ...`` in display units (``gpu.setpoint=72 pid.kp=4``);
    one transaction on the module: all applied or none."""
    if not assignments:
        raise InputError("config set: give KEY=VALUE pairs, e.g. gpu.setpoint=72")
    values, shown = {}, []
    for a in assignments:
        k, wire = parse_assignment(a)
        values[k.key] = wire
        shown.append(f"{k.display} {k.show(wire)}")
    if len(values) > C.by_name("config_set")[C.M_FIELDS][0][C.F_HI]:
        raise InputError("config set: at most 64 keys at once")
    reply = t.request("config_set", {"values": values})
    o = _outcome(t, "config set", "config set: " + ", ".join(shown), reply, "config_set")
    if o.status == "ack":
        o.notes.append("in RAM until `modbridge config save`")
    return o


def config_save(t: Target) -> Outcome:
    reply = t.request("config_save")
    o = _outcome(t, "config save", "config save", reply, "config_save")
    if o.status == "ack":
        o.notes.append("written to the module's flash (nothing is written when unchanged)")
    return o


def config_reset(t: Target) -> Outcome:
    reply = t.request("config_reset")
    o = _outcome(t, "config reset", "config reset to factory defaults", reply, "config_reset")
    if o.status == "ack":
        o.notes.append("the stored configs were deleted; the module runs its factory defaults")
    return o


def _step_labels(n: int) -> list[str]:
    try:
        from device.selftest import STEPS

        if len(STEPS) == n:
            return [f"{fmt_num(PCT.to_display(d))} %" for d in STEPS]
    except ImportError:  # pragma: no cover - the firmware ships with modbridge
        pass
    return [f"step {i + 1}" for i in range(n)]


ABORT_TIMEOUT_S = 5.0


def abort_selftest(t: Target) -> str:
    """Ask the module to end its self-test now (``selftest`` with ``abort``: its
    controller takes the fans back); what happened, in one sentence."""
    try:
        reply = t.request("selftest", {"abort": True}, timeout=ABORT_TIMEOUT_S)
    except (ModbridgeError, OSError, KeyboardInterrupt) as e:
        why = sanitize(str(e) or e.__class__.__name__, 160)
        return (f"interrupted; the self-test could not be aborted ({why}): the module ends "
                "it on its own within 75 s, its safety floors apply throughout")  # fmt: skip
    if reply.name == "ack":
        return "interrupted: self-test aborted, the fans are back under the module's controller"
    return ("interrupted; the module did not take the abort (older firmware?): it ends the "
            "self-test on its own within 75 s, its safety floors apply throughout")


def selftest(t: Target, timeout_s: float | None = None) -> Outcome:
    """``selftest``: fans stepped down with the tach checked, channels, 12 V input;
    ``failed`` when the module says it did not pass. It takes 30-40 s on healthy fans
    (each step waits until the tach settles), at most the link's selftest timeout (None:
    the default of whoever talks to the module, this process or the bridge)."""
    try:
        reply = t.request("selftest", timeout=timeout_s)
    except KeyboardInterrupt:
        raise Interrupted(abort_selftest(t)) from None
    o = _outcome(t, "selftest", "selftest", reply, "selftest")
    if o.status == "refused":
        return o
    if reply.name != "selftest_report":
        o.status = "ack"
        o.notes.append("acknowledged, but no report came")
        o.failed = True
        return o
    f = reply.fields
    passed = bool(f.get("passed"))
    o.failed = not passed
    o.summary = f"selftest: {'passed' if passed else 'FAILED'}"
    fans, lines = [], []
    fans_ok = f.get("fans_ok") or []
    for n in (1, 2):
        rpm = f.get(f"fan{n}_rpm")
        if rpm is None:
            continue
        labels = _step_labels(len(rpm))
        ok = fans_ok[n - 1] if len(fans_ok) >= n else None
        steps = [{"duty": lab, "rpm": r} for lab, r in zip(labels, rpm, strict=False)]
        fans.append({"fan": n, "ok": ok, "steps": steps})
        steps = ", ".join(f"{lab} {r} RPM" for lab, r in zip(labels, rpm, strict=False))
        lines.append(f"  fan{n}: {_okword(ok)}: {steps}")
    chans = []
    for i, ok in enumerate(f.get("channels_ok") or []):
        name = C.CHANNELS[i] if i < len(C.CHANNELS) else str(i)
        chans.append({"channel": name, "ok": ok})
    if chans:
        lines.append("  channels: " + ", ".join(f"{c['channel']} {_okword(c['ok'])}"
                                                for c in chans))  # fmt: skip
    v = f.get("v_in")
    pm = f.get("power_monitor_ok")
    if v is not None or pm is not None:
        volts = f": {VOLT.show(v)}" if v is not None else ""
        lines.append(f"  12 V input: {_okword(pm)}{volts}")
    if f.get("text"):
        lines.append(f"  module says: {f['text']}")
    o.lines_extra = lines
    o.data = {"passed": passed, "fans": fans, "channels": chans,
              "power_monitor_ok": pm, "v_in_v": VOLT.to_display(v) if v is not None else None,
              "text": f.get("text")}  # fmt: skip
    return o


def _okword(ok) -> str:
    return "ok" if ok else ("FAIL" if ok is not None else "?")


def reboot(t: Target) -> Outcome:
    reply = t.request("reboot")
    o = _outcome(t, "reboot", "reboot", reply, "reboot")
    if o.status == "ack":
        o.notes.append("the module restarts (boot floor 70 % until its sensors read)")
    return o


def repl(t: Target) -> Outcome:
    """``repl``: the firmware stops and hands the port to the MicroPython REPL."""
    if t.via == "bridge":
        raise ControlError(
            "the bridge holds the port: it would keep writing heartbeats into the REPL; "
            "stop the bridge first (systemctl stop modbridge), then run `modbridge repl "
            f"{t.port or '<port>'} --direct`"
        )
    reply = t.request("repl")
    o = _outcome(t, "repl", "repl", reply, "repl")
    if o.status != "ack":
        return o
    port = t.port or "<port>"
    o.summary = f"repl: the module on {port} left the firmware for the MicroPython REPL"
    o.notes += [
        "the fans keep their last duty (on a board with a watchdog it resets into the "
        "REPL: the fans' PWM inputs float, most fans then run at full speed)",
        f"next: mpremote connect {port} repl   (or exec, fs ls, fs cp ...)",
        f"back to the firmware: mpremote connect {port} reset   (or power-cycle)",
    ]
    if t.via == "sim":
        o.notes.append("this virtual module ends with the command: `modbridge sim` keeps "
                       "one running for mpremote")  # fmt: skip
    return o


def pick_module(arg: str, entries) -> str:
    """The port of the module ``arg`` names among ``entries`` (``(port, module_id,
    names)``, the bridge's links): a port path (or a path to the same device), a
    module id, a ``[[module]]`` name, or a unique prefix of a module id."""
    for port, _mid, _names in entries:
        if arg == port or ("/" in arg and os.path.realpath(arg) == os.path.realpath(port)):
            return port
    for port, mid, names in entries:
        if arg == mid or arg in names:
            return port
    pre = [port for port, mid, _ in entries if mid and mid.startswith(arg.lower())]
    if len(pre) == 1:
        return pre[0]
    known = "; ".join(f"{p}: {mid or '?'}" + (f" ({', '.join(n)})" if n else "")
                      for p, mid, n in entries) or "none"  # fmt: skip
    if len(pre) > 1:
        raise TargetNotFound(f"module {arg} is ambiguous (modules: {known}): give more of its id")
    raise TargetNotFound(f"no module {arg} (modules: {known})")
