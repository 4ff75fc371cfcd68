"""Cooling cannot be made worse than factory near the GPU's slowdown, hosted or not
(issue 23 item 15). DUAL: the real firmware on the fake board under the safety
harness (every tick checked against the oracle's floors, the die-margin floor too).

Hosted: a fresh die within 4 degC of the slowdown ramps the fans to 100 % at
slowdown - 1 degC whatever the gains or the curve say (all gains 0 and a flat-0 curve
sat at 20 % before). Standalone: the module keeps the last slowdown and the
probe-to-die offset it learned while hosted (learned.bin beside the config, through a
reboot) and warns before its estimate of the die reaches the slowdown (with a fan
stalled on a chassis whose probe reads below the die, no over-temperature event
came before: the limits were the configured 85/90 degC).
"""

from safety_harness import Harness

from device import config
from device import floors as F
from device.safety import Safety
from protocol import catalog as C

DUAL = True
MPY_TIMEOUT = 900

SLOW = 83000  # an RTX 30xx's slowdown


def duties(h):
    return h.hal.pwm[0].duty_u16(), h.hal.pwm[1].duty_u16()


def events(h, code):
    return [m for m in h.hal.take() if m.ok and m.name == "event" and m.fields["code"] == code]


def ramp(h, ch, to_c, from_c=30):
    """Move channel ``ch`` to ``to_c`` at 5 degC a second (a faster move is a jumping,
    implausible NTC)."""
    t = from_c
    while t != to_c:
        t = min(t + 5, to_c) if to_c > t else max(t - 5, to_c)
        h.set_temp(ch, t)
        h.advance(1000)


def hosted(die_mc, ntc_c=60):
    h = Harness()
    ramp(h, 0, ntc_c)
    h.hb_slowdown = SLOW
    h.hb_temp = die_mc
    h.host(True)
    return h


def useless_gains(h):
    assert h.command("pid_gains", {"kp": 0, "ki": 0, "kd": 0, "kff": 0}) == "ack"


def flat_curve(h):
    assert h.command("fan_curve", {"points": [[30000, 0], [90000, 0]]}) == "ack"
    assert h.command("fan_mode", {"mode": C.FAN_MODES.index("curve")}) == "ack"


# -- hosted: the die-margin floor ------------------------------------------------------


def _forced_up(setup):
    h = hosted(70000)
    setup(h)
    h.advance(30000)
    low = duties(h)
    assert max(low) < 30000, low  # the control law asks for almost nothing
    h.hb_temp = SLOW - 2500  # the die 2.5 degC under the slowdown: no warning yet
    h.advance(3000)
    d = duties(h)
    want = F.die_floor(SLOW - 2500, SLOW, 13107)
    assert min(d) >= want > 35000, (d, want)
    h.hb_temp = SLOW - 1000
    h.advance(3000)
    assert duties(h) == (65535, 65535), duties(h)
    return h


def test_zero_gains_are_forced_up_as_the_die_nears_slowdown():
    _forced_up(useless_gains)


def test_a_flat_zero_curve_is_forced_up_as_the_die_nears_slowdown():
    _forced_up(flat_curve)


def test_no_floor_far_from_slowdown_or_without_one():
    h = hosted(SLOW - 4500)
    useless_gains(h)
    h.advance(30000)
    assert h.app.safety.die_mc == SLOW - 4500 and max(duties(h)) < 30000, duties(h)
    h.hb_slowdown = 0  # a heartbeat without the slowdown: no die floor
    h.hb_temp = SLOW - 500
    h.advance(5000)
    assert h.app.safety.slow_mc == 0


def test_the_die_at_slowdown_raises_an_over_temperature_event_hosted():
    h = hosted(70000)
    useless_gains(h)
    h.advance(5000)
    h.hal.take()
    h.hb_temp = SLOW
    h.advance(3000)
    ev = events(h, C.REASON_OVER_TEMP)
    assert ev and ev[0].fields["active"], ev


# -- standalone: limits from what the module learned -----------------------------------


def _standalone_with_offset(offset_c, stall=True):
    """Hosted with the die ``offset_c`` above the GPU NTC at 60 degC, then the host
    goes away (and a fan stalls)."""
    h = hosted(60000 + offset_c * 1000, 60)
    h.advance(150000)  # five times the offset filter's time constant
    sf = h.app.safety
    assert sf.learn_slow_mc == SLOW
    assert offset_c * 1000 - 600 <= sf.learn_off_mc <= offset_c * 1000, sf.learn_off_mc
    h.host(False)
    if stall:
        h.set_fan(1, "stalled")
    h.advance(10000)
    assert h.app.sup.state != C.STATE_HOSTED
    h.hal.take()
    return h


def _over_temp_before_slowdown(h, offset_c):
    """The NTC rises 1 degC a second; the over-temperature event must come before the
    die (NTC + offset) reaches the slowdown."""
    ntc = 60
    while ntc + offset_c < SLOW // 1000:
        ntc += 1
        h.set_temp(0, ntc)
        h.advance(1000)
        if events(h, C.REASON_OVER_TEMP):
            return ntc + offset_c
    raise AssertionError("no over-temperature event before the die reached the slowdown")


def test_standalone_with_a_stalled_fan_warns_before_the_die_reaches_slowdown():
    h = _standalone_with_offset(4)
    die = _over_temp_before_slowdown(h, 4)
    assert die <= SLOW // 1000 - 2, die


