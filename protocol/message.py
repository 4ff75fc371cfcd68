"""Decoded messages, rejected frames, and field validation against the catalog."""

from protocol import catalog as C
from protocol import cbor
from protocol import errors as E  # the classes by attribute, made on first use

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


# Constants of protocol.catalog and protocol.sign this module reads: copies, which the
# compiler folds (another module's names are dict lookups at run time, and imported
# ones slots in this module's dict on the MCU); tests/test_message_frame.py checks them.
_AUTH_NONE = const(0)
_M_NAME = const(1)
_M_FIELDS = const(3)
_F_KEY = const(0)
_F_NAME = const(1)
_F_KIND = const(2)
_F_REQUIRED = const(3)
_F_LO = const(4)
_F_HI = const(5)
_K_UINT = const("u")
_K_INT = const("i")
_K_STR = const("s")
_K_BYTES = const("b")
_K_BOOL = const("?")
_K_LIST = const("l")
_K_MAP = const("m")
_K_NUM = const("n")
_K_ENUM = const("e")
_ERR_MALFORMED = const(1)
_ERR_MISSING_FIELD = const(4)
_ERR_BAD_TYPE = const(5)
_ERR_OUT_OF_RANGE = const(6)
_ERR_INTERNAL = const(11)

FMT_CBOR = "cbor"
FMT_JSON = "json"


class Message:
    """One valid message. ``fields`` maps field names to wire values (fixed point ints).

    ``auth`` is the outcome of its signature check (``protocol.sign.AUTH_*``:
    ``AUTH_NONE`` when it was not signed) and ``link`` the signer's link id (-1 when
    unsigned). A message with a bad or replayed signature is still a Message: the
    application decides, and answers ``nack unauthorized`` with its seq and type.
    """

    ok = True

    def __init__(self, type_id, name, seq, fields, minor=0, fmt=FMT_CBOR, auth=_AUTH_NONE, link=-1):
        self.type = type_id
        self.name = name
        self.seq = seq
        self.fields = fields
        self.minor = minor
        self.fmt = fmt
        self.auth = auth
        self.link = link

    def get(self, name, default=None):
        return self.fields.get(name, default)


class BadFrame:
    """A frame or line that was rejected. ``kind`` is the counter it was added to.

    ``type`` and ``seq`` are filled in when the header could be read (so a NACK can
    reference the command), else they are 0. ``code`` is the NACK error code.
    ``auth``/``link`` are the signature check's outcome when the frame got that far
    (signatures are checked right after the version), else ``AUTH_NONE``/-1.
    """

    ok = False
    auth = _AUTH_NONE
    link = -1

    def __init__(
        self, kind, detail, code=_ERR_MALFORMED, type_id=0, seq=0, field=None, fmt=FMT_CBOR
    ):
        self.kind = kind
        self.detail = detail
        self.code = code
        self.type = type_id
        self.seq = seq
        self.field = field
        self.fmt = fmt


if __import__("sys").implementation.name != "micropython":
    # The host's conveniences (equality, readable reprs), which the firmware never
    # uses: on MicroPython they would be three functions and class-dict slots in the
    # heap from boot (issue 24).

    def _message_eq(self, other):
        return (
            isinstance(other, Message)
            and self.type == other.type
            and self.seq == other.seq
            and self.fields == other.fields
        )

    def _message_repr(self):
        return "Message(%s seq=%d %r)" % (self.name, self.seq, self.fields)

    def _bad_frame_repr(self):
        return "BadFrame(%s: %s)" % (self.kind, self.detail)

    Message.__eq__ = _message_eq
    Message.__hash__ = None  # as a class body defining __eq__ leaves it
    Message.__repr__ = _message_repr
    BadFrame.__repr__ = _bad_frame_repr
    del _message_eq, _message_repr, _bad_frame_repr


def lookup(type_or_name):
    """Message definition by type id or name; UnknownTypeError if neither."""
    if isinstance(type_or_name, str):
        m = C.by_name(type_or_name)
    else:
        m = C.by_type(type_or_name)
    if m is None:
        raise E.UnknownTypeError("unknown message type %r" % (type_or_name,))
    return m


