"""Receiving the host's signed heartbeats allocates nothing (StreamDecoder with a
HeartbeatState and a Verifier, fed from a preallocated buffer with a sink).

Under MicroPython every feed runs with the heap locked: one allocation anywhere on the
path (decoder, COBS, CRC, CBOR parse, HMAC-SHA256, replay check) is a MemoryError.
On CPython the same code gives the same results. The fast path must also agree with
the allocating decoder on every frame it hands on, and check each signature once.
"""

from array import array

from mpcompat import heap_locked, raises
from protocol_samples import XorShift32

from protocol import catalog as C
from protocol import cobs
from protocol import frame as F
from protocol.crc import crc16
from protocol.sign import (
    AUTH_BAD,
    AUTH_NONE,
    AUTH_OK,
    AUTH_REPLAY,
    FLAG_SIGNED,
    Signer,
    Verifier,
)

DUAL = True
MPY_TIMEOUT = 600

KEY = bytes(range(100, 132))
NONCE = b"\xa1\xb2\xc3\xd4\xe5\xf6\x07\x18"
OLD_NONCE = b"\x01\x02\x03\x04\x05\x06\x07\x08"
LINK = 2
HB = C.by_type(C.T_HEARTBEAT)
N_HB = len(HB[C.M_FIELDS])
GPU_TEMP = C.field_index(HB, "gpu_temp")
GPU_POWER = C.field_index(HB, "gpu_power")
POWER_LIMIT = C.field_index(HB, "power_limit")
HOST_TIME = C.field_index(HB, "host_time")
MEM_TEMP = C.field_index(HB, "gpu_mem_temp")
PERIOD = C.field_index(HB, "period_ms")


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def _signer(nonce=NONCE, t=10**12, link=LINK):
    s = Signer(KEY, link, clock=Clock(t))
    s.nonce = nonce
    return s


def _rig():
    v = Verifier(KEY)
    v.set_nonce(NONCE)
    hb = F.HeartbeatState()
    dec = F.StreamDecoder(accept=C.H2D, verifier=v, heartbeat=hb)
    return v, hb, dec


def _fields(i):
    """The wire values of heartbeat number ``i``: all fields, the limits included."""
    return {
        "gpu_temp": -55000 + (i * 2551) % 255001,
        "gpu_power": (i * 40013) % 4000001,
        "power_limit": 4000000 - i,
        "host_time": i * 3600,  # below 2**30: stored
        "gpu_mem_temp": 200000 - i * 7,
        "period_ms": (i * 6007) % 600001,
        "gpu_slowdown": 40000 + (i * 853) % 85001,
    }


def _frames(count, signer, start=0):
    return [F.encode_frame("heartbeat", _fields(start + i), i, signer=signer) for i in range(count)]


# _NOTE_CLOSURES: calling a closure that holds more than five variables of its
# enclosing function allocates the argument array on MicroPython (py/objclosure.c), so
# the heap-locked helpers below close over at most five.

# Preallocated by the test, so the heap-locked part allocates nothing itself.
_SINK_CALLS = array("i", [0])


def _sink(item):
    _SINK_CALLS[0] += 1


def _copy(dst, src, start, end):
    i = start
    k = 0
    while i < end:
        dst[k] = src[i]
        i += 1
        k += 1
    return k


def _expect(hb, fields):
    assert hb.fields() == fields, (hb.fields(), fields)


def test_100_signed_heartbeats_whole_without_allocation():
    v, hb, dec = _rig()
    frames = _frames(100, _signer())
    rx = bytearray(600)
    seqs = array("i", [0] * 100)
    vals = array("i", [0] * (100 * N_HB))
    auths = array("i", [0] * 100)
    out = (seqs, vals, auths)  # one closure cell: see _NOTE_CLOSURES
    _SINK_CALLS[0] = 0

    def run():
        seqs, vals, auths = out
        i = 0
        while i < 100:
            f = frames[i]
            n = _copy(rx, f, 0, len(f))
            dec.feed(rx, n, _sink)
            seqs[i] = hb.seq if hb.pending else -1
            auths[i] = hb.auth
            hb.pending = False
            j = 0
            while j < N_HB:
                vals[i * N_HB + j] = hb.values[j]
                j += 1
            i += 1

    heap_locked(run)
    assert _SINK_CALLS[0] == 0  # no Message, no BadFrame
    for i in range(100):
        assert seqs[i] == i and auths[i] == AUTH_OK, (i, seqs[i], auths[i])
        want = _fields(i)
        got = {}
        for fdef in HB[C.M_FIELDS]:
            got[fdef[C.F_NAME]] = vals[i * N_HB + C.field_index(HB, fdef[C.F_NAME])]
        assert got == want, (i, got, want)
    assert hb.taken == 100 and hb.accepted == 100 and hb.refused == 0 and hb.fallbacks == 0
    assert hb.link == LINK and hb.wide == 0 and hb.present == (1 << N_HB) - 1
    assert v.ok == 100 and v.bad == 0 and v.replayed == 0
    assert dec.frames == 100 and dec.error_total() == 0
    assert dec.bytes == sum(len(f) for f in frames)


