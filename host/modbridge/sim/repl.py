"""The virtual module's MicroPython REPL: what a board's port speaks once the firmware
has handed it back (a ``repl`` command) or stopped (it returned or crashed).

A real board runs MicroPython's own REPL on that port (``shared/runtime/pyexec.c``);
the unix port has no raw REPL, so this module speaks the REPL's side of the port in
CPython, byte by byte as pyexec does, and runs the code in a persistent ``micropython``
process (the real interpreter, :class:`Interpreter`) whose filesystem is the module's
flash directory mounted at ``/`` (``fs_dir``: config.json, secret.key). What a host
sees, as on a board:

- friendly REPL: the banner, ``>>> `` and ``... `` (continuation as
  ``mp_repl_continue_with_input``), echo and backspace, Ctrl-C (``\\r\\n`` and a new
  prompt, or KeyboardInterrupt in running code), Ctrl-B (banner again), Ctrl-E
  (paste mode), Ctrl-D on an empty line (soft reset: ``MPY: soft reboot``, then the
  board runs main.py again: :attr:`Repl.action` ``"soft"``, the runner restarts the
  firmware);
- raw REPL (Ctrl-A): ``raw REPL; CTRL-B to exit\\r\\n>``, code until Ctrl-D, ``OK``,
  stdout, ``\\x04``, the exception's text, ``\\x04>``; Ctrl-D on an empty line is a
  soft reset that stays in the raw REPL (a fresh interpreter, main.py does not run,
  as on a board); Ctrl-B back to the friendly REPL;
- raw-paste mode (``\\x05A\\x01`` in the raw REPL): ``R\\x01``, a 128-byte window
  (half of pyexec's 256-byte buffer) as two bytes, ``\\x01`` per window consumed,
  ``\\x04`` at the end of the code, then the output as in the raw REPL. mpremote 1.29
  uses it for every ``exec``;
- ``machine.reset()`` (mpremote's ``reset``): :attr:`Repl.action` ``"reset"``;
  ``machine.soft_reset()`` / ``sys.exit()``: a soft reset in the current mode.

While code runs, bytes from the host wait (at most :data:`MAX_PENDING`), except
Ctrl-C, which interrupts it (SIGINT to the interpreter: KeyboardInterrupt, as the
board's interrupt character). Nothing a host sends can raise out of :meth:`Repl.feed`
or leave it waiting on the host: every state ends at a byte the host can send.

Stdout is "cooked" as a board's is (``\\n`` -> ``\\r\\n``). The firmware's own modules
are not importable here (on an STM32 they are frozen; this interpreter only sees the
flash directory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable

from modbridge.errors import ModbridgeError
from modbridge.link.requests import timeout_scale

log = logging.getLogger(__name__)

CTRL_A, CTRL_B, CTRL_C, CTRL_D, CTRL_E = 1, 2, 3, 4, 5
RAW_BANNER = b"raw REPL; CTRL-B to exit\r\n"
SOFT_REBOOT = b"MPY: soft reboot\r\n"
PASTE_BANNER = b"\r\npaste mode; Ctrl-C to cancel, Ctrl-D to finish\r\n=== "
PS1, PS2 = b">>> ", b"... "
WINDOW = 128  # raw-paste flow-control window: pyexec's MICROPY_REPL_STDIN_BUFFER_MAX / 2
MACHINE = "sim with MicroPython unix port"  # boards/sim.py NAME and MCU
MAX_CODE = 1 << 20  # bytes of one line / paste / raw-paste; more is dropped (a board's heap)
MAX_PENDING = 1 << 16  # host bytes held while code runs (a board's stdin ring is smaller)
# How long the REPL's interpreter may take to start and say its version, times
# $MODBRIDGE_TIMEOUT_SCALE (modbridge.link.requests): a loaded machine starts a
# MicroPython process slowly (a full test run beside qemu jobs took more than 10 s).
START_TIMEOUT_S = 10.0 * timeout_scale()

# modes
FRIENDLY, PASTE, RAW, RAW_PASTE = "friendly", "paste", "raw", "raw-paste"

# the interpreter link: host -> child requests, child -> host control messages
REQ_EXEC, REQ_SINGLE = ord("X"), ord("S")
MSG_VERSION, MSG_DONE, MSG_RESET = ord("V"), ord("D"), ord("R")
DONE_OK, DONE_ERROR, DONE_EXIT = 0, 1, 2

_COMPOUND = re.compile(rb"(if|while|for|try|with|def|class|async)(?![A-Za-z0-9_])")


def _read_available(fd: int, limit: int | None = None) -> bytes:
    """What a non-blocking ``fd`` holds now (at most ``limit`` bytes): reads until it
    would block, hits end of file or fails."""
    out = b""
    while limit is None or len(out) < limit:
        try:
            chunk = os.read(fd, 65536 if limit is None else limit - len(out))
        except OSError:  # BlockingIOError (nothing more), InterruptedError, EIO
            break
        if not chunk:
            break
        out += chunk
    return out

class ReplError(ModbridgeError):
    """The REPL's interpreter could not be started (the message says why)."""


