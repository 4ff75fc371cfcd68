"""`modbridge list/status/run/monitor/restore/config`: the bridge commands (docs/bridge.md).

Thin: parse options, call :mod:`modbridge.bridge` / :mod:`modbridge.cli.monitor`, format.
Exit codes: 0 ok, 1 runtime error, 2 usage or config error, 3 no module / no GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import click

import modbridge
from modbridge.errors import ModbridgeError

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3
#: examples/ of the checkout, or its copy in the wheel (modbridge/_fw/examples/).
EXAMPLE_CONFIG = Path(modbridge.FIRMWARE_ROOT) / "examples" / "modbridge.toml"
READY_TIMEOUT_S = 10.0  # status/--once: how long to wait for every module's hello


def _fail(err: Exception | str, code: int | None = None) -> None:
    click.echo(f"modbridge: {err}", err=True)
    sys.exit(code if code is not None else getattr(err, "exit_code", EXIT_RUNTIME))


def _dump(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


# ----------------------------------------------------------------------------- options


def _port_option(f):
    return click.option(
        "--port",
        "ports",
        multiple=True,
        metavar="PATH",
        help="Module serial port (repeatable); CH340 adapters are also found by USB id.",
    )(f)


def _env_path_option(name: str, env: str, help: str, dirs: bool):
    """An option that sets ``$env`` for the whole command (no parameter of its own):
    what a library default reads, so every link or backend the command opens sees it."""

    def to_env(ctx, param, value):
        if value is not None:
            os.environ[env] = value
        return value

    kind = click.Path(file_okay=False) if dirs else click.Path(dir_okay=False)
    return click.option(name, type=kind, default=None, expose_value=False, callback=to_env,
                        help=help)  # fmt: skip


def _backend_option(f):
    f = _env_path_option(
        "--gpu-socket",
        "MODBRIDGE_SIM_GPU_SOCKET",  # modbridge.gpu.remote.ENV: find_socket reads it
        "With --backend sim-remote: the `modbridge sim`'s gpu.sock (default: the one "
        "beside the --port symlink).",
        dirs=False,
    )(f)
    return click.option(
        "--backend",
        type=click.Choice(["auto", "nvml", "nvidia-smi", "sim-remote"]),
        default=None,
        help="GPU backend (default: the config's, else auto: NVML, then nvidia-smi); "
        "sim-remote: the virtual GPUs of a `modbridge sim` (docs/simulator.md).",
    )(f)


def _config_option(f):
    # the process-wide override modbridge.link.keys.default_dir() reads first after an
    # explicit argument, so every link this command opens signs with these keys
    f = _env_path_option(
        "--keys-dir",
        "MODBRIDGE_KEYS_DIR",
        "The modules' signing keys (default: [bridge] keys_dir, the state dir; "
        "docs/pairing.md).",
        dirs=True,
    )(f)
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="Config file (default: /etc/modbridge/modbridge.toml, ~/.config/modbridge.toml).",
    )(f)


def _state_dir_option(f):
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Journal of original power limits and GPU locks (default: [bridge] "
        "state_dir, $STATE_DIRECTORY, /var/lib/modbridge; --sim: a temporary one).",
    )(f)


# ``--sim-speed max`` for the commands that run a bridge: the fastest pace at which its
# heartbeats (every 2 s of world time, at most 10 a second: br.sim_heartbeat_period_s)
# still reach the module within its host timeout (5 s of world time) when the machine
# hiccups: 3 s of world time is 0.3 s of wall time at 10x. At 20x a loaded machine's
# 0.15 s pause let the module time out now and then. A world run flat out (``modbridge
# sim --speed max``) outruns them: the module falls to STANDALONE.
SIM_SPEED_MAX_HOSTED = 10.0


class _SimSpeed(click.ParamType):
    """``--sim-speed``: a number > 0, or ``max`` (also 0): SIM_SPEED_MAX_HOSTED."""

    name = "SPEED"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        from modbridge.cli.sim import _speed

        try:
            v = _speed(str(value))
        except ValueError:
            self.fail(f"a number > 0 or 'max', got {value!r}", param, ctx)
        return SIM_SPEED_MAX_HOSTED if v == 0 else v


SIM_SPEED = _SimSpeed()


def _sim_options(f):
    for opt in reversed(
        [
            click.option("--sim", is_flag=True, help="Virtual modules and GPUs (no hardware)."),
            click.option("--sim-modules", default=1, show_default=True, type=click.IntRange(1, 64),
                         help="Number of virtual modules (module i cools GPU i)."),
            click.option("--sim-world", default="default", show_default=True,
                         help="World file: a built-in name (default, h200_2u) or a path."),
            click.option("--sim-profile", default="demo", show_default=True,
                         help="GPU load profile: a built-in name or a file."),
            click.option("--sim-speed", default="1", show_default=True, type=SIM_SPEED,
                         help="World time per wall-clock second, or 'max' (also 0): the "
                              f"fastest pace the bridge's heartbeats keep up with "
                              f"({SIM_SPEED_MAX_HOSTED:g}x)."),
            click.option("--sim-fault", "sim_faults", multiple=True, metavar="SPEC",
                         help="Scheduled fault, e.g. fan_stall:1@60s-120s (repeatable; "
                              "grammar in docs/simulator.md)."),
        ]
    ):  # fmt: skip
        f = opt(f)
    return f


@dataclasses.dataclass
class _Setup:
    config: object
    backend: object
    ports: list
    fleet: object = None
    state_dir: object = None  # the journal and the GPU locks (docs/bridge.md)


def _load_config(path: str | None):
    from modbridge import config as cfgmod

    try:
        return cfgmod.load_given_or_default(path) or cfgmod.BridgeConfig()
    except cfgmod.ConfigFileError as e:
        for problem in e.problems:
            click.echo(f"{e.path}: {problem}", err=True)
        _fail(f"{e.path}: invalid config ({len(e.problems)} problem(s)); "
              "`modbridge config validate` checks it", EXIT_USAGE)  # fmt: skip


def _open_backend(kind: str, sim_gpus=None, ports=()):
    """The GPU backend ``kind`` (exit 3 naming why when there is none); ``ports``: the
    ports as given, beside which a ``modbridge sim`` serves its GPUs (sim-remote)."""
    from modbridge.gpu import select
    from modbridge.gpu.base import GpuError
    from modbridge.gpu.remote import find_socket

    sock = find_socket(ports)
    try:
        return select.open_backend(kind, sim_gpus=sim_gpus, sim_socket=sock)
    except GpuError as e:
        if kind != "sim-remote" and sock is not None and sock.exists():
            e = f"{e} (the port is a `modbridge sim`'s: add --backend sim-remote)"
        _fail(e, EXIT_NOT_FOUND)


def _module_ports(given, cfg) -> list[str]:
    from modbridge.link.discovery import find_modules

    found = find_modules(list(given) + cfg.ports())
    if not found:
        from modbridge.bridge import NoModuleFound

        _fail(NoModuleFound(
            "no module found: plug one in (CH340 adapters are found by USB id), "
            "give --port PATH, or try --sim"
        ))  # fmt: skip
    return [p.device for p in found]


@contextlib.contextmanager
def _setup(config_path, ports, backend, sim, sim_modules, sim_world, sim_profile, sim_speed,
           sim_faults=(), state_dir=None):  # fmt: skip
    """The config, the GPU backend and the module ports: real, or a started SimFleet;
    and the state directory (given, the config's, the default; --sim: the fleet's)."""
    from modbridge import bridge as br
    from modbridge.actuator.journal import default_state_dir

    cfg = _load_config(config_path)
    if sim_faults and not sim:
        _fail("--sim-fault needs --sim", EXIT_USAGE)
    if sim:
        if ports or backend:
            _fail("--sim brings its own modules and GPUs: drop --port/--backend", EXIT_USAGE)
        from modbridge.sim.faults import FaultSpecError, parse_faults

        try:
            faults = parse_faults(sim_faults)
        except FaultSpecError as e:
            _fail(e, EXIT_USAGE)
        try:
            fleet, mappings = br.open_sim(
                sim_modules, sim_world, sim_profile, sim_speed, faults=faults
            )
        except ValueError as e:  # an unknown world or profile, a bad file: usage
            _fail(f"cannot start the simulator: {e}", EXIT_USAGE)
        except (ModbridgeError, OSError) as e:
            _fail(f"cannot start the simulator: {e}", EXIT_RUNTIME)
        try:
            cfg.modules = mappings
            cfg.backend = "sim"
            cfg.heartbeat_period_s = br.sim_heartbeat_period_s(cfg.heartbeat_period_s, sim_speed)
            gpu_backend = _open_backend("sim", sim_gpus=fleet.gpus)
            where = state_dir or cfg.state_dir or (fleet.state_dir / "bridge")
            yield _Setup(cfg, gpu_backend, fleet.ports, fleet, where)
        finally:
            fleet.stop()
        return
    kind = backend or cfg.backend
    if kind == "sim":
        _fail('backend "sim" needs --sim', EXIT_USAGE)
    given = list(ports) + cfg.ports()
    gpu_backend = _open_backend(kind, ports=given)
    try:
        where = state_dir or default_state_dir(cfg)
        if kind == "sim-remote":  # a `modbridge sim` elsewhere: its pairs, its pace
            where = state_dir or cfg.state_dir or (gpu_backend.path.parent / "bridge")
            if not cfg.modules:
                from modbridge.config import ModuleMapping

                cfg.modules = [ModuleMapping(module_id=m["module_id"], gpu=m["gpu"],
                                             port=m["port"])
                               for m in gpu_backend.mappings(given)]  # fmt: skip
            cfg.heartbeat_period_s = br.sim_heartbeat_period_s(cfg.heartbeat_period_s,
                                                               gpu_backend.speed)  # fmt: skip
            if gpu_backend.keys_dir:  # its modules' keys: looked up there too
                from modbridge.link.keys import attach_dir

                attach_dir(gpu_backend.keys_dir)
        yield _Setup(cfg, gpu_backend, _module_ports(ports, cfg), None, where)
    finally:
        gpu_backend.close()


# ----------------------------------------------------------------------------- list


@click.command("list")
@_port_option
@_backend_option
@_config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object: modules and gpus.")
@click.option("--timeout", default=3.0, show_default=True, help="Seconds to wait for hellos.")
def list_cmd(ports, backend, config_path, as_json, timeout):
    """Modules found (with their hello) and GPUs visible. Exit 3 if either is none."""
    from modbridge import bridge as br
    from modbridge.gpu import select
    from modbridge.gpu.base import GpuError
    from modbridge.link.discovery import find_modules

    cfg = _load_config(config_path)
    modules = br.probe_modules(find_modules(list(ports) + cfg.ports()), timeout=timeout)
    gpus, gpu_error = [], None
    from modbridge.gpu.remote import find_socket

    try:
        gb = select.open_backend(backend or cfg.backend,
                                 sim_socket=find_socket(list(ports) + cfg.ports()))  # fmt: skip
    except GpuError as e:
        gpu_error = str(e)
    else:
        try:
            gpus = br.gpu_infos(gb)
        finally:
            gb.close()
    out = {"modules": modules, "gpus": gpus, "gpu_error": gpu_error}
    if as_json:
        _dump(out)
    else:
        click.echo(
            "modules:" if modules else "modules: none (give --port PATH; see docs/bridge.md)"
        )
        from modbridge.sanitize import sanitize

        for m in modules:
            # wire strings (id, firmware, board, errors quoting them) never reach the
            # terminal raw
            what = (
                f"module {sanitize(m['module_id'])}  fw {sanitize(m['fw_version'])}  "
                f"board {sanitize(m['board'])}  protocol {sanitize(m['protocol'])}"
                if m["link_up"]
                else f"no module: {sanitize(m.get('error'))}"
            )
            click.echo(f"  {m['device']}  {what}")
        click.echo("gpus:" if gpus else f"gpus: none ({gpu_error or 'no GPU visible'})")
        for g in gpus:
            click.echo(f"  [{g['index']}] {g['uuid']}  {g['name']}  {g['pci_bus_id']}")
    if not any(m["link_up"] for m in modules) or not gpus:
        sys.exit(EXIT_NOT_FOUND)


# ----------------------------------------------------------------------------- status


@click.command("status")
@_state_dir_option
@_port_option
@_backend_option
@_config_option
@_sim_options
@click.option("--module", "module_id", default=None, help="Only this module (id from `list`).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: modules and gpus.")
@click.option("--timeout", default=READY_TIMEOUT_S, show_default=True,
              help="Seconds to wait for every module's first telemetry.")  # fmt: skip
@click.option(
    "--direct",
    is_flag=True,
    help="Open the ports even if a running bridge's control socket answers.",
)
@click.option(
    "--control-socket",
    "socket_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The running bridge's control socket (default: the config's "
    "control_socket, $RUNTIME_DIRECTORY, /run/modbridge, the state dir).",
)
def status_cmd(ports, backend, config_path, module_id, as_json, timeout, direct, socket_path,
               **sim):  # fmt: skip
    """One-shot view: each module's telemetry, its GPU, and its policy level.

    While `modbridge run` holds the ports, its last tick through its control socket
    (unless --port, --sim or --direct). Never writes a power limit (the policy runs
    as a dry run). Exit 1 if a module's link did not come up.
    """
    from modbridge import bridge as br
    from modbridge.cli import monitor

    rep = None
    if not (direct or ports or sim["sim"]):
        rep = bridge_report(_load_config(config_path), socket_path,
                            lambda m: click.echo(f"note: {m}", err=True),
                            state_dir=sim.get("state_dir"))  # fmt: skip
    if rep is None:
        rep = one_shot_report(config_path, ports, backend, timeout, **sim)
    if module_id is not None:
        rep["modules"] = [m for m in rep["modules"] if m["module_id"] == module_id]
        if not rep["modules"]:
            _fail(br.UnknownModule(f"no module {module_id}: `modbridge list` shows the modules"))
    if as_json:
        _dump(rep)
    else:
        for line in monitor.table(rep):
            click.echo(line)
    if not all(m["link_up"] for m in rep["modules"]):
        sys.exit(EXIT_RUNTIME)


def one_shot_report(config_path, ports, backend, timeout, **sim) -> dict:
    """``status``'s own look: open the ports (or ``--sim``), wait up to ``timeout``
    for every module, one tick as a dry run, the report."""
    from modbridge import bridge as br

    with _setup(config_path, ports, backend, **sim) as s:
        s.config.dry_run = True  # status only looks
        b = _start_bridge(s)
        try:
            if b.wait_ready(timeout) and s.fleet is not None:
                wait_settled(b, timeout)
            return br.report(b.tick())
        finally:
            b.stop("status")


def bridge_report(config, socket_path=None, note=None, state_dir=None) -> dict | None:
    """The running bridge's ``status --json`` document over its control socket
    (:func:`modbridge.ops.ctlsock.client_paths`: ``socket_path``, else the default
    places), or None when no bridge answers (a stale socket is a ``note``). A bridge
    that refuses this user is an error (exit 1): its ports are not ours to open."""
    from modbridge.ops import ctlsock

    for path in ctlsock.client_paths(config, socket_path, state_dir=state_dir):
        try:
            reply = ctlsock.Client(path).call({"op": "report"})
        except ctlsock.SocketRefused as e:
            _fail(e, EXIT_RUNTIME)
        except ctlsock.SocketError as e:
            if note is not None:
                note(f"{e}" if isinstance(e, ctlsock.StaleSocket) else
                     f"{path}: {e}; opening the ports directly")  # fmt: skip
            continue
        if reply.get("ok") and isinstance(reply.get("report"), dict):
            return reply["report"]
        if note is not None:  # an older bridge without the report op
            note(f"{path}: the bridge cannot report ({reply.get('message')}); "
                 "opening the ports directly")  # fmt: skip
    return None


def _settled(link) -> bool:
    """Out of BOOT with a fan turning: what a module that has been running looks like."""
    st = link.status
    return st.state not in (None, "BOOT") and any(
        (st.fan_rpm(i) or 0) > 0 for i in range(1, (st.fans or 2) + 1)
    )


def wait_settled(b, timeout: float, step: float = 0.05) -> bool:
    """Wait (at most ``timeout`` s) until every module has left BOOT with its fans
    turning. A virtual module has only just powered on when ``status --sim`` or ``run
    --sim --once`` looks: without this they always showed BOOT at 0 RPM."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_settled(link) for link in b.links.values()):
            return True
        time.sleep(step)
    return all(_settled(link) for link in b.links.values())


