"""CLI: ``modbridge record`` and ``modbridge report`` (docs/recording.md).

Thin over :mod:`modbridge.ops.record` and :mod:`modbridge.ops.report`: parse, call,
format. ``record`` runs the bridge (cli/bridge.py's ``_setup``: the same ``--port``,
``--sim ...`` options as ``status``) and samples it; on real hardware it is a dry run
(it reads GPUs, never locks or writes them: the service owns them). Exit codes as
docs/bridge.md: 0 ok (also Ctrl-C), 1 runtime error, 2 usage error or a file that is
not a recording, 3 no module / no GPU.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from modbridge.cli.bridge import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    _backend_option,
    _config_option,
    _port_option,
    _setup,
    _sim_options,
    _state_dir_option,
)
from modbridge.errors import ModbridgeError

PROGRESS_TTY_S = 0.5  # a terminal's progress line is redrawn at most this often
PROGRESS_LINE_S = 10.0  # otherwise one line this often


def _fail(cmd: str, msg, code: int) -> None:
    click.echo(f"modbridge {cmd}: {msg}", err=True)
    sys.exit(code)


def _size(n: int) -> str:
    """A byte count for a person.

    >>> _size(512), _size(2048), _size(3 * 1024 * 1024)
    ('512 B', '2.0 KB', '3.0 MB')
    """
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / 1024 / 1024:.1f} MB"


def progress_text(p, path: str) -> str:
    mods = f"  {p.modules_up}/{p.modules} modules up" if p.modules else ""
    return (f"recording {p.elapsed_s:.0f} s  {p.samples} samples  {p.events} events  "
            f"{_size(p.bytes_written)}{mods} -> {path}")  # fmt: skip


class _ProgressLine:
    """stderr: one ``\\r``-redrawn line on a terminal (log records go above it: see
    :mod:`modbridge.cli.term`), else a line every 10 s."""

    def __init__(self, path: str, enabled: bool = True, stream=None):
        from modbridge.cli.term import StatusLine

        self.line = StatusLine(stream or sys.stderr)
        self.stream, self.tty = self.line.stream, self.line.tty
        self.path, self.enabled = path, enabled
        self._last = None

    def __call__(self, p, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        every = PROGRESS_TTY_S if self.tty else PROGRESS_LINE_S
        if not final and self._last is not None and now - self._last < every:
            return
        self._last = now
        text = progress_text(p, self.path)
        if final:
            self.line.done(text)
        else:
            self.line.show(text)


def _default_output(fmt: str | None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"recording-{stamp}.{fmt or 'csv'}"


@click.command("record")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Where to write (default recording-<UTC time>.csv; '-': stdout).")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default=None,
              help="File format (default: from FILE's extension, .jsonl -> jsonl, else csv).")
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=None,
              help="Stop after this many wall-clock seconds (default: until Ctrl-C).")
@click.option("--interval", type=click.FloatRange(0.05, 3600), default=1.0,
              show_default=True, help="Seconds between samples.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option("--dry-run", is_flag=True,
              help="--sim: do not write the virtual GPUs' limits either (real GPUs: never).")
@click.option("-q", "--quiet", is_flag=True, help="No progress line.")
@click.option("--json", "as_json", is_flag=True, help="At the end, one JSON object on stdout.")
@click.option("--samples", "max_samples", type=click.IntRange(1), default=None, hidden=True,
              help="Stop after this many intervals (tests).")
@_state_dir_option
@_port_option
@_backend_option
@_config_option
@_sim_options
def record_cmd(output, fmt, duration, interval, force, dry_run, quiet, as_json, max_samples,
               ports, backend, config_path, **sim):  # fmt: skip
    """Write module and GPU telemetry plus events to a CSV or JSON-lines file.

    Every --interval: one row per module (temperatures, fans, 12 V input, state), its
    GPU (temperature, power, limit) and the policy's level and target; every event of
    the bridge (alarms, decisions, limit actions, links) as its own row. Ctrl-C (or
    SIGTERM) ends it with the file complete. Real GPUs are only read (a dry run: no
    lock, no write; the service owns them); `--sim` runs the whole bridge on its
    virtual GPUs. `modbridge report FILE` plots it. Schema: docs/recording.md.
    """
    from modbridge.ops import record as rec

    fmt = rec.format_for_path(output, fmt)
    path = output or _default_output(fmt)
    if path != "-" and os.path.isdir(path):
        _fail("record", f"{path} is a directory: -o takes a file name", EXIT_USAGE)
    if path != "-" and os.path.exists(path) and not force:
        _fail("record", f"{path} exists: give --force to overwrite it, or another -o FILE",
              EXIT_USAGE)  # fmt: skip
    with _setup(config_path, ports, backend, **sim) as s:
        cfg = s.config
        cfg.dry_run = True if s.fleet is None else (dry_run or cfg.dry_run)
        cfg.tick_s = min(cfg.tick_s, max(0.05, interval))
        tap = rec.EventTap()
        started = (time.monotonic(), time.time())
        b = _start(s, tap)
        try:
            stream = _open_output(path)
        except OSError as e:
            b.stop("record: no output")
            _fail("record", f"{path}: cannot write: {e.strerror or e}", EXIT_RUNTIME)
        show = _ProgressLine("stdout" if path == "-" else path, enabled=not quiet)
        meta = rec.RecordingMeta(
            source="sim" if s.fleet is not None else "serial",
            ports=tuple(s.ports),
            backend=s.backend.name,
            dry_run=cfg.dry_run,
        )
        recorder = rec.Recorder(b, rec.writer_for(fmt, stream), tap, interval_s=interval,
                                duration_s=duration, on_progress=show, meta=meta,
                                max_samples=max_samples, started=started,
                                world_time=_world_clock(s.fleet))  # fmt: skip
        uninstall = b.install_signal_handlers()
        error = None
        try:
            recorder.run()
        except ModbridgeError as e:  # the loop's fail-safe (TickFailing)
            error = e
        except OSError as e:  # the output: disk full, a closed pipe
            error = f"{path}: cannot write: {e.strerror or e}"
        finally:
            restored = b.stop()
            uninstall()
            try:
                recorder.finish()
            except OSError as e:
                error = error or f"{path}: cannot write: {e.strerror or e}"
            if stream is not sys.stdout:
                stream.close()
        show(recorder.progress(), final=True)
    res = rec.RecordResult(
        path=None if path == "-" else path,
        format=fmt,
        samples=recorder.writer.samples,
        events=recorder.writer.events,
        bytes_written=recorder.writer.bytes_written,
        elapsed_s=round(recorder.elapsed(), 3),
        stop_reason=b.stop_reason,
        limits_restored=restored,
    )
    if as_json and path != "-":
        click.echo(json.dumps(res.as_dict(), indent=2))
    if error is not None:
        _fail("record", error, EXIT_RUNTIME)
    if b.signal_received is not None:
        click.echo(f"modbridge record: stopped by {b.stop_reason}; {path} is complete", err=True)
    sys.exit(EXIT_OK if restored else EXIT_RUNTIME)


def _world_clock(fleet):
    """--sim: port -> that module's world time in s (None: not a virtual module's)."""
    if fleet is None:
        return None
    worlds = dict(zip(fleet.ports, fleet.worlds, strict=True))

    def world_s(port):
        w = worlds.get(port)
        return None if w is None else w.now_ms / 1000.0

    return world_s


def _open_output(path: str):
    if path == "-":
        return sys.stdout
    return open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed by the caller


def _start(s, tap):
    """The bridge on the setup's modules and GPUs, its events into ``tap``."""
    from modbridge.bridge import Bridge
    from modbridge.link.errors import PortBusy

    b = Bridge(s.config, s.backend, s.ports, event_log=tap.log, state_dir=s.state_dir)
    try:
        return b.start()
    except PortBusy as e:
        b.stop("start failed")
        _fail("record", f"{e}. A module's port has one reader: while the bridge service "
              "(`modbridge run`) serves it, read its metrics (docs/metrics.md) or stop it "
              "for the recording (`sudo systemctl stop modbridge`); record itself never "
              "takes the GPUs, it only reads them", EXIT_RUNTIME)  # fmt: skip
    except ModbridgeError as e:  # a port that cannot be opened, the state dir
        b.stop("start failed")
        _fail("record", e, getattr(e, "exit_code", EXIT_RUNTIME))


