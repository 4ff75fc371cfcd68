"""Flood benchmark: the safety path while a local user floods the metrics endpoint.

    python -m bench.run flood          # merges the keys into bench/results.json
    python -m bench.bench_flood        # the whole run, printed
    python -m bench.bench_flood attack '{"port": 9659, "idle": 2000, "slow": 1000}'

Issue 23: the exporter took a thread and a descriptor per connection, with no count
and no timeout, so ~100 idle connections from any local user used up the bridge's
RLIMIT_NOFILE and the journal write that comes before lowering a power limit failed
with EMFILE. This benchmark runs the real bridge under that attack. For each soft
limit in :data:`FD_LIMITS` (256 and 1,024 descriptors; the hard limit the same, so the
bridge cannot raise it) there are three processes:

* the fleet (``bench._bridge_cpu_child fleet``, as in bench_bridge): :data:`N`
  virtual modules, the real firmware in MicroPython on ptys, at real time;
* the bridge (this file's ``bridge`` role), started with ``RLIMIT_NOFILE`` at the
  limit: the real :class:`~modbridge.bridge.Bridge` with a state directory (every
  lowering is journaled and fsync'd first, as in the service), its exporter on an
  ephemeral port with the limits ``modbridge run`` gives it
  (``ServerLimits.for_fd_limit``), a VirtualBackend whose ``set_power_limit_w`` is
  stamped, an event log;
* the attacker (the ``attack`` role, :class:`Flood`), its own soft limit raised to its
  hard one: :data:`IDLE` idle connections and :data:`SLOW` slowloris ones (a request
  line, then a header byte every :data:`SLOW_EVERY_S`) to the exporter, every one
  the server closes reopened at once, at most :data:`INFLIGHT` connects in flight.

Once the flood has run for :data:`FLOOD_WARMUP_S`, every module gets repeated 12 V
rail dips (an under-voltage ALARM) for :data:`TRIAL_S`, as bench_bridge's phase A:

* ``safety_path_write_ms_p99_under_flood_<L>fd`` (and ``_p50``, ``_max``): from the
  firmware tick in which the fault is known (the fleet stamps the moment the runner
  relays the ALARM to the pty) to the bridge's ``set_power_limit_w`` with the lowered
  limit (after the journal write), both ``time.monotonic()`` (CLOCK_MONOTONIC, one
  clock for all processes), over ``safety_path_write_samples_under_flood_<L>fd``
  trials. ``safety_path_write_ms_p99_under_flood``: the larger of the two p99s (the
  goal: 20 ms). ``safety_path_trials_lost_under_flood``: trials with no lowered limit
  within 3 s, both limits.
* ``exporter_threads_max_under_flood``: the most threads of the exporter
  (``modbridge-metrics*``) seen at once in the bridge (sampled at 20 Hz), both limits;
  ``bridge_threads_max_under_flood``: the bridge process's threads, its own only (the
  benchmark's stdin reader and sampler left out); ``bridge_fds_max_under_flood_<L>fd``:
  its open descriptors.
* ``flood_module_silent_decisions``: policy decisions naming ``module_silent`` (the
  issue's bridge declared its module silent): 0 is the only good value;
  ``flood_limit_write_failures``: power-limit actions ``failed`` (a journal write
  failing with EMFILE was one), both limits.
* ``flood_connections_rejected_<L>fd``: connections the exporter closed unread (over
  capacity, timed out); ``flood_attacker_connects_per_s_<L>fd``: connections the
  attacker got established a second, the load the exporter stood.
* ``safety_path_write_ms_p99_no_flood_256fd`` (and ``_p50``, ``_max``, ``_samples``,
  ``_in_bridge``): the same trials with no attacker, first: what the machine gives
  without a flood, to read the flood's numbers against. ``..._in_bridge``: from the
  moment the bridge's I/O thread hands the ALARM frame over to the write (the fleet's
  scheduling and the pty excluded). ``flood_bench_loadavg_<run>``: the host's 1-minute
  load average (2 vCPUs) after each run: every number here is wall-clock.

About 4 minutes.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import random
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench._jsonchild import JsonLinesChild

ROOT = Path(__file__).resolve().parent.parent
FD_LIMITS = (256, 1024)
N = 6  # modules (and GPUs): six trials in parallel, as bench_bridge's latency modules
IDLE = 2000
SLOW = 1000
SLOW_EVERY_S = 1.0  # a slowloris client sends one header byte this often
INFLIGHT = 256  # the attacker's connects in progress at once
FLOOD_WARMUP_S = 3.0
TRIAL_S = 60.0
MIN_SAMPLES = 500  # the run is long enough for this many at the measured rate
TEL_MS = 1000  # the firmware's default telemetry period


def emit(**obj) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def raise_own_nofile() -> int:
    """This process's soft RLIMIT_NOFILE up to its hard limit (the attacker's sockets);
    returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ----------------------------------------------------------------------------- attacker


