"""Child processes of bench/bench_bridge.py (not a benchmark itself: no ``bench_`` prefix).

    python -m bench._bridge_cpu_child fleet '{"n": 8, "speed": 1, "telemetry_ms": [100, ...]}'
    python -m bench._bridge_cpu_child bridge '{"ports": [...], "exporter": true}'

``fleet``: a :class:`~modbridge.sim.fleet.SimFleet` (the real firmware in MicroPython
on ptys), kept out of the bridge's process so that the bridge's CPU time and latency
are not mixed with the simulator's. Each module's ``control.telemetry_ms`` is set
with a ``config_set`` frame injected into the firmware (``host_write``) and acked
before the ports are announced. Every module's tap is wrapped: the wall-clock
(``time.monotonic``, CLOCK_MONOTONIC, comparable across processes) moment the runner
relays an ALARM/CRITICAL ``event`` frame to the pty is printed (``alarm``), and the
moment a telemetry frame first shows ``FAULT_UNDER_VOLTAGE`` or ``v_in`` below the
policy's threshold (``fault``: it can come before the event), each with the byte
length of what that firmware tick sent (``nbytes``). Commands on stdin, one JSON
object a line, each answered with one line:
``dip`` (a 12 V rail dip: under-voltage), ``unplug`` / ``replug`` (the pty closes:
unread bytes are lost), ``pause`` / ``resume`` (the runner stops exchanging: a hung
module, still plugged), ``telemetry`` (every module's ``control.telemetry_ms`` set
by an injected ``config_set``, acked), ``quit``.

``bridge``: the real :class:`~modbridge.bridge.Bridge` with a VirtualBackend of
standalone virtual GPUs (one per port, distinct UUIDs), the exporter, an event log,
heartbeats every 1 s, the bridge loop in the main thread as in ``modbridge run``.
After a warm-up (``ready``) it takes commands on stdin: ``measure`` (``seconds``,
``tag``): its own CPU time (``getrusage``) and each thread's
(``/proc/self/task/<tid>/schedstat``) over that much wall time, printed as a
``result``; ``quit``. With ``"profile": PATH`` in its arguments each window is
also profiled (cProfile, the loop's thread and the I/O thread each by a profiler of
its own, switched on and off by the thread itself) and the stats are dumped to
``PATH.<tag>.<thread>`` (``python -m bench.bench_bridge --cpu --profile PATH``): a
guide to where the time goes, not a measurement (the profiler's own cost is in the
window's numbers).

Both print one JSON object per line on stdout; logging goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import sys
import tempfile
import threading
import time

_out_lock = threading.Lock()
UNDER_VOLTAGE_MV = 11400  # the policy's default under_voltage_v (PolicyConfig), mV


def emit(**obj) -> None:
    line = json.dumps(obj, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


# ----------------------------------------------------------------------------- fleet


def _wrap_tap(i: int, vm, last_tx: list) -> None:
    """Timestamp the firmware's tx bytes as the runner relays them to the pty.

    ``VirtualModule._relay_tx`` calls ``_tap(data)`` and then ``os.write(master,
    data)``: the stamp taken right after the original tap returns is a few
    microseconds before the bytes reach the pty.
    """
    from protocol import catalog as C

    orig = vm._tap

    faults_before = [0]

    def tap(data: bytes) -> None:
        n_ev = len(vm.events)
        nbytes = len(data)
        orig(data)
        t = time.monotonic()
        if vm.plugged:
            last_tx[i] = t
        tel = vm.last_telemetry or {}
        low = bool(tel.get("faults", 0) & C.FAULT_UNDER_VOLTAGE) or (
            tel.get("v_in") is not None and tel["v_in"] < UNDER_VOLTAGE_MV
        )
        if low and not faults_before[0]:
            # the policy acts on v_in below its threshold as on the fault bit: a
            # telemetry frame showing either can come before the event
            emit(k="fault", i=i, t=t, bit="under_voltage", nbytes=nbytes, plugged=vm.plugged)
        faults_before[0] = low
        for ev in vm.events[n_ev:]:
            if ev.get("severity", 0) >= C.SEV_ALARM:
                emit(
                    k="alarm",
                    i=i,
                    t=t,
                    code=ev.get("code"),
                    active=bool(ev.get("active")),
                    plugged=vm.plugged,
                    nbytes=nbytes,
                )

    vm._tap = tap  # instance attribute: shadows the method for this module only


_cfg_seq = 40000


def set_telemetry(fleet, tel: list) -> None:
    """``control.telemetry_ms`` = ``tel[i]`` on module i (None: leave it), each by a
    signed ``config_set`` injected into the firmware and acked."""
    global _cfg_seq
    seqs = {}
    for i, vm in enumerate(fleet.modules):
        if tel[i] is not None:
            _cfg_seq += 1  # unique: an old answer cannot be taken for this one's
            frame = vm.encode("config_set", {"values": {"control.telemetry_ms": tel[i]}},
                              _cfg_seq)  # fmt: skip
            seqs[i] = _cfg_seq
            vm.host_write(b"\x00" + frame)
    deadline = time.monotonic() + 10.0
    for i, seq in seqs.items():
        vm = fleet.modules[i]
        while True:
            answers = [(name, f) for name, f in list(vm.messages)
                       if name in ("ack", "nack") and f.get("ref") == seq]  # fmt: skip
            if answers:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"module {i}: no answer to config_set")
            time.sleep(0.01)
        if answers[0][0] != "ack":
            raise SystemExit(f"module {i}: config_set telemetry_ms={tel[i]} refused")


def run_fleet(args: dict) -> None:
    from modbridge.sim.fleet import SimFleet

    n = int(args.get("n", 8))
    tel = args.get("telemetry_ms") or [None] * n
    fleet = SimFleet(n, speed=float(args.get("speed", 1.0)), seed=int(args.get("seed", 0)))
    last_tx = [0.0] * n
    for i, vm in enumerate(fleet.modules):
        _wrap_tap(i, vm, last_tx)
    fleet.start()
    set_telemetry(fleet, tel)
    emit(k="ports", ports=fleet.ports, uids=[vm.uid.hex() for vm in fleet.modules],
         keys_dir=str(fleet.keys.dir))  # fmt: skip
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            vm = fleet.modules[cmd["i"]] if "i" in cmd else None
            if op == "dip":
                vm.world_fault("rail_dip", int(cmd["mv"]), int(cmd["ms"]))
                emit(k="dip", i=cmd["i"], t=time.monotonic())
            elif op == "unplug":
                vm.unplug()  # under the runner's lock: between two exchanges
                emit(k="unplugged", i=cmd["i"], t=time.monotonic(), last_tx=last_tx[cmd["i"]])
            elif op == "replug":
                vm.replug()
                emit(k="replugged", i=cmd["i"], t=time.monotonic())
            elif op == "pause":
                vm.pause()  # no more exchanges: the firmware is frozen, the pty stays
                emit(k="paused", i=cmd["i"], t=time.monotonic(), last_tx=last_tx[cmd["i"]])
            elif op == "resume":
                vm.start()
                emit(k="resumed", i=cmd["i"], t=time.monotonic())
            elif op == "telemetry":
                set_telemetry(fleet, [int(cmd["ms"])] * n)
                emit(k="telemetry_set", t=time.monotonic(), ms=int(cmd["ms"]))
            elif op == "quit":
                break
    finally:
        fleet.stop()
    emit(k="bye")


# ----------------------------------------------------------------------------- bridge


def virtual_gpus(n: int) -> list:
    """``n`` virtual GPUs (the sim's VirtualGPU, idle, equilibrated) with distinct
    UUIDs and PCI bus ids (every world of a SimFleet carries the world file's one)."""
    from modbridge.sim.world import World

    gpus = []
    for i in range(n):
        gpu = World(seed=i).gpu
        gpu.uuid = f"GPU-b0b0b0b0-0000-4000-8000-{i:012x}"
        gpu.pci_bus_id = f"00000000:{0x18 + i:02x}:00.0"
        gpus.append(gpu)
    return gpus


def bench_config(ports: list[str], gpus: list, **bridge_kw):
    """The benchmarks' bridge config: each port mapped to its GPU, heartbeats 1 s,
    signed with the fleet's keys (``keys_dir``: the fleet runs in a process of its
    own, so the bridge is told where they are; without them no heartbeat is sent and
    the modules stay STANDALONE).

    ``disagree_time_s`` is raised: the standalone virtual GPUs are not the ones the
    modules' NTCs sit on, so their temperatures differ, and a sensor_disagree WARN
    would add limit writes that are not part of what is measured.
    """
    from modbridge.config import BridgeConfig, ModuleMapping
    from modbridge.policy.engine import PolicyConfig

    policy = dict(disagree_time_s=1e6)
    policy.update(bridge_kw.pop("policy", {}))
    return BridgeConfig(
        heartbeat_period_s=1.0,
        modules=[ModuleMapping(None, g.uuid, p) for p, g in zip(ports, gpus, strict=True)],
        policy=PolicyConfig(**policy),
        **bridge_kw,
    )


def thread_cpu_ns() -> dict[int, int]:
    """CPU time (ns, user + system) of each live thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
    return out


def _component(name: str) -> str:
    if name.startswith("modbridge-link"):
        return "links"  # the one I/O thread (selector) serving every port
    if name == "modbridge-metrics-worker":
        return "scrapes"  # the HTTP server's request workers (long-lived)
    if name == "modbridge-metrics":
        return "exporter"
    if name == "MainThread":
        return "loop"
    return "other"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _commands(q) -> None:
    for line in sys.stdin:
        with contextlib.suppress(ValueError):
            q.append(json.loads(line))
    q.append({"op": "quit"})


class _Profiles:
    """cProfile per thread for the measurement windows (``"profile"`` argument): each
    thread enables and disables its own profiler (cProfile hooks only the calling
    thread), the loop's in :func:`run_bridge`'s step, the I/O thread's after each
    wake-up (``LinkIO.after_iteration``, wrapped)."""

    def __init__(self, path: str | None):
        self.path = path
        self.want: str | None = None  # the window's tag while one is open
        self._on: dict[str, tuple] = {}  # thread name -> (profiler, tag)

    def sync(self, thread: str) -> None:
        if self.path is None:
            return
        import cProfile

        cur = self._on.get(thread)
        if cur is not None and cur[1] != self.want:
            cur[0].disable()
            cur[0].dump_stats(f"{self.path}.{cur[1]}.{thread}")
            del self._on[thread]
            cur = None
        if cur is None and self.want is not None:
            prof = cProfile.Profile()
            self._on[thread] = (prof, self.want)
            prof.enable()

    def wrap_io(self, bridge) -> None:
        if self.path is None:
            return
        after = bridge.io.after_iteration

        def after_iteration():
            after()
            self.sync("io")

        bridge.io.after_iteration = after_iteration


def run_bridge(args: dict) -> None:
    from collections import deque

    from modbridge.bridge import Bridge
    from modbridge.exporter import prometheus as exporter
    from modbridge.exporter.eventlog import EventLog
    from modbridge.gpu.virtual import VirtualBackend

    ports = args["ports"]
    gpus = virtual_gpus(len(ports))
    cfg = bench_config(ports, gpus, exporter_enabled=bool(args.get("exporter", True)),
                       keys_dir=args["keys_dir"])  # fmt: skip
    tmp = tempfile.TemporaryDirectory(prefix="modbridge-bench-")
    elog = EventLog(os.path.join(tmp.name, "events.jsonl"))
    bridge = Bridge(cfg, VirtualBackend(gpus), ports, event_log=elog)
    profiles = _Profiles(args.get("profile"))
    profiles.wrap_io(bridge)
    started = time.monotonic()
    bridge.start()
    server = exporter.serve(bridge.snapshot, port=0) if cfg.exporter_enabled else None
    clock = time.monotonic
    links = list(bridge.links.values())

    # warm-up: every link up and at least two telemetry frames from each (the first
    # may be stale bytes from the pty buffer)
    first_frames: dict[str, int] = {}

    def warm() -> bool:
        for port, link in bridge.links.items():
            if not link.link_up or link.status.telemetry_at is None:
                return False
            first_frames.setdefault(port, link.status.frames_total)
            if link.status.frames_total < first_frames[port] + 2:
                return False
        return True

    t_warm = clock() + 30.0
    bridge.run(until=lambda: warm() or clock() > t_warm)
    if not warm():
        states = {p: (lk.state, lk.telemetry_ms) for p, lk in bridge.links.items()}
        emit(k="error", why=f"links not ready after 30 s: {states}")
        bridge.stop()
        return
    names = {t.native_id: t.name for t in threading.enumerate()}
    emit(
        k="ready",
        url=server.url if server else None,
        t=clock(),
        started=started,
        threads=len(os.listdir("/proc/self/task")),
        thread_names=sorted(names.values()),
        telemetry_ms=[lk.telemetry_ms for lk in links],
    )
    q: deque = deque()
    threading.Thread(target=_commands, args=(q,), name="bench-stdin", daemon=True).start()
    window: dict = {}

    def start_window(cmd) -> None:
        window.update(
            tag=cmd.get("tag", ""),
            end=clock() + float(cmd["seconds"]),
            th0=thread_cpu_ns(),
            cpu0=_cpu_s(),
            t0=clock(),
            frames0=sum(lk.status.frames_total for lk in links),
            hb0=sum(lk.heartbeats_sent for lk in links),
            ticks0=bridge.ticks,
            wakes0=bridge.io.iterations,
        )
        profiles.want = window["tag"]

    def end_window() -> None:
        cpu1, t1 = _cpu_s(), clock()
        th1 = thread_cpu_ns()
        names = {t.native_id: t.name for t in threading.enumerate()}
        by_component: dict[str, float] = {}
        th0 = window["th0"]
        for tid, ns in th1.items():
            comp = _component(names.get(tid, "?"))
            by_component[comp] = by_component.get(comp, 0.0) + (ns - th0.get(tid, 0)) / 1e9
        wall = t1 - window["t0"]
        cpu = cpu1 - window["cpu0"]
        # threads that ended during the window (the HTTP server's per-scrape handlers)
        by_component["exited_threads"] = max(0.0, cpu - sum(by_component.values()))
        emit(
            k="result",
            tag=window["tag"],
            wall_s=wall,
            cpu_s=cpu,
            cpu_pct=100.0 * cpu / wall,
            by_component_pct={k: 100.0 * v / wall for k, v in by_component.items()},
            threads=len(th1),
            frames=sum(lk.status.frames_total for lk in links) - window["frames0"],
            heartbeats=sum(lk.heartbeats_sent for lk in links) - window["hb0"],
            ticks=bridge.ticks - window["ticks0"],
            io_wakeups=bridge.io.iterations - window["wakes0"],
            links_up=sum(lk.link_up for lk in links),
            maxrss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        )
        window.clear()
        profiles.want = None

    def step() -> bool:
        if window and clock() >= window["end"]:
            end_window()
        profiles.sync("loop")
        while q and not window:
            cmd = q.popleft()
            if cmd.get("op") == "quit":
                return True
            if cmd.get("op") == "measure":
                start_window(cmd)
        return False

    t_quit = clock() + 600.0  # never linger
    bridge.run(until=lambda: step() or clock() > t_quit)
    bridge.stop()
    if server is not None:
        server.stop()
    elog.close()
    tmp.cleanup()
    emit(k="bye")


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    role, args = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    if role == "fleet":
        run_fleet(args)
    elif role == "bridge":
        run_bridge(args)
    else:
        print(f"unknown role {role!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
