# MicroPython image for the pyboard_v11 board: the firmware plus the board's module.
# Built by `make firmware BOARD=pyboard_v11` (firmware/stm32.py; docs/boards.md).

include("firmware.py")  # noqa: F821 - provided by MicroPython's manifest reader
module("boards/pyboard_v11.py", base_path="../..")  # noqa: F821
