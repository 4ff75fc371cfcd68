"""The project's own CBOR (RFC 8949) subset codec, for MicroPython and CPython.

Emits exactly what the ``cbor2`` library emits for the same value, provided maps are
given in the deterministic key order this codec uses (keys sorted by the length of
their encoding, then bytewise: RFC 7049 section 3.9 "canonical" order). Sorting is
not optional: MicroPython dicts do not keep insertion order, and frames must be the
same bytes on both interpreters.

Subset:

==========  ================================  =======================================
major type  encoded                           decoded
==========  ================================  =======================================
0, 1        int in [-2**64, 2**64 - 1]        same, shortest head form only on encode
2           bytes, bytearray                  bytes (definite length only)
3           str (UTF-8)                       str (UTF-8 validated, definite only)
4           list, tuple                       list (definite length only)
5           dict with int/str/bytes keys      dict (keys int/str/bytes, no duplicates)
6           --                                rejected (no tags)
7           False, True, None, float          false/true/null, f16/f32/f64; undefined,
                                              simple values and break are rejected
==========  ================================  =======================================

Floats are written as float64 except NaN and +-infinity, which ``cbor2`` writes as
float16 (``f9 7e00`` / ``f9 7c00`` / ``f9 fc00``); so do we.

The decoder treats its input as hostile: every length is checked against the bytes
that remain, nesting is bounded (``max_depth``), indefinite lengths, tags and reserved
additional-information values are refused with :class:`CBORDecodeError`.

:func:`put_head` and :func:`put_int` write into a caller-owned buffer without
allocating (for integers within the small-int range); the telemetry encoder is built
on them.
"""

import struct

from protocol import errors as E  # the classes by attribute, made on first use

if __import__("sys").implementation.name != "micropython":
    # CPython's stand-in; MicroPython's compiler folds ``NAME = const(value)`` itself
    # (not importing it keeps ``const`` out of this module's dict on the MCU).

    def const(x):
        return x


# Major types and simple values the encoder writes (the decoder's, all of them, are
# in protocol/_cbor_rx.py).
_MAJOR_UINT = const(0)
_MAJOR_NEGINT = const(1)
_MAJOR_BYTES = const(2)
_MAJOR_TEXT = const(3)
_MAJOR_ARRAY = const(4)
MAJOR_MAP = const(5)

_FALSE = const(0xF4)
_TRUE = const(0xF5)
_NULL = const(0xF6)
_F64 = const(0xFB)

DEFAULT_MAX_DEPTH = 8
_UINT64_MAX = 0xFFFFFFFFFFFFFFFF


# ---------------------------------------------------------------------------
# Encoding into a caller-owned buffer (no allocation for small ints)


def head_len(value):
    """Bytes taken by a head whose argument is ``value`` (0 <= value < 2**64)."""
    if value < 24:
        return 1
    if value < 0x100:
        return 2
    if value < 0x10000:
        return 3
    if value <= 0xFFFFFFFF:
        return 5
    return 9


def put_head(buf, off, major, value):
    """Write the head of ``major`` with argument ``value`` at ``buf[off]``; return end."""
    mt = major << 5
    if value < 24:
        buf[off] = mt | value
        return off + 1
    if value < 0x100:
        buf[off] = mt | 24
        buf[off + 1] = value
        return off + 2
    if value < 0x10000:
        buf[off] = mt | 25
        buf[off + 1] = value >> 8
        buf[off + 2] = value & 0xFF
        return off + 3
    if value <= 0xFFFFFFFF:
        buf[off] = mt | 26
        struct.pack_into(">I", buf, off + 1, value)
        return off + 5
    buf[off] = mt | 27
    struct.pack_into(">Q", buf, off + 1, value)
    return off + 9


def put_int(buf, off, value):
    """Write integer ``value`` (major 0 or 1) at ``buf[off]``; return end offset."""
    if value >= 0:
        return put_head(buf, off, _MAJOR_UINT, value)
    return put_head(buf, off, _MAJOR_NEGINT, -1 - value)


