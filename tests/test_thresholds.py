"""The GPU channel's warning and critical limits follow the GPU's own slowdown
temperature (heartbeat ``gpu_slowdown``): lowered to ``slowdown - margin``, never
raised above the configured limits, back to the configured ones when the host is
lost or stops sending it, with the supervisor's usual hysteresis. Supervisor unit
tests, then the real App on the fake board under the safety harness's oracle (every
tick checked against the raw-ADC floors). DUAL."""

from safety_harness import Harness
from test_app_safety import events as _events
from test_app_safety import run_collect as _run

from device import config
from device import failsafe as FS
from device.failsafe import EventQueue, Supervisor
from protocol import catalog as C

DUAL = True
MPY_TIMEOUT = 600

WARN_M = FS.SLOWDOWN_WARN_MARGIN_MC
CRIT_M = FS.SLOWDOWN_CRIT_MARGIN_MC
DIE_W = 3000  # with the host's die measured: the NTC warns over slowdown - 3 ...
DIE_C = 0  # ... and is critical at the slowdown (issue 25)


def _sup():
    return Supervisor(config.defaults(), EventQueue(32))


def _temps(gpu_mc):
    from array import array

    return array("i", [gpu_mc, 50000, 55000, 25000])


def _tick(sup, gpu_mc, host=True):
    sup.update(_temps(gpu_mc), 0, 0, 0, False, False, host, False, True)


def test_limits_are_lowered_never_raised_and_restored():
    sup = _sup()
    cfg_w, cfg_c = sup.warn_mc[0], sup.crit_mc[0]
    assert (cfg_w, cfg_c) == (85000, 90000)
    sup.follow_slowdown(83000)
    assert (sup.warn_mc[0], sup.crit_mc[0]) == (83000 - WARN_M, 83000 - CRIT_M)
    assert sup.warn_mc[0] < sup.crit_mc[0] < 83000
    sup.follow_slowdown(125000)  # a slowdown above the configured limits raises nothing
    assert (sup.warn_mc[0], sup.crit_mc[0]) == (cfg_w, cfg_c)
    sup.follow_slowdown(92000)  # just above the configured limits: both lowered
    assert (sup.warn_mc[0], sup.crit_mc[0]) == (92000 - WARN_M, 92000 - CRIT_M)
    sup.follow_slowdown(93000)  # 93 - 8 = 85 and 93 - 3 = 90: the configured ones
    assert (sup.warn_mc[0], sup.crit_mc[0]) == (cfg_w, cfg_c)
    sup.follow_slowdown(0)
    assert (sup.warn_mc[0], sup.crit_mc[0]) == (cfg_w, cfg_c)
    # only the GPU channel follows the GPU
    sup.follow_slowdown(60000)
    assert sup.warn_mc[1] == 90000 and sup.crit_mc[1] == 95000
    for s in range(40000, 130001, 500):
        sup.follow_slowdown(s)
        assert sup.warn_mc[0] <= cfg_w and sup.crit_mc[0] <= cfg_c, s
        assert sup.warn_mc[0] < sup.crit_mc[0], s
        assert sup.warn_mc[0] <= s - WARN_M or sup.warn_mc[0] == cfg_w


def test_lowered_limits_keep_the_hysteresis():
    sup = _sup()
    sup.follow_slowdown(83000)
    warn = 83000 - WARN_M
    _tick(sup, warn)
    assert not sup.over
    _tick(sup, warn + 1)
    assert sup.over & 1 and sup.state == C.STATE_FAILSAFE
    _tick(sup, warn - sup.hyst_mc)  # inside the band: stays
    assert sup.over & 1
    _tick(sup, warn - sup.hyst_mc - 1)
    assert not sup.over
    _tick(sup, 83000 - CRIT_M)
    assert sup.crit & 1 and sup.reason == C.REASON_CRITICAL_TEMP


def test_follow_slowdown_does_not_allocate():
    from mpcompat import heap_locked

    sup = _sup()

    def run():
        s = 40000
        while s < 130000:
            sup.follow_slowdown(s)
            sup.follow_slowdown(s)
            sup.follow_slowdown(0)
            s += 100

    heap_locked(run)
    assert sup.warn_mc[0] == 85000


