"""TI INA226 bus-voltage / current / power monitor over I2C (datasheet SBOS547).

Used on the module's 12 V input: the chip measures the shunt voltage (2.5 uV/bit,
signed, +-81.92 mV full scale) and the bus voltage (1.25 mV/bit, 0..40.96 V), and
computes current and power in hardware from the Calibration register:

    Current_LSB = max_current / 2**15          (finest resolution for that maximum)
    CAL         = 0.00512 / (Current_LSB * R_shunt)
    Current_reg = Shunt_reg * CAL / 2048
    Power_reg   = Current_reg * Bus_reg / 20000,   Power_LSB = 25 * Current_LSB

This driver rounds Current_LSB *up* to a 1-2-5 step in micro-amps (1, 2, 5, 10, 20,
50, ... uA) so the scaled readings are exact integer arithmetic, and also never
below the LSB that keeps CAL <= 32767 (CAL's D15 is reserved). In integers, with
the shunt in micro-ohms: CAL = round(5_120_000_000 / (lsb_ua * shunt_uohm)).

Worked example (the datasheet's Table 1): 2 mOhm shunt, 20 A maximum.
20_000_000 uA / 32768 = 610.4 uA -> 1000 uA (1 mA/bit); CAL = 5.12e9 / (1000 * 2000)
= 2560 (0x0A00); Power_LSB = 25 mW. At 10 A and 11.98 V: Shunt_reg = 20 mV / 2.5 uV
= 8000, Current_reg = 8000 * 2560 / 2048 = 10000 -> 10000 mA, Bus_reg = 9584 ->
11980 mV, Power_reg = 10000 * 9584 / 20000 = 4792 -> 119800 mW.

Readings (all ints, no allocation, every intermediate within +-2**30):

- ``bus_mv()``: Bus_reg * 1.25, truncated; exact to the mV over the whole 0..40.96 V
  range when Bus_reg is a multiple of 4, else at most 0.75 mV low.
- ``shunt_uv()``: Shunt_reg * 2.5 truncated towards zero, signed, +-81920 uV.
- ``current_ma()``: Current_reg * Current_LSB, signed, truncated towards zero; exact
  whenever Current_LSB is a whole number of mA (max_current_ma > 16384, e.g. the
  default 20 A, or 40 A on 2 mOhm -> 2 mA/bit), else within one mA.
- ``power_mw()``: Power_reg * Power_LSB, truncated; the register is unsigned (a
  magnitude). Exact when 25 * Current_LSB is a whole number of mW (Current_LSB a
  multiple of 40 uA, true for every LSB >= 200 uA in the 1-2-5 series).

The bound: |Current_reg| <= 32768 and Power_reg <= 65535 are multiplied by the whole
part (mA or mW per bit, <= 50 and <= 1250 for max_current_ma <= 1_000_000) and by
the sub-unit part (< 1000) separately, so no product exceeds 65535 * 1250 < 2**27.

The construction, the alert and the other configuring code are in
device.drivers.ina226_setup, loaded when used (``INA226.__getattr__`` and this
module's ``__getattr__`` answer for it).

Errors: bus trouble is the plain ``OSError`` that ``machine.I2C`` raises (callers
catch OSError); a chip that answers but is not an INA226 raises ``INA226Error``, an
OSError subclass whose message names the address and the id read (``args[0]`` is
that message, not an errno). Bad constructor/config values raise ValueError.

The Mask/Enable register is read-to-clear (CVRF, and AFF when latched): every read
of it goes through one method that remembers a seen AFF until ``alert()`` reports it,
so ``wait_ready()`` cannot swallow an under-voltage alert.
"""

from array import array

try:
    from micropython import const
except ImportError:
    const = lambda x: x  # noqa: E731

_REG_SHUNT = const(0x01)
_REG_BUS = const(0x02)
_REG_POWER = const(0x03)
_REG_CURRENT = const(0x04)
_REG_MASK_ENABLE = const(0x06)
_ME_AFF = const(0x0010)  # Mask/Enable: alert function flag
_ME_CVRF = const(0x0008)  # Mask/Enable: conversion ready flag

# The state array (``INA226._c``); device.drivers.ina226_setup fills it and names the
# same indices (tests/test_ina226.py checks the two lists agree).
_ADDR = const(0)
_CUR_WHOLE = const(1)  # mA per Current_reg bit, whole part
_CUR_FRAC = const(2)  # ... and thousandths
_POW_WHOLE = const(3)  # mW per Power_reg bit
_POW_FRAC = const(4)
_AFF_SEEN = const(13)  # an AFF read and not yet reported by alert()
_N_STATE = const(14)


