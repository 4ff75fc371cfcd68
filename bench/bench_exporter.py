"""Exporter benchmark: /metrics scrapes over HTTP with 8 modules and 8 GPUs.

    python -m bench.run exporter
    python -c "import bench.bench_exporter as b; print(b.run())"

Starts the real endpoint (``exporter.serve``) on 127.0.0.1 with an ephemeral port,
then times SCRAPES sequential GETs from a scraper in a process of its own (``python
-m bench.bench_exporter client URL``, an ``http.client`` connection per scrape)
sending the headers Prometheus sends (``Accept`` OpenMetrics first,
``Accept-Encoding: gzip``, its ``User-Agent`` and scrape timeout): connect, request,
the render, gzip, response, close, decompression, timed by the scraper. Prometheus
is a process apart from the bridge; a client in the bridge's own process (as this
benchmark had, urllib) put its own CPU and a second thread fighting for the GIL
inside every timed scrape, and that is not what a scrape of a bridge costs. Every
optional value in the snapshot is set, so the body is the largest a healthy bridge
produces. Process metrics are included, as in ``modbridge run``.

The bridge publishes a snapshot every tick (2 Hz) and Prometheus scrapes every 15 s,
so nearly every real scrape meets a snapshot version that was never rendered:
``scrape_ms_p50``/``_p99`` publish a new snapshot (other values, same modules) before
every scrape and so time the full render. ``scrape_ms_p99_same_snapshot`` is a
second scraper (an HA pair) reading a version already rendered. ``scrape_bytes_8_modules``
is the body as rendered, ``scrape_bytes_gzip_8_modules`` what went over the wire,
``scrape_samples_8_modules`` the sample lines in it. ``scrape_cpu_ms_*`` is the
endpoint's own CPU per request (thread time of the render, the process metrics and
gzip; not the HTTP plumbing): unlike the wall times it barely moves when other
processes load the machine, whose 1-minute load average at the start is
``scrape_host_load_1m``.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from modbridge.exporter import prometheus as exporter
from modbridge.gpu.base import CLOCKS_EVENT_REASONS, GpuSample
from modbridge.model import BridgeSnapshot, ModuleStatus, PairState
from protocol import catalog as C

N = 8  # modules and GPUs
SCRAPES = 1_000
WARMUP = 20
# What Prometheus 3 sends by default (scrape_protocols, UTF-8 names allowed, gzip);
# 2.x sends the same without the escaping parameter.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/3.5.0",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",  # scrape_timeout's default
}
ROOT = Path(__file__).resolve().parent.parent


def fleet_snapshot(n: int = N, k: int = 0) -> BridgeSnapshot:
    """A healthy fleet of ``n`` modules and GPUs; ``k`` varies every live reading
    (temperatures, fans, the 12 V input, GPU temperatures, power, utilization, fan,
    the policy's ETA) and the frame counter, as 15 s between two scrapes do; the set
    of modules, the states, limits and other counters stay (a healthy fleet)."""
    now = time.monotonic()
    modules, gpus, pairs = [], [], []
    for i in range(n):
        w = (k + 3 * i) % 97  # this tick's wobble
        mid = f"e6614103e7{i:06x}"
        uuid = f"GPU-9c8a4f1e-3b2d-4e5f-8a7b-1c2d3e4f5a{i:02x}"
        modules.append(
            ModuleStatus(
                port=f"/dev/serial/by-id/usb-1a86_USB_Serial-if00-port{i}",
                module_id=mid,
                link_up=True,
                last_frame_at=now - 0.3,
                fw_version="0.3.1",
                proto_version="1.0",
                board="blackpill_f411",
                channels=C.CHANNELS,
                fans=2,
                telemetry={
                    "uptime_s": 273_512,
                    "state": C.STATE_HOSTED,
                    "reason": C.REASON_HOST_OK,
                    "faults": 0,
                    "temp_gpu": 72_312 + i + w * 7,
                    "temp_vram": 68_150 + w * 5,
                    "temp_mos": 55_020 + w * 3,
                    "temp_amb": 24_480 + w,
                    "fan1_rpm": 2850 + w % 13,
                    "fan2_rpm": 2790 + w % 11,
                    "fan1_duty": 32_768 + w * 16,
                    "fan2_duty": 31_000 + w * 16,
                    "v_in": 11_920 + w % 7,
                    "i_in": 20_500 + w * 3,
                    "p_in": 244_360 + w * 36,
                },
                events_total=Counter(boot=1, host_ok=3, over_temp=2, cleared=2),
                frame_errors=Counter(crc=3, noise=12),
                frames_total=1_234_567 + k * 5,
                reconnects=1,
            )
        )
        gpus.append(
            GpuSample(
                uuid=uuid,
                name="NVIDIA H200",
                pci_bus_id=f"00000000:{i + 0x18:02x}:00.0",
                timestamp=now - 0.1,
                temperature_c=71.0 + w % 5,
                memory_temperature_c=80.0 + w % 3,
                power_w=612.5 + w * 0.25,
                enforced_limit_w=700.0,
                default_limit_w=700.0,
                min_limit_w=200.0,
                max_limit_w=700.0,
                clocks_event_reasons=CLOCKS_EVENT_REASONS["sw_power_cap"],
                utilization=0.9 + w % 10 / 100,
                fan_speed_ratio=0.45 + w % 5 / 100,
                slowdown_temp_c=90.0,
                shutdown_temp_c=95.0,
                max_operating_temp_c=87.0,
            )
        )
        pairs.append(
            PairState(
                module_id=mid,
                gpu_uuid=uuid,
                level=1,
                eta_s=95.0 - w * 0.5,
                target_limit_w=650.0,
                original_limit_w=700.0,
                actions_total=Counter(lower=3, restore=2),
            )
        )
    return BridgeSnapshot(taken_at=now, modules=modules, gpus=gpus, pairs=pairs, backend="nvml")


def _percentile(sorted_ms: list[float], q: float) -> float:
    k = (len(sorted_ms) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (k - lo)


def _scrape(url: str) -> tuple[float, bytes, int]:
    """(milliseconds, body, bytes on the wire) of one scrape as Prometheus makes it: a
    connection of its own (Host from the URL), the request, the whole response read,
    the connection closed, the body decompressed."""
    u = urlsplit(url)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    try:
        conn.request("GET", u.path, headers=PROMETHEUS_HEADERS)
        r = conn.getresponse()
        wire = r.read()
        gzipped = r.getheader("Content-Encoding") == "gzip"
        assert r.status == 200, r.status
    finally:
        conn.close()
    body = gzip.decompress(wire) if gzipped else wire
    return (time.perf_counter() - t0) * 1000.0, body, len(wire)


def client(url: str) -> None:
    """The scraper process: a line ``scrape`` on stdin makes one scrape of ``url``,
    answered with a JSON line (``ms``, ``wire``, ``bytes``, and for ``scrape body``
    also ``samples`` and ``eof``, counted after the timing)."""
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] != "scrape":
            break
        ms, body, wire = _scrape(url)
        out = {"ms": ms, "wire": wire, "bytes": len(body)}
        if cmd[1:] == ["body"]:
            lines = body.splitlines()
            out["samples"] = sum(1 for ln in lines if ln and not ln.startswith(b"#"))
            out["eof"] = body.endswith(b"# EOF\n")
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


class _Scraper:
    """The scraper process, one scrape per call."""

    def __init__(self, url: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_exporter", "client", url],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, body: bool = False) -> dict:
        self.proc.stdin.write("scrape body\n" if body else "scrape\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the scraper process ended ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run() -> dict:
    snaps = [fleet_snapshot(k=k) for k in range(SCRAPES + WARMUP)]
    current = [snaps[0]]
    server = exporter.serve(lambda: current[0], port=0)
    endpoint = server.endpoint
    respond = endpoint.respond
    cpu_ms = []

    def timed(*request):  # the endpoint's own CPU: render, process metrics, gzip
        t0 = time.thread_time()
        answer = respond(*request)
        cpu_ms.append((time.thread_time() - t0) * 1000.0)
        return answer

    endpoint.respond = timed
    scrape = _Scraper(server.url)
    load = os.getloadavg()[0]
    try:
        renders = server.renderer.renders
        fresh, same = [], []
        for i, snap in enumerate(snaps):
            current[0] = snap  # the bridge's next tick
            last = scrape(body=i == len(snaps) - 1)
            if i >= WARMUP:
                fresh.append(last["ms"])
                same.append(scrape()["ms"])  # a second scraper, same version
        renders = server.renderer.renders - renders
    finally:
        scrape.close()
        server.stop()
    assert renders == len(snaps), (renders, len(snaps))  # every fresh scrape rendered
    assert last["eof"], "not OpenMetrics"
    fresh.sort()
    same.sort()
    fresh_cpu = sorted(cpu_ms[2 * WARMUP :: 2])  # each fresh scrape, then its repeat
    same_cpu = sorted(cpu_ms[2 * WARMUP + 1 :: 2])
    return {
        "scrape_ms_p50": round(statistics.median(fresh), 3),
        "scrape_ms_p99": round(_percentile(fresh, 0.99), 3),
        "scrape_ms_p99_same_snapshot": round(_percentile(same, 0.99), 3),
        "scrape_cpu_ms_p50": round(statistics.median(fresh_cpu), 3),
        "scrape_cpu_ms_p99": round(_percentile(fresh_cpu, 0.99), 3),
        "scrape_cpu_ms_p99_same_snapshot": round(_percentile(same_cpu, 0.99), 3),
        "scrape_host_load_1m": round(load, 2),
        "scrape_bytes_8_modules": last["bytes"],
        "scrape_bytes_gzip_8_modules": last["wire"],
        "scrape_samples_8_modules": last["samples"],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client(sys.argv[2])
    else:
        print(run())
