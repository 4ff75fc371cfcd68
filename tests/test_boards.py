"""Board modules: registry, pin tables, and make_hal() against a fake ``machine``.

The fake is MicroPython-compatible source: the same module checks, under the real
``micropython`` with the heap locked, that the HAL calls the control tick makes
(ADC reads, port_readinto, port_write) never allocate.
"""

import importlib
import re
import subprocess
import types
from pathlib import Path

import pytest

from boards import BOARDS, _build, _common, _optional, load

REPO_ROOT = Path(__file__).resolve().parent.parent
MCU_BOARDS = ("pyboard_v11", "blackpill_f411", "nucleo_f411re", "pico")
STM32_BOARDS = ("pyboard_v11", "blackpill_f411", "nucleo_f411re")
# STM32F4 pins wired to ADC1 (stm32f411_af.csv; the F405 has the same channel map).
STM32_ADC_PINS = {f"PA{i}" for i in range(8)} | {"PB0", "PB1"} | {f"PC{i}" for i in range(6)}
# Pins with a TIMx_CH1..4 alternate function (the ones machine.PWM can drive) that we use.
STM32_PWM_PINS = {"PB4", "PB5", "PB8", "PB9"}

FAKE_MACHINE = '''
class _Cpu:
    def __getattr__(self, name):
        return "cpu:" + name


class Pin:
    IN = 0
    OUT = 1
    PULL_UP = 1
    IRQ_FALLING = 2
    cpu = _Cpu()

    def __init__(self, id, mode=-1, pull=-1, value=None):
        self.id = id
        self.mode = mode
        self.pull = pull
        self.level = value

    def value(self, v=None):
        if v is None:
            return self.level
        self.level = v

    def irq(self, handler=None, trigger=0, hard=False):
        self.handler = handler


class ADC:
    def __init__(self, pin):
        self.pin = pin
        self.code = 1000

    def read_u16(self):
        return self.code


class PWM:
    def __init__(self, pin, freq=0, duty_u16=0):
        self.pin = pin
        self.f = freq
        self.d = duty_u16

    def freq(self, f=None):
        if f is None:
            return self.f
        self.f = f

    def duty_u16(self, d=None):
        if d is None:
            return self.d
        self.d = d


class I2C:
    def __init__(self, id, scl=None, sda=None, freq=0):
        self.id = id
        self.scl = scl
        self.sda = sda
        self.freq = freq


class UART:
    def __init__(self, id, baudrate, tx=None, rx=None, timeout=-1, rxbuf=0):
        self.id = id
        self.baudrate = baudrate
        self.tx = tx
        self.rx = rx
        self.timeout = timeout
        self.rxbuf = rxbuf
        self.out = bytearray(2048)
        self.out_n = 0
        self.inq = bytearray(64)
        self.in_n = 0
        self.in_pos = 0

    def any(self):
        return self.in_n - self.in_pos

    def readinto(self, buf, n):
        i = 0
        while i < n:
            buf[i] = self.inq[self.in_pos]
            self.in_pos += 1
            i += 1
        return n

    def write(self, buf):  # one argument, like machine.UART (mp_stream_write1_obj)
        for b in buf:
            self.out[self.out_n] = b
            self.out_n += 1
        return len(buf)


class WDT:
    def __init__(self, id=0, timeout=5000):
        self.timeout = timeout

    def feed(self):
        pass


PWRON_RESET = 1
HARD_RESET = 2
WDT_RESET = 3
SOFT_RESET = 5


def reset_cause():
    return WDT_RESET


def unique_id():
    return b"\\x01\\x02\\x03"


def reset():
    raise SystemExit("reset")
'''


def fake_machine():
    mod = types.ModuleType("machine")
    exec(FAKE_MACHINE, mod.__dict__)
    return mod


# ---------------------------------------------------------------------- registry


def test_registry_names_and_arches():
    assert set(BOARDS) == set(MCU_BOARDS) | {"sim"}
    for name in STM32_BOARDS:
        assert BOARDS[name][1] == "armv7emsp", name  # Cortex-M4F
    assert BOARDS["pico"][1] == "armv6m"  # Cortex-M0+
    assert BOARDS["sim"] == ("boards.sim", None)


def test_load_unknown_board_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown board 'stm32f072'.*pico"):
        load("stm32f072")


@pytest.mark.parametrize("name", MCU_BOARDS)
def test_load_returns_the_module(name):
    mod = load(name)
    assert mod is importlib.import_module(BOARDS[name][0])
    assert mod.NAME == name


# ---------------------------------------------------------------------- pin tables


def _functional_pins(pins):
    """Every pin a role uses (the muxed ADC input counted once)."""
    used = list(dict.fromkeys(pins["ntc"]))
    used += list(pins["fan_pwm"]) + list(pins["tach"])
    used += [pins["i2c"]["scl"], pins["i2c"]["sda"], pins["ina226_alert"]]
    if pins["port"]["kind"] == "uart":
        used += [pins["port"]["tx"], pins["port"]["rx"]]
    if pins.get("adc_mux"):
        used.append(pins["adc_mux"]["select"])
    return used


