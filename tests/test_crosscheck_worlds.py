"""The NTC / GPU cross-check against the simulated world (docs/policy.md, "Cross-check").

A healthy module must never raise ``sensor_disagree``: in every shipped world and in
one the check was not tuned for (a heavier heatsink, a slower NTC mounted nearer the
heatsink, a warmer room), 30 simulated minutes at full load. A frozen module NTC, a
drifting one and a frozen NVML temperature must be caught within the documented time.

Fast, without the firmware: the world (host/modbridge/sim/world.py) is stepped in
process; a stand-in module reads its ADC codes through the firmware's NTC driver
(median filter, 8x oversampling) and runs the firmware's PID (device/control/pid.py,
default gains, GPU-power feed-forward) every 100 ms, and reports telemetry every
second. The policy is evaluated at 2 Hz (the bridge's default tick) with the virtual
GPU's NVML-like readings (whole degC, 1 s power average), and its power-limit
decisions are applied to the virtual GPU.
"""

from __future__ import annotations

import pytest

from device import config as device_config
from device.control.pid import PID
from device.control.select import worst_channel
from device.drivers.ntc import NTC
from modbridge.gpu.base import GpuSample
from modbridge.model import ModuleStatus
from modbridge.policy import PairPolicy, PolicyConfig
from modbridge.sim import Profile, World, load_params
from modbridge.sim.params import builtin_names
from protocol import catalog as C

TICK_MS = 100
TELEMETRY_MS = 1000
POLICY_MS = 500
HALF_HOUR_MS = 30 * 60 * 1000
IDLE_MS = 120_000
# two idle minutes, then the GPU's whole limit (it draws what its cooling allows)
FULL_LOAD = Profile.parse("idle 2min\nhold 700W 3h")

# A chassis the cross-check was not tuned on: twice the heatsink mass, the GPU NTC
# half on the heatsink and 4x slower, a warmer room, weaker fans.
UNTUNED = {
    "world.ambient_c": 32.0,
    "heatsink.heat_capacity_j_per_k": 320.0,
    "heatsink.to_air_forced_w_per_k": 600.0,
    "ntc.gpu.sense_weights": [0.5, 0.5],
    "ntc.gpu.tau_s": 8.0,
}


class _Adc:
    """One channel's ADC: serves the codes the world produced for this tick."""

    def __init__(self):
        self.codes = []

    def read_u16(self):
        return self.codes.pop()


class HealthyModule:
    """The firmware's sensing and control law on a world, in process (no MicroPython)."""

    def __init__(self, world: World):
        self.world = world
        cfg = device_config.defaults()
        self.adcs = [_Adc() for _ in range(4)]
        luts = {}
        self.ntcs = [NTC.from_config(a, c, luts=luts) for a, c in zip(self.adcs, cfg["channels"])]
        self.setpoints = [c["setpoint_mc"] for c in cfg["channels"]]
        self.controlled = sum(1 << i for i, c in enumerate(cfg["channels"]) if c["controlled"])
        p = cfg["pid"]
        self.pid = PID(
            p["kp"], p["ki"], p["kd"], p["kff"],
            out_min=min(f["min_duty"] for f in cfg["fans"]), out_max=65535,
            slew_per_s=p["slew_pct_s"] * 65535 // 100, d_filter_ms=p["d_filter_ms"],
        )  # fmt: skip
        self.temps = [0] * 4
        self.out = [0, 0]
        self.duty = 65535
        self.ms = 0

    def tick(self):
        w = self.world
        w.step(TICK_MS)
        self.ms += TICK_MS
        codes = w.adc_codes(8)
        for i in range(4):
            self.adcs[i].codes = list(codes[i])
            self.temps[i] = self.ntcs[i].read_mc()
        worst_channel(self.temps, self.setpoints, self.controlled, self.out)
        ff = round(w.gpu.power_w() * 1000)
        self.duty = self.pid.step(self.out[1], 0, TICK_MS, ff)
        w.set_duties(self.duty, self.duty)

    def telemetry(self) -> dict:
        w = self.world
        bus_mv, i_ma = w.ina226_inputs()
        return {
            "uptime_s": self.ms // 1000,
            "state": C.STATE_HOSTED,
            "reason": C.REASON_HOST_OK,
            "faults": 0,
            "temp_gpu": self.temps[0],
            "temp_vram": self.temps[1],
            "temp_mos": self.temps[2],
            "temp_amb": self.temps[3],
            "fan1_rpm": round(w.rpm[0]),
            "fan2_rpm": round(w.rpm[1]),
            "fan1_duty": self.duty,
            "fan2_duty": self.duty,
            "v_in": bus_mv,
            "i_in": i_ma,
            "p_in": bus_mv * i_ma // 1000,
            "target": self.out[1],
        }


