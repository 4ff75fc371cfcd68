"""Firmware entry point on a board: ``from device.main import run; run("pico")``.

The ``main.py`` that ``modbridge flash`` writes to the board does exactly that. The
board module builds the hardware abstraction (see device/README.md); the app runs
until a ``repl`` command hands the port back to the MicroPython REPL.
"""


def load_board(name):
    """Import ``boards.<name>`` and return the module."""
    pkg = __import__("boards." + name)
    return getattr(pkg, name)


def make_hal(name, machine=None):
    """The HAL of board ``name`` (on ``machine``, else the board's own). The board
    module, boards._build and the ``boards`` package are forgotten after: their pin
    tables are dicts, RAM even when frozen, and their functions are needed once, here;
    the HAL keeps what it uses (boards._common, its classes; boards._optional where
    the board uses one of its parts)."""
    from device.app import _unload

    hal = load_board(name).make_hal(machine)
    _unload("boards." + name)
    _unload("boards._build")
    _unload("boards")
    return hal


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
    hal = make_hal(board_name)
    if repl_requested(hal.fs_dir):
        hal.repl()
        print("module firmware: staying at the REPL after a repl command; reset to resume")
        return
    from device.app import App

    App(hal).run()
