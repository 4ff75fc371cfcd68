"""Reproductions of every attack of the firmware-safety issue, on the real App.

Each test failed on b2cd58d and passes now; the invariant it proves is named in its
docstring (docs/safety.md). DUAL: runs on CPython and under MicroPython.
"""

from fakehal import run
from mpcompat import heap_locked
from safety_harness import KEY, Harness, _deep_line

from device import config
from device import floors as F
from device.app import MODE_AUTO, MODE_MANUAL, App
from protocol import catalog as C
from protocol import frame, sign

DUAL = True
MPY_TIMEOUT = 900


def answers(h, name):
    return [m for m in h.hal.take() if m.ok and m.name == name]


def run_collect(h, ms):
    out = []
    t = 0
    while t < ms:
        h.advance(100)
        out.extend(h.hal.take())
        t += 100
    return out


def nacks(items, code=None):
    return [
        m for m in items if m.ok and m.name == "nack" and (code is None or m.fields["code"] == code)
    ]


def events(items, code):
    return [m for m in items if m.ok and m.name == "event" and m.fields["code"] == code]


def duties(h):
    return (h.hal.pwm[0].duty_u16(), h.hal.pwm[1].duty_u16())


# -- S8: no input reaches the loop's exception path ---------------------------------


def test_deep_nesting_is_refused_malformed_and_the_loop_lives():
    """S8: 100 nested brackets in config_set, fan_curve and cal_write."""
    h = Harness()
    h.advance(1000)
    h.hal.take()
    lines = (
        _deep_line(100),
        b'{"type":"fan_curve","points":' + b"[" * 100 + b"1" + b"]" * 100 + b"}\n",
        b'{"type":"cal_write","channel":0,"model":"poly","coeffs":'
        + b"[" * 100
        + b"1"
        + b"]" * 100
        + b"}\n",
    )
    for line in lines:
        h.send_raw(line)
        items = run_collect(h, 300)
        assert nacks(items, C.ERR_MALFORMED), items
    assert h.app.failures == 0 and h.app.internal_errors == 0
    assert h.command("hello_request", {}) is None  # answered with hello, not ack
    assert h.app.running


def test_duplicate_keys_refused_no_factory_reset():
    """S8: {"type":"hello_request","type":"config_reset"} no longer factory-resets."""
    h = Harness()
    assert h.command("config_set", {"values": {"pid.kp": 6000}}) == "ack"
    h.send_raw(b'{"type":"hello_request","type":"config_reset"}\n')
    items = run_collect(h, 300)
    assert nacks(items, C.ERR_MALFORMED), items
    assert h.app.cfg["pid"]["kp"] == 6000


def test_undecodable_gets_nack_malformed_and_nacks_are_rate_limited():
    """S8 and SPEC section 11: malformed is answered, a flood of refusals is not."""
    h = Harness()
    h.advance(1000)
    h.hal.take()
    for _ in range(100):
        h.send_raw(b'{"type":"fan_mode","mode":"manual","duty1":}\n')
    items = run_collect(h, 3000)  # 4.7 KB at 128 bytes a step: all read by now
    assert h.hal.rx_pending() == 0
    got = len(nacks(items, C.ERR_MALFORMED))
    assert 8 <= got <= 8 + 31, got  # the burst, then ten a second
    assert h.app.nacks_suppressed == 100 - got, (h.app.nacks_suppressed, got)


def test_command_handler_bug_is_nack_internal_not_a_reset():
    """S8: the last-resort handler answers nack internal and keeps cooling."""
    h = Harness()
    h.advance(1000)

    handle = h.app.handle

    def broken(msg):
        if msg.name == "setpoints":  # a bug in a command's handler
            raise RuntimeError("maximum recursion depth exceeded")
        handle(msg)

    h.app.handle = broken
    h.allow_internal = True
    h.hal.take()
    seq = h.send_signed("setpoints", {"sp_gpu": 70000})
    items = run_collect(h, 300)
    got = [m for m in nacks(items, C.ERR_INTERNAL) if m.fields["ref"] == seq]
    assert got, items
    assert h.app.internal_errors == 1 and h.app.failures == 0
    assert events(items, C.REASON_INTERNAL_ERROR)


# -- S6, S7: config transactions and a boot that always speaks -------------------------


