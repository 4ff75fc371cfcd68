"""The safety oracle catches a wrong floor in the firmware (issue 23 item 14). DUAL.

The harness's oracle (tests/safety_harness.py) used to call the production
``floors.hot_floor``: a wrong floor function would have agreed with itself. It now
computes every floor from its own table (tests/oracle_floors.py, written from
docs/safety.md). Here the production floors are mutated in place (the firmware reads
them through the module at every tick) and the harness must raise ``InvariantError``
on I1; unmutated, the same run passes. A control law configured into uselessness
(all gains 0) and warning limits raised out of the way leave the floor alone in
charge, as in the attacks the floors exist for.
"""

import oracle_floors as O
from safety_harness import Harness, InvariantError

from device import floors as F

DUAL = True
MPY_TIMEOUT = 600

_SLOW = 87000


def _useless(h):
    """All gains 0 and the GPU channel's warning limit out of the way: nothing but the
    floors cools the card."""
    assert h.command("pid_gains", {"kp": 0, "ki": 0, "kd": 0, "kff": 0}) == "ack"
    values = {"channels.0.setpoint_mc": 90000, "channels.0.warn_mc": 94000}
    values["channels.0.crit_mc"] = 95000
    assert h.command("config_set", {"values": values}) == "ack"


def _hot_gpu(h):
    h.host(True)  # hosted: the PID (gains 0) rules, not the standalone curve
    _useless(h)
    t = 30
    while t < 92:  # 5 degC a second: a jump of 15 degC would be an implausible NTC
        t = min(t + 5, 92)
        h.set_temp(0, t)
        h.advance(1000)
    h.advance(3000)


def _hot_die(h):
    h.hb_slowdown = _SLOW
    h.hb_temp = _SLOW - 2500  # 2.5 degC under the slowdown (no warning yet), the NTC cool
    h.host(True)
    _useless(h)
    h.advance(4000)


def _caught(mutate, restore, scenario, why):
    """``scenario`` passes unmutated and raises I1 naming ``why`` mutated."""
    scenario(Harness())  # the firmware as shipped: no violation
    mutate()
    try:
        h = Harness()
        try:
            scenario(h)
        except InvariantError as e:
            text = str(e)
            assert text.startswith("I1") and why in text, text
            return
    finally:
        restore()
    raise AssertionError("the mutated floor went unnoticed")


def test_hot_floor_returning_0_is_caught():
    real = F.hot_floor

    def zero(i, temp_mc, min_spin):
        return 0

    def mutate():
        F.hot_floor = zero

    def restore():
        F.hot_floor = real

    _caught(mutate, restore, _hot_gpu, "hot0")


def test_hot_floor_shifted_10_degc_is_caught():
    real = F.HOT_START_MC

    def mutate():
        F.HOT_START_MC = (90000,) + tuple(real[1:])

    def restore():
        F.HOT_START_MC = real

    _caught(mutate, restore, _hot_gpu, "hot0")


def test_die_floor_returning_0_is_caught():
    real = F.die_floor

    def zero(die_mc, slowdown_mc, min_spin):
        return 0

    def mutate():
        F.die_floor = zero

    def restore():
        F.die_floor = real

    _caught(mutate, restore, _hot_die, "die_margin")


def test_die_floor_starting_2_degc_late_is_caught():
    real = F.die_floor

    def late(die_mc, slowdown_mc, min_spin):
        return real(die_mc - 2000, slowdown_mc, min_spin)

    def mutate():
        F.die_floor = late

    def restore():
        F.die_floor = real

    _caught(mutate, restore, _hot_die, "die_margin")


def test_oracle_table_is_its_own():
    """The oracle's floors come from its table, not from device.floors: no import of
    it, and its numbers agree with the firmware's within the oracle's rounding."""
    try:
        with open(O.__file__) as f:
            lines = f.read().split("\n")
    except OSError:  # qemu-arm runs the compiled module, without its source
        lines = []
    assert not [x for x in lines if x.startswith("import ") or x.startswith("from ")]
    spin = F.fan_model(None)[F.FM_MIN_SPIN]
    assert spin == O.MIN_SPIN
    t = 60000
    while t <= 135000:
        for ch in range(4):
            o = O.hot_floor(ch, t)
            p = F.hot_floor(ch, t, spin)
            assert o <= p <= o + 4, (ch, t, o, p)
        o = O.die_floor(t, _SLOW)
        p = F.die_floor(t, _SLOW, spin)
        assert o <= p <= o + 4, (t, o, p)
        t += 250
