"""CLI: ``modbridge set``, ``config get|set|save|reset``, ``selftest``, ``reboot``,
``repl`` (docs/control.md). Thin over :mod:`modbridge.ops.control`: parse, check the
input (exit 2 before anything is sent), call, print the :class:`Outcome`'s lines or
its JSON.

``MODULE`` is a port path, a module id (a unique prefix will do) or a ``[[module]]``
name from the config; with ``--sim`` there is no MODULE (a virtual module for the
command's length). While ``modbridge run`` serves its control socket the commands go
through the bridge; ``--direct`` opens the port instead.

Exit codes: 0 done (ack), 1 refused by the module / failed / self-test failed, 2 bad
input, 3 no such module.
"""

from __future__ import annotations

import json
import sys
import time

import click

from modbridge.cli.bridge import config_group
from modbridge.errors import ModbridgeError
from modbridge.ops import control as ctl
from modbridge.sanitize import sanitize_lines

EXIT_USAGE = 2


def _target_options(f):
    opts = [
        click.option("--sim", is_flag=True,
                     help="A virtual module for this command (no MODULE argument)."),
        click.option("--direct", is_flag=True,
                     help="Open the port even if a bridge's control socket answers."),
        click.option("--control-socket", "socket_path", type=click.Path(dir_okay=False),
                     default=None, help="The bridge's control socket (default: the config's "
                     "control_socket, $RUNTIME_DIRECTORY, /run/modbridge, the state dir)."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help="Config file ([[module]] names, ports, keys_dir)."),
        click.option("--keys-dir", type=click.Path(file_okay=False), default=None,
                     help="Signing keys directory (docs/pairing.md)."),
        click.option("--json", "as_json", is_flag=True, help="One JSON object: the outcome."),
    ]  # fmt: skip
    for opt in reversed(opts):
        f = opt(f)
    return f


def _die(cmd: str, err, code: int | None = None) -> None:
    click.echo(sanitize_lines(f"modbridge {cmd}: {err}"), err=True)  # wire text in errors too
    sys.exit(code if code is not None else getattr(err, "exit_code", 1))


def _config(cmd: str, config_path):
    from modbridge import config as cfgmod

    try:
        return cfgmod.load_given_or_default(config_path) or cfgmod.BridgeConfig()
    except cfgmod.ConfigFileError as e:
        _die(cmd, e, EXIT_USAGE)


def _split(cmd: str, args: tuple, sim: bool) -> tuple[str | None, list[str]]:
    """(MODULE, the rest): with --sim there is no MODULE."""
    args = list(args)
    if sim:
        return None, args
    if not args:
        _die(cmd, "give the MODULE (a port, a module id or a [[module]] name), or --sim",
             EXIT_USAGE)  # fmt: skip
    return args[0], args[1:]


class _Progress:
    """``modbridge CMD: STARTED... N s`` on stderr while a long operation runs: redrawn
    each second on a terminal, a line every 10 s otherwise; ended by :meth:`done`."""

    def __init__(self, cmd: str, started: str):
        import threading

        from modbridge.cli.term import StatusLine

        self.prefix = f"modbridge {cmd}: {started}"
        self.line = StatusLine(sys.stderr)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self.line.show(self.prefix + ("" if self.line.tty else " ..."))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        step = 1.0 if self.line.tty else 10.0
        while not self._stop.wait(step):
            s = time.monotonic() - self._t0
            self.line.show(f"{self.prefix} {s:.0f} s" if self.line.tty
                           else f"modbridge: still running, {s:.0f} s")  # fmt: skip

    def done(self):
        self._stop.set()
        self._thread.join(2.0)
        self.line.done()


def _execute(cmd: str, module, op, *, sim, direct, socket_path, config_path, keys_dir,
             as_json, heartbeats: bool = False, started: str | None = None) -> None:  # fmt: skip
    """Open the target, run ``op(target)``, print, exit with the outcome's code.
    ``started``: what a long ``op`` is doing, shown with the elapsed time meanwhile."""
    from modbridge.cli.main import _key_store

    cfg = _config(cmd, config_path)
    notes: list[str] = []
    target = None
    progress = None
    try:
        store = None if sim else _key_store(keys_dir, config_path)
        target = ctl.open_target(module, sim=sim, direct=direct, config=cfg, keys=store,
                                 socket_path=socket_path, notes=notes,
                                 heartbeats=heartbeats)  # fmt: skip
        for n in notes:
            click.echo(f"note: {n}", err=True)
        if started and not as_json:
            progress = _Progress(cmd, started)
        try:
            out = op(target)
        finally:
            if progress is not None:
                progress.done()
    except KeyboardInterrupt:  # before the module was busy for us: nothing to undo
        _die(cmd, "interrupted", ctl.Interrupted.exit_code)
    except ModbridgeError as e:
        for n in notes if target is None else ():
            click.echo(f"note: {n}", err=True)
        _die(cmd, e)
    finally:
        if target is not None:
            target.close()
    out.notes = notes + out.notes
    if as_json:
        click.echo(json.dumps(out.as_dict(), indent=2, default=str))
    else:
        for line in out.lines():
            click.echo(line)
    sys.exit(out.exit_code)


