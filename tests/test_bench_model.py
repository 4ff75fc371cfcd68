"""bench_model's own machinery: the coarse physics it runs at, its error measure and
its detection bookkeeping (the numbers themselves are bench/results.json's)."""

from __future__ import annotations

import math

import pytest

from bench import bench_model as bm
from modbridge.sim import params as load_params
from modbridge.sim.world import DIE, World, WorldError


def _die_path(substep_ms, seconds=600, step_s=1):
    case = bm.Case("rtx3080", load_params.load("rtx3080"), 30)
    rig = bm.Rig(case, "idle 60s\nhold 320W 20min\n", 1, substep_ms=substep_ms)
    rig.hold_duty = 19661
    out = []
    for _ in range(seconds // step_s):
        rig.step_n(step_s)
        out.append(rig.w.T[DIE])
    return out


def test_bench_physics_steps_agree_with_the_fine_world():
    fine, bench = _die_path(10), _die_path(bm.SUBSTEP_MS)
    err = [abs(a - b) for a, b in zip(fine, bench, strict=True)]
    assert max(err) < 0.4  # the die's first second after the 320 W step at 60 s
    assert max(err[:60] + err[65:]) < 0.1
    # the days-long runs: 1 s physics, sampled every LONG_STEP_S
    coarse = _die_path(bm.LONG_SUBSTEP_MS, step_s=bm.LONG_STEP_S)
    ref = bench[bm.LONG_STEP_S - 1 :: bm.LONG_STEP_S]
    assert max(abs(a - b) for a, b in zip(ref[30:], coarse[30:], strict=True)) < 0.3


def test_airflow_loss_heats_the_die_at_the_same_rpm():
    w = World(load_params.load("rtx3080"), seed=1, ambient_c=25.0)
    w.set_duties(32768, 32768)
    w.gpu.profile = w.profile = bm.Profile([(0, 10**9, "linear", (300.0, 300.0))])
    w.equilibrate()
    clean, rpm = w.T[DIE], list(w.rpm)
    w.airflow_loss(0.3)
    w.equilibrate()
    assert w.rpm == rpm and w.T[DIE] > clean + 3.0
    w.airflow_loss(0.0)
    w.equilibrate()
    assert w.T[DIE] == pytest.approx(clean)
    for bad in (-0.1, 1.5, "x", True, math.nan):
        with pytest.raises(WorldError):
            w.airflow_loss(bad)


def test_ttt_error_measure():
    assert bm.ttt_error_pct(100.0, 110.0) == pytest.approx(10.0)
    assert bm.ttt_error_pct(200.0, 100.0) == pytest.approx(50.0)
    assert bm.ttt_error_pct(math.inf, math.inf) is None  # both beyond the horizon
    assert bm.ttt_error_pct(900.0, 400.0) is None
    assert bm.ttt_error_pct(math.inf, 150.0) == pytest.approx(50.0)  # a false alarm


def test_detect_hours_bookkeeping():
    runs = [
        (1, (150.0, "dust", None, 0.27), 144.0),  # 6 h after 25 %
        (1, (130.0, "dust", None, 0.23), 144.0),  # before 25 %: 0 h
        (1, (150.0, "fan_wear", 2, 0.27), 144.0),  # the wrong cause: missed
        (0, None, 144.0),  # never: missed
    ]
    hours, loss, missed = bm._detect_hours(runs, "dust")
    assert hours == 6.0 and loss == pytest.approx(23.0) and missed == 2
    assert bm._detect_hours([(0, None, None)], "dust") == (float(bm.DUST_MAX_H), 0.0, 1)


def test_mixed_load_is_seeded_and_parses():
    a, b = bm.mixed_load(300, 60, 7), bm.mixed_load(300, 60, 7)
    assert a == b != bm.mixed_load(300, 60, 8)
    prof = bm.Profile.parse(a)
    assert prof.end_ms >= 60 * 60 * 1000
    assert all(0 <= prof.demand_w(t * 1000) <= 300 for t in range(0, 3600, 7))