def check_value(fdef, value):
    """Raise FieldError unless ``value`` fits field definition ``fdef``."""
    kind = fdef[_F_KIND]
    name = fdef[_F_NAME]
    lo = fdef[_F_LO]
    hi = fdef[_F_HI]
    size = None
    if kind == _K_UINT or kind == _K_INT or kind == _K_ENUM:
        if not isinstance(value, int) or isinstance(value, bool):
            raise E.FieldError("%s must be an integer" % name, _ERR_BAD_TYPE, name)
        if kind == _K_UINT and value < 0:
            raise E.FieldError("%s must not be negative" % name, _ERR_OUT_OF_RANGE, name)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise E.FieldError(
                "%s=%d outside %s..%s" % (name, value, lo, hi), _ERR_OUT_OF_RANGE, name
            )
        return
    if kind == _K_STR:
        if not isinstance(value, str):
            raise E.FieldError("%s must be text" % name, _ERR_BAD_TYPE, name)
        size = len(value)
    elif kind == _K_BYTES:
        if not isinstance(value, (bytes, bytearray)):
            raise E.FieldError("%s must be bytes" % name, _ERR_BAD_TYPE, name)
        size = len(value)
    elif kind == _K_BOOL:
        if not isinstance(value, bool):
            raise E.FieldError("%s must be true or false" % name, _ERR_BAD_TYPE, name)
        return
    elif kind == _K_LIST:
        if not isinstance(value, (list, tuple)):
            raise E.FieldError("%s must be a list" % name, _ERR_BAD_TYPE, name)
        size = len(value)
    elif kind == _K_MAP:
        if not isinstance(value, dict):
            raise E.FieldError("%s must be a map" % name, _ERR_BAD_TYPE, name)
        for k in value:
            if not isinstance(k, str):
                raise E.FieldError("%s keys must be text" % name, _ERR_BAD_TYPE, name)
        size = len(value)
    elif kind == _K_NUM:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise E.FieldError("%s must be a number" % name, _ERR_BAD_TYPE, name)
        if isinstance(value, float) and value - value != 0:  # inf - inf, nan: nan
            raise E.FieldError("%s must be finite" % name, _ERR_OUT_OF_RANGE, name)
        return
    else:  # pragma: no cover - catalog test guarantees known kinds
        raise E.FieldError("%s has unknown kind %r" % (name, kind), _ERR_INTERNAL, name)
    if (lo is not None and size < lo) or (hi is not None and size > hi):
        raise E.FieldError(
            "%s length %d outside %s..%s" % (name, size, lo, hi), _ERR_OUT_OF_RANGE, name
        )


def check_seq(seq):
    """Sequence numbers are u16; anything else is a caller bug, refused loudly."""
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= 0xFFFF:
        raise E.FieldError(
            "seq must be an integer 0..65535, got %r" % (seq,), _ERR_OUT_OF_RANGE, "seq"
        )


def check_required(mdef, fields):
    for fdef in mdef[_M_FIELDS]:
        if fdef[_F_REQUIRED] and fdef[_F_NAME] not in fields:
            name = fdef[_F_NAME]
            raise E.FieldError(
                "%s is required in %s" % (name, mdef[_M_NAME]), _ERR_MISSING_FIELD, name
            )


def encode_payload(mdef, fields):
    """CBOR map with integer keys, in key order; empty bytes when there are no fields.

    The payload of a binary frame, and what a signed JSON line's signature covers.
    """
    if not fields:
        return b""
    keyed = {}
    for fdef in mdef[_M_FIELDS]:
        name = fdef[_F_NAME]
        if name in fields:
            keyed[fdef[_F_KEY]] = fields[name]
    return cbor.dumps(keyed)


def fields_from_keys(mdef, raw):
    """Map a decoded CBOR map (int keys) to a validated dict by field name.

    Unknown keys (fields added by a newer minor version) are ignored.
    """
    out = {}
    for fdef in mdef[_M_FIELDS]:
        key = fdef[_F_KEY]
        if key in raw:
            value = raw[key]
            check_value(fdef, value)
            out[fdef[_F_NAME]] = value
    check_required(mdef, out)
    return out


def validate_fields(mdef, fields):
    """Validate a name -> value dict for sending; unknown names are an error here."""
    known = mdef[_M_FIELDS]
    for name in fields:
        i = C.field_index(mdef, name)
        if i < 0:
            raise E.FieldError("%s has no field %r" % (mdef[_M_NAME], name), _ERR_BAD_TYPE, name)
        check_value(known[i], fields[name])
    check_required(mdef, fields)
