"""Tach and NTC plausibility against the simulated plants (CPython): no false positive.

Every world file in host/modbridge/sim/worlds (and the control benchmark's plant) is
run for 30 simulated minutes through load steps, a 100 W swing while regulated,
bursts and ramps, in closed loop: the firmware's NTC drivers read the world's ADC
codes, the firmware's PID (factory gains, GPU-power feed-forward) sets the duty, the
firmware's ``Fan`` drivers (board model ``sim``) count the world's tach pulses, and
``NtcWatch`` gets the INA226 input power. Neither detector may fire. A second run
steps both fans through every duty from min_spin to 100 % and back, with a stop.
Positive controls check the same loop does catch a seized fan and a frozen channel.
"""

from __future__ import annotations

from array import array

import pytest
from fakes import IRQ_FALLING, FakePin, FakePWM

from bench.bench_control import WORLD_OVERRIDES
from boards import sim as sim_board
from device import floors
from device.config import DEFAULTS
from device.control.pid import PID
from device.control.select import worst_channel
from device.drivers.fan import Fan
from device.drivers.ntc import NTC
from device.plausibility import NtcWatch
from modbridge.sim import World, load_params
from modbridge.sim.params import WORLDS_DIR
from modbridge.sim.profiles import Profile

WORLDS = sorted(p.stem for p in WORLDS_DIR.glob("*.toml"))
PLANTS = [(w, None) for w in WORLDS] + [("h200_2u", "bench")]
# Factory setpoints at the world's room temperature (the fans mostly idle at min_spin),
# and a 35 degC room with low setpoints: the PID regulates, up to 100 %, and a 100 W
# swing meets a channel the loop is holding flat.
CONDITIONS = {"factory": (None, None), "regulated": (35, [55000, 60000, 60000, 40000])}
TICK_MS = DEFAULTS["control"]["period_ms"]

MIN_SPIN = floors.fan_model(sim_board.FAN_MODEL)[floors.FM_MIN_SPIN]
PROFILE_TEXT = (
    "idle 60s\n"
    "hold 650W 5min\n"
    "hold 550W 1min\n"  # 100 W down and up while the loop regulates
    "hold 650W 1min\n"
    "hold 550W 1min\n"
    "hold 650W 1min\n"
    "bursts 650W 30s/30s 6min\n"
    "ramp 650W 200W 5min\n"
    "hold 450W 2min\n"
    "hold 350W 2min\n"
    "idle 5min\n"
)
PROFILE = Profile.parse(PROFILE_TEXT, name="plausibility")


def _profile(params):
    """PROFILE, or for a GPU whose power limit is below 650 W (a 320 W card would
    clip the 100 W swing flat) the same shape under its limit, the swing still 100 W."""
    top = params["gpu"]["default_limit_w"]
    if top >= 650:
        return PROFILE
    text = PROFILE_TEXT.replace(" 550W", f" {top - 100:g}W")
    for w in (650, 450, 350, 200):
        text = text.replace(f" {w}W", f" {round(w * top / 650)}W")
    return Profile.parse(text, name="plausibility-scaled")


class _Adc:
    """``read_u16`` over the world's codes of one channel for this tick."""

    def __init__(self):
        self.codes = [0]
        self.i = 0

    def read_u16(self):
        c = self.codes[self.i % len(self.codes)]
        self.i += 1
        return c


