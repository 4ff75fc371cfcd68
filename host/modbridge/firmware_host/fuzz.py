"""Deterministic fuzzing of the stream decoder, the CBOR decoder and JSON lines.

Protocol tooling, not firmware: it runs unchanged on CPython and MicroPython
(tests/test_fuzz.py runs it on both, bench/bench_protocol.py reports its numbers)
but nothing on the module imports it at run time.

How a case is checked (:func:`run`): the mutated bytes, then one 0x00, then a known
valid *sentinel* frame go through ONE long-lived :class:`~protocol.frame.StreamDecoder`,
split into random chunks (bytes, bytearray or memoryview). Whatever the case was:

- ``feed()`` returns a list and never raises (``escaped`` counts the exceptions);
- the sentinel is the last item returned (``sentinels_lost`` counts misses);
- the decoder's counters account for every item returned: the growth of
  ``frames`` plus all ``errors`` equals the number of items (``inconsistent``);
- its buffer never grows beyond a frame's or a line's size (``unbounded``).

Every mutator names the outcomes it aims at (an error kind, or ``"frame"`` for a
message that must still decode); ``missed`` lists the aims that were never reached,
which proves the cases get past the framing layer into the CBOR and field checks.

Everything is driven by :class:`XorShift32`, so a seed gives the same cases, byte for
byte, on either interpreter (given the same catalog); a few verdicts differ where the
interpreters' ``json`` modules do.
"""

from protocol import VERSION_MAJOR, VERSION_MINOR, cbor, cobs, jsonl
from protocol import catalog as C
from protocol.crc import crc16
from protocol.errors import CBORDecodeError, ProtocolError
from protocol.frame import ERROR_KINDS, HEADER_LEN, MAX_FRAME, MAX_LINE, StreamDecoder, encode_frame
from protocol.message import BadFrame, Message

try:
    from time import ticks_diff, ticks_ms
except ImportError:  # CPython
    from time import perf_counter

    def ticks_ms():
        return int(perf_counter() * 1000)

    def ticks_diff(a, b):
        return a - b


_M32 = 0xFFFFFFFF
_MAX_DETAIL = 8  # escaped exceptions described in a result, at most
_DECODER_BUG = "decoder bug"  # StreamDecoder's text for a non-protocol exception


class XorShift32:
    """Marsaglia's xorshift32 (13, 17, 5): tiny, deterministic, same on both interpreters."""

    def __init__(self, seed=1):
        seed &= _M32
        self.state = seed if seed else 0x6D2B79F5
        for _ in range(8):  # small seeds start with small outputs: stir a little
            self.next()

    def next(self):
        x = self.state
        x ^= (x << 13) & _M32
        x ^= x >> 17
        x ^= (x << 5) & _M32
        self.state = x
        return x

    def below(self, n):
        """Uniform-ish int in [0, n) for n >= 1."""
        if n <= 0x100000000:
            return self.next() % n
        return ((self.next() << 32) | self.next()) % n

    def between(self, lo, hi):
        """Int in [lo, hi], both included."""
        return lo + self.below(hi - lo + 1)

    def chance(self, k):
        """True once in ``k`` calls on average."""
        return self.next() % k == 0

    def choice(self, seq):
        return seq[self.next() % len(seq)]

    def bytes(self, n, lo=0, hi=255):
        """``n`` random bytes with values in [lo, hi]."""
        out = bytearray(n)
        span = hi - lo + 1
        i = 0
        while i < n:
            out[i] = lo + self.next() % span
            i += 1
        return bytes(out)


# ---------------------------------------------------------------------------
# Building blocks


def _head(major, value):
    buf = bytearray(9)
    end = cbor.put_head(buf, 0, major, value)
    return bytes(buf[:end])


def raw_frame(type_id, payload, seq=0, major=VERSION_MAJOR, minor=VERSION_MINOR):
    """A COBS frame (with delimiter) around any ``payload`` bytes, with a correct CRC.

    Bypasses all validation, so hostile payloads reach the CBOR decoder.
    """
    n = HEADER_LEN + len(payload) + 2
    raw = bytearray(n)
    raw[0] = major & 0xFF
    raw[1] = minor & 0xFF
    raw[2] = type_id & 0xFF
    raw[3] = (seq >> 8) & 0xFF
    raw[4] = seq & 0xFF
    raw[HEADER_LEN : n - 2] = payload
    crc = crc16(raw, 0, n - 2)
    raw[n - 2] = crc >> 8
    raw[n - 1] = crc & 0xFF
    return bytes(cobs.encode(raw)) + b"\x00"


_TEXT_POOL = 'abcdefXYZ0129 _-.:/"\\\t\n\u00b0\u00e9\u2603'
_PRINTABLE_LO = 0x20
_PRINTABLE_HI = 0x7E


def _text(rng, lo, hi):
    n = rng.between(lo, hi)
    chars = []
    for _ in range(n):
        chars.append(_TEXT_POOL[rng.below(len(_TEXT_POOL))])
    return "".join(chars)


def _bounds(fdef, lo_default, hi_default):
    lo = fdef[C.F_LO]
    hi = fdef[C.F_HI]
    if lo is None:
        lo = lo_default
    if hi is None:
        hi = lo + hi_default
    return lo, hi


def valid_value(rng, fdef):
    """A random value that passes the catalog's checks for field ``fdef``."""
    kind = fdef[C.F_KIND]
    if kind == C.K_ENUM:
        lo, hi = _bounds(fdef, 0, 255)
        names = fdef[C.F_SCALE]
        if rng.chance(8) or not names:
            return rng.between(lo, hi)
        return rng.below(min(len(names), hi + 1))
    if kind == C.K_UINT or kind == C.K_INT:
        lo, hi = _bounds(fdef, 0 if kind == C.K_UINT else -100000, 200000)
        r = rng.below(8)
        if r == 0:
            return lo
        if r == 1:
            return hi
        return rng.between(lo, hi)
    if kind == C.K_STR:
        lo, hi = _bounds(fdef, 0, 16)
        return _text(rng, lo, min(hi, lo + 12))
    if kind == C.K_BYTES:
        lo, hi = _bounds(fdef, 0, 16)
        return rng.bytes(rng.between(lo, min(hi, lo + 12)))
    if kind == C.K_BOOL:
        return rng.chance(2)
    if kind == C.K_NUM:
        return rng.choice((0, 1, -7, 3950, 0.5, -2.25, 0.001))
    if kind == C.K_LIST:
        lo, hi = _bounds(fdef, 0, 4)
        out = []
        for _ in range(rng.between(lo, min(hi, lo + 4))):
            r = rng.below(3)
            if r == 0:
                out.append(rng.between(-1000, 100000))
            elif r == 1:
                out.append([rng.between(20000, 90000), rng.below(65536)])
            else:
                out.append(_text(rng, 1, 4))
        return out
    if kind == C.K_MAP:
        lo, hi = _bounds(fdef, 0, 4)
        out = {}
        for i in range(rng.between(lo, min(hi, lo + 3))):
            r = rng.below(4)
            if r == 0:
                v = rng.between(-5000, 5000)
            elif r == 1:
                v = _text(rng, 0, 6)
            elif r == 2:
                v = rng.chance(2)
            else:
                v = None
            out["k%d" % i] = v
        return out
    raise ValueError("no generator for field kind %r" % (kind,))  # a new kind: add it here


