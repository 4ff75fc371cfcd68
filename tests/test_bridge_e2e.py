"""End to end: the bridge against virtual modules (the real firmware in MicroPython on
ptys, SimFleet) and their virtual GPUs, 20x faster than real time, with a 0.1 s tick
(the harness, ``bridged``, is tests/e2e_helpers.py's, shared with the test_e2e_* files).

Each test starts its own fleet and bridge and stops both; an autouse fixture checks
that no link thread and no MicroPython process is left behind. Conditions are waited
for with deadlines (``wait_for``), never fixed sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from e2e_helpers import FAST_POLICY, MIN_W, ORIGINAL_W, SPEED, WARN_W, bridged, wait_for
from prometheus_client.parser import text_string_to_metric_families

from modbridge.exporter import prometheus as exporter
from modbridge.gpu.base import PowerLimitRefused
from modbridge.policy.engine import CRITICAL, NORMAL, WARN

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_leaks():
    yield
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("modbridge-link")],
        5,
        "link threads to end",
    )
    assert not [t for t in threading.enumerate() if t.name == "virtual-module"]


def test_fan_stall_lowers_the_limit_and_recovery_restores_it():
    with bridged() as r:
        assert r.gpu.power_limit_w() == ORIGINAL_W
        r.vm.world_fault("fan_stall", 0)
        wait_for(lambda: r.pair().level == WARN, 10, "WARN on one stalled fan")
        wait_for(lambda: r.gpu.power_limit_w() == WARN_W, 5, "limit at 70 %")
        r.vm.world_fault("fan_stall", 1)
        lowered = wait_for(
            lambda: r.events("power_limit", action="lower", enforced_w=MIN_W), 10, "lowered"
        )
        assert r.gpu.power_limit_w() == MIN_W
        assert lowered[-1]["reason"] == "both_fans_stalled"
        assert lowered[-1]["values"]["stalled_fans"] == 2
        decision = r.events("decision", level="CRITICAL")[-1]
        assert decision["reasons"] == ["both_fans_stalled"] and decision["target_w"] == MIN_W
        # recovery: fans back -> one level down per hold -> the original limit
        r.vm.world_fault("fan_stall", 0, False)
        r.vm.world_fault("fan_stall", 1, False)
        restored = wait_for(
            lambda: r.events("power_limit", action="restore"), 15, "original limit back"
        )
        assert restored[-1]["enforced_w"] == ORIGINAL_W == r.gpu.power_limit_w()
        assert r.pair().level == NORMAL


class ThreadRecordingBackend:
    """The virtual backend, recording the thread that issues each power-limit write."""

    def __init__(self, inner):
        self._inner = inner
        self.name = inner.name
        self.write_threads: list[str] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def set_power_limit_w(self, uuid, watts):
        self.write_threads.append(threading.current_thread().name)
        return self._inner.set_power_limit_w(uuid, watts)


def test_an_alarm_is_decided_in_the_io_thread_right_after_its_frames_are_read():
    """No hand-off to the loop's next tick: the stall's event and telemetry frames are
    read, and the same I/O thread evaluates the policy and writes the limit (through
    the actuator, journal and lock as ever)."""
    with bridged(backend_wrap=ThreadRecordingBackend, tick_s=5.0) as r:
        r.vm.world_fault("fan_stall", 0)
        wait_for(lambda: r.gpu.power_limit_w() == WARN_W, 15, "limit at 70 %")
        backend = r.bridge.backend
        assert backend.write_threads[0] == "modbridge-link io"
        assert r.bridge.inline_ticks >= 1 and r.bridge.urgent_ticks >= r.bridge.inline_ticks


def test_over_temperature_lowers_the_limit_with_reasons_and_values():
    # a loaded GPU (~50 degC at 650 W) against a 40 degC warn threshold
    with bridged(profile="hold 650W 1h", warn_temp_c=40.0, critical_temp_c=80.0) as r:
        [ev] = wait_for(lambda: r.events("power_limit", action="lower"), 10, "limit lowered")
        assert r.gpu.power_limit_w() == WARN_W
        assert ev["reason"] == "over_temp" and ev["level"] == "info"
        assert ev["values"]["gpu_temp_c"] > 40.0 and ev["values"]["warn_temp_c"] == 40.0
        assert ev["enforced_w"] == WARN_W and ev["original_w"] == ORIGINAL_W


def test_module_killed_goes_critical_within_the_silent_timeout():
    with bridged() as r:
        killed = time.monotonic()
        r.vm.stop()
        wait_for(lambda: r.pair().level == CRITICAL, 5, "CRITICAL after the module died")
        took = time.monotonic() - killed
        assert took < FAST_POLICY["module_silent_s"] + 1.0, took
        assert "module_silent" in r.pair().reasons
        wait_for(lambda: r.gpu.power_limit_w() == MIN_W, 2, "limit at the minimum")
        assert r.events("link", up=False)  # the link loss is logged too


def test_unplug_replug_reconnects_with_the_same_module():
    with bridged() as r:
        link = r.bridge.links[r.fleet.ports[0]]
        module_id = link.status.module_id
        r.vm.unplug()
        wait_for(lambda: not link.status.link_up, 5, "link down after unplug")
        r.vm.replug()
        wait_for(lambda: link.status.link_up, 10, "link up after replug")
        st = r.bridge.snapshot().modules[0]
        assert st.module_id == module_id and st.reconnects == 1
        wait_for(lambda: r.events("link", up=True, reconnects=1), 2, "reconnect event")
        assert r.pair().module_id == module_id
        assert r.pair().level == NORMAL and r.gpu.power_limit_w() == ORIGINAL_W


def test_gpu_lost_mid_run_no_write_no_crash_and_metrics_say_so():
    with bridged() as r:
        server = exporter.serve(r.bridge.snapshot, "127.0.0.1", 0, process_metrics=False)
        try:
            body = _scrape(server.url)
            assert _value(body, "modbridge_module_up") == 1.0
            assert _value(body, "modbridge_module_temperature_celsius", channel="gpu") > 0
            assert _value(body, "modbridge_gpu_power_limit_watts") == ORIGINAL_W
            assert _value(body, "modbridge_gpu_up") == 1.0
            writes_before = len(r.events("power_limit"))
            r.vm.world_fault("gpu_lost")
            wait_for(lambda: "gpu_lost" in r.pair().reasons, 5, "policy gpu_lost")
            ticks = r.bridge.ticks
            wait_for(lambda: r.bridge.ticks > ticks + 5, 5, "the loop to keep ticking")
            assert len(r.events("power_limit")) == writes_before  # nothing written
            assert r.events("decision", level="CRITICAL")[-1]["can_actuate"] is False
            body = _scrape(server.url)
            assert _value(body, "modbridge_gpu_up") == 0.0
            assert _value(body, "modbridge_gpu_state", state="lost") == 1.0
            assert r.bridge.tick_errors == 0
        finally:
            server.stop()


class RefusingBackend:
    """The virtual backend with a driver that refuses every power-limit write."""

    def __init__(self, inner):
        self._inner = inner
        self.name = inner.name
        self.attempts = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def set_power_limit_w(self, uuid, watts):
        self.attempts += 1
        raise PowerLimitRefused(f"refused {watts:g} W (test)", requested_w=watts)


def test_refused_write_is_counted_alerted_and_not_retried_every_tick():
    with bridged(backend_wrap=RefusingBackend) as r:
        with r.vm.lock:  # both at the same instant: one target, the minimum
            r.vm.world_fault("fan_stall", 0)
            r.vm.world_fault("fan_stall", 1)
        wait_for(lambda: r.pair().limit_writes_refused >= 1, 10, "a refused write")
        ticks = r.bridge.ticks
        wait_for(lambda: r.bridge.ticks > ticks + 10, 5, "more ticks")
        assert r.bridge.backend.attempts == 1  # throttled, not once per tick
        # the refusal is told once; the episode's one alert is the fallback's (the
        # clocks stand in), docs/bridge.md: one alert per episode on every path
        refused = r.events("power_limit", action="refused")
        assert len(refused) == 1 and refused[0]["level"] == "info", refused
        assert refused[0]["clamped_w"] == MIN_W and "refused" in refused[0]["message"]
        alerts = [e for e in r.events() if e.get("level") == "alert"]
        assert [(e["kind"], e["action"]) for e in alerts] == [("actuator", "fallback")], alerts
        assert alerts[0]["stands_in"] is True and "refused" in alerts[0]["message"]
        assert r.gpu.power_limit_w() == ORIGINAL_W
        server = exporter.serve(r.bridge.snapshot, "127.0.0.1", 0, process_metrics=False)
        try:
            body = _scrape(server.url)
        finally:
            server.stop()
        assert _value(body, "modbridge_policy_limit_writes_refused_total") == 1.0
        assert _value(body, "modbridge_policy_actions_total", action="refused") == 1.0
        assert r.bridge.tick_errors == 0


def test_dry_run_writes_nothing_but_logs_decisions():
    with bridged(dry_run=True) as r:
        r.vm.world_fault("fan_stall", 0)
        r.vm.world_fault("fan_stall", 1)
        [ev, *_] = wait_for(
            lambda: r.events("power_limit", action="dry_run", clamped_w=MIN_W),
            10,
            "a dry-run decision for the minimum",
        )
        assert ev["dry_run"] is True and ev["reason"] == "both_fans_stalled"
        assert "would" in ev["message"]
        assert r.events("decision", level="CRITICAL")
        assert r.gpu.power_limit_w() == ORIGINAL_W
    assert not [e for e in r.events("power_limit") if e["action"] in ("lower", "restore")]


def test_sigterm_restores_the_limits_and_exits_0(tmp_path):
    cfg = tmp_path / "modbridge.toml"
    cfg.write_text(
        "[bridge]\ntick_s = 0.1\n[policy]\nwarn_temp_c = 30.0\ncritical_temp_c = 80.0\n"
        "min_hold_s = 60.0\n"
    )
    events = tmp_path / "events.jsonl"
    cmd = [sys.executable, "-m", "modbridge", "run", "--sim", "--sim-speed", str(SPEED),
           "--config", str(cfg), "--no-metrics", "--event-log", str(events),
           "--status-every", "0"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:

        def lowered():
            if not events.exists():
                return None
            return [
                e
                for e in map(json.loads, events.read_text().splitlines())
                if e["kind"] == "power_limit" and e["action"] == "lower"
            ]

        wait_for(lowered, 20, "the demo profile's ramp to lower the limit")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, err
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    restore = [e for e in lines if e["kind"] == "power_limit" and e["action"] == "restore"]
    assert restore and restore[-1]["reason"] == "signal SIGTERM"
    assert restore[-1]["enforced_w"] == ORIGINAL_W
    stop = lines[-1]
    assert stop["kind"] == "bridge" and stop["action"] == "stop"
    assert stop["limits_restored"] is True
    assert "limits restored" in err


# -- helpers --------------------------------------------------------------------------
def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _value(body: str, name: str, **labels) -> float:
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"{name}{labels or ''} not in the scrape")


def test_heartbeats_at_the_telemetry_period_keep_the_module_hosted():
    """Heartbeats at the module's own telemetry period (1 s of module time each, the
    bridge's default against the firmware's default): over a minute of module time
    the real firmware never misses its host (no host_timeout event, HOSTED in every
    frame) and a heartbeat goes out for about every frame."""
    with bridged(heartbeat_period_s=1.0 / SPEED) as r:
        link = next(iter(r.bridge.links.values()))
        # the module boots unhosted (BOOT) until the first heartbeat reaches it
        wait_for(lambda: r.module().state == "HOSTED", 30, "the first heartbeat")
        states = set()
        frames0 = link.status.frames_total
        beats0 = link.heartbeats_sent

        def minute_seen():
            states.add(r.module().state)
            return link.status.frames_total - frames0 >= 60_000 // link.telemetry_ms

        wait_for(minute_seen, 30, "a minute of module time")
        assert states == {"HOSTED"}, states
        assert link.status.events_total["host_timeout"] == 0
        assert link.heartbeats_sent - beats0 >= 55