def cooked(data: bytes) -> bytes:
    """Stdout as a board's port carries it: every ``\\n`` as ``\\r\\n``.

    >>> cooked(b"a\\nb")
    b'a\\r\\nb'
    """
    return data.replace(b"\n", b"\r\n")


def continue_with_input(src: bytes) -> bool:
    """Whether the friendly REPL asks for another line (``... ``), as MicroPython's
    ``mp_repl_continue_with_input``: an open bracket or triple quote, a trailing
    backslash, or a compound statement whose last line is not empty.

    >>> [continue_with_input(s) for s in (b"1+1", b"if x:", b"if x:\\n  y\\n", b"f(1,")]
    [False, True, False, True]
    """
    if not src:
        return False
    compound = src.startswith(b"@") or _COMPOUND.match(src) is not None
    brackets = {b"(": 0, b"[": 0, b"{": 0}
    closing = {b")": b"(", b"]": b"[", b"}": b"{"}
    quote = b""  # b"", b"'", b'"', b"'''", b'"""'
    i, n = 0, len(src)
    while i < n:
        c = src[i : i + 1]
        if c in (b"'", b'"'):
            triple = src[i : i + 3] == c * 3
            if quote == b"" or quote == c * 3:
                if triple:
                    quote = b"" if quote else c * 3
                    i += 3
                    continue
                if quote == b"":
                    quote = c
            elif quote == c:
                quote = b""
        elif c == b"\\" and quote and i + 1 < n and src[i + 1 : i + 2] in (b"'", b'"', b"\\"):
            i += 1
        elif not quote:
            if c in brackets:
                brackets[c] += 1
            elif c in closing:
                brackets[closing[c]] -= 1
        i += 1
    if len(quote) == 3:
        return True
    if any(v > 0 for v in brackets.values()) and not quote:
        return True
    if src.endswith(b"\\"):
        return True
    return compound and not src.endswith(b"\n")


# --------------------------------------------------------------------------- the interpreter

