"""Child processes of bench/bench_bridge.py (not a benchmark itself: no ``bench_`` prefix).

    python -m bench._bridge_cpu_child fleet '{"n": 8, "speed": 1, "telemetry_ms": [100, ...]}'
    python -m bench._bridge_cpu_child bridge '{"ports": [...], "seconds": 60, "exporter": true}'

``fleet``: a :class:`~modbridge.sim.fleet.SimFleet` (the real firmware in MicroPython
on ptys), kept out of the bridge's process so that the bridge's CPU time and latency
are not mixed with the simulator's. Each module's ``control.telemetry_ms`` is set
with a ``config_set`` frame injected into the firmware (``host_write``) and acked
before the ports are announced. Every module's tap is wrapped: the wall-clock
(``time.monotonic``, CLOCK_MONOTONIC, comparable across processes) moment the runner
relays an ALARM/CRITICAL ``event`` frame to the pty is printed. Commands on stdin,
one JSON object a line, each answered with one line: ``dip`` (a 12 V rail dip:
under-voltage), ``unplug`` / ``replug`` (the pty closes: unread bytes are lost),
``pause`` / ``resume`` (the runner stops exchanging: a hung module, still plugged),
``quit``.

``bridge``: the real :class:`~modbridge.bridge.Bridge` with a VirtualBackend of
standalone virtual GPUs (one per port, distinct UUIDs), the exporter, an event log,
heartbeats every 1 s, the bridge loop in the main thread as in ``modbridge run``.
After a warm-up it measures its own CPU time (``getrusage``) and each thread's
(``/proc/self/task/<tid>/schedstat``) over ``seconds`` of wall time, prints them,
then keeps serving until ``quit`` on stdin.

Both print one JSON object per line on stdout; logging goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import select
import sys
import tempfile
import threading
import time

_out_lock = threading.Lock()


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

    def tap(data: bytes) -> None:
        n_ev = len(vm.events)
        orig(data)
        t = time.monotonic()
        if vm.plugged:
            last_tx[i] = t
        for ev in vm.events[n_ev:]:
            if ev.get("severity", 0) >= C.SEV_ALARM:
                emit(
                    k="alarm",
                    i=i,
                    t=t,
                    code=ev.get("code"),
                    active=bool(ev.get("active")),
                    plugged=vm.plugged,
                )

    vm._tap = tap  # instance attribute: shadows the method for this module only


def run_fleet(args: dict) -> None:
    from modbridge.sim.fleet import SimFleet

    n = int(args.get("n", 8))
    tel = args.get("telemetry_ms") or [None] * n
    fleet = SimFleet(n, speed=float(args.get("speed", 1.0)), seed=int(args.get("seed", 0)))
    last_tx = [0.0] * n
    for i, vm in enumerate(fleet.modules):
        _wrap_tap(i, vm, last_tx)
    fleet.start()
    for i, vm in enumerate(fleet.modules):
        if tel[i] is not None:
            frame = vm.encode("config_set", {"values": {"control.telemetry_ms": tel[i]}}, 1)
            vm.host_write(b"\x00" + frame)
    deadline = time.monotonic() + 10.0
    for i, vm in enumerate(fleet.modules):
        if tel[i] is None:
            continue
        while not any(name in ("ack", "nack") for name, _ in list(vm.messages)):
            if time.monotonic() > deadline:
                raise SystemExit(f"module {i}: no answer to config_set")
            time.sleep(0.01)
        acked = [f for name, f in list(vm.messages) if name == "ack"]
        if not acked:
            raise SystemExit(f"module {i}: config_set telemetry_ms={tel[i]} refused")
    emit(k="ports", ports=fleet.ports, uids=[vm.uid.hex() for vm in fleet.modules])
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
    """The benchmarks' bridge config: each port mapped to its GPU, heartbeats 1 s.

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


