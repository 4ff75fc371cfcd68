"""Generate protocol/vectors/v1.json: golden vectors for protocol v1 (CPython only).

    python protocol/vectors/generate.py            # rewrite protocol/vectors/v1.json
    python protocol/vectors/generate.py --out DIR  # write DIR/v1.json instead

Host-side tooling: the firmware never imports it. Every payload is cross-checked with
the ``cbor2`` library (decodes to the same map; canonical ``cbor2`` encoding gives the
same bytes) before anything is written. The output is deterministic: same catalog,
same bytes (sorted keys, ASCII, no floats anywhere).

``vectors``: one entry per good message::

    {"name", "message", "type", "seq", "fields", "cbor_hex", "json_line"}

``fields`` are wire values (fixed-point ints, enums as numbers; a byte string is
``{"hex": "..."}``), ``cbor_hex`` is the
complete frame (COBS plus the 0x00 delimiter), ``json_line`` the JSON line with its
newline. ``bad``: ``{"name", "hex", "expect_kind"}``; fed to a fresh StreamDecoder
the bytes give exactly one BadFrame of that kind.
"""

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import cbor2  # noqa: E402 - after the path fix above

from protocol import VERSION_MAJOR, VERSION_MINOR, cbor, cobs, jsonl  # noqa: E402
from protocol import catalog as C  # noqa: E402
from protocol.crc import crc16  # noqa: E402
from protocol.frame import HEADER_LEN, MAX_FRAME, MAX_LINE, StreamDecoder, decode_frame  # noqa: E402
from protocol.frame import encode_frame  # noqa: E402

FILENAME = "v1.json"
HERE = os.path.dirname(os.path.abspath(__file__))