def valid_fields(rng, mdef, everything=False):
    """Random valid fields of message ``mdef``: the required ones, some optional ones."""
    out = {}
    for fdef in mdef[C.M_FIELDS]:
        if fdef[C.F_REQUIRED] or everything or rng.chance(2):
            out[fdef[C.F_NAME]] = valid_value(rng, fdef)
    return out


def _wrong_value(rng, fdef):
    """A CBOR-encodable value that the catalog must refuse for field ``fdef``."""
    kind = fdef[C.F_KIND]
    lo = fdef[C.F_LO]
    hi = fdef[C.F_HI]
    r = rng.below(6)
    if kind in (C.K_UINT, C.K_INT, C.K_ENUM):
        if r == 0 and hi is not None:
            return hi + rng.between(1, 1 << 40)
        if r == 1 and lo is not None:
            return lo - rng.between(1, 1 << 40)
        return rng.choice(("12", 1.0, True, None, [1], {1: 2}, b"\x01"))
    if kind in (C.K_STR, C.K_BYTES, C.K_LIST, C.K_MAP):
        if r == 0 and hi is not None and hi < 100:
            size = hi + 1
            if kind == C.K_STR:
                return "x" * size
            if kind == C.K_BYTES:
                return b"x" * size
            if kind == C.K_LIST:
                return [0] * size
            out = {}
            for i in range(size):
                out["k%d" % i] = i
            return out
        if r == 1 and lo:
            if kind == C.K_STR:
                return ""
            if kind == C.K_LIST:
                return []
            if kind == C.K_MAP:
                return {}
        if kind == C.K_MAP and r == 2:
            return {1: 2}  # map keys must be text
        if kind == C.K_STR:
            return rng.choice((7, b"bytes", [], None, False))
        if kind == C.K_BYTES:
            return rng.choice((7, "text", [], None))
        if kind == C.K_LIST:
            return rng.choice((7, "text", {}, None, 1.5))
        return rng.choice((7, "text", [], None))
    if kind == C.K_BOOL:
        return rng.choice((0, 1, "true", None))
    if kind == C.K_NUM:
        return rng.choice((float("nan"), float("inf"), float("-inf"), "1.0", None, True, [1.0]))
    return None


def _valid_item(rng, depth):
    """Bytes of a random item inside the CBOR subset (heads not always shortest)."""
    r = rng.below(10 if depth > 0 else 8)
    if r == 0:
        v = rng.choice((0, 23, 24, 255, 256, 65535, 65536, _M32, _M32 + 1, 0xFFFFFFFFFFFFFFFF))
        return _head(0, v)
    if r == 1:
        return _head(1, rng.choice((0, 1, 23, 300, 70000, _M32, 0xFFFFFFFFFFFFFFFF)))
    if r == 2:
        return bytes((0x18, rng.below(24)))  # non-shortest head: still valid CBOR
    if r == 3:
        b = rng.bytes(rng.below(6))
        return _head(2, len(b)) + b
    if r == 4:
        t = _text(rng, 0, 5).encode()
        return _head(3, len(t)) + t
    if r == 5:
        return bytes((rng.choice((0xF4, 0xF5, 0xF6)),))
    if r == 6:
        return rng.choice(
            (
                b"\xf9\x3c\x00",
                b"\xf9\x7e\x00",
                b"\xf9\xfc\x00",
                b"\xfa\x3f\xc0\x00\x00",
                b"\xfb\x40\x09\x21\xfb\x54\x44\x2d\x18",
                b"\xf9\x00\x01",
            )
        )
    if r == 7:
        return _head(0, rng.below(1000))
    if r == 8:
        n = rng.below(4)
        out = _head(4, n)
        for _ in range(n):
            out += _valid_item(rng, depth - 1)
        return out
    n = rng.below(4)
    out = _head(5, n)
    for i in range(n):
        out += _head(0, 1000 + i) + _valid_item(rng, depth - 1)
    return out


