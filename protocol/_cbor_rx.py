"""The CBOR decoder of :mod:`protocol.cbor` (``decode_from``, ``loads``): see there.

A module of its own so that the firmware holds it only while it decodes a command
(protocol.cbor's ``__getattr__`` imports it on MicroPython; device.app's ``_release``
forgets it). Use it through protocol.cbor.

The decoder treats its input as hostile: every length is checked against the bytes
that remain, nesting is bounded (``max_depth``), indefinite lengths, tags and reserved
additional-information values are refused with :class:`CBORDecodeError`.
"""

import struct

from protocol import errors as E  # the classes by attribute, made on first use

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


# protocol.cbor's constants this module reads: copies, folded by the compiler;
# tests/test_cbor.py checks them against their source.
_MAJOR_UINT = const(0)
_MAJOR_NEGINT = const(1)
_MAJOR_BYTES = const(2)
_MAJOR_TEXT = const(3)
_MAJOR_ARRAY = const(4)
_MAJOR_MAP = const(5)
_MAJOR_SIMPLE = const(7)
_FALSE = const(0xF4)
_TRUE = const(0xF5)
_NULL = const(0xF6)
_UNDEFINED = const(0xF7)
_F16 = const(0xF9)
_F32 = const(0xFA)
_F64 = const(0xFB)
_BREAK = const(0xFF)
_DEFAULT_MAX_DEPTH = const(8)


def _half_to_float(h):
    """IEEE half-precision bits -> float, exactly: every half is a double, so its
    float64 bits are built and unpacked (``m * 2.0**e`` goes through ``pow``, which
    is not exact on every MicroPython port's libm)."""
    sign = (h & 0x8000) << 48
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0x1F:  # infinity, NaN (payload kept)
        bits = sign | 0x7FF0000000000000 | (mant << 42)
    elif exp:  # normal: rebias 15 -> 1023
        bits = sign | ((exp + 1008) << 52) | (mant << 42)
    elif mant:  # subnormal: normalise (mant * 2**-24)
        n = 0
        while not mant & 0x400:
            mant <<= 1
            n += 1
        bits = sign | ((1009 - n) << 52) | ((mant & 0x3FF) << 42)
    else:
        bits = sign  # +-0.0
    return struct.unpack(">d", struct.pack(">Q", bits))[0]


def _utf8_is_lax():
    try:
        str(b"\xc0\x80", "utf-8")  # overlong NUL: CPython refuses it, MicroPython not
    except UnicodeError:
        return False
    return True


_LAX_UTF8 = _utf8_is_lax()


def _valid_utf8(b):
    """Strict UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
    U+10FFFF), for interpreters whose ``str(b, "utf-8")`` lets those through."""
    i = 0
    n = len(b)
    while i < n:
        c = b[i]
        i += 1
        if c < 0x80:
            continue
        lo = 0x80
        hi = 0xBF
        if 0xC2 <= c <= 0xDF:
            more = 1
        elif 0xE0 <= c <= 0xEF:
            more = 2
            if c == 0xE0:
                lo = 0xA0
            elif c == 0xED:
                hi = 0x9F
        elif 0xF0 <= c <= 0xF4:
            more = 3
            if c == 0xF0:
                lo = 0x90
            elif c == 0xF4:
                hi = 0x8F
        else:
            return False
        if i + more > n or not lo <= b[i] <= hi:
            return False
        j = i + 1
        i += more
        while j < i:
            if not 0x80 <= b[j] <= 0xBF:
                return False
            j += 1
    return True


