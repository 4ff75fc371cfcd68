"""``modbridge doctor``: the four-layer fault isolation (docs/doctor.md).

Thin over :mod:`modbridge.ops.doctor`: parse, call :func:`~modbridge.ops.doctor.run_doctor`,
print the checks (a table, or ``--json`` from the same :class:`~modbridge.ops.doctor.Check`
objects). Exit: 0 every check passed (or was skipped), 4 warnings only, 1 a fail,
2 usage or config, 3 nothing found (no module answered and no GPU is visible).
"""

from __future__ import annotations

import json
import sys

import click

from modbridge.cli.bridge import SIM_SPEED
from modbridge.ops import doctor as D

_MARK = {D.PASS: "pass", D.WARN: "WARN", D.FAIL: "FAIL", D.SKIP: "skip"}
_MAX_TEXT = 1000  # characters of a detail or hint shown (wire strings are escaped)


def format_report(report: D.Report) -> list[str]:
    """The text view: one block per layer, one line per check, its hint under it."""
    from modbridge.sanitize import sanitize

    lines = []
    for layer, title in D.LAYERS.items():
        checks = [c for c in report.checks if c.layer == layer]
        if not checks:
            continue
        lines.append(f"{layer} {title}")
        for c in checks:
            target = f" [{sanitize(c.target)}]" if c.target and c.target != "-" else ""
            detail = sanitize(c.detail, _MAX_TEXT)
            lines.append(f"  {_MARK[c.status]:4}  {c.name}{target}: {detail}")
            if c.hint and c.status in (D.WARN, D.FAIL):
                lines.append(f"        next: {sanitize(c.hint, _MAX_TEXT)}")
    n = report.counts()
    lines.append(f"{n[D.PASS]} pass, {n[D.WARN]} warn, {n[D.FAIL]} fail, {n[D.SKIP]} skipped "
                 f"(exit {report.exit_code})")  # fmt: skip
    return lines


@click.command("doctor")
@click.option("--port", "ports", multiple=True, metavar="PATH",
              help="Module serial port (repeatable); CH340 adapters are also found by USB id.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Config file (default: /etc/modbridge/modbridge.toml, "
                   "~/.config/modbridge.toml).")
@click.option("--backend", type=click.Choice(["auto", "nvml", "nvidia-smi"]), default=None,
              help="GPU backend (default: the config's, else auto).")
@click.option("--sim", is_flag=True, help="A virtual module and GPU (no hardware).")
@click.option("--sim-world", default="default", show_default=True,
              help="--sim: world file, a built-in name or a path.")
@click.option("--sim-fault", "sim_faults", multiple=True, metavar="SPEC",
              help="--sim: a scheduled fault, e.g. fan_stall:1@0s (docs/simulator.md).")
@click.option("--sim-speed", default="10", show_default=True, type=SIM_SPEED,
              help="--sim: world time per wall-clock second, or 'max' (as run --sim).")
@click.option("--active", is_flag=True,
              help="Also step the fans to 100 % (signed fan_mode) and back to auto.")
@click.option("--timeout", "timeout_s", default=5.0, show_default=True,
              type=click.FloatRange(0.5, 120), help="Seconds to wait for each module's hello.")
@click.option("--metrics-url", default=None, metavar="URL",
              help="The bridge's /metrics (default: from the config's [exporter]).")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="The bridge's state directory (default: as `modbridge run`).")
@click.option("--keys-dir", type=click.Path(file_okay=False), default=None,
              help="The modules' signing keys (default: as `modbridge run`).")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: checks (layer, name, target, status, detail, hint, "
                   "data), counts, worst, exit_code.")  # fmt: skip
def doctor_cmd(ports, config_path, backend, sim, sim_world, sim_faults, sim_speed, active,
               timeout_s, metrics_url, state_dir, keys_dir, as_json):  # fmt: skip
    """Check the four layers, L1 physical to L4 application, and say what to try next.

    L1 physical: NTCs, fans, 12 V. L2 firmware: the module answers, versions, resets,
    config, flash wear, pairing. L3 driver: NVML, driver version, GPUs, persistence
    mode, power-limit permission (judged, never written). L4 application: the
    exporter, event log, state directory, journal.

    Exit 0: all pass; 4: warnings only; 1: a check failed; 2: usage; 3: no module
    answered and no GPU is visible.
    """
    opts = D.DoctorOptions(
        ports=tuple(ports), config_path=config_path, backend=backend, sim=sim,
        sim_world=sim_world, sim_faults=tuple(sim_faults), sim_speed=sim_speed,
        active=active, timeout_s=timeout_s, metrics_url=metrics_url, state_dir=state_dir,
        keys_dir=keys_dir,
    )  # fmt: skip
    emit = None if as_json or not sys.stderr.isatty() else (lambda t: click.echo(t, err=True))
    try:
        report = D.run_doctor(opts, emit=emit)
    except D.DoctorError as e:
        click.echo(f"modbridge doctor: {e}", err=True)
        sys.exit(e.exit_code)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        for line in format_report(report):
            click.echo(line)
    sys.exit(report.exit_code)


def register(group):
    """Add ``doctor`` to the CLI group."""
    group.add_command(doctor_cmd)
