"""Issue 9, "Blind spots": a module sending byte-identical telemetry (frozen sequence
number and uptime) was fresh forever on b2cd58d.

Reproduction through the real bridge: the virtual module's ``telemetry_freeze`` fault
(host/modbridge/sim/faults.py) hands the host the same telemetry frame again, byte for
byte, while the firmware runs on. Frames keep arriving, so only the policy's
stale-telemetry rule can tell: silence (CRITICAL, ``module_silent`` from
``telemetry_stale``) within ``stale_telemetry_s``, the limit at the GPU's minimum, and
back to the original once the telemetry moves again.
"""

from __future__ import annotations

from e2e_helpers import MIN_W, ORIGINAL_W, bridged, wait_for

from modbridge.policy.engine import CRITICAL, NORMAL

FREEZE_AT_S, THAW_AT_S = 30, 150  # simulated seconds (20x: 1.5 s and 7.5 s of real time)
STALE_S = 3.0


def test_byte_identical_telemetry_is_silence_and_the_limit_goes_to_the_minimum():
    with bridged(faults=[f"telemetry_freeze@{FREEZE_AT_S}s-{THAW_AT_S}s"],
                 stale_telemetry_s=STALE_S) as r:  # fmt: skip
        freeze = wait_for(lambda: r.vm.__dict__.get("_relay_tx"), 10, "the freeze")
        [d] = wait_for(lambda: r.events("decision", level="CRITICAL"), 15, "CRITICAL")
        assert "module_silent" in d["reasons"], d
        assert d["values"]["sources"]["module_silent"] == ["telemetry_stale"], d["values"]
        assert d["values"]["telemetry_stale_s"] > STALE_S
        assert d["values"]["last_frame_age_s"] < 1.0  # frames kept coming: not a dead link
        assert freeze.repeated > 0 and r.module().link_up
        wait_for(lambda: r.gpu.power_limit_w() == MIN_W, 5, "the minimum limit")
        assert r.pair().level == CRITICAL
        # thawed: the telemetry moves, the module is heard again, the limit comes back
        wait_for(lambda: "_relay_tx" not in r.vm.__dict__, 15, "the thaw")
        wait_for(lambda: r.pair().level == NORMAL, 15, "NORMAL again")
        wait_for(lambda: r.gpu.power_limit_w() == ORIGINAL_W, 5, "the original limit")
        assert r.bridge.tick_errors == 0
