"""The virtual module: the real firmware in ``micropython`` on the sim board, lockstepped
with a simulated world, its protocol port on a pty that pyserial opens.

Most tests drive the runner with ``run_for`` in the test's thread (fast and
deterministic); one runs the paced background thread. Every test stops its modules;
the last one checks that no ``micropython`` process survived.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
import serial
from fakehal import adc_code

from modbridge.sim import World, load_params
from modbridge.sim import link as L
from modbridge.sim.runner import VirtualModule, stage_mpy, unique_id
from protocol import catalog as C
from protocol import frame

HB = {"gpu_temp": 60000, "gpu_power": 300000}
REPO = Path(__file__).resolve().parent.parent


class StubWorld:
    """The smallest world with the runner's interface (``ina_absent`` as a bool)."""

    def __init__(self, params=None, seed=0, profile=None):
        self.now_ms = 0
        self.duties = [0, 0]
        self.ina_absent = False
        self.temps_c = [45.0, 50.0, 55.0, 25.0]
        self.gpu = None
        self._rng = random.Random(seed)
        self._pulses = [0.0, 0.0]
        self._taken = [0, 0]

    def set_duties(self, d1, d2):
        self.duties = [d1, d2]

    def step(self, dt_ms):
        self.now_ms += dt_ms
        for i in range(2):
            rpm = 3000 * self.duties[i] / 65535
            self._pulses[i] += rpm * 2 * dt_ms / 60000

    def adc_codes(self, n):
        g = self._rng.gauss
        return [[adc_code(t + g(0, 0.05)) for _ in range(n)] for t in self.temps_c]

    def ina226_inputs(self):
        return 12000, 5000 + round(self._rng.gauss(0, 20))

    def tach_pulses(self):
        out = []
        for i in range(2):
            whole = int(self._pulses[i])
            out.append(whole - self._taken[i])
            self._taken[i] = whole
        return out

    def snapshot(self):
        return {"t_ms": self.now_ms, "fan_duty": list(self.duties)}


def _world(seed):
    """The default world in the steady state of fans at 30 % (it is built with them
    stopped, hot enough for the firmware's over-temperature fail-safe)."""
    w = World(load_params("default"), seed=seed)
    w.set_duties(19661, 19661)
    w.equilibrate()
    return w


@pytest.fixture
def make_vm(tmp_path):
    made = []

    def make(world=None, seed=1, name="vm", **kw):
        if world is None:
            world = _world(seed)
        kw.setdefault("speed", 0)
        vm = VirtualModule(
            world, tmp_path / name, seed=seed, port_symlink=tmp_path / (name + ".port"), **kw
        )
        made.append(vm)
        return vm

    yield make
    for vm in made:
        vm.stop()


def _hb(vm, seq):
    """A heartbeat signed the way a host signs it (vm.encode: the module's key and the
    nonce of its last hello)."""
    return vm.encode("heartbeat", HB, seq)


def _read_port(ser, quiet_s=0.1, max_s=3.0):
    """Everything the port delivers until it has been quiet for ``quiet_s``."""
    out = b""
    end = time.monotonic() + max_s
    last = time.monotonic()
    while time.monotonic() < end:
        n = ser.in_waiting
        if n:
            out += ser.read(n)
            last = time.monotonic()
        elif time.monotonic() - last > quiet_s:
            break
        else:
            time.sleep(0.005)
    return out


def _read_until(ser, marker, max_s=10.0):
    out = b""
    end = time.monotonic() + max_s
    while marker not in out and time.monotonic() < end:
        out += ser.read(max(1, ser.in_waiting))
    return out


def _decode(data):
    return [m for m in frame.StreamDecoder(accept=C.D2H).feed(data) if m.ok]


def _open(path):
    return serial.Serial(str(path), 115200, timeout=1)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone: it runs nothing
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- boot, telemetry


def test_boot_banner_and_hello_reach_pyserial(make_vm):
    vm = make_vm()
    ser = _open(vm.port_symlink)  # opened before power-up: pyserial flushes on open
    try:
        vm.run_for(1500)
        data = _read_port(ser)
    finally:
        ser.close()
    assert data.startswith(b"MODULER READY v"), data[:40]
    msgs = _decode(data)
    assert msgs[0].name == "hello", msgs[:2]
    hello = msgs[0].fields
    assert hello["board"] == "sim" and hello["uid"] == vm.uid.hex(), hello
    assert any(m.name == "telemetry" for m in msgs)
    assert vm.banners == 1 and vm.hellos == [hello]
    assert os.path.realpath(vm.port_symlink) == vm.port


