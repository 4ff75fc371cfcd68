"""The stream decoder after a pause (``StreamDecoder.idle``, SPEC.md section 8): a
human who typed a control byte at a terminal gets a listening decoder back by waiting,
and no binary frame sent in one burst is ever cut. Also the firmware's console path:
Ctrl-C twice, a pause, a JSON line: answered. DUAL: also under MicroPython.
"""

from fakehal import FakeHal, run
from mpcompat import heap_locked
from protocol_samples import XorShift32

from device.app import App
from protocol import catalog as C
from protocol import frame as F

DUAL = True
MPY_TIMEOUT = 600

GAP = 100  # F._GAP_MS (a const: not an attribute under MicroPython)
LINE = b'{"type":"config_get"}\n'
MPREMOTE = (b"\r\x03\x03", b"\r\x01", b"\x03", b"\x03\x03", b"\r\x03\r\x03", b"\x1b", b"\x04")


def _ack(seq):
    return F.encode_frame("ack", {"ref": seq & 0xFFFF, "ref_type": 2}, seq & 0xFFFF)


def _pause(dec, t, ms=GAP):
    """The port found empty at ``t`` and again ``ms`` later; returns the new time."""
    dec.idle(t)
    dec.idle((t + ms) & 0x3FFFFFFF)
    return (t + ms) & 0x3FFFFFFF


def _names(items):
    return [(it.name if it.ok else it.kind) for it in items]


def test_a_control_byte_run_is_deaf_until_a_zero_without_a_pause():
    # the bug this rule fixes: the run is binary and only 0x00 ends it
    dec = F.StreamDecoder(accept=C.H2D)
    assert dec.feed(b"\x03\x03" + LINE + LINE) == []
    assert _names(dec.feed(b"\x00" + LINE)) == ["framing", "config_get"]


def test_what_mpremote_and_ctrl_c_send_then_a_pause_then_a_line():
    for junk in MPREMOTE:
        dec = F.StreamDecoder(accept=C.H2D)
        assert dec.feed(junk) == [], junk
        _pause(dec, 5000)
        items = dec.feed(LINE)
        assert _names(items) == ["config_get"], (junk, items)
        assert items[0].fmt == "json"
        # a lone control byte is trimmed off the line; a binary run counts as framing
        assert dec.errors["framing"] == (0 if len(junk) == 1 else 1), (junk, dec.errors)
        assert dec.error_total() == dec.errors["framing"]


def test_a_pause_shorter_than_the_gap_keeps_the_run():
    ack = _ack(7)
    dec = F.StreamDecoder()
    assert dec.feed(ack[:4]) == []
    _pause(dec, 100, GAP - 1)
    assert _names(dec.feed(ack[4:])) == ["ack"]
    assert dec.error_total() == 0


def test_silence_counts_from_the_first_empty_read_not_from_the_last_bytes():
    # a busy module reads half a frame, then runs for a long while: the rest was
    # waiting in the port all along, so the next read is not empty and nothing is cut
    ack = _ack(8)
    dec = F.StreamDecoder()
    dec.idle(0)  # long idle before the frame
    dec.feed(ack[:3])
    dec.idle(GAP * 50)  # first empty read after the bytes: silence starts here
    dec.idle(GAP * 50 + GAP - 1)
    items = dec.feed(ack[3:])
    assert _names(items) == ["ack"]
    # a full gap after that first empty read drops the run
    dec.feed(ack[:3])
    dec.idle(10**6)
    dec.idle(10**6 + GAP)
    assert _names(dec.feed(b"\x00" + ack)) == ["ack"]
    assert dec.errors["framing"] == 1 and dec.error_total() == 1


def test_idle_wraps_with_the_ticks():
    dec = F.StreamDecoder(accept=C.H2D)
    dec.feed(b"\x03\x03")
    dec.idle(0x3FFFFFFF - 10)
    dec.idle(GAP - 20)  # wrapped: 89 ms later, under the gap
    assert dec.feed(b"") == [] and dec.errors["framing"] == 0
    dec.idle(0x3FFFFFFF - 10)
    dec.idle(GAP - 11)  # exactly GAP ms later
    assert _names(dec.feed(LINE)) == ["config_get"]


def test_a_slowly_typed_line_is_never_cut():
    dec = F.StreamDecoder(accept=C.H2D)
    t = 0
    items = []
    for i in range(len(LINE)):
        items += dec.feed(LINE[i : i + 1])
        t = _pause(dec, t, 3 * GAP)
    assert _names(items) == ["config_get"]
    assert dec.error_total() == 0


def test_a_slowly_typed_line_after_ctrl_c_and_a_pause():
    dec = F.StreamDecoder(accept=C.H2D)
    dec.feed(b"\x03")
    t = _pause(dec, 0, 3 * GAP)
    dec.feed(b"\x03")
    t = _pause(dec, t, 3 * GAP)
    items = []
    for i in range(len(LINE)):
        items += dec.feed(LINE[i : i + 1])
        t = _pause(dec, t, 3 * GAP)
    assert _names(items) == ["config_get"]


