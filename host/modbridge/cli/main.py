"""Command-line entry point. Thin: parse, dispatch to the library, format."""

from __future__ import annotations

import json
import logging
import os
import sys

import click

from modbridge import __version__
from modbridge.errors import ModbridgeError
from modbridge.sanitize import sanitize_lines


class _Main(click.Group):
    """The top-level group. A reader that goes away (``modbridge status | head -1``) is
    not a failure: click would exit 1 on EPIPE; here the command ends quietly with 0,
    as ``head``'s writer should (every command, one exit code)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # what is still buffered would raise again at exit: send it nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(0)

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except SystemExit as e:
            # EPIPE while parsing (--help): click muted the streams and exits 1
            if e.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
                raise SystemExit(0) from None
            raise


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="modbridge")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Bridge GPU servers and their cooling modules."""
    level = logging.WARNING
    if verbose == 1:
        level = logging.INFO
    elif verbose >= 2:
        level = logging.DEBUG
    from modbridge.cli.term import setup_logging

    setup_logging(level)  # records never break a status or progress line


EXIT_USAGE = 2  # docs/bridge.md "Commands": 0 ok, 1 runtime, 2 usage or config, 3 not found


def _fail(err: Exception, code: int | None = None) -> None:
    click.echo(sanitize_lines(f"modbridge: {err}"), err=True)  # wire text in errors too
    sys.exit(code if code is not None else getattr(err, "exit_code", 1))


HUMAN_LINK_ID = 2  # `frame encode`'s signing link (the bridge signs as 0, the sim as 1)


def keys_dir_option(f):
    """``--keys-dir``: where the modules' signing keys are (docs/pairing.md)."""
    return click.option(
        "--keys-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Signing keys directory (default: $MODBRIDGE_KEYS_DIR, the config's "
        "keys_dir, else ~/.local/state/modbridge/keys).",
    )(f)


def _key_store(keys_dir: str | None, config_path: str | None = None):
    from modbridge import config as cfgmod
    from modbridge.link.keys import KeyStore

    if keys_dir is not None:
        return KeyStore(keys_dir)
    try:
        cfg = cfgmod.load_given_or_default(config_path)
    except cfgmod.ConfigFileError as e:
        _fail(e)
    return KeyStore.for_config(cfg)


@main.command("wire-demo")
@click.option("--seconds", default=10.0, show_default=True, help="How long to stream.",
              type=click.FloatRange(0, min_open=True))  # fmt: skip
@click.option("--period-ms", default=100, show_default=True, help="Telemetry period.",
              type=click.IntRange(1, 60000))  # fmt: skip
@click.option("--json-every", default=10, show_default=True, type=click.IntRange(0),
              help="Also send a JSON line every N (0: never).")  # fmt: skip
@click.option("--noise-every", default=25, show_default=True, type=click.IntRange(0),
              help="Inject line noise every N (0: never).")  # fmt: skip
def wire_demo(seconds: float, period_ms: int, json_every: int, noise_every: int) -> None:
    """Stream telemetry from MicroPython to this process over the real protocol."""
    from modbridge.tools import wiredemo

    try:
        res = wiredemo.run(seconds, period_ms, json_every, noise_every, emit=click.echo)
    except ModbridgeError as e:
        _fail(e)
    for line in wiredemo.summary(res):
        click.echo(line)
    if res.exit_code:
        sys.exit(1)


@main.group()
def frame() -> None:
    """Encode and decode protocol frames by hand (debugging aid)."""


