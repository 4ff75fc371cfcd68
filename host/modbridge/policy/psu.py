"""The PSU budget guard: GPUs on one supply kept within ``capacity * margin``.

See :class:`PsuGuard` and docs/policy.md, "PSU guard".
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from modbridge.policy.config import PolicyConfig, PolicyConfigError
from modbridge.policy.decision import clamp, round_w


@dataclass
class PsuMember:
    """One GPU on the guarded supply. Powers in W; None = unknown."""

    p_in_w: float | None  # the module's measured 12 V input (what the guard sums)
    gpu_power_w: float | None = None  # the GPU's own reading: used when p_in_w is unknown
    min_limit_w: float | None = None
    original_limit_w: float | None = None


@dataclass
class PsuVerdict:
    active: bool
    changed: bool  # active or any cap differs from the previous verdict
    total_w: float
    budget_w: float
    caps_w: dict  # key -> cap in W (only while active)
    values: dict = field(default_factory=dict)


def fit_budget(weights_w: Mapping, floors_w: Mapping, budget_w: float) -> dict:
    """Caps ``max(floor, s * weight)`` with one scale ``s <= 1`` so they sum to the budget.

    Water-filling: members pinned at their floor are taken out and the rest re-scaled.
    When even the floors exceed the budget every member gets its floor.

    >>> fit_budget({"a": 450, "b": 350, "c": 200}, {"a": 100, "b": 100, "c": 150}, 675)
    {'a': 295.3125, 'b': 229.6875, 'c': 150.0}
    """
    keys = list(weights_w)
    floor = {k: float(floors_w.get(k) or 0.0) for k in keys}
    pinned: set = set()
    while True:
        free = [k for k in keys if k not in pinned]
        room = budget_w - sum(floor[k] for k in pinned)
        weight = sum(weights_w[k] for k in free)
        if not free or room <= 0 or weight <= 0:
            return {k: floor[k] if k in pinned or room <= 0 else max(floor[k], 0.0) for k in keys}
        s = min(room / weight, 1.0)
        newly = {k for k in free if s * weights_w[k] < floor[k]}
        if not newly:
            return {k: floor[k] if k in pinned else s * weights_w[k] for k in keys}
        pinned |= newly


class PsuGuard:
    """Keeps the GPUs on one supply within ``capacity_w * margin``.

    Engages when the summed draw exceeds the budget. While engaged every member's cap
    is its original limit scaled by one common factor (floored at its minimum limit,
    rounded down to ``step_w``) so the caps sum to the budget: fair, and stable (the
    caps do not chase a noisy draw). Releases once the demand *as it would be
    uncapped* falls below ``budget * release_fraction`` and ``hold_s`` has passed:
    a GPU drawing within 5 % of its cap is assumed to want its original limit, so a
    capped load does not look like a light one.
    """

    PINNED_FRACTION = 0.95  # draw >= this * cap: the cap is what holds the GPU back

    def __init__(
        self,
        capacity_w: float,
        margin: float = 0.9,
        release_fraction: float = 0.8,
        step_w: float = 5.0,
        hold_s: float = 0.0,
    ):
        if not capacity_w or capacity_w <= 0:
            raise PolicyConfigError("policy config: psu_capacity_w must be > 0")
        self.capacity_w = float(capacity_w)
        self.margin = float(margin)
        self.release_fraction = float(release_fraction)
        self.step_w = float(step_w)
        self.hold_s = float(hold_s)
        self.active = False
        self.active_since: float | None = None
        self.caps_w: dict = {}

    @classmethod
    def from_config(cls, cfg: PolicyConfig) -> PsuGuard | None:
        if cfg.psu_capacity_w is None:
            return None
        return cls(
            cfg.psu_capacity_w,
            cfg.psu_margin,
            cfg.psu_release_fraction,
            cfg.psu_step_w,
            cfg.min_hold_s,
        )

    @property
    def budget_w(self) -> float:
        return self.capacity_w * self.margin

    def evaluate(self, now: float, members: Mapping[Hashable, PsuMember]) -> PsuVerdict:
        """One tick over the members on this supply (keyed as the caller likes)."""
        draws, unmeasured = {}, []
        for key, m in members.items():
            d = m.p_in_w if m.p_in_w is not None else m.gpu_power_w
            if d is None:
                unmeasured.append(key)
                d = 0.0
            draws[key] = max(float(d), 0.0)
        total = sum(draws.values())
        budget = self.budget_w
        was_active, old_caps = self.active, self.caps_w
        demand = total
        if self.active:
            demand = 0.0
            for k, d in draws.items():
                cap, orig = old_caps.get(k), members[k].original_limit_w
                pinned = cap is not None and d >= self.PINNED_FRACTION * cap
                demand += orig if pinned and orig is not None and orig > d else d
        if not self.active and total > budget:
            self.active, self.active_since = True, now
        elif (
            self.active
            and demand < budget * self.release_fraction
            and now - self.active_since >= self.hold_s
        ):
            self.active, self.active_since = False, None
        caps = {}
        if self.active:
            weights = {
                k: m.original_limit_w if m.original_limit_w is not None else draws[k]
                for k, m in members.items()
            }
            floors = {k: m.min_limit_w for k, m in members.items()}
            for k, w in fit_budget(weights, floors, budget).items():
                m = members[k]
                if self.step_w > 0:
                    w = math.floor(w / self.step_w + 1e-9) * self.step_w
                caps[k] = clamp(round_w(w), m.min_limit_w, m.original_limit_w)
        self.caps_w = caps
        values = {
            "total_w": round(total, 3),
            "demand_w": round(demand, 3),
            "budget_w": budget,
            "capacity_w": self.capacity_w,
            "release_below_w": budget * self.release_fraction,
        }
        if unmeasured:
            values["unmeasured"] = [str(k) for k in unmeasured]
        if self.active and sum(m.min_limit_w or 0.0 for m in members.values()) > budget:
            values["cannot_fit"] = True  # every GPU at its minimum is still too much
        return PsuVerdict(
            active=self.active,
            changed=self.active != was_active or caps != old_caps,
            total_w=total,
            budget_w=budget,
            caps_w=caps,
            values=values,
        )
