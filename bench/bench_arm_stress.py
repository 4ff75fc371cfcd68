"""The fragmentation stress on the F411's exact GC heap (issue 24), on 32-bit ARM.

    python -m bench.run arm_stress        # short (make bench): 8 seeds x 300 operations
    python -m bench.run arm_stress_long   # long (make soak): 50 seeds x 1,000, F411 + 72 KB
    python -m bench.bench_arm_stress [--long] [--seeds N] [--ops N] [--jobs N]
                                     [--pool BYTES] [--search]

Each seed is one fresh qemu run (bench/bench_arm.py's image, MPS2_AN385, Cortex-M3) of
``mpy_firmware_bench.main(['', 'stress', seed, ops, collect])``: the factory
``config.json`` stored as ``modbridge flash`` writes it, boot, a signed heartbeat at
every 10th 100 ms tick, then ``ops`` seeded random operations: runs of 1-30 hosted
ticks, or one signed command (every host command: config_get whole and per section,
config_set, config_save over the stored config, setpoints, pid_gains, fan_mode
manual/auto, cal_read, cal_write, selftest start/abort, autotune start/abort, pair,
reboot) run until answered. Mode ``garbage`` leaves what each command allocated in the
heap; mode ``collect`` runs gc.collect() before each command. A MemoryError anywhere
(a nack's text, a failed tick, the harness itself) fails the seed; every run prints a
line (seed, mode, ok or the failing operation, commands answered, reboots, the lowest
``gc.mem_free()`` after an operation), a failure the operation and its traceback.

**Reboot** is what ``machine.reset()`` does to the heap: the harness drops every
reference to the old App (its own, the failure ``_keep_failure`` kept, the tach pins'
IRQ handlers, which a reset clears), collects, then boots a new App on the same
filesystem (mpy_firmware_bench._Stress.reboot). The rest of the heap (the harness,
the host's signer, the fake board, the imported modules) stays where it was: more
than a board holds after a reset, so conservative. Nothing else collects in
``garbage`` mode.

**Determinism.** qemu runs with ``-icount`` (one instruction, one ns of virtual time),
so interrupts land at the same instruction on every run and a seed is reproducible:
the same failure at the same operation. Without it SysTick interrupts land where the
host's speed puts them, leaving different stale words on the C stack, which the GC
scans conservatively: the layouts, and the outcomes near the limit, differ from run to
run (seed 3 at 81 KB failed at operation 213, then passed). The host's side decodes
the module's output in place (``decoder.feed(hal.tx, hal.tx_len)``): fakehal.take()
copies it first, up to 1 KB a call, a block no board allocates.

**The heap.** The F411's GC heap is read from the image ``make firmware`` builds for
the board with the smallest one, ``blackpill_f411`` (:func:`f411_heap`: its
``gc_heap_bytes``, ``_heap_end - _heap_start`` in the ELF, from
firmware.stm32.build_image, a cached build; the NUCLEO's is 3,040 B larger): never a
copied number, since it moves with the image's static RAM. With MicroPython's pystack
in the images (firmware/stm32.py PYSTACK_WORDS: 3,072 B of .bss) it is 88,720 B, down
from 91,804 without. MicroPython's gc.c (v1.28.0, finaliser on) makes of the heap an
allocation table of (heap - 1) * 8 / 524 bytes, each covering 4 blocks of 16 B: for
88,720 B a table of 1,354 bytes and a pool of 1,354 * 4 * 16 = 86,656 B
(:func:`f411_pool`). The run gets exactly that pool: a
``bytearray`` blocker takes the rest of the 2 MB heap first (bench_arm.fits), so the
firmware's region is one contiguous block as on the board. What the boot module left
before the blocker (the RAM disk's block-device object) counts against the firmware.
The host's side of the harness (its signer, the heartbeats it encodes and signs in
pure Python on the target, a few KB of garbage each) lives in the same heap: the
numbers are conservative.

**Time.** A seed of 1,000 operations is about 30 s of qemu (TCG) alone, 40-65 s two at
a time with ``-icount`` on this 2-core machine: about half in hosted ticks (~1.2 ms
each: the firmware plus the fake board's Python HAL), a third in commands (10-100 ms
each: signing, the configuring modules' imports, config_save's file work), the rest in
signing heartbeats (~3.5 ms each, the host's pure-Python HMAC) and qemu's start
(~1.5 s); the GC, scanning the 2 MB blocker too, ~3.5 ms a collection, is a small
part. Runs go ``--jobs`` at a time in separate qemu processes (default 2,
``$BENCH_ARM_STRESS_JOBS``), seed by seed with both modes: the short run is about 3
minutes, the long run's sweep at the F411 pool (100 runs) 35-55 minutes.

**Smallest pool** (``--search``, the long run): bisection over whole KB between
:data:`FLOOR_KB` (taken as failing) and the largest whole KB in the F411's pool, each
probe the whole seed set in both modes, stopped at its first failure (seeds that failed
before run first). One bisection is not a bound, since fragmentation is not monotone
in the pool's size: the reported pool P is one at which every seed passed in both
modes, and so did every pool checked above it: P + 1, P + 2 and P + 4 KB
(:data:`CHECKS_KB`) and every probe the bisection passed. A check that fails moves P
above it (the bisection resumes between the failing pool and the next passing one) and
is reported as non-monotone with its seeds (``arm_stress_nonmonotone``: pools above a
passing pool at which some seed failed). Each probe is up to 100 runs of ~30 s; the
search is some 6 bisection probes and 3 checks: hours on 2 cores. It runs only when
every seed passed at the F411's pool.

Keys (short run): ``arm_stress_memoryerrors`` (seeds x modes failing at the F411 pool;
goal 0), ``arm_stress_seeds``, ``arm_stress_ops``, ``arm_stress_low_free_bytes`` (the
smallest ``gc.mem_free()`` after any operation, any seed: in ``garbage`` mode the GC
runs only when the heap is full, so this is the level before a collection),
``arm_stress_pool_bytes`` (the pool the seeds ran at: :func:`f411_pool`). The long
run's are the same with ``arm_stress_long_`` and ``arm_stress_min_heap_kb`` (P, KB of
pool), ``arm_stress_min_heap_margin_pct`` (1 - P / the F411 pool), ``arm_stress_nonmonotone``.
When some seed fails at the F411's pool itself there is no search (every pool above
the answer must pass, that one too): P is then the pool's next whole KB (85 above the
F411's 84.6 KB), and the margin negative.

**The long run as `make soak` records it** (``run_long``, ``--long``): the whole seed set
at the F411's pool, then at :data:`GOAL_KB` (72 KB, issue 24's goal): about 2 x 45
minutes on 2 cores, where the bisection takes hours. ``arm_stress_min_heap_kb`` is then
the smallest of those two pools at which every seed passed in both modes with the
pool above it passing too (:func:`probed_min_kb`): 72 when both pass, an upper bound
on the bisection's answer at a resolution of the two probes
(``arm_stress_min_heap_probes`` 2). Extra keys: ``arm_stress_long_goal_kb``,
``arm_stress_long_goal_memoryerrors``, ``arm_stress_long_goal_low_free_bytes``.
``--long --search`` runs the bisection instead (``arm_stress_nonmonotone``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from bench.bench_arm import TARGET, _last_json
from firmware import qemu, stm32

F411_BOARD = "blackpill_f411"  # the F411 image with the smallest GC heap
SHORT = (8, 300)
LONG = (50, 1000)
MODES = (("garbage", 0), ("collect", 1))
JOBS = int(os.environ.get("BENCH_ARM_STRESS_JOBS", "2"))
FLOOR_KB = 40  # taken as failing: the boot heap and the fake board alone are ~45 KB
CHECKS_KB = (1, 2, 4)  # above the bisection's answer, every seed must pass there too
GOAL_KB = 72  # issue 24's goal for arm_stress_min_heap_kb: the long run sweeps it
RUN_TIMEOUT_S = 1800


@functools.cache
def f411_heap() -> int:
    """The GC heap of :data:`F411_BOARD`'s image in bytes (``_heap_end - _heap_start``
    in its ELF): built, or found in the build cache, by firmware.stm32 as ``make
    firmware`` builds it. It needs what the qemu image needs too (the MicroPython
    source and arm-none-eabi-gcc)."""
    return stm32.build_image(F411_BOARD)["gc_heap_bytes"]


def pool_of(heap: int) -> int:
    """The allocation pool gc.c (v1.28.0, finaliser on) makes of ``heap`` bytes: an
    allocation table of (heap - 1) * 8 / 524 bytes, 4 blocks of 16 B each."""
    return (heap - 1) * 8 // 524 * 4 * 16


def f411_pool() -> int:
    """The F411 image's pool: the heap the stress runs at (86,656 B with the pystack)."""
    return pool_of(f411_heap())


