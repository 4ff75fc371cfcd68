"""The fakes themselves: the INA226 model against the datasheet, the bus, clock, PWM, pin."""

from fakes import (
    EIO,
    ENODEV,
    IRQ_FALLING,
    IRQ_RISING,
    TICKS_PERIOD,
    FakeADC,
    FakeClock,
    FakeI2C,
    FakeINA226,
    FakePin,
    FakePWM,
    ticks_add,
    ticks_diff,
)
from mpcompat import IS_MICROPYTHON, heap_locked, raises

DUAL = True

ADDR = 0x40


def _reg(i2c, reg):
    b = i2c.readfrom_mem(ADDR, reg, 2)
    return (b[0] << 8) | b[1]


def _write(i2c, reg, value):
    i2c.writeto_mem(ADDR, reg, bytes(((value >> 8) & 0xFF, value & 0xFF)))


def _s16(v):
    return v - 0x10000 if v & 0x8000 else v


def _bus_with_chip(**kw):
    i2c = FakeI2C()
    chip = i2c.add(ADDR, FakeINA226(**kw))
    return i2c, chip


# --------------------------------------------------------------------------- INA226 model


def test_ina226_reset_values_and_ids():
    i2c, _ = _bus_with_chip()
    assert _reg(i2c, 0x00) == 0x4127
    for reg in (0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07):
        assert _reg(i2c, reg) & ~0x0008 == 0, reg  # CVRF may be set by a conversion
    assert _reg(i2c, 0xFE) == 0x5449
    assert _reg(i2c, 0xFF) == 0x2260


def test_ina226_datasheet_table_1():
    # SBOS547 Table 1: 10 A, 2 mOhm, bus 11.98 V, CAL 2560.
    i2c, chip = _bus_with_chip(shunt_ohm=0.002)
    _write(i2c, 0x05, 2560)
    chip.set_current_ma(10000)
    chip.set_bus_mv(11980)
    assert _reg(i2c, 0x01) == 0x1F40  # 8000 * 2.5 uV = 20 mV
    assert _reg(i2c, 0x02) == 0x2570  # 9584 * 1.25 mV = 11.98 V
    assert _reg(i2c, 0x05) == 0x0A00
    assert _reg(i2c, 0x04) == 0x2710  # 10000 * 1 mA
    assert _reg(i2c, 0x03) == 0x12B8  # 4792 * 25 mW = 119.8 W


def test_ina226_current_and_power_follow_cal():
    i2c, chip = _bus_with_chip(shunt_ohm=0.002)
    chip.set_current_ma(10000)
    chip.set_bus_mv(12000)
    assert _reg(i2c, 0x04) == 0 and _reg(i2c, 0x03) == 0  # CAL not programmed yet
    _write(i2c, 0x05, 1280)  # 2 mA/bit
    assert _reg(i2c, 0x04) == 8000 * 1280 // 2048 == 5000
    assert _reg(i2c, 0x03) == 5000 * 9600 // 20000 == 2400
    _write(i2c, 0x05, 0xFFFF)
    assert _reg(i2c, 0x05) == 0x7FFF  # D15 reserved


def test_ina226_negative_current_and_saturation():
    i2c, chip = _bus_with_chip(shunt_ohm=0.002)
    _write(i2c, 0x05, 2560)
    chip.set_bus_mv(12000)
    chip.set_current_ma(-5000)
    assert _s16(_reg(i2c, 0x01)) == -4000
    assert _s16(_reg(i2c, 0x04)) == -5000
    assert _reg(i2c, 0x03) == 5000 * 9600 // 20000  # power is a magnitude
    chip.set_current_ma(-100000)  # beyond -81.92 mV
    assert _reg(i2c, 0x01) == 0x8000
    assert _s16(_reg(i2c, 0x04)) == -32768
    assert _reg(i2c, 0x06) & 0x0004  # OVF
    chip.set_current_ma(100000)
    assert _reg(i2c, 0x01) == 0x7FFF
    chip.set_bus_mv(50000)
    assert _reg(i2c, 0x02) == 0x7FFF
    chip.set_bus_mv(-5)
    assert _reg(i2c, 0x02) == 0


