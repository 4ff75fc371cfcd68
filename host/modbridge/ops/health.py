"""The node health verdict for schedulers (docs/schedulers.md): is this node's GPU
cooling fit for new jobs?

:func:`judge` reads the document ``modbridge status --json`` prints
(:func:`modbridge.bridge.report`, also what the bridge's control socket answers to
``{"op": "report"}``) and returns a :class:`Verdict`. What makes a node **unhealthy**
(drained in Slurm, tainted in Kubernetes), worst first:

- ``no_bridge``: no bridge answers. Nothing lowers a GPU's power limit when its
  cooling fails; the module still cools on its own, but the node is unwatched.
- ``bridge_stalled``: the bridge answers but its last tick is older than the bound.
- ``no_module``: the report has no module: no GPU's cooling is watched.
- ``module_silent``: a module's link is down, it was never heard from, or its last
  frame is older than ``silent_after_s``: the bridge cannot see that GPU's cooling.
- ``module_critical``: the policy's level for a module's pair is CRITICAL (critical
  temperature, every fan stalled, the GPU lost, the module silent).
- ``module_failsafe``: the firmware is in FAILSAFE (a fan stalled or its tach
  implausible, a controlled sensor open/short/stale, over-temperature): the module runs
  its fans at a fault floor instead of regulating. The firmware debounces these
  (a stall is called after 3 s of a quiet tach), so a FAILSAFE seen is not a glitch.
- ``gpu_unpaired``: the bridge sees a GPU that no module cools (``ignore_gpus`` lists
  those a site cools otherwise). Not while a module is not paired yet (a report from
  before the bridge's first tick with it: it may be that GPU's).

Reported but **healthy**: the policy's WARN (one fan stalled with the other turning,
under-voltage, a sensor disagreeing, an early warning: the bridge already caps the
GPU's power limit, and a WARN comes and goes with load), a module in STANDALONE
(regulating on its own sensors: the bridge's heartbeats do not reach it) or BOOT (just
powered on, fans at the boot floor), a module that cools no GPU the bridge sees.

The verdict follows the policy's level, with its hysteresis: a CRITICAL steps down
only after ``[policy] min_hold_s`` (60 s), so a node does not flap between drained and
resumed.
"""

from __future__ import annotations

import dataclasses
import json
import math

from modbridge.errors import ModbridgeError

SILENT_AFTER_S = 10.0  # twice the policy's module_silent_s (5 s), which goes CRITICAL first
BRIDGE_STALLED_S = 30.0  # the last tick older than this (60 ticks at the default 0.5 s)

# stable codes, worst first; CamelCase reasons for a Kubernetes node condition
PROBLEMS = {
    "no_bridge": "NoBridge",
    "bridge_stalled": "BridgeStalled",
    "no_module": "NoModule",
    "module_silent": "ModuleSilent",
    "module_critical": "ModuleCritical",
    "module_failsafe": "ModuleFailsafe",
    "gpu_unpaired": "GpuWithoutModule",
}
HEALTHY_REASON = "CoolingOk"
SHORT_ID = 12  # module ids in a reason line, as the status line shows them


class ReportError(ModbridgeError):
    """The document is not a ``status --json`` report; the message says where."""

    exit_code = 2


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem (unhealthy) or warning (healthy, reported)."""

    code: str
    message: str
    module_id: str | None = None
    gpu: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Verdict:
    healthy: bool
    problems: list[Finding]
    warnings: list[Finding]
    modules: int = 0
    gpus: int = 0

    @property
    def reason(self) -> str:
        """CamelCase: the worst problem's (a node condition's ``reason``)."""
        return PROBLEMS[self.problems[0].code] if self.problems else HEALTHY_REASON

    def summary(self, limit: int = 200) -> str:
        """One line: every problem, or what was judged healthy (a drain reason)."""
        if self.problems:
            text = "; ".join(p.message for p in self.problems)
        else:
            text = f"cooling ok: {self.modules} module(s), {self.gpus} GPU(s)"
            if self.warnings:
                text += " (" + "; ".join(w.message for w in self.warnings) + ")"
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def key(self) -> tuple:
        """What a change of is worth telling a scheduler (not ages, not counters)."""
        return (self.healthy, tuple((p.code, p.module_id, p.gpu) for p in self.problems))

    def as_dict(self) -> dict:
        return {
            "healthy": self.healthy,
            "reason": self.reason,
            "summary": self.summary(),
            "modules": self.modules,
            "gpus": self.gpus,
            "problems": [p.as_dict() for p in self.problems],
            "warnings": [w.as_dict() for w in self.warnings],
        }


def no_bridge(why: str) -> Verdict:
    """The verdict when no bridge answers (``why``: where it was looked for)."""
    return Verdict(False, [Finding("no_bridge", f"no bridge: {why}")], [])


def _short(mid: str) -> str:
    return mid if len(mid) <= SHORT_ID + 2 else mid[:SHORT_ID] + ".."


def _num(v, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise ReportError(f"{where}: a number or null, got {v!r:.60}")
    return float(v)


def _str(v, where: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ReportError(f"{where}: a string or null, got {v!r:.60}")
    return v


def _obj(v, where: str, optional: bool = True) -> dict | None:
    if v is None and optional:
        return None
    if not isinstance(v, dict):
        raise ReportError(f"{where}: an object{' or null' if optional else ''}, got {v!r:.60}")
    return v


def _list(v, where: str) -> list:
    if not isinstance(v, list):
        raise ReportError(f"{where}: a list, got {v!r:.60}")
    return v


def loads(text: str | bytes) -> dict:
    """A report from JSON text; :class:`ReportError` for anything else."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ReportError(f"not JSON (a `modbridge status --json` document): {e}") from None
    return _obj(doc, "the report", optional=False)