def run_seed(elf, seed: int, ops: int, collect: int, pool: int) -> dict:
    """One seed in one mode in a fresh qemu with ``pool`` bytes of heap free."""
    code = (
        "import gc\ngc.collect()\nf0 = gc.mem_free()\ntotal = gc.mem_alloc() + f0\n"
        f"_blocker = bytearray(f0 - {pool} - 64)\n"
        "gc.collect()\nprint('@@HEAP', total, f0 - gc.mem_free())\n"
        "import mpy_firmware_bench\n"
        f"mpy_firmware_bench.main(['', 'stress', '{seed}', '{ops}', '{collect}'])"
    )
    t0 = time.monotonic()
    base = {"seed": seed, "mode": MODES[collect][0], "pool": pool}
    try:
        with qemu.Session(elf, icount=True, target=TARGET) as s:
            res = s.run(code, timeout_s=RUN_TIMEOUT_S)
    except qemu.QemuError as e:
        return {
            **base,
            "ok": 0,
            "op": -1,
            "what": "harness",
            "error": str(e)[-300:],
            "secs": time.monotonic() - t0,
        }
    try:
        out = _last_json(res.out)
    except RuntimeError:
        out = {"ok": 0, "op": -1, "what": "harness", "error": res.err[-300:]}
    if "@@HEAP" in res.out:
        total, taken = (int(v) for v in res.out.split("@@HEAP", 1)[1].split()[:2])
        out["heap"] = total - taken  # the pool plus what the boot module left
    if not out.get("ok"):
        out["trace"] = (res.out + res.err)[-600:]
    return {**out, **base, "secs": time.monotonic() - t0}


