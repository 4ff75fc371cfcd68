"""Issue 9, "Blind spots": a module set to MANUAL by another process kept the policy
NORMAL until the die reached over-temperature (b2cd58d).

Reproduction against a virtual module through the real bridge: a second writer on the
module's serial port (``host_write``, signed with the module's key on its own link id,
as another tool on the same host would) puts it in MANUAL. The firmware refuses 0 %
(below its compiled MANUAL floor, 30 %) and takes 30 %; in the 2U H200 chassis at full
load that is below what automatic control commands, the GPU runs hot, and the policy
goes WARN with ``manual_low_duty``. With ``[policy] return_to_auto`` the bridge then
sends a signed ``fan_mode auto`` (once; the episode is over when the module is back)
and the module returns to automatic control.
"""

from __future__ import annotations

import pytest
from e2e_helpers import WARN_W, bridged, wait_for

from device.floors import FLOOR_MANUAL
from modbridge.policy.engine import NORMAL, WARN
from protocol import catalog as C

MANUAL = C.FAN_MODES.index("manual")
SPEED = 20.0
WARM_ROOM_C = 32.0  # the 2U chassis' inlet 2 degC above its usual 30: hot at 30 % duty


def answer(vm, seq):
    """The firmware's ack/nack to the second writer's request ``seq`` (None: not yet)."""
    for name, fields in list(vm.messages):
        if name in ("ack", "nack") and fields.get("ref") == seq:
            return name, fields
    return None


def second_writer(vm, seq, duty):
    """Another process on the module's port: signed ``fan_mode manual`` at ``duty``."""
    wait_for(lambda: vm.nonce is not None, 10, "the module's nonce")
    vm.host_write(vm.encode("fan_mode", {"mode": MANUAL, "duty1": duty, "duty2": duty}, seq))
    return wait_for(lambda: answer(vm, seq), 10, f"an answer to request {seq}")


def test_manual_from_another_process_warns_and_is_returned_to_auto():
    with bridged("hold 700W 2h", world="h200_2u", speed=SPEED, ambient_c=WARM_ROOM_C,
                 return_to_auto=True, min_hold_s=5.0) as r:  # fmt: skip
        # 0 %: the firmware's own defence refuses it
        name, nack = second_writer(r.vm, 40001, 0)
        assert name == "nack" and nack["field"] == "duty1", nack
        assert r.module().state != "MANUAL"
        # the MANUAL floor: taken, and below automatic while hot
        floor = FLOOR_MANUAL  # 30 %
        assert second_writer(r.vm, 40002, floor)[0] == "ack"
        # MANUAL, seen in the telemetry or already acted on: at 5 Hz telemetry the
        # bridge can decide and ask for auto before this poll sees the state
        wait_for(lambda: r.module().state == "MANUAL" or r.decisions("manual_low_duty"),
                 10, "MANUAL")  # fmt: skip
        [warn] = wait_for(lambda: r.decisions("manual_low_duty"), 120, "manual_low_duty")
        assert warn["level"] == "WARN" and warn["target_w"] == WARN_W
        assert warn["want_auto"] is True and warn["values"]["return_to_auto"]["attempt"] == 1
        # what the fans get: the MANUAL duty, or a safety floor above it; below full
        assert floor / C.DUTY_MAX - 1e-3 <= warn["values"]["manual"]["duty_pct"] / 100 < 0.98
        assert warn["values"]["gpu_temp_c"] > warn["values"]["manual"]["hot_c"]
        # the bridge asks once, signed through its link; the module is back in automatic
        [ask] = wait_for(lambda: r.events("fan_mode", result="ok"), 20, "fan_mode auto")
        assert ask["action"] == "auto" and ask["attempt"] == 1 and ask["episode"] == 1
        wait_for(lambda: r.module().state == "HOSTED", 10, "automatic control again")
        # WARN until it did, then NORMAL after sensor_clear_s and the hold
        wait_for(lambda: r.pair().level == NORMAL, 60, "the policy back to NORMAL")
        assert len(r.events("fan_mode")) == 1  # one request for the episode
        levels = [e["level"] for e in r.events("decision")]
        assert "WARN" in levels and levels[-1] == "NORMAL"
        assert r.gpu.power_limit_w() == pytest.approx(700.0)
        assert r.bridge.tick_errors == 0


def test_without_return_to_auto_the_module_stays_manual_and_the_limit_lowered():
    """The default: the bridge does not fight another controller; WARN holds the cut."""
    with bridged("hold 700W 2h", world="h200_2u", speed=SPEED, ambient_c=WARM_ROOM_C,
                 min_hold_s=5.0) as r:  # fmt: skip
        assert second_writer(r.vm, 40003, FLOOR_MANUAL)[0] == "ack"
        wait_for(lambda: r.decisions("manual_low_duty"), 120, "manual_low_duty")
        wait_for(lambda: r.gpu.power_limit_w() <= WARN_W + 0.5, 10, "the WARN cut")
        ticks = r.bridge.ticks
        wait_for(lambda: r.bridge.ticks > ticks + 20, 10, "more ticks")
        assert r.module().state == "MANUAL" and r.pair().level == WARN  # sensor_clear_s
        assert not r.events("fan_mode")
        assert not any(e.get("want_auto") for e in r.events("decision"))
