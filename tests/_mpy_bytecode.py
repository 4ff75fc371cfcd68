"""The firmware packages as bytecode for the ``[micropython]`` column (conftest.py).

MicroPython's unix port compiles a module from source at every import, and the
firmware imports its configuring modules again after each configuring command
(device.app._release frees their RAM): test_app_garbage's MicroPython run spent 16.4 s
of CPU, 4.1 s with the packages compiled once. ``device``, ``protocol`` and ``boards``
are compiled by ``mpy-cross`` (what a board's image freezes) into
``build/mpy-bytecode/<hash of the sources>/``, which the runner puts first on
MICROPYPATH; the test modules and their helpers are still compiled from source. A
file mpy-cross refuses (host-only code) is copied as source, so importing it fails as
before. Without ``mpy-cross``, or if its bytecode does not load, the column runs from
source as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("device", "protocol", "boards")
CACHE = REPO_ROOT / "build" / "mpy-bytecode"
KEEP_S = 24 * 3600  # older trees (edited sources) are removed


def root(micropython: str) -> Path | None:
    """The directory holding the packages as .mpy (for MICROPYPATH), or None."""
    micropython = str(Path(micropython).resolve())
    cross = shutil.which("mpy-cross", path=str(Path(micropython).parent)) or shutil.which(
        "mpy-cross"
    )
    if cross is None:
        return None
    sources = {
        path.relative_to(REPO_ROOT): path.read_bytes()
        for pkg in PACKAGES
        for path in sorted((REPO_ROOT / pkg).rglob("*.py"))
    }
    digest = hashlib.sha256()
    for tool in (cross, micropython):  # another version: compile again
        st = os.stat(tool)
        digest.update(f"{Path(tool).resolve()}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    for rel, data in sources.items():
        digest.update(str(rel).encode() + b"\0" + data + b"\0")
    out = CACHE / digest.hexdigest()[:16]
    if out.is_dir():
        return out
    tmp = None
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=CACHE))
        for rel, data in sources.items():  # the bytes hashed, whatever changes meanwhile
            src = tmp / rel
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_bytes(data)
            done = subprocess.run(
                [cross, "-s", str(REPO_ROOT / rel), "-o", str(src.with_suffix(".mpy")), str(src)],
                capture_output=True,
                timeout=300,
            )
            if done.returncode == 0:
                src.unlink()  # else the source stays: importing it fails as before
        if _loads(micropython, tmp):
            os.rename(tmp, out)
            tmp = None
    except (OSError, subprocess.SubprocessError):
        pass  # from source, as before (or another pytest-xdist worker was first)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    _prune(out)
    return out if out.is_dir() else None


def _loads(micropython: str, tree: Path) -> bool:
    """The unix port imports this bytecode (its .mpy version is mpy-cross's)."""
    env = dict(os.environ, MICROPYPATH=f"{tree}:.frozen")
    probe = "import protocol.crc, device.floors; print('ok')"
    done = subprocess.run(
        [micropython, "-c", probe], env=env, capture_output=True, timeout=60, cwd=tree
    )
    return done.stdout.strip() == b"ok"


def _prune(keep: Path) -> None:
    for old in CACHE.iterdir():
        try:
            if old != keep and time.time() - old.stat().st_mtime > KEEP_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            continue
