"""The Prometheus exporter: values, units, absences, naming, HTTP endpoint lifecycle.

Snapshots are built by hand from wire values (what a link would store), scraped with
``generate_latest`` and over real HTTP on 127.0.0.1, and parsed back with
prometheus_client's own parsers.
"""

from __future__ import annotations

import math
import re
import socket
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import exposition, generate_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from modbridge import __version__
from modbridge.chassis import ChassisReport
from modbridge.exporter import collector as collector_module
from modbridge.exporter import prometheus as X
from modbridge.exporter import render as render_module
from modbridge.exporter.endpoint import _fast_format, _Gzip
from modbridge.exporter.process import _ProcessMetrics
from modbridge.exporter.walk import _Blocks
from modbridge.gpu.base import CLOCKS_EVENT_REASONS, GpuSample
from modbridge.model import BridgeSnapshot, ModuleStatus, PairState
from protocol import catalog as C
from protocol.frame import ERROR_KINDS

REPO_ROOT = Path(__file__).resolve().parent.parent
NOW = 1000.0  # the collector's clock in these tests (time.monotonic() stand-in)
MOD = "e6614103e7"
UUID = "GPU-9c8a4f1e-3b2d-4e5f-8a7b-1c2d3e4f5a6b"


# -- snapshot builders (wire values, as the link stores them) -------------------------
def module(**kw) -> ModuleStatus:
    telemetry = {
        "uptime_s": 273_512,
        "state": C.STATE_HOSTED,
        "reason": C.REASON_HOST_OK,
        "faults": 0,
        "temp_gpu": 72_300,
        "temp_vram": 68_150,
        "temp_mos": 55_020,
        "temp_amb": 24_480,
        "fan1_rpm": 2850,
        "fan2_rpm": 2790,
        "fan1_duty": 32_768,
        "fan2_duty": 65_535,
        "v_in": 11_920,
        "i_in": 20_500,
        "p_in": 244_360,
    }
    telemetry.update(kw.pop("telemetry", {}))
    fields = dict(
        port="/dev/ttyUSB0",
        module_id=MOD,
        link_up=True,
        last_frame_at=NOW - 0.25,
        connected_at=NOW - 600,
        fw_version="0.3.1",
        proto_version="1.0",
        board="pico",
        channels=C.CHANNELS,
        fans=2,
        telemetry=telemetry,
        telemetry_at=NOW - 0.25,
        events_total=Counter({"host_ok": 3, "boot": 1}),
        frame_errors=Counter({"crc": 2, "noise": 5}),
        frames_total=12_345,
        reconnects=1,
        module_resets=2,
    )
    fields.update(kw)
    return ModuleStatus(**fields)


def gpu(**kw) -> GpuSample:
    fields = dict(
        uuid=UUID,
        name="NVIDIA H200",
        pci_bus_id="00000000:00:06.0",
        timestamp=NOW - 0.1,
        temperature_c=71.0,
        memory_temperature_c=None,  # NotSupported
        power_w=512.25,
        enforced_limit_w=600.0,
        default_limit_w=700.0,
        min_limit_w=200.0,
        max_limit_w=700.0,
        clocks_event_reasons=CLOCKS_EVENT_REASONS["sw_power_cap"]
        | CLOCKS_EVENT_REASONS["sw_thermal_slowdown"],
        utilization=0.97,
        fan_speed_ratio=None,  # data-centre GPU: no fan
        slowdown_temp_c=90.0,
        shutdown_temp_c=95.0,
        max_operating_temp_c=87.0,
    )
    fields.update(kw)
    return GpuSample(**fields)


def pair(**kw) -> PairState:
    fields = dict(
        module_id=MOD,
        gpu_uuid=UUID,
        level=1,
        reasons=("module_over_temp",),
        eta_s=42.5,
        target_limit_w=600.0,
        original_limit_w=700.0,
        actions_total=Counter({"lower": 2, "restore": 1}),
        limit_writes_refused=0,
    )
    fields.update(kw)
    return PairState(**fields)


def chassis(**kw) -> ChassisReport:
    fields = dict(
        converged=True,
        params={"ok": 1, "unc_mc": 1800},
        unc_c=1.8,
        time_to_throttle_s=412.5,
        time_to_throttle_full_s=math.inf,
        conductance_ratio=0.92,
        fan_rpm_ratios=(1.0, 0.97),
        cooling_degraded=True,
        cause="dust",
        throttle_in_days=12.5,
        inlet_c=24.5,
    )
    fields.update(kw)
    return ChassisReport(**fields)


def snapshot(modules=None, gpus=None, pairs=None, taken_at=NOW - 0.5, chassis_reports=None):
    modules = [module()] if modules is None else modules
    if chassis_reports is None:
        chassis_reports = {m.module_id: chassis() for m in modules if m.module_id}
    return BridgeSnapshot(
        taken_at=taken_at,
        modules=modules,
        gpus=[gpu()] if gpus is None else gpus,
        pairs=[pair()] if pairs is None else pairs,
        backend="virtual",
        chassis=chassis_reports,
    )


def collector(snap):
    return X.BridgeCollector(lambda: snap, clock=lambda: NOW)


def scrape(snap) -> dict:
    """Families by name, parsed from the Prometheus text format."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    reg.register(collector(snap))
    text = generate_latest(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(families: dict, name: str) -> dict:
    """{frozenset(labels.items()): value} of one family's samples."""
    fam = families.get(name)
    if fam is None:
        return {}
    return {frozenset(s.labels.items()): s.value for s in fam.samples}


def value(families, name, **labels):
    return values(families, name)[frozenset(labels.items())]


