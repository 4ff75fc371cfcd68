"""Binary frames, the stream decoder, and the allocation-free heartbeat path.

A frame before byte stuffing::

    +-------+-------+------+---------+-----------------+----------+-------------------+
    | major | minor | type | seq u16 | payload (CBOR)  | CRC u16  | signed frames:    |
    |  u8   |  u8   |  u8  |   BE    | map, or nothing |    BE    | link ts u48 sig 6 |
    +-------+-------+------+---------+-----------------+----------+-------------------+

CRC-16/IBM-3740 covers header and payload. Bit 7 of byte 1 (``FLAG_SIGNED``) marks a
signed frame: the minor version is ``byte1 & 0x7F`` and a 13-byte trailer follows the
CRC (:mod:`protocol.sign`; SPEC.md section 14.1). The whole is COBS-encoded and
followed by one 0x00 delimiter. ``MAX_FRAME`` bounds the unstuffed size, trailer
included.

:class:`StreamDecoder` takes bytes as they come from a serial port (any chunking) and
returns :class:`~protocol.message.Message` and :class:`~protocol.message.BadFrame`
items. JSON lines (see :mod:`protocol.jsonl`) are recognised on the same stream by the
second byte of a run: a binary frame always carries its major version there (a control
byte, 0x01 for v1; majors stay below 0x20), so any other second byte starts a text line
that ends at the next LF, whatever it holds (a terminal's backspace or escape
sequences cannot make the decoder stop listening for lines). A binary run also ends
at a pause: ``idle(now)``, called when the port is found empty, drops an incomplete
one after ``GAP_MS`` (100 ms) of silence, so a control byte typed at a terminal (Ctrl-C) does
not leave the decoder deaf until a 0x00 (SPEC.md section 8).

On the module, ``feed(rx, n, sink)`` with a :class:`HeartbeatState` and a
:class:`~protocol.sign.Verifier` receives the host's signed heartbeats without
allocating anything: see :class:`HeartbeatState`.
"""

from protocol import catalog as C
from protocol import cbor, cobs
from protocol import errors as E  # the classes by attribute: 8 fewer module names
from protocol import message as M  # by attribute too: 9 fewer
from protocol.crc import crc16

if __import__("sys").implementation.name != "micropython":
    # CPython's stand-in. MicroPython's compiler folds every ``NAME = const(value)``
    # here itself (the name need not exist: not importing it keeps it out of this
    # module's dict on the MCU).

    def const(x):
        return x


# Constants of protocol (VERSION_*), protocol.catalog, protocol.message and
# protocol.sign that this module reads: copies, which the compiler folds (another
# module's names are dict lookups at run time, and imported ones slots in this
# module's dict on the MCU). tests/test_message_frame.py checks each against its source.
_VERSION_MAJOR = const(1)
_VERSION_MINOR = const(0)
_FLAG_SIGNED = const(0x80)
_TRAILER_LEN = const(13)
_AUTH_NONE = const(0)
_AUTH_OK = const(1)
_AUTH_UNCHECKED = const(4)
_FMT_CBOR = const("cbor")
_FMT_JSON = const("json")
_T_HEARTBEAT = const(0x20)
_H2D = const("h2d")
_M_TYPE = const(0)
_M_NAME = const(1)
_M_DIR = const(2)
_M_FIELDS = const(3)
_F_KEY = const(0)
_F_NAME = const(1)
_F_KIND = const(2)
_F_REQUIRED = const(3)
_F_LO = const(4)
_F_HI = const(5)
_K_UINT = const("u")
_K_INT = const("i")
_K_ENUM = const("e")
_ERR_MALFORMED = const(1)
_ERR_VERSION = const(2)
_ERR_UNKNOWN_TYPE = const(3)
_ERR_OUT_OF_RANGE = const(6)
_ERR_DIRECTION = const(12)

