"""What the firmware is: the one allow-list of the files a board runs.

``modbridge flash`` deploys these (host/modbridge/tools/flash.py
``firmware_sources``), every stm32 image freezes them (boards/manifests/firmware.py
runs this file), and so does the qemu test target (firmware/qemu.py, through
flash). Every ``.py`` directly inside a directory of :data:`PACKAGES` is firmware,
and so are :data:`BOARD_SUPPORT` and the board's own module; nothing else is (the
host-only code lives in host/modbridge/firmware_host/, the golden vectors in
protocol/vectors/, which is not listed). A new firmware directory is added here.

Plain Python that imports only ``os``: MicroPython's manifest reader runs it.
"""

import os

#: Directories (posix, relative to the root) whose every ``.py`` is firmware.
PACKAGES = ("device", "device/cfg", "device/control", "device/drivers", "protocol")
#: Files of boards/ every board runs, besides its own module.
BOARD_SUPPORT = (
    "boards/__init__.py",
    "boards/_build.py",
    "boards/_common.py",
    "boards/_optional.py",
)
#: mpy-cross's optimisation level for every image and every .mpy deploy: 3 drops the
#: bytecode's line-number tables (and asserts; the firmware has none), ~9 KB of the
#: frozen image and of a .mpy deploy's RAM. A traceback still names each function.
MPY_OPT = 3


def firmware_files(root, board_file=None):
    """The firmware's files under ``root`` (relative posix paths, sorted), with
    ``board_file`` (e.g. ``boards/pico.py``) if given."""
    out = set(BOARD_SUPPORT)
    if board_file:
        out.add(board_file)
    for pkg in PACKAGES:
        for name in os.listdir(os.path.join(root, *pkg.split("/"))):
            if name.endswith(".py"):
                out.add(pkg + "/" + name)
    return sorted(out)
