"""JSON lines: the same messages as the binary frames, for a human on a terminal.

One message per line, a flat JSON object, compact, ASCII only::

    {"type":"telemetry","v":"1.0","seq":7,"state":"HOSTED","temp_gpu":72.3,"fan1_rpm":2850,"v_in":11.92}

``type``, ``v`` (protocol version "major.minor") and ``seq`` are the header, followed
in a signed line by ``link``, ``ts`` and ``sig`` (:func:`binary_equivalent`); every
other key is a field of the catalog. Values are in display units: fields with a
fixed-point scale (milli-degC, mV, mA, mW, duty) appear as decimal numbers in degC, V,
A, W and percent; enumerations appear as names. On input ``v`` and ``seq`` may be
omitted (a human typing a command), enumerations may be given as names or numbers.

The text is produced with integer arithmetic only (no float formatting), so both
interpreters emit the same bytes.
"""

from protocol import VERSION_MAJOR, VERSION_MINOR
from protocol import catalog as C
from protocol.telemetry import mul_div_round  # noqa: F401 - jsonl.mul_div_round too
from protocol.crc import crc16
from protocol.errors import (
    CBORDecodeError,
    CBOREncodeError,
    FieldError,
    UnknownTypeError,
    VersionError,
)
from protocol.message import (
    FMT_JSON,
    Message,
    check_required,
    check_seq,
    check_value,
    encode_payload,
    lookup,
)
from protocol.sign import (
    AUTH_NONE,
    AUTH_UNCHECKED,
    FLAG_SIGNED,
    SIG_LEN,
    TRAILER_LEN,
    TS_LEN,
    TS_MAX,
)


HEADER_KEYS = ("type", "v", "seq", "link", "ts", "sig")
SIGNATURE_KEYS = ("link", "ts", "sig")
_HEX = "0123456789abcdef"
# Powers of ten for a scale's decimals. From a list: a constant tuple's ints above
# 0x1FFF freeze as big ints (tests/test_frozen_ints.py).
_POW10 = tuple([1, 10, 100, 1000, 10000, 100000, 1000000])


def format_fixed(value, scale):
    """Render wire integer ``value`` in display units as JSON number text.

    >>> format_fixed(72300, (1, 1, 3)), format_fixed(32768, (100000, 65535, 3))
    ('72.3', '50.001')
    """
    mul, div, dec = scale
    neg = value < 0
    v = -value if neg else value
    if mul != div:
        v = mul_div_round(v, mul, div)
    p = _POW10[dec]
    ip = v // p
    fp = v - ip * p
    text = str(ip)
    if fp:
        digits = str(fp)
        digits = "0" * (dec - len(digits)) + digits
        while digits and digits[-1] == "0":
            digits = digits[:-1]
        text = text + "." + digits
    if neg and (ip or fp):
        text = "-" + text
    return text


def parse_fixed(value, scale, name):
    """Display-unit number -> wire integer (round half away from zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError("%s must be a number" % name, C.ERR_BAD_TYPE, name)
    if value != value or value in (_INF, -_INF):
        raise FieldError("%s must be finite" % name, C.ERR_OUT_OF_RANGE, name)
    mul, div, dec = scale
    try:
        x = value * _POW10[dec] * div / mul
    except OverflowError:  # an int too big for a float (CPython; MicroPython gives inf)
        raise FieldError("%s is far out of range" % name, C.ERR_OUT_OF_RANGE, name) from None
    if x > 1e12 or x < -1e12:
        raise FieldError("%s is far out of range" % name, C.ERR_OUT_OF_RANGE, name)
    return int(x + 0.5) if x >= 0 else -int(-x + 0.5)


_INF = float("inf")


_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _escape(s):
    """JSON string literal, ASCII only; the same text as CPython's json.dumps."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif o < 0x10000:
            out.append("\\u%04x" % o)
        else:
            o -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 | (o >> 10), 0xDC00 | (o & 0x3FF)))
    out.append('"')
    return "".join(out)