@frame.command("decode")
@click.argument("hexdata", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per item.")
def frame_decode(hexdata: str | None, as_json: bool) -> None:
    """Decode frames from HEXDATA (or raw bytes on stdin) and print them."""
    from protocol.frame import StreamDecoder

    if hexdata is not None:
        try:
            data = bytes.fromhex(hexdata.replace(":", "").replace(" ", ""))
        except ValueError:
            _fail(ModbridgeError("HEXDATA is not hex (pairs of 0-9a-f)"), EXIT_USAGE)
    else:
        data = sys.stdin.buffer.read()
    dec = StreamDecoder()
    items = dec.feed(data)
    if data and data[-1] != 0 and not data.endswith(b"\n"):
        items += dec.feed(b"\x00")  # a lone frame without its delimiter
    for it in items:
        if it.ok:
            obj = {"type": it.name, "seq": it.seq, "format": it.fmt, "fields": it.fields}
        else:
            obj = {"error": it.kind, "detail": it.detail}
        click.echo(json.dumps(obj) if as_json else _describe(obj))
    if dec.error_total():
        sys.exit(2)


def _describe(obj: dict) -> str:
    if "error" in obj:
        return f"rejected ({obj['error']}): {obj['detail']}"
    fields = " ".join(f"{k}={v}" for k, v in obj["fields"].items())
    return f"{obj['type']} seq={obj['seq']} [{obj['format']}] {fields}"


@frame.command("encode")
@click.argument("line")
@click.option("--seq", type=int, default=None, help="Override the sequence number.")
@click.option(
    "--sign-key",
    "key_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Sign with this key file (32 raw bytes, mode 0600).",
)
@click.option(
    "--nonce",
    default=None,
    metavar="HEX",
    help="With --sign-key: the module's nonce (16 hex digits, from its hello).",
)
@click.option(
    "--link",
    "link_id",
    type=click.IntRange(0, 255),
    default=HUMAN_LINK_ID,
    show_default=True,
    help="With --sign-key: the signing link id.",
)
@click.option(
    "--jsonl",
    "as_line",
    is_flag=True,
    help="Print a JSON line (for a terminal) instead of a binary frame in hex.",
)
def frame_encode(line: str, seq: int | None, key_file: str | None, nonce: str | None,
                 link_id: int, as_line: bool) -> None:  # fmt: skip
    """Encode a JSON line (display units) into a binary frame, printed as hex.

    Example: modbridge frame encode '{"type":"fan_mode","mode":"manual","duty1":40}'

    Signed (docs/pairing.md): add --sign-key ~/.local/state/modbridge/keys/<uid>.key
    --nonce <hello nonce>; the timestamp is this host's clock.
    """
    from protocol import frame as fr
    from protocol import jsonl
    from protocol.errors import ProtocolError

    signer = None
    if (key_file is None) != (nonce is None):
        _fail(ModbridgeError("--sign-key and --nonce go together (the nonce is in the "
                             "module's hello)"), EXIT_USAGE)  # fmt: skip
    if key_file is not None:
        signer = _signer(key_file, nonce, link_id)
    try:
        msg = jsonl.decode_line(line)
        s = msg.seq if seq is None else seq
        if as_line:
            click.echo(jsonl.encode_line(msg.type, msg.fields, s, signer=signer).decode(), nl=False)
            return
        data = fr.encode_frame(msg.type, msg.fields, s, signer=signer)
    except ProtocolError as e:
        _fail(ModbridgeError(f"cannot encode: {e}"), EXIT_USAGE)
    click.echo(data.hex())


def _signer(key_file: str, nonce_hex: str, link_id: int):
    from modbridge.link.keys import KeyStoreError, read_key_file
    from protocol.sign import NONCE_LEN, Signer

    try:
        nonce = bytes.fromhex(nonce_hex)
    except ValueError:
        nonce = b""
    if len(nonce) != NONCE_LEN:
        _fail(ModbridgeError(f"--nonce: {NONCE_LEN * 2} hex digits (the module's hello "
                             f"nonce), got {nonce_hex!r}"), EXIT_USAGE)  # fmt: skip
    try:
        key = read_key_file(key_file)
    except KeyStoreError as e:
        _fail(e)
    if key is None:
        _fail(ModbridgeError(f"--sign-key: no such file {key_file}"), EXIT_USAGE)
    signer = Signer(key, link_id=link_id)
    signer.nonce = nonce
    return signer


# ----------------------------------------------------------------------------- pair


@main.command("pair")
@click.argument("port")
@keys_dir_option
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (for its keys_dir).",
)
@click.option(
    "--force", is_flag=True, help="Make a new key even if the store has one for this module."
)
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.1, 120),
    help="Seconds to wait for the module's hello.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was done.")