def test_refused_change_leaves_no_trace_and_later_changes_work():
    """S6: channels.N.correction [1000000] is refused and not kept."""
    h = Harness()
    before = config.canonical(h.app.cfg)
    assert h.command("config_set", {"values": {"channels.1.correction": [1000000]}}) == "nack"
    assert config.canonical(h.app.cfg) == before
    assert h.command("config_set", {"values": {"pid.kp": 6000}}) == "ack"
    assert h.command("config_save", {}) == "ack"
    h.reboot()
    assert h.app.cfg["pid"]["kp"] == 6000 and h.app.config_source == "current"


def test_filter_none_configures():
    """S6: the schema's "none" filter is what the driver does (validated == configurable)."""
    h = Harness()
    assert h.command("config_set", {"values": {"channels.0.filter": "none"}}) == "ack"
    assert h.command("config_save", {}) == "ack"
    h.reboot()
    assert h.app.cfg["channels"][0]["filter"] == "none"


class _PickyApp(App):
    """An App whose build refuses a config with pid.kp == 6001 (a config that
    validates but does not configure, as a driver bug or a newer schema would)."""

    def _build(self, cfg):
        if cfg["pid"]["kp"] == 6001:
            raise ValueError("driver refuses it")
        return App._build(self, cfg)


def test_boot_falls_back_to_last_good_then_factory():
    """S7: a saved config that does not configure boots the previous one, with an event."""
    h = Harness()
    assert h.command("config_set", {"values": {"pid.kp": 6000}}) == "ack"
    assert h.command("config_save", {}) == "ack"
    bad = config.defaults()
    bad["pid"]["kp"] = 6001
    config.save(bad, h.hal.fs_dir)  # the saved config now does not configure
    app = _PickyApp(h.hal)
    app.boot()
    run(app, h.hal, 200)  # events go out with the first tick
    items = h.hal.take()
    assert app.cfg["pid"]["kp"] == 6000 and app.config_source == "prev", app.config_source
    assert [m for m in items if m.ok and m.name == "hello"]
    ev = events(items, C.REASON_CONFIG_FALLBACK)
    assert ev and ev[0].fields["value"] == 1, items


def test_boot_speaks_whatever_is_in_flash():
    """S7: garbage in both config files still boots, on factory defaults."""
    h = Harness()
    for name in ("config.json", "config.prev.json"):
        with open(h.hal.fs_dir + "/" + name, "wb") as f:
            f.write(b'{"config":' + b"[" * 500)
    h.reboot()  # raises if no hello
    assert h.app.config_source == "factory"


# -- S1: floors are code ----------------------------------------------------------------


def test_floors_cannot_be_configured_to_zero():
    """S1: every floor key of the attack is refused; manual 0 % is refused."""
    h = Harness()
    for change in (
        {"fans.0.min_duty": 0},
        {"fans.1.kick_duty": 0},
        {"safety.min_manual_duty": 0},
        {"safety.host_lost": 0},
        {"safety.sensor_fault": 0},
    ):
        assert h.command("config_set", {"values": change}) == "nack", change
    h.host(True)
    h.advance(2000)
    assert h.command("fan_mode", {"mode": 1, "duty1": 0, "duty2": 0}) == "nack"
    assert h.command("fan_mode", {"mode": 1, "duty1": 19661, "duty2": 19661}) == "ack"
    h.advance(30000)
    d = duties(h)
    assert d[0] >= F.FLOOR_MANUAL and d[1] >= F.FLOOR_MANUAL, d


def test_useless_control_law_still_cools_a_hot_card():
    """S1 (hot floor): setpoints at their ceiling and all gains 0 at 95 degC."""
    h = Harness()
    h.host(True)
    assert h.command("pid_gains", {"kp": 0, "ki": 0, "kd": 0, "kff": 0}) == "ack"
    assert h.command("setpoints", {"sp_gpu": 110000}) in ("ack", "nack")
    h.set_temp(0, 93)
    h.advance(5000)
    assert min(duties(h)) >= 50000, duties(h)
    h.set_temp(0, 97)
    h.advance(2000)
    assert duties(h) == (65535, 65535), duties(h)


def test_blinding_correction_is_refused_and_could_not_blind():
    """S2: correction [-40] is refused; over-temperature sees the nominal reading."""
    h = Harness()
    assert h.command("config_set", {"values": {"channels.0.correction": [-40]}}) == "nack"
    assert h.command("cal_write", {"channel": 0, "model": 2, "coeffs": [-40]}) == "nack"
    h.set_temp(0, 86)
    h.advance(3000)
    assert h.app.sup.faults & C.FAULT_OVER_TEMP


