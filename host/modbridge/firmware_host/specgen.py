"""Regenerate the generated parts of protocol/SPEC.md from the code.

    python -m modbridge.firmware_host.specgen            rewrite the generated regions in place
    python -m modbridge.firmware_host.specgen --check    exit 1 if SPEC.md is stale (CI, tests)
    python -m modbridge.firmware_host.specgen --print    write the catalog region to stdout

Two regions are generated, each between its own marker comments:

- CATALOG: constants, message index, one field table per message, enumerations,
  fault bits and display scales, all from :mod:`protocol.catalog` (descriptions from
  :mod:`modbridge.firmware_host.catalog_doc`);
- EXAMPLE: the worked telemetry frame, byte by byte, produced by
  :func:`protocol.frame.encode_frame` (so the hex in the spec is never hand-typed).

A CPython tool (it is never run on the device), kept to plain Python 3 syntax so
mpy-cross compiles it along with the rest of the package.
"""

import os
import sys

from protocol import VERSION_MAJOR, VERSION_MINOR, cbor, cobs, frame, jsonl
from protocol import catalog as C
from modbridge.firmware_host.catalog_doc import field_doc, message_doc
from protocol.crc import crc16

SPEC_PATH = os.path.join(os.path.dirname(os.path.abspath(C.__file__)), "SPEC.md")  # protocol/

CATALOG = "CATALOG"
EXAMPLE = "EXAMPLE"
REGIONS = (CATALOG, EXAMPLE)


def begin_marker(region):
    return "<!-- BEGIN GENERATED %s -->" % region


def end_marker(region):
    return "<!-- END GENERATED %s -->" % region


_KIND_NAMES = {
    C.K_UINT: "uint",
    C.K_INT: "int",
    C.K_STR: "text",
    C.K_BYTES: "bytes",
    C.K_BOOL: "bool",
    C.K_LIST: "array",
    C.K_MAP: "map",
    C.K_NUM: "number",
    C.K_ENUM: "enum",
}

# (heading, catalog tuple, anchor name, what it is)
ENUMS = (
    ("states", C.STATES, "Control states (`state`, `prev_state`)."),
    ("reasons", C.REASONS, "Reason / event codes (`reason`, event `code`)."),
    ("severities", C.SEVERITIES, "Event severities."),
    ("errors", C.ERRORS, "NACK error codes (`nack.code`). `ok` (0) is never sent."),
    ("channels", C.CHANNELS, "NTC channel names, index order (`channel`, event `index`)."),
    ("fan_modes", C.FAN_MODES, "Fan modes: the text values of `fan_mode.mode`."),
    ("cal_models", C.CAL_MODELS, "Calibration models: the text values of `cal_write.model`."),
    ("tune_status", C.TUNE_STATUS, "Autotune status (`autotune_report.status`)."),
    ("tune_actions", C.TUNE_ACTIONS, "Autotune actions: the text values of `autotune.action`."),
)

_REASON_NOTES = {
    "none": "no particular reason",
    "boot": "firmware started",
    "host_ok": "heartbeats arriving",
    "host_timeout": "no heartbeat within the timeout",
    "sensor_open": "NTC open circuit (index = channel)",
    "sensor_short": "NTC short circuit (index = channel)",
    "sensor_stale": "sensor not updating / I2C read failed repeatedly",
    "fan_stall": "commanded above minimum, 0 RPM (index = fan)",
    "over_temp": "a channel above its warning limit (index = channel)",
    "critical_temp": "a channel above its critical limit: fans forced to 100 %",
    "under_voltage": "12 V input below the threshold",
    "power_monitor_fault": "INA226 absent, wrong id or not answering",
    "manual_override": "host switched fans to manual",
    "config_corrupt": "stored config unreadable: factory defaults in use",
    "config_saved": "config written to flash",
    "watchdog_reset": "last reset was caused by the watchdog",
    "cleared": "the condition named in `value` is gone",
    "selftest": "self-test ran (value = 1 pass, 0 fail)",
    "calibration": "calibration coefficients changed (index = channel)",
    "manual_expired": "MANUAL lease ended (value 0 time, 1 host lost, 2 a safety cause)",
    "tach_implausible": "tach reading does not fit the commanded duty (index = fan)",
    "sensor_stuck": "NTC reading frozen while the load swings (index = channel)",
    "sensor_implausible": "NTC colder than ambient or jumping (index = channel)",
    "config_fallback": "saved config did not configure: value 1 last good, 0 factory",
    "unauthorized": "unsigned, forged or replayed command refused (value = its type)",
    "internal_error": "a handler hit a firmware bug: answered nack internal",
    "paired": "a new signing secret was provisioned",
    "autotune": "a relay autotune ended (value = its tune_status)",
}