class SlowdownHost(Harness):
    """The harness's host, sending the GPU's slowdown temperature too (or not)."""

    slowdown = 83000

    def _send_heartbeat(self):
        self.last_hb = self.now
        if self.host_seen_at is None:
            self.host_seen_at = self.now
        fields = {"gpu_power": self.hb_power, "power_limit": 320000}
        if self.hb_temp is not None:  # None: a host that sends no die temperature
            fields["gpu_temp"] = self.hb_temp
        if self.slowdown:
            fields["gpu_slowdown"] = self.slowdown
        self.send_signed("heartbeat", fields)


def _warning_then_critical(h, warn_c, crit_c):
    """The GPU NTC at ``warn_c``: an over-temperature warning on channel 0, FAILSAFE
    and its floor; then at ``crit_c``: critical, both fans at 100 %."""
    app = h.app
    h.set_temp(0, warn_c)
    items = _run(h, 2000)
    ev = _events(items, C.REASON_OVER_TEMP)
    assert ev and ev[0].fields["active"] and ev[0].fields["index"] == 0, items
    assert app.sup.state == C.STATE_FAILSAFE and app.sup.reason == C.REASON_OVER_TEMP
    assert min(h.hal.pwm[0].duty_u16(), h.hal.pwm[1].duty_u16()) >= app.safety.f_over
    h.set_temp(0, crit_c)
    items = _run(h, 2000)
    assert _events(items, C.REASON_CRITICAL_TEMP), items
    assert (h.hal.pwm[0].duty_u16(), h.hal.pwm[1].duty_u16()) == (65535, 65535)


def test_app_warns_below_the_configured_limit_when_the_gpu_slows_down_earlier():
    # a heartbeat without the die's temperature: the NTC stands in for it, read as a
    # probe below the die (slowdown - 8 / - 3)
    h = SlowdownHost()
    h.hb_temp = None
    h.host(True)
    h.set_temp(0, 70.0)
    _run(h, 3000)
    app = h.app
    assert app.sup.state == C.STATE_HOSTED, C.STATES[app.sup.state]
    assert app.gpu_slowdown_mc == 83000
    assert app.sup.warn_mc[0] == 83000 - WARN_M
    assert app.safety.crit_mc[0] == 83000 - CRIT_M
    # 77 degC on the GPU NTC: under the configured 85, over the lowered 75; 81 degC:
    # critical under the GPU's slowdown, both fans at 100 %
    _warning_then_critical(h, 77.0, 81.0)
    h.set_temp(0, 77.0)
    _run(h, 3000)
    assert not app.sup.crit and app.sup.over & 1


def test_with_the_hosts_die_the_gpu_ntc_limits_guess_nothing_about_its_placement():
    # issue 25: a probe on the core read 75.2 degC (over slowdown - 8) with the die 7
    # degC under its slowdown: FAILSAFE(over_temp) for 91 s. With the die measured the
    # die itself warns from slowdown - 2; the NTC keeps min(configured, slowdown - 3)
    # and min(configured, slowdown): a probe on the die's heat path reads no higher
    # than the die
    h = SlowdownHost()
    h.hb_temp = 76000
    h.host(True)
    h.set_temp(0, 70.0)
    _run(h, 3000)
    app = h.app
    assert app.sup.warn_mc[0] == 83000 - DIE_W and app.safety.crit_mc[0] == 83000 - DIE_C
    h.set_temp(0, 75.0)
    h.hb_temp = 77000  # the NTC on the core, just under the die: no alarm
    items = _run(h, 3000)
    assert not _events(items, C.REASON_OVER_TEMP) and app.sup.state == C.STATE_HOSTED, items
    # the NTC over slowdown - 3: a warning, whatever the die says; at the slowdown:
    # critical, both fans at 100 %
    _warning_then_critical(h, 81.0, 83.0)