def gpu_sample(world: World) -> GpuSample:
    g = world.gpu
    gp = world.params["gpu"]
    lo, hi = g.power_limit_constraints_w()
    return GpuSample(
        uuid="GPU-sim",
        temperature_c=float(g.temperature_c()),
        power_w=g.power_w(),
        enforced_limit_w=g.power_limit_w(),
        default_limit_w=g.default_power_limit_w(),
        min_limit_w=lo,
        max_limit_w=hi,
        slowdown_temp_c=gp["hw_slowdown_c"],
        shutdown_temp_c=gp["shutdown_c"],
        max_operating_temp_c=gp["slowdown_c"],
    )


def drive(params, minutes, *, fault=None, fault_at_ms=None, profile=FULL_LOAD, seed=1):
    """Run the world, the module and the policy; returns ``(policy, decisions)``.

    ``fault(t_ms_since_fault, telemetry, sample)`` may change what the policy sees
    (a frozen or drifting reading) from ``fault_at_ms`` on."""
    w = World(params, seed=seed, profile=profile)
    w.set_duties(32768, 32768)
    w.equilibrate()
    m = HealthyModule(w)
    policy = PairPolicy(PolicyConfig(), "m-sim", "GPU-sim")
    status = ModuleStatus(port="sim", module_id="m-sim", link_up=True, fans=2)
    decisions = []
    for _ in range(round(minutes * 60_000 / TICK_MS)):
        m.tick()
        now_ms = m.ms
        if now_ms % TELEMETRY_MS == 0:
            status.telemetry = m.telemetry()
            status.last_frame_at = now_ms / 1000
        if now_ms % POLICY_MS:
            continue
        sample = gpu_sample(w)
        tel = status.telemetry
        if fault is not None and now_ms >= fault_at_ms:
            tel = dict(tel)
            sample = fault(now_ms - fault_at_ms, tel, sample)
        seen = ModuleStatus(**{**status.__dict__, "telemetry": tel})
        d = policy.evaluate(now_ms / 1000, seen, sample)
        decisions.append(d)
        if d.changed and d.can_actuate:
            w.gpu.set_power_limit_w(d.target_limit_w or w.gpu.default_power_limit_w())
    return policy, decisions


def first(decisions, reason):
    return next((d for d in decisions if reason in d.reasons), None)


WORLDS = [*builtin_names(), "untuned"]


def world_params(name):
    if name == "untuned":
        return load_params("default").override(UNTUNED)
    return load_params(name)


@pytest.mark.parametrize("name", WORLDS)
def test_healthy_module_never_disagrees_at_full_load(name):
    policy, decisions = drive(world_params(name), 32)
    bad = first(decisions, "sensor_disagree")
    assert bad is None, (bad.at, bad.values)
    learned = policy._crosscheck.learned()
    print(name, {k: round(v, 2) for k, v in learned.items()},
          "disagree", decisions[-1].values.get("disagree_c"),
          "gpu", decisions[-1].values["gpu_temp_c"], "levels", {d.level for d in decisions})  # fmt: skip
    assert learned, "a steady full load must teach the offset"
