"""Run the test functions of one dual-interpreter test module under MicroPython.

Started by tests/conftest.py as:

    micropython tests/_mpy_runner.py <token> <path/to/test_module.py> <test_name>...

It imports the module, calls each named function in the order given and prints one
result block per test, every marker line starting with ``@@MPY-<token>`` (the token
is random per run, so nothing a test prints can be mistaken for a marker):

    @@MPY-<token> START <name>
    ...whatever the test prints...
    @@MPY-<token> RESULT <name> PASS|FAIL <elapsed_ms>
    @@MPY-<token> TB-BEGIN <name>        (FAIL only)
    <traceback from sys.print_exception>
    @@MPY-<token> TB-END <name>
    ...
    @@MPY-<token> DONE

A module that fails to import prints an IMPORT-FAIL block (with TB-BEGIN/TB-END)
and DONE. No DONE at all means the interpreter died.
"""

import io
import sys

try:
    from time import ticks_diff, ticks_ms
except ImportError:  # CPython, when debugging the runner by hand
    from time import monotonic

    def ticks_ms():
        return int(monotonic() * 1000)

    def ticks_diff(a, b):
        return a - b


def _format_exception(e):
    buf = io.StringIO()
    if hasattr(sys, "print_exception"):
        sys.print_exception(e, buf)
    else:
        import traceback

        traceback.print_exception(type(e), e, e.__traceback__, file=buf)
    return buf.getvalue()


def _emit(marker, *words):
    # A leading newline ends any partial line the test left without one.
    sys.stdout.write("\n" + marker + " " + " ".join(words) + "\n")


def _traceback(marker, name, text):
    _emit(marker, "TB-BEGIN", name)
    sys.stdout.write(text)
    _emit(marker, "TB-END", name)


def _split_path(path):
    i = path.rfind("/")
    directory, filename = (path[:i], path[i + 1 :]) if i >= 0 else (".", path)
    if filename.endswith(".py"):
        filename = filename[:-3]
    return directory, filename


def main(argv):
    marker = "@@MPY-" + argv[1]
    directory, modname = _split_path(argv[2])
    names = argv[3:]
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        module = __import__(modname)
    except BaseException as e:  # noqa: B036 - report everything, incl. SystemExit
        _traceback(marker, "IMPORT-FAIL", _format_exception(e))
        _emit(marker, "DONE")
        return
    for name in names:
        _emit(marker, "START", name)
        func = getattr(module, name, None)
        start = ticks_ms()
        error = None
        try:
            if func is None:
                raise AttributeError("module has no test function " + name)
            func()
        except BaseException as e:  # noqa: B036 - a test's SystemExit is a failure too
            error = e
        elapsed = ticks_diff(ticks_ms(), start)
        _emit(marker, "RESULT", name, "PASS" if error is None else "FAIL", str(elapsed))
        if error is not None:
            _traceback(marker, name, _format_exception(error))
    _emit(marker, "DONE")


if __name__ == "__main__":
    main(sys.argv)