def test_unique_ids_differ_per_seed_and_instance():
    ids = {unique_id(s, i) for s in (0, 1) for i in (0, 1, 2)}
    assert len(ids) == 6 and all(len(u) == 12 for u in ids)


def test_telemetry_follows_the_world(make_vm):
    vm = make_vm()
    vm.run_for(10000)
    per_10s = 10000 // vm.hellos[0]["telemetry_ms"]  # the firmware's period, from its hello
    assert per_10s - 1 <= vm.telemetry_count <= per_10s + 1, vm.telemetry_count
    t = vm.last_telemetry
    snap = vm.world.snapshot()
    assert abs(t["temp_gpu"] - snap["ntc_gpu_c"] * 1000) < 1500, (t, snap)
    assert abs(t["temp_amb"] - snap["ntc_amb_c"] * 1000) < 1500, (t, snap)
    assert abs(t["v_in"] - snap["rail_v"] * 1000) < 50, (t, snap)
    assert abs(t["fan1_rpm"] - snap["fan_rpm"][0]) < 0.15 * snap["fan_rpm"][0] + 120, (t, snap)
    assert vm.world.duties[0] == vm.world.duties[1] and vm.world.duties[0] >= 13107
    st = vm.stats()
    assert st["exchanges"] >= 100 and st["bytes_to_host"] > 0 and st["boots"] == 1, st


def test_stub_world_and_ina_absent(make_vm):
    world = StubWorld(seed=3)
    vm = make_vm(world=world)
    vm.run_for(3000)
    t = vm.last_telemetry
    assert t["v_in"] == 12000 and not t["faults"] & C.FAULT_POWER_MONITOR, t
    assert abs(t["temp_gpu"] - 45000) < 500, t
    world.ina_absent = True
    vm.run_for(2000)
    assert vm.last_telemetry["faults"] & C.FAULT_POWER_MONITOR, vm.last_telemetry
    world.ina_absent = False
    vm.run_for(2000)
    assert not vm.last_telemetry["faults"] & C.FAULT_POWER_MONITOR, vm.last_telemetry


def test_world_faults_pass_through(make_vm):
    vm = make_vm()
    vm.run_for(2000)
    vm.world_fault("ina_absent", True)
    vm.run_for(2000)
    assert vm.last_telemetry["faults"] & C.FAULT_POWER_MONITOR, vm.last_telemetry


# --------------------------------------------------------------------------- host link


def test_heartbeats_on_the_pty_make_it_hosted_and_silence_standalone(make_vm):
    vm = make_vm()
    ser = _open(vm.port_symlink)
    try:
        seq = 0
        vm.run_for(300)  # the boot hello: its nonce signs the heartbeats

        def seconds(n):
            nonlocal seq
            for _ in range(n):
                seq += 1
                ser.write(_hb(vm, seq))
                ser.flush()
                vm.run_for(1000)

        seconds(3)
        assert vm.last_telemetry["state"] == C.STATE_HOSTED, vm.last_telemetry
        assert vm.bytes_from_host > 0
        vm.host_silence(True)
        seconds(4)
        assert vm.last_telemetry["state"] == C.STATE_HOSTED  # within the 5 s timeout
        seconds(3)
        assert vm.last_telemetry["state"] == C.STATE_STANDALONE, vm.last_telemetry
        assert vm.host_bytes_dropped > 0
        vm.host_silence(False)
        seconds(2)
        assert vm.last_telemetry["state"] == C.STATE_HOSTED, vm.last_telemetry
    finally:
        ser.close()


def test_unplug_and_replug(make_vm):
    vm = make_vm()
    link = vm.port_symlink
    ser = _open(link)
    vm.run_for(1500)
    assert _read_port(ser)
    vm.unplug()
    with pytest.raises(serial.SerialException):
        ser.read(1)
    assert ser.is_open  # as with a real CH340 unplug: the handle still claims to be open
    ser.close()
    assert not os.path.lexists(link)
    vm.run_for(2000)  # the firmware goes on; its bytes go nowhere
    assert vm.tx_dropped > 0
    vm.replug()
    assert os.path.realpath(link) == vm.port
    ser = _open(link)
    try:
        vm.run_for(2000)
        msgs = _decode(_read_port(ser))
    finally:
        ser.close()
    assert any(m.name == "telemetry" for m in msgs), msgs


