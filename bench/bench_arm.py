"""The firmware's RAM and CPU budget on 32-bit ARM (MicroPython's qemu port).

    python -m bench.run arm

Runs the qemu test image (firmware/qemu.py: MPS2_AN385, a Cortex-M3 like NETDUINO2,
the firmware frozen in as the stm32 images freeze it) under ``qemu-system-arm`` and drives
bench/mpy_firmware_bench.py there, the same target-side code bench_firmware.py runs on
the unix port (its docstring says what each mode does). Keys:

    heap_after_boot_bytes_armv7m_<board>   the boot heap as the board ships, for
                                     blackpill_f411, nucleo_f411re, pyboard_v11 (goal
                                     <= 28672 on the F411 boards): gc.collect();
                                     gc.mem_alloc() after the firmware imports, device.main
                                     (main.py's import), device.main.make_hal(board): the
                                     board's real HAL on bench/fakemachine.py (a fake
                                     ``machine``, its module's own import left out: C
                                     in flash on a board), App(hal) + boot() + the
                                     watchdog, minus the same before; with the factory
                                     config.json and a secret.key stored in the board's
                                     FS_DIR first, as ``modbridge flash`` writes them
                                     (store_as_flashed), and checked to boot from them
                                     (mpy_firmware_bench.mode_heap_board). Its parts:
    heap_firmware_imports_bytes_armv7m_<board>   the firmware imports
    heap_main_module_bytes_armv7m_<board>        device.main
    heap_hal_bytes_armv7m_<board>                make_hal: boards._common (the board module,
                                     boards._build and the package are forgotten
                                     after), the HAL, its machine objects, and
    heap_machine_objects_bytes_armv7m_<board>    the fake machine's objects of one HAL
                                     (Pin, ADC, PWM, I2C, UART with its 1 KB receive
                                     ring: on a board C objects of a few words, but the
                                     stm32 UART's ring is on the GC heap too): an
                                     overstatement kept in the figure
    heap_app_objects_bytes_armv7m_<board>        App(hal) + boot() + the watchdog
    heap_after_boot_bytes_armv7m     the older figure, not as it ships: firmware imports
                                     + App(hal) + boot() on the SIMULATOR fake board
                                     (tests/fakehal.py), without a stored config; the
                                     fake board's modules and objects left out
    heap_firmware_imports_bytes_armv7m, heap_app_objects_bytes_armv7m   its two parts
    heap_after_commands_bytes_armv7m the same measured again after the warm-up and one
                                     of each command device.commands answers
                                     (mpy_firmware_bench.COMMANDS: config_get,
                                     config_set, config_save, ...): the modules that
                                     configure are imported for each and forgotten
                                     after, so this shows what stays
    tick_alloc_bytes_armv7m_hosted   heap bytes per tick (gc disabled, mem_alloc delta
                                     over 1,000 ticks) with a signed heartbeat arriving
                                     every 10th tick (goal 0)
    tick_heap_locked_armv7m_hosted   1 if 1,000 such ticks also ran under heap_lock()
                                     (tick_heap_locked_failures_armv7m_hosted: how many
                                     of them failed, a MemoryError caught by the app)
    min_heap_kb_armv7m               the smallest heap, in KB, in which boot, warm-up,
                                     those commands and 1,000 ticks (GC enabled) run
    min_heap_kb_armv7m_ticks         the same without the commands: boot, warm-up and
                                     1,000 ticks
    tick_instructions_armv7m         guest instructions per control tick (below), in
                                     the ``boot`` heap layout: boot on an empty heap
    tick_cpu_share_pct_96mhz_100ms   tick_instructions / (96e6 * 0.1) * 100: the share
                                     of a 100 ms period on a 96 MHz Cortex-M4, assuming
                                     ~1 instruction per cycle (goal < 10)
    tick_instructions_armv7m_min, _median, _max   the same count over the heap layouts
                                     (below; tick_instructions_layouts_armv7m of them)
    tick_cpu_share_pct_96mhz_100ms_max   the largest's share (goal < 10)
    tick_instructions_armv7m_heap_locked  the ``boot`` count with the ticks under
                                     heap_lock(): no call frame taken from the heap
                                     (below), the same in every layout

Why MPS2_AN385 and not NETDUINO2's 96 KB heap: one image for the test column and the
benchmark, and room for the minimum-heap search to start above any answer. The heap
figures are gc.mem_alloc() deltas, independent of the heap's size; the instruction
set, word size and small-int range are the same Cortex-M3's.

**Minimum heap.** One image, its heap limited from inside: before the run, a
``bytearray`` "blocker" takes all of the 2 MB heap but the amount under test
(allocated first, so the rest stays one contiguous region); the heap the firmware had
is the heap's size minus the blocker's footprint (its gc.mem_free() difference). A
binary search over that amount in 256-byte steps, between 16 and 256 KB, finds the
smallest heap that runs ``mode fit``; the result rounds it up to whole KB. The heap's
size is the GC's own (``gc.mem_alloc() + gc.mem_free()``, less than
``MICROPY_HEAP_SIZE``: the GC's tables take their share of it). What the boot module
left in the heap before the blocker (the RAM disk's block-device object, about 1.7 KB)
counts as firmware: a slight overestimate.

**Instructions.** qemu runs with ``-icount shift=0``: every guest instruction advances
the virtual clock by 1 ns, so target time measures instructions deterministically,
independent of the host's speed or load. The port's ``time.ticks_us()`` runs on that
clock through SysTick at a rate that is calibrated in the same run: an inline-thumb
loop of exactly 2 instructions per iteration (``subs``, ``bne``), run for two
iteration counts, gives instructions per tick_us (the difference cancels the call's
overhead). The tick's count is then (1,000 hosted ticks - the same loop with a no-op
in place of ``app.step()``) / 1,000: the loop, the fake clock's ``advance`` and
``tx_len = 0`` are subtracted; the heartbeat feed (``hal.send``, every 10th tick) and
the fake board's calls made by the firmware (ADC, I2C, PWM, UART, all in Python on the
fake board, C functions on a real one) stay in, so the count is an upper bound of the
firmware's own work.

**Heap layouts.** The hosted tick allocates nothing, yet its count depends on where
the App's objects lie (the issue measured 751,993-863,516 on NETDUINO2 and
782,537-813,798 on MPS2 over layouts). So the count is taken in separate qemu runs
(two at a time) under :data:`TICK_LAYOUTS`: ``boot`` (the App booted on an empty heap,
the key ``tick_instructions_armv7m``); ``holes<seed>``: before boot, a seeded pattern
of :data:`HOLE_ALLOCS` bytearrays of 16-384 B, about half of them freed and collected,
so the App's objects fall into the holes among live blocks; ``stress<seed>``: the
fragmentation stress's command mix (mpy_firmware_bench._Stress, garbage mode, on the
2 MB heap) for :data:`STRESS_LAYOUT_OPS` operations, then the modes it may have left
undone (selftest and autotune aborted, fan_mode auto, telemetry at its default 200 ms)
so the tick does the same work; its tuning values stay as the mix left them. Each
run's state must be the ``boot`` run's (HOSTED). All on MPS2_AN385 (one image).

Why the layout mattered: MicroPython without a pystack (py/objfun.c,
``VM_MAX_STATE_ON_STACK``) takes the frame of every call to a bytecode function whose
locals and value stack exceed 11 words from the GC heap (``m_new_obj_var_maybe``) and
frees it on return; the tick makes many such calls. Net allocation stays 0, but each
one is a gc_alloc that scans the allocation table from the lowest free block for a run
long enough, through every small hole below it, and on a full heap it collects first
(923,617-1,077,145 instructions over the layouts, 881,637 under heap_lock(), where the
frames go on the C stack). The images now have a pystack (firmware/stm32.py
PYSTACK_WORDS, the qemu image the same): frames come from a fixed static array, so
the layouts, ``tick_instructions_armv7m_heap_locked`` included, differ by little more
than where the App's objects lie (877,953-879,376 on 8197696): the layouts stay, as
the check that the count does not depend on the heap.

**Boot heap per board.** The qemu image's littlefs RAM disk is mounted at ``/``
(tests/qemu/_qemu_boot.py), where the stm32 port mounts its flash at ``/flash``: the
harness makes the board's FS_DIR a directory on it, so the board's own path string
reaches the stored files. The nonce differs from the F411 (the qemu build has
``os.urandom``; the F411 hashes a boot counter): device.nonce is released after
App(), so it leaves nothing either way.

Takes about 3 minutes (plus a minute when the image must be built first).
"""

