"""Opening a module's serial port: 115200 8N1, exclusive, non-blocking reads; the
open errors mapped to messages that say what to do; the reopen back-off."""

from __future__ import annotations

import errno
import os
import random
import stat
from collections.abc import Callable

import serial

from modbridge.link.errors import (
    LinkError,
    NotASerialPort,
    PortBusy,
    PortNotFound,
    PortPermissionDenied,
)

BAUDRATE = 115200
WRITE_TIMEOUT_S = 0.5
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
BACKOFF_JITTER = 0.2  # +-20 %


def open_error(port: str, exc: BaseException) -> LinkError:
    """Map an exception from opening ``port`` to a one-line error that says what to do."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in (errno.EACCES, errno.EPERM) or isinstance(exc, PermissionError):
        return PortPermissionDenied(
            f"{port}: permission denied: add your user to the dialout group "
            "(sudo usermod -aG dialout $USER) and log in again"
        )
    if code in (errno.EBUSY, errno.EAGAIN, errno.EWOULDBLOCK) or "exclusively lock" in text:
        return PortBusy(f"{port}: port in use by another program (another modbridge? mpremote?)")
    if code in (errno.ENOENT, errno.ENODEV, errno.ENXIO) or isinstance(exc, FileNotFoundError):
        return PortNotFound(
            f"{port}: no such port: is the module plugged in? `modbridge list` shows modules"
        )
    if code == errno.ENOTTY or "Inappropriate ioctl" in text:
        return _not_serial(port, "a device that is not a tty")
    return LinkError(f"{port}: cannot open: {text}")


def _not_serial(port: str, what: str) -> NotASerialPort:
    return NotASerialPort(f"{port} is not a serial port ({what}): give the module's tty, "
                          "e.g. /dev/ttyUSB0 or /dev/modbridge/...; `modbridge list` shows "
                          "them")  # fmt: skip


def check_port(port: str) -> None:
    """Fail fast on a path no module can be behind: missing (:class:`PortNotFound`),
    or not a tty (:class:`NotASerialPort`: a file, a directory, /dev/null). A tty, or
    one this user may not open (the open then says so), passes."""
    try:
        st = os.stat(port)
    except FileNotFoundError:
        raise open_error(port, FileNotFoundError(errno.ENOENT, port)) from None
    except OSError as e:
        raise open_error(port, e) from None
    if stat.S_ISDIR(st.st_mode):
        raise _not_serial(port, "a directory")
    if not stat.S_ISCHR(st.st_mode):
        raise _not_serial(port, "a regular file" if stat.S_ISREG(st.st_mode) else "not a device")
    try:
        fd = os.open(port, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return  # busy or not ours: the real open reports it, with its advice
    try:
        if not os.isatty(fd):
            raise _not_serial(port, "a device that is not a tty")
    finally:
        os.close(fd)


def open_port(port: str, open_fn: Callable = serial.Serial, timeout: float = 0):
    """Open ``port`` exclusively at 115200 8N1; raises a :class:`LinkError` subclass.

    ``timeout`` is pyserial's read timeout: 0 (the link's choice) makes reads
    non-blocking, the link paces itself.
    """
    try:
        return open_fn(
            port, BAUDRATE, timeout=timeout, write_timeout=WRITE_TIMEOUT_S, exclusive=True
        )
    except (serial.SerialException, OSError) as e:
        raise open_error(port, e) from e


class Backoff:
    """Exponential back-off with jitter: ``next()`` gives the delay to wait now and
    doubles the next one up to ``max_s``; ``reset()`` after a success."""

    def __init__(self, min_s: float = BACKOFF_MIN_S, max_s: float = BACKOFF_MAX_S,
                 jitter: float = BACKOFF_JITTER, rng: random.Random | None = None):  # fmt: skip
        self.min_s, self.max_s, self.jitter = min_s, max_s, jitter
        self.rng = rng if rng is not None else random.Random()
        self.current = min_s

    def next(self) -> float:
        delay = self.current * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        self.current = min(self.current * 2, self.max_s)
        return min(delay, self.max_s)

    def reset(self) -> None:
        self.current = self.min_s
