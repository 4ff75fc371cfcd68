"""``modbridge console`` (modbridge.ops.console, modbridge.cli.console): typed lines
checked against the catalog, sent signed, answered; what the module sends shown in
display units; heartbeats that keep the module HOSTED; the firmware's own JSON
console after Ctrl-C; piped stdin through click's CliRunner.

One virtual module serves the module-scoped tests (a MicroPython process each: the
CLI test starts a second one).
"""

from __future__ import annotations

import json
import queue
import time

import pytest
from click.testing import CliRunner

from modbridge.cli.main import main as cli
from modbridge.link.session import CommandRefused, NotPaired, RequestTimeout
from modbridge.model import ModuleStatus
from modbridge.ops import console as K
from protocol import catalog as C
from protocol.message import Message

SPEED = 2.0  # world time 2x: the module's 5 s host timeout is 2.5 s of wall time


# ------------------------------------------------------------------ without a module


class FakeLink:
    """What Console needs of a link; ``answers`` maps a request name to a Message or
    an exception, and everything answered also lands in ``inbox`` (as the link's
    thread would put it there)."""

    def __init__(self, answers=None):
        self.port = "/dev/fake0"
        self.inbox = queue.Queue()
        self.status = ModuleStatus(port=self.port)
        self.answers = answers or {}
        self.sent = []
        self.heartbeats_sent = 0
        self.heartbeat_period_s = 1.0
        self.signing_supported = True
        self.key_error = None

    def request(self, name, fields=None, timeout=None):
        self.sent.append((name, fields))
        a = self.answers.get(name)
        if isinstance(a, Exception):
            if isinstance(a, CommandRefused):
                self.inbox.put(a.nack)
            raise a
        if a is None:
            a = Message(C.T_ACK, "ack", 9, {"ref": len(self.sent), "ref_type": 0})
        self.inbox.put(a)
        return a


def _nack(code, field=None, text=None):
    f = {"ref": 1, "ref_type": C.T_FAN_MODE, "code": code}
    if field:
        f["field"] = field
    if text:
        f["text"] = text
    return Message(C.T_NACK, "nack", 3, f)


def test_lines_are_parsed_in_display_units_both_ways():
    assert K.parse_line('{"type":"fan_mode","mode":"manual","duty1":40}') == (
        "fan_mode",
        {"mode": C.FAN_MODES.index("manual"), "duty1": 26214},
        0,
    )
    assert K.parse_line("fan_mode mode=manual duty1=40") == K.parse_line(
        '{"type":"fan_mode","mode":"manual","duty1":40}'
    )
    assert K.parse_line("setpoints sp_gpu=70.5")[1] == {"sp_gpu": 70500}
    # list elements are wire values in JSON lines too (SPEC.md section 13 notes)
    assert K.parse_line("fan_curve points=[[40000,19661],[80000,65535]]")[1]["points"] == [
        [40000, 19661],
        [80000, 65535],
    ]
    assert K.parse_line("config_get section=pid")[1] == {"section": "pid"}


@pytest.mark.parametrize(
    "line, says",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "unknown message or command '[1,'"),
        ('{"type":"bogus"}', "unknown message type 'bogus'"),
        ("bogus duty1=3", "unknown message or command 'bogus'"),
        ('{"type":"fan_mode"}', "mode is required"),
        (
            '{"type":"fan_mode","mode":"manual","duty1":140}',
            "duty1=140 is out of range: duty1 0..100 %",
        ),
        ('{"type":"setpoints","sp_gpu":5}', "sp_gpu=5 is out of range: sp_gpu 20..110 degC"),
        ('{"type":"fan_mode","mode":"sideways"}', "mode: unknown name 'sideways'"),
        ('{"type":"fan_mode","mode":"auto","duty1":"x"}', "duty1"),
        ("fan_mode duty1", "give fields as key=value"),
        ('{"type":"telemetry","state":1}', "is sent by the module, not to it"),
    ],
)
def test_garbage_lines_get_a_clear_message_and_nothing_is_sent(line, says):
    link = FakeLink()
    res = K.Console(link).handle(line)
    assert [s.kind for s in res.shown] == ["error"], res
    assert says in res.shown[0].text, res.shown[0].text
    assert link.sent == [] and res.sent is None