from __future__ import annotations

import json
import math
import statistics
from concurrent.futures import ThreadPoolExecutor

from firmware import qemu

TARGET = qemu.MPS2_AN385
FIT_STEP = 256
FIT_RANGE = (16 * 1024, 256 * 1024)
CALIBRATION_ITERATIONS = (2_000_000, 4_000_000)
TICKS = 1000
HOLE_ALLOCS = 600  # ~120 KB of 16-384 B blocks, about half freed
STRESS_LAYOUT_OPS = 150
TICK_LAYOUTS = ("boot", "holes1", "holes2", "holes3", "holes4", "stress1", "stress2")
TICK_JOBS = 2

SPIN = """
import micropython, time

@micropython.asm_thumb
def _spin(r0):
    label(loop)
    sub(r0, r0, 1)
    bne(loop)

def _us(n):
    t0 = time.ticks_us()
    _spin(n)
    return time.ticks_diff(time.ticks_us(), t0)
"""

# Boot on the fake board, warm up with a heartbeat, and prepare the heartbeats of
# {n} hosted ticks (encoding and signing them is the host's work, done before).
HOSTED = """
import gc, micropython, time
import mpy_firmware_bench as B
fakehal, hal = B.make_board()
app = B.boot(fakehal, hal)
host = B.warm_up(fakehal, hal, app, True)
B.ticks(app, hal, 10, host.frames(1))
hb = host.frames({n} // 10 + 1)
"""

