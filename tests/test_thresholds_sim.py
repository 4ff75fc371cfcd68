"""End to end: a 320 W consumer card with an 83 degC slowdown, in a chassis whose
cooling cannot hold it (a clogged heatsink, a 40 degC room), NTC beside the memory
MOSFETs ~12 degC below the die. The GPU's own slowdown temperature reaches the
module in the heartbeats (the virtual GPU answers NVML's thresholds; the bridge's
heartbeat builder sends the lower of SLOWDOWN and GPU_MAX), and the module raises
over_temp before the die reaches the slowdown, where the configured 85 degC NTC
limit never would. The real firmware in MicroPython, 20x real time."""

from __future__ import annotations

import time

from modbridge.bridge import heartbeat_fields
from modbridge.gpu.virtual import VirtualBackend
from modbridge.link.session import ModuleLink
from modbridge.sim.fleet import SimFleet
from modbridge.sim.profiles import Profile
from protocol import catalog as C

CLOGGED = """inherit = "rtx3080_dusty"

[world]
name = "rtx3080_clogged"

[heatsink]
to_air_forced_w_per_k = 5.0
"""


def test_over_temperature_event_comes_before_the_gpu_throttles(tmp_path):
    world_file = tmp_path / "clogged.toml"
    world_file.write_text(CLOGGED)
    fleet = SimFleet(
        1,
        world=str(world_file),
        profile=Profile.parse("idle 30s\nhold 320W 1h\n"),
        speed=20,
        ambient_c=40.0,
        state_dir=tmp_path / "sim",
    )
    backend = VirtualBackend(fleet.gpus)
    gpu = fleet.gpus[0]
    world = fleet.worlds[0]
    slowdown_c = world.params["gpu"]["slowdown_c"]
    assert slowdown_c == 83.0
    events = []

    def on_event(status, msg):
        events.append((world.now_ms, dict(msg.fields)))

    fleet.start()
    link = ModuleLink(
        fleet.ports[0],
        keys=fleet.keys,
        heartbeat_period_s=0.05,
        heartbeat_source=lambda: heartbeat_fields(backend.sample(gpu.uuid)),
        on_event=on_event,
    )
    throttled_at = None
    try:
        link.start()
        assert link.wait_up(20)
        deadline = time.monotonic() + 120
        while world.now_ms < 240000 and time.monotonic() < deadline:
            if throttled_at is None and gpu.temperature_c() >= slowdown_c:
                throttled_at = world.now_ms
            time.sleep(0.02)
        sample = backend.sample(gpu.uuid)
    finally:
        link.stop()
        fleet.stop()
    assert heartbeat_fields(sample)["gpu_slowdown"] == 83000
    assert throttled_at is not None, "the scenario must push the die past its slowdown"
    over = [
        t
        for t, f in events
        if f["code"] == C.REASON_OVER_TEMP and f.get("index") == 0 and f.get("active")
    ]
    assert over, events
    assert over[0] < throttled_at, (over[0], throttled_at)
