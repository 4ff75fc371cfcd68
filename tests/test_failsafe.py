"""The fail-safe supervisor on its own: every transition, its reason, floors and events."""

from array import array

from mpcompat import heap_locked, raises

from device import config
from device import safety as SF
from device.failsafe import EventQueue, Supervisor
from protocol import catalog as C

DUAL = True

CFG = config.defaults()
S = CFG["safety"]
OK = array("i", [45000, 50000, 55000, 25000])


def sup():
    s = Supervisor(CFG)
    return s


def step(
    s,
    temps=OK,
    open_m=0,
    short_m=0,
    stall=0,
    pm=False,
    uv=False,
    host=False,
    manual=False,
    booted=True,
):
    return s.update(temps, open_m, short_m, stall, pm, uv, host, manual, booted, 12000)


def drain(s):
    out = []
    while s.events.count:
        out.append(s.events.pop())
    return out


def test_boot_holds_the_boot_floor_until_sensors_are_read():
    s = sup()
    step(s, booted=False)
    assert s.state == C.STATE_BOOT and s.causes == SF.CAUSE_BOOT
    assert step(s) is True
    assert s.state == C.STATE_STANDALONE and s.reason == C.REASON_BOOT
    assert s.causes == 0  # no host seen yet: the control law alone decides
    ev = drain(s)
    assert [(e["prev_state"], e["state"]) for e in ev] == [(C.STATE_BOOT, C.STATE_STANDALONE)]


def test_host_comes_and_goes():
    s = sup()
    step(s)
    step(s, host=True)
    assert s.state == C.STATE_HOSTED and s.reason == C.REASON_HOST_OK
    drain(s)
    step(s, host=False)
    assert s.state == C.STATE_STANDALONE and s.reason == C.REASON_HOST_TIMEOUT
    assert s.faults & C.FAULT_HOST_TIMEOUT
    assert s.causes == SF.CAUSE_HOST_LOST
    ev = drain(s)
    assert len(ev) == 1 and ev[0]["severity"] == C.SEV_WARNING
    assert step(s, host=False) is False and drain(s) == []  # transitions only


def test_manual_needs_a_live_host():
    s = sup()
    step(s, host=True, manual=True)
    assert s.state == C.STATE_MANUAL and s.reason == C.REASON_MANUAL_OVERRIDE
    step(s, host=False, manual=True)
    assert s.state == C.STATE_STANDALONE and s.reason == C.REASON_HOST_TIMEOUT


def test_each_failsafe_cause_and_its_floor():
    cases = (
        (dict(open_m=1), C.REASON_SENSOR_OPEN, SF.CAUSE_SENSOR),
        (dict(short_m=2), C.REASON_SENSOR_SHORT, SF.CAUSE_SENSOR),
        (dict(stall=2), C.REASON_FAN_STALL, SF.CAUSE_STALL),
        (
            dict(temps=array("i", [86000, 50000, 55000, 25000])),
            C.REASON_OVER_TEMP,
            SF.CAUSE_OVER,
        ),
        (
            dict(temps=array("i", [45000, 50000, 126000, 25000])),
            C.REASON_CRITICAL_TEMP,
            SF.CAUSE_OVER | SF.CAUSE_CRIT,
        ),
    )
    for kw, reason, causes in cases:
        s = sup()
        step(s, host=True)
        drain(s)
        assert step(s, host=True, manual=True, **kw) is True
        assert s.state == C.STATE_FAILSAFE and s.reason == reason, (kw, s.reason)
        assert s.causes == causes, (kw, s.causes, causes)
        ev = drain(s)
        assert ev[-1]["state"] == C.STATE_FAILSAFE and ev[-1]["code"] == reason
        # cleared: back to HOSTED, and the fault's clearing is an event too
        step(s, host=True)
        # temperatures need the hysteresis to clear
        assert s.state == C.STATE_HOSTED, (kw, s.state)
        ev = drain(s)
        assert any(not e["active"] for e in ev) and ev[-1]["state"] == C.STATE_HOSTED


def test_maximum_of_causes_wins_and_priorities():
    s = sup()
    step(s, open_m=1, stall=1, temps=array("i", [45000, 96000, 55000, 25000]))
    assert s.reason == C.REASON_CRITICAL_TEMP and s.causes & SF.CAUSE_CRIT
    assert s.causes & SF.CAUSE_STALL and s.causes & SF.CAUSE_SENSOR
    s = sup()
    step(s, open_m=1, stall=1)
    assert s.reason == C.REASON_FAN_STALL and s.causes == SF.CAUSE_STALL | SF.CAUSE_SENSOR
    # critical beats even BOOT
    s = sup()
    step(s, booted=False, temps=array("i", [99000, 50000, 55000, 25000]))
    assert s.reason == C.REASON_CRITICAL_TEMP and s.causes & SF.CAUSE_CRIT


