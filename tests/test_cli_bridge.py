"""`modbridge list/status/run/monitor/config` through click's CliRunner.

Modules are virtual (SimFleet: the real firmware on a pty); GPUs come from ``--sim``
or from the fake NVML (the recorded H200) injected in place of pynvml.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from modbridge.cli.main import main
from modbridge.gpu import select
from modbridge.gpu.base import GpuError
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend
from modbridge.link import discovery
from modbridge.sim.fleet import SimFleet

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "modbridge.toml"


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(autouse=True)
def no_default_config_or_ports(monkeypatch, tmp_path):
    """Tests never read the machine's config or state dir, or find its real serial
    adapters."""
    from modbridge import config

    monkeypatch.setattr(config, "DEFAULT_PATHS", (tmp_path / "absent.toml",))
    monkeypatch.setenv("MODBRIDGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setattr(discovery, "_default_lister", lambda: [])
    yield
    assert not [t for t in threading.enumerate() if t.name.startswith("modbridge-link")]


@pytest.fixture(scope="module")
def fleet():
    f = SimFleet(1, speed=20).start()
    yield f
    f.stop()


@pytest.fixture
def fake_nvml(monkeypatch):
    """``--backend nvml`` (and auto) get NVML over the recorded H200."""
    nv = FakeNvml()
    real = select.open_backend

    def open_backend(kind="auto", **kw):
        if kind in ("auto", "nvml"):
            return NvmlBackend(nvml=nv)
        return real(kind, **kw)

    monkeypatch.setattr(select, "open_backend", open_backend)
    return nv


@pytest.fixture
def no_gpu(monkeypatch):
    def open_backend(kind="auto", **kw):
        raise GpuError("no NVIDIA GPU backend: NVML: driver not loaded. Install the NVIDIA "
                       "driver, or run with --sim")  # fmt: skip

    monkeypatch.setattr(select, "open_backend", open_backend)


# -- list -------------------------------------------------------------------------------
def test_list_json_shows_the_module_hello_and_the_gpus(fleet, fake_nvml):
    res = run("list", "--json", "--port", fleet.ports[0])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) >= {"modules", "gpus"}
    [m] = out["modules"]
    assert m["device"] == fleet.ports[0] and m["link_up"] is True
    assert m["module_id"] == fleet.modules[0].uid.hex()
    assert m["board"] == "sim" and m["protocol"].startswith("1.") and m["fw_version"]
    [g] = out["gpus"]
    assert g["index"] == 0 and g["uuid"].startswith("GPU-") and "H200" in g["name"]
    assert g["pci_bus_id"]


def test_list_table_and_exit_3_without_a_module(fake_nvml, tmp_path):
    res = run("list", "--port", str(tmp_path / "ttyUSB9"), "--timeout", "0.2")
    assert res.exit_code == 3
    assert "no module" in res.output and "H200" in res.output


def test_list_without_gpu_exits_3_and_says_what_to_do(fleet, no_gpu):
    res = run("list", "--port", fleet.ports[0])
    assert res.exit_code == 3
    assert fleet.modules[0].uid.hex() in res.output
    assert "--sim" in res.output


# -- status -----------------------------------------------------------------------------
def test_status_json_with_nvml_leaves_unsupported_fan_speed_out(fleet, fake_nvml):
    res = run("status", "--json", "--backend", "nvml", "--port", fleet.ports[0])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    [m] = out["modules"]
    assert m["module_id"] == fleet.modules[0].uid.hex() and m["link_up"]
    assert out["schema"] == 2  # docs/vocabulary.md's names
    assert m["state"] is not None and m["temp_gpu_c"] > 0
    assert m["v_in_v"] > 11 and {"fan1_rpm", "fan2_duty_pct"} <= set(m) and "fan3_rpm" not in m
    gpu = m["gpu"]  # one module, one GPU: paired automatically
    assert gpu["uuid"] == out["gpus"][0]["uuid"]
    assert gpu["temp_c"] is not None and gpu["limit_w"] > 0
    assert "fan_speed_pct" not in gpu  # NotSupported on an H200: absent, not 0
    assert m["policy"]["level"] in ("NORMAL", "WARN", "CRITICAL")
    assert fake_nvml.writes == []  # status never writes a limit


def test_status_table_and_json_come_from_the_same_objects(fleet, fake_nvml):
    res = run("status", "--port", fleet.ports[0], "--backend", "nvml")
    assert res.exit_code == 0, res.output
    uid = fleet.modules[0].uid.hex()
    assert f"module {uid}" in res.output
    assert "policy " in res.output and "fan -" in res.output  # absent shown as '-'


def test_status_sim_and_unknown_module():
    res = run("status", "--sim", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["backend"] == "virtual" and out["modules"][0]["gpu"]["state"] == "ok"
    # a virtual module has just powered on: status waits until it left BOOT, fans turning
    m = out["modules"][0]
    assert m["state"] not in (None, "BOOT"), m
    assert m["fan1_rpm"] or m["fan2_rpm"], m
    assert m["fan1_duty_pct"] is not None and m["fan2_duty_pct"] is not None, m
    res = run("status", "--sim", "--module", "00ff")
    assert res.exit_code == 3
    assert "modbridge list" in res.output


# -- run --------------------------------------------------------------------------------
def test_run_once_sim_prints_status_and_exits_0(tmp_path):
    log = tmp_path / "events.jsonl"
    res = run("run", "--sim", "--sim-speed", "20", "--once", "--no-metrics",
              "--event-log", str(log))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "policy NORMAL" in res.output
    assert "state BOOT" not in res.output and "fans rpm 0/0" not in res.output
    assert " duty " in res.output
    kinds = [json.loads(x)["kind"] for x in log.read_text().splitlines()]
    assert kinds[0] == "bridge" and kinds[-1] == "bridge" and "link" in kinds


def test_run_without_gpu_exits_3_pointing_at_the_driver_and_sim(fleet, no_gpu):
    res = run("run", "--port", fleet.ports[0], "--no-metrics", "--once")
    assert res.exit_code == 3
    assert "driver" in res.output and "--sim" in res.output


def test_run_without_module_exits_3(fake_nvml):
    res = run("run", "--no-metrics", "--once")
    assert res.exit_code == 3
    assert "no module found" in res.output and "--port" in res.output


def test_run_port_permission_denied_says_dialout(fake_nvml, monkeypatch):
    from modbridge.link import session as link

    def denied(port, open_fn=None, timeout=0):
        raise link.open_error(port, PermissionError(13, "Permission denied"))

    monkeypatch.setattr(link, "open_port", denied)
    res = run("run", "--port", "/dev/ttyUSB0", "--no-metrics", "--once")
    assert res.exit_code == 1
    assert "dialout" in res.output and "/dev/ttyUSB0" in res.output


def test_run_with_a_bad_config_exits_2_listing_each_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[bridge]\ntick_s = "fast"\n[[module]]\ngpu = "nope"\n')
    res = run("run", "--sim", "--config", str(bad))
    assert res.exit_code == 2
    assert "bridge.tick_s" in res.output and "module[0]" in res.output


def test_run_sim_rejects_port(fleet):
    res = run("run", "--sim", "--port", fleet.ports[0])
    assert res.exit_code == 2 and "--sim" in res.output


# -- monitor ----------------------------------------------------------------------------
def test_monitor_line_mode_when_not_a_tty():
    res = run("monitor", "--sim", "--sim-speed", "20", "--interval", "0.2", "--count", "3")
    assert res.exit_code == 0, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 3 and "\x1b[" not in res.output


def test_live_view_redraws_in_place_on_a_tty():
    import io

    import pyte

    from modbridge.cli.monitor import LiveView

    out = io.StringIO()
    view = LiveView(out, tty=True, keys=False, size=(80, 24))
    rep = {"backend": "virtual", "modules": [], "gpus": []}
    view.draw(rep)
    view.draw(rep)
    view.close()
    screen = pyte.Screen(80, 24)
    pyte.Stream(screen).feed(out.getvalue().replace("\n", "\r\n"))
    shown = "\n".join(x.rstrip() for x in screen.display)
    assert shown.count("modbridge monitor") == 1 and "0 modules" in shown, shown


# -- config -----------------------------------------------------------------------------
def test_config_example_is_the_example_file_and_validates(tmp_path):
    res = run("config", "example")
    assert res.exit_code == 0
    assert res.output == EXAMPLE.read_text()
    copy = tmp_path / "modbridge.toml"
    copy.write_text(res.output)
    res = run("config", "validate", str(copy))
    assert res.exit_code == 0 and "ok" in res.output


def test_config_validate_prints_every_problem_with_its_place(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[bridge]\nbackend = "cuda"\nspeed = 2\n'
        "[exporter]\nport = 70000\n"
        '[[module]]\nid = "XYZ"\ngpu = "GPU-1"\n'
    )
    res = run("config", "validate", str(bad))
    assert res.exit_code == 2
    for place in ("bridge.backend", "bridge.speed", "exporter.port", "module[0].id",
                  "module[0].gpu"):  # fmt: skip
        assert f"{bad}: {place}" in res.output, place


def test_config_validate_missing_file_and_no_default(tmp_path):
    res = run("config", "validate", str(tmp_path / "none.toml"))
    assert res.exit_code == 2 and "no such file" in res.output
    res = run("config", "validate")
    assert res.exit_code == 2 and "give FILE" in res.output


# -- restore ----------------------------------------------------------------------------
H200 = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"


def _lowered(nv, watts=490):
    for name in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"):
        nv.set_answer(name, int(watts * 1000))


def _journal(state_dir, original_w=700.0):
    from modbridge.actuator.journal import LimitJournal

    LimitJournal(state_dir).record(H200, original_w, 490.0)


def test_restore_puts_every_journaled_gpu_back(fake_nvml, tmp_path):
    _journal(tmp_path / "state")  # MODBRIDGE_STATE_DIR (the autouse fixture)
    _lowered(fake_nvml)
    res = run("restore", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["dry_run"] is True and out["gpus"][0]["action"] == "would_restore"
    assert fake_nvml.writes == []
    res = run("restore", "--json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)["gpus"]
    assert (row["uuid"], row["action"], row["before_w"], row["after_w"]) == (
        H200, "restored", 490.0, 700.0)  # fmt: skip
    assert [w["value_mw"] for w in fake_nvml.writes] == [700000]
    res = run("restore")
    assert res.exit_code == 0 and "no journaled GPU" in res.output


def test_restore_refused_exits_1_and_keeps_the_entry(fake_nvml, tmp_path):
    other = tmp_path / "elsewhere"
    _journal(other)
    _lowered(fake_nvml)
    fake_nvml.read_only = True
    res = run("restore", "--state-dir", str(other))
    assert res.exit_code == 1
    assert f"{H200}  refused" in res.output and "root" in res.output
    assert (other / "limits" / f"{H200}.json").exists()


def test_restore_ignores_a_foreign_limit_above_the_default(fake_nvml, tmp_path):
    _journal(tmp_path / "state", original_w=2000.0)
    _lowered(fake_nvml)
    res = run("restore", "--json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)["gpus"]
    assert row["after_w"] == 700.0 and "2000 W" in row["message"]
    assert [w["value_mw"] for w in fake_nvml.writes] == [700000]


def test_run_restores_a_journaled_gpu_before_the_modules_and_locks_it(fake_nvml, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    from modbridge.link import session as link

    def denied(port, open_fn=None, timeout=0):
        raise link.open_error(port, PermissionError(13, "Permission denied"))

    monkeypatch.setattr(link, "open_port", denied)
    state = tmp_path / "run-state"
    _journal(state)
    _lowered(fake_nvml)
    res = run("run", "--state-dir", str(state), "--port", "/dev/ttyUSB0", "--no-metrics",
              "--once")  # fmt: skip
    assert res.exit_code == 1 and "dialout" in res.output  # the port, after the restore
    assert [w["value_mw"] for w in fake_nvml.writes] == [700000]
    assert not (state / "limits" / f"{H200}.json").exists()
    assert (state / "locks" / f"{H200}.lock").exists()


def test_run_when_another_bridge_owns_the_gpu_exits_1_naming_it(fake_nvml, tmp_path):
    import os

    from modbridge.actuator.gpulock import GpuLock

    with GpuLock(tmp_path / "state", H200, key=f"{H200}.test-{os.getpid()}"):
        res = run("run", "--port", "/dev/ttyUSB0", "--no-metrics", "--once")
    assert res.exit_code == 1
    assert f"owned by another modbridge (pid {os.getpid()}" in res.output
    assert fake_nvml.writes == []


def test_run_with_an_unusable_state_dir_exits_1(fake_nvml, tmp_path):
    (tmp_path / "file").write_text("")
    res = run("run", "--state-dir", str(tmp_path / "file" / "state"), "--port", "/dev/ttyUSB0",
              "--no-metrics", "--once")  # fmt: skip
    assert res.exit_code == 1 and "--state-dir" in res.output
