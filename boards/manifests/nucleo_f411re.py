# MicroPython image for the nucleo_f411re board: the firmware plus the board's module.
# Built by `make firmware BOARD=nucleo_f411re` (firmware/stm32.py; docs/boards.md).

include("firmware.py")  # noqa: F821 - provided by MicroPython's manifest reader
module("boards/nucleo_f411re.py", base_path="../..")  # noqa: F821