_TUNE_NOTES = {
    "idle": "no test has run",
    "running": "relay cycles being measured",
    "done": "consistent cycles measured: ku, pu_ms and gains are in the report",
    "aborted": "the host aborted it",
    "safety": "a safety cause appeared (`causes` says which)",
    "not_hosted": "no longer HOSTED in auto mode (host lost, manual, fail-safe)",
    "too_hot": "the error rose past `max_rise`",
    "timeout": "not done within `timeout_s`",
    "floor": "a safety floor kept the relay's low level from the fans for 30 s",
    "inconsistent": "12 cycles without `cycles` agreeing ones",
}

_ERROR_NOTES = {
    "ok": "never sent in a nack",
    "malformed": "frame or payload could not be decoded",
    "version": "protocol major version not supported",
    "unknown_type": "message type not in this catalog",
    "missing_field": "a required field is absent",
    "bad_type": "a field has the wrong type",
    "out_of_range": "a value is outside its allowed range",
    "bad_state": "not allowed in the current state",
    "busy": "try again later",
    "storage": "flash read/write failed",
    "unsupported": "valid request this module cannot do",
    "internal": "firmware error (a bug: please report it)",
    "direction": "message only valid in the other direction",
    "unauthorized": "needs a valid signature (unsigned, forged or replayed)",
    "rate_limited": "too many requests of this kind: wait and retry",
}

_STATE_NOTES = {
    "BOOT": "fixed safe duty until sensors are valid",
    "HOSTED": "host heartbeats arriving; normal regulation",
    "STANDALONE": "host heartbeat missing past the timeout; regulating on local sensors",
    "FAILSAFE": "sensor/fan/temperature fault; floor duty per cause, the maximum wins",
    "MANUAL": "host override, still floored by the safety floor; a lease of 10 minutes",
}

# enumerations carried as text on the wire (K_STR fields), not as numbers
_TEXT_ENUMS = ("fan_modes", "cal_models")

_NOTES = {
    "reasons": _REASON_NOTES,
    "errors": _ERROR_NOTES,
    "states": _STATE_NOTES,
    "tune_status": _TUNE_NOTES,
}


def _cell(text):
    """Markdown table cell: pipes escaped, newlines flattened."""
    text = str(text).replace("\n", " ")
    return text.replace("|", "\\|")


def _row(cells):
    return "| " + " | ".join([_cell(c) for c in cells]) + " |"


def _table(header, rows):
    out = [_row(header), "|" + "|".join(["---"] * len(header)) + "|"]
    for r in rows:
        out.append(_row(r))
    return out


def _enum_label(names):
    for label, tup, _doc in ENUMS:
        if tup is names:
            return label
    return "?"


def _num(v):
    if v == C.U32:
        return "2^32-1"
    if v == C.I32_MIN:
        return "-2^31"
    if v == C.I32_MAX:
        return "2^31-1"
    return str(v)


def _range(fdef):
    kind = fdef[C.F_KIND]
    lo = fdef[C.F_LO]
    hi = fdef[C.F_HI]
    if lo is None and hi is None:
        return "—"
    span = "%s..%s" % ("" if lo is None else _num(lo), "" if hi is None else _num(hi))
    if kind in (C.K_STR, C.K_BYTES, C.K_LIST, C.K_MAP):
        return "len " + span
    return span


def _display_unit(unit):
    if unit.startswith("m "):
        return unit[2:]
    if unit in ("mV", "mA", "mW"):
        return unit[1:]
    return unit


