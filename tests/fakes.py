"""Fakes at the `machine` boundary, importable on CPython and on MicroPython.

Each fake stands in for one `machine` object (or one chip behind a bus) and is driven
the way liquidctl's mocks are: preload what the hardware will answer, run the code,
then look at what it sent. Nothing here knows about the firmware above the boundary.

API (stable; other test modules and the sim board use it):

``FakeClock(start_ms=0)``
    ``ticks_ms()`` wraps at ``TICKS_PERIOD`` (2**30, as on a 32-bit MCU port), so start
    near ``TICKS_PERIOD`` to test wrap-around; ``advance(ms)``; ``sleep_ms(ms)`` (advances;
    counts calls in ``.sleeps``); ``now_ms`` is the unwrapped total. Module-level
    ``ticks_diff(a, b)`` / ``ticks_add(t, delta)`` follow ``time.ticks_diff`` semantics
    for that period (CPython's ``time`` has neither).

``FakeADC(codes=None)``
    ``read_u16()`` returns, per read: the next code of a list (then repeats the last
    one), an int constant, or ``codes()`` for a callable. ``set(code)`` switches to a
    constant; ``reads`` counts calls. Codes outside 0..65535 raise ValueError.

``FakeI2C(log=True)``
    ``add(addr, device)`` returns the device; ``remove(addr)``; ``set_absent(addr,
    absent=True)``; ``fail_next(n=1, errno=EIO)`` makes the next n transactions raise
    ``OSError(errno)``; ``scan()``; ``readfrom_mem_into(addr, reg, buf)``,
    ``readfrom_mem(addr, reg, n)``, ``writeto_mem(addr, reg, buf)``. An absent or
    silent device raises ``OSError(ENODEV)`` as `machine.I2C` does (read the code with
    ``e.args[0]``: CPython leaves ``e.errno`` None for a one-argument OSError).
    ``log`` is a list of ``(op, addr, reg, bytes)`` with op ``"r"``/``"w"``; pass
    ``log=False`` (``log`` is then None) for code run under ``micropython.heap_lock()``.
    ``reads``/``writes`` count successful transactions.
    A device is any object with ``read_mem(reg, buf)`` (fill ``buf`` in place) and
    ``write_mem(reg, data)``; either may raise OSError (a NACK). An optional
    ``answering`` attribute (default True) is honoured by ``scan()``.

``FakeINA226(shunt_ohm=0.002, clock=None, manufacturer_id=0x5449, die_id=0x2260)``
    ``boards.sim_ina226.INA226Model``, re-exported: the one register model, shared with
    the sim board. Register model of the TI INA226 (SBOS547): 16-bit big-endian registers; inputs
    ``set_bus_mv(mv)``, ``set_current_ma(ma)`` (or ``set_shunt_reg(raw)``). A conversion
    latches shunt = I*R/2.5 uV and bus = V/1.25 mV (rounded, saturated to the register
    range) and computes Current = Shunt*CAL/2048 and Power = |Current|*Bus/20000
    (truncated; saturation sets OVF), sets CVRF and evaluates the one enabled alert
    function (SOL/SUL/BOL/BUL/POL, highest bit wins) into AFF, latched if LEN.
    Reading Mask/Enable clears CVRF (and a latched AFF); writing Config clears CVRF;
    Config bit 15 resets every register to its default (Config 0x4127).
    Timing: with ``clock=None`` conversions are instantaneous (after every input change
    and every Config/CAL write, in continuous modes; after a Config write in triggered
    modes). With a ``FakeClock`` a conversion completes every AVG*(VBUSCT+VSHCT) us
    (the enabled channels) after the last Config write, as on the chip.
    ``stop_answering(errno=ENODEV)`` / ``resume()``; ``reg(n)`` peeks a register
    without side effects; ``conversions`` counts completed conversions.

``FakePWM(history_len=256)``
    ``freq(hz=None)``, ``duty_u16(d=None)`` (ValueError outside 0..65535, like a strict
    port), ``deinit()``. ``history()`` returns the duties written, oldest first (the last
    ``history_len``; kept in a preallocated ring, so writing never allocates).

``FakePin(value=1)``
    ``irq(handler=None, trigger=IRQ_FALLING, hard=False)``, ``value(v=None)``,
    ``pulse(n=1)``: n low-then-high pulses, calling the handler with the pin for every
    edge that matches the trigger (so n calls for FALLING, 2n for FALLING|RISING).
    Allocation-free, so it can simulate tach edges under ``heap_lock``.
    ``FakePin.IRQ_FALLING`` / ``FakePin.IRQ_RISING`` (also module-level).
"""

