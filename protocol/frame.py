"""Binary frames and the stream decoder.

A frame before byte stuffing::

    +-------+-------+------+---------+-----------------+----------+
    | major | minor | type | seq u16 | payload (CBOR)  | CRC u16  |
    |  u8   |  u8   |  u8  |   BE    | map, or nothing |    BE    |
    +-------+-------+------+---------+-----------------+----------+

CRC-16/IBM-3740 covers everything before it. The whole is COBS-encoded and followed by
one 0x00 delimiter. ``MAX_FRAME`` bounds the unstuffed size.

:class:`StreamDecoder` takes bytes as they come from a serial port (any chunking) and
returns :class:`~protocol.message.Message` and :class:`~protocol.message.BadFrame`
items. JSON lines (see :mod:`protocol.jsonl`) are recognised on the same stream by the
second byte of a run: a binary frame always carries its major version there (a control
byte, 0x01 for v1; majors stay below 0x20), so any other second byte starts a text line
that ends at the next LF, whatever it holds (a terminal's backspace or escape
sequences cannot make the decoder stop listening for lines).
"""

from protocol import VERSION_MAJOR, VERSION_MINOR, cbor, cobs, jsonl
from protocol import catalog as C
from protocol.crc import crc16
from protocol.errors import (
    CBORDecodeError,
    CRCError,
    FieldError,
    FrameError,
    OversizeError,
    ProtocolError,
    UnknownTypeError,
    VersionError,
)
from protocol.message import (
    FMT_CBOR,
    FMT_JSON,
    BadFrame,
    Message,
    check_seq,
    fields_from_keys,
    lookup,
    validate_fields,
)

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


HEADER_LEN = const(5)
CRC_LEN = const(2)
MIN_FRAME = const(7)
MAX_FRAME = const(512)
MAX_LINE = const(1024)
DELIMITER = const(0)

# ----------------------------------------------------------------------------
# Encoding


def encode_payload(mdef, fields):
    """CBOR map with integer keys, in key order; empty bytes when there are no fields."""
    if not fields:
        return b""
    keyed = {}
    for fdef in mdef[C.M_FIELDS]:
        name = fdef[C.F_NAME]
        if name in fields:
            keyed[fdef[C.F_KEY]] = fields[name]
    return cbor.dumps(keyed)


def encode_frame(type_or_name, fields=None, seq=0, minor=VERSION_MINOR, major=VERSION_MAJOR):
    """Validate and encode one message; returns the COBS frame plus its 0x00 delimiter.

    Raises FieldError for a field that does not fit the catalog, UnknownTypeError for a
    type not in it, OversizeError when the frame would exceed MAX_FRAME.
    """
    mdef = lookup(type_or_name)
    fields = fields or {}
    check_seq(seq)
    validate_fields(mdef, fields)
    payload = encode_payload(mdef, fields)
    n = HEADER_LEN + len(payload) + CRC_LEN
    if n > MAX_FRAME:
        raise OversizeError("%s frame of %d bytes exceeds %d" % (mdef[C.M_NAME], n, MAX_FRAME))
    raw = bytearray(n)
    raw[0] = major
    raw[1] = minor
    raw[2] = mdef[C.M_TYPE]
    raw[3] = (seq >> 8) & 0xFF
    raw[4] = seq & 0xFF
    raw[HEADER_LEN : HEADER_LEN + len(payload)] = payload
    crc = crc16(raw, 0, n - CRC_LEN)
    raw[n - 2] = crc >> 8
    raw[n - 1] = crc & 0xFF
    out = bytearray(cobs.max_encoded_len(n) + 1)
    end = cobs.encode_into(raw, n, out, 0)
    out[end] = DELIMITER
    return bytes(out[: end + 1])


def encode_message(msg):
    """Encode a Message in its own format (binary frame or JSON line)."""
    if msg.fmt == FMT_JSON:
        return jsonl.encode_line(msg.name, msg.fields, msg.seq)
    return encode_frame(msg.type, msg.fields, msg.seq)


# ----------------------------------------------------------------------------
# Decoding


