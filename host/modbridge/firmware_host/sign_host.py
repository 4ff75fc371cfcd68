"""Host side of signed commands (protocol/sign.py): signing, keys, timestamps.

Free to allocate; the firmware only verifies (protocol.sign.Verifier) and never
imports this module. ``protocol.sign`` forwards these names here on first use
(``sign.Signer``, ``from protocol.sign import new_key``), the API it always had.
"""

from protocol.errors import ProtocolError
from protocol.sign import (
    KEY_LEN,
    LINK_LEN,
    NONCE_LEN,
    SIG_LEN,
    TRAILER_LEN,
    TS_LEN,
    TS_MAX,
    Mac,
    _check_key,
)

TS_UNIX_EPOCH = 1420070400  # 2015-01-01 00:00:00 UTC in Unix seconds
TS_PER_S = 100000  # timestamp units per second (10 us each)


class SigningError(ProtocolError):
    """A frame cannot be signed: no nonce from the module yet, or timestamps exhausted."""

    kind = "signing"


def ts_from_unix(seconds):
    """Timestamp (10 us units since 2015-01-01 UTC) for Unix time ``seconds``."""
    return int((seconds - TS_UNIX_EPOCH) * TS_PER_S)


def _default_clock():
    import time

    epoch = _epoch_unix_s(time)
    ns = getattr(time, "time_ns", None)
    if ns is not None:
        return (ns() + (epoch - TS_UNIX_EPOCH) * 1000000000) // 10000
    return ts_from_unix(time.time() + epoch)


def _epoch_unix_s(time):
    """Unix time of the ``time`` module's epoch: MicroPython's MCU ports count from
    2000-01-01 (``time.gmtime(0)`` says so), the unix port and CPython from 1970."""
    gmtime = getattr(time, "gmtime", None)
    return 946684800 if gmtime is not None and gmtime(0)[0] == 2000 else 0


class _HashlibMac:
    """HMAC-SHA256 through ``hmac``/``hashlib`` (CPython: ~50x faster than :class:`Mac`)."""

    def __init__(self, key, hmac, hashlib):
        _check_key(key)
        self._hmac = hmac.new(bytes(key), digestmod=hashlib.sha256)

    def mac48_into(self, nonce, buf, start, end, out, off):
        h = self._hmac.copy()
        h.update(bytes(nonce))
        h.update(bytes(buf[start:end]))
        out[off : off + SIG_LEN] = h.digest()[:SIG_LEN]


def _host_mac(key):
    try:
        import hashlib
        import hmac
    except ImportError:  # MicroPython: no hmac module
        return Mac(key)
    return _HashlibMac(key, hmac, hashlib)


class Signer:
    """Host side: signs frames for one module and one link (may allocate).

    ``nonce`` must be set from the module's ``hello.nonce`` before signing (a
    :class:`SigningError` says so otherwise) and again after every module reboot.
    ``link_id`` (0..255) names this sender; a module keeps one replay slot per
    ``link_id & 7``, so two senders to one module need different links. ``clock()``
    returns the current timestamp in 10 us units since 2015-01-01 UTC (default: from
    ``time.time_ns()``); :meth:`next_ts` never repeats or goes back, whatever the clock
    does. ``last_ts`` is the last timestamp used (0 before the first): set it higher
    (a value kept from an earlier run) and the signer continues from there.

    ``reserve`` (None: nothing kept): a callable ``reserve(ts) -> ceiling`` that
    records, durably, that timestamps up to ``ceiling`` (>= ``ts``) may be used, and
    returns the ceiling. :meth:`next_ts` calls it before it returns a timestamp above
    the last ceiling, so a timestamp is never used before it is on record and a
    process restarted after a crash or a clock step back continues above it (the
    MAVLink 2 rule: the timestamp persists and never goes back). ``reserved`` is the
    ceiling (0 before the first call).
    """

    def __init__(self, key, link_id=0, clock=None, reserve=None):
        if not isinstance(link_id, int) or isinstance(link_id, bool) or not 0 <= link_id <= 255:
            raise ValueError("link_id must be an integer 0..255, got %r" % (link_id,))
        self._mac = _host_mac(key)
        self.link_id = link_id
        self.clock = clock or _default_clock
        self.nonce = None
        self.last_ts = 0
        self.reserve = reserve
        self.reserved = 0

    def next_ts(self):
        """A timestamp greater than every one this signer returned: max(clock, last+1),
        on record with ``reserve`` (if any) before it is returned."""
        ts = self.clock()
        if ts <= self.last_ts:
            ts = self.last_ts + 1
        if ts > TS_MAX:
            raise SigningError("timestamp past 2**48 - 1: check the signer's clock")
        if self.reserve is not None and ts > self.reserved:
            self.reserved = self.reserve(ts)
        self.last_ts = ts
        return ts

    def trailer(self, data):
        """The 13-byte trailer for ``data``: the unstuffed frame from its header (with
        the signed flag set) through its CRC."""
        nonce = self.nonce
        if nonce is None:
            raise SigningError(
                "no nonce from the module yet: read its hello before sending signed frames"
            )
        if len(nonce) != NONCE_LEN:
            raise SigningError("the module's nonce must be %d bytes" % NONCE_LEN)
        ts = self.next_ts()
        n = len(data)
        buf = bytearray(n + TRAILER_LEN)
        buf[0:n] = data
        buf[n] = self.link_id
        i = 0
        while i < TS_LEN:
            buf[n + 1 + i] = (ts >> (8 * (TS_LEN - 1 - i))) & 0xFF
            i += 1
        body = n + LINK_LEN + TS_LEN
        self._mac.mac48_into(nonce, buf, 0, body, buf, body)
        return bytes(buf[n:])


def new_key():
    """A fresh random signing secret (host: ``os.urandom``)."""
    import os

    return os.urandom(KEY_LEN)


def check_key_bytes(data, where="key"):
    """``data`` as a key (bytes), or ValueError that says what is wrong."""
    if len(data) != KEY_LEN:
        raise ValueError(
            "%s: a key file holds exactly %d raw bytes, this one has %d"
            % (where, KEY_LEN, len(data))
        )
    return bytes(data)


def load_key_file(path):
    """The key in ``path``: exactly 32 raw bytes (ValueError otherwise; OSError if
    the file cannot be read)."""
    with open(path, "rb") as f:
        data = f.read(KEY_LEN + 1)
    return check_key_bytes(data, path)