# Heap layouts for the tick count (module docstring): set up before HOSTED boots ...
HOLES = """
import gc
import mpy_firmware_bench as B
_r = B._Rand({seed})
_live = []
_gone = []
for _i in range({count}):
    _b = bytearray(16 * (1 + _r.below(24)))
    (_gone if _r.below(2) else _live).append(_b)
_gone = _b = None
gc.collect()
"""

# ... or in place of HOSTED: the stress's command mix, then the modes it left undone
STRESS_MIX = """
import gc, time
import mpy_firmware_bench as B
st = B._Stress({seed}, 0)
B._keep_failure(st.app)
for _i in range({ops}):
    st.op()
    st.check()
st.command("selftest", {{"abort": True}})
st.command("autotune", {{"action": 1}})
st.command("fan_mode", {{"mode": 0}})
st.command("config_set", {{"values": {{"control.telemetry_ms": 200}}}})
st.check()
fakehal, hal, app, host = st.fakehal, st.hal, st.app, st.host
st = None
B.ticks(app, hal, 10, host.frames(1))
hb = host.frames({n} // 10 + 1)
"""

TICK_COUNT = """
step = app.step

def _noop():
    pass

def _timed(n, hb):
    gc.collect()
    t0 = time.ticks_us()
    B.ticks(app, hal, n, hb)
    return time.ticks_diff(time.ticks_us(), t0)

n0 = app.ticks
full = _timed({n}, hb)
B.check(app, n0, {n})
app.step = _noop
empty = _timed({n}, None)
app.step = step
print("@@RESULT", full, empty, _us({c1}), _us({c2}), app.sup.state)
"""


ALLOC = """
n0 = app.ticks
accepted = app.hb.accepted
gc.collect()
gc.disable()
before = gc.mem_alloc()
B.ticks(app, hal, {n}, hb)
after = gc.mem_alloc()
gc.enable()
B.check(app, n0, {n})
beats = app.hb.accepted - accepted
hb = host.frames({n} // 10 + 1)
gc.collect()
f0 = app.failures
micropython.heap_lock()
try:
    B.ticks(app, hal, {n}, hb)
finally:
    micropython.heap_unlock()
print("@@RESULT", after - before, beats, app.failures - f0, app.sup.state)
"""


def _last_json(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"no JSON from the target:\n{out}")
    return json.loads(lines[-1])


def _bench_mode(session: qemu.Session, mode: str) -> dict:
    out = session.check(f"import mpy_firmware_bench\nmpy_firmware_bench.main(['', {mode!r}])")
    return _last_json(out)


SHIPPED_BOARDS = ("blackpill_f411", "nucleo_f411re", "pyboard_v11")


