"""device.safety on its own: floors (S1), bounded calibration (S2), the hold (S3),
critical (S4); zero allocation. See docs/safety.md.

DUAL: runs on CPython and under MicroPython.
"""

from fakehal import adc_code
from fakes import FakePin, FakePWM
from mpcompat import heap_locked

from device import config
from device import floors as F
from device import safety as S
from device.drivers.fan import Fan
from device.drivers.ntc import NTC, lut_interp_mc
from protocol import catalog as C

DUAL = True

ALL = 0xF
AUTO = 0
MANUAL = 1


class _Hal:
    fan_model = None
    ntc_nominal = None


def make(cfg=None):
    fans = [Fan(FakePWM(), FakePin(), 0), Fan(FakePWM(), FakePin(), 0)]
    sf = S.Safety(_Hal(), fans)
    sf.configure(cfg or config.defaults())
    return sf, fans


def nominal_mc(sf, code):
    """The nominal curve's reading at ``code`` (a valid one): the table the safety layer
    keeps (``nominal_table``, the one its ``bound`` converts with)."""
    lut, step = sf.nominal_table
    return lut_interp_mc(lut, step, code)


def feed(sf, temps_c=(45, 50, 55, 25)):
    """Bound the four channels at their nominal codes (calibration == nominal)."""
    for i in range(4):
        code = adc_code(temps_c[i])
        nom = nominal_mc(sf, code)
        sf.bound(i, code, nom)


def test_min_spin_floor_whatever_is_requested():
    sf, fans = make()
    feed(sf)
    for t in range(20):
        sf.apply(0, 0, 0, ALL, AUTO, C.STATE_HOSTED, 100 * t, 100)
    assert sf.applied[0] == F.FAN_MODELS["pwm4"][F.FM_MIN_SPIN], sf.applied[0]
    assert fans[0].duty >= sf.applied[0] and fans[1].duty >= sf.applied[1]


def test_each_cause_floor_and_the_largest_wins():
    cases = (
        (S.CAUSE_BOOT, F.FLOOR_BOOT),
        (S.CAUSE_HOST_LOST, F.FLOOR_HOST_LOST),
        (S.CAUSE_SENSOR, F.FLOOR_SENSOR),
        (S.CAUSE_OVER, F.FLOOR_OVER_TEMP),
        (S.CAUSE_STALL, F.FLOOR_STALL),
        (S.CAUSE_CRIT, 65535),
        (S.CAUSE_HOST_LOST | S.CAUSE_SENSOR, F.FLOOR_SENSOR),
        (S.CAUSE_BOOT | S.CAUSE_STALL, F.FLOOR_STALL),
    )
    for causes, want in cases:
        sf, fans = make()
        feed(sf)
        # start the hold at 0: many quiet ticks at minimum duty
        for t in range(400):
            sf.apply(0, 0, 0, ALL, AUTO, C.STATE_HOSTED, 100 * t, 100)
        sf.apply(0, 0, causes, ALL, AUTO, C.STATE_FAILSAFE, 40000, 100)
        assert sf.floor[0] == want and sf.floor[1] == want, (causes, sf.floor[0], want)
        assert fans[0].commanded >= want and fans[1].commanded >= want


def test_config_can_raise_floors_but_compiled_ones_hold():
    cfg = config.defaults()
    cfg["safety"]["host_lost"] = 40000
    sf, _ = make(cfg)
    assert sf.f_host == 40000
    low = config.defaults()
    low["safety"]["host_lost"] = 0  # validation refuses this; the layer ignores it anyway
    sf, _ = make(low)
    assert sf.f_host == F.FLOOR_HOST_LOST
    low["safety"]["min_manual_duty"] = 0
    sf, _ = make(low)
    assert sf.f_manual == F.FLOOR_MANUAL


def test_hot_floor_rises_with_temperature():
    sf, _ = make()
    got = []
    for t_c in (70, 80, 85, 90, 95, 99):
        feed(sf, (t_c, 50, 55, 25))
        sf.apply(0, 0, 0, ALL, AUTO, C.STATE_HOSTED, 0, 100)
        got.append(sf.hot)
    assert got[0] == 0 and got[-1] == 65535, got
    assert got == sorted(got), got
    assert 13107 <= got[2] < got[3] < 65535, got


def test_hot_floor_values_in_small_int_range():
    for i in range(3):
        start = F.HOT_START_MC[i]
        full = F.HOT_FULL_MC[i]
        for t in range(start - 1000, full + 1000, 250):
            v = F.hot_floor(i, t, 13107)
            assert 0 <= v <= 65535, (i, t, v)
    assert F.hot_floor(3, 200000, 13107) == 0  # ambient: no hot floor


