"""The policy engine: every pair and the PSU guard for one tick, and the event log.

What a module and its GPU report -> how far to lower the GPU power limit. Pure: inputs
in, :class:`~modbridge.policy.decision.Decision` out; ``now`` (``time.monotonic()``
seconds) is passed in. The bridge applies decisions with the actuator; see
docs/policy.md for the conditions, the defaults and where they come from.

The package, by concern:

``levels``        levels, reason codes, the level state machine (up at once, down one
                  level per ``min_hold_s``)
``config``        ``PolicyConfig`` (the ``[policy]`` section) and its validation
``thresholds``    warn/critical from the config, else NVML, else fallbacks
``freshness``     the link's silence verdict taken as a fact, the never-heard grace,
                  stale telemetry (seq/uptime frozen)
``module_rules``  fans, temperatures, the 12 V input from fresh telemetry
``blindspots``    sensor_fault, tach_implausible, manual_low_duty (and the request to
                  return a module to automatic control)
``crosscheck``    the module's GPU NTC against the GPU's own temperature (learned offset)
``early``         the early warning from the temperature slope
``hysteresis``    latches and reasons that stay a while
``decision``      ``Decision`` and the limit a level asks for
``pair``          ``PairPolicy``: one pair's state machine, built from the above
``psu``           ``PsuGuard``: the PSU budget over the pairs
``engine``        ``PolicyEngine`` and ``PairInput`` (here); the names above are
                  importable from here too
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from modbridge.gpu.base import GpuError, GpuSample
from modbridge.model import LinkFreshness, ModuleStatus
from modbridge.policy.blindspots import MANUAL_FULL_DUTY, TACH_CONFIRM_S
from modbridge.policy.config import _KINDS, PolicyConfig, PolicyConfigError
from modbridge.policy.crosscheck import SensorCrossCheck
from modbridge.policy.decision import Decision
from modbridge.policy.early import EARLY_WARNING_CLEAR_FACTOR, lsq_slope, time_to_threshold
from modbridge.policy.freshness import STALE_MIN_S
from modbridge.policy.levels import (
    CRITICAL,
    LEVEL_NAMES,
    NORMAL,
    R_BOTH_FANS_STALLED,
    R_CRITICAL_TEMP,
    R_EARLY_WARNING,
    R_FAN_STALL,
    R_GPU_LOST,
    R_HOLD,
    R_MANUAL_LOW_DUTY,
    R_MODULE_SILENT,
    R_MODULE_UNTRUSTED,
    R_OVER_TEMP,
    R_PSU_BUDGET,
    R_SENSOR_DISAGREE,
    R_SENSOR_FAULT,
    R_TACH_IMPLAUSIBLE,
    R_UNDER_VOLTAGE,
    REASON_LEVELS,
    REASONS,
    WARN,
)
from modbridge.policy.pair import PairPolicy
from modbridge.policy.psu import PsuGuard, PsuMember, PsuVerdict, fit_budget
from modbridge.policy.thresholds import (
    FALLBACK_CRITICAL_C,
    FALLBACK_WARN_C,
    Thresholds,
    effective_thresholds,
)

__all__ = [
    "CRITICAL", "EARLY_WARNING_CLEAR_FACTOR", "FALLBACK_CRITICAL_C", "FALLBACK_WARN_C",
    "LEVEL_NAMES", "MANUAL_FULL_DUTY", "NORMAL", "R_BOTH_FANS_STALLED", "R_CRITICAL_TEMP",
    "R_EARLY_WARNING", "R_FAN_STALL", "R_GPU_LOST", "R_HOLD", "R_MANUAL_LOW_DUTY",
    "R_MODULE_SILENT", "R_MODULE_UNTRUSTED", "R_OVER_TEMP", "R_PSU_BUDGET", "R_SENSOR_DISAGREE",
    "R_SENSOR_FAULT",
    "R_TACH_IMPLAUSIBLE", "R_UNDER_VOLTAGE", "REASONS", "REASON_LEVELS", "STALE_MIN_S",
    "TACH_CONFIRM_S", "WARN", "_KINDS", "Decision", "PairInput", "PairPolicy", "PolicyConfig",
    "PolicyConfigError", "PolicyEngine", "PsuGuard", "PsuMember", "PsuVerdict",
    "SensorCrossCheck", "Thresholds", "effective_thresholds", "fit_budget", "lsq_slope",
    "time_to_threshold",
]  # fmt: skip

log = logging.getLogger(__name__)


@dataclass
class PairInput:
    """What the bridge knows about one pair this tick."""

    module_id: str | None
    gpu_uuid: str | None
    module: ModuleStatus | None = None
    gpu: GpuSample | GpuError | None = None
    link_up: bool | None = None
    last_frame_age_s: float | None = None
    original_limit_w: float | None = None  # the actuator's saved original
    link: LinkFreshness | None = None  # the link's verdict (None: the module's own)
    # a GPU whose module cannot be trusted (duplicate_id, unmapped, module_lost):
    # module is None, the GPU is protected as one without working cooling
    untrusted: str | None = None
    no_gpu: bool = False  # a module mapped to no GPU: its conditions, nothing to write

    @property
    def key(self) -> tuple:
        return (self.module_id, self.gpu_uuid)


class PolicyEngine:
    """Evaluates every pair and the PSU guard for one tick; logs what changed.

    ``log`` is anything with ``write(kind, **fields)`` (an :class:`EventLog`), or None.
    The engine never actuates: the bridge applies the returned decisions.
    """

    def __init__(self, config: PolicyConfig | None = None, log=None):
        self.config = config or PolicyConfig()
        self.log = log
        self.pairs: dict[tuple, PairPolicy] = {}
        self.psu = PsuGuard.from_config(self.config)
        self.caps: dict = {}  # the PSU guard's caps (W) by pair key, from the last step

    def pair(self, module_id, gpu_uuid) -> PairPolicy:
        key = (module_id, gpu_uuid)
        p = self.pairs.get(key)
        if p is None:
            p = self.pairs[key] = PairPolicy(self.config, module_id, gpu_uuid)
        return p

    def _on_psu(self, inp: PairInput) -> bool:
        names = self.config.psu_gpus
        return names is None or inp.gpu_uuid in names or inp.module_id in names

    def step(self, now: float, inputs: Iterable[PairInput]) -> list[Decision]:
        """Every pair of the tick: the PSU guard over all of them, then each pair."""
        inputs = list(inputs)
        self.caps = self._psu_caps(now, inputs)
        return self._decide(now, inputs, self.caps)

    def step_pairs(self, now: float, inputs: Iterable[PairInput]) -> list[Decision]:
        """Only these pairs, now (an alarm on their module): each pair evaluated as in
        :meth:`step`, with the PSU guard's caps of the last :meth:`step` (the guard
        weighs every pair at once; it is re-run at the next full tick)."""
        return self._decide(now, list(inputs), self.caps)

    def _psu_caps(self, now: float, inputs: list[PairInput]) -> dict:
        caps = {}
        if self.psu is not None:
            members = {}
            for inp in inputs:
                if not self._on_psu(inp):
                    continue
                original, mn = self.pair(*inp.key).observe_limits(inp.gpu, inp.original_limit_w)
                sample = inp.gpu if isinstance(inp.gpu, GpuSample) else None
                members[inp.key] = PsuMember(
                    p_in_w=inp.module.p_in_w if inp.module is not None else None,
                    gpu_power_w=sample.power_w if sample is not None else None,
                    min_limit_w=mn,
                    original_limit_w=original,
                )
            verdict = self.psu.evaluate(now, members)
            caps = verdict.caps_w
            if verdict.changed:
                self._write(
                    "psu_guard",
                    active=verdict.active,
                    caps_w={_key_name(k): w for k, w in caps.items()},
                    values=verdict.values,
                )
                if verdict.active:
                    log.warning(
                        "PSU guard: %.0f W drawn over the %.0f W budget: capping %d GPU(s)",
                        verdict.total_w,
                        verdict.budget_w,
                        len(caps),
                    )
        return caps

    def _decide(self, now: float, inputs: list[PairInput], caps: dict) -> list[Decision]:
        decisions = []
        for inp in inputs:
            d = self.pair(*inp.key).evaluate(
                now,
                inp.module,
                inp.gpu,
                link_up=inp.link_up,
                last_frame_age_s=inp.last_frame_age_s,
                original_limit_w=inp.original_limit_w,
                psu_limit_w=caps.get(inp.key),
                link=inp.link,
                untrusted=inp.untrusted,
                no_gpu=inp.no_gpu,
            )
            if d.changed:
                self._write("decision", **d.as_event())
                # WARNING for an escalation only: a recovery, or a change of reasons or
                # target at the same level (WARN -> WARN), is not news a person must act on
                lvl = logging.WARNING if d.level > d.previous_level else logging.INFO
                log.log(
                    lvl,
                    "policy %s/%s: %s -> %s, target %s W (%s)%s",
                    d.module_id,
                    d.gpu_uuid,
                    LEVEL_NAMES[d.previous_level],
                    d.level_name,
                    "original" if d.target_limit_w is None else f"{d.target_limit_w:g}",
                    ", ".join(d.reasons) or "all clear",
                    "" if d.can_actuate else _no_write(d),
                )
            decisions.append(d)
        return decisions

    def _write(self, kind, **fields):
        if self.log is not None:
            self.log.write(kind, **fields)


def _no_write(d: Decision) -> str:
    """Why a decision writes nothing, for the log line."""
    if d.values.get("gpu_state") == "unmapped":
        return "; no GPU mapped to this module: nothing to write (a GPU it may cool is "\
            "protected by its own pair: module_untrusted)"
    return f"; GPU unusable ({d.values.get('gpu_error')}): no power-limit write possible"


def _key_name(key) -> str:
    module_id, gpu_uuid = key
    return gpu_uuid if gpu_uuid is not None else str(module_id)
