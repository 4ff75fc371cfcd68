"""device.drivers.ina226 against the register model in tests/fakes.py."""

from array import array

from fakes import EIO, ENODEV, TICKS_PERIOD, FakeClock, FakeI2C, FakeINA226
from mpcompat import IS_MICROPYTHON, heap_locked, raises

from device.drivers.ina226 import (
    AVERAGES,
    CONVERSION_TIMES_US,
    INA226,
    INA226Error,
    calibration,
    current_lsb_ua,
)

DUAL = True

ADDR = 0x40


def _setup(shunt_ohm=0.002, log=True, clock=None, **kw):
    i2c = FakeI2C(log=log)
    chip = i2c.add(ADDR, FakeINA226(shunt_ohm=shunt_ohm, clock=clock))
    ina = INA226(i2c, addr=ADDR, shunt_uohm=int(shunt_ohm * 1e6 + 0.5), **kw)
    return i2c, chip, ina


# --------------------------------------------------------------------------- identity


def test_identity_checked_at_construction():
    i2c, _, ina = _setup()
    assert i2c.log[0] == ("r", ADDR, 0xFE, b"\x54\x49")
    assert i2c.log[1] == ("r", ADDR, 0xFF, b"\x22\x60")
    assert ina.addr == ADDR


def test_wrong_manufacturer_id_names_what_was_read():
    i2c = FakeI2C()
    i2c.add(0x45, FakeINA226(manufacturer_id=0x1234))
    with raises(INA226Error) as e:
        INA226(i2c, addr=0x45)
    msg = str(e.value)
    assert "0x45" in msg and "0x1234" in msg and "0x5449" in msg, msg
    assert isinstance(e.value, OSError)
    assert i2c.writes == 0  # nothing written to an unknown chip


def test_wrong_die_id_names_what_was_read():
    i2c = FakeI2C()
    i2c.add(ADDR, FakeINA226(die_id=0x2270))  # e.g. a different part from TI
    with raises(INA226Error, match="die id 0x2270"):
        INA226(i2c)
    i2c = FakeI2C()
    i2c.add(ADDR, FakeINA226(die_id=0x2261))  # another silicon revision is fine
    INA226(i2c)


def test_absent_device_raises_plain_oserror():
    i2c = FakeI2C()
    with raises(OSError) as e:
        INA226(i2c, addr=0x41)
    assert not isinstance(e.value, INA226Error)
    assert e.value.args[0] == ENODEV
    i2c.add(ADDR, FakeINA226()).stop_answering()
    with raises(OSError):
        INA226(i2c)


# --------------------------------------------------------------------------- calibration


def test_current_lsb_and_cal_hand_computed():
    # (shunt uOhm, max mA) -> (LSB uA, CAL): CAL = 0.00512 / (LSB * R)
    cases = (
        ((2000, 20000), (1000, 2560)),  # datasheet: 610.4 uA -> 1 mA; 0.00512/(1e-3*2e-3)
        ((2000, 40000), (2000, 1280)),  # 1220.7 uA -> 2 mA
        ((1000, 10000), (500, 10240)),  # 305.2 uA -> 500 uA; 0.00512/(5e-4*1e-3)
        ((10000, 8000), (500, 1024)),  # 244.1 -> 500 uA; 0.00512/(5e-4*1e-2)
        ((100000, 800), (50, 1024)),  # 24.4 uA -> 50 uA; 0.00512/(5e-5*0.1)
        ((500, 100000), (5000, 2048)),  # 3051.8 -> 5 mA; 0.00512/(5e-3*5e-4)
        ((1500, 20000), (1000, 3413)),  # 3413.33 rounds to 3413 (not exact)
    )
    for (shunt, imax), (lsb, cal) in cases:
        assert current_lsb_ua(shunt, imax) == lsb, (shunt, imax, current_lsb_ua(shunt, imax))
        assert calibration(lsb, shunt) == cal, (shunt, lsb, calibration(lsb, shunt))


def test_lsb_grows_to_keep_cal_in_15_bits():
    # 0.5 mOhm, 1 A: 30.5 uA would need CAL 335544; LSB grows until CAL <= 32767.
    lsb = current_lsb_ua(500, 1000)
    assert lsb == 500, lsb
    assert calibration(lsb, 500) == 20480


