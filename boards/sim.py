"""The virtual board: the firmware, unmodified, in the MicroPython unix port.

``from device.main import run; run("sim")`` under ``micropython`` runs the real
firmware on this HAL. The process's stdin/stdout are not the protocol port: they are
a private binary link to the runner (``host/modbridge/sim/runner.py``), which owns
the simulated world and the pty a host opens. The world is the clock. Every
``sleep_ms(ms)`` is one exchange: the board sends what it drives (fan duties,
watchdog feeds, protocol bytes written since the last exchange) and blocks for the
world's answer (the new time, ADC samples, INA226 inputs, tach pulses, protocol bytes
from the host). Between exchanges time stands still, so a run is deterministic.

The link format is described once, in ``host/modbridge/sim/link.py``; this module
implements the board's end of it with preallocated buffers: a steady-state exchange
allocates nothing (``tests/test_sim_board.py`` proves it under ``heap_lock``).

What each HAL part does here (device/README.md is the contract):

- ``adc[i].read_u16()`` serves the reply's samples for channel i cyclically;
- ``i2c`` holds the INA226 register model (``boards/sim_ina226.py``) at ``INA_ADDR``,
  fed the world's bus voltage and current every exchange; "absent" makes it NACK;
- ``pwm[i]`` records freq/duty, reported to the world at every exchange;
- ``tach[i]`` calls its IRQ handler once per pulse the world reports (a hard IRQ that
  fired that many times during the sleep);
- ``port_write`` buffers (a full buffer is relayed at once, no time passing);
  ``port_readinto`` serves the host's bytes. ``sleep_ms`` with unread host bytes
  after a read that made progress returns at once (a real port is polled every
  millisecond; here the firmware gets to drain its receive buffer first);
- ``wdt_start`` returns a watchdog whose feeds are counted to the runner, which
  resets the MCU when none arrives for the timeout in world time;
- ``unique_id``, ``reset_cause``, ``fs_dir`` and ``poll_ms`` (the longest sleep the
  app takes, see ``App.run``) come from the runner's boot reply;
- ``reset()`` asks the runner for a restart (cause "soft"); ``repl()`` tells it the
  firmware left the port;
- a reply with ``FLAG_HEAP`` makes the next request carry ``heap_used``: the heap in
  use after a ``gc.collect()`` (benchmarks watch it for leaks; never done unasked,
  since measuring walks the whole heap).
"""

import gc
import sys
from array import array

try:
    from micropython import const
except ImportError:  # CPython
    const = lambda x: x

from boards.sim_ina226 import INA226Model

NAME = "sim"
MCU = "MicroPython unix port"
INA_ADDR = 0x40  # A0 = A1 = GND, the config default
SHUNT_OHM = 0.001  # the config default shunt (1000 uOhm)
WDT_MAX_MS = 32000
# device/floors.py FAN_MODELS "sim": numbers that fit the simulated fans of every
# world in host/modbridge/sim/worlds (tests/test_plausibility_world.py runs them all).
FAN_MODEL = "sim"
IRQ_RISING = 1
IRQ_FALLING = 2
PWM_BOOT_DUTY = const(65535)  # pins float until the app drives them: fans at 100 %

# The link (host/modbridge/sim/link.py is the description; tests check these agree).
MAGIC_REQ = const(0xB5)
MAGIC_REP = const(0x5B)
LINK_VERSION = const(1)
REQ_BOOT = const(0)
REQ_SLEEP = const(1)
REQ_TX = const(2)
REQ_RESET = const(3)
REQ_REPL = const(4)
REP_BOOT = const(0)
REP_STEP = const(1)
FLAG_STOP = const(1)
FLAG_INA_ABSENT = const(2)
FLAG_STARVE_WDT = const(4)
FLAG_HEAP = const(8)
RESET_CAUSES = ("power", "watchdog", "soft", "hard")
HEADER_SIZE = const(5)
REQ_FIXED_SIZE = const(24)
HEAP_FIELD_SIZE = const(4)
STEP_FIXED_SIZE = const(18)
N_ADC = const(4)
MAX_TX = const(2048)
MAX_RX = const(512)
MAX_ADC = const(16)
MAX_REPLY = const(1200)  # >= link.MAX_REPLY
RX_BUF = const(1024)  # like the MCU boards' UART ring (boards/_build.PORT_RXBUF)