def _hostile_item(rng):
    """Bytes that the CBOR subset decoder must refuse (wherever they appear)."""
    r = rng.below(16)
    if r == 0:  # indefinite lengths
        return rng.choice(
            (
                b"\x5f\x41\x61\xff",
                b"\x7f\x61\x61\xff",
                b"\x9f\x01\x02\xff",
                b"\xbf\x01\x02\xff",
                b"\x9f\xff",
                b"\x5f\xff",
                b"\x1f",
                b"\x3f",
            )
        )
    if r == 1:  # tags
        tag = rng.choice(
            (
                b"\xc0",
                b"\xc1",
                b"\xd7",
                b"\xd8\x20",
                b"\xd9\xd9\xf7",
                b"\xda\x00\x01\x00\x00",
                b"\xdb\x00\x00\x00\x00\x00\x00\x00\x01",
            )
        )
        return tag + _valid_item(rng, 1)
    if r == 2:  # huge declared lengths
        major = rng.choice((2, 3, 4, 5))
        return (
            _head(major, rng.choice((_M32, 0xFFFFFFFFFFFFFFFF, 1 << 40, 70000, 600))) + b"\x01\x02"
        )
    if r == 3:  # length one beyond the end
        major = rng.choice((2, 3))
        return _head(major, 4) + b"abc"
    if r == 4:  # deep nesting
        depth = rng.between(cbor.DEFAULT_MAX_DEPTH + 1, 300)
        opener = rng.choice((b"\x81", b"\xa1\x00"))
        return opener * depth + b"\x00"
    if r == 5:  # duplicate keys
        return rng.choice(
            (
                b"\xa2\x01\x00\x01\x00",
                b"\xa2\x61\x61\x00\x61\x61\x01",
                b"\xa3\x00\x01\x02\x03\x00\x04",
                b"\xa2\x41\x00\x01\x41\x00\x02",
            )
        )
    if r == 6:  # reserved additional information
        return bytes(((rng.below(8) << 5) | rng.between(28, 30),))
    if r == 7:  # stray break, undefined, other simple values
        return (
            bytes((rng.choice((0xFF, 0xF7, 0xE0, 0xF0, 0xF3)),)) if rng.chance(2) else b"\xf8\x20"
        )
    if r == 8:  # invalid UTF-8
        return rng.choice((b"\x62\xc3\x28", b"\x61\xff", b"\x63\xed\xa0\x80", b"\x62\xc0\xaf"))
    if r == 9:  # map keys outside the subset
        key = rng.choice(
            (
                b"\xf5",
                b"\xf4",
                b"\xf6",
                b"\x80",
                b"\xa0",
                b"\xfb\x3f\xf0\x00\x00\x00\x00\x00\x00",
                b"\xf9\x3c\x00",
            )
        )
        return b"\xa1" + key + b"\x00"
    if r == 10:  # truncated heads
        return rng.choice(
            (b"\x18", b"\x19\x01", b"\x1a\x00\x00", b"\x1b\x00", b"\xfb\x00", b"\xfa", b"\xf9\x00")
        )
    if r == 11:  # map or array with fewer items than declared
        return rng.choice((b"\xa2\x00\x01", b"\x83\x01\x02", b"\xa1\x00"))
    if r == 12:  # indefinite map as a whole
        return b"\xbf\x00\x01\xff"
    if r == 13:  # tag inside an array
        return b"\x82\x01\xc2\x41\x01"
    if r == 14:  # huge length inside a map value
        return b"\xa1\x00\x9b\xff\xff\xff\xff\xff\xff\xff\xff"
    return b"\xa1\x00" + bytes((0xFF,))


def _hostile_payload(rng):
    """A payload the decoder must refuse as undecodable (the CRC is valid)."""
    bad = _hostile_item(rng)
    r = rng.below(6)
    if r == 0:
        return bad
    if r == 1:  # as the value of a field
        return b"\xa1" + _head(0, rng.below(20)) + bad
    if r == 2:  # behind a valid field
        return b"\xa2\x00\x00" + _head(0, rng.between(1, 20)) + bad
    if r == 3:  # not a map at all
        return rng.choice((b"\x80", b"\x01", b"\x61\x61", b"\xf6", b"\x40", b"\x83\x01\x02\x03"))
    if r == 4:  # trailing bytes after the map
        return b"\xa1\x00\x00" + _valid_item(rng, 1)
    return b"\xa1\x00" + bad


# ---------------------------------------------------------------------------
# The fuzzer


