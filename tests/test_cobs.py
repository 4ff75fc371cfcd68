"""COBS (protocol.cobs): published vectors, round trips, bounds, hostile input."""

from mpcompat import IS_MICROPYTHON, raises
from protocol_samples import XorShift32

from protocol import cobs
from protocol.errors import FrameError, OversizeError

DUAL = True


def _seq(a, b):
    """bytes a, a+1, ..., b (inclusive)."""
    return bytes(range(a, b + 1))


# Examples from the Wikipedia article "Consistent Overhead Byte Stuffing" (which follow
# Cheshire & Baker), canonical COBS, without the trailing delimiter.
VECTORS = (
    (b"", b"\x01"),
    (b"\x00", b"\x01\x01"),
    (b"\x00\x00", b"\x01\x01\x01"),
    (b"\x00\x11\x00", b"\x01\x02\x11\x01"),
    (b"\x11\x22\x00\x33", b"\x03\x11\x22\x02\x33"),
    (b"\x11\x22\x33\x44", b"\x05\x11\x22\x33\x44"),
    (b"\x11\x00\x00\x00", b"\x02\x11\x01\x01\x01"),
    # 254 non-zero bytes: one full block, no trailing code byte
    (_seq(0x01, 0xFE), b"\xff" + _seq(0x01, 0xFE)),
    # a zero, then 254 non-zero bytes
    (_seq(0x00, 0xFE), b"\x01\xff" + _seq(0x01, 0xFE)),
    # 255 non-zero bytes: full block, then a block of one
    (_seq(0x01, 0xFF), b"\xff" + _seq(0x01, 0xFE) + b"\x02\xff"),
    # 254 non-zero bytes then a zero
    (_seq(0x02, 0xFF) + b"\x00", b"\xff" + _seq(0x02, 0xFF) + b"\x01\x01"),
    # 253 non-zero, a zero, one more
    (_seq(0x03, 0xFF) + b"\x00\x01", b"\xfe" + _seq(0x03, 0xFF) + b"\x02\x01"),
)


def test_published_vectors_encode():
    for raw, enc in VECTORS:
        got = bytes(cobs.encode(raw))
        assert got == enc, (raw[:8], got[:8], len(got), len(enc))


def test_published_vectors_decode():
    for raw, enc in VECTORS:
        got = bytes(cobs.decode(enc))
        assert got == raw, (enc[:8], got[:8])


def test_docstring_example():
    assert bytes(cobs.encode(b"\x11\x00\x22")) == b"\x02\x11\x02\x22"


def test_all_zero_input():
    for n in (1, 2, 10, 254, 255, 600):
        enc = bytes(cobs.encode(bytes(n)))
        assert enc == b"\x01" * (n + 1), n
        assert bytes(cobs.decode(enc)) == bytes(n), n


def test_block_boundaries():
    # around the 254-byte block size, with and without a trailing zero
    for n in (252, 253, 254, 255, 256, 507, 508, 509, 510):
        for tail in (b"", b"\x00"):
            raw = bytes([1 + i % 255 for i in range(n)]) + tail
            enc = cobs.encode(raw)
            assert len(enc) <= cobs.max_encoded_len(len(raw)), (n, tail)
            assert b"\x00" not in enc, (n, tail)
            assert bytes(cobs.decode(enc)) == raw, (n, tail)


def test_max_encoded_len():
    assert cobs.max_encoded_len(0) == 1
    assert cobs.max_encoded_len(1) == 2
    assert cobs.max_encoded_len(253) == 254
    assert cobs.max_encoded_len(254) == 256
    assert cobs.max_encoded_len(512) == 515
    # the worst case is reached by a run of non-zero bytes
    for n in (1, 253, 300, 508):
        raw = b"\x42" * n
        assert len(cobs.encode(raw)) <= cobs.max_encoded_len(n), n


def test_round_trip_random_buffers():
    rng = XorShift32(11)
    mixes = ((0, 0), (50, 0), (0, 50), (30, 30), (90, 5), (2, 2))
    lengths = (0, 1, 2, 3, 100, 253, 254, 255, 256, 300, 509, 512)
    count = 0
    for zero_pct, ff_pct in mixes:
        for n in lengths:
            raw = bytes(rng.buffer(n, zero_pct, ff_pct))
            enc = cobs.encode(raw)
            assert b"\x00" not in enc, (zero_pct, ff_pct, n)
            assert len(enc) <= cobs.max_encoded_len(n), (zero_pct, ff_pct, n)
            assert bytes(cobs.decode(enc)) == raw, (zero_pct, ff_pct, n)
            count += 1
    # random lengths too
    for _ in range(60):
        n = rng.below(700)
        raw = bytes(rng.buffer(n, rng.below(60), rng.below(40)))
        enc = cobs.encode(raw)
        assert b"\x00" not in enc, n
        assert bytes(cobs.decode(enc)) == raw, n
        count += 1
    assert count == len(mixes) * len(lengths) + 60


