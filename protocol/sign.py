"""Signed commands: HMAC-SHA256 truncated to 48 bits, the MAVLink 2 signing model.

A signed frame carries a 13-byte trailer after its CRC (SPEC.md section 14.1)::

    link u8 | timestamp u48 BE | signature 6 bytes

    signature = first 6 bytes of HMAC-SHA256(key, nonce || frame[0 : n-6])

where ``frame[0 : n-6]`` is every unstuffed byte from the header (with the signed
flag) through the timestamp, and ``nonce`` is the 8 random bytes the module drew at
boot and announced in ``hello.nonce``: a frame recorded in an earlier boot never
verifies again. The timestamp counts 10 microsecond units since 2015-01-01 00:00 UTC
(MAVLink's); per link (``link & 7``) the module accepts only a timestamp greater than
the last one it accepted, so a replay in the same boot is refused too.

Module side, allocation-free (the receive path runs inside the control loop):
:class:`Mac` (HMAC with the key's inner and outer states precomputed once) and
:class:`Verifier` (``verify(raw, n)`` returns one of the ``AUTH_*`` codes). Host
side, free to allocate: :class:`Signer`, :func:`new_key`, :func:`load_key_file`, in
host/modbridge/firmware_host/sign_host.py (with SigningError, ts_from_unix,
TS_UNIX_EPOCH and TS_PER_S): imported by the first use of one of those names here
(``sign.Signer``), so the module's firmware, which only verifies, never holds them in
RAM.
"""

from protocol.sha256 import Sha256

if __import__("sys").implementation.name != "micropython":
    # CPython's stand-in; MicroPython's compiler folds ``NAME = const(value)`` itself
    # (not importing it keeps ``const`` out of this module's dict on the MCU).

    def const(x):
        return x

    _HOST = True


# The names the firmware reads for every command (AUTH_NONE, AUTH_OK) are plain module
# attributes; the others (the host's, those the firmware reads once at boot or for a
# refused frame, and this module's own, folded here) are const()-private and answered
# by __getattr__ from _LAZY, in flash: no slot in the module's dict on the MCU (issue
# 24's boot heap). On CPython every name is a plain attribute (the loop at the end).
_FLAG_SIGNED = const(0x80)  # in frame byte 1 (minor): a 13-byte trailer follows the CRC
_KEY_LEN = const(32)  # bytes of a signing secret
_NONCE_LEN = const(8)  # bytes of the module's per-boot nonce
_LINK_LEN = const(1)
_TS_LEN = const(6)  # u48, big-endian, 10 us units since 2015-01-01 00:00 UTC
_SIG_LEN = const(6)  # truncated HMAC-SHA256
_TRAILER_LEN = const(13)  # LINK_LEN + TS_LEN + SIG_LEN
_N_LINKS = const(8)  # replay slots: link & 7

# Outcome of a signature check (``Message.auth``, ``HeartbeatState.auth``).
AUTH_NONE = const(0)  # not signed
AUTH_OK = const(1)  # signed with the receiver's key, timestamp newer than the link's last
_AUTH_BAD = const(2)  # wrong signature, or the receiver has no key
_AUTH_REPLAY = const(3)  # right signature, timestamp not newer than the link's last
_AUTH_UNCHECKED = const(4)  # signed, but this receiver verifies nothing (a host)
_AUTH_NAMES = const(("none", "ok", "bad", "replay", "unchecked"))

_TS_MAX = const(0xFFFFFFFFFFFF)  # 2**48 - 1

_IPAD = const(0x36)
_OPAD = const(0x5C)
_BLOCK_LEN = const(64)  # protocol.sha256's
_DIGEST_LEN = const(32)
_SIG_AT = const(48)  # N_LINKS * TS_LEN: where Verifier._last keeps the computed signature

# Pairs: name, value.
# fmt: off
_LAZY = const((
    "KEY_LEN", _KEY_LEN,
    "NONCE_LEN", _NONCE_LEN,
    "AUTH_REPLAY", _AUTH_REPLAY,
    "FLAG_SIGNED", _FLAG_SIGNED,
    "LINK_LEN", _LINK_LEN,
    "TS_LEN", _TS_LEN,
    "SIG_LEN", _SIG_LEN,
    "TRAILER_LEN", _TRAILER_LEN,
    "N_LINKS", _N_LINKS,
    "AUTH_BAD", _AUTH_BAD,
    "AUTH_UNCHECKED", _AUTH_UNCHECKED,
    "AUTH_NAMES", _AUTH_NAMES,
    "TS_MAX", _TS_MAX,
))
# fmt: on


def _check_key(key):
    if not isinstance(key, (bytes, bytearray)) or len(key) != _KEY_LEN:
        raise ValueError("a signing key is exactly %d bytes" % _KEY_LEN)


