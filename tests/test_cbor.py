"""CBOR subset codec (protocol.cbor): RFC 8949 examples, hostile input, heads, floats."""

import math
import struct
from binascii import hexlify, unhexlify

from mpcompat import IS_MICROPYTHON, raises

from protocol import cbor
from protocol.errors import CBORDecodeError, CBOREncodeError, ProtocolError

DUAL = True

_INF = float("inf")
# Built at run time, not literals: freezing (tools/mpy-tool.py, the qemu-arm image)
# writes a float constant with 16 significant digits, which changes the last bit of
# some doubles, and writes -0.0 as 0; math.ldexp is exact where ``**`` may not be.
_NEG_ZERO = math.copysign(0.0, -1.0)
_F16_MIN = math.ldexp(1.0, -24)  # 5.960464477539063e-08, the smallest half subnormal
_F32_MAX = math.ldexp(0xFFFFFF, 104)  # 3.4028234663852886e38
_NAN = float("nan")
# -2**30, the smallest small int of a 32-bit port, folded by the compiler as one (the
# expression -(2**30) negates 2**30, a big int there, at run time; so would -v)
_MIN_SMALL = -0x3FFFFFFF - 1


def _h(text):
    return unhexlify(text.replace(" ", ""))


def _hex(data):
    return hexlify(data).decode()


