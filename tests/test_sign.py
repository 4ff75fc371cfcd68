"""Signed commands (protocol.sign, signed frames and JSON lines) on both interpreters:
the MAC, the trailer layout, the replay rule, the nonce, the key file, and the
equivalence of a signed JSON line with its binary frame."""

import hashlib

from mpcompat import raises, tmpdir

from protocol import catalog as C
from protocol import cobs, jsonl, sign
from protocol import frame as F
from protocol.crc import crc16
from protocol.errors import (
    CRCError,
    FieldError,
    FrameError,
    OversizeError,
    ProtocolError,
    VersionError,
)
from protocol.sign import (
    AUTH_BAD,
    AUTH_NONE,
    AUTH_OK,
    AUTH_REPLAY,
    AUTH_UNCHECKED,
    FLAG_SIGNED,
    TRAILER_LEN,
    Mac,
    Signer,
    SigningError,
    Verifier,
)

DUAL = True

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
NONCE = b"\x10\x32\x54\x76\x98\xba\xdc\xfe"
OLD_NONCE = b"\x00\x11\x22\x33\x44\x55\x66\x77"


class Clock:
    """A settable clock for Signer (10 us units)."""

    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def _signer(link=0, t=1000, key=KEY, nonce=NONCE):
    s = Signer(key, link, clock=Clock(t))
    s.nonce = nonce
    return s


def _verifier(key=KEY, nonce=NONCE):
    v = Verifier(key)
    v.set_nonce(nonce)
    return v


def _raw(frame):
    return bytearray(cobs.decode(frame[:-1]))


def _restuff(raw):
    return bytes(cobs.encode(raw)) + b"\x00"


def _hmac(key, msg):
    """HMAC-SHA256 written out over hashlib (an independent reference)."""
    k = bytearray(64)
    k[: len(key)] = key
    inner = hashlib.sha256(bytes([b ^ 0x36 for b in k]) + msg).digest()
    return hashlib.sha256(bytes([b ^ 0x5C for b in k]) + inner).digest()


def _ts_bytes(ts):
    return bytes([(ts >> (8 * (5 - i))) & 0xFF for i in range(6)])


# --------------------------------------------------------------------------- MAC


def test_mac48_known_value_and_reference():
    msg = b"MAVLink 2 signing model"
    out = bytearray(8)
    Mac(KEY).mac48_into(bytes(range(8)), msg, 0, len(msg), out, 1)
    assert bytes(out[1:7]).hex() == "b0b910886bad", bytes(out).hex()
    assert out[0] == 0 and out[7] == 0
    assert bytes(out[1:7]) == _hmac(KEY, bytes(range(8)) + msg)[:6]
    # a window of a larger buffer, and lengths across the block boundaries
    data = bytes(range(200))
    m = Mac(OTHER_KEY)
    for start, end in ((0, 0), (3, 50), (10, 66), (0, 120), (7, 200)):
        m.mac48_into(NONCE, data, start, end, out, 0)
        assert bytes(out[:6]) == _hmac(OTHER_KEY, NONCE + data[start:end])[:6], (start, end)


def test_keys_must_be_32_bytes():
    for bad in (b"", bytes(31), bytes(33), "x" * 32, None):
        with raises(ValueError, match="32 bytes"):
            Mac(bad)
    with raises(ValueError):
        Verifier(bytes(16))
    with raises(ValueError):
        Signer(bytes(16))
    with raises(ValueError, match="8 bytes"):
        Verifier(KEY).set_nonce(b"1234567")


# --------------------------------------------------------------------------- Signer


def test_signer_timestamps_strictly_increase():
    clock = Clock(500)
    s = Signer(KEY, 1, clock=clock)
    assert s.last_ts == 0
    assert s.next_ts() == 500
    assert s.next_ts() == 501  # the clock did not move
    clock.t = 100  # the clock went back
    assert s.next_ts() == 502
    clock.t = 10**6
    assert s.next_ts() == 10**6 and s.last_ts == 10**6
    clock.t = sign.TS_MAX
    assert s.next_ts() == sign.TS_MAX
    with raises(SigningError, match="2**48"):
        s.next_ts()


