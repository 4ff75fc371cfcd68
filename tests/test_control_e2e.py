"""`modbridge set/config/selftest` end to end on one virtual module (the real firmware
in MicroPython on a pty): straight to the port, and through a running Bridge's
control socket, with click's CliRunner in this process. Every answer is checked in
the units a person typed, and against what the module then reports."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from click.testing import CliRunner
from e2e_helpers import bridged, wait_for

from modbridge.cli.main import main
from modbridge.sim.fleet import SimFleet


def _cli(*args):
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def _json(*args):
    code, out = _cli(*args, "--json")
    assert "{" in out, (code, out)
    return code, json.loads(out[out.index("{"):])


@pytest.fixture(scope="module")
def direct():
    fleet = SimFleet(1, speed=1.0, seed=7).start()  # another uid than bridged()'s module
    try:
        wait_for(lambda: fleet.modules[0].world.now_ms >= 3000, 30, "the module out of BOOT")
        yield fleet.ports[0], ["--keys-dir", str(fleet.keys.dir), "--direct"]
    finally:
        fleet.stop()


def test_direct_set_fan_mode_setpoint_curve(direct):
    port, opts = direct
    code, o = _json("set", port, "fan1", "40%", *opts)
    assert code == 0 and o["status"] == "ack" and o["via"] == "direct", o
    assert o["summary"] == "fan1: manual 40 %"
    assert o["applied"]["state"] == "MANUAL" and o["applied"]["fan1_duty_pct"] >= 40
    assert any("MANUAL needs a host's heartbeats" in n for n in o["notes"])
    code, out = _cli("set", port, "mode", "auto", *opts)
    assert code == 0 and out.startswith("mode: auto (ack)"), out
    code, out = _cli("set", port, "setpoint", "gpu", "72", *opts)
    assert code == 0 and out.startswith("setpoint gpu: 72 degC (ack)"), out
    code, out = _cli("set", port, "setpoint", "gpu", "100", *opts)  # above its warn limit
    assert code == 1, out
    assert out.startswith("setpoint gpu: refused: out_of_range: gpu.warn must be > setpoint "
                          "(100 degC), got 85 degC"), out  # fmt: skip
    code, out = _cli("set", port, "curve", "40:30", "60:50", "80:100", "--hysteresis", "2", *opts)
    assert code == 0 and "curve: 40:30 60:50 80:100 (degC:%), hysteresis 2 degC (ack)" in out


def test_direct_config_get_set_save(direct):
    port, opts = direct
    code, out = _cli("config", "set", port, "gpu.setpoint=71.5", "pid.kp=4", *opts)
    assert code == 0 and "gpu.setpoint 71.5 degC, pid.kp 4 %/degC (ack)" in out, out
    code, o = _json("config", "get", port, "gpu", *opts)
    assert code == 0 and o["data"]["values"]["gpu.setpoint"] == 71.5
    assert o["data"]["keys"]["gpu.setpoint"] == "channels.0.setpoint_mc"
    code, out = _cli("config", "get", port, *opts)  # every section
    assert code == 0 and "pid.kp" in out and "fan2.min_duty" in out and "safety.boot" in out
    assert "curve.points" in out and "(degC:%)" in out
    code, out = _cli("config", "save", port, *opts)
    assert code == 0 and out.startswith("config save (ack)"), out
    code, out = _cli("config", "set", port, "fan1.min_duty=10%", *opts)  # below the floor
    assert code == 1 and "fan1.min_duty must be >= 20 %" in out, out


@pytest.fixture(scope="module")
def through_bridge():
    with bridged(speed=20.0) as run, tempfile.TemporaryDirectory(prefix="mbe2e-", dir="/tmp") as d:
        path = os.path.join(d, "control.sock")
        run.bridge.serve_control(path)
        wait_for(lambda: (run.module().state or "BOOT") != "BOOT", 20, "the module out of BOOT")
        yield run, ["--control-socket", path]


def test_through_the_bridge_set_fan_setpoint_config(through_bridge):
    run, opts = through_bridge
    uid = run.module().module_id
    code, o = _json("set", uid[:6], "fans", "45%", *opts)
    assert code == 0 and o["via"] == "bridge" and o["module_id"] == uid, o
    assert o["applied"]["state"] == "MANUAL" and o["applied"]["fan2_duty_pct"] >= 45
    code, out = _cli("set", run.fleet.ports[0], "mode", "auto", *opts)
    assert code == 0 and out.startswith("mode: auto (ack)"), out
    wait_for(lambda: run.module().state == "HOSTED", 10, "HOSTED again")
    code, out = _cli("set", uid, "setpoint", "gpu", "150", *opts)
    assert code == 2 and "sp_gpu must be 20..110 degC" in out
    code, out = _cli("config", "set", uid, "gpu.setpoint=73", *opts)
    assert code == 0, out
    code, o = _json("config", "get", uid, "gpu.setpoint", *opts)
    assert code == 0 and o["data"]["values"] == {"gpu.setpoint": 73.0} and o["via"] == "bridge"
    code, out = _cli("config", "save", uid, *opts)
    assert code == 0, out
    code, out = _cli("set", "nosuchmodule", "mode", "auto", *opts)
    assert code == 3 and "no module nosuchmodule" in out


def test_through_the_bridge_selftest_and_repl_refused(through_bridge):
    run, opts = through_bridge
    uid = run.module().module_id
    code, o = _json("selftest", uid, *opts)
    assert code in (0, 1) and o["command"] == "selftest" and o["data"] is not None, o
    assert [f["fan"] for f in o["data"]["fans"]] == [1, 2]
    assert all(len(f["steps"]) >= 2 for f in o["data"]["fans"])
    assert o["ok"] == (code == 0) == o["data"]["passed"]
    code, out = _cli("repl", uid, *opts)
    assert code == 1 and "stop the bridge first" in out


def test_direct_by_config_name_and_by_id_prefix(direct, tmp_path):
    port, opts = direct
    cfg = tmp_path / "modbridge.toml"
    cfg.write_text(f'[[module]]\nport = "{port}"\nname = "sim0"\n')
    code, o = _json("config", "get", "sim0", "pid.kp", "--config", str(cfg), *opts)
    assert code == 0 and o["port"] == port and "pid.kp" in o["data"]["values"], o
    uid = o["module_id"]
    code, o = _json("config", "get", uid[:5], "pid.kp", "--config", str(cfg), *opts)
    assert code == 0 and o["module_id"] == uid
    code, out = _cli("config", "get", "ffff00", "--config", str(cfg), *opts)
    assert code == 3 and "no module ffff00 found" in out and uid in out