def _start_bridge(s: _Setup, event_log=None):
    from modbridge.bridge import Bridge
    from modbridge.link.session import LinkError

    b = Bridge(s.config, s.backend, s.ports, event_log=event_log, state_dir=s.state_dir)
    try:
        return b.start()
    except LinkError as e:
        b.stop("start failed")
        _fail(e, EXIT_RUNTIME)
    except ModbridgeError as e:  # another bridge owns a GPU (GpuBusy), no state dir
        b.stop("start failed")
        _fail(e, EXIT_RUNTIME)


# ----------------------------------------------------------------------------- run


@click.command("run")
@_state_dir_option
@_config_option
@_port_option
@_sim_options
@_backend_option
@click.option(
    "--dry-run", is_flag=True, default=None, help="Decide and log, never write a power limit."
)
@click.option("--metrics-address", default=None, help="Exporter address (default 127.0.0.1).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Exporter port (default 9659; 0: any free port).",
)
@click.option("--no-metrics", is_flag=True, help="No Prometheus endpoint.")
@click.option(
    "--event-log",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append JSON-lines events here (decisions, limit writes, links).",
)
@click.option("--once", is_flag=True, help="One tick once every module is up, print, exit.")
@click.option(
    "--status-every",
    default=10.0,
    show_default=True,
    type=float,
    help="Seconds between status lines on stderr (0: none).",
)
@click.option("--live", is_flag=True, help="A live view on stdout instead of status lines.")
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=None,
              help="Stop (restoring limits) after this many wall-clock seconds.")