def test_100_heartbeats_split_at_every_byte_boundary_without_allocation():
    """Frame i is cut at byte i mod (len + 1), so the cut walks through the frames
    (test_every_cut_of_one_heartbeat takes every cut of one); then 3 frames are fed
    one byte at a time."""
    v, hb, dec = _rig()
    frames = _frames(103, _signer())
    rx = bytearray(96)  # a signed heartbeat with every field: up to 65 bytes
    seqs = array("i", [-1] * 103)

    def run():
        i = 0
        while i < 100:
            f = frames[i]
            cut = i % (len(f) + 1)
            n = _copy(rx, f, 0, cut)
            dec.feed(rx, n, _sink)
            n = _copy(rx, f, cut, len(f))
            dec.feed(rx, n, _sink)
            if hb.pending:
                seqs[i] = hb.seq
                hb.pending = False
            i += 1
        while i < 103:
            f = frames[i]
            k = 0
            while k < len(f):
                rx[0] = f[k]
                dec.feed(rx, 1, _sink)
                k += 1
            if hb.pending:
                seqs[i] = hb.seq
                hb.pending = False
            i += 1

    _SINK_CALLS[0] = 0
    heap_locked(run)
    assert _SINK_CALLS[0] == 0
    assert list(seqs) == list(range(103)), list(seqs)
    assert hb.accepted == 103 and v.ok == 103
    _expect(hb, _fields(102))
    lens = set(len(f) for f in frames)
    assert max(lens) < 100  # so the cuts above cover every position


def test_every_cut_of_one_heartbeat():
    v, hb, dec = _rig()
    s = _signer()
    proto = F.encode_frame("heartbeat", _fields(5), 0, signer=s)
    frames = [F.encode_frame("heartbeat", _fields(5), k, signer=s) for k in range(len(proto) + 1)]
    assert set(len(f) for f in frames) == {len(proto)}  # only seq and signature differ
    rx = bytearray(96)  # a signed heartbeat with every field: up to 65 bytes
    ok = array("i", [0, len(proto)])
    del proto  # five closure cells at most (_NOTE_CLOSURES)

    def run():
        cut = 0
        while cut <= ok[1]:
            f = frames[cut]
            n = _copy(rx, f, 0, cut)
            dec.feed(rx, n, _sink)
            n = _copy(rx, f, cut, len(f))
            dec.feed(rx, n, _sink)
            if hb.pending and hb.auth == AUTH_OK and hb.seq == cut:
                ok[0] += 1
            hb.pending = False
            cut += 1

    heap_locked(run)
    assert ok[0] == ok[1] + 1, (ok[0], ok[1])


def test_several_heartbeats_in_one_chunk_and_n_limits_the_bytes():
    v, hb, dec = _rig()
    frames = _frames(3, _signer())
    rx = bytearray(300)
    data = frames[0] + frames[1] + frames[2]
    n = _copy(rx, data, 0, len(data))
    rx[n] = 0x55  # garbage past n must not be read
    rx[n + 1] = 0x01
    heap_locked(lambda: dec.feed(rx, n, _sink))
    assert hb.taken == 3 and hb.accepted == 3 and hb.seq == 2
    _expect(hb, _fields(2))
    assert dec.bytes == n and dec.frames == 3
    assert dec.feed(b"\x00") == []  # nothing was left half-read


