"""JSON lines (protocol.jsonl): fixed-point text, escaping, encode/decode, rejections."""

import json

from mpcompat import IS_MICROPYTHON, raises
from protocol_samples import same_message, valid_field_sets

from protocol import catalog as C
from protocol import jsonl
from protocol.errors import CBORDecodeError, FieldError, UnknownTypeError, VersionError

DUAL = True


def _scaled_fields():
    """(message name, field def) of every field shown in display units."""
    out = []
    for mdef in C.MESSAGES:
        for fdef in mdef[C.M_FIELDS]:
            if fdef[C.F_KIND] != C.K_ENUM and fdef[C.F_SCALE] is not None:
                out.append((mdef[C.M_NAME], fdef))
    return out


def _round_trip(v, scale):
    text = jsonl.format_fixed(v, scale)
    return jsonl.parse_fixed(json.loads(text), scale, "x"), text


# --------------------------------------------------------------------------- fixed point


def test_format_fixed_examples():
    cases = (
        (72300, C.MILLI, "72.3"),
        (0, C.MILLI, "0"),
        (1, C.MILLI, "0.001"),
        (-1, C.MILLI, "-0.001"),
        (10, C.MILLI, "0.01"),
        (12345, C.MILLI, "12.345"),
        (-55000, C.MILLI, "-55"),
        (200000, C.MILLI, "200"),
        (11920, C.MILLI, "11.92"),
        (-100000, C.MILLI, "-100"),
        (4000000, C.MILLI, "4000"),
        (0, C.DUTY_PCT, "0"),
        (1, C.DUTY_PCT, "0.002"),
        (32768, C.DUTY_PCT, "50.001"),
        (32767, C.DUTY_PCT, "49.999"),
        (65535, C.DUTY_PCT, "100"),
        (655, C.DUTY_PCT, "0.999"),
        (1000000, C.GAIN, "1000"),
        (1500, C.GAIN, "1.5"),
    )
    for v, scale, want in cases:
        got = jsonl.format_fixed(v, scale)
        assert got == want, (v, scale, got, want)


def test_mul_div_round():
    assert jsonl.mul_div_round(30000, 100000, 65535) == 45777
    # against exact integer arithmetic, half up
    for v in (0, 1, 2, 327, 32767, 32768, 65534, 65535):
        exact = (v * 100000 * 2 + 65535) // (2 * 65535)
        assert jsonl.mul_div_round(v, 100000, 65535) == exact, v
    assert jsonl.mul_div_round(5, 1, 2) == 3  # 2.5 rounds up
    assert jsonl.mul_div_round(7, 1, 1) == 7


def test_duty_round_trip_lossless():
    # every duty value survives wire -> text -> wire
    v = 0
    while v <= C.DUTY_MAX:
        got, text = _round_trip(v, C.DUTY_PCT)
        assert got == v, (v, text, got)
        v += 1


