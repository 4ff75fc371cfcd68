"""Firmware entry point on a board: ``from device.main import run; run("pico")``.

The ``main.py`` that ``modbridge flash`` writes to the board does exactly that. The
board module builds the hardware abstraction (see device/README.md); the app runs
until a ``repl`` command hands the port back to the MicroPython REPL.
"""


def load_board(name):
    """Import ``boards.<name>`` and return the module."""
    pkg = __import__("boards." + name)
    return getattr(pkg, name)


def run(board_name):
    from device.app import App

    hal = load_board(board_name).make_hal()
    App(hal).run()