def test_host_time_above_small_int_range_is_skipped():
    v, hb, dec = _rig()
    s = _signer()
    f = dict(_fields(1))
    f["host_time"] = 1718000000  # > 2**30: valid, but not stored
    rx = bytearray(96)  # a signed heartbeat with every field: up to 65 bytes
    frame = F.encode_frame("heartbeat", f, 7, signer=s)
    n = _copy(rx, frame, 0, len(frame))
    heap_locked(lambda: dec.feed(rx, n, _sink))
    assert hb.pending and hb.auth == AUTH_OK and hb.accepted == 1
    assert hb.wide == 1 << HOST_TIME and not hb.present & (1 << HOST_TIME)
    del f["host_time"]
    _expect(hb, f)
    # the largest u32 is still in range
    f2 = {"host_time": 0xFFFFFFFF, "gpu_temp": 1}
    frame = F.encode_frame("heartbeat", f2, 8, signer=s)
    n = _copy(rx, frame, 0, len(frame))
    dec.feed(rx, n, _sink)
    assert hb.seq == 8 and hb.wide == 1 << HOST_TIME and hb.fields() == {"gpu_temp": 1}


def test_refused_heartbeats_never_update_values():
    v, hb, dec = _rig()
    good = _frames(1, _signer(t=5000))[0]
    dec.feed(bytearray(good), None, _sink)
    assert hb.auth == AUTH_OK
    before = hb.fields()
    rx = bytearray(96)  # a signed heartbeat with every field: up to 65 bytes
    got = []

    def feed(frame):
        hb.pending = False
        n = _copy(rx, frame, 0, len(frame))
        heap_locked(lambda: dec.feed(rx, n, _sink))
        got.append((hb.pending, hb.auth))
        assert hb.fields() == before and hb.present == (1 << N_HB) - 1

    other = _fields(50)
    # 1. forged: a signature bit flipped (the CRC does not cover the trailer)
    raw = bytearray(cobs.decode(F.encode_frame("heartbeat", other, 1, signer=_signer(t=6000))[:-1]))
    raw[-1] ^= 0x40
    feed(bytes(cobs.encode(raw)) + b"\x00")
    # 2. replayed: the accepted frame again
    feed(good)
    # 3. older timestamp on the same link
    feed(F.encode_frame("heartbeat", other, 2, signer=_signer(t=4999)))
    # 4. recorded in the previous boot (old nonce), timestamp far ahead
    feed(F.encode_frame("heartbeat", other, 3, signer=_signer(nonce=OLD_NONCE, t=10**14)))
    # 5. unsigned
    feed(F.encode_frame("heartbeat", other, 4))
    # 6. signed with another key
    s = Signer(bytes(32), LINK, clock=Clock(10**13))
    s.nonce = NONCE
    feed(F.encode_frame("heartbeat", other, 5, signer=s))
    want = [
        (True, AUTH_BAD),
        (True, AUTH_REPLAY),
        (True, AUTH_REPLAY),
        (True, AUTH_BAD),
        (True, AUTH_NONE),
        (True, AUTH_BAD),
    ]
    assert got == want, got
    assert hb.taken == 7 and hb.accepted == 1 and hb.refused == 6
    assert v.ok == 1 and v.bad == 3 and v.replayed == 2
    assert hb.link == -1 or hb.link == LINK
    # a module that has no key: every signed heartbeat is bad, values untouched
    v.set_key(None)
    feed(F.encode_frame("heartbeat", other, 6, signer=_signer(t=10**13)))
    assert got[-1] == (True, AUTH_BAD)
    # and a good one after all that is still accepted (nothing was consumed)
    v.set_key(KEY)
    hb.pending = False
    dec.feed(bytearray(F.encode_frame("heartbeat", other, 9, signer=_signer(t=7000))), None, _sink)
    assert hb.auth == AUTH_OK and hb.seq == 9
    _expect(hb, other)


def test_heartbeat_state_needs_a_verifier():
    with raises(ValueError, match="verifier"):
        F.StreamDecoder(heartbeat=F.HeartbeatState())


