"""The bridge's fast decoder (HostDecoder, cbor2 fast path) against the reference
StreamDecoder: every input gives the same verdict from both, never an exception.

A deterministic differential run of host/modbridge/firmware_host/fuzz.py (the benchmark runs 100,000
cases, bench/bench_protocol.py) and hypothesis properties over arbitrary bytes and
over frames whose CRC is valid, split into arbitrary chunks. CPython only (cbor2).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.bench_protocol import bridge_decoder
from modbridge.firmware_host import fuzz
from protocol import VERSION_MAJOR, cbor
from protocol import catalog as C
from protocol.frame import StreamDecoder, encode_frame

HostDecoder = bridge_decoder()
DIFF_CASES = 4_000
SETTINGS = settings(
    max_examples=400,
    deadline=None,
    database=None,
    derandomize=True,  # the same cases every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
D2H = [m for m in C.MESSAGES if m[C.M_DIR] == C.D2H]


def test_signed_flag_without_trailer_is_refused_as_the_reference_does():
    """Found by this fuzz: the fast path ignored FLAG_SIGNED, so a frame with the flag
    and no trailer was a message to it and a CRC/framing error to the reference."""
    mdef = C.by_type(C.T_TELEMETRY)
    fields = fuzz.valid_fields(fuzz.XorShift32(3), mdef, everything=True)
    keyed = {f[C.F_KEY]: fields[f[C.F_NAME]] for f in mdef[C.M_FIELDS]}
    frame = fuzz.raw_frame(C.T_TELEMETRY, cbor.dumps(keyed), 7, VERSION_MAJOR, 0x80)
    got = HostDecoder().feed(frame)
    assert not any(getattr(m, "ok", False) for m in got), got


Decoder = HostDecoder


def _agree(chunks) -> None:
    ref, host = StreamDecoder(accept=C.D2H), Decoder()
    want, _, err_ref = fuzz.feed_verdicts(ref, chunks)
    got, _, err_host = fuzz.feed_verdicts(host, chunks)
    assert err_ref is None and err_host is None, (err_ref, err_host)
    assert got == want
    assert (host.frames, host.errors) == (ref.frames, ref.errors)


def test_differential_run_agrees_and_reaches_the_fast_path():
    r = fuzz.differential(DIFF_CASES, 20240611, Decoder)
    shown = {k: v for k, v in r.items() if k != "hits"}
    assert r["cases"] == DIFF_CASES
    assert r["escaped_reference"] == 0 and r["escaped_other"] == 0, shown
    assert r["missed"] == [], shown  # every aim of the fast-path cases was reached
    assert r["fast_frames"] > DIFF_CASES // 2, shown  # most good frames went fast
    assert r["disagreements"] == 0, shown


def test_the_differential_sees_a_decoder_that_differs():
    # a decoder that drops every frame's last field must be caught, case by case
    class Lossy(HostDecoder):
        def feed(self, data, n=None, sink=None):
            out = super().feed(data, n, sink)
            for it in out:
                if it.ok and it.fields:
                    it.fields.pop(next(iter(it.fields)))
            return out

    r = fuzz.differential(300, 5, Lossy)
    assert r["disagreements"] > 100 and r["details"]


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points + [len(data)]:
        out.append(data[prev:p])
        prev = p
    return [c for c in out if c]


@SETTINGS
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=6))
def test_any_bytes_same_verdicts(data, cuts):
    _agree(_split(data + b"\x00", cuts))


values = st.one_of(
    st.integers(-(2**64), 2**64 - 1),
    st.booleans(),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.floats(),
    st.none(),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
)


@st.composite
def d2h_frames(draw):
    """A module -> host frame with a valid CRC: a valid message's fields (from a drawn
    seed) with some replaced by, or added as, any values; sometimes another minor or
    the signed flag; encoded by our CBOR (canonical, as a module sends it)."""
    mdef = draw(st.sampled_from(D2H))
    fields = fuzz.valid_fields(fuzz.XorShift32(draw(st.integers(1, 2**32 - 1))), mdef)
    keyed = {f[C.F_KEY]: fields[f[C.F_NAME]] for f in mdef[C.M_FIELDS] if f[C.F_NAME] in fields}
    keys = [f[C.F_KEY] for f in mdef[C.M_FIELDS]] + [40, 99]
    keyed.update(draw(st.dictionaries(st.sampled_from(keys), values, max_size=3)))
    for k in draw(st.lists(st.sampled_from(keys), max_size=2)):
        keyed.pop(k, None)
    try:
        payload = cbor.dumps(keyed) if keyed else b""
    except Exception:  # noqa: BLE001 - not encodable by the subset (NaN, big ints)
        payload = b""
    minor = draw(st.sampled_from([0, 0, 0, 1, 0x7F, 0x80, 0x81]))
    seq = draw(st.integers(0, 0xFFFF))
    if len(payload) > 480:
        payload = b""
    return fuzz.raw_frame(mdef[C.M_TYPE], payload, seq, VERSION_MAJOR, minor)


@SETTINGS
@given(st.lists(d2h_frames(), min_size=1, max_size=4), st.lists(st.integers(0, 2000), max_size=4))
def test_valid_crc_frames_same_verdicts(frames, cuts):
    _agree(_split(b"".join(frames), cuts))


_BOUNDS = [0, 1, 23, 24, 255, 256, 0xFFFF, 0x10000, 2**32 - 1, 2**32, 2**64 - 1]


def _head(major: int, a: int, extra: int) -> bytes:
    """A CBOR head for argument ``a``, ``extra`` sizes longer than the shortest
    (a non-canonical head when ``extra`` > 0, as far as 8 argument bytes go)."""
    sizes = [0, 1, 2, 4, 8]
    need = 0 if a < 24 else 1 if a < 0x100 else 2 if a < 0x10000 else 3 if a < 2**32 else 4
    n = sizes[min(need + extra, 4)]
    if n == 0:
        return bytes((major | a,))
    return bytes((major | {1: 24, 2: 25, 4: 26, 8: 27}[n],)) + a.to_bytes(n, "big")


@st.composite
def int_map_payloads(draw):
    """What the one-pass integer map decoder (codec._int_map) must judge as the
    reference does: a valid message's fields (every required one there) as a map of
    integers, then a few of: values moved to CBOR's head boundaries (in range or
    not, negative), heads longer than they need be, keys swapped, repeated or
    unknown, an entry dropped, a map length that lies, a byte cut off or added."""
    mdef = draw(st.sampled_from(D2H))
    fields = fuzz.valid_fields(fuzz.XorShift32(draw(st.integers(1, 2**32 - 1))), mdef)
    entries = [[f[C.F_KEY], fields[f[C.F_NAME]]] for f in mdef[C.M_FIELDS]
               if type(fields.get(f[C.F_NAME])) is int]  # fmt: skip
    near = st.sampled_from(_BOUNDS).flatmap(lambda b: st.integers(max(0, b - 1), b + 1))
    anyint = st.one_of(near, near.map(lambda v: -1 - v))
    for _ in range(draw(st.integers(0, 2))):
        if entries:
            entries[draw(st.integers(0, len(entries) - 1))][1] = draw(anyint)
    for _ in range(draw(st.integers(0, 1))):
        key = draw(st.sampled_from([e[0] for e in entries] + [23, 24, 40, 255, 256]))
        entries.insert(draw(st.integers(0, len(entries))), [key, draw(anyint)])
    if entries and draw(st.integers(0, 4)) == 0:
        i = draw(st.integers(0, len(entries) - 1))
        j = draw(st.integers(0, len(entries) - 1))
        entries[i], entries[j] = entries[j], entries[i]
    if entries and draw(st.integers(0, 4)) == 0:
        del entries[draw(st.integers(0, len(entries) - 1))]
    longer = set(draw(st.lists(st.integers(0, 2 * len(entries)), max_size=2)))
    lie = draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
    out = bytearray(_head(0xA0, max(0, len(entries) + lie), 0))
    for n, (k, v) in enumerate(entries):
        v = v if -(2**64) <= v < 2**64 else 7
        out += _head(0, k, int(2 * n in longer))
        out += _head(0x20 if v < 0 else 0, -1 - v if v < 0 else v, int(2 * n + 1 in longer))
    cut = draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
    if cut == -1 and out:
        del out[-1]
    elif cut == 1:
        out += bytes((draw(st.integers(0, 255)),))
    return fuzz.raw_frame(mdef[C.M_TYPE], bytes(out), draw(st.integers(0, 0xFFFF)))


@SETTINGS
@given(st.lists(int_map_payloads(), min_size=1, max_size=3))
def test_integer_maps_same_verdicts(frames):
    _agree(list(frames))


def test_telemetry_takes_the_one_pass_integer_path(monkeypatch):
    """A module's telemetry never reaches cbor2 (codec._int_map decodes it), and what
    it gives is the reference's message."""
    from modbridge.link import codec

    rng = fuzz.XorShift32(21)
    mdef = C.by_type(C.T_TELEMETRY)
    frames = [encode_frame("telemetry", fuzz.valid_fields(rng, mdef, everything=True), n)
              for n in range(50)]  # fmt: skip
    want = [StreamDecoder(accept=C.D2H).feed(f)[0].fields for f in frames]
    monkeypatch.setattr(codec, "cbor2", None)
    host = HostDecoder()
    got = [host.feed(f)[0] for f in frames]
    assert [m.fields for m in got] == want and host.fast_frames == len(frames)