# -- values and units ------------------------------------------------------------------
def test_module_readings_in_base_units():
    f = scrape(snapshot())
    assert value(f, "modbridge_module_temperature_celsius", module=MOD, channel="gpu") == 72.3
    assert value(f, "modbridge_module_temperature_celsius", module=MOD, channel="amb") == 24.48
    assert value(f, "modbridge_module_fan_duty_ratio", module=MOD, fan="1") == pytest.approx(
        32768 / 65535
    )
    assert value(f, "modbridge_module_fan_duty_ratio", module=MOD, fan="1") == pytest.approx(
        0.5000076295, abs=1e-10
    )
    assert value(f, "modbridge_module_fan_duty_ratio", module=MOD, fan="2") == 1.0
    assert value(f, "modbridge_module_fan_speed_rpm", module=MOD, fan="1") == 2850
    assert value(f, "modbridge_module_input_volts", module=MOD) == 11.92
    assert value(f, "modbridge_module_input_amperes", module=MOD) == 20.5
    assert value(f, "modbridge_module_input_watts", module=MOD) == 244.36
    assert value(f, "modbridge_module_last_frame_age_seconds", module=MOD) == pytest.approx(0.25)
    assert value(f, "modbridge_module_up", module=MOD, port="/dev/ttyUSB0") == 1


def test_every_ratio_is_within_0_and_1():
    f = scrape(snapshot())
    ratios = [n for n in f if n.endswith("_ratio")]
    assert ratios
    for name in ratios:
        for v in values(f, name).values():
            assert 0.0 <= v <= 1.0, (name, v)


def test_module_state_and_faults_are_one_hot():
    faults = C.FAULT_FAN1_STALL | C.FAULT_OVER_TEMP
    f = scrape(snapshot([module(telemetry={"state": C.STATE_FAILSAFE, "faults": faults})]))
    state = {dict(k)["state"]: v for k, v in values(f, "modbridge_module_state").items()}
    assert state == {s: (1.0 if s == "FAILSAFE" else 0.0) for s in C.STATES}
    fault = {dict(k)["fault"]: v for k, v in values(f, "modbridge_module_fault").items()}
    assert set(fault) == set(C.FAULT_BITS)
    assert {k for k, v in fault.items() if v == 1} == {"fan1_stall", "over_temp"}


def test_unknown_state_from_a_newer_firmware_is_still_shown():
    f = scrape(snapshot([module(telemetry={"state": 9})]))
    state = {dict(k)["state"]: v for k, v in values(f, "modbridge_module_state").items()}
    assert state["9"] == 1 and sum(state.values()) == 1


def test_counters_and_every_frame_error_kind_present_at_zero():
    f = scrape(snapshot())
    errors = {dict(k)["kind"]: v for k, v in values(f, "modbridge_module_frame_errors").items()}
    assert set(errors) == set(ERROR_KINDS)
    assert errors["crc"] == 2 and errors["noise"] == 5 and errors["oversize"] == 0
    events = {dict(k)["reason"]: v for k, v in values(f, "modbridge_module_events").items()}
    assert set(events) == set(C.REASONS) and events["host_ok"] == 3 and events["boot"] == 1
    # text format: family "modbridge_module_frames" of type counter, samples "..._total"
    for fam in (
        "modbridge_module_frames",
        "modbridge_module_reconnects",
        "modbridge_module_resets",
        "modbridge_module_events",
        "modbridge_module_frame_errors",
        "modbridge_policy_actions",
        "modbridge_policy_limit_writes_refused",
    ):
        assert f[fam].type == "counter", fam
        assert {s.name for s in f[fam].samples} == {fam + "_total"}, fam
    assert value(f, "modbridge_module_frames", module=MOD) == 12_345
    assert value(f, "modbridge_module_reconnects", module=MOD) == 1
    assert value(f, "modbridge_module_resets", module=MOD) == 2


def test_info_metrics_carry_ids():
    f = scrape(snapshot())
    (labels,) = values(f, "modbridge_module_info")
    assert dict(labels) == {
        "module": MOD,
        "port": "/dev/ttyUSB0",
        "firmware": "0.3.1",
        "protocol": "1.0",
        "board": "pico",
        "gpu": UUID,
        "gpu_name": "NVIDIA H200",
    }
    assert f["modbridge_module_info"].samples[0].value == 1
    (labels,) = values(f, "modbridge_gpu_info")
    assert dict(labels) == {"gpu": UUID, "name": "NVIDIA H200", "pci_bus_id": "00000000:00:06.0"}
    (labels,) = values(f, "modbridge_build_info")
    assert dict(labels) == {"version": __version__, "backend": "virtual"}


def test_gpu_metrics():
    f = scrape(snapshot())
    assert value(f, "modbridge_gpu_temperature_celsius", gpu=UUID) == 71.0
    assert value(f, "modbridge_gpu_power_watts", gpu=UUID) == 512.25
    assert value(f, "modbridge_gpu_power_limit_watts", gpu=UUID) == 600.0
    assert value(f, "modbridge_gpu_power_limit_default_watts", gpu=UUID) == 700.0
    assert value(f, "modbridge_gpu_power_limit_min_watts", gpu=UUID) == 200.0
    assert value(f, "modbridge_gpu_power_limit_max_watts", gpu=UUID) == 700.0
    assert value(f, "modbridge_gpu_power_limit_original_watts", gpu=UUID) == 700.0
    assert value(f, "modbridge_gpu_slowdown_temperature_celsius", gpu=UUID) == 90.0
    assert value(f, "modbridge_gpu_utilization_ratio", gpu=UUID) == 0.97
    assert value(f, "modbridge_gpu_up", gpu=UUID) == 1
    reasons = {
        dict(k)["reason"]: v for k, v in values(f, "modbridge_gpu_clocks_event_reason").items()
    }
    assert set(reasons) == set(CLOCKS_EVENT_REASONS)
    assert {k for k, v in reasons.items() if v} == {"sw_power_cap", "sw_thermal_slowdown"}
    states = {dict(k)["state"]: v for k, v in values(f, "modbridge_gpu_state").items()}
    assert states["ok"] == 1 and sum(states.values()) == 1 and "lost" in states