def decode_raw(raw, n, accept=None):
    """Decode an unstuffed frame ``raw[:n]``; returns a Message or raises ProtocolError.

    ``accept`` (C.H2D or C.D2H) refuses messages meant for the other direction.
    """
    if n < MIN_FRAME:
        raise FrameError("frame of %d bytes is shorter than %d" % (n, MIN_FRAME))
    got = (raw[n - 2] << 8) | raw[n - 1]
    want = crc16(raw, 0, n - CRC_LEN)
    if got != want:
        raise CRCError("CRC %04x, computed %04x" % (got, want))
    major = raw[0]
    minor = raw[1]
    type_id = raw[2]
    seq = (raw[3] << 8) | raw[4]
    if major != VERSION_MAJOR:
        err = VersionError(
            "peer speaks protocol %d.%d, this side speaks %d.x" % (major, minor, VERSION_MAJOR),
            major,
            minor,
        )
        err.type_id = type_id
        err.seq = seq
        raise err
    mdef = C.by_type(type_id)
    if mdef is None:
        err = UnknownTypeError("unknown message type 0x%02x" % type_id)
        err.type_id = type_id
        err.seq = seq
        raise err
    try:
        if accept is not None and mdef[C.M_DIR] != accept:
            raise FieldError(
                "%s is not accepted in this direction" % mdef[C.M_NAME], C.ERR_DIRECTION
            )
        end = n - CRC_LEN
        if end == HEADER_LEN:
            raw_fields = {}
        else:
            raw_fields, pos = cbor.decode_from(raw, HEADER_LEN, end)
            if pos != end:
                raise CBORDecodeError("%d bytes after the payload map" % (end - pos))
            if not isinstance(raw_fields, dict):
                raise CBORDecodeError("payload is not a map")
        fields = fields_from_keys(mdef, raw_fields)
    except ProtocolError as e:
        e.type_id = type_id
        e.seq = seq
        raise
    return Message(type_id, mdef[C.M_NAME], seq, fields, minor, FMT_CBOR)


def decode_frame(data, accept=None):
    """Decode one COBS frame (with or without its trailing 0x00)."""
    n = len(data)
    if n and data[n - 1] == DELIMITER:
        n -= 1
    raw = bytearray(n)
    m = cobs.decode_into(data, n, raw)
    return decode_raw(raw, m, accept)


# stream decoder states
_IDLE = const(0)  # nothing buffered
_FIRST = const(4)  # one byte buffered: the next one tells a frame from a text line
_TEXT = const(1)  # a text line (JSON or noise), ends at LF
_BIN = const(2)  # binary frame, ends at 0x00
_DISCARD = const(3)  # oversize: dropping until the next delimiter
_NL = const(0x0A)
_LBRACE = const(0x7B)


def _is_space(b):
    return b == 0x20 or b == 0x09 or b == 0x0A or b == 0x0D


ERROR_KINDS = (
    "crc",
    "oversize",
    "framing",
    "undecodable",
    "unknown_type",
    "version",
    "invalid",
    "noise",
)