# (vector name, message, seq, wire fields). Realistic values; every message at least once.
GOOD = (
    (
        "hello_full",
        "hello",
        0,
        {
            "fw_version": "1.0.0",
            "proto_minor": 0,
            "board": "pyboard_v11",
            "uid": "3a0041000c51353432383931",
            "channels": ["gpu", "vram", "mos", "amb"],
            "fans": 2,
            "max_frame": 512,
            "telemetry_ms": 500,
            "state": C.STATE_BOOT,
            "nonce": bytes.fromhex("a1b2c3d4e5f60718"),
            "paired": True,
        },
    ),
    (
        "hello_required_only",
        "hello",
        1,
        {
            "fw_version": "1.0.0-dev+g1a2b3c",
            "proto_minor": 0,
            "board": "rp2_pico",
            "uid": "e6614c311b7e2a35",
            "channels": [],
            "fans": 0,
            "max_frame": 64,
        },
    ),
    ("hello_request", "hello_request", 2, {}),
    (
        "telemetry_full",
        "telemetry",
        7,
        {
            "uptime_s": 3600,
            "state": C.STATE_HOSTED,
            "reason": C.REASON_HOST_OK,
            "faults": 0,
            "temp_gpu": 72300,
            "temp_vram": 68150,
            "temp_mos": 55020,
            "temp_amb": 24500,
            "fan1_rpm": 2850,
            "fan2_rpm": 2790,
            "fan1_duty": 32768,
            "fan2_duty": 30000,
            "v_in": 11920,
            "i_in": 1534,
            "p_in": 18285,
            "target": -2700,
            "flash_writes": 12,
            "auth_failures": 0,
            "internal_errors": 0,
        },
    ),
    ("telemetry_state_only", "telemetry", 0, {"state": C.STATE_BOOT}),
    (
        "telemetry_sensor_faulted",
        "telemetry",
        255,
        {
            # the faulted GPU NTC is absent, never a made-up value
            "uptime_s": 86400,
            "state": C.STATE_FAILSAFE,
            "reason": C.REASON_SENSOR_OPEN,
            "faults": C.FAULT_NTC_GPU | C.FAULT_POWER_MONITOR,
            "temp_vram": 81000,
            "temp_mos": 64000,
            "temp_amb": 31000,
            "fan1_rpm": 4100,
            "fan2_rpm": 4050,
            "fan1_duty": 65535,
            "fan2_duty": 65535,
        },
    ),
    (
        "telemetry_negative",
        "telemetry",
        256,
        {
            "uptime_s": 12,
            "state": C.STATE_STANDALONE,
            "reason": C.REASON_HOST_TIMEOUT,
            "faults": C.FAULT_HOST_TIMEOUT,
            "temp_gpu": -1,
            "temp_vram": -55000,
            "temp_mos": -999,
            "temp_amb": -12500,
            "fan1_duty": 0,
            "fan2_duty": 1,
            "v_in": 0,
            "i_in": -250,
            "p_in": 0,
            "target": -15000,
        },
    ),
    (
        "telemetry_extremes",
        "telemetry",
        65535,
        {
            "uptime_s": 0xFFFFFFFF,
            "state": C.STATE_MANUAL,
            "reason": 200,
            "faults": 0x7FF,
            "temp_gpu": 200000,
            "temp_vram": 23,
            "temp_mos": 24,
            "temp_amb": 256,
            "fan1_rpm": 100000,
            "fan2_rpm": 0,
            "fan1_duty": 65534,
            "fan2_duty": 6553,
            "v_in": 40000,
            "i_in": 100000,
            "p_in": 4000000,
            "target": 200000,
        },
    ),
    (
        "event_critical",
        "event",
        300,
        {
            "code": C.REASON_CRITICAL_TEMP,
            "severity": C.SEV_CRITICAL,
            "active": True,
            "state": C.STATE_FAILSAFE,
            "prev_state": C.STATE_HOSTED,
            "index": 0,
            "value": 98500,
            "text": 'GPU 98.5 \u00b0C > 95 \u00b0C "crit"',
            "uptime_s": 7200,
        },
    ),
    (
        "event_cleared",
        "event",
        301,
        {
            "code": C.REASON_CLEARED,
            "severity": C.SEV_INFO,
            "active": False,
            "index": -1,
            "value": C.REASON_CRITICAL_TEMP,
        },
    ),
    (
        "event_unnamed_code",
        "event",
        302,
        {
            "code": 200,
            "severity": C.SEV_WARNING,
            "value": -2147483648,
            "text": "",
        },
    ),
    (
        "cal_raw",
        "cal_raw",
        17,
        {
            "ref": 16,
            "channel": 0,
            "samples": 64,
            "raw_mean_x16": 524296,
            "raw_min": 32700,
            "raw_max": 32841,
            "ohms": 10012,
            "temp": 24970,
        },
    ),
    (
        "config",
        "config",
        6,
        {
            "ref": 5,
            "version": 1,
            "values": {
                "fan.min_duty": 6553,
                "hb.timeout_ms": 3000,
                "board": "pyboard_v11",
                "failsafe.enabled": True,
                "curve": [[30000, 13107], [80000, 65535]],
                "sp": {"gpu": 70000, "vram": 80000},
            },
        },
    ),
    ("ack", "ack", 9, {"ref": 65535, "ref_type": C.T_SETPOINTS}),
    (
        "nack",
        "nack",
        10,
        {
            "ref": 12,
            "ref_type": C.T_FAN_MODE,
            "code": C.ERR_OUT_OF_RANGE,
            "field": "duty1",
            "text": "duty1=70000 outside 0..65535",
        },
    ),
    ("nack_minimal", "nack", 11, {"ref": 0, "ref_type": 0, "code": C.ERR_MALFORMED}),
    (
        "heartbeat",
        "heartbeat",
        1000,
        {
            "gpu_temp": 71000,
            "gpu_power": 215500,
            "power_limit": 320000,
            "host_time": 1718000000,
            "gpu_mem_temp": 80000,
            "period_ms": 1000,
        },
    ),
    ("heartbeat_empty", "heartbeat", 1001, {}),
    (
        "heartbeat_slowdown",
        "heartbeat",
        1002,
        {"gpu_temp": 71000, "gpu_power": 300000, "gpu_slowdown": 83000},
    ),
    ("fan_mode_manual", "fan_mode", 20, {"mode": 1, "duty1": 32768, "duty2": 19661}),
    ("fan_mode_auto", "fan_mode", 21, {"mode": 0}),
    (
        "setpoints",
        "setpoints",
        22,
        {"sp_gpu": 70000, "sp_vram": 82500, "sp_mos": 95000, "sp_amb": 35000},
    ),
    ("pid_gains", "pid_gains", 23, {"kp": 2500, "ki": 150, "kd": 0, "kff": 120}),
    (
        "fan_curve",
        "fan_curve",
        24,
        {
            "points": [[30000, 13107], [60000, 32768], [85000, 65535]],
            "hysteresis": 2000,
        },
    ),
    ("config_get_all", "config_get", 25, {}),
    ("config_get_section", "config_get", 26, {"section": "fan"}),
    ("config_set", "config_set", 27, {"values": {"fan.min_duty": 9830, "hb.timeout_ms": 5000}}),
    ("config_save", "config_save", 28, {}),
    ("config_reset", "config_reset", 29, {}),
    ("cal_read", "cal_read", 30, {"channel": 1, "samples": 256}),
    # beta model: integer coefficients. The sh model needs floats, left out on purpose.
    (
        "cal_write_beta",
        "cal_write",
        31,
        {
            "channel": 0,
            "model": 1,
            "coeffs": [3950, 10000, 25000],
            "correction": [0, 1],
        },
    ),
    ("reboot", "reboot", 32, {}),
    ("repl", "repl", 33, {}),
    ("selftest", "selftest", 34, {}),
    ("pair", "pair", 35, {"key": bytes(range(32))}),
    (
        "selftest_report_pass",
        "selftest_report",
        35,
        {
            "ref": 34,
            "passed": True,
            "fan1_rpm": [2950, 2240, 1510, 760],
            "fan2_rpm": [2900, 2210, 1490, 740],
            "fans_ok": [True, True],
            "channels_ok": [True, True, True, True],
            "power_monitor_ok": True,
            "v_in": 12010,
            "text": "all parts passed",
        },
    ),
    (
        "selftest_report_fail",
        "selftest_report",
        36,
        {
            "ref": 34,
            "passed": False,
            "fan2_rpm": [0, 0, 0, 0],
            "fans_ok": [True, False],
            "text": "failed: fan2",
        },
    ),
    (
        "autotune_start",
        "autotune",
        40,
        {"action": 0, "amplitude": 13107, "hysteresis": 300, "timeout_s": 1800, "cycles": 3},
    ),
    ("autotune_abort", "autotune", 41, {"action": 1}),
    (
        "autotune_report_running",
        "autotune_report",
        42,
        {
            "ref": 40,
            "status": C.TUNE_RUNNING,
            "cycles": 1,
            "elapsed_s": 61,
            "bias": 30000,
            "relay": 13107,
            "period_ms": 35200,
            "amplitude": 1185,
        },
    ),
    (
        "autotune_report_done",
        "autotune_report",
        43,
        {
            "ref": 40,
            "status": C.TUNE_DONE,
            "cycles": 3,
            "elapsed_s": 128,
            "bias": 30000,
            "relay": 13107,
            "period_ms": 36000,
            "amplitude": 1252,
            "ku": 20702,
            "pu_ms": 35733,
            "kp": 6469,
            "ki": 82,
            "kd": 0,
        },
    ),
    (
        "autotune_report_safety",
        "autotune_report",
        44,
        {"ref": 40, "status": C.TUNE_SAFETY, "cycles": 2, "causes": 16},
    ),
)


