"""The ``[qemu-arm]`` column of the DUAL test modules (registered by conftest.py).

Every ``DUAL = True`` module gets, besides its ``[micropython]`` items, one
``<name>[qemu-arm]`` item per test function, run on 32-bit ARM: MicroPython's qemu
port (MPS2_AN385, a Cortex-M3 like NETDUINO2 with the RAM the tests were written for;
firmware/qemu.py says why) with the firmware and the test modules frozen in. One
qemu process runs a whole module through tests/_mpy_runner.py; its results are
cached and each item reports its own, failures with the MicroPython traceback.

The image is built on the first ``[qemu-arm]`` item to run (about a minute on 2
cores) and cached under build/mp-cache/ by a hash of its inputs, so the next run
finds it; meanwhile the suite's other tests run (the column runs in a background
thread, one qemu process at a time). Without the MicroPython source or the ARM
toolchain the column is not collected and the terminal summary says, in one line, how
to enable it; with ``CI=true`` it is always collected, so there its items fail
instead. ``QEMU_ARM=1``/``0`` switches the column on or off (``DEFAULT_ON`` below).
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from conftest import (
    SUFFIX as MPY_SUFFIX,
)
from conftest import (
    TAIL_LINES,
    MicroPythonModule,
    ModuleRun,
    _display_path,
    _tail,
    parse_dual_module,
    parse_output,
)

from firmware import mpsource, qemu

SUFFIX = "[qemu-arm]"
#: On wherever the toolchain and the MicroPython source are (elsewhere the summary says
#: in one line how to enable it); ``QEMU_ARM=0`` switches it off for a quick run.
#: .ci/run requires [qemu-arm] items while it is on.
DEFAULT_ON = True
#: qemu emulates the Cortex-M3 several times slower than the unix port runs natively.
TIMEOUT_FACTOR = 3


class QemuModule(MicroPythonModule):
    suffix = SUFFIX
    label = "MicroPython on qemu-arm"
    column: QemuColumn

    def module_run(self) -> ModuleRun:
        if self._run is None:
            self._run = self.column.result(self)
        return self._run


class QemuColumn:
    def __init__(self, config) -> None:
        self.config = config
        self._reason: list[str | None] = []  # computed once, only when switched on
        self.ci = _truthy(os.environ.get("CI", ""))
        self._image: mpsource.Build | None = None
        self._image_error: str | None = None
        self.passed = self.failed = 0
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[str, Future] = {}
        self._by_path: dict[str, QemuModule] = {}  # xdist: files whose qemu run waits

    @property
    def reason(self) -> str | None:
        """Why the column cannot run here (None: it can). Finding the source may
        unpack ../shared's tarball into build/, so it is looked up only when needed."""
        if not self._reason:
            self._reason.append(qemu.unavailable())
        return self._reason[0]

    @property
    def switched_on(self) -> bool:
        value = os.environ.get("QEMU_ARM", "")
        return _truthy(value) if value else DEFAULT_ON

    @property
    def enabled(self) -> bool:
        return self.switched_on and (self.reason is None or self.ci)

    # ------------------------------------------------------------------ collection

    @pytest.hookimpl(trylast=True)
    def pytest_collect_file(self, file_path, parent):
        if not self.enabled or file_path.suffix != ".py" or not file_path.name.startswith("test_"):
            return None
        if file_path.parent not in (qemu.TESTS_DIR, qemu.TESTS_DIR / "qemu"):
            return None  # only tests/ is frozen into the image
        info = parse_dual_module(file_path)
        if info is None:
            return None
        collector = QemuModule.from_parent(parent, path=file_path)
        collector.info = info
        collector.column = self
        return collector

    # ------------------------------------------------------------------ running

    def pytest_collection_finish(self, session) -> None:
        """Start the column in the background, in collection order: one qemu process
        at a time runs beside the rest of the suite (which mostly waits on
        subprocesses too), so the column costs little extra wall time."""
        modules = {}
        for item in session.items:
            parent = item.parent
            if isinstance(parent, QemuModule):
                modules.setdefault(parent.nodeid, parent)
        if not modules:
            return
        if self.reason is None:
            qemu.plan()  # its ast parsing here, in the main thread (qemu.plan says why)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qemu-arm")
        if hasattr(session.config, "workerinput"):
            # a pytest-xdist worker collects every item but runs only the files it is
            # sent (--dist loadfile): the image is built in the background now (the
            # workers share one build: mpsource's lock), and a module's qemu run starts
            # in the background with the first item of its file (pytest_runtest_setup)
            self._pool.submit(self.image)
            self._by_path = {str(mod.path): mod for mod in modules.values()}
            return
        for nodeid, mod in modules.items():
            self._futures[nodeid] = self._pool.submit(self.run_module, mod.path, mod.info)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item) -> None:
        """Under pytest-xdist: the first item of a file starts that file's qemu run
        beside its CPython and MicroPython items."""
        mod = self._by_path.pop(str(item.path), None)
        if mod is not None and self._pool is not None:
            self._futures[mod.nodeid] = self._pool.submit(self.run_module, mod.path, mod.info)

    def pytest_sessionfinish(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def result(self, module: QemuModule) -> ModuleRun:
        future = self._futures.get(module.nodeid)
        if future is None:  # collected but not started (e.g. run by a plugin): run now
            return self.run_module(module.path, module.info)
        return future.result()

    def image(self) -> mpsource.Build | None:
        if self._image is None and self._image_error is None:
            if self.reason is not None:
                self._image_error = "the qemu-arm column cannot run here: " + self.reason
            else:
                try:
                    self._image = qemu.image(qemu.MPS2_AN385)
                except (mpsource.BuildError, mpsource.SourceMissing, OSError) as e:
                    self._image_error = f"building the qemu-arm image failed: {e}"
        return self._image

    def run_module(self, path, info) -> ModuleRun:
        build = self.image()
        if build is None:
            return ModuleRun(setup_error=self._image_error)
        token = uuid.uuid4().hex[:12]
        args = ["", token, _display_path(path)] + [name for name, _ in info.tests]
        code = f"import _mpy_runner\n_mpy_runner.main({args!r})"
        timeout = info.timeout_s * TIMEOUT_FACTOR
        try:
            with qemu.Session(build.artefacts["elf"], target=qemu.MPS2_AN385) as session:
                try:
                    res = session.run(code, timeout_s=timeout)
                    text, err = res.out, res.err
                except qemu.QemuError as e:
                    text = session.transcript.decode("utf-8", "replace").replace("\r\n", "\n")
                    err = str(e)
        except qemu.QemuError as e:  # the target did not boot
            return ModuleRun(setup_error=f"the qemu-arm target did not start: {e}")
        run = parse_output(text, token)
        if err and run.setup_error is None:
            run.died = run.died or "raised outside the tests"
            run.tail = f"--- target (last {TAIL_LINES} lines) ---\n{_tail(text)}\n{_tail(err)}"
        elif run.died is not None:
            run.tail = f"--- target (last {TAIL_LINES} lines) ---\n{_tail(text)}"
        return run

    # ------------------------------------------------------------------ reporting

    def pytest_runtest_logreport(self, report) -> None:
        if not report.nodeid.endswith(SUFFIX):
            return
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failed += 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.switched_on:
            terminalreporter.write_line("qemu-arm: column off (QEMU_ARM=0; unset it to turn it on)")
        elif not self.enabled:
            terminalreporter.write_line(
                f"qemu-arm: column not run ({self.reason}). To enable it: {ENABLE_HELP}"
            )
        elif self.passed + self.failed:
            terminalreporter.write_line(
                f"qemu-arm: {self.passed} passed, {self.failed} failed (items named "
                f"*{SUFFIX}, run on MicroPython's qemu port, Cortex-M3, beside *{MPY_SUFFIX})"
            )


ENABLE_HELP = (
    "install gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm, and point "
    "MICROPY_DIR at a MicroPython v1.28.0 checkout (or `make micropython`)"
)


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes")
