"""The long fragmentation stress (``make soak``): 50 seeds x 1,000 operations in both
modes on the F411's pool, then the smallest pool at which every seed passes
(``arm_stress_min_heap_kb``). What it runs: bench/bench_arm_stress.py; the default
set (``make bench``) runs its short version."""

from bench.bench_arm_stress import run_long


def run() -> dict:
    return run_long()


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
