"""The chassis generator (host/modbridge/sim/chassis.py): deterministic, inside the
issue's ranges, fixed disjoint training and validation sets, every chassis physically
sane (the oracle here is the issue's rule, computed from the world's own steady state)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device.config import defaults
from modbridge.sim import World, chassis
from modbridge.sim.profiles import Profile

SET_SEEDS = chassis.TRAIN_SEEDS + chassis.VAL_SEEDS
MIN_DUTY = defaults()["fans"][0]["min_duty"]


def test_the_same_seed_gives_the_same_chassis():
    for seed in (chassis.TRAIN_SEEDS[0], chassis.VAL_SEEDS[3], 12345):
        a, b = chassis.generate(seed), chassis.generate(seed)
        assert a == b
        assert a.params() == b.params()
    assert chassis.generate(100) != chassis.generate(101)


def test_train_and_val_are_fixed_disjoint_and_named():
    assert len(chassis.TRAIN_SEEDS) >= 8 and len(chassis.VAL_SEEDS) >= 8
    assert not set(chassis.TRAIN_SEEDS) & set(chassis.VAL_SEEDS)
    assert len(set(SET_SEEDS)) == len(SET_SEEDS)
    assert chassis.generate(chassis.TRAIN_SEEDS[3]).name == "gen-train-03"
    assert chassis.generate(chassis.VAL_SEEDS[7]).name == "gen-val-07"
    assert chassis.generate(7).name == "gen-7"


def check_ranges(c):
    assert 150 <= c.card_w <= 700
    lo, hi = {k: (a, b) for k, a, b in chassis.CLASSES}[c.card_class]
    assert lo <= c.card_w <= hi
    assert 80 <= c.slowdown_c <= 92
    assert c.ceiling_c == pytest.approx(c.slowdown_c - 3.0)
    assert 1 <= c.lag_s <= 15
    assert 0.5 <= c.heatsink_x <= 3.0
    assert 0.3 <= c.airflow_x <= 1.2
    assert c.fans in (1, 2)
    assert c.amb_probe in ("inlet", "air")
    cool, hot = c.rooms_c
    assert 15 <= cool <= 30 <= hot <= 45 and hot - cool >= 10
    p = c.params()  # validates every override against the world schema
    g = p["ntc.gpu"]
    assert g["tau_s"] == c.lag_s
    weights = dict(zip(g["sense_nodes"], g["sense_weights"], strict=True))
    if c.probe == "die":
        assert 0.6 <= weights["die"] <= 1.0 and set(weights) <= {"die", "heatsink"}
    elif c.probe == "heatsink":
        assert weights.get("die", 0.0) <= 0.3 and weights["heatsink"] >= 0.7
    else:
        assert 0.3 <= weights["mos"] <= 0.7 and set(weights) == {"mos", "heatsink"}
    amb = p["ntc.amb"]["sense_nodes"]
    assert amb == (["ambient"] if c.amb_probe == "inlet" else ["air"])
    gp = p["gpu"]
    assert gp["default_limit_w"] == c.card_w and gp["slowdown_c"] == c.slowdown_c
    assert gp["min_limit_w"] < gp["default_limit_w"] < gp["max_limit_w"]
    assert gp["slowdown_c"] < gp["hw_slowdown_c"] < gp["shutdown_c"]
    # heatsink capacity and airflow scale the nominal design for the card's watts
    s = c.card_w / 320.0
    assert p["heatsink"]["heat_capacity_j_per_k"] == pytest.approx(150 * s * c.heatsink_x, 1e-3)
    flow = 0.04 * s * c.airflow_x * (0.5 if c.fans == 1 else 1.0)
    assert p["fans"]["flow_m3_per_s"] == pytest.approx(flow, abs=1e-5)


def test_every_set_chassis_is_in_range():
    for seed in SET_SEEDS:
        check_ranges(chassis.generate(seed))


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=-(10**6), max_value=10**6))
def test_any_seed_is_in_range(seed):
    check_ranges(chassis.generate(seed))


def test_eight_consecutive_seeds_cover_every_class_and_placement():
    for seeds in (chassis.TRAIN_SEEDS[:8], chassis.VAL_SEEDS[:8]):
        cs = [chassis.generate(s) for s in seeds]
        assert {c.card_class for c in cs} == {k for k, _, _ in chassis.CLASSES}
        assert {c.probe for c in cs} == set(chassis.PLACEMENTS)


def steady(c, room, duty, watts):
    """The issue's oracle: the die's steady state at ``watts`` with both fans at
    ``duty``, computed by running the world (no GPU slowdown: the demand is held at
    ``watts`` by a power limit high enough, and the slowdown moved out of reach)."""
    p = c.params().override(
        {
            "gpu.slowdown_c": 190.0,
            "gpu.hw_slowdown_c": 195.0,
            "gpu.shutdown_c": 200.0,
            "adc.noise_lsb": 0.0,
        }
    )
    w = World(p, seed=0, profile=Profile.parse(f"hold {watts:g}W 2h\n"), ambient_c=room)
    w.set_duties(duty, duty)
    w.equilibrate()
    return w.T[0]


@pytest.mark.parametrize("seed", SET_SEEDS[::3] + (4242,))
def test_sane_at_full_duty_in_the_hot_room_and_not_trivial_at_the_minimum(seed):
    c = chassis.generate(seed)
    cool, hot = min(c.rooms_c), max(c.rooms_c)
    assert steady(c, hot, 65535, c.card_w) <= c.ceiling_c - chassis.SANE_MARGIN_C
    assert steady(c, hot, MIN_DUTY, c.card_w) > c.ceiling_c
    assert steady(c, cool, MIN_DUTY, c.card_w) >= c.ceiling_c - chassis.COLD_BAND_C
    # the generator's own check agrees with the oracle
    assert chassis.sane(c)


def test_an_insane_draw_is_rejected():
    c = chassis.generate(chassis.TRAIN_SEEDS[0])
    hot = dict(c.__dict__, rooms_c=(c.rooms_c[0], 75))
    assert not chassis.sane(chassis.Chassis(**hot))
    cold = dict(c.__dict__, rooms_c=(-40, c.rooms_c[1]))
    assert not chassis.sane(chassis.Chassis(**cold))


def test_one_fan_is_half_the_air_of_two():
    """A one-fan chassis is the two-fan one's air path with half the airflow."""
    c = chassis.generate(chassis.TRAIN_SEEDS[0])
    one = chassis._overrides(1, 400.0, 85.0, 5.0, 1.0, 1.0, 1, "inlet", ["die"], [1.0])
    two = chassis._overrides(1, 400.0, 85.0, 5.0, 1.0, 1.0, 2, "inlet", ["die"], [1.0])
    half = chassis._overrides(1, 400.0, 85.0, 5.0, 1.0, 0.5, 2, "inlet", ["die"], [1.0])
    assert one == half
    assert one["fans.flow_m3_per_s"] == pytest.approx(0.5 * two["fans.flow_m3_per_s"], 1e-3)
    assert c.fans in (1, 2)


def test_describe_names_what_differs():
    c = chassis.generate(chassis.VAL_SEEDS[0])
    text = c.describe()
    for part in (c.name, f"{c.card_w:.0f} W", f"lag {c.lag_s:.1f} s", c.probe, "fan"):
        assert part in text
    assert c.family == f"{c.card_class}/{c.probe}"


def test_h200_trace_is_scaled_to_the_card_and_fills_the_case():
    samples = chassis.h200_samples(350.0, start_s=60, case_s=480)
    prof = Profile.from_samples(samples, name="h200")
    assert prof.demand_w(30_000) == 0.0  # idle before the start
    loaded = [prof.demand_w(t) for t in range(100_000, 180_000, 1000)]
    assert 0.9 * 345 <= max(loaded) <= 350.0  # ~690 W of 700 W, scaled to 350 W
    assert prof.demand_w(480_000) >= 0.0 and prof.end_ms >= 490_000
    # two load phases in the case, as the recording repeats every 200 s
    assert prof.demand_w(60_000 + 200_000 + 80_000) > 300
