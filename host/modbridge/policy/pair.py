"""The state machine of one (module, GPU) pair: :class:`PairPolicy`.

It gathers the active conditions from the GPU (:mod:`~modbridge.policy.thresholds`),
the module (:mod:`~modbridge.policy.freshness`, :mod:`~modbridge.policy.module_rules`),
the cross-check (:mod:`~modbridge.policy.crosscheck`) and the early warning
(:mod:`~modbridge.policy.early`); the level follows
:class:`~modbridge.policy.levels.LevelMachine` and the limit
:func:`~modbridge.policy.decision.target_limit`. Pure: ``now`` is passed in.
"""

from __future__ import annotations

from modbridge.gpu.base import GpuError, GpuSample
from modbridge.model import FRESH, LinkFreshness, ModuleStatus
from modbridge.policy.blindspots import ReturnToAuto
from modbridge.policy.config import PolicyConfig
from modbridge.policy.crosscheck import SensorCrossCheck
from modbridge.policy.decision import Decision, target_limit
from modbridge.policy.early import EarlyWarning
from modbridge.policy.freshness import TelemetryFreshness
from modbridge.policy.hysteresis import Latches, temperature_reason
from modbridge.policy.levels import (
    NORMAL,
    R_CRITICAL_TEMP,
    R_EARLY_WARNING,
    R_GPU_LOST,
    R_HOLD,
    R_MANUAL_LOW_DUTY,
    R_MODULE_SILENT,
    R_MODULE_UNTRUSTED,
    R_OVER_TEMP,
    R_PSU_BUDGET,
    R_SENSOR_DISAGREE,
    REASON_LEVELS,
    LevelMachine,
    ordered,
    raw_level,
)
from modbridge.policy.module_rules import ModuleRules
from modbridge.policy.thresholds import effective_thresholds

_DISAGREE_SOURCE = {"ntc_frozen": "ntc_gpu", "gpu_frozen": "gpu"}  # else "ntc_gpu"


