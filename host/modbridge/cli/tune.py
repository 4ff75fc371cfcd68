"""``modbridge tune``: run the module's relay autotune and write the gains it proposes.

The module does the test (device/control/autotune.py, docs/autotune.md): it replaces
its PID by a relay around the duty it runs at, measures the oscillation's period and
amplitude until they agree over a few cycles, and reports the ultimate gain Ku, the
ultimate period Pu and Tyreus-Luyben PI gains. This command is the host for it: it
keeps the module HOSTED with signed heartbeats (with the GPU's readings when it knows
the GPU), starts the test (signed), shows each cycle, and on confirmation writes the
gains with ``pid_gains`` and ``config_save`` (signed). The module aborts the test on
any safety cause, host loss or a temperature past its limit; Ctrl-C aborts it too.

    modbridge tune --port /dev/ttyUSB0          a module on a port
    modbridge tune --module 3a0041000c51...     a module by its id (auto-discovered)
    modbridge tune --sim --world h200_2u --yes  a virtual module, 20x real time
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import click

from modbridge.errors import ModbridgeError
from modbridge.ops.control import find_port as _find_port  # shared with `modbridge set`
from protocol import catalog as C

SIM_SPEED = 20.0  # the virtual module's pace: heartbeats every 0.1 s keep it HOSTED
SIM_SETTLE_S = 180.0  # world seconds of regulation at a steady load before the test
SIM_LOAD_FRACTION = 0.93  # steady GPU demand: this share of the world's default limit
UP_TIMEOUT_S = 10.0
HOSTED_TIMEOUT_S = 15.0
_ACTION_START = C.TUNE_ACTIONS.index("start")
_ACTION_ABORT = C.TUNE_ACTIONS.index("abort")
_DUTY_FULL = 65535


class TuneError(ModbridgeError):
    """The test could not be run or did not produce gains; the message says why.
    ``result``: the :class:`TuneResult` so far, when the test ran."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


@dataclass
class TuneResult:
    """What a test gave, in units a person reads (wire gains in ``gains_wire``)."""

    status: str
    module_id: str | None
    port: str
    cycles: int = 0
    elapsed_s: int = 0
    bias_pct: float = 0.0
    relay_pct: float = 0.0
    ku_pct_per_c: float | None = None
    pu_s: float | None = None
    amplitude_c: float | None = None
    causes: int = 0
    gains_wire: dict | None = None  # kp/ki/kd in milli-units, as pid_gains takes them
    current_wire: dict | None = None  # the module's gains before
    written: bool = False
    progress: list = field(default_factory=list)  # one dict per report

    @property
    def done(self) -> bool:
        return self.status == "done"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["gains"] = _display(self.gains_wire)
        d["current"] = _display(self.current_wire)
        d["ti_s"] = _ti_s(self.gains_wire)
        return d


def _display(wire: dict | None) -> dict | None:
    if wire is None:
        return None
    return {k: wire[k] / 1000.0 for k in ("kp", "ki", "kd") if k in wire}


def _ti_s(wire: dict | None) -> float | None:
    if not wire or not wire.get("ki"):
        return None
    return wire["kp"] / wire["ki"]


def _pct(duty: int) -> float:
    return round(duty * 100.0 / _DUTY_FULL, 1)


def _cause_names(mask: int) -> str:
    from device import safety as S

    names = (
        (S.CAUSE_BOOT, "boot"),
        (S.CAUSE_HOST_LOST, "host lost"),
        (S.CAUSE_SENSOR, "sensor fault"),
        (S.CAUSE_STALL, "fan stall"),
        (S.CAUSE_OVER, "over-temperature"),
        (S.CAUSE_CRIT, "critical temperature"),
    )
    return ", ".join(n for bit, n in names if mask & bit) or f"0x{mask:x}"


def _why(status: str, result: TuneResult) -> str:
    return {
        "aborted": "aborted",
        "safety": f"aborted by a safety cause: {_cause_names(result.causes)}",
        "not_hosted": "aborted: the module left HOSTED/automatic control",
        "too_hot": "aborted: the temperature rose past the limit (--max-rise)",
        "timeout": (
            "timed out"
            + (
                ": the relay never crossed the setpoint; start from steady regulation "
                "near the setpoint, or raise --amplitude"
                if result.cycles == 0
                else ""
            )
        ),
        "floor": "aborted: a safety floor kept the relay's low level from the fans",
        "inconsistent": (
            "the cycles did not agree (noise or a changing load): run it again at a "
            "steady load, or raise --hysteresis"
        ),
    }.get(status, status)


