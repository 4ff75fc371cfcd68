"""Faults against the real firmware: the MicroPython unix port on the sim board, driven by
``SimFleet`` (one ``VirtualModule``, speed max, a world settled at 30 % fans) with the
faults scheduled through ``sim/faults.py``, the same parser and schedule as
``modbridge sim --fault``. Each test checks the module's state, its events and the fan
duty afterwards, from the runner's telemetry tap.

The parser's own tests come first (no firmware).
"""

from __future__ import annotations

import os
import time

import pytest

from modbridge.sim import GpuLost, Profile
from modbridge.sim.faults import (
    Fault,
    FaultSchedule,
    FaultSpecError,
    fan_faults,
    parse_fault,
    release_fan_faults,
)
from modbridge.sim.fleet import SimFleet
from modbridge.sim.world import World, WorldError
from protocol import catalog as C
from protocol import frame

FLOOR_SENSOR = 52428  # safety.sensor_fault, 80 %
FLOOR_HOST_LOST = 26214  # safety.host_lost, 40 %
FLOOR_BOOT = 45875  # safety.boot, 70 %
CONTROLLED = ("gpu", "vram", "mos")

# --------------------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    "spec, want",
    [
        ("ntc_open:gpu@30s", Fault("ntc_open", 30000, None, 0)),
        ("ntc_short:amb@5s-9.5s", Fault("ntc_short", 5000, 9500, 3)),
        ("ntc_open:2@1min", Fault("ntc_open", 60000, None, 2)),
        ("fan_stall:2@60s-90s", Fault("fan_stall", 60000, 90000, 1)),
        ("ina_absent@10s", Fault("ina_absent", 10000)),
        ("dip:900mV/500ms@45s", Fault("dip", 45000, None, None, 900, 500)),
        ("rail_dip:1.2V/2s@45", Fault("dip", 45000, None, None, 1200, 2000)),
        ("host_silence@20s-40s", Fault("host_silence", 20000, 40000)),
        ("mcu_reset@50s", Fault("mcu_reset", 50000, None, "power")),
        ("mcu_reset:watchdog@500ms", Fault("mcu_reset", 500, None, "watchdog")),
        ("gpu_lost@100s", Fault("gpu_lost", 100000)),
        ("m1:fan_stall:1@0s", Fault("fan_stall", 0, None, 0, module=1)),
        ("telemetry_freeze@30s-60s", Fault("telemetry_freeze", 30000, 60000)),
        ("frozen_telemetry@1min", Fault("telemetry_freeze", 60000)),
        ("fan_weak:1@10s", Fault("fan_weak", 10000, None, 0, pct=30.0)),
        ("fan_weak:2/50%@1s-2s", Fault("fan_weak", 1000, 2000, 1, pct=50.0)),
        ("tach_noise:2@5s", Fault("tach_noise", 5000, None, 1)),
        ("m0:tach_noise:1/12.5%@0s", Fault("tach_noise", 0, None, 0, module=0, pct=12.5)),
    ],
)
def test_good_specs(spec, want):
    got = parse_fault(spec)
    assert got == Fault(**{**want.__dict__, "spec": spec}), got