def test_an_oversize_binary_run_is_forgotten_after_a_pause():
    dec = F.StreamDecoder(accept=C.H2D)
    items = dec.feed(b"\x03\x03" + b"x" * (dec.max_encoded + 10))
    assert _names(items) == ["oversize"]
    _pause(dec, 0)
    assert _names(dec.feed(LINE)) == ["config_get"]
    assert dec.errors["oversize"] == 1 and dec.error_total() == 1


def test_an_oversize_text_line_still_ends_at_its_lf():
    dec = F.StreamDecoder(accept=C.H2D, max_line=64)
    items = dec.feed(b"y" * 100)
    assert _names(items) == ["oversize"]
    _pause(dec, 0)
    assert dec.feed(LINE) == []  # the LF ends the discarded line
    assert _names(dec.feed(LINE)) == ["config_get"]


def test_idle_allocates_nothing():
    dec = F.StreamDecoder(accept=C.H2D)
    dec.feed(b"\x03\x03junk")

    def pauses():
        dec.idle(1)
        dec.idle(1 + GAP)
        dec.idle(2 + GAP)

    heap_locked(pauses)
    assert dec.errors["framing"] == 1


# ------------------------------------------------------------------ property tests


def _garbage(rng):
    n = rng.below(700)
    return bytes(rng.buffer(n, zero_pct=rng.below(4), ff_pct=5)) if n else b""


def _feed_chunked(dec, rng, data):
    items = []
    i = 0
    while i < len(data):
        n = 1 + rng.below(90)
        items += dec.feed(data[i : i + n])
        i += n
    return items


def test_any_garbage_then_a_pause_then_a_line_is_answered():
    rng = XorShift32(1201)
    for case in range(300):
        dec = F.StreamDecoder(accept=C.H2D)
        g = _garbage(rng)
        _feed_chunked(dec, rng, g)
        t = _pause(dec, rng.below(1 << 30), GAP + rng.below(1000))
        # a pause, then Enter and the line: answered whatever came before
        items = _feed_chunked(dec, rng, b"\n" + LINE)
        assert items and items[-1].ok and items[-1].name == "config_get", (case, g, items)
        # garbage that ends in a binary run (a control byte second): no Enter needed
        body = rng.buffer(rng.below(600))
        for k in range(len(body)):
            body[k] = body[k] or 0x55  # no delimiter in the run
        tail = bytes([1 + rng.below(8), 1 + rng.below(8)]) + bytes(body)
        _feed_chunked(dec, rng, g + b"\x00" + tail)
        _pause(dec, t, GAP + rng.below(1000))
        items = _feed_chunked(dec, rng, LINE)
        assert items and items[-1].ok and items[-1].name == "config_get", (case, tail, items)


def test_frames_sent_in_bursts_among_garbage_and_pauses_all_decode():
    rng = XorShift32(1202)
    dec = F.StreamDecoder()
    t = 0
    want = []
    got = []
    for i in range(300):
        got += _feed_chunked(dec, rng, _garbage(rng))
        if rng.below(2):
            t = _pause(dec, t, GAP + rng.below(5000))
        # one burst: the delimiter flush, then the frame, read in pieces with empty
        # reads in between (a polling module) that last less than the gap in all
        ack = _ack(i)
        burst = b"\x00" + ack
        start = t
        j = 0
        while j < len(burst):
            n = 1 + rng.below(40)
            got += dec.feed(burst[j : j + n])
            j += n
            for _ in range(rng.below(3)):
                dec.idle(t)
                t = (t + rng.below(GAP // 8)) & 0x3FFFFFFF
        assert (t - start) & 0x3FFFFFFF < GAP
        want.append(i)
    oks = [it.seq for it in got if it.ok and it.name == "ack"]
    assert oks == want


# ------------------------------------------------------------------ the firmware


def test_firmware_console_ctrl_c_twice_a_pause_and_a_json_line_is_answered():
    hal = FakeHal()
    app = App(hal)
    app.boot()
    run(app, hal, 1000)
    hal.take()
    for junk in (b"\x03", b"\x03", b"\r\x03\x03", b"\r\x01"):
        hal.send(junk)
        run(app, hal, 300)  # the person looks at the screen: the port is empty
    # control bytes are not answered (telemetry goes on)
    assert [it.name for it in hal.take() if not (it.ok and it.name == "telemetry")] == []
    hal.send(LINE)
    run(app, hal, 50)
    replies = [it for it in hal.take() if it.ok and it.name != "telemetry"]
    assert replies and {(it.name, it.fmt) for it in replies} == {("config", "json")}, replies
    assert app.decoder.errors["framing"] >= 1
