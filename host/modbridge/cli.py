"""Command-line entry point. Thin: parse, dispatch to the library, format."""

from __future__ import annotations

import json
import logging
import sys

import click

from modbridge import __version__
from modbridge.errors import ModbridgeError


@click.group()
@click.version_option(__version__, prog_name="modbridge")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Bridge GPU servers and their cooling modules."""
    level = logging.WARNING
    if verbose == 1:
        level = logging.INFO
    elif verbose >= 2:
        level = logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _fail(err: Exception) -> None:
    click.echo(f"modbridge: {err}", err=True)
    sys.exit(getattr(err, "exit_code", 1))


@main.command("wire-demo")
@click.option("--seconds", default=10.0, show_default=True, help="How long to stream.")
@click.option("--period-ms", default=100, show_default=True, help="Telemetry period.")
@click.option("--json-every", default=10, show_default=True, help="Also send a JSON line every N.")
@click.option("--noise-every", default=25, show_default=True, help="Inject line noise every N.")
def wire_demo(seconds: float, period_ms: int, json_every: int, noise_every: int) -> None:
    """Stream telemetry from MicroPython to this process over the real protocol."""
    from modbridge import wiredemo

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
            _fail(ModbridgeError("HEXDATA is not hex (pairs of 0-9a-f)"))
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
def frame_encode(line: str, seq: int | None) -> None:
    """Encode a JSON line (display units) into a binary frame, printed as hex.

    Example: modbridge frame encode '{"type":"fan_mode","mode":"manual","duty1":40}'
    """
    from protocol import frame as fr
    from protocol import jsonl
    from protocol.errors import ProtocolError

    try:
        msg = jsonl.decode_line(line)
        data = fr.encode_frame(msg.type, msg.fields, msg.seq if seq is None else seq)
    except ProtocolError as e:
        _fail(ModbridgeError(f"cannot encode: {e}"))
    click.echo(data.hex())


@main.command("flash")
@click.option("--board", required=True, help="Board name (see docs/boards.md).")
@click.option("--port", required=True, help="Serial port of the board's REPL (mpremote syntax).")
@click.option("--dry-run", is_flag=True, help="Stage files and print the commands only.")
@click.option("--no-compile", is_flag=True, help="Copy .py sources instead of mpy-cross .mpy.")
@click.option("--no-reset", is_flag=True, help="Do not reset the board afterwards.")
def flash_cmd(board: str, port: str, dry_run: bool, no_compile: bool, no_reset: bool) -> None:
    """Compile the firmware and copy it to a board with mpremote."""
    from modbridge import flash

    try:
        plan = flash.deploy(
            board,
            port,
            dry_run=dry_run,
            compile=not no_compile,
            reset=not no_reset,
            emit=click.echo,
        )
    except ModbridgeError as e:
        _fail(e)
    for note in plan.notes:
        click.echo(f"note: {note}")
    if dry_run:
        for line in plan.command_lines():
            click.echo(line)
    else:
        click.echo(f"flashed {len(plan.files)} files to {board} on {port}")


def _register_commands() -> None:
    """Commands that live in their own modules register themselves on the group."""
    from modbridge import cli_bridge, cli_sim

    cli_sim.register(main)
    cli_bridge.register(main)


_register_commands()
