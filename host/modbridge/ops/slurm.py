"""Drain and resume a Slurm node on the health verdict, as NHC does for
``HealthCheckProgram`` (docs/schedulers.md).

Unhealthy: ``scontrol update NodeName=<node> State=DRAIN Reason="modbridge: <why>"``,
unless the node is drained or down already for another reason (an admin's reason is
never overwritten). Healthy: ``State=RESUME`` only when the node's reason is ours
(starts with ``modbridge:``). The node's state comes from ``scontrol show node -o``.
Every scontrol call is bounded (:data:`SCONTROL_TIMEOUT_S`).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import socket
import subprocess

from modbridge.errors import ModbridgeError

REASON_PREFIX = "modbridge:"
SCONTROL_TIMEOUT_S = 10.0
REASON_MAX = 200  # Slurm keeps longer ones, but sinfo -R and logs read better short
_DOWN_BASES = ("DOWN", "FAIL", "FAILING", "FUTURE", "UNKNOWN")


class SlurmError(ModbridgeError):
    """scontrol is missing, failed, or answered what cannot be read."""

    exit_code = 1


def short_hostname() -> str:
    """This node's Slurm NodeName as NHC assumes it: the hostname up to its first dot."""
    return socket.gethostname().split(".", 1)[0]


@dataclasses.dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # as scontrol prints it, e.g. IDLE+DRAIN
    reason: str | None  # without scontrol's " [user@time]" suffix

    @property
    def flags(self) -> set[str]:
        return {f.rstrip("*~#$@^-!%") for f in self.state.split("+")}

    @property
    def drained(self) -> bool:
        f = self.flags
        return bool(f & {"DRAIN", "DRAINED", "DRAINING"})

    @property
    def down(self) -> bool:
        return bool(self.flags & set(_DOWN_BASES))

    @property
    def ours(self) -> bool:
        return bool(self.reason) and self.reason.startswith(REASON_PREFIX)


_REASON_STAMP = re.compile(r"\s*\[[^\]\[]*@[^\]\[]*\]\s*$")  # " [root@2026-12-02T06:00:00]"


def parse_show_node(text: str, name: str) -> NodeState:
    """``scontrol show node -o NAME``'s one line: State= and Reason= (which runs to the
    next ``Key=`` field or the end; its value may hold spaces)."""
    line = next((ln for ln in text.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise SlurmError(f"scontrol show node {name}: no NodeName= line in its answer "
                         f"({text.strip()[:120]!r})")  # fmt: skip
    m = re.search(r"(?:^|\s)State=(\S+)", line)
    if m is None:
        raise SlurmError(f"scontrol show node {name}: no State= in {line[:120]!r}")
    reason = None
    r = re.search(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Z][A-Za-z]*=|$)", line)
    if r is not None:
        reason = _REASON_STAMP.sub("", r.group(1)).strip() or None
        if reason == "(null)":
            reason = None
    return NodeState(name, m.group(1), reason)


@dataclasses.dataclass
class Action:
    node: str
    action: str  # drained, updated, resumed, left, none; unknown (a dry run without scontrol)
    message: str
    before: str | None = None  # the node's state before
    ok: bool = True

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Scontrol:
    """scontrol, bounded: ``run(args) -> stdout``; :class:`SlurmError` on failure."""

    def __init__(self, path: str | None = None, timeout_s: float = SCONTROL_TIMEOUT_S):
        self.path = path or shutil.which("scontrol")
        self.timeout_s = timeout_s
        if self.path is None:
            raise SlurmError("scontrol not found on PATH: install Slurm's client "
                             "(Debian: slurm-client) or give --scontrol PATH")  # fmt: skip

    def run(self, *args: str) -> str:
        cmd = [self.path, *args]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s,
                                 check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            what = " ".join(args[:2])
            raise SlurmError(f"scontrol {what}: no answer within {self.timeout_s:g} s "
                             "(is slurmctld reachable?)") from None  # fmt: skip
        except OSError as e:
            raise SlurmError(f"cannot run {self.path}: {e}") from None
        if res.returncode != 0:
            err = (res.stderr or res.stdout).strip().splitlines()
            raise SlurmError(f"scontrol {' '.join(args[:2])} failed (exit {res.returncode}): "
                             + (err[-1] if err else "no message"))  # fmt: skip
        return res.stdout

    def show(self, node: str) -> NodeState:
        return parse_show_node(self.run("show", "node", "-o", node), node)

    def update(self, node: str, *fields: str) -> None:
        self.run("update", f"NodeName={node}", *fields)


def drain_reason(verdict) -> str:
    """``modbridge: <why>`` within :data:`REASON_MAX`."""
    return f"{REASON_PREFIX} {verdict.summary(REASON_MAX - len(REASON_PREFIX) - 1)}"


def apply(verdict, node: str, scontrol: Scontrol | None, dry_run: bool = False) -> Action:
    """Drain ``node`` for an unhealthy ``verdict``, resume it for a healthy one if the
    drain was ours; leave anyone else's drain or down alone.

    A dry run changes nothing and never fails on the scheduler: it reads the node's
    state when it can (``scontrol`` None: not installed) and otherwise says what it
    would do whatever that state is."""
    if dry_run:
        try:
            if scontrol is None:
                raise SlurmError("scontrol not found on PATH")
            st = scontrol.show(node)
        except SlurmError as e:
            why = f"would drain: {drain_reason(verdict)}" if not verdict.healthy else (
                "would resume it if modbridge had drained it")
            return Action(node, "unknown", f"{node}: {why} (its state is unknown: {e})")
    else:
        st = scontrol.show(node)
    before = st.state + (f" ({st.reason})" if st.reason else "")
    verb = "would " if dry_run else ""
    if not verdict.healthy:
        reason = drain_reason(verdict)
        if st.drained or st.down:
            if not st.ours:
                return Action(node, "left", f"{node} is {st.state} for another reason "
                              f"({st.reason or 'none given'}): left alone", before)  # fmt: skip
            if st.reason == reason or not st.drained:
                return Action(node, "none", f"{node} is {st.state} by modbridge already", before)
            if not dry_run:  # our drain, a new why
                scontrol.update(node, "State=DRAIN", f"Reason={reason}")
            return Action(node, "updated", f"{node}: {verb}update the drain reason: {reason}",
                          before)  # fmt: skip
        if not dry_run:
            scontrol.update(node, "State=DRAIN", f"Reason={reason}")
        return Action(node, "drained", f"{node}: {verb}drain: {reason}", before)
    if (st.drained or st.down) and st.ours:
        if not dry_run:
            scontrol.update(node, "State=RESUME")
        return Action(node, "resumed", f"{node}: {verb}resume (it was {before})", before)
    return Action(node, "none", f"{node} is {st.state}: nothing to do", before)
