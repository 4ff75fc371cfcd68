"""The bridge's config file as the bridge uses it, and the bridge's wiring without
serial ports: pairing (config mappings, automatic), start/stop, signals, a tick that
fails, the refused-write throttle, and the ``--sim`` setup.

Links are fakes (``FakeLink``: a ModuleStatus and start/stop); GPUs are a small fake
backend. The end-to-end behaviour against real firmware is tests/test_bridge_e2e.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from modbridge import bridge as br
from modbridge.config import BridgeConfig, ConfigFileError, ModuleMapping, load, parse, tomllib
from modbridge.gpu.base import GpuBackend, GpuInfo, GpuSample, PowerLimitRefused
from modbridge.link.session import PortPermissionDenied
from modbridge.model import ModuleStatus
from modbridge.policy.engine import PolicyConfig
from protocol import catalog as C

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "modbridge.toml"
UUID_A = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"
UUID_B = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e0001"


# -- the config file ----------------------------------------------------------------------
def test_example_file_sets_every_bridge_and_exporter_key():
    cfg = load(EXAMPLE)
    data = tomllib.loads(EXAMPLE.read_text())
    assert set(data["bridge"]) == {
        "heartbeat_period_s", "tick_s", "backend", "on_exit", "dry_run", "event_log"
    }  # fmt: skip
    assert set(data["exporter"]) == {"address", "port", "enabled"}
    assert cfg.tick_s == 0.5 and cfg.exporter_port == 9659 and cfg.on_exit == "restore"
    assert cfg.policy == PolicyConfig()  # the example shows the defaults
    assert [m.gpu for m in cfg.modules] == [UUID_A, "00000000:00:07.0"]
    assert cfg.ports() == ["/dev/modbridge/by-path/pci-0000:00:14.0-usb-0:1.2:1.0"]


def test_every_policy_key_appears_in_the_example():
    from modbridge.policy.engine import _KINDS

    text = EXAMPLE.read_text()
    for key in _KINDS:
        short = key.replace("early_warning_", "")
        assert key in text or f"{short} =" in text, key


def test_problems_name_their_place():
    with pytest.raises(ConfigFileError) as e:
        parse({
            "bridge": {"tick_s": 0, "on_exit": "reset"},
            "policy": {"min_hold": 3},
            "module": [{"id": "ab", "gpu": UUID_A}, {"id": "ab", "gpu": UUID_A}, {}],
        })  # fmt: skip
    text = "\n".join(e.value.problems)
    for place in ("bridge.tick_s", "bridge.on_exit", "min_hold", "module[1].id",
                  "module[1].gpu", "module[2]"):  # fmt: skip
        assert place in text, place
    assert e.value.exit_code == 2


# -- fakes ------------------------------------------------------------------------------
class FakeBackend(GpuBackend):
    name = "fake"

    def __init__(self, *uuids, refuse=False):
        self.limits = {u: 700.0 for u in uuids}
        self.buses = {u: f"00000000:00:{6 + i:02x}.0" for i, u in enumerate(uuids)}
        self.refuse = refuse
        self.writes: list[tuple[str, float]] = []
        self.fail_reads = False

    def devices(self):
        return [GpuInfo(i, u, "Fake", self.buses[u]) for i, u in enumerate(self.limits)]

    def sample(self, uuid):
        if self.fail_reads:
            raise RuntimeError("driver bug (not a GpuError)")
        return GpuSample(uuid=uuid, name="Fake", pci_bus_id=self.buses[uuid],
                         temperature_c=50.0, enforced_limit_w=self.limits[uuid],
                         default_limit_w=700.0, min_limit_w=200.0, max_limit_w=700.0)  # fmt: skip

    def set_power_limit_w(self, uuid, watts):
        self.writes.append((uuid, watts))
        if self.refuse:
            raise PowerLimitRefused("no", requested_w=watts)
        self.limits[uuid] = watts
        return watts


class FakeLink:
    started: list[FakeLink] = []

    def __init__(self, port, status=None, fail=None, **kw):
        self.port = port
        self.status = status or ModuleStatus(port=port)
        self.fail = fail
        self.stopped = False

    def start(self):
        if self.fail:
            raise self.fail
        FakeLink.started.append(self)
        return self

    def stop(self):
        self.stopped = True

    def wait_up(self, timeout):
        return self.status.link_up

    def hello(self, module_id, stalled=0):
        s = self.status
        s.link_up, s.module_id, s.fans = True, module_id, 2
        s.last_frame_at = 1e12  # fresh whatever the clock
        s.telemetry = {"state": 1, "faults": stalled, "temp_gpu": 50000, "v_in": 12000}


def make_bridge(config, backend, ports, clock=lambda: 1e12, **kw):
    FakeLink.started = []
    return br.Bridge(config, backend, ports, link_factory=FakeLink, clock=clock, **kw).start()


# -- pairing ------------------------------------------------------------------------------
def test_one_module_one_gpu_pair_automatically():
    b = make_bridge(BridgeConfig(), FakeBackend(UUID_A), ["/dev/ttyUSB0"])
    b.links["/dev/ttyUSB0"].hello("aa01")
    b.tick()
    [pair] = b.snapshot().pairs
    assert (pair.module_id, pair.gpu_uuid, pair.original_limit_w) == ("aa01", UUID_A, 700.0)
    b.stop()


def test_mapping_by_id_by_port_and_by_bus_id(tmp_path):
    link = tmp_path / "gpu_module1"
    link.symlink_to("/dev/null")
    cfg = BridgeConfig(modules=[
        ModuleMapping("aa01", UUID_B),
        ModuleMapping(None, "00000000:00:06.0", port=str(link)),
    ])  # fmt: skip
    b = make_bridge(cfg, FakeBackend(UUID_A, UUID_B), ["/dev/ttyUSB0", "/dev/null"])
    b.links["/dev/ttyUSB0"].hello("aa01")
    b.links["/dev/null"].hello("bb02")  # matched through the symlink's target
    b.tick()
    pairs = {p.module_id: p.gpu_uuid for p in b.snapshot().pairs}
    assert pairs == {"aa01": UUID_B, "bb02": UUID_A}
    b.stop()


def test_a_port_mapping_for_another_module_id_does_not_match():
    cfg = BridgeConfig(modules=[ModuleMapping("cc03", UUID_A, port="/dev/ttyUSB0")])
    b = make_bridge(cfg, FakeBackend(UUID_A), ["/dev/ttyUSB0"])
    b.links["/dev/ttyUSB0"].hello("aa01")  # not the module the config names
    b.tick()
    assert b.snapshot().pairs[0].gpu_uuid is None
    assert b.check_mapped_modules() and "modbridge list" in b.check_mapped_modules()[0]
    b.stop()


def test_before_hello_the_pair_is_named_after_the_port():
    b = make_bridge(BridgeConfig(), FakeBackend(UUID_A), ["/dev/ttyUSB0"])
    b.tick()
    assert b.snapshot().pairs[0].module_id == "/dev/ttyUSB0"
    rep = br.report(b.snapshot())
    assert rep["modules"][0]["policy"]["level"] == "NORMAL"
    b.stop()


# -- life cycle ------------------------------------------------------------------------
def test_start_failure_stops_the_links_already_started():
    FakeLink.started = []

    def factory(port, **kw):
        fail = PortPermissionDenied("dialout") if port == "/dev/b" else None
        return FakeLink(port, fail=fail, **kw)

    b = br.Bridge(BridgeConfig(), FakeBackend(UUID_A), ["/dev/a", "/dev/b"], link_factory=factory)
    with pytest.raises(PortPermissionDenied):
        b.start()
    assert FakeLink.started and all(link.stopped for link in FakeLink.started)
    assert b.links == {}


def test_a_failing_tick_is_counted_and_the_loop_goes_on():
    gpus = FakeBackend(UUID_A)
    b = make_bridge(BridgeConfig(tick_s=0.05), gpus, ["/dev/ttyUSB0"])
    gpus.fail_reads = True
    b.run(until=lambda: b.ticks >= 3)
    assert b.tick_errors == 3
    b.stop()


def test_refused_writes_are_throttled_then_retried():
    now = [1000.0]
    gpus = FakeBackend(UUID_A, refuse=True)
    b = make_bridge(BridgeConfig(), gpus, ["/dev/ttyUSB0"], clock=lambda: now[0])
    link = b.links["/dev/ttyUSB0"]
    link.hello("aa01", stalled=C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL)
    link.status.last_frame_at = now[0]
    for _ in range(5):
        b.tick()
        now[0] += 1.0
        link.status.last_frame_at = now[0]
    assert gpus.writes == [(UUID_A, 200.0)]
    now[0] += br.REFUSED_RETRY_S
    link.status.last_frame_at = now[0]
    b.tick()
    assert len(gpus.writes) == 2 and b.snapshot().pairs[0].limit_writes_refused == 2
    b.stop()


def test_stop_restores_once_and_reports_success():
    now = [1000.0]
    gpus = FakeBackend(UUID_A)
    lines = []
    from modbridge.exporter.eventlog import EventLog

    b = make_bridge(BridgeConfig(), gpus, ["/dev/ttyUSB0"], clock=lambda: now[0],
                    event_log=EventLog(lines))  # fmt: skip
    link = b.links["/dev/ttyUSB0"]
    link.hello("aa01", stalled=C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL)
    link.status.last_frame_at = now[0]
    b.tick()
    assert gpus.limits[UUID_A] == 200.0
    assert b.stop("test") is True and b.stop("again") is True
    assert gpus.limits[UUID_A] == 700.0 and len(gpus.writes) == 2
    assert link.stopped
    assert '"action":"stop"' in lines[-1] and '"limits_restored":true' in lines[-1]


def test_signal_requests_a_stop_and_a_second_one_restores_at_once():
    now = [1000.0]
    gpus = FakeBackend(UUID_A)
    b = make_bridge(BridgeConfig(), gpus, ["/dev/ttyUSB0"], clock=lambda: now[0])
    link = b.links["/dev/ttyUSB0"]
    link.hello("aa01", stalled=C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL)
    link.status.last_frame_at = now[0]
    b.tick()
    uninstall = b.install_signal_handlers(signals=(signal.SIGUSR1,))
    try:
        signal.raise_signal(signal.SIGUSR1)
        assert b.stop_reason == "signal SIGUSR1" and b.signal_received == signal.SIGUSR1
        b.run()  # returns at once: the stop was requested
        assert gpus.limits[UUID_A] == 200.0  # nothing restored by the handler itself
        with pytest.raises(SystemExit) as e:
            signal.raise_signal(signal.SIGUSR1)
        assert e.value.code == 128 + signal.SIGUSR1
        assert gpus.limits[UUID_A] == 700.0
    finally:
        uninstall()
    b.stop()


# -- --sim ----------------------------------------------------------------------------------
def test_sim_heartbeats_follow_the_world_speed():
    assert br.sim_heartbeat_period_s(1.0, 1.0) == 1.0
    assert br.sim_heartbeat_period_s(1.0, 20.0) == 0.1
    assert br.sim_heartbeat_period_s(1.0, 0) == 0.1


def test_open_sim_maps_module_i_to_gpu_i_with_distinct_uuids():
    fleet, mappings = br.open_sim(2, profile="idle", speed=20)
    try:
        uuids = [g.uuid for g in fleet.gpus]
        assert len(set(uuids)) == 2
        assert [m.gpu for m in mappings] == uuids
        assert [m.port for m in mappings] == fleet.ports
        assert len({g.pci_bus_id for g in fleet.gpus}) == 2
        parse({"module": [{"gpu": m.gpu, "port": m.port} for m in mappings]})  # valid
    finally:
        fleet.stop()


def test_load_given_or_default_prefers_the_given_file_then_the_defaults(tmp_path, monkeypatch):
    from modbridge import config as cfgmod

    given = tmp_path / "given.toml"
    given.write_text("[bridge]\ntick_s = 2.0\n")
    default = tmp_path / "default.toml"
    monkeypatch.setattr(cfgmod, "DEFAULT_PATHS", (tmp_path / "absent.toml", default))
    assert cfgmod.load_given_or_default(None) is None  # no file anywhere: caller's defaults
    default.write_text("[bridge]\ntick_s = 3.0\n")
    assert cfgmod.load_given_or_default(None).tick_s == 3.0
    assert cfgmod.load_given_or_default(given).tick_s == 2.0
    bad = tmp_path / "bad.toml"
    bad.write_text("[bridge]\ntick_s = 0\n")
    with pytest.raises(cfgmod.ConfigFileError):
        cfgmod.load_given_or_default(bad)
    with pytest.raises(cfgmod.ConfigFileError, match="no such file"):
        cfgmod.load_given_or_default(tmp_path / "missing.toml")
