"""Conditions from a module's fresh telemetry: fans, temperatures, the 12 V input, and
the blind spots (:mod:`modbridge.policy.blindspots`). docs/policy.md, the table of
conditions.
"""

from __future__ import annotations

from modbridge.model import ModuleStatus
from modbridge.policy.blindspots import BlindSpots
from modbridge.policy.config import PolicyConfig
from modbridge.policy.hysteresis import Latches, temperature_reason
from modbridge.policy.levels import (
    R_BOTH_FANS_STALLED,
    R_CRITICAL_TEMP,
    R_FAN_STALL,
    R_OVER_TEMP,
    R_UNDER_VOLTAGE,
)
from modbridge.policy.thresholds import Thresholds
from protocol import catalog as C

# the channels the module's temperatures are judged on, with their names in values,
# latches and sources
_CHANNELS = tuple((ch, f"temp_{ch}_c", f"ntc_{ch}:module", f"ntc_{ch}") for ch in
                  ("gpu", "vram", "mos"))  # fmt: skip


class ModuleRules:
    """The module's conditions for one pair, with their hysteresis."""

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.latches = Latches()  # per-channel temperatures and the 12 V input
        self.blind = BlindSpots(config)

    def forget(self) -> None:
        """The module went silent: its last telemetry is stale, its latches go."""
        self.latches.clear()
        self.blind.forget()

    def evaluate(self, module: ModuleStatus, th: Thresholds, values, hit, now, gpu_c):
        """Hit every active condition; returns the module's GPU NTC reading (degC)."""
        cfg = self.config
        faults = module.faults
        values["faults"] = module.fault_names()
        # fans
        stalled = module.stalled_fans()
        n_fans = module.fans or 2
        values["stalled_fans"] = stalled
        if stalled and stalled >= n_fans:
            hit(R_BOTH_FANS_STALLED, "module")
        elif stalled:
            hit(R_FAN_STALL, "module")
        # temperatures: the module's own limits (fault bits), then ours per channel
        if faults & C.FAULT_CRITICAL_TEMP:
            hit(R_CRITICAL_TEMP, "module_fault")
        elif faults & C.FAULT_OVER_TEMP:
            hit(R_OVER_TEMP, "module_fault")
        ntc_c = module.temperature_c("gpu")
        for (ch, value_key, latch_key, source), warn, crit in zip(
            _CHANNELS,
            (th.warn_c, cfg.vram_warn_temp_c, cfg.mos_warn_temp_c),
            (th.critical_c, cfg.vram_critical_temp_c, cfg.mos_critical_temp_c),
            strict=True,
        ):
            t = module.temperature_c(ch)
            values[value_key] = t
            reason = temperature_reason(self.latches, latch_key, t, warn, crit,
                                        cfg.hysteresis_c)  # fmt: skip
            if reason is not None:
                hit(reason, source)
        # 12 V input
        v = module.v_in_v
        values["v_in_v"] = v
        values["p_in_w"] = module.p_in_w
        if self.latches.below("uv:module", v, cfg.under_voltage_v, cfg.hysteresis_v):
            hit(R_UNDER_VOLTAGE, "v_in")
            values["under_voltage_v"] = cfg.under_voltage_v
        if faults & C.FAULT_UNDER_VOLTAGE:
            hit(R_UNDER_VOLTAGE, "module_fault")
        self.blind.evaluate(module, th, values, hit, now, gpu_c, ntc_c)
        return ntc_c
