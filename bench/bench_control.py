"""Control-quality benchmark: the firmware's PID, a linear fan curve and a host-side
thermal trip, side by side on the virtual module.

    python -m bench.run control
    python -c "import bench.bench_control as b; print(b.run())"

Each run is the real firmware (MicroPython unix port, sim board) lockstepped with a
simulated world (``modbridge.sim``) at maximum speed, for the ``bench`` load profile:
idle 60 s, 650 W for 10 min, 30 s on / 30 s off bursts for 10 min, idle 5 min. The
bench plays the host: every simulated second it writes a heartbeat with the virtual
GPU's temperature, power and enforced limit (``VirtualModule.host_write``, so a run
depends only on the seed), and the commands that select the controller. Runs of the
two ambients and the controllers go to parallel processes.

Controllers (the firmware's safety floors apply to all of them):

``pid``       fan_mode auto with the factory gains (device/config.py DEFAULTS["pid"])
``pidtuned``  the same PID with ``TUNED_GAINS`` sent as pid_gains (see the docs)
``curve``     fan_mode curve with a fan2go-style linear curve (``CURVE_POINTS``)
``bangbang``  fan_mode manual, switched by the host: 100 % when the GPU temperature it
              reads reaches ``TRIP_HIGH_C``, the minimum manual duty once it is back
              to ``TRIP_LOW_C``

Metrics per controller and ambient, from samples taken every simulated second; see
docs/control-benchmark.md for the exact windows. Keys ``control_<ctl>_<amb>_<metric>``:

``overshoot_c``           max(0, max die temperature - setpoint) during the 650 W hold
``rms_error_c``           RMS of (die - setpoint) while loaded (hold and bursts)
``ss_error_c``            mean of (die - setpoint) over the last 2 minutes of the hold
``max_c``                 highest die temperature of the run
``mean_duty``             mean PWM duty of fan 1 over the run, 0..1
``duty_changes_per_min``  1 s samples whose duty differs from the previous one by > 1 %
``slowdown_s``            seconds the GPU reported thermal slowdown (SW or HW)
``ntc_overshoot_c``, ``ntc_rms_error_c``, ``ntc_ss_error_c``  the same three on the
                          quantity the firmware regulates: the worst controlled NTC
                          channel minus its own setpoint (telemetry ``target``)

plus ``control_sim_speedup`` (simulated seconds per wall second, all runs together)
and ``control_wall_s``.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from device.config import DEFAULTS
from modbridge.sim import World, load_params
from modbridge.sim import gpu as G
from modbridge.sim.profiles import Profile
from modbridge.sim.runner import VirtualModule
from protocol import catalog as C

# --- the plant ---------------------------------------------------------------------
# h200_2u with two changes (docs/control-benchmark.md has the runs without them):
# - the chassis heat capacity of a 2U box (6 kJ/K): the 31.8 kJ/K both world files
#   carry was fitted to the recording's whole server; with it the 650 W step reaches
#   ~40 % of its rise in 10 minutes (air time constant ~21 min at minimum duty) and no
#   controller ever reaches its setpoint;
# - the ambient NTC at the inlet, where device/config.py assumes it ("inlet air", warn
#   45 degC): in the chassis air it reads up to 26 degC above the room at 650 W, and
#   the resulting over-temperature floor (80 %) would be the controller under test.
WORLD = "h200_2u"
WORLD_OVERRIDES = {
    "air.heat_capacity_j_per_k": 6000.0,
    "ntc.amb.sense_nodes": ["ambient"],
    "ntc.amb.sense_weights": [1.0],
}
PROFILE = "bench"
AMBIENTS_C = (25, 35)
SEED = 1
SETTLE_DUTY = 19661  # the world starts in the steady state of fans at 30 % (as SimFleet)
SAMPLE_MS = 1000  # heartbeat period and sampling period

SETPOINT_C = DEFAULTS["channels"][0]["setpoint_mc"] / 1000  # GPU channel, 70 degC
STEP_S = (60, 660)  # the 650 W hold of the bench profile, seconds
LOADED_S = (60, 1260)  # hold and bursts
SETTLED_S = (540, 660)  # the last 2 minutes of the hold
DUTY_STEP = 65535 // 100  # "changed" = more than 1 % of full scale
SLOWDOWN_MASK = (  # the clocks event reasons that mean thermal slowdown
    G.CLOCKS_EVENT_SW_THERMAL_SLOWDOWN
    | G.CLOCKS_EVENT_HW_SLOWDOWN
    | G.CLOCKS_EVENT_HW_THERMAL_SLOWDOWN
)

# --- the controllers ---------------------------------------------------------------
CONTROLLERS = ("pid", "pidtuned", "curve", "bangbang")
# fan2go's linear curve (internal/curves/linear.go): 0 at/below `min`, linear to 255 at
# `max`; its example config uses min 40 / max 80 degC, and with neverStop the bottom is
# the fan's minimum PWM. Here: the firmware's minimum duty (20 %) at 40 degC, 100 % at
# 80 degC, and the 2 degC hysteresis that the firmware and FanControl default to.
CURVE_POINTS = [[40000, DEFAULTS["fans"][0]["min_duty"]], [80000, 65535]]
CURVE_HYSTERESIS_MC = 2000
TRIP_HIGH_C = 75
TRIP_LOW_C = 70
MIN_MANUAL_DUTY = DEFAULTS["safety"]["min_manual_duty"]  # 30 %
# kp 20 %/degC, ki 2 %/(degC s), no D, no feed-forward (milli-units; docs say why)
TUNED_GAINS = {"kp": 20000, "ki": 2000, "kd": 0, "kff": 0}


def world_params(world=WORLD, overrides=None):
    params = load_params(world)
    overrides = WORLD_OVERRIDES if overrides is None and world == WORLD else overrides
    return params.override(overrides) if overrides else params


class Host:
    """The bench's side of the protocol: heartbeats and commands, acks checked."""

    def __init__(self, vm):
        self.vm = vm
        self.seq = 0
        self.pending = {}  # seq -> command name, until acked
        self.commands = 0

    def command(self, name, fields=None):
        self.seq = (self.seq + 1) & 0xFFFF
        self.pending[self.seq] = name
        self.commands += 1
        self.vm.host_write(self.vm.encode(name, fields or {}, self.seq))

    def heartbeat(self):
        gpu = self.vm.world.gpu
        fields = {
            "gpu_temp": int(gpu.temperature_c()) * 1000,
            "gpu_power": round(gpu.power_w() * 1000),
            "power_limit": round(gpu.power_limit_w() * 1000),
        }
        mem = gpu.memory_temperature_c()
        if mem is not None:
            fields["gpu_mem_temp"] = int(mem) * 1000
        self.seq = (self.seq + 1) & 0xFFFF
        self.vm.host_write(self.vm.encode("heartbeat", fields, self.seq))

    def check_replies(self):
        """After the exchange that carried the commands: each must have been acked."""
        if not self.pending:
            return
        for name, fields in self.vm.messages:
            ref = fields.get("ref") if name in ("ack", "nack") else None
            if ref not in self.pending:
                continue
            if name == "nack":
                raise RuntimeError(f"the firmware refused {self.pending[ref]}: {fields}")
            del self.pending[ref]
        if self.pending:
            raise RuntimeError(f"no answer to {sorted(self.pending.values())}")


