"""device.drivers.ina226's configuring side, imported when needed and forgotten after.

The ``INA226`` driver keeps in its class only what the control tick reads (``read_into``
and the three readings it makes); this module holds the rest: the construction (the
identity check, the Config and Calibration registers and their arithmetic), the
under-voltage alert's setup, ``reset``, ``wait_ready`` and the settings read back by
name. The
driver reaches it through ``INA226.__getattr__`` (methods and attributes an instance
does not hold) and the module's ``__getattr__`` (``INA226Error``, ``current_lsb_ua``,
...), so ``device.drivers.ina226``'s API is unchanged; ``device.app._release`` forgets
this module after configuring (its functions are RAM only while it is loaded; the
bytecode stays in flash). See device/drivers/ina226.py for the math.
"""

try:
    from micropython import const
except ImportError:
    const = lambda x: x  # noqa: E731

_REG_CONFIG = const(0x00)
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
_ME_LEN = const(0x0001)  # alert latch enable

AVERAGES = (1, 4, 16, 64, 128, 256, 512, 1024)  # AVG code = index
# CT code = index; frozen-ints: compared only (by _code)
CONVERSION_TIMES_US = (140, 204, 332, 588, 1100, 2116, 4156, 8244)

_CAL_NUMERATOR = 5120000000  # 0.00512 expressed for uA * uOhm
_SHUNT_FULL_SCALE_NV = const(81920000)  # 81.92 mV: max_current_ma * shunt_uohm limit
_MAX_CURRENT_MA_LIMIT = const(1000000)
_BUS_FULL_SCALE_MV = const(40960)

# The driver's state array (``INA226._c``), as device/drivers/ina226.py indexes it
# (tests/test_ina226.py checks the two lists agree).
_ADDR = const(0)
_CUR_WHOLE = const(1)  # mA per Current_reg bit, whole part
_CUR_FRAC = const(2)  # ... and thousandths
_POW_WHOLE = const(3)  # mW per Power_reg bit
_POW_FRAC = const(4)
_SHUNT = const(5)  # shunt_uohm
_LSB = const(6)  # current_lsb_ua
_POW_LSB = const(7)  # power_lsb_uw
_CAL = const(8)  # the Calibration register value written
_CONFIG = const(9)  # the Config register value written
_CONV = const(10)  # conversion_time_us
_ALERT_MASK = const(11)
_ALERT_LIMIT = const(12)
_AFF_SEEN = const(13)  # an AFF read and not yet reported by alert()


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


def init(ina, addr, shunt_uohm, max_current_ma, avg, vbus_ct_us, vsh_ct_us):
    """``INA226.__init__`` after its buffers: check the arguments, fill the state
    array, check the ids, then write Config (continuous shunt and bus), Calibration,
    and clear the alert configuration."""
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
    c = ina._c
    c[_ADDR] = addr
    c[_SHUNT] = shunt_uohm
    lsb = current_lsb_ua(shunt_uohm, max_current_ma)
    c[_LSB] = lsb
    c[_CAL] = calibration(lsb, shunt_uohm)
    c[_POW_LSB] = 25 * lsb
    # whole unit per bit + sub-unit remainder in thousandths (see the driver's docstring)
    c[_CUR_WHOLE] = lsb // 1000
    c[_CUR_FRAC] = lsb % 1000
    c[_POW_WHOLE] = 25 * lsb // 1000
    c[_POW_FRAC] = 25 * lsb % 1000
    c[_CONFIG] = (
        _CONFIG_FIXED
        | (avg_code << _AVG_SHIFT)
        | (vbus_code << _VBUSCT_SHIFT)
        | (vsh_code << _VSHCT_SHIFT)
        | _MODE_SHUNT_BUS_CONTINUOUS
    )
    c[_CONV] = avg * (vbus_ct_us + vsh_ct_us)
    _check_identity(ina)
    _configure(ina)


