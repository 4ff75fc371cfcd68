"""tests/slowtier.py: the fast tier's list and the order pytest-xdist hands files out
in, from a junit file; garbage in the data files costs the order, never the run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import slowtier  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_quick" time="0.01"/>
<testcase classname="tests.test_a" name="test_long" time="3.5"/>
<testcase classname="tests.test_b" name="test_x[micropython]" time="1.5"/>
<testcase classname="tests.test_b" name="test_y[micropython]" time="1.0"/>
<testcase classname="tests.test_b" name="test_z[qemu-arm]" time="9.0"/>
<testcase classname="tests.qemu.test_arm" name="test_tick" time="20.0"/>
<testcase classname="tests.test_c.TestGroup" name="test_m" time="0.7"/>
</testsuite></testsuites>
"""


def test_node_ids_from_junit_class_names():
    assert slowtier.nodeid("tests.test_a", "test_q") == "tests/test_a.py::test_q"
    assert slowtier.nodeid("tests.qemu.test_arm", "t") == "tests/qemu/test_arm.py::t"
    assert slowtier.nodeid("tests.test_c.TestGroup", "t") == "tests/test_c.py::TestGroup::t"


def test_slow_ids_and_file_seconds(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    assert slowtier.slow_ids(junit) == [
        "tests/qemu/test_arm.py::test_tick",
        "tests/test_a.py::test_long",
        "tests/test_b.py::test_x[micropython]",
        "tests/test_b.py::test_y[micropython]",
        "tests/test_c.py::TestGroup::test_m",
    ]
    secs = slowtier.file_seconds(junit)
    assert secs == {
        "tests/test_a.py": 3.51,
        "tests/test_b.py": 11.5,
        "tests/qemu/test_arm.py": 20.0,
        "tests/test_c.py": 0.7,
    }


def test_longest_first_then_the_unmeasured_in_their_own_order():
    secs = {"tests/a.py": 1.0, "tests/b.py": 30.0, "tests/c.py": 5.0}
    paths = ["tests/new2.py", "tests/a.py", "tests/c.py", "tests/new1.py", "tests/b.py"]
    assert slowtier.longest_files_first(paths, secs) == [
        "tests/b.py", "tests/c.py", "tests/a.py", "tests/new2.py", "tests/new1.py",
    ]  # fmt: skip


def test_a_garbled_or_missing_seconds_file_gives_no_order_and_no_error(tmp_path):
    assert slowtier.load_file_seconds(tmp_path / "absent.txt") == {}
    f = tmp_path / "file_seconds.txt"
    f.write_bytes(b"# head\n12.5 tests/a.py\nfast tests/b.py\n\xff\xfe\n3 4 5\n\n2 tests/c.py\n")
    assert slowtier.load_file_seconds(f) == {"tests/a.py": 12.5, "tests/c.py": 2.0}


def test_the_shipped_seconds_file_parses_and_names_real_files():
    secs = slowtier.load_file_seconds()
    root = Path(__file__).resolve().parent.parent
    assert len(secs) > 100
    missing = [p for p in secs if not (root / p).is_file()]
    assert len(missing) <= 5, missing  # files renamed since `make durations`: a few at most