def experimental_link_factory(name: str | None):
    """``None``: the real :class:`~modbridge.link.session.ModuleLink`. ``"wake"``: an
    experiment for docs/bridge-benchmarks.md (not what the bridge ships): the link
    thread sleeps in ``select()`` on the port's fd instead of a fixed 0.5 s poll, so
    it reads as soon as bytes arrive, and a telemetry frame whose ``faults`` differ
    from the previous one wakes the bridge loop (through ``on_event``) like an event
    does. Requests made while it sleeps are not seen early (the benchmark makes none).
    """
    from modbridge.link.session import ModuleLink

    if name is None:
        return ModuleLink
    if name != "wake":
        raise ValueError(f"unknown link experiment {name!r}")

    class WakeOnDataLink(ModuleLink):
        _faults = None

        def _wait(self, delay: float) -> None:
            ser = self._ser
            if ser is None or delay <= 0 or self._wake.is_set():
                super()._wait(delay)
                return
            try:
                select.select([ser.fileno()], [], [], delay)
            except (OSError, ValueError):
                pass  # the port went away: the next read says so
            self._wake.clear()

        def _dispatch(self, item, now: float) -> None:
            super()._dispatch(item, now)
            if item.ok and item.name == "telemetry":
                faults = item.fields.get("faults", 0)
                if self._faults is not None and faults != self._faults:
                    self._callback(self.on_event, item)
                self._faults = faults

    return WakeOnDataLink


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
        return "links"
    if name == "modbridge-metrics":
        return "exporter"
    if name == "MainThread":
        return "loop"
    return "other"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_bridge(args: dict) -> None:
    from modbridge.bridge import Bridge
    from modbridge.exporter import prometheus as exporter
    from modbridge.exporter.eventlog import EventLog
    from modbridge.gpu.virtual import VirtualBackend

    ports = args["ports"]
    seconds = float(args.get("seconds", 60.0))
    telemetry_ms = args.get("telemetry_ms")
    gpus = virtual_gpus(len(ports))
    cfg = bench_config(ports, gpus, exporter_enabled=bool(args.get("exporter", True)))
    tmp = tempfile.TemporaryDirectory(prefix="modbridge-bench-")
    elog = EventLog(os.path.join(tmp.name, "events.jsonl"))
    factory = experimental_link_factory(args.get("link"))
    bridge = Bridge(cfg, VirtualBackend(gpus), ports, event_log=elog, link_factory=factory)
    bridge.start()
    server = exporter.serve(bridge.snapshot, port=0) if cfg.exporter_enabled else None
    clock = time.monotonic

    # warm-up: every link up, its hello says the wanted telemetry period, and at
    # least two telemetry frames (the first may be stale bytes from the pty buffer)
    first_frames: dict[str, int] = {}

    def warm() -> bool:
        for port, link in bridge.links.items():
            if not link.link_up or link.status.telemetry_at is None:
                return False
            if telemetry_ms is not None and link.telemetry_ms != telemetry_ms:
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
    frames0 = sum(lk.status.frames_total for lk in bridge.links.values())
    hb0 = sum(lk.heartbeats_sent for lk in bridge.links.values())
    ticks0 = bridge.ticks
    names = {t.native_id: t.name for t in threading.enumerate()}
    emit(
        k="ready",
        url=server.url if server else None,
        t=clock(),
        threads=len(os.listdir("/proc/self/task")),
        thread_names=sorted(names.values()),
        telemetry_ms=[lk.telemetry_ms for lk in bridge.links.values()],
    )
    th0 = thread_cpu_ns()
    cpu0, t0 = _cpu_s(), clock()
    t_end = t0 + seconds
    bridge.run(until=lambda: clock() >= t_end)
    cpu1, t1 = _cpu_s(), clock()
    th1 = thread_cpu_ns()
    names = {t.native_id: t.name for t in threading.enumerate()}
    by_component: dict[str, float] = {}
    for tid, ns in th1.items():
        comp = _component(names.get(tid, "?"))
        by_component[comp] = by_component.get(comp, 0.0) + (ns - th0.get(tid, 0)) / 1e9
    wall = t1 - t0
    cpu = cpu1 - cpu0
    # threads that ended during the window (the HTTP server's per-scrape handlers)
    by_component["exited_threads"] = max(0.0, cpu - sum(by_component.values()))
    emit(
        k="result",
        wall_s=wall,
        cpu_s=cpu,
        cpu_pct=100.0 * cpu / wall,
        by_component_pct={k: 100.0 * v / wall for k, v in by_component.items()},
        threads=len(th1),
        frames=sum(lk.status.frames_total for lk in bridge.links.values()) - frames0,
        heartbeats=sum(lk.heartbeats_sent for lk in bridge.links.values()) - hb0,
        ticks=bridge.ticks - ticks0,
        links_up=sum(lk.link_up for lk in bridge.links.values()),
        maxrss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    )

    def quit_requested() -> bool:
        r, _, _ = select.select([sys.stdin], [], [], 0)
        return bool(r)

    t_quit = clock() + 120.0  # the parent's scrapes; never linger
    bridge.run(until=lambda: quit_requested() or clock() > t_quit)
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
