"""Chassis the project never saw: a seeded generator of world-parameter overrides.

    from modbridge.sim import chassis
    c = chassis.generate(907)            # -> Chassis (frozen), the same for the same seed
    c.describe()                         # one line: card, probe, lag, heatsink, airflow...
    params = c.params()                  # the inherited world file + c.overrides
    for seed in chassis.TRAIN_SEEDS: ... # tune on these (and the shipped worlds) only
    for seed in chassis.VAL_SEEDS: ...   # score on these; no tuning ever looks at them

Each chassis is the ``INHERIT`` world file (``rtx3080``: a GPU in a small case, two
fans pushing through a fin stack) with ``overrides``: flat dotted keys, exactly what
``Params.override`` and ``bench_control.world_params(world, overrides)`` accept.

The ranges (issue 25, item 7; docs/control-benchmark.md, "Chassis the suite never
saw"):

=====================  ==============================================================
card                   150-700 W (the load, ``gpu.default_limit_w``), in three classes
                       by the seed: ``small`` 150-300 W, ``mid`` 300-500 W, ``big``
                       500-700 W; slowdown 80-92 degC, uniform
probe placement        by the seed: ``die`` (die-coupled: die weight 0.6-1.0, the rest
                       heatsink), ``heatsink`` (heatsink- or backplate-coupled: die
                       0-0.3, the rest heatsink), ``mos`` (beside the VRM MOSFETs: mos
                       0.3-0.7, the rest heatsink)
probe lag              ``ntc.gpu.tau_s`` 1-15 s, uniform
heatsink capacity      0.5-3x the nominal, log-uniform
airflow                0.3-1.2x the nominal, uniform: fan flow x, forced conductances
                       x^flow_exponent (the world's h ~ flow^0.8)
fans                   two (70 %) or one (30 %), see below
rooms                  ``rooms_c`` = (a cool room 15-30, a hot room 30-45 degC), whole
                       degrees, at least 10 degC apart
ambient probe          at the inlet (``["ambient"]``) or in the chassis air (``["air"]``),
                       even odds
loads                  what the bench runs on each: steady, step, bursts30, bursts6
                       (``bench_control.profile_text``) and the recorded H200 training
                       trace scaled to the card (``h200_samples``)
=====================  ==============================================================

The seed picks the card class (``seed % 3``) and the probe placement (``seed // 3 %
3``), so any 8 consecutive seeds cover every class and every placement; everything
else is drawn from ``random.Random(f"chassis:{seed}")``.

Nominal design, per card watt (scaled from the ``rtx3080`` world, which is the
nominal's 0.7x airflow and 2x heatsink at 320 W, and whose GPU section the card's is
scaled from): with ``s = card_w / 320``, die capacity 6 s J/K and 16 s W/K to the
heatsink (a die ~15 K over its heatsink at full power, whatever the card), memory and
VRM nodes likewise x s, heatsink 150 s J/K, forced conductance 51.4 s W/K and fan flow
0.04 s m^3/s per fan at full airflow, chassis air 6000 sqrt(s) J/K. GPU: idle 0.1 P,
limits 0.3 P..1.1 P, memory idle 0.38 of idle, software slowdown shedding P/8 W per K
(the 3080's 40 W/K at 320 W, the H200's 100 W/K at 700 W), hardware slowdown at
slowdown + 4 and shutdown at slowdown + 10 degC; memory temperature in NVML on the
``big`` (data-centre) class only.

One fan: the module has two fan headers and its firmware has no "fan absent"
setting (an empty header reads as a stall, whose floor runs the other fan flat out:
device/cfg/schema.py ``safety.fan_stall``). A one-fan chassis is therefore the same
air path with one fan's airflow, both headers' PWM and tach wired to that fan: fan
flow x0.5 and forced conductances x0.5^flow_exponent. In the world's thermal model
(conductance from the summed RPM at equal duties) that is exactly one fan.

Physically sane (``sane``), or the whole draw is redrawn from the same generator
(deterministic): at 100 % duty and full load in the hot room the die's steady state
is at least ``SANE_MARGIN_C`` under the ceiling (slowdown - 3 degC); at the fans'
minimum duty (the factory ``min_duty``) the die's unthrottled steady state exceeds
the ceiling in the hot room (the fans matter) and is within ``COLD_BAND_C`` of it in
the cool room (the case is not trivially cold). The rejection shapes the accepted
distribution: low airflow goes with cooler hot rooms.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from modbridge.sim import params as _params
from modbridge.sim.world import DIE, World

INHERIT = "rtx3080"
MARGIN_C = 3.0  # ceiling = slowdown - MARGIN_C (bench_control.MARGIN_C)
SANE_MARGIN_C = 2.0  # at 100 % in the hot room: die steady state <= ceiling - this
COLD_BAND_C = 20.0  # at min duty in the cool room: die steady state >= ceiling - this
MAX_DRAWS = 500

CLASSES = (("small", 150.0, 300.0), ("mid", 300.0, 500.0), ("big", 500.0, 700.0))
PLACEMENTS = ("die", "heatsink", "mos")
SLOWDOWN_C = (80.0, 92.0)
LAG_S = (1.0, 15.0)
HEATSINK_X = (0.5, 3.0)
AIRFLOW_X = (0.3, 1.2)
ONE_FAN_P = 0.3
COOL_ROOM_C = (15, 30)
HOT_ROOM_C = (30, 45)
MIN_ROOM_GAP_C = 10

# Fixed and disjoint: tune on TRAIN (and the shipped worlds), score VAL separately.
TRAIN_SEEDS = tuple(range(100, 116))
VAL_SEEDS = tuple(range(900, 916))

_REF_W = 320.0  # the rtx3080 world's card, the nominal design's reference
_TRACE = (
    Path(__file__).resolve().parents[3]
    / "tests"
    / "fixtures"
    / "nvidia-h200"
    / "h200_thermal_trace.csv"
)
_TRACE_LIMIT_W = 700.0  # the recording's enforced power limit


def _min_duty():
    from device.config import defaults

    return defaults()["fans"][0]["min_duty"]


@dataclass(frozen=True)
class Chassis:
    """One generated chassis; ``overrides`` apply to the ``inherit`` world (do not
    mutate them)."""

    name: str
    seed: int
    overrides: dict = field(repr=False)
    rooms_c: tuple
    ceiling_c: float
    slowdown_c: float
    card_w: float
    card_class: str
    probe: str  # "die" | "heatsink" | "mos"
    lag_s: float
    heatsink_x: float
    airflow_x: float
    fans: int
    amb_probe: str  # "inlet" | "air"
    inherit: str = INHERIT
    draws: int = 1  # how many draws the sanity rule took

    @property
    def family(self):
        """The bench's grouping: card class / probe placement."""
        return f"{self.card_class}/{self.probe}"

    def params(self):
        """The world parameters: the inherited world file with the overrides."""
        return _params.load(self.inherit).override(self.overrides)

    def describe(self):
        return (
            f"{self.name}: {self.card_w:.0f} W {self.card_class} card, slowdown "
            f"{self.slowdown_c:.1f} degC, probe {self.probe}-coupled, lag {self.lag_s:.1f} s, "
            f"heatsink {self.heatsink_x:.2f}x, airflow {self.airflow_x:.2f}x, "
            f"{self.fans} fan{'s' if self.fans > 1 else ''}, ambient probe "
            f"{'at the inlet' if self.amb_probe == 'inlet' else 'in chassis air'}, rooms "
            + "/".join(f"{r:g}" for r in self.rooms_c)
            + " degC"
        )


