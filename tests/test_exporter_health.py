"""The exporter's /healthz (liveness) and /readyz (readiness): what Kubernetes' probes
read (packaging/kubernetes/, docs/metrics.md "Health endpoints").

/healthz is 200 while the bridge loop's newest snapshot is younger than the bound and
503 with the reason after; /readyz is 200 once a snapshot exists and never looks at
module health (a module in trouble stays scraped, so its alerts fire). Every other
path is still /metrics."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.exporter.endpoint import LIVE_MAX_AGE_S, Endpoint
from modbridge.exporter.server import serve
from modbridge.model import BridgeSnapshot, ModuleStatus

NOW = 1000.0


def _endpoint(snap, now=NOW, **kw) -> Endpoint:
    return Endpoint(lambda: snap, process_metrics=False, clock=lambda: now, **kw)


def _sick_module() -> ModuleStatus:
    # link down, FAILSAFE with a fan stall: everything a module can do wrong at once
    m = ModuleStatus(port="/dev/ttyUSB0")
    m.link_up = False
    return m


def test_healthz_ok_while_the_snapshot_is_young():
    ep = _endpoint(BridgeSnapshot(taken_at=NOW - 0.5))
    status, headers, body = ep.respond("GET", "/healthz", "", None, None)
    assert status == 200
    assert dict(headers)["Content-Type"].startswith("text/plain")
    assert body.startswith(b"ok: snapshot 0.5 s old")


def test_healthz_fails_with_the_reason_once_the_loop_stops():
    ep = _endpoint(BridgeSnapshot(taken_at=NOW - LIVE_MAX_AGE_S - 0.1))
    status, _, body = ep.respond("GET", "/healthz", "", None, None)
    assert status == 503
    assert b"30.1 s old" in body and b"limit 30 s" in body and b"not ticking" in body


def test_no_snapshot_yet_is_neither_live_nor_ready():
    ep = _endpoint(None)
    assert ep.respond("GET", "/healthz", "", None, None)[:1] == (503,)
    status, _, body = ep.respond("GET", "/readyz", "", None, None)
    assert status == 503 and b"no snapshot yet" in body


def test_readyz_ignores_module_health_and_snapshot_age():
    # a sick module and a stale loop: liveness says so, readiness does not (the pod
    # stays behind the Service: the alerts on these metrics must be able to fire)
    snap = BridgeSnapshot(taken_at=NOW - 3600, modules=[_sick_module()])
    ep = _endpoint(snap)
    assert ep.respond("GET", "/readyz", "", None, None) == (
        200,
        [("Content-Type", "text/plain; charset=utf-8")],
        b"ready\n",
    )
    assert ep.respond("GET", "/healthz", "", None, None)[0] == 503
    assert ep.respond("GET", "/metrics", "", None, None)[0] == 200


@settings(max_examples=200, deadline=None)
@given(
    age=st.floats(-5.0, 1e6, allow_nan=False),
    bound=st.floats(0.1, 1e4, allow_nan=False),
)
def test_healthz_is_200_exactly_when_the_age_is_within_the_bound(age, bound):
    ep = _endpoint(BridgeSnapshot(taken_at=NOW - age), live_max_age_s=bound)
    status, _, body = ep.respond("GET", "/healthz", "", None, None)
    assert status == (200 if NOW - (NOW - age) <= bound else 503)
    assert body.endswith(b"\n") and body.isascii()


@settings(max_examples=200, deadline=None)
@given(
    path=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=40).map(
        lambda s: "/" + s
    )
)
def test_any_other_path_is_still_metrics(path):
    ep = _endpoint(BridgeSnapshot(taken_at=NOW - 0.5))
    status, headers, body = ep.respond("GET", path, "", None, None)
    if path in ("/healthz", "/readyz", "/favicon.ico"):
        return
    assert status == 200
    assert dict(headers)["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"modbridge_scrape_snapshot_age_seconds" in body


def test_probes_answer_only_get_like_metrics():
    ep = _endpoint(BridgeSnapshot(taken_at=NOW))
    assert ep.respond("POST", "/healthz", "", None, None)[0] == 405
    assert ep.respond("OPTIONS", "/readyz", "", None, None)[0] == 200
    # near misses are /metrics (the old behaviour), not a probe
    for near in ("/healthz/", "/Healthz", "/readyz.html", "/healthz?x"):
        assert b"modbridge_" in ep.respond("GET", near, "", None, None)[2]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_over_http_on_loopback():
    snap = [None]
    server = serve(lambda: snap[0], "127.0.0.1", 0, process_metrics=False)
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert _get(base + "/readyz")[0] == 503
        snap[0] = BridgeSnapshot(taken_at=time.monotonic())
        assert _get(base + "/readyz") == (200, b"ready\n")
        status, body = _get(base + "/healthz?verbose=1")  # a query does not matter
        assert status == 200 and body.startswith(b"ok:")
        snap[0] = BridgeSnapshot(taken_at=time.monotonic() - 2 * LIVE_MAX_AGE_S)
        status, body = _get(base + "/healthz")
        assert status == 503 and b"not live" in body
        assert _get(base + "/metrics")[0] == 200
    finally:
        server.stop()


def test_a_running_sim_bridge_is_live_and_ready(tmp_path: Path):
    """``modbridge run --sim``: the probes the DaemonSet uses answer 200 (the real
    loop, the real server); after SIGTERM the process ends within the grace period."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "modbridge", "run", "--sim", "--metrics-port", "0",
         "--no-control", "--state-dir", str(tmp_path), "--status-every", "0"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            m = re.search(r"metrics on (http://\S+)/metrics", line)
            url = m.group(1) if m else None
        assert url, "the bridge did not print its metrics URL within 30 s"
        assert _get(url + "/readyz") == (200, b"ready\n")
        status, body = _get(url + "/healthz")
        assert status == 200 and body.startswith(b"ok: snapshot")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
            pytest.fail("modbridge run did not stop within 20 s of SIGTERM")
        proc.stderr.close()
    assert proc.returncode == 0