def link_class():
    """ModuleLink with a queue of the ``autotune_report`` messages it receives."""
    from modbridge.link.session import ModuleLink

    class TuneLink(ModuleLink):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.reports: queue.Queue = queue.Queue()

        def _dispatch(self, item, now):
            if getattr(item, "ok", False) and item.name == "autotune_report":
                self.reports.put(dict(item.fields))
            super()._dispatch(item, now)

    return TuneLink


def current_gains(link) -> dict | None:
    """The module's kp/ki/kd (wire milli-units), or None if it does not say."""
    from modbridge.link.session import LinkError

    try:
        msg = link.request("config_get", {"section": "pid"})
    except LinkError:
        return None
    values = msg.fields.get("values", {}) if msg.name == "config" else {}
    out = {}
    for k in ("kp", "ki", "kd"):
        v = values.get("pid." + k, values.get(k))
        if isinstance(v, int):
            out[k] = v
    return out or None


def run_test(link, params: dict, wall_timeout_s: float, on_report=None, stop=None) -> TuneResult:
    """Start the test on ``link`` (a link from :func:`link_class`, up and HOSTED) and
    wait for its end. ``params``: the ``autotune`` fields besides ``action``.
    ``on_report(fields)`` for each report. On ``stop`` (an Event) or the wall timeout
    the test is aborted. Raises :class:`TuneError` if the module refuses to start."""
    from modbridge.link.session import CommandRefused, LinkError

    while not link.reports.empty():  # an earlier test's leftovers
        link.reports.get_nowait()
    fields = {"action": _ACTION_START}
    fields.update(params)
    try:
        ack = link.request("autotune", fields)
    except CommandRefused as e:
        if e.code == C.ERR_UNKNOWN_TYPE:
            raise TuneError(
                f"{link.port}: this firmware has no autotune (protocol additions of "
                "docs/autotune.md): reflash the module"
            ) from None
        raise TuneError(str(e)) from None
    except LinkError as e:
        raise TuneError(str(e)) from None
    ref = ack.fields.get("ref")
    res = TuneResult(status="running", module_id=link.status.module_id, port=link.port)
    deadline = time.monotonic() + wall_timeout_s
    try:
        while True:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            if time.monotonic() > deadline:
                raise TuneError(f"{link.port}: no result within {wall_timeout_s:.0f} s")
            try:
                rep = link.reports.get(timeout=0.2)
            except queue.Empty:
                if not link.link_up:
                    raise TuneError(f"{link.port}: link lost during the test") from None
                continue
            if ref is not None and rep.get("ref") != ref:
                continue
            _update(res, rep)
            if on_report is not None:
                on_report(res, rep)
            if res.status != "running":
                return res
    except BaseException:
        try:
            link.request("autotune", {"action": _ACTION_ABORT})
        except LinkError:
            pass
        raise


def _update(res: TuneResult, rep: dict) -> None:
    st = rep.get("status", 0)
    res.status = C.TUNE_STATUS[st] if 0 <= st < len(C.TUNE_STATUS) else str(st)
    res.cycles = rep.get("cycles", res.cycles)
    res.elapsed_s = rep.get("elapsed_s", res.elapsed_s)
    res.bias_pct = _pct(rep.get("bias", 0))
    res.relay_pct = _pct(rep.get("relay", 0))
    res.causes = rep.get("causes", 0)
    res.progress.append(dict(rep))
    if "ku" in rep:
        res.ku_pct_per_c = rep["ku"] / 1000.0
        res.pu_s = rep["pu_ms"] / 1000.0
        res.amplitude_c = rep.get("amplitude", 0) / 1000.0
        res.gains_wire = {"kp": rep["kp"], "ki": rep["ki"], "kd": rep["kd"]}


def write_gains(link, gains_wire: dict) -> None:
    """Write kp/ki/kd (signed ``pid_gains``) and persist them (``config_save``)."""
    link.request("pid_gains", dict(gains_wire))
    link.request("config_save")