@pytest.mark.parametrize(
    "spec, words",
    [
        ("", "empty"),
        ("fan_stall:2", "no start time"),
        ("fan_stal:2@60s", "unknown fault 'fan_stal'"),
        ("fan_stall:3@60s", "fan, 1 or 2"),
        ("fan_stall@60s", "fan, 1 or 2"),
        ("ntc_open:cpu@30s", "NTC channel"),
        ("ntc_open:@30s", "nothing after ntc_open:"),
        ("ntc_open:gpu@soon", "start time like 30s"),
        ("ntc_open:gpu@30x", "start time like 30s"),
        ("ntc_open:gpu@30s-20s", "not after start"),
        ("ntc_open:gpu@30s-", "end time like"),
        ("ntc_open:gpu@0.0005s", "whole number of ms"),
        ("dip@45s", "depth>/<duration"),
        ("dip:900/500ms@45s", "dip depth like 900mV"),
        ("dip:900mV/fast@45s", "dip duration like"),
        ("dip:900mV/0ms@45s", "dip duration must be > 0"),
        ("dip:900mV/500ms@45s-50s", "start time only"),
        ("mcu_reset@5s-6s", "it is an instant"),
        ("mcu_reset:brownout@5s", "reset cause is one of"),
        ("ina_absent:yes@10s", "takes no argument"),
        ("fan_weak:3@1s", "fan, 1 or 2"),
        ("fan_weak@1s", "fan, 1 or 2"),
        ("tach_noise:/10%@1s", "fan, 1 or 2"),
        ("fan_weak:1/0%@1s", "above 0 and below 100%"),
        ("fan_weak:1/100%@1s", "above 0 and below 100%"),
        ("fan_weak:1/30@1s", "level is a percentage"),
        ("tach_noise:1/95%@1s", "above 0 and below 90%"),
        ("tach_noise:1/noisy@1s", "level is a percentage"),
        ("tach_noise:1/@1s", "level is a percentage"),
    ],
)
def test_garbage_specs_name_the_problem(spec, words):
    with pytest.raises(FaultSpecError) as ei:
        parse_fault(spec)
    msg = str(ei.value)
    assert words in msg and "\n" not in msg, msg
    assert msg.startswith(f"fault {spec.strip()!r}: "), msg


def test_schedule_orders_offs_before_ons_and_checks_module_numbers():
    s = FaultSchedule(["fan_stall:1@2s-5s", "gpu_lost@5s", "ina_absent@1s"], n_modules=2)
    assert s.next_ms == 1000
    order = [(a.t_ms, a.fault.name, a.on) for a in s._pending]
    assert order == [
        (1000, "ina_absent", True),
        (2000, "fan_stall", True),
        (5000, "fan_stall", False),
        (5000, "gpu_lost", True),
    ]
    with pytest.raises(FaultSpecError, match=r"no module 2 \(modules are 0..1\)"):
        FaultSchedule(["m2:gpu_lost@1s"], n_modules=2)


def test_fan_fault_labels():
    assert parse_fault("fan_weak:2@1s").label() == "fan2 weak (30 % of its RPM)"
    assert parse_fault("tach_noise:1@1s").label() == "fan1 tach noise (pure noise)"
    assert parse_fault("tach_noise:1/10%@1s").label() == "fan1 tach noise (10 % jitter and spikes)"


# ------------------------------------------------------- fan_weak / tach_noise on a world


def _world(seed=1):
    w = World(seed=seed)
    w.set_duties(65535, 65535)
    w.step(20000)
    w.tach_pulses()
    return w