def test_app_keeps_the_learned_limits_without_the_host():
    # issue 23 item 15: without a host the limits follow the last slowdown it sent
    # (the die at slowdown - 1.5 warns while hosted; the NTC reads 4.5 degC below it)
    h = SlowdownHost()
    h.hb_temp = 81500
    h.host(True)
    h.set_temp(0, 77.0)
    _run(h, 3000)
    app = h.app
    assert app.sup.over & 1
    before = min(h.hal.pwm[0].duty_u16(), h.hal.pwm[1].duty_u16())
    h.host(False)
    _run(h, 8000)  # past host_timeout_ms: STANDALONE, the learned limits
    assert app.sup.reason == C.REASON_OVER_TEMP, C.REASONS[app.sup.reason]
    assert app.sup.warn_mc[0] == 83000 - WARN_M and app.safety.crit_mc[0] == 83000 - CRIT_M
    assert app.sup.over & 1
    # the host-loss hold keeps what the fans ran at (the harness checks it every tick)
    assert min(h.hal.pwm[0].duty_u16(), h.hal.pwm[1].duty_u16()) >= before
    h.set_temp(0, 60.0)
    items = _run(h, 8000)
    assert app.sup.state == C.STATE_STANDALONE, C.STATES[app.sup.state]
    cleared = [e for e in _events(items, C.REASON_OVER_TEMP) if not e.fields["active"]]
    assert cleared, items
    # the host comes back: its slowdown and its die rule again
    h.set_temp(0, 77.0)
    h.host(True)
    _run(h, 3000)
    assert app.sup.warn_mc[0] == 83000 - DIE_W and app.sup.over & 1


def test_a_heartbeat_without_the_slowdown_or_above_the_limits_changes_nothing():
    h = SlowdownHost()
    h.slowdown = 0
    h.host(True)
    h.set_temp(0, 80.0)
    _run(h, 3000)
    app = h.app
    assert app.sup.state == C.STATE_HOSTED and app.gpu_slowdown_mc == 0
    assert app.sup.warn_mc[0] == 85000 and app.safety.crit_mc[0] == 90000
    h.slowdown = 110000  # an H100-like 110 degC threshold: the configured limits stay
    _run(h, 3000)
    assert app.gpu_slowdown_mc == 110000
    assert app.sup.warn_mc[0] == 85000 and app.safety.crit_mc[0] == 90000
    assert app.sup.state == C.STATE_HOSTED
    h.slowdown = 84000  # lowered by the next heartbeat; the die measured: slowdown - 3
    _run(h, 3000)
    assert app.sup.warn_mc[0] == 84000 - DIE_W and not app.sup.over
    h.set_temp(0, 82.0)  # over it: a warning now
    _run(h, 3000)
    assert app.sup.warn_mc[0] == 84000 - DIE_W and app.sup.over & 1
    h.slowdown = 0  # a host that stops sending it: the last slowdown it sent stays
    _run(h, 3000)  # (issue 23 item 15: limits follow what the module learned)
    assert app.sup.warn_mc[0] == 84000 - WARN_M and app.sup.over & 1


def test_the_hosts_die_temperature_warns_before_the_slowdown_whatever_the_ntc_reads():
    h = SlowdownHost()
    h.host(True)
    h.set_temp(0, 65.0)  # the NTC beside the MOSFETs, far below a hot die
    h.hb_temp = 80000
    _run(h, 3000)
    app = h.app
    assert app.sup.state == C.STATE_HOSTED and not app.sup.over
    h.hb_temp = 81500  # past slowdown - 2
    items = _run(h, 2000)
    ev = _events(items, C.REASON_OVER_TEMP)
    assert ev and ev[0].fields["active"] and ev[0].fields["value"] == 81500 - FS.DIE_OFFSET_MC, ev
    assert app.sup.state == C.STATE_FAILSAFE
    h.hb_temp = 86000  # slowdown + 3: critical, full cooling
    _run(h, 2000)
    assert app.sup.crit & 1
    assert (h.hal.pwm[0].duty_u16(), h.hal.pwm[1].duty_u16()) == (65535, 65535)
    # without a slowdown in the heartbeat the die does not count: configured behaviour
    h2 = SlowdownHost()
    h2.slowdown = 0
    h2.hb_temp = 86000
    h2.host(True)
    h2.set_temp(0, 65.0)
    _run(h2, 3000)
    assert h2.app.sup.state == C.STATE_HOSTED and not h2.app.sup.over
