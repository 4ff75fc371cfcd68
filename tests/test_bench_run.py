"""bench.run, the benchmark runner: selection (make bench / make soak), merging into
the results file, atomic writes, validation of results. CPython only, well under a
second: the benchmarks are fakes registered in sys.modules; no real one runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from bench import run

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake(monkeypatch):
    """Fake benchmarks: ``fake(name, result)`` registers bench.bench_<name> whose run()
    returns ``result`` (or raises it if it is an exception); discover() lists them."""
    names: list[str] = []
    calls: list[str] = []
    monkeypatch.setattr(run, "discover", lambda: sorted(names))

    def add(name, result):
        def run_():
            calls.append(name)
            if isinstance(result, BaseException):
                raise result
            return result

        module = types.ModuleType(f"bench.bench_{name}")
        module.run = run_
        monkeypatch.setitem(sys.modules, f"bench.bench_{name}", module)
        names.append(name)

    add.calls = calls
    return add


@pytest.fixture
def results(tmp_path):
    return tmp_path / "results.json"


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _select(argv: list[str], available: list[str]) -> list[str]:
    return run.select(run.parse_args(argv), available)


# ----------------------------------------------------------------------- selection

AVAILABLE = ["bridge", "control", "exporter", "firmware", "protocol", "soak"]


def test_the_default_set_is_everything_but_the_soak_group():
    default = ["bridge", "control", "exporter", "firmware", "protocol"]
    assert _select([], AVAILABLE) == default
    assert _select(["--group", "default"], AVAILABLE) == default
    assert _select(["--all-but", "soak"], AVAILABLE) == default
    assert _select(["--group", "soak"], AVAILABLE) == ["soak"]
    assert _select(["--group", "all"], AVAILABLE) == AVAILABLE
    assert _select(["--all-but", "soak,bridge"], AVAILABLE) == default[1:]
    assert _select(["--group", "default", "--skip", "bridge"], AVAILABLE) == default[1:]
    assert _select(["bench_soak", "control"], AVAILABLE) == ["control", "soak"]
    # a new benchmark joins the default set by itself
    assert _select([], AVAILABLE + ["zeta"]) == default + ["zeta"]


def test_the_real_benchmarks_soak_is_long():
    available = run.discover()
    assert "soak" in available
    assert "soak" not in run.group("default", available)
    assert "arm_stress_long" not in run.group("default", available)  # its short one is
    assert set(run.group("default", available)) | set(run.LONG) == set(available)


@pytest.mark.parametrize(
    "argv", [["nope"], ["--skip", "nope"], ["control", "--group", "soak"], ["--all-but", "x"]]
)
def test_bad_selections_are_refused(argv, fake, results):
    fake("control", {"a": 1})
    assert run.main(argv + ["--results", str(results)]) == 2
    assert not fake.calls and not results.exists()


def _make_dry_run(target: str) -> list[str]:
    """The bench.run arguments of ``make -n <target>``."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(
        ["make", "-n", "-s", target], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    lines = [ln for ln in out.splitlines() if re.search(r"-m bench\.run\b", ln)]
    assert len(lines) == 1, out
    return lines[0].split("-m bench.run", 1)[1].split()


def test_make_bench_leaves_the_soak_out_and_make_soak_runs_it():
    available = run.discover()
    bench = _select(_make_dry_run("bench"), available)
    assert "soak" not in bench and bench == run.group("default", available)
    assert _select(_make_dry_run("soak"), available) == sorted(run.LONG)


# ----------------------------------------------------------------------- merging


def test_keys_are_merged_and_keys_of_benchmarks_not_run_are_kept(fake, results):
    results.write_text(json.dumps({"other_key": 7, "alpha_x": 0, "bench_wall_s_other": 3.0}))
    fake("alpha", {"alpha_x": 1.5, "alpha_n": 3})
    fake("beta", {"beta_y": 2})
    assert run.main(["alpha", "--results", str(results)]) == 0
    got = _read(results)
    assert got["other_key"] == 7 and got["bench_wall_s_other"] == 3.0  # kept
    assert got["alpha_x"] == 1.5 and got["alpha_n"] == 3  # merged, updated
    assert "beta_y" not in got and fake.calls == ["alpha"]
    wall = got["bench_wall_s_alpha"]
    assert isinstance(wall, int | float) and 0 <= wall < 5
    assert run.main(["beta", "--results", str(results)]) == 0
    got = _read(results)
    assert got["alpha_x"] == 1.5 and got["beta_y"] == 2 and "bench_wall_s_beta" in got