def _setup(host, controller, gains=None):
    if controller == "pid":
        return
    if controller == "pidtuned":
        host.command("pid_gains", gains or TUNED_GAINS)
    elif controller == "curve":
        host.command("fan_curve", {"points": CURVE_POINTS, "hysteresis": CURVE_HYSTERESIS_MC})
        host.command("fan_mode", {"mode": C.FAN_MODES.index("curve")})
    elif controller == "bangbang":
        _manual(host, MIN_MANUAL_DUTY)
    else:
        raise ValueError(f"unknown controller {controller!r}; have {', '.join(CONTROLLERS)}")


def _manual(host, duty):
    host.command("fan_mode", {"mode": C.FAN_MODES.index("manual"), "duty1": duty, "duty2": duty})


def simulate(
    controller, ambient_c, profile=PROFILE, seed=SEED, duration_s=None, params=None, gains=None
):
    """Run one controller through ``profile``; a dict of per-second samples and stats.

    Samples (lists, one entry per simulated second, taken at the end of it): ``t_s``,
    ``die_c`` (world), ``gpu_c`` (what the host reads), ``duty`` (fan 1 PWM, 0..65535),
    ``err_c`` (telemetry target: worst controlled NTC minus its setpoint, None when
    missing), ``state`` and ``faults`` (telemetry), ``slowdown`` (bool).
    """
    prof = Profile.get(profile)
    if duration_s is None:
        duration_s = math.ceil(prof.end_ms / 1000)
    world = World(params or world_params(), seed=seed, profile=prof, ambient_c=ambient_c)
    world.set_duties(SETTLE_DUTY, SETTLE_DUTY)
    world.equilibrate()
    keys = ("t_s", "die_c", "gpu_c", "duty", "err_c", "state", "faults", "slowdown")
    trace = {k: [] for k in keys}
    with tempfile.TemporaryDirectory(prefix="bench-control-") as tmp:
        vm = VirtualModule(world, tmp, speed=0, seed=seed)
        try:
            host = Host(vm)
            vm.power_on()
            vm.run_for(100)  # the boot hello: its nonce signs the commands
            _setup(host, controller, gains)
            high = False
            wall = time.perf_counter()
            for _ in range(duration_s):
                gpu = world.gpu
                host.heartbeat()
                if controller == "bangbang":
                    t = gpu.temperature_c()
                    if not high and t >= TRIP_HIGH_C:
                        high = True
                        _manual(host, 65535)
                    elif high and t <= TRIP_LOW_C:
                        high = False
                        _manual(host, MIN_MANUAL_DUTY)
                vm.run_for(SAMPLE_MS)
                host.check_replies()
                tel = vm.last_telemetry or {}
                target = tel.get("target")
                trace["t_s"].append(world.now_ms / 1000)
                trace["die_c"].append(world.snapshot()["die_c"])
                trace["gpu_c"].append(gpu.temperature_c())
                trace["duty"].append(world.duties[0])
                trace["err_c"].append(None if target is None else target / 1000)
                trace["state"].append(tel.get("state"))
                trace["faults"].append(tel.get("faults", 0))
                trace["slowdown"].append(bool(gpu.clocks_event_reasons() & SLOWDOWN_MASK))
            wall = time.perf_counter() - wall
            if vm.resets or vm.mcu_state != "running":
                raise RuntimeError(f"the module reset or stopped: {vm.stats()} {vm.last_crash}")
            trace.update(
                controller=controller,
                ambient_c=ambient_c,
                sim_s=duration_s,
                wall_s=wall,
                commands=host.commands,
            )
        finally:
            vm.stop()
    return trace