def wait_hosted(link, timeout_s: float) -> dict:
    """Wait for telemetry that says HOSTED; returns it. TuneError otherwise."""
    deadline = time.monotonic() + timeout_s
    tel = None
    while time.monotonic() < deadline:
        tel = link.status.telemetry
        if tel and tel.get("state") == C.STATE_HOSTED:
            return tel
        time.sleep(0.05)
    state = C.STATES[tel["state"]] if tel and "state" in tel else "no telemetry"
    raise TuneError(
        f"{link.port}: the module is not HOSTED ({state}): it needs this host's signed "
        "heartbeats, auto mode and no fault to run the test"
    )


# --------------------------------------------------------------------------- targets


class _SimTarget:
    """A virtual module at a steady load (its world's GPU), and the GPU's heartbeats."""

    def __init__(self, world: str, load_w: float | None, speed: float, seed: int):
        from modbridge.gpu.virtual import VirtualBackend
        from modbridge.sim import params as sim_params
        from modbridge.sim.fleet import SimFleet
        from modbridge.sim.profiles import Profile

        p = sim_params.load(world)
        watts = load_w if load_w is not None else SIM_LOAD_FRACTION * p["gpu"]["default_limit_w"]
        self.load_w = watts
        profile = Profile.parse(f"hold {watts:g}W 24h\n", name=f"hold {watts:g} W")
        self.fleet = SimFleet(1, world=world, profile=profile, speed=speed, seed=seed)
        self.speed = speed
        self.backend = VirtualBackend(self.fleet.gpus)
        self.uuid = self.fleet.gpus[0].uuid
        self.port = self.fleet.ports[0]
        self.keys = self.fleet.keys
        self.fleet.start()

    @property
    def vm(self):
        return self.fleet.modules[0]

    def relax_host_timeout(self, link) -> None:
        """Give the virtual module the longest host timeout (30 s of world time): the
        heartbeats are paced in wall time, and a busy machine can hold this process's
        threads for longer than 5 s of a world running 20x faster. RAM only."""
        link.request("config_set", {"values": {"control.host_timeout_ms": 30000}})

    def world_s(self) -> float:
        return self.vm.world.now_ms / 1000.0

    def heartbeat(self):
        from modbridge.bridge import heartbeat_fields

        return heartbeat_fields(self.backend.sample(self.uuid))

    def close(self):
        self.fleet.stop()


class _GpuFeed:
    """Cached GPU readings for the heartbeats (the link's thread must not block on
    NVML or nvidia-smi): a thread refreshes them every second."""

    def __init__(self, backend, uuid: str):
        self.backend, self.uuid = backend, uuid
        self._sample = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tune-gpu", daemon=True)
        self._thread.start()

    def _run(self):
        from modbridge.gpu.base import GpuError

        while not self._stop.is_set():
            try:
                self._sample = self.backend.sample(self.uuid)
            except GpuError:
                self._sample = None
            self._stop.wait(1.0)

    def heartbeat(self):
        from modbridge.bridge import heartbeat_fields

        return heartbeat_fields(self._sample)

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)


# ------------------------------------------------------------------------- command


def _params(amplitude, hysteresis, max_rise, timeout, cycles) -> dict:
    return {
        "amplitude": int(round(amplitude * _DUTY_FULL / 100.0)),
        "hysteresis": int(round(hysteresis * 1000)),
        "max_rise": int(round(max_rise * 1000)),
        "timeout_s": int(timeout),
        "cycles": int(cycles),
    }


def _check_params(p: dict) -> None:
    mdef = C.by_name("autotune")
    for f in mdef[C.M_FIELDS]:
        name = f[C.F_NAME]
        if name in p and not f[C.F_LO] <= p[name] <= f[C.F_HI]:
            lo, hi = f[C.F_LO], f[C.F_HI]
            if name == "amplitude":
                lo, hi = _pct(lo), _pct(hi)
                unit = " % duty"
            elif name in ("hysteresis", "max_rise"):
                lo, hi = lo / 1000, hi / 1000
                unit = " degC"
            else:
                unit = ""
            opt = "--" + name.replace("_", "-").replace("timeout-s", "timeout")
            raise click.UsageError(f"{opt} must be within {lo:g}..{hi:g}{unit}")


