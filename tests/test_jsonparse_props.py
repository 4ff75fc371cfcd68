"""Property tests (CPython only) for protocol.jsonparse.

- every JSON value within the parser's limits survives ``json.dumps`` -> ``loads``;
- on arbitrary bytes ``loads`` raises nothing but JSONError;
- it agrees with CPython's ``json.loads`` wherever that accepts and the extra rules
  (no duplicate keys, depth <= 8, integers in 64 bits, magnitudes below 1e38, no
  lone surrogates, strict UTF-8, length) hold, and refuses everything else;
- its depth limit means what the CBOR decoder's does.
"""

import json
import math
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import cbor, jsonparse
from protocol.errors import CBORDecodeError
from protocol.jsonparse import JSONError, loads

SETTINGS = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
REFUSED = object()


# --------------------------------------------------------------------------- helpers


def depth(v, level=0):
    """The level of the deepest item, counted like the CBOR decoder (top = 0)."""
    if isinstance(v, list):
        return max([depth(x, level + 1) for x in v], default=level)
    if isinstance(v, dict):  # keys are items of the level below too, like values
        return max([depth(x, level + 1) for x in v.values()], default=level)
    return level


def same(a, b):
    """Type-strict equality, -0.0 != 0.0, and dict key order must match."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def has_surrogate(v):
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, list):
        return any(has_surrogate(x) for x in v)
    if isinstance(v, dict):
        return any(has_surrogate(k) or has_surrogate(x) for k, x in v.items())
    return False


class _Refuse(Exception):
    pass


def _pairs(items):
    keys = [k for k, _ in items]
    if len(set(keys)) != len(keys):
        raise _Refuse("duplicate key")
    return dict(items)


def _int(text):
    v = int(text)
    if not INT_MIN <= v <= INT_MAX:
        raise _Refuse("int range")
    return v


def too_large(text):
    """|number| >= 1e38, exactly, for any exponent (Decimal alone overflows)."""
    mant, _, exp = text.lower().partition("e")
    d = Decimal(mant)
    return d != 0 and d.adjusted() + int(exp or "0") >= jsonparse.FLOAT_MAX_EXP10


def _float(text):
    if too_large(text):
        raise _Refuse("float range")
    return float(text)


def _constant(text):
    raise _Refuse(text)


def oracle(data, max_depth=8, max_len=1024):
    """What jsonparse.loads must return for ``data``: CPython's json plus the rules."""
    if len(data) > max_len:
        return REFUSED
    try:
        text = data.decode("utf-8")  # strict: no overlong, surrogate or > U+10FFFF
        v = json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_int=_int,
            parse_float=_float,
            parse_constant=_constant,
        )
    except (_Refuse, ValueError, RecursionError):
        return REFUSED
    if depth(v) > max_depth or has_surrogate(v):
        return REFUSED
    return v


def mine(data, **kw):
    try:
        return loads(data, **kw)
    except JSONError as e:
        assert 0 <= e.offset <= max(len(data), kw.get("max_len", 1024)), (e.offset, data)
        assert str(e).endswith(f"(at byte {e.offset})")
        return REFUSED


# --------------------------------------------------------------------------- strategies

keys = st.text(max_size=6)
finite = st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: abs(f) < 1e38)
scalars = st.none() | st.booleans() | st.integers(INT_MIN, INT_MAX) | finite | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)

# fmt: off
TOKENS = [
    b"{", b"}", b"[", b"]", b",", b":", b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c",
    b'"a"', b'"b"', b'"a":', b'"\\u00e9"', b'"\\ud800"', b'"\\udc00"', b'"\\ud83d\\ude00"',
    b'"\\n"', b'"\\x"', b'"\x01"', b'"\x7f"', b'"\xc3\xa9"', b'"\xc0\x80"', b'"\xed\xa0\x80"',
    b'"\xf4\x90\x80\x80"', b'"\xe2\x82"', b"\xc3\xa9", b"\xff", b'"', b"\\",
    b"0", b"-0", b"1", b"12", b"01", b"-", b"+1", b".5", b"1.", b"1.5", b"1e5", b"1E-5",
    b"1e38", b"9.99e37", b"-1e38", b"1e-400", b"1e400", b"0.1e39", b"0e999999999999",
    b"9223372036854775807", b"9223372036854775808", b"-9223372036854775808",
    b"99999999999999999999", b"true", b"false", b"null", b"tru", b"nulls", b"NaN",
    b"Infinity", b"-Infinity", b"\xef\xbb\xbf", b"/**/",
]
# fmt: on
token_soup = st.lists(st.sampled_from(TOKENS), max_size=30).map(b"".join)


