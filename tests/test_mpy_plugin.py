"""CPython-only tests of the MicroPython plugin in conftest.py, through pytester."""

import shutil
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).parent
PLUGIN_FILES = (
    "conftest.py",
    "_mpy_runner.py",
    "_mpy_bytecode.py",
    "mpcompat.py",
    "_qemu_column.py",
    "slowtier.py",
)


@pytest.fixture
def project(pytester, monkeypatch):
    """A scratch project with a copy of the plugin in its tests/ directory (the
    [qemu-arm] column's half imports ``firmware`` from the repository root)."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR.parent))
    tests = pytester.mkdir("tests")
    for name in PLUGIN_FILES:
        shutil.copy(TESTS_DIR / name, tests / name)
    # -p no:cloudcoil as pyproject.toml's addopts: that plugin fails to load here (filelock)
    pytester.makeini("[pytest]\ntestpaths = tests\naddopts = -p no:cacheprovider -p no:cloudcoil\n")
    return tests


def test_failing_dual_test_reports_micropython_traceback(pytester, project):
    (project / "test_demo.py").write_text(
        "import sys\n"
        "DUAL = True\n"
        "\n"
        "def test_ok():\n"
        "    print('partial line', end='')\n"
        "    assert 1 + 1 == 2\n"
        "\n"
        "def helper():\n"
        "    raise ValueError('deliberate on ' + sys.implementation.name)\n"
        "\n"
        "def test_bad():\n"
        "    helper()\n"
        "\n"
        "def test_fails_only_on_micropython():\n"
        "    assert sys.implementation.name != 'micropython', 'mpy-only failure'\n"
    )
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines(
        [
            "PASSED tests/test_demo.py::test_ok?micropython?",
            "FAILED tests/test_demo.py::test_bad?micropython?*",
            "FAILED tests/test_demo.py::test_fails_only_on_micropython?micropython?*",
        ],
        consecutive=False,
    )
    # MicroPython's own traceback, naming the file and the helper frame.
    result.stdout.fnmatch_lines(
        [
            "*MicroPython traceback:*",
            '*File "tests/test_demo.py", line 9, in helper*',
            "ValueError: deliberate on micropython",
        ]
    )
    result.stdout.fnmatch_lines(["AssertionError: mpy-only failure"])
    result.stdout.fnmatch_lines(["micropython: 1 passed, 2 failed*"])


def test_interpreter_crash_fails_the_remaining_items(pytester, project):
    (project / "test_crash.py").write_text(
        "from mpcompat import IS_MICROPYTHON\n"
        "DUAL = True\n"
        "\n"
        "def test_before():\n"
        "    pass\n"
        "\n"
        "def test_crash():\n"
        "    print('about to crash')\n"
        "    if IS_MICROPYTHON:\n"
        "        import uctypes\n"
        "        uctypes.bytearray_at(0, 4)[0]  # reads address 0: SIGSEGV\n"
        "\n"
        "def test_after():\n"
        "    pass\n"
    )
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines(["PASSED tests/test_crash.py::test_before?micropython?"])
    result.stdout.fnmatch_lines(
        ["*MicroPython killed by signal 11 while running this test.*", "*about to crash*"]
    )
    result.stdout.fnmatch_lines(
        ["*did not run: MicroPython killed by signal 11 during test_crash.*"]
    )


def test_timeout_fails_the_items(pytester, project):
    (project / "test_slow.py").write_text(
        "import time\n"
        "from mpcompat import IS_MICROPYTHON\n"
        "DUAL = True\n"
        "MPY_TIMEOUT = 2\n"
        "\n"
        "def test_hangs():\n"
        "    if IS_MICROPYTHON:\n"
        "        time.sleep(60)\n"
    )
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*MicroPython timed out after 2 s*"])


def test_missing_interpreter_fails_rather_than_skips(pytester, project, monkeypatch):
    monkeypatch.setenv("MICROPYTHON", str(pytester.path / "no-such-micropython"))
    (project / "test_dual.py").write_text("DUAL = True\n\ndef test_a():\n    pass\n")
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*MicroPython interpreter not found*Run `make test`*"])


def test_module_without_dual_flag_runs_on_cpython_only(pytester, project):
    (project / "test_plain.py").write_text("DUAL = False\n\ndef test_a():\n    pass\n")
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=1)