def test_ina226_rounding_of_inputs():
    i2c, chip = _bus_with_chip(shunt_ohm=0.001)
    chip.set_current_ma(1)  # 1 uV -> 0.4 LSB -> 0
    assert _reg(i2c, 0x01) == 0
    chip.set_current_ma(2)  # 2 uV -> 0.8 -> 1
    assert _reg(i2c, 0x01) == 1
    chip.set_current_ma(-2)
    assert _s16(_reg(i2c, 0x01)) == -1
    chip.set_bus_mv(1)  # 0.8 LSB -> 1
    assert _reg(i2c, 0x02) == 1


def test_ina226_config_reset_bit_restores_defaults():
    i2c, chip = _bus_with_chip()
    _write(i2c, 0x00, 0x4527)
    _write(i2c, 0x05, 2560)
    _write(i2c, 0x07, 1234)
    _write(i2c, 0x06, 0x1001)
    assert _reg(i2c, 0x00) == 0x4527
    assert chip.config_fields() == (16, 1100, 1100, 7)
    _write(i2c, 0x00, 0x8000)
    assert _reg(i2c, 0x00) == 0x4127
    assert _reg(i2c, 0x05) == 0 and _reg(i2c, 0x07) == 0 and _reg(i2c, 0x06) & 0xFC03 == 0


def test_ina226_read_only_registers_ignore_writes():
    i2c, _ = _bus_with_chip()
    _write(i2c, 0xFE, 0)
    _write(i2c, 0x02, 0x1234)
    assert _reg(i2c, 0xFE) == 0x5449
    assert _reg(i2c, 0x02) == 0
    with raises(OSError):
        _reg(i2c, 0x42)  # no such register


def test_ina226_cvrf_cleared_by_reading_mask_and_writing_config():
    i2c, chip = _bus_with_chip()
    chip.set_bus_mv(12000)
    assert _reg(i2c, 0x06) & 0x0008
    assert not _reg(i2c, 0x06) & 0x0008  # read-to-clear
    chip.set_bus_mv(12001)
    assert chip.reg(0x06) & 0x0008  # peek does not clear
    assert chip.reg(0x06) & 0x0008


def test_ina226_timed_conversions_with_clock():
    clock = FakeClock()
    i2c, chip = _bus_with_chip(clock=clock)
    _write(i2c, 0x00, 0x4527)  # avg 16, 1.1 ms + 1.1 ms -> 35.2 ms per conversion
    chip.set_bus_mv(12000)
    assert _reg(i2c, 0x02) == 0  # nothing converted yet
    clock.advance(35)
    assert not _reg(i2c, 0x06) & 0x0008
    clock.advance(1)
    assert _reg(i2c, 0x06) & 0x0008
    assert _reg(i2c, 0x02) == 9600
    assert chip.conversions == 1
    chip.set_bus_mv(11000)
    assert _reg(i2c, 0x02) == 9600  # until the next conversion
    clock.advance(36)
    assert _reg(i2c, 0x02) == 8800


def test_ina226_triggered_mode_converts_once():
    clock = FakeClock()
    i2c, chip = _bus_with_chip(clock=clock)
    _write(i2c, 0x00, 0x4003)  # avg 1, 140 us each, shunt+bus triggered
    chip.set_bus_mv(12000)
    clock.advance(1)
    assert _reg(i2c, 0x02) == 9600
    chip.set_bus_mv(11000)
    clock.advance(100)
    assert _reg(i2c, 0x02) == 9600
    assert chip.conversions == 1


def test_ina226_power_down_does_not_convert():
    i2c, chip = _bus_with_chip()
    _write(i2c, 0x00, 0x4000)
    before = chip.conversions
    chip.set_bus_mv(12000)
    assert chip.conversions == before
    assert _reg(i2c, 0x02) == 0


