"""Fleet benchmark: what one GPU host costs a Prometheus fleet, on loopback.

    python -m bench.run fleet
    python -c "import bench.bench_fleet as b; print(b.run())"

Two ``modbridge run --sim`` bridges: host a with 8 virtual modules and GPUs
(``--sim-modules 8``), host b with 1. Each has a Prometheus made from
packaging/prometheus/fleet/host-prometheus.yml (tests/promstack.py ``FleetStack``),
a global Prometheus made from global-prometheus.yml federates both every second and
evaluates the fleet rules; host a's Prometheus scrapes its bridge every 100 ms.

* ``fleet_series_per_gpu``: the samples of one /metrics scrape (parsed with
  prometheus_client.parser) of the 8-module bridge minus the 1-module one, over 7:
  what one more GPU and its module add. ``fleet_series_per_host_8_gpus`` and
  ``fleet_series_per_host_1_gpu`` are the totals (process metrics included).
  Scraped once every module is up and the count is steady (two scrapes agree).
* ``fleet_host_rule_series_8_gpus``: series host_rules.yml makes for host a;
  ``fleet_federated_series_per_host_8_gpus``: samples host a's /federate answers the
  global's match[] with (host rules, one raw temperature per GPU, ``up``, alerts).
* ``fleet_scrape_ms_p99_8_gpus`` (``_p50``, ``fleet_scrape_count_8_gpus``): host a's
  Prometheus's own ``scrape_duration_seconds`` of the bridge, every sample of the
  run (at least SCRAPES of them, 100 ms apart): what a scrape costs the host's
  Prometheus, as it measures it.
* ``fleet_federated_query_ms_p99`` (``_p50``, ``_count``): PromQL instant queries
  at the global, timed by this client (urllib, a connection per query), alternately
  the hottest GPU per host (``host:modbridge_gpu_temperature_celsius:max``) and a raw
  per-GPU query (``modbridge_gpu_temperature_celsius``), run while the scrapes are
  counted, so the machine is busy as a real host's would be.
  ``fleet_host_load_1m`` is the 1-minute load average at the start.

Wall time about 70 s: the bridges' start (~5 s), then SCRAPES scrapes at 100 ms.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from promstack import Bridge, Deadline, FleetStack, get  # noqa: E402

N = 8  # modules and GPUs on host a
SCRAPE_INTERVAL = "100ms"
SCRAPES = 500  # at least this many scrape_duration_seconds samples
QUERIES = 500  # at least this many federated queries
QUERY_PAUSE_S = 0.02  # between two queries: a dashboard's pace, not a load test
BUDGET_S = 90.0  # every wait of the run together
QUERY_EXPRS = ("host:modbridge_gpu_temperature_celsius:max", "modbridge_gpu_temperature_celsius")


def _percentile(sorted_values: list[float], q: float) -> float:
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def count_samples(exposition: str) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(exposition))


def _all_up(exposition: str, n: int) -> bool:
    """Every one of ``n`` modules linked, every GPU read, every pair with a target."""
    seen = {"modbridge_module_up": [], "modbridge_gpu_temperature_celsius": [],
            "modbridge_policy_target_limit_watts": []}  # fmt: skip
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name in seen:
                seen[s.name].append(s.value)
    return all(len(v) == n for v in seen.values()) and all(seen["modbridge_module_up"])


def steady_series(bridge: Bridge, n: int, deadline: Deadline) -> int:
    """The sample count of a scrape once all ``n`` modules are up and two scrapes a
    second apart agree."""
    last = [None]

    def check():
        text = bridge.metrics()
        if not _all_up(text, n):
            return None
        count, prev = count_samples(text), last[0]
        last[0] = count
        return count if count == prev else None

    return deadline.wait(f"{n} modules up and a steady series count", check, every=1.0,
                         proc=bridge.proc, log=bridge.err)  # fmt: skip


def federate_samples(prom_port: int, matchers: list[str]) -> int:
    query = urllib.parse.urlencode([("match[]", m) for m in matchers])
    with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/federate?{query}", timeout=5) as r:
        text = r.read().decode()
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def run() -> dict:
    import yaml

    load = os.getloadavg()[0]
    deadline = Deadline(BUDGET_S)
    with TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        a = Bridge(work / "a", "--sim-modules", str(N), duration=BUDGET_S + 30)
        b = Bridge(work / "b", "--sim-modules", "1", duration=BUDGET_S + 30)
        stack = None
        try:
            a.start()
            b.start()
            a.wait_up(deadline)
            b.wait_up(deadline)
            series_8 = steady_series(a, N, deadline)
            series_1 = steady_series(b, 1, deadline)
            stack = FleetStack(work, {"a": ("r1", a.target), "b": ("r1", b.target)},
                               scrape_interval={"a": SCRAPE_INTERVAL})  # fmt: skip
            stack.start(deadline)
            host_a, glob = stack.hosts["a"], stack.global_
            started = time.time()
            deadline.wait("the global to have both hosts' hottest GPU",
                          lambda: len(glob.query(QUERY_EXPRS[0])) == 2, every=0.25)  # fmt: skip

            def scrapes() -> int:
                expr = 'count_over_time(scrape_duration_seconds{job="modbridge"}[10m])'
                result = host_a.query(expr)
                return int(float(result[0]["value"][1])) if result else 0

            query_ms: list[float] = []
            while scrapes() < SCRAPES + 10 or len(query_ms) < QUERIES:
                if deadline.left() <= 0:
                    raise TimeoutError(f"{scrapes()} scrapes, {len(query_ms)} queries in time")
                for expr in QUERY_EXPRS:
                    t0 = time.perf_counter()
                    result = glob.query(expr)
                    query_ms.append((time.perf_counter() - t0) * 1000.0)
                    assert len(result) == (2 if expr == QUERY_EXPRS[0] else N + 1), result
                    time.sleep(QUERY_PAUSE_S)
            window = f"{int(time.time() - started) + 60}s"
            [durations] = host_a.query(f'scrape_duration_seconds{{job="modbridge"}}[{window}]')
            scrape_ms = sorted(float(v) * 1000.0 for _t, v in durations["values"])
            host_series = host_a.query('count({__name__=~"(host|gpu):modbridge_.+"})')
            rule_series = int(float(host_series[0]["value"][1]))
            global_doc = yaml.safe_load(glob.config.read_text())
            matchers = global_doc["scrape_configs"][0]["params"]["match[]"]
            federated = federate_samples(host_a.port, matchers)
            up = get(host_a.port, "/api/v1/query", query='up{job="modbridge"}')
            assert float(up["data"]["result"][0]["value"][1]) == 1
        finally:
            if stack is not None:
                stack.stop()
            a.stop()
            b.stop()
    query_ms.sort()
    return {
        "fleet_series_per_gpu": round((series_8 - series_1) / (N - 1), 2),
        "fleet_series_per_host_8_gpus": series_8,
        "fleet_series_per_host_1_gpu": series_1,
        "fleet_host_rule_series_8_gpus": rule_series,
        "fleet_federated_series_per_host_8_gpus": federated,
        "fleet_scrape_ms_p50_8_gpus": round(statistics.median(scrape_ms), 3),
        "fleet_scrape_ms_p99_8_gpus": round(_percentile(scrape_ms, 0.99), 3),
        "fleet_scrape_count_8_gpus": len(scrape_ms),
        "fleet_federated_query_ms_p50": round(statistics.median(query_ms), 3),
        "fleet_federated_query_ms_p99": round(_percentile(query_ms, 0.99), 3),
        "fleet_federated_query_count": len(query_ms),
        "fleet_host_load_1m": round(load, 2),
    }


if __name__ == "__main__":
    for key, value in sorted(run().items()):
        print(f"{key}: {value}")