def _check(cmd: str, fn, *a):
    """Run a parser/validator: InputError exits 2 with its message, nothing sent."""
    try:
        return fn(*a)
    except ctl.InputError as e:
        _die(cmd, e, EXIT_USAGE)


# ----------------------------------------------------------------------------- set


def _parse_set(cmd: str, rest: list[str], hysteresis):
    """``fan1 40%`` ... -> a function of the target."""
    if not rest:
        _die(cmd, "what to set: fan1|fan2|fans PCT, mode auto|manual|curve, setpoint "
             "CHANNEL DEGC, curve DEGC:PCT..., pid kp=..", EXIT_USAGE)  # fmt: skip
    what, args = rest[0].lower(), rest[1:]
    if hysteresis is not None and what != "curve":
        _die(cmd, "--hysteresis goes with `set MODULE curve ...`", EXIT_USAGE)
    if what in ("fan1", "fan2", "fans"):
        duties: dict[int, float] = {}
        items = [what, *args]
        if len(items) % 2:
            _die(cmd, f"{what}: give a duty, e.g. {what} 40%", EXIT_USAGE)
        for name, val in zip(items[::2], items[1::2], strict=True):
            name = name.lower()
            if name not in ("fan1", "fan2", "fans"):
                _die(cmd, f"{name}: expected fan1, fan2 or fans", EXIT_USAGE)
            pct = _check(cmd, ctl.parse_percent, val, name)
            for n in ((1, 2) if name == "fans" else (int(name[-1]),)):
                duties[n] = pct
        _check(cmd, ctl.fan_fields, duties, None)
        return lambda t: ctl.set_fans(t, duties)
    if what == "mode":
        if len(args) != 1 or args[0] not in ctl.FAN_MODES:
            _die(cmd, f"mode: one of {', '.join(ctl.FAN_MODES)}", EXIT_USAGE)
        return lambda t: ctl.set_mode(t, args[0])
    if what == "setpoint":
        if len(args) != 2:
            _die(cmd, "setpoint: CHANNEL DEGC, e.g. setpoint gpu 70", EXIT_USAGE)
        ch = args[0].lower()
        if ch not in ctl.SETPOINT_CHANNELS:
            _die(cmd, f"setpoint: channel one of {', '.join(ctl.SETPOINT_CHANNELS)}, got {ch!r}",
                 EXIT_USAGE)  # fmt: skip
        degc = _check(cmd, ctl.parse_degc, args[1], f"setpoint {ch}")
        _check(cmd, ctl.to_wire, "setpoints", f"sp_{ch}", degc)
        return lambda t: ctl.set_setpoint(t, ch, degc)
    if what == "curve":
        points = _check(cmd, ctl.parse_curve, args)
        _check(cmd, ctl.curve_fields, points, hysteresis)
        return lambda t: ctl.set_curve(t, points, hysteresis)
    if what == "pid":
        gains = _check(cmd, ctl.parse_gains, args)
        for k, v in gains.items():
            _check(cmd, ctl.to_wire, "pid_gains", k, v)
        return lambda t: ctl.set_pid(t, gains)
    _die(cmd, f"{what}: can set fan1, fan2, fans, mode, setpoint, curve, pid", EXIT_USAGE)


@click.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, required=True, metavar="MODULE WHAT VALUE...")
@click.option("--hysteresis", type=float, default=None,
              help="With `curve`: degC a falling temperature must drop before the duty does.")
@_target_options
def set_cmd(args, hysteresis, sim, direct, socket_path, config_path, keys_dir, as_json):
    """Set fan duty, mode, a setpoint, the curve or PID gains of MODULE.

    \b
      modbridge set gpu0 fan1 40%           manual duty (fan2 keeps its duty)
      modbridge set gpu0 fans 60%           both fans
      modbridge set gpu0 mode auto          auto | manual | curve
      modbridge set gpu0 setpoint gpu 70    degC; channels gpu, vram, mos, amb
      modbridge set gpu0 curve 40:30 60:50 80:100 --hysteresis 2
      modbridge set gpu0 pid kp=5 ki=0.2    kp %/degC, ki %/(degC s), kd, kff %/W

    The module's safety floors still apply (docs/safety.md): the answer says when it
    runs a fan above the duty asked."""
    module, rest = _split("set", args, sim)
    op = _parse_set("set", rest, hysteresis)
    manual = rest[0].lower() in ("fan1", "fan2", "fans") or rest[1:2] == ["manual"]
    _execute("set", module, op, sim=sim, direct=direct, socket_path=socket_path,
             config_path=config_path, keys_dir=keys_dir, as_json=as_json,
             heartbeats=manual)  # fmt: skip


# -------------------------------------------------------------------------- config