def set_name(seed):
    """``gen-train-03``, ``gen-val-07`` or ``gen-<seed>`` (a seed in neither set)."""
    if seed in TRAIN_SEEDS:
        return f"gen-train-{TRAIN_SEEDS.index(seed):02d}"
    if seed in VAL_SEEDS:
        return f"gen-val-{VAL_SEEDS.index(seed):02d}"
    return f"gen-{seed}"


def generate(seed: int) -> Chassis:
    """The chassis of ``seed`` (an int): deterministic, physically sane (redrawn
    until it is; ``ValueError`` after ``MAX_DRAWS``, which no seed tried reaches)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    rng = random.Random(f"chassis:{seed}")
    for draw in range(1, MAX_DRAWS + 1):
        c = _draw(seed, rng, draw)
        if sane(c):
            return c
    raise ValueError(f"no sane chassis for seed {seed} in {MAX_DRAWS} draws")


def _draw(seed, rng, draw):
    cls, lo_w, hi_w = CLASSES[seed % 3]
    probe = PLACEMENTS[seed // 3 % 3]
    card_w = float(round(rng.uniform(lo_w, hi_w) / 10) * 10)
    slowdown = round(rng.uniform(*SLOWDOWN_C), 1)
    lag = round(rng.uniform(*LAG_S), 1)
    hs_x = round(math.exp(rng.uniform(math.log(HEATSINK_X[0]), math.log(HEATSINK_X[1]))), 2)
    air_x = round(rng.uniform(*AIRFLOW_X), 2)
    fans = 1 if rng.random() < ONE_FAN_P else 2
    amb = "inlet" if rng.random() < 0.5 else "air"
    if probe == "die":
        w = round(rng.uniform(0.6, 1.0), 2)
        nodes, weights = ["die", "heatsink"], [w, round(1.0 - w, 2)]
    elif probe == "heatsink":
        w = round(rng.uniform(0.0, 0.3), 2)
        nodes, weights = ["die", "heatsink"], [w, round(1.0 - w, 2)]
    else:
        w = round(rng.uniform(0.3, 0.7), 2)
        nodes, weights = ["mos", "heatsink"], [w, round(1.0 - w, 2)]
    cool = rng.randint(*COOL_ROOM_C)
    hot = rng.randint(max(HOT_ROOM_C[0], cool + MIN_ROOM_GAP_C), HOT_ROOM_C[1])
    overrides = _overrides(seed, card_w, slowdown, lag, hs_x, air_x, fans, amb, nodes, weights)
    return Chassis(
        name=set_name(seed),
        seed=seed,
        overrides=overrides,
        rooms_c=(cool, hot),
        ceiling_c=round(slowdown - MARGIN_C, 1),
        slowdown_c=slowdown,
        card_w=card_w,
        card_class=cls,
        probe=probe,
        lag_s=lag,
        heatsink_x=hs_x,
        airflow_x=air_x,
        fans=fans,
        amb_probe=amb,
        draws=draw,
    )


def _overrides(seed, card_w, slowdown, lag, hs_x, air_x, fans, amb, nodes, weights):
    base = _params.load(INHERIT)
    s = card_w / _REF_W
    expo = base["heatsink"]["flow_exponent"]
    flow_x = air_x * (0.5 if fans == 1 else 1.0)  # one fan: half the air (module docstring)
    forced_x = flow_x**expo
    idle = round(0.1 * card_w, 1)
    return {
        "world.name": set_name(seed),
        "die.heat_capacity_j_per_k": round(6.0 * s, 3),
        "die.to_heatsink_w_per_k": round(16.0 * s, 3),
        "die.to_vram_w_per_k": round(0.6 * s, 3),
        "vram.heat_capacity_j_per_k": round(30.0 * s, 3),
        "vram.to_heatsink_w_per_k": round(2.5 * s, 3),
        "vram.to_air_w_per_k": round(1.5 * s, 3),
        "heatsink.heat_capacity_j_per_k": round(150.0 * s * hs_x, 2),
        "heatsink.to_air_natural_w_per_k": round(3.0 * s, 3),
        "heatsink.to_air_forced_w_per_k": round(51.4 * s * forced_x, 3),
        "mos.heat_capacity_j_per_k": round(15.0 * s, 3),
        "mos.to_heatsink_w_per_k": round(1.5 * s, 3),
        "mos.to_air_natural_w_per_k": round(0.3 * s, 3),
        "mos.to_air_forced_w_per_k": round(2.14 * s * forced_x, 3),
        "air.heat_capacity_j_per_k": round(6000.0 * math.sqrt(s), 1),
        "fans.flow_m3_per_s": round(0.04 * s * flow_x, 5),
        "gpu.name": f"generated {card_w:.0f} W GPU",
        "gpu.idle_w": idle,
        "gpu.min_limit_w": round(0.3 * card_w, 1),
        "gpu.max_limit_w": round(1.1 * card_w, 1),
        "gpu.default_limit_w": card_w,
        "gpu.memory_idle_w": round(0.38 * idle, 2),
        "gpu.memory_power_fraction": 0.16,
        "gpu.vrm_efficiency": 0.9,
        "gpu.slowdown_c": slowdown,
        "gpu.slowdown_w_per_k": round(card_w / 8.0, 1),
        "gpu.hw_slowdown_c": slowdown + 4.0,
        "gpu.shutdown_c": slowdown + 10.0,
        "gpu.memory_temperature_supported": card_w >= CLASSES[2][1],
        "ntc.gpu.sense_nodes": nodes,
        "ntc.gpu.sense_weights": weights,
        "ntc.gpu.tau_s": lag,
        "ntc.amb.sense_nodes": ["ambient" if amb == "inlet" else "air"],
        "ntc.amb.sense_weights": [1.0],
    }


def steady_die_c(params, room_c, duty, watts):
    """The die's steady state (degC) at ``watts`` of board power with both fans at
    ``duty`` (0..65535) in a ``room_c`` room, without the GPU's thermal slowdown."""
    w = World(params, seed=0, profile=None, ambient_c=room_c)
    w.set_duties(duty, duty)
    w.equilibrate()
    return w._steady(watts)[DIE]


