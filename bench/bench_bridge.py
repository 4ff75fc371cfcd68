"""Bridge benchmark: reaction latency, silence and unplug detection, CPU, scrape time.

    python -m bench.run bridge                 # merges the keys into bench/results.json
    python -m bench.bench_bridge --doc         # docs/bridge-benchmarks.md's table from it
    python -m bench.bench_bridge --cpu [--profile PATH]   # phase B only, printed

Everything runs against the real firmware in MicroPython (a SimFleet at real time,
speed 1) in a child process of its own (``bench/_bridge_cpu_child.py fleet``), over
ptys, so the bridge's numbers do not include the simulator. docs/bridge-benchmarks.md
says what each number measures and what bounds it. About 4.5 minutes:

Phase A (~100 s), the bridge in this process (policy ``min_hold_s`` = 0.2 s, so a
trial is back to NORMAL quickly), modules 0-2 at the firmware's default telemetry
(1 Hz), 3-5 at 10 Hz, 6 and 7 for silence:

* ``reaction_latency_ms_p50/_p99/_max`` over ``reaction_latency_samples`` (>= 500)
  trials on modules 0-5: repeated 12 V rail dips (1000 mV for 0.4 s: an
  under-voltage ALARM). From the firmware tick in which the fault is known (the
  fleet process stamps the moment the runner relays that tick's bytes, the ALARM
  event and the telemetry frame it triggers, to the pty) to the moment the bridge
  calls the backend's ``set_power_limit_w`` with the lowered limit (wrapped here).
  Both stamps are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for both
  processes). ``..._tel1000ms`` / ``..._tel100ms``: the same per telemetry rate.
  ``..._wire``: plus the time those bytes take on a 115200-baud UART (10 bits a
  byte), which a pty does not have. ``..._in_bridge``: from the moment the bridge's
  I/O thread hands the event frame over (the pty's delivery excluded) to the write.
  ``reaction_trials_lost``: reaction trials with
  no lowered limit within 3 s (silence trials are not counted).
* ``module_silent_detect_s``: module 7 (1 Hz telemetry) hangs (its runner stops
  exchanging: no more frames, the pty stays open) and recovers, repeatedly; from the
  last frame the firmware wrote to the policy decision CRITICAL with reason
  ``module_silent`` (stamped by the event log it is written to). Mean over the
  trials. ``module_unplug_detect_s``: module 6 is unplugged (the pty closes) and
  replugged, measured from the unplug. ``module_silent_age_at_decision_s``: the
  policy's own ``last_frame_age_s`` in the hang decisions.

Phase B (~170 s), 8 modules, the bridge in a child process of its own
(``_bridge_cpu_child.py bridge``: heartbeats 1 s, exporter on, loop in the main thread
as in ``modbridge run``), measured in steady state: from ``STEADY_S`` (65 s) after the
bridge started, when the policy's windowed rules (the early warning's slope, the
cross-check, 60 s windows) work over a full history:

* ``bridge_cpu_pct_8_modules``: the bridge process's user + system CPU time over 60 s
  of wall time at the firmware's default telemetry (1 Hz), in percent of one core,
  with four /metrics scrapes in it (Prometheus at 15 s; one scrape before the windows:
  a running bridge has been scraped before). ``bridge_cpu_pct_links/_loop/
  _exporter/_scrapes``: the same by thread (``/proc/self/task/*/schedstat``).
  ``..._10hz``: the same with every module at 10 Hz telemetry, over 30 s.
  ``bridge_io_wakeups_per_s``: wake-ups of the one I/O thread. ``bridge_threads``: the
  process's OS threads.
* ``bridge_scrape_ms_p50/_p99``: then 200 sequential GETs of /metrics (after 20 to
  warm up) from this process, with the 8 modules' telemetry flowing. Named with a
  ``bridge_`` prefix: ``scrape_ms_p50/_p99`` are bench_exporter's synthetic-snapshot
  numbers in the same results.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from bench._bridge_cpu_child import bench_config, virtual_gpus
from bench._jsonchild import JsonLinesChild
from modbridge.policy.config import PolicyConfig
from protocol import catalog as C

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "bridge-benchmarks.md"
N = 8
SPEED = 1.0  # real time: wall-clock latencies mean something

LAT_SLOW = (0, 1, 2)  # firmware default telemetry period
LAT_FAST = (3, 4, 5)  # 10 Hz telemetry
HANG, UNPLUG = 7, 6  # silence trials, at the default telemetry period
TEL_DEFAULT_MS = 1000
TEL_FAST_MS = 100
PHASE_A_S = 100.0
MIN_HOLD_S = 0.2
DIP_MV = 1000  # 12.05 V nominal -> ~11.0 V, below the 11.4 V under-voltage threshold
DIP_MS = 400
WAIT_S = 3.0  # for a write after an alarm before a trial counts as lost
MIN_TRIALS = 500
BAUD_BITS_PER_S = 115200
BITS_PER_BYTE = 10  # 8N1: start + 8 data + stop

#: the default-rate window: 60 s, four scrapes (a 30 s one read 0.45 to 0.50 % for the
#: same code on this shared machine; the 10 Hz one is ten times the work and as steady)
CPU_WINDOW_S = 60.0
CPU_WINDOW_FAST_S = 30.0
#: the CPU windows start once the bridge has run this long: the policy's windowed
#: rules (early warning slope, cross-check) have a full history, as in a bridge that
#: has run for a while (their windows are 60 s by default)
STEADY_S = max(PolicyConfig().early_warning_window_s, PolicyConfig().disagree_window_s) + 5.0
PROM_INTERVAL_S = 15.0
SCRAPES = 200
SCRAPE_WARMUP = 20

#: keys an earlier version of this benchmark wrote that measure nothing now
STALE_KEYS = (
    "module_silent_detect_unplug_s", "module_silent_detect_unplug_s_min",
    "module_silent_detect_unplug_s_max", "module_silent_unplug_trials",
    "reaction_latency_ms_p50_tel100ms", "bench_wall_s_bridge_old",
)  # fmt: skip


def wire_ms(nbytes: int) -> float:
    """Time ``nbytes`` take on a 115200-baud 8N1 UART, ms.

    >>> round(wire_ms(115), 3)
    9.983
    """
    return nbytes * BITS_PER_BYTE * 1000.0 / BAUD_BITS_PER_S


def _percentile(sorted_vals: list[float], q: float) -> float:
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


class Child(JsonLinesChild):
    """A ``_bridge_cpu_child`` process: JSON lines out, JSON commands in."""

    def __init__(self, role: str, args: dict):
        super().__init__([sys.executable, "-m", "bench._bridge_cpu_child", role,
                          json.dumps(args)])  # fmt: skip

    def send(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

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


def start_fleet(telemetry_ms: list[int]) -> tuple[Child, list[str], str]:
    """The fleet child: (it, its ports, the directory of its modules' keys)."""
    fleet = Child("fleet", {"n": len(telemetry_ms), "speed": SPEED, "telemetry_ms": telemetry_ms})
    got = fleet.wait_for(lambda o: o["k"] == "ports", 30.0)
    if got is None:
        fleet.close()
        raise RuntimeError("the fleet did not start within 30 s")
    return fleet, got["ports"], got["keys_dir"]


# ----------------------------------------------------------------------------- phase A


class Recorder:
    """What the in-process bridge did, with ``time.monotonic()`` stamps."""

    def __init__(self):
        self.cond = threading.Condition()
        self.writes: dict[str, list[tuple[float, float]]] = defaultdict(list)  # uuid ->
        self.decisions: dict[str, list[tuple[float, dict]]] = defaultdict(list)
        self.arrivals: dict[str, list[float]] = defaultdict(list)  # port -> event frames

    def wrap_events(self, bridge) -> None:
        """Stamp every event frame as the bridge's I/O thread hands it over (before
        ``start``: the links are given ``bridge._on_event``)."""
        orig = bridge._on_event

        def on_event(status, msg):
            with self.cond:
                self.arrivals[status.port].append(time.monotonic())
            return orig(status, msg)

        bridge._on_event = on_event

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


def _latency_worker(i, fleet, rec, bridge, port, uuid, original_w, stop_at, out, lost,
                    rng) -> None:  # fmt: skip
    """Repeated dips on module ``i``: the firmware tick that knows the fault -> the
    lowered limit written. ``out`` gets (latency ms, bytes of that tick, ms from the
    event frame's arrival in the bridge to the write)."""
    time.sleep(rng.uniform(0.0, 1.0))  # spread the modules' phases
    while time.monotonic() + DIP_MS / 1000 + WAIT_S < stop_at:
        # a random pause: the dip lands anywhere in the firmware's tick and telemetry
        # schedule, and the modules' trials do not fall into step
        time.sleep(rng.uniform(0.05, 0.3))
        with fleet.cond:
            start = len(fleet.lines)
        fleet.request(op="dip", i=i, mv=DIP_MV, ms=DIP_MS)
        # the firmware tick in which the fault is known: its ALARM event, or the first
        # telemetry frame with the fault bit, whichever it sent first
        alarm = fleet.wait_for(
            lambda o: o.get("i") == i and (
                (o["k"] == "alarm" and o["code"] == C.REASON_UNDER_VOLTAGE and o["active"])
                or (o["k"] == "fault" and o["bit"] == "under_voltage")
            ),
            3.0,
            start,
        )  # fmt: skip
        if alarm is None:
            lost.append(f"module {i}: no under-voltage alarm or fault bit after a dip")
            continue
        t_alarm = alarm["t"]

        def lowered(t0=t_alarm):
            for t, w in rec.writes[uuid]:
                if t >= t0 and w < original_w:
                    return t
            return None

        t_write = rec.wait(lowered, WAIT_S)
        if t_write is None:
            pair = bridge.pairs.get(port)
            st = bridge.links[port].status
            lost.append(
                f"module {i}: no lowered limit within {WAIT_S:g} s of the alarm (pair "
                f"{pair.level if pair else None} {pair.reasons if pair else None}, faults "
                f"{st.fault_names()}, writes {rec.writes[uuid][-2:]})"
            )
            time.sleep(DIP_MS / 1000 + MIN_HOLD_S + 1.0)  # let the trial end: next one
            continue
        arrived = [t for t in rec.arrivals[port] if t_alarm <= t <= t_write]
        inside = (t_write - arrived[0]) * 1000.0 if arrived else None
        out.append(((t_write - t_alarm) * 1000.0, alarm.get("nbytes", 0), inside))

        def restored(t0=t_write):
            for t, w in rec.writes[uuid]:
                if t >= t0 and w >= original_w:
                    return t
            return None

        # the dip ends, the next telemetry is clean, min_hold_s passes: restore
        if rec.wait(restored, DIP_MS / 1000 + MIN_HOLD_S + 4.0) is None:
            lost.append(f"module {i}: the limit was not restored")


def _silent_worker(i, how, fleet, bridge, port, rec, uuid, stop_at, out, errors, rng) -> None:
    """Module ``i`` goes silent (``how``: unplug, or pause = hang) and comes back,
    repeatedly: silent -> the decision CRITICAL with reason module_silent."""
    from modbridge.policy.engine import NORMAL

    link = bridge.links[port]
    back = {"unplug": "replug", "pause": "resume"}[how]
    while time.monotonic() + 6.0 < stop_at:
        t_ready = time.monotonic() + 15.0
        while not (link.link_up and bridge.pairs.get(port) and bridge.pairs[port].level == NORMAL):
            if time.monotonic() > t_ready:
                errors.append(f"module {i}: not back to NORMAL after {back}")
                return
            time.sleep(0.05)
        # a few telemetry frames in, then a random phase against the telemetry
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


def _latency_keys(samples: list[tuple], suffix: str = "") -> dict:
    ms = sorted(m for m, _, _ in samples)
    return {
        f"reaction_latency_ms_p50{suffix}": round(statistics.median(ms), 1),
        f"reaction_latency_ms_p99{suffix}": round(_percentile(ms, 0.99), 1),
        f"reaction_latency_samples{suffix}": len(ms),
    }


def phase_a() -> dict:
    from modbridge.bridge import Bridge
    from modbridge.gpu.virtual import VirtualBackend

    tel = [TEL_FAST_MS if i in LAT_FAST else TEL_DEFAULT_MS for i in range(N)]
    fleet, ports, keys_dir = start_fleet(tel)
    bridge = None
    try:
        gpus = virtual_gpus(N)
        backend = VirtualBackend(gpus)
        rec = Recorder()
        rec.wrap_backend(backend)
        cfg = bench_config(ports, gpus, exporter_enabled=False, keys_dir=keys_dir,
                           policy={"min_hold_s": MIN_HOLD_S})  # fmt: skip
        bridge = Bridge(cfg, backend, ports, event_log=rec.event_log())
        rec.wrap_events(bridge)
        bridge.start()
        loop = threading.Thread(target=bridge.run, name="bridge-loop", daemon=True)
        loop.start()
        t_ready = time.monotonic() + 20.0
        while not all(lk.link_up and lk.status.telemetry_at for lk in bridge.links.values()):
            if time.monotonic() > t_ready:
                raise RuntimeError("phase A: links not up within 20 s")
            time.sleep(0.05)
        got = [lk.telemetry_ms for lk in bridge.links.values()]
        if got != tel:
            raise RuntimeError(f"phase A: telemetry periods {got}, wanted {tel}")
        stop_at = time.monotonic() + PHASE_A_S
        slow: list = []
        fast: list = []
        hung: list = []
        unplugged: list = []
        lost: list[str] = []
        errors: list[str] = []
        workers = []
        rng = random.Random(1)
        for i in LAT_SLOW + LAT_FAST:
            uuid = gpus[i].uuid
            original = bridge.limiters[uuid].original_w
            args = (i, fleet, rec, bridge, ports[i], uuid, original, stop_at)
            args += (slow if i in LAT_SLOW else fast,)
            args += (lost, random.Random(rng.random()))
            workers.append(threading.Thread(target=_latency_worker, args=args, daemon=True))
        for i, how, out in ((HANG, "pause", hung), (UNPLUG, "unplug", unplugged)):
            args = (i, how, fleet, bridge, ports[i], rec, gpus[i].uuid, stop_at, out, errors)
            args += (random.Random(rng.random()),)
            workers.append(threading.Thread(target=_silent_worker, args=args, daemon=True))
        for w in workers:
            w.start()
        for w in workers:
            w.join(PHASE_A_S + 30.0)
        urgent, inline = bridge.urgent_ticks, bridge.inline_ticks
    finally:
        if bridge is not None:
            bridge.stop()
        fleet.close()
    for why in lost + errors:
        print(f"bench_bridge: {why}", file=sys.stderr)
    both = slow + fast
    if len(both) < MIN_TRIALS or len(hung) < 3 or len(unplugged) < 3:
        raise RuntimeError(
            f"phase A: too few samples ({len(slow)} + {len(fast)} latency, {len(hung)} + "
            f"{len(unplugged)} silent); lost: {lost[:5]}; errors: {errors[:5]}"
        )
    wire = sorted(m + wire_ms(b) for m, b, _ in both)
    inside = sorted(x for _, _, x in both if x is not None)
    hung_s = [a for a, _ in hung]
    unplug_s = [a for a, _ in unplugged]
    ages = [b for _, b in hung if b is not None]
    out = _latency_keys(both)
    out.update(
        reaction_latency_ms_max=round(max(m for m, _, _ in both), 1),
        reaction_latency_ms_p50_in_bridge=round(statistics.median(inside), 2),
        reaction_latency_ms_p99_in_bridge=round(_percentile(inside, 0.99), 2),
        reaction_latency_ms_p50_wire=round(statistics.median(wire), 1),
        reaction_latency_ms_p99_wire=round(_percentile(wire, 0.99), 1),
        reaction_frame_bytes_p50=statistics.median(b for _, b, _ in both),
        reaction_trials_lost=len(lost),
        bridge_urgent_ticks=urgent,
        bridge_inline_ticks=inline,
    )
    out.update(_latency_keys(slow, "_tel1000ms"))
    out.update(_latency_keys(fast, "_tel100ms"))
    del out["reaction_latency_ms_p50_tel1000ms"], out["reaction_latency_ms_p50_tel100ms"]
    out.update(
        module_silent_detect_s=round(statistics.mean(hung_s), 3),
        module_silent_detect_s_min=round(min(hung_s), 3),
        module_silent_detect_s_max=round(max(hung_s), 3),
        module_silent_trials=len(hung_s),
        module_unplug_detect_s=round(statistics.mean(unplug_s), 3),
        module_unplug_detect_s_min=round(min(unplug_s), 3),
        module_unplug_detect_s_max=round(max(unplug_s), 3),
        module_unplug_trials=len(unplug_s),
        module_silent_age_at_decision_s=round(statistics.mean(ages), 3),
    )
    return out


# ----------------------------------------------------------------------------- phase B


def _scrape(url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000.0, body


def _cpu_window(bridge: Child, fleet: Child, url: str, tag: str, seconds: float) -> dict:
    """One CPU window of the bridge child, scraped like Prometheus would."""
    with bridge.cond:
        start = len(bridge.lines)
    t0 = time.monotonic()
    bridge.send(op="measure", seconds=seconds, tag=tag)
    for n in range(int(seconds // PROM_INTERVAL_S)):
        due = t0 + PROM_INTERVAL_S * (n + 0.5)
        time.sleep(max(0.0, due - time.monotonic()))
        _scrape(url)
    result = bridge.wait_for(
        lambda o: o["k"] == "result" and o.get("tag") == tag, seconds + 30.0, start
    )
    if result is None:
        raise RuntimeError(f"phase B: no CPU result ({tag}) from the bridge")
    return result


def _cpu_keys(result: dict, suffix: str) -> dict:
    comp = result["by_component_pct"]
    wall = result["wall_s"]
    return {
        f"bridge_cpu_pct_8_modules{suffix}": round(result["cpu_pct"], 3),
        f"bridge_cpu_pct_links{suffix}": round(comp.get("links", 0.0), 3),
        f"bridge_cpu_pct_loop{suffix}": round(comp.get("loop", 0.0), 3),
        f"bridge_cpu_pct_exporter{suffix}": round(comp.get("exporter", 0.0), 3),
        f"bridge_cpu_pct_scrapes{suffix}": round(
            comp.get("scrapes", 0.0) + comp.get("exited_threads", 0.0), 3
        ),
        f"bridge_frames_per_s{suffix}": round(result["frames"] / wall, 1),
        f"bridge_io_wakeups_per_s{suffix}": round(result["io_wakeups"] / wall, 1),
        f"bridge_ticks_per_s{suffix}": round(result["ticks"] / wall, 2),
        f"bridge_heartbeats_per_s{suffix}": round(result["heartbeats"] / wall, 1),
    }


def phase_b(profile: str | None = None) -> dict:
    """Phase B's keys. ``profile``: the bridge child profiles its windows into
    ``profile.<tag>.<thread>`` (cProfile; ``--cpu --profile``: for reading, its
    numbers are not recorded)."""
    fleet, ports, keys_dir = start_fleet([TEL_DEFAULT_MS] * N)
    bridge = None
    try:
        args = {"ports": ports, "exporter": True, "keys_dir": keys_dir}
        if profile is not None:
            args["profile"] = os.path.abspath(profile)
        bridge = Child("bridge", args)
        ready = bridge.wait_for(lambda o: o["k"] in ("ready", "error"), 40.0)
        if ready is None or ready["k"] != "ready":
            raise RuntimeError(f"phase B: the bridge did not get ready: {ready}")
        if ready["telemetry_ms"] != [TEL_DEFAULT_MS] * N:
            raise RuntimeError(f"phase B: telemetry {ready['telemetry_ms']}")
        url = ready["url"]
        # a running bridge has been scraped before: the first render's one-time work
        # (prometheus_client's text of every header and label prefix) is not steady
        # state, so one scrape comes before the windows
        _scrape(url)
        # steady state: the policy's windowed rules (the early warning's slope, the
        # cross-check) work over their whole history only once the bridge has run
        # that long; a window measured before would leave that work out
        time.sleep(max(0.0, ready["started"] + STEADY_S - time.monotonic()))
        default = _cpu_window(bridge, fleet, url, "default", CPU_WINDOW_S)
        with fleet.cond:
            start = len(fleet.lines)
        fleet.send(op="telemetry", ms=TEL_FAST_MS)
        if fleet.wait_for(lambda o: o["k"] == "telemetry_set", 20.0, start) is None:
            raise RuntimeError("phase B: the fleet did not switch to 10 Hz telemetry")
        time.sleep(1.0)
        fast = _cpu_window(bridge, fleet, url, "10hz", CPU_WINDOW_FAST_S)
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
    if fast["frames"] / fast["wall_s"] < 5 * default["frames"] / default["wall_s"]:
        raise RuntimeError(f"phase B: 10 Hz window frames {fast['frames']}: no switch?")
    for result in (default, fast):  # signed heartbeats flow (the modules are HOSTED)
        if result["heartbeats"] < 0.9 * N * result["wall_s"] / 1.0:
            raise RuntimeError(f"phase B: {result['heartbeats']} heartbeats in {result['tag']}")
    times.sort()
    out = _cpu_keys(default, "")
    out.update(_cpu_keys(fast, "_10hz"))
    out.update(
        bridge_threads=ready["threads"],
        bridge_maxrss_mb=round(fast["maxrss_kb"] / 1024.0, 1),
        bridge_scrape_ms_p50=round(statistics.median(times), 3),
        bridge_scrape_ms_p99=round(_percentile(times, 0.99), 3),
        bridge_scrape_bytes_8_modules=len(body),
    )
    return out


def run() -> dict:
    quiet = logging.getLogger("modbridge")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # unplugs and policy changes log warnings: expected here
    load0 = os.getloadavg()[0]
    try:
        out = phase_a()
        load_a = os.getloadavg()[0]
        out.update(phase_b())
    finally:
        quiet.setLevel(level)
    # the machine's 1-minute load average (2 vCPUs) when phase A and B ended: wall-clock
    # numbers (latency, scrapes) depend on it
    out["bridge_bench_loadavg_start"] = round(load0, 2)
    out["bridge_bench_loadavg_phase_a"] = round(load_a, 2)
    out["bridge_bench_loadavg_phase_b"] = round(os.getloadavg()[0], 2)
    return out


# ----------------------------------------------------------------------------- the doc

#: (key, what it measures, goal) rows of docs/bridge-benchmarks.md's results table
DOC_ROWS = (
    ("reaction_latency_ms_p99", "fault known in a firmware tick -> lowered limit written", "<= 20"),
    ("reaction_latency_ms_p50", "the same, median", ""),
    ("reaction_latency_samples", "reaction trials measured", ">= 500"),
    ("reaction_latency_ms_p99_wire", "p99 plus the frames' 115200-baud wire time", ""),
    ("reaction_latency_ms_p99_in_bridge", "p99 from the event frame's arrival in the bridge", ""),
    ("reaction_latency_ms_p99_tel1000ms", "p99 at the default 1 Hz telemetry", ""),
    ("reaction_latency_ms_p99_tel100ms", "p99 at 10 Hz telemetry", ""),
    ("reaction_latency_ms_max", "the slowest trial", ""),
    ("reaction_trials_lost", "reaction trials without a lowered limit within 3 s", "0"),
    ("module_silent_detect_s", "module hangs (last frame) -> module_silent, mean", "<= 2.0"),
    ("module_silent_detect_s_max", "the same, slowest trial", ""),
    ("module_unplug_detect_s", "a module is unplugged -> CRITICAL module_silent, mean", "<= 1.0"),
    ("module_unplug_detect_s_max", "the same, slowest trial", ""),
    ("bridge_cpu_pct_8_modules", "bridge CPU, % of a core, 8 modules at 1 Hz telemetry", "<= 0.5"),
    ("bridge_cpu_pct_links", "the same, the I/O thread", ""),
    ("bridge_cpu_pct_loop", "the same, the bridge loop", ""),
    ("bridge_io_wakeups_per_s", "wake-ups of the I/O thread at 1 Hz", ""),
    ("bridge_heartbeats_per_s", "signed heartbeats sent a second (8 modules, 1 s)", "8"),
    ("bridge_cpu_pct_8_modules_10hz", "bridge process CPU, 8 modules at 10 Hz telemetry", ""),
    ("bridge_cpu_pct_links_10hz", "the same, the I/O thread", ""),
    ("bridge_threads", "OS threads of the bridge process", ""),
    ("bridge_scrape_ms_p99", "GET /metrics with 8 live modules, p99 of 200", ""),
    ("bridge_bench_loadavg_phase_a", "the host's 1-min load average (2 vCPUs) after phase A", ""),
    ("bridge_bench_loadavg_phase_b", "the same after phase B", ""),
)  # fmt: skip
BEGIN = "<!-- results: generated by python -m bench.bench_bridge --doc -->"
END = "<!-- end of results -->"


def doc_table(results: dict) -> str:
    """The results table of docs/bridge-benchmarks.md, from ``results``."""
    lines = [BEGIN, "| key | what | result | goal |", "|---|---|---|---|"]
    for key, what, goal in DOC_ROWS:
        lines.append(f"| `{key}` | {what} | {results[key]:g} | {goal} |")
    lines.append(END)
    return "\n".join(lines)


def write_doc(results_path: Path = ROOT / "bench" / "results.json", doc: Path = DOC) -> None:
    results = json.loads(results_path.read_text())
    text = doc.read_text()
    i, j = text.index(BEGIN), text.index(END) + len(END)
    doc.write_text(text[:i] + doc_table(results) + text[j:])


def main(argv: list[str]) -> int:
    """``--doc``: the doc's table; ``--cpu [--profile PATH]``: phase B alone (the CPU
    windows and the scrapes), printed, not recorded (while iterating: CPU time
    depends little on the machine's load); nothing: the whole run, printed."""
    if argv == ["--doc"]:
        write_doc()
    elif argv[:1] == ["--cpu"]:
        profile = argv[argv.index("--profile") + 1] if "--profile" in argv else None
        out = phase_b(profile)
        out["bridge_bench_loadavg_phase_b"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out, indent=1, sort_keys=True))
    else:
        print(run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