def test_a_large_probe_offset_lowers_the_standalone_limit():
    # a probe 10 degC under the die: the slowdown - 8 rule alone would warn at a die
    # of slowdown + 2; the learned offset warns at slowdown - 3
    h = _standalone_with_offset(10, stall=False)
    off = h.app.safety.learn_off_mc
    assert h.app.sup.warn_mc[0] == SLOW - off - F.STANDALONE_WARN_MARGIN_MC
    assert h.app.safety.crit_mc[0] == SLOW - off - F.STANDALONE_CRIT_MARGIN_MC
    die = _over_temp_before_slowdown(h, 10)
    assert die <= SLOW // 1000 - 2, die


def test_what_was_learned_survives_a_reboot():
    h = _standalone_with_offset(6, stall=False)
    slow, off = config.load_learned(h.hal.fs_dir)  # written when the host was lost
    assert slow == SLOW and 5400 <= off <= 6000, (slow, off)
    h.reboot()
    h.advance(3000)
    assert h.app.safety.learn_slow_mc == SLOW and h.app.safety.learn_off_mc == off
    assert h.app.sup.warn_mc[0] == SLOW - off - F.STANDALONE_WARN_MARGIN_MC


def test_never_hosted_keeps_the_factory_limits():
    h = Harness()
    ramp(h, 0, 60)
    h.advance(5000)
    assert h.app.sup.warn_mc[0] == 85000 and h.app.safety.crit_mc[0] == 90000
    assert config.load_learned(h.hal.fs_dir) == (0, 0)


# -- the pieces ---------------------------------------------------------------------------


def test_learned_record_round_trip_bounds_and_corruption():
    h = Harness()
    d = h.hal.fs_dir
    config.save_learned(d, 87000, 4000)
    assert config.load_learned(d) == (87000, 4000)
    config.save_learned(d, 87000, 40000)  # an offset past the bound is clamped
    assert config.load_learned(d) == (87000, F.OFFSET_MAX_MC)
    config.save_learned(d, 200000, 4000)  # no GPU slows down at 200 degC: not taken
    assert config.load_learned(d) == (0, 0)
    path = d.rstrip("/") + "/" + config.LEARNED_NAME
    config.save_learned(d, 87000, 4000)
    with open(path, "rb") as f:
        b = bytearray(f.read())
    b[3] ^= 1
    with open(path, "wb") as f:
        f.write(b)
    assert config.load_learned(d) == (0, 0)  # a bad CRC: never hosted
    with open(path, "wb") as f:
        f.write(b"\x4c\x02" + bytes(10))  # another record version
    assert config.load_learned(d) == (0, 0)


class _Hal:
    fan_model = "pwm4"


def test_offset_is_low_passed_then_rises_at_once_and_falls_slowly():
    sf = Safety(_Hal(), [None, None])
    k = 0
    while k < 50:  # a 5 s transient of 15 degC (a load step the probe lags): filtered
        sf.learn(SLOW, 81000, 66000, 100)
        k += 1
    assert 2000 < sf.learn_off_mc < 3000, sf.learn_off_mc
    k = 0
    while k < 3000:  # five minutes at a 9 degC offset: learned (up as it is seen)
        sf.learn(SLOW, 80000, 71000, 100)
        k += 1
    assert 8700 <= sf.learn_off_mc <= 9000, sf.learn_off_mc
    top = sf.learn_off_mc
    k = 0
    while k < 3000:  # five minutes at a 2 degC offset: not a degree lower yet
        sf.learn(SLOW, 70000, 68000, 100)
        k += 1
    assert sf.learn_off_mc == top, sf.learn_off_mc
    k = 0
    while k < 3000:  # ten minutes in all: a degree lower
        sf.learn(SLOW, 70000, 68000, 100)
        k += 1
    assert sf.learn_off_mc == top - F.OFFSET_DOWN_MC, sf.learn_off_mc
    k = 0
    while k < 3000:  # a probe above the die: never below 0; a huge gap: at most 15
        sf.learn(SLOW, 99000, 60000, 100)
        k += 1
    assert sf.learn_off_mc == F.OFFSET_MAX_MC or sf.learn_off_mc > 14700, sf.learn_off_mc
    sf.learn(SLOW, 60000, 70000, 100)
    assert sf._off_f >= 0


def test_the_die_floor_and_the_learning_do_not_allocate():
    from mpcompat import heap_locked
    from test_app import boot, cmd

    from protocol import catalog as CC

    hal, app = boot()
    hal.set_temp(0, 70)  # a jump from 25 degC: implausible for 30 s, then cleared
    fields = {"gpu_temp": SLOW - 3000, "gpu_power": 300000, "gpu_slowdown": SLOW}
    k = 0
    while k < 400:
        if k % 10 == 0:
            cmd(hal, "heartbeat", fields)
        app.step()
        hal.advance(100)
        k += 1
    hal.take()
    assert app.sup.state == CC.STATE_HOSTED, CC.STATES[app.sup.state]
    assert app.safety.slow_mc == SLOW and app.safety.learn_off_mc > 0

    def ticks():
        n = 0
        while n < 1000:
            now = hal.ticks_ms()
            app.hb_ms = now  # no heartbeat under the lock: keep the host and its die fresh
            app.gpu_temp_ms = now
            # the floor and the offset move; under slowdown - 2 (a warning: an event)
            app.gpu_temp_mc = SLOW - 4000 + (n % 20) * 90
            app.step()
            hal.advance(100)
            n += 1
            if hal.tx_len > 60000:
                hal.tx_len = 0

    heap_locked(ticks)
    assert app.failures == 0 and app.missed == 0, (app.failures, app.missed)
    assert app.sup.state == CC.STATE_HOSTED, CC.STATES[app.sup.state]
    assert app.safety.floor[0] > 13107
