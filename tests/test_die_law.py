"""The hosted control law on the die's margin (issue 25 items 2 and 3): with a fresh
die from the host the PID regulates the die envelope against the GPU's slowdown - 5
degC; the NTC channels count only near their own warning limits; after a power rise
the feed-forward is not cancelled by a proportional term on a large negative error
while the die is heading for its setpoint (device/app.py ``App._margin_law``,
``PID.step(keep_q8)``); load bursts do not move the fans. The real App on the fake
board. DUAL."""

from fakehal import run
from test_app import boot, cmd

from device.control.pid import PID
from protocol import catalog as C

DUAL = True
MPY_TIMEOUT = 900

SLOW = 83000  # an RTX 30xx's slowdown: the die's setpoint is 78 degC


def _hb(hal, die_mc, power_mw):
    fields = {"gpu_temp": die_mc, "gpu_power": power_mw, "gpu_slowdown": SLOW}
    fields["power_limit"] = 320000
    cmd(hal, "heartbeat", fields)


def _hold(hal, app, seconds, die_mc, power_mw):
    """Heartbeats every second for ``seconds``."""
    i = 0
    while i < seconds:
        _hb(hal, die_mc, power_mw)
        run(app, hal, 1000)
        i += 1


def _idle(gpu_c=40.0):
    """Hosted, idle for 2 minutes: the boot hold gone, the fans at their minimum."""
    hal, app = boot(temps_c=(gpu_c, 40.0, 40.0, 25.0))
    _hold(hal, app, 120, 45000, 30000)
    assert app.sup.state == C.STATE_HOSTED, C.STATES[app.sup.state]
    assert app.fans[0].duty < app.pid.out_min + 655, app.fans[0].duty
    return hal, app


def test_the_guard_keeps_the_feed_forward_against_a_large_negative_error():
    pid = PID(kp=5000, ki=200, kff=100)
    # 20 degC under the setpoint at 320 W: P (-95 %) cancels FF (32 %) without it
    sp = 78000
    d = 0
    i = 0
    while i < 50:
        d = pid.step(sp - 20000, sp, 100, 320000)
        i += 1
    assert d == 0, d
    ff = 65535 * 32 // 100
    i = 0
    while i < 50:
        d = pid.step(sp - 20000, sp, 100, 320000, 256)
        i += 1
    assert ff - 100 <= d <= ff + 100, (d, ff)  # at least all of FF (P + I may not cancel it)
    held = pid._a[38]  # the integrator (_I): not wound down while the guard holds
    i = 0
    while i < 50:
        d = pid.step(sp - 20000, sp, 100, 320000, 128)
        i += 1
    assert ff // 2 - 100 <= d <= ff // 2 + 100, (d, ff)  # half of FF kept
    assert pid._a[38] >= held, (pid._a[38], held)
    # a positive error is never limited by it
    i = 0
    while i < 30:
        d = pid.step(sp + 5000, sp, 100, 320000, 256)
        i += 1
    assert d > ff + 65535 * 15 // 100, d


def test_after_a_power_rise_the_fans_move_while_the_die_heads_for_its_setpoint():
    hal, app = _idle()
    mn = app.pid.out_min
    ff = 65535 * 32 // 100  # kff 0.1 %/W at 320 W
    die = 56000  # the die's own jump at the step, then the heatsink's 0.4 degC/s
    i = 0
    low_first = 65535
    while i < 40:
        _hb(hal, die, 320000)
        run(app, hal, 1000)
        if i < 8 and app.fans[0].duty < low_first:
            low_first = app.fans[0].duty
        die += 400
        i += 1
    # 18 degC under 78 after the jump: P alone would hold the minimum, the guard
    # holds at least the feed-forward once the die's rise shows where it is heading
    assert low_first < mn + 655, low_first  # the die's jump itself is not the guard's
    assert app.worst_out[1] < -5000, app.worst_out[1]
    assert app.fans[0].duty >= ff - 700, (app.fans[0].duty, ff)


def test_a_power_rise_with_a_die_that_stays_far_below_keeps_the_minimum():
    hal, app = _idle()
    _hold(hal, app, 60, 56000, 320000)  # the die settles far under its setpoint (cool)
    assert app.fans[0].duty < app.pid.out_min + 655, app.fans[0].duty


def test_the_gpu_ntc_setpoint_no_longer_governs_but_its_warning_limit_does():
    hal, app = boot(temps_c=(60.0, 40.0, 40.0, 25.0))
    _hold(hal, app, 120, 68000, 300000)
    mn = app.pid.out_min
    # the probe on the core, 72 degC: 2 over its 70 degC setpoint; the die 10 under
    for t in (65.0, 70.0, 72.0):
        hal.set_temp(0, t)
        _hold(hal, app, 1, 73000, 300000)
    _hold(hal, app, 90, 73000, 300000)
    assert app.sup.state == C.STATE_HOSTED, C.STATES[app.sup.state]
    assert app.fans[0].duty < mn + 655, app.fans[0].duty
    # the same probe at 79 degC: 2 under its warning limit with the die measured
    # (slowdown - 3 = 80): component protection drives the fans
    for t in (75.0, 79.0):
        hal.set_temp(0, t)
        _hold(hal, app, 1, 73000, 300000)
    _hold(hal, app, 30, 73000, 300000)
    assert app.sup.state == C.STATE_HOSTED, C.STATES[app.sup.state]
    assert app.fans[0].duty > mn + 6553 * 2, app.fans[0].duty


def test_load_bursts_do_not_move_the_fans():
    # 6 s at 320 W / 4 s idle: the die swings by 20 degC, its envelope and the power
    # envelope hold the peaks: after the first bursts no duty change of more than 1 %
    hal, app = _idle()
    changes = 0
    prev = -1
    t = 0
    while t < 400:
        on = t % 10 < 6
        _hb(hal, 76000 if on else 56000, 320000 if on else 30000)
        run(app, hal, 1000)
        d = app.fans[0].duty
        if t >= 100 and prev >= 0 and (d - prev > 655 or prev - d > 655):
            changes += 1
        prev = d
        t += 1
    assert changes <= 2 * 5, changes  # at most 2 a minute over the last 5 minutes
    assert app.sup.state == C.STATE_HOSTED, C.STATES[app.sup.state]


def test_the_die_warns_from_slowdown_minus_2_and_is_critical_from_slowdown_plus_1():
    hal, app = _idle(gpu_c=60.0)
    _hold(hal, app, 3, SLOW - 3000, 300000)
    assert not app.sup.over & 1, app.sup.over
    _hb(hal, SLOW - 2000, 300000)  # NVML's whole degrees: slowdown - 2 reached
    run(app, hal, 1000)
    assert app.sup.over & 1 and app.sup.state == C.STATE_FAILSAFE, C.STATES[app.sup.state]
    assert app.sup.reason == C.REASON_OVER_TEMP
    _hb(hal, SLOW, 300000)
    run(app, hal, 1000)
    assert not app.sup.crit & 1, app.sup.crit
    _hb(hal, SLOW + 1000, 300000)
    run(app, hal, 1000)
    assert app.sup.crit & 1 and app.sup.reason == C.REASON_CRITICAL_TEMP
    assert app.fans[0].duty == 65535 and app.fans[1].duty == 65535