@pytest.mark.parametrize("name", MCU_BOARDS)
def test_pin_table_shape(name):
    pins = load(name).PINS
    assert len(pins["ntc"]) == 4
    assert len(pins["fan_pwm"]) == 2
    assert len(pins["tach"]) == 2
    used = _functional_pins(pins)
    assert len(used) == len(set(used)), f"{name}: a pin has two jobs: {used}"


@pytest.mark.parametrize("name", STM32_BOARDS)
def test_stm32_pins_are_real_and_capable(name):
    mod = load(name)
    pins = mod.PINS
    for p in _functional_pins(pins):
        assert re.fullmatch(r"P[A-H]\d{1,2}", p), p
    assert set(pins["ntc"]) <= STM32_ADC_PINS
    assert set(pins["fan_pwm"]) <= STM32_PWM_PINS
    # STM32 EXTI: one interrupt pin per line number (the pin's number).
    lines = [int(p[2:]) for p in (*pins["tach"], pins["ina226_alert"])]
    assert len(set(lines)) == len(lines), lines
    assert mod.WDT_MAX_MS == 32767
    for label_of in mod.LABELS:
        assert label_of in _functional_pins(pins)


def test_pico_pins():
    pins = load("pico").PINS
    assert set(pins["ntc"]) <= {26, 27, 28, 29}
    assert pins["ntc"][:2] == (26, 27)
    mux = pins["adc_mux"]
    a, b = mux["channels"]
    assert pins["ntc"][a] == pins["ntc"][b]  # mos and amb share ADC2 through the switch
    # GP16/17 are PWM slice 0 channels A/B: (gp >> 1) & 7 == 0
    assert {(gp >> 1) & 7 for gp in pins["fan_pwm"]} == {0}
    assert load("pico").WDT_MAX_MS == 8388


def test_fs_dirs():
    # the stm32 port mounts its internal flash at /flash and has no writable "/"
    for name in ("pyboard_v11", "blackpill_f411", "nucleo_f411re"):
        assert load(name).FS_DIR == "/flash", name
    assert load("pico").FS_DIR == "/"


# ---------------------------------------------------------------------- make_hal


HAL_CALLABLES = (
    "ticks_ms", "sleep_ms", "port_readinto", "port_write", "wdt_start",
    "unique_id", "reset_cause", "reset", "repl",
)


@pytest.mark.parametrize("name", MCU_BOARDS)
def test_make_hal_contract(name):
    m = fake_machine()
    hal = load(name).make_hal(m)
    assert hal.name == name
    assert hal.fs_dir == load(name).FS_DIR
    assert len(hal.adc) == 4 and all(0 <= a.read_u16() <= 65535 for a in hal.adc)
    assert len(hal.pwm) == 2 and len(hal.tach) == 2
    for pwm in hal.pwm:
        assert pwm.freq() == 25000
        assert pwm.duty_u16() == 65535  # full cooling until the app takes over
    for t in hal.tach:
        assert t.mode == m.Pin.IN and t.pull == m.Pin.PULL_UP
    assert hal.IRQ_FALLING == m.Pin.IRQ_FALLING
    for attr in HAL_CALLABLES:
        assert callable(getattr(hal, attr)), attr
    assert hal.unique_id() == b"\x01\x02\x03"
    assert hal.reset_cause() == "watchdog"
    assert isinstance(hal.ticks_ms(), int)
    assert hal.i2c.freq == 400000
    uart = hal.port._uart
    assert (uart.baudrate, uart.timeout) == (115200, 20)
    assert uart.id == load(name).PINS["port"]["id"]


def test_stm32_pins_go_through_pin_cpu():
    hal = load("nucleo_f411re").make_hal(fake_machine())
    # Arduino "A2" is PA4: by CPU name, never the ambiguous board name.
    assert [a.pin.id for a in hal.adc] == ["cpu:A0", "cpu:A1", "cpu:A4", "cpu:B0"]
    assert [p.pin.id for p in hal.pwm] == ["cpu:B4", "cpu:B5"]
    assert hal.port._uart.tx is None  # STM32 UART pins are fixed by the board build


def test_pico_uart_i2c_pins_and_mux():
    hal = load("pico").make_hal(fake_machine())
    uart = hal.port._uart
    assert (uart.id, uart.tx.id, uart.rx.id) == (0, 0, 1)
    assert (hal.i2c.id, hal.i2c.scl.id, hal.i2c.sda.id) == (0, 5, 4)
    gpu, vram, mos, amb = hal.adc
    assert mos._adc is amb._adc and mos._adc.pin.id == 28
    sel = mos._sel
    assert sel.id == 22
    mos.read_u16()
    assert sel.level == 0
    amb.read_u16()
    assert sel.level == 1