def test_ambient_fault_is_reported_not_failsafe():
    s = sup()
    step(s, host=True)
    drain(s)
    step(s, host=True, open_m=8)
    assert s.state == C.STATE_HOSTED and s.faults & C.FAULT_NTC_AMB
    ev = drain(s)
    assert len(ev) == 1 and ev[0]["index"] == 3 and ev[0]["severity"] == C.SEV_WARNING


def test_temperature_hysteresis():
    s = sup()
    warn = CFG["channels"][0]["warn_mc"]
    step(s, temps=array("i", [warn + 100, 50000, 55000, 25000]))
    assert s.state == C.STATE_FAILSAFE
    step(s, temps=array("i", [warn - 1000, 50000, 55000, 25000]))  # inside the band
    assert s.state == C.STATE_FAILSAFE
    step(s, temps=array("i", [warn - 2500, 50000, 55000, 25000]))
    assert s.state == C.STATE_STANDALONE


def test_power_monitor_and_under_voltage_events():
    s = sup()
    step(s, host=True)
    drain(s)
    step(s, host=True, uv=True)
    step(s, host=True, uv=True)
    step(s, host=True, uv=False, pm=True)
    ev = drain(s)
    codes = [(e["code"], e["active"]) for e in ev]
    # within one tick the power-monitor edge is queued before the under-voltage one
    assert codes == [
        (C.REASON_UNDER_VOLTAGE, True),
        (C.REASON_POWER_MONITOR_FAULT, True),
        (C.REASON_UNDER_VOLTAGE, False),
    ], codes
    assert s.state == C.STATE_HOSTED


def test_event_queue_bounded_drops_oldest():
    q = EventQueue(4)
    for i in range(6):
        q.push(i, 0, True, -1, i, 0, 0)
    assert q.count == 4 and q.dropped == 2
    assert [q.pop()["code"] for _ in range(4)] == [2, 3, 4, 5]
    assert q.pop() is None


def test_update_does_not_allocate():
    s = sup()
    hot = array("i", [86000, 50000, 55000, 25000])

    def run():
        i = 0
        while i < 500:
            # alternate causes so every branch and the event ring run
            if i % 5 == 0:
                s.update(hot, 0, 0, 0, False, False, True, False, True, 12000)
            elif i % 5 == 1:
                s.update(OK, 1, 0, 2, True, True, False, True, True, 11000)
            else:
                s.update(OK, 0, 0, 0, False, False, True, False, True, 12000)
            i += 1

    heap_locked(run)
    assert s.events.count == s.events.cap  # ring full, oldest dropped, no growth


def test_stuck_implausible_and_tach_faults():
    s = sup()
    step(s, host=True)
    drain(s)
    s.update(OK, 0, 0, 0, False, False, True, False, True, 12000, 0, 1, 0)
    assert s.state == C.STATE_FAILSAFE and s.reason == C.REASON_SENSOR_STUCK
    assert s.faults & C.FAULT_NTC_STUCK and s.faults & C.FAULT_NTC_GPU
    assert s.causes == SF.CAUSE_SENSOR
    ev = drain(s)
    assert (ev[0]["code"], ev[0]["index"], ev[0]["active"]) == (C.REASON_SENSOR_STUCK, 0, True)
    s.update(OK, 0, 0, 0, False, False, True, False, True, 12000, 0, 0, 2)
    assert s.reason == C.REASON_SENSOR_IMPLAUSIBLE and s.faults & C.FAULT_NTC_IMPLAUSIBLE
    s.update(OK, 0, 0, 0, False, False, True, False, True, 12000, 2, 0, 0)
    assert s.reason == C.REASON_TACH_IMPLAUSIBLE and s.faults & C.FAULT_FAN2_TACH
    assert s.causes == SF.CAUSE_STALL
    # an ambient channel that is stuck is reported, not failsafe
    s.update(OK, 0, 0, 0, False, False, True, False, True, 12000, 0, 8, 0)
    assert s.state == C.STATE_HOSTED and s.faults & C.FAULT_NTC_AMB


def test_critical_is_capped_at_the_compiled_end():
    cfg = config.defaults()
    cfg["channels"][0]["crit_mc"] = 100000  # allowed by config; the hot floor ends at 95
    s = Supervisor(cfg)
    step(s, temps=array("i", [95500, 50000, 55000, 25000]))
    assert s.reason == C.REASON_CRITICAL_TEMP


def test_config_without_controlled_channel_is_refused():
    cfg = config.defaults()
    for ch in cfg["channels"]:
        ch["controlled"] = False
    with raises(config.ConfigError):
        config.validate(cfg)
