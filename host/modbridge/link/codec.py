"""The host's codec. Module -> host: the reference
:class:`~protocol.frame.StreamDecoder` with a CPython fast path for good binary
frames, and boot banners as items of their own. Host -> module: :func:`encode_fast`,
:func:`protocol.frame.encode_frame`'s bytes for the messages of integer fields the
bridge sends every second (heartbeats), without the reference's byte loops.

The frames of every second (a module's telemetry in, its heartbeat out) are maps of
small integer keys to integers, coded here by hand in one pass (:func:`_int_map`,
:func:`_int_map_bytes`) rather than through ``cbor2``: as fast when warm, and
cheaper where it counts, in an I/O thread that wakes once per frame with cold
caches (docs/bridge-benchmarks.md). Everything else takes ``cbor2`` (C), and
whatever that does not accept outright the reference decoder, which decides."""

from __future__ import annotations

import binascii

import cbor2

from protocol import VERSION_MAJOR, VERSION_MINOR
from protocol import catalog as C
from protocol.errors import ProtocolError
from protocol.frame import (
    HEADER_LEN,
    MAX_FRAME,
    MIN_FRAME,
    StreamDecoder,
    _is_space,
    encode_frame,
)
from protocol.message import FMT_CBOR, Message, fields_from_keys, lookup
from protocol.sign import FLAG_SIGNED, TRAILER_LEN

BANNER_PREFIX = b"MODULER READY v"


def _cobs_decode(enc: bytes) -> bytes | None:
    """Canonical COBS decode block by block (slices, not bytes); None if malformed."""
    out = bytearray()
    i = 0
    n = len(enc)
    while i < n:
        code = enc[i]
        j = i + code
        if code == 0 or j > n:
            return None
        out += enc[i + 1 : j]
        i = j
        if code < 0xFF and i < n:
            out.append(0)
    return bytes(out)


_INT_MIN = -(1 << 64)
_INT_MAX = (1 << 64) - 1
_MAX_DEPTH = 8


def _plain(value, depth: int) -> bool:
    """True if ``value`` holds only what the project's CBOR subset can carry."""
    t = type(value)
    if t is int:
        return _INT_MIN <= value <= _INT_MAX
    if t is str or t is bytes or t is bool or t is float:
        return True
    if depth >= _MAX_DEPTH:
        return False
    if t is list:
        return all(_plain(v, depth + 1) for v in value)
    if t is dict:
        for k, v in value.items():
            if type(k) not in (int, str, bytes) or not _plain(k, depth + 1):
                return False
            if not _plain(v, depth + 1):
                return False
        return True
    return False  # None, tags, datetimes, sets, ...: the reference decoder decides


_IDLE = 0  # StreamDecoder's state with nothing buffered
_NL = 0x0A


def _whole_frames(data: bytes, max_encoded: int) -> list[bytes] | None:
    """The binary frames of ``data`` if it is only whole ones (each ended by its
    0x00; runs of 0x00 between them), every one a frame to the reference state
    machine too: its second byte a control byte, not whitespace (the first byte
    of a frame's content is the major version), not a blank line's LF before it, and
    not longer than the receive buffer. None for anything else."""
    if not data or data[-1] != 0:
        return None
    frames = []
    for enc in data.split(b"\x00")[:-1]:
        if not enc:
            continue
        if len(enc) < 2 or len(enc) > max_encoded:
            return None
        b = enc[1]
        if b >= 0x20 or _is_space(b) or (enc[0] == _NL and b != VERSION_MAJOR):
            return None
        frames.append(enc)
    return frames


class Banner:
    """A boot banner line (``MODULER READY v<fw>``) seen on the stream."""

    ok = False
    kind = "banner"

    def __init__(self, fw_version: str):
        self.fw_version = fw_version


