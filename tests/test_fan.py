"""device.drivers.fan: min duty, kick, RPM window, glitch filter, stall, tach
plausibility, no allocation."""

from fakes import IRQ_FALLING, IRQ_RISING, TICKS_PERIOD, FakeClock, FakePin, FakePWM
from mpcompat import heap_locked, raises

from device import floors
from device.drivers.fan import (
    IMPLAUSIBLE_NONE,
    IMPLAUSIBLE_SLOW,
    IMPLAUSIBLE_TURNING,
    STOP_SPINDOWN_MS,
    Fan,
    rpm_from_pulses,
)

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


# --------------------------------------------------------------------------- plausibility


class _Rotor:
    """A fan on the tach pin: its RPM heads for ``max_rpm * duty / 65535`` (0 below
    ``stop_duty``, or when ``seized``) with first-order lags, and pulses 2 per rev.
    ``noise`` extra edges per second ride on the line whatever the rotor does."""

    def __init__(self, fan, pin, max_rpm, tau_up_ms=1500, tau_down_ms=2500, rpm=0):
        self.fan = fan
        self.pin = pin
        self.max_rpm = max_rpm
        self.tau_up = tau_up_ms
        self.tau_down = tau_down_ms
        self.stop_duty = 6554  # 10 %
        self.mrpm = rpm * 1000  # milli-RPM
        self.acc = 0  # pulse fraction, in milli-RPM * ms
        self.noise = 0
        self.noise_acc = 0
        self.seized = False

    @property
    def rpm(self):
        return self.mrpm // 1000

    def step(self, dt_ms):
        duty = self.fan.duty
        target = 0
        if not self.seized and duty >= self.stop_duty:
            target = self.max_rpm * duty // 65535 * 1000
        tau = self.tau_up if target > self.mrpm else self.tau_down
        self.mrpm += (target - self.mrpm) * dt_ms // (tau + dt_ms)
        if target == 0 and self.mrpm < 1000:
            self.mrpm = 0
        self.acc += self.mrpm * 2 * dt_ms
        n = self.acc // 60000000
        self.acc -= n * 60000000
        self.noise_acc += self.noise * dt_ms
        n += self.noise_acc // 1000
        self.noise_acc %= 1000
        self.pin.pulse(n)


