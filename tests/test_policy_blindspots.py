"""Blind spots of the policy (issue 9, part 4): telemetry that repeats is silence; a
module held below automatic cooling while hot, one that lost a sensor, or one whose
tach cannot be trusted raises WARN with its own reason, and clears with hysteresis.

Pure: time is injected; the module is a ModuleStatus as its link would fill it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modbridge.gpu.base import GpuSample
from modbridge.model import ModuleStatus
from modbridge.policy.blindspots import sensor_faults
from modbridge.policy.engine import (
    CRITICAL,
    NORMAL,
    REASON_LEVELS,
    REASONS,
    TACH_CONFIRM_S,
    WARN,
    PairPolicy,
    PolicyConfig,
)
from protocol import catalog as C

WARN_C = 84.0  # H200: NVML max operating 87 - 3
HOT_C = WARN_C - PolicyConfig().manual_hot_margin_c  # 74


def gpu(temp=60.0) -> GpuSample:
    return GpuSample(
        uuid="GPU-0", temperature_c=temp, power_w=600.0, enforced_limit_w=700.0,
        default_limit_w=700.0, min_limit_w=200.0, max_limit_w=700.0,
        slowdown_temp_c=89.0, shutdown_temp_c=95.0, max_operating_temp_c=87.0,
    )  # fmt: skip


def module(now, *, uptime=None, seq=None, state=C.STATE_HOSTED, reason=C.REASON_HOST_OK,
           faults=0, ntc_c=None, duty=0.5, target_c=0.0, **tel) -> ModuleStatus:  # fmt: skip
    telemetry = {
        "state": state, "reason": reason, "faults": faults,
        "temp_vram": 55000, "temp_mos": 60000, "temp_amb": 30000,
        "fan1_rpm": 2000, "fan2_rpm": 2000,
        "fan1_duty": round(duty * C.DUTY_MAX), "fan2_duty": round(duty * C.DUTY_MAX),
        "v_in": 12000, "p_in": 600000,
    }  # fmt: skip
    if uptime is not None:
        telemetry["uptime_s"] = uptime
    if ntc_c is not None:
        telemetry["temp_gpu"] = round(ntc_c * 1000)
    if target_c is not None:
        telemetry["target"] = round(target_c * 1000)
    telemetry.update(tel)
    return ModuleStatus(port="/dev/null", module_id="m1", link_up=True, last_frame_at=now,
                        fans=2, telemetry=telemetry, telemetry_seq=seq)  # fmt: skip


def test_new_reasons_are_warn_and_listed():
    for r in ("sensor_fault", "tach_implausible", "manual_low_duty"):
        assert REASON_LEVELS[r] == WARN and r in REASONS
    assert REASONS.index("under_voltage") < REASONS.index("sensor_fault")
    assert REASONS.index("manual_low_duty") < REASONS.index("sensor_disagree")


# --- stale telemetry is silence ---------------------------------------------------------
def test_frozen_uptime_is_silence_after_stale_telemetry_s():
    p = PairPolicy(PolicyConfig(stale_telemetry_s=3.0))
    for k in range(10):  # healthy: 1 Hz telemetry, uptime counting
        d = p.evaluate(float(k), module(float(k), uptime=100 + k, ntc_c=58.0), gpu())
        assert d.level == NORMAL, d.reasons
    # now byte-identical frames keep arriving: fresh frame age, frozen uptime
    levels = {}
    for k in range(10, 20):
        d = p.evaluate(float(k), module(float(k), uptime=109, ntc_c=58.0), gpu())
        levels[k] = d.level
    assert levels[12] == NORMAL and levels[13] == CRITICAL  # frozen since t = 9: > 3 s at 13
    assert d.reasons == ["module_silent"]
    assert d.values["sources"]["module_silent"] == ["telemetry_stale"]
    assert d.values["telemetry_stale_s"] == 10.0
    assert "temp_gpu_c" not in d.values  # stale telemetry is not trusted either


def test_frozen_sequence_number_is_silence_too():
    p = PairPolicy(PolicyConfig(stale_telemetry_s=3.0))
    for k in range(10):
        d = p.evaluate(float(k), module(float(k), uptime=k, seq=7), gpu())
    assert d.reasons == ["module_silent"] and d.values["telemetry_stale_s"] == 9.0


def test_default_stale_time_follows_module_silent_s_but_not_below_3_s():
    p = PairPolicy(PolicyConfig(module_silent_s=1.0))  # a fast test config
    for k in range(6):
        t = k * 0.5
        d = p.evaluate(t, module(t, uptime=k // 2), gpu())  # uptime in whole seconds
        assert d.level == NORMAL
    p = PairPolicy(PolicyConfig(module_silent_s=5.0))
    for k in range(7):
        d = p.evaluate(float(k), module(float(k), uptime=1), gpu())
    assert d.level == CRITICAL and d.values["telemetry_stale_s"] == 6.0


def test_telemetry_advancing_again_is_fresh_and_a_reset_uptime_counts_as_progress():
    p = PairPolicy(PolicyConfig(stale_telemetry_s=3.0, min_hold_s=0.0))
    for k in range(6):
        d = p.evaluate(float(k), module(float(k), uptime=5), gpu())
    assert d.level == CRITICAL
    d = p.evaluate(6.0, module(6.0, uptime=0), gpu())  # the module rebooted
    assert "module_silent" not in d.reasons


def test_no_uptime_no_seq_no_staleness_judgement():
    p = PairPolicy(PolicyConfig(stale_telemetry_s=1.0))
    for k in range(10):
        d = p.evaluate(float(k), module(float(k)), gpu())
    assert d.level == NORMAL


# --- MANUAL below automatic while hot -----------------------------------------------------
def test_manual_at_the_floor_while_hot_warns():
    p = PairPolicy(PolicyConfig())
    m = module(0.0, state=C.STATE_MANUAL, reason=C.REASON_MANUAL_OVERRIDE, duty=0.3,
               target_c=6.0, ntc_c=72.0)  # fmt: skip
    d = p.evaluate(0.0, m, gpu(HOT_C + 1))
    assert (d.level, d.reasons) == (WARN, ["manual_low_duty"])
    assert d.values["manual"] == {"duty_pct": pytest.approx(30.0, abs=1e-2), "target_error_c": 6.0,
                                  "hot_c": HOT_C}  # fmt: skip


@pytest.mark.parametrize(
    "kw, gpu_c",
    [
        ({"duty": 0.3, "target_c": 6.0}, HOT_C - 1),  # not hot: the module copes
        ({"duty": 1.0, "target_c": 6.0}, HOT_C + 1),  # full duty: automatic cannot do more
        ({"duty": 0.3, "target_c": -2.0}, HOT_C + 1),  # below its setpoint: auto would not raise
        ({"duty": 0.3, "target_c": 6.0, "state": C.STATE_HOSTED}, HOT_C + 1),  # automatic
    ],
)
def test_manual_not_below_automatic_or_not_hot_is_normal(kw, gpu_c):
    kw.setdefault("state", C.STATE_MANUAL)
    p = PairPolicy(PolicyConfig())
    assert p.evaluate(0.0, module(0.0, **kw), gpu(gpu_c)).level == NORMAL


def test_manual_without_a_valid_sensor_is_below_automatic_full():
    p = PairPolicy(PolicyConfig())
    m = module(0.0, state=C.STATE_MANUAL, duty=0.5, target_c=None)
    assert p.evaluate(0.0, m, gpu(HOT_C + 1)).reasons == ["manual_low_duty"]


def test_manual_low_duty_clears_with_hysteresis():
    cfg = PolicyConfig(min_hold_s=0.0, sensor_clear_s=10.0)
    p = PairPolicy(cfg)

    def at(t, gpu_c, **kw):
        kw.setdefault("state", C.STATE_MANUAL)
        return p.evaluate(t, module(t, duty=0.3, target_c=6.0, **kw), gpu(gpu_c)).reasons

    assert at(0.0, HOT_C + 1) == ["manual_low_duty"]
    assert at(1.0, HOT_C - 1) == ["manual_low_duty"]  # within hysteresis_c (3 degC)
    assert at(2.0, HOT_C - cfg.hysteresis_c) == ["manual_low_duty"]  # condition off at 1 s...
    assert at(11.0, HOT_C - cfg.hysteresis_c) == ["manual_low_duty"]  # ...held sensor_clear_s
    assert at(12.5, HOT_C - cfg.hysteresis_c) == []
    assert at(13.0, HOT_C + 1) == ["manual_low_duty"]
    assert at(14.0, HOT_C + 1, state=C.STATE_HOSTED) == ["manual_low_duty"]  # held
    assert at(24.5, HOT_C + 1, state=C.STATE_HOSTED) == []


def _manual_hot(p, t, state=C.STATE_MANUAL):
    m = module(t, state=state, duty=0.3, target_c=6.0, ntc_c=72.0)
    return p.evaluate(t, m, gpu(HOT_C + 1))


def test_return_to_auto_is_off_by_default():
    p = PairPolicy(PolicyConfig())
    assert not any(_manual_hot(p, t / 2).want_auto for t in range(200))
    assert _manual_hot(p, 100.0).reasons == ["manual_low_duty"]


def test_return_to_auto_asks_at_once_then_backs_off_once_per_episode():
    p = PairPolicy(PolicyConfig(return_to_auto=True, return_to_auto_retry_s=10.0))
    asks = [t / 2 for t in range(0, 200) if _manual_hot(p, t / 2).want_auto]
    assert asks == [0.0, 10.0, 30.0, 70.0]  # 10, 20, 40 s apart
    d = _manual_hot(p, 100.0, state=C.STATE_HOSTED)  # back in automatic: reason held...
    assert d.reasons == ["manual_low_duty"] and not d.want_auto  # ...but nothing to ask
    d = _manual_hot(p, 101.0)  # MANUAL again: a new episode, asked at once
    assert d.want_auto and d.values["return_to_auto"] == {"attempt": 1, "episode": 2}
    assert d.as_event()["want_auto"] is True


def test_return_to_auto_not_for_a_module_that_is_not_below_automatic():
    p = PairPolicy(PolicyConfig(return_to_auto=True))
    m = module(0.0, state=C.STATE_MANUAL, duty=1.0, target_c=6.0)  # full: nothing to gain
    d = p.evaluate(0.0, m, gpu(HOT_C + 1))
    assert not d.want_auto and "want_auto" not in d.as_event()


def test_return_to_auto_config_keys_are_checked():
    with pytest.raises(ValueError, match="return_to_auto must be true or false"):
        PolicyConfig.from_dict({"return_to_auto": 1})
    with pytest.raises(ValueError, match="return_to_auto_retry_s must be >= 1"):
        PolicyConfig.from_dict({"return_to_auto_retry_s": 0.5})


# --- sensor faults and implausible tach -----------------------------------------------------
@pytest.mark.parametrize(
    "faults, state, reason",
    [
        (C.FAULT_NTC_GPU, C.STATE_FAILSAFE, C.REASON_SENSOR_OPEN),
        (C.FAULT_NTC_VRAM, C.STATE_FAILSAFE, C.REASON_SENSOR_SHORT),
        (C.FAULT_NTC_MOS | C.FAULT_NTC_STUCK, C.STATE_FAILSAFE, C.REASON_SENSOR_STUCK),
        (C.FAULT_NTC_GPU | C.FAULT_NTC_IMPLAUSIBLE, C.STATE_FAILSAFE, C.REASON_SENSOR_IMPLAUSIBLE),
        (C.FAULT_NTC_GPU, C.STATE_FAILSAFE, C.REASON_FAN_STALL),  # another cause shows first
        (0, C.STATE_FAILSAFE, C.REASON_SENSOR_STALE),  # the module says so
        (C.FAULT_NTC_AMB, C.STATE_FAILSAFE, C.REASON_SENSOR_OPEN),  # ambient made controlled
    ],
)
def test_a_sensor_fault_warns(faults, state, reason):
    p = PairPolicy(PolicyConfig())
    m = module(0.0, faults=faults, state=state, reason=reason)
    d = p.evaluate(0.0, m, gpu())
    assert d.level == WARN and "sensor_fault" in d.reasons
    assert d.values["sensor_fault"]


def test_an_open_ambient_ntc_the_module_does_not_control_on_is_not_a_warn():
    p = PairPolicy(PolicyConfig())
    m = module(0.0, faults=C.FAULT_NTC_AMB, state=C.STATE_HOSTED)
    assert p.evaluate(0.0, m, gpu()).level == NORMAL


BOTH_TACH = C.FAULT_FAN1_TACH | C.FAULT_FAN2_TACH


@pytest.mark.parametrize(
    "faults, fans", [(C.FAULT_FAN1_TACH, [1]), (C.FAULT_FAN2_TACH, [2]), (BOTH_TACH, [1, 2])]
)
def test_an_implausible_tach_warns_once_confirmed(faults, fans):
    p = PairPolicy(PolicyConfig())
    bad = dict(faults=faults, state=C.STATE_FAILSAFE, reason=C.REASON_TACH_IMPLAUSIBLE)
    for t in (0.0, 2.0, 4.5):
        d = p.evaluate(t, module(t, **bad), gpu())
        assert d.level == NORMAL and d.values["tach_implausible_fans"] == fans
    d = p.evaluate(TACH_CONFIRM_S, module(TACH_CONFIRM_S, **bad), gpu())
    assert (d.level, d.reasons) == (WARN, ["tach_implausible"])


def test_a_fan_spinning_down_into_a_stall_is_one_fan_stall_not_a_tach_warn_first():
    p = PairPolicy(PolicyConfig())
    reasons = []
    for k in range(20):
        t = k * 0.5
        if t < 3.0:  # the firmware: implausible while the fan slows, then the stall
            m = module(t, faults=C.FAULT_FAN1_TACH | C.FAULT_FAN2_TACH)
        else:
            m = module(t, faults=C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL)
        reasons.append(p.evaluate(t, m, gpu()).reasons)
    assert reasons[:6] == [[]] * 6
    assert all(r == ["both_fans_stalled"] for r in reasons[6:])


def test_a_flapping_sensor_fault_holds_its_reason_for_sensor_clear_s():
    p = PairPolicy(PolicyConfig(min_hold_s=0.0, sensor_clear_s=10.0))
    bad = dict(faults=C.FAULT_NTC_GPU, state=C.STATE_FAILSAFE, reason=C.REASON_SENSOR_OPEN)
    reasons = []
    for k in range(30):
        t = float(k)
        m = module(t, **bad) if k in (0, 4, 8) else module(t)
        reasons.append(p.evaluate(t, m, gpu()).reasons)
    assert all(r == ["sensor_fault"] for r in reasons[:19])  # on at 0, 4, 8: held to 18
    assert reasons[19] == [] and reasons[-1] == []


def test_a_silent_module_forgets_its_sensor_fault():
    p = PairPolicy(PolicyConfig(min_hold_s=0.0))
    p.evaluate(0.0, module(0.0, faults=C.FAULT_FAN1_TACH), gpu())
    d = p.evaluate(10.0, module(0.0, faults=C.FAULT_FAN1_TACH), gpu())  # 10 s old frame
    assert d.reasons == ["module_silent"]


# --- end to end: the real firmware in a virtual module, the bridge, the virtual GPU --------
def test_an_open_gpu_ntc_raises_warn_and_lowers_the_limit_end_to_end():
    """The issue's reproduction: an open NTC left the policy NORMAL at 700 W."""
    from e2e_helpers import ORIGINAL_W, WARN_W, bridged, wait_for

    with bridged() as r:
        assert r.gpu.power_limit_w() == ORIGINAL_W
        r.vm.world_fault("ntc_open", "gpu")
        wait_for(lambda: "sensor_fault" in r.pair().reasons, 10, "sensor_fault")
        assert r.pair().level == WARN
        wait_for(lambda: r.gpu.power_limit_w() == WARN_W, 5, "limit at 70 %")
        decision = r.events("decision", level="WARN")[-1]
        # the channel's fault bit can reach the bridge a frame before the firmware's
        # FAILSAFE(sensor_open): the logged decision names the channel, and the module's
        # sensor faults name the kind once the FAILSAFE has arrived
        assert decision["values"]["sensor_fault"][0] == "gpu"
        wait_for(lambda: sensor_faults(r.module()) == ["gpu", "sensor_open"], 10,
                 "sensor faults: gpu, sensor_open")  # fmt: skip
        r.vm.world_fault("ntc_open", "gpu", False)
        wait_for(lambda: r.events("power_limit", action="restore"), 30, "original limit back")
        assert r.gpu.power_limit_w() == ORIGINAL_W


@given(over=st.floats(min_value=1e-9, max_value=100.0),
       limit=st.floats(min_value=0.5, max_value=60.0))
def test_a_reported_stale_time_is_past_the_limit_it_exceeded(over, limit):
    """The stale time in a decision's values is in whole ms: rounded up, so a frame
    frozen a hair past ``stale_telemetry_s`` never reads as equal to it (round() did)."""
    from modbridge.policy.freshness import TelemetryFreshness

    fresh = TelemetryFreshness(PolicyConfig(stale_telemetry_s=limit))
    m = ModuleStatus(port="/dev/x")
    m.telemetry_seq, m.telemetry = 7, {"uptime_s": 100}
    assert fresh.stale_s(1000.0, m) is None  # first sight: progress noted
    stale = fresh.stale_s(1000.0 + limit + over, m)
    if stale is not None:  # frozen > limit in floating point
        assert stale > limit and stale - (limit + over) < 0.0011
