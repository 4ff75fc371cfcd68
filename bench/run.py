"""Run benchmarks and record their numbers in bench/results.json.

    python -m bench.run            # every bench/bench_*.py
    python -m bench.run cbor frame # bench/bench_cbor.py and bench/bench_frame.py

Each benchmark module exposes ``run() -> dict`` mapping flat keys to numbers. The keys
are merged into bench/results.json (existing keys from other benchmarks are kept).
A failing benchmark prints its traceback, the others still run, and the exit status
is 1 at the end.
"""

from __future__ import annotations

import importlib
import json
import numbers
import sys
import time
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results.json"
PREFIX = "bench_"


def discover() -> list[str]:
    """Names (without the bench_ prefix) of the benchmark modules, sorted."""
    return sorted(p.stem[len(PREFIX) :] for p in BENCH_DIR.glob(f"{PREFIX}*.py"))


def run_one(name: str) -> dict[str, float]:
    module = importlib.import_module(f"bench.{PREFIX}{name}")
    result = module.run()
    if not isinstance(result, dict):
        raise TypeError(f"{PREFIX}{name}.run() returned {type(result).__name__}, not dict")
    for key, value in result.items():
        if not isinstance(key, str) or not isinstance(value, numbers.Real):
            raise TypeError(f"{PREFIX}{name}.run(): {key!r}: {value!r} is not str -> number")
    return result


def load_results() -> dict[str, float]:
    if not RESULTS.exists():
        return {}
    return json.loads(RESULTS.read_text())


def write_results(results: dict[str, float]) -> None:
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def print_table(rows: list[tuple[str, float]]) -> None:
    if not rows:
        return
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        shown = f"{value:,}" if isinstance(value, int) else f"{value:,.6g}"
        print(f"  {key:<{width}}  {shown:>16}")


def main(argv: list[str]) -> int:
    available = discover()
    if not available:
        print(f"bench: no {PREFIX}*.py modules in {BENCH_DIR}; nothing to run")
        return 0
    wanted = [a[len(PREFIX) :] if a.startswith(PREFIX) else a for a in argv] or available
    unknown = [name for name in wanted if name not in available]
    if unknown:
        print(f"bench: unknown benchmark(s) {', '.join(unknown)}; have {', '.join(available)}")
        return 2
    results = load_results()
    failed = []
    for name in wanted:
        print(f"{PREFIX}{name}:")
        start = time.perf_counter()
        try:
            numbers_ = run_one(name)
        except Exception:
            sys.stdout.flush()
            traceback.print_exc()
            sys.stderr.flush()
            failed.append(name)
            continue
        results.update(numbers_)
        print_table(sorted(numbers_.items()))
        print(f"  ({time.perf_counter() - start:.1f} s)")
    if len(failed) < len(wanted):
        write_results(results)
        print(f"bench: results merged into {RESULTS}")
    if failed:
        print(f"bench: FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
