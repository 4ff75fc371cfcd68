"""World parameters: a small TOML file, validated against a fixed schema.

Every key has its unit in its name (``_c`` degC, ``_w`` W, ``_j_per_k``, ``_w_per_k``,
``_rpm``, ``_s``, ``_ms``, ``_v``, ``_mv``, ``_ma``, ``_ohm``, ``_pct``, ``_m3_per_s``,
``_lsb``) or is a plain ratio/exponent/string. ``docs/simulator.md`` explains each one.

    params = load("default")            # a built-in world (worlds/default.toml)
    params = load("my_chassis.toml")    # a file of yours
    params = params.override({"adc.noise_lsb": 0.0, "world.ambient_c": 30.0})
    params["fans"]["max_rpm"]           # -> 3000

A file either states every key or starts with ``inherit = "<world>"`` (a built-in world
name or a path relative to the file) and states only what differs. Unknown keys,
missing keys, wrong types and out-of-range values raise ``ParamsError`` naming the
file, line and dotted key.

Why a TOML *subset* parsed here: ``tomllib`` exists only from Python 3.11 and this
package supports 3.10 without new dependencies. The subset is what a parameter file
needs -- ``# comments``, ``[table]`` / ``[table.sub]`` headers, ``key = value`` with
integers, floats, ``true``/``false``, ``"strings"`` and one-line arrays of those --
and every file in that subset is valid TOML with the same meaning (a test checks the
built-in worlds against ``tomllib`` where it exists). Anything else is refused with
the line number, never silently misread.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

WORLDS_DIR = Path(__file__).resolve().parent / "worlds"
CHANNELS = ("gpu", "vram", "mos", "amb")
NODES = ("die", "heatsink", "vram", "mos", "air", "ambient")


class ParamsError(ValueError):
    """A world file or override is wrong; the message names the key and the problem."""


# --------------------------------------------------------------------------- schema
# section -> ((key, kind, lo, hi), ...). Kinds: "num" (int or float), "int", "bool",
# "str", "nodes" (list of node names), "weights" (list of numbers). lo/hi inclusive;
# None = unbounded. A lo given as ("gt", x) means strictly greater than x.

_POS = ("gt", 0.0)


def _ntc_section():
    return (
        ("beta", "num", 1000.0, 10000.0),
        ("r0_ohm", "num", 100.0, 1e6),
        ("r_fixed_ohm", "num", 100.0, 1e6),
        ("ntc_low", "bool", None, None),
        ("sense_nodes", "nodes", None, None),
        ("sense_weights", "weights", 0.0, 1.0),
        ("offset_c", "num", -20.0, 20.0),
        ("tau_s", "num", 0.0, 600.0),
    )


SCHEMA = {
    "world": (
        ("name", "str", None, None),
        ("ambient_c", "num", -40.0, 80.0),
        ("substep_ms", "int", 1, 100),
    ),
    "die": (
        ("heat_capacity_j_per_k", "num", _POS, 1e6),
        ("to_heatsink_w_per_k", "num", _POS, 1e5),
        ("to_vram_w_per_k", "num", 0.0, 1e5),
    ),
    "vram": (
        ("heat_capacity_j_per_k", "num", _POS, 1e6),
        ("to_heatsink_w_per_k", "num", _POS, 1e5),
        ("to_air_w_per_k", "num", 0.0, 1e5),
    ),
    "heatsink": (
        ("heat_capacity_j_per_k", "num", _POS, 1e7),
        ("to_air_natural_w_per_k", "num", 0.0, 1e5),
        ("to_air_forced_w_per_k", "num", 0.0, 1e5),
        ("flow_exponent", "num", 0.0, 2.0),
    ),
    "mos": (
        ("heat_capacity_j_per_k", "num", _POS, 1e6),
        ("to_heatsink_w_per_k", "num", 0.0, 1e5),
        ("to_air_natural_w_per_k", "num", 0.0, 1e5),
        ("to_air_forced_w_per_k", "num", 0.0, 1e5),
    ),
    "air": (
        ("heat_capacity_j_per_k", "num", _POS, 1e7),
        ("leak_w_per_k", "num", _POS, 1e5),
        ("volumetric_heat_capacity_j_per_m3_k", "num", _POS, 1e4),
    ),
    "fans": (
        ("max_rpm", "num", 100.0, 50000.0),
        ("stop_duty_pct", "num", 0.0, 100.0),
        ("start_duty_pct", "num", 0.0, 100.0),
        ("spinup_tau_s", "num", 0.0, 60.0),
        ("spindown_tau_s", "num", 0.0, 60.0),
        ("pulses_per_rev", "int", 1, 4),
        ("flow_m3_per_s", "num", 0.0, 10.0),
        ("power_w", "num", 0.0, 500.0),
    ),
    "rail": (
        ("nominal_v", "num", 1.0, 60.0),
        ("source_resistance_ohm", "num", 0.0, 1.0),
        ("measured_share", "num", 0.0, 1.0),
        ("bus_noise_mv", "num", 0.0, 1000.0),
        ("current_noise_ma", "num", 0.0, 10000.0),
    ),
    "adc": (("noise_lsb", "num", 0.0, 100.0),),
    "gpu": (
        ("name", "str", None, None),
        ("uuid", "str", None, None),
        ("pci_bus_id", "str", None, None),
        ("idle_w", "num", 0.0, 2000.0),
        ("min_limit_w", "num", _POS, 5000.0),
        ("max_limit_w", "num", _POS, 5000.0),
        ("default_limit_w", "num", _POS, 5000.0),
        ("memory_idle_w", "num", 0.0, 1000.0),
        ("memory_power_fraction", "num", 0.0, 0.9),
        ("vrm_efficiency", "num", 0.5, 1.0),
        ("power_average_s", "num", 0.0, 10.0),
        ("slowdown_c", "num", 0.0, 200.0),
        ("slowdown_w_per_k", "num", 0.0, 1e4),
        ("hw_slowdown_c", "num", 0.0, 200.0),
        ("hw_slowdown_power_fraction", "num", 0.0, 1.0),
        ("shutdown_c", "num", 0.0, 250.0),
        ("memory_temperature_supported", "bool", None, None),
    ),
}
for _ch in CHANNELS:
    SCHEMA["ntc." + _ch] = _ntc_section()


class Params:
    """Validated world parameters: ``params[section][key]``; read-only by convention."""

    def __init__(self, sections, source="<params>"):
        self.sections = sections
        self.source = source

    def __getitem__(self, section):
        return self.sections[section]

    def __eq__(self, other):
        return isinstance(other, Params) and self.sections == other.sections

    def __repr__(self):
        return f"Params({self.sections['world']['name']!r}, source={self.source!r})"

    def to_dict(self):
        """A deep copy as plain nested dicts (``{"fans": {"max_rpm": 3000, ...}}``)."""
        return {s: dict(keys) for s, keys in self.sections.items()}

    def override(self, changes):
        """New ``Params`` with ``{"section.key": value}`` changes applied and validated."""
        data = self.to_dict()
        for dotted, value in changes.items():
            section, _, key = dotted.rpartition(".")
            if section not in SCHEMA:
                raise ParamsError(f"override {dotted}: unknown section {section!r}")
            if key not in dict((k[0], k) for k in SCHEMA[section]):
                raise ParamsError(f"override {dotted}: unknown key {key!r} in [{section}]")
            data[section][key] = value
        return validate(data, self.source + " (overridden)")


# --------------------------------------------------------------------------- loading


def builtin_names():
    """Names of the built-in worlds (files in ``worlds/``)."""
    return sorted(p.stem for p in WORLDS_DIR.glob("*.toml"))


def default():
    """The built-in default world."""
    return load("default")


def load(path_or_name):
    """Load a world: a built-in name (``"default"``) or a path to a ``.toml`` file."""
    path = _resolve(path_or_name, None)
    return _load_path(path, ())


def loads(text, source="<string>", base_dir=None):
    """Parse and validate world parameters from ``text``."""
    return _from_text(text, source, base_dir, ())


def _resolve(path_or_name, base_dir):
    s = str(path_or_name)
    if "/" not in s and "\\" not in s and not s.endswith(".toml"):
        path = WORLDS_DIR / (s + ".toml")
        if not path.is_file():
            raise ParamsError(
                f"no built-in world {s!r} (built-in: {', '.join(builtin_names())}); "
                "give a path to a .toml file for your own"
            )
        return path
    path = Path(s)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return path


def _load_path(path, chain):
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ParamsError(f"cannot read world file {path}: {e.strerror or e}") from None
    return _from_text(text, str(path), path.parent, chain)


def _from_text(text, source, base_dir, chain):
    doc, lines = parse_toml(text, source)
    base = None
    if "inherit" in doc:
        parent = doc.pop("inherit")
        if not isinstance(parent, str):
            raise ParamsError(f"{source}: inherit must be a world name or path string")
        path = _resolve(parent, Path(base_dir) if base_dir else None)
        if str(path.resolve()) in chain:
            raise ParamsError(f"{source}: inherit loop through {path}")
        base = _load_path(path, chain + (str(path.resolve()),)).to_dict()
    data = base if base is not None else {}
    for section, keys in doc.items():
        where = lines.get(section, "")
        if section not in SCHEMA:
            if isinstance(keys, dict):
                raise ParamsError(
                    f"{source}{where}: unknown section [{section}]; sections are "
                    + ", ".join(SCHEMA)
                )
            raise ParamsError(f"{source}{where}: unknown top-level key {section!r}")
        target = data.setdefault(section, {})
        known = [k[0] for k in SCHEMA[section]]
        for key, value in keys.items():
            if key not in known:
                raise ParamsError(
                    f"{source}{lines.get(section + '.' + key, '')}: unknown key "
                    f"{section}.{key}; [{section}] takes {', '.join(known)}"
                )
            target[key] = value
    return validate(data, source, lines)


def validate(data, source="<params>", lines=None):
    """Check ``{"section": {"key": value}}`` against the schema -> ``Params``."""
    lines = lines or {}
    out = {}
    for section, spec in SCHEMA.items():
        got = data.get(section)
        if got is None:
            raise ParamsError(f"{source}: missing section [{section}]")
        for key in got:
            if key not in [k[0] for k in spec]:
                raise ParamsError(f"{source}: unknown key {section}.{key}")
        sec = {}
        for key, kind, lo, hi in spec:
            dotted = section + "." + key
            if key not in got:
                raise ParamsError(f"{source}: missing key {dotted} ({_describe(kind, lo, hi)})")
            sec[key] = _check(got[key], kind, lo, hi, f"{source}{lines.get(dotted, '')}: {dotted}")
        out[section] = sec
    for section in data:
        if section not in SCHEMA:
            raise ParamsError(f"{source}: unknown section [{section}]")
    _cross_checks(out, source)
    return Params(out, source)


def _describe(kind, lo, hi):
    names = {
        "num": "a number",
        "int": "an integer",
        "bool": "true or false",
        "str": "a string",
        "nodes": "an array of node names",
        "weights": "an array of numbers",
    }
    text = names[kind]
    if kind in ("num", "int") and lo is not None:
        low = f"> {lo[1]:g}" if isinstance(lo, tuple) else f">= {lo:g}"
        text += f" {low} and <= {hi:g}"
    return text


def _check(value, kind, lo, hi, where):
    def bad(why):
        return ParamsError(f"{where}: {why}, got {value!r}")

    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("must be true or false")
        return value
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise bad("must be a non-empty string")
        return value
    if kind == "nodes":
        if not isinstance(value, list) or not value:
            raise bad("must be a non-empty array of node names")
        for v in value:
            if v not in NODES:
                raise bad(f"node {v!r} is not one of {', '.join(NODES)}")
        if len(set(value)) != len(value):
            raise bad("names a node twice")
        return list(value)
    if kind == "weights":
        if not isinstance(value, list) or not value:
            raise bad("must be a non-empty array of numbers")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise bad(f"every weight must be a number in {lo:g}..{hi:g}")
        return [float(v) for v in value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad("must be " + _describe(kind, None, None))
    if kind == "int" and not isinstance(value, int):
        raise bad("must be an integer")
    if not math.isfinite(value):
        raise bad("must be finite")
    if isinstance(lo, tuple):
        if not value > lo[1]:
            raise bad(f"must be > {lo[1]:g}")
    elif lo is not None and value < lo:
        raise bad(f"must be >= {lo:g}")
    if hi is not None and value > hi:
        raise bad(f"must be <= {hi:g}")
    return value if kind == "int" else float(value)


def _cross_checks(p, source):
    g = p["gpu"]
    if not g["min_limit_w"] <= g["default_limit_w"] <= g["max_limit_w"]:
        raise ParamsError(
            f"{source}: gpu.default_limit_w ({g['default_limit_w']:g}) must lie within "
            f"gpu.min_limit_w..gpu.max_limit_w ({g['min_limit_w']:g}..{g['max_limit_w']:g})"
        )
    if not g["slowdown_c"] < g["hw_slowdown_c"] < g["shutdown_c"]:
        raise ParamsError(
            f"{source}: need gpu.slowdown_c < gpu.hw_slowdown_c < gpu.shutdown_c, got "
            f"{g['slowdown_c']:g}, {g['hw_slowdown_c']:g}, {g['shutdown_c']:g}"
        )
    f = p["fans"]
    if f["start_duty_pct"] < f["stop_duty_pct"]:
        raise ParamsError(
            f"{source}: fans.start_duty_pct ({f['start_duty_pct']:g}) must be >= "
            f"fans.stop_duty_pct ({f['stop_duty_pct']:g})"
        )
    for ch in CHANNELS:
        n = p["ntc." + ch]
        if len(n["sense_nodes"]) != len(n["sense_weights"]):
            raise ParamsError(
                f"{source}: ntc.{ch}.sense_nodes and sense_weights differ in length "
                f"({len(n['sense_nodes'])} vs {len(n['sense_weights'])})"
            )
        if abs(sum(n["sense_weights"]) - 1.0) > 1e-9:
            raise ParamsError(
                f"{source}: ntc.{ch}.sense_weights must sum to 1, got {sum(n['sense_weights']):g}"
            )


# --------------------------------------------------------------------------- TOML subset

_KEY = re.compile(r"^[A-Za-z0-9_]+$")
_HEADER = re.compile(r"^\[\s*([A-Za-z0-9_]+(?:\s*\.\s*[A-Za-z0-9_]+)*)\s*\]$")
_INT = re.compile(r"^[+-]?(0|[1-9](_?[0-9])*)$")
_FLOAT = re.compile(
    r"^[+-]?(0|[1-9](_?[0-9])*)((\.[0-9](_?[0-9])*)([eE][+-]?[0-9](_?[0-9])*)?"
    r"|[eE][+-]?[0-9](_?[0-9])*)$"
)


def parse_toml(text, source="<string>"):
    """Parse the TOML subset -> ``(doc, lines)``.

    ``doc`` maps top-level keys to values and table names (dotted, as written in the
    header) to ``{key: value}``; ``lines`` maps ``"table.key"`` to ``" line N"``.
    """
    doc = {}
    lines = {}
    current = None
    current_name = ""
    seen_tables = set()
    for n, raw in enumerate(text.splitlines(), 1):
        where = f"{source} line {n}"
        line = _strip_comment(raw, where).strip()
        if not line:
            continue
        if line.startswith("["):
            m = _HEADER.match(line)
            if not m or line.startswith("[["):
                raise ParamsError(f"{where}: bad table header {line!r} (use [name] or [a.b])")
            name = ".".join(part.strip() for part in m.group(1).split("."))
            if name in seen_tables:
                raise ParamsError(f"{where}: table [{name}] defined twice")
            seen_tables.add(name)
            current = doc.setdefault(name, {})
            current_name = name + "."
            lines[name] = f" line {n}"
            continue
        key, eq, rest = line.partition("=")
        key = key.strip()
        if not eq or not _KEY.match(key):
            raise ParamsError(f"{where}: expected `key = value`, got {line!r}")
        value = _parse_value(rest.strip(), where)
        table = doc if current is None else current
        if key in table:
            raise ParamsError(f"{where}: key {key!r} defined twice")
        table[key] = value
        lines[current_name + key] = f" line {n}"
    return doc, lines


def _strip_comment(line, where):
    out = []
    in_str = False
    i = 0
    while i < len(line):
        c = line[i]
        if in_str:
            if c == "\\":
                out.append(line[i : i + 2])
                i += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "#":
            break
        out.append(c)
        i += 1
    if in_str:
        raise ParamsError(f"{where}: unterminated string")
    return "".join(out)


def _parse_value(s, where):
    if not s:
        raise ParamsError(f"{where}: missing value after '='")
    if s.startswith("["):
        if not s.endswith("]"):
            raise ParamsError(f"{where}: arrays must open and close on one line")
        inner = s[1:-1].strip()
        if not inner:
            return []
        items = _split_array(inner, where)
        return [_parse_scalar(item.strip(), where) for item in items if item.strip()]
    return _parse_scalar(s, where)


def _split_array(inner, where):
    items, cur, in_str = [], [], False
    for c in inner:
        if c == '"':
            in_str = not in_str
        if c == "," and not in_str:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    items.append("".join(cur))
    if any(not item.strip() for item in items[:-1]):
        raise ParamsError(f"{where}: empty array element")
    return items


_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


def _parse_scalar(s, where):
    if s == "true":
        return True
    if s == "false":
        return False
    if s.startswith('"'):
        if len(s) < 2 or not s.endswith('"'):
            raise ParamsError(f"{where}: bad string {s!r}")
        body, out, i = s[1:-1], [], 0
        while i < len(body):
            c = body[i]
            if c == '"':
                raise ParamsError(f"{where}: bad string {s!r}")
            if c == "\\":
                esc = body[i + 1 : i + 2]
                if esc not in _ESCAPES:
                    raise ParamsError(f"{where}: unsupported escape \\{esc} in {s!r}")
                out.append(_ESCAPES[esc])
                i += 2
                continue
            out.append(c)
            i += 1
        return "".join(out)
    if _INT.match(s):
        return int(s.replace("_", ""))
    if _FLOAT.match(s):
        return float(s.replace("_", ""))
    raise ParamsError(
        f"{where}: cannot read value {s!r} (this parser takes numbers, true/false, "
        '"strings" and one-line arrays of those)'
    )