def test_default_clock_is_mavlink_time():
    s = Signer(KEY)
    ts = s.next_ts()
    # 10 us units since 2015-01-01: 2024-01-01 .. 2100-01-01
    lo = (1704067200 - sign.TS_UNIX_EPOCH) * sign.TS_PER_S
    hi = (4102444800 - sign.TS_UNIX_EPOCH) * sign.TS_PER_S
    assert lo < ts < hi, ts
    assert sign.ts_from_unix(sign.TS_UNIX_EPOCH + 1) == 100000


def test_signer_needs_a_nonce_and_a_valid_link():
    s = Signer(KEY, 0, clock=Clock(1))
    with raises(SigningError, match="nonce"):
        s.trailer(b"\x01\x80\x20\x00\x00\x00\x00")
    with raises(SigningError, match="nonce"):
        F.encode_frame("heartbeat", {}, 0, signer=s)
    assert s.last_ts == 0  # no timestamp was used up
    for bad in (-1, 256, "1", True):
        with raises(ValueError, match="link_id"):
            Signer(KEY, bad)


def test_trailer_layout():
    s = _signer(link=0xA5, t=0x0102030405)
    data = b"\x01\x80\x20\x12\x34\xa0\x55\x66"
    t = s.trailer(data)
    assert len(t) == TRAILER_LEN
    assert t[0] == 0xA5
    assert t[1:7] == b"\x00\x01\x02\x03\x04\x05"  # u48 big-endian
    assert t[7:] == _hmac(KEY, NONCE + data + t[:7])[:6]


# --------------------------------------------------------------------------- frames


def test_signed_frame_layout():
    fields = {"mode": 1, "duty1": 32768, "duty2": 19661}
    plain = _raw(F.encode_frame("fan_mode", fields, 0x1234))
    s = _signer(link=3, t=777)
    raw = _raw(F.encode_frame("fan_mode", fields, 0x1234, signer=s))
    n = len(raw)
    assert n == len(plain) + TRAILER_LEN
    assert raw[1] == FLAG_SIGNED | 0 and raw[0] == 1 and raw[2] == C.T_FAN_MODE
    body = n - TRAILER_LEN
    assert raw[5 : body - 2] == plain[5:-2]  # the same payload
    crc = crc16(raw, 0, body - 2)  # the CRC covers the header with its flag
    assert raw[body - 2] == crc >> 8 and raw[body - 1] == crc & 0xFF
    assert raw[body] == 3
    assert raw[body + 1 : body + 7] == _ts_bytes(777)
    assert raw[body + 7 :] == _hmac(KEY, NONCE + bytes(raw[: n - 6]))[:6]


def test_signed_frame_decodes_with_auth():
    s = _signer(link=2)
    frame = F.encode_frame("fan_mode", {"mode": 0}, 9, signer=s)
    v = _verifier()
    msg = F.decode_frame(frame, C.H2D, v)
    assert msg.ok and msg.name == "fan_mode" and msg.fields == {"mode": 0}
    assert msg.auth == AUTH_OK and msg.link == 2 and msg.minor == 0 and msg.seq == 9
    assert F.decode_frame(frame, C.H2D, v).auth == AUTH_REPLAY
    assert F.decode_frame(frame).auth == AUTH_UNCHECKED  # the host verifies nothing
    plain = F.decode_frame(F.encode_frame("fan_mode", {"mode": 0}, 9), C.H2D, v)
    assert plain.auth == AUTH_NONE and plain.link == -1
    assert (v.ok, v.bad, v.replayed) == (1, 0, 1)


def test_every_covered_byte_matters():
    s = _signer(link=1)
    raw = _raw(F.encode_frame("setpoints", {"sp_gpu": 70000, "sp_amb": 30000}, 77, signer=s))
    n = len(raw)
    body = n - TRAILER_LEN
    for i in range(n):
        if body - 2 <= i < body:
            continue  # the CRC bytes are checked by the CRC
        bad = bytearray(raw)
        bad[i] ^= 0x01
        if i < body - 2:  # keep the CRC right so the signature is what rejects it
            crc = crc16(bad, 0, body - 2)
            bad[body - 2] = crc >> 8
            bad[body - 1] = crc & 0xFF
        v = _verifier()
        try:
            auth = F.decode_raw(bad, n, None, v).auth
        except VersionError:
            assert i == 0, i  # major 0: refused before the signature is looked at
            continue
        except ProtocolError as e:  # a flipped payload byte may not decode, or not fit
            auth = e.auth
        assert auth == AUTH_BAD, (i, auth)
    v = _verifier()
    assert F.decode_raw(raw, n, None, v).auth == AUTH_OK


