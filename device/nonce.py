"""The module's per-boot nonce, also on chips without a random number generator.

Signed commands (protocol/sign.py, SPEC "Signed commands") are bound to a nonce the
module draws at every boot, so a command recorded before a reboot cannot be replayed
after it. What the nonce needs is to be *unique per boot* of one module; it does not
need to be secret (it is sent in ``hello``).

Where the port has ``os.urandom`` (rp2, the pyboard's STM32F405 with its RNG, the unix
port, CPython) that is used. The STM32F411 has no RNG, so its MicroPython images have
no ``os.urandom``; there the nonce is the first bytes of

    SHA-256("modbridge-nonce" | unique_id | boot counter | ticks_us at boot)

where the boot counter lives in ``<fs_dir>/boot.count`` and is incremented and written
back *before* the nonce is used. Two boots of one module therefore never share a
counter value as long as the write lands; if the filesystem refuses it (full, read
only), the counter read is still mixed in with the microsecond tick, and ``fallback``
in the result says so (kept as ``App.nonce_source``).

Runs once at boot, so it may allocate.
"""

import os

from protocol import sha256

COUNTER_FILE = "boot.count"
_DOMAIN = b"modbridge-nonce"


def _ticks_us():
    try:
        import time

        return time.ticks_us() & 0x3FFFFFFF
    except AttributeError:  # CPython
        import time

        return time.perf_counter_ns() // 1000 & 0x3FFFFFFF


def _read_counter(path):
    try:
        with open(path, "rb") as fh:
            raw = fh.read(9)
    except OSError:
        return 0
    if len(raw) != 8:
        return 0  # missing, torn or foreign: start again (the tick still differs)
    n = 0
    for b in raw:
        n = (n << 8) | b
    return n


def _write_counter(path, n):
    out = bytearray(8)
    for i in range(8):
        out[7 - i] = (n >> (8 * i)) & 0xFF
    try:
        with open(path, "wb") as fh:
            fh.write(out)
        return True
    except OSError:
        return False


def boot_nonce(n, fs_dir, unique_id, urandom=None):
    """``(nonce, source)``: ``n`` bytes, ``source`` "urandom", "counter" or "fallback".

    ``urandom`` defaults to ``os.urandom`` where the port has it; pass ``False`` to
    force the counter path (tests, and chips whose RNG is known bad)."""
    if urandom is None:
        urandom = getattr(os, "urandom", None)
    if urandom:
        return urandom(n), "urandom"
    path = fs_dir.rstrip("/") + "/" + COUNTER_FILE
    count = _read_counter(path) + 1
    stored = _write_counter(path, count)
    h = sha256.Sha256()
    h.update_from(_DOMAIN, 0, len(_DOMAIN))
    uid = bytes(unique_id)
    h.update_from(uid, 0, len(uid))
    mix = bytearray(12)
    for i in range(8):
        mix[i] = (count >> (8 * (7 - i))) & 0xFF
    t = _ticks_us()
    for i in range(4):
        mix[8 + i] = (t >> (8 * (3 - i))) & 0xFF
    h.update_from(mix, 0, len(mix))
    out = bytearray(sha256.DIGEST_LEN)
    h.digest_into(out, 0)
    return bytes(out[:n]), ("counter" if stored else "fallback")
