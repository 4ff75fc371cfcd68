"""A real Prometheus (Debian's /usr/bin/prometheus) scraping `modbridge run --sim`.

Everything on 127.0.0.1: the bridge runs a virtual module and GPU at 4x real time
with fan 1 stalling at 45 s of world time; Prometheus scrapes it every second and
evaluates packaging/prometheus/alerts.yml every second, from a copy whose `for:`
durations are 2 s. Through the HTTP API the test checks that the module's and the
GPU's series arrive (and the dashboard's correlation join pairs them), that every
rule and every dashboard query evaluates without error on real data, and that
ModbridgeFanStalled (and ModbridgePowerLimitLowered, the bridge's reaction) fire
after the stall. Both processes are stopped at the end; the waits are bounded (the
whole test takes about 25 s, at most 90 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from promstack import PROMETHEUS, PROMETHEUS_MISSING, Deadline, free_port, get, query, ready, stop
from test_packaging_monitoring import ALERTS, dashboard, dashboard_exprs

from modbridge.tools.mpy import MicroPythonMissing, micropython_path

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason=PROMETHEUS_MISSING)

SIM_SPEED = 4
STALL = "fan_stall:1@45s-120s"  # world time: ~11 s of wall time after the module boots
SHORT_FOR = "2s"
BUDGET_S = 50.0  # the test's waits, after the fixtures' (20 s + 15 s at most)


@pytest.fixture
def bridge(tmp_path):
    """`modbridge run --sim` with a fan stall; yields (its metrics port, stderr path)."""
    try:
        micropython_path()
    except MicroPythonMissing as e:
        pytest.skip(f"the virtual module needs micropython: {e}")
    err = tmp_path / "bridge.err"
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")])}  # fmt: skip
    with open(err, "w") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modbridge", "run", "--sim", "--sim-speed", str(SIM_SPEED),
             "--sim-fault", STALL, "--metrics-port", "0", "--status-every", "0",
             "--duration", "90", "--event-log", str(tmp_path / "events.jsonl")],
            stdout=subprocess.DEVNULL, stderr=errf, env=env, cwd=tmp_path,
        )  # fmt: skip
    try:
        found = Deadline(20).wait(
            "the bridge's metrics line",
            lambda: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", err.read_text()),
            proc=proc,
            log=err,
        )
        yield int(found.group(1)), err
    finally:
        stop(proc, "modbridge run --sim")


@pytest.fixture
def prometheus(tmp_path, bridge):
    """Prometheus on a free loopback port scraping the bridge every second, with the
    alert rules at short `for:`; yields its port."""
    metrics_port, _err = bridge
    rules = ALERTS.read_text(encoding="utf-8")
    n_rules = len(re.findall(r"^\s+- alert: ", rules, re.M))
    rules, n_for = re.subn(r"^(\s+for:) \S+$", rf"\1 {SHORT_FOR}", rules, flags=re.M)
    assert n_for == n_rules, "every alert rule has a for: line to shorten"
    (tmp_path / "alerts.yml").write_text(rules)
    (tmp_path / "prometheus.yml").write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "rule_files:\n"
        "  - alerts.yml\n"
        "scrape_configs:\n"
        "  - job_name: modbridge\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "w") as logf:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=logf, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    try:
        Deadline(15).wait("Prometheus to be ready", lambda: ready(port), proc=proc, log=log)
        yield port
    finally:
        stop(proc, "prometheus")


def _dashboard_expr_for_api(expr: str) -> str:
    """A dashboard query as Grafana would send it with every variable on "All"."""
    expr = re.sub(r"\$__rate_interval|\$__interval", "5s", expr)
    return re.sub(r"\$\{?(instance|module|gpu)\}?", ".*", expr)


def test_prometheus_scrapes_the_sim_and_fires_the_fan_stall_alert(bridge, prometheus):
    _metrics_port, bridge_err = bridge
    port = prometheus
    deadline = Deadline(BUDGET_S)

    # the module's and the GPU's series arrive
    modules = deadline.wait(
        "module temperature series",
        lambda: query(port, 'modbridge_module_temperature_celsius{job="modbridge"}'),
    )
    module = modules[0]["metric"]["module"]
    assert {m["metric"]["channel"] for m in modules} == {"gpu", "vram", "mos", "amb"}
    assert all(m["metric"]["instance"].startswith("127.0.0.1:") for m in modules)
    gpus = deadline.wait("GPU temperature series",
                         lambda: query(port, "modbridge_gpu_temperature_celsius"))  # fmt: skip
    gpu = gpus[0]["metric"]["gpu"]
    assert gpu.startswith("GPU-") and 0 < float(gpus[0]["value"][1]) < 120
    fans = query(port, "modbridge_module_fan_speed_rpm")
    assert {f["metric"]["fan"] for f in fans} == {"1", "2"}

    # the dashboard's correlation join pairs this module with its GPU
    panel = next(p for p in dashboard()["panels"] if p["title"] == "Module NTC vs GPU temperature")
    diff = next(t for t in panel["targets"] if t["refId"] == "C")
    [pair] = deadline.wait("the NTC - GPU difference",
                           lambda: query(port, _dashboard_expr_for_api(diff["expr"])))  # fmt: skip
    assert (pair["metric"]["module"], pair["metric"]["gpu"]) == (module, gpu)
    assert -30 < float(pair["value"][1]) < 30

    # before the stall (world time < 40 s: ~1 frame a second) and past the fans' spin-up
    # at boot, the alert is quiet (neither firing nor pending)
    def frames():
        result = query(port, "modbridge_module_frames_total")
        return float(result[0]["value"][1]) if result else 0.0

    if deadline.wait("10 frames", lambda: frames() >= 10) and frames() < 35:
        assert query(port, 'ALERTS{alertname="ModbridgeFanStalled"}') == []

    # after it: fan 1 of this module, firing, with its annotations
    def firing(name):
        alerts = get(port, "/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts
                if a["labels"]["alertname"] == name and a["state"] == "firing"]  # fmt: skip

    [stalled] = deadline.wait("ModbridgeFanStalled to fire", lambda: firing("ModbridgeFanStalled"))
    assert stalled["labels"]["fan"] == "1" and stalled["labels"]["module"] == module
    assert stalled["labels"]["severity"] == "critical"
    assert stalled["annotations"]["summary"].startswith(f"Fan 1 of module {module} stalled")
    assert "modbridge doctor" in stalled["annotations"]["runbook"]
    # the bridge lowered the GPU's power limit in answer
    [lowered] = deadline.wait("ModbridgePowerLimitLowered to fire",
                              lambda: firing("ModbridgePowerLimitLowered"))  # fmt: skip
    assert (lowered["labels"]["module"], lowered["labels"]["gpu"]) == (module, gpu)
    assert float(lowered["value"]) < float(
        query(port, "modbridge_gpu_power_limit_original_watts")[0]["value"][1]
    )

    # every rule evaluated on real data without an error (a many-to-many join, say)
    groups = get(port, "/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(re.findall(r"^\s+- alert: ", ALERTS.read_text(), re.M))
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert bad == []

    # and so does every dashboard query, the module and GPU panels with data
    empty = []
    for where, expr in dashboard_exprs(dashboard()):
        result = query(port, _dashboard_expr_for_api(expr))  # asserts "success"
        if not result:
            empty.append(where)
    for must in ("Module NTC channels", "GPU temperatures and thresholds", "Fan speed",
                 "Fan duty", "12 V input power vs GPU power", "Power limits",
                 "Last frame age", "Bridge health", "Inventory"):  # fmt: skip
        assert f"panel {must!r} A" not in empty, f"{must}: no data ({empty})"
    assert "Traceback" not in bridge_err.read_text()