def line(r: dict) -> str:
    head = f"  {r['mode']:7s} seed {r['seed']:3d} pool {r['pool']:6d}:"
    tail = (
        f"answered {r.get('answered', '?')}, reboots {r.get('reboots', '?')}, "
        f"low free {r.get('low_free', '?')} B, {r['secs']:.0f} s"
    )
    if r.get("ok"):
        return f"{head} ok, {r['ops']} operations, {tail}"
    return (
        f"{head} FAILED at operation {r['op']} ({r['what']}): {r['error']}; {tail}\n"
        f"{r.get('trace', '')}"
    )


def sweep(
    elf,
    seeds: int,
    ops: int,
    pool: int | None = None,
    jobs: int = JOBS,
    stop_on_fail: bool = False,
    first=(),
    quiet: bool = False,
) -> list[dict]:
    """Every seed 1..seeds in both modes at ``pool``, ``jobs`` qemu runs at a time
    (``first``: (seed, mode) pairs to run before the others). ``stop_on_fail``: no run
    starts after the first failure (the ones running finish). ``pool``: the F411's
    by default."""
    pool = f411_pool() if pool is None else pool
    # seed by seed, both modes (a run cut short has both modes' first seeds)
    runs = [(seed, collect) for seed in range(1, seeds + 1) for collect in (0, 1)]
    front = set(first)
    runs.sort(key=lambda sc: (sc[0], MODES[sc[1]][0]) not in front)
    out = []
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        futures = [ex.submit(run_seed, elf, seed, ops, collect, pool) for seed, collect in runs]
        for f in as_completed(futures):
            if f.cancelled():
                continue
            r = f.result()
            out.append(r)
            if not quiet:
                print(line(r), file=sys.stderr, flush=True)
            if stop_on_fail and not r.get("ok"):
                for g in futures:
                    g.cancel()
    out.sort(key=lambda r: (r["mode"], r["seed"]))
    return out


def summary(results: list[dict]) -> dict:
    ok = [r for r in results if r.get("ok")]
    return {
        "memoryerrors": len(results) - len(ok),
        "low_free": min((r["low_free"] for r in ok), default=0),
        "pool": min((r["pool"] for r in results), default=0),
    }


