"""device/nonce.py: the per-boot nonce, with and without os.urandom (STM32F411)."""

import time

from mpcompat import tmpdir

from device import nonce as N

DUAL = True
UID = b"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c"


def test_urandom_is_used_where_the_port_has_it():
    got, source = N.boot_nonce(8, "/nonexistent", UID, urandom=lambda n: b"\xab" * n)
    assert (got, source) == (b"\xab" * 8, "urandom"), (got, source)


def test_without_rng_every_boot_gets_a_new_nonce_and_the_counter_persists():
    d = tmpdir()
    seen = set()
    for boot in range(1, 21):
        got, source = N.boot_nonce(8, d, UID, urandom=False)
        assert source == "counter", source
        assert len(got) == 8, got
        assert got not in seen, boot
        seen.add(got)
        assert N._read_counter(d + "/" + N.COUNTER_FILE) == boot


def test_a_torn_counter_file_starts_again_and_still_differs():
    d = tmpdir()
    first, _ = N.boot_nonce(8, d, UID, urandom=False)
    with open(d + "/" + N.COUNTER_FILE, "wb") as fh:
        fh.write(b"\x00\x01")  # torn: not 8 bytes
    time.sleep(0.005)  # a later boot: its tick differs (both calls in one ms did not)
    second, source = N.boot_nonce(8, d, UID, urandom=False)
    assert source == "counter", source
    assert N._read_counter(d + "/" + N.COUNTER_FILE) == 1
    assert first != second  # same counter value, different boot tick


def test_an_unwritable_filesystem_is_reported_as_fallback():
    got, source = N.boot_nonce(8, "/nonexistent/dir", UID, urandom=False)
    assert source == "fallback", source
    assert len(got) == 8, got


def test_two_modules_with_the_same_counter_differ_by_unique_id():
    x, _ = N.boot_nonce(8, tmpdir(), UID, urandom=False)
    y, _ = N.boot_nonce(8, tmpdir(), b"\xff" * 12, urandom=False)
    assert x != y