def test_lost_gpu_is_down_with_its_state_and_no_readings():
    lost = GpuSample(uuid=UUID, name="NVIDIA H200", state="lost", error="GPU is lost")
    f = scrape(snapshot(gpus=[lost]))
    assert value(f, "modbridge_gpu_up", gpu=UUID) == 0
    states = {dict(k)["state"]: v for k, v in values(f, "modbridge_gpu_state").items()}
    assert states["lost"] == 1 and states["ok"] == 0
    for name in (
        "modbridge_gpu_temperature_celsius",
        "modbridge_gpu_power_watts",
        "modbridge_gpu_clocks_event_reason",
        "modbridge_gpu_utilization_ratio",
    ):
        assert name not in f, name


def test_policy_metrics():
    f = scrape(snapshot())
    assert value(f, "modbridge_policy_level", module=MOD, gpu=UUID) == 1
    levels = {dict(k)["level"]: v for k, v in values(f, "modbridge_policy_state").items()}
    assert levels == {"NORMAL": 0, "WARN": 1, "CRITICAL": 0}
    actions = {dict(k)["action"]: v for k, v in values(f, "modbridge_policy_actions").items()}
    assert actions == {"lower": 2, "restore": 1, "refused": 0, "failed": 0, "dry_run": 0}
    assert value(f, "modbridge_policy_time_to_threshold_seconds", module=MOD, gpu=UUID) == 42.5
    assert value(f, "modbridge_policy_target_limit_watts", module=MOD, gpu=UUID) == 600.0
    assert value(f, "modbridge_policy_limit_writes_refused", module=MOD, gpu=UUID) == 0


def test_policy_target_is_the_original_limit_when_not_lowering():
    f = scrape(snapshot(pairs=[pair(level=0, target_limit_w=None, eta_s=None)]))
    assert value(f, "modbridge_policy_target_limit_watts", module=MOD, gpu=UUID) == 700.0
    assert "modbridge_policy_time_to_threshold_seconds" not in f


def test_bridge_metrics():
    f = scrape(snapshot(taken_at=NOW - 2.0))
    assert f["modbridge_scrape_snapshot_age_seconds"].samples[0].value == 2.0


# -- absent, never 0 -------------------------------------------------------------------
def test_sensor_not_sent_is_absent_never_zero():
    m = module()
    del m.telemetry["temp_vram"]
    f = scrape(snapshot([m]))
    temps = {dict(k)["channel"] for k in values(f, "modbridge_module_temperature_celsius")}
    assert temps == {"gpu", "mos", "amb"}


def test_sensor_flagged_faulty_is_absent_even_if_a_value_was_sent():
    f = scrape(snapshot([module(telemetry={"faults": C.FAULT_NTC_MOS, "temp_mos": 0})]))
    temps = {dict(k)["channel"] for k in values(f, "modbridge_module_temperature_celsius")}
    assert temps == {"gpu", "vram", "amb"}


def test_gpu_not_supported_values_are_absent():
    f = scrape(snapshot(gpus=[gpu(clocks_event_reasons=None, utilization=None)]))
    for name in (
        "modbridge_gpu_memory_temperature_celsius",
        "modbridge_gpu_fan_speed_ratio",
        "modbridge_gpu_clocks_event_reason",
        "modbridge_gpu_utilization_ratio",
    ):
        assert name not in f, name
    assert value(f, "modbridge_gpu_temperature_celsius", gpu=UUID) == 71.0


def test_module_before_hello_is_labelled_by_port_and_has_no_readings():
    m = ModuleStatus(port="/dev/ttyUSB3", link_up=False)
    f = scrape(snapshot([m], gpus=[], pairs=[]))
    assert value(f, "modbridge_module_up", module="/dev/ttyUSB3", port="/dev/ttyUSB3") == 0
    for name in (
        "modbridge_module_temperature_celsius",
        "modbridge_module_state",
        "modbridge_module_fault",
        "modbridge_module_input_volts",
        "modbridge_module_last_frame_age_seconds",
    ):
        assert name not in f, name
    errors = values(f, "modbridge_module_frame_errors")
    assert len(errors) == len(ERROR_KINDS) and not any(errors.values())


def test_link_down_drops_the_readings_at_once_and_keeps_the_counters():
    # an unplugged module: the last telemetry is still in the status, but nothing of it
    # is exported as current (Prometheus marks the missing series stale at once)
    m = module(link_up=False, last_frame_at=NOW - 0.5)
    f = scrape(snapshot([m], gpus=[], pairs=[]))
    assert value(f, "modbridge_module_up", module=MOD, port="/dev/ttyUSB0") == 0
    for name in (
        "modbridge_module_temperature_celsius",
        "modbridge_module_state",
        "modbridge_module_fault",
        "modbridge_module_input_volts",
        "modbridge_module_fan_rpm",
    ):
        assert name not in f, name
    assert "modbridge_module_last_frame_age_seconds" in f
    assert values(f, "modbridge_module_frames")