def test_good_frames_take_the_fast_path():
    host = HostDecoder()
    rng = fuzz.XorShift32(9)
    n = 0
    for mdef in D2H:
        for _ in range(5):
            fields = fuzz.valid_fields(rng, mdef, everything=True)
            got = host.feed(encode_frame(mdef[C.M_TYPE], fields, n))
            assert len(got) == 1 and got[0].ok and got[0].fields == fields, (mdef[C.M_NAME], got)
            n += 1
    assert host.frames == n and host.fast_frames >= n // 2, (host.fast_frames, n)


# ----------------------------------------------------------------------------- encoding

H2D = [m for m in C.MESSAGES if m[C.M_DIR] == C.H2D]
_ANY_INT = st.one_of(
    st.integers(-5, 300), st.integers(-(2**31), 2**33), st.booleans(), st.just(2**70)
)


def _signer(key=b"k" * 32):
    from protocol.sign import Signer

    ticks = iter(range(10**9, 2 * 10**9))
    signer = Signer(key, link_id=3, clock=lambda: next(ticks))
    signer.nonce = bytes(range(8))
    return signer


def _outcome(encode, *args, **kw):
    try:
        return encode(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the verdict is what is compared
        return type(e)


@SETTINGS
@given(
    mdef=st.sampled_from(H2D),
    data=st.data(),
    seq=st.one_of(st.integers(0, 0xFFFF), st.just(-1), st.just(0x10000)),
    signed=st.booleans(),
)
def test_fast_encoder_writes_the_reference_bytes(mdef, data, seq, signed):
    """encode_fast is encode_frame: the same bytes (signed: the same trailer from the
    same clock) or the same exception, for every host -> module message and fields
    in range, out of range, of the wrong type, unknown or missing."""
    from modbridge.link.codec import encode_fast

    names = [f[C.F_NAME] for f in mdef[C.M_FIELDS]] + ["no_such_field"]
    fields = data.draw(st.dictionaries(st.sampled_from(names), _ANY_INT, max_size=len(names)))
    want = _outcome(encode_frame, mdef[C.M_NAME], fields, seq, signer=_signer() if signed else None)
    got = _outcome(encode_fast, mdef[C.M_NAME], fields, seq, signer=_signer() if signed else None)
    assert got == want


def test_fast_encoder_takes_the_fast_path_for_heartbeats(monkeypatch):
    """A heartbeat in range never reaches the reference encoder."""
    from modbridge.link import codec

    hb = {"gpu_temp": 71000, "gpu_power": 612500, "power_limit": 700000, "host_time": 5,
          "period_ms": 1000}  # fmt: skip
    want = encode_frame("heartbeat", hb, 9, signer=_signer())
    monkeypatch.setattr(codec, "encode_frame", None)
    assert codec.encode_fast("heartbeat", hb, 9, signer=_signer()) == want
