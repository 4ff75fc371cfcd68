"""``modbridge console``: a JSON-lines session with one module (docs/console.md).

Thin over :mod:`modbridge.ops.console`: this module finds the module, starts the
link, and runs the prompt (line editing, history in
``~/.local/state/modbridge/console_history``, tab completion of message names) on a
terminal, or reads lines from a pipe and prints the replies.

    modbridge console /dev/ttyACM0
    modbridge console --sim
    echo '{"type":"config_get"}' | modbridge console --sim --quiet-telemetry
"""

from __future__ import annotations

import sys
import threading

import click

from modbridge.cli.main import keys_dir_option
from modbridge.errors import ModbridgeError
from modbridge.ops import console as K
from modbridge.sanitize import sanitize_lines

PROMPT = "> "
_PRINT_EVERY_S = 0.2  # the background printer's look at what the module sent


def register(group) -> None:
    group.add_command(console_cmd)


def _fail(msg: str, code: int) -> None:
    click.echo(sanitize_lines(f"modbridge console: {msg}"), err=True)
    sys.exit(code)


def _resolve(target: str, keys, config_path: str | None) -> str:
    """A port path as given; a module id or a ``[[module]]`` name looked up like
    ``modbridge set`` does (modbridge.ops.control)."""
    try:
        from modbridge.ops.control import find_port, looks_like_port, resolve_name
    except ImportError:  # pragma: no cover - shipped together
        return target
    if looks_like_port(target):
        return target
    from modbridge import config as cfgmod

    try:
        cfg = cfgmod.load_given_or_default(config_path)
    except cfgmod.ConfigFileError as e:
        _fail(str(e), 2)
    mid, port = resolve_name(target, cfg)
    if port is not None:
        return port
    ports = cfg.ports() if cfg is not None else []
    return find_port(mid or target.lower(), ports, keys)


@click.command("console")
@click.argument("target", required=False)
@click.option("--sim", is_flag=True, help="A virtual module (the real firmware in MicroPython).")
@click.option("--sim-speed", type=float, default=1.0, show_default=True,
              help="--sim: times real time.")  # fmt: skip
@click.option("--quiet-telemetry", is_flag=True, help="Hide telemetry (`telemetry` shows it).")
@click.option("--telemetry", "tel_mode", type=click.Choice(["compact", "json", "off"]),
              default="compact", show_default=True,
              help="Telemetry as a compact line with units, as JSON lines, or not.")  # fmt: skip
@click.option("--telemetry-every", type=click.FloatRange(0), default=K.TELEMETRY_EVERY_S,
              show_default=True,
              help="Seconds between telemetry lines (a state change shows at once).")  # fmt: skip
@keys_dir_option
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Bridge config (keys_dir, [[module]] names).")  # fmt: skip
def console_cmd(target, sim, sim_speed, quiet_telemetry, tel_mode, telemetry_every, keys_dir,
                config_path) -> None:  # fmt: skip
    """A JSON-lines session with a module: type messages, see what it answers.

    TARGET is a serial port, a module id (or a unique prefix) or a [[module]] name.
    Lines are JSON objects in display units
    ({"type":"fan_mode","mode":"manual","duty1":40}) or a name with key=value pairs
    (fan_mode mode=manual duty1=40); `help` lists the messages. Commands are signed
    with this host's key for the module; signed heartbeats keep it HOSTED while the
    console runs. Ctrl-C cancels a line, Ctrl-D quits. Reads a pipe too (lines in,
    replies out).

    Exit 0 at the end of input or `quit`; 1 runtime error; 2 usage; 3 no module.
    """
    if bool(target) == bool(sim):
        raise click.UsageError("give the module (a port, a module id or a name) or --sim")
    if sim and sim_speed <= 0:
        raise click.UsageError("--sim-speed must be > 0 (heartbeats keep wall time)")
    if quiet_telemetry:
        tel_mode = "off"
    simmod = None
    link = None
    try:
        try:
            if sim:
                simmod = K.SimModule(speed=sim_speed)
                port, keys = simmod.port, simmod.keys
                source, period = simmod.heartbeat, simmod.heartbeat_period_s
            else:
                from modbridge.cli.main import _key_store

                keys = _key_store(keys_dir, config_path)
                port = _resolve(target, keys, config_path)
                source, period = (lambda: None), K.HEARTBEAT_PERIOD_S
            link = K.open_link(port, keys, heartbeat_source=source, heartbeat_period_s=period)
        except ModbridgeError as e:  # NoModule, TargetNotFound: 3; a busy port: 1
            _fail(str(e), getattr(e, "exit_code", 1))
        con = K.Console(link, telemetry=tel_mode, telemetry_every_s=telemetry_every)
        if sys.stdin.isatty():
            _interactive(con)
        else:
            _piped(con)
    finally:
        if link is not None:
            link.stop()
        if simmod is not None:
            simmod.close()


