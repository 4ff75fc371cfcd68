"""JSON-lines event log: one line per policy decision, alert or guard transition.

Each line is one JSON object, keys in a fixed order::

    {"ts":"2025-05-01T12:00:03.250Z","kind":"decision","module_id":"e6614c31...",
     "gpu_uuid":"GPU-4b1e...","level":"WARN","target_w":245.0,"reasons":["fan_stall"],
     "values":{"stalled_fans":1,...}}

``ts`` is UTC ISO 8601 with milliseconds from ``clock`` (``time.time`` by default);
``kind`` and the fields given to :meth:`EventLog.write` follow. Floats that are not
finite (an infinite ETA) are written as ``null``; anything JSON cannot encode is
written as its ``str()``.

Strings from the wire. Every string in a record (values and keys, at any depth) goes
through :func:`modbridge.sanitize.sanitize` (bounded to :data:`MAX_STR` characters):
a module id or an event text with an escape sequence, a newline or a bidi override
is written with those characters as visible escapes (``\\x1b``, ``\\u202e``). The
JSON is also ASCII-only (``ensure_ascii``), so the file itself never holds a control
byte; sanitising the values as well keeps ``jq -r .module_id`` and every other tool
that decodes the JSON safe on a terminal. A valid module id, board or firmware
version is printable and goes through unchanged.

The sink is a path, a text stream, or a list (lines are appended as strings, for
tests). Writing is thread-safe and never raises: a line that cannot be written (disk
full, permission lost, closed stream) is counted in :attr:`EventLog.dropped` and
logged once per episode (a warning when dropping starts, an info line when writing
works again).

A path is opened for append (``O_APPEND``: each line is one ``write``, and
logrotate's ``copytruncate`` keeps working), with ``O_NOFOLLOW`` (a symbolic link at
the path is refused with :class:`EventLogError`, never followed: a link planted in a
log directory must not make the bridge append to another file) and, when the file
is created, mode 0640 whatever the umask (an existing file with more permissive
bits is narrowed to 0640). A directory, a FIFO or a socket at the path is refused
too; a character device (``/dev/null``) is accepted and never rotated. Only the last
path component is checked, as logrotate does.

Rotation by size, the way ``logging.handlers.RotatingFileHandler`` and logrotate do:
before a line would take the file past ``max_bytes`` (default 10 MiB), ``path.N-1``
is renamed to ``path.N`` ... ``path`` to ``path.1`` (each an atomic ``os.replace``;
``backup_count`` files are kept, default 5, the oldest is replaced) and a new file
is opened. ``backup_count=0`` deletes the full file instead; ``max_bytes=0`` turns
rotation off (leave it to logrotate). A line longer than ``max_bytes`` gets a file
of its own. A rotation that fails (a read-only directory) is counted in
:attr:`EventLog.rotate_failures`, warned about once per episode, and retried at the
next line; lines keep going to the current file meanwhile (an event is worth more
than the bound). The file at the path is checked before each line: if it was
renamed or deleted behind the log's back (logrotate without ``copytruncate``,
another :class:`EventLog` on the same path), it is reopened. :class:`EventLog`
objects of one process on one path share a lock, so their lines never interleave
and only one of them rotates.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import stat
import threading
import time
from datetime import datetime, timezone

from modbridge.errors import ModbridgeError
from modbridge.sanitize import sanitize

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUP_COUNT = 5
FILE_MODE = 0o640
MAX_STR = 1024  # characters per string in a record, after escaping

# Keys written first, in this order, when given.
_HEAD = ("module_id", "gpu_uuid", "level", "target_w", "reasons")

_OPEN_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
)

# One lock per absolute path: EventLogs of one process on one file write and rotate
# one at a time.
_path_locks: dict[str, threading.RLock] = {}
_path_locks_guard = threading.Lock()


def _lock_for(path: str) -> threading.RLock:
    key = os.path.abspath(path)
    with _path_locks_guard:
        lock = _path_locks.get(key)
        if lock is None:
            lock = _path_locks[key] = threading.RLock()
        return lock


class EventLogError(ModbridgeError, OSError):
    """The event log's path cannot be used (a symlink, a directory, no permission);
    the message says what to do. An :class:`OSError` too, for callers catching that."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.errno = code


def iso_utc(t: float) -> str:
    """``2025-05-01T12:00:03.250Z`` for Unix time ``t``.

    >>> iso_utc(0.25)
    '1970-01-01T00:00:00.250Z'
    """
    dt = datetime.fromtimestamp(t, timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _clean(v):
    """JSON-safe copy: non-finite floats -> None, tuples/sets -> lists, keys -> str,
    strings sanitised."""
    if isinstance(v, str):
        return sanitize(v, MAX_STR)
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {sanitize(str(k), MAX_STR): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_clean(x) for x in v), key=str)
    if isinstance(v, (bytes, bytearray)):
        return sanitize(v, MAX_STR)
    return v


