"""A small fake ``machine`` module for the qemu image: the hardware boundary of a board.

bench/mpy_firmware_bench.py ``heap_board BOARD`` passes it to ``boards.<board>.make_hal``
so the board's real HAL (boards/_build.py ``build()``) is what boots, as on the board,
instead of the simulator's fake board. Frozen into the qemu image (firmware/qemu.py
EXTRA_TOP_LEVEL); never deployed.

Only what boards/_build.py, boards/_common.py and the firmware call exists, and every
object is as small as it can be: on a board these are C objects (a few words each, in
flash or static RAM), here they are Python instances, so counting them as firmware RAM
overstates the board (the benchmark reports them separately). Nothing allocates after construction:

- ``Pin.cpu.<name>`` resolves to the name (a qstr, no allocation); ``Pin(name)`` is the
  pin; ``irq()`` keeps the handler.
- ``ADC.read_u16()``: a fixed code per channel near mid-scale (an NTC around 25-45 C in
  the default 10 k divider).
- ``PWM``: ``freq()``/``duty_u16()`` keep the last value.
- ``I2C``: one INA226 at 0x40 (manufacturer 0x5449, die 0x2260; Config, Calibration,
  Mask/Enable and Alert Limit keep what is written; bus 9,600 LSB = 12 V, shunt 2,000
  LSB = 5 mV, current and power 0); any other address raises ``OSError(19)`` (ENODEV)
  as MicroPython's I2C does for a missing device.
- ``UART``: ``any()``/``readinto(buf, n)`` from a receive ring a harness fills with
  ``feed(data)``; ``write(buf)`` counts the bytes (``written``) and drops them.
- ``WDT(timeout=)`` with ``feed()``; ``unique_id()``; ``reset_cause()`` (PWRON_RESET)
  and the cause constants; ``reset()`` raises SystemExit; ``mem32`` (a register file:
  the stm32 reset-cause mark reads and writes RTC BKP0R through it).
"""

IN = 0
PULL_UP = 1
IRQ_FALLING = 2
PWRON_RESET = 1
HARD_RESET = 2
WDT_RESET = 3
DEEPSLEEP_RESET = 4
SOFT_RESET = 5
_UID = b"\x30\x00\x41\x00\x0b\x51\x33\x35\x39\x38\x31\x37"
_INA_ADDR = 0x40
# INA226 register file (16-bit, big-endian on the wire): reg -> index in _Regs.
_INA_REGS = (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0xFE, 0xFF)
_INA_RESET = (0x4127, 2000, 9600, 0, 0, 0, 0, 0, 0x5449, 0x2260)
# Every object made, for the benchmark's count of their bytes: MADE[0] is how many,
# the slots are allocated here (with the module, not counted) so recording allocates
# nothing.
MADE = [0] + [None] * 40


def _made(obj):
    n = MADE[0] + 1
    if n < len(MADE):
        MADE[n] = obj
        MADE[0] = n


class _Cpu:
    def __getattr__(self, name):
        return name


class Pin:
    IN = IN
    PULL_UP = PULL_UP
    IRQ_FALLING = IRQ_FALLING
    cpu = _Cpu()

    def __init__(self, id, mode=-1, pull=-1):
        _made(self)
        self.id = id
        self.handler = None

    def value(self, v=None):
        return 0

    def irq(self, handler=None, trigger=0, hard=False):
        self.handler = handler


class ADC:
    _n = 0

    def __init__(self, pin):
        _made(self)
        ADC._n += 1
        self.code = 30000 - 2000 * ADC._n  # 28000, 26000, ...: ~30-45 C, mid-scale

    def read_u16(self):
        return self.code


class PWM:
    def __init__(self, pin, freq=0, duty_u16=0):
        _made(self)
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
    def __init__(self, id, freq=400000):
        _made(self)
        self.regs = list(_INA_RESET)

    def _index(self, addr, reg):
        if addr != _INA_ADDR:
            raise OSError(19)
        for i in range(len(_INA_REGS)):
            if _INA_REGS[i] == reg:
                return i
        raise OSError(5)

    def readfrom_mem_into(self, addr, reg, buf):
        v = self.regs[self._index(addr, reg)]
        buf[0] = (v >> 8) & 0xFF
        buf[1] = v & 0xFF

    def writeto_mem(self, addr, reg, buf):
        i = self._index(addr, reg)
        v = (buf[0] << 8) | buf[1]
        if i == 0 and v & 0x8000:  # RST: back to the power-on values
            v = _INA_RESET[0]
        if i < 8 and i not in (1, 2, 3, 4):  # the measured registers are read-only
            self.regs[i] = v


class UART:
    def __init__(self, id, baudrate=115200, timeout=0, rxbuf=64):
        _made(self)
        self.ring = bytearray(rxbuf)
        self.head = 0
        self.n = 0
        self.written = 0

    def feed(self, data):
        """The harness: bytes arriving on the line (dropped when the ring is full)."""
        ring = self.ring
        size = len(ring)
        for b in data:
            if self.n < size:
                ring[(self.head + self.n) % size] = b
                self.n += 1

    def any(self):
        return self.n

    def readinto(self, buf, n=-1):
        if n < 0 or n > len(buf):
            n = len(buf)
        if n > self.n:
            n = self.n
        ring = self.ring
        size = len(ring)
        h = self.head
        i = 0
        while i < n:
            buf[i] = ring[h]
            h += 1
            if h == size:
                h = 0
            i += 1
        self.head = h
        self.n -= n
        return n

    def write(self, buf):
        self.written += len(buf)
        return len(buf)


class WDT:
    def __init__(self, id=0, timeout=5000):
        _made(self)
        self.timeout = timeout

    def feed(self):
        pass


class _Mem:
    def __init__(self):
        self.regs = {}

    def __getitem__(self, addr):
        return self.regs.get(addr, 0)

    def __setitem__(self, addr, v):
        self.regs[addr] = v


mem32 = _Mem()


def unique_id():
    return _UID


def reset_cause():
    return PWRON_RESET


def reset():
    raise SystemExit("machine.reset")