def test_wire_strings_in_labels_are_sanitised():
    m = module(module_id="e661\x1b[2Jx", board="pico\x1b]0;pwned\x07", fw_version="1.0\u202e")
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    reg.register(collector(snapshot([m], gpus=[], pairs=[])))
    text = generate_latest(reg).decode()
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    f = scrape(snapshot([m], gpus=[], pairs=[]))
    (labels,) = values(f, "modbridge_module_up")
    assert dict(labels)["module"] == "e661\\x1b[2Jx", labels


def test_no_snapshot_yet_exports_build_info_only():
    reg_families = list(X.BridgeCollector(lambda: None).collect())
    assert [m.name for m in reg_families] == ["modbridge_build"]


def test_duplicate_module_ids_are_exported_once_preferring_the_live_link():
    old = module(port="/dev/ttyUSB0", link_up=False, last_frame_at=NOW - 60)
    new = module(port="/dev/ttyUSB1", link_up=True)
    f = scrape(snapshot([old, new]))
    assert list(values(f, "modbridge_module_up")) == [
        frozenset({"module": MOD, "port": "/dev/ttyUSB1"}.items())
    ]


# -- the scrape only reads the snapshot ------------------------------------------------
@pytest.fixture
def no_hardware(monkeypatch):
    """Any serial port open or NVML call fails the test."""
    import pynvml
    import serial

    touched = []

    def forbid(name):
        def boom(*a, **k):
            touched.append(name)
            raise AssertionError(f"scrape touched {name}")

        return boom

    monkeypatch.setattr(serial.Serial, "open", forbid("serial.Serial.open"))
    monkeypatch.setattr(serial.Serial, "read", forbid("serial.Serial.read"))
    for attr in dir(pynvml):
        if attr.startswith("nvml") and callable(getattr(pynvml, attr)):
            monkeypatch.setattr(pynvml, attr, forbid("pynvml." + attr))
    return touched


def test_scrape_calls_the_source_once_and_never_touches_hardware(no_hardware):
    calls = []
    snap = snapshot()

    def source():
        calls.append(threading.current_thread().name)
        return snap

    with X.serve(source, port=0) as server:
        assert calls == []  # registering describes without calling the source
        for _ in range(3):
            with urllib.request.urlopen(server.url, timeout=5) as r:
                assert r.status == 200
    assert len(calls) == 3
    assert no_hardware == []


def test_scrape_is_fast_while_the_bridge_loop_is_stuck():
    """The bridge thread blocks in a (fake) serial read; scrapes keep answering."""
    stuck = threading.Event()
    release = threading.Event()
    latest = {"snap": snapshot(taken_at=time.monotonic())}

    def bridge_loop():  # one good cycle, then a read that hangs until released
        latest["snap"] = snapshot(taken_at=time.monotonic())
        stuck.set()
        release.wait(10)

    t = threading.Thread(target=bridge_loop, daemon=True)
    t.start()
    assert stuck.wait(5)
    try:
        with X.serve(lambda: latest["snap"], port=0, process_metrics=False) as server:
            ages = []
            for _ in range(2):
                t0 = time.monotonic()
                with urllib.request.urlopen(server.url, timeout=5) as r:
                    body = r.read().decode()
                assert time.monotonic() - t0 < 1.0
                f = {m.name: m for m in text_string_to_metric_families(body)}
                ages.append(f["modbridge_scrape_snapshot_age_seconds"].samples[0].value)
                time.sleep(0.05)
            assert ages[1] > ages[0]  # staleness is visible to alerts
    finally:
        release.set()
        t.join(5)