@st.composite
def mutated_json(draw):
    """A valid JSON text with one to three byte-level edits."""
    data = bytearray(json.dumps(draw(values), ensure_ascii=draw(st.booleans())).encode())
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("insert", "delete", "replace")))
        i = draw(st.integers(0, len(data)))
        if op == "insert":
            data[i:i] = draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=2))
        elif data and i < len(data):
            if op == "delete":
                del data[i]
            else:
                data[i] = draw(st.integers(0, 255))
    return bytes(data)


valid_json = values.map(lambda v: json.dumps(v, ensure_ascii=False).encode())


def _dumps_variants(v):
    yield json.dumps(v)
    yield json.dumps(v, ensure_ascii=False)
    yield json.dumps(v, indent=2)
    yield json.dumps(v, separators=(",", ":"))


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(values)
def test_round_trip_of_values_within_the_limits(v):
    for text in _dumps_variants(v):
        data = text.encode()
        if depth(v) <= 8:
            got = loads(data, max_len=len(data))
            assert same(got, v), (text, got)
            assert same(loads(text, max_len=len(data)), v)
        else:
            assert mine(data, max_len=len(data)) is REFUSED


@SETTINGS
@given(st.binary(max_size=300) | token_soup | mutated_json() | valid_json)
def test_arbitrary_bytes_raise_only_json_error_and_agree_with_json(data):
    got = mine(data)  # anything but JSONError propagates and fails the test
    want = oracle(data)
    if want is REFUSED:
        assert got is REFUSED, (data, got)
    else:
        assert got is not REFUSED, (data, want)
        assert same(got, want), (data, got, want)


@SETTINGS
@given(token_soup, st.integers(0, 10))
def test_agreement_holds_for_other_limits(data, max_depth):
    for max_len in (0, 5, len(data)):
        got = mine(data, max_depth=max_depth, max_len=max_len)
        want = oracle(data, max_depth=max_depth, max_len=max_len)
        assert (got is REFUSED) == (want is REFUSED), (data, max_depth, max_len, got, want)
        if got is not REFUSED:
            assert same(got, want)


@SETTINGS
@given(values, st.integers(0, 10))
def test_depth_limit_means_what_the_cbor_decoder_means(v, max_depth):
    v = _nested(v)
    encoded = cbor.dumps(v, max_depth=64)
    try:
        cbor.loads(encoded, max_depth=max_depth)
        cbor_ok = True
    except CBORDecodeError:
        cbor_ok = False
    text = json.dumps(v).encode()
    json_ok = mine(text, max_depth=max_depth, max_len=len(text)) is not REFUSED
    assert json_ok == cbor_ok == (depth(v) <= max_depth), (v, max_depth)


def _nested(v):
    """``v`` wrapped a few more times, so the depths straddle the limits."""
    return [{"k": [v]}]


@SETTINGS
@given(st.integers(INT_MIN - 10, INT_MAX + 10) | st.integers())
def test_integers_accepted_exactly_in_the_64_bit_range(n):
    got = mine(str(n).encode())
    if INT_MIN <= n <= INT_MAX:
        assert got == n and type(got) is int
    else:
        assert got is REFUSED


@SETTINGS
@given(st.decimals(allow_nan=False, allow_infinity=False), st.sampled_from(("e", "f")))
def test_number_magnitude_rule_is_decided_on_the_decimal_text(d, style):
    text = format(d, style)
    data = text.encode()
    if len(data) > 1024:
        return
    got = mine(data)
    if "e" not in text and "." not in text:  # an integer
        want_ok = INT_MIN <= int(text) <= INT_MAX
    else:
        want_ok = not too_large(text)
    assert (got is not REFUSED) == want_ok, (text, got)
    if want_ok and not isinstance(got, int):
        assert got == float(text), (text, got)
