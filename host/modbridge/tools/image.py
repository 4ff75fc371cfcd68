"""``python -m modbridge.tools.image <board>``: build an stm32 board's MicroPython image
with the firmware frozen in, from an installed modbridge (a checkout runs ``make
firmware BOARD=<board>``, the same build).

It needs the MicroPython v1.28.0 source (``MICROPY_DIR``) and gcc-arm-none-eabi; the
image goes to the build directory (``$MODBRIDGE_BUILD_DIR``, else
``~/.cache/modbridge/build``), where ``modbridge flash`` looks first.
"""

import sys

import modbridge  # noqa: F401 - puts the firmware's folder (firmware/, boards/) on sys.path
from firmware import stm32

if __name__ == "__main__":
    sys.exit(stm32.main())