# Runs in the micropython process. Requests on fd RFD: kind (X exec, S single), u32
# length, code. Control messages on fd WFD: kind, u32 length, payload (V version
# banner; D status byte + exception text; R machine.reset()). Stdout is fd 1, as is.
# Each message is one write of < 4096 bytes: atomic on a pipe, so a Ctrl-C (SIGINT)
# landing in a write can retry it whole.
_SERVER = r"""
import sys, io, os, time, vfs
import machine as _um
_rd = open(@RFD@, "rb")
_wr = open(@WFD@, "wb")
_UID = bytes.fromhex(@UID@)
_CAUSE = @CAUSE@


def _put(kind, data):
    n = len(data)
    msg = bytes((kind, n & 255, (n >> 8) & 255, (n >> 16) & 255, n >> 24)) + data
    while True:
        try:
            _wr.write(msg)
            return
        except KeyboardInterrupt:
            pass


def _get(n):
    b = b""
    while len(b) < n:
        try:
            c = _rd.read(n - len(b))
        except KeyboardInterrupt:
            continue
        if not c:
            return None
        b += c
    return b


class _Machine:
    PWRON_RESET = 1
    HARD_RESET = 2
    WDT_RESET = 3
    DEEPSLEEP_RESET = 4
    SOFT_RESET = 5

    def reset(self):
        _put(82, b"")
        while True:
            time.sleep_ms(100)

    def soft_reset(self):
        raise SystemExit

    def unique_id(self):
        return _UID

    def reset_cause(self):
        return _CAUSE

    def freq(self, *args):
        return 100000000

    def idle(self):
        time.sleep_ms(1)

    def __getattr__(self, name):
        return getattr(_um, name)


class _Os:
    # the unix port's VfsPosix lists (name, type, inode): add the size, as a board's
    # FAT or littlefs does (mpremote's fs ls shows it)
    def ilistdir(self, path=""):
        base = "" if path in ("", ".") else path.rstrip("/") + "/"
        for e in os.ilistdir(path) if path else os.ilistdir():
            size = 0
            if e[1] == 0x8000:
                try:
                    size = os.stat(base + e[0])[6]
                except OSError:
                    pass
            yield (e[0], e[1], e[2], size)

    def __getattr__(self, name):
        return getattr(os, name)


def _trace(e):
    b = io.StringIO()
    sys.print_exception(e, b)
    mine = '  File "<sim-repl>"'
    keep = [ln for ln in b.getvalue().split("\n") if ln and not ln.startswith(mine)]
    text = ("\n".join(keep) + "\n").encode()
    return text[-3000:]


def _run(kind, src, g):
    try:
        exec(compile(src, "<stdin>", "single" if kind == 83 else "exec"), g)
        return b"\x00"
    except SystemExit:
        return b"\x02"
    except BaseException as e:
        return b"\x01" + _trace(e)


def _main():
    sys.modules["machine"] = _Machine()
    sys.modules["os"] = _Os()
    vfs.umount("/")
    vfs.mount(vfs.VfsPosix(@FS@), "/")
    os.chdir("/")
    sys.path.clear()
    sys.path.extend(["", ".frozen", "/lib"])
    v = sys.implementation.version
    ver = "v%d.%d.%d" % (v[0], v[1], v[2])
    if len(v) > 3 and v[3]:
        ver += "-" + v[3]
    if " on " in sys.version:
        ver += " on " + sys.version.split(" on ")[-1]
    _put(86, ver.encode())
    g = {"__name__": "__main__"}
    while True:
        hdr = _get(5)
        if hdr is None:
            return
        src = _get(hdr[1] | (hdr[2] << 8) | (hdr[3] << 16) | (hdr[4] << 24))
        if src is None:
            return
        try:
            res = _run(hdr[0], src, g)
        except KeyboardInterrupt:  # a late Ctrl-C, after the code had finished
            res = b"\x01KeyboardInterrupt: \n"
        _put(68, res)


_main()
"""