def test_other_messages_go_to_the_sink():
    v, hb, dec = _rig()
    s = _signer()
    items = []
    data = (
        F.encode_frame("fan_mode", {"mode": 0}, 1, signer=s)
        + b"\x03\x01\x00"  # too short
        + F.encode_frame("heartbeat", _fields(3), 2, signer=s)
        + b'{"type":"hello_request"}\n'
    )
    assert dec.feed(bytearray(data), None, items.append) is None
    assert [(x.ok, x.name if x.ok else x.kind) for x in items] == [
        (True, "fan_mode"),
        (False, "framing"),
        (True, "hello_request"),
    ], items
    assert items[0].auth == AUTH_OK and items[2].auth == AUTH_NONE
    assert hb.seq == 2 and hb.auth == AUTH_OK
    # without a sink: a list, as before
    got = dec.feed(F.encode_frame("config_get", {}, 3))
    assert len(got) == 1 and got[0].name == "config_get"


# --------------------------------------------------------------------------- fallback


def _signed_raw(type_id, payload, seq, signer, minor=0):
    """A signed frame around any payload bytes (correct CRC and signature)."""
    raw = bytearray([1, minor | FLAG_SIGNED, type_id, seq >> 8, seq & 0xFF]) + payload
    crc = crc16(raw)
    raw += bytes([crc >> 8, crc & 0xFF])
    raw += signer.trailer(bytes(raw))
    return bytes(cobs.encode(raw)) + b"\x00"


def _outcome(item_or_state):
    x = item_or_state
    if isinstance(x, F.HeartbeatState):
        return ("hb", x.auth, x.fields())
    if x.ok:
        return ("msg", x.auth, x.fields)
    return ("bad", x.kind, x.code)


def _both(frame):
    """(fast-path decoder result, reference decoder result) for one frame."""
    v1, hb, fast = _rig()
    v2 = Verifier(KEY)
    v2.set_nonce(NONCE)
    slow = F.StreamDecoder(accept=C.H2D, verifier=v2)
    items = []
    fast.feed(bytearray(frame), None, items.append)
    ref = slow.feed(frame)
    assert len(ref) == 1, ref
    if hb.pending:
        assert not items, items
        r = _outcome(ref[0])
        assert r[0] == "msg" and r[1] == hb.auth, (r, hb.auth)
        if hb.auth == AUTH_OK:
            want = dict(ref[0].fields)
            if hb.wide & (1 << HOST_TIME):
                del want["host_time"]
            assert hb.fields() == want, (hb.fields(), want)
        return "fast"
    assert len(items) == 1, items
    assert _outcome(items[0]) == _outcome(ref[0]), (items[0], ref[0])
    assert v1.ok + v1.bad + v1.replayed <= 1  # the signature was checked at most once
    return "fallback"


def test_unusual_heartbeats_fall_back_with_the_same_verdict():
    s = _signer()
    cases = (
        (b"", "fast"),  # no fields
        (b"\xa0", "fast"),  # an empty map
        (b"\xa1\x00\x18\x05", "fast"),  # non-shortest value: still an int
        (b"\xa1\x17\x01", "fast"),  # unknown key 23 (a newer minor): ignored
        (b"\xa1\x18\x00\x01", "fallback"),  # key in a two-byte head
        (b"\xa1\x00\x1b" + bytes(7) + b"\x01", "fallback"),  # 8-byte value
        (b"\xa2\x00\x01\x00\x02", "fallback"),  # duplicate key: undecodable
        (b"\xa1\x00\x01\x00", "fallback"),  # trailing byte
        (b"\xa1\x00", "fallback"),  # truncated
        (b"\xa1\x01\x20", "fallback"),  # gpu_power = -1: out of range
        (b"\xa1\x00\x3a\x00\x00\xd6\xd8", "fallback"),  # gpu_temp = -55001
        (b"\xa1\x00\x1a\x00\x03\x0d\x41", "fallback"),  # gpu_temp = 200001
        (b"\xa1\x00\x1a\x40\x00\x00\x00", "fallback"),  # gpu_temp = 2**30
        (b"\xa1\x03\x1a\xff\xff\xff\xff", "fast"),  # host_time = u32 max: skipped
        (b"\xa1\x03\x3a\x40\x00\x00\x00", "fallback"),  # host_time negative
        (b"\xa1\x00\xf5", "fallback"),  # true is not an integer
        (b"\xa1\x00\x61\x31", "fallback"),  # text
        (b"\xa1\x17\x61\x31", "fallback"),  # unknown key with a text value: ignored
        (b"\xb8\x01\x00\x01", "fallback"),  # map head with a one-byte count
        (b"\x81\x00", "fallback"),  # not a map
        (b"\xa1\x05\x1a\x00\x09\x27\xc1", "fallback"),  # period_ms = 600001
    )
    for i, (payload, path) in enumerate(cases):
        frame = _signed_raw(C.T_HEARTBEAT, payload, i, s)
        got = _both(frame)
        assert got == path, (payload, got)
    # unsigned, a CRC error, another major, the wrong direction
    assert _both(F.encode_frame("heartbeat", _fields(1), 1)) == "fast"
    raw = bytearray(cobs.decode(F.encode_frame("heartbeat", _fields(1), 1, signer=s)[:-1]))
    raw[6] ^= 1
    assert _both(bytes(cobs.encode(raw)) + b"\x00") == "fallback"
    f = F.encode_frame("heartbeat", {"gpu_temp": 1}, 1, major=2)
    assert _both(f) == "fallback"