# -- S3: monotone under faults ------------------------------------------------------------


def _hot_pid(h):
    """PID at 100 % in a hosted module (weak airflow: the card stays hot)."""
    h.host(True)
    h.set_temp(0, 84)
    h.advance(20000)
    assert duties(h) == (65535, 65535), duties(h)


def test_host_loss_never_lowers_a_pid_at_full():
    """S3: on host loss the fallback curve (66 %) no longer replaces a PID at 100 %."""
    h = Harness()
    _hot_pid(h)
    h.host(False)
    for _ in range(30):
        h.advance(1000)
        assert duties(h) == (65535, 65535), duties(h)
    assert h.app.sup.state == C.STATE_STANDALONE


def test_open_ntc_never_lowers_a_pid_at_full():
    """S3: an open NTC's 80 % floor no longer replaces a PID at 100 %."""
    h = Harness()
    _hot_pid(h)
    h.set_code(1, 65535)
    for _ in range(20):
        h.advance(1000)
        assert duties(h) == (65535, 65535), duties(h)
    assert h.app.sup.state == C.STATE_FAILSAFE


# -- S5: MANUAL is a lease ----------------------------------------------------------------


def test_manual_lease_ends_after_its_time_with_heartbeats_flowing():
    """S5: MANUAL ends after MANUAL_LEASE_MS, back to automatic, with an event."""
    h = Harness()
    h.host(True)
    h.advance(2000)
    assert h.command("fan_mode", {"mode": 1, "duty1": 40000}) == "ack"
    h.advance(5000)
    assert h.app.mode == MODE_MANUAL and h.app.sup.state == C.STATE_MANUAL
    seen = []
    t = 0
    while t < F.MANUAL_LEASE_MS + 5000:
        h.advance(5000)
        seen.extend(events(h.hal.take(), C.REASON_MANUAL_EXPIRED))
        t += 5000
    assert h.app.mode == MODE_AUTO and h.app.sup.state == C.STATE_HOSTED
    assert len(seen) == 1 and seen[0].fields["value"] == 0, seen


def test_manual_ends_on_host_loss_and_on_a_fault():
    """S5: host loss and a safety cause end MANUAL at once."""
    h = Harness()
    h.host(True)
    h.advance(2000)
    assert h.command("fan_mode", {"mode": 1, "duty1": 40000}) == "ack"
    h.host(False)
    h.advance(7000)
    assert h.app.mode == MODE_AUTO
    h.host(True)
    h.advance(2000)
    assert h.command("fan_mode", {"mode": 1, "duty1": 40000}) == "ack"
    h.set_fan(0, "stalled")
    h.advance(6000)
    assert h.app.mode == MODE_AUTO
    ev = events(h.hal.take(), C.REASON_MANUAL_EXPIRED)
    assert ev and ev[-1].fields["value"] == 2, ev


# -- S11: plausibility ------------------------------------------------------------------


def test_stopped_rotor_with_tach_noise_is_implausible():
    """S11: 10 noise edges a second (300 RPM) at full duty is not a running fan."""
    h = Harness()
    h.host(True)
    h.set_temp(0, 84)  # the PID drives full duty
    h.advance(10000)
    h.set_fan(1, "noisy")
    items = run_collect(h, 20000)
    assert h.app.sup.faults & C.FAULT_FAN2_TACH, h.app.sup.faults
    assert events(items, C.REASON_TACH_IMPLAUSIBLE)
    assert duties(h) == (65535, 65535)


# -- S9: only the key holder steers ---------------------------------------------------------


def test_unsigned_forged_and_replayed_commands_are_refused():
    """S9: reboot, config_reset, repl, fan_mode unsigned or forged: nack unauthorized."""
    h = Harness()
    h.advance(1000)
    for name, fields in (
        ("reboot", {}),
        ("config_reset", {}),
        ("repl", {}),
        ("fan_mode", {"mode": 1, "duty1": 19661}),
        ("config_set", {"values": {"pid.kp": 6000}}),
    ):
        for how in ("unsigned", "forged"):
            h.hal.take()
            assert h.command(name, fields, how) == "nack", (name, how)
    assert h.hal.resets == 0 and h.app.running and h.app.mode == MODE_AUTO
    assert h.app.auth_failures >= 10
    assert h.command("config_set", {"values": {"pid.kp": 6000}}) == "ack"
    h.send_replay(-1)
    items = run_collect(h, 300)
    assert nacks(items, C.ERR_UNAUTHORIZED), items
    # reads stay open
    assert h.command("config_get", {"section": "pid"}, "unsigned") is None
    assert h.command("hello_request", {}, "unsigned") is None