# -- HTTP endpoint ---------------------------------------------------------------------
def _port_is_free(port: int) -> bool:
    """True if a listener could bind it (SO_REUSEADDR, as http.server does: the
    scrape's closed connection may linger in TIME_WAIT, which is not a leak)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _switches(tid: int) -> int:
    """Times the kernel has run thread ``tid`` (``schedstat``'s third field)."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[2])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_an_idle_endpoint_does_not_wake_and_stops_at_once():
    """The accepting thread sleeps until a connection or stop(): no 0.5 s poll (a
    count of its runs, not a timing); a scrape wakes it; stop() right after serve()
    (the thread maybe not yet in its loop) returns and frees the port."""
    with X.serve(lambda: snapshot(), port=0, process_metrics=False) as server:
        with urllib.request.urlopen(server.url, timeout=5) as r:
            r.read()
        tid = server._thread.native_id
        runs = _switches(tid)
        time.sleep(1.6)  # socketserver's loop would have run 3 times
        assert _switches(tid) - runs == 0
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert r.status == 200
        assert _switches(tid) > runs
    for _ in range(20):
        quick = X.serve(lambda: None, port=0, process_metrics=False)
        quick.stop()
        assert _port_is_free(quick.port)
        quick._thread.join(5)
        assert not quick._thread.is_alive()


def test_http_scrape_parses_and_stop_releases_port_and_thread():
    before = {t.ident for t in threading.enumerate()}
    server = X.serve(lambda: snapshot(), port=0)
    assert server.addr == "127.0.0.1" and server.port > 0
    with urllib.request.urlopen(server.url, timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        body = r.read().decode()
    f = {m.name: m for m in text_string_to_metric_families(body)}
    assert value(f, "modbridge_module_temperature_celsius", module=MOD, channel="gpu") == 72.3
    assert "process_resident_memory_bytes" in f and "python_info" in f
    assert not _port_is_free(server.port)

    server.stop()
    server.stop()  # idempotent
    assert _port_is_free(server.port)
    deadline = time.monotonic() + 5
    while {t.ident for t in threading.enumerate()} - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {t.ident for t in threading.enumerate()} - before == set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
    # a restarted bridge gets the same port back
    with X.serve(lambda: None, port=server.port, process_metrics=False) as again:
        assert again.port == server.port


def test_openmetrics_scrape_carries_units():
    with X.serve(lambda: snapshot(), port=0, process_metrics=False) as server:
        req = urllib.request.Request(
            server.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert "openmetrics" in r.headers["Content-Type"]
            body = r.read().decode()
    f = {m.name: m for m in parse_openmetrics(body)}
    assert f["modbridge_module_temperature_celsius"].unit == "celsius"
    assert f["modbridge_module_fan_duty_ratio"].unit == "ratio"
    assert f["modbridge_module_input_volts"].unit == "volts"
    assert f["modbridge_policy_time_to_threshold_seconds"].unit == "seconds"
    assert f["modbridge_module_frames"].type == "counter"
    assert f["modbridge_module"].type == "info"


def test_process_metrics_can_be_left_out():
    reg = X.make_registry(lambda: snapshot(), process_metrics=False)
    names = {m.name for m in reg.collect()}
    assert names and all(n.startswith("modbridge_") for n in names)


def test_port_in_use_is_a_clear_error():
    with X.serve(lambda: None, port=0, process_metrics=False) as server:
        with pytest.raises(X.ExporterError, match="metrics-port"):
            X.serve(lambda: None, port=server.port, process_metrics=False)


def test_default_endpoint_is_loopback_on_an_unallocated_exporter_port():
    import inspect

    params = inspect.signature(X.serve).parameters
    assert params["addr"].default == "127.0.0.1"
    assert params["port"].default == X.DEFAULT_PORT
    assert X.DEFAULT_PORT != 9101  # HAProxy exporter's (the seed's choice)
    assert X.DEFAULT_PORT not in (9100, 9400, 9445, 9454, 9835)  # node, GPU exporters
    assert 9100 <= X.DEFAULT_PORT <= 9999  # the exporters' range


# -- naming lint (promtool/promlint rules, by hand) ------------------------------------
UNIT_WORDS = set(X.UNITS) | {"bytes"}
ABBREVIATIONS = set(
    "s ms us ns sec secs msec usec mins hr hrs b kb mb gb v mv a ma w mw kw c degc mc"
    " pct percent temp rpms".split()
)
PREFIXED = re.compile(r"^(milli|micro|nano|kilo|mega|giga|centi|deci)")
NON_BASE = {"fahrenheit", "minutes", "hours", "days", "percent", "kelvin", "watthours"}
TYPE_WORDS = {"counter", "gauge", "histogram", "summary", "untyped"}


def full_families():
    """Every family, each with samples: a snapshot where every optional value is set."""
    g = gpu(memory_temperature_c=80.0, fan_speed_ratio=0.4)
    return list(collector(snapshot(gpus=[g])).collect())


def lint(family) -> list[str]:
    problems = []
    name, typ = family.name, family.type
    exposed = name + {"counter": "_total", "info": "_info"}.get(typ, "")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", exposed):
        problems.append("not snake_case / reserved characters (colons are for recording rules)")
    if not exposed.startswith("modbridge_"):
        problems.append("missing the modbridge_ prefix")
    if not family.documentation.strip():
        problems.append("no HELP text")
    if typ == "counter" and exposed.endswith("_total_total"):
        problems.append("double _total")
    if typ != "counter" and exposed.endswith("_total"):
        problems.append("non-counter ends with _total")
    if typ == "info" and family.samples and any(s.value != 1 for s in family.samples):
        problems.append("info value must be 1")
    for reserved in ("_bucket", "_count", "_sum", "_created"):
        if exposed.endswith(reserved):
            problems.append(f"reserved suffix {reserved}")
    words = name.split("_")[1:]
    for w in words:
        if w in ABBREVIATIONS:
            problems.append(f"abbreviated unit or word {w!r}")
        if w in NON_BASE or PREFIXED.match(w):
            problems.append(f"non-base unit {w!r}")
        if w in TYPE_WORDS:
            problems.append(f"metric type {w!r} in name")
    units = [w for w in words if w in UNIT_WORDS]
    if units and words[-1] != units[-1]:
        problems.append("unit must be the last word")
    if len(units) > 1:
        problems.append(f"several units {units}")
    if typ == "gauge" and units and family.unit != units[-1]:
        problems.append(f"unit metadata {family.unit!r} != name's {units[-1]!r}")
    for s in family.samples:
        for label in s.labels:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", label) or label in ("le", "quantile"):
                problems.append(f"bad label {label!r}")
    return problems


def test_lint_catches_bad_names():
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

    assert lint(GaugeMetricFamily("modbridge_temp_millicelsius", "x"))
    assert lint(GaugeMetricFamily("modbridge_requests_total", "x"))
    assert lint(GaugeMetricFamily("modbridge_fan_duty_percent", "x"))
    assert lint(GaugeMetricFamily("modbridge_uptime_ms", "x"))
    assert lint(GaugeMetricFamily("modbridge_watts_input", "x"))
    assert lint(GaugeMetricFamily("other_thing_volts", "x", unit="volts"))
    assert lint(CounterMetricFamily("modbridge_frames_gauge", "x"))
    assert not lint(CounterMetricFamily("modbridge_frames", "x"))


def test_every_metric_name_follows_prometheus_naming_rules():
    families = full_families()
    assert len(families) == len(X.BridgeCollector(lambda: None).describe())
    problems = {f.name: lint(f) for f in families}
    assert {k: v for k, v in problems.items() if v} == {}


def test_docs_list_exactly_the_exported_metrics():
    exposed = set()
    for f in full_families():
        exposed |= {s.name for s in f.samples}
    doc = (REPO_ROOT / "docs" / "metrics.md").read_text()
    table = set(re.findall(r"^\| `(modbridge_[a-z0-9_]+)`", doc, re.M))
    assert exposed - table == set(), "metrics missing from docs/metrics.md"
    assert table - exposed == set(), "docs/metrics.md lists metrics that are not exported"
    assert f"{X.DEFAULT_PORT}" in doc


# -- rendering once per snapshot version (Renderer, Endpoint) ----------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from prometheus_client.openmetrics.exposition import (  # noqa: E402
    generate_latest as generate_openmetrics,
)
from prometheus_client.utils import floatToGoString  # noqa: E402

PROPS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,  # deterministic: the same cases every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OM_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def reference(snap, fmt=X.TEXT, clock=lambda: NOW) -> bytes:
    """What prometheus_client makes of a registry with BridgeCollector: Metric families
    per scrape, then generate_latest. The collector and the Renderer read the same
    blocks (one walk decides what is exported); comparing the two texts checks the
    Renderer's own writing (kept prefixes, kept block texts, value formatting)."""
    reg = X.make_registry(lambda: snap, process_metrics=False, clock=clock)
    return (generate_latest if fmt == X.TEXT else generate_openmetrics)(reg)


def fleet(n=3, **kw):
    return snapshot(
        [module(module_id=f"{MOD}{i:02x}", port=f"/dev/ttyUSB{i}", **kw) for i in range(n)],
        [gpu(uuid=f"{UUID}{i}") for i in range(n)],
        [pair(module_id=f"{MOD}{i:02x}", gpu_uuid=f"{UUID}{i}") for i in range(n)],
    )


def test_renderer_is_byte_equal_to_prometheus_client_in_both_formats():
    snaps = [
        snapshot(),
        fleet(8),
        None,
        snapshot([module(link_up=False)]),
        snapshot([ModuleStatus(port="/dev/ttyUSB3")], gpus=[], pairs=[]),
        snapshot([module(module_id='e661\x1b[2J"x\\\n', board="p\x07")], gpus=[], pairs=[]),
        snapshot(gpus=[GpuSample(uuid=UUID, name="H200", state="lost", error="lost")]),
    ]
    for fmt in (X.TEXT, X.OPENMETRICS):
        for snap in snaps:
            r = X.Renderer(lambda snap=snap: snap, clock=lambda: NOW)
            assert r.render(fmt) == reference(snap, fmt), (fmt, snap)
            assert r.render(fmt) == reference(snap, fmt)  # from the cache: the same
    # and both parse with prometheus_client's parsers into every family of the fleet
    want = {f.name for f in X.make_registry(lambda: fleet(8), process_metrics=False).collect()}
    text = X.Renderer(lambda: fleet(8), clock=lambda: NOW).render(X.TEXT).decode()
    parsed = [f.name for f in text_string_to_metric_families(text)]
    assert len(parsed) == len(want) >= len(X.FAMILIES) - 2  # no memory temp, no GPU fan
    om = X.Renderer(lambda: fleet(8), clock=lambda: NOW).render(X.OPENMETRICS).decode()
    assert {f.name for f in parse_openmetrics(om)} == want


def test_the_collector_and_the_renderer_read_one_walk(monkeypatch):
    # one source of truth for families, labels and values: neither has a walk of its
    # own that a change could miss (the collector had one, held equal only by a test)
    walks = []

    class Counted(_Blocks):
        def __init__(self, snap):
            walks.append(snap)
            super().__init__(snap)

    monkeypatch.setattr(collector_module, "_Blocks", Counted)  # where each of them looks it up
    monkeypatch.setattr(render_module, "_Blocks", Counted)
    snap = fleet(2)
    list(collector(snap).collect())
    X.Renderer(lambda: snap, clock=lambda: NOW).render()
    assert walks == [snap, snap]
    assert not [n for n in vars(X.BridgeCollector) if n.startswith("_") and n[1] != "_"]


def test_one_render_per_snapshot_version_and_ages_per_scrape():
    snap = fleet(2)
    clock = [NOW]
    r = X.Renderer(lambda: snap, clock=lambda: clock[0])
    bodies = []
    for step in range(3):
        clock[0] = NOW + step
        bodies.append(r.render())
        assert bodies[-1] == reference(snap, clock=lambda: clock[0])
    assert r.renders == 1  # one snapshot, three scrapes: rendered once
    ages = [
        {m.name: m for m in text_string_to_metric_families(b.decode())}[
            "modbridge_scrape_snapshot_age_seconds"
        ]
        .samples[0]
        .value
        for b in bodies
    ]
    assert ages == [0.5, 1.5, 2.5]  # the clocked samples are filled per scrape
    r.render(X.OPENMETRICS)
    assert r.renders == 1  # a second format of the same version: no new walk
    snap = fleet(2)
    r.render()
    assert r.renders == 2  # a new snapshot object: a new version


def test_a_link_going_down_between_snapshots_shows_in_the_next_scrape():
    # the link thread updates a module's live status between two snapshots; the
    # scrape must show it as the per-scrape renderer did (a new version), not the cache
    snap = fleet(2)
    r = X.Renderer(lambda: snap, clock=lambda: NOW)
    r.render()
    snap.modules[0].link_up = False
    body = r.render()
    assert r.renders == 2 and body == reference(snap)
    f = {m.name: m for m in text_string_to_metric_families(body.decode())}
    temps = {dict(k)["module"] for k in values(f, "modbridge_module_temperature_celsius")}
    assert temps == {f"{MOD}01"}
    snap.modules[1].telemetry = dict(snap.modules[1].telemetry, temp_gpu=80_000)  # a frame
    snap.modules[1].frames_total += 1
    body = r.render()
    assert r.renders == 3 and body == reference(snap)
    snap.pairs[0].level = 2
    snap.pairs[0].actions_total["lower"] += 1
    assert r.render() == reference(snap) and r.renders == 4


def test_a_family_at_rest_keeps_its_text_and_a_changed_one_is_rewritten():
    a = fleet(2)
    b = fleet(2)
    b.gpus[1] = gpu(uuid=f"{UUID}1", power_w=-0.0)  # equals 0.0, written "-0.0"
    c = fleet(2)
    c.gpus[1] = gpu(uuid=f"{UUID}1", power_w=0.0)
    cur = [a]
    r = X.Renderer(lambda: cur[0], clock=lambda: NOW)
    for snap in (a, b, c, b, a):
        cur[0] = snap
        assert r.render() == reference(snap)
    assert r.renders == 5


def test_prefixes_of_a_module_that_went_away_are_dropped():
    cur = [fleet(3)]
    r = X.Renderer(lambda: cur[0], clock=lambda: NOW)
    r.render()
    gone = f"{MOD}02"

    def cached_labels():
        return r.cached_label_values()

    assert gone in cached_labels()
    for _ in range(2):
        cur[0] = fleet(2)
        r.render()
    assert gone not in cached_labels()


label_text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=12
)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0.0, -0.0, 1e6, -1e6, 999_999.9, 1e21, 1e-7, 2**53 + 1]),
)


