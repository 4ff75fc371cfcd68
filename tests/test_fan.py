"""device.drivers.fan: min duty, kick, RPM window, glitch filter, stall, no allocation."""

from fakes import IRQ_FALLING, IRQ_RISING, TICKS_PERIOD, FakeClock, FakePin, FakePWM
from mpcompat import heap_locked, raises

from device.drivers.fan import Fan, rpm_from_pulses

DUAL = True

MIN = 13107  # the default min_duty (20 %)


def _fan(**kw):
    pwm = FakePWM()
    pin = FakePin()
    fan = Fan(pwm, pin, IRQ_FALLING, **kw)
    return pwm, pin, fan


def _run(fan, pin, clock, ms, pulses_per_100ms=0, tick_ms=100):
    """Advance ms in control ticks, giving the tach pulses_per_100ms each 100 ms."""
    for _ in range(ms // tick_ms):
        pin.pulse(pulses_per_100ms * tick_ms // 100)
        clock.advance(tick_ms)
        fan.update(clock.ticks_ms())


# --------------------------------------------------------------------------- construction


def test_construction_sets_25khz_full_speed_and_irq():
    pwm, pin, fan = _fan()
    assert pwm.freq() == 25000
    assert pwm.duty_u16() == 65535 and fan.duty == 65535
    assert pin.handler is fan._isr and pin.trigger == IRQ_FALLING
    assert (fan.rpm, fan.stalled, fan.kicking) == (0, False, False)


def test_construction_options():
    pwm, _, fan = _fan(freq_hz=21000, initial_duty=0, allow_stop=True)
    assert pwm.freq() == 21000 and pwm.duty_u16() == 0
    pwm, _, fan = _fan(initial_duty=0)
    assert pwm.duty_u16() == MIN  # no stop allowed: min duty
    pwm, _, fan = _fan(invert=True, initial_duty=50000)
    assert pwm.duty_u16() == 65535 - 50000 and fan.duty == 50000


def test_bad_construction_arguments():
    for kw in (
        {"freq_hz": 0},
        {"freq_hz": 25000.0},
        {"min_duty": -1},
        {"min_duty": 70000},
        {"kick_duty": 1000},  # below min_duty
        {"pulses_per_rev": 0},
        {"rpm_window_ms": 10},
        {"stall_ms": 0},
        {"max_rpm": 0},
        {"initial_duty": 65536},
        {"max_rpm": 1000000, "pulses_per_rev": 16, "rpm_window_ms": 60000},  # > 2**30
    ):
        with raises(ValueError):
            _fan(**kw)


# As device/config.py's defaults spell a fan (key "ppr").
CONFIG_FAN = {
    "min_duty": 13107,
    "kick_duty": 65535,
    "kick_ms": 500,
    "ppr": 2,
    "stall_ms": 3000,
    "max_rpm": 3000,
}


def test_from_config_maps_keys():
    pwm, pin = FakePWM(), FakePin()
    cfg = dict(CONFIG_FAN)
    cfg["future_key"] = 1  # unknown keys are ignored
    fan = Fan.from_config(pwm, pin, IRQ_FALLING, cfg)
    assert (fan.min_duty, fan.kick_duty, fan.kick_ms) == (13107, 65535, 500)
    assert (fan.pulses_per_rev, fan.stall_ms, fan.max_rpm) == (2, 3000, 3000)
    assert fan.freq_hz == 25000 and pwm.freq() == 25000 and pin.handler is fan._isr
    cfg = dict(CONFIG_FAN)
    cfg["ppr"] = 0
    with raises(ValueError, match="pulses_per_rev"):
        Fan.from_config(FakePWM(), FakePin(), IRQ_FALLING, cfg)


def test_configure_running_fan_reapplies_request():
    pwm, pin, fan = _fan()
    isr = pin.handler
    fan.set_duty(15000, 0)
    assert fan.duty == 15000
    fan.configure({"min_duty": 20000, "kick_duty": 60000, "freq_hz": 22000})
    assert fan.duty == 20000 and fan.commanded == 15000 and pwm.freq() == 22000
    assert pin.handler is isr  # the IRQ is not re-registered
    fan.configure({"min_duty": 10000})
    assert fan.duty == 15000 and fan.kick_duty == 60000  # others kept
    with raises(ValueError, match="kick_duty"):
        fan.configure({"min_duty": 65000})  # above kick_duty: rejected as a whole
    assert fan.min_duty == 10000 and fan.duty == 15000
    fan.configure({"invert": True})
    assert pwm.duty_u16() == 65535 - 15000


def test_configure_during_kick_keeps_kicking():
    _, _, fan = _fan(allow_stop=True, initial_duty=0)
    fan.set_duty(20000, 0)
    fan.configure({"min_duty": 25000})
    assert fan.kicking and fan.duty == 65535
    fan.update(0)
    fan.update(500)
    assert not fan.kicking and fan.duty == 25000


def test_force_full_honours_invert():
    pwm, _, fan = _fan(initial_duty=20000)
    fan.force_full()
    assert pwm.duty_u16() == 65535 and fan.duty == 65535
    pwm, _, fan = _fan(invert=True, initial_duty=20000)
    fan.force_full()
    assert pwm.duty_u16() == 0 and fan.duty == 65535
    fan.set_duty(20000, 0)
    assert pwm.duty_u16() == 45535


# --------------------------------------------------------------------------- duty


def test_min_duty_applies_to_small_and_zero_requests():
    pwm, _, fan = _fan()
    fan.set_duty(1000, 0)
    assert fan.duty == MIN and pwm.duty_u16() == MIN and fan.commanded == 1000
    fan.set_duty(0, 0)
    assert fan.duty == MIN and fan.commanded == 0
    fan.set_duty(40000, 0)
    assert fan.duty == 40000 and pwm.duty_u16() == 40000
    fan.set_duty(MIN, 0)
    assert fan.duty == MIN


def test_allow_stop_lets_zero_stop():
    pwm, _, fan = _fan(allow_stop=True, kick_ms=0)
    fan.set_duty(0, 0)
    assert fan.duty == 0 and pwm.duty_u16() == 0
    fan.set_duty(1, 0)  # non-zero below min still goes to min
    assert fan.duty == MIN


def test_garbage_duty_is_clamped_or_rejected():
    pwm, _, fan = _fan()
    fan.set_duty(-5, 0)
    assert fan.commanded == 0 and fan.duty == MIN
    fan.set_duty(70000, 0)
    assert fan.commanded == 65535 and fan.duty == 65535
    fan.set_duty(40000, 0)
    for bad in (0.5, 30000.0, None, "30000", True, [1]):
        with raises(ValueError, match="duty_u16"):
            fan.set_duty(bad, 0)
        assert fan.duty == 40000 and fan.commanded == 40000  # unchanged


def test_pwm_written_only_on_change():
    pwm, _, fan = _fan()
    for _ in range(5):
        fan.set_duty(30000, 0)
        fan.update(0)
    assert pwm.history() == [65535, 30000]


def test_invert_writes_the_complement():
    pwm, _, fan = _fan(invert=True)
    fan.set_duty(20000, 0)
    assert fan.duty == 20000 and pwm.duty_u16() == 45535


# --------------------------------------------------------------------------- kick


def test_kick_sequence_timing():
    clock = FakeClock(start_ms=TICKS_PERIOD - 200)  # the kick crosses the tick wrap
    pwm, _, fan = _fan(allow_stop=True, kick_ms=500, kick_duty=60000, initial_duty=0)
    fan.update(clock.ticks_ms())
    t0 = clock.ticks_ms()
    fan.set_duty(20000, t0)
    assert fan.kicking and fan.duty == 60000 and pwm.duty_u16() == 60000
    clock.advance(499)
    fan.update(clock.ticks_ms())
    assert fan.kicking and fan.duty == 60000
    fan.set_duty(25000, clock.ticks_ms())  # a new request during the kick waits
    assert fan.duty == 60000
    clock.advance(1)
    fan.update(clock.ticks_ms())
    assert not fan.kicking and fan.duty == 25000
    assert pwm.history() == [0, 60000, 25000]


def test_no_kick_when_already_running_or_request_is_high():
    pwm, _, fan = _fan(allow_stop=True, initial_duty=30000)
    fan.set_duty(20000, 0)
    assert not fan.kicking and fan.duty == 20000
    fan.set_duty(0, 0)
    fan.set_duty(65535, 10)  # at or above kick_duty: nothing to add
    assert not fan.kicking and fan.duty == 65535


def test_stop_cancels_a_kick_and_kick_ms_zero_disables_it():
    _, _, fan = _fan(allow_stop=True, initial_duty=0)
    fan.set_duty(20000, 0)
    assert fan.kicking
    fan.set_duty(0, 100)
    assert not fan.kicking and fan.duty == 0
    fan.update(600)
    assert fan.duty == 0
    _, _, fan = _fan(allow_stop=True, initial_duty=0, kick_ms=0)
    fan.set_duty(20000, 0)
    assert not fan.kicking and fan.duty == 20000


def test_kick_from_min_when_stop_not_allowed_does_not_happen():
    # Without allow_stop the fan never stops, so it never needs a kick.
    _, _, fan = _fan(initial_duty=0)
    fan.set_duty(0, 0)
    fan.set_duty(20000, 0)
    assert not fan.kicking and fan.duty == 20000


# --------------------------------------------------------------------------- RPM


def test_rpm_from_pulses_function():
    assert rpm_from_pulses(50, 2, 1000) == 1500
    assert rpm_from_pulses(25, 1, 500) == 3000
    assert rpm_from_pulses(0, 2, 1000) == 0
    assert rpm_from_pulses(1, 2, 1000) == 30
    assert rpm_from_pulses(333, 2, 1000) == 9990


def test_rpm_at_several_ppr_and_windows():
    # (ppr, window_ms, pulses per 100 ms, expected rpm)
    for ppr, window, p100, want in (
        (2, 1000, 5, 1500),
        (2, 500, 5, 1500),
        (1, 1000, 5, 3000),
        (4, 2000, 10, 1500),
        (2, 1000, 40, 12000),
        (3, 1000, 6, 1200),
    ):
        clock = FakeClock()
        _, pin, fan = _fan(pulses_per_rev=ppr, rpm_window_ms=window)
        fan.update(clock.ticks_ms())
        _run(fan, pin, clock, window - 100, p100)
        assert fan.rpm == 0  # the first window is not complete yet
        _run(fan, pin, clock, 100, p100)
        assert fan.rpm == want, (ppr, window, fan.rpm, want)
        _run(fan, pin, clock, window, 0)
        assert fan.rpm == 0


def test_rpm_uses_measured_elapsed_time():
    clock = FakeClock()
    _, pin, fan = _fan(rpm_window_ms=1000)
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 1200, 5, tick_ms=300)  # window closes at 1200 ms, 60 pulses
    assert fan.rpm == 60 * 60000 // (2 * 1200) == 1500, fan.rpm


def test_rpm_counter_wrap():
    clock = FakeClock()
    _, pin, fan = _fan()
    fan.pulses = 0x1FFFFFFF - 10
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 1000, 5)
    assert fan.pulses < 100  # wrapped
    assert fan.rpm == 1500