def int_len(value):
    """Bytes :func:`put_int` would write for ``value``."""
    return head_len(value if value >= 0 else -1 - value)


# ---------------------------------------------------------------------------
# Generic encoder (allocates; used outside the control tick)


def _key_order(item):
    enc = item[0]
    return (len(enc), enc)


def _encode(obj, out, depth):
    if depth < 0:
        raise E.CBOREncodeError("nesting deeper than the codec allows")
    # bool first: it is an int subclass on both interpreters
    if obj is False:
        out.append(_FALSE)
    elif obj is True:
        out.append(_TRUE)
    elif obj is None:
        out.append(_NULL)
    elif isinstance(obj, int):
        if obj > _UINT64_MAX or obj < -1 - _UINT64_MAX:
            raise E.CBOREncodeError("integer out of the 64-bit CBOR range: %d" % obj)
        tmp = bytearray(9)
        n = put_int(tmp, 0, obj)
        out.extend(tmp[:n] if n < 9 else tmp)
    elif isinstance(obj, float):
        if obj != obj:
            out.extend(b"\xf9\x7e\x00")
        elif obj in (float("inf"), float("-inf")):
            out.extend(b"\xf9\x7c\x00" if obj > 0 else b"\xf9\xfc\x00")
        else:
            out.append(_F64)
            out.extend(struct.pack(">d", obj))
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        _extend_head(out, _MAJOR_TEXT, len(data))
        out.extend(data)
    elif isinstance(obj, (bytes, bytearray)):
        _extend_head(out, _MAJOR_BYTES, len(obj))
        out.extend(obj)
    elif isinstance(obj, (list, tuple)):
        _extend_head(out, _MAJOR_ARRAY, len(obj))
        for item in obj:
            _encode(item, out, depth - 1)
    elif isinstance(obj, dict):
        pairs = []
        for k, v in obj.items():
            if isinstance(k, bool) or not isinstance(k, (int, str, bytes)):
                raise E.CBOREncodeError(
                    "map keys must be int, str or bytes, not %s" % type(k).__name__
                )
            kb = bytearray()
            _encode(k, kb, depth - 1)
            pairs.append((bytes(kb), v))
        pairs.sort(key=_key_order)
        _extend_head(out, MAJOR_MAP, len(pairs))
        for kb, v in pairs:
            out.extend(kb)
            _encode(v, out, depth - 1)
    else:
        raise E.CBOREncodeError("type %s is outside the CBOR subset" % type(obj).__name__)


def _extend_head(out, major, value):
    tmp = bytearray(9)
    n = put_head(tmp, 0, major, value)
    out.extend(tmp[:n] if n < 9 else tmp)


def dumps(obj, max_depth=DEFAULT_MAX_DEPTH):
    """Encode ``obj``; returns bytes. Raises CBOREncodeError for unsupported values."""
    out = bytearray()
    _encode(obj, out, max_depth)
    return bytes(out)


# ---------------------------------------------------------------------------
# Decoder: protocol/_cbor_rx.py. The module decodes CBOR only when a command arrives
# (its heartbeats take frame.HeartbeatState's own parser), so on MicroPython the
# decoder is imported by the first use of ``decode_from`` or ``loads`` here and the
# firmware forgets it after each command (device.app ``_release``): its class and
# functions (about 400 B) are not in the heap from boot on (issue 24). On CPython the
# two are plain attributes of this module.

if __import__("sys").implementation.name == "micropython":

    def __getattr__(name):
        """``decode_from`` and ``loads``, from protocol._cbor_rx (imported now)."""
        if name == "decode_from" or name == "loads":
            from protocol import _cbor_rx

            return getattr(_cbor_rx, name)
        raise AttributeError(name)

else:
    from protocol._cbor_rx import decode_from, loads  # noqa: F401 - this module's API
