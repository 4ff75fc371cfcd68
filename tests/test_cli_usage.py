"""The CLI's small promises: ``-h``, the exit codes of docs/bridge.md (2 for a usage
error, whatever the command), ``--sim-speed max``, every ``[policy]`` problem named by
``config validate``, and the status views showing duty and why a module is in FAILSAFE."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from modbridge.cli import bridge as cli_bridge
from modbridge.cli import monitor
from modbridge.cli.main import main


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


@pytest.mark.parametrize("args", [(), ("status",), ("frame", "encode"), ("config", "validate")])
def test_dash_h_is_help_everywhere(args):
    res = run(*args, "-h")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Usage: ") and "--help" in res.output


@pytest.mark.parametrize(
    "args, said",
    [
        (("frame", "decode", "zz"), "not hex"),
        (("frame", "encode", "notjson"), "cannot encode"),
        (("frame", "encode", '{"type":"nope"}'), "unknown message type"),
        (("frame", "encode", '{"type":"heartbeat"}', "--nonce", "00"), "go together"),
        (("flash", "--board", "nope", "--port", "/dev/null", "--dry-run"), "unknown board"),
        (("wire-demo", "--seconds", "-1"), "--seconds"),
        (("wire-demo", "--period-ms", "0"), "--period-ms"),
        (("status", "--sim", "--sim-world", "nope"), "no built-in world"),
        (("monitor", "--sim", "--sim-profile", "nope"), "neither a built-in"),
        (("run", "--sim", "--sim-speed", "fast", "--once"), "a number > 0 or 'max'"),
        (("status", "--sim-fault", "fan_stall:1@1s"), "needs --sim"),
    ],
)
def test_usage_errors_exit_2_and_say_what_is_wrong(args, said):
    res = run(*args)
    assert res.exit_code == 2, (args, res.exit_code, res.output)
    assert said in res.output, res.output


@pytest.mark.parametrize("text, speed", [("max", 10.0), ("MAX", 10.0), ("0", 10.0),
                                         ("5", 5.0), ("0.5", 0.5)])  # fmt: skip
def test_sim_speed_max_is_the_fastest_pace_heartbeats_keep_up_with(text, speed):
    assert cli_bridge.SIM_SPEED.convert(text, None, None) == speed
    assert cli_bridge.SIM_SPEED_MAX_HOSTED == 10.0


@given(st.text(max_size=8))
def test_sim_speed_refuses_anything_else_by_name(text):
    try:
        v = cli_bridge.SIM_SPEED.convert(text, None, None)
    except click.BadParameter as e:
        assert "a number > 0 or 'max'" in str(e)
    else:
        assert 0 < v < float("inf")


def test_config_validate_names_every_policy_problem(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(
        '[policy]\nwarn_temp_c = "hot"\ncritical_temp_c = -5\nnonsense = 3\n'
        "[bridge]\ntick_s = 0\n"
    )
    res = run("config", "validate", str(p))
    assert res.exit_code == 2
    for said in ("bridge.tick_s", "'nonsense'", "warn_temp_c must be a number",
                 "critical_temp_c must be > 0", "4 problem(s)"):  # fmt: skip
        assert said in res.output, (said, res.output)


def _rep(state="HOSTED", reason="host_ok", fans=((1200, 0.4), (1180, 0.4))):
    return {
        "backend": "virtual",
        "gpus": [],
        "modules": [
            {
                "module_id": "abc123",
                "port": "/dev/ttyUSB0",
                "link_up": True,
                "state": state,
                "reason": reason,
                "faults": [],
                "temp_gpu_c": 60.0,
                **{k: v for i, (r, d) in enumerate(fans, 1)
                   for k, v in ((f"fan{i}_rpm", r),
                                (f"fan{i}_duty_pct", None if d is None else d * 100))},
                "gpu": None,
                "policy": None,
            }
        ],
    }


def test_status_views_show_fan_duty_in_percent():
    rows = monitor.table(_rep())
    assert any("fans rpm 1200/1180  duty 40/40 %" in r for r in rows), rows
    assert "1200/1180rpm@40/40%" in monitor.status_line(_rep(), clock=lambda: 0)
    rows = monitor.table(_rep(fans=((None, None), (None, None))))
    assert any("duty -" in r for r in rows), rows


def test_the_status_line_says_why_a_module_is_in_failsafe():
    line = monitor.status_line(_rep("FAILSAFE", "sensor_open"), clock=lambda: 0)
    assert "FAILSAFE(sensor_open)" in line
    line = monitor.status_line(_rep("HOSTED", "host_ok"), clock=lambda: 0)
    assert "HOSTED " in line and "host_ok" not in line


def test_a_reader_that_goes_away_is_not_a_failure():
    """`modbridge ... | head -1`: the pipe's reader closes before the command writes;
    the command ends quietly with 0, no traceback (click alone exits 1)."""
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "modbridge"
    for args in (["config", "example"], ["--help"], ["frame", "decode", "00"]):
        proc = subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
        proc.stdout.close()  # the reader is gone before the first line is written
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 or args[0] == "frame", (args, proc.returncode, err)
        assert b"Traceback" not in err and b"BrokenPipe" not in err, (args, err)
