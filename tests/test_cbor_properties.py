"""Property tests (CPython only): the CBOR subset codec and the message layer agree
with the reference implementation cbor2 on generated values and on arbitrary bytes."""

import json
import math

import cbor2
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protocol import catalog as C
from protocol import cbor, cobs, frame, jsonl
from protocol.errors import CBORDecodeError, OversizeError

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

U64 = 2**64 - 1


# --------------------------------------------------------------------------- helpers


def _key_bytes(k):
    return cbor2.dumps(k)


def canonical_order(v):
    """``v`` with every dict rebuilt in length-first, then bytewise order of the
    cbor2-encoded keys (RFC 7049 canonical order), and tuples as lists."""
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda kv: (len(_key_bytes(kv[0])), _key_bytes(kv[0])))
        return {k: canonical_order(x) for k, x in items}
    if isinstance(v, (list, tuple)):
        return [canonical_order(x) for x in v]
    return v


def same(a, b):
    """Equality with NaN == NaN, -0.0 != 0.0, tuples == lists, bytearray == bytes."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (bytes, bytearray)) and isinstance(b, (bytes, bytearray)):
        return bytes(a) == bytes(b)
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------- (a) values

ints = st.integers(min_value=-(2**64), max_value=U64)
floats = st.floats(allow_nan=True, allow_infinity=True)
leaves = st.none() | st.booleans() | ints | floats | st.text(max_size=20) | st.binary(max_size=20)
map_keys = ints | st.text(max_size=6)


def values(depth=4):
    if depth == 0:
        return leaves
    sub = values(depth - 1)
    return (
        leaves
        | st.lists(sub, max_size=4)
        | st.lists(sub, max_size=3).map(tuple)
        | st.dictionaries(map_keys, sub, max_size=4)
    )


@SETTINGS
@given(values())
def test_dumps_matches_cbor2_canonical(v):
    assert cbor.dumps(v) == cbor2.dumps(canonical_order(v))


@SETTINGS
@given(values())
def test_loads_reads_cbor2(v):
    got = cbor.loads(cbor2.dumps(v))
    assert same(got, v), (got, v)
    # and the canonical form as well (shortest floats, sorted keys)
    assert same(cbor.loads(cbor2.dumps(v, canonical=True)), v)


@SETTINGS
@given(st.dictionaries(map_keys, ints, max_size=12), st.randoms(use_true_random=False))
def test_dumps_independent_of_dict_order(d, rnd):
    items = list(d.items())
    rnd.shuffle(items)
    assert cbor.dumps(dict(items)) == cbor.dumps(d)


# --------------------------------------------------------------------------- (b) bytes


def _check_against_cbor2(data):
    try:
        got = cbor.loads(data)
    except CBORDecodeError:
        return False  # ours may refuse more than cbor2 (it is a subset)
    want = cbor2.loads(data)  # must not raise when ours accepted the input
    assert same(got, want), (data.hex(), got, want)
    return True


@SETTINGS
@given(st.binary(max_size=40))
def test_decoder_on_arbitrary_bytes(data):
    _check_against_cbor2(data)


@st.composite
def mutated_encodings(draw):
    """Valid cbor2 encodings with a few bytes flipped, cut off, or inserted."""
    data = bytearray(cbor2.dumps(draw(values(3))))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(("flip", "cut", "insert", "set")))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[pos:]
        elif op == "insert":
            data.insert(pos, draw(st.integers(0, 255)))
        elif data:
            data[pos] = draw(
                st.sampled_from((0x00, 0x18, 0x1B, 0x5F, 0x7F, 0x9F, 0xBF, 0xC0, 0xF7, 0xFF))
            )
    return bytes(data)


@SETTINGS
@given(mutated_encodings())
def test_decoder_on_mutated_encodings(data):
    _check_against_cbor2(data)


def test_decoder_accepts_much_of_the_mutations():
    # guard against the property above passing vacuously: valid inputs get through
    accepted = 0
    for v in ([1, 2], {"a": [1.5, None]}, b"xyz", "h\u00e9", -(2**64), 1.0e300):
        accepted += _check_against_cbor2(cbor2.dumps(v))
    assert accepted == 6


# --------------------------------------------------------------------------- (c) messages

# JSON lines carry what the strict parser takes (protocol/jsonparse.py): integers
# within int64, numbers below 1e38 in magnitude (single-precision boards)
json_float = st.floats(min_value=-1e37, max_value=1e37, allow_nan=False)
json_leaf = (
    st.integers(-(2**63), 2**63 - 1)
    | json_float
    | st.text(max_size=8)
    | st.booleans()
)


def field_strategy(fdef):
    kind, lo, hi = fdef[C.F_KIND], fdef[C.F_LO], fdef[C.F_HI]
    if kind in (C.K_UINT, C.K_INT, C.K_ENUM):
        return st.integers(lo, hi)
    if kind == C.K_STR:
        return st.text(min_size=lo or 0, max_size=hi)
    if kind == C.K_BYTES:
        return st.binary(min_size=lo or 0, max_size=hi)
    if kind == C.K_BOOL:
        return st.booleans()
    if kind == C.K_NUM:
        return st.integers(-(2**31), 2**31) | json_float
    if kind == C.K_LIST:
        item = (
            st.integers(-(2**31), 2**31)
            | json_float
            | st.lists(st.integers(-(10**6), 10**6), max_size=3)
        )
        return st.lists(item, min_size=lo or 0, max_size=hi)
    if kind == C.K_MAP:
        return st.dictionaries(
            st.text(max_size=8), json_leaf, min_size=lo or 0, max_size=min(hi, 8)
        )
    raise AssertionError(kind)


def message_fields(mdef):
    required = {}
    optional = {}
    for f in mdef[C.M_FIELDS]:
        (required if f[C.F_REQUIRED] else optional)[f[C.F_NAME]] = field_strategy(f)
    return st.fixed_dictionaries(required, optional=optional)


def _keyed(mdef, fields):
    return {f[C.F_KEY]: fields[f[C.F_NAME]] for f in mdef[C.M_FIELDS] if f[C.F_NAME] in fields}


@pytest.mark.parametrize("mdef", C.MESSAGES, ids=[m[C.M_NAME] for m in C.MESSAGES])
def test_messages_round_trip(mdef):
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(message_fields(mdef), st.integers(0, 0xFFFF))
    def check(fields, seq):
        keyed = _keyed(mdef, fields)
        want_payload = cbor2.dumps(canonical_order(keyed)) if keyed else b""
        try:
            data = frame.encode_frame(mdef[C.M_NAME], fields, seq)
        except OversizeError:
            assert frame.HEADER_LEN + len(want_payload) + frame.CRC_LEN > frame.MAX_FRAME
            assume(False)
        raw = bytes(cobs.decode(data[:-1]))
        assert raw[frame.HEADER_LEN : -frame.CRC_LEN] == want_payload
        msg = frame.decode_frame(data)
        assert (msg.type, msg.seq) == (mdef[C.M_TYPE], seq)
        assert same(msg.fields, fields)

        line = jsonl.encode_line(mdef[C.M_NAME], fields, seq)
        assert line.endswith(b"\n") and max(line) < 0x7F
        json.loads(line)  # valid JSON for any other tool
        jmsg = jsonl.decode_line(line)
        assert (jmsg.type, jmsg.seq) == (mdef[C.M_TYPE], seq)
        assert jmsg.fields == fields, (jmsg.fields, fields)

    check()