def _raw(
    payload, type_id=C.T_TELEMETRY, seq=0x1234, major=VERSION_MAJOR, minor=VERSION_MINOR, crc=None
):
    """Unstuffed frame bytes around any payload; ``crc`` overrides the right one."""
    raw = bytearray([major, minor, type_id, seq >> 8, seq & 0xFF]) + payload
    c = crc16(raw) if crc is None else crc
    return bytes(raw) + bytes([c >> 8, c & 0xFF])


def _stuffed(raw):
    return bytes(cobs.encode(raw)) + b"\x00"


def _jsonable(fields):
    """Byte-string fields as ``{"hex": "..."}`` (JSON has no bytes); readers turn
    them back (tests/test_vectors.py ``_fields``)."""
    out = {}
    for k, v in fields.items():
        out[k] = {"hex": v.hex()} if isinstance(v, (bytes, bytearray)) else v
    return out


def _bad():
    """(name, bytes, expected kind), each giving exactly one BadFrame."""
    good = _raw(b"\xa1\x01\x01")  # telemetry {state: HOSTED}
    right = crc16(good, 0, len(good) - 2)
    return (
        ("crc_mismatch", _stuffed(_raw(b"\xa1\x01\x01", crc=right ^ 0x0001)), "crc"),
        ("crc_payload_bit_flipped", _stuffed(good[:6] + bytes([good[6] ^ 0x02]) + good[7:]), "crc"),
        ("short_frame", _stuffed(b"\x01\x00\x10\x00"), "framing"),
        ("short_empty_header", b"\x01\x00", "framing"),
        ("cobs_code_past_end", b"\x09\x01\x00", "framing"),
        ("version_major_2", _stuffed(_raw(b"\xa1\x01\x01", major=2)), "version"),
        ("version_major_0", _stuffed(_raw(b"", type_id=C.T_HELLO_REQUEST, major=0)), "version"),
        ("unknown_type_0x7f", _stuffed(_raw(b"", type_id=0x7F)), "unknown_type"),
        ("unknown_type_0xff", _stuffed(_raw(b"\xa1\x00\x00", type_id=0xFF)), "unknown_type"),
        ("undecodable_tag", _stuffed(_raw(b"\xa1\x01\xc1\x01")), "undecodable"),
        ("undecodable_indefinite_map", _stuffed(_raw(b"\xbf\x01\x01\xff")), "undecodable"),
        (
            "undecodable_huge_length",
            _stuffed(_raw(b"\xa1\x00\x5b\xff\xff\xff\xff\xff\xff\xff\xff")),
            "undecodable",
        ),
        ("undecodable_duplicate_key", _stuffed(_raw(b"\xa2\x01\x01\x01\x02")), "undecodable"),
        (
            "undecodable_deep_nesting",
            _stuffed(_raw(b"\xa1\x01" + b"\x81" * 20 + b"\x00")),
            "undecodable",
        ),
        ("undecodable_not_a_map", _stuffed(_raw(b"\x82\x01\x01")), "undecodable"),
        ("undecodable_trailing_byte", _stuffed(_raw(b"\xa1\x01\x01\x00")), "undecodable"),
        (
            "undecodable_bad_utf8",
            _stuffed(_raw(b"\xa1\x00\x62\xc3\x28", type_id=C.T_FAN_MODE)),
            "undecodable",
        ),
        ("invalid_missing_required", _stuffed(_raw(b"\xa1\x00\x01")), "invalid"),
        (
            "invalid_out_of_range",
            _stuffed(_raw(b"\xa2\x01\x01\x04\x1a\x00\x0f\x42\x40")),
            "invalid",
        ),
        ("invalid_wrong_type", _stuffed(_raw(b"\xa1\x01\x61\x31")), "invalid"),
        ("invalid_negative_uint", _stuffed(_raw(b"\xa2\x00\x20\x01\x01")), "invalid"),
        ("oversize_binary", b"\x05\x01" + b"\x41" * 600 + b"\x00", "oversize"),
        ("oversize_decoded", b"\x02\x01" * 257 + b"\x00", "oversize"),
        ("oversize_text_line", b'{"type":"' + b"a" * MAX_LINE + b'"}\n', "oversize"),
        ("noise_text_line", b"MicroPython v1.28.0 on pyboard\r\n", "noise"),
        ("json_undecodable", b'{"type":"reboot",\n', "undecodable"),
        ("json_version", b'{"type":"reboot","v":"2.0","seq":1}\n', "version"),
        ("json_unknown_type", b'{"type":"self_destruct","seq":1}\n', "unknown_type"),
        ("json_invalid_field", b'{"type":"fan_mode","mode":"manual","duty1":101}\n', "invalid"),
        ("json_missing_type", b'{"seq":1}\n', "invalid"),
    )


