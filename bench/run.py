"""Run benchmarks and record their numbers in bench/results.json.

    python -m bench.run                    # the default set: every bench_*.py but the soak
    python -m bench.run --group soak       # the soak group (`make soak`)
    python -m bench.run --group all        # everything, the soak included
    python -m bench.run protocol firmware  # bench/bench_protocol.py and bench_firmware.py
    python -m bench.run --all-but soak,bridge   # every benchmark except these
    python -m bench.run --list             # benchmarks, groups, last recorded wall times

``make bench`` runs ``--group default`` (budget: 20 minutes on the 2-core build
machine), ``make soak`` runs ``--group soak``. A benchmark module ``bench/bench_<name>.py``
is in the default set unless ``LONG`` names it; new ones join it by themselves.

Each benchmark module exposes ``run() -> dict`` mapping flat string keys to numbers
(int or float, finite; not bool). After each benchmark that succeeds, its keys and
``bench_wall_s_<name>`` (its wall time in seconds) are merged into the results file:
read again, updated, written to a temporary file in the same directory and renamed
over the old one, under an exclusive lock on the directory. So keys of benchmarks
that were not run are kept, a run that is cut off keeps the benchmarks it finished,
and two ``bench.run`` at once (``make soak`` beside ``make bench``) lose nothing.
A failing benchmark prints its traceback and writes nothing (its keys from the last
run that succeeded stay); the others still run, and the exit status is 1 at the end.

The results file is bench/results.json, or ``--results PATH`` / ``$BENCH_RESULTS``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results.json"
RESULTS_ENV = "BENCH_RESULTS"
PREFIX = "bench_"
WALL_PREFIX = "bench_wall_s_"  # + benchmark name: its wall time, written by this runner
# `make soak` only, not the default set
LONG = ("soak", "arm_stress_long", "arm_stress_search", "chassis", "model_long")
BUDGET_S = 20 * 60  # the default set, on the 2-core build machine
GROUPS = ("default", "soak", "all")


class ResultsError(Exception):
    """The results file cannot be read or a benchmark's result cannot be recorded."""


def discover() -> list[str]:
    """Names (without the bench_ prefix) of the benchmark modules, sorted."""
    return sorted(p.stem[len(PREFIX) :] for p in BENCH_DIR.glob(f"{PREFIX}*.py"))


def group(name: str, available: list[str]) -> list[str]:
    """The benchmarks of a group, in ``available``'s order."""
    if name == "default":
        return [b for b in available if b not in LONG]
    if name == "soak":
        return [b for b in available if b in LONG]
    if name == "all":
        return list(available)
    raise ValueError(f"unknown group {name!r}; have {', '.join(GROUPS)}")


def _names(values: list[str]) -> list[str]:
    """Benchmark names from arguments: comma-separated too, bench_ prefix optional."""
    out = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part:
                out.append(part[len(PREFIX) :] if part.startswith(PREFIX) else part)
    return out


def select(args: argparse.Namespace, available: list[str]) -> list[str]:
    """The benchmarks to run, in ``available``'s order; ValueError on a bad name."""
    names = _names(args.names)
    skip = _names(args.skip) + _names(args.all_but or [])
    unknown = sorted({n for n in names + skip if n not in available})
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; have {', '.join(available)}")
    if names and (args.group or args.all_but is not None):
        raise ValueError("give benchmark names, --group or --all-but, not several")
    if args.group and args.all_but is not None:
        raise ValueError("give --group or --all-but, not both")
    if names:
        chosen = [b for b in available if b in names]
    elif args.all_but is not None:
        chosen = list(available)
    else:
        chosen = group(args.group or "default", available)
    return [b for b in chosen if b not in skip]


def check_result(name: str, result: object) -> dict[str, int | float]:
    """``result`` if it is a dict of str -> finite int/float; ResultsError otherwise."""
    if not isinstance(result, dict):
        raise ResultsError(f"{PREFIX}{name}.run() returned {type(result).__name__}, not dict")
    for key, value in result.items():
        if not isinstance(key, str) or not key:
            raise ResultsError(f"{PREFIX}{name}.run(): key {key!r} is not a non-empty str")
        if key.startswith(WALL_PREFIX):
            raise ResultsError(f"{PREFIX}{name}.run(): {key!r}: {WALL_PREFIX}* is the runner's")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ResultsError(
                f"{PREFIX}{name}.run(): {key!r}: {value!r} ({type(value).__name__}) is not a number"
            )
        if not math.isfinite(value):
            raise ResultsError(f"{PREFIX}{name}.run(): {key!r}: {value!r} is not finite")
    return result


