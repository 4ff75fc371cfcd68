"""Log records never break a status or progress line (modbridge.cli.term): on a
terminal a record goes on a line of its own above the redrawn line; off a terminal
both are plain lines. The screens are checked through a small terminal model written
here (CR, ESC[K, LF), not through the code under test."""

from __future__ import annotations

import io
import logging
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from modbridge.cli import term

MODBRIDGE = str(Path(sys.executable).parent / "modbridge")


class Tty(io.StringIO):
    def isatty(self):
        return True


def screen(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: CR returns to column 0, ESC[K erases to
    the end of the line, LF starts a new line; other escapes are dropped."""
    lines, cur, col = [], [], 0
    i = 0
    while i < len(raw):
        c = raw[i]
        if raw.startswith("\x1b[K", i):
            del cur[col:]
            i += 3
            continue
        m = re.match(r"\x1b\[[0-9;?]*[A-Za-z]", raw[i:])
        if m:
            i += len(m.group(0))
            continue
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("".join(cur))
            cur, col = [], 0
        else:
            if col < len(cur):
                cur[col] = c
            else:
                cur.append(c)
            col += 1
        i += 1
    lines.append("".join(cur))
    return lines


def _logger(stream):
    log = logging.getLogger("test_term")
    log.propagate = False
    log.handlers[:] = [term.LineSafeHandler(stream)]
    log.handlers[0].setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.setLevel(logging.INFO)
    return log


def test_a_record_goes_above_the_line_and_the_line_comes_back():
    out = Tty()
    log = _logger(out)
    line = term.StatusLine(out)
    line.show("recording 3 s  30 samples")
    log.warning("the policy says something")
    line.show("recording 4 s  40 samples")
    assert screen(out.getvalue()) == ["WARNING the policy says something",
                                      "recording 4 s  40 samples"]  # fmt: skip
    line.done("recorded 5 s")
    log.warning("after")
    assert screen(out.getvalue())[-3:] == ["recorded 5 s", "WARNING after", ""]


def test_off_a_terminal_progress_and_records_are_plain_lines():
    out = io.StringIO()
    log = _logger(out)
    line = term.StatusLine(out)
    line.show("p1")
    log.warning("w")
    line.done("end")
    assert out.getvalue() == "p1\nWARNING w\nend\n"


@given(st.lists(st.tuples(st.sampled_from(["show", "log", "done"]),
                          st.text("abcdefgh ", min_size=1, max_size=12)), max_size=30))  # fmt: skip
def test_every_record_is_a_whole_line_and_the_status_is_last(ops):
    out = Tty()
    log = _logger(out)
    line = term.StatusLine(out)
    showing = None
    for op, text in ops:
        if op == "show":
            line.show("S:" + text)
            showing = "S:" + text
        elif op == "log":
            log.warning("L:" + text)
        else:
            line.done("D:" + text)
            showing = None
    lines = screen(out.getvalue())
    for op, text in ops:
        if op == "log":
            assert "WARNING L:" + text in lines, (lines, text)
    for ln in lines:  # never a record glued to a status line
        assert not (ln.startswith("S:") and "WARNING" in ln), lines
    assert lines[-1] == (showing or ""), lines


def test_record_on_a_terminal_keeps_its_progress_line_whole():
    """`record -v --sim` on a pty: INFO records arrive while the progress line is
    shown; no screen line holds both."""
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm")
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"term-{os.getpid()}.csv")
    proc = subprocess.Popen([MODBRIDGE, "-v", "record", "--sim", "--sim-speed", "5",
                             "--duration", "4", "-o", out, "--force"],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env,
                            close_fds=True)  # fmt: skip
    os.close(slave)
    raw = b""
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 1.0)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                raw += chunk
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        os.close(master)
        if os.path.exists(out):
            os.unlink(out)
    lines = screen(raw.decode("utf-8", "replace").replace("\r\n", "\n"))
    assert any(ln.startswith("recording ") for ln in lines), lines
    assert any(" INFO " in ln for ln in lines), lines
    glued = [ln for ln in lines if "recording " in ln and " INFO " in ln]
    assert not glued, glued