class Fuzzer:
    """Corpus, mutators and sentinels for one seed; :func:`run` drives it."""

    def __init__(self, seed=1, variants=3):
        self.rng = rng = XorShift32(seed)
        self.frames = []  # (mdef, fields, frame bytes)
        self.lines = []  # (mdef, fields, JSON line bytes)
        for mdef in C.MESSAGES:
            for v in range(variants):
                fields = valid_fields(rng, mdef, everything=(v == 1))
                seq = rng.below(0x10000)
                self.frames.append((mdef, fields, encode_frame(mdef[C.M_TYPE], fields, seq)))
                self.lines.append((mdef, fields, jsonl.encode_line(mdef[C.M_TYPE], fields, seq)))
        self.sentinels = []
        tmdef = C.by_type(C.T_TELEMETRY)
        for i in range(32):
            fields = valid_fields(rng, tmdef, everything=(i % 2 == 0))
            msg_seq = 0xFF00 + i
            self.sentinels.append((msg_seq, fields, encode_frame(C.T_TELEMETRY, fields, msg_seq)))
        unknown = []
        for t in range(256):
            if C.by_type(t) is None:
                unknown.append(t)
        self.unknown_types = unknown
        # (name, method, weight, aims)
        self.mutators = (
            ("bitflip", self.m_bitflip, 8, ("crc",)),
            ("byte_set", self.m_byte_set, 6, ("crc",)),
            ("insert", self.m_insert, 4, ("crc",)),
            ("delete", self.m_delete, 4, ("crc", "framing")),
            ("truncate", self.m_truncate, 4, ("framing",)),
            ("splice", self.m_splice, 4, ("crc",)),
            ("duplicate", self.m_duplicate, 2, ("frame",)),
            ("garbage", self.m_garbage, 4, ()),
            ("zero_inject", self.m_zero_inject, 3, ("framing",)),
            ("newline_inject", self.m_newline_inject, 3, ("crc", "undecodable")),
            ("short_frame", self.m_short_frame, 2, ("framing",)),
            ("oversize_binary", self.m_oversize_binary, 1, ("oversize",)),
            ("oversize_decoded", self.m_oversize_decoded, 1, ("oversize",)),
            ("oversize_text", self.m_oversize_text, 1, ("oversize",)),
            ("text_noise", self.m_text_noise, 2, ("noise",)),
            ("text_brace", self.m_text_brace, 2, ("undecodable",)),
            ("wrong_major", self.m_wrong_major, 3, ("version",)),
            ("newer_minor", self.m_newer_minor, 3, ("frame",)),
            ("unknown_type", self.m_unknown_type, 3, ("unknown_type",)),
            ("cbor_hostile", self.m_cbor_hostile, 12, ("undecodable",)),
            ("cbor_wrong_type", self.m_cbor_wrong_type, 8, ("invalid",)),
            ("cbor_missing", self.m_cbor_missing, 3, ("invalid",)),
            ("cbor_random_map", self.m_cbor_random_map, 4, ("invalid",)),
            ("json_mutate", self.m_json_mutate, 4, ("undecodable",)),
            ("json_version", self.m_json_version, 2, ("version",)),
            ("json_unknown_type", self.m_json_unknown_type, 2, ("unknown_type",)),
            ("json_wrong_type", self.m_json_wrong_type, 4, ("invalid",)),
            ("json_hostile", self.m_json_hostile, 3, ("undecodable", "invalid")),
        )
        table = []
        for i in range(len(self.mutators)):
            table.extend([i] * self.mutators[i][2])
        self._table = table

    # -- helpers
    def frame(self):
        return self.rng.choice(self.frames)[2]

    def line(self):
        return self.rng.choice(self.lines)[2]

    def any_valid(self):
        return self.frame() if self.rng.below(4) else self.line()

    def pick(self):
        """Index of a mutator, by weight."""
        return self.rng.choice(self._table)

    # -- byte-level mutators on valid frames (and sometimes JSON lines)
    def m_bitflip(self):
        rng = self.rng
        b = bytearray(self.frame())
        for _ in range(rng.between(1, 4)):
            i = rng.below(len(b) - 1)  # keep the delimiter: a damaged frame, not a merge
            b[i] ^= 1 << rng.below(8)
        return b

    def m_byte_set(self):
        rng = self.rng
        b = bytearray(self.frame())
        for _ in range(rng.between(1, 3)):
            b[rng.below(len(b) - 1)] = rng.between(1, 255)
        return b

    def m_insert(self):
        rng = self.rng
        b = self.frame()
        i = rng.between(1, len(b) - 1)
        return b[:i] + rng.bytes(rng.between(1, 8), 1, 255) + b[i:]

    def m_delete(self):
        rng = self.rng
        b = self.any_valid()
        i = rng.below(len(b))
        j = i + rng.between(1, 8)
        return b[:i] + b[j:]

    def m_truncate(self):
        b = self.frame()
        return b[: self.rng.below(len(b) - 1)]

    def m_splice(self):
        rng = self.rng
        a = self.any_valid()
        b = self.any_valid()
        return a[: rng.below(len(a))] + b[rng.below(len(b)) :]

    def m_duplicate(self):
        a = self.any_valid()
        if self.rng.chance(2):
            return a + a
        return a + self.any_valid()

    def m_garbage(self):
        rng = self.rng
        if rng.chance(2):
            return rng.bytes(rng.between(1, 64))
        return rng.bytes(rng.between(1, 64), 1, 255)

    def m_zero_inject(self):
        rng = self.rng
        b = self.frame()
        i = rng.between(2, len(b) - 2)  # leave a piece of >= 2 bytes before the 0x00
        return b[:i] + b"\x00" + b[i:]

    def m_newline_inject(self):
        rng = self.rng
        b = self.frame() if rng.chance(2) else self.line()
        i = rng.between(1, len(b) - 2)
        return b[:i] + b"\n" + b[i:]

    def m_short_frame(self):
        rng = self.rng
        raw = rng.bytes(rng.between(1, 6), 1, 255)
        return bytes(cobs.encode(raw)) + b"\x00"

    def m_oversize_binary(self):
        rng = self.rng
        # non-text first byte, then anything but 0x00: a binary frame that never ends
        return bytes((rng.between(1, 8),)) + rng.bytes(rng.between(516, 1100), 1, 255)

    def m_oversize_decoded(self):
        # fits the COBS buffer (<= 515 bytes) but decodes to more than MAX_FRAME
        n = self.rng.between(514, 515)
        b = bytearray(n)
        for i in range(n):
            b[i] = 0x02 if i % 2 == 0 else 0x01  # second byte: a control byte, as in a frame
        return b

    def m_oversize_text(self):
        rng = self.rng
        b = b"{" + rng.bytes(rng.between(MAX_LINE, MAX_LINE + 300), _PRINTABLE_LO, _PRINTABLE_HI)
        return b + b"\n" if rng.chance(2) else b

    def m_text_noise(self):
        rng = self.rng
        b = rng.bytes(rng.between(1, 80), _PRINTABLE_LO, _PRINTABLE_HI)
        if b[0] == 0x7B or b.strip() == b"":
            b = b"x" + b
        return b + b"\n"

    def m_text_brace(self):
        rng = self.rng
        return b"{" + rng.bytes(rng.between(0, 80), _PRINTABLE_LO, _PRINTABLE_HI) + b"\n"

    # -- frames that are valid at the framing level
    def m_wrong_major(self):
        rng = self.rng
        mdef, fields, _ = rng.choice(self.frames)
        major = rng.choice((0, 2, 3, 0x7F, 0xFF, rng.between(2, 255)))
        if rng.chance(4):
            return raw_frame(rng.below(256), rng.bytes(rng.below(12)), rng.below(0x10000), major)
        return encode_frame(mdef[C.M_TYPE], fields, rng.below(0x10000), rng.below(256), major)

    def m_newer_minor(self):
        """A newer minor version may add fields: unknown keys must be ignored."""
        rng = self.rng
        mdef, fields, _ = rng.choice(self.frames)
        payload = b""
        known = {}
        for fdef in mdef[C.M_FIELDS]:
            if fdef[C.F_NAME] in fields:
                known[fdef[C.F_KEY]] = fields[fdef[C.F_NAME]]
        count = len(known)
        body = b""
        for k in known:  # any order is valid on input
            body += _head(0, k) + cbor.dumps(known[k])
        extra = rng.between(1, 4)
        for i in range(extra):
            body += _head(0, 40 + i) + _valid_item(rng, 3)
        payload = _head(5, count + extra) + body
        if len(payload) + HEADER_LEN + 2 > MAX_FRAME:
            payload = cbor.dumps(known) if known else b""
        return raw_frame(
            mdef[C.M_TYPE], payload, rng.below(0x10000), VERSION_MAJOR, rng.between(1, 255)
        )

    def m_unknown_type(self):
        rng = self.rng
        t = rng.choice(self.unknown_types)
        payload = b"" if rng.chance(3) else b"\xa1\x00" + _valid_item(rng, 2)
        return raw_frame(t, payload, rng.below(0x10000))

    def m_cbor_hostile(self):
        rng = self.rng
        mdef = rng.choice(self.frames)[0]
        return raw_frame(mdef[C.M_TYPE], _hostile_payload(rng), rng.below(0x10000))

    def m_cbor_wrong_type(self):
        rng = self.rng
        mdef, fields, _ = rng.choice(self.frames)
        fdefs = mdef[C.M_FIELDS]
        if not fdefs:  # no fields to get wrong: try another message next time
            return self.m_cbor_missing()
        keyed = {}
        for fdef in fdefs:
            if fdef[C.F_NAME] in fields:
                keyed[fdef[C.F_KEY]] = fields[fdef[C.F_NAME]]
        bad = rng.choice(fdefs)
        keyed[bad[C.F_KEY]] = _wrong_value(rng, bad)
        return raw_frame(mdef[C.M_TYPE], cbor.dumps(keyed), rng.below(0x10000))

    def m_cbor_missing(self):
        rng = self.rng
        for _ in range(8):
            mdef, fields, _ = rng.choice(self.frames)
            required = [f for f in mdef[C.M_FIELDS] if f[C.F_REQUIRED]]
            if required:
                break
        else:
            return raw_frame(C.T_HELLO, b"\xa0", 1)
        drop = rng.choice(required)
        keyed = {}
        for fdef in mdef[C.M_FIELDS]:
            if fdef[C.F_NAME] in fields and fdef is not drop:
                keyed[fdef[C.F_KEY]] = fields[fdef[C.F_NAME]]
        return raw_frame(mdef[C.M_TYPE], cbor.dumps(keyed), rng.below(0x10000))

    def m_cbor_random_map(self):
        rng = self.rng
        mdef = rng.choice(self.frames)[0]
        n = rng.between(1, 6)
        body = b""
        for i in range(n):
            body += _head(0, i * 3 + rng.below(3)) + _valid_item(rng, 2)
        return raw_frame(mdef[C.M_TYPE], _head(5, n) + body, rng.below(0x10000))

    # -- JSON lines
    def m_json_mutate(self):
        rng = self.rng
        b = bytearray(self.line())
        r = rng.below(3)
        if r == 0:
            return b[: rng.between(1, len(b) - 2)] + b"\n"
        if r == 1:
            i = rng.between(1, len(b) - 2)
            b[i] = rng.choice(b'{}[]":,\\x0- ')
            return b
        i = rng.between(1, len(b) - 2)
        return b[:i] + rng.choice((b'"', b"{", b"[", b",", b"}", b":")) + b[i:]

    def m_json_version(self):
        rng = self.rng
        b = self.line()
        v = rng.choice((b'"2.0"', b'"0.9"', b'"255.1"', b"2", b'"-1"'))
        return b.replace(b'"v":"1.0"', b'"v":' + v)

    def m_json_unknown_type(self):
        rng = self.rng
        mdef, _, b = rng.choice(self.lines)
        name = b'"type":"' + mdef[C.M_NAME].encode() + b'"'
        t = rng.choice((b'"nosuch"', b'"Hello"', b'""', b"255", b"3"))
        return b.replace(name, b'"type":' + t)

    def m_json_wrong_type(self):
        rng = self.rng
        for _ in range(8):
            mdef, fields, _ = rng.choice(self.lines)
            if mdef[C.M_FIELDS]:
                break
        fdef = rng.choice(mdef[C.M_FIELDS])
        r = rng.below(10)
        if r == 0:
            value = b"9" * rng.between(20, 400)  # display scale must not overflow a float
        elif r == 1:
            value = b"-1e400"
        elif r == 2:
            value = b"NaN" if rng.chance(2) else b"Infinity"
        elif r == 3:
            value = b'"nosuchname"'
        else:
            value = rng.choice(
                (b'"x"', b"true", b"null", b"[]", b"{}", b"1.5", b"-99999999999", b'{"a":[1]}')
            )
        text = '{"type":"' + mdef[C.M_NAME] + '"'
        for f in mdef[C.M_FIELDS]:
            if f[C.F_REQUIRED] and f is not fdef:
                text += ',"' + f[C.F_NAME] + '":' + jsonl.field_to_json(f, fields[f[C.F_NAME]])
        return (text + ',"' + fdef[C.F_NAME] + '":').encode() + value + b"}\n"

    def m_json_hostile(self):
        rng = self.rng
        r = rng.below(6)
        if r == 0:  # deep nesting
            d = rng.between(50, MAX_LINE // 2 - 20)
            return b'{"type":"hello","x":' + b"[" * d + b"]" * d + b"}\n"
        if r == 1:  # unclosed deep nesting
            return b'{"a":' + b"[" * rng.between(100, MAX_LINE - 20) + b"\n"
        if r == 2:  # huge seq
            return b'{"type":"reboot","seq":' + b"9" * rng.between(6, 300) + b"}\n"
        if r == 3:  # no type at all
            return rng.choice(
                (b'{"seq":1}\n', b"{}\n", b'{"type":null}\n', b'{"type":[1]}\n', b'{"type":true}\n')
            )
        if r == 4:  # bad version text
            return rng.choice(
                (
                    b'{"type":"reboot","v":"x.y"}\n',
                    b'{"type":"reboot","v":""}\n',
                    b'{"type":"reboot","v":1.5}\n',
                    b'{"type":"reboot","v":[1]}\n',
                )
            )
        # invalid UTF-8 inside a string
        return b'{"type":"nack","text":"\xff\xfe"}\n'

    # -- driving
    def sentinel(self, i):
        return self.sentinels[i % len(self.sentinels)]

    def chunks(self, stream):
        """Split ``stream`` at random points into bytes/bytearray/memoryview pieces."""
        rng = self.rng
        r = rng.below(16)
        if r < 7:
            return (stream,)
        n = len(stream)
        if r == 7 and n < 200:
            return [stream[i : i + 1] for i in range(n)]
        cuts = [0]
        for _ in range(rng.between(1, 5)):
            cuts.append(rng.below(n + 1))
        cuts.append(n)
        cuts.sort()
        kind = rng.below(3)
        if kind == 1:
            stream = bytearray(stream)
        elif kind == 2:
            stream = memoryview(stream)
        out = []
        for i in range(len(cuts) - 1):
            out.append(stream[cuts[i] : cuts[i + 1]])
        return out


def _describe(e, where):
    return "%s: %s(%r)" % (where, type(e).__name__, str(e)[:120])


def run(n=10000, seed=1, max_frame=MAX_FRAME, max_line=MAX_LINE):
    """Feed ``n`` mutated cases through one StreamDecoder; see the module docstring.

    Returns a dict: ``cases``, ``frames`` (good messages incl. sentinels), ``items``,
    ``bytes``, ``escaped``, ``decoder_bugs`` (foreign exceptions that the decoder's
    catch-all turned into a BadFrame), ``sentinels_lost``, ``inconsistent``, ``unbounded``,
    ``errors`` (kind -> count), ``hits`` (mutator -> outcome -> count), ``missed``
    (``"mutator:aim"`` never reached), ``details`` (first problems, as text) and
    ``elapsed_ms``.
    """
    fz = Fuzzer(seed)
    mutators = fz.mutators
    dec = StreamDecoder(max_frame, max_line)
    # the buffer is made for a frame and grown once, for the first text line, to
    # this; never beyond
    cap = max(cobs.max_encoded_len(max_frame), max_line) + 1
    hits = {}
    for m in mutators:
        hits[m[0]] = {}
    escaped = lost = inconsistent = unbounded = bugs = 0
    total_bytes = total_items = 0
    details = []
    start = ticks_ms()
    for i in range(n):
        name, mutate, _, _ = mutators[fz.pick()]
        case = mutate()
        seq, fields, sentinel = fz.sentinel(i)
        stream = bytes(case) + b"\x00" + sentinel
        total_bytes += len(stream)
        before = dec.frames + dec.error_total()
        items = []
        for chunk in fz.chunks(stream):
            try:
                got = dec.feed(chunk)
            except Exception as e:  # noqa: BLE001 - counting them is the point
                escaped += 1
                if len(details) < _MAX_DETAIL:
                    details.append(_describe(e, "case %d (%s)" % (i, name)))
                dec.reset()
                continue
            if not isinstance(got, list):
                escaped += 1
                continue
            items.extend(got)
            if dec._n > cap or len(dec._buf) > cap:
                unbounded += 1
        total_items += len(items)
        if dec.frames + dec.error_total() - before != len(items):
            inconsistent += 1
            if len(details) < _MAX_DETAIL:
                details.append(
                    "case %d (%s): %d items, counters moved by %d"
                    % (i, name, len(items), dec.frames + dec.error_total() - before)
                )
        last = items[-1] if items else None
        if last is None or not last.ok or last.seq != seq or last.fields != fields:
            lost += 1
            if len(details) < _MAX_DETAIL:
                details.append("case %d (%s): sentinel lost, last item %r" % (i, name, last))
        else:
            items.pop()
        h = hits[name]
        for it in items:
            k = "frame" if it.ok else it.kind
            h[k] = h.get(k, 0) + 1
            if not it.ok and it.detail.startswith(_DECODER_BUG):
                # the decoder's own catch-all caught a foreign exception: still a bug
                bugs += 1
                if len(details) < _MAX_DETAIL:
                    details.append("case %d (%s): %s" % (i, name, it.detail[:160]))
    elapsed = ticks_diff(ticks_ms(), start)
    missed = []
    for m in mutators:
        for aim in m[3]:
            if not hits[m[0]].get(aim):
                missed.append("%s:%s" % (m[0], aim))
    errors = {}
    for k in ERROR_KINDS:
        errors[k] = dec.errors.get(k, 0)
    for k in dec.errors:  # a kind the decoder grew that this list does not know yet
        errors[k] = dec.errors[k]
    return {
        "cases": n,
        "seed": seed,
        "frames": dec.frames,
        "items": total_items,
        "bytes": total_bytes,
        "escaped": escaped,
        "decoder_bugs": bugs,
        "sentinels_lost": lost,
        "inconsistent": inconsistent,
        "unbounded": unbounded,
        "errors": errors,
        "hits": hits,
        "missed": missed,
        "details": details,
        "elapsed_ms": elapsed,
    }


# ---------------------------------------------------------------------------
# Direct fuzzing of the two decoders


def _direct(n, seed, make, decode, allowed):
    fz = Fuzzer(seed, variants=1)
    rng = fz.rng
    accepted = rejected = escaped = 0
    details = []
    start = ticks_ms()
    for i in range(n):
        data = make(fz, rng)
        try:
            decode(data, rng)
            accepted += 1
        except allowed:
            rejected += 1
        except Exception as e:  # noqa: BLE001 - counting them is the point
            escaped += 1
            if len(details) < _MAX_DETAIL:
                details.append(_describe(e, "case %d %r" % (i, bytes(data[:40]))))
    return {
        "cases": n,
        "accepted": accepted,
        "rejected": rejected,
        "escaped": escaped,
        "details": details,
        "elapsed_ms": ticks_diff(ticks_ms(), start),
    }


def _cbor_case(fz, rng):
    r = rng.below(6)
    if r == 0:
        return _hostile_payload(rng)
    if r == 1:
        return _valid_item(rng, 4)
    if r == 2:
        return rng.bytes(rng.between(0, 24))
    if r == 3:  # a valid payload with one byte changed
        mdef, fields, _ = rng.choice(fz.frames)
        b = bytearray(cbor.dumps(fields))
        b[rng.below(len(b))] = rng.below(256)
        return b
    if r == 4:  # a valid item cut short
        b = _valid_item(rng, 4)
        return b[: rng.below(len(b))]
    return _hostile_item(rng) + (_valid_item(rng, 1) if rng.chance(2) else b"")


def _cbor_decode(data, rng):
    cbor.loads(data)


def fuzz_cbor(n=10000, seed=1):
    """``cbor.loads`` on hostile bytes: only CBORDecodeError may come out."""
    return _direct(n, seed, _cbor_case, _cbor_decode, CBORDecodeError)


def _jsonl_case(fz, rng):
    r = rng.below(8)
    if r == 0:
        return fz.m_json_mutate()
    if r == 1:
        return fz.m_json_version()
    if r == 2:
        return fz.m_json_unknown_type()
    if r == 3:
        return fz.m_json_wrong_type()
    if r == 4:
        return fz.m_json_hostile()
    if r == 5:
        return fz.m_text_brace()
    if r == 6:
        return rng.bytes(rng.between(0, 40))
    return fz.line()


_ACCEPTS = (None, C.D2H, C.H2D)


def _jsonl_decode(data, rng):
    data = bytes(data).rstrip(b"\n")
    if rng.chance(2):
        try:
            data = data.decode()
        except UnicodeError:
            pass
    jsonl.decode_line(data, rng.choice(_ACCEPTS))


def fuzz_jsonl(n=10000, seed=1):
    """``jsonl.decode_line`` on hostile lines: only ProtocolError subclasses may come out."""
    return _direct(n, seed, _jsonl_case, _jsonl_decode, ProtocolError)


# ---------------------------------------------------------------------------
# Differential fuzzing: another decoder against the reference


_FLAG_SIGNED = 0x80  # frame byte 1 (protocol.sign.FLAG_SIGNED)
_TRAILER_LEN = 13  # protocol.sign.TRAILER_LEN


def _stuffed(raw):
    return bytes(cobs.encode(raw)) + b"\x00"


def _with_crc(raw):
    crc = crc16(raw, 0, len(raw))
    return raw + bytes((crc >> 8, crc & 0xFF))


def _edge_values(fdef):
    """Values at and beyond the edges of field ``fdef``, of its own kind and others."""
    kind = fdef[C.F_KIND]
    lo = fdef[C.F_LO]
    hi = fdef[C.F_HI]
    if kind in (C.K_UINT, C.K_INT, C.K_ENUM):
        out = [0, -1, 1, 23, 24, (1 << 63), -(1 << 64), (1 << 64) - 1, True, False]
        out += [1.0, 0.5, "1", None, [], b"\x01"]
        if lo is not None:
            out += [lo, lo - 1]
        if hi is not None:
            out += [hi, hi + 1]
        return out
    if kind == C.K_STR:
        n = hi if hi is not None and hi < 200 else 8
        out = ["", "x" * n, "x" * (n + 1), "\u00e9", "\u2603" * 3, 7, True, None, b"x"]
        if lo:
            out += ["x" * (lo - 1), "x" * lo]
        return out
    if kind == C.K_BOOL:
        return [True, False, 0, 1, None, "true", 1.0]
    return [0, "x", None, True, b"", [], {}, 1.5]


def _value_bytes(rng, v):
    """CBOR of ``v``, sometimes with a non-shortest head (still valid CBOR)."""
    if type(v) is int and 0 <= v < 24 and rng.chance(6):
        return bytes((0x18, v))
    if type(v) is int and 0 <= v < 256 and rng.chance(8):
        return bytes((0x19, 0, v))
    return cbor.dumps(v)


class _FastCases:
    """Cases aimed at a fast path's own shortcuts: module -> host frames whose CRC is
    valid and whose payload is near what such a path accepts (edge values, non-canonical
    CBOR, the signed flag with and without a trailer, other minors)."""

    def __init__(self, fz):
        self.fz = fz
        self.rng = fz.rng
        d2h = []
        for entry in fz.frames:
            if entry[0][C.M_DIR] == C.D2H:
                d2h.append(entry)
        self.d2h = d2h
        # (name, method, weight, aims); weights against the Fuzzer's own (total 101)
        self.mutators = (
            ("d2h_valid", self.m_valid, 10, ("frame",)),
            ("d2h_edges", self.m_edges, 24, ("frame", "invalid")),
            ("d2h_encoding", self.m_encoding, 16, ("frame", "undecodable")),
            ("d2h_signed", self.m_signed, 12, ("frame", "framing", "crc")),
        )

    def _keyed(self):
        mdef, fields, _ = self.rng.choice(self.d2h)
        keyed = []
        for fdef in mdef[C.M_FIELDS]:
            if fdef[C.F_NAME] in fields:
                keyed.append([fdef[C.F_KEY], fields[fdef[C.F_NAME]]])
        return mdef, keyed

    def _map(self, pairs):
        out = _head(5, len(pairs))
        for k, v in pairs:
            out += _value_bytes(self.rng, k) + _value_bytes(self.rng, v)
        return out

    def _frame(self, mdef, payload, minor=VERSION_MINOR):
        rng = self.rng
        raw = bytes((VERSION_MAJOR, minor, mdef[C.M_TYPE], rng.below(256), rng.below(256)))
        return _stuffed(_with_crc(raw + payload))

    def m_valid(self):
        """A good frame of another minor (newer minors may add fields)."""
        mdef, keyed = self._keyed()
        minor = self.rng.choice((0, 0, 1, 5, 0x7F))
        return self._frame(mdef, cbor.dumps(dict(keyed)) if keyed else b"", minor)

    def m_edges(self):
        rng = self.rng
        mdef, keyed = self._keyed()
        fdefs = mdef[C.M_FIELDS]
        if fdefs:
            for _ in range(rng.between(1, 3)):
                fdef = rng.choice(fdefs)
                v = rng.choice(_edge_values(fdef))
                for pair in keyed:
                    if pair[0] == fdef[C.F_KEY]:
                        pair[1] = v
                        break
                else:
                    keyed.append([fdef[C.F_KEY], v])
        r = rng.below(6)
        if r == 0 and keyed:  # a required field (or any) missing
            keyed.pop(rng.below(len(keyed)))
        elif r == 1:  # a newer minor's field, plain or not
            keyed.append([rng.between(40, 200), rng.choice((7, -3, "x", None, [1], 1.5, True))])
        elif r == 2:  # a key of another type
            keyed.append([rng.choice(("temp", b"k", -1, True, None)), 1])
        keyed.sort(key=_sort_key)
        if len(keyed) > 23 or 5 + len(keyed) * 12 > MAX_FRAME:
            keyed = keyed[:10]
        return self._frame(mdef, self._map(keyed))

    def m_encoding(self):
        rng = self.rng
        mdef, keyed = self._keyed()
        keyed.sort(key=_sort_key)
        r = rng.below(7)
        if r == 0 and len(keyed) > 1:  # keys out of order
            i = rng.below(len(keyed) - 1)
            keyed[i], keyed[i + 1] = keyed[i + 1], keyed[i]
        elif r == 1 and keyed:  # a key twice
            pair = rng.choice(keyed)
            keyed.append([pair[0], pair[1]])
            keyed.sort(key=_sort_key)
        elif r == 2 and keyed:  # an integer written as a float
            pair = rng.choice(keyed)
            if type(pair[1]) is int:
                pair[1] = float(pair[1])
        elif r == 3:  # indefinite-length map
            body = b""
            for k, v in keyed:
                body += cbor.dumps(k) + cbor.dumps(v)
            return self._frame(mdef, b"\xbf" + body + b"\xff")
        elif r == 4:  # map head not the shortest
            body = b""
            for k, v in keyed:
                body += cbor.dumps(k) + cbor.dumps(v)
            return self._frame(mdef, bytes((0xB8, len(keyed))) + body)
        elif r == 5:  # a tag around a value
            if keyed:
                pair = rng.choice(keyed)
                pair[1] = _Tagged(cbor.dumps(pair[1]))
        return self._frame(mdef, self._map_raw(keyed))

    def _map_raw(self, pairs):
        out = _head(5, len(pairs))
        for k, v in pairs:
            out += _value_bytes(self.rng, k)
            out += v.data if type(v) is _Tagged else _value_bytes(self.rng, v)
        return out

    def m_signed(self):
        """The signed flag: with a trailer after the CRC (a signed frame), without one,
        or with a trailer whose last two bytes are a CRC over all before them."""
        rng = self.rng
        mdef, keyed = self._keyed()
        payload = cbor.dumps(dict(keyed)) if keyed else b""
        minor = VERSION_MINOR | _FLAG_SIGNED
        head = bytes((VERSION_MAJOR, minor, mdef[C.M_TYPE], rng.below(256), rng.below(256)))
        body = _with_crc(head + payload)
        r = rng.below(3)
        if r == 0:
            return _stuffed(body + rng.bytes(_TRAILER_LEN))
        if r == 1:
            return _stuffed(body)
        return _stuffed(_with_crc(body + rng.bytes(_TRAILER_LEN - 2)))


class _Tagged:
    """Raw CBOR bytes of a tagged value (tag 1, then the value)."""

    def __init__(self, value_bytes):
        self.data = b"\xc1" + value_bytes


def _sort_key(pair):
    k = pair[0]
    return (0, k) if type(k) is int else (1, repr(k))


def _typed(v):
    """``v`` with every type spelt out (1 == True == 1.0 in Python; NaN != NaN)."""
    t = type(v)
    if t is dict:
        items = []
        for k in v:
            items.append((repr(k), _typed(v[k])))
        items.sort()
        return ("dict", tuple(items))
    if t is list or t is tuple:
        out = []
        for x in v:
            out.append(_typed(x))
        return ("list", tuple(out))
    if t is float:
        return ("float", repr(v))
    return (t.__name__, v)


def verdict(item):
    """What a decoder decided about one frame or line, for comparing two decoders:
    a message by type, seq, typed fields, minor, format and signature outcome; a
    rejection by kind, NACK code, type, seq, field, format and signature outcome.
    None for an item of a decoder's own (not a Message or BadFrame)."""
    if isinstance(item, Message):
        return (
            "frame",
            item.type,
            item.seq,
            _typed(item.fields),
            item.minor,
            item.fmt,
            item.auth,
            item.link,
        )
    if isinstance(item, BadFrame):
        return (
            item.kind,
            item.code,
            item.type,
            item.seq,
            item.field,
            item.fmt,
            item.auth,
            item.link,
        )
    return None


def feed_verdicts(dec, chunks):
    """(verdicts, own items, exception text or None) of feeding every chunk."""
    out = []
    own = 0
    for chunk in chunks:
        try:
            got = dec.feed(chunk)
        except Exception as e:  # noqa: BLE001 - counting them is the point
            dec.reset()
            return out, own, "%s(%r)" % (type(e).__name__, str(e)[:120])
        for it in got:
            v = verdict(it)
            if v is None:
                own += 1
            else:
                out.append(v)
    return out, own, None


def _counters(dec):
    errors = []
    for k in dec.errors:
        errors.append((k, dec.errors[k]))
    errors.sort()
    return dec.frames, tuple(errors)


def _moved(before, after):
    """What one case added to each counter (a reset in between: all of ``after``)."""
    if after[0] < before[0]:
        return after
    out = []
    for i in range(len(after[1])):
        k, v = after[1][i]
        was = 0
        for k0, v0 in before[1]:
            if k0 == k:
                was = v0
        out.append((k, v - was))
    return after[0] - before[0], tuple(out)


def differential(n, seed, make_decoder, accept=C.D2H):
    """Feed ``n`` cases, split into the same chunks, through the reference
    :class:`~protocol.frame.StreamDecoder` (``accept``) and ``make_decoder()``, both
    long-lived, and compare what they return.

    Cases: the :class:`Fuzzer`'s mutators plus :class:`_FastCases` (frames aimed at a
    fast path's shortcuts), each followed by 0x00 and a sentinel telemetry frame.
    A case *disagrees* when the two give different verdicts (:func:`verdict`) in any
    order or number, when the case moves their counters (``frames``, ``errors``)
    differently, or when an
    exception escapes one of them (``escaped_reference``/``escaped_other``). Items
    of the other decoder's own (the host's boot banners) are counted in ``own_items``,
    not compared.

    Returns ``cases``, ``disagreements`` (and ``disagreements_by_mutator``),
    ``escaped_reference``, ``escaped_other``,
    ``frames`` (good messages, per the reference), ``fast_frames`` (the other
    decoder's ``fast_frames`` if it counts them), ``own_items``, ``hits`` (mutator ->
    verdict kind -> count), ``missed`` aims, ``details`` (first disagreements) and
    ``elapsed_ms``.
    """
    fz = Fuzzer(seed)
    fast = _FastCases(fz)
    mutators = fz.mutators + fast.mutators
    table = []
    for i in range(len(mutators)):
        table.extend([i] * mutators[i][2])
    ref = StreamDecoder(accept=accept)
    other = make_decoder()
    hits = {}
    for m in mutators:
        hits[m[0]] = {}
    disagreements = escaped_ref = escaped_other = own_items = 0
    by_mutator = {}
    details = []
    start = ticks_ms()
    for i in range(n):
        name, mutate, _, _ = mutators[fz.rng.choice(table)]
        case = mutate()
        sentinel = fz.sentinel(i)[2]
        chunks = fz.chunks(bytes(case) + b"\x00" + sentinel)
        before_ref = _counters(ref)
        before_other = _counters(other)
        want, _, err_ref = feed_verdicts(ref, chunks)
        got, own, err_other = feed_verdicts(other, chunks)
        own_items += own
        escaped_ref += err_ref is not None
        escaped_other += err_other is not None
        if err_ref is not None or err_other is not None:
            # a reset decoder starts clean: re-align both before the next case
            ref.reset()
            other.reset()
        problem = None
        if err_ref != err_other:
            problem = "exception: reference %s, other %s" % (err_ref, err_other)
        elif want != got:
            problem = "verdicts: reference %r, other %r" % (want, got)
        else:
            moved_ref = _moved(before_ref, _counters(ref))
            moved_other = _moved(before_other, _counters(other))
            if moved_ref != moved_other:
                problem = "counters moved: reference %r, other %r" % (moved_ref, moved_other)
        if problem is not None:
            disagreements += 1
            by_mutator[name] = by_mutator.get(name, 0) + 1
            if len(details) < _MAX_DETAIL:
                details.append("case %d (%s) %r: %s" % (i, name, bytes(case[:48]), problem[:400]))
        h = hits[name]
        for v in want[:-1]:  # the sentinel is the last
            h[v[0]] = h.get(v[0], 0) + 1
    elapsed = ticks_diff(ticks_ms(), start)
    missed = []
    for m in fast.mutators:
        for aim in m[3]:
            if not hits[m[0]].get(aim):
                missed.append("%s:%s" % (m[0], aim))
    return {
        "cases": n,
        "seed": seed,
        "disagreements": disagreements,
        "disagreements_by_mutator": by_mutator,
        "escaped_reference": escaped_ref,
        "escaped_other": escaped_other,
        "frames": ref.frames,
        "fast_frames": getattr(other, "fast_frames", -1),
        "own_items": own_items,
        "hits": hits,
        "missed": missed,
        "details": details,
        "elapsed_ms": elapsed,
    }
