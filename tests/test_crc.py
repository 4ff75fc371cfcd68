"""CRC-16/IBM-3740 (protocol.crc): check value, vectors, offsets, chaining, error detection."""

from mpcompat import IS_MICROPYTHON
from protocol_samples import XorShift32

from protocol.crc import INIT, POLY, crc16

DUAL = True

# (data, CRC-16/IBM-3740); cross-checked against binascii.crc_hqx(data, 0xFFFF).
VECTORS = (
    (b"", 0xFFFF),
    (b"A", 0xB915),
    (b"123456789", 0x29B1),
    (b"\x00", 0xE1F0),
    (b"\xff", 0xFF00),
    (b"\x00\x00\x00\x00", 0x84C0),
    (b"\xff\xff\xff\xff", 0x1D0F),
    (bytes(range(256)), 0x3FBD),
    (b"The quick brown fox jumps over the lazy dog", 0x8FDD),
    (b"A" * 256, 0xEA0B),
)


def _bitwise_crc(data, crc=0xFFFF):
    """Independent bit-at-a-time reference (no table)."""
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def test_parameters():
    assert POLY == 0x1021
    assert INIT == 0xFFFF


def test_check_value():
    assert crc16(b"123456789") == 0x29B1
    assert crc16(bytearray(b"123456789")) == 0x29B1
    assert crc16(memoryview(b"123456789")) == 0x29B1


def test_empty_input_is_init():
    assert crc16(b"") == 0xFFFF
    assert crc16(b"abc", 1, 1) == 0xFFFF
    assert crc16(b"", crc=0x1234) == 0x1234


def test_known_vectors():
    for data, want in VECTORS:
        got = crc16(data)
        assert got == want, (data[:16], hex(got), hex(want))
        assert _bitwise_crc(data) == want, data[:16]


def test_matches_bitwise_reference_on_random_buffers():
    rng = XorShift32(1)
    for n in (1, 2, 3, 7, 64, 255):
        data = rng.buffer(n, zero_pct=20, ff_pct=20)
        assert crc16(data) == _bitwise_crc(data), n


def test_offsets_equal_slicing():
    rng = XorShift32(2)
    data = rng.buffer(40)
    for start in (0, 1, 5, 39, 40):
        for end in (start, start + 1, 20, 39, 40):
            if end < start or end > 40:
                continue
            assert crc16(data, start, end) == crc16(data[start:end]), (start, end)
    # end=-1 means "to the end"
    assert crc16(data, 7) == crc16(data[7:])
    assert crc16(data, 7, -1) == crc16(data[7:])


def test_incremental_continuation():
    rng = XorShift32(3)
    data = rng.buffer(100, zero_pct=10)
    for cut in (0, 1, 50, 99, 100):
        a = data[:cut]
        b = data[cut:]
        assert crc16(b, crc=crc16(a)) == crc16(data), cut
        # the same with offsets into one buffer, as the frame code does
        assert crc16(data, cut, 100, crc16(data, 0, cut)) == crc16(data), cut


def test_single_bit_errors_always_detected():
    rng = XorShift32(4)
    for _ in range(4):
        data = rng.buffer(64)
        good = crc16(data)
        for pos in range(64):
            for bit in range(8):
                data[pos] ^= 1 << bit
                assert crc16(data) != good, (pos, bit)
                data[pos] ^= 1 << bit
        assert crc16(data) == good


def test_burst_errors_up_to_16_bits_detected():
    # A CRC of degree 16 with a +1 term detects every burst of length <= 16.
    rng = XorShift32(5)
    data = rng.buffer(32)
    good = crc16(data)
    nbits = 32 * 8
    for _ in range(300):
        length = 1 + rng.below(16)
        start = rng.below(nbits - length + 1)
        # burst pattern: first and last bit set, random bits between
        pattern = 1 | (1 << (length - 1)) | (rng.next32() & ((1 << length) - 1))
        bad = bytearray(data)
        for k in range(length):
            if pattern & (1 << k):
                bitpos = start + k
                bad[bitpos >> 3] ^= 0x80 >> (bitpos & 7)
        assert crc16(bad) != good, (start, length, pattern)


def test_appended_crc_gives_zero_residue():
    # Non-reflected CRC without final XOR: data + big-endian CRC checks to 0.
    rng = XorShift32(6)
    for n in (0, 1, 9, 100):
        data = rng.buffer(n)
        c = crc16(data)
        assert crc16(data + bytes([c >> 8, c & 0xFF])) == 0, n


def test_does_not_allocate():
    # heap_lock() makes any allocation raise MemoryError (MicroPython only).
    data = bytearray(range(256))
    crc16(data)  # warm up
    if IS_MICROPYTHON:
        import micropython

        micropython.heap_lock()
    try:
        c = crc16(data, 0, 256)
        c = crc16(data, 10, 200, c)
    finally:
        if IS_MICROPYTHON:
            micropython.heap_unlock()
    assert c == crc16(data[10:200], crc=crc16(data))


def test_table_constants_are_the_polynomials():
    """protocol.crc's constant table (high and low bytes) is POLY's, entry by entry:
    the CRC of the one byte i from a register of 0 is entry i. (On MicroPython the
    tables are const()-folded, not module attributes: read through crc16 there.)"""
    from protocol import crc

    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ POLY) if c & 0x8000 else (c << 1)
            c &= 0xFFFF
        assert crc16(bytes([i]), 0, 1, 0) == c, i
        if not IS_MICROPYTHON:
            assert (crc._HI[i] << 8) | crc._LO[i] == c, i
    if not IS_MICROPYTHON:
        assert len(crc._HI) == len(crc._LO) == 256
