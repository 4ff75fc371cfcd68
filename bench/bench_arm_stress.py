"""The fragmentation stress on the F411's exact GC heap (issue 24), on 32-bit ARM.

    python -m bench.run arm_stress        # short: 8 seeds x 300 operations, both modes
    python -m bench.run soak              # long (bench_soak runs ``run_long``): 50 x 1,000

Each seed is one fresh qemu run (bench/bench_arm.py's image, MPS2_AN385, Cortex-M3) of
``mpy_firmware_bench.main(['', 'stress', seed, ops, collect])``: the factory
``config.json`` stored as ``modbridge flash`` writes it, boot, a signed heartbeat at
every 10th 100 ms tick, then ``ops`` seeded random operations: runs of 1-30 hosted
ticks, or one signed command (every host command: config_get whole and per section,
config_set, config_save over the stored config, setpoints, pid_gains, fan_mode
manual/auto, cal_read, cal_write, selftest start/abort, autotune start/abort, pair,
reboot: a new App booted on the same filesystem) run until answered. Mode ``garbage``
leaves what each command allocated in the heap; mode ``collect`` runs gc.collect()
before each command. A MemoryError anywhere (a nack's text, a failed tick, the
harness itself) fails the seed and prints the seed and the operation.

**The heap.** The F411 images' GC heap is 91,804 B (``_heap_end - _heap_start`` in the
ELF, bench images); MicroPython's gc.c (v1.28.0, finaliser on) makes of that an
allocation table of (91,804 - 1) * 8 / 524 = 1,401 bytes, i.e. a pool of
1,401 * 4 * 16 = 89,664 B: :data:`F411_POOL`. The run gets exactly that pool: a
``bytearray`` blocker takes the rest of the 2 MB heap first (bench_arm.fits), so the
firmware's region is one contiguous block as on the board. What the boot module left
before the blocker (the RAM disk's block-device object) counts against the firmware.
The host's side of the harness (its signer, the heartbeats it encodes) lives in the
same heap: the numbers are conservative.

Keys: ``arm_stress_memoryerrors`` (seeds x modes failing at the F411 pool; goal 0),
``arm_stress_seeds``, ``arm_stress_ops``, ``arm_stress_low_free_bytes`` (the smallest
``gc.mem_free()`` seen after any operation, any seed), and with ``--min-heap``
(the soak) ``arm_stress_min_heap_kb``: the smallest pool, in 1 KB steps down from
the F411's, at which every seed passes in both modes.
"""

from __future__ import annotations

import json
import math
import sys

from bench.bench_arm import TARGET, _last_json
from firmware import qemu

F411_HEAP = 91804
F411_POOL = (F411_HEAP - 1) * 8 // 524 * 4 * 16  # 89,664: gc.c's split of the heap
SHORT = (8, 300)
LONG = (50, 1000)
MODES = (("garbage", 0), ("collect", 1))


def run_seed(elf, seed: int, ops: int, collect: int, pool: int = F411_POOL) -> dict:
    code = (
        "import gc\ngc.collect()\nf0 = gc.mem_free()\ntotal = gc.mem_alloc() + f0\n"
        f"_blocker = bytearray(f0 - {pool} - 64)\n"
        "gc.collect()\nprint('@@HEAP', total, f0 - gc.mem_free())\n"
        "import mpy_firmware_bench\n"
        f"mpy_firmware_bench.main(['', 'stress', '{seed}', '{ops}', '{collect}'])"
    )
    with qemu.Session(elf, target=TARGET) as s:
        res = s.run(code, timeout_s=900)
    total, taken = (int(v) for v in res.out.split("@@HEAP", 1)[1].split()[:2])
    try:
        out = _last_json(res.out)
    except RuntimeError:
        out = {"ok": 0, "seed": seed, "op": -1, "what": "harness", "error": res.err[-300:]}
    out["pool"] = total - taken
    if not out.get("ok"):
        out["trace"] = (res.out + res.err)[-600:]
    return out


def stress(elf, seeds: int, ops: int, pool: int = F411_POOL, quiet: bool = False) -> dict:
    fails = 0
    low = None
    for mode, collect in MODES:
        for seed in range(1, seeds + 1):
            r = run_seed(elf, seed, ops, collect, pool)
            if r.get("ok"):
                low = r["low_free"] if low is None else min(low, r["low_free"])
                line = (f"  {mode:7s} seed {seed:3d}: ok, {r['answered']} commands, "
                        f"{r['reboots']} reboots, low free {r['low_free']} B, pool {r['pool']}")
            else:
                fails += 1
                line = (f"  {mode:7s} seed {seed:3d}: FAILED at operation {r['op']} "
                        f"({r['what']}): {r['error']}\n{r.get('trace', '')}")
            if not quiet:
                print(line, file=sys.stderr, flush=True)
    return {"memoryerrors": fails, "low_free": low if low is not None else 0}


def min_heap_kb(elf, seeds: int, ops: int) -> float:
    """Step the pool down 1 KB at a time from the F411's until a seed fails."""
    pool = F411_POOL
    best = None
    while pool > 40 * 1024:
        if stress(elf, seeds, ops, pool, quiet=True)["memoryerrors"]:
            break
        best = pool
        pool -= 1024
    return math.ceil(best / 1024) if best else float(F411_POOL // 1024 + 1)


def _keys(seeds: int, ops: int, res: dict) -> dict:
    return {
        "arm_stress_memoryerrors": res["memoryerrors"],
        "arm_stress_seeds": seeds,
        "arm_stress_ops": ops,
        "arm_stress_low_free_bytes": res["low_free"],
    }


def run() -> dict:
    elf = qemu.image(TARGET).artefacts["elf"]
    seeds, ops = SHORT
    return _keys(seeds, ops, stress(elf, seeds, ops))


def run_long() -> dict:
    elf = qemu.image(TARGET).artefacts["elf"]
    seeds, ops = LONG
    out = _keys(seeds, ops, stress(elf, seeds, ops))
    out["arm_stress_min_heap_kb"] = min_heap_kb(elf, seeds, ops)
    return out


if __name__ == "__main__":
    print(json.dumps(run_long() if "--long" in sys.argv else run(), indent=1))
