"""The 32-bit ARM test target: MicroPython's qemu port with the firmware frozen in.

``image(target)`` builds (once per set of inputs, :func:`firmware.mpsource.cached_build`)
the qemu port for a Cortex-M3 board (32-bit words and small ints, the armv7m
instruction set): ``NETDUINO2`` (an STM32F205 with a 96 KB heap, the budget's target)
or ``MPS2_AN385`` (the test column's, with 4 MB of RAM), with littlefs, and frozen
into it:

- the firmware, the files ``modbridge flash`` deploys for every board
  (``firmware_sources``), plus the host-only modules the DUAL tests import;
- every DUAL test module (tests/conftest.py), their helpers from tests/, the
  MicroPython test runner (tests/_mpy_runner.py), the firmware benchmark's target
  side (bench/mpy_firmware_bench.py and its fake ``machine``, bench/fakemachine.py)
  and tests/qemu/ (the boot module);
- ``_repo_files``: the repository files DUAL tests read (``read_repo_file``) as
  bytes constants, which stay in flash.

:class:`Session` runs the image under ``qemu-system-arm`` and drives its raw REPL
over stdio (Ctrl-A, code, Ctrl-D; the answer is ``OK``, output, ``\\x04``, error,
``\\x04``). ``icount=True`` adds ``-icount shift=0``: one guest instruction is one
nanosecond of virtual time, so time measured on the target counts instructions
deterministically (bench/bench_arm.py).

Facts of the port this works around: no ``sys.argv``, no ``os.getenv``, no
``os.urandom`` (the build turns it on); only VfsRom unless built with
``MICROPY_VFS_LFS2=1``, which needs ``mp_hal_time_ns`` (the user C module
firmware/qemu_cmod) and an ``.ARM.exidx`` placement in mcu/arm/stm32.ld (a patched
copy under build/, never the tree's file).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import mpsource, stm32


@dataclass(frozen=True)
class Target:
    """A qemu board: the port's BOARD, qemu's -machine, heap and RAM-disk sizes."""

    board: str
    machine: str
    heap_size: int
    ramdisk_bytes: int


#: The budget's target (bench/bench_arm.py): an STM32F205 with 128 KB of RAM, 96 KB
#: of it heap, like what MicroPython leaves on an STM32F411.
NETDUINO2 = Target("NETDUINO2", "netduino2", 98304, 16 * 1024)
#: The test column's target: the same Cortex-M3 core and armv7m code with 4 MB of RAM.
#: The DUAL tests were written for the unix port's 4 MB heap (fuzzing with 100 KB
#: inputs, 64 KB fake-board buffers, dozens of config files); in NETDUINO2's 128 KB
#: a fifth of them fail for memory alone, which says nothing about the firmware.
MPS2_AN385 = Target("MPS2_AN385", "mps2-an385", 2 * 1024 * 1024, 512 * 1024)
BOARD = NETDUINO2.board
HEAP_SIZE = NETDUINO2.heap_size
REPO_ROOT = mpsource.REPO_ROOT
TESTS_DIR = REPO_ROOT / "tests"
CMOD_DIR = Path(__file__).resolve().parent / "qemu_cmod"
GEN_DIR = mpsource.BUILD_ROOT / "qemu-gen"  # generated manifest, linker script, data
MAKE_VARS = {
    "MICROPY_PY_BTREE": "0",  # lib/berkeley-db-1.xx is not in the shared source
    "MICROPY_VFS_LFS2": "1",
    # The port's default is single precision, like the F4 boards' hardware floats;
    # the DUAL tests carry float64 vectors (1e300, CBOR's f64 encodings) that cannot
    # even be frozen as single-precision constants. The firmware's tick uses no floats
    # (fixed point) and a float object takes one 16-byte heap block either way, so
    # the heap and instruction figures do not depend on this choice.
    "MICROPY_FLOAT_IMPL": "double",
}
#: MicroPython's pystack, the same size as on the stm32 boards (firmware/stm32.py's
#: PYSTACK_WORDS says why that size and what running out does): every bytecode call's
#: frame comes from this fixed static array, never from the GC heap, so neither the
#: tick's instruction count nor the heap's fragmentation depends on per-call frames.
#: qemu_board.h hooks its init into mp_init (MICROPY_PORT_INIT_FUNC).
PYSTACK_WORDS = stm32.PYSTACK_WORDS
#: Packages whose modules may be frozen -> the folder holding each: the firmware's
#: trees, and of modbridge only the host-side halves of the firmware's packages that
#: the DUAL tests import (modbridge.firmware_host, MicroPython-clean, and
#: modbridge/__init__.py, which runs there); the rest of modbridge is CPython's.
PACKAGES = {
    "device": REPO_ROOT,
    "protocol": REPO_ROOT,
    "boards": REPO_ROOT,
    "modbridge": REPO_ROOT / "host",
}
MODBRIDGE_FROZEN = "modbridge.firmware_host"
#: Folders of top-level modules the DUAL tests import (host/modbridge/sim/link.py is
#: dual-interpreter code that test_sim_board.py imports as ``link``).
TOP_LEVEL_DIRS = (TESTS_DIR, REPO_ROOT / "host" / "modbridge" / "sim")
EXTRA_TOP_LEVEL = (
    TESTS_DIR / "_mpy_runner.py",
    REPO_ROOT / "bench" / "mpy_firmware_bench.py",
    REPO_ROOT / "bench" / "fakemachine.py",  # the board HAL's machine (heap_board)
    TESTS_DIR / "qemu" / "_qemu_boot.py",
)
QEMU = "qemu-system-arm"
READY = b"raw REPL; CTRL-B to exit\r\n>"


class QemuError(RuntimeError):
    """The target did not answer as expected; the message has what it printed."""


def unavailable() -> str | None:
    """None if the image can be built and run here, else one line saying how to
    enable it (the source or the toolchain is missing)."""
    try:
        mpsource.source_dir()
    except mpsource.SourceMissing as e:
        return str(e)
    return mpsource.toolchain_missing("qemu")


# --------------------------------------------------------------------------- selection


def dual_modules() -> list[Path]:
    """The DUAL test modules (``DUAL = True`` at top level), sorted."""
    out = []
    for path in sorted([*TESTS_DIR.glob("test_*.py"), *TESTS_DIR.glob("qemu/test_*.py")]):
        tree = ast.parse(path.read_bytes())
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["DUAL"]
                and isinstance(node.value, ast.Constant)
                and node.value.value is True
            ):
                out.append(path)
                break
    return out


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module_file(name: str) -> Path | None:
    """The repository file of module ``name`` (a firmware package's module, or a
    top-level helper in tests/), or None for anything else (stdlib, micropython)."""
    parts = name.split(".")
    if (
        parts[0] == "modbridge"
        and name != "modbridge"
        and not (name == MODBRIDGE_FROZEN or name.startswith(MODBRIDGE_FROZEN + "."))
    ):
        return None
    if parts[0] in PACKAGES:
        base = PACKAGES[parts[0]].joinpath(*parts)
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand
        return None
    if len(parts) == 1:
        for directory in TOP_LEVEL_DIRS:
            if (directory / f"{name}.py").is_file():
                return directory / f"{name}.py"
    return None


def plan() -> None:
    """Work out what the image freezes (the two functions below), here and once.

    They parse the repository's Python with :mod:`ast`; CPython 3.11 keeps ast's
    recursion depth in state shared by threads, so a parse in a background thread
    beside one in another thread (pytest's assertion rewriting, hypothesis reading a
    lambda) can fail with ``SystemError: AST constructor recursion depth mismatch``.
    The qemu-arm column calls this in pytest's main thread before it builds the
    image in its own thread."""
    frozen_files()
    repo_files_read()


def frozen_files() -> tuple[list[Path], list[Path]]:
    """(package files, top-level files) to freeze: the deployed firmware of every
    board, and everything the DUAL modules and the extra top-level modules import,
    transitively (package ``__init__``s included)."""
    packaged, top = _frozen_files()
    return list(packaged), list(top)


@functools.cache  # once a process: plan() says why
def _frozen_files() -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    from modbridge.tools import flash

    todo = [
        REPO_ROOT / rel for board in flash.board_names() for rel in flash.firmware_sources(board)
    ]
    todo += dual_modules() + list(EXTRA_TOP_LEVEL)
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            found = _module_file(name)
            if found is not None:
                todo.append(found)
            parts = name.split(".")
            for i in range(1, len(parts)):  # parent packages
                init = _module_file(".".join(parts[:i]))
                if init is not None:
                    todo.append(init)
    packaged = sorted(p for p in seen if _package_root(p) is not None)
    top = sorted(p for p in seen if p not in packaged)
    return tuple(packaged), tuple(top)


def _package_root(path: Path) -> Path | None:
    """The folder of ``path``'s top package (:data:`PACKAGES`), None for a top-level
    module."""
    for name, root in PACKAGES.items():
        if path.is_relative_to(root / name):
            return root
    return None


def repo_files_read() -> list[str]:
    """Repository paths the DUAL modules pass to ``read_repo_file("...")``."""
    return list(_repo_files_read())


@functools.cache  # once a process: plan() says why
def _repo_files_read() -> tuple[str, ...]:
    out = set()
    for path in dual_modules():
        for node in ast.walk(ast.parse(path.read_bytes())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "read_repo_file"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                out.add(node.args[0].value)
    return tuple(sorted(out))


# --------------------------------------------------------------------------- build


_LDSCRIPTS = {"NETDUINO2": "stm32.ld", "MPS2_AN385": "mps2.ld"}


def _linker_script(src: Path, target: Target) -> Path:
    """The board's mcu/arm/*.ld with ``.ARM.exidx`` kept inside .text (littlefs's
    code brings unwind tables; the stock scripts have no place for them)."""
    name = _LDSCRIPTS[target.board]
    text = (src / "ports" / "qemu" / "mcu" / "arm" / name).read_text()
    anchor = "        *(.rodata*)\n"
    if ".ARM.exidx" in text:  # mps2.ld has its place already
        anchor = ""
    elif anchor not in text:
        raise mpsource.BuildError(f"mcu/arm/{name} changed: cannot place .ARM.exidx")
    if anchor:
        text = text.replace(anchor, anchor + "        *(.ARM.exidx*)\n", 1)
    out = GEN_DIR / name.replace(".ld", "_exidx.ld")
    _write_if_changed(out, text)
    return out


def _write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)  # atomic: a concurrent build never reads half a file


def write_manifest() -> Path:
    """Generate the manifest (and ``_repo_files.py``) under build/qemu-gen/<key>/.

    ``key`` hashes what the manifest names (each module's path, which carries the
    checkout's root) and the repository files it freezes, so two checkouts sharing one
    build directory (git worktrees, an installed wheel's cache beside a checkout) never
    write the same file: with one shared manifest.py, a build could hash and freeze the
    other checkout's firmware when both wrote it before either took the build lock."""
    packaged, top = frozen_files()
    lines = [f"{rel!r}: {(REPO_ROOT / rel).read_bytes()!r}," for rel in repo_files_read()]
    files_py = (
        '"""Repository files the DUAL tests read, frozen (firmware/qemu.py)."""\n\n'
        "FILES = {\n" + "".join(f"    {line}\n" for line in lines) + "}\n"
    )
    modules = []
    for path in packaged:
        root = _package_root(path)
        rel = path.relative_to(root).as_posix()
        modules.append(f"module({rel!r}, base_path={str(root)!r})")
    for path in top:
        modules.append(f"module({path.name!r}, base_path={str(path.parent)!r})")
    key = hashlib.sha256("\n".join([files_py, *modules]).encode()).hexdigest()[:16]
    gen = GEN_DIR / key
    data = gen / "data"
    _write_if_changed(data / "_repo_files.py", files_py)
    out = [
        "# Generated by firmware/qemu.py: the qemu test target's frozen modules.",
        f"module('_repo_files.py', base_path={str(data)!r})",
        *modules,
    ]
    manifest = gen / "manifest.py"
    _write_if_changed(manifest, "\n".join(out) + "\n")
    return manifest


def image(target: Target = NETDUINO2) -> mpsource.Build:
    """The qemu image for ``target`` (built, or found in the cache)."""
    src = mpsource.source_dir()
    ld = _linker_script(src, target)
    cmod = sorted(p for p in CMOD_DIR.rglob("*") if p.is_file())
    make_vars = dict(MAKE_VARS, MICROPY_HEAP_SIZE=str(target.heap_size))
    make_vars.update(LDSCRIPT=str(ld), USER_C_MODULES=str(CMOD_DIR))
    header = CMOD_DIR / "qemu_board" / "qemu_board.h"
    time_h = CMOD_DIR / "qemu_board" / "qemu_time.h"
    make_vars["CFLAGS_EXTRA"] = (
        f"-DMICROPY_PY_OS_URANDOM=1 -DQEMU_RAMDISK_BYTES={target.ramdisk_bytes} -include {header}"
        " -DMICROPY_PY_TIME_GMTIME_LOCALTIME_MKTIME=1"
        f" -DMICROPY_PY_TIME_TIME_TIME_NS=1 -DMICROPY_PY_TIME_INCLUDEFILE='\"{time_h}\"'"
        # the pystack: qemu_board.h hooks its init into mp_init (MICROPY_PORT_INIT_FUNC)
        f" -DMICROPY_ENABLE_PYSTACK=1 -DQEMU_PYSTACK_WORDS={PYSTACK_WORDS}"
    )
    return mpsource.cached_build(
        "qemu", target.board, make_vars, write_manifest(), inputs=[ld, *cmod], src=src
    )


# --------------------------------------------------------------------------- running


@dataclass
class Result:
    out: str
    err: str  # the exception's traceback, "" if the code ran to its end


class Session:
    """One qemu process with the image; ``run(code)`` executes code in its raw REPL.

    Use as a context manager. ``boot=True`` first runs ``import _qemu_boot`` (the
    littlefs at ``/``)."""

    def __init__(
        self, elf: Path, icount: bool = False, boot: bool = True, target: Target = NETDUINO2
    ):
        cmd = [QEMU, "-machine", target.machine, "-nographic", "-monitor", "null"]
        cmd += ["-serial", "stdio", "-semihosting", "-kernel", str(elf)]
        if icount:
            cmd += ["-icount", "shift=0,align=off,sleep=off"]
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self._buf = b""
        self.transcript = bytearray()  # everything the target said, for errors
        try:
            self._read_until(b">>> ", 30)  # booted: the UART now receives
            self._send(b"\r\x01")  # enter the raw REPL
            self._read_until(READY, 30)
            if boot:
                self.check("import _qemu_boot")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()

    def _send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def _read_until(self, marker: bytes, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while marker not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QemuError(
                    f"no {marker!r} from the target within {timeout_s:g} s" + self._tail()
                )
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise QemuError(f"qemu exited (code {self.proc.poll()})" + self._tail())
            self._buf += chunk
            self.transcript += chunk
        i = self._buf.index(marker)
        got, self._buf = self._buf[:i], self._buf[i + len(marker) :]
        return got

    def _tail(self) -> str:
        text = bytes(self.transcript[-3000:]).decode("utf-8", "replace")
        return f"\ncommand: {' '.join(self.cmd)}\n--- target output (end) ---\n{text}"

    def run(self, code: str, timeout_s: float = 300) -> Result:
        """Execute ``code``; its output and traceback (``\\r\\n`` made ``\\n``)."""
        self._send(code.encode() + b"\x04")
        head = self._read_until(b"OK", 30)
        if head.strip(b">\r\n"):
            raise QemuError(f"raw REPL refused the code: {head!r}" + self._tail())
        out = self._read_until(b"\x04", timeout_s)
        err = self._read_until(b"\x04", 30)
        self._read_until(b">", 30)

        def text(b: bytes) -> str:
            return b.decode("utf-8", "replace").replace("\r\n", "\n")

        return Result(text(out), text(err))

    def check(self, code: str, timeout_s: float = 300) -> str:
        """``run`` that raises :class:`QemuError` on an exception; returns the output."""
        res = self.run(code, timeout_s)
        if res.err:
            raise QemuError(f"{code!r} raised on the target:\n{res.err}{res.out}")
        return res.out