class _Reader:
    """Cursor over ``buf[pos:end]``; every read is bounds-checked."""

    def __init__(self, buf, pos, end, max_depth):
        self.buf = buf
        self.pos = pos
        self.end = end
        self.max_depth = max_depth

    def need(self, n):
        if n > self.end - self.pos:
            raise E.CBORDecodeError("truncated: need %d bytes, %d left" % (n, self.end - self.pos))

    def arg(self, info):
        """Read the argument for additional information ``info`` (< 28)."""
        buf = self.buf
        if info < 24:
            return info
        if info == 24:
            self.need(1)
            v = buf[self.pos]
            self.pos += 1
            return v
        if info == 25:
            self.need(2)
            p = self.pos
            self.pos = p + 2
            return (buf[p] << 8) | buf[p + 1]
        if info == 26:
            self.need(4)
            v = struct.unpack_from(">I", buf, self.pos)[0]
            self.pos += 4
            return v
        if info == 27:
            self.need(8)
            v = struct.unpack_from(">Q", buf, self.pos)[0]
            self.pos += 8
            return v
        if info == 31:
            raise E.CBORDecodeError("indefinite length is outside the subset")
        raise E.CBORDecodeError("reserved additional information %d" % info)

    def item(self, depth):
        if depth > self.max_depth:
            raise E.CBORDecodeError("nesting deeper than %d" % self.max_depth)
        self.need(1)
        ib = self.buf[self.pos]
        self.pos += 1
        major = ib >> 5
        info = ib & 0x1F
        if major == _MAJOR_SIMPLE:
            return self.simple(ib, info)
        n = self.arg(info)
        if major == _MAJOR_UINT:
            return n
        if major == _MAJOR_NEGINT:
            return -1 - n
        if major == _MAJOR_BYTES or major == _MAJOR_TEXT:
            self.need(n)
            p = self.pos
            self.pos = p + n
            raw = bytes(self.buf[p : p + n])
            if major == _MAJOR_BYTES:
                return raw
            if _LAX_UTF8 and not _valid_utf8(raw):
                raise E.CBORDecodeError("text string is not valid UTF-8")
            try:
                return str(raw, "utf-8")
            except UnicodeError:
                raise E.CBORDecodeError("text string is not valid UTF-8") from None
        if major == _MAJOR_ARRAY:
            # every item takes at least one byte: bound n before allocating
            self.need(n)
            out = []
            for _ in range(n):
                out.append(self.item(depth + 1))
            return out
        if major == _MAJOR_MAP:
            self.need(2 * n)
            out = {}
            for _ in range(n):
                k = self.item(depth + 1)
                if isinstance(k, bool) or not isinstance(k, (int, str, bytes)):
                    raise E.CBORDecodeError(
                        "map key of type %s is outside the subset" % type(k).__name__
                    )
                if k in out:
                    raise E.CBORDecodeError("duplicate map key %r" % (k,))
                out[k] = self.item(depth + 1)
            return out
        raise E.CBORDecodeError("tags (major type 6) are outside the subset")

    def simple(self, ib, info):
        if ib == _FALSE:
            return False
        if ib == _TRUE:
            return True
        if ib == _NULL:
            return None
        if ib == _F64:
            self.need(8)
            v = struct.unpack_from(">d", self.buf, self.pos)[0]
            self.pos += 8
            return v
        if ib == _F32:
            self.need(4)
            v = struct.unpack_from(">f", self.buf, self.pos)[0]
            self.pos += 4
            return v
        if ib == _F16:
            self.need(2)
            p = self.pos
            self.pos = p + 2
            return _half_to_float((self.buf[p] << 8) | self.buf[p + 1])
        if ib == _BREAK:
            raise E.CBORDecodeError("break outside an indefinite-length item")
        if ib == _UNDEFINED:
            raise E.CBORDecodeError("undefined is outside the subset")
        raise E.CBORDecodeError("simple value %d is outside the subset" % info)


def decode_from(buf, pos=0, end=-1, max_depth=_DEFAULT_MAX_DEPTH):
    """Decode one item from ``buf[pos:end]``; return ``(value, end_of_item)``."""
    if end < 0:
        end = len(buf)
    r = _Reader(buf, pos, end, max_depth)
    value = r.item(0)
    return value, r.pos


def loads(data, max_depth=_DEFAULT_MAX_DEPTH):
    """Decode exactly one item from ``data``; trailing bytes are an error."""
    value, pos = decode_from(data, 0, len(data), max_depth)
    if pos != len(data):
        raise E.CBORDecodeError("%d trailing bytes after the item" % (len(data) - pos))
    return value
