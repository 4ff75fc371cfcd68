"""``modbridge doctor`` (modbridge.ops.doctor): each check alone over made-up facts
(pass, warn, fail), the fact gathering against fakes at the machine's boundary (a fake
NVML, a fake link, a real exporter on 127.0.0.1, state directories in tmp_path), the
exit-code rule, the JSON shape, and end to end against a virtual module (``--sim``)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from collections import Counter

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from modbridge.actuator.journal import LimitJournal
from modbridge.cli.main import main
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.link.session import CommandRefused, NotPaired
from modbridge.model import BridgeSnapshot, ModuleStatus
from modbridge.ops import doctor as D
from protocol import catalog as C

UID = "3a0041000c51333433383639"
GPU = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"


def tel(**kw) -> dict:
    """Healthy telemetry in wire units (m degC, mV, 1/65535)."""
    t = {
        "uptime_s": 3600, "state": C.STATE_HOSTED, "faults": 0, "temp_gpu": 61_000,
        "temp_vram": 58_500, "temp_mos": 49_000, "temp_amb": 26_000, "fan1_rpm": 1900,
        "fan2_rpm": 1880, "fan1_duty": 39_321, "fan2_duty": 39_321, "v_in": 12_020,
        "i_in": 6_660, "flash_writes": 12,
    }  # fmt: skip
    t.update(kw)
    return {k: v for k, v in t.items() if v is not None}


def view(**kw) -> D.ModuleView:
    fields = dict(port="/dev/ttyUSB0", module_id=UID, fw_version=D._bundled_fw_version(),
                  proto_version="1.0", board="blackpill_f411", telemetry=tel(), paired=True,
                  config_read=True, config_version=1)  # fmt: skip
    fields.update(kw)
    return D.ModuleView(**fields)


def bit(name: str) -> int:
    return 1 << C.FAULT_BITS.index(name)


def status_of(check: D.Check) -> str:
    assert isinstance(check, D.Check) and check.detail
    if check.status in (D.WARN, D.FAIL):
        assert check.hint, f"{check.name}: a {check.status} needs a next thing to try"
    return check.status


# ----------------------------------------------------------------------- the Check


def test_check_refuses_unknown_layers_and_statuses():
    with pytest.raises(ValueError, match="layer must be one of L1, L2, L3, L4"):
        D.Check("L5", "x", D.PASS, "d")
    with pytest.raises(ValueError, match="status must be one of pass, warn, fail, skip"):
        D.Check("L1", "x", "ok", "d")


def _c(status):
    return D.Check("L1", "x", status, "d", "h")


@given(st.lists(st.sampled_from(D.STATUSES), max_size=12))
def test_exit_code_is_the_worst_result(statuses):
    checks = [_c(s) for s in statuses]
    code = D.exit_code_for(checks)
    if D.FAIL in statuses:
        assert code == D.EXIT_FAIL
    elif D.WARN in statuses:
        assert code == D.EXIT_WARN
    else:
        assert code == D.EXIT_OK  # skips count as passes
    # adding passes or skips never changes it; adding a fail always makes it 1
    assert D.exit_code_for(checks + [_c(D.PASS), _c(D.SKIP)]) == code
    assert D.exit_code_for(checks + [_c(D.FAIL)]) == D.EXIT_FAIL
    assert D.exit_code_for(checks, found_anything=False) == D.EXIT_NOT_FOUND


def test_exit_codes_keep_the_bridges_meanings():
    assert (D.EXIT_OK, D.EXIT_FAIL, D.EXIT_USAGE, D.EXIT_NOT_FOUND, D.EXIT_WARN) == (0, 1, 2, 3, 4)


# ----------------------------------------------------------------------------- L1


def test_ntc_pass_and_values_in_degc():
    c = D.check_ntc(view())
    assert status_of(c) == D.PASS and "gpu 61.0" in c.detail
    assert c.data == {"gpu_c": 61.0, "vram_c": 58.5, "mos_c": 49.0, "amb_c": 26.0}


def test_ntc_faulted_channel_fails():
    v = view(telemetry=tel(temp_gpu=None, faults=bit("ntc_gpu")))
    c = D.check_ntc(v)
    assert status_of(c) == D.FAIL and "gpu faulted" in c.detail and "open" in c.hint
    c = D.check_ntc(view(telemetry=tel(temp_mos=None)))  # absent without a fault bit
    assert status_of(c) == D.FAIL and "mos absent" in c.detail


def test_ntc_out_of_range_fails_and_colder_than_ambient_warns():
    c = D.check_ntc(view(telemetry=tel(temp_vram=150_000)))
    assert status_of(c) == D.FAIL and "out of -20..125" in c.detail
    c = D.check_ntc(view(telemetry=tel(temp_mos=18_000)))  # 8 degC under the 26 degC air
    assert status_of(c) == D.WARN and "colder than ambient" in c.detail
    c = D.check_ntc(view(telemetry=tel(temp_amb=2_000, temp_mos=40_000)))
    assert status_of(c) == D.WARN and "not a room's air" in c.detail
    c = D.check_ntc(view(telemetry=tel(temp_mos=22_000)))  # within the 5 degC margin
    assert status_of(c) == D.PASS


def test_ntc_hot_but_agreeing_is_about_cooling():
    c = D.check_ntc(view(telemetry=tel(faults=bit("critical_temp"), temp_gpu=98_000)))
    assert status_of(c) == D.FAIL and "airflow" in c.hint
    c = D.check_ntc(view(telemetry=tel(faults=bit("over_temp"))))
    assert status_of(c) == D.WARN


def test_l1_checks_skip_without_telemetry():
    v = view(telemetry={}, error="no hello", module_id=None)
    for fn in (D.check_ntc, D.check_fans, D.check_input_voltage):
        c = fn(v)
        assert c.status == D.SKIP and "see module_answers" in c.detail


def test_fans_pass_stall_zero_rpm_slow_and_stopped():
    c = D.check_fans(view())
    assert status_of(c) == D.PASS and "fan 1 1900 RPM at 60 %" in c.detail
    c = D.check_fans(view(telemetry=tel(fan2_rpm=0, faults=bit("fan2_stall"))))
    assert status_of(c) == D.FAIL and "fan 2 stalled" in c.detail
    c = D.check_fans(view(telemetry=tel(fan1_rpm=0)))  # no stall bit yet, but 0 at 60 %
    assert status_of(c) == D.FAIL and "fan 1 reads 0 RPM at 60 %" in c.detail
    c = D.check_fans(view(telemetry=tel(fan1_rpm=150, fan1_duty=65535)))
    assert status_of(c) == D.WARN and "slow" in c.detail and "--active" in c.hint
    c = D.check_fans(view(telemetry=tel(fan1_rpm=0, fan1_duty=0)))  # stopped as commanded
    assert status_of(c) == D.PASS
    c = D.check_fans(view(telemetry=tel(faults=bit("fan1_tach"))))
    assert status_of(c) == D.WARN and "tach" in c.detail


def test_fans_judged_against_the_boards_model_and_the_twin():
    """A stalled rotor that still reports a trickle (the sim's fan_stall: 180 RPM at 20 %)
    beside a twin at 780 RPM: FAIL, whatever the floor of the model says."""
    twenty = dict(fan1_duty=13107, fan2_duty=13107)  # 20 %
    c = D.check_fans(view(board="sim", telemetry=tel(fan1_rpm=180, fan2_rpm=780, **twenty)))
    assert status_of(c) == D.FAIL and "fan 2 turns at 780 RPM" in c.detail, c.detail
    assert c.data["fan_model"] == "sim"
    # the board's model sets the floor: sim fans are judged from 20 % (pwm4 from 50 %)
    c = D.check_fans(view(board="sim", telemetry=tel(fan1_rpm=200, fan2_rpm=200, **twenty)))
    assert status_of(c) == D.WARN and "sim fan reads >= 300" in c.detail, c.detail
    assert D.board_fan_model("blackpill_f411")[0] == "pwm4"
    assert D.board_fan_model("../../etc/passwd")[0] == "pwm4"  # never a path
    assert D.board_fan_model(None)[0] == "pwm4"


# docs/doctor.md, fans: at the same duty (within 5 %), a fan below half its twin's RPM
# fails, below three quarters warns; a fan already failed on its own is not re-judged.
@given(st.integers(13107, 65535), st.integers(0, 3276), st.integers(1, 20000),
       st.integers(1, 20000))  # fmt: skip
def test_twin_rule(duty, delta, rpm1, rpm2):
    t = tel(fan1_duty=duty, fan2_duty=min(65535, duty + delta), fan1_rpm=rpm1, fan2_rpm=rpm2)
    c = D.check_fans(view(board="sim", telemetry=t))
    slow, fast = sorted((rpm1, rpm2))
    same_duty = abs(min(65535, duty + delta) - duty) * 100 / 65535 <= 5.0
    if same_duty and slow < 0.5 * fast:
        assert status_of(c) == D.FAIL, (t, c.detail)
    elif status_of(c) == D.FAIL:
        assert False, (t, c.detail)
    if same_duty and 0.5 * fast <= slow < 0.75 * fast:
        assert status_of(c) == D.WARN, (t, c.detail)


@given(st.floats(9.0, 15.0, allow_nan=False))
def test_input_voltage_status_grows_with_the_deviation(v):
    def rank(volts):
        c = D.check_input_voltage(view(telemetry=tel(v_in=int(round(volts * 1000)))))
        return D._RANK[status_of(c)]

    nearer = 12.0 + (v - 12.0) / 2  # half as far from 12 V: never a worse result
    assert rank(nearer) <= rank(v)


def test_input_voltage_pass_warn_fail():
    assert D.check_input_voltage(view()).status == D.PASS
    c = D.check_input_voltage(view(telemetry=tel(v_in=11_500)))
    assert status_of(c) == D.WARN and "-4.2%" in c.detail
    c = D.check_input_voltage(view(telemetry=tel(v_in=11_000)))
    assert status_of(c) == D.FAIL and "11.00 V" in c.detail and "PSU" in c.hint
    c = D.check_input_voltage(view(telemetry=tel(v_in=13_000)))
    assert status_of(c) == D.FAIL
    c = D.check_input_voltage(view(telemetry=tel(v_in=None, faults=bit("power_monitor"))))
    assert status_of(c) == D.FAIL and "INA226" in c.detail
    c = D.check_input_voltage(view(telemetry=tel(faults=bit("under_voltage"))))
    assert status_of(c) == D.FAIL  # the module's own under-voltage alarm
    # the stricter of ATX's -5 % and the policy's under_voltage_v is the fail line
    assert D.check_input_voltage(view(telemetry=tel(v_in=11_300)), 11.0).status == D.FAIL
    assert D.check_input_voltage(view(telemetry=tel(v_in=11_700))).status == D.PASS
    assert D.check_input_voltage(view(telemetry=tel(v_in=11_700)), 11.8).status == D.FAIL


# ---- --active: the fan step


def test_fans_active_judges_the_step():
    assert D.check_fans_active(view()).status == D.SKIP
    ok = {"before": {1: 1380, 2: 1380}, "before_duty": {1: 20.0, 2: 20.0},
          "after": {1: 3000, 2: 2950}, "commanded": True, "restored": True}  # fmt: skip
    c = D.check_fans_active(view(active=ok))
    assert status_of(c) == D.PASS and "1380 -> 3000" in c.detail
    c = D.check_fans_active(view(active=dict(ok, after={1: 0, 2: 2950})))
    assert status_of(c) == D.FAIL and "fan 1 0 RPM at 100 %" in c.detail
    c = D.check_fans_active(view(active=dict(ok, after={1: 1400, 2: 2950})))
    assert status_of(c) == D.FAIL and "did not speed up" in c.detail and "PWM" in c.hint
    c = D.check_fans_active(view(active=dict(ok, restored=False, restore_error="timeout")))
    assert status_of(c) == D.FAIL and "auto mode could not be restored" in c.detail
    c = D.check_fans_active(view(active={"error": "cannot send fan_mode: not paired",
                                         "commanded": False, "after": {}}))  # fmt: skip
    assert status_of(c) == D.WARN and "modbridge pair" in c.hint


class FakeStatus:
    def __init__(self, telemetry):
        self.telemetry = telemetry
        self.fans = 2


class FakeLink:
    """``request`` records each command; the fans answer a manual 100 % by ``rise``."""

    def __init__(self, rise=True, refuse=None, fail_restore=False):
        self.status = FakeStatus(tel(fan1_rpm=900, fan2_rpm=910, fan1_duty=13107,
                                     fan2_duty=13107))  # fmt: skip
        self.sent = []
        self.rise, self.refuse, self.fail_restore = rise, refuse, fail_restore

    def request(self, name, fields=None, timeout=None):
        self.sent.append((name, dict(fields or {})))
        if self.refuse is not None:
            raise self.refuse
        if fields.get("mode") == C.FAN_MODES.index("auto") and self.fail_restore:
            raise CommandRefused("/dev/x", "fan_mode", _nack())
        if fields.get("mode") == C.FAN_MODES.index("manual"):
            t = dict(self.status.telemetry, fan1_duty=65535, fan2_duty=65535)
            if self.rise:
                t.update(fan1_rpm=2900, fan2_rpm=2950)
            self.status.telemetry = t
        return object()


def _nack():
    from protocol.message import Message

    fields = {"ref": 1, "ref_type": 0x30, "code": C.ERR_OUT_OF_RANGE}
    return Message(0x15, "nack", 1, fields)


def _clock():
    t = [0.0]

    def clock():
        return t[0]

    def sleep(s):
        t[0] += s

    return clock, sleep


def test_fan_step_raises_to_full_and_always_restores_auto():
    link = FakeLink()
    clock, sleep = _clock()
    out = D.fan_step(link, clock=clock, sleep=sleep)
    manual, auto = C.FAN_MODES.index("manual"), C.FAN_MODES.index("auto")
    assert link.sent == [("fan_mode", {"mode": manual, "duty1": 65535, "duty2": 65535}),
                         ("fan_mode", {"mode": auto})]  # fmt: skip
    assert out["after"] == {1: 2900, 2: 2950} and out["before"] == {1: 900, 2: 910}
    assert out["restored"] and D.check_fans_active(view(active=out)).status == D.PASS
    # fans that do not follow: the step waits its timeout, then auto again
    link = FakeLink(rise=False)
    clock, sleep = _clock()
    out = D.fan_step(link, timeout_s=3.0, clock=clock, sleep=sleep)
    assert clock() >= 3.0 and link.sent[-1] == ("fan_mode", {"mode": auto})
    assert D.check_fans_active(view(active=out)).status == D.FAIL


def test_fan_step_not_paired_changes_nothing_and_a_failed_restore_is_a_fail():
    link = FakeLink(refuse=NotPaired("/dev/x: cannot send fan_mode: not paired"))
    out = D.fan_step(link)
    assert len(link.sent) == 1 and not out["commanded"] and out["restored"]
    assert D.check_fans_active(view(active=out)).status == D.WARN
    link = FakeLink(fail_restore=True)
    clock, sleep = _clock()
    out = D.fan_step(link, clock=clock, sleep=sleep)
    assert not out["restored"] and "out_of_range" in out["restore_error"]
    c = D.check_fans_active(view(active=out))
    assert c.status == D.FAIL and "MANUAL" in c.hint


# ----------------------------------------------------------------------------- L2


def test_module_answers_pass_busy_and_silent():
    assert status_of(D.check_module_answers(view())) == D.PASS
    c = D.check_module_answers(view(module_id=None, error="/dev/ttyUSB0: no module: no hello",
                                    error_kind="no_hello"))  # fmt: skip
    assert status_of(c) == D.FAIL and "firmware" in c.hint
    c = D.check_module_answers(view(module_id=None, error="busy", error_kind="busy"))
    assert status_of(c) == D.WARN and "bridge" in c.hint
    c = D.check_module_answers(view(module_id=None, error="denied", error_kind="permission"))
    assert status_of(c) == D.FAIL and "group" in c.hint


def test_versions():
    assert status_of(D.check_versions(view(), bundled_fw=view().fw_version)) == D.PASS
    c = D.check_versions(view(proto_version="2.0"))
    assert status_of(c) == D.FAIL and "major" in c.detail
    c = D.check_versions(view(fw_version="0.0.9"), bundled_fw="0.1.0")
    assert status_of(c) == D.WARN and "ships firmware 0.1.0" in c.detail
    c = D.check_versions(view(proto_version="1.x"))
    assert status_of(c) == D.WARN


def test_versions_older_minor_warns(monkeypatch):
    monkeypatch.setattr(D, "VERSION_MINOR", 3)
    c = D.check_versions(view(proto_version="1.2"))
    assert status_of(c) == D.WARN and "older firmware" in c.detail


def test_watchdog_reset_event_warns():
    assert status_of(D.check_reset_cause(view())) == D.PASS
    wd = {"reason": "watchdog_reset", "active": True, "seen": "event log"}
    c = D.check_reset_cause(view(events=[wd]))
    assert status_of(c) == D.WARN and "watchdog" in c.detail and "event log" in c.detail
    c = D.check_reset_cause(view(resets=2))
    assert status_of(c) == D.WARN and "2 module reset(s)" in c.detail


def test_config_checks():
    assert status_of(D.check_config(view())) == D.PASS
    c = D.check_config(view(events=[{"reason": "config_corrupt", "active": True}]))
    assert status_of(c) == D.FAIL and "factory defaults" in c.detail
    c = D.check_config(view(events=[{"reason": "config_fallback", "active": True, "value": 1}]))
    assert status_of(c) == D.WARN and "last good copy" in c.detail
    c = D.check_config(view(config_read=False, config_error="timed out"))
    assert status_of(c) == D.FAIL and "timed out" in c.detail
    c = D.check_config(view(config_version=2))
    assert status_of(c) == D.WARN
    assert D.check_config(view(source="metrics", config_read=False)).status == D.SKIP


def test_flash_writes_wear():
    assert status_of(D.check_flash_writes(view())) == D.PASS
    c = D.check_flash_writes(view(telemetry=tel(flash_writes=25_000)))
    assert status_of(c) == D.WARN and "25000" in c.detail
    assert D.check_flash_writes(view(telemetry=tel(flash_writes=250_000))).status == D.FAIL
    assert D.check_flash_writes(view(telemetry=tel(flash_writes=None))).status == D.SKIP


def test_pairing():
    assert status_of(D.check_pairing(view())) == D.PASS
    c = D.check_pairing(view(key_error="no key for module 3a00.. in /k"))
    assert status_of(c) == D.WARN and "modbridge pair /dev/ttyUSB0" in c.hint


def test_a_module_that_does_not_answer(tmp_path):
    """probe_module over a port path with nothing behind it: a fail that names it."""
    port = str(tmp_path / "ttyUSB9")
    v = D.probe_module(port, timeout_s=0.5)
    assert not v.answered and v.error_kind == "not_found" and "ttyUSB9" in v.error
    c = D.check_module_answers(v)
    assert status_of(c) == D.FAIL and "plug the module in" in c.hint
    assert all(f(v).status == D.SKIP for f in (D.check_versions, D.check_config,
                                                D.check_flash_writes, D.check_reset_cause))


# ----------------------------------------------------------------------------- L3


def test_nvml_facts_from_the_h200_recording():
    nv = FakeNvml(devices=2)
    gpu = D.probe_gpus("auto", nvml_module=nv)
    assert gpu.backend == "nvml" and gpu.driver_version and len(gpu.gpus) == 2
    assert nv.init_count == 0  # shut down again
    assert not nv.writes  # read only: nothing was written
    assert status_of(D.check_nvml(gpu)) == D.PASS
    assert gpu.driver_version in D.check_driver_version(gpu).detail
    assert status_of(D.check_gpus_visible(gpu)) == D.PASS
    assert D.check_persistence(gpu).status in (D.PASS, D.WARN)
    root = D.Privileges(euid=0, cap_sys_admin=True)
    c = D.check_power_limit_permission(gpu, root)
    assert status_of(c) == D.PASS and "not written" in c.detail


def test_persistence_off_warns():
    nv = FakeNvml()
    nv.set_answer("nvmlDeviceGetPersistenceMode", 0)
    c = D.check_persistence(D.probe_gpus("nvml", nvml_module=nv))
    assert status_of(c) == D.WARN and "nvidia-persistenced" in c.hint
    nv.set_answer("nvmlDeviceGetPersistenceMode", 1)
    assert D.check_persistence(D.probe_gpus("nvml", nvml_module=nv)).status == D.PASS


def test_nvml_missing_fails_or_falls_back_to_nvidia_smi():
    nv = FakeNvml()
    nv.fail("nvmlInit", "NVMLError_LibraryNotFound")

    def no_smi(args):
        raise FileNotFoundError(2, "nvidia-smi is not on PATH")

    gpu = D.probe_gpus("auto", nvml_module=nv, smi_run=no_smi)
    assert gpu.backend is None and "libnvidia-ml.so.1" in gpu.error
    c = D.check_nvml(gpu)
    assert status_of(c) == D.FAIL and "driver" in c.hint
    for fn in (D.check_driver_version, D.check_gpus_visible, D.check_persistence):
        assert fn(gpu).status == D.SKIP

    row = (f"{GPU}, NVIDIA GeForce RTX 3080, 00000000:01:00.0, 580.159.04, Disabled, "
           "320.00, 320.00, 100.00, 370.00\n")  # fmt: skip
    gpu = D.probe_gpus("auto", nvml_module=nv, smi_run=lambda args: row)
    assert gpu.backend == "nvidia-smi" and gpu.driver_version == "580.159.04"
    assert status_of(D.check_nvml(gpu)) == D.WARN
    assert D.check_persistence(gpu).status == D.WARN
    assert gpu.gpus[0].max_limit_w == 370.0


def test_configured_gpu_not_visible_fails():
    gpu = D.probe_gpus("nvml", nvml_module=FakeNvml(), wanted=["GPU-00000000-dead"])
    c = D.check_gpus_visible(gpu)
    assert status_of(c) == D.FAIL and "GPU-00000000-dead" in c.detail
    gpu = D.probe_gpus("nvml", nvml_module=FakeNvml(), wanted=["00000000:00:06.0"])
    assert D.check_gpus_visible(gpu).status == D.PASS  # a PCI bus id works too


def test_power_limit_permission_denied_and_not_settable():
    gpu = D.probe_gpus("nvml", nvml_module=FakeNvml())
    c = D.check_power_limit_permission(gpu, D.Privileges(euid=1000, cap_sys_admin=False))
    assert status_of(c) == D.WARN and "neither root nor CAP_SYS_ADMIN" in c.detail
    c = D.check_power_limit_permission(gpu, D.Privileges(euid=1000, cap_sys_admin=True))
    assert status_of(c) == D.PASS and "CAP_SYS_ADMIN" in c.detail
    gpu.gpus[0].min_limit_w = gpu.gpus[0].max_limit_w
    c = D.check_power_limit_permission(gpu, D.Privileges(euid=0, cap_sys_admin=True))
    assert status_of(c) == D.WARN and "clocks" in c.hint


def test_read_privileges(tmp_path):
    f = tmp_path / "status"
    f.write_text("Name:\tx\nCapEff:\t0000000000200000\n")
    assert D.read_privileges(f).cap_sys_admin is True
    f.write_text("CapEff:\t0000000000000400\n")
    assert D.read_privileges(f).cap_sys_admin is False
    f.write_text("CapEff:\tgarbage\n")
    assert D.read_privileges(f).cap_sys_admin is False
    assert D.read_privileges(tmp_path / "missing").euid == os.geteuid()


# ----------------------------------------------------------------------------- L4


class _Server:
    """An HTTP server on 127.0.0.1 answering every GET with ``body``."""

    def __init__(self, body: str):
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/metrics"


def _cfg(**kw):
    from modbridge.config import BridgeConfig

    return BridgeConfig(**kw)


def _snapshot() -> BridgeSnapshot:
    st = ModuleStatus(port="/dev/ttyUSB0", module_id=UID, link_up=True, fw_version="0.1.0",
                      proto_version="1.0", board="blackpill_f411", fans=2,
                      channels=C.CHANNELS, last_frame_at=time.monotonic(),
                      telemetry=tel(temp_gpu=None, faults=bit("ntc_gpu")),
                      telemetry_at=time.monotonic(), module_resets=1,
                      events_total=Counter({"watchdog_reset": 1, "boot": 2}))  # fmt: skip
    return BridgeSnapshot(taken_at=time.monotonic(), modules=[st], backend="nvml")


def test_exporter_up_down_and_foreign(tmp_path):
    from modbridge.exporter import prometheus as X

    server = X.serve(_snapshot, "127.0.0.1", 0)
    try:
        url = server.url if server.url.endswith("/metrics") else server.url + "/metrics"
        app = D.probe_app(_cfg(), tmp_path / "state", url=url)
        assert status_of(D.check_exporter(app)) == D.PASS
        # the module as the running bridge sees it, back in wire units
        (v,) = D.parse_metrics(app.metrics_text)
    finally:
        server.stop()
    assert v.module_id == UID and v.port == "/dev/ttyUSB0" and v.fw_version == "0.1.0"
    assert v.telemetry["temp_amb"] == 26_000 and v.telemetry["fan1_rpm"] == 1900
    assert v.telemetry["v_in"] == 12_020 and v.telemetry["state"] == C.STATE_HOSTED
    assert v.fault("ntc_gpu") and "temp_gpu" not in v.telemetry
    assert D.check_ntc(v).status == D.FAIL and D.check_reset_cause(v).status == D.WARN
    assert D.check_config(v).status == D.SKIP and D.check_flash_writes(v).status == D.SKIP

    with _Server("# HELP node_load1 x\nnode_load1 0.5\n") as other:
        c = D.check_exporter(D.probe_app(_cfg(), tmp_path, url=other.url))
        assert status_of(c) == D.FAIL and "not with modbridge's metrics" in c.detail
    down = _closed_port_url()
    c = D.check_exporter(D.probe_app(_cfg(), tmp_path, url=down))
    assert c.status == D.SKIP and "no bridge running" in c.detail  # nothing to reach
    app = D.probe_app(_cfg(), tmp_path, url=down)
    app.bridge_pids = [4242]  # but a bridge runs: its exporter is down
    c = D.check_exporter(app)
    assert status_of(c) == D.FAIL and "pid 4242" in c.detail
    assert D.check_exporter(D.probe_app(_cfg(exporter_enabled=False), tmp_path)).status == D.SKIP


def test_metrics_url_from_the_config():
    assert D.metrics_url(_cfg()) == "http://127.0.0.1:9659/metrics"
    assert D.metrics_url(_cfg(exporter_address="0.0.0.0", exporter_port=9000)) == (
        "http://127.0.0.1:9000/metrics")  # fmt: skip
    assert D.metrics_url(_cfg(exporter_address="::")) == "http://[::1]:9659/metrics"
    assert D.metrics_url(_cfg(exporter_enabled=False)) is None


def test_event_log(tmp_path):
    assert D.check_event_log(D.AppFacts()).status == D.SKIP
    log = tmp_path / "events.jsonl"
    c = D.check_event_log(D.AppFacts(event_log=str(log)))
    assert status_of(c) == D.PASS and "can be created" in c.detail
    log.write_text("{}\n")
    assert D.check_event_log(D.AppFacts(event_log=str(log))).status == D.PASS
    link = tmp_path / "link.jsonl"
    link.symlink_to(log)
    c = D.check_event_log(D.AppFacts(event_log=str(link)))
    assert status_of(c) == D.FAIL and "symbolic link" in c.detail
    c = D.check_event_log(D.AppFacts(event_log=str(tmp_path / "nodir" / "e.jsonl")))
    assert status_of(c) == D.WARN and "does not exist" in c.detail
    assert sorted(os.listdir(tmp_path)) == ["events.jsonl", "link.jsonl"]  # no leftovers


def test_state_dir(tmp_path):
    d = tmp_path / "state"
    assert status_of(D.check_state_dir(D.AppFacts(state_dir=str(d)))) == D.PASS  # creatable
    assert not d.exists()  # doctor does not create it
    d.mkdir(mode=0o700)
    c = D.check_state_dir(D.AppFacts(state_dir=str(d)))
    assert status_of(c) == D.PASS and "0700" in c.detail
    d.chmod(0o755)
    c = D.check_state_dir(D.AppFacts(state_dir=str(d)))
    assert status_of(c) == D.WARN and "chmod 0700" in c.hint
    assert os.listdir(d) == []  # the probe file is gone
    f = tmp_path / "file"
    f.write_text("x")
    assert status_of(D.check_state_dir(D.AppFacts(state_dir=str(f)))) == D.FAIL


def test_unwritable_state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    monkeypatch.setattr(D, "probe_writable_dir", lambda p: "Read-only file system")
    monkeypatch.setattr(D.os, "geteuid", lambda: 0)  # as the service (root): a fail
    c = D.check_state_dir(D.AppFacts(state_dir=str(d)))
    assert status_of(c) == D.FAIL and "Read-only file system" in c.detail
    monkeypatch.setattr(D.os, "geteuid", lambda: 1000)  # another user: maybe only ours
    c = D.check_state_dir(D.AppFacts(state_dir=str(d)))
    assert status_of(c) == D.WARN and "sudo modbridge doctor" in c.hint


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0500 directory anyway")
def test_unwritable_state_dir_by_mode(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o500)
    try:
        c = D.check_state_dir(D.AppFacts(state_dir=str(d)))
        assert c.status == D.WARN and "cannot create files" in c.detail
    finally:
        d.chmod(0o700)


def _gpu_facts(enforced=700.0):
    return D.GpuFacts(backend="nvml", gpus=[D.GpuFact(uuid=GPU, enforced_limit_w=enforced)])


def test_journal_consistent_crashed_orphan_and_corrupt(tmp_path):
    state = tmp_path / "state"
    app = lambda: D.probe_app(_cfg(), state, url=None, use_config_url=False)  # noqa: E731
    assert status_of(D.check_journal(app(), _gpu_facts())) == D.PASS  # none: empty
    LimitJournal(state).record(GPU, original_w=700.0, intended_w=490.0)
    entry = (state / "limits" / f"{GPU}.json").read_bytes()
    # the writer (this test process, standing for a bridge) is not a running modbridge
    c = D.check_journal(app(), _gpu_facts(enforced=700.0))
    assert status_of(c) == D.WARN and "modbridge restore" in c.hint
    c = D.check_journal(app(), _gpu_facts(enforced=490.0))  # and the GPU is held low
    assert status_of(c) == D.FAIL and "at 490 W, original 700 W" in c.detail
    a = app()
    a.bridge_pids = [os.getpid()]  # a running bridge holds it: consistent
    assert status_of(D.check_journal(a, _gpu_facts(490.0))) == D.PASS
    c = D.check_journal(app(), D.GpuFacts(backend="nvml", gpus=[]))  # the GPU is gone
    assert status_of(c) == D.WARN and "not present" in c.detail
    (state / "limits" / f"{GPU}.json").write_bytes(b"{not json")
    c = D.check_journal(app(), _gpu_facts())
    assert status_of(c) == D.FAIL and "not JSON" in c.detail
    assert (state / "limits" / f"{GPU}.json").exists()  # doctor sets nothing aside
    assert entry  # (the good entry's bytes, for the record)


def test_running_bridge_pids(tmp_path):
    locks = tmp_path / "state" / "locks"
    locks.mkdir(parents=True)
    proc = tmp_path / "proc"
    for pid, cmd in ((101, b"/opt/modbridge/bin/python\0/usr/local/bin/modbridge\0run"),
                     (102, b"/usr/bin/vim\0")):  # fmt: skip
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(cmd)
    (locks / "GPU-a.lock").write_text("101\n")
    (locks / "GPU-b.lock").write_text("102\n")  # a recycled pid: not ours
    (locks / "GPU-c.lock").write_text("103\n")  # dead
    (locks / "GPU-d.lock").write_text("junk")
    assert D.running_bridge_pids(tmp_path / "state", proc_root=proc) == [101]


# --------------------------------------------------------------------- run_doctor


def _env(**kw):
    def refused(url):
        raise ConnectionRefusedError(111, "Connection refused")

    fields = dict(nvml=FakeNvml(), fetch=refused, lister=lambda: [],
                  privileges=D.Privileges(euid=0, cap_sys_admin=True))  # fmt: skip
    fields.update(kw)
    return D.DoctorEnv(**fields)


def test_run_doctor_without_a_module(tmp_path):
    opts = D.DoctorOptions(config_path=str(_config(tmp_path)), state_dir=str(tmp_path / "s"))
    rep = D.run_doctor(opts, _env())
    by = {c.name: c for c in rep.checks}
    assert by["module_answers"].status == D.FAIL and "--sim" in by["module_answers"].hint
    assert by["nvml"].status == D.PASS and by["gpus_visible"].status == D.PASS
    assert rep.exit_code == D.EXIT_FAIL and rep.found_anything
    assert [c.layer for c in rep.checks] == sorted(c.layer for c in rep.checks)
    d = rep.as_dict()
    assert set(d) == {"checks", "counts", "worst", "exit_code"} and d["worst"] == D.FAIL
    assert set(d["checks"][0]) == {"layer", "name", "target", "status", "detail", "hint", "data"}
    json.dumps(d)  # all plain values


def test_run_doctor_finds_nothing(tmp_path):
    nv = FakeNvml()
    nv.fail("nvmlInit", "NVMLError_DriverNotLoaded")

    def no_smi(args):
        raise FileNotFoundError(2, "no nvidia-smi")

    opts = D.DoctorOptions(config_path=str(_config(tmp_path)), state_dir=str(tmp_path / "s"))
    rep = D.run_doctor(opts, _env(nvml=nv, smi_run=no_smi))
    assert rep.exit_code == D.EXIT_NOT_FOUND


def test_run_doctor_refuses_bad_options(tmp_path):
    with pytest.raises(D.DoctorError, match="drop --port"):
        D.run_doctor(D.DoctorOptions(sim=True, ports=("/dev/x",)), _env())
    with pytest.raises(D.DoctorError, match="--sim-fault needs --sim"):
        D.run_doctor(D.DoctorOptions(sim_faults=("fan_stall:1@0s",)), _env())
    bad = tmp_path / "bad.toml"
    bad.write_text("[bridge]\ntick_s = 0\n")
    with pytest.raises(D.DoctorError, match="tick_s"):
        D.run_doctor(D.DoctorOptions(config_path=str(bad)), _env())


def _config(tmp_path, extra=""):
    p = tmp_path / "modbridge.toml"
    p.write_text(f"[bridge]\nevent_log = \"{tmp_path / 'events.jsonl'}\"\n{extra}")
    return p


def test_watchdog_reset_from_the_event_log():
    v = view()
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("garbage\n")
        f.write(json.dumps({"ts": "x", "kind": "module_event", "module_id": UID,
                            "reason": "watchdog_reset", "fields": {"active": True}}) + "\n")
        f.write(json.dumps({"kind": "module_event", "module_id": "other",
                            "reason": "config_corrupt"}) + "\n")  # fmt: skip
    try:
        D._events_from_log(f.name, [v])
    finally:
        os.unlink(f.name)
    assert [e["reason"] for e in v.events] == ["watchdog_reset"]
    assert D.check_reset_cause(v).status == D.WARN and D.check_config(v).status == D.PASS


# ------------------------------------------------------------------------------ CLI


def _cli(*args):
    return CliRunner().invoke(main, ["doctor", *args])


def test_cli_usage_errors_exit_2(tmp_path):
    res = _cli("--sim", "--port", "/dev/ttyUSB0")
    assert res.exit_code == 2 and "modbridge doctor: --sim brings its own" in res.output
    res = _cli("--sim-fault", "fan_stall:1@0s")
    assert res.exit_code == 2 and "--sim-fault needs --sim" in res.output
    res = _cli("--sim", "--sim-fault", "fan_wobble:1@0s")
    assert res.exit_code == 2, res.output
    res = _cli("--backend", "cuda")
    assert res.exit_code == 2


def test_cli_sim_healthy_end_to_end():
    """A healthy virtual module and GPU, the fans stepped: every check passes, but for
    the three an unattended virtual run cannot have (no bridge, so no exporter and no
    control socket; no event log configured)."""
    res = _cli("--sim", "--active", "--json", "--config", os.devnull)
    d = json.loads(res.output)
    skipped = {c["name"] for c in d["checks"] if c["status"] == D.SKIP}
    assert skipped == {"exporter", "control_socket", "event_log"}, d
    bad = [c for c in d["checks"] if c["status"] in (D.WARN, D.FAIL)]
    assert not bad, bad
    assert res.exit_code == 0 and d["exit_code"] == 0 and d["worst"] == D.PASS
    assert {c["layer"] for c in d["checks"]} == set(D.LAYERS)
    by = {c["name"]: c for c in d["checks"]}
    assert by["fans_active"]["data"]["restored"] is True
    assert by["input_12v"]["data"]["v_in_v"] == pytest.approx(12.0, abs=0.4)


def test_cli_sim_faults_end_to_end():
    """An open GPU NTC and a stalled fan 1 on the virtual module: L1 fails, the text
    says what to try, exit 1."""
    res = _cli("--sim", "--active", "--config", os.devnull,
               "--sim-fault", "ntc_open:gpu@0s", "--sim-fault", "fan_stall:1@0s")  # fmt: skip
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert any(ln.startswith("  FAIL  ntc") and "gpu faulted" in ln for ln in lines), res.output
    assert any(ln.startswith("  FAIL  fans_active") and "fan 1" in ln for ln in lines)
    assert sum(ln.strip().startswith("next:") for ln in lines) >= 2
    assert lines[-1].endswith("(exit 1)")


def test_cli_sim_stalled_fan_fails_without_active():
    """The passive check alone catches a stalled fan that still reports a trickle: its
    twin turns at the same duty (it passed with 16 checks and exit 0 before)."""
    res = _cli("--sim", "--config", os.devnull, "--sim-fault", "fan_stall:1@0s")
    assert res.exit_code == 1, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("  FAIL  fans ")]
    assert "fan 1 turns at" in line and "where fan 2 turns at" in line, line


def test_run_doctor_reads_a_busy_module_from_the_bridges_metrics(tmp_path):
    """The bridge holds the port (an exclusive open, as the service's): doctor reads
    the module from the bridge's /metrics instead, and skips what only the port tells."""
    import serial

    from modbridge.exporter import prometheus as X

    master, slave = os.openpty()
    port = os.ttyname(slave)
    held = serial.Serial(port, exclusive=True)
    snap = _snapshot()
    snap.modules[0].port = port
    server = X.serve(lambda: snap, "127.0.0.1", 0)
    try:
        url = server.url if server.url.endswith("/metrics") else server.url + "/metrics"
        opts = D.DoctorOptions(ports=(port,), config_path=str(_config(tmp_path)),
                               state_dir=str(tmp_path / "s"), metrics_url=url)  # fmt: skip
        rep = D.run_doctor(opts, _env(fetch=None))
    finally:
        server.stop()
        held.close()
        os.close(master)
        os.close(slave)
    by = {c.name: c for c in rep.checks}
    assert by["module_answers"].status == D.PASS and "metrics" in by["module_answers"].detail
    assert by["exporter"].status == D.PASS
    assert by["ntc"].status == D.FAIL  # the snapshot's faulted GPU channel
    assert by["reset_cause"].status == D.WARN  # its watchdog_reset counter
    assert by["config"].status == D.SKIP and by["pairing"].status == D.SKIP
    assert by["fans"].status == D.PASS and by["input_12v"].status == D.PASS


def test_fan_step_gives_a_manual_module_its_duties_back():
    link = FakeLink()
    link.status.telemetry = dict(link.status.telemetry, state=C.STATE_MANUAL,
                                 fan1_duty=26214, fan2_duty=32768)  # fmt: skip
    clock, sleep = _clock()
    out = D.fan_step(link, clock=clock, sleep=sleep)
    manual = C.FAN_MODES.index("manual")
    assert link.sent[-1] == ("fan_mode", {"mode": manual, "duty1": 26214, "duty2": 32768})
    c = D.check_fans_active(view(active=out))
    assert c.status == D.PASS and c.detail.endswith("back in manual")


@given(st.text(max_size=300))
def test_metrics_garbage_never_raises(text):
    for v in D.parse_metrics(text):
        assert isinstance(v, D.ModuleView)


def test_metrics_that_are_not_the_text_format():
    assert D.parse_metrics("modbridge_build_info{version=\"0.1\" 1\n\x00\x01{{{") == []
    assert D.parse_metrics("") == []


def test_cli_exit_code_and_json_come_from_the_same_checks(monkeypatch):
    checks = [D.Check("L1", "ntc", D.PASS, "4 channels plausible", target=UID),
              D.Check("L3", "persistence_mode", D.WARN, "persistence mode off on GPU-x",
                      "enable it"),
              D.Check("L4", "exporter", D.SKIP, "no bridge running")]  # fmt: skip
    monkeypatch.setattr(D, "run_doctor", lambda opts, emit=None: D.Report(checks))
    res = _cli()
    assert res.exit_code == D.EXIT_WARN, res.output
    lines = res.output.splitlines()
    assert lines[0] == "L1 physical" and f"  pass  ntc [{UID}]: 4 channels plausible" in lines
    assert "  WARN  persistence_mode: persistence mode off on GPU-x" in lines
    assert "        next: enable it" in lines and "L2 firmware" not in lines
    assert lines[-1] == "1 pass, 1 warn, 0 fail, 1 skipped (exit 4)"
    res = _cli("--json")
    d = json.loads(res.output)
    assert res.exit_code == 4 and d["exit_code"] == 4 and d["worst"] == D.WARN
    assert [c["name"] for c in d["checks"]] == ["ntc", "persistence_mode", "exporter"]
    assert d["checks"][1] == checks[1].as_dict()


def test_cli_escapes_wire_strings(monkeypatch):
    evil = D.Check("L2", "module_answers", D.FAIL, "module \x1b[2Jgone", "try\x07", target="a\nb")
    monkeypatch.setattr(D, "run_doctor", lambda opts, emit=None: D.Report([evil]))
    res = _cli()
    assert res.exit_code == 1 and "\x1b" not in res.output and "\x07" not in res.output
    assert "a\\nb" in res.output


def test_a_simulator_that_cannot_start_is_a_runtime_error(monkeypatch):
    from modbridge import bridge as br
    from modbridge.errors import ModbridgeError

    def no_micropython(*a, **kw):
        raise ModbridgeError("micropython not found: `make setup` installs it")

    monkeypatch.setattr(br, "open_sim", no_micropython)
    res = _cli("--sim")
    assert res.exit_code == 1
    assert "modbridge doctor: cannot start the simulator: micropython not found" in res.output
    assert "Traceback" not in res.output


def test_fan_step_waits_on_the_modules_clock():
    """A fan that never comes up: the step ends after ACTIVE_STEP_S of the module's
    uptime (a virtual module's runs faster than ours), long before our wall limit."""

    link = FakeLink(rise=False)
    clock, sleep_ = _clock()

    def sleep(s):  # every poll, the module's uptime moves a second
        sleep_(s)
        link.status.telemetry = dict(link.status.telemetry,
                                     uptime_s=link.status.telemetry["uptime_s"] + 1)  # fmt: skip

    out = D.fan_step(link, timeout_s=1000.0, poll_s=0.01, clock=clock, sleep=sleep)
    assert clock() < 1.0 and out["restored"]  # 8 polls, not 1000 s
    assert D.check_fans_active(view(active=out)).status == D.FAIL


def _unix_server(path, reply: bytes):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


def test_control_socket(tmp_path, monkeypatch):
    from modbridge.ops import ctlsock

    sock = tmp_path / "control.sock"
    cfg = _cfg(control_socket=str(sock))
    app = D.AppFacts()
    D.probe_control(app, cfg)
    assert app.control_socket is None
    assert D.check_control_socket(app).status == D.SKIP  # no bridge, no socket
    app.bridge_pids = [4242]
    c = D.check_control_socket(app)
    assert status_of(c) == D.WARN and "no control socket" in c.detail

    srv, t = _unix_server(sock, b'{"ok": true, "op": "ping"}\n')  # a bridge answering
    try:
        app = D.AppFacts()
        D.probe_control(app, cfg)
        t.join(5)
    finally:
        srv.close()
    assert app.control_ok and status_of(D.check_control_socket(app)) == D.PASS
    # the socket file is still there, nobody listens: a stale one
    app = D.AppFacts()
    D.probe_control(app, cfg)
    assert app.control_error_kind == "stale" and D.check_control_socket(app).status == D.SKIP
    app.bridge_pids = [4242]
    assert status_of(D.check_control_socket(app)) == D.FAIL  # a bridge runs, yet no answer

    class Refusing:
        def __init__(self, path, timeout_s):
            pass

        def ping(self):
            raise ctlsock.SocketRefused("control.sock: permission denied")

    app = D.AppFacts()
    D.probe_control(app, cfg, Refusing)
    c = D.check_control_socket(app)
    assert status_of(c) == D.WARN and "control_group" in c.hint