# HEADER_LEN, CRC_LEN, MIN_FRAME, MAX_LINE, MIN_SIGNED and ERROR_KINDS are public names
# the firmware reads only here: const()-private, answered by __getattr__ (at the end)
# from flash on MicroPython (no slots in this module's dict: issue 24), plain
# attributes on CPython. MAX_FRAME, which the firmware reads, is a plain attribute.
_HEADER_LEN = const(5)
_CRC_LEN = const(2)
_MIN_FRAME = const(7)
MAX_FRAME = const(512)  # unstuffed, trailer included
_MAX_LINE = const(1024)
_DELIMITER = const(0)
_MINOR_MASK = const(0x7F)  # byte 1 = minor | FLAG_SIGNED
_MIN_SIGNED = const(20)  # _MIN_FRAME + TRAILER_LEN
# Line silence that ends an incomplete binary run (StreamDecoder.idle; SPEC's GAP_MS).
# Private to keep it out of the module's dict on the MCU: tests read it on CPython.
_GAP_MS = const(100)
_TICKS_MASK = const(0x3FFFFFFF)  # ms ticks wrap at 2**30 (device/ticks.py)

# ----------------------------------------------------------------------------
# Encoding


def encode_frame(
    type_or_name, fields=None, seq=0, minor=_VERSION_MINOR, major=_VERSION_MAJOR, signer=None
):
    """Validate and encode one message; returns the COBS frame plus its 0x00 delimiter.

    With ``signer`` (a :class:`protocol.sign.Signer` that has the module's nonce) the
    frame is signed: FLAG_SIGNED in byte 1 and the 13-byte trailer after the CRC.
    Without one, byte 1 is ``minor`` as given (a minor with bit 7 set then makes a
    frame that claims a trailer it lacks: only hostile-input tests want that).

    Raises FieldError for a field that does not fit the catalog, UnknownTypeError for a
    type not in it, OversizeError when the frame would exceed MAX_FRAME, SigningError
    when the signer has no nonce yet.
    """
    mdef = M.lookup(type_or_name)
    fields = fields or {}
    M.check_seq(seq)
    M.validate_fields(mdef, fields)
    if signer is not None and not 0 <= minor <= _MINOR_MASK:
        raise E.FieldError(
            "minor %r does not fit beside the signed flag" % (minor,), _ERR_OUT_OF_RANGE, "minor"
        )
    payload = M.encode_payload(mdef, fields)
    body = _HEADER_LEN + len(payload) + _CRC_LEN
    n = body if signer is None else body + _TRAILER_LEN
    if n > MAX_FRAME:
        raise E.OversizeError("%s frame of %d bytes exceeds %d" % (mdef[_M_NAME], n, MAX_FRAME))
    raw = bytearray(n)
    raw[0] = major
    raw[1] = minor if signer is None else minor | _FLAG_SIGNED
    raw[2] = mdef[_M_TYPE]
    raw[3] = (seq >> 8) & 0xFF
    raw[4] = seq & 0xFF
    raw[_HEADER_LEN : _HEADER_LEN + len(payload)] = payload
    crc = crc16(raw, 0, body - _CRC_LEN)
    raw[body - 2] = crc >> 8
    raw[body - 1] = crc & 0xFF
    if signer is not None:
        trailer = signer.trailer(bytes(raw[:body]))
        if len(trailer) != _TRAILER_LEN:  # pragma: no cover - Signer guarantees it
            raise E.FrameError("signer returned a %d-byte trailer" % len(trailer))
        raw[body:n] = trailer
    out = bytearray(cobs.max_encoded_len(n) + 1)
    end = cobs.encode_into(raw, n, out, 0)
    out[end] = _DELIMITER
    return bytes(out[: end + 1])


def encode_message(msg, signer=None):
    """Encode a Message in its own format (binary frame or JSON line)."""
    if msg.fmt == _FMT_JSON:
        from protocol import jsonl  # JSON lines: imported for the first one (kept)

        return jsonl.encode_line(msg.name, msg.fields, msg.seq, signer=signer)
    return encode_frame(msg.type, msg.fields, msg.seq, signer=signer)


# ----------------------------------------------------------------------------
# Decoding