def _default(v):
    return sanitize(str(v), MAX_STR)


def open_error(path: str, exc: OSError) -> EventLogError:
    """One line that says what is wrong with ``path`` and what to do."""
    code = exc.errno
    if code in (errno.ELOOP, errno.EMLINK) or os.path.islink(path):
        return EventLogError(
            f"{path} is a symbolic link: the event log never follows one (a link there "
            "could make the bridge append to any file); give the real file's path",
            errno.ELOOP,
        )
    if code == errno.EISDIR or os.path.isdir(path):
        return EventLogError(
            f"{path} is a directory: give the event log a file name, e.g. "
            f"{os.path.join(path, 'events.jsonl')}",
            errno.EISDIR,
        )
    if code in (errno.EACCES, errno.EPERM):
        return EventLogError(
            f"{path}: permission denied: the bridge's user cannot create or append to it "
            "(check the owner and mode of the file and its directory; systemd: "
            "LogsDirectory=modbridge)",
            code,
        )
    if code == errno.ENOENT:
        return EventLogError(
            f"{path}: no directory {os.path.dirname(path) or '.'}: create it "
            "(systemd: LogsDirectory=modbridge)",
            code,
        )
    if code == errno.EROFS:
        return EventLogError(f"{path}: read-only file system: put the log elsewhere", code)
    if code == errno.ENXIO:
        return EventLogError(
            f"{path} is a FIFO or socket: the event log writes regular files only", code
        )
    return EventLogError(f"{path}: cannot open: {exc.strerror or exc}", code)


