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
    Register model of the TI INA226 (SBOS547): 16-bit big-endian registers; inputs
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

ENODEV = 19
EIO = 5
ETIMEDOUT = 110

TICKS_PERIOD = 1 << 30
_TICKS_MASK = TICKS_PERIOD - 1
_TICKS_HALF = TICKS_PERIOD >> 1

IRQ_RISING = 1
IRQ_FALLING = 2


def ticks_diff(a, b):
    """Signed difference a - b of two tick values, as ``time.ticks_diff``."""
    return ((a - b + _TICKS_HALF) & _TICKS_MASK) - _TICKS_HALF


def ticks_add(t, delta):
    """Tick value ``delta`` ms after ``t``, as ``time.ticks_add``."""
    return (t + delta) & _TICKS_MASK


def _div_round(n, d):
    """n / d rounded to the nearest int, halves away from zero (d > 0)."""
    if n >= 0:
        return (n + d // 2) // d
    return -((-n + d // 2) // d)


def _div_trunc(n, d):
    """n / d truncated towards zero (d > 0)."""
    if n >= 0:
        return n // d
    return -(-n // d)


class FakeClock:
    """Millisecond clock that only moves when told to."""

    def __init__(self, start_ms=0):
        self.now_ms = start_ms
        self.sleeps = 0

    def ticks_ms(self):
        return self.now_ms & _TICKS_MASK

    def ticks_us(self):
        return (self.now_ms * 1000) & _TICKS_MASK

    def advance(self, ms):
        if ms < 0:
            raise ValueError("a clock cannot go back")
        self.now_ms += ms

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

_INA_CONFIG = 0x00
_INA_SHUNT = 0x01
_INA_BUS = 0x02
_INA_POWER = 0x03
_INA_CURRENT = 0x04
_INA_CAL = 0x05
_INA_MASK = 0x06
_INA_LIMIT = 0x07
_INA_MFR_ID = 0xFE
_INA_DIE_ID = 0xFF

_INA_CONFIG_DEFAULT = 0x4127
_INA_RST = 0x8000
_INA_AVG = (1, 4, 16, 64, 128, 256, 512, 1024)
_INA_CT_US = (140, 204, 332, 588, 1100, 2116, 4156, 8244)

# Mask/Enable bits
_SOL = 0x8000
_SUL = 0x4000
_BOL = 0x2000
_BUL = 0x1000
_POL = 0x0800
_CNVR = 0x0400
_AFF = 0x0010
_CVRF = 0x0008
_OVF = 0x0004
_APOL = 0x0002
_LEN = 0x0001
_MASK_WRITABLE = _SOL | _SUL | _BOL | _BUL | _POL | _CNVR | _APOL | _LEN


def _s16(v):
    return v - 0x10000 if v & 0x8000 else v


class FakeINA226:
    """Register-level model of the TI INA226 (see the module docstring)."""

    def __init__(self, shunt_ohm=0.002, clock=None, manufacturer_id=0x5449, die_id=0x2260):
        if shunt_ohm <= 0:
            raise ValueError("shunt_ohm must be > 0")
        self.shunt_nohm = int(shunt_ohm * 1e9 + 0.5)
        self.clock = clock
        self.manufacturer_id = manufacturer_id
        self.die_id = die_id
        self.answering = True
        self._nack_errno = ENODEV
        self._in_shunt = 0  # raw shunt register the next conversion will latch
        self._in_bus = 0
        self.conversions = 0
        self._reset_registers()

    # ---------------------------------------------------------------- inputs

    def set_bus_mv(self, mv):
        self._in_bus = max(0, min(0x7FFF, _div_round(int(mv) * 4, 5)))
        self._input_changed()

    def set_current_ma(self, ma):
        # mA * nOhm = pV; one shunt LSB is 2.5 uV = 2_500_000 pV
        raw = _div_round(int(ma) * self.shunt_nohm, 2500000)
        self._in_shunt = max(-0x8000, min(0x7FFF, raw))
        self._input_changed()

    def set_shunt_reg(self, raw):
        self._in_shunt = max(-0x8000, min(0x7FFF, int(raw)))
        self._input_changed()

    def stop_answering(self, errno=ENODEV):
        self.answering = False
        self._nack_errno = errno

    def resume(self):
        self.answering = True

    # ---------------------------------------------------------------- inspection

    def reg(self, n):
        """Current value of register n (unsigned 16-bit), without side effects."""
        return self._peek(n)

    def config_fields(self):
        """(avg, vbus_ct_us, vsh_ct_us, mode) decoded from the Config register."""
        c = self._config
        return (_INA_AVG[(c >> 9) & 7], _INA_CT_US[(c >> 6) & 7], _INA_CT_US[(c >> 3) & 7], c & 7)

    # ---------------------------------------------------------------- I2C device protocol

    def read_mem(self, reg, buf):
        if not self.answering:
            raise OSError(self._nack_errno)
        self._catch_up()
        if reg == _INA_MASK:
            v = self._mask | self._flags
            self._flags &= ~_CVRF
            if self._mask & _LEN:
                self._flags &= ~_AFF
        else:
            v = self._peek(reg)
        # The INA226 does not auto-increment: longer reads repeat the register.
        for i in range(len(buf)):
            buf[i] = (v >> 8) & 0xFF if i % 2 == 0 else v & 0xFF

    def write_mem(self, reg, data):
        if not self.answering:
            raise OSError(self._nack_errno)
        if len(data) < 2:
            return  # a pointer-only write
        v = (data[0] << 8) | data[1]
        self._catch_up()
        if reg == _INA_CONFIG:
            if v & _INA_RST:
                self._reset_registers()
                return
            self._config = (v & 0x0FFF) | 0x4000
            self._flags &= ~_CVRF
            self._restart()
        elif reg == _INA_CAL:
            self._cal = v & 0x7FFF  # D15 is reserved
            if self.clock is None and self._continuous():
                self._convert()
        elif reg == _INA_MASK:
            self._mask = v & _MASK_WRITABLE
        elif reg == _INA_LIMIT:
            self._limit = v
        # writes to read-only registers are ignored, as on the chip

    # ---------------------------------------------------------------- internals

    def _peek(self, reg):
        if reg == _INA_CONFIG:
            return self._config
        if reg == _INA_SHUNT:
            return self._shunt & 0xFFFF
        if reg == _INA_BUS:
            return self._bus
        if reg == _INA_POWER:
            return self._power
        if reg == _INA_CURRENT:
            return self._current & 0xFFFF
        if reg == _INA_CAL:
            return self._cal
        if reg == _INA_MASK:
            return self._mask | self._flags
        if reg == _INA_LIMIT:
            return self._limit
        if reg == _INA_MFR_ID:
            return self.manufacturer_id
        if reg == _INA_DIE_ID:
            return self.die_id
        raise OSError(EIO)

    def _reset_registers(self):
        self._config = _INA_CONFIG_DEFAULT
        self._shunt = 0
        self._bus = 0
        self._power = 0
        self._current = 0
        self._cal = 0
        self._mask = 0
        self._flags = 0
        self._limit = 0
        self._restart()

    def _continuous(self):
        return (self._config & 4) != 0 and (self._config & 3) != 0

    def _period_us(self):
        c = self._config
        avg = _INA_AVG[(c >> 9) & 7]
        t = 0
        if c & 2:
            t += _INA_CT_US[(c >> 6) & 7]
        if c & 1:
            t += _INA_CT_US[(c >> 3) & 7]
        return avg * t

    def _restart(self):
        self._done = 0
        if self.clock is not None:
            self._t0 = self.clock.ticks_ms()
        elif self._config & 3:  # any measurement enabled: convert now
            self._convert()

    def _input_changed(self):
        if self.clock is None and self._continuous():
            self._convert()

    def _catch_up(self):
        if self.clock is None or not (self._config & 3):
            return
        elapsed_us = ticks_diff(self.clock.ticks_ms(), self._t0) * 1000
        n = elapsed_us // self._period_us()
        if not self._config & 4 and n > 1:
            n = 1  # triggered: one conversion per Config write
        if n > self._done:
            self._done = n
            self._convert()

    def _convert(self):
        c = self._config
        if c & 1:
            self._shunt = self._in_shunt
        if c & 2:
            self._bus = self._in_bus
        self._flags &= ~_OVF
        current = _div_trunc(self._shunt * self._cal, 2048)
        if current > 0x7FFF or current < -0x8000:
            current = 0x7FFF if current > 0 else -0x8000
            self._flags |= _OVF
        power = abs(current) * self._bus // 20000
        if power > 0xFFFF:
            power = 0xFFFF
            self._flags |= _OVF
        self._current = current
        self._power = power
        self.conversions += 1
        self._flags |= _CVRF
        self._evaluate_alert()

    def _evaluate_alert(self):
        m = self._mask
        limit = self._limit
        if m & _SOL:
            hit = self._shunt > _s16(limit)
        elif m & _SUL:
            hit = self._shunt < _s16(limit)
        elif m & _BOL:
            hit = self._bus > limit
        elif m & _BUL:
            hit = self._bus < limit
        elif m & _POL:
            hit = self._power > limit
        else:
            hit = False
        if hit:
            self._flags |= _AFF
        elif not m & _LEN:
            self._flags &= ~_AFF


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