def decode_raw(raw, n, accept=None, verifier=None):
    """Decode an unstuffed frame ``raw[:n]``; returns a Message or raises ProtocolError.

    ``accept`` (C.H2D or C.D2H) refuses messages meant for the other direction.
    ``verifier`` (a :class:`protocol.sign.Verifier`) checks the signature of a signed
    frame right after the version; its outcome is ``Message.auth`` (or the ``auth``
    of the error) and never rejects the frame by itself. Without a verifier a signed
    frame is ``AUTH_UNCHECKED``.
    """
    if n < _MIN_FRAME:
        raise E.FrameError("frame of %d bytes is shorter than %d" % (n, _MIN_FRAME))
    end = n  # end of the CRC
    if raw[1] & _FLAG_SIGNED:
        end = n - _TRAILER_LEN
        if end < _MIN_FRAME:
            raise E.FrameError("signed frame of %d bytes is shorter than %d" % (n, _MIN_SIGNED))
    got = (raw[end - 2] << 8) | raw[end - 1]
    want = crc16(raw, 0, end - _CRC_LEN)
    if got != want:
        raise E.CRCError("CRC %04x, computed %04x" % (got, want))
    major = raw[0]
    minor = raw[1] & _MINOR_MASK
    type_id = raw[2]
    seq = (raw[3] << 8) | raw[4]
    if major != _VERSION_MAJOR:
        err = E.VersionError(
            "peer speaks protocol %d.%d, this side speaks %d.x" % (major, minor, _VERSION_MAJOR),
            major,
            minor,
        )
        err.type_id = type_id
        err.seq = seq
        raise err
    auth = _AUTH_NONE
    link = -1
    if end != n:
        link = raw[end]
        auth = _AUTH_UNCHECKED if verifier is None else verifier.verify(raw, n)
    mdef = C.by_type(type_id)
    if mdef is None:
        err = E.UnknownTypeError("unknown message type 0x%02x" % type_id)
        err.type_id = type_id
        err.seq = seq
        err.auth = auth
        err.link = link
        raise err
    try:
        if accept is not None and mdef[_M_DIR] != accept:
            raise E.FieldError(
                "%s is not accepted in this direction" % mdef[_M_NAME], _ERR_DIRECTION
            )
        pend = end - _CRC_LEN
        if pend == _HEADER_LEN:
            raw_fields = {}
        else:
            raw_fields, pos = cbor.decode_from(raw, _HEADER_LEN, pend)
            if pos != pend:
                raise E.CBORDecodeError("%d bytes after the payload map" % (pend - pos))
            if not isinstance(raw_fields, dict):
                raise E.CBORDecodeError("payload is not a map")
        fields = M.fields_from_keys(mdef, raw_fields)
    except E.ProtocolError as e:
        e.type_id = type_id
        e.seq = seq
        e.auth = auth
        e.link = link
        raise
    return M.Message(type_id, mdef[_M_NAME], seq, fields, minor, _FMT_CBOR, auth, link)


def decode_frame(data, accept=None, verifier=None):
    """Decode one COBS frame (with or without its trailing 0x00); see decode_raw."""
    n = len(data)
    if n and data[n - 1] == _DELIMITER:
        n -= 1
    raw = bytearray(n)
    m = cobs.decode_into(data, n, raw)
    return decode_raw(raw, m, accept, verifier)


# ----------------------------------------------------------------------------
# Heartbeats without allocation

_SMALL_MIN = const(-0x40000000)  # a MicroPython small int on a 32-bit MCU: -2**30 ..
_SMALL_MAX = const(0x3FFFFFFF)  # .. 2**30 - 1
_INT_KINDS = const((_K_UINT, _K_INT, _K_ENUM))