def _counts(w, seconds, step_ms=100):
    """Tach pulses per second per fan, exchanges of ``step_ms`` as the runner's."""
    out = []
    for _ in range(seconds):
        got = [0, 0]
        for _ in range(1000 // step_ms):
            w.step(step_ms)
            p = w.tach_pulses()
            got[0] += p[0]
            got[1] += p[1]
        out.append(got)
    return out


def test_fan_weak_reaches_only_its_share_and_moves_less_air():
    w = _world()
    twin = _world()
    ff = fan_faults(w)
    ff.set_weak(1, 0.3)
    _counts(w, 30)
    _counts(twin, 30)
    assert abs(w.rpm[1] - 900) < 5 and abs(w.rpm[0] - 3000) < 5, w.rpm
    c = _counts(w, 5)
    assert all(abs(n - 30) <= 1 and abs(m - 100) <= 1 for m, n in c), c  # 2 pulses/rev
    assert w._conductances()[0] < twin._conductances()[0]  # less flow, less cooling
    w.set_duties(32768, 32768)
    _counts(w, 30)
    assert abs(w.rpm[1] - 450) < 5, w.rpm  # the share of whatever the duty gives
    ff.set_weak(1, None)
    release_fan_faults(w)
    assert "_fan_target" not in w.__dict__ and "tach_pulses" not in w.__dict__
    _counts(w, 30)
    assert abs(w.rpm[1] - 1500) < 5, w.rpm


def test_tach_noise_pure_does_not_follow_the_rotor():
    w = _world(seed=4)
    fan_faults(w).set_noise(0, True)
    w.set_duties(0, 65535)  # fan 1 stops: its tach keeps counting noise
    c = [n for n, _ in _counts(w, 120)]
    assert all(m == 100 for _, m in _counts(w, 3))  # the other fan's tach is untouched
    rpm = [n * 30 for n in c]  # 2 pulses/rev over 1 s
    mean = sum(rpm) / len(rpm)
    assert 1600 < mean < 3100, mean  # log-uniform over 200..9,000 RPM: 2,300 on average
    assert min(rpm) >= 180 and max(rpm) <= 9000, rpm  # never silent, never a glitch
    jumps = [abs(a - b) for a, b in zip(rpm, rpm[1:], strict=False)]
    assert sorted(jumps)[len(jumps) // 2] > 500, jumps  # no two seconds agree
    assert w.rpm[0] < 1.0  # the rotor itself stopped
    twin = _world(seed=4)
    fan_faults(twin).set_noise(0, True)
    twin.set_duties(0, 65535)
    assert [n for n, _ in _counts(twin, 120)] == c  # seeded: the same edges again


def test_tach_noise_with_a_level_is_jitter_and_a_spike_every_5s():
    w = _world(seed=2)
    fan_faults(w).set_noise(1, True, 0.1)
    c = [m for _, m in _counts(w, 30)]
    spikes = [i for i, m in enumerate(c) if m > 115]
    assert len(spikes) == 6 and all(b - a == 5 for a, b in zip(spikes, spikes[1:], strict=False)), c
    clean = [m for i, m in enumerate(c) if i not in spikes]
    assert all(90 <= m <= 110 for m in clean), clean  # 100 pulses/s, within 10 %
    assert abs(sum(clean) / len(clean) - 100) < 3, clean
    assert all(m < 140 for m in c), c  # a spike: 3 times one exchange's count
    fan_faults(w).set_noise(1, False)
    release_fan_faults(w)
    assert [m for _, m in _counts(w, 3)] == [100, 100, 100]


def test_fan_faults_check_the_fan():
    w = _world()
    with pytest.raises(WorldError, match="fan must be 0 or 1"):
        fan_faults(w).set_weak(2, 0.5)
    with pytest.raises(WorldError, match="fan must be 0 or 1"):
        fan_faults(w).set_noise(-1, True)


# --------------------------------------------------------------------------- the firmware


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


class Run:
    """One virtual module with a fault schedule; records telemetry and events by time."""

    def __init__(self, state_dir, faults=(), profile=None, seed=1, heartbeat_until=0):
        self.fleet = SimFleet(
            1,
            world="default",
            profile=profile,
            seed=seed,
            speed=0,
            state_dir=state_dir,
            faults=faults,
        )
        self.vm = self.fleet.modules[0]
        self.tel: list[tuple[int, dict]] = []  # (fleet ms, telemetry fields)
        self.ev: list[tuple[int, dict]] = []  # (fleet ms, event fields)
        self.pids: set[int] = set()
        self.heartbeat_until = heartbeat_until
        self._count = 0
        self._hb_seq = 0

    def _on_step(self, t, acts):
        vm = self.vm
        if vm.telemetry_count != self._count:
            self._count = vm.telemetry_count
            self.tel.append((t, dict(vm.last_telemetry)))
        while len(self.ev) < len(vm.events):
            self.ev.append((t, vm.events[len(self.ev)]))
        if vm._proc is not None:
            self.pids.add(vm._proc.pid)
        if t % 1000 == 0 and t < self.heartbeat_until:
            self._hb_seq += 1
            vm.host_write(
                vm.encode("heartbeat", {"gpu_temp": 60000, "gpu_power": 300000}, self._hb_seq)
            )

    def until(self, t_ms):
        self.fleet.run_for(t_ms - self.fleet.now_ms, on_step=self._on_step)
        return self.vm.last_telemetry

    def events(self, code, since=0, **match):
        return [
            e
            for t, e in self.ev
            if t >= since and e["code"] == code and all(e.get(k) == v for k, v in match.items())
        ]

    def events_since(self, since):
        return [e for t, e in self.ev if t >= since]

    def stop(self):
        self.fleet.stop()
        assert not [p for p in self.pids if _alive(p)], self.pids


@pytest.fixture
def sim(tmp_path):
    runs = []

    def make(*faults, **kw):
        r = Run(tmp_path / f"run{len(runs)}", faults, **kw)
        runs.append(r)
        return r

    yield make
    for r in runs:
        r.stop()


def _duties(t):
    return t["fan1_duty"], t["fan2_duty"]


@pytest.mark.parametrize("kind", ["open", "short"])
@pytest.mark.parametrize("ch", C.CHANNELS)
def test_ntc_open_and_short(sim, kind, ch):
    i = C.CHANNELS.index(ch)
    reason = C.REASON_SENSOR_OPEN if kind == "open" else C.REASON_SENSOR_SHORT
    r = sim(f"ntc_{kind}:{ch}@3s-12s")
    before = r.until(3000)
    assert before["state"] == C.STATE_STANDALONE and before["faults"] == 0, before
    t = r.until(10000)
    assert t["faults"] == 1 << i, t
    assert f"temp_{ch}" not in t, t  # a blind channel sends no temperature
    edges = r.events(reason, since=3000, index=i)
    assert [e["active"] for e in edges] == [True], r.ev  # sent once, not every tick
    if ch in CONTROLLED:
        assert t["state"] == C.STATE_FAILSAFE and t["reason"] == reason, t
        assert min(_duties(t)) >= FLOOR_SENSOR, t
        assert edges[0]["severity"] == C.SEV_ALARM
        trans = r.events(reason, since=3000, state=C.STATE_FAILSAFE)
        assert len(trans) == 1 and trans[0]["prev_state"] == C.STATE_STANDALONE, r.ev
    else:  # ambient: reported, not controlled
        assert t["state"] == C.STATE_STANDALONE, t
        assert edges[0]["severity"] == C.SEV_WARNING
        assert _duties(t) == _duties(before), (t, before)
        assert len(r.events_since(3000)) == 1, r.ev
    t = r.until(14000)  # cleared at 12 s
    assert t["state"] == C.STATE_STANDALONE and t["faults"] == 0, t
    assert f"temp_{ch}" in t
    assert [e["active"] for e in r.events(reason, since=3000, index=i)] == [True, False]
    t = r.until(24000)  # the hold ramps down at 5 %/s once the fault is gone
    assert max(_duties(t)) < FLOOR_SENSOR, t  # the floor went with the fault


def test_fan_stall(sim):
    r = sim("fan_stall:2@3s-40s")
    r.until(30000)  # the stalled fan coasts down (spin-down lag) before its tach goes quiet
    t = r.vm.last_telemetry
    assert t["state"] == C.STATE_FAILSAFE and t["reason"] == C.REASON_FAN_STALL, t
    assert t["faults"] == C.FAULT_FAN2_STALL, t
    assert _duties(t) == (65535, 65535), t  # the other fan flat out (and the stalled one)
    assert t["fan2_rpm"] == 0 and t["fan1_rpm"] > 2500, t
    stall = r.events(C.REASON_FAN_STALL, index=1)
    assert [e["active"] for e in stall] == [True], r.ev
    assert stall[0]["severity"] == C.SEV_ALARM
    # the coasting rotor first reads too slow for its duty (tach_implausible, also
    # FAILSAFE at 100 %), then its tach goes quiet: the stall
    first = [
        e
        for _, e in r.ev
        if e.get("state") == C.STATE_FAILSAFE and e.get("prev_state") == C.STATE_STANDALONE
    ]
    assert len(first) == 1, r.ev
    assert first[0]["code"] in (C.REASON_TACH_IMPLAUSIBLE, C.REASON_FAN_STALL), r.ev
    trans = [e for e in r.events(C.REASON_FAN_STALL, state=C.STATE_FAILSAFE) if "index" not in e]
    assert len(trans) == 1, r.ev  # the state change (the fault edge carries the index)
    t = r.until(48000)  # freed at 40 s: driven at 100 %, it spins up and clears
    assert t["state"] == C.STATE_STANDALONE and t["faults"] == 0, t
    assert [e["active"] for e in r.events(C.REASON_FAN_STALL, index=1)] == [True, False]
    t = r.until(70000)  # 100 % ramps down at 5 %/s once the stall is gone
    assert max(_duties(t)) < FLOOR_SENSOR, t


def test_fan_weak_reads_too_slow_for_its_duty(sim):
    r = sim("fan_weak:1@3s-40s")
    t = r.until(30000)
    assert t["state"] == C.STATE_FAILSAFE and t["reason"] == C.REASON_TACH_IMPLAUSIBLE, t
    assert _duties(t) == (65535, 65535) and abs(t["fan1_rpm"] - 900) <= 60, t
    # raised at the world's settled 30 %, cleared while 100 % is not yet its settled
    # duty (a slow reading of 900 RPM fits 30 %), raised again at 100 %
    edges = [e["active"] for e in r.events(C.REASON_TACH_IMPLAUSIBLE, index=0)]
    assert edges[0] and edges[-1], r.ev
    assert "_fan_faults" in r.vm.world.__dict__
    t = r.until(48000)  # healthy again at 40 s: it reaches its RPM and the fault clears
    assert t["faults"] == 0 and t["fan1_rpm"] > 2000, t  # ramping down from 100 %
    assert "_fan_faults" not in r.vm.world.__dict__  # the wrappers are off again


def test_tach_noise_reaches_the_firmware(sim):
    r = sim("tach_noise:2@3s")
    r.until(40000)
    per_s = {ms // 1000: t["fan2_rpm"] for ms, t in r.tel if ms >= 10000}  # one a second
    rpm = list(per_s.values())
    assert len(set(rpm)) > len(rpm) // 2, rpm  # it reads something new every second
    assert max(rpm) - min(rpm) > 1500, rpm


def test_ina226_not_answering_leaves_cooling_alone(sim):
    load = Profile.parse("ramp 200W 650W 30s\n")  # something for the curve to follow
    r = sim("ina_absent@5s-15s", profile=load)
    twin = sim(profile=load)  # same seed, no fault: the ADC noise is the same
    r.until(4000)
    assert "v_in" in r.vm.last_telemetry
    t = r.until(13000)
    ref = twin.until(13000)
    assert t["faults"] == C.FAULT_POWER_MONITOR, t
    assert not {"v_in", "i_in", "p_in"} & set(t), t  # absent, not zero
    assert t["state"] == C.STATE_STANDALONE == ref["state"], (t, ref)
    assert _duties(t) == _duties(ref) and t["temp_gpu"] == ref["temp_gpu"], (t, ref)
    pm = r.events(C.REASON_POWER_MONITOR_FAULT)
    assert [e["active"] for e in pm] == [True] and pm[0]["severity"] == C.SEV_WARNING, r.ev
    assert all(e["code"] == C.REASON_POWER_MONITOR_FAULT for e in r.events_since(5000))
    t = r.until(17000)  # answering again: the open driver reads it at the next tick
    assert t["faults"] == 0 and abs(t["v_in"] - 11950) < 200, t
    assert [e["active"] for e in r.events(C.REASON_POWER_MONITOR_FAULT)] == [True, False]
    assert t["state"] == C.STATE_STANDALONE and _duties(t) == _duties(twin.until(17000))


def test_ina226_missing_at_boot_is_retried_every_5s(sim):
    r = sim("ina_absent@0s-7s")
    t = r.until(9000)  # answering since 7 s, but the firmware only retries every 5 s
    assert t["faults"] == C.FAULT_POWER_MONITOR and "v_in" not in t, t
    assert t["state"] == C.STATE_STANDALONE, t
    t = r.until(12000)
    assert t["faults"] == 0 and "v_in" in t, t
    pm = [(at, e["active"]) for at, e in r.ev if e["code"] == C.REASON_POWER_MONITOR_FAULT]
    assert [a for _, a in pm] == [True, False], pm
    assert 10000 <= pm[1][0] <= 10600, pm  # booted at 0.2 s: retries at ~5.2 s and ~10.2 s
    assert max(_duties(t)) < FLOOR_BOOT, t


def test_12v_dip(sim):
    r = sim("dip:900mV/500ms@5s", "dip:900mV/1500ms@10s")
    t = r.until(4000)
    before = _duties(t)
    t = r.until(15000)
    uv = r.events(C.REASON_UNDER_VOLTAGE)
    assert [e["active"] for e in uv] == [True, False, True, False], r.ev
    assert all(e["value"] < 11400 for e in uv[0::2]), uv  # the rail voltage at the alert
    assert all(e["value"] > 11400 for e in uv[1::2]), uv
    assert uv[0]["severity"] == C.SEV_ALARM
    during = [f for at, f in r.tel if 10000 < at <= 11500]
    assert any(f["faults"] & C.FAULT_UNDER_VOLTAGE and f["v_in"] < 11400 for f in during), r.tel
    assert t["faults"] == 0 and t["v_in"] > 11900, t  # set, then cleared
    assert t["state"] == C.STATE_STANDALONE and _duties(t) == before, (t, before)
    assert all(e["code"] == C.REASON_UNDER_VOLTAGE for e in r.events_since(5000)), r.ev


def test_host_silence(sim):
    r = sim("host_silence@10s-20s", heartbeat_until=30000)  # the host never stops sending
    t = r.until(9000)
    assert t["state"] == C.STATE_HOSTED and t["reason"] == C.REASON_HOST_OK, t
    t = r.until(14000)
    assert t["state"] == C.STATE_HOSTED, t  # the last heartbeat got through at 9 s
    t = r.until(16000)
    assert t["state"] == C.STATE_STANDALONE and t["reason"] == C.REASON_HOST_TIMEOUT, t
    assert t["faults"] == C.FAULT_HOST_TIMEOUT, t
    assert min(_duties(t)) >= FLOOR_HOST_LOST, t
    lost = r.events(C.REASON_HOST_TIMEOUT)
    assert len(lost) == 1 and lost[0]["prev_state"] == C.STATE_HOSTED, r.ev
    assert lost[0]["severity"] == C.SEV_WARNING
    assert r.vm.host_bytes_dropped > 0
    t = r.until(23000)  # heard again
    assert t["state"] == C.STATE_HOSTED and t["faults"] == 0, t
    assert len(r.events(C.REASON_HOST_OK, state=C.STATE_HOSTED)) == 2, r.ev


def test_telemetry_freeze_repeats_one_frame_byte_for_byte(sim):
    r = sim("telemetry_freeze@3s-8s")
    r.until(8000)
    freeze = r.vm.__dict__["_relay_tx"]  # in front of the runner's relay while on
    during = [f for t, f in r.tel if t >= 3100]
    assert len(during) >= 3 and all(f == during[0] for f in during), during
    assert freeze.repeated >= 3 and freeze.frame.endswith(b"\x00")
    assert r.vm.telemetry_count >= len(during)  # the tap saw every repeated frame
    t = r.until(11000)
    assert "_relay_tx" not in r.vm.__dict__  # the runner's own relay again
    assert t["uptime_s"] > during[0]["uptime_s"] + 5, (t, during[0])  # the firmware ran on
    assert t["state"] == C.STATE_STANDALONE and t["faults"] == 0, t  # nothing else happened


def test_mcu_reset_keeps_the_config(sim):
    r = sim("mcu_reset@6s")
    r.until(2000)
    r.vm.host_write(r.vm.encode("setpoints", {"sp_gpu": 65000}, 1))
    r.vm.host_write(r.vm.encode("config_save", {}, 2))
    r.until(3000)
    assert [f["ref"] for n, f in r.vm.messages if n == "ack"] == [1, 2]
    t = r.until(10000)
    vm = r.vm
    assert vm.banners == 2 and len(vm.hellos) == 2 and vm.resets == ["power"], vm.stats()
    assert vm.hellos[1]["uid"] == vm.hellos[0]["uid"]
    after = [f for at, f in r.tel if at > 6000]
    assert after[0]["state"] == C.STATE_BOOT and min(_duties(after[0])) >= FLOOR_BOOT, after
    assert t["state"] == C.STATE_STANDALONE and t["reason"] == C.REASON_BOOT, t
    boot = r.events(C.REASON_BOOT, since=6000)
    assert [(e["prev_state"], e["state"]) for e in boot] == [(C.STATE_BOOT, C.STATE_STANDALONE)], (
        r.ev
    )
    assert max(_duties(t)) < FLOOR_BOOT, t
    vm.host_write(frame.encode_frame("config_get", {"section": "channels.0"}, 3))
    r.until(11000)
    cfg = [f for n, f in vm.messages if n == "config"][-1]["values"]
    assert cfg["channels.0.setpoint_mc"] == 65000, cfg  # persisted across the reset
    assert len(r.pids) == 2, r.pids  # a new process


def test_gpu_lost_is_not_the_modules_business(sim):
    r = sim("gpu_lost@5s", profile=Profile.parse("hold 650W 1min\n"))
    r.until(4000)
    gpu = r.vm.world.gpu
    assert gpu.power_w() > 600
    n0 = r.vm.telemetry_count
    t = r.until(15000)
    assert gpu.lost
    with pytest.raises(GpuLost):
        gpu.temperature_c()
    with pytest.raises(GpuLost):
        gpu.power_w()
    assert r.vm.world.faults()["gpu_lost"] is True
    # the firmware knows nothing about NVML: it goes on cooling what its NTCs say
    assert r.vm.mcu_state == "running" and r.vm.telemetry_count >= n0 + 10
    assert t["state"] == C.STATE_STANDALONE and t["faults"] == 0, t
    assert r.events_since(5000) == [], r.ev
    assert min(_duties(t)) >= 13107 and t["fan1_rpm"] > 0, t  # still turning (min duty)
    assert "temp_gpu" in t and t["p_in"] < 200000, t  # the lost GPU idles: less power


def test_no_micropython_left(sim, tmp_path):
    r = sim()
    r.until(1500)
    pid = r.vm._proc.pid
    r.stop()
    assert not _alive(pid)
    assert not os.path.lexists(r.vm.port_symlink)


def test_fleet_start_applies_the_schedule_in_its_thread(tmp_path):
    fleet = SimFleet(2, speed=0, state_dir=tmp_path, faults=["m1:gpu_lost@2s", "ina_absent@3s"])
    fleet.start()
    try:
        end = time.monotonic() + 20
        while fleet.now_ms < 6000 and time.monotonic() < end:
            time.sleep(0.02)
        gpus = [vm.world.gpu.lost for vm in fleet.modules]
        tel = [vm.last_telemetry for vm in fleet.modules]
        pids = [vm._proc.pid for vm in fleet.modules]
    finally:
        fleet.stop()
    assert gpus == [False, True], gpus
    assert all(t["faults"] == C.FAULT_POWER_MONITOR for t in tel), tel
    assert [a.t_ms for a, _ in fleet.schedule.done] == [2000, 3000]
    assert not [p for p in pids if _alive(p)], pids
