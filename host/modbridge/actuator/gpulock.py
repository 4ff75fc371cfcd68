"""One owner per GPU: an exclusive ``flock`` per GPU UUID under the state directory.

    lock = GpuLock(state_dir, uuid).acquire()   # GpuBusy naming the other pid
    ...
    lock.release()

``<state_dir>/locks/<uuid>.lock`` holds the owner's pid (for the message only: the
kernel's lock is the truth, and it goes away with the process, however it dies, so a
SIGKILLed bridge never leaves a stale lock behind). Two bridges, or a bridge and
``modbridge restore``, never write the same GPU's limit.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from modbridge.actuator.journal import ensure_dir, file_name
from modbridge.errors import ModbridgeError


class GpuBusy(ModbridgeError):
    """Another process owns this GPU's power limit."""

    exit_code = 1

    def __init__(self, message, uuid=None, pid=None):
        super().__init__(message)
        self.uuid = uuid
        self.pid = pid


class GpuLock:
    def __init__(self, state_dir, uuid: str):
        self.uuid = uuid
        self.path = Path(state_dir) / "locks" / f"{file_name(uuid)}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> GpuLock:
        """Take the lock now or raise :class:`GpuBusy` (never waits)."""
        if self._fd is not None:
            return self
        ensure_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            try:
                other = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            pid = int(other) if other.isdigit() else None
            raise GpuBusy(
                f"GPU {self.uuid} is owned by another modbridge (pid {pid or 'unknown'}, "
                f"lock {self.path}): stop it first (`systemctl stop modbridge`), or map this "
                "module to another GPU",
                uuid=self.uuid,
                pid=pid,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
