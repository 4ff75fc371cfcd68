"""protocol.sha256 on CPython and under MicroPython: the FIPS 180-2 vectors, every
padding boundary, incremental updates, state copies, and no allocation."""

import hashlib

from mpcompat import IS_MICROPYTHON, heap_locked, raises
from protocol_samples import XorShift32

from protocol.sha256 import DIGEST_LEN, Sha256, sha256

DUAL = True

# FIPS 180-2 appendix B (and the 896-bit message of FIPS 180-4's examples).
FIPS = (
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (
        b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    ),
    (
        b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
        b"ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
    ),
)
MILLION_A = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"


def _hex(h):
    out = bytearray(DIGEST_LEN)
    h.digest_into(out, 0)
    return bytes(out).hex()


def test_fips_vectors():
    for msg, want in FIPS:
        assert sha256(msg).hex() == want, (msg, sha256(msg).hex())
        h = Sha256()
        h.update_from(bytearray(msg), 0, len(msg))
        assert _hex(h) == want, msg


def test_one_million_a():
    chunk = b"a" * 1000
    h = Sha256()
    for _ in range(1000):
        h.update_from(chunk, 0, 1000)
    assert _hex(h) == MILLION_A


def test_every_padding_boundary_matches_hashlib():
    # lengths 0..200 cover 55/56/57 (one or two padding blocks), 63/64/65, 119/120/121
    data = XorShift32(7).buffer(200)
    for n in range(201):
        want = hashlib.sha256(bytes(data[:n])).digest()
        assert sha256(data[:n]) == want, n


def test_update_from_any_split_and_offsets():
    rng = XorShift32(11)
    data = rng.buffer(300)
    want = hashlib.sha256(bytes(data[5:280])).digest()
    h = Sha256()
    for cut in (0, 1, 63, 64, 65, 128, 200, 275):
        h.reset()
        h.update_from(data, 5, 5 + cut)
        h.update_from(memoryview(data), 5 + cut, 280)
        out = bytearray(40)
        h.digest_into(out, 8)
        assert bytes(out[8:40]) == want, cut
        assert out[:8] == bytearray(8)  # nothing written before the offset
    # many small pieces, including empty ones
    h.reset()
    i = 5
    step = 0
    while i < 280:
        j = min(280, i + step % 9)
        h.update_from(data, i, j)
        i = j
        step += 1
    assert _hex(h) == want.hex()


def test_copy_from_forks_a_state():
    prefix = bytes(range(64)) + b"xyz"
    base = Sha256()
    base.update_from(prefix, 0, len(prefix))  # a full block plus a partial one
    a = Sha256()
    b = Sha256()
    a.copy_from(base)
    b.copy_from(base)
    a.update_from(b"one", 0, 3)
    b.update_from(b"two!", 0, 4)
    assert _hex(a) == hashlib.sha256(prefix + b"one").digest().hex()
    assert _hex(b) == hashlib.sha256(prefix + b"two!").digest().hex()
    assert _hex(base) == hashlib.sha256(prefix).digest().hex()  # untouched by the copies


def test_digest_finalises_until_reset():
    h = Sha256()
    h.update_from(b"abc", 0, 3)
    _hex(h)
    with raises(ValueError, match="reset"):
        h.update_from(b"d", 0, 1)
    with raises(ValueError, match="reset"):
        _hex(h)
    h.reset()
    h.update_from(b"abc", 0, 3)
    assert _hex(h) == FIPS[0][1]


def test_no_allocation_for_a_300_byte_message():
    data = XorShift32(3).buffer(300)
    want = hashlib.sha256(bytes(data)).digest()
    h = Sha256()
    g = Sha256()
    out = bytearray(DIGEST_LEN)

    def run():
        i = 0
        while i < 20:
            h.reset()
            h.update_from(data, 0, 7)  # partial block first, then whole blocks in place
            h.update_from(data, 7, 300)
            g.copy_from(h)
            g.digest_into(out, 0)
            i += 1

    heap_locked(run)
    assert bytes(out) == want
    if IS_MICROPYTHON:
        import micropython

        failed = False
        micropython.heap_lock()
        try:
            bytearray(4)  # the lock is real: anything that allocates fails
        except MemoryError:
            failed = True
        finally:
            micropython.heap_unlock()
        assert failed
