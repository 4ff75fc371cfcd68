"""Binary frames (protocol.frame, protocol.message): encode/decode, validation, and
the resynchronising StreamDecoder."""

from mpcompat import raises
from protocol_samples import (
    XorShift32,
    bad_type_value,
    field_values,
    raw_frame,
    same_message,
    valid_field_sets,
)

from protocol import VERSION_MAJOR, VERSION_MINOR, cbor, cobs, jsonl
from protocol import catalog as C
from protocol import frame as F
from protocol.errors import (
    CBORDecodeError,
    CRCError,
    FieldError,
    FrameError,
    OversizeError,
    ProtocolError,
    UnknownTypeError,
    VersionError,
)
from protocol.message import BadFrame, Message

DUAL = True


def _all_valid():
    """(mdef, fields) for every message and every representative field set."""
    out = []
    for mdef in C.MESSAGES:
        for fields in valid_field_sets(mdef):
            out.append((mdef, fields))
    return out


def _payload(frame_bytes):
    """The unstuffed frame (header + payload + CRC) of an encoded frame."""
    return bytes(cobs.decode(frame_bytes[:-1]))


def _keyed(mdef, fields):
    d = {}
    for fdef in mdef[C.M_FIELDS]:
        if fdef[C.F_NAME] in fields:
            d[fdef[C.F_KEY]] = fields[fdef[C.F_NAME]]
    return d


# --------------------------------------------------------------------------- encoding


def test_round_trip_every_message():
    seq = 0
    count = 0
    for mdef, fields in _all_valid():
        seq = (seq * 7 + 12345) & 0xFFFF
        data = F.encode_frame(mdef[C.M_NAME], fields, seq)
        assert data[-1] == 0 and b"\x00" not in data[:-1], mdef[C.M_NAME]
        msg = F.decode_frame(data)
        assert msg.ok
        assert msg.type == mdef[C.M_TYPE] and msg.name == mdef[C.M_NAME], msg
        assert msg.seq == seq
        assert msg.fields == fields, (mdef[C.M_NAME], msg.fields, fields)
        assert msg.minor == VERSION_MINOR and msg.fmt == "cbor"
        # by type id as well as by name, and without the delimiter
        assert F.encode_frame(mdef[C.M_TYPE], fields, seq) == data
        assert same_message(F.decode_frame(data[:-1]), msg)
        count += 1
    assert count == 4 * len(C.MESSAGES)


def test_frame_layout():
    data = F.encode_frame("ack", {"ref": 0x1234, "ref_type": C.T_FAN_MODE}, seq=0xBEEF)
    raw = _payload(data)
    assert raw[0] == VERSION_MAJOR and raw[1] == VERSION_MINOR
    assert raw[2] == C.T_ACK
    assert raw[3] == 0xBE and raw[4] == 0xEF
    assert raw[5:-2] == cbor.dumps({0: 0x1234, 1: C.T_FAN_MODE})
    from protocol.crc import crc16

    assert (raw[-2] << 8) | raw[-1] == crc16(raw[:-2])
    # a message without fields has no payload at all
    raw = _payload(F.encode_frame("hello_request", {}, 3))
    assert len(raw) == F.MIN_FRAME == 7


def test_payload_is_map_in_key_order():
    mdef = C.by_name("telemetry")
    fields = valid_field_sets(mdef)[2]
    raw = _payload(F.encode_frame("telemetry", fields, 1))
    # keys 0..15 are one-byte heads: the payload is map head + key/value pairs in order
    assert raw[5:-2] == cbor.dumps(_keyed(mdef, fields))
    pos = 5 + cbor.head_len(len(fields))
    keys = []
    while pos < len(raw) - 2:
        k, pos = cbor.decode_from(raw, pos, len(raw) - 2)
        _, pos = cbor.decode_from(raw, pos, len(raw) - 2)
        keys.append(k)
    assert keys == list(range(len(mdef[C.M_FIELDS])))