@click.option("--ticks", type=click.IntRange(1), default=None, hidden=True,
              help="Stop after this many ticks (tests, benchmarks).")  # fmt: skip
@click.option("--control-socket", type=click.Path(dir_okay=False), default=None,
              help="Control socket for `modbridge set/config/selftest` (default: "
              "[bridge] control_socket, $RUNTIME_DIRECTORY, the state dir; docs/control.md).")
@click.option("--no-control", is_flag=True, help="No control socket.")
def run_cmd(config_path, ports, backend, dry_run, metrics_address, metrics_port, no_metrics,
            event_log, once, status_every, live, duration, ticks, control_socket, no_control,
            **sim):  # fmt: skip
    """The service: modules + GPUs + policy + power limits + Prometheus exporter.

    SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 or any other signal that would
    end the process: the power limits go back (per on_exit) and the exit code is 0.
    Originals are journaled in --state-dir before every write; a GPU found below its
    journaled original is restored at start.
    """
    from modbridge import bridge as br
    from modbridge import fdlimit
    from modbridge.cli import monitor
    from modbridge.exporter import prometheus as exporter
    from modbridge.exporter.eventlog import EventLog

    # soft RLIMIT_NOFILE up to the hard one, before anything opens a descriptor; the
    # servers size their connection limits from it (docs/bridge.md, "File descriptors")
    fdlimit.raise_nofile()
    with _setup(config_path, ports, backend, **sim) as s:
        cfg = s.config
        if dry_run:
            cfg.dry_run = True
        if no_metrics:
            cfg.exporter_enabled = False
        cfg.exporter_address = metrics_address or cfg.exporter_address
        cfg.exporter_port = cfg.exporter_port if metrics_port is None else metrics_port
        path = event_log or cfg.event_log
        try:
            elog = EventLog(path) if path else None
        except OSError as e:
            _fail(f"cannot open the event log {path}: {e}", EXIT_RUNTIME)
        b = _start_bridge(s, elog)
        from modbridge.ops import ctlsock

        ctlsock.serve_run(b, cfg, s.state_dir, control_socket, not no_control,
                          lambda m: click.echo(m, err=True))  # fmt: skip
        uninstall = b.install_signal_handlers()
        server = None
        ok = False
        try:
            if cfg.exporter_enabled:
                server = exporter.serve(b.snapshot, cfg.exporter_address, cfg.exporter_port)
                click.echo(f"modbridge: metrics on {server.url}", err=True)
            if once and b.wait_ready(READY_TIMEOUT_S) and s.fleet is not None:
                wait_settled(b, READY_TIMEOUT_S)
            if live:  # q stops the service as Ctrl-C does (the limits go back)
                view = monitor.LiveView(title="modbridge run",
                                        on_quit=lambda: b.request_stop("q"))  # fmt: skip
                show = monitor.Throttled(lambda snap: view.draw(br.report(snap)), 1.0)
            else:
                show = monitor.Throttled(
                    lambda snap: click.echo(monitor.status_line(br.report(snap)), err=True),
                    status_every,
                )
            limit = 1 if once else ticks
            deadline = None if duration is None else time.monotonic() + duration

            def until():
                if limit and b.ticks >= limit:
                    return True
                return deadline is not None and time.monotonic() >= deadline

            try:
                b.run(until=until, on_tick=show)
            finally:
                if live:
                    view.close()
            if once:
                for line in monitor.table(br.report(b.snapshot())):
                    click.echo(line)
        except ModbridgeError as e:
            click.echo(f"modbridge: {e}", err=True)
        else:
            ok = True
        finally:
            if server is not None:
                server.stop()
            restored = b.stop()
            uninstall()
            if elog is not None:
                elog.close()
        if b.signal_received is not None:
            click.echo(f"modbridge: stopped by {b.stop_reason}; limits restored", err=True)
    sys.exit(EXIT_OK if ok and restored else EXIT_RUNTIME)