class _Conn:
    __slots__ = ("slow", "sock", "state", "sent")

    def __init__(self, slow: bool):
        self.slow = slow
        self.sock: socket.socket | None = None
        self.state = "closed"  # closed, connecting, open
        self.sent = 0


class Flood:
    """``idle`` connections that send nothing and ``slow`` that send a request line and
    then a header byte every ``slow_every_s`` (slowloris), to ``host:port``; every one
    the server closes (or fails) is reopened at once, at most ``inflight`` connects in
    progress. One thread, one selector: :meth:`run` until ``stop`` is set or
    ``seconds`` pass. ``stats``: connects established, closed by the server, failed
    connects."""

    LINE = b"GET /metrics HTTP/1.1\r\n"
    HEAD = LINE + b"Host: modbridge\r\nUser-Agent: slowloris\r\nX-Padding: " + b"a" * 60000

    def __init__(self, port: int, idle: int, slow: int, slow_every_s: float = SLOW_EVERY_S,
                 host: str = "127.0.0.1", inflight: int = INFLIGHT):  # fmt: skip
        self.addr = (host, port)
        self.conns = [_Conn(False) for _ in range(idle)] + [_Conn(True) for _ in range(slow)]
        random.Random(0).shuffle(self.conns)
        self.slow_every_s = slow_every_s
        self.inflight_max = inflight
        self.stop = threading.Event()
        self.stats = {"connects": 0, "closed_by_server": 0, "failed": 0, "open": 0}
        self._sel = selectors.DefaultSelector()
        self._closed = collections.deque(self.conns)
        self._due: collections.deque = collections.deque()  # (when, conn) slowloris sends
        self._inflight = 0

    def _connect(self, c: _Conn) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(self.addr)
        if err not in (0, 115):  # EINPROGRESS
            s.close()
            self.stats["failed"] += 1
            self._closed.append(c)
            return
        c.sock, c.state, c.sent = s, "connecting", 0
        self._inflight += 1
        self._sel.register(s, selectors.EVENT_WRITE, c)

    def _close(self, c: _Conn, by_server: bool) -> None:
        if c.state == "connecting":
            self._inflight -= 1
        elif c.state == "open":
            self.stats["open"] -= 1
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(c.sock)
        c.sock.close()
        c.sock, c.state = None, "closed"
        if by_server:
            self.stats["closed_by_server"] += 1
        self._closed.append(c)

    def _send(self, c: _Conn, now: float) -> None:
        """The next byte of a slowloris head (the request line at once)."""
        n = len(self.LINE) if c.sent == 0 else 1
        try:
            c.sent += c.sock.send(self.HEAD[c.sent : c.sent + n])
        except OSError:
            self._close(c, True)
            return
        self._due.append((now + self.slow_every_s, c))

    def run(self, seconds: float | None = None, report=None, report_every_s: float = 1.0) -> dict:
        end = None if seconds is None else time.monotonic() + seconds
        next_report = time.monotonic() + report_every_s
        while not self.stop.is_set() and (end is None or time.monotonic() < end):
            while self._closed and self._inflight < self.inflight_max:
                self._connect(self._closed.popleft())
            now = time.monotonic()
            wait = 0.05
            if self._due:
                wait = min(wait, max(0.0, self._due[0][0] - now))
            for key, _ in self._sel.select(wait):
                c = key.data
                if c.state == "connecting":
                    if c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self.stats["failed"] += 1
                        self._close(c, False)
                        continue
                    self._inflight -= 1
                    c.state = "open"
                    self.stats["open"] += 1
                    self.stats["connects"] += 1
                    self._sel.modify(c.sock, selectors.EVENT_READ, c)
                    if c.slow:
                        self._send(c, now)
                else:
                    try:
                        data = c.sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        self._close(c, True)
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                _, c = self._due.popleft()
                if c.state == "open":
                    self._send(c, now)
            if report is not None and now >= next_report:
                next_report = now + report_every_s
                report(dict(self.stats, t=now))
        for c in self.conns:
            if c.sock is not None:
                c.sock.close()
        self._sel.close()
        return dict(self.stats)