@PROPS
@given(st.lists(st.tuples(label_text, label_text, numbers, numbers), min_size=1, max_size=4))
def test_renderer_matches_prometheus_client_on_any_labels_and_values(rows):
    cur = [None]
    r = X.Renderer(lambda: cur[0], clock=lambda: NOW)
    for mod_id, board, power, limit in rows:  # a sequence of versions through one cache
        cur[0] = snapshot(
            [module(module_id=mod_id or None, board=board)],
            [gpu(power_w=power, enforced_limit_w=limit)],
            [pair(module_id=mod_id or None, eta_s=power)],
        )
        for fmt in (X.TEXT, X.OPENMETRICS):
            assert r.render(fmt) == reference(cur[0], fmt)


@PROPS
@given(numbers)
def test_value_text_is_floattogostring(v):
    assert X.value_text(v) == floatToGoString(v)


def test_endpoint_negotiates_like_prometheus_client_and_gzips():
    import gzip

    snap = fleet(2)
    ep = X.Endpoint(lambda: snap, process_metrics=False, clock=lambda: NOW)
    status, headers, body = ep.respond("GET", "/metrics", "", None, None)
    assert status == 200 and dict(headers)["Content-Type"].startswith("text/plain; version=0.0.4")
    assert body == reference(fleet(2))
    status, headers, zbody = ep.respond("GET", "/metrics", "", OM_ACCEPT, "deflate, gzip;q=1")
    assert dict(headers)["Content-Encoding"] == "gzip"
    assert dict(headers)["Content-Type"].startswith("application/openmetrics-text")
    assert gzip.decompress(zbody) == reference(fleet(2), X.OPENMETRICS)
    # name[] filters and other escapings are prometheus_client's own rendering
    _, _, only = ep.respond("GET", "/metrics", "name[]=modbridge_module_up", None, None)
    assert [f.name for f in text_string_to_metric_families(only.decode())] == [
        "modbridge_module_up"
    ]
    # allow-utf-8 (Prometheus 3 asks for it) and underscores are the Renderer's, dots
    # and values prometheus_client's: each the same text as prometheus_client's
    for scheme in ("allow-utf-8", "underscores", "dots", "values"):
        for accept, generate in (
            (f"text/plain;version=1.0.0;escaping={scheme}", generate_latest),
            (f"application/openmetrics-text;version=1.0.0;escaping={scheme}", generate_openmetrics),
        ):
            _, headers, body = ep.respond("GET", "/metrics", "", accept, None)
            assert f"escaping={scheme}" in dict(headers)["Content-Type"]
            assert body == generate(ep.registry, escaping=scheme), accept
    assert ep.renderer.renders == 1  # (the snapshot is the same throughout)
    prometheus_3 = (  # its default Accept (UTF-8 names allowed)
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
        "application/openmetrics-text;version=0.0.1;q=0.5,"
        "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3"
    )
    assert _fast_format(exposition.choose_encoder(prometheus_3)[0]) == X.OPENMETRICS
    dots = exposition.choose_encoder("text/plain;version=1.0.0;escaping=dots")[0]
    assert _fast_format(dots) is None
    assert ep.respond("POST", "/metrics", "", None, None)[0] == 405
    assert ep.respond("OPTIONS", "/metrics", "", None, None)[:2] == (
        200,
        [("Allow", "OPTIONS,GET")],
    )
    assert ep.respond("GET", "/favicon.ico", "", None, None) == (200, [], b"")
    assert ep.renderer.renders == 1  # all formats of one snapshot version: one walk
    other = "application/openmetrics-text;version=2.0.0"  # prometheus_client's own
    assert ep.respond("GET", "/metrics", "", other, None)[2] == generate_openmetrics(
        ep.registry, version="2.0.0"
    )
    assert ep.renderer.renders == 1