class HostDecoder(StreamDecoder):
    """:class:`~protocol.frame.StreamDecoder` for module -> host traffic, CPython fast.

    A binary frame is first tried on a fast path (slice-wise COBS,
    ``binascii.crc_hqx`` for the CRC-16/IBM-3740, then the payload: an integer map
    decoded and checked in one pass by :func:`_int_map`, or else ``cbor2``, accepted
    only when the payload is canonical and every value is of a subset type, then the
    catalog's checks). Anything the fast path
    does not accept outright goes to the reference decoder, which decides and counts;
    so results are identical, only cheaper for good frames. Also records the peer's
    version when a frame of another major version arrives (``peer_version``) and
    yields a :class:`Banner` item (before the ``noise`` it is counted as) for a boot
    banner line.
    """

    def __init__(self):
        super().__init__(max_frame=MAX_FRAME, accept=C.D2H)
        self._frame_max = MAX_FRAME  # the reference's frame buffer (whatever it names it)
        self.peer_version: tuple[int, int] | None = None
        self.fast_frames = 0

    def feed(self, data, n=None, sink=None):
        """:meth:`StreamDecoder.feed`; a chunk that is nothing but whole binary frames
        (what a read of the port returns almost every time) is cut at its delimiters
        and each frame decoded at once, without the byte-wise state machine. Anything
        else (text, a frame cut by the read, a sink) goes the reference way."""
        if sink is None and n is None and self._state == _IDLE and type(data) is bytes:
            frames = _whole_frames(data, self.max_encoded)
            if frames is not None:
                end = len(data)
                room = 0x3FFFFFFF - self.bytes  # as the reference counts (no big int)
                self.bytes = end - room - 1 if end > room else self.bytes + end
                out = []
                for enc in frames:
                    self._binary(out, enc, False)
                return out
        return super().feed(data, n, sink)

    def _end_binary(self, out):
        self._binary(out, bytes(self._buf[: self._n]), True)

    def _binary(self, out, enc: bytes, buffered: bool) -> None:
        """One binary frame ``enc`` (COBS, no delimiter); ``buffered``: it is also in
        the receive buffer, where the reference path reads it."""
        raw = _cobs_decode(enc)
        if raw is not None and MIN_FRAME <= len(raw) <= self._frame_max:
            n = len(raw)
            if binascii.crc_hqx(raw[: n - 2], 0xFFFF) == (raw[n - 2] << 8) | raw[n - 1]:
                if raw[0] != VERSION_MAJOR:
                    self.peer_version = (raw[0], raw[1])
                elif not raw[1] & FLAG_SIGNED:  # a signed frame: the reference path checks it
                    msg = _fast_message(raw)
                    if msg is not None:
                        self._n = 0
                        self._state = _IDLE
                        self.frames += 1
                        self.fast_frames += 1
                        out.append(msg)
                        return
        if not buffered:
            self._buf[: len(enc)] = enc
            self._n = len(enc)
        super()._end_binary(out)

    def _end_text(self, out):
        line = bytes(self._buf[: self._n]).strip()
        if line.startswith(BANNER_PREFIX):
            fw = line[len(BANNER_PREFIX) :].decode("ascii", "replace")
            out.append(Banner(fw))
        super()._end_text(out)


_INT_KINDS = (C.K_UINT, C.K_INT, C.K_ENUM)
_fast_specs: dict = {}


def _fast_spec(mdef):
    """key -> (name, kind, lo, hi) of a message's fields, and its required names."""
    spec = _fast_specs.get(mdef[C.M_TYPE])
    if spec is None:
        by_key = {
            f[C.F_KEY]: (f[C.F_NAME], f[C.F_KIND], f[C.F_LO], f[C.F_HI]) for f in mdef[C.M_FIELDS]
        }
        required = frozenset(f[C.F_NAME] for f in mdef[C.M_FIELDS] if f[C.F_REQUIRED])
        spec = _fast_specs[mdef[C.M_TYPE]] = (by_key, required)
    return spec


def _head_len(a: int) -> int:
    """Bytes of a canonical CBOR head with argument ``a`` (>= 0, < 2**64)."""
    if a < 24:
        return 1
    if a < 0x100:
        return 2
    if a < 0x10000:
        return 3
    return 5 if a < 0x100000000 else 9


def _fast_fields(mdef, keyed: dict, size: int = -1) -> dict | None:
    """The catalog check of ``fields_from_keys`` for the common cases (integer, bool
    and text fields, integer keys); None for anything else, which then goes the
    reference way. A differential test keeps the two in agreement.

    ``size`` (>= 0): the byte length of the payload ``keyed`` was decoded from, which
    must be that of ``keyed``'s canonical encoding in this order (else None). For
    these types that is the check that the payload is canonical (what the reference
    accepts): every other encoding of the same map (longer heads, indefinite
    lengths, tags such as bignums, a duplicate key that the dict lost, bytes after
    the map) is longer, and nothing shorter decodes to it."""
    by_key, required = _fast_spec(mdef)
    out = {}
    prev = -1
    n = _head_len(len(keyed))  # the map's head
    for k, v in keyed.items():
        if type(k) is not int or k <= prev:  # ascending keys: same field order as the catalog
            return None
        prev = k
        n += 1 if k < 24 else _head_len(k)
        tv = type(v)
        if tv is int:
            if not _INT_MIN <= v <= _INT_MAX:
                return None
            n += _head_len(v if v >= 0 else -1 - v)
        elif tv is bool:
            n += 1
        elif tv is str:
            b = len(v.encode("utf-8")) if not v.isascii() else len(v)
            n += _head_len(b) + b
        f = by_key.get(k)
        if f is None:  # a newer minor's field: ignored, if it is a plain int
            if tv is int:
                continue
            return None
        name, kind, lo, hi = f
        if tv is int:
            if kind not in _INT_KINDS:
                return None
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                return None
            if kind == C.K_UINT and v < 0:
                return None
        elif tv is bool:
            if kind != C.K_BOOL:
                return None
        elif tv is str:
            if (
                kind != C.K_STR
                or (lo is not None and len(v) < lo)
                or (hi is not None and len(v) > hi)
            ):
                return None
        else:
            return None
        out[name] = v
    if size >= 0 and n != size:
        return None
    if not required.issubset(out):
        return None
    return out


