"""Hypothesis properties of the stream decoder's pause rule (``StreamDecoder.idle``,
SPEC.md section 8), beside the seeded ones of tests/test_stream_idle.py that also run
under MicroPython: whatever came before, a pause and a JSON line are answered; and a
pause rule that never fires inside a burst never costs a frame."""

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import catalog as C
from protocol import frame as F

GAP = 100  # F._GAP_MS (a const: not an attribute under MicroPython)
LINE = b'{"type":"config_get","section":"pid"}\n'
MASK = 0x3FFFFFFF

chunks = st.lists(st.integers(1, 97), min_size=1, max_size=20)


def _feed(dec, data, sizes):
    items = []
    i = k = 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        items += dec.feed(data[i : i + n])
        i += n
        k += 1
    return items


def _last_is_the_line(items):
    return bool(items) and items[-1].ok and items[-1].name == "config_get"


@settings(max_examples=400, deadline=None)
@given(
    garbage=st.binary(max_size=1500),
    sizes=chunks,
    t0=st.integers(0, MASK),
    pause=st.integers(GAP, 10**6),
    empty_reads=st.integers(0, 3),
)
def test_any_garbage_a_pause_and_enter_then_a_line_is_answered(
    garbage, sizes, t0, pause, empty_reads
):
    dec = F.StreamDecoder(accept=C.H2D)
    _feed(dec, garbage, sizes)
    for j in range(empty_reads):  # the module polls an empty port a few times
        dec.idle((t0 + j) & MASK)
    dec.idle((t0 + empty_reads) & MASK)
    dec.idle((t0 + empty_reads + pause) & MASK)
    assert _last_is_the_line(_feed(dec, b"\n" + LINE, sizes))


@settings(max_examples=300, deadline=None)
@given(
    garbage=st.binary(max_size=800),
    run=st.binary(min_size=0, max_size=900).map(lambda b: b.replace(b"\x00", b"\x55")),
    second=st.integers(1, 31).filter(lambda b: b not in (9, 10, 13)),
    sizes=chunks,
    pause=st.integers(GAP, 10**6),
)
def test_a_binary_run_then_a_pause_needs_no_enter(garbage, run, second, sizes, pause):
    """Ctrl-C and what follows it, without a 0x00: after the pause the line alone."""
    dec = F.StreamDecoder(accept=C.H2D)
    _feed(dec, garbage + b"\x00\x03" + bytes([second]) + run, sizes)
    dec.idle(0)
    dec.idle(pause)
    assert _last_is_the_line(_feed(dec, LINE, sizes))


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.binary(max_size=300), st.integers(0, 0xFFFF), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    sizes=chunks,
    steps=st.lists(st.integers(0, GAP // 10), min_size=1, max_size=10),
)
def test_frames_in_bursts_among_garbage_and_pauses_all_decode(parts, sizes, steps):
    dec = F.StreamDecoder()
    t = 0
    got = []
    for garbage, seq, pause in parts:
        got += _feed(dec, garbage, sizes)
        if pause:
            dec.idle(t)
            t = (t + GAP * 3) & MASK
            dec.idle(t)
        burst = b"\x00" + F.encode_frame("ack", {"ref": seq, "ref_type": 1}, seq)
        start = t
        i = k = 0
        while i < len(burst):  # read in pieces, empty reads between, all within GAP
            n = sizes[k % len(sizes)]
            got += dec.feed(burst[i : i + n])
            i += n
            if ((t - start) & MASK) + GAP // 10 < GAP:
                dec.idle(t)
                t = (t + steps[k % len(steps)]) & MASK
            k += 1
    acks = [it.seq for it in got if it.ok and it.name == "ack"]
    assert acks == [seq for _g, seq, _p in parts]
