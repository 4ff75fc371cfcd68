"""Allocation-free telemetry encoder (protocol.telemetry): same bytes as the generic
encoders, decodable, and no heap use under MicroPython's heap lock."""

from array import array

from mpcompat import IS_MICROPYTHON, raises
from protocol_samples import XorShift32, same_message

from protocol import catalog as C
from protocol import telemetry as T
from protocol.frame import StreamDecoder, decode_frame, encode_frame
from protocol.jsonl import decode_line, encode_line

DUAL = True


def _encoded(enc, seq):
    n = enc.encode_cbor(seq)
    cb = bytes(enc.out[:n])
    n = enc.encode_json(seq)
    js = bytes(enc.out[:n])
    return cb, js


def _candidates(fdef, rng):
    """Interesting valid wire values of one telemetry field."""
    lo, hi = fdef[C.F_LO], fdef[C.F_HI]
    out = [lo, hi, lo + 1, hi - 1, (lo + hi) // 2, lo + rng.below(hi - lo + 1)]
    for v in (0, 1, -1, 23, 24, 255, 256, 65535, 65536, -24, -25, -256, -257):
        if lo <= v <= hi:
            out.append(v)
    return out


def test_index_constants_match_catalog_order():
    mdef = C.by_type(C.T_TELEMETRY)
    assert T.FIELDS is mdef[C.M_FIELDS]
    assert T.N_FIELDS == len(mdef[C.M_FIELDS]) == 19
    for i in range(T.N_FIELDS):
        name = T.FIELDS[i][C.F_NAME]
        assert T.index(name) == i
        assert getattr(T, name.upper()) == i, name
    assert (T.UPTIME_S, T.STATE, T.TEMP_GPU, T.TARGET) == (0, 1, 4, 15)
    with raises(KeyError):
        T.index("bogus")


def test_every_field_range_fits_the_value_store():
    # the encoder keeps wire values in enc.values: every catalog value must survive
    enc = T.TelemetryEncoder()
    for i in range(T.N_FIELDS):
        f = T.FIELDS[i]
        for v in (f[C.F_LO], f[C.F_HI]):
            enc.set(i, v)
            assert enc.values[i] == v, (f[C.F_NAME], v, enc.values[i])


def test_identical_to_generic_encoders_at_boundaries():
    rng = XorShift32(31)
    enc = T.TelemetryEncoder()
    checked = 0
    for i in range(T.N_FIELDS):
        fdef = T.FIELDS[i]
        for v in _candidates(fdef, rng):
            enc.present = 0
            enc.set(T.STATE, C.STATE_HOSTED)
            enc.set(i, v)
            fields = enc.fields()
            seq = rng.below(0x10000)
            cb, js = _encoded(enc, seq)
            assert cb == encode_frame("telemetry", fields, seq), (fdef[C.F_NAME], v)
            assert js == encode_line("telemetry", fields, seq), (fdef[C.F_NAME], v, js)
            checked += 1
    assert checked > 100


def test_identical_to_generic_encoders_random_subsets():
    rng = XorShift32(32)
    enc = T.TelemetryEncoder()
    cands = [_candidates(T.FIELDS[i], rng) for i in range(T.N_FIELDS)]
    for round_ in range(150):
        enc.present = 0
        mask = rng.next32() | (1 << T.STATE)  # state is required
        for i in range(T.N_FIELDS):
            if mask & (1 << i):
                c = cands[i]
                enc.set(i, c[rng.below(len(c))])
        fields = enc.fields()
        seq = (0, 1, 0xFF, 0x100, 0xFFFF, rng.below(0x10000))[round_ % 6]
        cb, js = _encoded(enc, seq)
        assert cb == encode_frame("telemetry", fields, seq), fields
        assert js == encode_line("telemetry", fields, seq), (fields, js)
        # and both decode back to the same message
        msg = decode_frame(cb)
        assert msg.fields == fields and msg.seq == seq
        assert same_message(decode_line(js[:-1]), msg)


def test_all_fields_max_and_min():
    for which in (C.F_LO, C.F_HI):
        enc = T.TelemetryEncoder()
        for i in range(T.N_FIELDS):
            enc.set(i, T.FIELDS[i][which])
        fields = enc.fields()
        assert len(fields) == T.N_FIELDS
        cb, js = _encoded(enc, 0xFFFF)
        assert cb == encode_frame("telemetry", fields, 0xFFFF)
        assert js == encode_line("telemetry", fields, 0xFFFF)


def test_enum_without_name_is_a_number():
    enc = T.TelemetryEncoder()
    enc.set(T.STATE, 200)
    enc.set(T.REASON, len(C.REASONS))
    cb, js = _encoded(enc, 1)
    assert b'"state":200' in js
    assert js == encode_line("telemetry", enc.fields(), 1)
    assert cb == encode_frame("telemetry", enc.fields(), 1)


def test_absent_fields_omitted():
    enc = T.TelemetryEncoder()
    for i in range(T.N_FIELDS):
        enc.set(i, 1)
    enc.clear(T.TEMP_VRAM)
    enc.clear(T.FAN2_RPM)
    enc.clear(T.TEMP_VRAM)  # clearing twice is harmless
    fields = enc.fields()
    assert "temp_vram" not in fields and "fan2_rpm" not in fields
    assert len(fields) == T.N_FIELDS - 2
    cb, js = _encoded(enc, 5)
    assert b"temp_vram" not in js and b"fan2_rpm" not in js
    msg = decode_frame(cb)
    assert "temp_vram" not in msg.fields and msg.fields == fields
    # a cleared field keeps its old value but is not sent until set again
    enc.set(T.TEMP_VRAM, 45000)
    assert decode_frame(_encoded(enc, 6)[0]).fields["temp_vram"] == 45000


def test_stream_decoder_reads_both_forms():
    rng = XorShift32(33)
    enc = T.TelemetryEncoder()
    stream = bytearray()
    want = []
    for seq in range(40):
        enc.present = 0
        enc.set(T.STATE, seq % len(C.STATES))
        enc.set(T.TEMP_GPU, 20000 + rng.below(80000))
        if seq % 3:
            enc.set(T.FAN1_DUTY, rng.below(65536))
        if seq % 5 == 0:
            enc.set(T.UPTIME_S, seq * 1000)
        n = enc.encode_cbor(seq) if seq % 2 else enc.encode_json(seq)
        stream.extend(enc.out[:n])
        want.append((seq, enc.fields(), "cbor" if seq % 2 else "json"))
    dec = StreamDecoder(accept=C.D2H)
    got = []
    for i in range(0, len(stream), 17):
        got += dec.feed(stream[i : i + 17])
    assert dec.error_total() == 0, dec.errors
    assert [(m.seq, m.fields, m.fmt) for m in got] == want


def test_no_allocation_under_heap_lock():
    rng = XorShift32(34)
    enc = T.TelemetryEncoder()
    # precomputed value table, so the loop itself allocates nothing
    table = []
    for i in range(T.N_FIELDS):
        c = _candidates(T.FIELDS[i], rng)
        # through an array: the catalog's bounds (and a constant tuple's ints beyond
        # 0x1FFF) are frozen big ints on the MCU; the firmware's values are small ints
        table.append(tuple(array("i", [v for v in c if -(2**30) < v < 2**30])))
    table = tuple(table)
    sizes = [0, 0]
    enc.set(T.STATE, 1)
    enc.encode_cbor(0)
    enc.encode_json(0)
    if IS_MICROPYTHON:
        import gc

        import micropython

        gc.collect()
        before = gc.mem_alloc()
        micropython.heap_lock()
    try:
        k = 0
        while k < 1000:
            i = 0
            while i < T.N_FIELDS:
                vals = table[i]
                enc.set(i, vals[(k + i) % len(vals)])
                i += 1
            if k % 7 == 0:
                enc.clear(T.TEMP_AMB)
            sizes[0] += enc.encode_cbor(k)
            sizes[1] += enc.encode_json(65535 - k)
            k += 1
    finally:
        if IS_MICROPYTHON:
            micropython.heap_unlock()
    if IS_MICROPYTHON:
        assert gc.mem_alloc() == before, (gc.mem_alloc(), before)
    assert sizes[0] > 1000 * 20 and sizes[1] > 1000 * 100
    # the last frames are still right
    n = enc.encode_cbor(999)
    assert decode_frame(bytes(enc.out[:n])).fields == enc.fields()