def test_heartbeats_and_pairing_are_not_typed():
    link = FakeLink()
    res = K.Console(link).handle('{"type":"heartbeat","gpu_temp":60}')
    assert "sends signed heartbeats itself" in str(res.shown[0]) and link.sent == []
    res = K.Console(link).handle("pair key=" + "00" * 32)
    assert "use `modbridge pair <port>`" in str(res.shown[0]) and link.sent == []
    assert "pair" not in K.command_names() and "heartbeat" not in K.command_names()


def test_blank_lines_comments_and_console_words():
    link = FakeLink()
    con = K.Console(link)
    assert con.handle("   ").shown == [] and con.handle("# a note").shown == []
    assert con.handle("quit").quit and con.handle("exit").quit
    text = "\n".join(str(s) for s in con.handle("help").shown)
    for name in K.command_names():
        assert f"  {name}" in text, name
    assert "heartbeat:" not in text  # the console sends them
    assert "fan_mode [signed]: mode auto|manual|curve, duty1 0..100 % (optional)" in text
    assert "config_get: section text (optional)" in text  # an open read: not signed
    one = [str(s) for s in con.handle("help telemetry").shown]
    assert one[0].startswith("telemetry (0x10, the module sends it)")
    assert any(s.strip().startswith("temp_gpu") and "degC" in s for s in one)
    assert con.handle("help nope").shown[0].kind == "error"
    assert link.sent == []


def test_a_refusal_is_shown_as_the_nack_and_in_words():
    nack = _nack(C.ERR_OUT_OF_RANGE, "duty1", "below the floor")
    link = FakeLink({"fan_mode": CommandRefused("/dev/fake0", "fan_mode", nack)})
    con = K.Console(link)
    res = con.handle("fan_mode mode=manual duty1=10")
    assert [s.kind for s in res.shown] == ["module", "refused"]
    assert json.loads(res.shown[0].text)["code"] == "out_of_range"
    assert res.shown[1].text == "refused: out_of_range (duty1): below the floor"
    assert con.refused == 1 and con.sent == 1


def test_a_missing_key_says_so_and_a_timeout_too():
    why = "/dev/fake0: cannot send fan_mode: module 3a00 is not paired: run `modbridge pair`"
    link = FakeLink({"fan_mode": NotPaired(why), "config_get": RequestTimeout("no answer")})
    con = K.Console(link)
    res = con.handle("fan_mode mode=auto")
    assert [s.kind for s in res.shown] == ["error"]
    assert "not paired" in str(res.shown[0]) and "modbridge pair" in str(res.shown[0])
    assert con.handle("config_get").shown[-1].text == "no answer"


def test_repl_ends_the_session_and_says_where_the_port_went():
    link = FakeLink()
    res = K.Console(link).handle('{"type":"repl"}')
    assert res.quit and res.sent == "repl"
    assert "mpremote connect /dev/fake0" in res.shown[-1].text


def test_telemetry_compact_throttled_json_or_off():
    t = [0.0]
    link = FakeLink()
    con = K.Console(link, telemetry_every_s=10.0, clock=lambda: t[0])
    tel = {"uptime_s": 5, "state": 1, "reason": 2, "faults": 0, "temp_gpu": 72300,
           "temp_amb": 24500, "fan1_rpm": 2850, "fan1_duty": 30000, "v_in": 11920,
           "p_in": 98340}  # fmt: skip
    link.inbox.put(Message(C.T_TELEMETRY, "telemetry", 1, tel))
    shown = con.pending()
    assert [s.text for s in shown] == [
        "telemetry HOSTED | gpu 72.3C amb 24.5C | fan1 2850 rpm 45.8% | 11.92V 98.3W"
    ]
    t[0] = 5.0  # within the throttle: hidden
    link.inbox.put(Message(C.T_TELEMETRY, "telemetry", 2, tel))
    assert con.pending() == []
    t[0] = 6.0  # a state change shows at once, with its faults in words
    bad = dict(tel, state=3, reason=7, faults=C.FAULT_FAN1_STALL)
    link.inbox.put(Message(C.T_TELEMETRY, "telemetry", 3, bad))
    line = con.pending()[0].text
    assert line.startswith("telemetry FAILSAFE (fan_stall) |") and line.endswith(
        "| faults fan1_stall"
    ), line
    # `telemetry` shows the latest in full, as a JSON line in display units
    full = json.loads(con.handle("telemetry").shown[-1].text)
    assert full["state"] == "FAILSAFE" and full["temp_gpu"] == 72.3
    off = K.Console(link, telemetry="off")
    link.inbox.put(Message(C.T_TELEMETRY, "telemetry", 4, tel))
    assert off.pending() == [] and off.last_telemetry == tel
    js = K.Console(link, telemetry="json")
    link.inbox.put(Message(C.T_TELEMETRY, "telemetry", 5, tel))
    assert json.loads(js.pending()[0].text)["fan1_duty"] == 45.777
    with pytest.raises(ValueError, match="compact, json or off"):
        K.Console(link, telemetry="loud")


