"""The last signing timestamp used for a module, kept on disk beside its key.

A module refuses a signed frame whose timestamp is not newer than the last one it
accepted on that link (in its current boot; protocol/sign.py). A host whose clock
stepped back (NTP correcting a fast clock, an RTC reset, a VM restored from a
snapshot) would sign below that mark after a restart and be refused until its clock
caught up, as long as the step was. MAVLink 2's answer, the one here: the host keeps
the last timestamp it used and continues from ``max(clock, last + 1)``.

``<uid>.ts`` beside the module's ``<uid>.key`` holds one decimal number and a newline:
a *reservation*, a timestamp at or above every one this host has signed with for the
module. A write per frame would cost an fsync a second per module, so a signer asks
for a reservation :data:`RESERVE_S` ahead of the timestamp it needs
(:meth:`Reservation.reserve`) and signs up to it without writing again; the file is
written before a timestamp above the old reservation is used, so a crash at any
instant never lets a restarted host reuse one. A clean stop writes the last timestamp
actually used (:meth:`Reservation.settle`), so restarts do not run ahead of the clock.

Writes are atomic (:func:`modbridge.fsutil.atomic_write`: an ``O_EXCL|O_NOFOLLOW``
temp file, fsync, rename, fsync of the directory); reads do not follow a symlink and
take at most :data:`MAX_FILE` bytes. A file that cannot be read or parsed, or one
that cannot be written, is never fatal: a warning says so (once) and the signer goes
on from the clock (a refusal for a stale timestamp is then recovered from by jumping
ahead, :mod:`modbridge.link.session`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from modbridge.firmware_host.sign_host import TS_PER_S
from modbridge.fsutil import atomic_write
from protocol.sign import TS_MAX

log = logging.getLogger(__name__)

TS_SUFFIX = ".ts"
RESERVE_S = 60  # a reservation this far ahead: one write a minute per signing module
RESERVE_TS = RESERVE_S * TS_PER_S
MAX_FILE = 32  # bytes read at most (a 48-bit number in decimal is 15 digits)
_FILE_MODE = 0o600


class StampFileError(ValueError):
    """A timestamp file that exists but cannot be used; the message says why."""


def read_stamp(path) -> int | None:
    """The reservation in ``path``; None if there is no such file.

    Raises :class:`StampFileError` for a file that is a symlink, not a regular file,
    unreadable, or not one decimal number in 0..2**48-1."""
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "is a symlink" if e.errno == errno.ELOOP else f"cannot be read ({e.strerror or e})"
        raise StampFileError(f"{p} {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StampFileError(f"{p} is not a regular file")
        data = os.read(fd, MAX_FILE + 1)
    except OSError as e:
        raise StampFileError(f"{p} cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    text = data.strip()
    if len(data) > MAX_FILE or not text.isdigit() or len(text) > 15:
        raise StampFileError(f"{p} does not hold a timestamp (one decimal number)")
    ts = int(text)
    if ts > TS_MAX:
        raise StampFileError(f"{p} holds a timestamp past 2**48 - 1")
    return ts


def write_stamp(path, ts: int) -> None:
    """Write the reservation ``ts`` to ``path`` atomically (OSError if it fails)."""
    atomic_write(Path(path), b"%d\n" % ts, _FILE_MODE)


class Reservation:
    """The on-disk reservation of one module's signing timestamps (``path``).

    :meth:`load` returns the timestamp a signer must continue above (0: none kept);
    :meth:`reserve` is a :class:`protocol.sign.Signer`'s ``reserve`` callable;
    :meth:`settle` records the last timestamp used at a clean stop. ``window`` is how
    far ahead a reservation reaches (timestamp units). ``writes`` and
    ``write_failures`` count file writes; ``error`` is the last problem, or None.
    """

    def __init__(self, path, window: int = RESERVE_TS):
        self.path = Path(path)
        self.window = window
        self.ceiling = 0  # on disk (or meant to be): no timestamp above it used yet
        self.writes = 0
        self.write_failures = 0
        self.error: str | None = None
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"Reservation({str(self.path)!r}, ceiling={self.ceiling})"

    def load(self) -> int:
        """The kept reservation (0 if none, or if the file is unusable: warned)."""
        try:
            ts = read_stamp(self.path)
        except StampFileError as e:
            self._warn(
                f"{e}: signing timestamps continue from this host's clock (if the clock "
                "went back, the module's first refusal makes the bridge jump ahead); the "
                "file is rewritten at the next reservation"
            )
            return 0
        if ts is None:
            return 0
        self.ceiling = max(self.ceiling, ts)
        return ts

    def reserve(self, ts: int) -> int:
        """Record that timestamps up to ``ts + window`` may be used; the ceiling.

        Called only when ``ts`` is above the signer's last ceiling. A failed write is
        warned about once and the ceiling is kept in memory (signing never stops: a
        module must not lose its host over a full disk)."""
        if ts <= self.ceiling:
            return self.ceiling
        want = min(ts + self.window, TS_MAX)
        if self._write(want):
            self.ceiling = want
            return want
        self.ceiling = want  # not retried per frame: once a window
        return want

    def settle(self, last_ts: int) -> None:
        """A clean stop: record ``last_ts`` (the last timestamp used) in place of the
        reservation, so the next run starts from the clock, not ``window`` ahead."""
        if 0 < last_ts <= self.ceiling and self._write(last_ts):
            self.ceiling = last_ts

    def _write(self, ts: int) -> bool:
        try:
            write_stamp(self.path, ts)
        except OSError as e:
            self.write_failures += 1
            self._warn(
                f"{self.path}: cannot keep the signing timestamp ({e.strerror or e}): after a "
                "restart with the clock set back the module refuses until the bridge has "
                "jumped ahead"
            )
            return False
        self.writes += 1
        return True

    def _warn(self, msg: str) -> None:
        self.error = msg
        if msg not in self._warned:
            self._warned.add(msg)
            log.warning("%s", msg)
