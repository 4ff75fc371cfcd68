"""`modbridge sim`: virtual module(s) on pty(s) (see docs/simulator.md).

The real firmware runs in the MicroPython unix port against a simulated world; each
module's protocol port is a pty with a stable symlink. The command drives the fleet
from its own thread (``SimFleet.run_for``), applies ``--fault`` schedules on the world
clock (to within one firmware sleep, <= 100 ms) and, with ``--watch``, prints one
status line per module per simulated second from the runner's telemetry tap (plus a
line per event and fault).
Each module is provisioned with a signing key (docs/pairing.md): the module's
``secret.key`` and the host copy in ``--keys-dir`` (default: ``keys/`` in the state
directory); the module line says where it is, for a bridge in another process
(``MODBRIDGE_KEYS_DIR``) or ``modbridge frame encode --sign-key``.
Stderr gets one line per change of what each virtual MCU does (the runner's
``McuEvent``: running firmware vX, at the REPL and why, soft reset, reset, halted and
why, powered off, unplugged), and a note when a REPL tool knocks while the firmware
owns the port. A missing ``micropython`` is one line and exit 1 (a runtime error in
docs/bridge.md's table: the simulator cannot run here, no module is missing).
SIGINT/SIGTERM stop it cleanly: every micropython process is killed, ptys closed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading

import click

from protocol import catalog as C

SPEED_HELP = "Simulated seconds per wall second (1 = real time), or 'max'."


def _speed(text: str) -> float:
    if text.strip().lower() in ("max", "0"):
        return 0.0
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0 or math.isinf(v):
        raise ValueError(f"--speed: a number > 0 or 'max', got {text!r}")
    return v


class _Usage(Exception):
    """Bad input: one line on stderr, exit 2."""


def register(group) -> None:
    """Add the simulator commands to the CLI group."""
    group.add_command(sim_cmd)


@click.command("sim")
@click.option(
    "--world",
    "--sim-world",
    "world",
    default="default",
    show_default=True,
    help="World: default, h200_2u or a world file (docs/simulator.md).",
)
@click.option(
    "--profile",
    "--sim-profile",
    "profile",
    default="demo",
    show_default=True,
    help="GPU load: idle, step650, bursts, bench, demo or a profile file (the default "
    "of run --sim too).",
)
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=int,
    help="Noise seed; module i uses seed+i (also its MCU unique id).",
)
@click.option("--speed", "--sim-speed", "speed_text", default="1", show_default=True,
              help=SPEED_HELP)  # fmt: skip
@click.option(
    "--modules",
    "--sim-modules",
    "n",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="How many virtual modules, each with its own world and GPU.",
)
@click.option(
    "--ambient",
    type=float,
    default=None,
    help="Room air at the inlet, degC (default: the world's).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the modules' flash (config, key) and ptys' symlinks here across runs.",
)
@click.option(
    "--keys-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the host copies of the modules' signing keys here "
    "(default: keys/ in the state directory).",
)
@click.option(
    "--fault",
    "--sim-fault",
    "faults",
    multiple=True,
    metavar="SPEC",
    help="Scheduled fault, repeatable: ntc_open:gpu@30s, ntc_short:amb@5s-9s, "
    "fan_stall:2@60s-90s, ina_absent@10s, dip:900mV/500ms@45s, "
    "host_silence@20s-40s, mcu_reset@50s, gpu_lost@100s; m<i>: for one module.",
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Stop after this many wall-clock seconds (exit 0), as run and record do.",
)
@click.option(
    "--world-duration",
    type=float,
    default=None,
    help="Stop after this many simulated seconds (exit 0): the same world at any --speed.",
)
@click.option("--watch", is_flag=True, help="One status line per module per simulated second.")
@click.option(
    "--interval",
    type=click.IntRange(1, 3600),
    default=1,
    show_default=True,
    help="With --watch: simulated seconds between status lines.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --watch: one JSON object per line (status, event, fault).",
)
def sim_cmd(
    world,
    profile,
    seed,
    speed_text,
    n,
    ambient,
    state_dir,
    keys_dir,
    faults,
    duration,
    world_duration,
    watch,
    interval,
    as_json,
):
    """Run virtual module(s): the real firmware against a simulated GPU, on a pty.

    Prints each module's port (a stable symlink and the pty it points to); anything
    speaking the protocol can open it: a terminal (type a JSON line), the bridge.
    Commands must be signed: the module line shows the key file (a bridge in another
    process: MODBRIDGE_KEYS_DIR=<dir>; a terminal: `modbridge frame encode --jsonl
    --sign-key <key> --nonce <hello nonce>`).

    The virtual GPUs are served on <state dir>/gpu.sock (a Unix socket, mode 0600; the
    module line shows it after "gpus"): a bridge in another process cools them with
    `modbridge run --port <symlink> --backend sim-remote` (module i cools GPU i; a
    real GPU is never paired with a virtual module).

    \b
    mpremote works once the module is at MicroPython's REPL: after a `repl` command
    (`modbridge repl <symlink> --keys-dir <keys dir>`, or {"type":"repl"}) or when
    the firmware stopped (returned or crashed: its traceback is on the port). Then
    `mpremote connect <symlink> exec "print(1+1)"`, `fs ls`, `fs cp :secret.key .`,
    `resume exec ...` (the module's flash directory is its filesystem); `mpremote
    reset` or Ctrl-D at the friendly REPL starts the firmware again (`soft-reset` is
    the raw REPL's: it stays at the REPL, as on a board).
    While the firmware runs it owns the port and mpremote fails: stderr says so.

    Stderr: one line per change of each MCU (running firmware vX, at the REPL and
    why, soft reset, reset, halted and why, powered off). Runs until Ctrl-C, SIGTERM,
    --duration (wall seconds) or --world-duration (simulated seconds). The --sim-*
    names of run, status and doctor are accepted for the same options.
    """
    try:
        code = _run(
            world,
            profile,
            seed,
            speed_text,
            n,
            ambient,
            state_dir,
            keys_dir,
            faults,
            (duration, world_duration),
            watch,
            interval,
            as_json,
        )
    except _Usage as e:
        click.echo(f"modbridge sim: {e}", err=True)
        sys.exit(2)
    sys.exit(code)


def _run(
    world,
    profile,
    seed,
    speed_text,
    n,
    ambient,
    state_dir,
    keys_dir,
    faults,
    duration,
    watch,
    interval,
    as_json,
) -> int:
    from modbridge.errors import ModbridgeError
    from modbridge.sim import ParamsError, ProfileError, WorldError
    from modbridge.sim.faults import FaultSpecError, parse_faults
    from modbridge.sim.fleet import SimFleet
    from modbridge.sim.runner import SimError

    try:
        speed = _speed(speed_text)
        specs = parse_faults(faults)
    except (ValueError, FaultSpecError) as e:
        raise _Usage(f"--{e}" if isinstance(e, FaultSpecError) else str(e)) from None
    wall_s, duration = duration  # --duration (wall), --world-duration (simulated)
    for name, what, v in (("--duration", "wall-clock", wall_s),
                          ("--world-duration", "simulated", duration)):  # fmt: skip
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise _Usage(f"{name}: {what} seconds > 0, got {v:g}")
    if as_json and not watch:
        raise _Usage("--json goes with --watch")

    stop = threading.Event()
    old = _install_signals(stop)
    timer = None
    if wall_s is not None:  # the wall clock's limit: the loop sees stop like a Ctrl-C
        timer = threading.Timer(wall_s, stop.set)
        timer.daemon = True
    fleet = gpu_server = None
    out = _Out(as_json)
    try:
        try:
            fleet = SimFleet(
                n,
                world=world,
                profile=profile,
                seed=seed,
                speed=speed,
                state_dir=state_dir,
                ambient_c=ambient,
                faults=specs,
                keys_dir=keys_dir,
            )
        except FaultSpecError as e:
            raise _Usage(f"--{e}") from None
        except (ParamsError, ProfileError, WorldError) as e:
            raise _Usage(str(e)) from None
        except OSError as e:
            raise _Usage(f"cannot set up the virtual modules: {e}") from None
        except ModbridgeError as e:  # no micropython: the simulator cannot run here
            click.echo(f"modbridge sim: {e}", err=True)
            return 1
        gpu_server = _serve_gpus(fleet)
        out.gpu_socket = None if gpu_server is None else str(gpu_server.path)
        for i, vm in enumerate(fleet.modules):
            out.module(i, vm, fleet)
            vm.on_mcu_event = _McuLines(i, len(fleet.modules) > 1, out)
        if not watch:
            out.info(
                f"signing keys in {fleet.keys.dir}: a bridge in another process signs with "
                f"MODBRIDGE_KEYS_DIR={fleet.keys.dir}"
            )
            if gpu_server is not None:
                out.info(
                    f"virtual GPUs on {gpu_server.path}: a bridge in another process uses "
                    f"them with `modbridge run --port {fleet.ports[0]} --backend sim-remote`"
                )
            out.info(_describe_faults(fleet.schedule.faults))
            limits = [f"{wall_s:g} s"] if wall_s is not None else []
            limits += [f"{duration:g} simulated s"] if duration is not None else []
            out.info("running for " + " or ".join(limits) if limits
                     else "running; Ctrl-C to stop")  # fmt: skip
        watcher = _Watcher(fleet, out, interval * 1000) if watch else None
        sim_ms = None if duration is None else int(round(duration * 1000))
        if timer is not None:
            timer.start()
        try:
            fleet.run_for(sim_ms, on_step=watcher, stop=stop)
        except BrokenPipeError:
            _silence_stdout()  # `| head`: the reader left; stop quietly
            return 0
        except (SimError, ModbridgeError) as e:
            click.echo(f"modbridge sim: {e}", err=True)
            return 1
        if watcher is not None:
            watcher.flush(fleet.now_ms)
        if not watch:
            out.info(f"stopped at {fleet.now_ms / 1000:.1f} simulated s")
        return 0
    finally:
        if timer is not None:
            timer.cancel()
        if gpu_server is not None:
            gpu_server.stop()
        if fleet is not None:
            fleet.stop()
        _restore_signals(old)


def _serve_gpus(fleet):
    """Publish the fleet's GPUs for a bridge in another process (``gpu.sock`` in its
    state directory, modbridge.sim.gpuserver); None, said on stderr, if it cannot."""
    from modbridge.ops.ctlsock import SocketError
    from modbridge.sim import gpuserver

    try:
        return gpuserver.serve(fleet)
    except (SocketError, OSError) as e:
        click.echo(f"modbridge sim: the virtual GPUs are not published ({e}); "
                   "only `run --sim` can use them", err=True)  # fmt: skip
        return None


def _describe_faults(faults) -> str:
    if not faults:
        return "no faults scheduled"
    parts = []
    for f in faults:
        when = f"{f.at_ms / 1000:g} s"
        if f.until_ms is not None:
            when += f"-{f.until_ms / 1000:g} s"
        who = "" if f.module is None else f" (module {f.module})"
        parts.append(f"{f.label()} @{when}{who}")
    return "faults: " + "; ".join(parts)


def _install_signals(stop: threading.Event):
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        if stop.is_set():  # a second one: stop waiting for the loop (fleet.stop still runs)
            raise KeyboardInterrupt
        stop.set()

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, handler)
    return old


def _restore_signals(old) -> None:
    if not old:
        return
    for sig, h in old.items():
        signal.signal(sig, h)


def _silence_stdout() -> None:
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


# --------------------------------------------------------------------------- output


class _Out:
    def __init__(self, as_json: bool):
        self.json = as_json
        self.gpu_socket = None  # where the virtual GPUs are served (gpuserver)

    def emit(self, text: str, obj: dict) -> None:
        click.echo(json.dumps(obj, separators=(",", ":")) if self.json else text)

    def info(self, text: str) -> None:
        if not self.json:
            click.echo(text)

    def module(self, i, vm, fleet) -> None:
        w = vm.world
        self.emit(
            f"module {i}: {vm.port_symlink} -> {vm.port} (uid {vm.uid.hex()}, "
            f"world {w.params['world']['name']}, profile {w.profile.name}, seed {vm.seed}) "
            f"key {vm.host_key_path}"
            + ("" if self.gpu_socket is None else f" gpus {self.gpu_socket}"),
            {
                "type": "module",
                "module": i,
                "port": str(vm.port_symlink),
                "pty": vm.port,
                "uid": vm.uid.hex(),
                "world": w.params["world"]["name"],
                "profile": w.profile.name,
                "seed": vm.seed,
                "state_dir": str(vm.state_dir),
                "key": str(vm.host_key_path),
                "secret": str(vm.key_path),
                "gpu_socket": self.gpu_socket,
                "gpu": vm.world.gpu.uuid,
            },
        )


class _McuLines:
    """``on_mcu_event`` of one module: a line on stderr per change (and, with --watch
    --json, the same as a ``{"type": "mcu"}`` object on stdout)."""

    def __init__(self, i: int, wide: bool, out: _Out):
        self.i = i
        self.tag = f" m{i}" if wide else ""
        self.out = out

    def __call__(self, ev) -> None:
        with contextlib.suppress(OSError, ValueError):  # stderr gone: nothing to tell
            click.echo(f"{ev.t_ms / 1000:7.1f}s{self.tag} MCU: {ev.text}", err=True)
        if self.out.json:
            obj = {
                "type": "mcu",
                "world_s": ev.t_ms / 1000,
                "module": self.i,
                "kind": ev.kind,
                "why": ev.why,
                "version": ev.version or None,
                "text": ev.text,
            }
            with contextlib.suppress(OSError, ValueError):
                click.echo(json.dumps(obj, separators=(",", ":")))


def _c(tel, key):
    v = tel.get(key)
    return None if v is None else round(v / 1000.0, 1)


def _pct(duty):
    return None if duty is None else round(duty * 100.0 / 65535, 1)


def _milli(tel, key, digits):
    """A wire value in milli-units (``v_in`` mV) in units, to ``digits`` places."""
    v = tel.get(key)
    return None if v is None else round(v / 1000, digits)


_EDGE_ONLY = ("under_voltage", "power_monitor_fault")


def _fault_names(mask: int) -> list[str]:
    return [name for b, name in enumerate(C.FAULT_BITS) if mask & (1 << b)]


def _name(table, i):
    return table[i] if isinstance(i, int) and 0 <= i < len(table) else str(i)


class _Watcher:
    """``on_step`` of the fleet: status lines every simulated second, events, faults."""

    def __init__(self, fleet, out: _Out, every_ms: int = 1000):
        self.fleet = fleet
        self.out = out
        self.every_ms = every_ms
        self.next_ms = every_ms
        self.seen = [0] * len(fleet.modules)
        self.wide = len(fleet.modules) > 1

    def __call__(self, now_ms: int, actions) -> None:
        for act in actions:
            self._fault(act)
        self._events(now_ms)
        if now_ms >= self.next_ms:
            self.next_ms = (now_ms // self.every_ms + 1) * self.every_ms
            for i, vm in enumerate(self.fleet.modules):
                self._status(now_ms, i, vm)

    def flush(self, now_ms: int) -> None:
        self._events(now_ms)

    def _tag(self, i) -> str:
        return f" m{i}" if self.wide else ""

    def _fault(self, act) -> None:
        f = act.fault
        mods = "all" if f.module is None else f.module
        who = "" if f.module is None or not self.wide else f" (m{f.module})"
        self.out.emit(
            f"{act.t_ms / 1000:7.1f}s fault: {act.text()}{who}",
            {
                "type": "fault",
                "world_s": act.t_ms / 1000,
                "module": mods,
                "fault": f.name,
                "on": act.on,
                "spec": f.spec,
                "text": act.text(),
            },
        )

    def _events(self, now_ms: int) -> None:
        for i, vm in enumerate(self.fleet.modules):
            evs = vm.events
            while self.seen[i] < len(evs):
                ev = evs[self.seen[i]]
                self.seen[i] += 1
                self._event(now_ms, i, ev)

    def _event(self, now_ms, i, ev) -> None:
        code = _name(C.REASONS, ev.get("code"))
        sev = _name(C.SEVERITIES, ev.get("severity", 0))
        active = ev.get("active", True)
        idx = ev.get("index", -1)
        state = ev.get("state")
        prev = ev.get("prev_state")
        value = ev.get("value")
        target = ""
        if idx is not None and idx >= 0:
            if code.startswith("sensor_") or code in ("over_temp", "critical_temp"):
                target = " " + _name(C.CHANNELS, idx)
            elif code == "fan_stall":
                target = f" fan{idx + 1}"
            else:
                target = f" {idx}"
        if state is not None and prev is not None and state != prev:
            what = f"{_name(C.STATES, prev)} -> {_name(C.STATES, state)} ({code})"
        elif idx == -1 and state is not None and code not in _EDGE_ONLY:
            what = f"{_name(C.STATES, state)} ({code})"
        else:
            what = f"{code}{target} {'raised' if active else 'cleared'}"
            if code == "under_voltage" and value:
                what += f" at {value / 1000:.2f} V"
            elif code in ("over_temp", "critical_temp") and value:
                what += f" at {value / 1000:.1f} C"
        if ev.get("text"):
            what += " " + repr(ev["text"])
        self.out.emit(
            f"{now_ms / 1000:7.1f}s{self._tag(i)} event: {what} [{sev}]",
            {
                "type": "event",
                "world_s": now_ms / 1000,
                "module": i,
                "code": code,
                "severity": sev,
                "active": bool(active),
                "index": idx,
                "state": None if state is None else _name(C.STATES, state),
                "prev_state": None if prev is None else _name(C.STATES, prev),
                "value": value,
                "text": ev.get("text"),
            },
        )

    def _status(self, now_ms, i, vm) -> None:
        tel = vm.last_telemetry or {}
        gpu = self._gpu(vm)
        obj = {
            "type": "status",
            "world_s": now_ms / 1000,
            "module": i,
            "mcu": vm.mcu_state,
            "state": _name(C.STATES, tel["state"]) if "state" in tel else None,
            "reason": _name(C.REASONS, tel["reason"]) if "reason" in tel else None,
            "faults": _fault_names(tel.get("faults", 0)),
            "temp_gpu_c": _c(tel, "temp_gpu"),
            "temp_vram_c": _c(tel, "temp_vram"),
            "temp_mos_c": _c(tel, "temp_mos"),
            "temp_amb_c": _c(tel, "temp_amb"),
            "fan1_rpm": tel.get("fan1_rpm"),
            "fan2_rpm": tel.get("fan2_rpm"),
            "fan1_duty_pct": _pct(tel.get("fan1_duty")),
            "fan2_duty_pct": _pct(tel.get("fan2_duty")),
            "v_in_v": _milli(tel, "v_in", 3),
            "i_in_a": _milli(tel, "i_in", 3),
            "p_in_w": _milli(tel, "p_in", 1),
            **gpu,
        }
        self.out.emit(self._line(obj, vm), obj)

    @staticmethod
    def _gpu(vm) -> dict:
        from modbridge.sim import GpuLost

        g = vm.world.gpu
        try:
            return {
                "gpu_power_w": round(g.power_w(), 1),
                "gpu_limit_w": round(g.power_limit_w(), 1),
                "gpu_temp_c": g.temperature_c(),
                "gpu_lost": False,
            }
        except GpuLost:
            return {"gpu_power_w": None, "gpu_limit_w": None, "gpu_temp_c": None, "gpu_lost": True}

    def _line(self, o, vm) -> str:
        head = f"{o['world_s']:7.1f}s{self._tag(o['module'])} "
        if vm.mcu_state != "running":
            why = f" ({vm.halt_reason})" if vm.halt_reason else ""
            state = f"MCU {vm.mcu_state}{why}"
        elif o["state"] is None:
            state = "(no telemetry yet)"
        else:
            state = o["state"]
            if o["state"] in ("FAILSAFE", "STANDALONE") and o["reason"] not in (None, "boot"):
                state += f"({o['reason']})"

        def num(v, fmt, width):
            return "--".rjust(width) if v is None else format(v, fmt).rjust(width)

        temps = " ".join(
            f"{k} {num(o[f'temp_{k}_c'], '.1f', 4)}" for k in ("gpu", "vram", "mos", "amb")
        )
        fans = (
            f"fans {num(o['fan1_rpm'], 'd', 4)}/{num(o['fan2_rpm'], 'd', 4)} rpm "
            f"{num(o['fan1_duty_pct'], '.0f', 3)}/{num(o['fan2_duty_pct'], '.0f', 3)} %"
        )
        rail = f"{num(o['v_in_v'], '.2f', 5)} V {num(o['p_in_w'], '.0f', 3)} W"
        if o["gpu_lost"]:
            gpu = "GPU lost"
        else:
            gpu = f"GPU {o['gpu_temp_c']:2d} C {o['gpu_power_w']:3.0f}/{o['gpu_limit_w']:.0f} W"
        line = f"{head}{state:<10}  {temps} C | {fans} | {rail} | {gpu}"
        if o["faults"]:
            line += " | faults " + ",".join(o["faults"])
        return line