def test_docs_scrape_cost_quotes_results_json():
    import json

    results = json.loads((REPO_ROOT / "bench" / "results.json").read_text())
    doc = (REPO_ROOT / "docs" / "metrics.md").read_text()
    rows = re.findall(r"^\| `(scrape_[a-z0-9_]+)` \| ([-0-9.]+) \|$", doc, re.M)
    assert len(rows) >= 4, rows
    for key, shown in rows:
        assert key in results, f"docs/metrics.md: {key} is not in bench/results.json"
        assert float(shown) == float(results[key]), (key, shown, results[key])


def test_a_failing_render_costs_one_scrape_not_the_endpoint(caplog):
    import urllib.error

    fail = [True]

    def source():
        if fail[0]:
            raise RuntimeError("boom")
        return snapshot()

    with X.serve(source, port=0, process_metrics=False) as server:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url, timeout=5)
        assert e.value.code == 500
        fail[0] = False
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert r.status == 200 and b"modbridge_module_up" in r.read()
    assert "a scrape failed" in caplog.text


def test_extra_families_are_prometheus_clients_text_at_every_scrape():
    # the process metrics keep their headers and prefixes between scrapes, written
    # with each scrape's values; a family of another shape, or with timestamps, is
    # written afresh: every scrape as prometheus_client writes the same registry
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    now = {"v": 1.0, "labels": ["a"], "stamp": None}

    class Varying:
        def collect(self):
            g = GaugeMetricFamily("x_size_bytes", 'help "q" \\ \n', labels=["k"], unit="bytes")
            for lv in now["labels"]:
                g.add_metric([lv], now["v"])
            c = CounterMetricFamily("x_ops", "ops")
            c.add_metric([], abs(now["v"]) * 3)
            t = GaugeMetricFamily("x_stamped", "stamped")
            t.add_metric([], now["v"], timestamp=now["stamp"])
            return [g, c, t]

    snap = fleet(1)
    extra = CollectorRegistry()
    extra.register(Varying())
    want = CollectorRegistry()
    want.register(collector(snap))
    want.register(Varying())
    r = X.Renderer(lambda: snap, clock=lambda: NOW, extra=extra)
    steps = [
        {"v": 2.5},
        {"v": -0.0},
        {"labels": ['a"\\\n', "é"]},
        {"v": 1e21, "stamp": 12.5},
        {"v": float("nan"), "stamp": None},
        {"v": 7, "labels": []},
        {"v": float("inf")},
    ]
    for step in steps:
        now.update(step)
        for fmt, generate in ((X.TEXT, generate_latest), (X.OPENMETRICS, generate_openmetrics)):
            assert r.render(fmt) == generate(want), (fmt, step)
    assert r.renders == 1