def test_fast_path_agrees_with_the_reference_on_random_heartbeats():
    rng = XorShift32(2024)
    s = _signer()
    paths = {"fast": 0, "fallback": 0}
    heads = (0x00, 0x17, 0x18, 0x19, 0x1A, 0x20, 0x37, 0x38, 0x39, 0x3A, 0x1B, 0xF5, 0x40)
    for i in range(300):
        count = rng.below(8)
        body = bytearray([0xA0 + count])
        for _ in range(count):
            body.append(rng.below(8) if rng.below(10) else 23 + rng.below(3))
            h = heads[rng.below(len(heads))]
            if h < 0x18 or 0x20 <= h < 0x38:
                body.append(h + rng.below(4))
            else:
                body.append(h)
                for _ in range((1, 2, 4, 8)[rng.below(4)]):
                    body.append(rng.below(256) if rng.below(3) else 0)
        if rng.below(10) == 0:
            body.append(rng.below(256))
        paths[_both(_signed_raw(C.T_HEARTBEAT, bytes(body), i, s))] += 1
    assert paths["fast"] > 30 and paths["fallback"] > 30, paths


def test_sink_mode_decodes_like_list_mode():
    """The sink mode copies byte by byte (no slicing); over random mixes of frames,
    lines, noise and oversize runs, in random chunks, it yields the same items."""
    rng = XorShift32(99)
    s = _signer()
    parts = [
        F.encode_frame("fan_mode", {"mode": 1, "duty1": 100, "duty2": 0}, 1),
        F.encode_frame("setpoints", {"sp_gpu": 70000}, 2, signer=s),
        F.encode_frame("heartbeat", _fields(1), 3),
        b'{"type":"config_get","seq":4}\n',
        b"MicroPython v1.28.0\r\n",
        b"\x05\x01" + b"\x41" * 600 + b"\x00",
        b"\x00\x00",
        b"\x02\x01\x00",
        b'{"type":"reboot",\n',
        bytes(rng.buffer(40, zero_pct=10)),
    ]
    stream = bytearray()
    for _ in range(60):
        stream += parts[rng.below(len(parts))]
    v1 = Verifier(KEY)
    v1.set_nonce(NONCE)
    v2 = Verifier(KEY)
    v2.set_nonce(NONCE)
    a = F.StreamDecoder(accept=C.H2D, verifier=v1)
    b = F.StreamDecoder(accept=C.H2D, verifier=v2)
    want = a.feed(bytes(stream))
    got = []
    rx = bytearray(128)
    i = 0
    while i < len(stream):
        n = min(len(stream) - i, 1 + rng.below(128))
        _copy(rx, stream, i, i + n)
        assert b.feed(rx, n, got.append) is None
        i += n
    assert len(got) == len(want), (len(got), len(want))
    for k in range(len(got)):
        x = got[k]
        y = want[k]
        assert x.ok == y.ok, (x, y)
        if x.ok:
            assert (x.name, x.seq, x.fields, x.auth, x.fmt) == (
                y.name,
                y.seq,
                y.fields,
                y.auth,
                y.fmt,
            )
        else:
            assert (x.kind, x.code, x.type, x.seq, x.fmt) == (y.kind, y.code, y.type, y.seq, y.fmt)
    assert a.errors == b.errors and a.frames == b.frames and a.bytes == b.bytes
