"""CLI: ``modbridge healthcheck``: the node's GPU cooling judged for a scheduler, and
(``--slurm``, ``--kubernetes``) acted on (docs/schedulers.md).

Thin: find the report (``--input``, ``--sim``, else the running bridge's control
socket), :func:`modbridge.ops.health.judge` it, hand the verdict to
:mod:`modbridge.ops.slurm` or :mod:`modbridge.ops.k8snode`, print.

Exit codes (docs/bridge.md's, as NHC: 0 means fit for jobs): 0 healthy, 1 unhealthy
(or the scheduler could not be told: the message says which), 2 usage or a document
that is not a ``status --json`` report, 3 nothing to judge (no bridge answers; with
``--slurm``/``--kubernetes`` the node is drained/tainted for it all the same).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

import click

from modbridge.cli.bridge import _config_option, _sim_options, _state_dir_option
from modbridge.errors import ModbridgeError
from modbridge.ops import health

log = logging.getLogger(__name__)

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, EXIT_NOTHING = 0, 1, 2, 3
HEARTBEAT_S = 300.0  # --watch: tell the scheduler again this often with no change
BACKOFF_MAX_S = 300.0
START_GRACE_S = 60.0  # --watch: no bridge / a silent module at start is not acted on


class NoBridge(ModbridgeError):
    exit_code = EXIT_NOTHING


def _fail(err, code: int | None = None):
    click.echo(f"modbridge healthcheck: {err}", err=True)
    sys.exit(code if code is not None else getattr(err, "exit_code", EXIT_UNHEALTHY))


def bridge_report(config, socket_path=None, state_dir=None) -> tuple[dict, str]:
    """The running bridge's report over its control socket and where it answered;
    :class:`NoBridge` if none does (a refusal is an error: wrong user, not no bridge)."""
    from modbridge.ops import ctlsock

    paths = ctlsock.client_paths(config, socket_path, state_dir=state_dir)
    tried = []
    for path in paths:
        try:
            reply = ctlsock.Client(path).call({"op": "report"})
        except ctlsock.SocketRefused:
            raise
        except ctlsock.StaleSocket:
            why = "no bridge listening" if os.path.exists(path) else "no such socket"
            tried.append(f"{path}: {why}")
            continue
        except ctlsock.SocketError as e:
            tried.append(str(e))
            continue
        if reply.get("ok") and isinstance(reply.get("report"), dict):
            return reply["report"], path
        tried.append(f"{path}: {reply.get('error')}: {reply.get('message')}")
    if not paths:
        where = socket_path or "$RUNTIME_DIRECTORY, /run/modbridge, the state dir"
        raise NoBridge(f"no control socket ({where}): is `modbridge run` running?")
    raise NoBridge("; ".join(tried))


class Source:
    """Where a report comes from: a file or stdin, a one-shot --sim look, the bridge."""

    def __init__(self, input_path, config_path, socket_path, sim_opts, timeout):
        self.input_path = input_path
        self.config_path = config_path
        self.socket_path = socket_path
        self.sim_opts = sim_opts
        self.timeout = timeout
        self.where = None

    def read(self) -> dict | None:
        """The report, or None: no bridge (``self.where`` says why)."""
        if self.input_path == "-":
            self.where = "stdin"
            return health.loads(sys.stdin.buffer.read())
        if self.input_path is not None:
            self.where = self.input_path
            try:
                with open(self.input_path, "rb") as fh:
                    return health.loads(fh.read())
            except OSError as e:
                raise health.ReportError(f"{self.input_path}: {e.strerror or e}") from None
        if self.sim_opts["sim"]:
            from modbridge.cli.bridge import one_shot_report

            self.where = "sim"
            return one_shot_report(self.config_path, (), None, self.timeout, **self.sim_opts)
        from modbridge import config as cfgmod

        try:
            cfg = cfgmod.load_given_or_default(self.config_path)
        except cfgmod.ConfigFileError as e:
            raise health.ReportError(f"{e.path}: invalid config: {'; '.join(e.problems)}") from None
        try:
            rep, self.where = bridge_report(cfg, self.socket_path,
                                            self.sim_opts.get("state_dir"))  # fmt: skip
        except NoBridge as e:
            self.where = str(e)
            return None
        return rep


def _verdict(src: Source, silent_after, ignore_gpus, stalled_after) -> health.Verdict:
    rep = src.read()
    if rep is None:
        return health.no_bridge(src.where)
    return health.judge(rep, silent_after, ignore_gpus, stalled_after)


class Actor:
    """Tells the scheduler (``--slurm``, ``--kubernetes``), or nobody."""

    def __init__(self, kind, node, dry_run, scontrol_path, api_server, token_file, ca_file,
                 taint):  # fmt: skip
        self.kind = kind
        self.node = node
        self.dry_run = dry_run
        self.scontrol_path = scontrol_path
        self.kube = None
        self.kube_opts = (api_server, token_file, ca_file)
        self.taint = taint

    def act(self, verdict) -> dict | None:
        if self.kind == "slurm":
            from modbridge.ops import slurm

            if self.dry_run:  # read-only: a missing scontrol is no failure
                try:
                    scontrol = slurm.Scontrol(self.scontrol_path)
                except slurm.SlurmError:
                    scontrol = None
                return slurm.apply(verdict, self.node, scontrol, True).as_dict()
            return slurm.apply(verdict, self.node, slurm.Scontrol(self.scontrol_path),
                               self.dry_run).as_dict()  # fmt: skip
        if self.kind == "kubernetes":
            from modbridge.ops import k8snode

            if self.dry_run:
                return {"node": self.node, "dry_run": True,
                        "condition": "True" if not verdict.healthy else "False",
                        "taint": ("present" if not verdict.healthy else "absent")
                        if self.taint else "off"}  # fmt: skip
            if self.kube is None:
                a, t, c = self.kube_opts
                self.kube = k8snode.Client(a, t, c)
            return k8snode.apply(verdict, self.node, self.kube, self.taint)
        return None


def _describe_action(a: dict | None) -> str | None:
    if a is None:
        return None
    if "error" in a:
        return f"the scheduler was not told: {a['error']}"
    if "message" in a:  # slurm
        return a["message"]
    from modbridge.ops.k8snode import CONDITION

    cond = a.get("condition")
    status = cond.get("status") if isinstance(cond, dict) else cond
    return f"node {a['node']}: condition {CONDITION}={status}, taint {a.get('taint')}"


def _print(verdict, where, action, as_json, stamp=False):
    if as_json:
        import json

        out = {**verdict.as_dict(), "source": where, "action": action}
        click.echo(json.dumps(out, indent=None if stamp else 2, default=str))
        return
    head = ("healthy: " if verdict.healthy else "unhealthy: ") + verdict.summary(10_000)
    if stamp:
        head = time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + head
    click.echo(head)
    if not stamp:
        for p in verdict.problems:
            click.echo(f"  problem {p.code}: {p.message}")
        for w in verdict.warnings:
            click.echo(f"  warning {w.code}: {w.message}")
    text = _describe_action(action)
    if text:
        click.echo(("  " if not stamp else "  -> ") + text)


def _exit_code(verdict) -> int:
    if verdict.healthy:
        return EXIT_OK
    if verdict.problems[0].code == "no_bridge":
        return EXIT_NOTHING
    return EXIT_UNHEALTHY


@click.command("healthcheck")
@click.option(
    "--slurm",
    "kind",
    flag_value="slurm",
    help="Drain this Slurm node when unhealthy, resume it when our drain ends "
    "(HealthCheckProgram; packaging/slurm/).",
)
@click.option(
    "--kubernetes",
    "kind",
    flag_value="kubernetes",
    help="Set this node's condition and taint (in a pod; docs/schedulers.md).",
)
@click.option(
    "--node",
    default=None,
    help="The node (default: Slurm $SLURMD_NODENAME or the short hostname; Kubernetes $NODE_NAME).",
)
@click.option(
    "--control-socket",
    "socket_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The bridge's control socket (default: the config's control_socket, "
    "$RUNTIME_DIRECTORY, /run/modbridge, the state dir).",
)
@click.option(
    "--input",
    "input_path",
    default=None,
    metavar="FILE|-",
    help="Judge this `modbridge status --json` document (- for stdin).",
)
@click.option(
    "--silent-after",
    default=health.SILENT_AFTER_S,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="A module whose last frame is older than this (s) is silent.",
)
@click.option(
    "--stalled-after",
    default=health.BRIDGE_STALLED_S,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="A bridge whose last tick is older than this (s) is stalled.",
)
@click.option(
    "--ignore-gpu",
    "ignore_gpus",
    multiple=True,
    metavar="UUID",
    help="A GPU no module cools on purpose (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: verdict and action.")
@click.option(
    "--watch",
    type=click.FloatRange(1),
    default=None,
    metavar="SECONDS",
    help="Judge every SECONDS; tell the scheduler on a change and every "
    "--heartbeat; API errors are logged and retried (a sidecar).",
)
@click.option(
    "--heartbeat",
    default=HEARTBEAT_S,
    show_default=True,
    type=click.FloatRange(1),
    help="--watch: tell the scheduler this often anyway.",
)
@click.option(
    "--start-grace",
    default=START_GRACE_S,
    show_default=True,
    type=click.FloatRange(0),
    help="--watch: no bridge or a silent module this soon after start is not "
    "acted on (the bridge is starting).",
)
@click.option(
    "--count",
    type=click.IntRange(1),
    default=None,
    hidden=True,
    help="--watch: stop after this many checks (tests).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be done to the node, do nothing.")
@click.option(
    "--scontrol",
    "scontrol_path",
    default=None,
    metavar="PATH",
    help="--slurm: the scontrol to run (default: scontrol on PATH).",
)
@click.option(
    "--api-server",
    default=None,
    metavar="URL",
    help="--kubernetes: the API server (default: the pod's in-cluster one).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="--kubernetes: bearer token file (default: the service account's).",
)
@click.option(
    "--ca-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="--kubernetes: CA bundle (default: the service account's ca.crt).",
)
@click.option("--no-taint", is_flag=True, help="--kubernetes: the condition only.")
@click.option(
    "--timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0),
    help="--sim: seconds to wait for every module's first telemetry.",
)
@_state_dir_option
@_config_option
@_sim_options
def healthcheck_cmd(kind, node, socket_path, input_path, silent_after, stalled_after,
                    ignore_gpus, as_json, watch, heartbeat, start_grace, count, dry_run,
                    scontrol_path, api_server, token_file, ca_file, no_taint, timeout,
                    config_path, **sim):  # fmt: skip
    """Is this node's GPU cooling fit for new jobs? Judge the running bridge's report
    (or --input, or --sim): unhealthy when a module is CRITICAL, in FAILSAFE or
    silent, a GPU has no module, there is no module or no bridge. WARN is healthy.

    Exit 0 healthy, 1 unhealthy, 2 usage or an unreadable document, 3 no bridge.
    """
    sources = sum(bool(x) for x in (input_path is not None, sim["sim"], socket_path))
    if sources > 1:
        _fail("give one of --input, --sim, --control-socket", EXIT_USAGE)
    if sim["sim_faults"] and not sim["sim"]:
        _fail("--sim-fault needs --sim", EXIT_USAGE)
    if watch is not None and (input_path == "-" or sim["sim"]):
        _fail("--watch reads the bridge or a file again and again: not stdin or --sim",
              EXIT_USAGE)  # fmt: skip
    if kind == "slurm" and not node:
        from modbridge.ops.slurm import short_hostname

        node = os.environ.get("SLURMD_NODENAME") or short_hostname()
    if kind == "kubernetes" and not node:
        node = os.environ.get("NODE_NAME")
        if not node:
            _fail("--kubernetes needs --node NAME (or $NODE_NAME, from the pod's "
                  "spec.nodeName)", EXIT_USAGE)  # fmt: skip
    src = Source(input_path, config_path, socket_path, sim, timeout)
    actor = Actor(kind, node, dry_run, scontrol_path, api_server, token_file, ca_file,
                  not no_taint)  # fmt: skip
    if watch is None:
        _once(src, actor, (silent_after, ignore_gpus, stalled_after), as_json)
    else:
        _watch(src, actor, (silent_after, ignore_gpus, stalled_after), as_json, watch,
               heartbeat, start_grace, count)  # fmt: skip


def _once(src, actor, judging, as_json):
    try:
        verdict = _verdict(src, *judging)
    except health.ReportError as e:
        _fail(e, EXIT_USAGE)
    except ModbridgeError as e:  # a refused socket, a --sim that cannot start
        _fail(e)
    try:
        action = actor.act(verdict)
    except ModbridgeError as e:
        _print(verdict, src.where, {"ok": False, "error": str(e)}, as_json)
        _fail(e, EXIT_UNHEALTHY)
    _print(verdict, src.where, action, as_json)
    sys.exit(_exit_code(verdict))


_GRACE_CODES = ("no_bridge", "module_silent")


def _watch(src, actor, judging, as_json, interval, heartbeat, start_grace, count):
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    old = {}
    for s in (signal.SIGTERM, signal.SIGINT):
        try:
            old[s] = signal.signal(s, on_signal)
        except ValueError:  # not the main thread (a test): no handlers
            pass
    started = time.monotonic()
    told_key, told_at = None, None
    shown_key = None
    failures = 0
    checks = 0
    try:
        while not stop.is_set():
            checks += 1
            wait = interval
            try:
                verdict = _verdict(src, *judging)
            except ModbridgeError as e:  # a document we cannot read: never act on it
                log.error("healthcheck: %s", e)
                verdict = None
            if verdict is not None:
                key = verdict.key()
                now = time.monotonic()
                in_grace = (
                    now - started < start_grace
                    and verdict.problems
                    and all(p.code in _GRACE_CODES for p in verdict.problems)
                )
                due = key != told_key or told_at is None or now - told_at >= heartbeat
                action = None
                if in_grace:
                    action = None
                    if key != shown_key:
                        click.echo(f"modbridge healthcheck: waiting for the bridge "
                                   f"({verdict.summary()})", err=True)  # fmt: skip
                        shown_key = key
                elif due:
                    try:
                        action = actor.act(verdict)
                    except Exception as e:  # noqa: BLE001 - a sidecar outlives any answer
                        if not isinstance(e, ModbridgeError):
                            log.exception("healthcheck: unexpected error telling the scheduler")
                        failures += 1
                        wait = min(BACKOFF_MAX_S, interval * 2 ** min(failures, 8))
                        log.error("healthcheck: cannot tell the scheduler: %s; again in %g s",
                                  e, wait)  # fmt: skip
                    else:
                        failures = 0
                        told_key, told_at = key, now
                if not in_grace and (key != shown_key or action is not None):
                    if key != shown_key or as_json:
                        _print(verdict, src.where, action, as_json, stamp=True)
                    shown_key = key
            if count is not None and checks >= count:
                break
            stop.wait(wait)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    sys.exit(EXIT_OK)


def register(group):
    """Add ``healthcheck`` to the CLI group."""
    group.add_command(healthcheck_cmd)