def test_process_metrics_are_prometheus_clients_families():
    # the same families, help, types and values as prometheus_client's ProcessCollector
    # (the memory and CPU read at a moment apart: equal within what can change between)
    from prometheus_client.process_collector import ProcessCollector

    ours = _ProcessMetrics().collect()
    theirs = ProcessCollector(registry=None).collect()
    assert [(m.name, m.type, m.documentation, m.unit) for m in ours] == [
        (m.name, m.type, m.documentation, m.unit) for m in theirs
    ]
    assert len(ours) == 6
    for a, b in zip(ours, theirs, strict=True):
        assert [(s.name, s.labels) for s in a.samples] == [(s.name, s.labels) for s in b.samples]
        (va,), (vb,) = [s.value for s in a.samples], [s.value for s in b.samples]
        if a.name in ("process_start_time_seconds", "process_max_fds"):
            assert va == vb, a.name
        elif a.name == "process_open_fds":
            assert abs(va - vb) <= 1, (va, vb)  # ours has no /proc/self/stat open
        elif a.name == "process_cpu_seconds_total":
            assert 0 <= vb - va <= 1.0, (va, vb)
        else:
            assert abs(va - vb) <= 64 << 20, (a.name, va, vb)


def test_gzip_state_kept_between_bodies_makes_one_complete_member_each():
    import gzip
    import zlib

    z = _Gzip(X.GZIP_LEVEL)
    body = X.Renderer(lambda: fleet(8), clock=lambda: NOW).render(X.OPENMETRICS)
    bodies = [body, b"", b"x", body[::-1], body, b"\0" * 100_000]
    for b in bodies:
        out = z.compress([b[: len(b) // 3], b[len(b) // 3 :]])
        d = zlib.decompressobj(wbits=31)  # exactly one gzip member, nothing after it
        assert d.decompress(out) == b and d.eof and d.unused_data == b""
        assert gzip.decompress(out) == b
        # the flush's empty stored block and the empty final block: a few bytes more
        assert len(out) <= len(gzip.compress(b, X.GZIP_LEVEL)) + 8
    with pytest.raises(TypeError):
        z.compress([body[:1000], "not bytes"])  # half a body went in: the state is new
    assert gzip.decompress(z.compress([body])) == body


def test_clients_that_connect_and_stall_do_not_hold_up_a_scrape():
    # stalled connections wait in the loop thread's selector, holding no worker; the
    # workers serve the scrapes, and stop() ends every thread
    # (tests/test_exporter_flood.py: the bounds under a flood)
    before = {t.ident for t in threading.enumerate()}
    server = X.serve(lambda: snapshot(), port=0, process_metrics=False)
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        for _ in range(3):
            with urllib.request.urlopen(server.url, timeout=5) as r:
                assert b"modbridge_module_up" in r.read()
        stalled[0].sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # a slow one, at last
        assert b"modbridge_module_up" in stalled[0].makefile("rb").read()
    finally:
        for s in stalled:
            s.close()
    server.stop()
    deadline = time.monotonic() + 5
    while {t.ident for t in threading.enumerate()} - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {t.ident for t in threading.enumerate()} - before == set()
