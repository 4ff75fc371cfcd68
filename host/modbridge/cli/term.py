"""One status line at the bottom of a terminal, and log records that never break it.

A long command (``record``, ``selftest``) keeps a progress line that it redraws with
``\\r`` on a terminal. A log record written meanwhile (``WARNING modbridge.policy ...``)
used to land in the middle of it. Here both go through one place: the log handler
clears the line, writes the record on a line of its own and redraws the line under it.
Off a terminal there is no line to keep: progress is plain lines, records are records.

    line = term.StatusLine(sys.stderr)
    line.show("recording 12 s ...")   # redrawn in place on a tty
    line.done("recorded 60 s")        # the last state, kept, on its own line
"""

from __future__ import annotations

import logging
import sys
import threading

CLEAR = "\r\x1b[K"  # to the start of the line, erase it

_lock = threading.RLock()
_active: StatusLine | None = None  # the line on screen now, if any


class StatusLine:
    """The redrawn line of one long command on ``stream`` (stderr by default)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.text = ""

    def show(self, text: str) -> None:
        """On a tty: ``text`` replaces the line; else it is written as a line."""
        global _active
        with _lock:
            self.text = text
            if self.tty:
                self.stream.write(CLEAR + text)
                _active = self
            else:
                self.stream.write(text + "\n")
            self.stream.flush()

    def done(self, text: str | None = None) -> None:
        """End the line: ``text`` (if any) stays on its own line; the next output
        starts on a fresh one."""
        global _active
        with _lock:
            if self.tty:
                self.stream.write(CLEAR + (text + "\n" if text else ""))
            elif text:
                self.stream.write(text + "\n")
            self.stream.flush()
            if _active is self:
                _active = None
            self.text = ""


def write_above(stream, text: str) -> None:
    """Write ``text`` (one or more whole lines) above the active status line, which
    is redrawn after it; without one, just write it."""
    with _lock:
        line = _active
        if line is not None and line.stream is stream:
            stream.write(CLEAR + text + line.text)
        else:
            stream.write(text)
        stream.flush()


class LineSafeHandler(logging.StreamHandler):
    """A stderr handler whose records go above the active status line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            write_above(self.stream, self.format(record) + self.terminator)
        except RecursionError:  # pragma: no cover - as logging.StreamHandler
            raise
        except Exception:
            self.handleError(record)


def setup_logging(level: int, stream=None) -> None:
    """The CLI's logging: records on stderr through :class:`LineSafeHandler`; on a
    terminal a short time stamp (the status lines carry one too), off it the full
    date (a journal or a log file)."""
    stream = stream or sys.stderr
    handler = LineSafeHandler(stream)
    tty = bool(getattr(stream, "isatty", lambda: False)())
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S" if tty else None))  # fmt: skip
    root = logging.getLogger()
    if any(not isinstance(h, LineSafeHandler) for h in root.handlers):
        return  # configured already (a test's capture, an embedding program): as basicConfig
    for h in list(root.handlers):
        root.removeHandler(h)  # ours, from an earlier call on another stream
    root.addHandler(handler)
    root.setLevel(level)