def test_port_write_writes_exactly_n_bytes():
    hal = load("pico").make_hal(fake_machine())
    uart = hal.port._uart
    frame = bytearray(b"\x02\x01\x02\x30\x00" + bytes(50))
    hal.port_write(frame, 4)
    hal.port_write(frame, 0)
    assert bytes(uart.out[: uart.out_n]) == b"\x02\x01\x02\x30"
    big = bytearray(i & 0xFF for i in range(1030))  # > MAX_LINE: several 64-byte chunks
    uart.out_n = 0
    hal.port_write(big, 1030)
    assert bytes(uart.out[: uart.out_n]) == bytes(big)
    assert hal.port.dropped == 0


def test_port_write_counts_refused_bytes():
    class Refusing:  # takes 7 of 8, refuses a chunk over 10 bytes (None)
        def write(self, view):
            return None if len(view) > 10 else len(view) - 1

    w = _common.UartPort(Refusing(), chunk=16)
    w.write(bytearray(40), 40)  # chunks 16, 16, 8: refused, refused, 7 of 8
    assert w.dropped == 16 + 16 + 1


def test_port_readinto_is_non_blocking():
    hal = load("blackpill_f411").make_hal(fake_machine())
    uart = hal.port._uart
    buf = bytearray(4)
    assert hal.port_readinto(buf) == 0
    uart.inq[:6] = b"abcdef"
    uart.in_n = 6
    assert hal.port_readinto(buf) == 4 and buf == b"abcd"
    assert hal.port_readinto(buf) == 2 and buf[:2] == b"ef"
    assert hal.port_readinto(buf) == 0


def test_wdt_clamped_to_the_mcu_limit():
    assert load("pico").make_hal(fake_machine()).wdt_start(30000).timeout == 8388
    stm = load("pyboard_v11").make_hal(fake_machine())
    assert stm.wdt_start(60000).timeout == 32767
    assert stm.wdt_start(2000).timeout == 2000


def test_reset_cause_names():
    m = fake_machine()
    for value, want in ((1, "power"), (2, "hard"), (3, "watchdog"), (5, "soft"), (9, "unknown")):
        m.reset_cause = lambda v=value: v
        assert _build.reset_cause_name(m) == want


def test_stdio_port_disables_and_restores_ctrl_c():
    calls = []

    class Poll:
        def __init__(self):
            self.ready = 0

        def ipoll(self, timeout):
            if self.ready:
                self.ready -= 1
                return iter([(None, 1)])
            return iter(())

    class In:
        data = bytearray(b"xyz")

        def readinto(self, b):
            b[0] = self.data.pop(0)
            return 1

    class Out:
        got = b""

        def write(self, b):
            Out.got += bytes(b)

    poll = Poll()
    port = _optional.StdioPort(In(), Out(), poll, calls.append)
    assert calls == [-1]
    buf = bytearray(8)
    assert port.readinto(buf) == 0
    poll.ready = 2
    assert port.readinto(buf) == 2 and buf[:2] == b"xy"
    port.write(bytearray(b"hello"), 3)
    assert Out.got == b"hel"
    port.release()
    assert calls == [-1, 3]


def test_unknown_port_kind():
    with pytest.raises(ValueError, match="unknown port kind"):
        _build.make_port(fake_machine(), {"kind": "can"})


# ---------------------------------------------------------------------- MicroPython

MPY_SCRIPT = '''
import sys
sys.path.insert(0, "{tmp}")
import fake_machine as m
import micropython
from boards import load


def tick(hal, buf, frame):
    # What a control tick asks of the HAL; locals only (a new global would allocate).
    adc = hal.adc
    n = 0
    micropython.heap_lock()
    try:
        for i in range(4):
            n += adc[i].read_u16()
        n += hal.port_readinto(buf)
        hal.port_write(frame, 67)
        hal.port_write(frame, 1030)
        n += hal.ticks_ms() & 1
        n += len(hal.unique_id()) + len(hal.reset_cause())
    finally:
        micropython.heap_unlock()
    return n


for name in ("pyboard_v11", "blackpill_f411", "nucleo_f411re", "pico"):
    hal = load(name).make_hal(m)
    uart = hal.port._uart
    uart.inq[:3] = b"abc"
    uart.in_n = 3
    tick(hal, bytearray(64), bytearray(1030))
    assert uart.out_n == 1097, uart.out_n
    assert hal.port.dropped == 0
    print(name, "ok")
'''


def _micropython():
    from modbridge.tools.mpy import micropython_path

    return micropython_path()


def test_hal_tick_calls_do_not_allocate_under_micropython(tmp_path):
    (tmp_path / "fake_machine.py").write_text(FAKE_MACHINE)
    script = tmp_path / "check.py"
    script.write_text(MPY_SCRIPT.format(tmp=tmp_path))
    proc = subprocess.run(
        [_micropython(), "-X", "heapsize=256k", str(script)],
        cwd=REPO_ROOT,
        env={"MICROPYPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == [
        "pyboard_v11", "ok", "blackpill_f411", "ok", "nucleo_f411re", "ok", "pico", "ok",
    ]