def _module(m: dict, i: int, silent_after_s: float, problems, warnings) -> str | None:
    """The findings of module ``i``; returns its GPU's uuid (None: no GPU)."""
    where = f"modules[{i}]"
    _obj(m, where, optional=False)
    mid = _str(m.get("module_id"), f"{where}.module_id") or _str(m.get("port"), f"{where}.port")
    name = f"module {_short(mid)}" if mid else f"module #{i}"
    link_up = m.get("link_up")
    if not isinstance(link_up, bool):
        raise ReportError(f"{where}.link_up: true or false, got {link_up!r:.60}")
    age = _num(m.get("last_frame_age_s"), f"{where}.last_frame_age_s")
    state = _str(m.get("state"), f"{where}.state")
    reason = _str(m.get("reason"), f"{where}.reason")
    faults = m.get("faults") or []
    faults = [str(f) for f in _list(faults, f"{where}.faults")]
    gpu = _obj(m.get("gpu"), f"{where}.gpu")
    uuid = _str(gpu.get("uuid"), f"{where}.gpu.uuid") if gpu else None
    policy = _obj(m.get("policy"), f"{where}.policy")
    level = _str(policy.get("level"), f"{where}.policy.level") if policy else None
    reasons = [str(r) for r in _list(policy.get("reasons") or [], f"{where}.policy.reasons")] \
        if policy else []  # fmt: skip
    if level is not None and level not in ("NORMAL", "WARN", "CRITICAL"):
        raise ReportError(f"{where}.policy.level: NORMAL, WARN or CRITICAL, got {level!r:.60}")

    def find(code, text, into=problems):
        into.append(Finding(code, f"{name}: {text}", mid, uuid))

    silent = None
    if not link_up:
        err = _str(m.get("last_error"), f"{where}.last_error")
        silent = "link down" + (f" ({err[:80]})" if err else "")
    elif age is None:
        silent = "never heard from"
    elif age > silent_after_s:
        silent = f"silent for {age:.1f} s (last frame; the bound is {silent_after_s:g} s)"
    if silent is not None:  # its state and level are stale: the silence is the news
        find("module_silent", silent)
        return uuid
    if level == "CRITICAL":
        find("module_critical", "CRITICAL (" + (", ".join(reasons) or "no reason given") + ")")
    if state == "FAILSAFE":
        why = reason or "no reason given"
        find("module_failsafe", f"FAILSAFE {why}" + (f" ({', '.join(faults)})" if faults else ""))
    if level == "WARN":
        find("module_warn", "WARN (" + (", ".join(reasons) or "no reason given") + ")", warnings)
    if state in ("STANDALONE", "BOOT"):
        find("module_" + state.lower(), f"{state} {reason or ''}".strip(), warnings)
    if policy is None:  # in the report before the bridge's first tick with it
        find("module_pending", "not paired yet (the bridge's next tick pairs it)", warnings)
    elif uuid is None:
        find("module_without_gpu", "cools no GPU the bridge sees", warnings)
    return uuid


def judge(report: dict, silent_after_s: float = SILENT_AFTER_S, ignore_gpus=(),
          stalled_after_s: float = BRIDGE_STALLED_S) -> Verdict:  # fmt: skip
    """The verdict on ``report`` (a ``status --json`` document). :class:`ReportError`
    if it is not one: a scheduler must not act on a document it cannot read."""
    _obj(report, "the report", optional=False)
    problems: list[Finding] = []
    warnings: list[Finding] = []
    bridge = _obj(report.get("bridge"), "bridge")
    if bridge is not None:
        age = _num(bridge.get("snapshot_age_s"), "bridge.snapshot_age_s")
        if age is not None and age > stalled_after_s:
            problems.append(Finding("bridge_stalled", f"the bridge's last tick is {age:.0f} s "
                                    f"old (the bound is {stalled_after_s:g} s)"))  # fmt: skip
    modules = _list(report.get("modules"), "modules")
    gpus = _list(report.get("gpus") if report.get("gpus") is not None else [], "gpus")
    if not modules:
        problems.append(Finding("no_module", "no module: no GPU's cooling is watched"))
    cooled = set()
    for i, m in enumerate(modules):
        uuid = _module(m, i, silent_after_s, problems, warnings)
        if uuid:
            cooled.add(uuid)
    # a module not paired yet may be the one for a GPU that has none so far
    pending = any(w.code == "module_pending" for w in warnings)
    ignored = set(ignore_gpus)
    for i, g in enumerate(gpus):
        _obj(g, f"gpus[{i}]", optional=False)
        uuid = _str(g.get("uuid"), f"gpus[{i}].uuid")
        if uuid is None or uuid in cooled or uuid in ignored:
            continue
        what = ", ".join(str(g[k]) for k in ("name", "pci_bus_id") if g.get(k))
        text = f"GPU {uuid}" + (f" ({what})" if what else "") + " is paired with no module"
        (warnings if pending else problems).append(Finding("gpu_unpaired", text, None, uuid))
    order = list(PROBLEMS)
    problems.sort(key=lambda p: order.index(p.code))
    return Verdict(not problems, problems, warnings, len(modules), len(gpus))
