"""Register-level model of the TI INA226 (SBOS547): the sim board's power monitor.

One model serves two places: the sim board (``boards/sim.py``) puts it on its I2C bus
so the firmware's real driver talks to it register by register, fed each exchange
with the simulated world's bus voltage and current; and the test fakes
(``tests/fakes.py`` re-exports it as ``FakeINA226``). Runs on CPython and MicroPython
(the unix port: intermediates such as mA x nOhm exceed 2**30, which is fine on a
63-bit small-int port and never runs on an MCU).

``INA226Model(shunt_ohm=0.002, clock=None, manufacturer_id=0x5449, die_id=0x2260)``

- 16-bit big-endian registers behind ``read_mem(reg, buf)`` / ``write_mem(reg, data)``
  (the device protocol of ``tests/fakes.FakeI2C`` and the sim board's bus). The chip
  does not auto-increment: a longer read repeats the register.
- Inputs: ``set_bus_mv(mv)``, ``set_current_ma(ma)`` (or ``set_shunt_reg(raw)``).
  A conversion latches shunt = I*R/2.5 uV and bus = V/1.25 mV (rounded, saturated to
  the register range) and computes Current = Shunt*CAL/2048 and Power =
  |Current|*Bus/20000 (truncated; saturation sets OVF), sets CVRF and evaluates the
  one enabled alert function (SOL/SUL/BOL/BUL/POL, highest bit wins) into AFF,
  latched if LEN. Reading Mask/Enable clears CVRF (and a latched AFF); writing Config
  clears CVRF; Config bit 15 resets every register to its default (Config 0x4127).
- Timing: with ``clock=None`` conversions are instantaneous (after every input change
  and every Config/CAL write, in continuous modes; after a Config write in triggered
  modes). With a clock (anything with ``ticks_ms()``, 2**30 period) a conversion
  completes every AVG*(VBUSCT+VSHCT) us (the enabled channels) after the last Config
  write, as on the chip.
- ``stop_answering(errno=ENODEV)`` / ``resume()`` (a NACK: ``OSError(errno)``);
  ``reg(n)`` peeks a register without side effects; ``conversions`` counts completed
  conversions; ``config_fields()`` decodes Config.

With ``clock=None`` the input setters, ``read_mem`` and ``write_mem`` allocate
nothing (a NACK raises, which allocates: that is a fault path).
"""

try:
    from micropython import const
except ImportError:  # CPython
    const = lambda x: x

from device.ticks import ticks_diff

ENODEV = const(19)
EIO = const(5)

_REG_CONFIG = const(0x00)
_REG_SHUNT = const(0x01)
_REG_BUS = const(0x02)
_REG_POWER = const(0x03)
_REG_CURRENT = const(0x04)
_REG_CAL = const(0x05)
_REG_MASK_ENABLE = const(0x06)
_REG_ALERT_LIMIT = const(0x07)
_REG_MANUFACTURER_ID = const(0xFE)
_REG_DIE_ID = const(0xFF)

_CONFIG_DEFAULT = const(0x4127)
_CONFIG_RST = const(0x8000)
_AVG = (1, 4, 16, 64, 128, 256, 512, 1024)
_CT_US = (140, 204, 332, 588, 1100, 2116, 4156, 8244)

# Mask/Enable bits
_SOL = const(0x8000)
_SUL = const(0x4000)
_BOL = const(0x2000)
_BUL = const(0x1000)
_POL = const(0x0800)
_CNVR = const(0x0400)
_AFF = const(0x0010)
_CVRF = const(0x0008)
_OVF = const(0x0004)
_APOL = const(0x0002)
_LEN = const(0x0001)
_MASK_WRITABLE = const(0xFC03)  # SOL SUL BOL BUL POL CNVR APOL LEN


def _s16(v):
    return v - 0x10000 if v & 0x8000 else v


def _gcd(a, b):
    while b:
        a, b = b, a % b
    return a


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


class INA226Model:
    """Register-level model of the TI INA226 (see the module docstring)."""

    def __init__(self, shunt_ohm=0.002, clock=None, manufacturer_id=0x5449, die_id=0x2260):
        if shunt_ohm <= 0:
            raise ValueError("shunt_ohm must be > 0")
        self.shunt_nohm = int(shunt_ohm * 1e9 + 0.5)
        # mA * nOhm / 2_500_000 pV, reduced by their gcd so the product stays a small
        # int on a 32-bit port (20 A * 1 mOhm in pV would be a big int: it allocated)
        g = _gcd(self.shunt_nohm, 2500000)
        self._cur_num = self.shunt_nohm // g
        self._cur_den = 2500000 // g
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
        raw = _div_round(int(ma) * self._cur_num, self._cur_den)
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
        return (_AVG[(c >> 9) & 7], _CT_US[(c >> 6) & 7], _CT_US[(c >> 3) & 7], c & 7)

    # ---------------------------------------------------------------- I2C device protocol

    def read_mem(self, reg, buf):
        if not self.answering:
            raise OSError(self._nack_errno)
        self._catch_up()
        if reg == _REG_MASK_ENABLE:
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
        if reg == _REG_CONFIG:
            if v & _CONFIG_RST:
                self._reset_registers()
                return
            self._config = (v & 0x0FFF) | 0x4000
            self._flags &= ~_CVRF
            self._restart()
        elif reg == _REG_CAL:
            self._cal = v & 0x7FFF  # D15 is reserved
            if self.clock is None and self._continuous():
                self._convert()
        elif reg == _REG_MASK_ENABLE:
            self._mask = v & _MASK_WRITABLE
        elif reg == _REG_ALERT_LIMIT:
            self._limit = v
        # writes to read-only registers are ignored, as on the chip

    # ---------------------------------------------------------------- internals

    def _peek(self, reg):
        if reg == _REG_CONFIG:
            return self._config
        if reg == _REG_SHUNT:
            return self._shunt & 0xFFFF
        if reg == _REG_BUS:
            return self._bus
        if reg == _REG_POWER:
            return self._power
        if reg == _REG_CURRENT:
            return self._current & 0xFFFF
        if reg == _REG_CAL:
            return self._cal
        if reg == _REG_MASK_ENABLE:
            return self._mask | self._flags
        if reg == _REG_ALERT_LIMIT:
            return self._limit
        if reg == _REG_MANUFACTURER_ID:
            return self.manufacturer_id
        if reg == _REG_DIE_ID:
            return self.die_id
        raise OSError(EIO)

    def _reset_registers(self):
        self._config = _CONFIG_DEFAULT
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
        avg = _AVG[(c >> 9) & 7]
        t = 0
        if c & 2:
            t += _CT_US[(c >> 6) & 7]
        if c & 1:
            t += _CT_US[(c >> 3) & 7]
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
