"""Two modules announcing one unique id (a cloned board), end to end (issue 9, part 3).

On b2cd58d both paired with the first GPU: the clone's stall throttled the wrong GPU
and the exporter alternated between them. Now neither is mapped while both are there,
an alert names both ports, metrics keep them apart by port, and when one goes away
the other is mapped again. Meanwhile the GPU the id was mapped to has no module it can
trust: it is protected as a GPU without working cooling (issue 23 item 4: on 4092283 it
was left as it was, and the pairs said ``gpu_lost``). Two virtual modules (the real
firmware in MicroPython) are given the same id and the same secret.
"""

from __future__ import annotations

import json
import shutil
import threading

from e2e_helpers import FAST_POLICY, MIN_W, ORIGINAL_W, SPEED, wait_for
from test_bridge_e2e import _scrape

from modbridge.bridge import Bridge
from modbridge.config import BridgeConfig, ModuleMapping
from modbridge.exporter import prometheus as exporter
from modbridge.exporter.eventlog import EventLog
from modbridge.gpu.virtual import VirtualBackend
from modbridge.policy.engine import PolicyConfig
from modbridge.sim.fleet import SimFleet


def _events(lines, kind):
    return [e for e in map(json.loads, list(lines)) if e["kind"] == kind]


def test_two_modules_with_one_id_are_not_mapped_and_kept_apart_by_port():
    fleet = SimFleet(2, world="default", profile="idle", speed=SPEED)
    original, clone = fleet.modules
    clone.uid = original.uid  # the clone: same MCU id, same secret
    shutil.copy2(original.key_path, clone.key_path)
    uid = original.uid.hex()
    gpu_a, gpu_b = fleet.gpus
    lines: list[str] = []
    bridge = thread = server = None
    fleet.start()
    try:
        cfg = BridgeConfig(
            heartbeat_period_s=0.1,
            tick_s=0.1,
            modules=[ModuleMapping(uid, gpu_a.uuid)],  # mapped by id, as an operator does
            policy=PolicyConfig(**FAST_POLICY),
        )
        backend = VirtualBackend(fleet.gpus)
        bridge = Bridge(cfg, backend, fleet.ports, event_log=EventLog(lines)).start()
        thread = threading.Thread(target=bridge.run, name="bridge-loop", daemon=True)
        thread.start()
        ports = tuple(fleet.ports)
        [alert] = wait_for(
            lambda: [e for e in _events(lines, "duplicate_module") if e["level"] == "alert"],
            15,
            "the duplicate-id alert",
        )
        assert alert["module_id"] == uid and tuple(alert["ports"]) == ports
        assert all(p in alert["message"] for p in ports)
        def module_pairs():
            return [p for p in bridge.snapshot().pairs if p.module_id is not None]

        # the alert is written when the ids are read; the snapshot's pairs follow at the
        # next tick (until then, the first module up may still show its mapping)
        wait_for(lambda: len(module_pairs()) == 2
                 and {p.gpu_uuid for p in module_pairs()} == {None}, 5,
                 "a pair per port, neither mapped")  # fmt: skip
        snap = bridge.snapshot()
        assert sorted(p.module_id for p in module_pairs()) == sorted(f"{uid}@{p}" for p in ports)
        assert not [p for p in module_pairs() if "gpu_lost" in p.reasons]  # no GPU, not lost
        # GPU A, whose module is one of the two, is protected: cut, with an alert
        [gpu_pair] = wait_for(lambda: [p for p in bridge.snapshot().pairs if p.module_id is None
                                       and "module_untrusted" in p.reasons], 10, "GPU A's pair")
        assert gpu_pair.gpu_uuid == gpu_a.uuid and gpu_pair.level == 2
        wait_for(lambda: gpu_a.power_limit_w() == MIN_W, 10, "GPU A cut to its minimum")
        [untrusted] = [e for e in _events(lines, "untrusted_module") if e["level"] == "alert"]
        assert (untrusted["gpu_uuid"], untrusted["why"]) == (gpu_a.uuid, "duplicate_id")
        assert sorted(m.module_id for m in snap.modules) == sorted(f"{uid}@{p}" for p in ports)
        assert all(tuple(m.duplicate_ports) == ports for m in snap.modules)
        # metrics: two modules, one per port, not one alternating between them
        server = exporter.serve(bridge.snapshot, "127.0.0.1", 0, process_metrics=False)
        body = _scrape(server.url)
        up = sorted(ln for ln in body.splitlines() if ln.startswith("modbridge_module_up{"))
        assert len(up) == 2 and all(ln.endswith(" 1.0") for ln in up)
        assert all(any(f'port="{p}"' in ln and f"{uid}@{p}" in ln for ln in up) for p in ports)
        # the clone's fans stall: no GPU may be throttled for it (on b2cd58d GPU A was)
        with clone.lock:
            clone.world_fault("fan_stall", 0)
            clone.world_fault("fan_stall", 1)
        wait_for(
            lambda: [p for p in bridge.snapshot().pairs if "both_fans_stalled" in p.reasons],
            20,
            "the clone's stall in its own pair",
        )
        assert gpu_b.power_limit_w() == ORIGINAL_W  # not configured: not ours to touch
        lowered = [e for e in _events(lines, "power_limit") if e.get("action") == "lower"]
        assert {e["gpu_uuid"] for e in lowered} == {gpu_a.uuid}
        assert len(_events(lines, "untrusted_module")) == 1  # one alert for the episode
        # the clone goes away: the original is mapped to its GPU again
        clone.unplug()
        wait_for(
            lambda: [p for p in module_pairs() if p.gpu_uuid == gpu_a.uuid],
            10,
            "the remaining module mapped again",
        )
        [pair] = [p for p in bridge.snapshot().pairs if p.gpu_uuid == gpu_a.uuid]
        assert pair.module_id == uid
        ok = [e for e in _events(lines, "duplicate_module") if e["level"] == "info"]
        assert ok and ok[-1]["ports"] == [ports[0]]
        assert not bridge.duplicates
        wait_for(lambda: gpu_a.power_limit_w() == ORIGINAL_W, 10, "GPU A restored")
        assert _events(lines, "untrusted_module")[-1]["level"] == "info"
        assert bridge.tick_errors == 0
    finally:
        if server is not None:
            server.stop()
        if bridge is not None:
            bridge.stop("test over")
        if thread is not None:
            thread.join(5)
        fleet.stop()
