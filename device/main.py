"""Firmware entry point on a board: ``from device.main import run; run("pico")``.

The ``main.py`` that ``modbridge flash`` writes to the board does exactly that. The
board module builds the hardware abstraction (see device/README.md); the app runs
until a ``repl`` command hands the port back to the MicroPython REPL.
"""


def load_board(name):
    """Import ``boards.<name>`` and return the module."""
    pkg = __import__("boards." + name)
    return getattr(pkg, name)


def repl_requested(fs_dir):
    """True once after a ``repl`` command reset the board (the flag is removed)."""
    import os

    from device.app import REPL_FLAG

    path = fs_dir.rstrip("/") + "/" + REPL_FLAG
    try:
        os.remove(path)
    except OSError:
        return False
    return True


def run(board_name):
    hal = load_board(board_name).make_hal()
    if repl_requested(hal.fs_dir):
        hal.repl()
        print("module firmware: staying at the REPL after a repl command; reset to resume")
        return
    from device.app import App

    App(hal).run()