def open_log_file(path: str) -> int:
    """Open ``path`` for appending; returns the descriptor. Refuses a symlink, a
    directory, a FIFO or a socket (:class:`EventLogError`). A new file gets mode 0640
    whatever the umask; an existing regular file is narrowed to 0640 if it grants
    more."""
    created = True
    try:
        fd = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:  # (O_EXCL also fails on a symlink, dangling or not)
        created = False
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as e:
            raise open_error(path, e) from e
    except OSError as e:
        raise open_error(path, e) from e
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            mode = stat.S_IMODE(st.st_mode)
            if created and mode != FILE_MODE:
                os.fchmod(fd, FILE_MODE)  # the umask narrowed it: 0640 regardless
            elif not created and mode & ~FILE_MODE:
                try:
                    os.fchmod(fd, mode & FILE_MODE)
                except OSError as e:  # not our file: leave it, say so
                    log.warning("event log: %s is mode %o, cannot narrow it to %o: %s",
                                path, mode, mode & FILE_MODE, e)  # fmt: skip
        elif not stat.S_ISCHR(st.st_mode):
            raise EventLogError(
                f"{path} is not a regular file (a FIFO or socket): the event log writes "
                "regular files only (a blocked reader would stall the bridge)",
                errno.EINVAL,
            )
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _File:
    """The file behind a path sink: append, reopen when moved, rotate by size.
    Every method runs under the path's lock."""

    def __init__(self, path: str, max_bytes: int, backup_count: int):
        self.path = path
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self.fd: int | None = open_log_file(path)
        self.regular = stat.S_ISREG(os.fstat(self.fd).st_mode)
        self.torn = False  # a partial line was written: start the next one on a new line
        self.rotations = 0
        self.rotate_failures = 0
        self._rotate_warned = False

    def write(self, data: bytes) -> None:
        """Append ``data`` (one line); raises OSError if it cannot."""
        if self.fd is None:
            self._reopen()
        st = os.fstat(self.fd)
        if self.regular:
            try:
                here = os.lstat(self.path)
            except FileNotFoundError:
                here = None
            if here is None or (here.st_dev, here.st_ino) != (st.st_dev, st.st_ino):
                self._reopen()  # rotated or deleted behind our back
                st = os.fstat(self.fd)
            if self.max_bytes > 0 and st.st_size > 0 and st.st_size + len(data) > self.max_bytes:
                self._rotate()
        if self.torn:
            data = b"\n" + data
        n = os.write(self.fd, data)
        while n < len(data):  # a short write (the disk filled up mid-line)
            self.torn = True
            n += os.write(self.fd, data[n:])
        self.torn = False

    def _reopen(self) -> None:
        old, self.fd = self.fd, None
        if old is not None:
            os.close(old)
        self.fd = open_log_file(self.path)
        self.regular = stat.S_ISREG(os.fstat(self.fd).st_mode)
        self.torn = False

    def _rotate(self) -> None:
        try:
            if self.backup_count > 0:
                for i in range(self.backup_count - 1, 0, -1):
                    src = f"{self.path}.{i}"
                    if os.path.lexists(src):
                        os.replace(src, f"{self.path}.{i + 1}")
                os.replace(self.path, f"{self.path}.1")
            else:
                os.unlink(self.path)
        except OSError as e:
            self.rotate_failures += 1
            if not self._rotate_warned:
                self._rotate_warned = True
                log.warning(
                    "event log: cannot rotate %s (%s): writing on past %d bytes, retrying "
                    "at each line (count in EventLog.rotate_failures)",
                    self.path, e, self.max_bytes,
                )  # fmt: skip
            return
        self.rotations += 1
        if self._rotate_warned:
            self._rotate_warned = False
            log.info("event log: %s rotates again", self.path)
        self._reopen()  # raises if the new file cannot be made: the line is dropped

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class EventLog:
    """Append JSON lines to ``sink``: a path, a text stream, or a list (tests).

    For a path: ``max_bytes`` (0: no rotation) and ``backup_count`` rotate it (see the
    module docstring). Counters: ``written``, ``dropped``, ``rotations``,
    ``rotate_failures`` (:meth:`counters`). Raises :class:`EventLogError` (an
    ``OSError``) if the path cannot be opened.
    """

    def __init__(
        self,
        sink,
        clock=time.time,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backup_count: int = DEFAULT_BACKUP_COUNT,
    ):
        if max_bytes < 0 or backup_count < 0:
            raise ValueError("EventLog max_bytes and backup_count must be >= 0")
        self._clock = clock
        self._lock = threading.RLock()
        self._list = None
        self._stream = None
        self._file: _File | None = None
        self.path = None
        self.written = 0
        self.dropped = 0
        self._dropping = 0  # lines dropped in the current episode
        self._closed = False
        if isinstance(sink, list):
            self._list = sink
        elif isinstance(sink, (str, os.PathLike)):
            self.path = os.fspath(sink)
            self._lock = _lock_for(self.path)
            self._file = _File(self.path, max_bytes, backup_count)
        elif hasattr(sink, "write"):
            self._stream = sink
        else:
            raise TypeError(f"EventLog sink must be a path, a text stream or a list: {sink!r}")

    @property
    def rotations(self) -> int:
        return self._file.rotations if self._file is not None else 0

    @property
    def rotate_failures(self) -> int:
        return self._file.rotate_failures if self._file is not None else 0

    def counters(self) -> dict[str, int]:
        """``written``, ``dropped``, ``rotations``, ``rotate_failures`` (for metrics)."""
        return {
            "written": self.written,
            "dropped": self.dropped,
            "rotations": self.rotations,
            "rotate_failures": self.rotate_failures,
        }

    def format(self, kind: str, **fields) -> str:
        """The line ``write`` would write (without the newline)."""
        record = {"ts": iso_utc(self._clock()), "kind": kind}
        for k in _HEAD:
            if k in fields:
                record[k] = fields.pop(k)
        record.update(fields)
        return json.dumps(_clean(record), separators=(",", ":"), allow_nan=False, default=_default)

    def write(self, kind: str, **fields) -> bool:
        """Write one event; True if written, False if dropped (never raises)."""
        try:
            line = self.format(kind, **fields)
        except (TypeError, ValueError, RecursionError) as err:  # a broken __str__, say
            return self._drop(f"cannot encode {sanitize(kind)!r} event: {sanitize(err)}")
        with self._lock:
            try:
                if self._list is not None:
                    self._list.append(line)
                elif self._file is not None:
                    if self._closed:
                        raise ValueError("event log closed")
                    self._file.write((line + "\n").encode("ascii"))
                else:
                    self._stream.write(line + "\n")
                    self._stream.flush()
            except (OSError, ValueError) as err:  # disk full, permission lost, closed file
                return self._drop(f"cannot write to {self.path or self._stream!r}: {err}")
            self.written += 1
            dropped, self._dropping = self._dropping, 0
        if dropped:
            log.info("event log: writing again (%d events dropped before)", dropped)
        return True

    def _drop(self, why: str) -> bool:
        with self._lock:
            self.dropped += 1
            self._dropping += 1
            warn = self._dropping == 1
        if warn:
            log.warning("event log: %s (dropping events; count in EventLog.dropped)", why)
        return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as err:
                    log.warning("event log: closing %s: %s", self.path, err)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