def test_missing_required_field():
    checked = 0
    for mdef in C.MESSAGES:
        full = valid_field_sets(mdef)[0]
        for fdef in mdef[C.M_FIELDS]:
            if not fdef[C.F_REQUIRED]:
                continue
            name = fdef[C.F_NAME]
            fields = dict(full)
            del fields[name]
            with raises(FieldError) as e:
                F.encode_frame(mdef[C.M_NAME], fields)
            assert e.value.code == C.ERR_MISSING_FIELD and e.value.field == name
            # and the same on decode, for a frame built by hand
            data = raw_frame(mdef[C.M_TYPE], cbor.dumps(_keyed(mdef, fields)) if fields else b"", 9)
            with raises(FieldError) as e:
                F.decode_frame(data)
            assert e.value.code == C.ERR_MISSING_FIELD and e.value.field == name
            assert e.value.seq == 9 and e.value.type_id == mdef[C.M_TYPE]
            checked += 1
    assert checked >= 20


def test_wrong_type_for_each_kind():
    kinds = {}
    for mdef in C.MESSAGES:
        base = valid_field_sets(mdef)[0]
        for fdef in mdef[C.M_FIELDS]:
            name = fdef[C.F_NAME]
            fields = dict(base)
            fields[name] = bad_type_value(fdef[C.F_KIND])
            with raises(FieldError) as e:
                F.encode_frame(mdef[C.M_NAME], fields)
            assert e.value.code == C.ERR_BAD_TYPE, (mdef[C.M_NAME], name, e.value.code)
            assert e.value.field == name
            data = raw_frame(mdef[C.M_TYPE], cbor.dumps(_keyed(mdef, fields)), 5)
            with raises(FieldError) as e:
                F.decode_frame(data)
            assert e.value.code == C.ERR_BAD_TYPE and e.value.field == name
            kinds[fdef[C.F_KIND]] = True
    # every kind used by the catalog was exercised
    for kind in (C.K_UINT, C.K_INT, C.K_STR, C.K_BOOL, C.K_LIST, C.K_MAP, C.K_ENUM):
        assert kind in kinds, kind


def test_bool_is_not_an_integer_field():
    for value in (True, False):
        with raises(FieldError) as e:
            F.encode_frame("ack", {"ref": value, "ref_type": 1})
        assert e.value.code == C.ERR_BAD_TYPE
    with raises(FieldError) as e:
        F.encode_frame("ack", {"ref": 1.0, "ref_type": 1})
    assert e.value.code == C.ERR_BAD_TYPE


def test_out_of_range():
    checked = 0
    for mdef in C.MESSAGES:
        base = valid_field_sets(mdef)[0]
        for fdef in mdef[C.M_FIELDS]:
            name = fdef[C.F_NAME]
            kind = fdef[C.F_KIND]
            lo, hi = fdef[C.F_LO], fdef[C.F_HI]
            bad = []
            if kind in (C.K_UINT, C.K_INT, C.K_ENUM):
                if lo is not None:
                    bad.append(lo - 1)
                if hi is not None:
                    bad.append(hi + 1)
            elif kind in (C.K_STR, C.K_LIST, C.K_MAP, C.K_BYTES):
                # a valid value of one size too many / too few
                if hi is not None:
                    bad.append(_resize(field_values(fdef)[1], hi + 1))
                if lo is not None and lo > 0:
                    bad.append(_resize(field_values(fdef)[0], lo - 1))
            for value in bad:
                fields = dict(base)
                fields[name] = value
                with raises(FieldError) as e:
                    F.encode_frame(mdef[C.M_NAME], fields)
                assert e.value.code == C.ERR_OUT_OF_RANGE, (mdef[C.M_NAME], name, value)
                data = raw_frame(mdef[C.M_TYPE], cbor.dumps(_keyed(mdef, fields)), 5)
                with raises(FieldError) as e:
                    F.decode_frame(data)
                assert e.value.code == C.ERR_OUT_OF_RANGE and e.value.field == name
                checked += 1
    assert checked > 60


def _resize(value, n):
    if isinstance(value, str):
        return (value + "x" * n)[:n]
    if isinstance(value, list):
        return (value + [[0, 0]] * n)[:n]
    if isinstance(value, dict):
        out = {}
        for i in range(n):
            out["k" + str(i)] = i
        return out
    return (bytes(value) + b"x" * n)[:n]