# --------------------------------------------------------------------------- resets


def _command(vm, name, fields=None, seq=1):
    vm.host_write(vm.encode(name, fields, seq))


def _replies(vm, name):
    return [f for n, f in vm.messages if n == name]


def test_mcu_reset_reboots_with_the_saved_config(make_vm):
    vm = make_vm()
    vm.run_for(1000)
    _command(vm, "setpoints", {"sp_gpu": 65000}, seq=1)
    _command(vm, "config_save", seq=2)
    vm.run_for(500)
    assert [a["ref"] for a in _replies(vm, "ack")] == [1, 2], list(vm.messages)
    assert (vm.fs_dir / "config.json").exists() or any(vm.fs_dir.iterdir())
    vm.mcu_reset()
    vm.run_for(1500)
    assert vm.banners == 2 and len(vm.hellos) == 2 and vm.resets == ["power"]
    _command(vm, "config_get", {"section": "channels.0"}, seq=3)
    vm.run_for(500)
    cfg = _replies(vm, "config")[-1]["values"]
    assert cfg["channels.0.setpoint_mc"] == 65000, cfg


def test_watchdog_starvation_resets_the_mcu(make_vm):
    vm = make_vm()
    vm.run_for(3000)
    t0 = vm.sim_time_ms
    vm.starve_watchdog()
    vm.run_for(3000)
    assert vm.resets == ["watchdog"], vm.resets
    assert 1800 <= vm.reset_times[0] - t0 <= 2100, (vm.reset_times, t0)
    assert vm.banners == 2
    codes = [e["code"] for e in vm.events]
    assert C.REASON_WATCHDOG_RESET in codes, vm.events
    vm.run_for(3000)  # the flag went with the reset: fed again, no second reset
    assert vm.resets == ["watchdog"]


def test_repl_command_resets_into_the_repl(make_vm):
    """A started watchdog cannot be stopped: the firmware flags the next boot to stay at
    the REPL and resets; that boot hands the port back and starts no watchdog."""
    vm = make_vm()
    vm.run_for(1000)
    _command(vm, "repl", seq=9)
    vm.run_for(1000)
    assert _replies(vm, "ack")[-1]["ref"] == 9
    assert vm.resets == ["soft"], vm.stats()
    assert vm.mcu_state == "repl" and vm.halt_reason == "repl command", vm.stats()
    vm.run_for(5000)  # nothing to feed, and nothing started: no watchdog reset
    assert vm.resets == ["soft"], vm.stats()
    kinds = [e.kind for e in vm.mcu_events]
    assert kinds == ["running", "reset", "repl"], [e.text for e in vm.mcu_events]
    assert vm.mcu_status == "at the REPL: repl command"


def test_reboot_command_is_a_soft_reset(make_vm):
    vm = make_vm()
    vm.run_for(1000)
    _command(vm, "reboot", seq=4)
    vm.run_for(1000)
    assert vm.resets == ["soft"] and vm.banners == 2, vm.stats()


# --------------------------------------------------------------------------- firmware trouble

FAKE_MAIN = """
import os

from boards.sim import make_hal


def run(board):
    hal = make_hal()
    wdt = hal.wdt_start(1000)
    n = 0
    while True:
        if os.getenv("SIM_TEST_MODE") == "hang" and n >= 3:
            while True:
                pass
        if os.getenv("SIM_TEST_MODE") == "crash" and n >= 3:
            raise RuntimeError("boom")
        wdt.feed()
        hal.sleep_ms(100)
        n += 1
"""