def _cross_check(name, mdef, fields, frame):
    """Decode ``frame`` by hand and compare the payload with what cbor2 says."""
    raw = bytes(cobs.decode(frame[:-1]))
    payload = raw[HEADER_LEN:-2]
    keyed = {}
    for fdef in mdef[C.M_FIELDS]:
        if fdef[C.F_NAME] in fields:
            keyed[fdef[C.F_KEY]] = fields[fdef[C.F_NAME]]
    if not keyed:
        if payload:
            raise SystemExit("%s: empty message has a payload" % name)
        return
    if cbor2.loads(payload) != keyed:
        raise SystemExit("%s: cbor2 decodes the payload to %r" % (name, cbor2.loads(payload)))
    if cbor2.dumps(keyed, canonical=True) != payload:
        raise SystemExit(
            "%s: cbor2 canonical encoding differs: %s vs %s"
            % (name, cbor2.dumps(keyed, canonical=True).hex(), payload.hex())
        )
    if cbor.loads(payload) != keyed:
        raise SystemExit("%s: protocol.cbor does not read its own payload back" % name)


def build():
    """The vector document as a dict (also used by tests/test_vectors_fresh.py)."""
    vectors = []
    seen = set()
    for name, message, seq, fields in GOOD:
        mdef = C.by_name(message)
        frame = encode_frame(message, fields, seq)
        if len(frame) > cobs.max_encoded_len(MAX_FRAME) + 1:
            raise SystemExit("%s: frame too long" % name)
        _cross_check(name, mdef, fields, frame)
        msg = decode_frame(frame)
        if msg.fields != fields or msg.seq != seq:
            raise SystemExit("%s: decode_frame gives %r" % (name, msg))
        line = jsonl.encode_line(message, fields, seq)
        back = jsonl.decode_line(line[:-1])
        if back.fields != fields or back.seq != seq:
            raise SystemExit("%s: decode_line gives %r" % (name, back))
        seen.add(message)
        vectors.append(
            {
                "name": name,
                "message": message,
                "type": mdef[C.M_TYPE],
                "seq": seq,
                "fields": _jsonable(fields),
                "cbor_hex": frame.hex(),
                "json_line": line.decode("ascii"),
            }
        )
    missing = [m[C.M_NAME] for m in C.MESSAGES if m[C.M_NAME] not in seen]
    if missing:
        raise SystemExit("no vector for: %s" % ", ".join(missing))
    bad = []
    for name, data, kind in _bad():
        got = StreamDecoder().feed(data)
        if len(got) != 1 or got[0].ok or got[0].kind != kind:
            raise SystemExit("bad vector %s: expected one %s, got %r" % (name, kind, got))
        bad.append({"name": name, "hex": data.hex(), "expect_kind": kind})
    return {
        "protocol": "%d.%d" % (VERSION_MAJOR, VERSION_MINOR),
        "generator": "protocol/vectors/generate.py",
        "vectors": vectors,
        "bad": bad,
    }


def render(doc):
    """Deterministic text of the document."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def _reject_floats(obj, where="vectors"):
    if isinstance(obj, float):
        raise SystemExit("%s: floats are not allowed in vectors" % where)
    if isinstance(obj, dict):
        for k, v in obj.items():
            _reject_floats(v, "%s.%s" % (where, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _reject_floats(v, "%s[%d]" % (where, i))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=HERE, help="directory to write %s into" % FILENAME)
    args = parser.parse_args(argv)
    doc = build()
    _reject_floats(doc)
    path = os.path.join(args.out, FILENAME)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(render(doc))
    print("wrote %s: %d vectors, %d bad" % (path, len(doc["vectors"]), len(doc["bad"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