class HeartbeatState:
    """The last authenticated heartbeat, filled by :class:`StreamDecoder` in place.

    Give one to ``StreamDecoder(heartbeat=..., verifier=...)``: a binary heartbeat
    frame whose payload is a CBOR map of small uint keys (< 24) to integers is then
    parsed straight into this object, its signature checked by the verifier, and no
    Message is made: nothing is allocated on MicroPython. After ``feed`` the
    application looks at ``pending``:

    - ``pending``: True after each heartbeat frame taken this way (the application
      clears it); ``seq``, ``minor``, ``auth`` (``protocol.sign.AUTH_*``) and ``link``
      (-1 unsigned) describe the LATEST such frame, whatever its signature. One read
      can hold several, so the application never decides from ``auth`` alone:
    - ``fresh``: True once an ``AUTH_OK`` heartbeat was taken (the application clears
      it), whatever came after it: an unsigned heartbeat right behind the host's
      signed one cannot hide it (issue 23 item 10);
    - ``bad``: how many refused heartbeats (any other auth) were taken since the
      application cleared it; ``bad_seq`` and ``bad_auth`` name the latest;
    - ``values`` (``array('i')``, indexed like the catalog's heartbeat fields) and
      ``present`` (bit i = field i) are updated ONLY when ``auth`` is ``AUTH_OK``:
      a forged, replayed, stale-nonce or unsigned heartbeat leaves them untouched.
      A field absent from the latest accepted heartbeat keeps a stale value in
      ``values``; ``present`` says which are current;
    - ``wide`` (bitmask): fields of the latest accepted heartbeat that were on the
      wire but hold a value of 2**30 or more, which is not a small int on a 32-bit
      MCU: they are valid (the range check passes) but SKIPPED, not stored, and their
      ``present`` bit is clear. In practice this is ``host_time`` (Unix seconds,
      > 2**30 since 2004); a module that wants it must take it off the fast path.
    - counters: ``taken`` (frames this path handled), ``accepted`` (``AUTH_OK``),
      ``refused`` (any other auth), ``fallbacks`` (heartbeat frames it passed on).

    Everything the fast path does not handle (a CRC error, a key or value outside the
    small-int encodings, duplicate keys, a value out of range, trailing bytes, ...)
    goes to the normal decoder, which allocates and gives the same accept/reject
    verdict as a Message or BadFrame item; the signature is checked exactly once
    either way.
    """

    _def = C.by_type(_T_HEARTBEAT)  # the catalog's heartbeat (a class attribute: no module slot)

    def __init__(self):
        from array import array  # here: not a slot in the module's dict

        fields = self._def[_M_FIELDS]
        n = len(fields)
        self.values = array("i", [0] * n)
        self.present = 0
        self.wide = 0
        self.seq = 0
        self.minor = 0
        self.auth = _AUTH_NONE
        self.link = -1
        self.pending = False
        self.fresh = False
        self.bad = 0
        self.bad_seq = 0
        self.bad_auth = _AUTH_NONE
        self.taken = 0
        self.accepted = 0
        self.refused = 0
        self.fallbacks = 0
        # One array (a header and a heap block, and an attribute, for all; 17
        # attributes keep the instance's table a size step smaller): the parsed values
        # [0, n), the lower bounds [n, 2n), the upper [2n, 3n), then the masks of
        # integer fields, of fields whose 4-byte uints are all in range, and of
        # required fields.
        t = array("i", [0] * (3 * n + 3))
        self._t = t
        ints = 0
        wide_ok = 0
        required = 0
        i = 0
        while i < n:
            f = fields[i]
            if f[_F_KEY] != i:  # take() reads a key as the field's index
                raise ValueError("heartbeat field keys are not 0..n-1")
            lo = f[_F_LO]
            hi = f[_F_HI]
            if f[_F_KIND] in _INT_KINDS:
                ints |= 1 << i
            if f[_F_KIND] == _K_UINT and (lo is None or lo < 0):
                lo = 0
            t[n + i] = _SMALL_MIN if lo is None or lo < _SMALL_MIN else lo
            t[2 * n + i] = _SMALL_MAX if hi is None or hi > _SMALL_MAX else hi
            if hi is None or hi >= 0xFFFFFFFF:
                wide_ok |= 1 << i  # any 4-byte uint fits its range
            if f[_F_REQUIRED]:
                required |= 1 << i
            i += 1
        t[3 * n] = ints
        t[3 * n + 1] = wide_ok
        t[3 * n + 2] = required

    def fields(self):
        """The present values as a name -> value dict (allocates; tests and hosts)."""
        out = {}
        fields = self._def[_M_FIELDS]
        i = 0
        while i < len(fields):
            if self.present & (1 << i):
                out[fields[i][_F_NAME]] = self.values[i]
            i += 1
        return out

    def take(self, raw, n, verifier, accept):
        """Handle the unstuffed frame ``raw[:n]`` if it is a heartbeat this path can
        parse; True when it did (the state describes it), False to decode it the
        normal way. Allocates nothing."""
        if n < _MIN_FRAME or raw[2] != _T_HEARTBEAT or raw[0] != _VERSION_MAJOR:
            return False
        if accept is not None and accept != _H2D:
            return False
        self.fallbacks += 1  # undone below when the frame is taken
        end = n
        if raw[1] & _FLAG_SIGNED:
            end = n - _TRAILER_LEN
            if end < _MIN_FRAME:
                return False
        if crc16(raw, 0, end - _CRC_LEN) != (raw[end - 2] << 8) | raw[end - 1]:
            return False
        p = _HEADER_LEN
        pend = end - _CRC_LEN
        present = 0
        wide = 0
        t = self._t
        nf = len(self.values)
        if p < pend:
            ib = raw[p]
            p += 1
            if ib < 0xA0 or ib > 0xB7:  # a map with fewer than 24 pairs
                return False
            count = ib - 0xA0
            ints = t[3 * nf]
            wide_ok = t[3 * nf + 1]
            seen = 0
            while count:
                if p + 2 > pend:
                    return False
                k = raw[p]
                if k >= 24 or seen & (1 << k):  # not a one-byte uint key, or a duplicate
                    return False
                seen |= 1 << k
                ib = raw[p + 1]
                p += 2
                info = ib & 0x1F
                big = False
                if ib >= 0x40:  # major type 2..7: not an integer
                    return False
                if info < 24:
                    v = info
                elif info == 24:
                    if p + 1 > pend:
                        return False
                    v = raw[p]
                    p += 1
                elif info == 25:
                    if p + 2 > pend:
                        return False
                    v = (raw[p] << 8) | raw[p + 1]
                    p += 2
                elif info == 26:
                    if p + 4 > pend:
                        return False
                    if raw[p] >= 0x40:
                        big = True  # >= 2**30: not a small int on the MCU
                        v = 0
                    else:
                        v = (raw[p] << 24) | (raw[p + 1] << 16) | (raw[p + 2] << 8) | raw[p + 3]
                    p += 4
                else:
                    return False  # 8-byte or reserved argument
                if ib >= 0x20:
                    v = -1 - v
                if k < nf:  # the field's index; unknown keys (a newer minor's) are ignored
                    bit = 1 << k
                    if not ints & bit:
                        return False
                    if big:
                        if ib >= 0x20 or not wide_ok & bit:
                            return False
                        wide |= bit
                    else:
                        if v < t[nf + k] or v > t[2 * nf + k]:
                            return False
                        t[k] = v
                        present |= bit
                count -= 1
            if p != pend:
                return False
        if t[3 * nf + 2] & ~(present | wide):
            return False
        # The frame is valid: the signature is checked now, exactly once.
        self.fallbacks -= 1
        if end != n:
            self.link = raw[end]
            self.auth = _AUTH_UNCHECKED if verifier is None else verifier.verify(raw, n)
        else:
            self.link = -1
            self.auth = _AUTH_NONE
        self.seq = (raw[3] << 8) | raw[4]
        self.minor = raw[1] & _MINOR_MASK
        self.pending = True
        self.taken += 1
        if self.auth != _AUTH_OK:
            self.refused += 1
            self.bad += 1
            self.bad_seq = self.seq
            self.bad_auth = self.auth
            return True
        values = self.values
        i = 0
        while i < nf:
            if present & (1 << i):
                values[i] = t[i]
            i += 1
        self.present = present
        self.wide = wide
        self.fresh = True
        self.accepted += 1
        return True


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