def test_num_field_must_be_finite():
    # K_NUM is not used by the catalog today; check_value still guards it
    from protocol.message import check_value

    fdef = (0, "x", C.K_NUM, False, None, None, None, "", "")
    check_value(fdef, 1.5)
    check_value(fdef, -3)
    for value in (float("nan"), float("inf")):
        with raises(FieldError) as e:
            check_value(fdef, value)
        assert e.value.code == C.ERR_OUT_OF_RANGE
    with raises(FieldError) as e:
        check_value(fdef, True)
    assert e.value.code == C.ERR_BAD_TYPE


def test_unknown_field_name_refused_on_encode():
    with raises(FieldError) as e:
        F.encode_frame("ack", {"ref": 1, "ref_type": 2, "bogus": 3})
    assert e.value.field == "bogus"


def test_map_field_keys_must_be_text():
    with raises(FieldError) as e:
        F.encode_frame("config_set", {"values": {1: 2}})
    assert e.value.code == C.ERR_BAD_TYPE


def test_unknown_fields_ignored_on_decode():
    # key 99 is from a newer minor version; key 2 of ack too
    payload = cbor.dumps({0: 7, 1: C.T_REBOOT, 2: "new", 99: [1, 2, {"x": 1}]})
    msg = F.decode_frame(raw_frame(C.T_ACK, payload, 44, minor=3))
    assert msg.name == "ack" and msg.seq == 44
    assert msg.fields == {"ref": 7, "ref_type": C.T_REBOOT}
    assert msg.minor == 3


def test_higher_minor_accepted():
    for minor in (1, 7, 127):
        data = F.encode_frame("heartbeat", {"gpu_temp": 50000}, 1, minor=minor)
        msg = F.decode_frame(data)
        assert msg.minor == minor and msg.fields == {"gpu_temp": 50000}
    # bit 7 of byte 1 is the signed flag, not part of the minor: an unsigned frame
    # with it set claims a trailer it does not have
    data = F.encode_frame("heartbeat", {"gpu_temp": 50000}, 1, minor=0xFF)
    with raises((CRCError, FrameError)):
        F.decode_frame(data)


def test_other_major_refused():
    for major in (0, 2, 255):
        data = F.encode_frame("heartbeat", {"gpu_temp": 50000}, 0x1234, major=major, minor=5)
        with raises(VersionError) as e:
            F.decode_frame(data)
        err = e.value
        assert err.major == major and err.minor == 5
        assert err.seq == 0x1234 and err.type_id == C.T_HEARTBEAT
        assert err.kind == "version"
    # the version is checked before the type: an unknown type of another major is a
    # version error
    with raises(VersionError):
        F.decode_frame(raw_frame(0x7F, b"", 1, major=2))


def test_unknown_type():
    for type_id in (0x00, 0x03, 0x7F, 0xFF):
        with raises(UnknownTypeError) as e:
            F.decode_frame(raw_frame(type_id, b"\xa0", 0x0102))
        assert e.value.type_id == type_id and e.value.seq == 0x0102
    with raises(UnknownTypeError):
        F.encode_frame("no_such_message", {})
    with raises(UnknownTypeError):
        F.encode_frame(0x7F, {})


def test_crc_error():
    good = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 3)
    raw = bytearray(_payload(good))
    for pos in range(len(raw)):
        bad = bytearray(raw)
        bad[pos] ^= 0x10
        data = bytes(cobs.encode(bad)) + b"\x00"
        with raises(CRCError):
            F.decode_frame(data)
    with raises(CRCError):
        F.decode_frame(raw_frame(C.T_ACK, b"", crc_xor=1))


def test_short_frame():
    for n in range(F.MIN_FRAME):
        raw = bytes([1, 0, 2, 0, 0, 0, 0])[:n]
        data = bytes(cobs.encode(raw)) + b"\x00"
        with raises(FrameError) as e:
            F.decode_frame(data)
        assert not isinstance(e.value, CRCError), n
        assert "shorter" in str(e.value)