def test_cal_and_lsbs_are_written():
    i2c, chip, ina = _setup(max_current_ma=20000)
    assert (ina.current_lsb_ua, ina.power_lsb_uw, ina.cal) == (1000, 25000, 2560)
    assert chip.reg(0x05) == 2560
    assert ina.config == 0x4527  # avg 16, 1.1 ms, 1.1 ms, continuous shunt+bus
    assert chip.reg(0x00) == 0x4527
    assert chip.reg(0x06) & 0xFC03 == 0 and chip.reg(0x07) == 0
    assert ina.conversion_time_us == 16 * 2200


# --------------------------------------------------------------------------- readings


def test_datasheet_example_readings():
    _, chip, ina = _setup(max_current_ma=20000)
    chip.set_current_ma(10000)
    chip.set_bus_mv(11980)
    assert ina.shunt_uv() == 20000
    assert ina.bus_mv() == 11980
    assert ina.current_ma() == 10000
    assert ina.power_mw() == 4792 * 25 == 119800


def test_sweep_against_model_2mohm_40a():
    _, chip, ina = _setup(max_current_ma=40000)
    assert ina.current_lsb_ua == 2000
    out = array("i", [0, 0, 0])
    for mv in range(11000, 12601, 200):
        for ma in range(0, 40001, 2500):
            chip.set_bus_mv(mv)
            chip.set_current_ma(ma)
            ina.read_into(out)
            bus_reg = chip.reg(0x02)
            cur_reg = chip.reg(0x04)
            pow_reg = chip.reg(0x03)
            # Exact scaling of the registers
            assert out[0] == bus_reg * 5 // 4, (mv, ma, out[0])
            assert out[1] == cur_reg * 2, (mv, ma, out[1])
            assert out[2] == pow_reg * 50, (mv, ma, out[2])
            # and close to the physical truth: bus within 1.25 mV, current within
            # the shunt LSB (1.25 mA) plus the current LSB, power within 0.1 %.
            assert abs(out[0] - mv) <= 1, (mv, out[0])
            assert abs(out[1] - ma) <= 4, (ma, out[1])
            true_mw = mv * ma // 1000
            assert abs(out[2] - true_mw) <= true_mw // 1000 + 50, (mv, ma, out[2], true_mw)


def test_negative_current():
    _, chip, ina = _setup(max_current_ma=20000)
    chip.set_bus_mv(12000)
    chip.set_current_ma(-7500)
    assert ina.shunt_uv() == -15000
    assert ina.current_ma() == -7500
    assert ina.power_mw() == 7500 * 12  # the power register is a magnitude
    chip.set_shunt_reg(-1)
    assert ina.shunt_uv() == -2  # -2.5 uV truncated towards zero
    assert ina.current_ma() == -1  # -1 * 2560 / 2048 -> -1 (truncated by the chip)


def test_sub_milliamp_lsb_truncates_symmetrically():
    # 100 mOhm, 800 mA max -> 50 uA/bit, 1.25 mW/bit
    _, chip, ina = _setup(shunt_ohm=0.1, max_current_ma=800)
    assert (ina.current_lsb_ua, ina.power_lsb_uw) == (50, 1250)
    chip.set_bus_mv(5000)
    chip.set_current_ma(123)
    reg = chip.reg(0x04)
    assert ina.current_ma() == reg * 50 // 1000 == 123, (reg, ina.current_ma())
    chip.set_current_ma(-123)
    assert ina.current_ma() == -123
    assert ina.power_mw() == chip.reg(0x03) * 1250 // 1000


def test_extreme_registers_stay_small():
    _, chip, ina = _setup(max_current_ma=40000)
    chip.set_shunt_reg(-32768)
    chip.set_bus_mv(40960)
    assert ina.shunt_uv() == -81920
    assert ina.bus_mv() == 32767 * 5 // 4
    assert ina.current_ma() == -32768 * 1280 // 2048 * 2 == -40960
    assert ina.power_mw() == chip.reg(0x03) * 50


def test_read_into_does_not_allocate():
    _, chip, ina = _setup(log=False, max_current_ma=20000)
    chip.set_bus_mv(12000)
    chip.set_current_ma(15000)
    out = array("i", [0, 0, 0])
    _locked(lambda: ina.read_into(out))
    assert list(out) == [12000, 15000, 180000], list(out)
    _locked(lambda: _read_all(ina, out))
    assert list(out) == [30000, 12000, 15000]