# ----------------------------------------------------------------------------- monitor


@click.command("monitor")
@_state_dir_option
@_port_option
@_backend_option
@_config_option
@_sim_options
@click.option("--interval", default=1.0, show_default=True, help="Seconds between redraws.")
@click.option("--count", type=click.IntRange(1), default=None,
              help="Stop after this many redraws.")  # fmt: skip
def monitor_cmd(ports, backend, config_path, interval, count, **sim):
    """Live view of modules and GPUs: one line per module, the worst first (q or
    Ctrl-C quits). Never writes a power limit.

    Keys (stdin a terminal): 1-9 open a module's details (again: close), up/down and
    Enter the same, Esc closes. When stdout is not a terminal: one plain line per
    module per refresh.
    """
    from modbridge import bridge as br
    from modbridge.cli import monitor

    with _setup(config_path, ports, backend, **sim) as s:
        s.config.dry_run = True  # a view, not the service
        b = _start_bridge(s)
        view = monitor.LiveView(on_quit=lambda: b.request_stop("q"))
        show = monitor.Throttled(lambda snap: view.draw(br.report(snap)), interval)
        try:
            b.run(until=(lambda: view.frames >= count) if count else None, on_tick=show)
        except KeyboardInterrupt:
            pass
        finally:
            view.close()
            b.stop("monitor")


