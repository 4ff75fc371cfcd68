"""Soak: the firmware on the virtual module for 72 simulated hours of 650 W bursts.

    make soak                                          # = python -m bench.run --group soak
    python -m bench.run soak
    MODBRIDGE_SOAK_HOURS=1 python -m bench.run soak     # a shorter soak

Not in ``make bench`` (bench.run's default set leaves the soak group out): on the
2-core build machine the 72 h take about half an hour of wall time on their own.

The real firmware (MicroPython unix port, sim board) cools the control benchmark's
plant (``bench_control.world_params()``, 25 degC room) through the ``bursts`` profile
repeated for the whole run (650 W 30 s on / 30 s off), with the factory config (PID,
fan_mode auto) and a host that sends a heartbeat every simulated second, written with
``VirtualModule.host_write`` so the run is deterministic. Maximum speed; it is the
longest benchmark (20-30 minutes of wall time for 72 h on the 2-core build machine:
see ``soak_sim_speedup``). Heap and tick counting start after a 10-minute warm-up;
a soak no longer than that (a smoke run, e.g. ``MODBRIDGE_SOAK_HOURS=0.05``) warms up
for half its length instead.

What it watches, over the link between the sim board and the runner (no protocol
message carries these):

``soak_heap_growth_bytes_mpy``   MicroPython heap in use at the end minus after the
                                 warm-up, each measured right after a gc.collect()
                                 (link FLAG_HEAP -> ``heap_used``): a leak shows here
``soak_heap_after_warmup_bytes_mpy``, ``soak_heap_max_bytes_mpy``  the baseline and
                                 the largest of the hourly samples
``soak_missed_ticks``            control ticks that did not complete on schedule after
                                 the warm-up: the ticks due (elapsed / control period)
                                 minus the watchdog feeds the firmware sent (it feeds
                                 once per completed tick); see docs/control-benchmark.md
``soak_telemetry_missing``       telemetry frames due (one per second) minus received
``soak_resets``                  MCU resets (must be 0); ``soak_internal_errors`` the
                                 firmware's "internal error" events (must be 0)
``soak_invariant_ticks``, ``soak_invariant_violations``   firmware ticks whose commanded
                                 duties were checked against the safety floor computed
                                 from the raw ADC samples (class Invariants), and how
                                 many fell below it (must be 0)
``soak_sim_hours``, ``soak_wall_s``, ``soak_sim_speedup``, ``soak_max_die_c``
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from bench.bench_control import SETTLE_DUTY, Host, world_params
from device.config import DEFAULTS
from modbridge.sim import World
from modbridge.sim.profiles import Profile
from modbridge.sim.runner import VirtualModule

HOURS_ENV = "MODBRIDGE_SOAK_HOURS"
DEFAULT_HOURS = 72.0
AMBIENT_C = 25
SEED = 1
WARMUP_S = 600  # heap baseline and tick counting start after 10 simulated minutes
MIN_HOURS = 0.01  # 36 s: a smoke run of the machinery (warm-up: half of it)
HEAP_EVERY_S = 3600  # heap samples (each a full collection)
PERIOD_MS = DEFAULTS["control"]["period_ms"]
TELEMETRY_MS = DEFAULTS["control"]["telemetry_ms"]


def soak_hours() -> float:
    raw = os.environ.get(HOURS_ENV, "")
    if not raw:
        return DEFAULT_HOURS
    hours = float(raw)
    if not MIN_HOURS <= hours <= 10000:
        raise ValueError(f"{HOURS_ENV}={raw!r}: want {MIN_HOURS:g} .. 10000 hours")
    return hours


class Invariants:
    """The safety floor of docs/safety.md checked on every firmware tick of the soak.

    Each request of the firmware carries the duties it commands; the oracle computes
    the floor from the raw ADC samples of the steps it acted on, through the board's
    *nominal* NTC curve alone (tests/safety_harness.nominal_mc): the fan model's
    minimum spin, the hot floor of the lowest reading of the last 10 steps minus the
    calibration band, 100 % past the compiled critical end. Every number from the
    oracle's own table (tests/oracle_floors.py, written from docs/safety.md), none
    from device.floors (issue 23 item 14)."""

    def __init__(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tests"))
        import oracle_floors
        from safety_harness import UNSURE, nominal_mc

        self.orc = oracle_floors
        self.nominal_mc = nominal_mc
        self.unsure = UNSURE
        self.min_spin = oracle_floors.MIN_SPIN  # the sim fans' model: 20 % as well
        self.recent = [[] for _ in range(4)]
        self.ticks = 0
        self.violations = 0
        self.first = None

    def __call__(self, now_ms, duty, adc):
        orc = self.orc
        fl = self.min_spin
        for ch in range(4):
            code = sum(adc[ch]) // len(adc[ch])
            r = self.recent[ch]
            r.append(code)
            if len(r) > 10:
                del r[0]
            temps = [self.nominal_mc(c) for c in r]
            if any(t is None or t is self.unsure for t in temps):
                continue
            prot = min(temps) - orc.CAL_BAND_MC - 500
            fl = max(fl, orc.hot_floor(ch, prot))
            full = orc.hot_full(ch)
            if full is not None and prot >= full + 1000:
                fl = orc.CRITICAL
        self.ticks += 1
        if min(duty) < fl:
            self.violations += 1
            if self.first is None:
                self.first = (now_ms, tuple(duty), fl)


def soak(hours=None, ambient_c=AMBIENT_C, seed=SEED, progress=True) -> dict:
    hours = soak_hours() if hours is None else hours
    total_s = round(hours * 3600)
    if total_s < 2:
        raise ValueError(f"a soak of {hours:g} h is too short to measure anything")
    warmup_s = WARMUP_S if total_s > WARMUP_S else total_s // 2
    profile = Profile.parse(f"bursts 650W 30s/30s {total_s}s\n", name="soak")
    world = World(world_params(), seed=seed, profile=profile, ambient_c=ambient_c)
    world.set_duties(SETTLE_DUTY, SETTLE_DUTY)
    world.equilibrate()
    heaps = []
    max_die = world.snapshot()["die_c"]
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        vm = VirtualModule(world, tmp, speed=0, seed=seed)
        try:
            host = Host(vm)
            check = Invariants()
            vm.on_exchange = check
            vm.power_on()
            vm.run_for(100)  # the boot hello: its nonce signs the heartbeats
            start = time.perf_counter()
            base = None  # (world ms, feeds, telemetry count) after the warm-up
            for s in range(1, total_s + 1):
                host.heartbeat()
                measure = s == warmup_s or s == total_s or (s > warmup_s and s % HEAP_EVERY_S == 0)
                if measure:
                    vm.request_heap()
                    asked_at = vm.world.now_ms
                vm.run_for(1000)
                die = world.snapshot()["die_c"]
                if die > max_die:
                    max_die = die
                if measure:
                    if vm.heap_used_at_ms is None or vm.heap_used_at_ms <= asked_at:
                        raise RuntimeError("the sim board did not report its heap")
                    heaps.append(vm.heap_used)
                if s == warmup_s:
                    base = (world.now_ms, vm.wdt_feeds, vm.telemetry_count)
                if progress and s % 21600 == 0:  # every 6 simulated hours
                    wall = time.perf_counter() - start
                    print(
                        f"  soak: {s / 3600:.0f} h simulated in {wall:.0f} s ({s / wall:.0f}x)",
                        file=sys.stderr,
                        flush=True,
                    )
            wall = time.perf_counter() - start
            t_ms, feeds, frames = base
            window_ms = world.now_ms - t_ms
            missed = window_ms // PERIOD_MS - (vm.wdt_feeds - feeds)
            tel_missing = window_ms // TELEMETRY_MS - (vm.telemetry_count - frames)
            internal = sum(1 for e in vm.events if "internal error" in str(e.get("text", "")))
            resets = len(vm.resets)
            if vm.mcu_state != "running":
                resets += 1  # a halted or crashed firmware counts as one
        finally:
            vm.stop()
    return {
        "soak_heap_growth_bytes_mpy": heaps[-1] - heaps[0],
        "soak_heap_after_warmup_bytes_mpy": heaps[0],
        "soak_heap_max_bytes_mpy": max(heaps),
        "soak_missed_ticks": missed,
        "soak_telemetry_missing": tel_missing,
        "soak_resets": resets,
        "soak_internal_errors": internal,
        "soak_sim_hours": round(total_s / 3600, 3),
        "soak_wall_s": round(wall, 1),
        "soak_sim_speedup": round(total_s / wall, 1),
        "soak_max_die_c": round(max_die, 2),
        "soak_invariant_ticks": check.ticks,
        "soak_invariant_violations": check.violations,
    }


def run() -> dict:
    return soak()


if __name__ == "__main__":
    for k, v in sorted(run().items()):
        print(f"{k:40s} {v}")
