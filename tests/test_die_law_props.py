"""Property test of the hosted law on the die's margin (issue 25 items 2 and 3): for
arbitrary sequences of the host's die, the GPU's slowdown and power, and the four
probes, the real firmware (fake board, the safety harness checking every tick against
its raw-hardware oracle: floors I1, holds I2, ...) never runs a fan below what the
floors demand, and raises an over-temperature alarm no later than the die reaches
slowdown - 2 degC.

The oracle is written from the issue and docs/safety.md, not from device/: a fresh
die at or above slowdown - 2 degC is a warning at the latest (``ALARM_BELOW_MC``); the
die-margin floor ramps from the fans' minimum at slowdown - 4 to 100 % at slowdown - 1
(tests/oracle_floors.py); the harness's I7 checks the alarm on every tick too."""

import oracle_floors as O
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safety_harness import Harness

from protocol import catalog as C

ALARM_BELOW_MC = 2000  # the spec: warn no later than the die at slowdown - 2 degC

_step = st.tuples(
    st.integers(30000, 100000),  # the host's die, m degC (NVML: any value taken)
    st.sampled_from((0, 100000, 320000, 450000, 700000)),  # GPU power, mW
    st.integers(-5, 5),  # the GPU NTC's move this step, degC (plausible: <= 5/s)
    st.sampled_from((20, 40, 60, 75, 85, 88, 92)),  # VRAM probe, degC
    st.sampled_from((30, 60, 90, 105, 112)),  # MOSFET probe, degC
    st.sampled_from((200, 1000, 3000)),  # how long this step lasts, ms
)


def _ramp(h, ch, frm, to):
    t = frm
    while t != to:
        t = min(t + 5, to) if to > t else max(t - 5, to)
        h.set_temp(ch, t)
        h.advance(1000)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    slowdown=st.sampled_from((80000, 83000, 87000, 92000)),
    steps=st.lists(_step, min_size=5, max_size=25),
)
def test_hosted_floors_hold_and_the_alarm_comes_by_slowdown_minus_2(slowdown, steps):
    h = Harness()  # checks I1..I7 on every tick (raises InvariantError)
    h.hb_slowdown = slowdown
    h.hb_temp = 60000
    h.host(True)
    ntc = 30
    _ramp(h, 0, 30, 60)
    ntc = 60
    vram = 30
    mos = 30
    for die, power, move, v, m, ms in steps:
        h.hb_temp = die
        h.hb_power = power
        ntc = max(20, min(110, ntc + move))
        h.set_temp(0, ntc)
        if v != vram:
            _ramp(h, 1, vram, v)
            vram = v
        if m != mos:
            _ramp(h, 2, mos, m)
            mos = m
        h.advance(ms)
        app = h.app
        if app.sup.state == C.STATE_BOOT or not h.host_on:
            continue
        # the module has ticked on a fresh heartbeat (the harness knows when)
        d = h._fresh_die()
        if d is None:
            continue
        die = d[0]
        floor = O.die_floor(die, slowdown)
        assert min(app.fans[0].duty, app.fans[1].duty) >= floor, (die, slowdown, floor)
        if die >= slowdown - ALARM_BELOW_MC:
            alarm = app.sup.faults & (C.FAULT_OVER_TEMP | C.FAULT_CRITICAL_TEMP)
            assert alarm, (die, slowdown, app.sup.faults, C.STATES[app.sup.state])
