"""modbridge.ops.control without a subprocess: parsing what a person types, the checks
before anything is sent, the requests built, the answers rendered in display units,
target resolution; and the safety property: any sequence of these commands, sent to
the real firmware App on the fake board (tests/safety_harness.py), never takes a fan
below the floor the firmware documents (docs/safety.md), the harness's oracle checking
every control tick."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from safety_harness import STEP_MS, Harness

from device import config as dc
from device import floors
from modbridge.cli.main import main
from modbridge.ops import control as ctl
from protocol import catalog as C
from protocol.frame import encode_frame

# --------------------------------------------------------------------- parsing


def test_percent_and_degc_forms():
    for text in ("40%", "40 %", "40", " 40.0% ", "+40"):
        assert ctl.parse_percent(text) == 40.0
    assert ctl.parse_percent("37.5%") == 37.5
    for text in ("70", "70C", "70 degC", "70°C", "70.0"):
        assert ctl.parse_degc(text) == 70.0
    for bad in ("", "%", "forty", "40%%", "4 0", "nan", "1e3"):
        with pytest.raises(ctl.InputError, match="percentage"):
            ctl.parse_percent(bad, "duty1")
    with pytest.raises(ctl.InputError, match="setpoint gpu"):
        ctl.parse_degc("hot", "setpoint gpu")


def test_curve_parsing_and_checks():
    pts = ctl.parse_curve(["40:30", "60:50,80:100"])
    assert pts == [(40.0, 30.0), (60.0, 50.0), (80.0, 100.0)]
    assert ctl.parse_curve("40:30 60:50") == [(40.0, 30.0), (60.0, 50.0)]
    f = ctl.curve_fields(pts, 2)
    assert f == {"points": [[40000, 19661], [60000, 32768], [80000, 65535]], "hysteresis": 2000}
    for bad, why in (
        (["40"], "degC:percent"),
        (["40:x"], "percentage"),
        ([], "at least 2"),
    ):
        with pytest.raises(ctl.InputError, match=why):
            ctl.parse_curve(bad)
    for pts, why in (
        ([(40, 30)], "2..16 points"),
        ([(40, 30), (40, 50)], r"points\[1\].*ascend"),
        ([(40, 50), (60, 30)], r"points\[1\].*must not fall"),
        ([(40, 30), (60, 130)], r"points\[1\].*0..100 %"),
        ([(-80, 30), (60, 50)], r"points\[0\].*-55..200 degC"),
        ([(t, 50) for t in range(20, 20 + 17 * 5, 5)], "2..16 points"),
    ):
        with pytest.raises(ctl.InputError, match=why):
            ctl.curve_fields(pts)
    with pytest.raises(ctl.InputError, match="hysteresis must be 0..20 degC"):
        ctl.curve_fields([(40, 30), (60, 50)], 25)


def test_fan_fields_keep_the_other_fan_and_respect_the_manual_minimum():
    f = ctl.fan_fields({1: 40}, {"fan1_duty": 13107, "fan2_duty": 45875})
    assert f == {"mode": 1, "duty1": 26214, "duty2": 45875}
    f = ctl.fan_fields({2: 55}, {"fan1_duty": 1000, "fan2_duty": 65535})
    assert f["duty1"] == floors.FLOOR_MANUAL and f["duty2"] == 36044  # raised to 30 %
    assert ctl.fan_fields({1: 40}, None) == {"mode": 1, "duty1": 26214, "duty2": 26214}
    with pytest.raises(ctl.InputError, match=r"duty1 must be 30..100 %.*got 20 %"):
        ctl.fan_fields({1: 20})
    with pytest.raises(ctl.InputError, match="duty2 must be 0..100 %"):
        ctl.fan_fields({2: 101})


def test_gains_and_setpoints_in_display_units():
    assert ctl.parse_gains(["kp=5", "KI=0.2"]) == {"kp": 5.0, "ki": 0.2}
    assert ctl.to_wire("pid_gains", "ki", 0.2) == 200
    with pytest.raises(ctl.InputError, match="NAME one of kp, ki, kd, kff"):
        ctl.parse_gains(["kx=1"])
    with pytest.raises(ctl.InputError, match="kp must be 0..1000 %/degC"):
        ctl.to_wire("pid_gains", "kp", 1001)
    assert ctl.to_wire("setpoints", "sp_gpu", 70) == 70000
    with pytest.raises(ctl.InputError, match="sp_amb must be 10..60 degC, got 70 degC"):
        ctl.to_wire("setpoints", "sp_amb", 70)


# ---------------------------------------------------------- properties (hypothesis)

_PCT = st.decimals(min_value=-50, max_value=150, places=1, allow_nan=False, allow_infinity=False)


@given(pct=_PCT, fan=st.sampled_from((1, 2)))
def test_any_accepted_duty_round_trips_and_any_other_is_refused_by_name(pct, fan):
    pct = float(pct)
    try:
        f = ctl.fan_fields({fan: pct}, {"fan1_duty": 30000, "fan2_duty": 30000})
    except ctl.InputError as e:
        assert pct < 30 or pct > 100
        assert f"duty{fan}" in str(e)
        return
    assert 30 <= pct <= 100
    wire = f[f"duty{fan}"]
    fdef = ctl.catalog_field("fan_mode", f"duty{fan}")
    assert fdef[C.F_LO] <= wire <= fdef[C.F_HI] and wire >= floors.FLOOR_MANUAL
    assert ctl.PCT.to_display(wire) == pct
    encode_frame("fan_mode", f, 1)  # the catalog takes it


@given(ch=st.sampled_from(C.CHANNELS),
       c=st.decimals(min_value=-100, max_value=250, places=3, allow_nan=False,
                     allow_infinity=False))  # fmt: skip
def test_any_accepted_setpoint_round_trips_and_any_other_is_refused_by_name(ch, c):
    c = float(c)
    name = f"sp_{ch}"
    fdef = ctl.catalog_field("setpoints", name)
    try:
        wire = ctl.to_wire("setpoints", name, c)
    except ctl.InputError as e:
        assert not fdef[C.F_LO] <= round(c * 1000) <= fdef[C.F_HI]
        assert name in str(e) and "degC" in str(e)
        return
    assert fdef[C.F_LO] <= wire <= fdef[C.F_HI]
    assert ctl.DEGC.to_display(wire) == c
    encode_frame("setpoints", {name: wire}, 1)


_POINT = st.tuples(st.integers(-60, 210), st.integers(-5, 105))


@given(points=st.lists(_POINT, min_size=0, max_size=18), hyst=st.none() | st.integers(-2, 25))
def test_any_accepted_curve_fits_the_wire_and_the_modules_rules(points, hyst):
    try:
        f = ctl.curve_fields(points, hyst)
    except ctl.InputError as e:
        assert "points" in str(e) or "hysteresis" in str(e)
        return
    wire = f["points"]
    assert 2 <= len(wire) <= 16
    for (t, d), (tw, dw) in zip(points, wire, strict=True):
        assert ctl.DEGC.to_display(tw) == t and ctl.PCT.to_display(dw) == d
    # what the module itself checks (device/config.py) holds: it validates
    cfg = dc.merge(dc.defaults(), {"curve.points": wire, **(
        {"curve.hysteresis_mc": f["hysteresis"]} if "hysteresis" in f else {})})
    assert cfg["curve"]["points"] == wire
    encode_frame("fan_curve", f, 1)


# ----------------------------------------------------------- module config keys


def test_every_config_key_has_one_display_key_that_leads_back():
    keys = ctl.known_keys()
    displays = [k.display for k in keys.values()]
    assert len(set(displays)) == len(displays)
    for fw, k in keys.items():
        assert ctl.lookup_key(k.display).key == fw
        assert not k.display.endswith(("_mc", "_mv", "_ma")), k.display
    assert keys["channels.0.setpoint_mc"].display == "gpu.setpoint"
    assert keys["fans.1.min_duty"].display == "fan2.min_duty"
    assert ctl.lookup_key("channels.0.setpoint").key == "channels.0.setpoint_mc"
    assert ctl.lookup_key("channels.vram.warn").key == "channels.1.warn_mc"
    assert ctl.lookup_key("fans.0.kick_duty").key == "fans.0.kick_duty"
    with pytest.raises(ctl.InputError, match="type gpu.setpoint=VALUE in degC"):
        ctl.lookup_key("channels.0.setpoint_mc")
    with pytest.raises(ctl.InputError, match="no such module config key.*pid has"):
        ctl.lookup_key("pid.kq")


def test_factory_values_shown_then_typed_back_give_the_same_wire_values():
    flat = dc.flatten(dc.defaults())
    for fw, wire in flat.items():
        k = ctl.known_keys()[fw]
        if isinstance(wire, bool) or not isinstance(wire, (int, str)) or k.spec[0] != "int":
            continue
        text = k.show(wire)
        if k.unit is ctl.PCT:  # 0.1 % shown: within half a step of the wire value
            assert abs(ctl.parse_config_value(k, text) - wire) <= 33, (fw, text)
        else:
            assert ctl.parse_config_value(k, text) == wire, (fw, text)
    pts = ctl.known_keys()["curve.points"]
    assert pts.show(flat["curve.points"]) == "30:20 50:30 65:50 75:70 85:100 (degC:%)"
    assert ctl.parse_config_value(pts, "30:20 50:30") == [[30000, 13107], [50000, 19661]]


def test_config_values_are_checked_against_the_schema_in_display_units():
    k, v = ctl.parse_assignment("gpu.setpoint=72.5")
    assert (k.key, v) == ("channels.0.setpoint_mc", 72500)
    assert ctl.parse_assignment("fan1.min_duty=25%")[1] == 16384
    assert ctl.parse_assignment("pid.kp=4")[1] == 4000
    assert ctl.parse_assignment("ina226.uv=11.4")[1] == 11400
    assert ctl.parse_assignment("control.mode=curve")[1] == "curve"
    assert ctl.parse_assignment("gpu.controlled=no")[1] is False
    assert ctl.parse_assignment("control.host_timeout_ms=8000ms")[1] == 8000
    for text, why in (
        ("gpu.setpoint", "KEY=VALUE"),
        ("gpu.setpoint=hot", "temperature"),
        ("control.host_timeout_ms=500", r"host_timeout_ms must be 1000..30000 ms"),
        ("gpu.crit=300", r"gpu.crit must be -55..200 degC"),
        ("control.mode=fast", "one of auto, manual, curve"),
        ("gpu.ntc_low=maybe", "true or false"),
        ("control.period_ms=1.5", "whole number"),
        ("nosuch.key=1", "no such module config key"),
    ):
        with pytest.raises(ctl.InputError, match=why):
            ctl.parse_assignment(text)


def _maximal_config():
    cfg = dc.defaults()
    for ch in cfg["channels"]:
        ch["sh"] = [1.1234567890123e-3, 2.3456789012345e-4, 8.7654321098765e-8]
        ch["correction"] = [0.1234567891, -0.0012345678, 1.2345678e-6, 0, 0, 0, 0, 0]
        ch["model"] = "sh"
        ch["filter"] = "median5"
    cfg["curve"]["points"] = [[20000 + 5000 * i, 13107 + 3000 * i] for i in range(16)]
    cfg["_comment"] = "x" * 64
    return cfg


def test_every_section_asked_for_fits_one_config_frame():
    for cfg in (dc.defaults(), _maximal_config()):
        for sec in ctl.section_names(None):
            values = dc.get_section(cfg, sec)
            frame = encode_frame("config", {"ref": 65535, "values": values, "version": 1}, 1)
            assert len(frame) <= 512, (sec, len(frame))
    assert ctl.section_names("gpu") == ("channels.0",)
    assert ctl.section_names("gpu.setpoint") == ("channels.0.setpoint_mc",)
    with pytest.raises(ctl.InputError, match="no such config section"):
        ctl.section_names("nope")


# --------------------------------------------------------------------- rendering


@pytest.mark.parametrize("request_name, nack, text", [
    ("setpoints", {"code": 6, "field": "sp_gpu", "text": "sp_gpu=150000 outside 20000..110000"},
     "out_of_range: sp_gpu must be 20..110 degC"),
    ("setpoints", {"code": 6, "field": "channels.0.warn_mc",
                   "text": "channels[0].warn_mc: must be > setpoint_mc (100000), got 85000"},
     "out_of_range: gpu.warn must be > setpoint (100 degC), got 85 degC"),
    ("fan_mode", {"code": 6, "field": "duty1", "text": "duty1 below the safety minimum 26214"},
     "out_of_range: duty1 below the safety minimum 40 %"),
    ("config_set", {"code": 6, "field": "safety.host_lost",
                    "text": "safety.host_lost: must be >= 26214 (compiled floor, 40 %), got 100"},
     "out_of_range: safety.host_lost must be >= 40 % (compiled floor, 40 %), got 0.2 %"),
    ("config_save", {"code": 14, "text": "config_save rate-limited: one flash write per 20 s"},
     "rate_limited: config_save rate-limited: one flash write per 20 s"),
    ("fan_mode", {"code": 13, "text": "bad signature"}, "unauthorized: bad signature"),
    ("reboot", {"code": 99}, "99"),
])  # fmt: skip
def test_nacks_in_words_and_display_units(request_name, nack, text):
    assert ctl.refusal_text(request_name, nack) == text


class FakeTarget(ctl.Target):
    """Answers from a script; records what was sent."""

    via = "direct"
    port = "/dev/fake0"
    module_id = "b9bddcc21aff921d00d1d986"

    def __init__(self, replies=(), telemetry=None):
        self.sent = []
        self.replies = list(replies)
        self.tel = telemetry

    def request(self, name, fields=None, timeout=None, then_telemetry=False):
        self.sent.append((name, fields))
        r = self.replies.pop(0) if self.replies else ctl.Reply("ack", {})
        return r

    def telemetry(self):
        return self.tel


def _tel(state="MANUAL", d1=26214, d2=26214, faults=0):
    return {"state": C.STATES.index(state), "fan1_duty": d1, "fan2_duty": d2,
            "fan1_rpm": 1200, "fan2_rpm": 1200, "faults": faults, "reason": 12}  # fmt: skip


def test_set_fan_ack_and_a_floor_above_the_duty_asked():
    t = FakeTarget([ctl.Reply("ack", {}, _tel("BOOT", 45875, 45875))], _tel("HOSTED", 30000, 30000))
    o = ctl.set_fans(t, {1: 40})
    assert t.sent == [("fan_mode", {"mode": 1, "duty1": 26214, "duty2": 30000})]
    assert o.lines()[0] == "fan1: manual 40 % (ack)" and o.exit_code == 0
    text = "\n".join(o.lines())
    assert "fan1 runs at 70 %, above the 40 % asked: the boot floor" in text
    assert "is BOOT" in text and "not MANUAL" in text
    d = o.as_dict()
    assert d["ok"] and d["applied"]["fan1_duty_pct"] == 70.0 and d["applied"]["state"] == "BOOT"
    t = FakeTarget([ctl.Reply("ack", {}, _tel("MANUAL", 26214, 26214))])
    o = ctl.set_fans(t, {1: 40, 2: 40})
    assert o.summary == "fans: manual 40 %" and not any("above" in n for n in o.notes)
    stall = _tel("FAILSAFE", 65535, 65535, C.FAULT_FAN2_STALL)
    o = ctl.set_fans(FakeTarget([ctl.Reply("ack", {}, stall)]), {1: 40, 2: 40})
    assert any("a fault floor: fan2_stall" in n for n in o.notes)


def test_refusals_name_what_was_asked_and_exit_1():
    nack = ctl.Reply("nack", {"code": 6, "field": "channels.0.warn_mc",
                              "text": "channels[0].warn_mc: must be > setpoint_mc (100000), "
                                      "got 85000"})  # fmt: skip
    o = ctl.set_setpoint(FakeTarget([nack]), "gpu", 100)
    assert o.lines()[0] == ("setpoint gpu: refused: out_of_range: gpu.warn must be > setpoint "
                            "(100 degC), got 85 degC")  # fmt: skip
    assert o.exit_code == 1 and o.as_dict()["nack"]["field"] == "channels.0.warn_mc"
    o = ctl.set_setpoint(FakeTarget(), "gpu", 72)
    assert o.lines()[0] == "setpoint gpu: 72 degC (ack)"


def test_config_get_shows_display_units():
    values = dc.get_section(dc.defaults(), "channels.0")
    o = ctl.config_get(FakeTarget([ctl.Reply("config", {"ref": 1, "values": values})]), "gpu")
    text = "\n".join(o.lines())
    assert "gpu.setpoint    70 degC" in text and "gpu.r0          10000 ohm" in text
    assert o.data["values"]["gpu.setpoint"] == 70.0 and o.data["units"]["gpu.setpoint"] == "degC"
    assert o.data["keys"]["gpu.setpoint"] == "channels.0.setpoint_mc"
    t = FakeTarget()
    ctl.config_get(t, None)
    assert [f["section"] for _, f in t.sent] == list(ctl.section_names(None))


def test_config_get_model_shows_the_chassis_model_in_display_units():
    cfg = dc.defaults()
    cfg["model"].update(ok=1, lead_ms=6000, ga_q12=1229, rp_mcw=25, rpd_mcw=-10, off_mc=1500,
                        unc_mc=2500, slow_mc=87000)  # fmt: skip
    values = dc.get_section(cfg, "model")
    o = ctl.config_get(FakeTarget([ctl.Reply("config", {"ref": 1, "values": values})]), "model")
    lines = o.lines()
    for want in ("model.ok", "1"), ("model.lead_ms", "6000 ms"), ("model.ga", "0.3 degC/degC"), \
            ("model.rp", "25 degC/kW"), ("model.rpd", "-10 degC/kW"), ("model.off", "1.5 degC"), \
            ("model.unc", "2.5 degC"), ("model.slow", "87 degC"):  # fmt: skip
        assert any(line.split() == [want[0], *want[1].split()] for line in lines), (want, lines)
    assert o.data["keys"]["model.ga"] == "model.ga_q12"
    assert ctl.parse_assignment("model.ga=0.3")[1] == 1229
    assert ctl.parse_assignment("model.slow=87")[1] == 87000
    assert ctl.section_names("model") == ("model",)
    assert "model" in ctl.section_names(None)
    with pytest.raises(ctl.InputError, match="model.unc must be 0.5..15 degC"):
        ctl.parse_assignment("model.unc=0.1")


def test_selftest_report_rendered_and_a_failure_exits_1():
    rep = {"ref": 1, "passed": False, "fan1_rpm": [2900, 2300, 1600, 800],
           "fan2_rpm": [0, 0, 0, 0], "fans_ok": [True, False],
           "channels_ok": [True, True, False, True], "power_monitor_ok": True, "v_in": 12010,
           "text": "failed: fan2"}  # fmt: skip
    o = ctl.selftest(FakeTarget([ctl.Reply("selftest_report", rep)]))
    lines = o.lines()
    assert lines[0] == "selftest: FAILED" and o.exit_code == 1
    assert "  fan1: ok: 100 % 2900 RPM, 75 % 2300 RPM, 50 % 1600 RPM, 25 % 800 RPM" in lines
    assert "  fan2: FAIL: 100 % 0 RPM, 75 % 0 RPM, 50 % 0 RPM, 25 % 0 RPM" in lines
    assert "  channels: gpu ok, vram ok, mos FAIL, amb ok" in lines
    assert "  12 V input: ok: 12.01 V" in lines
    assert o.as_dict()["data"]["v_in_v"] == 12.01


def test_repl_refused_through_the_bridge():
    t = FakeTarget()
    t.via = "bridge"
    with pytest.raises(ctl.ControlError, match="stop the bridge first"):
        ctl.repl(t)
    o = ctl.repl(FakeTarget())
    assert any("mpremote connect /dev/fake0" in n for n in o.notes)


def test_pick_module_by_port_id_name_and_prefix():
    entries = [("/dev/m0", "b9bd00", ["gpu0"]), ("/dev/m1", "b9cc11", []), ("/dev/m2", None, [])]
    assert ctl.pick_module("/dev/m1", entries) == "/dev/m1"
    assert ctl.pick_module("b9cc11", entries) == "/dev/m1"
    assert ctl.pick_module("gpu0", entries) == "/dev/m0"
    assert ctl.pick_module("B9BD", entries) == "/dev/m0"
    with pytest.raises(ctl.TargetNotFound, match="ambiguous"):
        ctl.pick_module("b9", entries)
    with pytest.raises(ctl.TargetNotFound, match="no module gpu7 .*gpu0"):
        ctl.pick_module("gpu7", entries)


# ------------------------------------------------------------ CLI: bad input, exit 2


@pytest.mark.parametrize("args, why", [
    (["set", "/nonexistent/tty", "fan1", "10%"], "duty1 must be 30..100 %"),
    (["set", "/nonexistent/tty", "fan1"], "give a duty"),
    (["set", "/nonexistent/tty", "fan3", "40%"], "can set fan1, fan2"),
    (["set", "/nonexistent/tty", "mode", "turbo"], "mode: one of auto, manual, curve"),
    (["set", "/nonexistent/tty", "setpoint", "cpu", "70"], "channel one of gpu"),
    (["set", "/nonexistent/tty", "setpoint", "gpu", "150"], "sp_gpu must be 20..110 degC"),
    (["set", "/nonexistent/tty", "curve", "40:30"], "2..16 points"),
    (["set", "/nonexistent/tty", "fan1", "40%", "--hysteresis", "2"], "--hysteresis goes"),
    (["set", "/nonexistent/tty", "pid", "kp=-1"], "kp must be 0..1000"),
    (["config", "set", "/nonexistent/tty", "gpu.setpoint_mc=70000"], "type gpu.setpoint"),
    (["config", "get", "/nonexistent/tty", "nope"], "no such config section"),
    (["config", "reset", "/nonexistent/tty", "--json"], "add --yes"),
    (["selftest"], "give the MODULE"),
])  # fmt: skip
def test_cli_input_errors_exit_2_before_anything_is_opened(args, why):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert why in res.output and "Traceback" not in res.output


def test_cli_a_port_without_a_module_is_a_clear_error(tmp_path):
    res = CliRunner().invoke(main, ["set", str(tmp_path / "ttyNONE"), "mode", "auto",
                                    "--keys-dir", str(tmp_path / "keys"), "--direct"])  # fmt: skip
    assert res.exit_code == 3, res.output
    assert "modbridge set:" in res.output and "ttyNONE" in res.output and "no module" in res.output


# ------------------------------------------- safety: the commands against the firmware


class HarnessTarget(ctl.Target):
    """The real firmware App on the fake board (tests/safety_harness.py), signed; the
    harness checks the safety invariants on every tick while it runs."""

    via = "direct"
    port = "fake"

    def __init__(self, h: Harness):
        self.h = h
        self.tel = None

    def _pump(self, ms, pred):
        t = 0
        while t < ms:
            self.h.advance(STEP_MS)
            t += STEP_MS
            for m in self.h.hal.take():
                if m.ok and m.name == "telemetry":
                    self.tel = dict(m.fields)
                if m.ok and pred(m):
                    return m
        return None

    def request(self, name, fields=None, timeout=None, then_telemetry=False):
        self.h.hal.take()
        boots = self.h.resets
        seq = self.h.send_signed(name, fields or {})
        m = self._pump(400, lambda m: m.name in ("ack", "nack", "config")
                       and m.fields.get("ref") == seq)  # fmt: skip
        if m is None:
            if self.h.resets != boots:
                return ctl.Reply("ack", {})
            raise ctl.ControlError(f"no answer to {name}")
        reply = ctl.Reply(m.name, dict(m.fields))
        if then_telemetry and m.name == "ack":
            self.tel = None
            self._pump(2500, lambda m: self.tel is not None)
            reply.telemetry = self.tel
        return reply

    def telemetry(self):
        return self.tel


_CONFIG_TEXTS = st.sampled_from((
    "fan1.min_duty=25%", "fan1.min_duty=10%", "safety.host_lost=35%", "safety.host_lost=50%",
    "safety.min_manual_duty=20%", "safety.sensor_fault=90%", "pid.kp=0", "pid.ki=0",
    "gpu.setpoint=110", "gpu.warn=100", "gpu.crit=100", "control.mode=manual",
    "control.manual_duty=30%", "control.host_timeout_ms=30000", "curve.points=20:0 150:0",
    "curve.hysteresis=20", "fan2.kick_duty=20%", "gpu.controlled=false",
))  # fmt: skip


class ControlMachine(RuleBasedStateMachine):
    """Random sequences of `modbridge set` / `config set` commands, typed as a person
    would (through the parsers), interleaved with heat, faults, host loss and time."""

    @initialize()
    def start(self):
        self.h = Harness()
        self.h.host(True)
        self.t = HarnessTarget(self.h)
        self.sent = 0

    def _run(self, op, *parse):
        try:
            args = [p() for p in parse]
        except ctl.InputError:
            return  # refused on the host: nothing sent
        try:
            op(self.t, *args)
        except ctl.InputError:
            return
        except ctl.ControlError as e:  # only: manual with no telemetry yet to keep
            assert "no telemetry" in str(e)
            return
        self.sent += 1

    @rule(which=st.sampled_from(("fan1", "fan2", "fans")),
          pct=st.decimals(0, 110, places=1, allow_nan=False, allow_infinity=False))  # fmt: skip
    def set_fan(self, which, pct):
        def duties():
            p = ctl.parse_percent(f"{pct}%")
            return {1: p, 2: p} if which == "fans" else {int(which[-1]): p}

        self._run(ctl.set_fans, duties)

    @rule(mode=st.sampled_from(ctl.FAN_MODES))
    def set_mode(self, mode):
        self._run(ctl.set_mode, lambda: mode)

    @rule(ch=st.sampled_from(C.CHANNELS), c=st.integers(0, 130))
    def set_setpoint(self, ch, c):
        self._run(lambda t, v: ctl.set_setpoint(t, ch, v), lambda: ctl.parse_degc(str(c)))

    @rule(points=st.lists(st.tuples(st.integers(0, 120), st.integers(0, 100)), min_size=2,
                          max_size=5), hyst=st.none() | st.integers(0, 20))  # fmt: skip
    def set_curve(self, points, hyst):
        text = " ".join(f"{a}:{b}" for a, b in points)
        self._run(lambda t, p: ctl.set_curve(t, p, hyst), lambda: ctl.parse_curve(text))

    @rule(kp=st.integers(0, 50), ki=st.integers(0, 5))
    def set_pid(self, kp, ki):
        self._run(ctl.set_pid, lambda: ctl.parse_gains([f"kp={kp}", f"ki={ki}"]))

    @rule(texts=st.lists(_CONFIG_TEXTS, min_size=1, max_size=3))
    def config_set(self, texts):
        self._run(ctl.config_set, lambda: [ctl.parse_assignment(x) and x for x in texts])

    @rule(ch=st.integers(0, 2), temp=st.integers(20, 110))
    def heat(self, ch, temp):
        self.h.set_temp(ch, temp)

    @rule(i=st.integers(0, 1), state=st.sampled_from(("ok", "stalled", "noisy")))
    def fan_fault(self, i, state):
        self.h.set_fan(i, state)

    @rule(on=st.booleans())
    def host(self, on):
        self.h.host(on)

    @rule(ms=st.sampled_from((200, 1000, 6000)))
    def wait(self, ms):
        self.h.advance(ms)

    @invariant()
    def floors_hold(self):
        if hasattr(self, "h"):  # the harness raises on a violation; counted here too
            assert self.h.violations == 0
            d = self.h.hal.pwm[0].duty_u16(), self.h.hal.pwm[1].duty_u16()
            assert min(d) >= floors.fan_model(None)[floors.FM_MIN_SPIN]


ControlMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_control_commands_never_cool_below_the_floors = ControlMachine.TestCase


# ------------------------------------------------- link errors, names in the config


class _ErrLink:
    def __init__(self, exc):
        self.exc = exc
        self.status = type("S", (), {"telemetry_at": 0.0, "telemetry": None})()

    def request(self, name, fields=None, timeout=None):
        raise self.exc


def test_link_errors_become_clear_control_errors():
    from modbridge.link.session import NotPaired, RequestTimeout

    msg = "/dev/x: cannot send fan_mode: module b9bd is not paired: run `modbridge pair /dev/x`"
    with pytest.raises(ctl.ControlError, match="not paired: run `modbridge pair /dev/x`") as e:
        ctl.link_request(_ErrLink(NotPaired(msg)), "fan_mode", {"mode": 0}, None)
    assert e.value.exit_code == 1
    with pytest.raises(ctl.ControlError, match="no answer"):
        ctl.link_request(_ErrLink(RequestTimeout("/dev/x: no answer to reboot within 1 s")),
                         "reboot", None, None)  # fmt: skip


def test_module_names_in_the_config(tmp_path):
    from modbridge import config as cfgmod

    cfg = cfgmod.parse({"module": [{"id": "b9bd00", "name": "gpu0"},
                                   {"port": "/dev/m1", "name": "rack.2-b"}]})  # fmt: skip
    assert ctl.resolve_name("gpu0", cfg) == ("b9bd00", None)
    assert ctl.resolve_name("rack.2-b", cfg) == (None, "/dev/m1")
    assert ctl.resolve_name("gpu9", cfg) == (None, None)
    with pytest.raises(cfgmod.ConfigFileError) as e:
        cfgmod.parse({"module": [{"id": "aa", "name": "gpu0"}, {"id": "bb", "name": "gpu0"},
                                 {"id": "cc", "name": "9lives"}],
                      "bridge": {"control_socket": "", "control_group": 5}})  # fmt: skip
    text = str(e.value)
    assert "module[1].name: gpu0 is already used by module[0]" in text
    assert "module[2].name: letters, digits" in text
    assert "bridge.control_socket: must be non-empty text" in text
    assert "bridge.control_group: must be non-empty text" in text
    ok = cfgmod.parse({"bridge": {"control_socket": "/run/x.sock", "control_group": "mb"}})
    assert (ok.control_socket, ok.control_group) == ("/run/x.sock", "mb")
