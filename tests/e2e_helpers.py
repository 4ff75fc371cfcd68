"""Shared by the ``test_e2e_*`` reproductions (issue 9, "Tests"): a fleet of virtual
modules (the real firmware in MicroPython on ptys) and their virtual GPUs, the real
:class:`~modbridge.bridge.Bridge` looping in a thread, and its event log as lines.

Conditions are waited for with deadlines (``wait_for``), never fixed sleeps; every
run stops its bridge and its fleet and checks that nothing is left running.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

from test_bridge_e2e import FAST_POLICY, MIN_W, ORIGINAL_W, SPEED, WARN_W, wait_for
from test_bridge_e2e import Run as BridgeRun

from modbridge.bridge import Bridge
from modbridge.config import BridgeConfig, ModuleMapping
from modbridge.exporter.eventlog import EventLog
from modbridge.gpu.virtual import VirtualBackend
from modbridge.policy.engine import PolicyConfig
from modbridge.sim.fleet import SimFleet
from modbridge.sim.profiles import Profile

__all__ = ["FAST_POLICY", "MIN_W", "ORIGINAL_W", "SPEED", "WARN_W", "Run", "bridged",
           "link_threads", "wait_for"]  # fmt: skip


def link_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("modbridge-link")]


class Run(BridgeRun):
    """:class:`test_bridge_e2e.Run` (fleet, bridge, event lines) with a few more views."""

    def module(self):
        return self.bridge.snapshot().modules[0]

    def decisions(self, reason=None):
        return [e for e in self.events("decision") if reason is None or reason in e["reasons"]]


@contextmanager
def bridged(profile="idle", backend_wrap=None, *, world="default", speed=SPEED, faults=(),
            state_dir=None, tick_s=0.1, ambient_c=None, **policy):  # fmt: skip
    """A :class:`Run` of one virtual module in ``world`` under ``profile`` (a name or
    profile text) with the bridge's policy ``FAST_POLICY`` updated by ``policy``."""
    if " " in profile:
        profile = Profile.parse(profile + "\n")
    fleet = SimFleet(1, world=world, profile=profile, speed=speed, faults=faults,
                     ambient_c=ambient_c).start()  # fmt: skip
    mappings = [ModuleMapping(module_id=None, gpu=g.uuid, port=p)
                for p, g in zip(fleet.ports, fleet.gpus, strict=True)]  # fmt: skip
    lines: list[str] = []
    bridge = thread = None
    try:
        cfg = BridgeConfig(
            heartbeat_period_s=min(0.1, 1.0 / speed),  # the firmware's 5 s host timeout
            tick_s=tick_s,
            modules=mappings,
            policy=PolicyConfig(**{**FAST_POLICY, **policy}),
        )
        backend = VirtualBackend(fleet.gpus)
        if backend_wrap is not None:
            backend = backend_wrap(backend)
        bridge = Bridge(cfg, backend, fleet.ports, event_log=EventLog(lines),
                        state_dir=state_dir).start()  # fmt: skip
        thread = threading.Thread(target=bridge.run, name="bridge-loop", daemon=True)
        thread.start()
        run = Run(fleet, bridge, lines)
        wait_for(lambda: bridge.snapshot().modules[0].telemetry, 10, "first telemetry")
        yield run
    finally:
        if bridge is not None:
            bridge.stop("test over")
        if thread is not None:
            thread.join(5)
            assert not thread.is_alive()
        procs = [vm._proc for vm in fleet.modules if vm._proc is not None]
        fleet.stop()
        assert all(p.poll() is not None for p in procs)  # no MicroPython left running
        assert not any(Path(port).exists() for port in fleet.ports)
        wait_for(lambda: not link_threads(), 5, "link threads to end")
