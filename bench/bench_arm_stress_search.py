"""The short stress's smallest passing pool (``make soak``, some 15-30 minutes): the
short set (8 seeds x 300 operations, both modes) run at whole-KB pools by
bench_arm_stress.min_pool_kb, the same bisection and checks above the answer as the
long run's search (bench/bench_arm_stress.py, "Smallest pool"). A lower bound on
``arm_stress_min_heap_kb`` (the long set's, 50 seeds x 1,000: hours), recorded apart so
a board's margin has a measured figure between long runs.

Keys: ``arm_stress_short_min_heap_kb`` (P, KB of pool), ``arm_stress_short_min_heap_margin_pct``
(1 - P / the F411 image's pool), ``arm_stress_short_nonmonotone`` (runs that failed at a
pool above one where the same seed and mode passed), ``arm_stress_short_probes``.
"""

from bench.bench_arm_stress import SHORT, TARGET, f411_pool, margin_pct, min_pool_kb
from firmware import qemu


def run(seeds: int = SHORT[0], ops: int = SHORT[1]) -> dict:
    elf = qemu.image(TARGET).artefacts["elf"]
    found = min_pool_kb(elf, seeds, ops)
    pool = f411_pool()
    return {
        "arm_stress_short_min_heap_kb": found["kb"],
        "arm_stress_short_min_heap_margin_pct": margin_pct(found["kb"], pool),
        "arm_stress_short_nonmonotone": len(found["nonmonotone"]),
        "arm_stress_short_probes": found["probes"],
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