def test_bad_cobs_is_frame_error():
    for data in (b"\x05\x01\x00", b"\x02\x01\x00\x03\x00", b""):
        with raises(FrameError):
            F.decode_frame(data)


def test_bad_payload():
    cases = (
        b"\x83\x01\x02\x03",  # array, not a map
        b"\xa1\x00",  # truncated map
        b"\xa1\x00\x01\x02",  # trailing byte after the map
        b"\x01",  # an int
        b"\xff",  # break
    )
    for payload in cases:
        with raises(CBORDecodeError) as e:
            F.decode_frame(raw_frame(C.T_ACK, payload, 77))
        assert e.value.seq == 77 and e.value.type_id == C.T_ACK, payload
    # an empty map is a valid empty payload
    assert F.decode_frame(raw_frame(C.T_HEARTBEAT, b"\xa0", 1)).fields == {}


def test_accept_direction_filter():
    d2h = F.encode_frame("hello", valid_field_sets(C.by_name("hello"))[0], 5)
    h2d = F.encode_frame("fan_mode", {"mode": 0}, 6)
    assert F.decode_frame(d2h, accept=C.D2H).name == "hello"
    assert F.decode_frame(h2d, accept=C.H2D).name == "fan_mode"
    with raises(FieldError) as e:
        F.decode_frame(d2h, accept=C.H2D)
    assert e.value.code == C.ERR_DIRECTION and e.value.seq == 5 and e.value.type_id == C.T_HELLO
    with raises(FieldError) as e:
        F.decode_frame(h2d, accept=C.D2H)
    assert e.value.code == C.ERR_DIRECTION


def test_oversize_frame_refused_at_encode():
    values = {}
    for i in range(40):
        values["k" + str(i)] = "v" * 20
    with raises(OversizeError):
        F.encode_frame("config_set", {"values": values})
    # just below the limit is fine: find the largest text that fits
    n = 0
    while True:
        try:
            F.encode_frame("config_set", {"values": {"k": "v" * (n + 1)}})
        except OversizeError:
            break
        n += 1
    data = F.encode_frame("config_set", {"values": {"k": "v" * n}})
    assert len(_payload(data)) == F.MAX_FRAME
    assert F.decode_frame(data).fields["values"]["k"] == "v" * n


def test_encode_message_keeps_format():
    msg = F.decode_frame(F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 3))
    assert same_message(F.decode_frame(F.encode_message(msg)), msg)
    jmsg = jsonl.decode_line(b'{"type":"ack","seq":3,"ref":1,"ref_type":2}')
    assert F.encode_message(jmsg) == jsonl.encode_line("ack", {"ref": 1, "ref_type": 2}, 3)
    assert same_message(jmsg, msg)  # equality ignores the format


def test_error_kinds_cover_every_protocol_error():
    for cls in (
        CBORDecodeError,
        CRCError,
        FieldError,
        FrameError,
        OversizeError,
        UnknownTypeError,
        VersionError,
    ):
        assert cls.kind in F.ERROR_KINDS, cls
        assert issubclass(cls, ProtocolError)


# --------------------------------------------------------------------------- stream


def _stream_and_expected():
    """A stream of every valid message (binary and JSON) with the expected items."""
    parts = []
    want = []
    seq = 1
    for mdef, fields in _all_valid():
        seq += 1
        parts.append(F.encode_frame(mdef[C.M_NAME], fields, seq))
        want.append(("cbor", mdef[C.M_TYPE], seq, fields))
        if seq % 3 == 0:
            seq += 1
            parts.append(jsonl.encode_line(mdef[C.M_NAME], fields, seq))
            want.append(("json", mdef[C.M_TYPE], seq, fields))
    return b"".join(parts), want


def _summary(items):
    out = []
    for it in items:
        assert isinstance(it, Message), it
        out.append((it.fmt, it.type, it.seq, it.fields))
    return out


def test_stream_all_at_once():
    data, want = _stream_and_expected()
    dec = F.StreamDecoder()
    got = dec.feed(data)
    assert _summary(got) == want
    assert dec.frames == len(want)
    assert dec.json_lines == len([w for w in want if w[0] == "json"]) > 5
    assert dec.bytes == len(data)
    assert dec.error_total() == 0


