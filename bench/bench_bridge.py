"""Bridge benchmark: reaction latency, silent-module detection, CPU, scrape time.

    python -m bench.run bridge
    python -c "import bench.bench_bridge as b; print(b.run())"

Everything runs against the real firmware in MicroPython (a SimFleet at real time,
speed 1) in a child process of its own (``bench/_bridge_cpu_child.py fleet``), over
ptys, so the bridge's numbers do not include the simulator. docs/bridge-benchmarks.md
says what each number measures and what bounds it. About 2.5 minutes:

Phase A (~50 s), the bridge in this process (policy ``min_hold_s`` = 1 s):

* ``reaction_latency_ms_p50/_p99``: modules 0-2 at the firmware's default telemetry
  period (1000 ms) get repeated 12 V rail dips (1000 mV for 1.5 s: an under-voltage
  ALARM event, then WARN in the policy). Measured from the wall-clock moment the
  runner relays the firmware's ALARM ``event`` frame to the pty (stamped in the fleet
  process by wrapping the module's tx tap) to the moment the bridge calls the
  backend's ``set_power_limit_w`` with the lowered limit (wrapped here). Both stamps
  are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for both processes).
  ``..._tel100ms`` keys: the same on modules 3-5 at 10 Hz telemetry. Before each dip
  the module is frozen for a random 0.1-1.1 s, so that its clock's phase against the
  link's polls and the bridge's ticks is random (a crystal drifting), not one per
  module for the whole run.
* ``module_silent_detect_s``: module 7 hangs (its runner stops exchanging: no more
  frames, the pty stays open) and recovers, repeatedly; measured from the last frame
  the firmware wrote to the bridge tick whose policy decision is CRITICAL with reason
  ``module_silent`` (stamped by the event log it is written to). Mean over the
  trials. ``..._unplug_s``: module 6 is unplugged (the pty closes; bytes not yet read
  are lost) and replugged, measured from the unplug. ``module_silent_age_at_decision_s``:
  the policy's own ``last_frame_age_s`` in those decisions.

Phase B (~70 s), 8 modules at 10 Hz telemetry, the bridge in a child process of its
own (``_bridge_cpu_child.py bridge``: heartbeats 1 s, exporter on, loop in the main
thread as in ``modbridge run``):

* ``bridge_cpu_pct_8_modules``: the bridge process's user + system CPU time over 60 s
  of wall time, in percent of one core; one /metrics scrape every 15 s during it, as
  Prometheus would. ``bridge_cpu_pct_links/_loop/_exporter/_scrapes``: the same by
  thread (``/proc/self/task/*/schedstat``). ``bridge_threads``: its OS threads.
* ``bridge_scrape_ms_p50/_p99``: then 200 sequential GETs of /metrics (after 20 to
  warm up) from this process, with the 8 modules' telemetry flowing. Named with a
  ``bridge_`` prefix: ``scrape_ms_p50/_p99`` are bench_exporter's synthetic-snapshot
  numbers in the same results.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from bench._bridge_cpu_child import bench_config, experimental_link_factory, virtual_gpus
from protocol import catalog as C

ROOT = Path(__file__).resolve().parent.parent
N = 8
SPEED = 1.0  # real time: wall-clock latencies mean something

LAT_SLOW = (0, 1, 2)  # firmware default telemetry period
LAT_FAST = (3, 4, 5)  # 10 Hz telemetry
SILENT = (7, 6)  # hang (pause), unplug
TEL_DEFAULT_MS = 1000
TEL_FAST_MS = 100
PHASE_A_S = 48.0
MIN_HOLD_S = 1.0
DIP_MV = 1000  # 12.05 V nominal -> ~11.0 V, below the 11.4 V under-voltage threshold
DIP_MS = 1500  # longer than one 1 s telemetry period: a frame always shows it
WAIT_S = 4.0  # for a write after an alarm before a trial counts as lost

CPU_WINDOW_S = 60.0
PROM_INTERVAL_S = 15.0
SCRAPES = 200
SCRAPE_WARMUP = 20


def _percentile(sorted_vals: list[float], q: float) -> float:
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


class Child:
    """A ``_bridge_cpu_child`` process: JSON lines out, JSON commands in."""

    def __init__(self, role: str, args: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench._bridge_cpu_child", role, json.dumps(args)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: list[dict] = []
        self.cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                with self.cond:
                    self.lines.append(obj)
                    self.cond.notify_all()
        with self.cond:
            self.lines.append({"k": "eof"})
            self.cond.notify_all()

    def send(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def wait_for(self, pred, timeout: float, start: int = 0) -> dict | None:
        """The first line (from index ``start``) matching ``pred``; None on timeout."""
        end = time.monotonic() + timeout
        with self.cond:
            i = start
            while True:
                while i < len(self.lines):
                    obj = self.lines[i]
                    i += 1
                    if obj.get("k") == "eof":
                        raise RuntimeError(f"child exited (rc {self.proc.poll()})")
                    if pred(obj):
                        return obj
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def request(self, timeout: float = 10.0, **cmd) -> dict:
        """Send a fleet command and wait for its answer (kind ``answer``)."""
        with self.cond:
            start = len(self.lines)
        self.send(**cmd)
        kind = {
            "dip": "dip",
            "unplug": "unplugged",
            "replug": "replugged",
            "pause": "paused",
            "resume": "resumed",
        }[cmd["op"]]
        got = self.wait_for(lambda o: o["k"] == kind and o.get("i") == cmd.get("i"), timeout, start)
        if got is None:
            raise RuntimeError(f"fleet: no answer to {cmd}")
        return got

    def close(self, quit_cmd: bool = True) -> None:
        if quit_cmd and self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.send(op="quit")
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_fleet(telemetry_ms: list[int]) -> tuple[Child, list[str]]:
    fleet = Child("fleet", {"n": len(telemetry_ms), "speed": SPEED, "telemetry_ms": telemetry_ms})
    got = fleet.wait_for(lambda o: o["k"] == "ports", 30.0)
    if got is None:
        fleet.close()
        raise RuntimeError("the fleet did not start within 30 s")
    return fleet, got["ports"]


# ----------------------------------------------------------------------------- phase A


class Recorder:
    """What the in-process bridge did, with ``time.monotonic()`` stamps."""

    def __init__(self):
        self.cond = threading.Condition()
        self.writes: dict[str, list[tuple[float, float]]] = defaultdict(list)  # uuid ->
        self.decisions: dict[str, list[tuple[float, dict]]] = defaultdict(list)

    def wrap_backend(self, backend) -> None:
        orig = backend.set_power_limit_w

        def set_power_limit_w(uuid: str, watts: float) -> float:
            t = time.monotonic()  # the moment the bridge issues the write
            with self.cond:
                self.writes[uuid].append((t, watts))
                self.cond.notify_all()
            return orig(uuid, watts)

        backend.set_power_limit_w = set_power_limit_w

    def event_log(self):
        from modbridge.exporter.eventlog import EventLog

        rec = self

        class StampedLog(EventLog):
            def write(self, kind: str, **fields) -> bool:
                t = time.monotonic()  # in the tick that decided
                if kind == "decision":
                    with rec.cond:
                        rec.decisions[fields.get("gpu_uuid")].append((t, dict(fields)))
                        rec.cond.notify_all()
                return super().write(kind, **fields)

        return StampedLog([])

    def wait(self, pred, timeout: float):
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                got = pred()
                if got is not None:
                    return got
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)


def _latency_worker(i, fleet, rec, uuid, original_w, stop_at, out, errors, rng) -> None:
    """Repeated dips on module ``i``: alarm frame -> lowered limit written."""
    time.sleep(rng.uniform(0.0, 1.5))  # spread the modules' phases
    while time.monotonic() + DIP_MS / 1000 + WAIT_S < stop_at:
        # Freeze the module for a random 0.1-1.1 s: its firmware's clock (telemetry
        # schedule, control ticks) slips against the link's polls and the bridge's
        # ticks, as a real MCU's crystal drifts against the host's. Without it each
        # module keeps one phase for the whole run and a few modules give a few
        # phases, not the distribution.
        fleet.request(op="pause", i=i)
        time.sleep(rng.uniform(0.1, 1.1))
        fleet.request(op="resume", i=i)
        time.sleep(0.2)
        with fleet.cond:
            start = len(fleet.lines)
        fleet.request(op="dip", i=i, mv=DIP_MV, ms=DIP_MS)
        alarm = fleet.wait_for(
            lambda o: (
                o["k"] == "alarm"
                and o["i"] == i
                and o["code"] == C.REASON_UNDER_VOLTAGE
                and o["active"]
            ),
            3.0,
            start,
        )
        if alarm is None:
            errors.append(f"module {i}: no under-voltage alarm after a dip")
            continue
        t_alarm = alarm["t"]

        def lowered(t0=t_alarm):
            for t, w in rec.writes[uuid]:
                if t >= t0 and w < original_w:
                    return t
            return None

        t_write = rec.wait(lowered, WAIT_S)
        if t_write is None:
            errors.append(f"module {i}: no lowered limit within {WAIT_S:g} s of the alarm")
        else:
            out.append((t_write - t_alarm) * 1000.0)

        def restored(t0=t_write or t_alarm):
            for t, w in rec.writes[uuid]:
                if t >= t0 and w >= original_w:
                    return t
            return None

        # the dip ends, the next telemetry is clean, min_hold_s passes: restore
        if rec.wait(restored, DIP_MS / 1000 + MIN_HOLD_S + 4.0) is None:
            errors.append(f"module {i}: the limit was not restored")


def _silent_worker(i, how, fleet, bridge, port, rec, uuid, stop_at, out, errors, rng) -> None:
    """Module ``i`` goes silent (``how``: unplug, or pause = hang) and comes back,
    repeatedly: silent -> the decision CRITICAL with reason module_silent."""
    from modbridge.policy.engine import NORMAL

    link = bridge.links[port]
    back = {"unplug": "replug", "pause": "resume"}[how]
    while time.monotonic() + 7.0 < stop_at:
        t_ready = time.monotonic() + 15.0
        while not (link.link_up and bridge.pairs.get(port) and bridge.pairs[port].level == NORMAL):
            if time.monotonic() > t_ready:
                errors.append(f"module {i}: not back to NORMAL after {back}")
                return
            time.sleep(0.05)
        # a few telemetry frames in, then a random phase against the link's polls and
        # the bridge's ticks (waiting for NORMAL above synchronises with a tick)
        time.sleep(0.3 + rng.uniform(0.0, 1.0))
        got = fleet.request(op=how, i=i)
        t_op, t_last = got["t"], got["last_tx"]

        def silent(t0=t_op):
            for t, d in rec.decisions[uuid]:
                if t >= t0 and d.get("level") == "CRITICAL" and "module_silent" in d["reasons"]:
                    return t, d["values"].get("last_frame_age_s")
            return None

        got = rec.wait(silent, 10.0)
        fleet.request(op=back, i=i)
        if got is None:
            errors.append(f"module {i}: no module_silent decision within 10 s of {how}")
            continue
        t_detect, age = got
        # unplug: from the unplug (frames not yet read when the pty closed are lost);
        # pause: from the last frame the firmware wrote (the bridge reads it later)
        out.append((t_detect - (t_op if how == "unplug" else t_last), age))


def phase_a(link: str | None = None) -> dict:
    from modbridge.bridge import Bridge
    from modbridge.gpu.virtual import VirtualBackend

    tel = [TEL_DEFAULT_MS if i in LAT_SLOW else TEL_FAST_MS for i in range(N)]
    fleet, ports = start_fleet(tel)
    bridge = None
    try:
        gpus = virtual_gpus(N)
        backend = VirtualBackend(gpus)
        rec = Recorder()
        rec.wrap_backend(backend)
        cfg = bench_config(ports, gpus, exporter_enabled=False, policy={"min_hold_s": MIN_HOLD_S})
        bridge = Bridge(
            cfg,
            backend,
            ports,
            event_log=rec.event_log(),
            link_factory=experimental_link_factory(link),
        ).start()
        loop = threading.Thread(target=bridge.run, name="bridge-loop", daemon=True)
        loop.start()
        t_ready = time.monotonic() + 20.0
        while not all(lk.link_up and lk.status.telemetry_at for lk in bridge.links.values()):
            if time.monotonic() > t_ready:
                raise RuntimeError("phase A: links not up within 20 s")
            time.sleep(0.05)
        bad = [(p, lk.telemetry_ms) for p, lk in bridge.links.items()]
        if [t for _, t in bad] != tel:
            raise RuntimeError(f"phase A: telemetry periods {bad}, wanted {tel}")
        stop_at = time.monotonic() + PHASE_A_S
        slow: list[float] = []
        fast: list[float] = []
        hung: list[tuple[float, float]] = []
        unplugged: list[tuple[float, float]] = []
        errors: list[str] = []
        workers = []
        rng = random.Random(1)
        for i in LAT_SLOW + LAT_FAST:
            uuid = gpus[i].uuid
            original = bridge.limiters[uuid].original_w
            args = (i, fleet, rec, uuid, original, stop_at, slow if i in LAT_SLOW else fast)
            args += (errors, random.Random(rng.random()))
            workers.append(threading.Thread(target=_latency_worker, args=args, daemon=True))
        for i, how, out in ((SILENT[0], "pause", hung), (SILENT[1], "unplug", unplugged)):
            args = (i, how, fleet, bridge, ports[i], rec, gpus[i].uuid, stop_at, out, errors)
            args += (random.Random(rng.random()),)
            workers.append(threading.Thread(target=_silent_worker, args=args, daemon=True))
        for w in workers:
            w.start()
        for w in workers:
            w.join(PHASE_A_S + 30.0)
    finally:
        if bridge is not None:
            bridge.stop()
        fleet.close()
    if len(slow) < 20 or len(fast) < 20 or len(hung) < 3 or len(unplugged) < 3:
        raise RuntimeError(
            f"phase A: too few samples ({len(slow)} + {len(fast)} latency, {len(hung)} + "
            f"{len(unplugged)} silent); errors: {errors[:5]}"
        )
    slow.sort()
    fast.sort()
    hung_s = [a for a, _ in hung]
    unplug_s = [a for a, _ in unplugged]
    ages = [b for _, b in hung + unplugged if b is not None]
    return {
        "reaction_latency_ms_p50": round(statistics.median(slow), 1),
        "reaction_latency_ms_p99": round(_percentile(slow, 0.99), 1),
        "reaction_latency_ms_max": round(slow[-1], 1),
        "reaction_latency_samples": len(slow),
        "reaction_latency_ms_p50_tel100ms": round(statistics.median(fast), 1),
        "reaction_latency_ms_p99_tel100ms": round(_percentile(fast, 0.99), 1),
        "reaction_latency_samples_tel100ms": len(fast),
        "reaction_trials_lost": len(errors),
        "module_silent_detect_s": round(statistics.mean(hung_s), 3),
        "module_silent_detect_s_min": round(min(hung_s), 3),
        "module_silent_detect_s_max": round(max(hung_s), 3),
        "module_silent_trials": len(hung_s),
        "module_silent_detect_unplug_s": round(statistics.mean(unplug_s), 3),
        "module_silent_detect_unplug_s_min": round(min(unplug_s), 3),
        "module_silent_detect_unplug_s_max": round(max(unplug_s), 3),
        "module_silent_unplug_trials": len(unplug_s),
        "module_silent_age_at_decision_s": round(statistics.mean(ages), 3),
    }


# ----------------------------------------------------------------------------- phase B


def _scrape(url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000.0, body


def phase_b(link: str | None = None) -> dict:
    fleet, ports = start_fleet([TEL_FAST_MS] * N)
    bridge = None
    try:
        bridge = Child(
            "bridge",
            {
                "ports": ports,
                "seconds": CPU_WINDOW_S,
                "exporter": True,
                "telemetry_ms": TEL_FAST_MS,
                "link": link,
            },
        )
        ready = bridge.wait_for(lambda o: o["k"] in ("ready", "error"), 40.0)
        if ready is None or ready["k"] != "ready":
            raise RuntimeError(f"phase B: the bridge did not get ready: {ready}")
        url = ready["url"]
        # Prometheus-like: one scrape every 15 s during the CPU window
        for n in range(int(CPU_WINDOW_S // PROM_INTERVAL_S)):
            due = ready["t"] + PROM_INTERVAL_S * (n + 0.5)
            time.sleep(max(0.0, due - time.monotonic()))
            _scrape(url)
        result = bridge.wait_for(lambda o: o["k"] == "result", CPU_WINDOW_S + 30.0)
        if result is None:
            raise RuntimeError("phase B: no CPU result from the bridge")
        for _ in range(SCRAPE_WARMUP):
            _scrape(url)
        times = []
        body = b""
        for _ in range(SCRAPES):
            ms, body = _scrape(url)
            times.append(ms)
    finally:
        if bridge is not None:
            bridge.close()
        fleet.close()
    text = body.decode()
    up = [ln for ln in text.splitlines() if ln.startswith("modbridge_module_up{")]
    if len(up) != N or not all(ln.endswith(" 1.0") for ln in up):
        raise RuntimeError(f"phase B: the scrape does not show {N} modules up: {up}")
    times.sort()
    comp = result["by_component_pct"]
    return {
        "bridge_cpu_pct_8_modules": round(result["cpu_pct"], 3),
        "bridge_cpu_pct_links": round(comp.get("links", 0.0), 3),
        "bridge_cpu_pct_loop": round(comp.get("loop", 0.0), 3),
        "bridge_cpu_pct_exporter": round(comp.get("exporter", 0.0), 3),
        "bridge_cpu_pct_scrapes": round(comp.get("exited_threads", 0.0), 3),
        "bridge_threads": ready["threads"],
        "bridge_frames_per_s": round(result["frames"] / result["wall_s"], 1),
        "bridge_maxrss_mb": round(result["maxrss_kb"] / 1024.0, 1),
        "bridge_scrape_ms_p50": round(statistics.median(times), 3),
        "bridge_scrape_ms_p99": round(_percentile(times, 0.99), 3),
        "bridge_scrape_bytes_8_modules": len(body),
    }


def run() -> dict:
    quiet = logging.getLogger("modbridge")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # unplugs and policy changes log warnings: expected here
    try:
        out = phase_a()
        out.update(phase_b())
    finally:
        quiet.setLevel(level)
    return out


if __name__ == "__main__":
    print(run())