def test_rising_and_falling_edges_count_double():
    clock = FakeClock()
    pwm = FakePWM()
    pin = FakePin()
    fan = Fan(pwm, pin, IRQ_FALLING | IRQ_RISING, pulses_per_rev=4)  # 2 pulses, 4 edges
    fan.update(0)
    _run(fan, pin, clock, 1000, 5)
    assert fan.rpm == 1500


def test_glitch_window_rejected():
    clock = FakeClock()
    _, pin, fan = _fan(max_rpm=6000)
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 1000, 5)
    assert fan.rpm == 1500
    _run(fan, pin, clock, 1000, 30)  # 18000 rpm > 6000: noise
    assert fan.rpm == 1500 and fan.glitches == 1
    _run(fan, pin, clock, 1000, 20)  # exactly 6000 is allowed
    assert fan.rpm == 6000 and fan.glitches == 1
    pin.pulse(10000000 // 1000)  # a burst of edges in one tick
    _run(fan, pin, clock, 1000, 0)
    assert fan.glitches == 2 and fan.rpm == 6000


def test_late_window_discarded():
    clock = FakeClock()
    _, pin, fan = _fan()
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 1000, 5)
    pin.pulse(500)
    clock.advance(5000)  # the loop stalled for 5 s
    fan.update(clock.ticks_ms())
    assert fan.rpm == 1500 and fan.glitches == 0
    _run(fan, pin, clock, 1000, 10)
    assert fan.rpm == 3000