def _window(trace, key, lo_s, hi_s):
    return [
        v
        for t, v in zip(trace["t_s"], trace[key], strict=True)
        if lo_s < t <= hi_s and v is not None
    ]


def metrics(trace, setpoint_c=SETPOINT_C, step_s=STEP_S, loaded_s=LOADED_S, settled_s=SETTLED_S):
    """The benchmark's numbers for one trace (see the module docstring).

    Windows are (lo, hi] in simulated seconds: samples taken after lo up to hi.
    """
    die_step = _window(trace, "die_c", *step_s)
    die_loaded = _window(trace, "die_c", *loaded_s)
    die_settled = _window(trace, "die_c", *settled_s)
    err_step = _window(trace, "err_c", *step_s)
    err_loaded = _window(trace, "err_c", *loaded_s)
    err_settled = _window(trace, "err_c", *settled_s)
    duty = trace["duty"]
    minutes = len(duty) * SAMPLE_MS / 60000
    changes = sum(1 for a, b in zip(duty, duty[1:], strict=False) if abs(b - a) > DUTY_STEP)
    return {
        "overshoot_c": max(0.0, max(die_step) - setpoint_c) if die_step else 0.0,
        "rms_error_c": _rms([t - setpoint_c for t in die_loaded]),
        "ss_error_c": _mean(die_settled) - setpoint_c if die_settled else 0.0,
        "max_c": max(trace["die_c"]),
        "mean_duty": sum(duty) / len(duty) / 65535,
        "duty_changes_per_min": changes / minutes if minutes else 0.0,
        "slowdown_s": sum(trace["slowdown"]) * SAMPLE_MS / 1000,
        "ntc_overshoot_c": max(0.0, max(err_step)) if err_step else 0.0,
        "ntc_rms_error_c": _rms(err_loaded),
        "ntc_ss_error_c": _mean(err_settled) if err_settled else 0.0,
    }


def _mean(values):
    return sum(values) / len(values)


def _rms(values):
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def _job(args):
    controller, ambient_c = args
    trace = simulate(controller, ambient_c)
    return controller, ambient_c, metrics(trace), trace["sim_s"], trace["wall_s"]


def run(controllers=CONTROLLERS, ambients=AMBIENTS_C, workers=None) -> dict:
    jobs = [(c, a) for a in ambients for c in controllers]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    start = time.perf_counter()
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = list(pool.map(_job, jobs))
    else:
        done = [_job(j) for j in jobs]
    wall = time.perf_counter() - start
    out = {}
    sim_total = 0
    for controller, ambient_c, m, sim_s, _ in done:
        sim_total += sim_s
        for key, value in m.items():
            out[f"control_{controller}_{ambient_c:g}_{key}"] = round(value, 4)
    out["control_sim_speedup"] = round(sim_total / wall, 1)
    out["control_wall_s"] = round(wall, 1)
    return out


if __name__ == "__main__":
    for k, v in sorted(run().items()):
        print(f"{k:48s} {v}")