def _json_repr(fdef):
    kind = fdef[C.F_KIND]
    scale = fdef[C.F_SCALE]
    if kind == C.K_ENUM:
        return "name"
    if scale is None:
        if kind == C.K_BYTES:
            return "hex text"
        return "as wire"
    mul, div, dec = scale
    if scale == C.DUTY_PCT:
        return "%% (x%d/%d, %d dp)" % (mul, div, dec)
    if mul == 1 and div == 1:
        return "%s (/%d)" % (_display_unit(fdef[C.F_UNIT]), 10**dec)
    return "x%d/%d/%d" % (mul, div, 10**dec)  # pragma: no cover - no such field today


def _type_name(fdef):
    kind = fdef[C.F_KIND]
    if kind == C.K_ENUM:
        return "enum [%s](#enum-%s)" % (_enum_label(fdef[C.F_SCALE]), _enum_label(fdef[C.F_SCALE]))
    return _KIND_NAMES[kind]


def _constants():
    rows = (
        ("VERSION_MAJOR", VERSION_MAJOR, "protocol major version (header byte 0)"),
        ("VERSION_MINOR", VERSION_MINOR, "protocol minor version (header byte 1)"),
        ("HEADER_LEN", frame.HEADER_LEN, "header bytes: major, minor, type, seq (u16 BE)"),
        ("CRC_LEN", frame.CRC_LEN, "CRC-16 trailer bytes (BE)"),
        ("MIN_FRAME", frame.MIN_FRAME, "smallest unstuffed frame (header + CRC)"),
        ("MAX_FRAME", frame.MAX_FRAME, "largest unstuffed frame"),
        (
            "MAX_ENCODED",
            cobs.max_encoded_len(frame.MAX_FRAME),
            "largest COBS-encoded frame, without the delimiter",
        ),
        ("MAX_LINE", frame.MAX_LINE, "largest JSON line (bytes before LF)"),
        ("GAP_MS", frame._GAP_MS, "line silence (ms) that ends an incomplete binary run"),
        ("CBOR_MAX_DEPTH", cbor.DEFAULT_MAX_DEPTH, "deepest CBOR nesting level (top level = 0)"),
        ("CRC check", "0x%04X" % crc16(b"123456789"), 'CRC-16 of the ASCII bytes "123456789"'),
    )
    return _table(("name", "value", "meaning"), rows)


def _message_index():
    rows = []
    for m in C.MESSAGES:
        rows.append(
            (
                "0x%02X" % m[C.M_TYPE],
                "[`%s`](#msg-%s)" % (m[C.M_NAME], m[C.M_NAME]),
                "module → host" if m[C.M_DIR] == C.D2H else "host → module",
                len(m[C.M_FIELDS]),
                message_doc(m[C.M_NAME]),
            )
        )
    return _table(("type", "name", "direction", "fields", "summary"), rows)


def _message_section(m):
    name = m[C.M_NAME]
    out = [
        '<a id="msg-%s"></a>' % name,
        "",
        "#### `%s` — type 0x%02X (%d), %s"
        % (
            name,
            m[C.M_TYPE],
            m[C.M_TYPE],
            "module → host" if m[C.M_DIR] == C.D2H else "host → module",
        ),
        "",
        message_doc(name),
        "",
    ]
    fields = m[C.M_FIELDS]
    if not fields:
        out.append("No fields: the payload is empty (0 bytes).")
        out.append("")
        return out
    rows = []
    for f in fields:
        rows.append(
            (
                f[C.F_KEY],
                "`%s`" % f[C.F_NAME],
                _type_name(f),
                "yes" if f[C.F_REQUIRED] else "",
                _range(f),
                f[C.F_UNIT] or "—",
                _json_repr(f),
                field_doc(name, f[C.F_NAME]),
            )
        )
    out += _table(("key", "name", "type", "req", "range", "wire unit", "JSON", "description"), rows)
    out.append("")
    return out