def _echo_report(as_json: bool):
    def show(res: TuneResult, rep: dict) -> None:
        if as_json:
            return
        if res.status == "running" and rep.get("cycles", 0) == 0:
            click.echo(
                f"relay {res.bias_pct:.1f} % +- {res.relay_pct:.1f} % duty around the "
                "setpoint; measuring cycles"
            )
        elif res.status == "running" or "period_ms" in rep:
            amp = rep.get("amplitude", 0)
            amp_txt = f"{amp / 1000:.2f} degC" if amp else "too small or clipped: not counted"
            click.echo(
                f"cycle {rep.get('cycles', 0)}: period {rep.get('period_ms', 0) / 1000:.1f} s, "
                f"amplitude {amp_txt} ({rep.get('elapsed_s', 0)} s)"
            )

    return show


def _summary(res: TuneResult) -> list[str]:
    lines = [
        f"done in {res.elapsed_s} s ({res.cycles} cycles): Ku {res.ku_pct_per_c:.3f} %/degC, "
        f"Pu {res.pu_s:.1f} s, amplitude {res.amplitude_c:.2f} degC"
    ]
    g = _display(res.gains_wire)
    ti = _ti_s(res.gains_wire)
    ti_txt = f" (Ti {ti:.1f} s)" if ti else ""
    lines.append(
        f"proposed (Tyreus-Luyben PI): kp {g['kp']:.3f} %/degC, ki {g['ki']:.3f} "
        f"%/(degC s){ti_txt}, kd {g['kd']:.3f} %s/degC"
    )
    cur = _display(res.current_wire)
    if cur:
        lines.append(
            "current: " + ", ".join(f"{k} {cur[k]:.3f}" for k in ("kp", "ki", "kd") if k in cur)
        )
    return lines


def register(group) -> None:
    group.add_command(tune_cmd)