class PairPolicy:
    """The state machine of one (module, GPU) pair. Call :meth:`evaluate` every tick."""

    def __init__(
        self,
        config: PolicyConfig | None = None,
        module_id: str | None = None,
        gpu_uuid: str | None = None,
    ):
        self.config = cfg = config or PolicyConfig()
        self.module_id = module_id
        self.gpu_uuid = gpu_uuid
        self.target_limit_w: float | None = None
        self.reasons: list[str] = []
        self._levels = LevelMachine(cfg.min_hold_s)  # the cooling causes' level
        self._level = NORMAL  # the level decided last (gpu_lost included)
        self._first_at: float | None = None
        self._gpu_latches = Latches()
        self._freshness = TelemetryFreshness(cfg)
        self._module = ModuleRules(cfg)
        self._crosscheck = SensorCrossCheck(cfg)
        self._early = EarlyWarning(cfg.early_warning_window_s, cfg.early_warning_horizon_s)
        self._auto = ReturnToAuto(cfg.return_to_auto_retry_s)
        self._gpu_thresholds: tuple = (None, None, None)  # slowdown, shutdown, max_operating
        self._thresholds = effective_thresholds(cfg)  # of _gpu_thresholds, set with it
        self._original_w: float | None = None
        self._min_w: float | None = None

    @property
    def level(self) -> int:
        return self._level

    @property
    def level_since(self) -> float | None:
        return self._levels.since

    def observe_limits(
        self, gpu: GpuSample | None, original_limit_w: float | None = None
    ) -> tuple[float | None, float | None]:
        """(original, min) limit in W, remembering the last ones a sample gave.

        The original is, in order: the actuator's saved original (``original_limit_w``),
        the GPU's default limit, the first enforced limit this pair saw.
        """
        if isinstance(gpu, GpuSample) and gpu.state == "ok":
            if gpu.default_limit_w is not None:
                self._original_w = gpu.default_limit_w
            elif self._original_w is None and gpu.enforced_limit_w is not None:
                self._original_w = gpu.enforced_limit_w
            if gpu.min_limit_w is not None:
                self._min_w = gpu.min_limit_w
        original = original_limit_w if original_limit_w is not None else self._original_w
        mn = self._min_w
        if mn is not None and original is not None and mn > original:
            mn = original
        return original, mn

    def estimate_eta(self, current_c: float | None, threshold_c: float):
        """(eta_s, slope_c_per_s) from the GPU temperature history of the last
        ``early_warning_window_s``; (None, None) until half a window (and 3 points)."""
        return self._early.estimate_eta(current_c, threshold_c)

    # -- the tick ----------------------------------------------------------------------
    def evaluate(
        self,
        now: float,
        module: ModuleStatus | None = None,
        gpu: GpuSample | GpuError | None = None,
        *,
        link_up: bool | None = None,
        last_frame_age_s: float | None = None,
        original_limit_w: float | None = None,
        psu_limit_w: float | None = None,
        link: LinkFreshness | None = None,
        untrusted: str | None = None,
        no_gpu: bool = False,
    ) -> Decision:
        """One evaluation at monotonic time ``now``.

        ``module``: the mapped module's status, None when no module is mapped.
        ``link_up`` / ``last_frame_age_s`` override what ``module`` says (None: read it).
        ``link``: the link's verdict on the module's frames (None: ``module.freshness``);
        silent is CRITICAL, late only shows in the values (one missed frame cuts nothing).
        ``gpu``: a sample, the GpuError its backend raised, or None (no reading).
        ``original_limit_w``: the limit saved by the actuator at start, if known.
        ``psu_limit_w``: the PSU guard's cap for this GPU (None: no cap).
        ``untrusted``: this GPU's module cannot be trusted (``duplicate_id``,
        ``unmapped``, ``module_lost``; ``module`` is None): the GPU is treated as one
        without working cooling (``module_untrusted``, CRITICAL; ``unmapped`` only once
        ``module_grace_s`` has passed since the pair's first evaluation).
        ``no_gpu``: the module is mapped to no GPU: nothing to lose (no ``gpu_lost``),
        nothing to write; its GPU, if it has one, is protected by its own pair.
        """
        cfg = self.config
        if self._first_at is None:
            self._first_at = now
        active: dict[str, list[str]] = {}  # reason -> sources
        values: dict = {}

        def hit(reason, source):
            active.setdefault(reason, []).append(source)

        # GPU ------------------------------------------------------------------------
        sample = gpu if isinstance(gpu, GpuSample) and gpu.state == "ok" else None
        if no_gpu:
            values["gpu_state"] = "unmapped"  # not lost: this module has no GPU
        elif sample is None:
            if isinstance(gpu, GpuError):
                state, err = gpu.state, str(gpu)
            elif isinstance(gpu, GpuSample):
                state, err = gpu.state, gpu.error
            else:
                state, err = "missing", "no GPU reading"
            hit(R_GPU_LOST, "gpu")
            values["gpu_state"] = state
            values["gpu_error"] = err
        else:
            known = (sample.slowdown_temp_c, sample.shutdown_temp_c, sample.max_operating_temp_c)
            if known != self._gpu_thresholds and any(t is not None for t in known):
                self._gpu_thresholds = known
                self._thresholds = effective_thresholds(cfg, *known)
        th = self._thresholds
        values.update(
            warn_temp_c=th.warn_c,
            critical_temp_c=th.critical_c,
            warn_source=th.warn_source,
            critical_source=th.critical_source,
        )
        gpu_c = sample.temperature_c if sample is not None else None
        values["gpu_temp_c"] = gpu_c
        reason = temperature_reason(self._gpu_latches, "gpu", gpu_c, th.warn_c, th.critical_c,
                                    cfg.hysteresis_c)  # fmt: skip
        if reason is not None:
            hit(reason, "gpu")

        # module ---------------------------------------------------------------------
        ntc_c = None
        if module is not None:
            age = last_frame_age_s if last_frame_age_s is not None else module.last_frame_age_s(now)
            values["link_up"] = module.link_up if link_up is None else link_up
            values["last_frame_age_s"] = age
            verdict = self._freshness.judge(now, module, age, self._first_at, link)
            f = verdict.link
            if f is not None and f.state != FRESH:
                values["link_state"] = f.state
                values["missed_frames"] = f.missed_frames
            if f is not None and f.paused_s:
                values["bridge_paused_s"] = round(f.paused_s, 3)
            if verdict.never_heard_s is not None:
                values["never_heard_s"] = verdict.never_heard_s
            if verdict.stale_s is not None:
                values["telemetry_stale_s"] = verdict.stale_s
            if verdict.silent:
                hit(R_MODULE_SILENT, verdict.source)
                self._module.forget()
            else:  # telemetry is fresh enough to trust
                ntc_c = self._module.evaluate(module, th, values, hit, now, gpu_c)
        else:
            values["module"] = None
            if untrusted is not None:
                waited = now - self._first_at
                if untrusted != "unmapped" or waited > cfg.module_grace_s:
                    hit(R_MODULE_UNTRUSTED, untrusted)
                else:  # at start, modules are still saying hello: the never-heard grace
                    values["never_heard_s"] = waited

        # cross-check: the module's GPU NTC against the GPU's own sensor --------------
        power_w = sample.power_w if sample is not None else None
        if power_w is None and ntc_c is not None:
            power_w = module.p_in_w
        kind = self._crosscheck.update(now, ntc_c, gpu_c, power_w, values)
        if kind is not None:
            hit(R_SENSOR_DISAGREE, _DISAGREE_SOURCE.get(kind, "ntc_gpu"))

        # early warning: time to the warn threshold from the recent slope -------------
        eta = None
        if gpu_c is not None:
            self._early.observe(now, gpu_c)
            eta, slope = self._early.estimate_eta(gpu_c, th.warn_c)
            values["slope_c_per_s"] = None if slope is None else round(slope, 6)
        if cfg.early_warning and R_OVER_TEMP not in active and R_CRITICAL_TEMP not in active:
            if self._early.warns(eta):
                hit(R_EARLY_WARNING, "gpu")
                values["early_warning_horizon_s"] = cfg.early_warning_horizon_s
        else:
            self._early.active = False

        # return to automatic fan control (if configured) -----------------------------
        want_auto = self._auto.want(
            now,
            cfg.return_to_auto
            and module is not None
            and module.state == "MANUAL"
            and R_MANUAL_LOW_DUTY in active,
        )
        if want_auto:
            values["return_to_auto"] = {"attempt": self._auto.attempts,
                                        "episode": self._auto.episodes}  # fmt: skip

        # level: up at once, down one level per min_hold_s ----------------------------
        # gpu_lost is no cooling cause (nothing was written for it): it sets the level
        # while it lasts but starts no hold; the GPU back, the cooling causes decide
        raw = raw_level(r for r in active if r != R_GPU_LOST)
        prev_level = self._level
        level = self._levels.step(now, raw)
        held = self._levels.held_above(raw)
        if R_GPU_LOST in active:
            level = max(level, REASON_LEVELS[R_GPU_LOST])
        self._level = level
        if held:
            values["held_since_s"] = self._levels.since  # the bridge clock (monotonic)
            values["min_hold_s"] = cfg.min_hold_s

        # target -----------------------------------------------------------------------
        original, mn = self.observe_limits(gpu, original_limit_w)
        values["original_w"] = original  # docs/vocabulary.md: the policy's own
        values["gpu_min_limit_w"] = mn
        can_actuate = R_GPU_LOST not in active and not no_gpu
        target = None
        if can_actuate:
            target, cap = target_limit(level, original, mn, cfg.warn_limit_fraction, psu_limit_w)
            if cap is not None:
                values["psu_limit_w"] = cap
                hit(R_PSU_BUDGET, "psu")

        reasons = ordered(active)
        if held:
            reasons.append(R_HOLD)
        values["sources"] = {r: active[r] for r in reasons if r in active}
        changed = level != prev_level or target != self.target_limit_w or reasons != self.reasons
        self.target_limit_w = target
        self.reasons = reasons
        return Decision(
            level=level,
            target_limit_w=target,
            reasons=reasons,
            values=values,
            changed=changed,
            eta_s=eta,
            module_id=self.module_id or (module.module_id if module is not None else None),
            gpu_uuid=self.gpu_uuid or (sample.uuid if sample is not None else None),
            at=now,
            previous_level=prev_level,
            can_actuate=can_actuate,
            want_auto=want_auto,
        )