# --------------------------------------------------------------------------- stall


def test_stall_detect_and_clear_timing():
    clock = FakeClock(start_ms=TICKS_PERIOD - 1000)
    _, pin, fan = _fan(stall_ms=3000)
    fan.set_duty(30000, clock.ticks_ms())
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 2000, 5)
    assert not fan.stalled and fan.rpm == 1500
    _run(fan, pin, clock, 2900, 0)  # last pulse 2900 ms ago
    assert not fan.stalled
    _run(fan, pin, clock, 100, 0)  # 3000 ms without a pulse
    assert fan.stalled
    _run(fan, pin, clock, 100, 5)  # a few pulses (a coasting rotor): still stalled
    assert fan.stalled
    _run(fan, pin, clock, 1200, 5)  # a full window really turning: cleared
    assert not fan.stalled and fan.rpm >= 100, fan.rpm


def test_stall_counts_at_min_duty_and_from_start():
    clock = FakeClock()
    _, pin, fan = _fan(stall_ms=3000)
    fan.set_duty(0, clock.ticks_ms())  # min duty: still expected to turn
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 2900, 0)
    assert not fan.stalled
    _run(fan, pin, clock, 100, 0)
    assert fan.stalled


def test_spin_up_has_grace_and_stopped_fan_never_stalls():
    clock = FakeClock()
    _, pin, fan = _fan(stall_ms=1000, allow_stop=True, initial_duty=0)
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 5000, 0)
    assert not fan.stalled  # stopped on purpose
    fan.set_duty(20000, clock.ticks_ms())
    _run(fan, pin, clock, 900, 0)
    assert not fan.stalled  # 900 ms after the start command
    _run(fan, pin, clock, 100, 0)
    assert fan.stalled
    fan.set_duty(0, clock.ticks_ms())
    assert not fan.stalled