@click.command("tune")
@click.option("--module", "module_id", default=None, help="Module id (its hello's uid).")
@click.option("--port", default=None, help="Serial port of the module.")
@click.option("--sim", is_flag=True, help="A virtual module (the real firmware in MicroPython).")
@click.option(
    "--world",
    default="default",
    show_default=True,
    help="--sim: built-in world name or .toml path.",
)
@click.option(
    "--load",
    "load_w",
    type=float,
    default=None,
    help="--sim: steady GPU demand in W (default 93 % of the world's limit).",
)
@click.option(
    "--settle",
    type=float,
    default=None,
    help="Seconds of regulation before the test (default: 180 with --sim, else 0).",
)
@click.option(
    "--speed", type=float, default=SIM_SPEED, show_default=True, help="--sim: times real time."
)
@click.option(
    "--amplitude", type=float, default=20.0, show_default=True, help="Relay half-amplitude, % duty."
)
@click.option(
    "--hysteresis", type=float, default=0.3, show_default=True, help="Relay hysteresis, degC."
)
@click.option(
    "--max-rise",
    type=float,
    default=8.0,
    show_default=True,
    help="Abort this many degC above the setpoint.",
)
@click.option("--cycles", type=int, default=3, show_default=True, help="Agreeing cycles needed.")
@click.option(
    "--timeout",
    type=int,
    default=1800,
    show_default=True,
    help="Abort after this many (module) seconds.",
)
@click.option(
    "--gpu",
    "gpu_id",
    default=None,
    help="GPU UUID or index whose readings go in the heartbeats (not --sim).",
)
@click.option("--yes", is_flag=True, help="Write the gains without asking.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the result.")
@click.option(
    "--keys-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Signing keys directory (default as for `modbridge run`).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Bridge config (keys_dir, and the GPU mapped to the module).",
)
def tune_cmd(
    module_id,
    port,
    sim,
    world,
    load_w,
    settle,
    speed,
    amplitude,
    hysteresis,
    max_rise,
    cycles,
    timeout,
    gpu_id,
    yes,
    as_json,
    keys_dir,
    config_path,
) -> None:
    """Relay autotune of a module's PID (docs/autotune.md): measure, show, write.

    Exit 0: gains proposed (written, or declined); 1: the test failed or was
    aborted; 2: usage."""
    if sum(bool(x) for x in (module_id, port, sim)) != 1:
        raise click.UsageError("give exactly one of --module, --port, --sim")
    params = _params(amplitude, hysteresis, max_rise, timeout, cycles)
    _check_params(params)
    target = None
    feed = None
    link = None
    stop = threading.Event()
    try:
        try:
            if sim:
                if speed <= 0:
                    raise click.UsageError("--speed must be > 0 (heartbeats keep wall time)")
                target = _SimTarget(world, load_w, speed, seed=0)
                store, the_port, source = target.keys, target.port, target.heartbeat
                hb_period = min(1.0, max(0.02, 0.5 / speed))  # two per world second
                settle_s = SIM_SETTLE_S if settle is None else settle
                pace = speed
            else:
                from modbridge.cli.main import _key_store

                store = _key_store(keys_dir, config_path)
                the_port = port or _find_port(module_id, [], store, 3.0)
                feed = _gpu_feed(gpu_id, config_path, module_id)
                source = feed.heartbeat if feed is not None else (lambda: None)
                hb_period = 1.0
                settle_s = 0.0 if settle is None else settle
                pace = 1.0
        except (ModbridgeError, OSError, ValueError) as e:
            raise TuneError(str(e)) from None
        link = link_class()(
            the_port, keys=store, heartbeat_period_s=hb_period, heartbeat_source=source
        )
        link.start()
        if not link.wait_up(UP_TIMEOUT_S):
            raise TuneError(f"{the_port}: no module: {link.status.last_error or 'no hello'}")
        tel = wait_hosted(link, HOSTED_TIMEOUT_S)
        if target is not None:
            target.relax_host_timeout(link)
        uid = link.status.module_id
        if not as_json:
            click.echo(
                f"module {uid} on {the_port}: HOSTED, fans {_pct(tel.get('fan1_duty', 0))} %, "
                f"GPU NTC {tel.get('temp_gpu', 0) / 1000:.1f} degC"
                + (f" (virtual, {target.load_w:g} W steady load)" if target else "")
            )
        if settle_s > 0:
            if not as_json:
                click.echo(f"regulating {settle_s:g} s before the test")
            _settle(target, settle_s, pace, stop)
            wait_hosted(link, HOSTED_TIMEOUT_S)
        wall = params["timeout_s"] / pace + 30.0
        res = run_test(link, params, wall, on_report=_echo_report(as_json), stop=stop)
        res.current_wire = current_gains(link)
        if not res.done:
            raise TuneError(f"autotune {res.status}: {_why(res.status, res)}", result=res)
        if not as_json:
            for line in _summary(res):
                click.echo(line)
        ask = "write these gains to the module (and its flash)?"
        if yes or (not as_json and click.confirm(ask)):
            write_gains(link, res.gains_wire)
            res.written = True
            if not as_json:
                click.echo("written and saved")
        if as_json:
            click.echo(json.dumps(res.as_dict(), indent=2))
    except TuneError as e:
        res = getattr(e, "result", None)
        if as_json and res is not None:
            click.echo(json.dumps(res.as_dict(), indent=2))
        click.echo(f"modbridge tune: {e}", err=True)
        sys.exit(1)
    except ModbridgeError as e:
        click.echo(f"modbridge tune: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("modbridge tune: interrupted; the test was aborted", err=True)
        sys.exit(1)
    finally:
        if link is not None:
            link.stop()
        if feed is not None:
            feed.close()
        if target is not None:
            target.close()


def _settle(target, seconds: float, pace: float, stop=None) -> None:
    """Wait ``seconds`` of the module's time (the world's with ``target``)."""
    stop = stop if stop is not None else threading.Event()
    if target is not None:  # world time
        end = target.world_s() + seconds
        deadline = time.monotonic() + seconds / pace + 30.0
        while target.world_s() < end and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
    else:
        stop.wait(seconds)


def _gpu_feed(gpu_id, config_path, module_id):
    """Heartbeat GPU readings: ``--gpu``, else the GPU the config maps to the module."""
    from modbridge import config as cfgmod
    from modbridge.gpu.select import open_backend

    if gpu_id is None and module_id is not None:
        try:
            cfg = cfgmod.load_given_or_default(config_path)
        except cfgmod.ConfigFileError:
            cfg = None
        for m in getattr(cfg, "modules", None) or ():
            if m.module_id == module_id and m.gpu:
                gpu_id = m.gpu
    if gpu_id is None:
        click.echo(
            "note: no GPU given (--gpu): heartbeats carry no GPU readings, so the test runs "
            "without feed-forward or the GPU's slowdown limit",
            err=True,
        )
        return None
    backend = open_backend("auto")
    infos = backend.devices()
    for i, info in enumerate(infos):
        if gpu_id in (info.uuid, str(i)):
            return _GpuFeed(backend, info.uuid)
    raise TuneError(f"no GPU {gpu_id} (GPUs: {', '.join(i.uuid for i in infos) or 'none'})")