@click.command("report")
@click.argument("recording", type=click.Path(dir_okay=False))
@click.option("-o", "--output", default=None, metavar="FILE.png",
              help="The PNG to write (default: RECORDING with .png).")
@click.option("--title", default=None, help="The figure's title.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: what was drawn.")
def report_cmd(recording, output, title, as_json):  # fmt: skip
    """Plot a recording (CSV or JSON lines, from `modbridge record`) as a PNG:
    one row per module on a shared time axis: temperatures, fan duty and rpm, input
    and GPU power with the power limit, the policy level as shading, and events as
    numbered vertical lines listed beside the row."""
    from modbridge.extras import ExtraMissing, require
    from modbridge.ops.record import RecordingError

    try:
        require("matplotlib", "modbridge report", "report")
    except ExtraMissing as e:
        _fail("report", e, EXIT_RUNTIME)
    from modbridge.ops.report import report_file

    out = output or (os.path.splitext(recording)[0] + ".png")
    try:
        res = report_file(recording, out, title)
    except RecordingError as e:  # unreadable input: 2; unwritable output: 1 (as record)
        _fail("report", e, e.exit_code)
    for note in res.notes:
        click.echo(f"modbridge report: note: {note}", err=True)
    if as_json:
        click.echo(json.dumps(res.as_dict(), indent=2))
        return
    click.echo(f"wrote {res.path} ({len(res.panels)} row(s) of panels, {res.width_px}x"
               f"{res.height_px} px, {res.samples} samples, "
               f"{res.events} events, {res.markers} marked)")  # fmt: skip


def register(group):
    """Add ``record`` and ``report`` to the CLI group."""
    group.add_command(record_cmd)
    group.add_command(report_cmd)
