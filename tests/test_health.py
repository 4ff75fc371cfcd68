"""The scheduler health verdict (ops/health.py, `modbridge healthcheck`) on real
``modbridge status --json`` documents from virtual modules (the real firmware in
MicroPython on ptys): a healthy one, a fan stall seen through a running bridge's
control socket, a silent module; hypothesis: whatever else a report says, a module
made CRITICAL, FAILSAFE or silent makes the node unhealthy and is named; garbage is a
clear exit 2. Also: `modbridge status` reaches a running bridge over its socket while
the bridge holds the port."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from e2e_helpers import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modbridge.ops import ctlsock, health

MODBRIDGE = str(Path(sys.executable).with_name("modbridge"))
BRIDGE_START_S = 40.0


def cli(*args, input=None, env=None, timeout=90):
    return subprocess.run([MODBRIDGE, *args], capture_output=True, text=True, input=input,
                          timeout=timeout, env=env)  # fmt: skip


@contextmanager
def running_bridge(*args, speed="10"):
    """``modbridge run --sim`` with its control socket in a short temporary directory
    (a Unix socket path is at most 107 bytes); yields (process, socket path, dir).
    Stopped (SIGTERM, then SIGKILL) and removed at the end, also on failure."""
    d = tempfile.mkdtemp(prefix="mbh-", dir="/tmp")
    sock = os.path.join(d, "control.sock")
    err = open(os.path.join(d, "run.err"), "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([MODBRIDGE, "run", "--sim", "--sim-speed", speed, "--no-metrics",
                             "--status-every", "0", "--control-socket", sock, *args],
                            stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True)  # fmt: skip
    try:

        def up():
            if proc.poll() is not None:
                raise AssertionError(f"modbridge run exited {proc.returncode}: "
                                     + Path(d, "run.err").read_text()[-2000:])  # fmt: skip
            try:
                rep = ctlsock.Client(sock).call({"op": "report"})
            except ctlsock.SocketError:
                return False
            return rep.get("ok") and all(m["link_up"] for m in rep["report"]["modules"])

        wait_for(up, BRIDGE_START_S, "modbridge run's control socket and its module")
        yield proc, sock, d
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        err.close()
        shutil.rmtree(d, ignore_errors=True)


def bridge_report(sock: str) -> dict:
    r = ctlsock.Client(sock).call({"op": "report"})
    assert r["ok"], r
    return r["report"]


@pytest.fixture(scope="module")
def sim_doc():
    """``modbridge status --sim --json``: one virtual module, healthy."""
    res = cli("status", "--sim", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# ------------------------------------------------------------------ real documents


def test_sim_status_is_healthy_and_pipes_into_healthcheck(sim_doc, tmp_path):
    v = health.judge(sim_doc)
    assert v.healthy and v.modules == 1 and v.gpus == 1 and v.reason == "CoolingOk", v
    path = tmp_path / "status.json"
    path.write_text(json.dumps(sim_doc))
    res = cli("healthcheck", "--input", str(path), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["healthy"] is True and out["source"] == str(path) and out["action"] is None
    # the pipe the docs show: status --json | healthcheck --input -
    res = subprocess.run(f"{MODBRIDGE} status --sim --json | {MODBRIDGE} healthcheck --input -",
                         shell=True, capture_output=True, text=True, timeout=90)  # fmt: skip
    assert res.returncode == 0 and res.stdout.startswith("healthy: cooling ok: 1 module(s)"), (
        res.stdout + res.stderr
    )


def test_status_reaches_the_running_bridge_over_its_control_socket():
    with running_bridge() as (proc, sock, d):
        res = cli("status", "--json", "--control-socket", sock)
        assert res.returncode == 0, res.stderr
        rep = json.loads(res.stdout)
        assert rep["bridge"]["pid"] == proc.pid and rep["bridge"]["ticks"] >= 1
        assert rep["bridge"]["snapshot_age_s"] < 5
        (m,) = rep["modules"]
        assert m["link_up"] and m["gpu"]["uuid"] and m["policy"]["level"] in ("NORMAL", "WARN")
        # the default path logic: $RUNTIME_DIRECTORY/control.sock, as systemd sets it
        env = {**os.environ, "RUNTIME_DIRECTORY": d}
        res = cli("status", "--json", env=env)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["bridge"]["pid"] == proc.pid
        res = cli("status", env=env)  # the table, from the same report
        assert res.returncode == 0 and f"module {m['module_id']}" in res.stdout, res.stdout
        # the bridge holds the port: a direct look cannot have it
        res = cli("status", "--direct", "--port", m["port"], "--json", "--timeout", "3", env=env)
        assert res.returncode != 0, res.stdout
        # and the healthcheck judges the bridge through the same socket
        res = cli("healthcheck", "--json", env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads(res.stdout)["source"] == sock
    # no bridge any more: status says why it goes direct, healthcheck: nothing to judge
    res = cli("healthcheck", "--control-socket", sock)
    assert res.returncode == 3 and "no bridge" in res.stdout, res.stdout + res.stderr


def test_both_fans_stalled_through_the_bridge_is_critical_and_unhealthy():
    faults = ["--sim-fault", "fan_stall:1@20s", "--sim-fault", "fan_stall:2@20s"]
    with running_bridge(*faults) as (_proc, sock, _d):

        def critical():
            rep = bridge_report(sock)
            m = rep["modules"][0]
            level = (m.get("policy") or {}).get("level")  # no policy yet: not paired yet
            return rep if level == "CRITICAL" and m["state"] == "FAILSAFE" else None

        rep = wait_for(critical, 60, "CRITICAL and FAILSAFE on both fans stalled")
        v = health.judge(rep)
        mid = rep["modules"][0]["module_id"]
        assert not v.healthy and v.reason == "ModuleCritical", v
        assert {p.code for p in v.problems} == {"module_critical", "module_failsafe"}
        assert all(p.module_id == mid and mid[:12] in p.message for p in v.problems)
        assert "both_fans_stalled" in v.summary()
        res = cli("healthcheck", "--control-socket", sock)
        assert res.returncode == 1 and res.stdout.startswith("unhealthy: module "), res.stdout


def test_a_silent_module_is_unhealthy(sim_doc):
    old = copy.deepcopy(sim_doc)
    old["modules"][0]["last_frame_age_s"] = 42.0
    v = health.judge(old)
    assert not v.healthy and v.problems[0].code == "module_silent" and "42.0 s" in v.summary()
    assert health.judge(old, silent_after_s=60).healthy  # the bound is the caller's
    down = copy.deepcopy(sim_doc)
    down["modules"][0].update(link_up=False, last_error="read failed: EIO")
    v = health.judge(down)
    assert not v.healthy and "link down (read failed: EIO)" in v.summary()


def test_unpaired_gpu_no_module_and_a_stalled_bridge(sim_doc):
    extra = copy.deepcopy(sim_doc)
    extra["gpus"].append({**extra["gpus"][0], "uuid": "GPU-0000-extra", "pci_bus_id": "x:07"})
    v = health.judge(extra)
    assert not v.healthy and v.problems[0].code == "gpu_unpaired"
    assert "GPU GPU-0000-extra" in v.summary() and v.reason == "GpuWithoutModule"
    assert health.judge(extra, ignore_gpus=["GPU-0000-extra"]).healthy
    none = {**sim_doc, "modules": []}
    v = health.judge(none)
    assert not v.healthy and v.reason == "NoModule"
    stalled = {**sim_doc, "bridge": {"pid": 1, "ticks": 9, "snapshot_age_s": 120.0}}
    assert health.judge(stalled).reason == "BridgeStalled"
    assert health.judge({**stalled, "bridge": {"snapshot_age_s": 0.3}}).healthy


def test_a_module_not_paired_yet_defers_the_unpaired_gpu(sim_doc):
    # a report taken between the module's hello and the bridge's next tick
    doc = copy.deepcopy(sim_doc)
    doc["modules"][0].update(gpu=None, policy=None)
    v = health.judge(doc)
    assert v.healthy and {w.code for w in v.warnings} == {"module_pending", "gpu_unpaired"}, v
    doc["modules"][0]["policy"] = copy.deepcopy(sim_doc["modules"][0]["policy"])  # paired: none
    v = health.judge(doc)
    assert not v.healthy and v.reason == "GpuWithoutModule", v


def test_warn_standalone_and_boot_are_healthy_but_reported(sim_doc):
    doc = copy.deepcopy(sim_doc)
    m = doc["modules"][0]
    m["policy"].update(level="WARN", reasons=["fan_stall"])
    m["state"], m["reason"] = "STANDALONE", "host_timeout"
    v = health.judge(doc)
    assert v.healthy, v
    assert {w.code for w in v.warnings} == {"module_warn", "module_standalone"}
    assert "WARN (fan_stall)" in v.summary()


def test_the_report_op_never_waits_for_the_loop():
    """The control socket's report is the last snapshot's, built on the socket's
    thread: with the tick lock held (a tick running) it still answers, and it never
    ticks."""
    import threading

    from modbridge.config import BridgeConfig
    from modbridge.model import BridgeSnapshot

    class Busy:
        config, ticks, links = BridgeConfig(), 7, {}

        def __init__(self):
            self._tick_lock = threading.Lock()
            self._tick_lock.acquire()

        def clock(self):
            return 100.0

        def snapshot(self):
            return BridgeSnapshot(taken_at=90.0, backend="virtual")

        def tick(self):
            raise AssertionError("the report op must not tick")

        def control_link(self, module):
            from types import SimpleNamespace

            return SimpleNamespace(status=SimpleNamespace(module_id=module), port="/dev/m0")

    r = ctlsock.BridgeControl(Busy())({"op": "report"})
    assert r["ok"] and r["report"]["modules"] == [] and r["report"]["backend"] == "virtual"
    assert r["report"]["bridge"]["snapshot_age_s"] == 10.0 and r["report"]["bridge"]["ticks"] == 7
    assert health.judge(r["report"]).reason == "NoModule"
    bad = ctlsock.BridgeControl(Busy())({"op": "nope", "module": "x"})
    assert not bad["ok"] and "report" in bad["message"]


# ------------------------------------------------------------------ hypothesis

BREAKS = {
    "critical": lambda m: m["policy"].update(level="CRITICAL", reasons=["critical_temp"]),
    "failsafe": lambda m: m.update(state="FAILSAFE", reason="fan_stall", faults=["fan1_stall"]),
    "link_down": lambda m: m.update(link_up=False),
    "old_frame": lambda m: m.update(last_frame_age_s=10.5),
    "never_heard": lambda m: m.update(last_frame_age_s=None),
}
EXPECT = {"critical": "module_critical", "failsafe": "module_failsafe",
          "link_down": "module_silent", "old_frame": "module_silent",
          "never_heard": "module_silent"}  # fmt: skip
_floats = st.floats(-50, 200, allow_nan=False)
NOISE = st.fixed_dictionaries({
    "temp_gpu_c": st.none() | _floats,
    "temp_vram_c": st.none() | _floats,
    "fan1_rpm": st.none() | st.integers(0, 9000),
    "fan1_duty_pct": st.none() | st.floats(0, 100),
    "v_in_v": st.none() | _floats,
    "reconnects": st.integers(0, 10**6),
    "last_frame_age_s": st.floats(0, 9.99),
    "state": st.sampled_from(["HOSTED", "STANDALONE", "MANUAL", "BOOT", None]),
})  # fmt: skip


def _fleet(doc: dict, n: int) -> dict:
    """``doc`` with ``n`` modules (distinct ids, each cooling its own GPU)."""
    out = copy.deepcopy(doc)
    m0, g0 = out["modules"][0], out["gpus"][0]
    out["modules"], out["gpus"] = [], []
    for i in range(n):
        g = {**copy.deepcopy(g0), "uuid": f"GPU-{i:04d}-{g0['uuid']}"}
        m = {**copy.deepcopy(m0), "module_id": f"{i:02d}{m0['module_id']}", "gpu": g}
        out["modules"].append(m)
        out["gpus"].append(g)
    return out


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(n=st.integers(1, 6), data=st.data())
def test_any_module_made_critical_or_silent_is_unhealthy_and_named(sim_doc, n, data):
    doc = _fleet(sim_doc, n)
    for m in doc["modules"]:  # whatever the rest says (healthy values)
        m.update(data.draw(NOISE))
    victim = data.draw(st.integers(0, n - 1))
    breaks = data.draw(st.lists(st.sampled_from(sorted(BREAKS)), min_size=1, unique=True))
    m = doc["modules"][victim]
    for b in breaks:
        BREAKS[b](m)
    v = health.judge(doc)
    assert not v.healthy
    mine = [p for p in v.problems if p.module_id == m["module_id"]]
    assert mine and all(m["module_id"][:12] in p.message for p in mine), v
    silent = {"link_down", "old_frame", "never_heard"} & set(breaks)
    want = {"module_silent"} if silent else {EXPECT[b] for b in breaks}
    assert {p.code for p in mine} == want, (breaks, v)
    assert all(p.module_id == m["module_id"] for p in v.problems), "only the victim"
    assert m["module_id"][:12] in v.summary(10_000)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(n=st.integers(1, 6), data=st.data())
def test_healthy_values_stay_healthy(sim_doc, n, data):
    doc = _fleet(sim_doc, n)
    for m in doc["modules"]:
        m.update(data.draw(NOISE))
        if data.draw(st.booleans()):
            m["policy"].update(level="WARN", reasons=["under_voltage"])
    assert health.judge(doc).healthy


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_garbage_is_a_report_error_never_a_crash(sim_doc, data):
    doc = copy.deepcopy(sim_doc)
    # replace one field anywhere in a real document with any JSON value
    path, node = [], doc
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        k = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        path.append(k)
        node = node[k]
    value = data.draw(_json)
    if path:
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = value
    else:
        doc = value
    try:
        v = health.judge(doc)
    except health.ReportError as e:
        assert str(e)
    else:
        assert isinstance(v, health.Verdict)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "not JSON"),
        ("garbage\n", "not JSON"),
        ("[1, 2]", "the report: an object"),
        ('{"modules": 3}', "modules: a list"),
        ('{"modules": [{"link_up": "yes"}]}', "modules[0].link_up: true or false"),
        ('{"modules": [], "gpus": [7]}', "gpus[0]: an object"),
        ("\x00\xff\xfe", "not JSON"),
    ],
)
def test_garbage_input_exits_2_with_a_clear_message(text, says):
    res = cli("healthcheck", "--input", "-", input=text, timeout=30)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert says in res.stderr and res.stderr.startswith("modbridge healthcheck: "), res.stderr


def test_usage_errors_exit_2(tmp_path):
    assert cli("healthcheck", "--input", "-", "--watch", "5", input="{}").returncode == 2
    assert cli("healthcheck", "--input", str(tmp_path / "none.json")).returncode == 2
    res = cli("healthcheck", "--kubernetes", "--input", "-", input="{}",
              env={k: v for k, v in os.environ.items() if k != "NODE_NAME"})  # fmt: skip
    assert res.returncode == 2 and "--node" in res.stderr


def test_state_dir_finds_the_bridges_socket():
    """`run --state-dir DIR` puts its control socket at DIR/control.sock; `status`,
    `healthcheck` and `doctor` given the same --state-dir find it there (they said
    "no bridge" before)."""
    env = {k: v for k, v in os.environ.items() if k != "RUNTIME_DIRECTORY"}
    with running_bridge() as (_proc, sock, d):
        assert sock == os.path.join(d, "control.sock")
        res = cli("healthcheck", "--state-dir", d, "--json", env=env)
        out = json.loads(res.stdout)
        assert out["source"] == sock, (out["source"], res.stderr)
        res = cli("status", "--state-dir", d, "--json", env=env)
        assert res.returncode == 0, res.stderr
        assert "opening the ports directly" not in res.stderr
        assert json.loads(res.stdout)["modules"], res.stdout
        res = cli("doctor", "--state-dir", d, "--json", "--config", os.devnull,
                  "--metrics-url", "http://127.0.0.1:1/metrics", env=env)  # fmt: skip
        checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
        assert checks["control_socket"]["status"] == "pass", checks["control_socket"]