# --------------------------------------------------------------------------- allocation


# (duty request, tach pulses) per 350 ms tick: stop, kick, run, stall, recover, clamp,
# stop, restart, glitch burst. Every path of set_duty/update runs under the lock.
ALLOC_STEPS = (
    (0, 0),
    (20000, 0),  # start from stop: kick
    (20000, 10),
    (20000, 10),  # kick over (700 ms)
    (30000, 10),  # first RPM window closes
    (30000, 0),
    (30000, 0),  # 700 ms without pulses: stalled
    (70000, 10),  # clamped; pulses clear the stall
    (-3, 10),  # clamped to 0: stop
    (1000, 0),  # min duty, kick again
    (45000, 1000),  # glitch burst
    (45000, 10),
    (45000, 10),
)


def test_isr_update_and_set_duty_do_not_allocate():
    clock = FakeClock(start_ms=TICKS_PERIOD - 700)
    pwm, pin, fan = _fan(allow_stop=True, initial_duty=0, max_rpm=6000, stall_ms=500)
    fan.update(clock.ticks_ms())
    kicked = stalled = measured = False
    for i in range(len(ALLOC_STEPS)):
        duty, pulses = ALLOC_STEPS[i]
        t = clock.ticks_ms()
        _locked(lambda d=duty, p=pulses, t=t: _tick_locked(fan, pin, d, p, t))
        kicked = kicked or fan.kicking
        stalled = stalled or fan.stalled
        measured = measured or fan.rpm > 0
        clock.advance(350)
    assert kicked and stalled and measured and not fan.stalled
    assert fan.glitches == 1, fan.glitches
    assert pwm.history() == [0, 65535, 20000, 30000, 65535, 0, 65535, 45000], pwm.history()


def _tick_locked(fan, pin, duty, pulses, now):
    pin.pulse(pulses)
    fan.set_duty(duty, now)
    fan.update(now)


_locked = heap_locked


def test_irq_rising_constant_exported():
    assert IRQ_RISING != IRQ_FALLING