try:
    from array import array
except ImportError:  # pragma: no cover - every supported interpreter has array
    array = None

from boards.sim_ina226 import INA226Model

ENODEV = 19
EIO = 5
ETIMEDOUT = 110

TICKS_PERIOD = 1 << 30  # a big int on a 32-bit port: tests only, never in a tick
# Literals, so they are small ints on every port (``TICKS_PERIOD - 1`` would be a big
# int on 32-bit ARM, and so would every result computed with it: each tick allocated).
_TICKS_MASK = 0x3FFFFFFF
_TICKS_HALF = 0x20000000

IRQ_RISING = 1
IRQ_FALLING = 2


def _small(v):
    """``v`` (0 <= v < 2**30) as a small int: on a 32-bit port a result computed from
    a big int stays a big int, though its value fits."""
    return int.from_bytes(v.to_bytes(4, "little"), "little")


def ticks_diff(a, b):
    """Signed difference a - b of two tick values, as ``time.ticks_diff``."""
    return ((a - b + _TICKS_HALF) & _TICKS_MASK) - _TICKS_HALF


def ticks_add(t, delta):
    """Tick value ``delta`` ms after ``t``, as ``time.ticks_add``."""
    return (t + delta) & _TICKS_MASK


class FakeClock:
    """Millisecond clock that only moves when told to."""

    def __init__(self, start_ms=0):
        # the time as wraps * TICKS_PERIOD + ticks, each a small int on a 32-bit port
        # too, so ticks_ms() and advance() allocate nothing there (``now_ms`` does)
        self._wraps = start_ms // TICKS_PERIOD
        self._ticks = _small(start_ms - self._wraps * TICKS_PERIOD)
        self.sleeps = 0

    @property
    def now_ms(self):
        """The unwrapped total (a big int past 2**30 on a 32-bit port)."""
        return self._wraps * TICKS_PERIOD + self._ticks

    def ticks_ms(self):
        return self._ticks

    def ticks_us(self):
        """``now_ms * 1000`` wrapped at 2**30, in small ints: (2**20 * 1000 < 2**30)."""
        lo = (self._ticks & 0xFFFFF) * 1000
        hi = (((self._ticks >> 20) * 1000) & 0x3FF) << 20
        room = _TICKS_MASK - lo
        return hi - room - 1 if hi > room else lo + hi

    def advance(self, ms):
        if ms < 0:
            raise ValueError("a clock cannot go back")
        if ms > _TICKS_MASK:  # a jump past a whole period (a big int on 32-bit ports)
            n = ms // TICKS_PERIOD
            self._wraps += n
            ms = _small(ms - n * TICKS_PERIOD)
        room = _TICKS_MASK - self._ticks
        if ms > room:
            self._wraps += 1
            self._ticks = ms - room - 1
        else:
            self._ticks += ms

    def sleep_ms(self, ms):
        self.sleeps += 1
        self.advance(ms)

    ticks_diff = staticmethod(ticks_diff)
    ticks_add = staticmethod(ticks_add)


def _check_u16(code, what):
    if not isinstance(code, int) or code < 0 or code > 0xFFFF:
        raise ValueError(what + " must be an int 0..65535, got " + repr(code))
    return code


class FakeADC:
    """`machine.ADC` stand-in replaying codes."""

    def __init__(self, codes=None):
        self.reads = 0
        self._codes = None
        self._fn = None
        self._const = 0
        self._i = 0
        if codes is None:
            return
        if callable(codes):
            self._fn = codes
        elif isinstance(codes, int):
            self.set(codes)
        else:
            codes = list(codes)
            if not codes:
                raise ValueError("FakeADC needs at least one code")
            for c in codes:
                _check_u16(c, "ADC code")
            self._codes = codes

    def set(self, code):
        self._const = _check_u16(code, "ADC code")
        self._codes = None
        self._fn = None

    def read_u16(self):
        self.reads += 1
        if self._fn is not None:
            return _check_u16(self._fn(), "ADC code")
        codes = self._codes
        if codes is None:
            return self._const
        i = self._i
        if i < len(codes) - 1:
            self._i = i + 1
        return codes[i]


