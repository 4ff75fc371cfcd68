# The module firmware, frozen into a MicroPython image (MicroPython's manifest format:
# https://docs.micropython.org/en/latest/reference/manifest.html). Included by each
# board's manifest beside this file; built by `make firmware BOARD=<board>`.
#
# The files firmware/allowlist.py names (the one allow-list, which `modbridge flash`
# deploys as .mpy too): its BOARD_SUPPORT (boards/__init__.py, _build.py, _common.py,
# _optional.py) and every .py in the firmware's package directories;
# tests/test_images.py checks that the image and the deploy are the same files.
#
# Not included: MicroPython's default stm32 manifest (asyncio, dht, onewire), which the
# firmware does not use. MicroPython's manifest reader runs this file with its folder
# as the working directory: paths are relative to it.
import os
import runpy

_ROOT = "../.."
_ALLOW = runpy.run_path(os.path.join(_ROOT, "firmware", "allowlist.py"))
for _rel in _ALLOW["firmware_files"](_ROOT):
    module(_rel, base_path=_ROOT, opt=_ALLOW["MPY_OPT"])  # noqa: F821 - MicroPython's reader