def test_stream_byte_by_byte():
    data, want = _stream_and_expected()
    dec = F.StreamDecoder()
    got = []
    for i in range(len(data)):
        got += dec.feed(data[i : i + 1])
    assert _summary(got) == want
    assert dec.bytes == len(data)


def test_stream_random_chunks():
    data, want = _stream_and_expected()
    rng = XorShift32(21)
    for _ in range(5):
        dec = F.StreamDecoder()
        got = []
        i = 0
        while i < len(data):
            n = 1 + rng.below(80)
            chunk = data[i : i + n]
            # the decoder takes bytes, bytearray and memoryview alike
            kind = rng.below(3)
            if kind == 1:
                chunk = bytearray(chunk)
            elif kind == 2:
                chunk = memoryview(chunk)
            got += dec.feed(chunk)
            i += n
        assert _summary(got) == want
        assert dec.error_total() == 0


def test_stream_errors_counted_by_kind():
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 10)
    stream = b"".join(
        [
            raw_frame(C.T_ACK, cbor.dumps({0: 1, 1: 2}), 11, crc_xor=0x55),  # crc
            b"\x05\x01\x02\x00",  # framing: code runs past the end
            raw_frame(C.T_ACK, b"\xa1\x00", 12),  # undecodable payload
            raw_frame(0x7E, b"", 13),  # unknown type
            raw_frame(C.T_ACK, b"", 14, major=2),  # version
            raw_frame(C.T_FAN_MODE, b"\xa1\x01\x00", 15),  # invalid: mode missing
            b"MicroPython v1.28 on pyboard\r\n",  # noise
            b"\x03\x01\x02\x00",  # framing: 2 bytes after COBS, shorter than a header
            ack,
        ]
    )
    dec = F.StreamDecoder()
    items = dec.feed(stream)
    assert dec.errors["crc"] == 1
    assert dec.errors["framing"] == 2
    assert dec.errors["undecodable"] == 1
    assert dec.errors["unknown_type"] == 1
    assert dec.errors["version"] == 1
    assert dec.errors["invalid"] == 1
    assert dec.errors["noise"] == 1
    assert dec.errors["oversize"] == 0
    assert dec.error_total() == 8
    assert dec.frames == 1
    bad = [it for it in items if not it.ok]
    assert len(bad) == 8
    assert same_message(items[-1], F.decode_frame(ack))
    by_kind = {}
    for b in bad:
        assert isinstance(b, BadFrame)
        by_kind[b.kind] = b
    # what a NACK needs: the referenced type and seq where the header was readable
    b = by_kind["invalid"]
    assert (b.type, b.seq, b.code, b.field) == (C.T_FAN_MODE, 15, C.ERR_MISSING_FIELD, "mode")
    b = by_kind["unknown_type"]
    assert (b.type, b.seq, b.code) == (0x7E, 13, C.ERR_UNKNOWN_TYPE)
    b = by_kind["version"]
    assert (b.type, b.seq, b.code) == (C.T_ACK, 14, C.ERR_VERSION)
    b = by_kind["undecodable"]
    assert (b.type, b.seq, b.code) == (C.T_ACK, 12, C.ERR_MALFORMED)
    b = by_kind["crc"]
    assert (b.type, b.seq, b.code) == (0, 0, C.ERR_MALFORMED)  # header not trusted
    assert by_kind["noise"].fmt == "json"


def test_stream_json_errors_carry_header():
    dec = F.StreamDecoder(accept=C.H2D)
    items = dec.feed(
        b'{"type":"fan_mode","seq":21}\n'
        b'{"type":"hello_request","seq":22,"v":"2.0"}\n'
        b'{"type":"bogus","seq":23}\n'
        b'{"type":"telemetry","seq":24,"state":1}\n'
        b'{"type":"fan_mode","seq":25,"mode":"auto","duty1":"x"}\n'
        b"{not json\n"
    )
    assert [it.ok for it in items] == [False] * 6
    m, v, u, d, t, j = items
    assert (m.kind, m.code, m.type, m.seq, m.field) == (
        "invalid",
        C.ERR_MISSING_FIELD,
        C.T_FAN_MODE,
        21,
        "mode",
    )
    assert (v.kind, v.code, v.seq) == ("version", C.ERR_VERSION, 22)
    assert (u.kind, u.code, u.seq) == ("unknown_type", C.ERR_UNKNOWN_TYPE, 23)
    assert (d.kind, d.code, d.type, d.seq) == ("invalid", C.ERR_DIRECTION, C.T_TELEMETRY, 24)
    assert (t.kind, t.code, t.field) == ("invalid", C.ERR_BAD_TYPE, "duty1")
    assert j.kind == "undecodable" and j.fmt == "json"
    assert dec.error_total() == 6 and dec.frames == 0