def test_wrong_key_no_key_no_nonce_old_nonce():
    frame = F.encode_frame("config_save", {}, 1, signer=_signer())
    assert F.decode_frame(frame, None, _verifier(key=OTHER_KEY)).auth == AUTH_BAD
    v = Verifier(None)  # a module that was never paired
    v.set_nonce(NONCE)
    assert F.decode_frame(frame, None, v).auth == AUTH_BAD and not v.has_key
    v = Verifier(KEY)  # nonce never set
    assert F.decode_frame(frame, None, v).auth == AUTH_BAD
    v.set_nonce(NONCE)
    assert F.decode_frame(frame, None, v).auth == AUTH_OK
    old = F.encode_frame("config_save", {}, 1, signer=_signer(t=10**9, nonce=OLD_NONCE))
    v = _verifier()
    assert F.decode_frame(old, None, v).auth == AUTH_BAD  # recorded in an earlier boot
    assert v.bad == 1 and v.ok == 0


def test_replay_rule_per_link():
    v = _verifier()

    def at(link, ts):
        frame = F.encode_frame("reboot", {}, 0, signer=_signer(link=link, t=ts))
        return F.decode_frame(frame, None, v).auth

    assert at(0, 1000) == AUTH_OK
    assert at(0, 1000) == AUTH_REPLAY  # equal is not greater
    assert at(0, 999) == AUTH_REPLAY
    assert at(0, 1001) == AUTH_OK
    assert at(1, 5) == AUTH_OK  # another link has its own last timestamp
    assert at(9, 5) == AUTH_REPLAY  # link 9 shares slot 9 & 7 == 1
    assert at(9, 6) == AUTH_OK
    # bytewise compare: a carry into a higher byte is newer, the reverse is older
    assert at(2, 0x00FFFFFFFFFF) == AUTH_OK
    assert at(2, 0x010000000000) == AUTH_OK
    assert at(2, 0x00FFFFFFFFFF) == AUTH_REPLAY
    assert at(2, 0x0100000000FF) == AUTH_OK
    assert at(2, 0x010000000100) == AUTH_OK
    assert at(2, 0x0100000000FF) == AUTH_REPLAY
    assert at(3, sign.TS_MAX) == AUTH_OK
    assert at(3, sign.TS_MAX) == AUTH_REPLAY
    # a new boot: a new nonce forgets every link's last timestamp
    v.set_nonce(NONCE)
    assert at(0, 1) == AUTH_OK
    assert v.ok == 10 and v.replayed == 6 and v.bad == 0, (v.ok, v.replayed, v.bad)


def test_set_key_switches_keys():
    v = _verifier()
    f_old = F.encode_frame("reboot", {}, 0, signer=_signer(t=10))
    f_new = F.encode_frame("reboot", {}, 0, signer=_signer(t=20, key=OTHER_KEY))
    v.set_key(OTHER_KEY)
    assert F.decode_frame(f_old, None, v).auth == AUTH_BAD
    assert F.decode_frame(f_new, None, v).auth == AUTH_OK
    v.set_key(None)
    assert F.decode_frame(f_new, None, v).auth == AUTH_BAD


def test_signed_frame_length_and_crc_position():
    s = _signer()
    raw = _raw(F.encode_frame("reboot", {}, 0, signer=s))
    assert len(raw) == F.MIN_SIGNED == F.MIN_FRAME + TRAILER_LEN
    with raises(FrameError, match="shorter"):
        F.decode_raw(raw, len(raw) - 1)  # one trailer byte short
    # an unsigned-looking frame (CRC last) with the flag set: the CRC is looked for
    # before the trailer, so it fails
    plain = _raw(F.encode_frame("fan_mode", {"mode": 0, "duty1": 1, "duty2": 2}, 1))
    plain[1] |= FLAG_SIGNED
    with raises((CRCError, FrameError)):
        F.decode_raw(plain, len(plain))
    # a trailer byte lost in transit: the CRC moves and no longer matches
    raw = _raw(F.encode_frame("fan_mode", {"mode": 0, "duty1": 1, "duty2": 2}, 1, signer=s))
    with raises(CRCError):
        F.decode_raw(raw, len(raw) - 1)