def _check_identity(ina):
    addr = ina._c[_ADDR]
    mid = ina.read_reg(_REG_MANUFACTURER_ID)
    if mid != MANUFACTURER_ID:
        raise INA226Error(
            "no INA226 at I2C address 0x%02x: manufacturer id 0x%04x, expected 0x%04x"
            % (addr, mid, MANUFACTURER_ID)
        )
    did = ina.read_reg(_REG_DIE_ID)
    if did >> 4 != DIE_ID >> 4:  # any silicon revision (low nibble)
        raise INA226Error(
            "no INA226 at I2C address 0x%02x: die id 0x%04x, expected 0x%04x" % (addr, did, DIE_ID)
        )


def _configure(ina):
    c = ina._c
    write_reg(ina, _REG_CONFIG, c[_CONFIG])
    write_reg(ina, _REG_CAL, c[_CAL])
    write_reg(ina, _REG_ALERT_LIMIT, c[_ALERT_LIMIT])
    write_reg(ina, _REG_MASK_ENABLE, c[_ALERT_MASK])
    c[_AFF_SEEN] = 0


# ---------------------------------------------------------------- the driver's methods


def reset(ina):
    """Reset the chip (Config RST) and re-apply this driver's configuration.

    Afterwards the first results arrive one ``conversion_time_us`` later; use
    ``wait_ready()``.
    """
    write_reg(ina, _REG_CONFIG, _CONFIG_RST)
    _configure(ina)


def set_under_voltage_alert(ina, mv, latch=True):
    """Raise AFF (and the ALERT pin) when the bus drops below ``mv``.

    Programs Alert Limit with ``mv`` in bus LSBs (1.25 mV, rounded) and Mask/Enable
    with BUL, plus LEN when ``latch`` (a dip between two polls is then not lost).
    ``None`` or 0 disables the alert (and clears both registers).
    """
    c = ina._c
    if mv is None or mv == 0:
        c[_ALERT_MASK] = 0
        c[_ALERT_LIMIT] = 0
    else:
        _check_int(mv, 0, _BUS_FULL_SCALE_MV, "under-voltage alert mv")
        c[_ALERT_LIMIT] = (mv * 4 + 2) // 5
        c[_ALERT_MASK] = _ME_BUL | (_ME_LEN if latch else 0)
    write_reg(ina, _REG_ALERT_LIMIT, c[_ALERT_LIMIT])
    write_reg(ina, _REG_MASK_ENABLE, c[_ALERT_MASK])
    c[_AFF_SEEN] = 0


def write_reg(ina, reg, value):
    """Write a 16-bit register (through the driver's scratch buffer)."""
    w = ina._buf
    w[0] = (value >> 8) & 0xFF
    w[1] = value & 0xFF
    ina._i2c.writeto_mem(ina._c[_ADDR], reg, w)


def wait_ready(ina, timeout_ms, ticks_ms, sleep_ms, poll_ms=1):
    """Poll CVRF until a conversion completes; False after ``timeout_ms``.

    ``ticks_ms``/``sleep_ms`` are injected (the HAL's). Bounded twice: by the
    clock, and by a poll count in case the clock does not move.
    """
    if poll_ms < 1:
        poll_ms = 1
    start = ticks_ms()
    polls = timeout_ms // poll_ms + 2
    while polls > 0:
        if ina.ready():
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


def attr(ina, name):
    """``INA226.__getattr__``: a method above bound to ``ina``, or a setting."""
    methods = (
        "reset",
        "set_under_voltage_alert",
        "write_reg",
        "wait_ready",
    )
    if name in methods:
        fn = globals()[name]
        return lambda *args, **kw: fn(ina, *args, **kw)
    settings = (
        "addr",
        None,
        None,
        None,
        None,
        "shunt_uohm",
        "current_lsb_ua",
        "power_lsb_uw",
        "cal",
        "config",
        "conversion_time_us",
    )
    for i in range(len(settings)):
        if settings[i] == name:
            return ina._c[i]
    raise AttributeError(name)