_TX_OFF = const(29)  # HEADER_SIZE + REQ_FIXED_SIZE: tx bytes go straight into the request


class LinkClosed(Exception):
    """The runner went away (end of file on the link) or broke the format."""


def _u16(b, o):
    return b[o] | (b[o + 1] << 8)


def _u32(b, o):
    return b[o] | (b[o + 1] << 8) | (b[o + 2] << 16) | (b[o + 3] << 24)


def _s32(b, o):
    """Signed 32-bit little-endian, without a big int for a value within +-2**30 (a
    32-bit port's small ints): ``v & 0x80000000`` would allocate on every step."""
    if b[o + 3] & 0x80:  # negative: -(ones' complement + 1), from the bytes
        inv = (b[o] ^ 0xFF) | ((b[o + 1] ^ 0xFF) << 8) | ((b[o + 2] ^ 0xFF) << 16)
        return -((inv | ((b[o + 3] ^ 0xFF) << 24)) + 1)
    return _u32(b, o)


def _put16(b, o, v):
    b[o] = v & 0xFF
    b[o + 1] = (v >> 8) & 0xFF


def _put32(b, o, v):
    b[o] = v & 0xFF
    b[o + 1] = (v >> 8) & 0xFF
    b[o + 2] = (v >> 16) & 0xFF
    b[o + 3] = (v >> 24) & 0xFF


class SimPWM:
    """``machine.PWM`` stand-in: the world reads ``duty`` and ``hz`` every exchange."""

    def __init__(self, freq=0, duty_u16=PWM_BOOT_DUTY):
        self.hz = freq
        self.duty = duty_u16

    def freq(self, hz=None):
        if hz is None:
            return self.hz
        self.hz = hz

    def duty_u16(self, d=None):
        if d is None:
            return self.duty
        if d < 0 or d > 65535:
            raise ValueError("duty_u16 must be 0..65535")
        self.duty = d

    def deinit(self):
        self.duty = 0


class SimPin:
    """A tach input: ``irq()`` registers the handler the world's pulses call."""

    IRQ_RISING = IRQ_RISING
    IRQ_FALLING = IRQ_FALLING

    def __init__(self):
        self.handler = None
        self.trigger = 0

    def irq(self, handler=None, trigger=IRQ_FALLING, hard=False):
        self.handler = handler
        self.trigger = trigger

    def value(self, v=None):
        return 1  # pulled up between pulses

    def pulse(self, n):
        h = self.handler
        if h is None or not (self.trigger & IRQ_FALLING):
            return
        while n > 0:
            h(self)
            n -= 1


class SimADC:
    """One NTC channel: the reply's samples for it, served cyclically."""

    def __init__(self, board, channel):
        self._b = board
        self._base = channel * MAX_ADC
        self.i = 0

    def read_u16(self):
        i = self.i
        v = self._b.adc_codes[self._base + i]
        i += 1
        if i >= self._b.n_adc:
            i = 0
        self.i = i
        return v


class SimI2C:
    """``machine.I2C`` stand-in with the INA226 model at ``INA_ADDR``."""

    def __init__(self, ina, addr=INA_ADDR):
        self.ina = ina
        self.addr = addr

    def _dev(self, addr):
        if addr != self.addr:
            raise OSError(19)  # ENODEV, as machine.I2C
        return self.ina

    def readfrom_mem_into(self, addr, memaddr, buf, addrsize=8):
        self._dev(addr).read_mem(memaddr, buf)

    def readfrom_mem(self, addr, memaddr, nbytes, addrsize=8):
        buf = bytearray(nbytes)
        self._dev(addr).read_mem(memaddr, buf)
        return bytes(buf)

    def writeto_mem(self, addr, memaddr, buf, addrsize=8):
        self._dev(addr).write_mem(memaddr, buf)

    def scan(self):
        return [self.addr] if self.ina.answering else []