def test_forged_heartbeat_does_not_steer():
    """S9: an unsigned heartbeat's GPU power does not reach control, nor host presence."""
    h = Harness()
    h.advance(1000)
    h.hal.send(frame.encode_frame("heartbeat", {"gpu_power": 4000000, "gpu_temp": 20000}, 9))
    h.advance(500)
    assert h.app.gpu_power_mw == 0 and not h.app.hb_seen


def test_a_previous_boot_s_frames_do_not_verify():
    """S9: a new nonce every boot: frames recorded before a reboot are refused."""
    h = Harness()
    assert h.command("config_set", {"values": {"pid.kp": 6000}}) == "ack"
    old = h.replay[-1]
    h.reboot()
    h.hal.take()
    h.send_raw(old)
    items = run_collect(h, 300)
    assert nacks(items, C.ERR_UNAUTHORIZED), items


def test_pairing_window_and_signed_repairing():
    """S9: unsigned pair only on an unpaired module within 60 s of power-on."""
    h = Harness()
    new = bytes(range(32))
    assert h.command("pair", {"key": new}, "unsigned") == "nack"  # already paired
    assert h.command("pair", {"key": new}) == "ack"  # signed with the old key
    h.key = new
    h.signer = sign.Signer(new, 1, h._clock)
    h.signer.nonce = h.app.nonce
    assert h.command("pid_gains", {"kp": 6000}) == "ack"
    # an unpaired module: pairing window
    import os

    os.remove(h.hal.fs_dir + "/secret.key")
    h.reboot()
    assert not h.app.paired
    assert h.command("pid_gains", {"kp": 6000}) == "nack"
    assert h.command("pair", {"key": KEY}, "unsigned") == "ack"
    assert h.app.paired


# -- S10: flash wear -----------------------------------------------------------------------


def test_unchanged_saves_write_nothing_and_saves_are_rate_limited():
    """S10: 1,000 saves of an unchanged config: 0 flash writes; changed saves limited."""
    h = Harness()
    assert h.command("config_set", {"values": {"pid.kp": 6000}}) == "ack"
    assert h.command("config_save", {}) == "ack"
    writes = h.app.flash_writes
    for _ in range(10):
        for _ in range(100):  # 100 at a time: the fake UART's receive ring is 16 KB
            h.send_signed("config_save", {})
        while h.hal.rx_pending():
            h.advance(1000)
    assert h.app.flash_writes == writes and config.flash_writes(h.hal.fs_dir) == writes
    got = []
    for kp in range(6001, 6011):
        h.command("config_set", {"values": {"pid.kp": kp}})
        got.append(h.command("config_save", {}))
    assert got.count("ack") <= 3 and got.count("nack") >= 7, got
    assert h.app.flash_writes <= writes + 3


# -- a hosted tick allocates nothing --------------------------------------------------------


def test_hosted_ticks_allocate_nothing():
    """Section 7 of the issue: heartbeats arriving at their real period, heap locked."""
    h = Harness()
    h.host(True)
    h.advance(3000)
    app = h.app
    hal = h.hal
    frames = []
    for _ in range(20):
        h.now += 1000
        frames.append(
            frame.encode_frame(
                "heartbeat",
                {"gpu_temp": 60000, "gpu_power": 300000, "power_limit": 700000},
                h._next_seq(),
                signer=h.signer,
            )
        )
    blob = bytearray()
    for f in frames:
        blob.extend(f)
    hal.take()
    hal.tx_len = 0

    def hosted():
        k = 0
        t = 0
        while t < 20000:
            if t % 1000 == 0:
                hal.send(frames[k])  # one heartbeat a second, as the UART delivers it
                k += 1
            app.step()
            hal.advance(50)
            t += 50
            hal.tx_len = 0

    heap_locked(hosted)
    assert app.hb_seen and app.sup.state == C.STATE_HOSTED
    assert app.gpu_power_mw == 300000