_U32 = 1 << 32


def _int_map(mdef, p: bytes) -> dict | None:
    """``p`` decoded and checked as ``mdef``'s fields in one pass, for the payload a
    module sends every second (telemetry): a canonical CBOR map of small integer keys
    in ascending order to integers (the heads' shortest forms, nothing after the map).
    The catalog's checks are :func:`_fast_fields`' (kinds, ranges, required fields; a
    newer minor's unknown integer field is skipped). None for anything else, which then
    goes through ``cbor2`` and :func:`_fast_fields` (and the reference decoder)."""
    by_key, required = _fast_spec(mdef)
    b = p[0]
    if b < 0xA0 or b > 0xB7:  # a map of 0..23 entries, its length in the head
        return None
    out = {}
    prev = -1
    i = 1
    try:
        for _ in range(b - 0xA0):
            k = p[i]
            if k < 24:
                i += 1
            elif k == 24 and p[i + 1] >= 24:
                k = p[i + 1]
                i += 2
            else:
                return None
            if k <= prev:
                return None
            prev = k
            b = p[i]
            ai = b & 31
            if b >= 0x40:  # neither an unsigned nor a negative integer
                return None
            if ai < 24:
                v = ai
                i += 1
            elif ai == 24:
                v = p[i + 1]
                i += 2
                if v < 24:
                    return None
            elif ai == 25:
                v = (p[i + 1] << 8) | p[i + 2]
                i += 3
                if v < 0x100:
                    return None
            elif ai == 26:
                v = int.from_bytes(p[i + 1 : i + 5], "big")
                i += 5
                if v < 0x10000:
                    return None
            elif ai == 27:
                v = int.from_bytes(p[i + 1 : i + 9], "big")
                i += 9
                if v < _U32:
                    return None
            else:
                return None
            if b >= 0x20:
                v = -1 - v
            f = by_key.get(k)
            if f is None:  # a newer minor's field: ignored (it is a plain int)
                continue
            name, kind, lo, hi = f
            if (
                kind not in _INT_KINDS
                or (lo is not None and v < lo)
                or (hi is not None and v > hi)
                or (kind == C.K_UINT and v < 0)
            ):
                return None
            out[name] = v
    except IndexError:  # cut short: the reference decides
        return None
    if i != len(p) or not required.issubset(out):
        return None
    return out


def _cbor_fields(mdef, payload: bytes) -> dict | None:
    """``payload`` as ``mdef``'s fields through ``cbor2`` (what :func:`_int_map` does
    not take: text and bool fields, larger keys, an empty payload); None if the
    reference decoder is to decide."""
    if payload:
        try:
            keyed = cbor2.loads(payload)
        except Exception:  # noqa: BLE001 - anything odd: the reference decoder decides
            return None
        if type(keyed) is not dict:
            return None
        # the common case checks that the payload is canonical by its length (no
        # re-encoding: see _fast_fields); anything else by cbor2's re-encoding
        fields = _fast_fields(mdef, keyed, len(payload))
        if fields is None:
            try:
                if cbor2.dumps(keyed) != payload:
                    return None
            except Exception:  # noqa: BLE001 - the reference decoder decides
                return None
    else:
        keyed = {}
        fields = _fast_fields(mdef, keyed)
    if fields is None:
        if not _plain(keyed, 0):
            return None
        try:
            fields = fields_from_keys(mdef, keyed)
        except ProtocolError:
            return None
    return fields


def _fast_message(raw: bytes) -> Message | None:
    mdef = C.by_type(raw[2])
    if mdef is None or mdef[C.M_DIR] != C.D2H:
        return None
    payload = raw[5:-2]
    fields = _int_map(mdef, payload) if payload else None
    if fields is None:
        fields = _cbor_fields(mdef, payload)
        if fields is None:
            return None
    seq = (raw[3] << 8) | raw[4]
    return Message(raw[2], mdef[C.M_NAME], seq, fields, raw[1], FMT_CBOR)


# ----------------------------------------------------------------------------- encoding