class Interpreter:
    """A persistent ``micropython`` process that runs the REPL's code (see the module
    docstring). ``run`` starts one piece of code; ``read_stdout`` and ``messages`` poll
    (never block); ``interrupt`` is Ctrl-C; ``close`` kills it. ``version`` is the
    interpreter's version for the banner."""

    def __init__(
        self,
        fs_dir,
        *,
        micropython: str,
        uid: bytes = b"",
        reset_cause: int = 1,
        heapsize: str | None = "1M",
        stderr=None,
        start_timeout_s: float = START_TIMEOUT_S,
    ):
        req_r, self._req_w = os.pipe()
        self._ctl_r, ctl_w = os.pipe()
        code = (
            _SERVER.replace("@RFD@", str(req_r))
            .replace("@WFD@", str(ctl_w))
            .replace("@UID@", repr(bytes(uid).hex()))
            .replace("@CAUSE@", str(int(reset_cause)))
            .replace("@FS@", repr(str(fs_dir)))
        )
        argv = [micropython]
        if heapsize:
            argv += ["-X", f"heapsize={heapsize}"]
        argv += ["-c", f"exec(compile({code!r}, '<sim-repl>', 'exec'))"]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr if stderr is not None else subprocess.DEVNULL,
                cwd=str(fs_dir),
                pass_fds=(req_r, ctl_w),
                bufsize=0,
                start_new_session=True,
            )
        except OSError as e:
            for fd in (req_r, ctl_w, self._req_w, self._ctl_r):
                os.close(fd)
            raise ReplError(f"cannot start the REPL's interpreter {micropython}: {e}") from e
        os.close(req_r)
        os.close(ctl_w)
        self.stdout_fd = self.proc.stdout.fileno()
        os.set_blocking(self.stdout_fd, False)
        os.set_blocking(self._ctl_r, False)
        self._ctl_buf = b""
        self.version = ""
        end = time.monotonic() + start_timeout_s
        while not self.version:
            left = end - time.monotonic()
            if left <= 0 or not self.alive:
                err = self.read_stdout().decode("utf-8", "replace").strip()
                self.close()
                raise ReplError(
                    "the REPL's interpreter did not start" + (f": {err[-300:]}" if err else "")
                )
            select.select([self._ctl_r], [], [], min(left, 0.2))
            for kind, payload in self.messages():
                if kind == MSG_VERSION:
                    self.version = payload.decode("utf-8", "replace")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def fds(self) -> list[int]:
        """What to select on for reading (stdout, control); empty once closed."""
        return [] if self.proc is None else [self.stdout_fd, self._ctl_r]

    def run(self, code: bytes, single: bool = False) -> None:
        """Start ``code`` (file input; ``single``: the friendly REPL's single input)."""
        n = len(code)
        hdr = bytes((REQ_SINGLE if single else REQ_EXEC,)) + n.to_bytes(4, "little")
        try:
            _write_all(self._req_w, hdr + code)
        except OSError as e:
            raise ReplError(f"the REPL's interpreter went away: {e}") from e

    def interrupt(self) -> None:
        """Ctrl-C: KeyboardInterrupt in the running code."""
        if self.alive:
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signal.SIGINT)

    def read_stdout(self, n: int = 65536) -> bytes:
        if self.proc is None:
            return b""
        return _read_available(self.stdout_fd, n)

    def messages(self) -> list[tuple[int, bytes]]:
        """Whole control messages that arrived (kind, payload)."""
        if self.proc is None:
            return []
        self._ctl_buf += _read_available(self._ctl_r)
        out = []
        buf = self._ctl_buf
        while len(buf) >= 5:
            n = int.from_bytes(buf[1:5], "little")
            if len(buf) < 5 + n:
                break
            out.append((buf[0], buf[5 : 5 + n]))
            buf = buf[5 + n :]
        self._ctl_buf = buf
        return out

    def close(self) -> None:
        p = self.proc
        if p is None:
            return
        self.proc = None
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
        with contextlib.suppress(OSError):
            p.stdout.close()
        for fd in (self._req_w, self._ctl_r):
            with contextlib.suppress(OSError):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# --------------------------------------------------------------------------- the REPL