def test_calibration_is_bounded_for_control_and_protection():
    sf, _ = make()
    code = adc_code(86.0)
    nominal = nominal_mc(sf, code)
    # a correction of -40 degC: the calibrated reading says 46 degC
    got = sf.bound(0, code, nominal - 40000)
    assert got == nominal - F.CAL_BAND_MC, (got, nominal)
    assert sf.prot_mc[0] == nominal - F.CAL_BAND_MC
    assert sf.clamped & 1
    # a correction that reads hot is clamped for control, kept for protection
    got = sf.bound(0, code, nominal + 20000)
    assert got == nominal + F.CAL_BAND_MC and sf.prot_mc[0] == nominal + 20000
    # within the band: untouched
    got = sf.bound(0, code, nominal - 1500)
    assert got == nominal - 1500 and not sf.clamped & 1


def test_code_outside_nominal_table_is_a_fault_whatever_the_calibration():
    sf, _ = make()
    assert sf.bound(0, 65535, 50000) == NTC.INVALID
    assert sf.nominal_fault(65535) == NTC.FAULT_OPEN  # NTC to ground: open reads high
    assert sf.bound(1, 0, 50000) == NTC.INVALID
    assert sf.nominal_fault(0) == NTC.FAULT_SHORT
    assert sf.nominal_bad == 3


def test_hold_on_fault_is_monotone_then_ramps_down():
    sf, fans = make()
    feed(sf)
    for t in range(300):
        sf.apply(60000, 60000, 0, ALL, AUTO, C.STATE_HOSTED, 100 * t, 100)
    assert sf.applied[0] == 60000
    # host lost: the fallback would be 40 %, the hold keeps 60000 while it lasts
    now = 30000
    for _ in range(100):
        sf.apply(20000, 20000, S.CAUSE_HOST_LOST, ALL, AUTO, C.STATE_STANDALONE, now, 100)
        now += 100
        assert sf.applied[0] >= 60000 and sf.applied[1] >= 60000, sf.applied[0]
    # back: ramps down at RAMP_DOWN_PER_S, never a step
    prev = sf.applied[0]
    steps = 0
    while sf.applied[0] > 20000 and steps < 1000:
        sf.apply(20000, 20000, 0, ALL, AUTO, C.STATE_HOSTED, now, 100)
        now += 100
        assert prev - sf.applied[0] <= F.RAMP_DOWN_PER_S // 10 + 1, (prev, sf.applied[0])
        prev = sf.applied[0]
        steps += 1
    assert sf.applied[0] == 20000 and 100 <= steps <= 140, steps


def test_mode_change_never_steps_down():
    sf, fans = make()
    feed(sf)
    for t in range(300):
        sf.apply(50000, 50000, 0, ALL, AUTO, C.STATE_HOSTED, 100 * t, 100)
    sf.apply(20000, 20000, 0, ALL, MANUAL, C.STATE_MANUAL, 30000, 100)
    assert sf.applied[0] == 50000  # the tick of the change: held
    sf.apply(20000, 20000, 0, ALL, MANUAL, C.STATE_MANUAL, 30100, 100)
    assert 50000 - F.RAMP_DOWN_PER_S // 10 - 1 <= sf.applied[0] < 50000


def test_leaving_boot_has_no_hold():
    sf, fans = make()
    feed(sf)
    for t in range(5):
        sf.apply(0, 0, S.CAUSE_BOOT, ALL, AUTO, C.STATE_BOOT, 100 * t, 100)
    assert sf.applied[0] == F.FLOOR_BOOT
    sf.apply(20000, 20000, 0, ALL, AUTO, C.STATE_STANDALONE, 500, 100)
    assert sf.applied[0] == 20000 and sf.hold[0] == 0


def test_critical_reading_forces_full():
    sf, fans = make()
    feed(sf, (96, 50, 55, 25))  # past the GPU's compiled critical end (95)
    sf.apply(0, 0, 0, ALL, AUTO, C.STATE_HOSTED, 0, 100)
    assert sf.causes & S.CAUSE_CRIT and sf.applied[0] == 65535 and sf.applied[1] == 65535
    # a faulted channel's reading is not trusted for it
    sf.apply(0, 0, 0, ALL & ~1, AUTO, C.STATE_HOSTED, 100, 100)
    assert not sf.causes & S.CAUSE_CRIT


def test_apply_and_bound_do_not_allocate():
    sf, fans = make()
    code = adc_code(85.0)

    def run():
        i = 0
        now = 0
        while i < 300:
            sf.bound(0, code, 80000)
            sf.bound(1, code, 20000)
            sf.bound(2, 65535, 50000)
            causes = S.CAUSE_HOST_LOST if i % 50 < 10 else 0
            sf.apply(i * 200, 70000 - i * 200, causes, ALL, i % 3, i % 5, now, 100)
            now += 100
            i += 1

    heap_locked(run)
    assert 0 <= sf.applied[0] <= 65535