_ERROR_KINDS = const(
    (
        "crc",
        "oversize",
        "framing",
        "undecodable",
        "unknown_type",
        "version",
        "invalid",
        "noise",
    )
)


class StreamDecoder:
    """Turns a byte stream into messages; never raises on any input.

    ``feed(data)`` returns a list of Message (``.ok`` True) and BadFrame (``.ok``
    False) items in stream order. Every rejected frame is counted in ``errors`` by
    kind; ``frames`` counts good ones (heartbeats taken by the fast path included),
    ``bytes`` the bytes fed (wrapping at 2**30, a small int on the MCU). Memory is
    bounded: a frame longer than ``max_frame`` (after stuffing) or a text line longer
    than ``max_line`` is dropped up to the next delimiter and counted once as
    ``oversize``.

    ``verifier`` (a :class:`protocol.sign.Verifier`, the module's) checks every signed
    frame and line; without one a signed message is ``AUTH_UNCHECKED`` (the host, which
    verifies nothing). ``heartbeat`` (a :class:`HeartbeatState`, which needs the
    verifier) turns on the allocation-free heartbeat path.
    """

    def __init__(
        self, max_frame=MAX_FRAME, max_line=_MAX_LINE, accept=None, verifier=None, heartbeat=None
    ):
        if heartbeat is not None and verifier is None:
            raise ValueError("a HeartbeatState needs a verifier")  # its values: signed only
        self.max_encoded = cobs.max_encoded_len(max_frame)
        self.max_line = max_line
        self.accept = accept
        self.verifier = verifier
        self.heartbeat = heartbeat
        # One buffer for both modes (a frame or a text line, never both at once): a
        # frame is COBS-decoded in place (cobs.decode_into), its bytes then the
        # buffer's first ``max_frame``. Sized to a frame; the first text line grows it
        # to a line's size (once: a peer that speaks JSON lines keeps speaking them).
        self._buf = bytearray(self.max_encoded + 1)
        self.max_frame = max_frame
        self._fn = None  # feed()'s sink while it runs
        self._n = 0
        self._state = _IDLE
        self._discard_text = False
        self._quiet = -1  # ms ticks of the first idle() since bytes came, -1: none yet
        self.frames = 0
        self.json_lines = 0
        self.bytes = 0
        self.errors = {}
        for k in _ERROR_KINDS:
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

    def feed(self, data, n=None, sink=None):
        """Decode ``data[:n]`` (all of it when ``n`` is None).

        Without ``sink``: returns the list of items. With ``sink`` (a callable) each
        item is passed to ``sink(item)`` as it is decoded and None is returned; this is
        the module's mode: no list, no slicing, and with a :class:`HeartbeatState` a
        signed heartbeat allocates nothing on MicroPython. Hand the same preallocated
        receive buffer every time, and a sink bound once (``self._on_item =
        self.on_item`` in ``__init__``: naming a bound method allocates it anew).
        """
        # Each item goes to ``(self._fn or out.append)(item)``: the sink (no list, and no
        # bound method made), else this list (also when a subclass's own feed hands a
        # list to _end_binary: host/modbridge/link/codec.py).
        out = [] if sink is None else None
        self._fn = sink
        self._quiet = -1
        end = len(data)
        if n is not None and n < end:
            end = n
        room = 0x3FFFFFFF - self.bytes  # wrap without ever holding 2**30 (a big int)
        self.bytes = end - room - 1 if end > room else self.bytes + end
        buf = self._buf
        i = 0
        has_find = hasattr(data, "find")
        while i < end:
            state = self._state
            if state == _BIN:
                # fast path: copy up to the next delimiter in one go
                if has_find:
                    stop = data.find(b"\x00", i, end)
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
                if sink is None:
                    buf[self._n : self._n + count] = data[i:stop]
                    self._n += count
                else:  # no slice: a slice allocates on MicroPython
                    k = self._n
                    while i < stop:
                        buf[k] = data[i]
                        k += 1
                        i += 1
                    self._n = k
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
                if first == _NL and b != _VERSION_MAJOR:
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
                if len(buf) <= self.max_line:
                    # grown to hold a text line (once), the first byte kept
                    big = bytearray(self.max_line + 1)
                    big[0] = first
                    self._buf = buf = big
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
                (self._fn or out.append)(M.BadFrame("noise", "text ended by 0x00", fmt=_FMT_JSON))
                continue
            if self._n >= self.max_line:
                self._overflow(out, True)
                continue
            buf[self._n] = b
            self._n += 1
        self._fn = None
        return out

    def idle(self, now):
        """The port was found empty at ``now`` (ms ticks, 0 .. 2**30 - 1).

        Once the line has been silent for ``GAP_MS`` (100 ms, counted from the first
        call since bytes were fed: nothing arrived in between, however busy the caller
        was), an incomplete binary run is dropped as ``framing`` (one that was already
        ``oversize`` is forgotten). A frame is sent in one burst, so this never cuts
        one; it is how a human at a terminal who typed control bytes (Ctrl-C twice)
        gets a listening decoder back. Text lines are never cut (a person types
        slowly), nor is a run of one byte (it may be a line's ``{``; a lone control
        byte before a line is trimmed off with the line's spaces). Allocates nothing.
        """
        q = self._quiet
        if q < 0:
            self._quiet = now
        elif (now - q) & _TICKS_MASK >= _GAP_MS:
            st = self._state
            if st == _BIN:
                self.errors["framing"] += 1
            elif st != _DISCARD or self._discard_text:
                return  # a text line (or one being discarded) ends at its LF only
            self.reset()

    def _overflow(self, out, text):
        self.errors["oversize"] += 1
        self._n = 0
        self._state = _DISCARD
        self._discard_text = text
        fmt = _FMT_JSON if text else _FMT_CBOR
        (self._fn or out.append)(M.BadFrame("oversize", "longer than the receive buffer", fmt=fmt))

    def _reject(self, out, err, fmt):
        kind = err.kind
        if kind not in self.errors:  # pragma: no cover - every decode error has a kind
            kind = "undecodable"
        self.errors[kind] += 1
        code = getattr(err, "code", None)
        if code is None:
            if kind == "version":
                code = _ERR_VERSION
            elif kind == "unknown_type":
                code = _ERR_UNKNOWN_TYPE
            else:
                code = _ERR_MALFORMED
        bad = M.BadFrame(
            kind,
            str(err),
            code,
            getattr(err, "type_id", 0),
            getattr(err, "seq", 0),
            getattr(err, "field", None),
            fmt,
        )
        auth = getattr(err, "auth", _AUTH_NONE)
        if auth != _AUTH_NONE:
            bad.auth = auth
            bad.link = err.link
        (self._fn or out.append)(bad)

    def _end_binary(self, out):
        n = self._n
        self._n = 0
        self._state = _IDLE
        try:
            raw = self._buf
            m = cobs.decode_into(raw, n, raw, self.max_frame)
            hb = self.heartbeat
            if hb is not None and hb.take(raw, m, self.verifier, self.accept):
                self.frames += 1
                return
            msg = decode_raw(raw, m, self.accept, self.verifier)
        except E.ProtocolError as e:
            self._reject(out, e, _FMT_CBOR)
            return
        except Exception as e:  # noqa: BLE001 - the read loop must survive anything
            self._reject(out, E.FrameError("decoder bug: %r" % (e,)), _FMT_CBOR)
            return
        self.frames += 1
        (self._fn or out.append)(msg)

    def _end_text(self, out):
        n = self._n
        self._n = 0
        self._state = _IDLE
        buf = self._buf
        s = 0
        while s < n and buf[s] <= 0x20:  # spaces and control bytes (a Ctrl-C typed first)
            s += 1
        e = n
        while e > s and buf[e - 1] <= 0x20:
            e -= 1
        if s == e:
            return
        if buf[s] != _LBRACE:
            # A UTF-8 byte order mark, spaces, then a ``{``: a JSON line an editor
            # marked, which the parser refuses as ``undecodable`` and the module answers
            # ``nack malformed`` (SPEC sections 7.4 and 8). Anything else is noise.
            b = s
            if e - s >= 4 and buf[s] == 0xEF and buf[s + 1] == 0xBB and buf[s + 2] == 0xBF:
                b = s + 3
                while b < e and buf[b] <= 0x20:
                    b += 1
            if b == s or b >= e or buf[b] != _LBRACE:
                self.errors["noise"] += 1
                (self._fn or out.append)(
                    M.BadFrame("noise", "text line that is not a JSON object", fmt=_FMT_JSON)
                )
                return
        try:
            from protocol import jsonl  # imported for the first line (kept): not at boot

            msg = jsonl.decode_line(bytes(buf[s:e]), self.accept, self.verifier)
        except E.ProtocolError as e:
            self._reject(out, e, _FMT_JSON)
            return
        except Exception as e:  # noqa: BLE001 - the read loop must survive anything
            self._reject(out, E.FrameError("decoder bug: %r" % (e,)), _FMT_JSON)
            return
        self.frames += 1
        self.json_lines += 1
        (self._fn or out.append)(msg)


# Pairs: name, value (see _HEADER_LEN).
_LAZY = const(
    (
        "HEADER_LEN",
        _HEADER_LEN,
        "CRC_LEN",
        _CRC_LEN,
        "MIN_FRAME",
        _MIN_FRAME,
        "MAX_LINE",
        _MAX_LINE,
        "MIN_SIGNED",
        _MIN_SIGNED,
        "ERROR_KINDS",
        _ERROR_KINDS,
    )
)


def __getattr__(name):
    """A name of ``_LAZY`` (``frame.HEADER_LEN``, ``from protocol.frame import
    MAX_LINE``); allocates nothing."""
    return __import__("protocol")._lazy(_LAZY, name)


if __import__("sys").implementation.name != "micropython":  # CPython: plain attributes
    __import__("protocol")._plain(globals(), _LAZY)