def test_completion_of_message_names_fields_and_words():
    con = K.Console(FakeLink())
    assert con.complete("conf") == ["config_get", "config_set", "config_save", "config_reset"]
    assert con.complete("he") == ["hello_request", "help"]
    assert con.complete('{"type":"sel') == ['{"type":"selftest"']
    assert con.complete("du", "fan_mode mode=manual du") == ["duty1=", "duty2="]
    assert con.complete("x", "bogus x") == []


def test_history_path_follows_xdg_state_home():
    assert str(K.history_path({"XDG_STATE_HOME": "/s"})) == "/s/modbridge/console_history"
    p = K.history_path({"HOME": "/home/u"})
    assert str(p) == "/home/u/.local/state/modbridge/console_history"


def test_cli_usage_errors_exit_2():
    r = CliRunner().invoke(cli, ["console"])
    assert r.exit_code == 2 and "give the module" in r.output
    r = CliRunner().invoke(cli, ["console", "--sim", "--sim-speed", "0"])
    assert r.exit_code == 2


def test_cli_no_module_on_a_missing_port_exits_nonzero_with_a_message(tmp_path):
    r = CliRunner().invoke(cli, ["console", str(tmp_path / "ttyNONE"), "--keys-dir",
                                 str(tmp_path / "keys")])  # fmt: skip
    assert r.exit_code == 3, r.output
    assert r.output.startswith("modbridge console: ") and "ttyNONE: no such port" in r.output


# ------------------------------------------------------------------ a virtual module


@pytest.fixture(scope="module")
def session():
    sim = K.SimModule(speed=SPEED)
    link = None
    try:
        link = K.open_link(
            sim.port,
            sim.keys,
            heartbeat_source=sim.heartbeat,
            heartbeat_period_s=sim.heartbeat_period_s,
            up_timeout_s=20.0,
        )
        yield sim, link, K.Console(link, telemetry="off")
    finally:
        if link is not None:
            link.stop()
        sim.close()


