"""Self-check of the dual-interpreter harness: these run on CPython and MicroPython."""

import os
import sys

from mpcompat import IS_MICROPYTHON, raises, tmpdir

DUAL = True


def test_interpreter_flag_matches_implementation():
    assert IS_MICROPYTHON == (sys.implementation.name == "micropython")


def test_raises_catches_the_expected_type():
    with raises(ValueError) as caught:
        int("not a number")
    assert isinstance(caught.value, ValueError)
    with raises((KeyError, IndexError)):
        [][1]
    with raises(ValueError, match="boom"):
        raise ValueError("boom here")


def test_raises_fails_when_nothing_is_raised():
    try:
        with raises(ValueError):
            pass
    except AssertionError as e:
        assert "did not raise ValueError" in str(e), str(e)
    else:
        raise AssertionError("raises() accepted a block that raised nothing")


def test_raises_lets_other_exceptions_through():
    try:
        with raises(ValueError):
            raise KeyError("k")
    except KeyError:
        pass
    else:
        raise AssertionError("raises(ValueError) swallowed a KeyError")


def test_raises_checks_the_message():
    with raises(AssertionError):
        with raises(ValueError, match="expected"):
            raise ValueError("something else")


def test_tmpdir_is_fresh_and_writable():
    first, second = tmpdir(), tmpdir()
    assert first != second
    assert os.listdir(first) == []
    path = first + "/probe.bin"
    with open(path, "wb") as f:
        f.write(b"\x00\x01\x02")
    with open(path, "rb") as f:
        assert f.read() == b"\x00\x01\x02"
    os.remove(path)
    os.rmdir(first)
    os.rmdir(second)


def test_small_int_fixed_point_arithmetic():
    # Milli-degC fixed point, as the firmware does it: stays within +-2**30.
    t_mc = 72_300
    scaled = (t_mc * 65535) // 100_000
    assert scaled == 47381, scaled
    assert -(2**30) < t_mc * 10_000 < 2**30
    assert divmod(-7, 2) == (-4, 1)


def test_stdout_from_tests_does_not_confuse_the_runner():
    print("output without a newline", end="")
    print("@@MPY-forged RESULT test_x FAIL 0")