def _read_all(ina, out):
    out[0] = ina.shunt_uv()
    out[1] = ina.bus_mv()
    out[2] = ina.current_ma()
    ina.power_mw()
    ina.ready()
    ina.alert()


def test_heap_lock_really_catches_allocation():
    # Guards the zero-allocation tests against a heap_lock that does nothing.
    if not IS_MICROPYTHON:
        return
    with raises(MemoryError):
        _locked(lambda: [1, 2, 3])


# --------------------------------------------------------------------------- config


def test_averaging_and_conversion_time_bits():
    for i in range(8):
        _, chip, ina = _setup(
            avg=AVERAGES[i], vbus_ct_us=CONVERSION_TIMES_US[i], vsh_ct_us=CONVERSION_TIMES_US[7 - i]
        )
        assert ina.config == 0x4000 | i << 9 | i << 6 | (7 - i) << 3 | 7, hex(ina.config)
        assert chip.config_fields() == (
            AVERAGES[i],
            CONVERSION_TIMES_US[i],
            CONVERSION_TIMES_US[7 - i],
            7,
        )


def test_invalid_config_values_list_the_allowed_ones():
    i2c = FakeI2C()
    i2c.add(ADDR, FakeINA226())
    with raises(ValueError, match="1, 4, 16, 64, 128, 256, 512, 1024") as e:
        INA226(i2c, avg=10)
    assert "avg" in str(e.value)
    with raises(ValueError, match="140, 204, 332, 588, 1100, 2116, 4156, 8244"):
        INA226(i2c, vbus_ct_us=1000)
    with raises(ValueError, match="vsh_ct_us"):
        INA226(i2c, vsh_ct_us=0)
    for bad in (0, -2000, 2.0, None):
        with raises(ValueError, match="shunt_uohm"):
            INA226(i2c, shunt_uohm=bad)
    for bad in (0, 20.5, 2000000):
        with raises(ValueError, match="max_current_ma"):
            INA226(i2c, max_current_ma=bad)
    with raises(ValueError, match="81920 uV"):
        INA226(i2c, shunt_uohm=2000, max_current_ma=41000)
    assert i2c.writes == 0  # validation happens before touching the bus


# --------------------------------------------------------------------------- alert


def test_under_voltage_alert_bits():
    _, chip, ina = _setup()
    ina.set_under_voltage_alert(11000)
    assert chip.reg(0x07) == 8800
    assert chip.reg(0x06) & 0xFC03 == 0x1001  # BUL | LEN
    ina.set_under_voltage_alert(11001, latch=False)
    assert chip.reg(0x07) == 8801  # 11001 / 1.25 = 8800.8 -> 8801
    assert chip.reg(0x06) & 0xFC03 == 0x1000
    ina.set_under_voltage_alert(None)
    assert chip.reg(0x06) & 0xFC03 == 0 and chip.reg(0x07) == 0
    ina.set_under_voltage_alert(11000)
    ina.set_under_voltage_alert(0)  # 0 disables too (the config's "off")
    assert chip.reg(0x06) & 0xFC03 == 0 and chip.reg(0x07) == 0
    for bad in (-1, 40961, 11.5, "11000"):
        with raises(ValueError):
            ina.set_under_voltage_alert(bad)


def test_under_voltage_alert_fires_and_latches():
    _, chip, ina = _setup()
    chip.set_bus_mv(12000)
    ina.set_under_voltage_alert(11000)
    assert not ina.alert()
    chip.set_bus_mv(10800)  # a dip between two polls
    chip.set_bus_mv(12000)
    assert ina.alert()
    assert not ina.alert()


def test_alert_not_swallowed_by_ready():
    _, chip, ina = _setup()
    chip.set_bus_mv(12000)
    ina.set_under_voltage_alert(11000)
    chip.set_bus_mv(10000)
    assert ina.ready()  # this read clears the latched AFF on the chip...
    assert not chip.reg(0x06) & 0x0010
    assert ina.alert()  # ...but the driver remembers it


def test_transparent_alert_follows_the_bus():
    _, chip, ina = _setup()
    chip.set_bus_mv(12000)
    ina.set_under_voltage_alert(11000, latch=False)
    chip.set_bus_mv(10000)
    assert ina.alert()
    chip.set_bus_mv(12000)
    assert not ina.alert()


