"""Relay autotune on the real App (fake board, a lagging integer plant closing the loop
through the ADC), under the safety harness's oracle: every tick's duty is checked
against the raw-ADC floors (tests/safety_harness.py, I1-I5). The test starts only
signed and only HOSTED in auto mode, reports per cycle and at the end, never applies
gains by itself, and ends with an event on a fan stall, host loss, manual mode, a
host abort or a temperature past its limit, after which the PID takes over. DUAL."""

from safety_harness import Harness

from device import safety as S
from protocol import catalog as C

DUAL = True
MPY_TIMEOUT = 900

SP = 70000


class Plant:
    """C dT/dt = P - G(duty)(T - 25 degC), C = 200 J/K, G = 1 + 9 duty/65535 W/K; the
    NTC follows through a 12 s lag and a 2 s dead time (micro-degC inside)."""

    def __init__(self, q_mw=300000):
        self.t_u = SP * 1000
        self.n_u = SP * 1000
        self.q = q_mw
        self.buf = [SP] * 21

    def advance(self, duty, dt=100):
        g = 1000 + 9000 * duty // 65535
        self.t_u += (self.q - g * (self.t_u // 1000 - 25000) // 1000) * dt // 200
        self.n_u += (self.t_u - self.n_u) * dt // (12000 + dt)
        self.buf.append(self.n_u // 1000)
        self.buf.pop(0)

    @property
    def ntc(self):
        return self.buf[0]


class Rig:
    def __init__(self):
        self.h = Harness()
        self.plant = Plant()
        self.h.host(True)
        self.h.set_temp(0, SP / 1000)
        # the harness's heartbeats carry a fixed die temperature: regulate the NTC
        # plant (the hosted die-envelope loop is tested in tests/test_autotune_sim.py)
        assert self.h.command("config_set", {"values": {"pid.die_sp_mc": 0}}) == "ack"
        self.items = []

    def run(self, ms, until=None):
        t = 0
        while t < ms:
            self.plant.advance(self.h.hal.pwm[0].duty_u16())
            self.h.set_temp(0, self.plant.ntc / 1000)
            self.h.advance(100)
            got = self.h.hal.take()
            for m in got:  # telemetry (5 Hz over ~40 simulated minutes) is not kept
                if not (m.ok and m.name == "telemetry"):
                    self.items.append(m)
            t += 100
            if until is not None and until(got):
                return True
        return False

    def command(self, name, fields):
        """Send a signed command, run until it is answered; keeps every item."""
        seq = self.h.send_signed(name, fields)
        answer = []

        def answered(got):
            for m in got:
                if m.ok and m.name in ("ack", "nack") and m.fields["ref"] == seq:
                    answer.append(m.name)
            return bool(answer)

        self.run(1000, answered)
        return answer[0] if answer else None

    def reports(self):
        return [m.fields for m in self.items if m.ok and m.name == "autotune_report"]

    def events(self):
        return [
            m.fields
            for m in self.items
            if m.ok and m.name == "event" and m.fields["code"] == C.REASON_AUTOTUNE
        ]


def _final(got):
    for m in got:
        if m.ok and m.name == "autotune_report" and m.fields["status"] != C.TUNE_RUNNING:
            return True
    return False


def _started(**fields):
    rig = Rig()
    rig.run(120000)  # the PID settles the plant near the setpoint
    assert rig.h.app.sup.state == C.STATE_HOSTED, C.STATES[rig.h.app.sup.state]
    f = {"action": 0}
    f.update(fields)
    assert rig.command("autotune", f) == "ack"
    assert rig.h.app.tune.running
    return rig


def test_autotune_measures_the_plant_and_leaves_the_gains_to_the_host():
    rig = _started()
    app = rig.h.app
    pid_before = dict(app.cfg["pid"])
    duties = set()

    def watch(got):
        duties.add(rig.h.hal.pwm[0].duty_u16())
        return _final(got)

    assert rig.run(1200000, watch), rig.reports()[-1:]
    reps = rig.reports()
    final = reps[-1]
    assert final["status"] == C.TUNE_DONE, final
    running = [r for r in reps if r["status"] == C.TUNE_RUNNING]
    assert len(running) >= 3, reps  # the start, then one per measured cycle but the last
    assert final["cycles"] >= 3 and final["ku"] > 0 and final["pu_ms"] > 10000, final
    assert final["kp"] == final["ku"] * 5 // 16 and final["ki"] > 0 and final["kd"] == 0
    lo = final["bias"] - final["relay"]
    hi = final["bias"] + final["relay"]
    assert lo >= app.pid.out_min, (lo, app.pid.out_min)
    assert {lo, hi} <= duties, (lo, hi, sorted(duties)[:8])
    ev = rig.events()
    assert len(ev) == 1 and ev[0]["value"] == C.TUNE_DONE and ev[0]["severity"] == C.SEV_INFO
    assert app.cfg["pid"] == pid_before  # proposed, not applied
    # the PID took over: the relay's two levels are no longer what the fans do
    rig.items = []
    rig.run(300000)
    assert not app.tune.running and app.mode == 0
    assert rig.h.hal.pwm[0].duty_u16() not in (lo, hi) or abs(rig.plant.ntc - SP) < 1500
    # the proposed gains, written like a host does, hold the plant (no limit cycle)
    gains = {"kp": final["kp"], "ki": final["ki"], "kd": final["kd"]}
    assert rig.command("pid_gains", gains) == "ack"
    temps = []
    t = 0
    while t < 600000:
        rig.run(1000)
        temps.append(rig.plant.ntc)
        t += 1000
    tail = temps[-240:]
    assert max(tail) - min(tail) <= 600, (min(tail), max(tail))
    band = app.cfg["pid"].get("deadband_mc", 0)  # the PID does not act inside it
    assert abs(sum(tail) // len(tail) - SP) <= band + 500, (sum(tail) // len(tail), band)


def test_start_needs_a_signature_and_hosted_auto_mode():
    rig = Rig()
    rig.run(3000)
    h = rig.h
    assert h.command("autotune", {"action": 0}, how="unsigned") == "nack"
    assert h.command("autotune", {"action": 0}, how="forged") == "nack"
    assert not h.app.tune.running
    assert h.command("fan_mode", {"mode": 1, "duty1": 40000}) == "ack"
    assert h.command("autotune", {"action": 0}) == "nack"  # MANUAL
    assert h.command("fan_mode", {"mode": 0}) == "ack"
    h.host(False)
    rig.run(8000)
    assert h.app.sup.state == C.STATE_STANDALONE
    assert h.command("autotune", {"action": 0}) == "nack"  # no host
    assert not h.app.tune.running
    # abort with nothing running is fine
    assert h.command("autotune", {"action": 1}) == "ack"


def _abort_case(act, want_status, want_cause=0):
    rig = _started()
    rig.run(30000)
    assert rig.h.app.tune.running
    act(rig)
    assert _final(rig.items) or rig.run(20000, _final), rig.reports()[-1:]
    final = rig.reports()[-1]
    assert final["status"] == want_status, (C.TUNE_STATUS[final["status"]], final)
    if want_cause:
        assert final["causes"] & want_cause, final
    ev = rig.events()
    assert len(ev) == 1 and ev[0]["value"] == want_status and ev[0]["severity"] == C.SEV_WARNING
    assert not rig.h.app.tune.running
    assert "kp" not in final
    return rig


def test_a_fan_stall_aborts_it():
    rig = _abort_case(lambda r: r.h.set_fan(1, "stalled"), C.TUNE_SAFETY, S.CAUSE_STALL)
    assert rig.h.hal.pwm[0].duty_u16() == 65535  # the stall floor, not the relay


def test_host_loss_aborts_it():
    def lose(r):
        r.h.host(False)

    _abort_case(lose, C.TUNE_SAFETY, S.CAUSE_HOST_LOST)


def test_manual_mode_and_a_host_abort_end_it():
    def manual(r):
        assert r.command("fan_mode", {"mode": 1, "duty1": 50000}) == "ack"

    _abort_case(manual, C.TUNE_NOT_HOSTED)

    def abort(r):
        assert r.command("autotune", {"action": 1}) == "ack"

    _abort_case(abort, C.TUNE_ABORTED)


def test_a_temperature_past_its_limit_aborts_it():
    def heat(r):
        r.plant.q = 900000  # far more than the relay's high level removes

    _abort_case(heat, C.TUNE_TOO_HOT)


def test_ticks_of_a_running_test_do_not_allocate():
    from mpcompat import heap_locked

    rig = _started()
    h = rig.h
    app = h.app
    h.set_temp(0, 68.0)  # steady: the bias is held, then the relay starts about 68 degC
    h.advance(45000)  # past the settling (30 s at least) and its report
    assert not app.tune.settling and app.tune.center < 0, app.tune.center
    hal = h.hal
    app.hb_ms = hal.ticks_ms()  # no heartbeats arrive under the lock: freeze the host
    app.host_timeout_ms = 10**8
    hal.take()

    def ticks():
        n = 0
        while n < 300:
            app.step()
            hal.advance(100)
            n += 1
            if hal.tx_len > 60000:
                hal.tx_len = 0

    heap_locked(ticks)
    assert app.failures == 0, app.failures
    assert app.tune.running, C.TUNE_STATUS[app.tune.status]
    assert hal.pwm[0].duty_u16() == app.tune.hi  # no switch: the error sits at the center