def _spin(fan, rotor, clock, ms, tick_ms=100, seen=None):
    """Run ``ms`` of control ticks; ``seen`` (a list) collects every implausible kind."""
    for _ in range(ms // tick_ms):
        rotor.step(tick_ms)
        clock.advance(tick_ms)
        fan.update(clock.ticks_ms())
        if seen is not None and fan.implausible and fan.implausible_kind not in seen:
            seen.append(fan.implausible_kind)


def test_model_argument_names_tuples_and_errors():
    _, _, fan = _fan()
    assert fan.model == floors.fan_model(None) == floors.FAN_MODELS["pwm4"]
    assert fan.rpm_floor == 400 and fan.settle_ms == 3000
    _, _, fan = _fan(model="sim", kick_ms=4000)
    assert fan.model == floors.FAN_MODELS["sim"] and fan.rpm_floor == 1500
    assert fan.settle_ms == 4000  # max(kick_ms, 3 s)
    _, _, fan = _fan(model=(13107, 45875, 300, 32768, 50, 2000))
    assert fan.rpm_floor == 1000
    for bad in (
        "no_such_fan",
        (1, 2, 3),
        [13107, 45875, 300, 32768, 50, 2000],
        7,
        (13107, 45875, 300, 32768, 101, 2000),
        (13107, 45875, 300, 70000, 50, 2000),
        (13107, 45875, 300, 32768, 100, 2000000),
    ):
        with raises(ValueError, match="model"):
            _fan(model=bad)
    cfg = dict(CONFIG_FAN)
    cfg["model"] = "pwm4_server"
    fan = Fan.from_config(FakePWM(), FakePin(), IRQ_FALLING, cfg)
    assert fan.model == floors.FAN_MODELS["pwm4_server"]
    fan = Fan.from_config(FakePWM(), FakePin(), IRQ_FALLING, cfg, model=floors.fan_model("sim"))
    assert fan.model == floors.FAN_MODELS["sim"]  # the board's compiled model wins
    fan.configure({"model": "pwm4"})
    assert fan.model == floors.FAN_MODELS["pwm4"] and fan.rpm_floor == 400
    with raises(ValueError, match="model"):
        fan.configure({"model": "nope", "min_duty": 20000})
    assert fan.model == floors.FAN_MODELS["pwm4"] and fan.min_duty == 13107  # all or nothing


def test_noise_edges_on_a_stopped_rotor_at_full_duty_are_implausible():
    # Problem 1: 10 noise edges/s (1 per 100 ms tick) read 300 RPM at full duty. No
    # stall (edges keep coming); the duty says the fan should turn >= 400 RPM.
    clock = FakeClock()
    _, pin, fan = _fan()  # full duty from construction, default model
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 8900, 1)  # boot: the fan may spin up from rest (2 settles)
    assert fan.rpm == 300 and not fan.stalled and not fan.implausible
    _run(fan, pin, clock, 200, 1)  # settled at 6 s, below the floor for stall_ms
    assert fan.implausible and fan.implausible_kind == IMPLAUSIBLE_SLOW, fan.implausible_kind
    assert not fan.stalled and fan.implausible_count == 1 and fan.rpm == 300
    _run(fan, pin, clock, 60000, 1)
    assert fan.implausible and fan.implausible_count == 1  # raised once, stays
    _run(fan, pin, clock, 500, 20)  # turning again (6,000 RPM): a window still mixed
    _run(fan, pin, clock, 1000, 20)  # a full window of plausible RPM: cleared
    assert not fan.implausible and fan.implausible_kind == IMPLAUSIBLE_NONE, fan.rpm
    assert fan.implausible_count == 1


def test_noise_at_half_duty_on_the_sim_model():
    # The sim model checks from min_spin: 300 RPM at 50 % is below its 750 RPM floor.
    clock = FakeClock(start_ms=TICKS_PERIOD - 3000)  # across the tick wrap
    _, pin, fan = _fan(model="sim", initial_duty=32768)
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 12000, 1)
    assert fan.implausible and fan.implausible_kind == IMPLAUSIBLE_SLOW and not fan.stalled


def test_slowly_coasting_rotor_is_implausible_before_it_stalls():
    # A rotor that lost its drive coasts down over a minute: pulses keep coming, so
    # `stalled` stays quiet for a long time; the reading falls below the duty's floor.
    clock = FakeClock()
    _, pin, fan = _fan()
    rotor = _Rotor(fan, pin, 1500, rpm=1500, tau_down_ms=20000)
    fan.update(clock.ticks_ms())
    _spin(fan, rotor, clock, 20000)
    assert fan.rpm >= 1400 and not fan.implausible
    rotor.seized = True
    seen = []
    t = 0
    while not fan.implausible and t < 120000:
        _spin(fan, rotor, clock, 100)
        t += 100
        assert not fan.stalled, t
    assert fan.implausible and fan.implausible_kind == IMPLAUSIBLE_SLOW
    assert 0 < fan.rpm < fan.rpm_floor and rotor.rpm > 100, (fan.rpm, rotor.rpm)
    assert t < 40000, t  # 1500 -> 400 RPM takes ~26 s, then stall_ms
    _spin(fan, rotor, clock, 200000, seen=seen)  # it comes to rest: now a stall too
    assert fan.stalled and fan.implausible and seen == [IMPLAUSIBLE_SLOW]


def test_a_silent_tach_is_a_stall_not_implausible():
    clock = FakeClock()
    _, pin, fan = _fan()
    fan.update(clock.ticks_ms())
    _run(fan, pin, clock, 30000, 0)
    assert fan.stalled and not fan.implausible and fan.implausible_count == 0