def _same(a, b):
    """Structural equality that treats NaN as equal to NaN and tells -0.0 from 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        if a != a or b != b:
            return a != a and b != b
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False
        for i in range(len(a)):
            if not _same(a[i], b[i]):
                return False
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b):
            return False
        for k in a:
            if k not in b or not _same(a[k], b[k]):
                return False
        return True
    return type(a) is type(b) and a == b


# RFC 8949 Appendix A, the items inside the subset that this codec also *encodes*
# to exactly the listed bytes.
RFC_BOTH = (
    (0, "00"),
    (1, "01"),
    (10, "0a"),
    (23, "17"),
    (24, "1818"),
    (25, "1819"),
    (100, "1864"),
    (1000, "1903e8"),
    (1000000, "1a000f4240"),
    (1000000000000, "1b000000e8d4a51000"),
    (18446744073709551615, "1bffffffffffffffff"),
    (-18446744073709551616, "3bffffffffffffffff"),
    (-1, "20"),
    (-10, "29"),
    (-100, "3863"),
    (-1000, "3903e7"),
    (1.1, "fb3ff199999999999a"),
    # float(): MicroPython 1.28's mpy-tool cannot freeze a float literal beyond
    # float32's range, and the qemu-arm test target freezes this module.
    (float("1e300"), "fb7e37e43c8800759c"),
    (-4.1, "fbc010666666666666"),
    (_INF, "f97c00"),
    (_NAN, "f97e00"),
    (-_INF, "f9fc00"),
    (False, "f4"),
    (True, "f5"),
    (None, "f6"),
    (b"", "40"),
    (b"\x01\x02\x03\x04", "4401020304"),
    ("", "60"),
    ("a", "6161"),
    ("IETF", "6449455446"),
    ('"\\', "62225c"),
    ("\u00fc", "62c3bc"),
    ("\u6c34", "63e6b0b4"),
    (chr(0x10151), "64f0908591"),
    ([], "80"),
    ([1, 2, 3], "83010203"),
    ([1, [2, 3], [4, 5]], "8301820203820405"),
    (
        list(range(1, 26)),
        "98190102030405060708090a0b0c0d0e0f101112131415161718181819",
    ),
    ({}, "a0"),
    ({1: 2, 3: 4}, "a201020304"),
    ({"a": 1, "b": [2, 3]}, "a26161016162820203"),
    (["a", {"b": "c"}], "826161a161626163"),
    (
        {"a": "A", "b": "B", "c": "C", "d": "D", "e": "E"},
        "a56161614161626142616361436164614461656145",
    ),
)

# RFC 8949 Appendix A floats in half/single precision: decoded only (this codec
# writes every finite float as float64, as cbor2 does).
RFC_DECODE_ONLY = (
    (0.0, "f90000"),
    (_NEG_ZERO, "f98000"),
    (1.0, "f93c00"),
    (1.5, "f93e00"),
    (65504.0, "f97bff"),
    (100000.0, "fa47c35000"),
    (_F32_MAX, "fa7f7fffff"),
    (_F16_MIN, "f90001"),
    (0.00006103515625, "f90400"),
    (-4.0, "f9c400"),
    (_INF, "fa7f800000"),
    (_NAN, "fa7fc00000"),
    (-_INF, "faff800000"),
    (_INF, "fb7ff0000000000000"),
    (_NAN, "fb7ff8000000000000"),
    (-_INF, "fbfff0000000000000"),
)

# RFC 8949 Appendix A items outside the subset: all must be refused.
RFC_REJECTED = (
    "f7",  # undefined
    "f0",  # simple(16)
    "f8ff",  # simple(255)
    "c074323031332d30332d32315432303a30343a30305a",  # tag 0
    "c11a514b67b0",  # tag 1
    "c249010000000000000000",  # bignum
    "d74401020304",  # tag 23
    "d818456449455446",  # tag 24
    "5f42010243030405ff",  # indefinite bytes
    "7f657374726561646d696e67ff",  # indefinite text
    "9fff",
    "9f018202039f0405ffff",
    "83018202039f0405ff",
    "bf61610161629f0203ffff",
    "826161bf61626163ff",
    "bf6346756ef563416d7421ff",
)


def test_rfc_examples_encode():
    for value, want in RFC_BOTH:
        got = _hex(cbor.dumps(value))
        assert got == want, (value, got, want)


def test_rfc_examples_decode():
    for want, text in RFC_BOTH + RFC_DECODE_ONLY:
        got = cbor.loads(_h(text))
        assert _same(got, want), (text, got, want)


def test_rfc_examples_outside_subset_rejected():
    for text in RFC_REJECTED:
        with raises(CBORDecodeError):
            cbor.loads(_h(text))


def test_finite_floats_encode_as_float64():
    assert _hex(cbor.dumps(0.0)) == "fb0000000000000000"
    assert _hex(cbor.dumps(_NEG_ZERO)) == "fb8000000000000000"
    assert _hex(cbor.dumps(1.0)) == "fb3ff0000000000000"
    assert _hex(cbor.dumps(1.5)) == "fb3ff8000000000000"
    assert _same(cbor.loads(cbor.dumps(_NEG_ZERO)), _NEG_ZERO)
    assert _same(cbor.loads(cbor.dumps(5e-324)), 5e-324)


def test_tuple_and_bytearray_encode_like_list_and_bytes():
    assert cbor.dumps((1, 2)) == cbor.dumps([1, 2]) == _h("820102")
    assert cbor.dumps(bytearray(b"\x01\x02")) == _h("420102")
    assert cbor.loads(_h("420102")) == b"\x01\x02"
    assert isinstance(cbor.loads(_h("420102")), bytes)


def test_every_proper_prefix_is_truncated():
    samples = [t for _, t in RFC_BOTH + RFC_DECODE_ONLY] + [
        "1b0000000100000000",
        "3b0000000100000000",
        "5a00000003010203",
        "7903e8" + "61" * 1000,
        "a3" + "0102" + "0304" + "0506",
        "8218ff19ffff",
    ]
    checked = 0
    for text in samples:
        data = _h(text)
        for n in range(len(data)):
            with raises(CBORDecodeError):
                cbor.loads(data[:n])
            checked += 1
    assert checked > 1000


def test_truncated_heads_every_major():
    # a head announcing 1, 2, 4 or 8 argument bytes, cut inside the argument
    for major in range(8):
        for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
            if major == 7 and info == 24:
                continue  # simple value: rejected for another reason, tested below
            head = bytes([(major << 5) | info]) + b"\x01" * size
            for n in range(1, size + 1):
                with raises(CBORDecodeError):
                    cbor.loads(head[:n])


def test_indefinite_lengths_rejected():
    for ib in (0x1F, 0x3F, 0x5F, 0x7F, 0x9F, 0xBF, 0xDF):
        with raises(CBORDecodeError):
            cbor.loads(bytes([ib]) + b"\xff")
        with raises(CBORDecodeError):
            cbor.loads(bytes([ib]))
    with raises(CBORDecodeError) as e:
        cbor.loads(b"\x9f\x01\xff")
    assert "indefinite" in str(e.value)


def test_tags_rejected():
    for ib in range(0xC0, 0xDC):
        with raises(CBORDecodeError):
            cbor.loads(bytes([ib]) + b"\x00\x00\x00\x00\x00\x00\x00\x00\x01")
    with raises(CBORDecodeError) as e:
        cbor.loads(b"\xc0\x60")
    assert "tag" in str(e.value)


def test_simple_values_rejected():
    for ib in range(0xE0, 0xF4):  # simple(0) .. simple(19)
        with raises(CBORDecodeError):
            cbor.loads(bytes([ib]))
    for data in (b"\xf7", b"\xf8\x00", b"\xf8\x20", b"\xf8\xff", b"\xf8"):
        with raises(CBORDecodeError):
            cbor.loads(data)


def test_break_rejected():
    with raises(CBORDecodeError) as e:
        cbor.loads(b"\xff")
    assert "break" in str(e.value)
    with raises(CBORDecodeError):
        cbor.loads(b"\x82\x01\xff")


def test_reserved_additional_info_rejected():
    for major in range(7):
        for info in (28, 29, 30):
            with raises(CBORDecodeError) as e:
                cbor.loads(bytes([(major << 5) | info]) + b"\x00" * 9)
            assert "reserved" in str(e.value), (major, info)
    for ib in (0xFC, 0xFD, 0xFE):
        with raises(CBORDecodeError):
            cbor.loads(bytes([ib]))


def test_huge_declared_lengths_rejected_without_allocating():
    hostile = (
        "9affffffff",  # array of 2**32 - 1 items in 5 bytes
        "9b0000000100000000",  # array of 2**32 items
        "9bffffffffffffffff",  # array of 2**64 - 1 items
        "bbffffffffffffffff",  # map of 2**64 - 1 pairs
        "bb8000000000000000",  # map whose pair count doubles past 2**64
        "baffffffff",
        "5bffffffffffffffff",  # byte string of 2**64 - 1 bytes
        "5affffffff00",
        "7bffffffffffffffff",
        "7a7fffffff61",
        "a20102",  # map of 2 pairs with one pair
    )
    for text in hostile:
        with raises(CBORDecodeError) as e:
            cbor.loads(_h(text))
        assert "truncated" in str(e.value), (text, str(e.value))
    # an array with too few bytes left is refused before its items are read
    with raises(CBORDecodeError):
        cbor.loads(_h("9a00010000") + b"\x01" * 100)


def test_nesting_depth_limit():
    d = cbor.DEFAULT_MAX_DEPTH
    assert d == 8
    ok = b"\x81" * d + b"\x01"
    assert cbor.loads(ok) == _nested(d)
    with raises(CBORDecodeError) as e:
        cbor.loads(b"\x81" * (d + 1) + b"\x01")
    assert "nesting" in str(e.value)
    # maps count too: {0: {0: ... 1}}
    with raises(CBORDecodeError):
        cbor.loads(b"\xa1\x00" * (d + 1) + b"\x01")
    assert cbor.loads(b"\xa1\x00" * d + b"\x01") is not None
    # deep hostile nesting fails cleanly, no RecursionError
    with raises(CBORDecodeError):
        cbor.loads(b"\x81" * 5000 + b"\x01")
    # max_depth is a parameter
    with raises(CBORDecodeError):
        cbor.loads(b"\x81\x81\x01", max_depth=1)
    assert cbor.loads(b"\x81\x81\x01", max_depth=2) == [[1]]
    assert cbor.loads(b"\x01", max_depth=0) == 1


def _nested(depth, leaf=1):
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def test_encoder_and_decoder_agree_on_depth():
    d = cbor.DEFAULT_MAX_DEPTH
    for depth in (d - 1, d):
        v = _nested(depth)
        assert cbor.loads(cbor.dumps(v)) == v
        v = _nested(depth, [])
        assert cbor.loads(cbor.dumps(v)) == v
    with raises(CBOREncodeError):
        cbor.dumps(_nested(d + 1))
    with raises(CBOREncodeError):
        cbor.dumps(_nested(2), max_depth=1)
    # an empty container at depth d+1 is one level too deep for both
    with raises(CBOREncodeError):
        cbor.dumps(_nested(d + 1, []))
    with raises(CBORDecodeError):
        cbor.loads(b"\x81" * (d + 1) + b"\x80")


def test_duplicate_map_keys_rejected():
    for text in ("a201020103", "a261610161610262", "a2410001410002", "a3010200000103"):
        with raises(CBORDecodeError) as e:
            cbor.loads(_h(text))
        assert "duplicate" in str(e.value), text


def test_unsupported_map_keys_rejected():
    for text in (
        "a18001",  # array key
        "a1a001",  # map key
        "a1f93c0001",  # float16 key
        "a1fb3ff000000000000001",  # float64 key
        "a1f501",  # true key (bool is an int subclass: must still be refused)
        "a1f401",
        "a1f601",  # null key
    ):
        with raises(CBORDecodeError) as e:
            cbor.loads(_h(text))
        assert "key" in str(e.value), text


def test_supported_map_keys():
    got = cbor.loads(_h("a3 01 02 6161 03 4100 04"))
    assert got == {1: 2, "a": 3, b"\x00": 4}
    assert cbor.loads(_h("a1 20 01")) == {-1: 1}


def test_invalid_utf8_rejected():
    bad = (
        "61ff",  # never valid in UTF-8
        "6180",  # lone continuation byte
        "62c328",  # lead byte without its continuation
        "61c3",  # truncated sequence
        "62c080",  # overlong NUL
        "62c1bf",  # overlong
        "63e08080",  # overlong 3-byte form
        "64f0808080",  # overlong 4-byte form
        "63eda080",  # UTF-16 surrogate U+D800
        "63edbfbf",  # UTF-16 surrogate U+DFFF
        "64f4908080",  # U+110000, beyond Unicode
        "65f888808080",  # 5-byte form
    )
    for text in bad:
        with raises(CBORDecodeError) as e:
            cbor.loads(_h(text))
        assert "UTF-8" in str(e.value), text


def test_valid_utf8_edges_accepted():
    for ch in (0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x10FFFF):
        s = chr(ch)
        data = cbor.dumps(s)
        assert cbor.loads(data) == s, hex(ch)


def test_trailing_bytes_rejected_by_loads():
    with raises(CBORDecodeError) as e:
        cbor.loads(b"\x01\x02")
    assert "trailing" in str(e.value)
    with raises(CBORDecodeError):
        cbor.loads(b"\x80\x00")
    with raises(CBORDecodeError):
        cbor.loads(b"")


def test_decode_from_reports_end_and_honours_bounds():
    buf = bytearray(b"\xee\xee\x82\x01\x02\x18\x64\xee")
    v, end = cbor.decode_from(buf, 2)
    assert v == [1, 2] and end == 5
    v, end = cbor.decode_from(buf, 5, 7)
    assert v == 100 and end == 7
    # end cuts the item short: truncated, even though the bytes exist in buf
    with raises(CBORDecodeError):
        cbor.decode_from(buf, 2, 4)
    assert cbor.loads(memoryview(b"\x83\x01\x02\x03")) == [1, 2, 3]


def test_non_shortest_heads_decode():
    assert cbor.loads(b"\x18\x00") == 0
    assert cbor.loads(b"\x19\x00\x01") == 1
    assert cbor.loads(b"\x1a\x00\x00\x00\x17") == 23
    assert cbor.loads(b"\x1b\x00\x00\x00\x00\x00\x00\x00\x01") == 1
    assert cbor.loads(b"\x38\x00") == -1
    assert cbor.loads(b"\x58\x01\x41") == b"A"


def test_float16_every_value():
    # exhaustive against the interpreter's own IEEE half-precision unpacking
    buf = bytearray(b"\xf9\x00\x00")
    h = 0
    while h < 0x10000:
        buf[1] = h >> 8
        buf[2] = h & 0xFF
        got = cbor.loads(buf)
        want = struct.unpack(">e", buf[1:])[0]
        assert isinstance(got, float)
        assert _same(got, want), (hex(h), got, want)
        h += 1


def test_float16_special_values():
    assert cbor.loads(_h("f90001")) == _F16_MIN  # smallest subnormal
    assert cbor.loads(_h("f903ff")) == math.ldexp(1023, -24)  # largest subnormal
    assert cbor.loads(_h("f98001")) == -_F16_MIN
    assert cbor.loads(_h("f90400")) == math.ldexp(1.0, -14)  # smallest normal
    assert cbor.loads(_h("f93555")) == 0.333251953125
    assert cbor.loads(_h("f97c00")) == _INF
    assert cbor.loads(_h("f9fc00")) == -_INF
    for text in ("f97e00", "f97c01", "f9fe00", "f97fff"):
        v = cbor.loads(_h(text))
        assert v != v, text
    z = cbor.loads(_h("f98000"))
    assert z == 0.0 and math.copysign(1.0, z) == -1.0
    z = cbor.loads(_h("f90000"))
    assert z == 0.0 and math.copysign(1.0, z) == 1.0


def test_float32():
    assert cbor.loads(_h("fa47c35000")) == 100000.0
    assert cbor.loads(_h("fa3f800000")) == 1.0
    assert cbor.loads(_h("fa3dcccccd")) == struct.unpack(">f", _h("3dcccccd"))[0]
    assert cbor.loads(_h("fa00000001")) == math.ldexp(1.0, -149)  # smallest subnormal
    assert cbor.loads(_h("fa7f7fffff")) == _F32_MAX
    z = cbor.loads(_h("fa80000000"))
    assert z == 0.0 and math.copysign(1.0, z) == -1.0
    v = cbor.loads(_h("fa7fc00000"))
    assert v != v


def test_map_key_order_is_deterministic():
    pairs = [
        (10, "a"),
        (-1, "b"),
        (100, "c"),
        (1000, "d"),
        ("a", 1),
        ("z", 2),
        ("aa", 3),
        (b"x", 4),
    ]
    # length of the encoded key first, then bytewise
    want = (
        "a8"
        + "0a6161"
        + "206162"
        + "18646163"
        + "417804"
        + "616101"
        + "617a02"
        + "1903e86164"
        + "62616103"
    )
    forward = {}
    for k, v in pairs:
        forward[k] = v
    backward = {}
    for k, v in reversed(pairs):
        backward[k] = v
    rotated = {}
    for k, v in pairs[3:] + pairs[:3]:
        rotated[k] = v
    for d in (forward, backward, rotated):
        assert _hex(cbor.dumps(d)) == want
    # nested maps are sorted too
    assert _hex(cbor.dumps({"b": {2: 0, 1: 0}, "a": 0})) == "a26161006162a201000200"


def test_map_key_order_many_keys():
    # more keys than any dict ordering could get right by accident
    keys = [i * 37 % 101 - 50 for i in range(101)]
    d1 = {}
    for k in keys:
        d1[k] = k
    d2 = {}
    for k in sorted(keys):
        d2[k] = k
    data = cbor.dumps(d1)
    assert data == cbor.dumps(d2)
    # and the keys come out in canonical order: 0..23, -1..-24, then 2-byte heads
    out = []
    pos = cbor.head_len(len(keys))  # skip the map head
    while pos < len(data):
        k, pos = cbor.decode_from(data, pos)
        _, pos = cbor.decode_from(data, pos)
        out.append(k)
    assert out == list(range(24)) + [-1 - i for i in range(24)] + list(range(24, 51)) + [
        -25 - i for i in range(26)
    ], out


def test_encode_integer_range():
    assert cbor.loads(cbor.dumps(2**64 - 1)) == 2**64 - 1
    assert cbor.loads(cbor.dumps(-(2**64))) == -(2**64)
    for bad in (2**64, -(2**64) - 1, 2**100, -(2**100)):
        with raises(CBOREncodeError):
            cbor.dumps(bad)
        with raises(CBOREncodeError):
            cbor.dumps([1, {"k": bad}])


def test_encode_unsupported_types():
    for bad in (set([1]), object(), len, ProtocolError, {"k": set()}, [1, object()]):
        with raises(CBOREncodeError):
            cbor.dumps(bad)
    for bad_key in (1.5, None, True, (1, 2)):
        with raises(CBOREncodeError):
            cbor.dumps({bad_key: 1})
    # errors are ProtocolErrors (and ValueErrors) with a kind for the counters
    with raises(ValueError) as e:
        cbor.dumps(object())
    assert e.value.kind == "unencodable"


def test_bool_is_not_encoded_as_int():
    assert cbor.dumps(True) == b"\xf5"
    assert cbor.dumps([False, 0, True, 1]) == b"\x84\xf4\x00\xf5\x01"
    assert cbor.loads(b"\xf5") is True


# Boundaries of the head encodings, with the expected head length.
BOUNDARIES = (
    (0, 1),
    (23, 1),
    (24, 2),
    (255, 2),
    (256, 3),
    (65535, 3),
    (65536, 5),
    (2**32 - 1, 5),
    (2**32, 9),
    (2**64 - 1, 9),
)


def test_head_len_matches_put_head_at_boundaries():
    buf = bytearray(12)
    for value, want in BOUNDARIES:
        assert cbor.head_len(value) == want, value
        for major in range(6):
            end = cbor.put_head(buf, 2, major, value)
            assert end == 2 + want, (major, value, end)
            assert buf[2] >> 5 == major
            # the head decodes back: for a uint head that is the value itself
            if major == 0:
                assert cbor.loads(buf[2:end]) == value
            # and the argument read back equals value
            v, pos = _read_head(buf, 2)
            assert (v, pos) == (value, end), (major, value, v, pos)


def _read_head(buf, off):
    info = buf[off] & 0x1F
    if info < 24:
        return info, off + 1
    size = {24: 1, 25: 2, 26: 4, 27: 8}[info]
    v = 0
    for i in range(size):
        v = (v << 8) | buf[off + 1 + i]
    return v, off + 1 + size


def test_put_int_and_int_len_at_boundaries():
    values = []
    for v, _ in BOUNDARIES:
        values.append(v)
        values.append(-1 - v)  # the matching negative boundary
    values += [-24, -25, -256, -257, -65536, -65537, -(2**32), -(2**32) - 1]
    buf = bytearray(10)
    for v in values:
        end = cbor.put_int(buf, 1, v)
        n = end - 1
        assert n == cbor.int_len(v), (v, n)
        assert bytes(buf[1:end]) == cbor.dumps(v), v
        assert cbor.loads(buf[1:end]) == v, v
    # spot-check exact bytes at the negative boundaries
    assert cbor.dumps(-24) == b"\x37"
    assert cbor.dumps(-25) == b"\x38\x18"
    assert cbor.dumps(-256) == b"\x38\xff"
    assert cbor.dumps(-257) == b"\x39\x01\x00"
    assert cbor.dumps(-65537) == b"\x3a\x00\x01\x00\x00"
    assert cbor.dumps(-(2**32) - 1) == b"\x3b\x00\x00\x00\x01\x00\x00\x00\x00"


def test_put_int_does_not_allocate():
    # from a list: a constant tuple's ints beyond 0x1FFF freeze as big ints (whose
    # arithmetic allocates on the MCU: tests/test_frozen_ints.py); these are small ints
    values = tuple(
        [0, 1, 23, 24, 255, 256, 65535, 65536, 2**30 - 1, -1, -24, -25, -257, -65537, _MIN_SMALL]
    )
    buf = bytearray(16)
    total = 0
    if IS_MICROPYTHON:
        import micropython

        micropython.heap_lock()
    try:
        i = 0
        while i < len(values):
            v = values[i]
            end = cbor.put_int(buf, 0, v)
            end = cbor.put_head(buf, end, 4, v if v >= 0 else -1 - v)  # CBOR's argument
            total += end
            i += 1
    finally:
        if IS_MICROPYTHON:
            micropython.heap_unlock()
    want = 0
    for v in values:
        want += cbor.int_len(v) + cbor.head_len(v if v >= 0 else -1 - v)
    assert total == want
