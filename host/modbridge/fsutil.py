"""Small file-system helpers shared by the bridge's state files (the limit journal,
the modules' keys): all-or-nothing writes that survive a crash or a power cut."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from modbridge.errors import ModbridgeError


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a rename in it is on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` all or nothing: a temp file beside it (``mode``
    whatever the umask, never through a symlink), fsync, rename over ``path``, fsync
    the directory. Raises OSError: before the rename the old file is intact and no
    temp is left; a failed directory fsync is reported too (the write may not last)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = create_new(tmp, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


# ------------------------------------------------------------------ trusted directories
#
# The state, keys and control-socket directories are written by a bridge that runs as
# root. A directory another user can write (or owns) lets that user plant a symlink
# where the bridge is about to create a file, and make root truncate or chmod a file
# of their choosing. So, as ssh's StrictModes does for ~/.ssh: such a directory is
# refused, with the command that fixes it; files are created with O_EXCL|O_NOFOLLOW.


class UnsafeDirectory(ModbridgeError):
    """A directory the bridge would write in is writable or owned by someone else."""

    exit_code = 1


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def check_private_dir(path, what: str = "directory") -> Path:
    """Refuse (:class:`UnsafeDirectory`) ``path`` unless it is a directory owned by root
    or this user that neither group nor others can write, in a chain of parents that
    only root or this user can change (a parent others can write must be sticky, like
    /tmp). Symlinks are resolved first; the real path is returned."""
    path = Path(path)
    real = Path(os.path.realpath(path))
    chain = [real, *real.parents]
    for i, d in enumerate(chain):
        try:
            st = os.stat(d)
        except OSError as e:
            raise UnsafeDirectory(f"cannot check the {what} {path}: {d}: {e.strerror or e}") from e
        shown = f"{path}" if i == 0 and d == path else f"{d} (for {path})"
        if i == 0 and not stat.S_ISDIR(st.st_mode):
            raise UnsafeDirectory(f"the {what} {shown} is not a directory")
        if not _trusted_owner(st.st_uid):
            raise UnsafeDirectory(
                f"the {what} {shown} is owned by uid {st.st_uid}, neither root nor this user "
                f"(uid {os.geteuid()}): it could redirect what the bridge writes. "
                f"Fix: `chown {os.geteuid()} {d}`, or choose another directory"
            )
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (i == 0 or not st.st_mode & stat.S_ISVTX):
            raise UnsafeDirectory(
                f"the {what} {shown} can be written by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): they could plant links in it. "
                f"Fix: `chmod go-w {d}`"
            )
    return real


def ensure_private_dir(path, mode: int = 0o700, what: str = "directory") -> Path:
    """Create ``path`` (and parents, ``mode``) if needed, then :func:`check_private_dir`.
    OSError from mkdir is left to the caller (its message says which directory)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    return check_private_dir(path, what)


def create_new(path, mode: int = 0o600, flags: int = os.O_WRONLY) -> int:
    """``os.open`` a file that must not exist yet, never through a symlink
    (O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC); ``mode`` whatever the umask."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


def chmod_chown_nofollow(path, mode: int, uid: int = -1, gid: int = -1,
                         kind=stat.S_ISSOCK) -> None:  # fmt: skip
    """Set the mode (and owner) of the file at ``path`` without following a symlink:
    the file is opened ``O_PATH|O_NOFOLLOW``, checked (``kind``, e.g. a socket; owned
    by this user) on that descriptor, and changed through it. OSError otherwise."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not kind(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "not the file this process created", str(path))
        through = f"/proc/self/fd/{fd}"  # the inode the descriptor holds, not a path
        os.chmod(through, mode)
        if uid != -1 or gid != -1:
            os.chown(through, uid, gid)
    finally:
        os.close(fd)