def _show(items) -> None:
    for s in items:  # errors too: they belong to the session's transcript
        click.echo(str(s))


def _piped(con: K.Console) -> None:
    _show(con.pending())
    for line in sys.stdin:
        res = con.handle(line)
        _show(res.shown)
        if res.quit:
            return
        _show(con.pending())


def _intro(con: K.Console) -> str:
    st = con.link.status
    return (f"module {st.module_id or '?'} on {con.link.port} (firmware {st.fw_version or '?'}, "
            f"board {st.board or '?'}): type `help`; Ctrl-D quits")  # fmt: skip


def _interactive(con: K.Console) -> None:
    try:
        import readline
    except ImportError:  # pragma: no cover - Python without readline
        readline = None
    hist = K.history_path()
    if readline is not None:
        _setup_readline(readline, con, hist)
    lock = threading.Lock()
    stop = threading.Event()

    def printer():  # what the module sends while the person types
        while not stop.wait(_PRINT_EVERY_S):
            items = con.pending()
            if not items:
                continue
            with lock:
                typed = readline.get_line_buffer() if readline is not None else ""
                sys.stdout.write("\r\x1b[K")
                for s in items:
                    sys.stdout.write(str(s) + "\n")
                sys.stdout.write(PROMPT + typed)
                sys.stdout.flush()

    click.echo(_intro(con))
    _show(con.pending())
    t = threading.Thread(target=printer, name="console-printer", daemon=True)
    t.start()
    try:
        while True:
            try:
                line = input(PROMPT)
            except KeyboardInterrupt:  # Ctrl-C: the line is dropped
                click.echo("^C")
                continue
            except EOFError:  # Ctrl-D
                click.echo()
                return
            try:
                with lock:  # the printer waits: the answer comes with the line
                    res = con.handle(line)
                    _show(res.shown)
            except KeyboardInterrupt:
                click.echo("^C")
                continue
            if res.quit:
                return
    finally:
        stop.set()
        t.join(timeout=1.0)
        if readline is not None:
            _save_history(readline, hist)


def _setup_readline(readline, con: K.Console, hist) -> None:
    try:
        readline.read_history_file(str(hist))
    except OSError:
        pass  # no history yet
    readline.set_history_length(1000)
    matches: list[str] = []

    def complete(text, state):
        if state == 0:
            matches[:] = con.complete(text, readline.get_line_buffer()[: readline.get_endidx()])
        return matches[state] if state < len(matches) else None

    readline.set_completer_delims(" \t\n,")
    readline.set_completer(complete)
    doc = getattr(readline, "__doc__", "") or ""
    readline.parse_and_bind("bind ^I rl_complete" if "libedit" in doc else "tab: complete")


def _save_history(readline, hist) -> None:
    try:
        hist.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(str(hist))
    except OSError as e:
        click.echo(f"modbridge console: history not saved: {e}", err=True)
