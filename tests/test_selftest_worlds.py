"""End to end: ``selftest`` on virtual modules (the real firmware in MicroPython on a
pty, ``SimFleet``), sent through ``ModuleLink.request`` as the CLI sends it (signed;
acked, then answered by ``selftest_report``), at 20x real time with heartbeats (HOSTED).

Every shipped world passes (issue 12: the default one failed with ``fan1, fan2``: the
75 % step read more than 100 % while the fans still spun up); a stalled fan, a weak
one (30 % of its RPM) and a tach of pure noise fail, and the text names the fan and why;
a working tach with noise (5 % jitter per exchange, a spike every 5 s) passes.
The worlds run in parallel (one MicroPython process each, a few seconds of wall each).
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from modbridge.link.session import ModuleLink
from modbridge.sim import params as sim_params
from modbridge.sim.fleet import SimFleet
from protocol import catalog as C

SPEED = 20.0
NOISY = "tach_noise:2/5%@0s"  # a noisy but healthy tach
FAULTS = {
    "fan_stall:1@0s": ("fan1", "stalled at 100%: 0 rpm"),
    "fan_weak:2@0s": ("fan2", "weak at 100%"),
    "tach_noise:1@0s": ("fan1", "tach implausible (unsettled)"),
}


def _worlds() -> list[str]:
    return sim_params.builtin_names()


def selftest(world: str, faults=(), seed: int = 3) -> dict:
    """Boot a virtual module in ``world`` with ``faults``, wait for HOSTED, run the
    self-test; the report's fields plus ``_world_s`` (world seconds it took) and
    ``_state`` (the module's state when it was asked)."""
    fleet = SimFleet(1, world=world, speed=SPEED, seed=seed, faults=list(faults))
    link = ModuleLink(fleet.ports[0], keys=fleet.keys, heartbeat_period_s=0.05)
    try:
        fleet.start()
        link.start()
        assert link.wait_up(30), f"{world}: no hello"
        deadline = time.monotonic() + 30
        state = None
        while time.monotonic() < deadline:
            tel = link.status.telemetry or {}
            state = tel.get("state")
            if state in (C.STATE_HOSTED, C.STATE_FAILSAFE) and tel.get("uptime_s", 0) >= 8:
                break  # warmed up (a fault puts it in FAILSAFE)
            time.sleep(0.02)
        vm = fleet.modules[0]
        t0 = vm.world.now_ms
        rep = link.request("selftest", timeout=4 * 15 * 1.5 / SPEED + 30)
        out = dict(rep.fields)
        out["_world_s"] = (vm.world.now_ms - t0) / 1000
        out["_state"] = state
        return out
    finally:
        link.stop()
        fleet.stop()


@pytest.fixture(scope="module")
def reports() -> dict:
    """Every case at once, in parallel: {(world, fault or None): report}."""
    cases = [(w, None) for w in _worlds()] + [("default", f) for f in (*FAULTS, NOISY)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futs = {c: pool.submit(selftest, c[0], [c[1]] if c[1] else []) for c in cases}
        return {c: f.result() for c, f in futs.items()}


def test_the_shipped_worlds_are_all_tested():
    assert {"default", "h200_2u", "rtx3080", "rtx3080_dusty"} <= set(_worlds())


@pytest.mark.parametrize("world", _worlds())
def test_every_shipped_world_passes(reports, world):
    r = reports[(world, None)]
    assert r["_state"] == C.STATE_HOSTED, r
    assert r["passed"] and r["text"] == "all parts passed", r
    assert r["fans_ok"] == [True, True] and r["channels_ok"] == [True] * 4, r
    assert r["power_monitor_ok"] and 11000 < r["v_in"] < 13000, r
    max_rpm = sim_params.load(world)["fans"]["max_rpm"]
    for rpm in (r["fan1_rpm"], r["fan2_rpm"]):
        # 100, 75, 50, 25 %: the tach follows the duty down, each step near the
        # world's RPM for it (fans proportional to duty), within the settling band
        assert rpm[0] > rpm[1] > rpm[2] > rpm[3] > 0, rpm
        for got, pct in zip(rpm, (100, 75, 50, 25), strict=True):
            assert abs(got - max_rpm * pct / 100) <= 0.15 * max_rpm * pct / 100 + 90, (rpm, world)
    # bounded: 4 steps of at most 15 s each; a healthy fan settles well before
    assert r["_world_s"] <= 45, r["_world_s"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fan_fault_fails_naming_the_fan(reports, fault):
    r = reports[("default", fault)]
    fan, why = FAULTS[fault]
    assert not r["passed"], r
    bad = int(fan[-1]) - 1
    assert r["fans_ok"][bad] is False, r
    assert r["text"].startswith(f"failed: {fan} {why}"), r["text"]
    assert r["channels_ok"] == [True] * 4 and r["power_monitor_ok"], r
    assert r["_world_s"] <= 4 * 15 + 2, r["_world_s"]


def test_a_noisy_but_healthy_tach_passes(reports):
    r = reports[("default", NOISY)]
    assert r["passed"] and r["text"] == "all parts passed", r
    rpm = r["fan2_rpm"]
    assert rpm[0] > rpm[1] > rpm[2] > rpm[3] > 0, rpm