def _wait(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def _module_lines(shown, name):
    return [
        json.loads(s.text)
        for s in shown
        if s.kind == "module" and json.loads(s.text)["type"] == name
    ]


def test_config_get_is_answered_with_the_config(session):
    _sim, _link, con = session
    res = con.handle('{"type":"config_get"}')
    configs = _module_lines(res.shown, "config")
    assert configs, res.shown
    values = {}
    for c in configs:
        values.update(c["values"])
    assert values["control.host_timeout_ms"] == 5000 and "pid.kp" in values
    res = con.handle("config_get section=pid")
    (cfg,) = _module_lines(res.shown, "config")
    assert set(cfg["values"]) and all(k.startswith("pid.") for k in cfg["values"])


def test_heartbeats_keep_the_module_hosted(session):
    _sim, link, _con = session
    assert _wait(lambda: (link.status.telemetry or {}).get("state") == C.STATE_HOSTED)
    sent = link.heartbeats_sent
    seen = set()
    first = link.status.telemetry_seq
    # 3.5 s of wall time is 7 s of the module's: longer than its host timeout
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        seen.add((link.status.telemetry or {}).get("state"))
        time.sleep(0.05)
    assert link.status.telemetry_seq != first  # telemetry kept coming
    assert seen == {C.STATE_HOSTED}, seen
    assert link.heartbeats_sent > sent and link.signing_supported and link.key_error is None
    assert link.status.events_total["host_timeout"] == 0


def test_a_signed_command_is_signed_and_acked(session):
    _sim, link, con = session
    assert link.signing_supported  # the module refuses unsigned fan_mode
    res = con.handle("fan_mode mode=manual duty1=60 duty2=60")
    (ack,) = _module_lines(res.shown, "ack")
    assert ack["ref_type"] == C.T_FAN_MODE and res.sent == "fan_mode"
    assert _wait(lambda: (link.status.telemetry or {}).get("state") == C.STATE_MANUAL)
    res = con.handle('{"type":"fan_mode","mode":"auto"}')
    assert _module_lines(res.shown, "ack")
    assert _wait(lambda: (link.status.telemetry or {}).get("state") == C.STATE_HOSTED)
    # the module refuses what breaks its rules, and the console says it in words
    res = con.handle('{"type":"fan_curve","points":[[60000,30000],[40000,20000]]}')
    assert res.shown[-1].kind == "refused" and res.shown[-1].text.startswith("refused: ")
    assert _module_lines(res.shown, "nack")


def test_a_command_without_a_key_says_to_pair_and_reads_stay_open(session):
    sim, link, con = session
    path = sim.keys.find(link.status.module_id)
    away = path.with_name(path.name + ".away")
    path.rename(away)
    try:
        link.refresh_hello()  # the link reloads the key at every hello
        assert link.key_error is not None
        con.pending()
        res = con.handle("fan_mode mode=auto")
        assert [s.kind for s in res.shown] == ["error"], res.shown  # not sent: no ack, no nack
        # the module is paired, this host lacks the key file: said as such, with the fix
        text = res.shown[0].text
        assert "is paired, but there is no key for it in" in text and "modbridge pair" in text
        assert _module_lines(con.handle("config_get section=pid").shown, "config")
        assert "no key" in "\n".join(str(s) for s in con.handle("status").shown)
    finally:
        away.rename(path)
        link.refresh_hello()
    assert link.key_error is None
    assert _module_lines(con.handle("fan_mode mode=auto").shown, "ack")


def test_firmware_json_console_after_ctrl_c_twice(session):
    """What a person at picocom does: Ctrl-C twice, a pause, a JSON line. The bytes
    go through the link's port as typed (no 0x00 flush); the module answers the line
    in JSON (and the next binary command switches it back)."""
    _sim, link, con = session
    con.pending()
    link._write(b"\x03")
    time.sleep(0.1)
    link._write(b"\x03")
    time.sleep(0.3)  # 0.6 s of the module's time: longer than GAP_MS
    link._write(b'{"type":"config_get","section":"pid"}\n')
    got = []
    assert _wait(lambda: got.extend(i for i in _drain(link) if i.ok and i.name == "config") or got)
    assert got[0].fmt == "json" and any(k.startswith("pid.") for k in got[0].fields["values"])
    # and binary again: a command from the console is answered as before
    res = con.handle("config_get section=pid")
    assert _module_lines(res.shown, "config")


def _drain(link):
    out = []
    while True:
        try:
            out.append(link.inbox.get_nowait())
        except queue.Empty:
            return out


def test_status_names_the_module_and_the_heartbeats(session):
    _sim, link, con = session
    text = "\n".join(str(s) for s in con.handle("status").shown)
    assert link.status.module_id in text and "signing on" in text and "heartbeats sent" in text


def test_cli_on_a_port_the_link_holds_says_busy_and_exits_1(session, tmp_path):
    sim, _link, _con = session
    r = CliRunner().invoke(cli, ["console", sim.port, "--keys-dir", str(tmp_path)], input="")
    assert r.exit_code == 1, r.output
    assert r.output.startswith("modbridge console: ") and sim.port in r.output


# ------------------------------------------------------------------ the CLI, piped


def test_cli_piped_stdin_lines_in_replies_out(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    lines = "\n".join([
        '{"type":"config_get","section":"pid"}',
        "{garbage",
        "fan_mode mode=manual duty1=50",
        '{"type":"fan_mode","mode":"auto"}',
        "help fan_mode",
        "quit",
        '{"type":"config_get"}',  # after quit: never sent
    ]) + "\n"  # fmt: skip
    r = CliRunner().invoke(cli, ["console", "--sim", "--sim-speed", str(SPEED),
                                 "--quiet-telemetry"], input=lines)  # fmt: skip
    assert r.exit_code == 0, r.output
    out = r.output.splitlines()
    js = [json.loads(x) for x in out if x.startswith("{")]
    configs = [j for j in js if j["type"] == "config"]
    assert len(configs) == 1 and all(k.startswith("pid.") for k in configs[0]["values"])
    assert [j["ref_type"] for j in js if j["type"] == "ack"] == [C.T_FAN_MODE, C.T_FAN_MODE]
    assert any(x.startswith("error: not valid JSON") for x in out), out
    assert any(x.startswith("fan_mode (0x30, you send it, signed)") for x in out)
    assert not any(x.startswith("telemetry") for x in out)
    assert not (tmp_path / "modbridge" / "console_history").exists()  # a pipe keeps none