@config_group.command("get")
@click.argument("args", nargs=-1, metavar="MODULE [SECTION]")
@_target_options
def config_get_cmd(args, sim, direct, socket_path, config_path, keys_dir, as_json):
    """Show MODULE's running config [SECTION], in degC, % and V.

    SECTION: control, gpu, vram, mos, amb, channels, pid, curve, fan1, fan2, fans,
    safety, ina226, watchdog, or one key (gpu.setpoint)."""
    module, rest = _split("config get", args, sim)
    if len(rest) > 1:
        _die("config get", "at most one SECTION", EXIT_USAGE)
    section = rest[0] if rest else None
    _check("config get", ctl.section_names, section)
    _execute("config get", module, lambda t: ctl.config_get(t, section), sim=sim, direct=direct,
             socket_path=socket_path, config_path=config_path, keys_dir=keys_dir,
             as_json=as_json)  # fmt: skip


@config_group.command("set")
@click.argument("args", nargs=-1, required=True, metavar="MODULE KEY=VALUE...")
@_target_options
def config_set_cmd(args, sim, direct, socket_path, config_path, keys_dir, as_json):
    """Change MODULE's running config: KEY=VALUE ... in display units, all or nothing.

    \b
      modbridge config set gpu0 gpu.setpoint=72 pid.kp=4 fan1.min_duty=25%

    In RAM until `modbridge config save MODULE`."""
    module, rest = _split("config set", args, sim)
    for a in rest:
        _check("config set", ctl.parse_assignment, a)
    if not rest:
        _die("config set", "give KEY=VALUE pairs, e.g. gpu.setpoint=72", EXIT_USAGE)
    _execute("config set", module, lambda t: ctl.config_set(t, rest), sim=sim, direct=direct,
             socket_path=socket_path, config_path=config_path, keys_dir=keys_dir,
             as_json=as_json)  # fmt: skip


@config_group.command("save")
@click.argument("args", nargs=-1, metavar="MODULE")
@_target_options
def config_save_cmd(args, sim, direct, socket_path, config_path, keys_dir, as_json):
    """Write MODULE's running config to its flash (nothing written when unchanged)."""
    module, rest = _split("config save", args, sim)
    if rest:
        _die("config save", f"unexpected {' '.join(rest)}", EXIT_USAGE)
    _execute("config save", module, ctl.config_save, sim=sim, direct=direct,
             socket_path=socket_path, config_path=config_path, keys_dir=keys_dir,
             as_json=as_json)  # fmt: skip


@config_group.command("reset")
@click.argument("args", nargs=-1, metavar="MODULE")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_target_options
def config_reset_cmd(args, yes, sim, direct, socket_path, config_path, keys_dir, as_json):
    """Put MODULE back to its factory config (the stored configs are deleted)."""
    module, rest = _split("config reset", args, sim)
    if rest:
        _die("config reset", f"unexpected {' '.join(rest)}", EXIT_USAGE)
    if not yes:
        if as_json or not sys.stdin.isatty():
            _die("config reset", "this deletes the module's stored config: add --yes", EXIT_USAGE)
        click.confirm(f"reset module {module or '(virtual)'} to its factory config and delete "
                      "its stored configs?", abort=True)  # fmt: skip
    _execute("config reset", module, ctl.config_reset, sim=sim, direct=direct,
             socket_path=socket_path, config_path=config_path, keys_dir=keys_dir,
             as_json=as_json)  # fmt: skip


# ------------------------------------------------------------ selftest, reboot, repl


def _simple(name: str, op, doc: str, started: str | None = None):
    @click.command(name)
    @click.argument("args", nargs=-1, metavar="MODULE")
    @_target_options
    def cmd(args, sim, direct, socket_path, config_path, keys_dir, as_json):
        module, rest = _split(name, args, sim)
        if rest:
            _die(name, f"unexpected {' '.join(rest)}", EXIT_USAGE)
        _execute(name, module, op, sim=sim, direct=direct, socket_path=socket_path,
                 config_path=config_path, keys_dir=keys_dir, as_json=as_json,
                 started=started)  # fmt: skip

    cmd.help = doc
    return cmd


selftest_cmd = _simple("selftest", ctl.selftest, """Run MODULE's self-test (30-40 s, at most 75 s):
    fans stepped down with the tach checked, every channel, the 12 V input. Exit 1 when
    it fails. Ctrl-C aborts it (the fans go back to the module's controller), exit 130.""",
    started="self-test running: fans stepped 100 -> 25 %, 30-40 s (at most 75 s)")
reboot_cmd = _simple("reboot", ctl.reboot, "Restart MODULE's firmware.")
repl_cmd = _simple("repl", ctl.repl, """Stop MODULE's firmware and hand its port to the
    MicroPython REPL (for mpremote). Not through the bridge: stop it first.""")


config_group.help = ("The bridge's config file (validate, example) and a module's running "
                     "config (get, set, save, reset: docs/control.md).")


def register(group):
    """Add the control commands to the CLI group (config get/set/save/reset go on the
    existing ``config`` group)."""
    for cmd in (set_cmd, selftest_cmd, reboot_cmd, repl_cmd):
        group.add_command(cmd)