@pytest.fixture
def fake_firmware(tmp_path):
    """A code root whose device.main boots the sim board, then hangs or crashes."""
    root = tmp_path / "fw"
    for rel in ("boards/__init__.py", "boards/sim.py", "boards/sim_ina226.py", "device/ticks.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text((REPO / rel).read_text())
    (root / "device" / "__init__.py").write_text("")
    (root / "device" / "main.py").write_text(FAKE_MAIN)
    return root


def test_hung_firmware_is_killed_and_the_watchdog_resets_it(make_vm, fake_firmware, monkeypatch):
    monkeypatch.setenv("SIM_TEST_MODE", "hang")
    vm = make_vm(code_root=fake_firmware, hang_timeout_s=0.5)
    vm.run_for(1300)  # boots at 200 ms; feeds at 200, 300, 400; hangs at 500
    assert "hangs" in vm.last_crash
    assert vm.resets == ["watchdog"] and vm.reset_times == [1400], vm.reset_times
    texts = [e.text for e in vm.mcu_events]
    assert texts[0].startswith("halted: no request for 0.5 s") and "hangs" in texts[0], texts
    assert texts[1] == "reset: watchdog (not fed for 1000 ms)", texts


def test_crashed_firmware_halts_with_its_traceback(make_vm, fake_firmware, monkeypatch):
    monkeypatch.setenv("SIM_TEST_MODE", "crash")
    vm = make_vm(code_root=fake_firmware)
    with _open(vm.port_symlink) as ser:  # open first: pyserial's open flushes the input
        vm.run_for(1000)  # crashes at 500 ms, after its last feed at 400
        seen = _read_until(ser, b">>> ")  # the traceback on the port, then the REPL
    assert "RuntimeError: boom" in vm.last_crash, vm.last_crash
    assert vm.mcu_state == "repl" and vm.resets == [], vm.stats()  # a board's REPL
    assert vm.halt_reason == "the firmware crashed: RuntimeError: boom", vm.halt_reason
    assert b'\r\nRuntimeError: boom\r\nMicroPython v1.' in seen, seen[-300:]
    assert seen.endswith(b'Type "help()" for more information.\r\n>>> '), seen[-300:]
    vm.run_for(300)  # the fans keep their last duty; the watchdog bites at 1400
    assert vm.resets == ["watchdog"] and vm.reset_times == [1400], vm.stats()
    assert "RuntimeError: boom" in (vm.state_dir / "mcu.log").read_text()


def test_runs_from_a_staged_mpy_build_and_records_the_link(make_vm, tmp_path):
    root = stage_mpy(tmp_path / "stage")
    assert (root / "boards" / "sim_ina226.mpy").exists()
    # the 64-bit unix port needs ~1.5-2x an MCU's heap (bench: min_heapsize_kb_mpy)
    vm = make_vm(code_root=root, heapsize="384k", link_path=tmp_path / "link.bin")
    vm.run_for(3000)
    assert vm.telemetry_count >= 2 and vm.mcu_state == "running", vm.stats()
    vm.stop()
    msgs = list(L.iter_messages((tmp_path / "link.bin").read_bytes()))
    assert msgs[0][:2] == (L.MAGIC_REQ, L.REQ_BOOT) and msgs[1][:2] == (L.MAGIC_REP, L.REP_BOOT)
    assert len(msgs) == 2 * (vm.boots + vm.exchanges), (len(msgs), vm.exchanges)
    small = make_vm(code_root=root, heapsize="64k", name="small")
    small.run_for(500)
    assert small.mcu_state == "repl" and "MemoryError" in small.last_crash, small.stats()
    assert small.halt_reason.startswith("the firmware crashed: MemoryError"), small.halt_reason


# --------------------------------------------------------------------------- determinism, speed


def _recorded_run(make_vm, seed, name):
    vm = make_vm(seed=seed, name=name, record_tx=True)
    vm.power_on()
    for s in range(60):
        if 1 <= s < 40:  # heartbeats for 40 s (once the hello's nonce is in), then quiet
            vm.host_write(_hb(vm, s))
        vm.run_for(1000)
    data = bytes(vm.tx_log)
    vm.stop()
    return data


def _without_hellos(data):
    """The frames of a stream, minus the hellos: each boot's nonce is random by design."""
    frames = [f + b"\x00" for f in data.split(b"\x00")]
    return [f for f in frames if not (_decode(f) and _decode(f)[0].name == "hello")]


def test_same_seed_same_input_same_bytes(make_vm):
    a = _recorded_run(make_vm, 7, "a")
    b = _recorded_run(make_vm, 7, "b")
    c = _recorded_run(make_vm, 8, "c")
    msgs = _decode(a)
    assert sum(m.name == "telemetry" for m in msgs) >= 59
    states = [m.fields["state"] for m in msgs if m.name == "telemetry"]
    assert C.STATE_HOSTED in states and states[-1] == C.STATE_STANDALONE, states
    assert _without_hellos(a) == _without_hellos(b)
    assert sum(m.name == "hello" for m in msgs) == 1
    assert a != c  # another seed: another uid and other noise


def test_speed_at_max(make_vm, record_property):
    vm = make_vm()
    vm.power_on()
    t = time.perf_counter()
    vm.run_for(120000)
    wall = time.perf_counter() - t
    ratio = 120.0 / wall
    record_property("sim_seconds_per_wall_second", round(ratio, 1))
    print(f"\nvirtual module at max speed: {ratio:.0f} simulated s per wall s")
    assert vm.telemetry_count >= 119


# --------------------------------------------------------------------------- threaded


def test_background_thread_paced_and_cleaned_up(make_vm):
    vm = make_vm(speed=20)
    ser = _open(vm.port_symlink)
    t0 = time.monotonic()
    vm.start()
    pid = vm._proc.pid
    try:
        data = b""
        while b"MODULER READY" not in data and time.monotonic() - t0 < 10:
            data += ser.read(256)
        assert b"MODULER READY" in data
        time.sleep(0.5)
        vm.host_silence(True)  # faults work while the thread runs
        wall = time.monotonic() - t0
        sim = vm.sim_time_ms
        assert sim <= 1.5 * 20 * wall * 1000 + 1000, (sim, wall)  # paced, not flat out
    finally:
        ser.close()
        vm.stop()
    assert vm.mcu_state == "off" and vm.port is None
    assert not os.path.lexists(vm.port_symlink)
    assert not _alive(pid)
    vm.stop()  # idempotent


# --------------------------------------------------------------------------- signing keys


def test_provisioned_like_a_paired_board_and_kept_across_runs(make_vm, tmp_path):
    from modbridge.link import keys as K
    from modbridge.sim.runner import SimError

    vm = make_vm(name="p")
    key = vm.key
    assert key is not None and vm.key_path == vm.fs_dir / "secret.key"
    assert vm.host_key_path == tmp_path / "p" / "host-keys" / f"{vm.uid.hex()}.key"
    assert K.read_key_file(vm.host_key_path) == key  # 0600, 32 bytes
    assert K.KeyStore(tmp_path / "elsewhere").load(vm.uid.hex()) == key  # attached
    with pytest.raises(SimError, match="no hello from the firmware yet"):
        vm.encode("heartbeat", HB, 1)
    vm.run_for(500)
    assert vm.hellos[-1]["paired"] is True and vm.nonce == vm.hellos[-1]["nonce"]
    assert vm.encode("config_get", None, 1) == frame.encode_frame("config_get", {}, 1)
    vm.stop()
    assert K.KeyStore(tmp_path / "elsewhere").load(vm.uid.hex()) is None  # detached
    again = make_vm(name="p")  # same state dir: the module keeps its secret
    assert again.key == key and K.read_key_file(again.host_key_path) == key
    bare = make_vm(name="bare", provision=False)
    assert bare.key is None and bare.host_key_path is None
    bare.run_for(500)
    assert bare.hellos[-1]["paired"] is False
    with pytest.raises(SimError, match="no secret"):
        bare.encode("heartbeat", HB, 1)


def test_unsigned_commands_are_refused_by_the_firmware(make_vm):
    vm = make_vm()
    vm.run_for(500)
    vm.host_write(frame.encode_frame("setpoints", {"sp_gpu": 65000}, 1))
    vm.host_write(vm.encode("setpoints", {"sp_gpu": 65000}, 2))
    vm.run_for(500)
    nacks = _replies(vm, "nack")
    assert [(n["ref"], n["code"]) for n in nacks] == [(1, C.ERR_UNAUTHORIZED)], nacks
    assert [a["ref"] for a in _replies(vm, "ack")] == [2]


def test_a_fleet_keeps_every_modules_key_in_one_store(tmp_path):
    from modbridge.link import keys as K
    from modbridge.sim.fleet import SimFleet

    fleet = SimFleet(2, speed=0, state_dir=tmp_path / "st", settle_duty=None)
    try:
        assert fleet.keys.dir == tmp_path / "st" / "keys"
        uids = [vm.uid.hex() for vm in fleet.modules]
        assert sorted(fleet.keys.uids()) == sorted(uids)
        for vm in fleet.modules:
            assert fleet.keys.load(vm.uid.hex()) == vm.key
        assert fleet.modules[0].key != fleet.modules[1].key
        assert K.KeyStore(tmp_path / "other").load(uids[0]) == fleet.modules[0].key
    finally:
        fleet.stop()
    assert K.KeyStore(tmp_path / "other").load(uids[0]) is None
