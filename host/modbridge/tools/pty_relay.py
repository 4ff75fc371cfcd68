"""The MicroPython unix port as a serial "board" on a pty (testing without hardware).

``micropython -i`` runs with stdin/stdout/stderr on the slave end of a pty in raw
mode; a relay thread copies bytes between that pty's master and the master of a
second pty pair, whose slave path is what ``mpremote`` (or pyserial) opens. Holding
our own fd on that slave keeps the relay alive across the client's open/close. The
unix port's filesystem is the host's, so its working directory is the "flash".
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import threading
import tty
from pathlib import Path

from modbridge.tools.mpy import micropython_path


class PtyRelay:
    """Copy bytes both ways between ``inner_fd`` and a new pty; ``path`` is its slave."""

    def __init__(self, inner_fd: int):
        self._inner = inner_fd
        self._master, self._slave = pty.openpty()
        tty.setraw(self._slave)
        self.path = os.ttyname(self._slave)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pty-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fds = [self._inner, self._master]
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select(fds, [], [], 0.05)
            except (OSError, ValueError):
                return
            for fd in ready:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    return  # the process (or our own pty) went away
                if not data:
                    return
                _write_all(self._master if fd == self._inner else self._inner, data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for fd in (self._master, self._slave):
            with contextlib.suppress(OSError):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            select.select([], [fd], [], 0.05)
            continue
        data = data[n:]


class UnixPortBoard:
    """``micropython -i`` behind a pty relay; use as a context manager.

    ``path`` is the serial device to give ``mpremote connect <path> resume ...``.
    """

    def __init__(self, cwd: Path | str, heapsize: str = "2M", env: dict | None = None):
        self.cwd = Path(cwd)
        inner_master, inner_slave = pty.openpty()
        tty.setraw(inner_slave)
        argv = [micropython_path(), "-X", f"heapsize={heapsize}", "-i"]
        self.proc = subprocess.Popen(
            argv,
            stdin=inner_slave,
            stdout=inner_slave,
            stderr=inner_slave,
            cwd=self.cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        os.close(inner_slave)
        self._inner_master = inner_master
        self.relay = PtyRelay(inner_master)
        self.path = self.relay.path

    def close(self, timeout_s: float = 5) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        self.relay.close()
        with contextlib.suppress(OSError):
            os.close(self._inner_master)

    def __enter__(self) -> UnixPortBoard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
