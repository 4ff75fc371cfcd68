"""One owner per GPU, machine-wide: an abstract unix socket per GPU, and an exclusive
``flock`` per GPU UUID under the state directory.

    lock = GpuLock(state_dir, uuid, key=backend.owner_key(uuid)).acquire()
    ...                                          # GpuBusy naming the other pid
    lock.release()

The machine-wide lock is a listening unix socket bound to the abstract name
``\0modbridge-gpu-<key>``, whatever the state directory: a second bridge (or
``modbridge restore``) with another ``--state-dir`` cannot bind it, and learns the
owner's pid and uid from ``SO_PEERCRED``. The key is the GPU's UUID for a real GPU; a
simulated backend adds what tells its world apart (``GpuBackend.owner_key``). Abstract
names belong to the network namespace: bridges in containers with their own network
namespace do not see each other's (give them the host's, or one state dir).

``<state_dir>/locks/<uuid>.lock`` holds the owner's pid too. Both locks are the
kernel's and go away with the process, however it dies, so a SIGKILLed bridge never
leaves a stale lock behind. Two bridges, or a bridge and ``modbridge restore``, never
write the same GPU's limit.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import struct
from pathlib import Path

from modbridge.actuator.journal import ensure_dir, file_name, state_dir_error
from modbridge.errors import ModbridgeError


class GpuBusy(ModbridgeError):
    """Another process owns this GPU's power limit."""

    exit_code = 1

    def __init__(self, message, uuid=None, pid=None):
        super().__init__(message)
        self.uuid = uuid
        self.pid = pid


def _abstract_name(key: str) -> bytes:
    """``\\0modbridge-gpu-<key>`` (a key too long for sun_path is hashed)."""
    raw = key.encode("utf-8", "replace")
    if len(raw) > 80:
        raw = hashlib.sha256(raw).hexdigest().encode()
    return b"\0modbridge-gpu-" + raw


def _holder(name: bytes) -> tuple[int | None, int | None]:
    """(pid, uid) of the process listening on the abstract ``name``, or Nones."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(name)
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None, None
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


class GpuLock:
    def __init__(self, state_dir, uuid: str, key: str | None = None):
        self.uuid = uuid
        self.key = uuid if key is None else key
        self.path = Path(state_dir) / "locks" / f"{file_name(uuid)}.lock"
        self._fd: int | None = None
        self._sock: socket.socket | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _busy(self, pid, where: str, uid=None) -> GpuBusy:
        who = f"pid {pid or 'unknown'}" + ("" if uid is None else f", uid {uid}")
        return GpuBusy(
            f"GPU {self.uuid} is owned by another modbridge ({who}, {where}): stop it "
            "first (`systemctl stop modbridge`, or `kill` that pid), or map this module to "
            "another GPU",
            uuid=self.uuid,
            pid=pid,
        )

    def _take_machine_wide(self) -> None:
        name = _abstract_name(self.key)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(name)
            sock.listen(16)
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE:
                raise
            pid, uid = _holder(name)
            raise self._busy(pid, "machine-wide, whatever its state dir", uid) from None
        self._sock = sock

    def acquire(self) -> GpuLock:
        """Take both locks now or raise :class:`GpuBusy` (never waits); an unusable
        state dir (full, read-only, unsafe) raises JournalError."""
        if self._fd is not None:
            return self
        self._take_machine_wide()
        try:
            self._fd = self._take_file()
        except BaseException:
            self._drop_socket()
            raise
        return self

    def _take_file(self) -> int:
        ensure_dir(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise state_dir_error(self.path.parent, e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            try:
                other = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise state_dir_error(self.path.parent, e) from e
            pid = int(other) if other.isdigit() else None
            raise self._busy(pid, f"lock {self.path}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            os.close(fd)
            raise state_dir_error(self.path.parent, e, "write a lock in") from e
        return fd

    def _drop_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._drop_socket()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
