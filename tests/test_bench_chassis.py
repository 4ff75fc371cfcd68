"""The generalisation benchmark's machinery (bench/bench_chassis.py) on short cases.

The benchmark's numbers are not re-measured here: the docs' tables are checked to be
generated from bench/results.json and docs/control-benchmark/chassis_cases.json, and
the keys to summarize the per-case file. What is asserted on runs is deterministic
(lockstepped firmware)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_chassis as BC
from bench import bench_control as B
from modbridge.sim import chassis as gen

ROOT = Path(__file__).resolve().parent.parent


def test_sets_are_the_generators_fixed_seeds():
    sets = BC.set_worlds(3, 2, shipped=True)
    assert [w.chassis.seed for w in sets["train"]] == list(gen.TRAIN_SEEDS[:3])
    assert [w.chassis.seed for w in sets["val"]] == list(gen.VAL_SEEDS[:2])
    assert sets["shipped"] == list(B.WORLDS)
    assert "shipped" not in BC.set_worlds(1, 1, shipped=False)
    w = sets["val"][0]
    assert BC.rooms_of(w) == w.chassis.rooms_c
    assert BC.rooms_of(w, "hot") == (max(w.chassis.rooms_c),)
    assert BC.rooms_of("rtx3080") == BC.SHIPPED_ROOMS_C


def test_a_chassis_is_a_bench_control_world():
    w = BC.ChassisWorld(gen.generate(gen.TRAIN_SEEDS[1]))
    c = w.chassis
    world = B.make_world(w, 33, "step", case_s=120)
    assert world.params == c.params()
    assert world.ambient_c == 33
    assert world.profile.demand_w(30_000) == 0.0
    assert world.profile.demand_w(90_000) == c.card_w
    h200 = B.make_world(w, 33, "h200", case_s=480)
    loaded = max(h200.profile.demand_w(t) for t in range(100_000, 200_000, 500))
    assert 0.9 * c.card_w <= loaded <= c.card_w
    # the fast model and the oracle take it too
    peak, d2 = B.fast_curve(w, 33, "step", B.curve_points(60, 20), case_s=90)
    assert peak > 33 and 0 < d2 <= 1
    assert B._limit(w) == pytest.approx(c.ceiling_c - B.CEILING_GUARD_C)


def test_a_shipped_world_runs_the_h200_trace_too():
    w = B.make_world("rtx3080", 30, "h200", case_s=480)
    watts = B.load_w(B.load_params("rtx3080"))
    assert max(w.profile.demand_w(t) for t in range(80_000, 200_000, 500)) <= watts
    assert w.profile.demand_w(120_000) > 0.9 * watts


def test_the_alarm_gap_counts_hot_seconds_without_an_alarm_bit():
    from protocol import catalog as C

    trace = {
        "die_c": [80.0, 85.0, 85.0, 86.0, 84.9, 85.0],
        "faults": [0, 0, C.FAULT_OVER_TEMP, C.FAULT_CRITICAL_TEMP, 0, C.FAULT_FAN1_STALL],
    }
    assert BC.alarm_gap_s(trace, 85.0) == 2.0  # the 2nd and the last second


def test_the_config_hook_sends_config_set_before_the_case():
    w = BC.ChassisWorld(gen.generate(gen.VAL_SEEDS[0]))
    min_duty = B.FACTORY["fans"][0]["min_duty"]
    tr = B.simulate(w, 25, "steady", case_s=5, config={"fans.0.min_duty": min_duty})
    assert len(tr["faults"]) == 5
    with pytest.raises(RuntimeError, match="refused config_set"):
        B.simulate(w, 25, "steady", case_s=5, config={"nope.key": 1})


def test_learn_is_cold_until_the_chassis_model_exists():
    assert BC.learn(BC.ChassisWorld(gen.generate(gen.TRAIN_SEEDS[0]))) is None


def _rows():
    """Two chassis, one case each, the three controllers: duty^2 known."""
    rows = []
    for world, cls, probe, d2 in (
        ("a", "small", "die", (0.2, 0.1, 0.2)),
        ("b", "big", "mos", (0.4, 0.4, 0.1)),
    ):
        for ctl, v in zip(BC.CONTROLLERS, d2, strict=True):
            rows.append(
                {
                    "set": "val",
                    "world": world,
                    "room": 40,
                    "load": "bursts6",
                    "controller": ctl,
                    "card_class": cls,
                    "probe": probe,
                    "ceiling_c": 80.0,
                    "peak_c": 79.0,
                    "duty2": v,
                    "above_ceiling_s": 3.0 if (world, ctl) == ("b", "chassis_curve") else 0.0,
                    "above_slowdown_no_alarm_s": 1.0 if ctl == "pid" else 0.0,
                    "changes_per_min": 1.5 if world == "a" else 0.5,
                    "limit_cycle": False,
                    "oracle_duty2": 0.05,
                }
            )
    return rows


def test_summarize_the_keys_of_a_set_and_its_families():
    out = BC.summarize(_rows())
    assert out["control_chassis_learned"] == 0
    assert out["control_val_duty2_vs_curve"] == round(0.6 / 0.5, 4)
    assert out["control_val_duty2_vs_chassis_curve"] == round(0.6 / 0.3, 4)
    assert out["control_val_duty2_oracle_vs_curve"] == round(0.1 / 0.5, 4)
    assert out["control_val_seconds_above_slowdown_without_alarm"] == 2.0
    assert out["control_val_duty_changes_per_min_bursts_max"] == 1.5
    assert out["control_val_ceiling_violations"] == 0
    assert out["control_val_chassis_curve_ceiling_violations"] == 1
    assert out["control_val_peak_over_ceiling_max_c"] == -1.0
    assert out["control_val_class_small_duty2_vs_curve"] == 2.0
    assert out["control_val_probe_mos_duty2_vs_chassis_curve"] == 4.0
    # no learning yet: the learned keys are the cold ones
    for k in ("duty2_vs_curve", "ceiling_violations", "seconds_above_slowdown_without_alarm"):
        assert out[f"control_val_{k}"] == out[f"control_val_cold_{k}"]
    assert not any(k.startswith("control_train_") for k in out)


def test_the_why_table_says_whether_the_ntc_setpoint_governed():
    rows = []
    for r in _rows():
        r = dict(r, load="steady", family=f"{r['card_class']}/{r['probe']}")
        r["steady_c"] = 75.0 if r["controller"] == "pid" else 79.0
        r["ntc_tail_c"] = 70.2 if r["world"] == "a" else 60.0  # a: at the setpoint
        rows.append(r)
    lines = BC.why_table({"cases": rows}).splitlines()
    assert lines[2] == "| val | small/die | 1.000 | -5.0 | -1.0 | 70.2 | 1 of 1 |"
    assert lines[3] == "| val | big/mos | 4.000 | -5.0 | -1.0 | 60.0 | 0 of 1 |"


def test_docs_tables_are_generated_from_the_results():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    doc = json.loads(BC.CASES_FILE.read_text())
    text = BC.DOC.read_text()
    assert B.render_docs(text, BC.docs_sections(results, doc)) == text
    sizes = doc["sizes"]
    n_worlds = sizes["train"] + sizes["val"] + (len(B.WORLDS) if sizes["shipped"] else 0)
    rooms = 2 if sizes["rooms"] == "both" else 1
    assert len(doc["cases"]) == n_worlds * rooms * len(BC.LOADS) * len(BC.CONTROLLERS)
    summary = BC.summarize(doc["cases"])
    for key, value in summary.items():
        assert results[key] == value, key