def test_minor_flag_and_size_limits():
    s = _signer()
    with raises(FieldError, match="minor"):
        F.encode_frame("reboot", {}, 0, minor=0x80, signer=s)
    raw = _raw(F.encode_frame("reboot", {}, 0, minor=0x7F, signer=s))
    assert raw[1] == 0xFF
    msg = F.decode_raw(raw, len(raw))
    assert msg.minor == 0x7F and msg.auth == AUTH_UNCHECKED
    # MAX_FRAME includes the trailer: a frame that fits unsigned may not fit signed
    for pad in range(450, 520):
        big = {"values": {"pad": "y" * pad}}
        n = len(_raw(F.encode_frame("config_set", big, 0)))
        if F.MAX_FRAME - TRAILER_LEN < n <= F.MAX_FRAME:
            break
    else:
        raise AssertionError("no payload size between the two limits")
    with raises(OversizeError):
        F.encode_frame("config_set", big, 0, signer=s)


def test_rejected_signed_frames_carry_auth():
    s = _signer(link=4)
    # out of range value, signed: rejected as invalid, but the auth is known
    payload = b"\xa1\x00\x01"  # sp_gpu = 1: out of range
    raw = bytearray([1, FLAG_SIGNED, C.T_SETPOINTS, 0, 42]) + payload
    crc = crc16(raw)
    raw += bytes([crc >> 8, crc & 0xFF])
    raw += s.trailer(bytes(raw))
    dec = F.StreamDecoder(accept=C.H2D, verifier=_verifier())
    got = dec.feed(_restuff(raw))
    assert len(got) == 1 and not got[0].ok and got[0].kind == "invalid", got
    assert got[0].auth == AUTH_OK and got[0].link == 4 and got[0].seq == 42
    plain = dec.feed(F.encode_frame("hello_request", {}, 1))
    assert plain[0].ok and plain[0].auth == AUTH_NONE
    # a module -> host message signed: refused for its direction, auth attached
    ack = F.encode_frame("ack", {"ref": 1, "ref_type": 2}, 1, signer=_signer(link=5, t=9))
    bad = dec.feed(ack)[0]
    assert bad.kind == "invalid" and bad.code == C.ERR_DIRECTION and bad.auth == AUTH_OK


# --------------------------------------------------------------------------- JSON lines


def test_signed_line_has_the_signature_of_its_frame():
    fields = {"mode": 1, "duty1": 32768, "duty2": 19661}
    frame = F.encode_frame("fan_mode", fields, 20, signer=_signer(link=6, t=123456789))
    line = jsonl.encode_line("fan_mode", fields, 20, signer=_signer(link=6, t=123456789))
    raw = _raw(frame)
    sig = bytes(raw[-6:]).hex()
    want = '{"type":"fan_mode","v":"1.0","seq":20,"link":6,"ts":123456789,"sig":"' + sig + '",'
    assert line.startswith(want.encode()), (line, want)
    assert line.endswith(b'"mode":"manual","duty1":50.001,"duty2":30.001}\n'), line
    v = _verifier()
    msg = jsonl.decode_line(line[:-1], C.H2D, v)
    assert msg.auth == AUTH_OK and msg.link == 6 and msg.fields == fields and msg.fmt == "json"
    # the frame with the same link and timestamp is now a replay: one predicate, one state
    assert F.decode_frame(frame, C.H2D, v).auth == AUTH_REPLAY
    assert jsonl.decode_line(line[:-1]).auth == AUTH_UNCHECKED