def store_as_flashed(fs_dir: str) -> str:
    """Target code that leaves ``fs_dir`` as ``modbridge flash`` does: the factory
    config.json (flash.default_config, made here on the host exactly as flash makes
    it) and a provisioned secret.key (mpy_firmware_bench.KEY). The qemu image mounts
    its littlefs RAM disk at ``/`` (tests/qemu/_qemu_boot.py), not at the stm32
    port's ``/flash``: ``fs_dir`` is made a directory on it, so the board's FS_DIR
    string reaches the same files (the firmware only joins paths to it)."""
    from modbridge.tools import flash

    name, text, _note = flash.default_config()
    if text is None:
        raise RuntimeError(f"no factory config: {_note}")
    d = fs_dir.rstrip("/")
    return (
        "import os, gc, mpy_firmware_bench as B\n"
        f"try:\n    os.mkdir({d!r})\nexcept OSError:\n    pass\n"
        f"with open({d + '/' + name!r}, 'wb') as f:\n    f.write({text.encode()!r})\n"
        f"with open({d + '/secret.key'!r}, 'wb') as f:\n    f.write(B.KEY)\n"
        "f = None\ngc.collect()\n"
    )


def heap_board(elf, board: str) -> dict:
    """``mode heap_board`` for one board after ``store_as_flashed``, in a fresh boot."""
    import importlib

    fs_dir = importlib.import_module(f"boards.{board}").FS_DIR
    with qemu.Session(elf, target=TARGET) as s:
        s.check(store_as_flashed(fs_dir))
        code = f"mpy_firmware_bench.main(['', 'heap_board', {board!r}])"
        res = _last_json(s.check("import mpy_firmware_bench\n" + code))
    if res.get("config_source") != "current" or not res.get("paired"):
        raise RuntimeError(f"{board}: booted without the stored config or key: {res}")
    return res


def heap_boards(elf) -> dict:
    out = {}
    for board in SHIPPED_BOARDS:
        r = heap_board(elf, board)
        out[f"heap_after_boot_bytes_armv7m_{board}"] = r["after_boot"]
        for part in ("firmware_imports", "main_module", "hal", "machine_objects", "app_objects"):
            out[f"heap_{part}_bytes_armv7m_{board}"] = r[part]
    return out


def heap_and_alloc(elf) -> dict:
    out = {}
    with qemu.Session(elf, target=TARGET) as s:
        heap = _bench_mode(s, "heap")
    out["heap_firmware_imports_bytes_armv7m"] = heap["firmware_imports"]
    out["heap_app_objects_bytes_armv7m"] = heap["app_objects"]
    out["heap_after_boot_bytes_armv7m"] = heap["firmware_imports"] + heap["app_objects"]
    out["heap_fake_board_bytes_armv7m"] = heap["fake_board"]
    out["heap_after_commands_bytes_armv7m"] = heap["after_commands"]
    # mode alloc_hosted's own check stops at a failed locked tick; this counts them
    with qemu.Session(elf, target=TARGET) as s:
        res = s.check((HOSTED + ALLOC).format(n=TICKS), timeout_s=900)
    alloc, beats, locked_failures, _state = res.split("@@RESULT", 1)[1].split()[:4]
    if int(beats) < TICKS // 10:
        raise RuntimeError(f"hosted run: {beats} heartbeats accepted of {TICKS // 10}")
    out["tick_alloc_bytes_armv7m_hosted"] = int(alloc) / TICKS
    out["tick_heap_locked_armv7m_hosted"] = int(int(locked_failures) == 0)
    out["tick_heap_locked_failures_armv7m_hosted"] = int(locked_failures)
    return out


def fits(elf, heap: int, mode: str = "fit") -> tuple[bool, int]:
    """(whether ``mode`` (fit, fit_ticks) ran with about ``heap`` bytes of heap, the
    heap it had)."""
    code = (
        "import gc\ngc.collect()\nf0 = gc.mem_free()\ntotal = gc.mem_alloc() + f0\n"
        f"_blocker = bytearray(f0 - {heap} - 64)\n"
        "gc.collect()\nprint('@@HEAP', total, f0 - gc.mem_free())\n"
        f"import mpy_firmware_bench\nmpy_firmware_bench.main(['', {mode!r}])"
    )
    with qemu.Session(elf, target=TARGET) as s:
        res = s.run(code, timeout_s=600)
    total, taken = (int(v) for v in res.out.split("@@HEAP", 1)[1].split()[:2])
    ok = not res.err and '"ok": 1' in res.out
    if res.err and "MemoryError" not in res.err:
        raise RuntimeError(f"fit run failed otherwise than out of memory:\n{res.err}")
    return ok, total - taken