# ----------------------------------------------------------------------------- restore


@click.command("restore")
@_state_dir_option
@_backend_option
@_config_option
@click.option("--dry-run", is_flag=True, help="Say what would be restored, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per journaled GPU.")
def restore_cmd(state_dir, backend, config_path, dry_run, as_json):
    """Put every journaled GPU back to its original power limit and clock lock (an
    unusable clock entry: unlocked), without the loop.

    Exit 0 when every GPU is at its original (or would be, with --dry-run), 1 if a
    restore was refused (or a GPU is owned by a running bridge, missing, or its
    journal entry unusable), 3 without a GPU backend.
    """
    from modbridge.actuator import restore_journaled
    from modbridge.actuator.journal import JournalError, default_state_dir

    cfg = _load_config(config_path)
    kind = backend or cfg.backend
    if kind == "sim":
        _fail('backend "sim" has nothing to restore outside `run --sim`', EXIT_USAGE)
    where = state_dir or default_state_dir(cfg)
    gb = _open_backend(kind)
    try:
        rows = restore_journaled(gb, where, dry_run=dry_run)
    except JournalError as e:
        _fail(e, EXIT_RUNTIME)
    finally:
        gb.close()
    if as_json:
        _dump({"state_dir": str(where), "dry_run": dry_run, "gpus": rows})
    else:
        if not rows:
            click.echo(f"{where}: no journaled GPU (nothing to restore)")
        for r in rows:
            click.echo(f"{r['uuid']}  {r['action']}  {r['message']}")
    if not all(r["ok"] for r in rows):
        sys.exit(EXIT_RUNTIME)