class Mac:
    """HMAC-SHA256 with a fixed 32-byte key, truncated to 48 bits.

    The key's inner (key ^ ipad) and outer (key ^ opad) hash states are computed once
    here and kept as 16 halves each in one array (not two whole Sha256 objects: heap
    on the MCU); :meth:`mac48_into` then costs two or three SHA-256 blocks for a short
    frame and allocates nothing on MicroPython.
    """

    def __init__(self, key):
        from array import array  # here: not a slot in the module's dict

        _check_key(key)
        pad = bytearray(_BLOCK_LEN)
        h = Sha256()
        ko = array("H", bytes(64))  # inner state [0, 16), outer [16, 32)
        p = _IPAD
        j = 0
        while j < 32:
            i = 0
            while i < _BLOCK_LEN:
                pad[i] = (key[i] if i < _KEY_LEN else 0) ^ p
                i += 1
            h.reset()
            h.update_from(pad, 0, _BLOCK_LEN)
            i = 0
            while i < 16:
                ko[j + i] = h._h[i]
                i += 1
            p = _OPAD
            j += 16
        self._ko = ko
        self._h = h

    def mac48_into(self, nonce, buf, start, end, out, off):
        """Write the first 6 bytes of HMAC(key, nonce || buf[start:end]) into
        ``out[off:off+6]``. ``nonce`` is any buffer (8 bytes in this protocol)."""
        h = self._h
        # The inner digest goes to the hash's own block buffer, free once digest_into
        # is done (no 32-byte buffer of its own: heap on the MCU); the outer hash then
        # reads it from there at the same offsets, as its partial block (update_from
        # copies each byte onto itself).
        d = h._block
        h.load_state(self._ko, 0, _BLOCK_LEN)
        h.update_from(nonce, 0, len(nonce))
        h.update_from(buf, start, end)
        h.digest_into(d, 0)
        h.load_state(self._ko, 16, _BLOCK_LEN)
        h.update_from(d, 0, _DIGEST_LEN)
        h.digest_into(d, 0)
        i = 0
        while i < _SIG_LEN:
            out[off + i] = d[i]
            i += 1


class Verifier:
    """The module's signature check; ``verify`` allocates nothing on MicroPython.

    ``Verifier(key=None)``: without a key every signed frame is ``AUTH_BAD`` (a module
    that was never paired). ``set_nonce(nonce8)`` must be called at boot with the
    nonce the module announces in ``hello.nonce``; until then signed frames are
    ``AUTH_BAD`` too. The last accepted timestamp of each of the ``N_LINKS`` slots is
    kept as 6 bytes and compared bytewise (a 48-bit int would be a big int on the MCU).
    Counters: ``ok``, ``bad``, ``replayed``.
    """

    def __init__(self, key=None):
        self._mac = None
        self.nonce = None
        # each link's last timestamp [0, 48), then the computed signature [48, 54)
        self._last = bytearray(_N_LINKS * _TS_LEN + _SIG_LEN)
        self.ok = 0
        self.bad = 0
        self.replayed = 0
        self.set_key(key)

    @property
    def has_key(self):
        return self._mac is not None

    def set_key(self, key):
        """Use ``key`` (32 bytes) from now on, or None to verify nothing as good.

        A new key keeps the per-link timestamps: frames signed before the change
        cannot come back either way (they fail the MAC under the new key)."""
        self._mac = None if key is None else Mac(key)

    def set_nonce(self, nonce):
        """Install this boot's nonce (8 bytes) and forget every link's last timestamp."""
        if len(nonce) != _NONCE_LEN:
            raise ValueError("a nonce is exactly %d bytes" % _NONCE_LEN)
        self.nonce = bytes(nonce)
        last = self._last
        i = 0
        while i < _N_LINKS * _TS_LEN:
            last[i] = 0
            i += 1

    def verify(self, raw, n):
        """Check the trailer of the unstuffed signed frame ``raw[:n]``; an ``AUTH_*``.

        On ``AUTH_OK`` the frame's timestamp becomes its link's last. The caller has
        checked the CRC and that ``n`` leaves room for a header and the trailer.
        """
        mac = self._mac
        if mac is None or self.nonce is None or n < _TRAILER_LEN:
            self.bad += 1
            return _AUTH_BAD
        body = n - _SIG_LEN
        last = self._last
        mac.mac48_into(self.nonce, raw, 0, body, last, _SIG_AT)
        diff = 0
        i = 0
        while i < _SIG_LEN:  # no early exit: the time taken does not depend on the data
            diff |= last[_SIG_AT + i] ^ raw[body + i]
            i += 1
        if diff:
            self.bad += 1
            return _AUTH_BAD
        ts = n - _SIG_LEN - _TS_LEN
        slot = (raw[n - _TRAILER_LEN] & (_N_LINKS - 1)) * _TS_LEN
        i = 0
        while i < _TS_LEN:
            a = raw[ts + i]
            b = last[slot + i]
            if a != b:
                break
            i += 1
        if i == _TS_LEN or raw[ts + i] < last[slot + i]:
            self.replayed += 1
            return _AUTH_REPLAY
        i = 0
        while i < _TS_LEN:
            last[slot + i] = raw[ts + i]
            i += 1
        self.ok += 1
        return AUTH_OK


_HOST_NAMES = const(
    (
        "SigningError",
        "Signer",
        "new_key",
        "check_key_bytes",
        "load_key_file",
        "ts_from_unix",
        "TS_UNIX_EPOCH",
        "TS_PER_S",
        "_default_clock",
        "_epoch_unix_s",
        "_host_mac",
        "_HashlibMac",
    )
)


def __getattr__(name):
    """A name of ``_LAZY``, or of the host side (modbridge.firmware_host.sign_host,
    imported on first use)."""
    if name in _LAZY:
        i = _LAZY.index(name)
        if not i & 1:
            return _LAZY[i + 1]
    if name in _HOST_NAMES:
        from modbridge.firmware_host import sign_host

        return getattr(sign_host, name)
    raise AttributeError(name)


if "_HOST" in globals():  # CPython (see const): plain attributes
    for _i in range(0, len(_LAZY), 2):
        globals()[_LAZY[_i]] = _LAZY[_i + 1]
    del _i
