"""Shared by the end-to-end tests (tests/test_bridge_e2e.py and the ``test_e2e_*``
reproductions of issue 9, "Tests"): a fleet of virtual modules (the real firmware in
MicroPython on ptys) and their virtual GPUs, the real :class:`~modbridge.bridge.Bridge`
looping in a thread, and its event log as lines.

Conditions are waited for with deadlines (``wait_for``), never fixed sleeps; every
run stops its bridge and its fleet and checks that nothing is left running.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from modbridge.bridge import Bridge
from modbridge.config import BridgeConfig, ModuleMapping
from modbridge.exporter.eventlog import EventLog
from modbridge.gpu.virtual import VirtualBackend
from modbridge.link.requests import timeout_scale
from modbridge.policy.engine import PolicyConfig
from modbridge.sim.fleet import SimFleet
from modbridge.sim.profiles import Profile

__all__ = ["FAST_POLICY", "MIN_W", "ORIGINAL_W", "SPEED", "WARN_W", "Run", "bridged",
           "link_threads", "wait_for"]  # fmt: skip

SPEED = 20.0
ORIGINAL_W, MIN_W = 700.0, 200.0  # the default world's H200
WARN_W = 490.0  # warn_limit_fraction 0.7 x 700 W
FAST_POLICY = dict(module_silent_s=1.0, module_grace_s=5.0, min_hold_s=0.5)


def wait_for(pred, timeout: float, what: str, step: float = 0.05):
    """``pred()`` once true, within ``timeout`` seconds times $MODBRIDGE_TIMEOUT_SCALE
    (conftest: 4): a bound on a loaded machine's delays, not a measurement."""
    timeout *= timeout_scale()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def link_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("modbridge-link")]


class Run:
    """A started fleet + bridge (looping in a thread) + its event log lines."""

    def __init__(self, fleet, bridge, lines):
        self.fleet, self.bridge, self.lines = fleet, bridge, lines

    @property
    def vm(self):
        return self.fleet.modules[0]

    @property
    def gpu(self):
        return self.fleet.gpus[0]

    def pair(self):
        return self.bridge.snapshot().pairs[0]

    def module(self):
        return self.bridge.snapshot().modules[0]

    def events(self, kind=None, **match):
        out = []
        for line in list(self.lines):
            ev = json.loads(line)
            if (kind is None or ev["kind"] == kind) and all(
                ev.get(k) == v for k, v in match.items()
            ):
                out.append(ev)
        return out

    def decisions(self, reason=None):
        return [e for e in self.events("decision") if reason is None or reason in e["reasons"]]


@contextmanager
def bridged(profile="idle", backend_wrap=None, *, world="default", speed=SPEED, faults=(),
            state_dir=None, tick_s=0.1, ambient_c=None, dry_run=False,
            heartbeat_period_s=None, **policy):  # fmt: skip
    """A :class:`Run` of one virtual module in ``world`` under ``profile`` (a name or
    profile text) with the bridge's policy ``FAST_POLICY`` updated by ``policy``;
    ``backend_wrap(backend)`` wraps the virtual GPUs' backend; heartbeats every
    ``heartbeat_period_s`` (default: 0.1 s, or often enough for the firmware's 5 s
    host timeout at ``speed``)."""
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
            heartbeat_period_s=heartbeat_period_s or min(0.1, 1.0 / speed),
            tick_s=tick_s,
            dry_run=dry_run,
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