def sane(c: Chassis) -> bool:
    """The module docstring's sanity rule."""
    p = c.params()
    cool, hot = min(c.rooms_c), max(c.rooms_c)
    full = steady_die_c(p, hot, 65535, c.card_w)
    if full > c.ceiling_c - SANE_MARGIN_C:
        return False
    low = _min_duty()
    if steady_die_c(p, hot, low, c.card_w) <= c.ceiling_c:
        return False
    return steady_die_c(p, cool, low, c.card_w) >= c.ceiling_c - COLD_BAND_C


def h200_samples(card_w, start_s=60, case_s=480):
    """The recorded H200 trace (tests/fixtures/nvidia-h200, 200 s: 20 s idle, 120 s of
    ~690 W matrix products, 60 s cool-down) as ``Profile.from_samples`` input:
    ``start_s`` idle, then the trace repeated until ``case_s`` + 10 s, its power
    scaled by ``card_w`` / 700 W (the recording's limit)."""
    with _TRACE.open(newline="") as f:
        rows = [(float(r["t_s"]), float(r["power_w"])) for r in csv.DictReader(f)]
    period_ms = int(round((rows[-1][0] + (rows[1][0] - rows[0][0])) * 1000))
    k = card_w / _TRACE_LIMIT_W
    out = [(0, 0.0), (start_s * 1000, 0.0)]
    t0 = start_s * 1000 + 1
    end = (case_s + 10) * 1000
    while t0 < end:
        for t, p in rows:
            out.append((t0 + int(round(t * 1000)), p * k))
        t0 += period_ms
    return [s for s in out if s[0] <= end + period_ms]
