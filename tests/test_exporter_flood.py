"""The metrics endpoint under a local user's flood (issue 23): bounded threads,
connections, time and descriptors, and the bridge still lowering a power limit.

The bridge runs as root and any local user can connect to its exporter. The issue's
exporter took a thread per connection, with no count and no timeout: idle
connections used up RLIMIT_NOFILE, and the power-limit journal's write failed with
EMFILE, so a stalled fan did not lower the limit. Here:

* the bounded server (exporter/server.py): a connection beyond the pending slots
  evicts the oldest, counted; a slowloris client is closed at its *total* deadline;
  a head too large is closed; requests beyond the workers and the queue are closed;
  accept() failing for want of descriptors pauses instead of spinning, then
  recovers; /metrics answers while a flood runs, on the same few threads;
* the descriptor budget (fdlimit.py, ServerLimits.for_fd_limit, the unit's
  LimitNOFILE=);
* the reproduction: ``modbridge run --sim`` at a 256-descriptor limit, flooded by
  the benchmark's attacker (bench/bench_flood.py: 2,000 idle and 1,000 slowloris
  connections, each reopened as soon as it is closed), then both fans stall: the
  limit is lowered to the minimum through the virtual GPU, no write fails, the module
  is never declared silent, the bridge's threads and descriptors stay bounded.

Conditions are waited for with deadlines, never fixed sleeps, except where a count
over a window of time is the point (the accept loop's wake-ups).
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import e2e_helpers
import pytest

from modbridge import fdlimit
from modbridge.exporter import prometheus as X
from modbridge.exporter.server import REJECT_REASONS, ServerLimits
from modbridge.model import BridgeSnapshot

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "packaging" / "systemd" / "modbridge.service"
LINUX = Path("/proc/self/task").is_dir()


def wait_for(pred, timeout: float, what: str, step: float = 0.01):
    """The project's wait_for (tests/e2e_helpers.py), polled finely by default: the
    server's counters move within milliseconds."""
    return e2e_helpers.wait_for(pred, timeout, what, step)


