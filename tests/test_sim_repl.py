"""The virtual module's MicroPython REPL, driven by the real mpremote.

One virtual module (the real firmware, paced at 10x) serves the whole module: a
``repl`` command puts it at the REPL, ``.venv/bin/mpremote`` (a subprocess, as a
person runs it) execs, lists and copies files, keeps state with ``resume``, soft-resets
and resets it back to the firmware; against the running firmware it must fail, and
the sim says why. The tests run in file order on that one module. The REPL emulation
alone (``modbridge.sim.repl.Repl``) is fed mpremote's exact byte sequences and garbage
(hypothesis) with a fake interpreter, and nasty code with the real one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import serial
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from modbridge.errors import ModbridgeError
from modbridge.sim import World, load_params
from modbridge.sim import repl as R
from modbridge.sim.runner import MICROPYTHON_MISSING, McuEvent, VirtualModule
from modbridge.tools import mpy

MPREMOTE = str(Path(sys.executable).with_name("mpremote"))
RAW_PROMPT = R.RAW_BANNER + b">"


def _world(seed=1):
    w = World(load_params("default"), seed=seed)
    w.set_duties(19661, 19661)
    w.equilibrate()
    return w


def mpremote(port, *args, timeout=60):
    """``mpremote connect <port> args...``: (exit code, stdout, stderr)."""
    r = subprocess.run(
        [MPREMOTE, "connect", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return r.returncode, r.stdout, r.stderr


def _to_repl(vm, seq):
    n = vm.mcu_event_count
    vm.host_write(vm.encode("repl", {}, seq))
    ev = vm.wait_mcu_event("repl", after=n, timeout=30)
    assert ev is not None, [e.text for e in vm.mcu_events]
    return ev


def _read_until(ser, marker: bytes, limit_s=20.0) -> bytes:
    out = b""
    end = time.monotonic() + limit_s
    while marker not in out and time.monotonic() < end:
        out += ser.read(max(1, ser.in_waiting))
    return out


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    d = tmp_path_factory.mktemp("repl-vm")
    m = VirtualModule(_world(), d / "vm", speed=10, seed=1, port_symlink=d / "module.tty")
    m.start()
    try:
        assert m.wait_mcu_event("running", timeout=30) is not None, m.stats()
        yield m
    finally:
        m.stop()


# --------------------------------------------------------------------------- mpremote


def test_repl_command_lands_at_the_repl_and_says_so(vm):
    ev = _to_repl(vm, seq=1)
    assert ev.text == "at the REPL: repl command"
    assert vm.mcu_state == "repl" and vm.mcu_status == "at the REPL: repl command"
    kinds = [e.kind for e in vm.mcu_events]
    # the firmware could not stop its watchdog: flag, reset, the next boot stays
    assert kinds[-3:] == ["running", "reset", "repl"], [e.text for e in vm.mcu_events]
    assert vm.mcu_events[-3].text == "running firmware v0.1.0 (reset cause: power)"
    assert not (vm.fs_dir / "repl.flag").exists()  # the boot that read it removed it


def test_exec_on_the_symlink_and_on_the_pty(vm):
    assert mpremote(vm.port_symlink, "exec", "print(1+1)") == (0, "2\n", "")
    # a /dev/pts path: mpremote reads it the blocking way (its QEMU case)
    assert mpremote(vm.port, "exec", "print('pty', 6*7)") == (0, "pty 42\n", "")


def test_fs_is_the_module_flash_directory(vm, tmp_path):
    rc, out, err = mpremote(vm.port_symlink, "fs", "ls")
    assert rc == 0, err
    assert "          32 secret.key" in out.splitlines(), out  # its size, as on a board
    local = tmp_path / "secret.bin"
    assert mpremote(vm.port_symlink, "fs", "cp", ":secret.key", str(local))[0] == 0
    assert local.read_bytes() == vm.key
    src = tmp_path / "notes.json"
    src.write_text('{"owner": "lab 3"}\n')
    assert mpremote(vm.port_symlink, "fs", "cp", str(src), ":notes.json")[0] == 0
    assert (vm.fs_dir / "notes.json").read_text() == '{"owner": "lab 3"}\n'
    rc, out, _ = mpremote(vm.port_symlink, "fs", "cat", "notes.json")
    assert (rc, out) == (0, '{"owner": "lab 3"}\n')
    rc, out, _ = mpremote(vm.port_symlink, "exec", "import os; print(sorted(os.listdir('/')))")
    assert out == "['notes.json', 'secret.key']\n", out  # "/" is the flash, not the host
    assert mpremote(vm.port_symlink, "fs", "rm", ":notes.json")[0] == 0
    assert not (vm.fs_dir / "notes.json").exists()


def test_state_persists_within_a_session_and_with_resume(vm):
    assert mpremote(vm.port_symlink, "exec", "x = 41")[0] == 0
    assert mpremote(vm.port_symlink, "resume", "exec", "print(x + 1)") == (0, "42\n", "")
    assert mpremote(vm.port_symlink, "exec", "y = 7", "exec", "print(y * 6)")[:2] == (0, "42\n")
    # without resume mpremote soft-resets first: a fresh interpreter, as on a board
    rc, out, _ = mpremote(vm.port_symlink, "exec", "print(x)")
    assert rc == 1 and "NameError: name 'x' isn't defined" in out, out


def test_an_exception_is_the_raw_repl_error_text(vm):
    rc, out, _ = mpremote(vm.port_symlink, "eval", "1/0")
    assert rc == 1
    assert out.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<stdin>", line 1, in <module>',
        "ZeroDivisionError: divide by zero",
    ]


def test_machine_at_the_repl_is_the_boards(vm):
    code = "import machine; print(machine.unique_id().hex(), machine.reset_cause())"
    rc, out, _ = mpremote(vm.port_symlink, "exec", code)
    assert (rc, out) == (0, f"{vm.uid.hex()} 5\n")  # the repl command's soft reset


def test_soft_reset_is_the_raw_repls_and_stays(vm):
    n = vm.mcu_event_count
    assert mpremote(vm.port_symlink, "soft-reset")[0] == 0
    ev = vm.wait_mcu_event("soft_reset", after=n, timeout=10)
    assert ev is not None and "raw REPL" in ev.text and "main.py not run" in ev.text
    time.sleep(0.3)  # would a firmware come up? (no: micropython#2249, by design)
    assert vm.mcu_state == "repl", [e.text for e in vm.mcu_events]
    assert vm.wait_mcu_event("running", after=n, timeout=0.01) is None


def test_reset_restarts_the_firmware(vm):
    n, hellos, boots = vm.mcu_event_count, len(vm.hellos), vm.boots
    rc, _, err = mpremote(vm.port_symlink, "reset")  # exec machine.reset(), no follow
    assert rc == 0, err
    ev = vm.wait_mcu_event("running", after=n, timeout=30)
    assert ev is not None, [e.text for e in vm.mcu_events]
    assert ev.text == "running firmware v0.1.0 (reset cause: soft)"
    reset = vm.wait_mcu_event("reset", after=n, timeout=1)
    assert reset.why == "soft (machine.reset() at the REPL)"
    assert len(vm.hellos) > hellos and vm.boots == boots + 1
    assert vm.mcu_state == "running"


def test_mpremote_fails_against_the_running_firmware_with_a_note(vm):
    n, tel, resets = vm.mcu_event_count, vm.telemetry_count, list(vm.resets)
    rc, out, err = mpremote(vm.port_symlink, "exec", "print(1)")  # ~10 s: mpremote's timeout
    assert rc != 0 and "could not enter raw repl" in out + err, (rc, out, err[-500:])
    note = vm.wait_mcu_event("note", after=n, timeout=1)
    assert note is not None
    assert 'the firmware owns the port: send `repl` first (modbridge repl / {"type":"repl"})' in (
        note.text
    )
    # Ctrl-C without a command did not stop the cooling firmware
    assert vm.mcu_state == "running" and vm.resets == resets
    assert vm.telemetry_count > tel
    assert vm.wait_mcu_event("repl", after=n, timeout=0.01) is None


def test_friendly_repl_and_its_soft_reset_run_the_firmware_again(vm):
    _to_repl(vm, seq=2)
    with serial.Serial(str(vm.port_symlink), 115200, timeout=0.2) as ser:
        ser.reset_input_buffer()
        ser.write(b"\r")
        assert _read_until(ser, b">>> ").endswith(b"\r\n>>> ")
        ser.write(b"for i in range(3):\r")
        assert _read_until(ser, b"... ").endswith(b"for i in range(3):\r\n... ")
        ser.write(b"  print(i * i)\r\r")
        assert _read_until(ser, b"4\r\n>>> ").endswith(b"0\r\n1\r\n4\r\n>>> ")
        # a flag left at the REPL keeps the next boot there, as on a board
        ser.write(b"open('repl.flag', 'w').write('1')\r")
        assert _read_until(ser, b"1\r\n>>> ").endswith(b"1\r\n>>> ")
        n = vm.mcu_event_count
        ser.write(b"\x04")
        assert b"MPY: soft reboot\r\n" in _read_until(ser, b"MPY: soft reboot\r\n")
        again = vm.wait_mcu_event("repl", after=n, timeout=30)
        assert again is not None and vm.wait_mcu_event("running", after=n, timeout=0.01) is None
        assert vm.wait_mcu_event("soft_reset", after=n, timeout=1).why.startswith(
            "from the friendly REPL"
        )
        assert not (vm.fs_dir / "repl.flag").exists()
        assert b"staying at the REPL after a repl command" in _read_until(ser, b">>> ")
        # now without the flag: main.py runs the firmware, which says hello
        n, hellos = vm.mcu_event_count, len(vm.hellos)
        ser.write(b"\x04")
        ev = vm.wait_mcu_event("running", after=n, timeout=30)
        assert ev is not None, [e.text for e in vm.mcu_events]
        assert b"MODULER READY v0.1.0" in _read_until(ser, b"MODULER READY")
        assert len(vm.hellos) > hellos and vm.mcu_state == "running"


# --------------------------------------------------------------------------- the runner alone


def test_mcu_events_unplug_and_power_off(tmp_path):
    seen = []
    m = VirtualModule(_world(), tmp_path / "vm", speed=0, port_symlink=tmp_path / "p.tty")
    m.on_mcu_event = seen.append
    m.unplug()
    m.unplug()  # already gone: no second line
    m.replug()
    m.stop()  # never powered on: nothing to power off
    assert [e.kind for e in seen] == ["unplugged", "plugged"]
    assert seen[0].text == "unplugged: the port is gone (the MCU keeps running)"
    assert seen[1].text.startswith("plugged in: /dev/pts/")
    assert [e.seq for e in seen] == [1, 2]


def test_mcu_event_lines():
    assert McuEvent(1, 0, "running", "power", "0.1.0").text == (
        "running firmware v0.1.0 (reset cause: power)"
    )
    assert McuEvent(2, 0, "repl", "the firmware crashed: OSError: 5").text == (
        "at the REPL: the firmware crashed: OSError: 5"
    )
    assert McuEvent(3, 0, "halted", "hangs").text == "halted: hangs"
    assert McuEvent(4, 0, "soft_reset", "x").text == "soft reset: x"
    assert McuEvent(5, 0, "off").text == "powered off"


def test_missing_micropython_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROPYTHON", str(tmp_path / "no-such-micropython"))
    with pytest.raises(ModbridgeError) as e:
        VirtualModule(_world(), tmp_path / "vm", port_symlink=tmp_path / "p.tty")
    assert str(e.value).startswith(MICROPYTHON_MISSING)
    assert not (tmp_path / "p.tty").exists()  # nothing made before the error
    from modbridge.cli.main import main

    r = CliRunner().invoke(main, ["sim", "--world-duration", "1"], catch_exceptions=False)
    assert r.exit_code == 1
    assert r.stderr.startswith("modbridge sim: " + MICROPYTHON_MISSING), r.stderr
    assert "[sim] extra" in r.stderr
    assert "Traceback" not in r.output and r.stderr.count("\n") == 1


def test_modbridge_sim_prints_what_the_mcu_does():
    from modbridge.cli.main import main

    r = CliRunner().invoke(
        main, ["sim", "--speed", "max", "--world-duration", "1"], catch_exceptions=False
    )
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert lines[0].endswith("MCU: running firmware v0.1.0 (reset cause: power)"), lines
    assert lines[-1].endswith("MCU: powered off"), lines
    assert "MCU:" not in r.stdout


# --------------------------------------------------------------------------- the REPL alone


class FakeInterp:
    """The Interpreter's interface, synchronous: code ``spin...`` or with a BEL byte runs
    until Ctrl-C;
    ``b"exit"`` is SystemExit, ``b"reset"`` machine.reset(), anything else prints."""

    version = "v9.9.9"

    def __init__(self):
        self.running = None
        self.msgs = []
        self.stdout = b""
        self.alive = True
        self.fds = []
        self.ran = []

    def run(self, code, single=False):
        assert self.running is None, "run while running"
        self.ran.append((bytes(code), single))
        if code.startswith(b"spin") or b"\x07" in code:
            self.running = code
        elif code == b"exit":
            self.msgs.append((R.MSG_DONE, b"\x02"))
        elif code == b"reset":
            self.msgs.append((R.MSG_RESET, b""))
        else:
            self.stdout += b"ran %d\n" % len(code)
            self.msgs.append((R.MSG_DONE, b"\x00"))

    def interrupt(self):
        if self.running is not None:
            self.running = None
            self.msgs.append((R.MSG_DONE, b"\x01KeyboardInterrupt: \n"))

    def read_stdout(self):
        out, self.stdout = self.stdout, b""
        return out

    def messages(self):
        out, self.msgs = self.msgs, []
        return out

    def close(self):
        self.alive = False


def _fake_repl():
    made = []

    def spawn():
        made.append(FakeInterp())
        return made[-1]

    r = R.Repl(spawn)
    r.start(b"note from main.py\n")
    return r, made


def _talk(r, data):
    r.feed(data)
    r.poll()
    return r.take_output()


def test_mpremote_byte_for_byte_with_a_fake_interpreter():
    r, made = _fake_repl()
    assert r.take_output() == (
        b"note from main.py\r\nMicroPython v9.9.9; sim with MicroPython unix port\r\n"
        b'Type "help()" for more information.\r\n>>> '
    )
    # mpremote enter_raw_repl(soft_reset=True)
    assert _talk(r, b"\r\x03") == b"\r\n>>> \r\n>>> "
    assert _talk(r, b"\r\x01") == b"\r\n>>> \r\n" + RAW_PROMPT
    assert _talk(r, b"\x04") == b"OK\r\n" + R.SOFT_REBOOT + RAW_PROMPT
    assert len(made) == 2 and not made[0].alive  # a fresh interpreter
    # exec: raw paste, a 300-byte program in windows of 128
    assert _talk(r, b"\x05A\x01") == b"R\x01\x80\x00\x01"
    code = b"p" * 300
    acks = _talk(r, code[:128]) + _talk(r, code[128:256]) + _talk(r, code[256:])
    assert acks == b"\x01\x01"  # one per window consumed
    assert _talk(r, b"\x04") == b"\x04ran 300\r\n\x04\x04>"
    assert made[-1].ran == [(code, False)]
    # the plain raw REPL, an error
    made[-1].msgs.clear()
    assert _talk(r, b"abc\x04") == b"OKran 3\r\n\x04\x04>"
    # raw-paste refused for an unknown variant, then Ctrl-B to the friendly REPL
    assert _talk(r, b"\x05B\x01") == b"R\x00>"
    assert _talk(r, b"\r\x02").startswith(b"\r\nMicroPython v9.9.9")
    assert r.mode == R.FRIENDLY and r.take_output() == b""


def test_running_code_waits_for_ctrl_c_and_queues_the_rest():
    r, _ = _fake_repl()
    r.take_output()
    assert _talk(r, b"spin\r") == b"spin\r\n"
    assert r.busy == R.FRIENDLY
    r.feed(b"1\r")  # typed while it runs: waits
    r.poll()
    assert r.take_output() == b""
    out = _talk(r, b"\x03")
    r.poll()  # the waiting line ran as soon as the REPL was free again
    out += r.take_output()
    assert out == b"KeyboardInterrupt: \r\n>>> 1\r\nran 1\r\n>>> ", out


def test_friendly_soft_reset_and_machine_reset_are_actions():
    r, _ = _fake_repl()
    r.take_output()
    assert _talk(r, b"\x04") == b"\r\n" + R.SOFT_REBOOT
    assert r.action == "soft"
    assert _talk(r, b"1+1\r") == b""  # the MCU restarts: the REPL takes nothing more
    r, _ = _fake_repl()
    r.take_output()
    _talk(r, b"reset\r")
    assert r.action == "reset"
    r, _ = _fake_repl()
    r.take_output()
    assert _talk(r, b"exit\r") == b"exit\r\n" + R.SOFT_REBOOT and r.action == "soft"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(min_size=0, max_size=64), max_size=8))
@example([b"\x1b["])  # an escape sequence cut short: readline ends it at the next byte
@example([b"\x1b[5"])
@example([b"\x01\x05A\x01" + b"x" * 200])  # raw-paste, cut in the middle of the code
@example([b"\x01spin\x04"])  # code that runs until Ctrl-C
@example([b"\x05if 1:\r"])  # friendly paste mode
@example([b"if 1:\r"])  # a compound statement waiting for its next line
def test_garbage_never_raises_and_mpremote_gets_in_afterwards(chunks):
    """Whatever a host sends, feed/poll return, and mpremote's entry (Ctrl-C, then
    Ctrl-A) reaches the raw prompt, unless the garbage asked for a reset."""
    r, made = _fake_repl()
    for c in chunks:
        r.feed(c)
        r.poll()
        assert isinstance(r.take_output(), bytes)
    _talk(r, b"\r\x03")
    out = _talk(r, b"\r\x01")
    if r.action is None:
        assert out.endswith(RAW_PROMPT), (out, r.mode, r.busy)
        assert r.mode == R.RAW and r.busy is None
    assert len(r.pending) <= R.MAX_PENDING
    r.close()
    assert all(not i.alive for i in made)


@pytest.mark.parametrize(
    "src,expect",
    [
        (b"", False),
        (b"x = 1", False),
        (b"if x:", True),
        (b"if x: y()", True),
        (b"def f():\n  return 1\n", False),
        (b"@deco", True),
        (b"f(1,", True),
        (b"s = '''abc", True),
        (b"s = ')'", False),
        (b"s = '(", False),
        (b"x = 1 + \\", True),
        (b"iffy = 3", False),
        (b'd = {"a": [1,', True),
        (b"while(1):", True),
        (b"(]", True),  # each kind of bracket counted on its own, as MicroPython does
        (b'x = "a\\"b"', False),  # an escaped quote inside a string
    ],
)
def test_continue_with_input(src, expect):
    assert R.continue_with_input(src) is expect


@given(st.binary(max_size=200))
def test_continue_with_input_takes_any_bytes(src):
    assert R.continue_with_input(src) in (True, False)
    assert R.continue_with_input(src + b"\\") is True  # a trailing backslash continues


# --------------------------------------------------------------------------- the real interpreter


def _until_idle(r, limit_s=20.0):
    out = b""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        r.poll()
        out += r.take_output()
        if r.busy is None and not r.pending:
            return out
        import select

        select.select(r.fds, [], [], 0.05)
    raise AssertionError(f"the REPL is still busy: {out!r}")


def test_real_interpreter_survives_nasty_code(tmp_path):
    fs = tmp_path / "flash"
    fs.mkdir()
    (fs / "config.json").write_text("{}")
    made = []

    def spawn():
        made.append(R.Interpreter(fs, micropython=mpy.micropython_path(), uid=b"\xab\xcd"))
        return made[-1]

    r = R.Repl(spawn)
    r.start()
    assert r.take_output().startswith(b"MicroPython v1.")
    _talk(r, b"\x01")
    assert r.take_output() == b""
    nasty = [
        b"\xff\xfe\x00garbage",  # not UTF-8, a NUL
        b"print('unterminated",
        b"raise MemoryError",
        b"def f(): f()\nf()",  # RuntimeError: maximum recursion depth exceeded
        b"import sys; sys.stdout.buffer.write(bytes(range(256)))",
        b"input()",  # stdin is not the port: an error, never a hang
        b"x" * 20000,
    ]
    for code in nasty:
        r.feed(code + b"\x04")
        out = _until_idle(r)
        assert out.startswith(b"OK") and out.endswith(b"\x04>"), (code[:40], out[-200:])
    r.feed(b"while True: pass\x04")
    r.poll()
    assert r.busy == R.RAW
    time.sleep(0.2)
    r.feed(b"\x03")
    out = _until_idle(r)
    assert b"KeyboardInterrupt" in out and out.endswith(b"\x04>"), out
    # sys.exit(): a soft reset in the raw REPL, a fresh interpreter
    r.feed(b"import sys; sys.exit()\x04")
    out = _until_idle(r)
    assert out.endswith(b"\x04\x04" + R.SOFT_REBOOT + RAW_PROMPT), out
    r.feed(b"import os; print(os.listdir(), open('config.json').read())\x04")
    assert _until_idle(r) == b"OK['config.json'] {}\r\n\x04\x04>"
    # an interpreter that dies under running code is replaced, with a word on why
    r.feed(b"while True: pass\x04")
    r.poll()
    made[-1].proc.kill()
    made[-1].proc.wait()
    out = _until_idle(r)
    assert b"the interpreter stopped" in out and out.endswith(b"\x04>"), out
    r.feed(b"print(3)\x04")
    assert _until_idle(r) == b"OK3\r\n\x04\x04>"
    r.close()
    assert all(i.proc is None for i in made)
    assert not [p for p in os.listdir(fs) if p != "config.json"]