def _healthy(model, max_rpm, steps, tau_up_ms, tau_down_ms, hold_ms=20000):
    """A fan of the slowest kind ``model`` covers through ``steps`` of duty (%)."""
    clock = FakeClock(start_ms=TICKS_PERIOD - 5000)
    _, pin, fan = _fan(model=model, initial_duty=65535 * steps[0] // 100)
    rotor = _Rotor(fan, pin, max_rpm, tau_up_ms, tau_down_ms)
    fan.update(clock.ticks_ms())
    seen = []
    worst = 1000  # lowest rpm / floor while checked, in 1/100
    steady = 1000  # the same at the end of each hold
    for pct in steps:
        fan.set_duty(65535 * pct // 100, clock.ticks_ms())
        for _ in range(hold_ms // 100):
            _spin(fan, rotor, clock, 100, seen=seen)
            s = fan.settled_duty
            if s >= fan.model[floors.FM_RPM_CHECK_DUTY] and fan.duty:
                floor = fan.rpm_floor * (s >> 6) // 1024
                worst = min(worst, fan.rpm * 100 // floor)
        if fan.duty >= fan.model[floors.FM_RPM_CHECK_DUTY]:
            steady = min(steady, fan.rpm * 100 // (fan.rpm_floor * (fan.duty >> 6) // 1024))
    return fan, seen, worst, steady


def test_healthy_fans_through_duty_steps_are_never_implausible():
    steps = (20, 100, 20, 50, 30, 100, 60, 20, 100)
    # the slowest fan of each model; a slow-reacting big fan and a quick server fan
    for model, max_rpm, up, down in (
        ("pwm4", 1000, 4000, 8000),
        ("pwm4_server", 8000, 800, 1500),
        ("sim", 3000, 1500, 2500),  # the default world's fans
        ("sim", 12000, 800, 1500),  # h200_2u
    ):
        fan, seen, worst, steady = _healthy(model, max_rpm, steps, up, down)
        assert seen == [] and fan.implausible_count == 0, (model, max_rpm, seen)
        pct = fan.model[floors.FM_RPM_FLOOR_PCT]
        # settled: the margin the model promises (100 / rpm_floor_pct), within the RPM
        # resolution; spinning up (the slow 4 s fan): still 1.5x
        assert steady >= 100 * 100 // pct - 10, (model, max_rpm, steady)
        assert worst >= 150, (model, max_rpm, worst)


def test_duty_ramps_like_a_pid_are_never_implausible():
    # A duty that changes every tick (slew-limited control law): the settled duty
    # trails it, never leads it.
    clock = FakeClock()
    _, pin, fan = _fan(model="sim", initial_duty=13107)
    rotor = _Rotor(fan, pin, 3000, 1500, 2500)
    fan.update(clock.ticks_ms())
    seen = []
    duty = 13107
    for k in range(6000):  # 10 min
        phase = (k // 600) % 2
        duty += 1310 if phase == 0 else -1310  # 20 %/s up, then down
        duty = max(13107, min(65535, duty))
        fan.set_duty(duty, clock.ticks_ms())
        _spin(fan, rotor, clock, 100, seen=seen)
    assert seen == [] and fan.implausible_count == 0


def test_spin_up_from_stop_with_a_kick_is_never_implausible():
    for model, max_rpm, pct in (
        ("pwm4", 1000, 20),
        ("pwm4", 1000, 100),
        ("sim", 3000, 20),
        ("sim", 3000, 60),
    ):
        clock = FakeClock()
        _, pin, fan = _fan(model=model, allow_stop=True, initial_duty=0, kick_ms=500)
        rotor = _Rotor(fan, pin, max_rpm, 2500, 3000)
        fan.update(clock.ticks_ms())
        seen = []
        _spin(fan, rotor, clock, 40000, seen=seen)  # stopped, quiet
        for _ in range(3):
            fan.set_duty(65535 * pct // 100, clock.ticks_ms())
            assert fan.kicking or pct == 100
            _spin(fan, rotor, clock, 30000, seen=seen)
            assert fan.rpm > 0 and not fan.kicking
            fan.set_duty(0, clock.ticks_ms())  # stop: it coasts to rest
            _spin(fan, rotor, clock, 60000, seen=seen)
            assert fan.rpm == 0
        assert seen == [] and fan.implausible_count == 0, (model, pct, seen)


def test_allow_stop_with_a_rotor_still_reading():
    clock = FakeClock()
    _, pin, fan = _fan(allow_stop=True, initial_duty=32768)
    rotor = _Rotor(fan, pin, 1500)
    fan.update(clock.ticks_ms())
    _spin(fan, rotor, clock, 20000)
    fan.set_duty(0, clock.ticks_ms())
    rotor.noise = 10  # the rotor stops, 10 edges/s of noise stay: 300 RPM
    _spin(fan, rotor, clock, STOP_SPINDOWN_MS)
    assert not fan.implausible and fan.rpm == 300  # still allowed to coast
    _spin(fan, rotor, clock, 3100)  # + stall_ms
    assert fan.implausible and fan.implausible_kind == IMPLAUSIBLE_TURNING
    assert not fan.stalled and fan.implausible_count == 1
    # The safety layer drives it again: a good running reading does not show that it
    # stops when told to, so the fault stays (no flapping every minute).
    fan.set_duty(65535, clock.ticks_ms())
    _spin(fan, rotor, clock, 30000)
    assert fan.rpm > 1000 and fan.implausible and fan.implausible_kind == IMPLAUSIBLE_TURNING
    # A stop that reads quiet (after the spin-down time) answers it.
    rotor.noise = 0
    fan.set_duty(0, clock.ticks_ms())
    _spin(fan, rotor, clock, STOP_SPINDOWN_MS + 1100)
    assert not fan.implausible and fan.implausible_count == 1
    # ... and so does configuring the fan not to stop.
    rotor.noise = 10
    _spin(fan, rotor, clock, STOP_SPINDOWN_MS + 3100)
    assert fan.implausible and fan.implausible_count == 2
    fan.configure({"allow_stop": False})
    assert not fan.implausible and fan.duty == fan.min_duty


def test_a_rotor_that_really_stops_is_not_implausible_when_stopped():
    clock = FakeClock()
    _, pin, fan = _fan(allow_stop=True, initial_duty=0)  # stopped at boot
    rotor = _Rotor(fan, pin, 3000, rpm=3000, tau_down_ms=6000)  # was turning before reset
    fan.update(clock.ticks_ms())
    seen = []
    _spin(fan, rotor, clock, 600000, seen=seen)
    assert seen == [] and fan.rpm == 0


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


def _noise_tick(fan, pin, duty, edges, now):
    pin.pulse(edges)
    fan.set_duty(duty, now)
    fan.update(now)


# (duty, edges per 100 ms tick, ms): every plausibility path -- slow set, clear,
# stop, spin-down, turning set, driven again, quiet stop clear -- under the lock.
NOISE_STEPS = (
    (65535, 1, 10000),  # 300 RPM at full duty: implausible (slow)
    (65535, 20, 3000),  # 6,000 RPM: cleared
    (0, 1, 34000),  # stopped, still reading: implausible (turning)
    (65535, 20, 5000),  # driven: stays
    (0, 0, 32000),  # a quiet stop: cleared
)


def test_plausibility_paths_do_not_allocate():
    clock = FakeClock(start_ms=TICKS_PERIOD - 20000)
    _, pin, fan = _fan(allow_stop=True, model="sim")
    fan.update(clock.ticks_ms())
    kinds = []
    for duty, edges, ms in NOISE_STEPS:
        for _ in range(ms // 100):
            clock.advance(100)
            t = clock.ticks_ms()
            _locked(lambda d=duty, e=edges, t=t: _noise_tick(fan, pin, d, e, t))
            k = fan.implausible_kind
            if not kinds or kinds[-1] != k:
                kinds.append(k)
    want = [0, IMPLAUSIBLE_SLOW, 0, IMPLAUSIBLE_TURNING, 0]
    assert kinds == want, kinds
    assert fan.implausible_count == 2


def test_irq_rising_constant_exported():
    assert IRQ_RISING != IRQ_FALLING
