"""`modbridge sim`: CliRunner for output and exit codes, a subprocess for signals.

Every run uses the real firmware in MicroPython; the subprocess tests check by pid
that no micropython process outlives the command.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import serial
from click.testing import CliRunner

from modbridge.cli.main import main

REPO = Path(__file__).resolve().parent.parent
STATUS = re.compile(
    r"^ +(\d+\.\d)s (\S+) +gpu +[\d.]+ vram +[\d.]+ mos +[\d.]+ amb +[\d.]+ C \| "
    r"fans +\d+/ *\d+ rpm +\d+/ *\d+ % \| +[\d.]+ V +\d+ W \| GPU +\d+ C +\d+/\d+ W"
)


def run(*args):
    return CliRunner().invoke(main, ["sim", *args], catch_exceptions=False)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _children(pid):
    """Pids of the direct children of ``pid`` (micropython is started in its own session,
    but it stays our child)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and "micropython" in stat.split(")", 1)[0]:
            out.append(int(d))
    return out


def test_watch_prints_the_port_and_a_line_per_second():
    r = run("--world-duration", "5", "--speed", "max", "--watch")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()  # the MCU's lines are on stderr
    m = re.match(r"^module 0: (\S+) -> (/dev/pts/\d+) \(uid ([0-9a-f]{24}), ", lines[0])
    assert m and m.group(1).endswith("module-0.tty"), lines[0]
    status = [STATUS.match(line) for line in lines if " event: " not in line][1:]
    assert all(status), [line for line, s in zip(lines[1:], status, strict=False) if not s]
    assert [s.group(1) for s in status] == ["1.0", "2.0", "3.0", "4.0", "5.0"], lines
    assert [s.group(2) for s in status][1:] == ["STANDALONE"] * 4, lines
    assert any("event: BOOT -> STANDALONE (boot)" in line for line in lines), lines
    assert not os.path.lexists(m.group(1))  # the symlink went with the run


def test_json_lines_parse():
    r = run("--world-duration", "4", "--speed", "max", "--watch", "--json",
            "--fault", "dip:1V/1s@1.5s")  # fmt: skip
    assert r.exit_code == 0, r.output
    objs = [json.loads(line) for line in r.stdout.splitlines()]
    assert objs[0]["type"] == "module" and objs[0]["pty"].startswith("/dev/pts/"), objs[0]
    status = [o for o in objs if o["type"] == "status"]
    assert [o["world_s"] for o in status] == [1.0, 2.0, 3.0, 4.0], objs
    last = status[-1]
    assert last["state"] == "STANDALONE" and last["mcu"] == "running", last
    assert 20 < last["temp_gpu_c"] < 40 and last["fan1_duty_pct"] >= 20.0
    assert last["gpu_lost"] is False and 20 < last["gpu_temp_c"] < 40, last
    assert 11.5 < last["v_in_v"] < 12.5 and last["gpu_limit_w"] == 700.0, last
    assert {"fan1_rpm", "fan2_rpm", "p_in_w", "i_in_a", "gpu_power_w", "faults",
            "reason"} <= set(last)
    faults = [o for o in objs if o["type"] == "fault"]
    assert faults == [
        {
            "type": "fault",
            "world_s": 1.5,
            "module": "all",
            "fault": "dip",
            "on": True,
            "spec": "dip:1V/1s@1.5s",
            "text": "12 V dip 1000 mV/1000 ms",
        }
    ]
    uv = [o for o in objs if o["type"] == "event" and o["code"] == "under_voltage"]
    assert [o["active"] for o in uv] == [True, False] and uv[0]["value"] < 11400, uv
    mcu = [o for o in objs if o["type"] == "mcu"]
    assert [(o["kind"], o["version"]) for o in mcu] == [("running", "0.1.0"), ("off", None)]
    assert mcu[0]["text"] == "running firmware v0.1.0 (reset cause: power)", mcu
    assert r.stderr.splitlines()[0].endswith("MCU: running firmware v0.1.0 (reset cause: power)")


