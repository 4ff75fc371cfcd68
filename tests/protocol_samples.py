"""Deterministic test data for the protocol tests, importable on CPython and MicroPython.

- :class:`XorShift32`: a tiny PRNG that yields the same numbers on both interpreters
  (the ``random`` modules differ), so a failing case found under MicroPython can be
  replayed on CPython with the same seed.
- :func:`valid_field_sets`: valid field dicts for any catalog message, derived from
  each field's kind and bounds (minimum, maximum and middle of every range).
- :func:`bad_type_value`: a value of the wrong type for a field kind.
- :func:`raw_frame`: a binary frame built by hand (header + payload + CRC, COBS,
  delimiter), for frames that ``encode_frame`` refuses to produce.
"""

from protocol import catalog as C
from protocol import cobs
from protocol.crc import crc16

# Bounds used when the catalog leaves a side open (None = unbounded).
_OPEN_LO = -(2**31)
_OPEN_HI = 2**31 - 1


class XorShift32:
    """Marsaglia xorshift32; never yields 0. All arithmetic stays below 2**32."""

    def __init__(self, seed):
        self.state = (seed & 0xFFFFFFFF) or 0x9E3779B9

    def next32(self):
        x = self.state
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self.state = x
        return x

    def below(self, n):
        """An int in range(n), n <= 2**32."""
        return self.next32() % n

    def buffer(self, n, zero_pct=0, ff_pct=0):
        """``n`` pseudo-random bytes with about ``zero_pct`` % 0x00 and ``ff_pct`` % 0xFF."""
        out = bytearray(n)
        for i in range(n):
            r = self.below(100)
            if r < zero_pct:
                out[i] = 0
            elif r < zero_pct + ff_pct:
                out[i] = 0xFF
            else:
                out[i] = self.below(256)
        return out


def _bounds(fdef):
    lo = fdef[C.F_LO]
    hi = fdef[C.F_HI]
    return (_OPEN_LO if lo is None else lo), (_OPEN_HI if hi is None else hi)


def _sized(kind, n):
    """A value of ``kind`` whose length is ``n``."""
    if kind == C.K_STR:
        # mixed ASCII so the text is not all the same byte
        return "".join([chr(0x61 + i % 26) for i in range(n)])
    if kind == C.K_BYTES:
        return bytes([i & 0xFF for i in range(n)])
    if kind == C.K_LIST:
        return [[i * 1000, i * 100] for i in range(n)]
    if kind == C.K_MAP:
        out = {}
        for i in range(n):
            out["k" + str(i)] = i
        return out
    raise ValueError(kind)


def field_values(fdef):
    """Valid values of one field: (minimum, maximum, middle)."""
    kind = fdef[C.F_KIND]
    if kind == C.K_BOOL:
        return (False, True, True)
    if kind == C.K_NUM:
        return (-2.5, 1234.5, 0)
    lo, hi = _bounds(fdef)
    if kind == C.K_UINT and lo < 0:
        lo = 0
    mid = (lo + hi) // 2
    if kind in (C.K_UINT, C.K_INT, C.K_ENUM):
        return (lo, hi, mid)
    return (_sized(kind, lo), _sized(kind, hi), _sized(kind, mid))


def valid_field_sets(mdef):
    """Field dicts that must all be accepted: required fields only, then every field
    at its minimum, at its maximum and in the middle of its range."""
    fields = mdef[C.M_FIELDS]
    required = {}
    for fdef in fields:
        if fdef[C.F_REQUIRED]:
            required[fdef[C.F_NAME]] = field_values(fdef)[0]
    sets = [required]
    for which in (0, 1, 2):
        d = {}
        for fdef in fields:
            d[fdef[C.F_NAME]] = field_values(fdef)[which]
        sets.append(d)
    return sets


def bad_type_value(kind):
    """A value that is not of field kind ``kind`` (and not coercible to it)."""
    if kind in (C.K_UINT, C.K_INT, C.K_ENUM):
        return "1"
    if kind == C.K_STR:
        return 5
    if kind == C.K_BYTES:
        return "00"
    if kind == C.K_BOOL:
        return 1
    if kind == C.K_LIST:
        return "abc"
    if kind == C.K_MAP:
        return [1, 2]
    if kind == C.K_NUM:
        return "1.5"
    raise ValueError(kind)


def raw_frame(type_id, payload=b"", seq=0, major=1, minor=0, crc_xor=0, signer=None):
    """A complete wire frame (COBS + 0x00) around ``payload``, built without any checks.

    ``crc_xor`` corrupts the CRC on purpose; ``signer`` (a protocol.sign.Signer with
    the module's nonce) signs it (flag in the minor byte, trailer after the CRC).
    """
    if signer is not None:
        minor |= 0x80
    raw = bytearray([major, minor, type_id, (seq >> 8) & 0xFF, seq & 0xFF])
    raw.extend(payload)
    crc = crc16(raw) ^ crc_xor
    raw.append(crc >> 8)
    raw.append(crc & 0xFF)
    if signer is not None:
        raw.extend(signer.trailer(bytes(raw)))
    return bytes(cobs.encode(raw)) + b"\x00"


def same_message(a, b):
    """Message equality as the host's ``Message.__eq__`` defines it (type, seq and
    fields; the format is ignored). The firmware's Message has no ``__eq__`` (it never
    compares messages: issue 24's boot heap), so on MicroPython the attributes are
    compared; on CPython ``==`` must agree."""
    same = a.type == b.type and a.seq == b.seq and a.fields == b.fields
    if __import__("sys").implementation.name != "micropython":
        assert (a == b) == same, (a, b)
    return same