def test_encode_into_offset_and_return_value():
    raw = b"\x11\x22\x00\x33"
    dst = bytearray(b"\xee" * 10)
    end = cobs.encode_into(raw, 4, dst, 3)
    assert end == 8
    assert bytes(dst) == b"\xee\xee\xee\x03\x11\x22\x02\x33\xee\xee"
    # src_len shorter than the buffer: only the prefix is encoded
    dst = bytearray(8)
    end = cobs.encode_into(b"\x11\x22\x00\x33", 2, dst, 0)
    assert bytes(dst[:end]) == b"\x03\x11\x22"


def test_encode_into_exact_size_buffer():
    for raw in (b"", b"\x00", b"\x01" * 254, b"\x01" * 300):
        n = cobs.max_encoded_len(len(raw))
        dst = bytearray(n)
        end = cobs.encode_into(raw, len(raw), dst, 0)
        assert end <= n
        assert bytes(dst[:end]) == bytes(cobs.encode(raw))


def test_encode_into_too_small_raises_and_writes_nothing():
    raw = b"\x11\x22\x00\x33" * 20
    need = cobs.max_encoded_len(len(raw))
    for size, off in ((0, 0), (need - 1, 0), (need, 1), (need + 4, 5)):
        dst = bytearray(b"\xaa" * size)
        with raises(OversizeError):
            cobs.encode_into(raw, len(raw), dst, off)
        assert dst == bytearray(b"\xaa" * size), (size, off)
    # OversizeError is a FrameError
    with raises(FrameError):
        cobs.encode_into(raw, len(raw), bytearray(3), 0)


def test_decode_rejects_zero_inside():
    for bad in (b"\x00", b"\x00\x01", b"\x03\x11\x00", b"\x02\x11\x00\x01", b"\x01\x00"):
        with raises(FrameError):
            cobs.decode(bad)


def test_decode_rejects_code_past_end():
    for bad in (b"\x02", b"\x05\x11\x22", b"\xff" + b"\x01" * 253, b"\x01\x03\x11"):
        with raises(FrameError) as e:
            cobs.decode(bad)
        assert "past the end" in str(e.value), bad


def test_decode_into_too_small_dst():
    enc = bytes(cobs.encode(b"\x11\x22\x33\x44"))
    dst = bytearray(3)
    with raises(OversizeError):
        cobs.decode_into(enc, len(enc), dst)
    # the implicit zero between blocks also counts
    enc = bytes(cobs.encode(b"\x11\x00\x22"))
    with raises(OversizeError):
        cobs.decode_into(enc, len(enc), bytearray(2))
    assert cobs.decode_into(enc, len(enc), bytearray(3)) == 3
    # a lone zero byte needs one byte of room
    with raises(OversizeError):
        cobs.decode_into(b"\x01\x01", 2, bytearray(0))
    dst = bytearray(1)
    assert cobs.decode_into(b"\x01\x01", 2, dst) == 1 and dst[0] == 0


def test_decode_into_uses_src_len():
    # bytes beyond src_len (e.g. the rest of a receive buffer) are ignored
    buf = bytearray(b"\x03\x11\x22\x00\xff\xff")
    dst = bytearray(8)
    n = cobs.decode_into(buf, 3, dst)
    assert bytes(dst[:n]) == b"\x11\x22"


def test_encode_decode_into_do_not_allocate():
    raw = bytearray(b"\x11\x00\x22" * 100)
    enc = bytearray(cobs.max_encoded_len(len(raw)))
    back = bytearray(len(raw))
    cobs.encode_into(raw, len(raw), enc, 0)  # warm up
    if IS_MICROPYTHON:
        import micropython

        micropython.heap_lock()
    try:
        end = cobs.encode_into(raw, len(raw), enc, 0)
        n = cobs.decode_into(enc, end, back)
    finally:
        if IS_MICROPYTHON:
            micropython.heap_unlock()
    assert n == len(raw)
    assert back == raw