class StreamDecoder:
    """Turns a byte stream into messages; never raises on any input.

    ``feed(data)`` returns a list of Message (``.ok`` True) and BadFrame (``.ok``
    False) items in stream order. Every rejected frame is counted in ``errors`` by
    kind; ``frames`` counts good ones. Memory is bounded: a frame longer than
    ``max_frame`` (after stuffing) or a text line longer than ``max_line`` is dropped
    up to the next delimiter and counted once as ``oversize``.
    """

    def __init__(self, max_frame=MAX_FRAME, max_line=MAX_LINE, accept=None):
        self.max_encoded = cobs.max_encoded_len(max_frame)
        self.max_line = max_line
        self.accept = accept
        self._buf = bytearray(max(self.max_encoded, max_line) + 1)
        self._raw = bytearray(max_frame)
        self._n = 0
        self._state = _IDLE
        self._discard_text = False
        self.frames = 0
        self.json_lines = 0
        self.bytes = 0
        self.errors = {}
        for k in ERROR_KINDS:
            self.errors[k] = 0

    def reset(self):
        """Drop any partial frame (e.g. after the port was reopened)."""
        self._n = 0
        self._state = _IDLE

    def error_total(self):
        t = 0
        for k in self.errors:
            t += self.errors[k]
        return t

    def feed(self, data):
        out = []
        self.bytes += len(data)
        buf = self._buf
        i = 0
        end = len(data)
        has_find = hasattr(data, "find")
        while i < end:
            state = self._state
            if state == _BIN:
                # fast path: copy up to the next delimiter in one go
                if has_find:
                    stop = data.find(b"\x00", i)
                    if stop < 0:
                        stop = end
                else:
                    stop = i
                    while stop < end and data[stop] != 0:
                        stop += 1
                count = stop - i
                if self._n + count > self.max_encoded:
                    self._overflow(out, False)
                    i = stop
                    continue
                buf[self._n : self._n + count] = data[i:stop]
                self._n += count
                i = stop
                if i < end:  # at the delimiter
                    i += 1
                    self._end_binary(out)
                continue
            b = data[i]
            i += 1
            if state == _DISCARD:
                if b == 0 or (b == _NL and self._discard_text):
                    self._n = 0
                    self._state = _IDLE
                continue
            if state == _IDLE:
                if b:
                    buf[0] = b
                    self._n = 1
                    self._state = _FIRST
                continue
            if state == _FIRST:
                # The second byte decides. A frame's is its major version: a control
                # byte (< 0x20, not whitespace). Anything else starts a text line.
                first = buf[0]
                if b == 0:
                    if _is_space(first):
                        self._n = 0
                        self._state = _IDLE
                    else:
                        self._end_binary(out)  # too short: counted
                    continue
                if first == _NL and b != VERSION_MAJOR:
                    # A blank line, not the COBS code byte 0x0A of a frame (whose
                    # second byte would be the major version): b starts the run.
                    buf[0] = b
                    continue
                if b < 0x20 and not _is_space(b):
                    buf[1] = b
                    self._n = 2
                    self._state = _BIN
                    continue
                if b == _NL:
                    self._end_text(out)
                    continue
                buf[1] = b
                self._n = 2
                self._state = _TEXT
                continue
            # _TEXT: a line, whatever bytes it holds, ends at LF
            if b == _NL:
                self._end_text(out)
                continue
            if b == 0:
                self._n = 0
                self._state = _IDLE
                self.errors["noise"] += 1
                out.append(BadFrame("noise", "text ended by 0x00", fmt=FMT_JSON))
                continue
            if self._n >= self.max_line:
                self._overflow(out, True)
                continue
            buf[self._n] = b
            self._n += 1
        return out

    def _overflow(self, out, text):
        self.errors["oversize"] += 1
        self._n = 0
        self._state = _DISCARD
        self._discard_text = text
        fmt = FMT_JSON if text else FMT_CBOR
        out.append(BadFrame("oversize", "longer than the receive buffer", fmt=fmt))

    def _reject(self, out, err, fmt):
        kind = err.kind
        if kind == "protocol":  # pragma: no cover - every subclass names its kind
            kind = "undecodable"
        self.errors[kind] += 1
        code = getattr(err, "code", None)
        if code is None:
            code = _CODE_BY_KIND.get(kind, C.ERR_MALFORMED)
        out.append(
            BadFrame(
                kind,
                str(err),
                code,
                getattr(err, "type_id", 0),
                getattr(err, "seq", 0),
                getattr(err, "field", None),
                fmt,
            )
        )

    def _end_binary(self, out):
        n = self._n
        self._n = 0
        self._state = _IDLE
        try:
            m = cobs.decode_into(self._buf, n, self._raw)
            msg = decode_raw(self._raw, m, self.accept)
        except ProtocolError as e:
            self._reject(out, e, FMT_CBOR)
            return
        except Exception as e:  # noqa: BLE001 - the read loop must survive anything
            self._reject(out, FrameError("decoder bug: %r" % (e,)), FMT_CBOR)
            return
        self.frames += 1
        out.append(msg)

    def _end_text(self, out):
        n = self._n
        self._n = 0
        self._state = _IDLE
        buf = self._buf
        s = 0
        while s < n and buf[s] in (0x20, 0x09, 0x0D, 0x0A):
            s += 1
        e = n
        while e > s and buf[e - 1] in (0x20, 0x09, 0x0D, 0x0A):
            e -= 1
        if s == e:
            return
        if buf[s] != _LBRACE:
            self.errors["noise"] += 1
            out.append(BadFrame("noise", "text line that is not a JSON object", fmt=FMT_JSON))
            return
        try:
            msg = jsonl.decode_line(bytes(buf[s:e]), self.accept)
        except ProtocolError as e:
            self._reject(out, e, FMT_JSON)
            return
        except Exception as e:  # noqa: BLE001 - the read loop must survive anything
            self._reject(out, FrameError("decoder bug: %r" % (e,)), FMT_JSON)
            return
        self.frames += 1
        self.json_lines += 1
        out.append(msg)


_CODE_BY_KIND = {
    "version": C.ERR_VERSION,
    "unknown_type": C.ERR_UNKNOWN_TYPE,
}