class FakeI2C:
    """`machine.I2C` stand-in with devices registered by address."""

    def __init__(self, log=True):
        self._devices = {}
        self._absent = set()
        self._fail_n = 0
        self._fail_errno = EIO
        self.log = [] if log else None
        self.reads = 0
        self.writes = 0

    def add(self, addr, device):
        self._devices[addr] = device
        return device

    def remove(self, addr):
        self._devices.pop(addr, None)

    def set_absent(self, addr, absent=True):
        if absent:
            self._absent.add(addr)
        else:
            self._absent.discard(addr)

    def fail_next(self, n=1, errno=EIO):
        self._fail_n = n
        self._fail_errno = errno

    def scan(self):
        found = []
        for addr in sorted(self._devices):
            if addr not in self._absent and getattr(self._devices[addr], "answering", True):
                found.append(addr)
        return found

    def _device(self, addr):
        if self._fail_n > 0:
            self._fail_n -= 1
            raise OSError(self._fail_errno)
        dev = self._devices.get(addr)
        if dev is None or addr in self._absent:
            raise OSError(ENODEV)
        return dev

    def readfrom_mem_into(self, addr, memaddr, buf, addrsize=8):
        self._device(addr).read_mem(memaddr, buf)
        self.reads += 1
        if self.log is not None:
            self.log.append(("r", addr, memaddr, bytes(buf)))

    def readfrom_mem(self, addr, memaddr, nbytes, addrsize=8):
        buf = bytearray(nbytes)
        self.readfrom_mem_into(addr, memaddr, buf, addrsize)
        return bytes(buf)

    def writeto_mem(self, addr, memaddr, buf, addrsize=8):
        self._device(addr).write_mem(memaddr, buf)
        self.writes += 1
        if self.log is not None:
            self.log.append(("w", addr, memaddr, bytes(buf)))


# --------------------------------------------------------------------------- INA226

# One INA226 register model for the tests and the sim board (boards/sim_ina226.py).
FakeINA226 = INA226Model


# --------------------------------------------------------------------------- PWM, Pin


class FakePWM:
    """`machine.PWM` stand-in recording the duties written."""

    def __init__(self, history_len=256):
        self._freq = 0
        self._duty = 0
        self.deinited = False
        self._hist = array("l", [0] * history_len)
        self._hist_n = 0  # total writes

    def freq(self, hz=None):
        if hz is None:
            return self._freq
        if not isinstance(hz, int) or hz <= 0:
            raise ValueError("freq must be a positive int")
        self._freq = hz
        self.deinited = False

    def duty_u16(self, d=None):
        if d is None:
            return self._duty
        if not isinstance(d, int) or d < 0 or d > 0xFFFF:
            raise ValueError("duty_u16 must be an int 0..65535")
        self._duty = d
        self._hist[self._hist_n % len(self._hist)] = d
        self._hist_n += 1
        self.deinited = False

    def deinit(self):
        self.deinited = True

    def history(self):
        size = len(self._hist)
        n = self._hist_n
        start = n - size if n > size else 0
        return [self._hist[i % size] for i in range(start, n)]


class FakePin:
    """`machine.Pin` stand-in for a tach input."""

    IRQ_RISING = IRQ_RISING
    IRQ_FALLING = IRQ_FALLING

    def __init__(self, value=1):
        self._value = value
        self.handler = None
        self.trigger = 0
        self.hard = False
        self.edges = 0

    def value(self, v=None):
        if v is None:
            return self._value
        self._value = 1 if v else 0

    def irq(self, handler=None, trigger=IRQ_FALLING | IRQ_RISING, hard=False):
        self.handler = handler
        self.trigger = trigger
        self.hard = hard

    def pulse(self, n=1):
        for _ in range(n):
            self._value = 0
            self.edges += 1
            if self.handler is not None and self.trigger & IRQ_FALLING:
                self.handler(self)
            self._value = 1
            self.edges += 1
            if self.handler is not None and self.trigger & IRQ_RISING:
                self.handler(self)