def run_attack(args: dict) -> None:
    """The ``attack`` role: a :class:`Flood` until stdin closes (or ``seconds``),
    a stats line a second."""
    soft = raise_own_nofile()
    need = int(args.get("idle", IDLE)) + int(args.get("slow", SLOW)) + 64
    if soft < need:
        raise SystemExit(f"attack: {need} descriptors needed, RLIMIT_NOFILE allows {soft}")
    flood = Flood(int(args["port"]), int(args.get("idle", IDLE)), int(args.get("slow", SLOW)),
                  float(args.get("slow_every_s", SLOW_EVERY_S)))  # fmt: skip

    def stdin_closed():
        for line in sys.stdin:
            if line.strip() == "quit":
                break
        flood.stop.set()

    threading.Thread(target=stdin_closed, daemon=True).start()
    emit(k="attacking", soft_limit=soft)
    final = flood.run(args.get("seconds"), lambda s: emit(k="stats", **s))
    emit(k="done", **final)


# ----------------------------------------------------------------------------- bridge


def run_bridge(args: dict) -> None:
    """The ``bridge`` role: the real Bridge (state directory, exporter, event log) on
    the fleet's ports with a stamped VirtualBackend; prints ``ready`` (the exporter's
    port), a ``write`` line per ``set_power_limit_w``, a ``silent`` line per decision
    naming module_silent, a ``failed`` line per power-limit action failed; ``summary``
    (threads, descriptors, the exporter's counters) after ``quit`` on stdin."""
    import tempfile

    from bench._bridge_cpu_child import bench_config, virtual_gpus
    from modbridge import fdlimit
    from modbridge.bridge import Bridge
    from modbridge.exporter import prometheus as exporter
    from modbridge.exporter.eventlog import EventLog
    from modbridge.gpu.virtual import VirtualBackend

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    fdlimit.raise_nofile()  # as `modbridge run`: the hard limit is the benchmark's
    ports = args["ports"]
    gpus = virtual_gpus(len(ports))
    backend = VirtualBackend(gpus)
    orig = backend.set_power_limit_w

    def set_power_limit_w(uuid: str, watts: float) -> float:
        emit(k="write", t=time.monotonic(), uuid=uuid, w=watts)
        return orig(uuid, watts)

    backend.set_power_limit_w = set_power_limit_w

    class Log(EventLog):
        def write(self, kind: str, **fields) -> bool:
            if kind == "decision":  # for the lost trials' report
                emit(k="decision", t=time.monotonic(), uuid=fields.get("gpu_uuid"),
                     level=fields.get("level"), reasons=fields.get("reasons"))  # fmt: skip
            if kind == "decision" and "module_silent" in (fields.get("reasons") or ()):
                emit(k="silent", uuid=fields.get("gpu_uuid"))
            if kind == "power_limit" and fields.get("action") == "failed":
                emit(k="failed", message=str(fields.get("message")))
            return super().write(kind, **fields)

    cfg = bench_config(ports, gpus, exporter_enabled=True, keys_dir=args["keys_dir"],
                       policy={"min_hold_s": float(args["min_hold_s"])})  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="modbridge-flood-") as state:
        elog = Log(os.path.join(state, "events.jsonl"))
        bridge = Bridge(cfg, backend, ports, event_log=elog, state_dir=os.path.join(state, "s"))
        on_event = bridge._on_event  # given to the links by start(): wrapped before it
        index = {port: i for i, port in enumerate(ports)}

        def stamped(status, msg):
            emit(k="event", t=time.monotonic(), i=index.get(status.port))
            return on_event(status, msg)

        bridge._on_event = stamped
        bridge.start()
        server = exporter.serve(bridge.snapshot, port=0)
        peak = {"threads": 0, "exporter_threads": 0, "fds": 0}
        done = threading.Event()

        def sample():
            while not done.wait(0.05):
                names = [t.name for t in threading.enumerate()]
                own = [n for n in names if not n.startswith("bench-")]
                peak["threads"] = max(peak["threads"], len(own))
                peak["exporter_threads"] = max(
                    peak["exporter_threads"], sum(n.startswith("modbridge-metrics") for n in own)
                )
                with contextlib.suppress(OSError):
                    peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")) - 1)

        def commands():
            for line in sys.stdin:
                if line.strip() == "quit":
                    break
            bridge.request_stop()

        def linked():
            end = time.monotonic() + 30.0
            while time.monotonic() < end and not done.is_set():
                if all(lk.link_up and lk.status.telemetry_at for lk in bridge.links.values()):
                    emit(k="linked")
                    return
                time.sleep(0.05)

        threading.Thread(target=sample, name="bench-sampler", daemon=True).start()
        threading.Thread(target=commands, name="bench-stdin", daemon=True).start()
        threading.Thread(target=linked, name="bench-linked", daemon=True).start()
        emit(k="ready", port=server.port, soft_limit=fdlimit.nofile()[0],
             max_connections=server.limits.max_connections(),
             uuids=[g.uuid for g in gpus])  # fmt: skip
        try:
            bridge.run()
        finally:
            done.set()
            stats = server.stats
            server.stop()
            bridge.stop("benchmark over")
            elog.close()
        emit(k="summary", **peak, rejected=sum(stats.rejected.values()),
             accepted=stats.accepted, accept_pauses=stats.accept_pauses)  # fmt: skip


