"""One module per board: its pin map and ``make_hal()``. See docs/boards.md.

``BOARDS`` maps a board name to ``(module name, mpy-cross -march)``. The arch matters
only for native code (@native/@viper); plain bytecode .mpy files run on any arch.
"""

BOARDS = {
    "pyboard_v11": ("boards.pyboard_v11", "armv7emsp"),  # STM32F405, Cortex-M4F
    "blackpill_f411": ("boards.blackpill_f411", "armv7emsp"),  # STM32F411, Cortex-M4F
    "nucleo_f411re": ("boards.nucleo_f411re", "armv7emsp"),  # STM32F411, Cortex-M4F
    "pico": ("boards.pico", "armv6m"),  # RP2040, Cortex-M0+
    # The virtual board: the MicroPython unix port lockstepped with a simulated world
    # (boards/sim.py; run by host/modbridge/sim/runner.py, never flashed).
    "sim": ("boards.sim", None),
}


def load(name):
    """Import and return the board module called ``name``."""
    if name not in BOARDS:
        raise ValueError("unknown board %r (one of: %s)" % (name, ", ".join(sorted(BOARDS))))
    modname = BOARDS[name][0]
    mod = __import__(modname)
    return getattr(mod, modname.split(".")[1])