def __getattr__(name):
    """The configuring side's names (``INA226Error``, ``current_lsb_ua``,
    ``calibration``, ``AVERAGES``, ...): device.drivers.ina226_setup, on demand."""
    from device.drivers import ina226_setup

    return getattr(ina226_setup, name)


class INA226:
    """One INA226 on an injected I2C bus. See the module docstring for the math.

    ``INA226(i2c, addr=0x40, shunt_uohm=2000, max_current_ma=20000, avg=16,
    vbus_ct_us=1100, vsh_ct_us=1100)`` checks the ids, then writes Config (continuous
    shunt and bus), Calibration, and clears the alert configuration. Attributes:
    ``addr``, ``shunt_uohm``, ``current_lsb_ua``, ``power_lsb_uw``, ``cal``, ``config``
    (the Config register value written), ``conversion_time_us`` (one full averaged
    conversion of both channels). Methods: the readings ``bus_mv()``, ``shunt_uv()``,
    ``current_ma()``, ``power_mw()``, ``read_into(out)``; ``read_reg``,
    ``write_reg``, ``read_mask_enable``, ``ready``, ``alert``, ``wait_ready``,
    ``reset``, ``set_under_voltage_alert``.

    The class holds the readings and the flags (allocation-free); the configuring
    methods (``write_reg``, ``wait_ready``, ``reset``, ``set_under_voltage_alert``) and
    the settings are device.drivers.ina226_setup's, answered by ``__getattr__`` (never
    asked on the tick): that code is RAM only while configuring.
    """

    def __init__(
        self,
        i2c,
        addr=0x40,
        shunt_uohm=2000,
        max_current_ma=20000,
        avg=16,
        vbus_ct_us=1100,
        vsh_ct_us=1100,
    ):
        from device.drivers import ina226_setup

        self._i2c = i2c
        self._buf = bytearray(2)  # the one scratch buffer, reads and writes
        self._mv = memoryview(self._buf)
        self._c = array("i", bytes(4 * _N_STATE))
        ina226_setup.init(self, addr, shunt_uohm, max_current_ma, avg, vbus_ct_us, vsh_ct_us)

    def __getattr__(self, name):
        from device.drivers import ina226_setup

        return ina226_setup.attr(self, name)

    def read_reg(self, reg):
        """Raw register value, unsigned 16-bit (one I2C read into the scratch buffer)."""
        self._i2c.readfrom_mem_into(self._c[_ADDR], reg, self._mv)
        b = self._buf
        return (b[0] << 8) | b[1]

    def read_mask_enable(self):
        """Mask/Enable register (read-to-clear flags); remembers AFF for ``alert()``."""
        v = self.read_reg(_REG_MASK_ENABLE)
        if v & _ME_AFF:
            self._c[_AFF_SEEN] = 1
        return v

    # ------------------------------------------------------------------ readings

    def bus_mv(self):
        return self.read_reg(_REG_BUS) * 5 // 4

    def shunt_uv(self):
        v = self.read_reg(_REG_SHUNT)
        if v & 0x8000:
            v -= 0x10000
        if v < 0:
            return -(-v * 5 // 2)
        return v * 5 // 2

    def current_ma(self):
        v = self.read_reg(_REG_CURRENT)
        if v & 0x8000:
            v -= 0x10000
        c = self._c
        if v < 0:
            v = -v
            return -(v * c[_CUR_WHOLE] + v * c[_CUR_FRAC] // 1000)
        return v * c[_CUR_WHOLE] + v * c[_CUR_FRAC] // 1000

    def power_mw(self):
        v = self.read_reg(_REG_POWER)
        c = self._c
        return v * c[_POW_WHOLE] + v * c[_POW_FRAC] // 1000

    def read_into(self, out):
        """Fill ``out[0..2]`` with bus mV, current mA, power mW (three reads, no alloc)."""
        out[0] = self.bus_mv()
        out[1] = self.current_ma()
        out[2] = self.power_mw()

    # ------------------------------------------------------------------ flags

    def ready(self):
        """True if a conversion completed since Mask/Enable was last read (clears CVRF)."""
        return (self.read_mask_enable() & _ME_CVRF) != 0

    def alert(self):
        """True if the alert function fired since the last call (reads Mask/Enable).

        With a latched alert the chip keeps AFF until read; this also reports an AFF
        seen by ``ready()``/``wait_ready()`` in between, then forgets it.
        """
        self.read_mask_enable()
        c = self._c
        seen = c[_AFF_SEEN] != 0
        c[_AFF_SEEN] = 0
        return seen