def test_ina226_bus_under_voltage_alert_latched_and_transparent():
    i2c, chip = _bus_with_chip()
    chip.set_bus_mv(12000)
    _write(i2c, 0x07, 11000 * 4 // 5)  # 11 V in bus LSBs
    _write(i2c, 0x06, 0x1001)  # BUL, latched
    chip.set_bus_mv(10500)
    chip.set_bus_mv(12000)  # recovered, but the flag is latched
    assert _reg(i2c, 0x06) & 0x0010
    assert not _reg(i2c, 0x06) & 0x0010  # cleared by the read
    _write(i2c, 0x06, 0x1000)  # transparent
    chip.set_bus_mv(10500)
    assert chip.reg(0x06) & 0x0010
    chip.set_bus_mv(12000)
    assert not chip.reg(0x06) & 0x0010  # follows the condition


def test_ina226_other_alert_functions():
    i2c, chip = _bus_with_chip(shunt_ohm=0.002)
    _write(i2c, 0x05, 2560)
    chip.set_bus_mv(12000)
    chip.set_current_ma(10000)  # shunt 8000, power 4800
    for mask, limit, want in (
        (0x8000, 7999, True),  # SOL
        (0x8000, 8000, False),
        (0x4000, 8001, True),  # SUL
        (0x2000, 9599, True),  # BOL
        (0x2000, 9600, False),
        (0x0800, 4799, True),  # POL
        (0x0800, 4800, False),
        (0x9000, 7999, True),  # SOL and BUL: SOL (highest) wins
    ):
        _write(i2c, 0x07, limit)
        _write(i2c, 0x06, mask)
        chip.set_current_ma(10000)
        assert bool(chip.reg(0x06) & 0x0010) == want, (hex(mask), limit)


def test_ina226_wrong_ids_and_silence():
    i2c = FakeI2C()
    i2c.add(ADDR, FakeINA226(manufacturer_id=0x1234, die_id=0x9999))
    assert _reg(i2c, 0xFE) == 0x1234 and _reg(i2c, 0xFF) == 0x9999
    chip = i2c.add(0x41, FakeINA226())
    chip.stop_answering()
    with raises(OSError) as e:
        i2c.readfrom_mem(0x41, 0xFE, 2)
    assert e.value.args[0] == ENODEV
    assert i2c.scan() == [0x40]
    chip.resume()
    assert i2c.scan() == [0x40, 0x41]


def test_ina226_longer_reads_repeat_the_register():
    i2c, _ = _bus_with_chip()
    assert i2c.readfrom_mem(ADDR, 0xFE, 4) == b"\x54\x49\x54\x49"


# --------------------------------------------------------------------------- I2C bus


class _Mem:
    def __init__(self):
        self.mem = bytearray(256)

    def read_mem(self, reg, buf):
        for i in range(len(buf)):
            buf[i] = self.mem[(reg + i) & 0xFF]

    def write_mem(self, reg, data):
        for i in range(len(data)):
            self.mem[(reg + i) & 0xFF] = data[i]


def test_i2c_routes_by_address_and_logs():
    i2c = FakeI2C()
    dev = i2c.add(0x50, _Mem())
    i2c.writeto_mem(0x50, 0x10, b"\x01\x02")
    assert dev.mem[0x10] == 1 and dev.mem[0x11] == 2
    buf = bytearray(2)
    i2c.readfrom_mem_into(0x50, 0x10, memoryview(buf))
    assert buf == bytearray(b"\x01\x02")
    assert i2c.log == [("w", 0x50, 0x10, b"\x01\x02"), ("r", 0x50, 0x10, b"\x01\x02")]
    assert i2c.reads == 1 and i2c.writes == 1
    assert i2c.scan() == [0x50]


def test_i2c_absent_and_injected_faults():
    i2c = FakeI2C()
    i2c.add(0x50, _Mem())
    with raises(OSError) as e:
        i2c.readfrom_mem(0x51, 0, 1)
    assert e.value.args[0] == ENODEV
    i2c.set_absent(0x50)
    assert i2c.scan() == []
    with raises(OSError) as e:
        i2c.writeto_mem(0x50, 0, b"\x00")
    assert e.value.args[0] == ENODEV
    i2c.set_absent(0x50, False)
    i2c.fail_next(2)
    for _ in range(2):
        with raises(OSError) as e:
            i2c.readfrom_mem(0x50, 0, 1)
        assert e.value.args[0] == EIO
    assert i2c.readfrom_mem(0x50, 0, 1) == b"\x00"
    i2c.fail_next(1, 110)
    with raises(OSError) as e:
        i2c.readfrom_mem(0x50, 0, 1)
    assert e.value.args[0] == 110
    assert i2c.reads == 1 and len(i2c.log) == 1  # failures are not logged as done


def test_i2c_without_log_does_not_allocate():
    i2c = FakeI2C(log=False)
    assert i2c.log is None
    i2c.add(ADDR, FakeINA226())
    buf = bytearray(2)
    _locked(lambda: i2c.readfrom_mem_into(ADDR, 0xFE, buf))
    assert buf == bytearray(b"\x54\x49")


# --------------------------------------------------------------------------- clock, ADC


def test_clock_wraps_like_ticks():
    clock = FakeClock(start_ms=TICKS_PERIOD - 10)
    t0 = clock.ticks_ms()
    clock.sleep_ms(25)
    t1 = clock.ticks_ms()
    assert t1 == 15
    assert ticks_diff(t1, t0) == 25 and ticks_diff(t0, t1) == -25
    assert ticks_add(t0, 25) == t1 and ticks_add(t1, -25) == t0
    assert clock.sleeps == 1 and clock.now_ms == TICKS_PERIOD + 15
    assert FakeClock.ticks_diff(5, TICKS_PERIOD - 5) == 10
    with raises(ValueError):
        clock.advance(-1)


def test_clock_agrees_with_micropython_ticks_diff():
    if not IS_MICROPYTHON:
        return
    import time

    # The unix port's period is wider, but small differences agree.
    # a list of tuples built at run time: a constant tuple's 1 << 20 would be a frozen
    # big int on 32-bit ARM, which time.ticks_diff (small ints only) cannot take
    big = 1 << 20
    for a, b in [(100, 50), (50, 100), (0, 0), (big, 3)]:
        assert ticks_diff(a, b) == time.ticks_diff(a, b)


def test_adc_replays_codes_then_repeats_last():
    adc = FakeADC([100, 200, 300])
    assert [adc.read_u16() for _ in range(5)] == [100, 200, 300, 300, 300]
    assert adc.reads == 5
    adc.set(4000)
    assert adc.read_u16() == 4000
    assert FakeADC().read_u16() == 0
    assert FakeADC(7).read_u16() == 7
    n = [0]

    def ramp():
        n[0] += 10
        return n[0]

    adc = FakeADC(ramp)
    assert (adc.read_u16(), adc.read_u16()) == (10, 20)


def test_adc_rejects_bad_codes():
    for bad in ([70000], [-1], [1.5], []):
        with raises(ValueError):
            FakeADC(bad)
    with raises(ValueError):
        FakeADC().set(65536)
    with raises(ValueError):
        FakeADC(lambda: 65536).read_u16()


# --------------------------------------------------------------------------- PWM, pin


def test_pwm_records_history_in_a_ring():
    pwm = FakePWM(history_len=4)
    pwm.freq(25000)
    assert pwm.freq() == 25000
    for d in (1, 2, 3, 4, 5, 6):
        pwm.duty_u16(d)
    assert pwm.duty_u16() == 6
    assert pwm.history() == [3, 4, 5, 6]
    for bad in (-1, 65536, 1.0):
        with raises(ValueError):
            pwm.duty_u16(bad)
    with raises(ValueError):
        pwm.freq(0)
    pwm.deinit()
    assert pwm.deinited
    _locked(lambda: pwm.duty_u16(7))
    assert pwm.history()[-1] == 7


def test_pin_pulses_call_handler_per_matching_edge():
    pin = FakePin()
    calls = []
    pin.irq(handler=calls.append, trigger=IRQ_FALLING)
    pin.pulse(3)
    assert len(calls) == 3 and calls[0] is pin
    pin.irq(handler=calls.append, trigger=IRQ_FALLING | IRQ_RISING)
    pin.pulse(2)
    assert len(calls) == 7
    assert pin.edges == 10 and pin.value() == 1
    pin.irq(handler=None)
    pin.pulse(5)
    assert len(calls) == 7
    assert FakePin.IRQ_FALLING == IRQ_FALLING


def test_pin_pulse_does_not_allocate():
    class Counter:
        def __init__(self):
            self.n = 0
            self.isr = self.edge

        def edge(self, pin):
            self.n += 1

    c = Counter()
    pin = FakePin()
    pin.irq(handler=c.isr, trigger=IRQ_FALLING)
    _locked(lambda: pin.pulse(100))
    assert c.n == 100


_locked = heap_locked
