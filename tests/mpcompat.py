"""Test helpers that import and behave the same on CPython and MicroPython.

Dual-interpreter test modules (those with ``DUAL = True``) cannot import pytest, so
they use these instead:

    from mpcompat import IS_MICROPYTHON, raises, tmpdir

    def test_rejects_short_frame():
        with raises(ValueError, match="short"):
            decode(b"\\x01")
"""

import os
import sys

IS_MICROPYTHON = sys.implementation.name == "micropython"


class raises:  # noqa: N801 - named like pytest.raises on purpose
    """Context manager: the block must raise ``exc_type`` (a class or a tuple).

    Fails with AssertionError if nothing is raised; an exception of another type
    propagates unchanged. ``match`` is a plain substring of ``str(exception)``.
    The caught exception is available as ``.value`` afterwards.
    """

    def __init__(self, exc_type, match=None):
        self.exc_type = exc_type
        self.match = match
        self.value = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            raise AssertionError("did not raise " + _type_names(self.exc_type))
        if not issubclass(exc_type, self.exc_type):
            return False
        self.value = exc
        if self.match is not None and self.match not in str(exc):
            message = str(exc)
            raise AssertionError(
                f"raised {exc_type.__name__}({message!r}) but {self.match!r} is not in it"
            )
        return True


def _type_names(exc_type):
    if isinstance(exc_type, tuple):
        return " or ".join(t.__name__ for t in exc_type)
    return exc_type.__name__


def exists(path):
    """True if ``path`` exists (MicroPython has no os.path)."""
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_repo_file(relative):
    """Bytes of a file of the repository, by its path from the root (``"protocol/
    vectors/v1.json"``). The MicroPython runner's cwd is the repository root and a
    module's ``__file__`` may be relative there; pytest gives absolute paths."""
    try:  # the qemu-arm target has no repository: the files come frozen (firmware/qemu.py)
        from _repo_files import FILES

        return FILES[relative]
    except (ImportError, KeyError):
        pass
    here = __file__
    i = here.rfind("/")
    tests_dir = here[:i] if i >= 0 else "."
    tried = (tests_dir + "/../" + relative, relative)
    for path in tried:
        try:
            f = open(path, "rb")
        except OSError:
            continue
        with f:
            return f.read()
    raise AssertionError(f"{relative} not found; tried {tried!r}")


_counter = 0


def tmpdir():
    """Return the path of a fresh, empty, writable directory."""
    if not IS_MICROPYTHON:
        import tempfile

        return tempfile.mkdtemp(prefix="mpytest-")
    global _counter
    getenv = getattr(os, "getenv", None)  # the qemu port has neither getenv nor urandom
    base = (getenv and getenv("TMPDIR")) or "/tmp"
    # The unix port has no os.getpid(): a random suffix keeps parallel runs apart.
    urandom = getattr(os, "urandom", None)
    tag = "".join(f"{b:02x}" for b in urandom(4)) if urandom else "arm"
    while True:
        _counter += 1
        path = f"{base.rstrip('/')}/mpytest-{tag}-{_counter}"
        try:
            os.mkdir(path)
        except OSError as e:
            if e.args[0] == 17:  # EEXIST
                continue
            raise
        return path


try:
    from micropython import heap_lock, heap_unlock
except ImportError:  # CPython: nothing to lock

    def heap_lock():
        pass

    def heap_unlock():
        pass


def heap_locked(fn):
    """Run ``fn()`` with the MicroPython heap locked, so any allocation raises
    MemoryError; a plain call on CPython. Returns what ``fn`` returns."""
    heap_lock()
    try:
        return fn()
    finally:
        heap_unlock()


def small_ints(module, relpath, drive):
    """Run ``drive(mod, begin, end)`` to prove ``module``'s arithmetic stays in 31-bit
    small ints: on MicroPython with the module itself, ``begin``/``end`` locking the
    heap (an int past +-2**30 would allocate on a 32-bit port); on CPython with a copy
    of ``relpath`` instrumented by tests/intcheck.py, ``begin``/``end`` switching its
    checks, which must have seen over 1000 ints, none past 2**30 - 1. Returns what
    ``drive`` returns."""
    if IS_MICROPYTHON:
        return drive(module, heap_lock, heap_unlock)
    from intcheck import load_checked

    mod, chk = load_checked(relpath)
    got = drive(mod, chk.__enter__, chk.__exit__)
    assert chk.count > 1000, chk.count
    assert chk.peak <= 2**30 - 1, (chk.peak, chk.where)
    return got