def test_scaled_fields_round_trip_endpoints_and_sweep():
    fields = _scaled_fields()
    assert len(fields) >= 20
    points = 600 if IS_MICROPYTHON else 6000
    checked = 0
    for name, fdef in fields:
        lo, hi, scale = fdef[C.F_LO], fdef[C.F_HI], fdef[C.F_SCALE]
        values = [lo, lo + 1, hi - 1, hi, (lo + hi) // 2]
        if lo < 0 < hi:
            values += [-1, 0, 1, -999, -1000, -1001]
        step = max(1, (hi - lo) // points)
        values += list(range(lo, hi + 1, step))
        for v in values:
            got, text = _round_trip(v, scale)
            assert got == v, (name, fdef[C.F_NAME], v, text, got)
            checked += 1
    assert checked > 20 * points


def test_negative_values_and_no_negative_zero():
    for scale in (C.MILLI, C.DUTY_PCT, C.GAIN):
        for v in range(-2000, 1):
            text = jsonl.format_fixed(v, scale)
            assert text != "-0" and not text.startswith("-0") or text.startswith("-0."), (v, text)
            if v < 0:
                assert text[0] == "-" and json.loads(text) < 0, (v, text)
            else:
                assert text == "0"
    # text is a plain JSON number: no trailing zeros or dot, no leading zeros
    for v in (-10, -100, -1000, -10000, -1010, 10, 100, 1000, 1010, 100100):
        text = jsonl.format_fixed(v, C.MILLI)
        assert not text.endswith(".") and not ("." in text and text.endswith("0")), text
        assert text.lstrip("-")[0] != "0" or text.lstrip("-")[:2] == "0." or text == "0", text


def test_parse_fixed():
    assert jsonl.parse_fixed(72.3, C.MILLI, "t") == 72300
    assert jsonl.parse_fixed(-72.3, C.MILLI, "t") == -72300
    assert jsonl.parse_fixed(72, C.MILLI, "t") == 72000
    assert jsonl.parse_fixed(0.0004, C.MILLI, "t") == 0
    assert jsonl.parse_fixed(0.0006, C.MILLI, "t") == 1
    assert jsonl.parse_fixed(-0.0006, C.MILLI, "t") == -1  # half away from zero, symmetric
    assert jsonl.parse_fixed(-0.0004, C.MILLI, "t") == 0
    assert jsonl.parse_fixed(100, C.DUTY_PCT, "d") == 65535
    assert jsonl.parse_fixed(50, C.DUTY_PCT, "d") == 32768  # 32767.5 rounds up
    assert jsonl.parse_fixed(0, C.DUTY_PCT, "d") == 0


def test_parse_fixed_rejects():
    for value in (
        float("nan"),
        float("inf"),
        -float("inf"),
        json.loads("1e400"),
        json.loads("-1e400"),
    ):
        with raises(FieldError) as e:
            jsonl.parse_fixed(value, C.MILLI, "t")
        assert e.value.code == C.ERR_OUT_OF_RANGE and e.value.field == "t"
    for value in (True, False, "1", None, [1], {"a": 1}):
        with raises(FieldError) as e:
            jsonl.parse_fixed(value, C.MILLI, "t")
        assert e.value.code == C.ERR_BAD_TYPE
    for value in (1e20, -1e20, 10**30):
        with raises(FieldError) as e:
            jsonl.parse_fixed(value, C.MILLI, "t")
        assert e.value.code == C.ERR_OUT_OF_RANGE


# --------------------------------------------------------------------------- escaping

# (text, what CPython's json.dumps(text) gives with ensure_ascii=True)
ESCAPES = (
    ("", '""'),
    ("plain", '"plain"'),
    ('a"b\\c', '"a\\"b\\\\c"'),
    ("\n\r\t\b\f", '"\\n\\r\\t\\b\\f"'),
    ("\x00\x01\x1f", '"\\u0000\\u0001\\u001f"'),
    ("\x7f", '"\\u007f"'),
    ("/", '"/"'),
    ("'<script>'", "\"'<script>'\""),
    ("\u00fc", '"\\u00fc"'),
    ("\u00e9\x80\xff", '"\\u00e9\\u0080\\u00ff"'),
    ("\u6c34", '"\\u6c34"'),
    ("\u2028\u2029", '"\\u2028\\u2029"'),
    ("\uffff", '"\\uffff"'),
    (chr(0x1F600), '"\\ud83d\\ude00"'),
    (chr(0x10000), '"\\ud800\\udc00"'),
    (chr(0x10FFFF), '"\\udbff\\udfff"'),
    ("72.3 \u00b0C", '"72.3 \\u00b0C"'),
)


def test_escape_matches_json_dumps():
    for text, want in ESCAPES:
        got = jsonl._escape(text)
        assert got == want, (text, got, want)
        if not IS_MICROPYTHON:
            assert json.dumps(text) == want, text
        # and it reads back; MicroPython's json leaves a \ud83d\ude00 pair as two
        # surrogates instead of joining it, a limitation of its json module
        if not (IS_MICROPYTHON and text and ord(text[0]) > 0xFFFF):
            assert json.loads(got) == text, text


def test_escape_every_bmp_class():
    # a sweep of code points: the output is ASCII and reads back to the same text
    cp = 0
    while cp < 0x10000:
        if not 0xD800 <= cp < 0xE000:
            s = "a" + chr(cp) + "z"
            out = jsonl._escape(s)
            assert max([ord(c) for c in out]) < 0x7F, cp
            assert json.loads(out) == s, cp
            if not IS_MICROPYTHON:
                assert out == json.dumps(s), cp
        cp += 7 if cp > 0x100 else 1


def test_dump_value():
    assert jsonl.dump_value({"b": [1, 2.5, None], "a": True}) == '{"a":true,"b":[1,2.5,null]}'
    assert jsonl.dump_value(b"\x01\xff") == '"01ff"'
    assert jsonl.dump_value(False) == "false"
    assert jsonl.dump_value(-3) == "-3"
    for bad in (float("nan"), float("inf"), object()):
        with raises(ValueError):
            jsonl.dump_value(bad)


# --------------------------------------------------------------------------- lines


def test_docstring_line():
    line = jsonl.encode_line(
        "telemetry",
        {"state": C.STATE_HOSTED, "temp_gpu": 72300, "fan1_rpm": 2850, "v_in": 11920},
        7,
    )
    want = (
        b'{"type":"telemetry","v":"1.0","seq":7,"state":"HOSTED","temp_gpu":72.3,'
        b'"fan1_rpm":2850,"v_in":11.92}\n'
    )
    assert line == want, line


def test_encode_line_fields_in_catalog_order():
    # the dict's order does not matter (MicroPython dicts are unordered anyway)
    a = {"v_in": 11920, "state": 1, "temp_gpu": 72300}
    b = {"temp_gpu": 72300, "state": 1, "v_in": 11920}
    assert jsonl.encode_line("telemetry", a, 1) == jsonl.encode_line("telemetry", b, 1)


def test_encode_decode_every_message():
    count = 0
    for mdef in C.MESSAGES:
        for fields in valid_field_sets(mdef):
            seq = (count * 131) & 0xFFFF
            line = jsonl.encode_line(mdef[C.M_NAME], fields, seq)
            assert line.endswith(b"\n") and line.count(b"\n") == 1
            assert max(line) < 0x7F
            obj = json.loads(line)
            assert obj["type"] == mdef[C.M_NAME] and obj["v"] == "1.0" and obj["seq"] == seq
            msg = jsonl.decode_line(line[:-1])
            assert msg.ok and msg.fmt == "json"
            assert msg.type == mdef[C.M_TYPE] and msg.seq == seq
            assert msg.fields == fields, (mdef[C.M_NAME], msg.fields, fields)
            # str input works too
            assert same_message(jsonl.decode_line(line.decode()), msg)
            count += 1
    assert count == 4 * len(C.MESSAGES)


def test_encode_line_validates():
    with raises(FieldError) as e:
        jsonl.encode_line("fan_mode", {})
    assert e.value.code == C.ERR_MISSING_FIELD
    with raises(FieldError) as e:
        jsonl.encode_line("fan_mode", {"mode": 0, "bogus": 1})
    assert e.value.field == "bogus"
    with raises(FieldError) as e:
        jsonl.encode_line("fan_mode", {"mode": 0, "duty1": 70000})
    assert e.value.code == C.ERR_OUT_OF_RANGE
    with raises(UnknownTypeError):
        jsonl.encode_line("nope", {})


def test_enum_by_name_any_case_and_number():
    for text in ('"HOSTED"', '"hosted"', '"Hosted"', "1"):
        msg = jsonl.decode_line('{"type":"telemetry","state":' + text + "}")
        assert msg.fields == {"state": C.STATE_HOSTED}, text
    msg = jsonl.decode_line('{"type":"nack","ref":1,"ref_type":2,"code":"OUT_OF_RANGE"}')
    assert msg.fields["code"] == C.ERR_OUT_OF_RANGE
    # unknown name, number out of range, wrong type
    with raises(FieldError) as e:
        jsonl.decode_line('{"type":"telemetry","state":"sleeping"}')
    assert e.value.code == C.ERR_OUT_OF_RANGE and e.value.field == "state"
    with raises(FieldError) as e:
        jsonl.decode_line('{"type":"telemetry","state":256}')
    assert e.value.code == C.ERR_OUT_OF_RANGE
    for bad in ("true", "1.0", "null", "[1]"):
        with raises(FieldError) as e:
            jsonl.decode_line('{"type":"telemetry","state":' + bad + "}")
        assert e.value.code == C.ERR_BAD_TYPE, bad
    # an enum number without a name is written as a number
    assert b'"state":200' in jsonl.encode_line("telemetry", {"state": 200})


def test_header_defaults_and_version():
    msg = jsonl.decode_line('{"type":"reboot"}')
    assert msg.seq == 0 and msg.minor == 0 and msg.name == "reboot"
    msg = jsonl.decode_line('{"type":"reboot","v":"1.7","seq":65535}')
    assert msg.minor == 7 and msg.seq == 65535
    assert jsonl.decode_line('{"type":"reboot","v":1}').minor == 0
    assert jsonl.decode_line('{"type":96}').name == "reboot"  # type id as number
    for v in ('"2.0"', '"0.9"', "2"):
        with raises(VersionError) as e:
            jsonl.decode_line('{"type":"reboot","v":' + v + ',"seq":9}')
        assert e.value.seq == 9 and e.value.major != 1, v
    for v in ('"x"', '"1.x"', "true", "1.0", "null"):
        with raises(FieldError) as e:
            jsonl.decode_line('{"type":"reboot","v":' + v + "}")
        assert e.value.code == C.ERR_BAD_TYPE and e.value.field == "v", v


def test_decode_line_rejects_non_json_and_non_objects():
    for line in (b"", b"hello", b"{", b'{"type":"reboot"', b"{'type':'reboot'}", b"\xff\xfe"):
        with raises(CBORDecodeError):
            jsonl.decode_line(line)
    for line in (b"[1,2]", b'"reboot"', b"42", b"null"):
        with raises(CBORDecodeError) as e:
            jsonl.decode_line(line)
        assert "object" in str(e.value)


def test_decode_line_missing_or_unknown_type():
    for line in ('{"seq":1}', '{"type":null}', '{"type":true}', '{"type":["reboot"]}'):
        with raises(FieldError) as e:
            jsonl.decode_line(line)
        assert e.value.code == C.ERR_MISSING_FIELD and e.value.field == "type", line
    with raises(UnknownTypeError) as e:
        jsonl.decode_line('{"type":"warp_drive","seq":4}')
    assert e.value.seq == 4
    with raises(UnknownTypeError):
        jsonl.decode_line('{"type":255}')


def test_decode_line_bad_seq():
    for seq in ("-1", "65536", '"1"', "true", "1.5", "null", "[]"):
        with raises(FieldError) as e:
            jsonl.decode_line('{"type":"reboot","seq":' + seq + "}")
        assert e.value.code == C.ERR_BAD_TYPE and e.value.field == "seq", seq


def test_decode_line_rejects_non_finite_scaled_values():
    # numbers far out of a field's range but within what JSON lines carry: the field
    # check refuses them
    for value in ("1e20", "-1e30", "9.9e37"):
        with raises(FieldError) as e:
            jsonl.decode_line('{"type":"heartbeat","gpu_temp":' + value + "}")
        assert e.value.code == C.ERR_OUT_OF_RANGE, value
        assert e.value.field == "gpu_temp"
    # beyond 1e38 (infinity on a single-precision board), and NaN/Infinity, which
    # are not JSON: the strict parser refuses the line on both interpreters
    for value in ("1e400", "-1e400", "1e300", "1e38", "NaN", "Infinity", "-Infinity"):
        with raises(CBORDecodeError):
            jsonl.decode_line('{"type":"heartbeat","gpu_temp":' + value + "}")


def test_decode_line_bool_where_number_expected():
    for line in (
        '{"type":"heartbeat","gpu_temp":true}',  # scaled
        '{"type":"heartbeat","host_time":true}',  # plain uint
        '{"type":"event","code":1,"severity":0,"index":false}',  # int
        '{"type":"fan_mode","mode":"auto","duty1":false}',  # duty
    ):
        with raises(FieldError) as e:
            jsonl.decode_line(line)
        assert e.value.code == C.ERR_BAD_TYPE, line


def test_decode_line_direction_unknown_keys_and_ranges():
    with raises(FieldError) as e:
        jsonl.decode_line('{"type":"telemetry","state":1,"seq":3}', accept=C.H2D)
    assert e.value.code == C.ERR_DIRECTION and e.value.seq == 3 and e.value.type_id == C.T_TELEMETRY
    assert jsonl.decode_line('{"type":"telemetry","state":1}', accept=C.D2H).ok
    # unknown keys are ignored (newer minor versions add fields)
    msg = jsonl.decode_line('{"type":"ack","ref":1,"ref_type":2,"future":{"x":[1]}}')
    assert msg.fields == {"ref": 1, "ref_type": 2}
    # display-unit range checks happen on the wire value
    with raises(FieldError) as e:
        jsonl.decode_line('{"type":"heartbeat","gpu_temp":200.001}')
    assert e.value.code == C.ERR_OUT_OF_RANGE
    assert jsonl.decode_line('{"type":"heartbeat","gpu_temp":200}').fields == {"gpu_temp": 200000}
    with raises(FieldError) as e:
        jsonl.decode_line('{"type":"fan_mode","mode":"manual","duty1":100.001}')
    assert e.value.code == C.ERR_OUT_OF_RANGE


def test_header_keys_never_collide_with_fields():
    assert jsonl.HEADER_KEYS == ("type", "v", "seq", "link", "ts", "sig")
    for mdef in C.MESSAGES:
        for fdef in mdef[C.M_FIELDS]:
            assert fdef[C.F_NAME] not in jsonl.HEADER_KEYS, (mdef[C.M_NAME], fdef[C.F_NAME])
