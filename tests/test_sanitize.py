"""sanitize(): strings from the wire made safe for a terminal and a log line.

Through the functions that print or log them, too: the monitor's table, status line
and live view, and the link's log lines (a module id with an escape sequence never
reaches the output raw).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modbridge.sanitize import MAX_LEN, sanitize

ESC_SEQS = [
    "\x1b[2J",  # CSI: clear the screen
    "\x1b]0;owned\x07",  # OSC: retitle the window
    "\x1b]8;;http://x\x1b\\",  # OSC 8 hyperlink, ST-terminated
    "\x9b31m",  # C1 CSI
    "\x9d0;t\x9c",  # C1 OSC ... ST
    "\x1bP+q\x1b\\",  # DCS
    "\x1bc",  # RIS: reset the terminal
]
BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
OTHER = ["\x00", "\x7f", "\x85", "\u200b", "\u200e", "\u2028", "\u2029", "\ufeff", "\ud800"]


def _clean(s: str) -> bool:
    """Nothing a terminal or a log reader would act on."""
    return s.isprintable() and "\x1b" not in s


def test_printable_text_goes_through_unchanged():
    for s in ["e6614c311b7a5c2f", "blackpill_f411", "1.2.3-rc1+g0f3c", "Grüße 温度 ✓", ""]:
        assert sanitize(s) == s


@pytest.mark.parametrize("seq", ESC_SEQS + BIDI + OTHER)
def test_controls_escapes_and_bidi_are_replaced_visibly(seq):
    out = sanitize("id" + seq + "end")
    assert _clean(out), ascii(out)
    assert out.startswith("id") and out.endswith("end")
    assert "\\" in out
    out.encode("utf-8")  # valid UTF-8, lone surrogates included


def test_the_escapes_look_like_python_s():
    assert sanitize("\x1b\x00\x9b\u202e\u2066\U000e0001") == (
        "\\x1b\\x00\\x9b\\u202e\\u2066\\U000e0001"
    )
    assert sanitize("a\tb\nc\rd") == "a\\tb\\nc\\rd"


def test_bytes_are_utf8_with_bad_bytes_escaped():
    assert sanitize(b"ok\xc3\xa9") == "oké"
    assert sanitize(b"\xff\x1b[0m") == "\\xff\\x1b[0m"
    assert sanitize(bytearray(b"a\x00")) == "a\\x00"


def test_other_types_are_their_str():
    assert sanitize(None) == "None"
    assert sanitize(42) == "42"
    assert sanitize(ValueError("bad\x1b[2J")) == "bad\\x1b[2J"


def test_length_is_bounded_and_escapes_are_never_split():
    assert len(sanitize("x" * 10_000)) == MAX_LEN
    assert sanitize("x" * 10_000).endswith("...")
    assert sanitize("abcdefgh", max_len=8) == "abcdefgh"
    assert sanitize("abcdefghi", max_len=8) == "abcde..."
    assert sanitize("ab\x1bcdefgh", max_len=8) == "ab..."  # not "ab\\x..."
    assert sanitize("abcd\x1b", max_len=8) == "abcd\\x1b"  # fits exactly
    assert sanitize("x" * 50, max_len=None) == "x" * 50
    assert sanitize("xxxxx", max_len=2) == ".."
    assert sanitize("xxxxx", max_len=0) == ""


@given(st.text(), st.integers(min_value=0, max_value=300))
def test_any_text_comes_out_clean_bounded_and_idempotent(s, n):
    out = sanitize(s, n)
    assert _clean(out)
    assert len(out) <= n
    out.encode("utf-8")
    full = sanitize(s, None)
    assert sanitize(full, None) == full  # idempotent: layers may apply it again


@given(st.binary())
def test_any_bytes_come_out_clean(b):
    out = sanitize(b)
    assert _clean(out) and len(out) <= MAX_LEN
    out.encode("utf-8")


def test_doctests():
    import doctest

    from modbridge import sanitize as mod

    result = doctest.testmod(mod)
    assert result.failed == 0 and result.attempted > 0


# --- through the monitor: what reaches the terminal --------------------------------------
EVIL = "e661\x1b]0;pwned\x07\x1b[2J\u202egnp.exe\x9b31m\x00\nforged"


def _raw(text: str) -> bool:
    """A control character, an escape or a bidi override that came from the wire."""
    return any(not c.isprintable() for c in text)


def _report(link_up=True):
    module = {
        "port": "/dev/ttyACM0",
        "module_id": EVIL,
        "link_up": link_up,
        "fw_version": "1.0\x1b[5m",
        "board": "b\u202eoard",
        "protocol": "1.0",
        "state": "HOSTED",
        "reason": None,
        "faults": [],
        "temp_gpu_c": 60.0,
        "fan1_rpm": 1200,
        "last_frame_age_s": 0.1,
        "last_error": f"/dev/ttyACM0: module {EVIL} is not paired",
        "gpu": {
            "uuid": "GPU-0",
            "name": "NVIDIA \x1b[8mH100",
            "temp_c": 60.0,
            "power_w": 300.0,
            "limit_w": 700.0,
        },
        "policy": {"level": "NORMAL", "reasons": [], "target_w": None},
    }
    gpu_err = {"uuid": "GPU-1", "state": "lost", "error": "gone\x1b[2J"}
    return {"backend": "virtual\x1b[31m", "modules": [module], "gpus": [module["gpu"], gpu_err]}


@pytest.mark.parametrize("link_up", [True, False])
def test_the_monitor_never_prints_a_wire_string_raw(link_up):
    from modbridge.cli import monitor

    rep = _report(link_up)
    lines = monitor.table(rep)
    assert lines and not any(_raw(line) for line in lines)
    text = "\n".join(lines)
    assert "e661\\x1b]0;pwned\\x07\\x1b[2J\\u202egnp.exe\\x9b31m\\x00\\nforged" in text
    assert "1.0\\x1b[5m" in text and "b\\u202eoard" in text and "gone\\x1b[2J" in text
    if not link_up:
        assert "is not paired" in text
    line = monitor.status_line(rep, clock=lambda: 0)
    assert not _raw(line) and line.count("\n") == 0
    assert line.split()[1] == "e661\\x1b]0;p.."  # the short id is cut after escaping


def test_the_live_view_sends_only_its_own_escape_codes():
    """The rich live view: what reaches the terminal is rich's own CSI sequences
    (colour, cursor moves) around escaped text; no OSC, no bell, no C1, no bidi."""
    import io
    import re

    from modbridge.cli import monitor

    out = io.StringIO()
    view = monitor.LiveView(out, tty=True, keys=False, size=(120, 30))
    try:
        view.draw(_report())
        view.key("1")  # the details too: the long wire strings are there
        view.draw(_report(link_up=False))
    finally:
        view.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # rich's CSI: SGR, moves
    assert "\x1b" not in text
    assert not any(_raw(line) for line in text.splitlines())
    assert "e661\\x1b]0;p" in text and "GPU-1" in text
    pipe = io.StringIO()
    monitor.LiveView(pipe, tty=False).draw(_report())
    lines = pipe.getvalue().splitlines()  # the module, then the GPU no module cools
    assert len(lines) == 2 and not any(_raw(x) for x in lines), lines