def _enum_section(label, names, doc):
    notes = _NOTES.get(label, {})
    out = ['<a id="enum-%s"></a>' % label, "", "#### %s" % label, "", doc, ""]
    rows = []
    i = 0
    while i < len(names):
        if notes:
            rows.append((i, "`%s`" % names[i], notes.get(names[i], "")))
        else:
            rows.append((i, "`%s`" % names[i]))
        i += 1
    header = ("value", "name", "meaning") if notes else ("value", "name")
    if label in _TEXT_ENUMS:
        header = ("index", "text on the wire")
    out += _table(header, rows)
    out.append("")
    return out


def _fault_bits():
    rows = []
    i = 0
    while i < len(C.FAULT_BITS):
        rows.append((i, "0x%04X" % (1 << i), "`%s`" % C.FAULT_BITS[i]))
        i += 1
    return _table(("bit", "mask", "name"), rows)


def _scales():
    rows = (
        ("MILLI", C.MILLI, "milli-unit → unit: m degC → degC, mV → V, mA → A, mW → W"),
        ("DUTY_PCT", C.DUTY_PCT, "duty 0..65535 → 0..100 %, lossless with 3 decimals"),
        ("GAIN", C.GAIN, "milli-gain → gain"),
    )
    return _table(
        ("scale", "(mul, div, decimals)", "use"),
        [(r[0], "(%d, %d, %d)" % r[1], r[2]) for r in rows],
    )


def catalog_region():
    """Markdown of the generated catalog (without the markers)."""
    out = ["", "### Constants", ""]
    out += _constants()
    out += ["", "### Message index", ""]
    out += _message_index()
    out += ["", "### Messages", ""]
    for m in C.MESSAGES:
        out += _message_section(m)
    out += ["### Enumerations", ""]
    out += ["Values are the index in the list; lists are append-only.", ""]
    for label, names, doc in ENUMS:
        out += _enum_section(label, names, doc)
    out += ['<a id="enum-faults"></a>', "", "#### faults", ""]
    out += [
        "Bits of `telemetry.faults` (uint, bit i = mask 1<<i; unknown bits are reserved "
        "and must be ignored).",
        "",
    ]
    out += _fault_bits()
    out += ["", "### JSON display scales", ""]
    out += _scales()
    out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Worked example

EXAMPLE_SEQ = 7
EXAMPLE_FIELDS = (
    ("uptime_s", 3600),
    ("state", C.STATE_HOSTED),
    ("reason", C.REASON_HOST_OK),
    ("faults", 0),
    ("temp_gpu", 72300),
    ("temp_vram", 68150),
    ("temp_mos", 55000),
    ("temp_amb", 24500),
    ("fan1_rpm", 2850),
    ("fan2_rpm", 2790),
    ("fan1_duty", 30000),
    ("fan2_duty", 29491),
    ("v_in", 11920),
    ("i_in", 8250),
    ("p_in", 98340),
    ("target", -2700),
)


def _hex(buf):
    return " ".join(["%02x" % b for b in buf])