# ----------------------------------------------------------------------------- config


@click.group("config")
def config_group():
    """Check the config file, or print an example."""


@config_group.command("validate")
@click.argument("file", required=False, type=click.Path(dir_okay=False))
def config_validate(file):
    """Check FILE (default: the first of the default paths) and list every problem."""
    from modbridge import config as cfgmod

    path = file or cfgmod.find_default()
    if path is None:
        _fail("no config file: give FILE (defaults: "
              + ", ".join(str(p) for p in cfgmod.DEFAULT_PATHS) + ")", EXIT_USAGE)  # fmt: skip
    try:
        cfg = cfgmod.load(path)
    except cfgmod.ConfigFileError as e:
        for problem in e.problems:
            click.echo(f"{e.path}: {problem}")
        click.echo(f"{e.path}: {len(e.problems)} problem(s)", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(f"{cfg.path}: ok ({len(cfg.modules)} module mapping(s))")


@config_group.command("example")
def config_example():
    """Print an example config file with every key (examples/modbridge.toml)."""
    try:
        text = EXAMPLE_CONFIG.read_text(encoding="utf-8")
    except OSError as e:
        _fail(f"cannot read {EXAMPLE_CONFIG}: {e} (see docs/bridge.md)", EXIT_RUNTIME)
    click.echo(text, nl=False)  # a closed stdout is not a read error (cli.main._Main)


def register(group):
    """Add the bridge commands to the CLI group."""
    for cmd in (list_cmd, status_cmd, run_cmd, monitor_cmd, restore_cmd, config_group):
        group.add_command(cmd)
