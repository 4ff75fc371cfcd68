"""Issue 23 item 11: a JSON line that starts with a UTF-8 byte order mark.

SPEC section 7.4 refuses a byte order mark as `undecodable` (the module answers
`nack malformed`) and section 8 decodes a text line that starts with one and then `{`
as a JSON line. On 4092283 such a line was counted as noise and got no answer.
DUAL: runs on CPython and under MicroPython.
"""

from fakehal import FakeHal, run, signer_for

from device.app import App
from protocol import catalog as C
from protocol.frame import StreamDecoder
from protocol.message import FMT_JSON

DUAL = True

BOM = b"\xef\xbb\xbf"
LINE = b'{"type":"hello_request","seq":77}'


def _one(data):
    dec = StreamDecoder(accept=C.H2D)
    items = dec.feed(data)
    assert len(items) == 1, items
    return dec, items[0]


def test_bom_line_is_undecodable_not_noise():
    for data in (BOM + LINE + b"\n", BOM + b"  \t" + LINE + b"\r\n", b" " + BOM + LINE + b"\n"):
        dec, item = _one(data)
        assert not item.ok and item.kind == "undecodable", (data, item.kind)
        assert item.code == C.ERR_MALFORMED and item.fmt == FMT_JSON, (item.code, item.fmt)
        assert "byte order mark" in item.detail, item.detail
        assert dec.errors["noise"] == 0 and dec.errors["undecodable"] == 1


def test_bom_before_other_text_is_still_noise():
    for data in (BOM + b"hello\n", BOM + b"\n", BOM + b"[1]\n"):
        dec, item = _one(data)
        assert not item.ok and item.kind == "noise", (data, item.kind)


def test_the_same_line_without_bom_is_accepted():
    dec, item = _one(LINE + b"\n")
    assert item.ok and item.name == "hello_request" and item.seq == 77


def test_module_answers_a_bom_line_with_nack_malformed_in_json():
    hal = FakeHal()
    app = App(hal)
    app.boot()
    signer_for(hal, app)
    run(app, hal, 500)
    hal.take()
    hal.send(BOM + LINE + b"\n")
    run(app, hal, 100)
    raw = hal.take_raw()
    assert raw.startswith(b"{"), raw[:40]  # answered in the line's format (SPEC 7.5)
    got = [m for m in hal.decoder.feed(raw) if m.ok and m.name == "nack"]
    assert len(got) == 1, got
    assert got[0].fields["code"] == C.ERR_MALFORMED, got[0].fields
