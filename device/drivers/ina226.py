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

Errors: bus trouble is the plain ``OSError`` that ``machine.I2C`` raises (callers
catch OSError); a chip that answers but is not an INA226 raises ``INA226Error``, an
OSError subclass whose message names the address and the id read (``args[0]`` is
that message, not an errno). Bad constructor/config values raise ValueError.

The Mask/Enable register is read-to-clear (CVRF, and AFF when latched): every read
of it goes through one method that remembers a seen AFF until ``alert()`` reports it,
so ``wait_ready()`` cannot swallow an under-voltage alert.
"""

try:
    from micropython import const
except ImportError:
    const = lambda x: x

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

MANUFACTURER_ID = const(0x5449)  # "TI"
DIE_ID = const(0x2260)  # DID 0x226, revision 0

_CONFIG_RST = const(0x8000)
_CONFIG_FIXED = const(0x4000)  # D14 reads back as 1
_MODE_SHUNT_BUS_CONTINUOUS = const(0x0007)
_AVG_SHIFT = const(9)
_VBUSCT_SHIFT = const(6)
_VSHCT_SHIFT = const(3)

# Mask/Enable bits
_ME_BUL = const(0x1000)  # bus voltage under-limit
_ME_AFF = const(0x0010)  # alert function flag
_ME_CVRF = const(0x0008)  # conversion ready flag
_ME_LEN = const(0x0001)  # alert latch enable

AVERAGES = (1, 4, 16, 64, 128, 256, 512, 1024)  # AVG code = index
# CT code = index; frozen-ints: compared only (by _code)
CONVERSION_TIMES_US = (140, 204, 332, 588, 1100, 2116, 4156, 8244)

_CAL_NUMERATOR = 5120000000  # 0.00512 expressed for uA * uOhm
_CAL_MAX = const(0x7FFF)
_SHUNT_FULL_SCALE_NV = const(81920000)  # 81.92 mV: max_current_ma * shunt_uohm limit
_MAX_CURRENT_MA_LIMIT = const(1000000)
_BUS_FULL_SCALE_MV = const(40960)


class INA226Error(OSError):
    """The device at the address is not an INA226 (wrong manufacturer or die id)."""


def _nice_ceil(x):
    """Smallest 1-2-5 step (1, 2, 5, 10, 20, ...) that is >= x (x >= 1)."""
    base = 1
    while True:
        for m in (1, 2, 5):
            if m * base >= x:
                return m * base
        base *= 10


def current_lsb_ua(shunt_uohm, max_current_ma):
    """Current register LSB in uA chosen for a shunt and a maximum current.

    >>> current_lsb_ua(2000, 20000)
    1000
    >>> current_lsb_ua(2000, 40000)
    2000
    """
    need = (max_current_ma * 1000 + 32767) // 32768  # ceil(max_ua / 2**15)
    d = 32767 * shunt_uohm  # CAL <= 32767  <=>  lsb >= 5.12e9 / (32767 * R)
    need_cal = (_CAL_NUMERATOR + d - 1) // d
    return _nice_ceil(max(need, need_cal, 1))


def calibration(lsb_ua, shunt_uohm):
    """CAL register value: round(0.00512 / (lsb * R)), lsb in uA, R in uOhm.

    >>> calibration(1000, 2000)
    2560
    """
    d = lsb_ua * shunt_uohm
    return (_CAL_NUMERATOR + d // 2) // d


def _code(value, table, what):
    for i in range(len(table)):
        if table[i] == value:
            return i
    raise ValueError(
        "%s must be one of %s, got %r" % (what, ", ".join(str(t) for t in table), value)
    )


def _check_int(value, lo, hi, what):
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or value > hi:
        raise ValueError("%s must be an int %d..%d, got %r" % (what, lo, hi, value))


class INA226:
    """One INA226 on an injected I2C bus. See the module docstring for the math.

    ``INA226(i2c, addr=0x40, shunt_uohm=2000, max_current_ma=20000, avg=16,
    vbus_ct_us=1100, vsh_ct_us=1100)`` checks the ids, then writes Config (continuous
    shunt and bus), Calibration, and clears the alert configuration. Attributes:
    ``addr``, ``shunt_uohm``, ``current_lsb_ua``, ``power_lsb_uw``, ``cal``, ``config``
    (the Config register value written), ``conversion_time_us`` (one full averaged
    conversion of both channels).
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
        _check_int(shunt_uohm, 1, 1000000000, "shunt_uohm")
        _check_int(max_current_ma, 1, _MAX_CURRENT_MA_LIMIT, "max_current_ma")
        if max_current_ma * shunt_uohm > _SHUNT_FULL_SCALE_NV:
            raise ValueError(
                "max_current_ma %d on a %d uOhm shunt is %d uV, beyond the INA226's"
                " 81920 uV shunt range"
                % (max_current_ma, shunt_uohm, max_current_ma * shunt_uohm // 1000)
            )
        avg_code = _code(avg, AVERAGES, "avg")
        vbus_code = _code(vbus_ct_us, CONVERSION_TIMES_US, "vbus_ct_us")
        vsh_code = _code(vsh_ct_us, CONVERSION_TIMES_US, "vsh_ct_us")

        self._i2c = i2c
        self.addr = addr
        self._buf = bytearray(2)
        self._mv = memoryview(self._buf)
        self._wbuf = bytearray(2)

        self.shunt_uohm = shunt_uohm
        self.current_lsb_ua = current_lsb_ua(shunt_uohm, max_current_ma)
        self.cal = calibration(self.current_lsb_ua, shunt_uohm)
        self.power_lsb_uw = 25 * self.current_lsb_ua
        # whole unit per bit + sub-unit remainder in thousandths (see the docstring)
        self._cur_whole = self.current_lsb_ua // 1000
        self._cur_frac = self.current_lsb_ua % 1000
        self._pow_whole = self.power_lsb_uw // 1000
        self._pow_frac = self.power_lsb_uw % 1000
        self.config = (
            _CONFIG_FIXED
            | (avg_code << _AVG_SHIFT)
            | (vbus_code << _VBUSCT_SHIFT)
            | (vsh_code << _VSHCT_SHIFT)
            | _MODE_SHUNT_BUS_CONTINUOUS
        )
        self.conversion_time_us = avg * (vbus_ct_us + vsh_ct_us)
        self._alert_mask = 0
        self._alert_limit = 0
        self._aff_seen = False

        self._check_identity()
        self._configure()

    # ------------------------------------------------------------------ setup

    def _check_identity(self):
        mid = self.read_reg(_REG_MANUFACTURER_ID)
        if mid != MANUFACTURER_ID:
            raise INA226Error(
                "no INA226 at I2C address 0x%02x: manufacturer id 0x%04x, expected 0x%04x"
                % (self.addr, mid, MANUFACTURER_ID)
            )
        did = self.read_reg(_REG_DIE_ID)
        if did >> 4 != DIE_ID >> 4:  # any silicon revision (low nibble)
            raise INA226Error(
                "no INA226 at I2C address 0x%02x: die id 0x%04x, expected 0x%04x"
                % (self.addr, did, DIE_ID)
            )

    def _configure(self):
        self.write_reg(_REG_CONFIG, self.config)
        self.write_reg(_REG_CAL, self.cal)
        self.write_reg(_REG_ALERT_LIMIT, self._alert_limit)
        self.write_reg(_REG_MASK_ENABLE, self._alert_mask)
        self._aff_seen = False

    def reset(self):
        """Reset the chip (Config RST) and re-apply this driver's configuration.

        Afterwards the first results arrive one ``conversion_time_us`` later; use
        ``wait_ready()``.
        """
        self.write_reg(_REG_CONFIG, _CONFIG_RST)
        self._configure()

    def set_under_voltage_alert(self, mv, latch=True):
        """Raise AFF (and the ALERT pin) when the bus drops below ``mv``.

        Programs Alert Limit with ``mv`` in bus LSBs (1.25 mV, rounded) and Mask/Enable
        with BUL, plus LEN when ``latch`` (a dip between two polls is then not lost).
        ``None`` or 0 disables the alert (and clears both registers).
        """
        if mv is None or mv == 0:
            self._alert_mask = 0
            self._alert_limit = 0
        else:
            _check_int(mv, 0, _BUS_FULL_SCALE_MV, "under-voltage alert mv")
            self._alert_limit = (mv * 4 + 2) // 5
            self._alert_mask = _ME_BUL | (_ME_LEN if latch else 0)
        self.write_reg(_REG_ALERT_LIMIT, self._alert_limit)
        self.write_reg(_REG_MASK_ENABLE, self._alert_mask)
        self._aff_seen = False

    # ------------------------------------------------------------------ registers

    def read_reg(self, reg):
        """Raw register value, unsigned 16-bit (one I2C read into the scratch buffer)."""
        self._i2c.readfrom_mem_into(self.addr, reg, self._mv)
        b = self._buf
        return (b[0] << 8) | b[1]

    def write_reg(self, reg, value):
        w = self._wbuf
        w[0] = (value >> 8) & 0xFF
        w[1] = value & 0xFF
        self._i2c.writeto_mem(self.addr, reg, w)

    def _read_s16(self, reg):
        v = self.read_reg(reg)
        if v & 0x8000:
            v -= 0x10000
        return v

    def read_mask_enable(self):
        """Mask/Enable register (read-to-clear flags); remembers AFF for ``alert()``."""
        v = self.read_reg(_REG_MASK_ENABLE)
        if v & _ME_AFF:
            self._aff_seen = True
        return v

    # ------------------------------------------------------------------ readings

    def bus_mv(self):
        return self.read_reg(_REG_BUS) * 5 // 4

    def shunt_uv(self):
        v = self._read_s16(_REG_SHUNT)
        if v < 0:
            return -(-v * 5 // 2)
        return v * 5 // 2

    def current_ma(self):
        v = self._read_s16(_REG_CURRENT)
        if v < 0:
            v = -v
            return -(v * self._cur_whole + v * self._cur_frac // 1000)
        return v * self._cur_whole + v * self._cur_frac // 1000

    def power_mw(self):
        v = self.read_reg(_REG_POWER)
        return v * self._pow_whole + v * self._pow_frac // 1000

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
        seen = self._aff_seen
        self._aff_seen = False
        return seen

    def wait_ready(self, timeout_ms, ticks_ms, sleep_ms, poll_ms=1):
        """Poll CVRF until a conversion completes; False after ``timeout_ms``.

        ``ticks_ms``/``sleep_ms`` are injected (the HAL's). Bounded twice: by the
        clock, and by a poll count in case the clock does not move.
        """
        if poll_ms < 1:
            poll_ms = 1
        start = ticks_ms()
        polls = timeout_ms // poll_ms + 2
        while polls > 0:
            if self.ready():
                return True
            if _diff(ticks_ms(), start) >= timeout_ms:
                return False
            sleep_ms(poll_ms)
            polls -= 1
        return False


def _diff(a, b):
    """ticks_diff(a, b) for a 2**30 tick period without leaving small-int range."""
    d = a - b
    if d >= 0x20000000:
        d = d - 0x20000000 - 0x20000000
    elif d < -0x20000000:
        d = d + 0x20000000 + 0x20000000
    return d