_enc_specs: dict = {}
_COBS_BLOCK = 254  # non-zero bytes a COBS code byte can cover


def _enc_spec(mdef):
    """The fields of ``mdef`` in catalog order as (name, key, kind, lo, hi), and its
    required names; None if a field is not an integer one (not for the fast path)."""
    spec = _enc_specs.get(mdef[C.M_TYPE], False)
    if spec is False:
        order = tuple(
            (f[C.F_NAME], f[C.F_KEY], f[C.F_KIND], f[C.F_LO], f[C.F_HI]) for f in mdef[C.M_FIELDS]
        )
        required = frozenset(f[C.F_NAME] for f in mdef[C.M_FIELDS] if f[C.F_REQUIRED])
        spec = (order, required) if all(f[2] in _INT_KINDS for f in order) else None
        _enc_specs[mdef[C.M_TYPE]] = spec
    return spec


def fast_keyed(mdef, fields: dict) -> dict | None:
    """``fields`` as the CBOR map the reference encodes (integer keys, catalog order)
    if every one is an integer the catalog accepts (``check_value``'s rules) and the
    required ones are there; None otherwise (the reference decides, and says why)."""
    spec = _enc_spec(mdef)
    if spec is None:
        return None
    order, required = spec
    keyed = {}
    for name, key, kind, lo, hi in order:
        if name in fields:
            v = fields[name]
            if type(v) is not int or not _INT_MIN <= v <= _INT_MAX:
                return None
            if (
                (kind == C.K_UINT and v < 0)
                or (lo is not None and v < lo)
                or (hi is not None and v > hi)
            ):
                return None
            keyed[key] = v
    if len(keyed) != len(fields) or not required.issubset(fields):
        return None  # a name the catalog does not know, or a required one missing
    return keyed


def _int_map_bytes(keyed: dict) -> bytes:
    """``cbor2.dumps(keyed)`` (canonical: the shortest heads) for what
    :func:`fast_keyed` gives: a map of at most 23 small integer keys (< 24) to
    integers within CBOR's 64 bits. Python's own int methods, not a call into cbor2,
    for a few fields every second."""
    out = bytearray((0xA0 + len(keyed),))
    for k, v in keyed.items():
        out.append(k)
        major = 0
        if v < 0:
            major, v = 0x20, -1 - v
        if v < 24:
            out.append(major | v)
        elif v < 0x100:
            out += bytes((major | 24, v))
        elif v < 0x10000:
            out += bytes((major | 25, v >> 8, v & 0xFF))
        elif v < _U32:
            out.append(major | 26)
            out += v.to_bytes(4, "big")
        else:
            out.append(major | 27)
            out += v.to_bytes(8, "big")
    return bytes(out)


def _cobs_encode(raw: bytes) -> bytes:
    """Canonical COBS (as :func:`protocol.cobs.encode_into`) of ``raw`` shorter than
    one block: one code byte per run of non-zero bytes."""
    out = bytearray()
    for run in raw.split(b"\x00"):
        out.append(len(run) + 1)
        out += run
    return bytes(out)


def encode_fast(type_or_name, fields: dict | None, seq: int, signer=None,
                keyed: dict | None = None) -> bytes:  # fmt: skip
    """:func:`protocol.frame.encode_frame` (this protocol version; signed with
    ``signer``), the same bytes, quicker for a message of integer fields that fits
    one COBS block; anything else (and every error) is the reference's. ``keyed``:
    :func:`fast_keyed` of ``fields``, when the caller has it already."""
    mdef = lookup(type_or_name)
    if keyed is None:
        keyed = fast_keyed(mdef, fields or {})
    if keyed is None or type(seq) is not int or not 0 <= seq <= 0xFFFF:
        return encode_frame(type_or_name, fields, seq, signer=signer)
    if not keyed:
        payload = b""
    elif len(keyed) < 24 and max(keyed) < 24:
        payload = _int_map_bytes(keyed)
    else:
        payload = cbor2.dumps(keyed)
    n = HEADER_LEN + len(payload) + 2 + (TRAILER_LEN if signer is not None else 0)
    if n >= _COBS_BLOCK or n > MAX_FRAME:
        return encode_frame(type_or_name, fields, seq, signer=signer)
    minor = VERSION_MINOR if signer is None else VERSION_MINOR | FLAG_SIGNED
    body = bytes((VERSION_MAJOR, minor, mdef[C.M_TYPE], seq >> 8, seq & 0xFF)) + payload
    body += binascii.crc_hqx(body, 0xFFFF).to_bytes(2, "big")
    if signer is not None:
        body += signer.trailer(body)  # raises SigningError without a nonce, as the reference
    return _cobs_encode(body) + b"\x00"