# ----------------------------------------------------------------------------- driver


class Proc(JsonLinesChild):
    """A child process of this benchmark: JSON lines out (kept, waited for), commands in."""

    def __init__(self, argv: list[str], preexec=None):
        super().__init__(argv, f"{argv[2:4]}:", preexec)

    def quit(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _limit(n: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return preexec


def _percentile(sorted_vals: list[float], q: float) -> float:
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def _trials(i: int, fleet, bridge: Proc, uuid: str, original_w: float, stop_at: float,
            out: list, lost: list, rng: random.Random) -> None:  # fmt: skip
    """Repeated dips on module ``i``: the firmware tick that knows the fault -> the
    lowered limit written by the bridge (ms into ``out``)."""
    from bench.bench_bridge import DIP_MS, DIP_MV, MIN_HOLD_S, WAIT_S
    from protocol import catalog as C

    time.sleep(rng.uniform(0.0, 1.0))
    while time.monotonic() + DIP_MS / 1000 + WAIT_S < stop_at:
        time.sleep(rng.uniform(0.05, 0.3))
        with fleet.cond:
            f0 = len(fleet.lines)
        with bridge.cond:
            b0 = len(bridge.lines)
        fleet.request(op="dip", i=i, mv=DIP_MV, ms=DIP_MS)
        alarm = fleet.wait_for(
            lambda o: o.get("i") == i and (
                (o["k"] == "alarm" and o["code"] == C.REASON_UNDER_VOLTAGE and o["active"])
                or (o["k"] == "fault" and o["bit"] == "under_voltage")
            ),
            3.0,
            f0,
        )  # fmt: skip
        if alarm is None:
            lost.append(f"module {i}: no under-voltage alarm after a dip")
            continue
        t0 = alarm["t"]
        write = bridge.wait_for(
            lambda o, t0=t0: o["k"] == "write" and o["uuid"] == uuid and o["t"] >= t0
            and o["w"] < original_w,
            WAIT_S,
            b0,
        )  # fmt: skip
        if write is None:
            late = bridge.wait_for(
                lambda o, t0=t0: o["k"] == "write" and o["uuid"] == uuid and o["t"] >= t0
                and o["w"] < original_w,
                5.0,
                b0,
            )  # fmt: skip
            after = "none within 8 s" if late is None else f"{late['t'] - t0:.2f} s after it"
            with bridge.cond:
                mine = [(round(o["t"] - t0, 3), o["k"], o.get("level") or o.get("w"),
                         o.get("reasons")) for o in bridge.lines
                        if o.get("uuid") == uuid and o["k"] in ("decision", "write")]  # fmt: skip
            seen = [x for x in mine if x[0] < 0][-2:] + [x for x in mine if x[0] >= 0][:6]
            lost.append(f"module {i}: no lowered limit within {WAIT_S:g} s of the alarm "
                        f"(a lowered write: {after}; the bridge's decisions and writes for "
                        f"its GPU around the dip, s from the alarm: {seen})")  # fmt: skip
            time.sleep(DIP_MS / 1000 + MIN_HOLD_S + 1.0)
            continue
        arrived = bridge.wait_for(
            lambda o, t0=t0, t1=write["t"]: o["k"] == "event" and o["i"] == i
            and t0 <= o["t"] <= t1,
            0.0,
            b0,
        )  # fmt: skip
        inside = None if arrived is None else (write["t"] - arrived["t"]) * 1000.0
        out.append(((write["t"] - t0) * 1000.0, inside))
        restored = bridge.wait_for(
            lambda o, t1=write["t"]: o["k"] == "write" and o["uuid"] == uuid and o["t"] > t1
            and o["w"] >= original_w,
            DIP_MS / 1000 + MIN_HOLD_S + 4.0,
            b0,
        )  # fmt: skip
        if restored is None:
            lost.append(f"module {i}: the limit was not restored")


def one_limit(fd_limit: int, trial_s: float = TRIAL_S, idle: int = IDLE, slow: int = SLOW,
              flood: bool = True) -> dict:  # fmt: skip
    """The fleet, the bridge at ``fd_limit`` descriptors and (``flood``) the attacker;
    the trials. Keys suffixed ``_under_flood_<fd_limit>fd`` (``_no_flood_...``: no
    attacker), and ``_``-prefixed counts the caller adds up."""
    from bench.bench_bridge import MIN_HOLD_S, start_fleet

    fleet, ports, keys_dir = start_fleet([TEL_MS] * N)
    bridge = attacker = None
    try:
        args = {"ports": ports, "keys_dir": keys_dir, "min_hold_s": MIN_HOLD_S}
        bridge = Proc([sys.executable, "-m", "bench.bench_flood", "bridge", json.dumps(args)],
                      preexec=_limit(fd_limit))  # fmt: skip
        ready = bridge.wait_for(lambda o: o["k"] == "ready", 30.0)
        if ready is None:
            raise RuntimeError("the bridge did not start within 30 s")
        if ready["soft_limit"] != fd_limit:
            raise RuntimeError(f"the bridge runs at {ready['soft_limit']} fds, not {fd_limit}")
        uuids = ready["uuids"]
        if bridge.wait_for(lambda o: o["k"] == "linked", 30.0) is None:
            raise RuntimeError("the bridge's links were not up within 30 s")
        a0 = a1 = None
        if flood:
            att = {"port": ready["port"], "idle": idle, "slow": slow}
            attacker = Proc([sys.executable, "-m", "bench.bench_flood", "attack",
                             json.dumps(att)])  # fmt: skip
            if attacker.wait_for(lambda o: o["k"] == "attacking", 10.0) is None:
                raise RuntimeError("the attacker did not start")
            time.sleep(FLOOD_WARMUP_S)
            with attacker.cond:
                a0 = next((o for o in reversed(attacker.lines) if o["k"] == "stats"), None)
        t_start = time.monotonic()
        stop_at = t_start + trial_s
        samples: list[float] = []
        lost: list[str] = []
        rng = random.Random(fd_limit)
        original_w = 700.0  # the virtual GPUs' default limit (World's H200)
        workers = [
            threading.Thread(target=_trials, name=f"trials-{i}",
                             args=(i, fleet, bridge, uuids[i], original_w, stop_at, samples,
                                   lost, random.Random(rng.random())), daemon=True)
            for i in range(N)
        ]  # fmt: skip
        for w in workers:
            w.start()
        for w in workers:
            w.join(trial_s + 30.0)
        if attacker is not None:
            with attacker.cond:
                a1 = next((o for o in reversed(attacker.lines) if o["k"] == "stats"), None)
            attacker.quit()
        bridge.quit()
        summary = bridge.wait_for(lambda o: o["k"] == "summary", 1.0) or {}
    finally:
        for p in (attacker, bridge):
            if p is not None:
                p.quit()
        fleet.close()
    for why in lost[:10]:
        print(f"bench_flood ({fd_limit} fds): {why}", file=sys.stderr)
    if not samples:
        raise RuntimeError(f"{fd_limit} fds: no trial measured; lost: {lost[:5]}")
    if len(samples) < MIN_SAMPLES:
        print(f"bench_flood ({fd_limit} fds): {len(samples)} samples, fewer than "
              f"{MIN_SAMPLES}", file=sys.stderr)  # fmt: skip
    with bridge.cond:
        silent = sum(1 for o in bridge.lines if o["k"] == "silent")
        failed = [o["message"] for o in bridge.lines if o["k"] == "failed"]
    for why in failed[:5]:
        print(f"bench_flood ({fd_limit} fds): a limit write failed: {why}", file=sys.stderr)
    ms = sorted(m for m, _ in samples)
    inside = sorted(x for _, x in samples if x is not None)
    sfx = f"_{'under' if flood else 'no'}_flood_{fd_limit}fd"
    out = {
        f"safety_path_write_ms_p99{sfx}": round(_percentile(ms, 0.99), 2),
        f"safety_path_write_ms_p50{sfx}": round(statistics.median(ms), 2),
        f"safety_path_write_ms_max{sfx}": round(ms[-1], 2),
        f"safety_path_write_samples{sfx}": len(ms),
        f"safety_path_write_ms_p99_in_bridge{sfx}": (
            round(_percentile(inside, 0.99), 2) if inside else -1
        ),
        f"flood_bench_loadavg{sfx}": round(os.getloadavg()[0], 2),
    }
    if flood:
        connects = 0.0
        if a0 and a1 and a1["t"] > a0["t"]:
            connects = (a1["connects"] - a0["connects"]) / (a1["t"] - a0["t"])
        out[f"bridge_fds_max_under_flood_{fd_limit}fd"] = summary.get("fds", -1)
        out[f"flood_connections_rejected_{fd_limit}fd"] = summary.get("rejected", -1)
        out[f"flood_attacker_connects_per_s_{fd_limit}fd"] = round(connects, 1)
    return out | {
        "_lost": len(lost),
        "_silent": silent,
        "_failed": len(failed),
        "_threads": summary.get("threads", -1),
        "_exporter_threads": summary.get("exporter_threads", -1),
    }


def run(trial_s: float = TRIAL_S) -> dict:
    out: dict = {}
    lost = silent = failed = 0
    threads = exporter_threads = 0
    raise_own_nofile()  # the attacker inherits it; its own code raises it too
    runs = [(FD_LIMITS[0], False)] + [(n, True) for n in FD_LIMITS]  # the baseline first
    for fd_limit, flood in runs:
        got = one_limit(fd_limit, trial_s, flood=flood)
        if not flood:  # the baseline: its latency keys only
            out.update({k: v for k, v in got.items() if not k.startswith("_")})
            continue
        lost += got.pop("_lost")
        silent += got.pop("_silent")
        failed += got.pop("_failed")
        threads = max(threads, got.pop("_threads"))
        exporter_threads = max(exporter_threads, got.pop("_exporter_threads"))
        out.update(got)
    out["safety_path_write_ms_p99_under_flood"] = max(
        out[f"safety_path_write_ms_p99_under_flood_{n}fd"] for n in FD_LIMITS
    )
    out["safety_path_trials_lost_under_flood"] = lost
    out["exporter_threads_max_under_flood"] = exporter_threads
    out["bridge_threads_max_under_flood"] = threads
    out["flood_module_silent_decisions"] = silent
    out["flood_limit_write_failures"] = failed
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["attack"]:
        run_attack(json.loads(argv[1]) if len(argv) > 1 else {})
    elif argv[:1] == ["bridge"]:
        run_bridge(json.loads(argv[1]))
    else:
        print(json.dumps(run(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