def example_region():
    """Markdown of the worked telemetry example (without the markers)."""
    fields = {}
    for name, value in EXAMPLE_FIELDS:
        fields[name] = value
    wire = frame.encode_frame("telemetry", fields, seq=EXAMPLE_SEQ)
    raw = cobs.decode(wire[:-1])
    n = len(raw)
    mdef = C.by_name("telemetry")
    rows = [
        ("0", "01", "major = 1"),
        ("1", "%02x" % raw[1], "minor = %d" % raw[1]),
        ("2", "%02x" % raw[2], "type = 0x%02X telemetry" % raw[2]),
        ("3-4", _hex(raw[3:5]), "seq = %d (u16 big-endian)" % EXAMPLE_SEQ),
    ]
    # walk the CBOR map with the codec itself
    pos = frame.HEADER_LEN
    head_end = pos + cbor.head_len(len(fields))
    rows.append((str(pos), _hex(raw[pos:head_end]), "CBOR map head, %d pairs" % len(fields)))
    pos = head_end
    for f in mdef[C.M_FIELDS]:
        if f[C.F_NAME] not in fields:
            continue
        key, kend = cbor.decode_from(raw, pos, n - 2)
        value, vend = cbor.decode_from(raw, kend, n - 2)
        shown = jsonl.field_to_json(f, value)
        if shown == str(value):
            meaning = "key %d `%s` = %d" % (key, f[C.F_NAME], value)
        else:
            meaning = "key %d `%s` = %d (JSON %s)" % (key, f[C.F_NAME], value, shown)
        where = "%d-%d" % (pos, vend - 1)
        rows.append((where, _hex(raw[pos:kend]) + " | " + _hex(raw[kend:vend]), meaning))
        pos = vend
    crc = crc16(raw, 0, n - 2)
    crc_doc = "CRC-16 = 0x%04X over bytes 0..%d" % (crc, n - 3)
    rows.append(("%d-%d" % (n - 2, n - 1), _hex(raw[n - 2 :]), crc_doc))

    ack = frame.encode_frame("ack", {"ref": 1, "ref_type": C.T_FAN_MODE}, 5)
    out = ["", "Fields (wire values):", "", "```"]
    for name, value in EXAMPLE_FIELDS:
        out.append("%s = %d" % (name, value))
    out += ["```", ""]
    out.append("Unstuffed frame, %d bytes:" % n)
    out += ["", "```", _wrap(_hex(raw)), "```", ""]
    out += _table(("offset", "bytes (key | value)", "meaning"), rows)
    out += ["", "On the wire after COBS and the delimiter, %d bytes:" % len(wire), ""]
    out += ["```", _wrap(_hex(wire)), "```", ""]
    out += [
        "COBS code bytes (value@offset): %s. The first is prepended, each later one stands "
        "where the unstuffed frame had a 0x00, and each gives the distance to the next; "
        "the final `00` is the delimiter." % _code_bytes(raw),
        "",
        "The same message as a JSON line:",
        "",
        "```",
        jsonl.encode_line("telemetry", fields, EXAMPLE_SEQ).decode().rstrip("\n"),
        "```",
        "",
        "Two more frames, complete on the wire:",
        "",
        "```",
        "hello_request seq=1              %s" % _hex(frame.encode_frame("hello_request", None, 1)),
        "ack ref=1 ref_type=0x30 seq=5    %s" % _hex(ack),
        "```",
        "",
    ]
    return "\n".join(out)


def _code_bytes(raw):
    enc = cobs.encode(raw)
    codes = []
    i = 0
    while i < len(enc):
        codes.append("`%02x`@%d" % (enc[i], i))
        i += enc[i]
    return ", ".join(codes)


def _wrap(text, width=24):
    parts = text.split(" ")
    lines = []
    i = 0
    while i < len(parts):
        lines.append(" ".join(parts[i : i + width]))
        i += width
    return "\n".join(lines)


# ---------------------------------------------------------------------------


def generated(region):
    if region == CATALOG:
        return catalog_region()
    return example_region()


def render(text):
    """``text`` with every generated region replaced; ValueError if markers are broken."""
    for region in REGIONS:
        b = begin_marker(region)
        e = end_marker(region)
        if text.count(b) != 1 or text.count(e) != 1:
            raise ValueError("SPEC.md needs exactly one %s and one %s" % (b, e))
        i = text.index(b) + len(b)
        j = text.index(e)
        if j < i:
            raise ValueError("%s comes before %s" % (e, b))
        text = text[:i] + "\n" + generated(region) + "\n" + text[j:]
    return text


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    path = SPEC_PATH
    check = False
    show = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--check":
            check = True
        elif a == "--print":
            show = True
        elif a == "--path" and i + 1 < len(argv):
            i += 1
            path = argv[i]
        else:
            sys.stderr.write(
                "usage: python -m modbridge.firmware_host.specgen"
                " [--check] [--print] [--path SPEC.md]\n"
            )
            return 2
        i += 1
    if show:
        sys.stdout.write(catalog_region())
        return 0
    with open(path, encoding="utf-8") as fh:
        old = fh.read()
    try:
        new = render(old)
    except ValueError as e:
        sys.stderr.write("%s: %s\n" % (path, e))
        return 1
    if check:
        if new != old:
            sys.stderr.write(
                "%s is stale: run `python -m modbridge.firmware_host.specgen`\n" % path
            )
            return 1
        return 0
    if new != old:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(new)
        os.replace(path + ".tmp", path)
        print("rewrote %s" % path)
    else:
        print("%s is up to date" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