def test_stream_accept_filter_binary():
    dec = F.StreamDecoder(accept=C.D2H)
    items = dec.feed(
        F.encode_frame("heartbeat", {}, 1) + F.encode_frame("ack", {"ref": 1, "ref_type": 1}, 2)
    )
    assert not items[0].ok and items[0].code == C.ERR_DIRECTION and items[0].seq == 1
    assert items[1].ok and items[1].name == "ack"


def test_stream_mixed_with_blank_lines_crlf_and_noise():
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 1)
    hb = F.encode_frame("heartbeat", {"gpu_temp": 61000}, 2)
    stream = (
        b"\n\n\r\n   \r\n\t\n"
        + ack
        + b"boot: ok\r\n"
        + b'{"type":"fan_mode","mode":"manual","duty1":50,"seq":3}\r\n'
        + b"\n"
        + hb
        + b'  {"type":"config_save","seq":4}  \n'
        + b"\x00\x00\x00"
        + b"=== noise ===\n"
        + ack
    )
    for step in (len(stream), 1, 3, 7):
        dec = F.StreamDecoder()
        items = []
        for i in range(0, len(stream), step):
            items += dec.feed(stream[i : i + step])
        names = [(it.name if it.ok else it.kind) for it in items]
        assert names == ["ack", "noise", "fan_mode", "heartbeat", "config_save", "noise", "ack"], (
            names
        )
        assert items[2].fields == {"mode": 1, "duty1": 32768} and items[2].fmt == "json"
        assert dec.frames == 5 and dec.json_lines == 2
        assert dec.errors["noise"] == 2 and dec.error_total() == 2


def test_stream_text_lines_are_trimmed_of_spaces_and_control_bytes():
    # a Ctrl-C typed before a line, a BEL or ESC after it: trimmed like spaces
    # (SPEC section 8); inside the line they stay, and a JSON error says so
    for junk in (b"", b"\x03", b"\x03 ", b"\r\t\x1b"):
        dec = F.StreamDecoder(accept=C.H2D)
        items = dec.feed(junk + b'{"type":"config_get"}' + b"\x07\x1b \r\n")
        assert [it.name for it in items if it.ok] == ["config_get"], (junk, items)
        assert dec.error_total() == 0
    dec = F.StreamDecoder(accept=C.H2D)
    items = dec.feed(b'{"type":"config_get"\x03}\n')
    assert [it.kind for it in items] == ["undecodable"]
    # DEL (a backspace key) is not a control byte: the line is noise
    items = dec.feed(b'\x7f{"type":"config_get"}\n')
    assert [it.kind for it in items] == ["noise"]


def test_stream_code_byte_newline():
    # minor 1 and a seq without zero bytes push the first 0x00 to raw[9], the value
    # of "reason": the COBS code byte is 0x0A, the same as a newline
    fields = {"state": 1, "reason": 0}
    data = F.encode_frame("telemetry", fields, 0x0101, minor=1)
    assert data[0] == 0x0A
    _expect_decoded_after_text(data, fields)


def test_stream_code_byte_brace():
    # an unknown (newer) field holding text moves the first 0x00 to raw[122]: the
    # COBS code byte is 0x7B, the same as "{" that starts a JSON line
    target = 0x7B
    found = None
    for n in range(24, 200):
        payload = b"\xa2\x01\x01\x18\x63" + cbor.dumps("x" * n)  # {1: 1, 99: "xx..."}
        data = raw_frame(C.T_TELEMETRY, payload, 0x0101, minor=1)
        if data[0] == target:
            found = data
            break
    assert found is not None
    _expect_decoded_after_text(found, {"state": 1})


