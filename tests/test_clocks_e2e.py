"""End to end on the virtual module with ``actuator = "clocks"``: a fan stall locks the
GPU's clocks (the power limit stays), recovery unlocks them; and a GPU whose power limit
cannot be set falls back to clocks by itself. Real firmware, real link, real bridge."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

from e2e_helpers import FAST_POLICY, ORIGINAL_W, SPEED, Run, wait_for

from modbridge.bridge import Bridge, open_sim
from modbridge.config import BridgeConfig
from modbridge.exporter.eventlog import EventLog
from modbridge.gpu.base import PowerLimitRefused
from modbridge.gpu.virtual import VirtualBackend
from modbridge.policy.engine import CRITICAL, NORMAL, WARN, PolicyConfig

WARN_LOCK, CRITICAL_LOCK = (345, 1575), (345, 990)  # 0.8 / 0.5 x 1980 MHz, snapped


class NoPowerLimit(VirtualBackend):
    """A consumer card: NVML NotSupported for every power-limit write."""

    def set_power_limit_w(self, uuid, watts):
        raise PowerLimitRefused("Not Supported (test)", requested_w=watts, not_supported=True)


@contextmanager
def bridged(tmp_path, actuator="clocks", backend_cls=VirtualBackend):
    fleet, mappings = open_sim(1, "default", "idle", SPEED)
    lines: list[str] = []
    bridge = thread = None
    try:
        cfg = BridgeConfig(heartbeat_period_s=0.1, tick_s=0.1, modules=mappings,
                           actuator=actuator, policy=PolicyConfig(**FAST_POLICY))  # fmt: skip
        bridge = Bridge(cfg, backend_cls(fleet.gpus), fleet.ports, event_log=EventLog(lines),
                        state_dir=tmp_path / "state").start()  # fmt: skip
        thread = threading.Thread(target=bridge.run, name="bridge-loop", daemon=True)
        thread.start()
        wait_for(lambda: bridge.snapshot().modules[0].telemetry, 10, "first telemetry")
        yield Run(fleet, bridge, lines)
    finally:
        if bridge is not None:
            bridge.stop("test over")
        if thread is not None:
            thread.join(5)
            assert not thread.is_alive()
        fleet.stop()
        assert not any(Path(port).exists() for port in fleet.ports)


def test_fan_stall_locks_the_clocks_and_recovery_unlocks_them(tmp_path):
    with bridged(tmp_path) as r:
        assert r.gpu.locked_clocks_mhz() is None
        r.vm.world_fault("fan_stall", 0)
        wait_for(lambda: r.pair().level == WARN, 10, "WARN on one stalled fan")
        wait_for(lambda: r.gpu.locked_clocks_mhz() == WARN_LOCK, 5, "clocks at 0.8 x max")
        r.vm.world_fault("fan_stall", 1)
        wait_for(lambda: r.gpu.locked_clocks_mhz() == CRITICAL_LOCK, 10, "clocks at 0.5 x max")
        assert r.pair().level == CRITICAL
        locked = r.events("clocks", action="lower")
        assert [e["target_mhz"] for e in locked] == [1575, 990]
        assert locked[-1]["reason"] == "both_fans_stalled"
        assert r.gpu.power_limit_w() == ORIGINAL_W  # the power limit is not this GPU's actuator
        assert (tmp_path / "state" / "clocks" / f"{r.gpu.uuid}.json").exists()
        r.vm.world_fault("fan_stall", 0, False)
        r.vm.world_fault("fan_stall", 1, False)
        wait_for(lambda: r.events("clocks", action="restore"), 15, "clocks unlocked")
        assert r.gpu.locked_clocks_mhz() is None and r.pair().level == NORMAL
        assert not (tmp_path / "state" / "clocks" / f"{r.gpu.uuid}.json").exists()
        assert r.gpu.power_limit_w() == ORIGINAL_W
        assert not r.events("power_limit", action="lower")


def test_a_gpu_without_a_settable_power_limit_falls_back_to_clocks(tmp_path):
    with bridged(tmp_path, actuator="power", backend_cls=NoPowerLimit) as r:
        r.vm.world_fault("fan_stall", 0)
        wait_for(lambda: r.gpu.locked_clocks_mhz() == WARN_LOCK, 10, "clocks stand in")
        [fallback] = r.events("actuator", action="fallback")
        assert fallback["level"] == "alert" and fallback["stands_in"] is True
        assert len(r.events("power_limit", action="refused")) == 1  # one alert
        r.vm.world_fault("fan_stall", 0, False)
        wait_for(lambda: r.gpu.locked_clocks_mhz() is None, 15, "clocks unlocked")
        assert r.gpu.power_limit_w() == ORIGINAL_W
    assert r.gpu.locked_clocks_mhz() is None  # and nothing left after the stop
