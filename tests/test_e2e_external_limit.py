"""Issue 9, "An operator's limit is overridden": after ``nvidia-smi -pl 400`` a fan
stall made the bridge "lower" the limit to 490 W (raising it), then "restore" 700 W
(b2cd58d).

Reproduction through the real bridge on a virtual module: the operator's change is
written to the virtual GPU behind the bridge's back (as ``nvidia-smi -pl`` would be),
before a fan stall and while one is active. The bridge logs it (``power_limit``,
action ``external``) and treats it as docs/bridge.md says ("The current limit is the
truth"): the operator's value is the new original, the policy's cuts are fractions of
it, and nothing the bridge writes is ever above it.
"""

from __future__ import annotations

import pytest
from e2e_helpers import ORIGINAL_W, WARN_W, bridged, wait_for

from modbridge.policy.engine import NORMAL, WARN

FRACTION = 0.7  # warn_limit_fraction


class RecordingBackend:
    """The virtual backend, recording every power-limit write with the limit before it."""

    def __init__(self, inner):
        self._inner = inner
        self.name = inner.name
        self.writes: list[tuple[float, float]] = []  # (watts, enforced before)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def set_power_limit_w(self, uuid, watts):
        before = self._inner.sample(uuid).enforced_limit_w
        self.writes.append((watts, before))
        return self._inner.set_power_limit_w(uuid, watts)


def externals(r):
    return r.events("power_limit", action="external")


def stall_then_clear(r, expect_w):
    r.vm.world_fault("fan_stall", 0)
    wait_for(lambda: r.pair().level == WARN, 10, "WARN on one stalled fan")
    wait_for(lambda: r.gpu.power_limit_w() == pytest.approx(expect_w), 5, f"{expect_w} W")
    r.vm.world_fault("fan_stall", 0, False)


def test_an_operator_limit_set_before_a_fault_is_the_original(tmp_path):
    with bridged(backend_wrap=RecordingBackend, state_dir=tmp_path) as r:
        r.gpu.set_power_limit_w(400.0)  # nvidia-smi -pl 400
        [ext] = wait_for(lambda: externals(r), 5, "the external change logged")
        assert "700 W -> 400 W" in ext["message"] and ext["previous_original_w"] == ORIGINAL_W
        stall_then_clear(r, FRACTION * 400.0)  # 280 W, never 490
        wait_for(lambda: r.pair().level == NORMAL, 15, "NORMAL again")
        wait_for(lambda: r.events("power_limit", action="restore"), 5, "the restore")
        assert r.gpu.power_limit_w() == 400.0  # the operator's value, not 700
        writes = r.bridge.backend.writes
        assert [w for w, _ in writes] == [280.0, 400.0], writes
        assert all(w <= 400.0 for w, _ in writes)
        assert r.bridge.limiters[r.gpu.uuid].original_w == 400.0
    assert r.gpu.power_limit_w() == 400.0  # and the stop left it there


@pytest.mark.parametrize("operator_w", [400.0, 600.0])
def test_an_operator_limit_set_while_a_fault_holds_a_cut(tmp_path, operator_w):
    """Below the hold (400 < 490): the hold is over and 400 is the original. Above it
    (600): it is the original too, and the bridge writes a cut again at once."""
    with bridged(backend_wrap=RecordingBackend, state_dir=tmp_path) as r:
        r.vm.world_fault("fan_stall", 0)
        wait_for(lambda: r.gpu.power_limit_w() == WARN_W, 10, "the WARN cut")
        r.gpu.set_power_limit_w(operator_w)
        [ext] = wait_for(lambda: externals(r), 5, "the external change logged")
        assert ext["previous_original_w"] == ORIGINAL_W
        cut = FRACTION * operator_w  # the policy's cut of the new original
        wait_for(lambda: r.gpu.power_limit_w() == pytest.approx(cut), 5, f"{cut} W")
        assert r.pair().level == WARN
        r.vm.world_fault("fan_stall", 0, False)
        wait_for(lambda: r.pair().level == NORMAL, 15, "NORMAL again")
        wait_for(lambda: r.gpu.power_limit_w() == operator_w, 5, "the operator's limit")
        writes = r.bridge.backend.writes
        assert writes[0][0] == WARN_W
        after = [w for w, _ in writes[1:]]
        assert after[-1] == operator_w and all(w <= operator_w for w in after), writes
        # a lowering write never raised the limit it found
        assert all(w <= before for w, before in writes[:-1]), writes