def _expect_decoded_after_text(data, fields):
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 1)
    prefixes = (
        b"",
        b"\n",
        b"\n\n",
        b"\n\x00",
        b"\r\n",
        b" \r\n\n",
        b'{"type":"config_save"}\n',
        ack,
    )
    for prefix in prefixes:
        for step in (len(prefix) + len(data), 1):
            dec = F.StreamDecoder()
            stream = prefix + data
            items = []
            for i in range(0, len(stream), step):
                items += dec.feed(stream[i : i + step])
            assert dec.error_total() == 0, (prefix, dec.errors)
            assert items[-1].ok and items[-1].name == "telemetry"
            assert items[-1].fields == fields


def test_stream_oversize_binary_counted_once_then_recovers():
    dec = F.StreamDecoder(max_frame=64)
    big = F.encode_frame("nack", {"ref": 1, "ref_type": 2, "code": 3, "text": "t" * 90}, 1)
    assert len(big) > dec.max_encoded
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 2)
    for step in (len(big) + len(ack), 1, 5):
        dec = F.StreamDecoder(max_frame=64)
        stream = big + ack
        items = []
        for i in range(0, len(stream), step):
            items += dec.feed(stream[i : i + step])
        assert dec.errors["oversize"] == 1, (step, dec.errors)
        assert dec.error_total() == 1
        assert items[-1].ok and items[-1].name == "ack"
        assert dec.frames == 1


def test_stream_oversize_text_counted_once_then_recovers():
    line = b'{"type":"event","code":1,"severity":0,"text":"' + b"y" * 300 + b'"}\n'
    good = b'{"type":"ack","ref":1,"ref_type":2}\n'
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 2)
    for step in (1000, 1, 13):
        dec = F.StreamDecoder(max_line=100)
        stream = line + good + line + ack
        items = []
        for i in range(0, len(stream), step):
            items += dec.feed(stream[i : i + step])
        assert dec.errors["oversize"] == 2, (step, dec.errors)
        assert dec.error_total() == 2
        oks = [it for it in items if it.ok]
        assert [(it.name, it.fmt) for it in oks] == [("ack", "json"), ("ack", "cbor")]
        assert dec.frames == 2 and dec.json_lines == 1


def test_stream_reset_drops_partial_frame():
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 2)
    dec = F.StreamDecoder()
    assert dec.feed(ack[:5]) == []
    dec.reset()
    items = dec.feed(ack)
    assert len(items) == 1 and items[0].ok
    assert dec.error_total() == 0
    # without reset() the stale half frame corrupts the next one
    dec = F.StreamDecoder()
    dec.feed(ack[:5])
    items = dec.feed(ack)
    assert len(items) == 1 and not items[0].ok
    assert dec.error_total() == 1
    # reset() in the middle of a text line too
    dec = F.StreamDecoder()
    dec.feed(b'{"type":"ack"')
    dec.reset()
    items = dec.feed(b'{"type":"ack","ref":1,"ref_type":2}\n')
    assert items[0].ok and dec.error_total() == 0


def test_stream_never_raises_on_garbage():
    rng = XorShift32(22)
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 2)
    for round_ in range(6):
        dec = F.StreamDecoder(max_frame=128, max_line=128)
        total_bad = 0
        n_bytes = 0
        for _ in range(30):
            chunk = bytes(rng.buffer(1 + rng.below(100), zero_pct=3 * round_, ff_pct=5))
            n_bytes += len(chunk)
            for it in dec.feed(chunk):
                if not it.ok:
                    total_bad += 1
        # one delimiter, then a good frame must come through
        items = dec.feed(b"\x00" + ack)
        n_bytes += 1 + len(ack)
        for it in items[:-1]:
            total_bad += 0 if it.ok else 1
        assert items[-1].ok and items[-1].name == "ack", round_
        assert dec.bytes == n_bytes
        assert total_bad == dec.error_total(), (total_bad, dec.errors)
