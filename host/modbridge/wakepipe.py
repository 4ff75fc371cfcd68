"""A wake-up pipe: how another thread ends a sleep in ``epoll``/``selectors``.

The link's I/O thread (:class:`modbridge.link.io.LinkIO`) and the exporter's
loop thread (:class:`modbridge.exporter.server.BoundedServer`) sleep on their
file descriptors with no poll period; :meth:`WakePipe.wake` (any thread) makes the
pipe's read end readable, :meth:`WakePipe.drain` (the sleeper, once woken) empties
it. One byte at most is in the pipe: a ``wake()`` while one is pending writes
nothing, and none is ever lost (see :meth:`drain`).
"""

from __future__ import annotations

import os


class WakePipe:
    """A non-blocking pipe; register :meth:`fileno` (the read end) for reading."""

    def __init__(self):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._pending = False  # a byte was written that no drain() has read yet

    def fileno(self) -> int:
        return self._r

    def wake(self) -> None:
        """Make the read end readable (from any thread; closed: nothing)."""
        if not self._pending:
            self._pending = True
            try:
                os.write(self._w, b"\0")
            except OSError:  # full (cannot be: one byte) or closed
                pass

    def drain(self) -> None:
        """Empty the pipe (the sleeping thread, after it saw the read end readable).

        The bytes are read *before* ``wake()`` may write again: a ``wake()`` racing
        with this sees a byte still pending and writes nothing, which is right, since
        the woken thread looks at what it was woken for after draining. Clearing the
        flag first would let such a byte be read here and leave the flag set with
        the pipe empty, and every later ``wake()`` would write nothing."""
        try:
            while os.read(self._r, 64):
                pass
        except OSError:  # empty (BlockingIOError) or closed
            pass
        self._pending = False

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1