def nonmonotone(cache: dict[int, list[dict]]) -> list[tuple[int, int, str]]:
    """(pool, seed, mode): a run that failed at a pool above one where the same seed
    and mode passed."""
    passed: dict[tuple[int, str], int] = {}
    for pool, results in cache.items():
        for r in results:
            if r.get("ok"):
                key = (r["seed"], r["mode"])
                passed[key] = min(pool, passed.get(key, pool))
    return sorted(
        (pool, r["seed"], r["mode"])
        for pool, results in cache.items()
        for r in results
        if not r.get("ok") and pool > passed.get((r["seed"], r["mode"]), pool)
    )


def min_pool_kb(
    elf, seeds: int, ops: int, jobs: int = JOBS, cache: dict[int, list[dict]] | None = None
) -> dict:
    """The smallest whole-KB pool P at which every seed passes in both modes, and every
    pool checked above it too (module docstring): {"kb", "nonmonotone", "probes"}.
    ``cache``: sweeps already run, pool in bytes -> results (e.g. the F411 pool's)."""
    cache = {} if cache is None else cache
    top = f411_pool() // 1024
    failed_before: set[tuple[int, str]] = set()

    def passes(kb: int) -> bool:
        pool = kb * 1024
        if pool not in cache:
            t0 = time.monotonic()
            cache[pool] = sweep(
                elf, seeds, ops, pool, jobs, stop_on_fail=True, first=failed_before, quiet=True
            )
            bad = [r for r in cache[pool] if not r.get("ok")]
            failed_before.update((r["seed"], r["mode"]) for r in bad)
            verdict = (
                "pass"
                if not bad
                else "FAIL "
                + ", ".join(
                    f"{r['mode']} seed {r['seed']} at operation {r['op']} ({r['what']})"
                    for r in bad
                )
            )
            print(
                f"  pool {kb} KB ({pool} B): {verdict}; {len(cache[pool])} runs, "
                f"{time.monotonic() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        return all(r.get("ok") for r in cache[pool])

    if not passes(top):
        return {"kb": float(top + 1), "nonmonotone": nonmonotone(cache), "probes": len(cache)}
    lo, hi = FLOOR_KB, top
    for _ in range(len(CHECKS_KB) + 3):
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if passes(mid):
                hi = mid
            else:
                lo = mid
        bad = [hi + d for d in CHECKS_KB if hi + d <= top and not passes(hi + d)]
        if not bad:
            break
        lo = max(bad)  # P moves above the highest failing check
        hi = min(
            k // 1024
            for k, rs in cache.items()
            if k // 1024 > lo and k % 1024 == 0 and all(r.get("ok") for r in rs)
        )
    return {"kb": hi, "nonmonotone": nonmonotone(cache), "probes": len(cache)}


def margin_pct(kb: float, pool: int) -> float:
    """How far under ``pool`` bytes a smallest passing pool of ``kb`` KB lies, in %."""
    return round(100 * (1 - kb * 1024 / pool), 1)


def _keys(prefix: str, seeds: int, ops: int, res: dict) -> dict:
    return {
        f"{prefix}_memoryerrors": res["memoryerrors"],
        f"{prefix}_seeds": seeds,
        f"{prefix}_ops": ops,
        f"{prefix}_low_free_bytes": res["low_free"],
        f"{prefix}_pool_bytes": res["pool"],
    }


def _say_heap() -> None:
    print(
        f"  F411 heap {f411_heap():,} B ({F411_BOARD}'s image), pool {f411_pool():,} B",
        file=sys.stderr,
        flush=True,
    )


def run(seeds: int = SHORT[0], ops: int = SHORT[1], jobs: int = JOBS) -> dict:
    _say_heap()
    elf = qemu.image(TARGET).artefacts["elf"]
    return _keys("arm_stress", seeds, ops, summary(sweep(elf, seeds, ops, jobs=jobs)))


def probed_min_kb(cache: dict[int, list[dict]]) -> float | None:
    """The smallest pool run (``cache``: pool in bytes -> results) at which every seed
    passed in both modes, every pool run above it passing too, in KB (the pool's size
    / 1024, not rounded); None when none qualifies. The long run without its search
    (:func:`run_long`): the F411's pool and :data:`GOAL_KB`."""
    best = None
    for pool in sorted(cache, reverse=True):
        if not all(r.get("ok") for r in cache[pool]):
            break
        best = pool
    return None if best is None else round(best / 1024, 2)


def goal_keys(
    first: list[dict], at_goal: list[dict], seeds: int, ops: int, goal_kb: int = GOAL_KB
) -> dict:
    """The long run's keys from its two sweeps (the F411's pool, then ``goal_kb``)."""
    out = _keys("arm_stress_long", seeds, ops, summary(first))
    out["arm_stress_long_goal_kb"] = goal_kb
    out["arm_stress_long_goal_memoryerrors"] = summary(at_goal)["memoryerrors"]
    out["arm_stress_long_goal_low_free_bytes"] = summary(at_goal)["low_free"]
    pool = summary(first)["pool"]
    kb = probed_min_kb({pool: first, goal_kb * 1024: at_goal})
    out["arm_stress_min_heap_kb"] = float(pool // 1024 + 1) if kb is None else kb
    out["arm_stress_min_heap_margin_pct"] = margin_pct(out["arm_stress_min_heap_kb"], pool)
    out["arm_stress_min_heap_probes"] = 2
    return out


def run_long(
    seeds: int = LONG[0], ops: int = LONG[1], jobs: int = JOBS, search: bool = False
) -> dict:
    _say_heap()
    elf = qemu.image(TARGET).artefacts["elf"]
    t0 = time.monotonic()
    first = sweep(elf, seeds, ops, jobs=jobs)
    out = _keys("arm_stress_long", seeds, ops, summary(first))
    print(
        f"  F411 pool: {out['arm_stress_long_memoryerrors']} failing of {len(first)}, "
        f"{time.monotonic() - t0:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    pool = f411_pool()
    if not search:
        t0 = time.monotonic()
        at_goal = sweep(elf, seeds, ops, GOAL_KB * 1024, jobs)
        print(
            f"  {GOAL_KB} KB: {summary(at_goal)['memoryerrors']} failing of {len(at_goal)}, "
            f"{time.monotonic() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        return goal_keys(first, at_goal, seeds, ops)
    if out["arm_stress_long_memoryerrors"]:
        # every pool checked above the answer must pass, the F411's included: none can
        out["arm_stress_min_heap_kb"] = float(pool // 1024 + 1)
        out["arm_stress_min_heap_margin_pct"] = margin_pct(pool // 1024 + 1, pool)
        out["arm_stress_nonmonotone"] = 0
        print("  no search: some seed fails at the F411 pool", file=sys.stderr, flush=True)
    else:
        found = min_pool_kb(elf, seeds, ops, jobs)
        out["arm_stress_min_heap_kb"] = found["kb"]
        out["arm_stress_min_heap_margin_pct"] = margin_pct(found["kb"], pool)
        out["arm_stress_nonmonotone"] = len(found["nonmonotone"])
        for pool, seed, mode in found["nonmonotone"]:
            print(
                f"  non-monotone: {mode} seed {seed} failed at {pool} B, passed below",
                file=sys.stderr,
                flush=True,
            )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--long", action="store_true", help="the long run: F411 pool, then GOAL_KB")
    p.add_argument("--seeds", type=int)
    p.add_argument("--ops", type=int)
    p.add_argument("--jobs", type=int, default=JOBS)
    p.add_argument("--pool", type=int, help="bytes of heap (one sweep; the F411's pool)")
    p.add_argument(
        "--search",
        action="store_true",
        help="the smallest-pool search (with --long: after its sweep)",
    )
    a = p.parse_args(argv)
    seeds, ops = LONG if a.long else SHORT
    seeds, ops = a.seeds or seeds, a.ops or ops
    elf = qemu.image(TARGET).artefacts["elf"]
    if a.long:
        out = run_long(seeds, ops, a.jobs, search=a.search)
    elif a.search:
        out = min_pool_kb(elf, seeds, ops, a.jobs)
    else:
        out = _keys("arm_stress", seeds, ops, summary(sweep(elf, seeds, ops, a.pool, a.jobs)))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