def test_faults_show_in_the_watch_and_two_modules():
    r = run(
        "--world-duration", "4", "--speed", "max", "--watch", "--modules", "2",
        "--fault", "m1:ntc_open:gpu@2s",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "module 0: " in out and "module 1: " in out
    assert "   2.0s fault: NTC gpu open on (m1)" in out, out
    last = out.splitlines()[-2:]
    assert " m0 STANDALONE " in last[0] and " m1 FAILSAFE(sensor_open) " in last[1], last
    assert "gpu   -- " in last[1] and last[1].endswith("| faults ntc_gpu"), last


def test_each_module_is_provisioned_and_says_where_its_key_is(tmp_path):
    from modbridge.link.keys import read_key_file

    kd = tmp_path / "keys"
    r = run("--world-duration", "1", "--speed", "max", "--watch", "--json", "--modules", "2",
            "--state-dir", str(tmp_path / "st"), "--keys-dir", str(kd))  # fmt: skip
    assert r.exit_code == 0, r.output
    mods = [json.loads(line) for line in r.stdout.splitlines()[:2]]
    for i, m in enumerate(mods):
        assert m["type"] == "module" and m["key"] == str(kd / f"{m['uid']}.key"), m
        assert m["secret"] == str(tmp_path / "st" / f"module-{i}" / "flash" / "secret.key")
        key = read_key_file(m["key"])  # 0600, 32 bytes
        assert key == Path(m["secret"]).read_bytes()
    assert mods[0]["key"] != mods[1]["key"]
    assert read_key_file(mods[0]["key"]) != read_key_file(mods[1]["key"])
    # a second run over the same state keeps the keys (the module keeps its secret)
    before = read_key_file(mods[0]["key"])
    r = run("--world-duration", "1", "--speed", "max", "--state-dir", str(tmp_path / "st"),
            "--keys-dir", str(kd))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert read_key_file(mods[0]["key"]) == before
    assert f"key {mods[0]['key']}" in r.output.splitlines()[0]
    assert f"MODBRIDGE_KEYS_DIR={kd}" in r.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--fault", "fan_stall:3@60s"], "--fault 'fan_stall:3@60s': fan_stall needs the fan"),
        (["--fault", "gpu_lost"], "--fault 'gpu_lost': no start time"),
        (["--fault", "dip:900mV@45s"], "dip needs <depth>/<duration>"),
        (["--fault", "m1:gpu_lost@1s"], "no module 1 (modules are 0..0)"),
        (["--speed", "fast"], "--speed: a number > 0 or 'max'"),
        (["--world", "nowhere"], "no built-in world 'nowhere'"),
        (["--profile", "nothing"], "profile 'nothing' is neither a built-in"),
        (["--json"], "--json goes with --watch"),
        (["--world-duration", "0"], "--world-duration: simulated seconds > 0"),
        (["--duration", "-1"], "--duration: wall-clock seconds > 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    timed = any("duration" in a for a in args)
    r = run(*args) if timed else run(*args, "--world-duration", "1")
    assert r.exit_code == 2, r.output
    assert r.stdout == "", r.stdout  # nothing started
    err = r.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("modbridge sim: ") and words in err[0], err


def _start(tmp_path, *args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "modbridge", "sim", "--state-dir", str(tmp_path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )


def _readline(proc, timeout_s=20.0):
    r, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert r, "no output from modbridge sim"
    return proc.stdout.readline().decode()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_it_cleanly(tmp_path, sig):
    proc = _start(tmp_path, "--speed", "5")
    try:
        first = _readline(proc)
        m = re.match(r"^module 0: (\S+) -> (/dev/pts/\d+) ", first)
        assert m, first
        link = Path(m.group(1))
        assert link == tmp_path / "module-0.tty"
        ser = serial.Serial(str(link), 115200, timeout=0.2)  # anything can open it
        data = b""
        end = time.monotonic() + 20
        while b"MODULER READY" not in data and time.monotonic() < end:
            data += ser.read(256)
        ser.close()
        assert b"MODULER READY v" in data, data[:80]
        kids = _children(proc.pid)
        assert len(kids) == 1, kids
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=10)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert rc == 0, err
    assert took < 3.0, took
    assert not _alive(kids[0]), kids
    assert not os.path.lexists(link)
    assert (tmp_path / "module-0" / "flash").is_dir()  # --state-dir: kept for the next run
    assert "Traceback" not in err, err


def test_options_mean_what_they_mean_in_run():
    """--duration is wall-clock seconds (as run and record), --world-duration simulated
    seconds; the --sim-* names of run are accepted; the default profile is run's."""
    import time

    t0 = time.monotonic()
    r = run("--duration", "2", "--sim-speed", "1", "--sim-profile", "idle", "--watch",
            "--json", "--sim-fault", "dip:1V/1s@0.5s")  # fmt: skip
    wall = time.monotonic() - t0
    assert r.exit_code == 0, r.output
    objs = [json.loads(line) for line in r.stdout.splitlines()]
    assert any(o.get("type") == "fault" for o in objs), objs
    seen = [o for o in objs if o.get("type") == "status"]
    # about 2 simulated s at real time; at most what 2 wall seconds could hold
    assert seen and max(o["world_s"] for o in seen) <= wall + 1, (seen[-1], wall)
    from modbridge.cli.sim import sim_cmd

    prof = [p for p in sim_cmd.params if p.name == "profile"][0]
    from modbridge.cli.bridge import status_cmd

    assert prof.default == [p for p in status_cmd.params if p.name == "sim_profile"][0].default


def test_sim_speed_max_is_accepted_wherever_sim_speed_is():
    from modbridge.cli.main import main as cli

    for cmd in ("run", "status", "doctor", "record", "healthcheck", "monitor"):
        sub = cli.get_command(None, cmd)
        ctx = sub.make_context(cmd, ["--sim", "--sim-speed", "max"])
        assert ctx.params["sim_speed"] > 1, (cmd, ctx.params["sim_speed"])
