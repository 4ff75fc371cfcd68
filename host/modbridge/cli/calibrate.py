"""CLI: ``modbridge calibrate`` (docs/calibration.md). Thin over modbridge.ops.calibrate.

    modbridge calibrate /dev/ttyUSB0 --channel gpu      guided, bath by bath
    modbridge calibrate 3a0041000c51... --model beta    a module by its id
    modbridge calibrate --sim --sim-beta 3435           a virtual module's probes in a bath
    modbridge calibrate fit --point 25:32776 --point 50:19204 --point 75:10562 --eval 4kohm

``modbridge calibrate MODULE ...`` is ``modbridge calibrate guided MODULE ...``.
Exit codes: 0 done (written, or declined); 1 a fit refused, or the module failed; 2 bad
input (points, values, options); 3 no module.
"""

from __future__ import annotations

import json
import os
import sys

import click

from modbridge.errors import ModbridgeError
from modbridge.ops import calibrate as K

SIM_SPEED = 1.0  # the bath needs no fast world; heartbeats at 2 Hz keep it HOSTED
UP_TIMEOUT_S = 10.0
HOSTED_TIMEOUT_S = 8.0


class _Group(click.Group):
    """``calibrate MODULE ...`` runs the ``guided`` command; ``calibrate fit ...`` fits."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["guided", *args]
        return super().parse_args(ctx, args)


def register(group) -> None:
    group.add_command(calibrate)


@click.group("calibrate", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def calibrate() -> None:
    """Calibrate a module's NTC channels (docs/calibration.md).

    \b
    modbridge calibrate MODULE|--sim [--channel gpu ...] [--model M] [--yes]
        guided: bath by bath against the module, then write (asks first)
    modbridge calibrate fit --point T:VALUE ... [--eval VALUE ...]
        offline: fit reference points, print cal_write and the config

    Exit 0 ok; 1 a fit refused or the module failed; 2 bad input; 3 no module.
    """


def _fail(e: Exception, code: int | None = None) -> None:
    click.echo(f"modbridge calibrate: {e}", err=True)
    sys.exit(code if code is not None else getattr(e, "exit_code", 1))


def _range(text: str) -> tuple[float, float]:
    for sep in ("..", ":"):
        if sep in text:
            lo, hi = text.split(sep, 1)
            try:
                lo_c, hi_c = float(lo), float(hi)
            except ValueError:
                break
            if not K.T_MIN_C <= lo_c < hi_c <= K.T_MAX_C:
                raise K.InputError(
                    f"--check-range {text!r}: need {K.T_MIN_C:g} <= LO < HI <= {K.T_MAX_C:g} degC"
                )
            return lo_c, hi_c
    raise K.InputError(f"--check-range {text!r}: LO:HI in degC, e.g. 0:125")


_model_opt = click.option(
    "--model",
    type=click.Choice(K.MODELS),
    default="steinhart-hart",
    show_default=True,
    help="steinhart-hart (3+ points), beta (2+), poly: a correction on the channel's "
    "current model (--degree + 1 points).",
)
_degree_opt = click.option(
    "--degree",
    type=int,
    default=K.DEFAULT_DEGREE,
    show_default=True,
    help="poly: the correction's degree (0 = an offset).",
)
_range_opt = click.option(
    "--check-range",
    default="0:125",
    show_default=True,
    help="degC range the curve must be sane over, and where the error is predicted.",
)
_ref_opt = click.option(
    "--ref-accuracy",
    type=float,
    default=K.REF_ACCURACY_C,
    show_default=True,
    help="The reference thermometer's accuracy, degC (for the predicted error).",
)


# --------------------------------------------------------------------------- fit


@calibrate.command("fit")
@click.option(
    "--point",
    "points",
    multiple=True,
    metavar="T:VALUE",
    help="Reference point: degC and a raw read_u16 code (0..65535) or a "
    "resistance with an ohm suffix (10kohm, 4.1k ohm, 10000ohm). Repeat.",
)
@_model_opt
@_degree_opt
@click.option(
    "--channel",
    default="gpu",
    show_default=True,
    help="Channel the cal_write line and the config keys are for.",
)
@click.option(
    "--r-fixed",
    type=float,
    default=None,
    help="Divider's fixed resistor, ohm (default 10000, or the --config's).",
)
@click.option(
    "--ntc-low/--ntc-high",
    "ntc_low",
    default=None,
    help="NTC between ADC pin and ground (default) or to Vref.",
)
@click.option(
    "--full-scale",
    type=int,
    default=None,
    help="ADC full scale of the codes (default 65535: read_u16).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A module config JSON (`modbridge config get --json`, or its "
    "config.json): divider and current model of --channel.",
)
@click.option(
    "--eval",
    "evals",
    multiple=True,
    metavar="VALUE",
    help="Print the fitted temperature of this code or resistance. Repeat.",
)
@_range_opt
@_ref_opt
@click.option("--json", "as_json", is_flag=True, help="One JSON object: fit, evaluations.")
def fit_cmd(points, model, degree, channel, r_fixed, ntc_low, full_scale, config_file,
            evals, check_range, ref_accuracy, as_json) -> None:  # fmt: skip
    """Fit reference points offline; print the fit, cal_write and the config snippet."""
    try:
        ch = K.parse_channel(channel)
        values = None
        div, base = K.Divider(), None
        if config_file is not None:
            div, base, values = K.load_config_file(config_file, ch)
        fs = full_scale if full_scale is not None else div.full_scale
        if not 255 <= fs <= 65535:
            raise K.InputError(f"--full-scale must be 255..65535, got {fs}")
        if r_fixed is not None and not 100 <= r_fixed <= 1e6:
            raise K.InputError(f"--r-fixed must be 100..1000000 ohm, got {r_fixed:g}")
        div = K.Divider(
            r_fixed if r_fixed is not None else div.r_fixed_ohm,
            ntc_low if ntc_low is not None else div.ntc_low,
            fs,
        )
        if values is not None:
            values = dict(values, r_fixed=int(round(div.r_fixed_ohm)), ntc_low=div.ntc_low)
        if not points:
            raise K.InputError("no --point given: --point T:VALUE, one per reference")
        parsed = [K.parse_point(p, fs) for p in points]
        to_eval = [K.parse_value(v, fs) for v in evals]
        res = K.fit(parsed, model, div, channel=ch, degree=degree, base=base,
                    check_range_c=_range(check_range), ref_accuracy_c=ref_accuracy,
                    channel_values=values)  # fmt: skip
    except ModbridgeError as e:
        _fail(e)
    evaluated = [res.evaluate(v) for v in to_eval]
    if as_json:
        d = res.as_dict()
        d["eval"] = [vars(e) for e in evaluated]
        click.echo(json.dumps(d, indent=2))
        return
    for line in K.render_fit(res):
        click.echo(line)
    for e in evaluated:
        click.echo(K.render_eval(e))
    for line in K.render_snippets(res):
        click.echo(line)


# --------------------------------------------------------------------------- guided


@calibrate.command("guided")
@click.argument("module", required=False)
@click.option(
    "--sim",
    is_flag=True,
    help="A virtual module; each temperature you enter puts its probes in a bath there.",
)
@click.option(
    "--channel",
    "channels",
    multiple=True,
    help="Channel(s) to calibrate: gpu, vram, mos, amb (repeat; default gpu).",
)
@_model_opt
@_degree_opt
@click.option(
    "--samples",
    type=int,
    default=K.DEFAULT_SAMPLES,
    show_default=True,
    help="ADC samples per cal_read (1..4096).",
)
@click.option(
    "--reads",
    type=int,
    default=K.DEFAULT_READS,
    show_default=True,
    help="cal_reads per channel and bath (their means are averaged; their "
    "spread tells a bath that is still moving).",
)
@_range_opt
@_ref_opt
@click.option("--yes", is_flag=True, help="Write without asking.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="The session as one JSON object on stdout (prompts on stderr).",
)
@click.option("--world", default="default", show_default=True, help="--sim: world name or .toml.")
@click.option(
    "--sim-beta",
    type=float,
    default=None,
    help="--sim: the bath probes' B in K (default: the world's probe; 3435 is a 103JT).",
)
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
    help="Bridge config (its keys_dir).",
)
def guided_cmd(module, sim, channels, model, degree, samples, reads, check_range,
               ref_accuracy, yes, as_json, world, sim_beta, keys_dir,
               config_path) -> None:  # fmt: skip
    """Guided calibration of MODULE (a port, or a module id) or --sim: for each bath
    you type the reference temperature, the module reads its ADC, and the fit is shown
    with its residuals and written (cal_write, config_save) when you confirm."""
    from modbridge.link.session import LinkError, ModuleLink

    if bool(module) == bool(sim):
        _fail(K.InputError("give MODULE (a port or a module id) or --sim"), 2)
    target = bath = link = None
    try:
        try:
            chans = [K.parse_channel(c) for c in channels] or [0]
            rng = _range(check_range)
            if not 1 <= samples <= 4096:
                raise K.InputError(f"--samples must be 1..4096 (cal_read), got {samples}")
            if not 1 <= reads <= 20:
                raise K.InputError(f"--reads must be 1..20, got {reads}")
            if not 0 <= degree <= K.MAX_DEGREE:
                raise K.InputError(f"--degree must be 0..{K.MAX_DEGREE}, got {degree}")
            if sim_beta is not None and not 1000 <= sim_beta <= 10000:
                raise K.InputError(f"--sim-beta must be 1000..10000 K, got {sim_beta:g}")
        except K.InputError as e:
            _fail(e)
        if sim:
            from modbridge.sim.fleet import SimFleet

            try:
                target = SimFleet(1, world=world, speed=SIM_SPEED)
            except (ModbridgeError, OSError, ValueError) as e:
                _fail(K.InputError(f"--sim: {e}"))
            target.start()
            store, port = target.keys, target.ports[0]
            bath = K.SimBath(target.modules[0], chans, beta=sim_beta)
            hb_period = 0.5 / SIM_SPEED
        else:
            from modbridge.cli.main import _key_store
            from modbridge.cli.tune import _find_port

            store = _key_store(keys_dir, config_path)
            port = module
            if not (os.path.exists(module) or module.startswith(("/", ".")) or os.sep in module):
                try:
                    port = _find_port(module, [], store, 3.0)
                except ModbridgeError as e:
                    _fail(e, 3)
            if not os.path.exists(port):
                _fail(ModbridgeError(f"{port}: no such port: is the module plugged in? "
                                     "`modbridge list` shows modules"), 3)  # fmt: skip
            hb_period = 1.0
        link = ModuleLink(port, keys=store, heartbeat_period_s=hb_period,
                          heartbeat_source=lambda: None)  # fmt: skip
        try:
            link.start()
        except LinkError as e:
            _fail(e, 3)
        if not link.wait_up(UP_TIMEOUT_S):
            _fail(ModbridgeError(f"{port}: no module: {link.status.last_error or 'no hello'}"), 3)
        emit = (lambda s: click.echo(s, err=True)) if as_json else click.echo
        hosted = K.wait_hosted(link, HOSTED_TIMEOUT_S)
        emit(
            f"module {link.status.module_id} on {port}"
            + (" (virtual: the temperature you enter is the bath's)" if sim else "")
            + ("" if hosted else "; not HOSTED (heartbeats refused?): calibrating anyway")
        )
        session = K.GuidedSession(link, chans, model, samples=samples, reads=reads,
                                  interval_s=0.5, degree=degree, check_range_c=rng,
                                  ref_accuracy_c=ref_accuracy, bath=bath)  # fmt: skip
        try:
            res = session.run(
                ask=lambda q: click.prompt(q, default="", show_default=False, err=as_json),
                confirm=lambda q: click.confirm(q, err=as_json),
                emit=emit,
                yes=yes,
            )
        except click.Abort:
            _fail(ModbridgeError("interrupted: nothing written"), 1)
        except (ModbridgeError, LinkError) as e:
            _fail(e)
        if as_json:
            click.echo(json.dumps(res.as_dict(), indent=2))
        if res.aborted or res.refused:
            sys.exit(1)
    finally:
        if bath is not None:
            bath.release()
        if link is not None:
            link.stop()
        if target is not None:
            target.stop()
