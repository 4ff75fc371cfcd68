"""No time above the GPU's slowdown without an over-temperature alarm (issue 23 item 15).

    python -m bench.run slowdown

The real firmware (MicroPython unix port, sim board) lockstepped with every shipped
world (``bench.bench_control.WORLDS``: host/modbridge/sim/worlds/), in its hottest
room (40 degC), under a load step to ``bench_control.load_w`` (650 W or the GPU's
default limit) after a minute idle, faster than real time. The bench plays the host
as the bridge does (a signed heartbeat every simulated second from the virtual GPU's
sample: die, power, limit and slowdown, ``bench_control.Host``). Cases per world:

hosted       the whole run with a host; standalone: the host for ``HOSTED_S``, then no
             more heartbeats (the module on its own, with what it learned)
faults       ``fan_stall`` (fan 2 stalls at the load step), ``zero_gains`` (pid_gains
             all 0), ``flat_curve`` (a flat-0 curve in curve mode), each hosted and
             standalone

Each simulated second the die (the world's) is compared with the GPU's slowdown
temperature (the heartbeat's ``gpu_slowdown``: the lower of NVML's SLOWDOWN and
GPU_MAX, ``modbridge.gpu.base.throttle_temp_c``); a second at or above it counts in
``seconds_above_slowdown_without_alarm`` unless the module's last telemetry shows an
over-temperature or critical fault at that moment. Keys (flat numbers):

``seconds_above_slowdown_without_alarm``          total over every case (goal 0)
``seconds_above_slowdown``                         total time at or above slowdown
``seconds_above_slowdown_without_alarm_hosted``    / ``_standalone``: by host presence
``slowdown_cases``                                 cases run
``slowdown_sim_s``                                 simulated seconds in all
``slowdown_peak_die_over_slowdown_c``              the highest die - slowdown seen
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from bench.bench_control import WORLDS, Host, load_w
from modbridge.gpu.base import throttle_temp_c
from modbridge.sim import World, load_params
from modbridge.sim.profiles import Profile
from modbridge.sim.runner import VirtualModule
from protocol import catalog as C

ROOM_C = 40
IDLE_S = 60
HOSTED_S = 300  # standalone cases: the host for this long, then none
CASE_S = 900
SEED = 1
START_DUTY = 19661  # the worlds start at the steady state of fans at 30 %
FAULTS = ("fan_stall", "zero_gains", "flat_curve")
ALARM = C.FAULT_OVER_TEMP | C.FAULT_CRITICAL_TEMP
FLAT_CURVE = [[30000, 0], [90000, 0]]


def make_world(world):
    params = load_params(world)
    text = f"idle {IDLE_S}s\nhold {load_w(params):g}W {CASE_S}s\n"
    w = World(params, seed=SEED, profile=Profile.parse(text, name="step"), ambient_c=ROOM_C)
    w.set_duties(START_DUTY, START_DUTY)
    w.equilibrate()
    return w


def _configure(vm, fault):
    """Power on, then the fault's commands (signed with the boot hello's nonce)."""
    host = Host(vm)
    vm.power_on()
    vm.run_for(100)
    if fault == "zero_gains":
        host.command("pid_gains", {"kp": 0, "ki": 0, "kd": 0, "kff": 0})
    elif fault == "flat_curve":
        host.command("fan_curve", {"points": FLAT_CURVE})
        host.command("fan_mode", {"mode": C.FAN_MODES.index("curve")})
    return host


def case(args):
    """One world, fault and host presence on the firmware -> its counts."""
    world, fault, standalone = args
    w = make_world(world)
    out = {"above": 0, "unalarmed": 0, "peak": -1e9, "sim_s": CASE_S}
    with tempfile.TemporaryDirectory(prefix="bench-slowdown-") as tmp:
        vm = VirtualModule(w, tmp, speed=0, seed=SEED)
        try:
            host = _configure(vm, fault)
            slowdown = None
            for s in range(CASE_S):
                if s == IDLE_S and fault == "fan_stall":
                    vm.world_fault("fan_stall", 1, True)
                hosted = not standalone or s < HOSTED_S
                if hosted:
                    host.heartbeat()
                if slowdown is None:
                    slowdown = throttle_temp_c(host.backend.sample(w.gpu.uuid))
                vm.run_for(1000)
                if s == 2:
                    host.check_replies()
                die = w.snapshot()["die_c"]
                tel = vm.last_telemetry or {}
                out["peak"] = max(out["peak"], die - slowdown)
                if die >= slowdown:
                    out["above"] += 1
                    if not tel.get("faults", 0) & ALARM:
                        out["unalarmed"] += 1
            if vm.resets or vm.mcu_state != "running":
                raise RuntimeError(f"the module reset or stopped: {vm.stats()} {vm.last_crash}")
        finally:
            vm.stop()
    return args, out


def cases():
    return [(w, f, sa) for w in WORLDS for f in FAULTS for sa in (False, True)]


def run(workers=2) -> dict:
    wall = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as ex:
        results = list(ex.map(case, cases()))
    res = {
        "seconds_above_slowdown_without_alarm": 0,
        "seconds_above_slowdown_without_alarm_hosted": 0,
        "seconds_above_slowdown_without_alarm_standalone": 0,
        "seconds_above_slowdown": 0,
        "slowdown_cases": len(results),
        "slowdown_sim_s": 0,
        "slowdown_peak_die_over_slowdown_c": -1e9,
    }
    for (_world, _fault, standalone), out in results:
        res["seconds_above_slowdown_without_alarm"] += out["unalarmed"]
        key = "standalone" if standalone else "hosted"
        res["seconds_above_slowdown_without_alarm_" + key] += out["unalarmed"]
        res["seconds_above_slowdown"] += out["above"]
        res["slowdown_sim_s"] += out["sim_s"]
        res["slowdown_peak_die_over_slowdown_c"] = round(
            max(res["slowdown_peak_die_over_slowdown_c"], out["peak"]), 2
        )
    res["slowdown_wall_s"] = round(time.perf_counter() - wall, 1)
    return res


if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) > 1:  # one case: world fault hosted|standalone
        print(json.dumps(case((sys.argv[1], sys.argv[2], sys.argv[3] == "standalone"))[1]))
    else:
        print(json.dumps(run(), indent=1))