def test_results_env_names_the_file(fake, results, monkeypatch):
    fake("alpha", {"alpha_x": 1})
    monkeypatch.setenv(run.RESULTS_ENV, str(results))
    assert run.main(["alpha"]) == 0
    assert _read(results)["alpha_x"] == 1


def test_each_benchmark_is_recorded_when_it_finishes(fake, results):
    """A run that is cut off (here: the second benchmark) keeps what the first did."""

    seen = {}

    def second():
        seen.update(_read(results))
        raise KeyboardInterrupt  # as a cut-off make would

    fake("alpha", {"alpha_x": 1})
    fake("beta", {})
    sys.modules["bench.bench_beta"].run = second
    with pytest.raises(KeyboardInterrupt):
        run.main(["--results", str(results)])
    assert seen["alpha_x"] == 1 and _read(results)["alpha_x"] == 1


def test_a_failing_benchmark_writes_nothing_and_the_others_still_run(fake, results, capsys):
    results.write_text(json.dumps({"beta_y": 1, "bench_wall_s_beta": 9.0}))
    fake("alpha", {"alpha_x": 1})
    fake("beta", RuntimeError("firmware in pieces"))
    fake("gamma", {"gamma_z": 3})
    assert run.main(["--results", str(results)]) == 1
    got = _read(results)
    assert got["alpha_x"] == 1 and got["gamma_z"] == 3
    assert got["beta_y"] == 1 and got["bench_wall_s_beta"] == 9.0  # last good run's
    assert "FAILED: beta" in capsys.readouterr().out


def test_concurrent_runners_lose_no_keys(results):
    """Two bench.run at once (make soak beside make bench): every merge survives."""

    def worker(prefix):
        for i in range(40):
            run.merge_results({f"{prefix}_{i}": i}, results)

    threads = [threading.Thread(target=worker, args=(p,)) for p in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = _read(results)
    assert len(got) == 120 and all(got[f"{p}_{i}"] == i for p in "abc" for i in range(40))


def test_a_broken_results_file_stops_the_run_before_any_benchmark(fake, results):
    results.write_text('{"a": 1,\n<<<<<<< HEAD\n')
    fake("alpha", {"alpha_x": 1})
    assert run.main(["--results", str(results)]) == 2
    assert not fake.calls and results.read_text().startswith('{"a": 1,')


# ----------------------------------------------------------------------- atomic writes


def test_results_are_written_to_a_temp_file_then_renamed(results, monkeypatch):
    results.write_text(json.dumps({"old": 1}))
    os.chmod(results, 0o644)
    renames = []
    real_replace = os.replace

    def replace(src, dst):
        # at the rename the target is still the old, complete file and the new one is
        # complete beside it, in the same directory (same file system: rename is atomic)
        assert _read(Path(dst)) == {"old": 1}
        assert Path(src).parent == Path(dst).parent and _read(Path(src))["new"] == 2
        renames.append((src, dst))
        real_replace(src, dst)

    monkeypatch.setattr(run.os, "replace", replace)
    run.merge_results({"new": 2}, results)
    assert len(renames) == 1 and Path(renames[0][1]) == results
    assert _read(results) == {"old": 1, "new": 2}
    assert results.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert sorted(p.name for p in results.parent.iterdir()) == ["results.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temp(results, monkeypatch):
    results.write_text(json.dumps({"old": 1}))

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(run.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        run.merge_results({"new": 2}, results)
    assert _read(results) == {"old": 1}
    assert sorted(p.name for p in results.parent.iterdir()) == ["results.json"]


# ----------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "result",
    [
        {"k": "fast"},
        {"k": None},
        {"k": True},  # a bool is an int to Python, not a number to results.json
        {"k": [1, 2]},
        {"k": {"p99": 1}},
        {"k": math.nan},
        {"k": math.inf},
        {1: 2.0},
        {"": 1},
        {"bench_wall_s_alpha": 1.0},  # the runner's own key
        [("k", 1)],
        None,
    ],
    ids=repr,
)
def test_non_numeric_results_are_rejected(result, fake, results):
    results.write_text(json.dumps({"alpha_ok": 1}))
    fake("alpha", result)
    assert run.main(["alpha", "--results", str(results)]) == 1
    assert _read(results) == {"alpha_ok": 1}  # nothing of it recorded


def test_numbers_are_accepted():
    ok = {"i": 3, "f": 0.25, "neg": -1, "zero": 0.0, "big": 2**40}
    assert run.check_result("alpha", ok) is ok