def pair_cmd(port: str, keys_dir: str | None, config_path: str | None, force: bool,
             timeout: float, as_json: bool) -> None:  # fmt: skip
    """Give the module on PORT a new signing key and keep the host's copy.

    Signed with the key this host has for the module, else unsigned, which a module
    accepts only in its pairing window: the first 60 s after power-on while it has no
    key. The key is stored only once the module acknowledged it. Exit 2: paired
    already (--force replaces the key); 3: no module on PORT.
    """
    from modbridge.link.keys import pair_module
    from modbridge.link.session import LinkError, ModuleLink

    store = _key_store(keys_dir, config_path)
    link = ModuleLink(port, keys=store, heartbeat_period_s=60.0)
    try:
        try:
            link.start()
        except LinkError as e:
            _fail(e)
        if not link.wait_up(timeout):
            why = link.status.last_error or "no hello"
            click.echo(f"modbridge: {port}: no module: {why}", err=True)
            sys.exit(3)
        try:
            res = pair_module(link, store, force=force)
        except ModbridgeError as e:
            _fail(e)
    finally:
        link.stop()
    if as_json:
        click.echo(json.dumps(res.as_dict(), indent=2))
        return
    click.echo(f"paired module {res.module_id} on {res.port}: key {res.key_path} "
               f"(sent {res.signed_with})")  # fmt: skip
    if res.paired is False:
        click.echo("warning: the module's hello still says it is not paired", err=True)


@main.command("flash")
@click.option("--board", required=True, help="Board name (see docs/boards.md).")
@click.option("--port", required=True, help="Serial port of the board's REPL (mpremote syntax).")
@click.option("--dry-run", is_flag=True, help="Stage files and print the commands only.")
@click.option("--no-compile", is_flag=True, help="Copy .py sources instead of mpy-cross .mpy.")
@click.option("--no-reset", is_flag=True, help="Do not reset the board afterwards.")
@click.option(
    "--no-key", is_flag=True, help="Do not provision a signing key (pair later: `modbridge pair`)."
)
@click.option("--method", type=click.Choice(["dfu", "stlink", "openocd", "drive"]),
              help="How an stm32 board's image is written (default: dfu; NUCLEO: stlink).")
@click.option("--drive", help="Mount point of the NUCLEO's ST-LINK drive (--method drive).")
@click.option("--mpy", is_flag=True,
              help="The .mpy deploy (the default for the Pico; refused where it cannot fit).")
@keys_dir_option
def flash_cmd(board: str, port: str, dry_run: bool, no_compile: bool, no_reset: bool,
              no_key: bool, method: str | None, drive: str | None, mpy: bool,
              keys_dir: str | None) -> None:  # fmt: skip
    """Flash a board: the stm32 boards' MicroPython image with the firmware frozen in
    (`make firmware`), the Pico's firmware as .mpy files; then main.py, the default
    config and the key with mpremote.

    Also copies the board's signing key (secret.key): the one this host has for the
    board's unique id, else a new one, kept in the key store (docs/pairing.md).
    """
    from modbridge.tools import flash

    try:
        plan = flash.deploy(
            board,
            port,
            dry_run=dry_run,
            compile=not no_compile,
            reset=not no_reset,
            emit=click.echo,
            keys=None if no_key else _key_store(keys_dir),
            image=False if mpy else None,
            method=method,
            drive=drive,
        )
    except ModbridgeError as e:
        _fail(e)
    for note in plan.notes:
        click.echo(f"note: {note}")
    if dry_run:
        for line in plan.command_lines():
            click.echo(line)
    else:
        what = "the image and main.py" if plan.image_commands else f"{len(plan.files)} files"
        click.echo(f"flashed {what} to {board} on {port}")


def _register_commands() -> None:
    """Commands that live in their own modules register themselves on the group."""
    from modbridge.cli import bridge as cli_bridge
    from modbridge.cli import calibrate as cli_calibrate
    from modbridge.cli import console as cli_console
    from modbridge.cli import control as cli_control
    from modbridge.cli import doctor as cli_doctor
    from modbridge.cli import health as cli_health
    from modbridge.cli import record as cli_record
    from modbridge.cli import sim as cli_sim
    from modbridge.cli import tune as cli_tune

    cli_sim.register(main)
    cli_bridge.register(main)
    cli_tune.register(main)
    cli_control.register(main)
    cli_console.register(main)
    cli_calibrate.register(main)
    cli_doctor.register(main)
    cli_record.register(main)
    cli_health.register(main)


_register_commands()