class Loop:
    """World + firmware drivers + PID + detectors, one control tick at a time."""

    def __init__(self, world, plant=None, allow_stop=False, seed=1, ambient_c=None, setpoints=None):
        params = load_params(world)
        if plant == "bench":
            params = params.override(WORLD_OVERRIDES)
        self.world = World(params, seed=seed, profile=_profile(params), ambient_c=ambient_c)
        self.world.set_duties(MIN_SPIN, MIN_SPIN)
        self.world.equilibrate()
        chans = DEFAULTS["channels"]
        self.adcs = [_Adc() for _ in chans]
        self.ntcs = [NTC.from_config(self.adcs[i], chans[i]) for i in range(len(chans))]
        self.setpoints = array("i", setpoints or [c["setpoint_mc"] for c in chans])
        self.controlled = sum(1 << i for i, c in enumerate(chans) if c["controlled"])
        self.pins = [FakePin(), FakePin()]
        fan_cfg = dict(DEFAULTS["fans"][0], allow_stop=allow_stop)
        model = floors.fan_model(sim_board.FAN_MODEL)
        self.fans = [
            Fan.from_config(FakePWM(), self.pins[i], IRQ_FALLING, fan_cfg, model=model)
            for i in range(2)
        ]
        p = DEFAULTS["pid"]
        self.pid = PID(
            p["kp"],
            p["ki"],
            p["kd"],
            p["kff"],
            out_min=MIN_SPIN,
            out_max=65535,
            slew_per_s=p["slew_pct_s"] * 65535 // 100,
            d_filter_ms=p["d_filter_ms"],
        )
        self.watch = NtcWatch(4, controlled=self.controlled, ambient=3)
        self.temps = array("i", [0] * 4)
        self.worst = array("i", [0, 0])
        self.now = 0
        self.frozen = None  # (channel, value): a stuck sensor, for the positive control
        self.fan_faults = 0  # every fan that was ever implausible
        self.ntc_faults = 0  # every channel the watch ever flagged
        self.min_margin = 1000  # lowest rpm / floor (1/100) while a fan was checked
        self.trace = []  # (t_s, power_mw, temps...) once a second

    def tick(self, duty=None):
        w = self.world
        w.step(TICK_MS)
        self.now += TICK_MS
        codes = w.adc_codes(8)
        valid = 0
        for i, ntc in enumerate(self.ntcs):
            self.adcs[i].codes = codes[i]
            t = ntc.read_mc()
            if ntc.fault == NTC.FAULT_NONE:
                valid |= 1 << i
                self.temps[i] = t
        if self.frozen is not None:
            self.temps[self.frozen[0]] = self.frozen[1]
        bus_mv, current_ma = w.ina226_inputs()
        power_mw = bus_mv * current_ma // 1000
        for i, n in enumerate(w.tach_pulses()):
            self.pins[i].pulse(n)
        if duty is None:
            worst_channel(self.temps, self.setpoints, self.controlled & valid, self.worst)
            duty = self.pid.step(self.worst[1], 0, TICK_MS, round(w.gpu.power_w() * 1000))
        for i, fan in enumerate(self.fans):
            fan.set_duty(duty, self.now)
            fan.update(self.now)
            if fan.implausible:
                self.fan_faults |= 1 << i
            s = fan.settled_duty
            if fan.duty and s >= fan.model[floors.FM_RPM_CHECK_DUTY]:
                floor = fan.rpm_floor * (s >> 6) // 1024
                self.min_margin = min(self.min_margin, fan.rpm * 100 // floor)
        w.set_duties(self.fans[0].duty, self.fans[1].duty)
        self.ntc_faults |= self.watch.update(self.temps, valid, power_mw, self.now)
        if self.now % 1000 == 0:
            self.trace.append((self.now // 1000, power_mw, *self.temps))

    def run(self, ms, duty=None):
        for _ in range(ms // TICK_MS):
            self.tick(duty)


def _least_move_under_swing(trace, controlled, window_s=120, bucket_s=10, swing_mw=100000):
    """The smallest peak-to-peak (mdegC) a controlled channel showed over a window
    whose 10 s power means spanned ``swing_mw`` -- what the stuck rule compares."""
    means = []
    for k in range(len(trace) // bucket_s):
        rows = trace[k * bucket_s : (k + 1) * bucket_s]
        means.append(sum(r[1] for r in rows) // len(rows))
    nb = window_s // bucket_s
    least = None
    for end in range(nb, len(means) + 1):
        if max(means[end - nb : end]) - min(means[end - nb : end]) < swing_mw:
            continue
        rows = trace[(end - nb) * bucket_s : end * bucket_s]
        for ch in range(4):
            if controlled >> ch & 1:
                vals = [r[2 + ch] for r in rows]
                pp = max(vals) - min(vals)
                least = pp if least is None else min(least, pp)
    return least


@pytest.mark.parametrize("condition", sorted(CONDITIONS))
@pytest.mark.parametrize(("world", "plant"), PLANTS)
def test_closed_loop_30_min_no_false_positive(world, plant, condition):
    ambient_c, setpoints = CONDITIONS[condition]
    loop = Loop(world, plant, ambient_c=ambient_c, setpoints=setpoints)
    loop.run(PROFILE.end_ms)
    least = _least_move_under_swing(loop.trace, loop.controlled)
    print(
        f"{world}/{plant}/{condition}: lowest rpm/floor {loop.min_margin / 100:.2f}, "
        f"least move under a 100 W swing {least} mdegC"
    )
    assert loop.fan_faults == 0, [f.implausible_kind for f in loop.fans]
    assert loop.ntc_faults == 0, (loop.watch.stuck, loop.watch.cold, loop.watch.jumpy)
    assert loop.watch.stuck_count == loop.watch.implausible_count == 0
    assert loop.min_margin >= 150  # the fans keep 1.5x their floor even spinning up
    assert least is not None and least >= 2 * loop.watch.stuck_pp_mc, least


@pytest.mark.parametrize("world", WORLDS)
def test_every_duty_from_min_spin_up_and_a_stop(world):
    loop = Loop(world, allow_stop=True)
    steps = list(range(20, 101, 10)) + list(range(90, 19, -10)) + [0, 20, 0, 100, 20]
    for pct in steps:
        loop.run(30000 if pct else 45000, duty=65535 * pct // 100)
    print(f"{world}: lowest rpm/floor {loop.min_margin / 100:.2f}")
    assert loop.fan_faults == 0, [(f.implausible_kind, f.rpm) for f in loop.fans]
    assert not any(f.stalled for f in loop.fans)
    assert loop.min_margin >= 150


@pytest.mark.parametrize("world", WORLDS)
def test_the_loop_catches_a_seized_fan_and_a_frozen_channel(world):
    # The positive controls: the same loop, a seized fan 1 and a GPU channel frozen at
    # its reading while the load steps.
    loop = Loop(world)
    loop.run(60000)
    loop.world.fan_stall(0)
    loop.run(60000)
    f = loop.fans[0]
    assert f.implausible or f.stalled, (f.rpm, f.settled_duty)
    loop = Loop(world)
    loop.run(200000)  # into the 650 W hold
    loop.frozen = (0, loop.temps[0])
    loop.run(200000)
    assert loop.watch.stuck == 0  # a flat load: nothing to judge by
    loop.run(200000)  # 650 -> 550 -> 650 W ...
    assert loop.watch.stuck == 1 << 0, (loop.watch.stuck, loop.watch.faults)
    assert loop.watch.implausible == 0