def dump_value(v):
    """Deterministic compact JSON for plain values (dict keys sorted)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (_INF, -_INF):
            raise ValueError("JSON has no NaN or infinity")
        return repr(v)
    if isinstance(v, str):
        return _escape(v)
    if isinstance(v, (bytes, bytearray)):
        return _escape(bytes(v).hex())
    if isinstance(v, (list, tuple)):
        return "[" + ",".join([dump_value(x) for x in v]) + "]"
    if isinstance(v, dict):
        keys = sorted(v)
        return "{" + ",".join([_escape(str(k)) + ":" + dump_value(v[k]) for k in keys]) + "}"
    raise ValueError("cannot express %s in JSON" % type(v).__name__)


def field_to_json(fdef, value):
    """JSON text of one field value in display units."""
    scale = fdef[C.F_SCALE]
    if fdef[C.F_KIND] == C.K_ENUM:
        if 0 <= value < len(scale):
            return _escape(scale[value])
        return str(value)
    if scale is not None:
        return format_fixed(value, scale)
    return dump_value(value)


def field_from_json(fdef, value):
    """Display-unit JSON value -> wire value for one field."""
    name = fdef[C.F_NAME]
    scale = fdef[C.F_SCALE]
    kind = fdef[C.F_KIND]
    if kind == C.K_ENUM:
        if isinstance(value, str):
            i = 0
            while i < len(scale):
                if scale[i] == value or scale[i].lower() == value.lower():
                    return i
                i += 1
            raise FieldError("%s: unknown name %r" % (name, value), C.ERR_OUT_OF_RANGE, name)
        return value
    if scale is not None:
        return parse_fixed(value, scale, name)
    if kind == C.K_BYTES and isinstance(value, str):
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise FieldError("%s must be hex" % name, C.ERR_BAD_TYPE, name) from None
    return value


def binary_equivalent(mdef, seq, minor, fields):
    """The unstuffed signed frame, header through CRC, that a JSON line stands for.

    A signed line's signature is the one its binary twin would carry: over
    ``nonce || major, minor | FLAG_SIGNED, type, seq BE, canonical CBOR payload of the
    wire values (exactly :func:`protocol.message.encode_payload`), CRC, link, ts BE``.
    So a line and a frame with the same fields verify with the same Verifier.
    Raises CBORDecodeError when the values have no CBOR form (nesting deeper than 8).
    """
    try:
        payload = encode_payload(mdef, fields)
    except CBOREncodeError as e:
        raise CBORDecodeError("no binary equivalent to sign: %s" % (e,)) from None
    n = 5 + len(payload)
    raw = bytearray(n + 2)
    raw[0] = VERSION_MAJOR
    raw[1] = minor | FLAG_SIGNED
    raw[2] = mdef[C.M_TYPE]
    raw[3] = seq >> 8
    raw[4] = seq & 0xFF
    raw[5:n] = payload
    crc = crc16(raw, 0, n)
    raw[n] = crc >> 8
    raw[n + 1] = crc & 0xFF
    return raw


def encode_line(type_or_name, fields=None, seq=0, minor=VERSION_MINOR, signer=None):
    """One message as a JSON line (bytes, ending in a newline).

    With ``signer`` (a :class:`protocol.sign.Signer` holding the module's nonce) the
    line carries ``link``, ``ts`` and ``sig`` after ``seq``.
    """
    mdef = lookup(type_or_name)
    fields = fields or {}
    check_seq(seq)
    for name in fields:
        i = C.field_index(mdef, name)
        if i < 0:
            raise FieldError("%s has no field %r" % (mdef[C.M_NAME], name), C.ERR_BAD_TYPE, name)
        check_value(mdef[C.M_FIELDS][i], fields[name])
    check_required(mdef, fields)
    parts = [
        '{"type":',
        _escape(mdef[C.M_NAME]),
        ',"v":"%d.%d","seq":%d' % (VERSION_MAJOR, minor, seq),
    ]
    if signer is not None:
        if not 0 <= minor <= 0x7F:
            raise FieldError(
                "minor %d does not fit beside the signed flag" % minor, C.ERR_OUT_OF_RANGE, "v"
            )
        t = signer.trailer(bytes(binary_equivalent(mdef, seq, minor, fields)))
        ts = 0
        i = 1
        while i <= TS_LEN:
            ts = (ts << 8) | t[i]
            i += 1
        parts.append(
            ',"link":%d,"ts":%d,"sig":"%s"' % (t[0], ts, _hexstr(t, 1 + TS_LEN, TRAILER_LEN))
        )
    for fdef in mdef[C.M_FIELDS]:
        name = fdef[C.F_NAME]
        if name in fields:
            parts.append(',"%s":%s' % (name, field_to_json(fdef, fields[name])))
    parts.append("}\n")
    return "".join(parts).encode()


def _hexstr(b, start, end):
    out = []
    i = start
    while i < end:
        out.append("%02x" % b[i])
        i += 1
    return "".join(out)


def _int_key(obj, key, hi):
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise FieldError("%s must be an integer" % key, C.ERR_BAD_TYPE, key)
    if not 0 <= v <= hi:
        raise FieldError("%s must be 0..%d" % (key, hi), C.ERR_OUT_OF_RANGE, key)
    return v


def _signature(obj):
    """(link, ts, sig bytes) of a line with signature keys, else None; FieldError
    (invalid) names the key that is missing or malformed."""
    have = 0
    for key in SIGNATURE_KEYS:
        if key in obj:
            have += 1
    if not have:
        return None
    for key in SIGNATURE_KEYS:
        if key not in obj:
            raise FieldError(
                "a signed line needs link, ts and sig: %s is missing" % key,
                C.ERR_MISSING_FIELD,
                key,
            )
    link = _int_key(obj, "link", 0xFF)
    ts = _int_key(obj, "ts", TS_MAX)
    sig = obj["sig"]
    if not isinstance(sig, str) or len(sig) != 2 * SIG_LEN:
        raise FieldError(
            "sig must be %d lowercase hex digits" % (2 * SIG_LEN), C.ERR_BAD_TYPE, "sig"
        )
    raw = bytearray(SIG_LEN)
    i = 0
    while i < SIG_LEN:
        hi = _HEX.find(sig[2 * i])
        lo = _HEX.find(sig[2 * i + 1])
        if hi < 0 or lo < 0:
            raise FieldError(
                "sig must be %d lowercase hex digits" % (2 * SIG_LEN), C.ERR_BAD_TYPE, "sig"
            )
        raw[i] = (hi << 4) | lo
        i += 1
    return link, ts, raw


def _parse_version(v):
    if isinstance(v, str):
        head = v.split(".")
        try:
            major = int(head[0])
            minor = int(head[1]) if len(head) > 1 else 0
        except ValueError:
            raise FieldError('v must look like "1.0"', C.ERR_BAD_TYPE, "v") from None
        return major, minor
    if isinstance(v, int) and not isinstance(v, bool):
        return v, 0
    raise FieldError('v must look like "1.0"', C.ERR_BAD_TYPE, "v")


def decode_line(line, accept=None, verifier=None):
    """Decode one JSON line (bytes or str, without the newline) into a Message.

    A line with ``link``/``ts``/``sig`` is signed: with ``verifier`` its signature is
    checked over :func:`binary_equivalent` once the fields are validated (``auth`` of
    the Message, an ``AUTH_*``); without one it is ``AUTH_UNCHECKED``.
    """
    # imported here, not with this module: the firmware receives frames, and a line
    # rarely (device.app forgets the parser again after each command)
    from protocol import jsonparse

    try:
        obj = jsonparse.loads(line)  # strict: depth 8, no duplicate keys (SPEC 7.4)
    except jsonparse.JSONError as e:
        raise CBORDecodeError("not valid JSON: %s" % (e,)) from None
    if not isinstance(obj, dict):
        raise CBORDecodeError("a JSON line must be an object")
    t = obj.get("type")
    if isinstance(t, str) or (isinstance(t, int) and not isinstance(t, bool)):
        mdef = C.by_name(t) if isinstance(t, str) else C.by_type(t)
    else:
        raise FieldError("type is required (a message name)", C.ERR_MISSING_FIELD, "type")
    seq = obj.get("seq", 0)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= 0xFFFF:
        raise FieldError("seq must be an integer 0..65535", C.ERR_BAD_TYPE, "seq")
    major, minor = VERSION_MAJOR, VERSION_MINOR
    if "v" in obj:
        major, minor = _parse_version(obj["v"])
    if major != VERSION_MAJOR:
        err = VersionError(
            "peer speaks protocol %d.%d, this side speaks %d.x" % (major, minor, VERSION_MAJOR),
            major,
            minor,
        )
        err.seq = seq
        raise err
    if mdef is None:
        err = UnknownTypeError("unknown message type %r" % (t,))
        err.seq = seq
        raise err
    auth = AUTH_NONE
    link = -1
    try:
        if accept is not None and mdef[C.M_DIR] != accept:
            raise FieldError(
                "%s is not accepted in this direction" % mdef[C.M_NAME], C.ERR_DIRECTION
            )
        signature = _signature(obj)
        if signature is not None and not 0 <= minor <= 0x7F:
            raise FieldError(
                "a signed line's minor version must be 0..127", C.ERR_OUT_OF_RANGE, "v"
            )
        fields = {}
        for fdef in mdef[C.M_FIELDS]:
            name = fdef[C.F_NAME]
            if name in obj:
                value = field_from_json(fdef, obj[name])
                check_value(fdef, value)
                fields[name] = value
        check_required(mdef, fields)
        if signature is not None:
            link = signature[0]
            if verifier is None:
                auth = AUTH_UNCHECKED
            else:
                raw = binary_equivalent(mdef, seq, minor, fields)
                raw.append(link)
                ts = signature[1]
                i = TS_LEN - 1
                while i >= 0:
                    raw.append((ts >> (8 * i)) & 0xFF)
                    i -= 1
                raw.extend(signature[2])
                auth = verifier.verify(raw, len(raw))
    except (FieldError, CBORDecodeError) as e:
        e.type_id = mdef[C.M_TYPE]
        e.seq = seq
        raise
    return Message(mdef[C.M_TYPE], mdef[C.M_NAME], seq, fields, minor, FMT_JSON, auth, link)