def test_signed_line_written_by_hand_verifies():
    """A human may reorder keys, add spaces, use names in any case or other number
    forms: the signature covers the wire values, not the text."""
    line = jsonl.encode_line("fan_mode", {"mode": 1, "duty1": 32768}, 3, signer=_signer(t=50))
    msg = jsonl.decode_line(line[:-1])
    sig = line.decode().split('"sig":"')[1][:12]
    typed = (
        '{ "duty1": 50.0010, "mode": "MANUAL", "sig": "' + sig + '", "ts": 50, "link": 0,'
        ' "seq": 3, "type": "fan_mode", "v": "1.0" }'
    )
    got = jsonl.decode_line(typed, C.H2D, _verifier())
    assert got.auth == AUTH_OK and got.fields == msg.fields
    # a changed value does not verify
    tampered = typed.replace("50.0010", "100")
    assert jsonl.decode_line(tampered, C.H2D, _verifier()).auth == AUTH_BAD
    # nor a changed seq, link or timestamp
    changes = (('"seq": 3', '"seq": 4'), ('"link": 0', '"link": 1'), ('"ts": 50', '"ts": 51'))
    for old, new in changes:
        assert jsonl.decode_line(typed.replace(old, new), C.H2D, _verifier()).auth == AUTH_BAD


def test_signed_line_header_errors():
    base = '{"type":"reboot","seq":1,"link":0,"ts":5,"sig":"0123456789ab"}'
    ok = jsonl.decode_line(base)
    assert ok.auth == AUTH_UNCHECKED and ok.link == 0

    def refused(text, field, code):
        with raises(FieldError) as e:
            jsonl.decode_line(text)
        assert e.value.field == field and e.value.code == code, (text, e.value.field, e.value.code)
        assert e.value.kind == "invalid" and e.value.seq == 1 and e.value.type_id == C.T_REBOOT

    refused(base.replace(',"ts":5', ""), "ts", C.ERR_MISSING_FIELD)
    refused(base.replace(',"link":0', ""), "link", C.ERR_MISSING_FIELD)
    refused(base.replace(',"sig":"0123456789ab"', ""), "sig", C.ERR_MISSING_FIELD)
    refused(base.replace('"link":0', '"link":256'), "link", C.ERR_OUT_OF_RANGE)
    refused(base.replace('"link":0', '"link":-1'), "link", C.ERR_OUT_OF_RANGE)
    refused(base.replace('"link":0', '"link":true'), "link", C.ERR_BAD_TYPE)
    refused(base.replace('"ts":5', '"ts":281474976710656'), "ts", C.ERR_OUT_OF_RANGE)
    refused(base.replace('"ts":5', '"ts":5.5'), "ts", C.ERR_BAD_TYPE)
    refused(base.replace("0123456789ab", "0123456789AB"), "sig", C.ERR_BAD_TYPE)
    refused(base.replace("0123456789ab", "0123456789a"), "sig", C.ERR_BAD_TYPE)
    refused(base.replace("0123456789ab", "0123456789abc"), "sig", C.ERR_BAD_TYPE)
    refused(base.replace('"0123456789ab"', "12"), "sig", C.ERR_BAD_TYPE)
    refused(base.replace("0123456789ab", "0123456789ag"), "sig", C.ERR_BAD_TYPE)
    refused(base.replace('"seq":1', '"seq":1,"v":"1.128"'), "v", C.ERR_OUT_OF_RANGE)
    assert jsonl.decode_line(base.replace('"ts":5', '"ts":281474976710655')).auth == AUTH_UNCHECKED


def test_stream_decoder_verifies_lines_and_frames():
    v = _verifier()
    dec = F.StreamDecoder(accept=C.H2D, verifier=v)
    s = _signer(link=1, t=100)
    line = jsonl.encode_line("config_save", {}, 1, signer=s)
    frame = F.encode_frame("config_save", {}, 2, signer=s)
    got = dec.feed(line + frame + line + b'{"type":"config_save","seq":3}\n')
    assert [m.auth for m in got] == [AUTH_OK, AUTH_OK, AUTH_REPLAY, AUTH_NONE], got
    assert [m.fmt for m in got] == ["json", "cbor", "json", "json"]
    assert dec.frames == 4 and dec.error_total() == 0


def test_key_files():
    d = tmpdir()
    good = d + "/secret.key"
    with open(good, "wb") as f:
        f.write(KEY)
    assert sign.load_key_file(good) == KEY
    for n in (0, 31, 33, 64):
        path = d + "/bad" + str(n) + ".key"
        with open(path, "wb") as f:
            f.write(bytes(n))
        with raises(ValueError, match="exactly 32 raw bytes"):
            sign.load_key_file(path)
    with raises(OSError):
        sign.load_key_file(d + "/missing.key")
    a = sign.new_key()
    b = sign.new_key()
    assert len(a) == 32 and a != b and isinstance(a, bytes)