def snapshot() -> BridgeSnapshot:
    return BridgeSnapshot(taken_at=time.monotonic())


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True once the server has closed ``sock`` (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""  # data would be odd: nothing was asked
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def get(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """The whole answer to a raw request."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        out = bytearray()
        while chunk := s.recv(65536):
            out += chunk
        return bytes(out)


def rejected(server, reason: str) -> int:
    return server.stats.rejected[reason]


# ----------------------------------------------------------------- the bounded server


def test_over_the_pending_slots_the_oldest_connection_is_closed_and_counted():
    limits = ServerLimits(max_pending=4, request_timeout_s=30.0)
    with X.serve(lambda: snapshot(), port=0, process_metrics=False, limits=limits) as server:
        idle = []
        for n in range(1, 5):
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
            wait_for(lambda n=n: server.stats.pending == n, 5, f"{n} pending")
        fifth = socket.create_connection(("127.0.0.1", server.port))
        assert closed_by_peer(idle[0], 5.0)  # the oldest made room for the fifth
        assert [still_open(s) for s in idle[1:] + [fifth]] == [True] * 4
        assert rejected(server, "over_capacity") == 1
        # a scraper still gets in while idle connections hold every slot
        with urllib.request.urlopen(server.url, timeout=5) as r:
            body = r.read().decode()
        assert r.status == 200
        assert 'modbridge_exporter_connections_rejected_total{reason="over_capacity"} ' in body
        assert rejected(server, "over_capacity") == 2 and closed_by_peer(idle[1], 5.0)
        assert server.stats.open_connections() <= limits.max_connections()
        for s in idle + [fifth]:
            s.close()


def test_a_slowloris_client_is_closed_at_its_total_deadline():
    # a header byte every 0.2 s: never 1 s without a byte, still closed 1 s after
    # the accept (a per-read timeout would keep it forever)
    limits = ServerLimits(request_timeout_s=1.0)
    with X.serve(lambda: snapshot(), port=0, process_metrics=False, limits=limits) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        t0 = time.monotonic()
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        closed_at = None
        for byte in b"X-Slow: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic()
                break
            if closed_by_peer(s, 0.2):
                closed_at = time.monotonic()
                break
        assert closed_at is not None, "a slowloris client kept its slot for 20 s"
        assert 0.9 <= closed_at - t0 <= 2.5
        assert rejected(server, "timeout") == 1
        s.close()


def test_a_request_head_over_the_limit_is_closed():
    limits = ServerLimits(max_head=1024)
    with X.serve(lambda: snapshot(), port=0, process_metrics=False, limits=limits) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 2000)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_peer(s, 5.0)
        s.close()
        assert rejected(server, "too_large") == 1


def test_requests_beyond_the_workers_and_the_queue_are_closed():
    release = threading.Event()

    def source():  # a render that waits: the worker is busy until released
        release.wait(10)
        return snapshot()

    limits = ServerLimits(workers=1, max_queued=1)
    with X.serve(source, port=0, process_metrics=False, limits=limits) as server:
        socks = []
        for n in range(3):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            socks.append(s)
            if n < 2:  # the first on the worker, the second queued
                wait_for(lambda n=n: server.stats.handed == n + 1, 5, "a request handed")
        assert closed_by_peer(socks[2], 5.0)
        assert rejected(server, "busy") == 1
        release.set()
        for s in socks[:2]:
            s.settimeout(5)
            assert s.makefile("rb").read().startswith(b"HTTP/1.0 200 OK\r\n")
            s.close()
        socks[2].close()


def test_http_answers_as_before():
    with X.serve(lambda: snapshot(), port=0, process_metrics=False) as server:
        ok = get(server.port, b"GET /metrics HTTP/1.0\r\nAccept: text/plain\r\n\r\n")
        head, _, body = ok.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 OK\r\n") and b"\r\nDate: " in head
        assert int(re.search(rb"Content-Length: (\d+)", head)[1]) == len(body)
        assert b"modbridge_build_info" in body
        # the head alone for HEAD; 405 for other methods; 400 for garbage
        head_only = get(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head_only.startswith(b"HTTP/1.0 405 ") and head_only.endswith(b"\r\n\r\n")
        assert get(server.port, b"BREW /pot HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 405 ")
        assert get(server.port, b"\x16\x03\x01 hello\r\n").startswith(b"HTTP/1.0 400 ")
        many = b"GET / HTTP/1.0\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150))
        assert get(server.port, many + b"\r\n").startswith(b"HTTP/1.0 400 ")
        healthz = get(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert healthz.startswith(b"HTTP/1.0 200 OK") and b"ok: snapshot" in healthz
        for reason in REJECT_REASONS:
            assert rejected(server, reason) == 0


def _attacker(port: int, idle: int, slow: int) -> subprocess.Popen:
    """bench/bench_flood.py's attacker: ``idle`` + ``slow`` connections to ``port``,
    each reopened as soon as it is closed, until its stdin closes (fewer, in the same
    proportion, if the hard RLIMIT_NOFILE cannot hold them all)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    room = (hard if hard != resource.RLIM_INFINITY else 1 << 20) - 100
    if idle + slow > room:
        idle, slow = idle * room // (idle + slow), slow * room // (idle + slow)
    args = json.dumps({"port": port, "idle": idle, "slow": slow, "slow_every_s": 0.5})
    proc = subprocess.Popen([sys.executable, "-m", "bench.bench_flood", "attack", args],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    line = proc.stdout.readline()
    assert '"attacking"' in line, f"the attacker did not start: {line!r}"
    return proc


def _stop(proc: subprocess.Popen) -> list[dict]:
    proc.stdin.close()
    out = proc.stdout.read()
    proc.wait(10)
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


@pytest.mark.skipif(not LINUX, reason="needs Linux /proc")
def test_metrics_answer_under_a_flood_on_the_same_threads_and_descriptors():
    before = {t.ident for t in threading.enumerate()}
    fds0 = len(os.listdir("/proc/self/fd"))
    with X.serve(lambda: snapshot(), port=0) as server:
        threads = server.threads()
        assert len(threads) == 1 + server.limits.workers
        attacker = _attacker(server.port, 600, 300)
        try:
            wait_for(lambda: server.stats.rejected["over_capacity"] > 200, 20, "a flood")
            worst_fds = 0
            for _ in range(20):  # a scrape every 0.1 s for 2 s of flood
                with urllib.request.urlopen(server.url, timeout=5) as r:
                    assert r.status == 200 and b"process_open_fds" in r.read()
                worst_fds = max(worst_fds, len(os.listdir("/proc/self/fd")) - 1)
                assert server.stats.open_connections() <= server.limits.max_connections()
                time.sleep(0.1)
            assert {t.ident for t in threading.enumerate()} - before == {t.ident for t in threads}
            assert worst_fds - fds0 <= server.limits.max_fds()
        finally:
            stats = _stop(attacker)
        assert stats[-1]["k"] == "done"
        assert server.stats.rejected["over_capacity"] > 500
    wait_for(lambda: not ({t.ident for t in threading.enumerate()} - before), 5, "threads end")


CHILD = r"""
import json, os, resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from modbridge.exporter import prometheus as X
from modbridge.model import BridgeSnapshot
srv = X.serve(lambda: BridgeSnapshot(taken_at=time.monotonic()), port=0, process_metrics=False)
stat = os.open(f"/proc/self/task/{srv._thread.native_id}/schedstat", os.O_RDONLY)
hog = []
try:
    while True:
        hog.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
print(srv.port, flush=True)
sys.stdin.readline()  # the parent's clients are in the listen backlog
def runs():  # the times the kernel ran the loop thread (no descriptor to spare)
    os.lseek(stat, 0, os.SEEK_SET)
    return int(os.read(stat, 256).split()[2])
time.sleep(0.3)
r0 = runs()
time.sleep(1.0)
r1 = runs()
pauses = srv.stats.accept_pauses
for fd in hog[:16]:
    os.close(fd)
print(json.dumps({"runs": r1 - r0, "pauses": pauses}), flush=True)
sys.stdin.readline()
srv.stop()
"""


@pytest.mark.skipif(not LINUX, reason="needs Linux /proc")
def test_accept_failing_for_want_of_descriptors_pauses_then_recovers():
    # the process's table full (64 descriptors, all taken): accept() fails with
    # EMFILE; the loop pauses 0.1 s at a time (a count of its runs over 1 s, not
    # thousands), and accepts the waiting clients once descriptors are free again
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        port = int(child.stdout.readline())
        clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        for c in clients:
            c.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
        child.stdin.write("go\n")
        child.stdin.flush()
        got = json.loads(child.stdout.readline())
        assert got["pauses"] >= 5
        assert got["runs"] <= 3 * got["pauses"] + 10, got  # a spinning loop runs ~10^5
        for c in clients:
            assert c.makefile("rb").read().startswith(b"HTTP/1.0 200 OK")
            c.close()
        child.stdin.write("quit\n")
        child.stdin.flush()
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# --------------------------------------------------------------- the descriptor budget


def test_the_exporter_takes_a_small_share_of_the_descriptor_limit():
    for soft in (64, 128, 200, 256, 512, 1024, 4096, 8192, 65536):
        lim = ServerLimits.for_fd_limit(soft)
        assert lim.max_pending >= 4 and lim.max_queued >= 2 and lim.workers >= 1
        if soft >= 256:  # a quarter of what the reserve leaves, at most
            assert lim.max_fds() <= (soft - fdlimit.RESERVED_FDS) // 4
        assert lim.max_connections() <= ServerLimits().max_connections()
    assert ServerLimits.for_fd_limit(None) == ServerLimits()


RAISE = r"""
import json, resource
from modbridge import fdlimit
before, after = fdlimit.raise_nofile(cap=int(__import__("sys").argv[1]))
print(json.dumps([before, after, resource.getrlimit(resource.RLIMIT_NOFILE)[1]]))
"""


@pytest.mark.parametrize(("soft", "hard", "cap", "want"), [
    (256, 4096, 65536, 4096),  # up to the hard limit
    (256, 4096, 1000, 1000),  # up to the cap
    (256, 256, 65536, 256),  # nothing to raise
    (2048, 4096, 1024, 2048),  # never lowered
])  # fmt: skip
def test_run_raises_its_soft_descriptor_limit(soft, hard, cap, want):
    def preexec():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = subprocess.run([sys.executable, "-c", RAISE, str(cap)], cwd=REPO, preexec_fn=preexec,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(out.stdout) == [soft, want, hard]


def test_the_unit_states_a_descriptor_limit_that_covers_the_budget():
    from modbridge.ops import ctlsock

    got = re.findall(r"^LimitNOFILE=(\d+)$", UNIT.read_text(), re.M)
    assert len(got) == 1, "modbridge.service: one LimitNOFILE= (soft and hard alike)"
    limit = int(got[0])
    servers = ServerLimits.for_fd_limit(limit).max_fds() + ctlsock.MAX_CLIENTS + 5
    assert limit >= 4 * (fdlimit.RESERVED_FDS + servers)
    assert limit <= fdlimit.NOFILE_CAP  # what run would raise it to anyway


# ------------------------------------------------------------------ the reproduction

FD_LIMIT = 256
SPEED = 5.0
STALL_AT_S = 50.0  # world time: 10 s of wall time, the flood well under way by then
MIN_W = 200.0  # the default world's H200: the lowest limit


@pytest.mark.skipif(not LINUX, reason="needs Linux /proc")
def test_a_flooded_bridge_at_256_descriptors_still_lowers_the_limit(tmp_path):
    events = tmp_path / "events.jsonl"

    def preexec():  # soft and hard: the bridge cannot raise it
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    cmd = [sys.executable, "-m", "modbridge", "run", "--sim", "--sim-speed", str(SPEED),
           "--sim-profile", "idle", "--sim-fault", f"fan_stall:1@{STALL_AT_S:g}s-600s",
           "--sim-fault", f"fan_stall:2@{STALL_AT_S:g}s-600s", "--metrics-port", "0",
           "--no-control", "--status-every", "0", "--event-log", str(events),
           "--duration", "60"]  # fmt: skip
    bridge = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True, preexec_fn=preexec)  # fmt: skip
    stderr: list[str] = []
    url = threading.Event()

    def read_stderr():
        for line in bridge.stderr:
            stderr.append(line)
            if "metrics on http" in line:
                url.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    attacker = None
    peak = {"threads": 0, "fds": 0}

    def sample():
        try:
            peak["threads"] = max(peak["threads"], len(os.listdir(f"/proc/{bridge.pid}/task")))
            peak["fds"] = max(peak["fds"], len(os.listdir(f"/proc/{bridge.pid}/fd")))
        except OSError:
            pass  # exited

    def log() -> list[dict]:
        if not events.exists():
            return []
        return [json.loads(x) for x in events.read_text().splitlines() if x.strip()]

    def lowered():
        sample()
        return [e for e in log() if e["kind"] == "power_limit" and e.get("action") == "lower"
                and e.get("enforced_w") == MIN_W]  # fmt: skip

    try:
        assert url.wait(30), f"no metrics endpoint: {''.join(stderr)[-2000:]}"
        metrics = re.search(r"metrics on (http://\S+)", "".join(stderr))[1]
        port = int(re.search(r":(\d+)/metrics", metrics)[1])
        attacker = _attacker(port, 2000, 1000)
        got = wait_for(lowered, 40, "the limit lowered to the minimum under the flood", 0.1)
        assert got[0]["reason"] == "both_fans_stalled"

        # under the flood still: the GPU reads the lowered limit, the flood is counted
        def scrape():
            with urllib.request.urlopen(metrics, timeout=10) as r:
                body = r.read().decode()
            limit = re.search(r"^modbridge_gpu_power_limit_watts\{[^}]*\} (\S+)$", body, re.M)
            return body if limit and float(limit[1]) == MIN_W else None

        body = wait_for(scrape, 10, "a scrape showing the lowered limit", 0.2)
        over = re.search(r'^modbridge_exporter_connections_rejected_total\{reason="over_capacity"\}'
                         r" (\S+)$", body, re.M)  # fmt: skip
        assert over and float(over[1]) > 100
        sample()
    finally:
        if attacker is not None:
            flood = _stop(attacker)
        if bridge.poll() is None:
            bridge.send_signal(signal.SIGTERM)
        rc = bridge.wait(30)
    assert rc == 0, "".join(stderr)[-3000:]
    assert flood[-1]["k"] == "done", flood[-1]
    evs = log()
    failed = [e["message"] for e in evs if e.get("action") == "failed"]
    assert failed == [], failed  # EMFILE in the journal write was the issue
    silent = [e for e in evs if e["kind"] == "decision" and "module_silent" in e["reasons"]]
    assert silent == []
    assert [e["enforced_w"] for e in evs if e.get("action") == "restore"] == [700.0]
    assert "Too many open files" not in "".join(stderr)
    assert peak["threads"] <= 12, peak  # a thread per connection was hundreds
    assert peak["fds"] <= FD_LIMIT - fdlimit.RESERVED_FDS, peak


def test_a_slowloris_client_of_the_control_socket_is_answered_at_its_total_deadline(tmp_path):
    # the same for the control socket: READ_TIMEOUT_S for the whole request line,
    # not per recv (a byte every 0.3 s never waits 1 s, and is still cut at 1 s)
    from modbridge.ops import ctlsock

    path = tmp_path / "ctl" / "control.sock"
    server = ctlsock.ControlServer(lambda req: {"ok": True}, path, read_timeout_s=1.0).start()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(path))
        t0 = time.monotonic()
        reply = b""
        for byte in b'{"op": "ping"' + b" " * 100:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            s.settimeout(0.3)
            try:
                reply = s.recv(4096)
            except TimeoutError:
                continue
            break
        elapsed = time.monotonic() - t0
        s.close()
        assert b'"error":"timeout"' in reply, reply
        assert 0.9 <= elapsed <= 2.5, elapsed
    finally:
        server.stop()