def run_one(name: str) -> dict[str, int | float]:
    module = importlib.import_module(f"bench.{PREFIX}{name}")
    return check_result(name, module.run())


def load_results(path: Path = RESULTS) -> dict[str, int | float]:
    """The results file's object; {} when there is none. ResultsError if unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ResultsError(f"{path} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path} holds a {type(data).__name__}, not a JSON object")
    return data


@contextlib.contextmanager
def _locked(directory: Path):
    """An exclusive flock on ``directory`` (no lock file to leave behind)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_results(results: dict[str, int | float], path: Path = RESULTS) -> None:
    """Write ``results`` to ``path`` atomically: a temp file beside it, then rename."""
    text = json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n"
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def merge_results(new: dict[str, int | float], path: Path = RESULTS) -> dict[str, int | float]:
    """Merge ``new`` into the results file (re-read under the lock); the merged dict."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent):
        results = load_results(path)
        results.update(new)
        write_results(results, path)
    return results


def print_table(rows: list[tuple[str, float]]) -> None:
    if not rows:
        return
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        shown = f"{value:,}" if isinstance(value, int) else f"{value:,.6g}"
        print(f"  {key:<{width}}  {shown:>16}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Run benchmarks; merge their numbers into the results file.",
    )
    p.add_argument("names", nargs="*", help="benchmarks to run (default: --group default)")
    p.add_argument("--group", choices=GROUPS, help=f"a set: default (all but {', '.join(LONG)})")
    p.add_argument(
        "--all-but", metavar="NAMES", action="append", help="every benchmark except these"
    )
    p.add_argument("--skip", metavar="NAMES", action="append", default=[], help="leave these out")
    p.add_argument(
        "--results",
        type=Path,
        default=Path(os.environ.get(RESULTS_ENV) or RESULTS),
        help=f"results file (default ${RESULTS_ENV} or {RESULTS.relative_to(BENCH_DIR.parent)})",
    )
    p.add_argument("--list", action="store_true", help="list benchmarks and groups, run none")
    return p.parse_args(argv)


def list_benchmarks(available: list[str], results: dict) -> None:
    for name in GROUPS:
        members = group(name, available)
        walls = [results.get(WALL_PREFIX + b) for b in members]
        known = sum(w for w in walls if w is not None)
        note = f"  (last recorded {known:.0f} s)" if all(w is not None for w in walls) else ""
        print(f"{name}: {' '.join(members)}{note}")
    for name in available:
        wall = results.get(WALL_PREFIX + name)
        print(f"  {PREFIX}{name}: " + ("-" if wall is None else f"{wall:g} s"))


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return int(e.code or 0)
    available = discover()
    if not available:
        print(f"bench: no {PREFIX}*.py modules in {BENCH_DIR}; nothing to run")
        return 0
    try:
        wanted = select(args, available)
        load_results(args.results)  # a broken results file fails now, not after the runs
    except (ValueError, ResultsError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if args.list:
        list_benchmarks(available, load_results(args.results))
        return 0
    if not wanted:
        print("bench: nothing selected")
        return 0
    failed = []
    total = 0.0
    for name in wanted:
        print(f"{PREFIX}{name}:", flush=True)
        start = time.perf_counter()
        try:
            numbers_ = run_one(name)
            wall = time.perf_counter() - start
            merge_results({**numbers_, WALL_PREFIX + name: round(wall, 1)}, args.results)
        except Exception:
            sys.stdout.flush()
            traceback.print_exc()
            sys.stderr.flush()
            failed.append(name)
            total += time.perf_counter() - start
            print(f"  FAILED after {time.perf_counter() - start:.1f} s; nothing recorded")
            continue
        total += wall
        print_table(sorted(numbers_.items()))
        print(f"  ({wall:.1f} s; merged into {args.results})", flush=True)
    print(f"bench: {len(wanted) - len(failed)} of {len(wanted)} in {total:.0f} s")
    if wanted == group("default", available) and total > BUDGET_S:
        print(f"bench: WARNING: the default set took {total:.0f} s, over its {BUDGET_S} s budget")
    if failed:
        print(f"bench: FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