class Repl:
    """The REPL's side of the port (see the module docstring).

    ``spawn()`` returns a started :class:`Interpreter` (or anything with its
    interface); it is called now and at every soft reset. The owner feeds host bytes
    to :meth:`feed`, calls :meth:`poll` when the interpreter's ``fds`` are readable
    (or now and then), sends :meth:`take_output` to the host and, once :attr:`action`
    is set (``"soft"``: a soft reset from the friendly REPL, the board runs main.py;
    ``"reset"``: ``machine.reset()``), restarts the firmware and :meth:`close` s this.
    ``notify(kind, why)`` hears what the MCU does meanwhile (``"soft_reset"``).
    """

    def __init__(self, spawn: Callable[[], Interpreter], notify=None):
        self._spawn = spawn
        self._notify = notify
        self.interp = spawn()
        self.mode = FRIENDLY
        self.line = bytearray()  # the friendly line being edited, or the raw line
        self.cont = b""  # friendly: the lines of a compound statement so far
        self.out = bytearray()
        self.pending = bytearray()  # host bytes that arrived while code ran
        self.busy: str | None = None  # the mode that started the running code
        self.action: str | None = None
        self.dropped = 0  # host bytes dropped (over MAX_PENDING or MAX_CODE)
        self._esc = 0  # friendly: 1 after ESC, 2 after ESC [, 3 after ESC [ digit
        self._cr = False  # friendly: the last byte was CR (a CRLF's LF is no new line)
        self._window = WINDOW
        self.last_error = ""
        self.closed = False

    # -- API ---------------------------------------------------------------------
    @property
    def banner(self) -> bytes:
        version = getattr(self.interp, "version", "") or "v?"
        return (
            f'MicroPython {version}; {MACHINE}\r\nType "help()" for more information.\r\n'
        ).encode()

    @property
    def fds(self) -> list[int]:
        return [] if self.closed or self.interp is None else list(self.interp.fds)

    def start(self, preamble: bytes = b"") -> None:
        """What the board prints on arriving at the REPL: ``preamble`` (main.py's
        output, a traceback), the banner and the prompt."""
        self.out += cooked(preamble) + self.banner + PS1

    def feed(self, data: bytes) -> None:
        for c in bytes(data):
            if self.closed or self.action:
                self.dropped += 1
            elif self.busy is not None:
                if c == CTRL_C:
                    if self.interp is not None:
                        self.interp.interrupt()
                elif len(self.pending) < MAX_PENDING:
                    self.pending.append(c)
                else:
                    self.dropped += 1
            else:
                self._char(c)

    def poll(self) -> None:
        """Take the interpreter's output; when the code is done, finish it and go on
        with the bytes that waited."""
        if self.closed or self.interp is None:
            return
        msgs = self.interp.messages()
        self.out += cooked(self.interp.read_stdout())
        for kind, payload in msgs:
            if kind == MSG_DONE and self.busy is not None:
                self.out += cooked(self.interp.read_stdout())  # written before the message
                self._done(payload[:1] or b"\x01", payload[1:])
            elif kind == MSG_RESET:
                self.out += cooked(self.interp.read_stdout())
                self.action = "reset"
        if self.busy is not None and not self.interp.alive and not self.action:
            self.out += cooked(self.interp.read_stdout())
            code = self.interp.proc.returncode if self.interp.proc is not None else None
            self._restart_interp()
            why = f"the interpreter stopped (exit status {code}); a fresh one runs now\n"
            self._done(bytes((DONE_ERROR,)), why.encode())
        while self.pending and self.busy is None and not self.action:
            data = bytes(self.pending)
            self.pending.clear()
            self.feed(data)

    def take_output(self) -> bytes:
        out = bytes(self.out)
        self.out.clear()
        return out

    def close(self) -> None:
        self.closed = True
        if self.interp is not None:
            self.interp.close()
            self.interp = None

    # -- the modes ---------------------------------------------------------------
    def _char(self, c: int) -> None:
        if self.mode == RAW:
            self._raw(c)
        elif self.mode == RAW_PASTE:
            self._raw_paste(c)
        elif self.mode == PASTE:
            self._paste(c)
        else:
            self._friendly(c)

    def _friendly(self, c: int) -> None:
        cr, self._cr = self._cr, c == 13
        # escape sequences as MicroPython's readline takes them (arrows, Home, Del):
        # ESC, '[' or 'O', an optional digit, one final byte; all of it ignored here
        if self._esc == 1:
            self._esc = 2 if c in (0x5B, 0x4F) else 0
            return
        if self._esc == 2:
            self._esc = 3 if 0x30 <= c <= 0x39 else 0
            return
        if self._esc == 3:
            self._esc = 0
            return
        empty = not self.line
        if c == 27:
            self._esc = 1
        elif c == CTRL_C:
            self.out += b"\r\n" + PS1
            self.line.clear()
            self.cont = b""
        elif c == CTRL_A and empty and not self.cont:
            self.out += b"\r\n" + RAW_BANNER + b">"
            self.mode = RAW
        elif c == CTRL_B and empty and not self.cont:
            self.out += b"\r\n" + self.banner + PS1
        elif c == CTRL_D and empty:
            if self.cont:  # ends the compound statement
                self.out += b"\r\n"
                self._exec_friendly(self.cont)
            else:
                self.out += b"\r\n" + SOFT_REBOOT
                self.action = "soft"
        elif c == CTRL_E and empty and not self.cont:
            self.out += PASTE_BANNER
            self.mode = PASTE
        elif c == 13 or (c == 10 and not cr):
            self.out += b"\r\n"
            self._enter()
        elif c in (8, 127):
            if self.line:
                self.line.pop()
                self.out += b"\b \b"
        elif c == 9:
            self._insert(b"    ")
        elif c >= 32 and c != 127:
            self._insert(bytes((c,)))
        # other control bytes: ignored, as readline does

    def _insert(self, data: bytes) -> None:
        if len(self.line) + len(data) > MAX_CODE:
            self.dropped += len(data)
            return
        self.line += data
        self.out += data

    def _enter(self) -> None:
        line = bytes(self.line)
        self.line.clear()
        if not self.cont and not line:
            self.out += PS1
            return
        src = self.cont + line
        if continue_with_input(src):
            self.cont = src + b"\n"
            self.out += PS2
            return
        self._exec_friendly(src)

    def _exec_friendly(self, src: bytes) -> None:
        self.cont = b""
        self._exec(src, single=True)

    def _paste(self, c: int) -> None:
        if c == CTRL_C:
            self.out += b"\r\n" + PS1
            self.line.clear()
            self.mode = FRIENDLY
        elif c == CTRL_D:
            self.out += b"\r\n"
            src = bytes(self.line)
            self.line.clear()
            self.mode = FRIENDLY
            self._exec(src, single=False, busy=FRIENDLY)
        elif len(self.line) >= MAX_CODE:
            self.dropped += 1
        else:
            self.line.append(c)
            self.out += b"\r\n=== " if c == 13 else bytes((c,))

    def _raw(self, c: int) -> None:
        if c == CTRL_A:
            if len(self.line) == 2 and self.line[0] == CTRL_E:
                ok = self.line[1] == ord("A")
                self.line.clear()
                if ok:  # raw-paste mode: R\x01, the window, and a second window free
                    self.out += b"R\x01" + WINDOW.to_bytes(2, "little") + b"\x01"
                    self._window = WINDOW
                    self.mode = RAW_PASTE
                else:
                    self.out += b"R\x00>"
                return
            self.line.clear()
            self.out += RAW_BANNER + b">"
        elif c == CTRL_B:
            self.line.clear()
            self.out += b"\r\n" + self.banner + PS1
            self.mode = FRIENDLY
            self.cont = b""
        elif c == CTRL_C:
            self.line.clear()
        elif c == CTRL_D:
            self.out += b"OK"
            src = bytes(self.line)
            self.line.clear()
            if not src:
                self.out += b"\r\n"
                self._soft_reset_raw()
            else:
                self._exec(src, single=False)
        elif len(self.line) >= MAX_CODE:
            self.dropped += 1
        else:
            self.line.append(c)

    def _raw_paste(self, c: int) -> None:
        if c == CTRL_D:
            self.out += b"\x04"  # end of the code seen
            src = bytes(self.line)
            self.line.clear()
            self.mode = RAW
            self._exec(src, single=False, busy=RAW_PASTE)
        elif c == CTRL_C:  # KeyboardInterrupt while reading: nothing runs
            self.line.clear()
            self.mode = RAW
            self.out += b"\x04\x04" + b"KeyboardInterrupt: \r\n" + b"\x04>"
        else:
            if len(self.line) < MAX_CODE:
                self.line.append(c)
            else:
                self.dropped += 1
            self._window -= 1
            if self._window == 0:
                self.out += b"\x01"
                self._window = WINDOW

    # -- running code ------------------------------------------------------------
    def _exec(self, src: bytes, single: bool, busy: str | None = None) -> None:
        self.busy = busy or self.mode
        if (self.interp is None or not self.interp.alive) and not self._restart_interp():
            self._done(bytes((DONE_ERROR,)), f"{self.last_error}\n".encode())
            return
        try:
            self.interp.run(src, single=single)
        except ReplError as e:
            self._restart_interp()
            self._done(bytes((DONE_ERROR,)), f"{e}\n".encode())

    def _done(self, status: bytes, err: bytes) -> None:
        mode, self.busy = self.busy, None
        st = status[0]
        if mode in (RAW, RAW_PASTE):
            self.out += b"\x04" + cooked(err if st == DONE_ERROR else b"") + b"\x04"
            if st == DONE_EXIT:
                self._soft_reset_raw()
            else:
                self.out += b">"
            return
        if st == DONE_EXIT:
            self.out += SOFT_REBOOT
            self.action = "soft"
            return
        if st == DONE_ERROR:
            self.out += cooked(err)
        self.out += PS1

    def _soft_reset_raw(self) -> None:
        """A soft reset in the raw REPL: a fresh interpreter, no main.py, raw again."""
        self.out += SOFT_REBOOT
        self._restart_interp()
        if self._notify is not None:
            self._notify("soft_reset", "in the raw REPL: a fresh interpreter, main.py not run")
        self.out += RAW_BANNER + b">"

    def _restart_interp(self) -> bool:
        """A fresh interpreter (False, with ``last_error``, if none would start)."""
        if self.interp is not None:
            self.interp.close()
        try:
            self.interp = self._spawn()
        except ReplError as e:
            self.interp = None
            self.last_error = str(e)
            log.warning("virtual MCU REPL: %s", e)
            return False
        return True