def min_heap_kb(elf, mode: str = "fit") -> float:
    lo, hi = FIT_RANGE[0] // FIT_STEP, FIT_RANGE[1] // FIT_STEP  # hi fits, lo does not
    ok, best = fits(elf, hi * FIT_STEP, mode)
    if not ok:
        raise RuntimeError(f"the firmware does not run in {FIT_RANGE[1]} bytes of heap")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, heap = fits(elf, mid * FIT_STEP, mode)
        if ok:
            hi, best = mid, heap
        else:
            lo = mid
    return math.ceil(best / 1024)


def _layout(name: str) -> str:
    """The code that boots the App in heap layout ``name`` (TICK_LAYOUTS)."""
    hosted = HOSTED.format(n=TICKS)
    if name == "boot":
        return hosted
    if name.startswith("holes"):
        return HOLES.format(seed=int(name[5:]), count=HOLE_ALLOCS) + hosted
    if name.startswith("stress"):
        return STRESS_MIX.format(seed=int(name[6:]), ops=STRESS_LAYOUT_OPS, n=TICKS)
    raise ValueError(f"unknown heap layout {name!r}")


# The timed loops under heap_lock(): no frame is taken from the heap (below)
TICK_COUNT_LOCKED = TICK_COUNT.replace(
    "    B.ticks(app, hal, n, hb)\n",
    "    micropython.heap_lock()\n    try:\n        B.ticks(app, hal, n, hb)\n"
    "    finally:\n        micropython.heap_unlock()\n",
)


def tick_count(elf, layout: str = "boot", locked: bool = False) -> tuple[float, float, int]:
    """(instructions per hosted tick, instructions per tick_us, the supervisor's state)
    in heap layout ``layout``, one qemu run with -icount; ``locked``: the ticks run
    under heap_lock()."""
    code = (
        SPIN
        + _layout(layout)
        + (TICK_COUNT_LOCKED if locked else TICK_COUNT).format(
            n=TICKS, c1=CALIBRATION_ITERATIONS[0], c2=CALIBRATION_ITERATIONS[1]
        )
    )
    with qemu.Session(elf, icount=True, target=TARGET) as s:
        out = s.check(code, timeout_s=900)
    full, empty, us1, us2, state = out.split("@@RESULT", 1)[1].split()[:5]
    per_us = 2 * (CALIBRATION_ITERATIONS[1] - CALIBRATION_ITERATIONS[0]) / (int(us2) - int(us1))
    return (int(full) - int(empty)) * per_us / TICKS, per_us, int(state)


def _share(instructions: float) -> float:
    return round(instructions / (96e6 * 0.1) * 100, 3)


def tick_instructions(elf, layouts=TICK_LAYOUTS, jobs: int = TICK_JOBS) -> dict:
    with ThreadPoolExecutor(jobs) as ex:
        locked = ex.submit(tick_count, elf, "boot", True)
        counts = dict(zip(layouts, ex.map(lambda n: tick_count(elf, n), layouts), strict=True))
        locked = locked.result()[0]
    boot, per_us, state = counts["boot"]
    other = {name: c[2] for name, c in counts.items() if c[2] != state}
    if other:
        raise RuntimeError(f"supervisor state {state} after boot but {other} in other layouts")
    each = sorted(c[0] for c in counts.values())
    return {
        "tick_instructions_armv7m": round(boot),
        "tick_cpu_share_pct_96mhz_100ms": _share(boot),
        "tick_instructions_armv7m_min": round(each[0]),
        "tick_instructions_armv7m_median": round(statistics.median(each)),
        "tick_instructions_armv7m_max": round(each[-1]),
        "tick_cpu_share_pct_96mhz_100ms_max": _share(each[-1]),
        "tick_instructions_layouts_armv7m": len(each),
        "tick_instructions_armv7m_heap_locked": round(locked),
        "qemu_instructions_per_tick_us": round(per_us, 2),
        "tick_state_armv7m_hosted": state,
    }


def run() -> dict:
    build = qemu.image(TARGET)
    elf = build.artefacts["elf"]
    out = heap_and_alloc(elf)
    out.update(heap_boards(elf))
    out.update(tick_instructions(elf))
    out["min_heap_kb_armv7m"] = min_heap_kb(elf)
    out["min_heap_kb_armv7m_ticks"] = min_heap_kb(elf, "fit_ticks")
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