class SimWDT:
    """What ``wdt_start`` returns: feeds are counted and reported to the runner."""

    def __init__(self, board):
        self._b = board

    def feed(self):
        b = self._b
        if not b.starve_wdt:
            b.wdt_feeds += 1


class SimHal:
    """The HAL of device/README.md over the lockstep link.

    ``readinto(buf, n)`` must read exactly ``n`` bytes into the start of ``buf``
    (returning fewer only at end of file) and ``write(buf, n)`` must write ``buf[:n]``:
    ``sys.stdin.buffer.readinto`` / ``sys.stdout.buffer.write`` do, without allocating.
    The constructor performs the boot exchange.
    """

    name = NAME
    IRQ_FALLING = IRQ_FALLING
    fan_model = FAN_MODEL

    def __init__(self, readinto, write):
        self._readinto = readinto
        self._write = write
        self.req = bytearray(_TX_OFF + MAX_TX + HEAP_FIELD_SIZE)
        self.rep = bytearray(MAX_REPLY)
        self.hdr = bytearray(HEADER_SIZE)
        self.tx_n = 0
        self.rx = bytearray(RX_BUF)
        self.rx_pos = 0
        self.rx_n = 0
        self.rx_dropped = 0
        self._rx_progress = False
        self.adc_codes = array("H", [0] * (N_ADC * MAX_ADC))
        self.n_adc = 1
        self.adc = [SimADC(self, i) for i in range(N_ADC)]
        self.ina = INA226Model(shunt_ohm=SHUNT_OHM)
        self.i2c = SimI2C(self.ina)
        self.pwm = [SimPWM(), SimPWM()]
        self.tach = [SimPin(), SimPin()]
        self.wdt_feeds = 0
        self.wdt_ms = 0
        self.starve_wdt = False
        self.heap_report = False
        self.exchanges = 0
        self._ticks = 0
        self._uid = b""
        self._cause = "power"
        self.fs_dir = "/"
        self.poll_ms = 100
        self._send(REQ_BOOT, 0)
        self._receive()

    # -- HAL -------------------------------------------------------------------
    def ticks_ms(self):
        return self._ticks

    def sleep_ms(self, ms):
        if self.rx_pos < self.rx_n and self._rx_progress:
            self._rx_progress = False
            return
        self._send(REQ_SLEEP, ms)
        self._receive()

    def port_write(self, buf, n):
        req = self.req
        i = 0
        while i < n:
            if self.tx_n >= MAX_TX:
                self._send(REQ_TX, 0)
            req[_TX_OFF + self.tx_n] = buf[i]
            self.tx_n += 1
            i += 1

    def port_readinto(self, buf):
        avail = self.rx_n - self.rx_pos
        if avail <= 0:
            return 0
        cap = len(buf)
        m = avail if avail < cap else cap
        rx = self.rx
        p = self.rx_pos
        i = 0
        while i < m:
            buf[i] = rx[p + i]
            i += 1
        self.rx_pos = p + m
        self._rx_progress = True
        return m

    def wdt_start(self, timeout_ms):
        t = int(timeout_ms)
        if t > WDT_MAX_MS:
            t = WDT_MAX_MS
        if t < 1:
            t = 1
        self.wdt_ms = t
        return SimWDT(self)

    def unique_id(self):
        return self._uid

    def reset_cause(self):
        return self._cause

    def reset(self):
        """Hard reset: the runner restarts this process; nothing here returns."""
        self._send(REQ_RESET, 0)
        self._readinto(self.hdr, HEADER_SIZE)  # blocks until the runner kills us
        raise SystemExit(0)

    def repl(self):
        self._send(REQ_REPL, 0)

    # -- link ------------------------------------------------------------------
    def _send(self, kind, sleep_ms):
        req = self.req
        n = REQ_FIXED_SIZE + self.tx_n
        if self.heap_report:
            self.heap_report = False
            _put32(req, _TX_OFF + self.tx_n, heap_used())
            n += HEAP_FIELD_SIZE
        req[0] = MAGIC_REQ
        req[1] = LINK_VERSION
        req[2] = kind
        _put16(req, 3, n)
        _put32(req, 5, sleep_ms)
        p = self.pwm
        _put16(req, 9, p[0].duty)
        _put16(req, 11, p[1].duty)
        _put32(req, 13, p[0].hz)
        _put32(req, 17, p[1].hz)
        f = self.wdt_feeds
        _put16(req, 21, f if f < 0xFFFF else 0xFFFF)
        _put32(req, 23, self.wdt_ms)
        _put16(req, 27, self.tx_n)
        self._write(req, HEADER_SIZE + n)
        self.wdt_feeds = 0
        self.tx_n = 0

    def _read(self, buf, n):
        got = self._readinto(buf, n)
        if got is None or got < n:
            raise LinkClosed("link closed")

    def _receive(self):
        hdr = self.hdr
        self._read(hdr, HEADER_SIZE)
        if hdr[0] != MAGIC_REP or hdr[1] != LINK_VERSION:
            raise LinkClosed("bad reply header")
        kind = hdr[2]
        n = _u16(hdr, 3)
        if n > MAX_REPLY:
            raise LinkClosed("reply too long")
        b = self.rep
        self._read(b, n)
        o = 0
        if kind == REP_BOOT:
            o = self._boot(b)
        elif kind != REP_STEP:
            raise LinkClosed("unknown reply kind")
        self._step(b, o)
        self.exchanges += 1

    def _boot(self, b):
        """The boot section (allocates: once per process)."""
        self._cause = RESET_CAUSES[b[0]]
        self.poll_ms = _u16(b, 1)
        uid_n = b[3]
        self._uid = bytes(b[4 : 4 + uid_n])
        o = 4 + uid_n
        fs_n = b[o]
        self.fs_dir = bytes(b[o + 1 : o + 1 + fs_n]).decode()
        return o + 1 + fs_n

    def _step(self, b, o):
        self._ticks = _u32(b, o)
        flags = b[o + 4]
        if flags & FLAG_STOP:
            raise SystemExit(0)
        self.starve_wdt = (flags & FLAG_STARVE_WDT) != 0
        if flags & FLAG_HEAP:
            self.heap_report = True
        ina = self.ina
        if flags & FLAG_INA_ABSENT:
            ina.answering = False
        else:
            ina.answering = True
            ina.set_bus_mv(_s32(b, o + 5))
            ina.set_current_ma(_s32(b, o + 9))
        p1 = _u16(b, o + 13)
        p2 = _u16(b, o + 15)
        n_adc = b[o + 17]
        if n_adc < 1 or n_adc > MAX_ADC:
            raise LinkClosed("bad ADC sample count")
        self.n_adc = n_adc
        o += STEP_FIXED_SIZE
        codes = self.adc_codes
        ch = 0
        while ch < N_ADC:
            base = ch * MAX_ADC
            i = 0
            while i < n_adc:
                codes[base + i] = _u16(b, o)
                o += 2
                i += 1
            self.adc[ch].i = 0
            ch += 1
        rx_n = _u16(b, o)
        o += 2
        self._take_rx(b, o, rx_n)
        # the tach IRQs fired during the sleep: deliver them last, as the new time holds
        self.tach[0].pulse(p1)
        self.tach[1].pulse(p2)

    def _take_rx(self, b, o, n):
        rx = self.rx
        pos = self.rx_pos
        have = self.rx_n - pos
        if pos:  # move the unread bytes to the front
            i = 0
            while i < have:
                rx[i] = rx[pos + i]
                i += 1
            self.rx_pos = 0
        room = RX_BUF - have
        if n > room:
            self.rx_dropped += n - room
            n = room
        i = 0
        while i < n:
            rx[have + i] = b[o + i]
            i += 1
        self.rx_n = have + n


def heap_used():
    """Bytes of heap in use after a collection (0 where ``gc.mem_alloc`` is missing)."""
    gc.collect()
    try:
        return gc.mem_alloc() & 0xFFFFFFFF
    except AttributeError:  # CPython
        return 0


def make_hal(readinto=None, write=None):
    """The sim HAL on this process's stdin/stdout (or the given link functions)."""
    if readinto is None:
        readinto = sys.stdin.buffer.readinto
    if write is None:
        write = sys.stdout.buffer.write
    return SimHal(readinto, write)