# --------------------------------------------------------------------------- waiting, reset


def test_wait_ready_succeeds_after_one_conversion():
    clock = FakeClock(start_ms=TICKS_PERIOD - 20)  # across the tick wrap
    _, chip, ina = _setup(clock=clock)
    chip.set_bus_mv(12000)
    start = clock.ticks_ms()
    assert ina.wait_ready(100, clock.ticks_ms, clock.sleep_ms)
    waited = clock.now_ms - (TICKS_PERIOD - 20)
    assert 35 <= waited <= 37, waited  # 16 * (1.1 + 1.1) ms = 35.2 ms
    assert ina.bus_mv() == 12000
    assert start != clock.ticks_ms()


def test_wait_ready_times_out_with_injected_clock():
    clock = FakeClock(start_ms=TICKS_PERIOD - 3)
    _, chip, ina = _setup(clock=clock, avg=1024, vbus_ct_us=8244, vsh_ct_us=8244)
    # one conversion takes 1024 * 16.5 ms = 16.9 s
    assert not ina.wait_ready(50, clock.ticks_ms, clock.sleep_ms, poll_ms=5)
    assert 50 <= clock.now_ms - (TICKS_PERIOD - 3) <= 55
    assert clock.sleeps <= 11


def test_wait_ready_is_bounded_even_if_the_clock_is_stuck():
    clock = FakeClock()
    _, chip, ina = _setup(clock=clock, avg=1024)
    sleeps = []
    assert not ina.wait_ready(20, clock.ticks_ms, sleeps.append, poll_ms=2)
    assert len(sleeps) <= 20 // 2 + 2, len(sleeps)


def test_reset_restores_driver_configuration():
    i2c, chip, ina = _setup(avg=64)
    ina.set_under_voltage_alert(11500)
    n = len(i2c.log)
    ina.reset()
    assert i2c.log[n] == ("w", ADDR, 0x00, b"\x80\x00")
    assert chip.reg(0x00) == ina.config and chip.config_fields()[0] == 64
    assert chip.reg(0x05) == ina.cal
    assert chip.reg(0x07) == 9200 and chip.reg(0x06) & 0xFC03 == 0x1001


# --------------------------------------------------------------------------- bus faults


def test_i2c_fault_mid_read_raises_oserror():
    i2c, chip, ina = _setup()
    chip.set_bus_mv(12000)
    out = array("i", [0, 0, 0])
    i2c.fail_next(1, EIO)
    with raises(OSError) as e:
        ina.read_into(out)
    assert e.value.args[0] == EIO and not isinstance(e.value, INA226Error)
    ina.read_into(out)  # the next tick works again
    assert out[0] == 12000
    chip.stop_answering()
    with raises(OSError) as e:
        ina.current_ma()
    assert e.value.args[0] == ENODEV


_locked = heap_locked


def test_state_indices_agree_with_the_setup_module():
    # device.drivers.ina226 and its configuring side (ina226_setup) index one state
    # array; each names the indices it uses as private consts (folded on MicroPython,
    # plain module attributes on CPython, where they are compared).
    if IS_MICROPYTHON:
        return
    from device.drivers import ina226, ina226_setup

    names = [n for n in vars(ina226) if n.startswith(("_ADDR", "_CUR_", "_POW_", "_AFF"))]
    assert len(names) == 6, names
    for n in names:
        assert getattr(ina226, n) == getattr(ina226_setup, n), n
    assert ina226._N_STATE == max(getattr(ina226_setup, n) for n in names) + 1 == 14


def test_configuring_side_is_loaded_on_demand():
    # The class answers the configuring methods and the settings from
    # device.drivers.ina226_setup, also after that module was forgotten (as
    # device.app._release does once configured).
    import sys

    i2c, chip, ina = _setup(log=False)
    sys.modules.pop("device.drivers.ina226_setup", None)
    import device.drivers as pkg

    pkg.__dict__.pop("ina226_setup", None)
    assert ina.cal == 2560 and ina.addr == ADDR and ina.current_lsb_ua == 1000
    ina.set_under_voltage_alert(11000)
    assert chip.reg(0x07) == (11000 * 4 + 2) // 5
    with raises(AttributeError):
        _ = ina.no_such_thing
