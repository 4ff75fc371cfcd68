# MicroPython image for the blackpill_f411 board: the firmware plus the board's module.
# Built by `make firmware BOARD=blackpill_f411` (firmware/stm32.py; docs/boards.md).

include("firmware.py")  # noqa: F821 - provided by MicroPython's manifest reader
module("boards/blackpill_f411.py", base_path="../..")  # noqa: F821
