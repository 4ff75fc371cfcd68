"""device.drivers.ntc: codes -> milli-degC, faults, oversampling, filters, zero allocation."""

from fakes import FakeADC
from mpcompat import IS_MICROPYTHON, raises

from device import calib
from device.drivers.ntc import FAULT_NONE, FAULT_OPEN, FAULT_SHORT, INVALID_MC, NTC
from modbridge.firmware_host import calib_fit

DUAL = True

K = calib.KELVIN
BETA = (3950.0, 10000.0, 25.0 + K)
CFG = {
    "model": "beta",
    "beta": 3950,
    "r0": 10000,
    "t0_mc": 25000,
    "sh": None,
    "correction": [],
    "r_fixed": 10000,
    "ntc_low": True,
}


def _cfg(**changes):
    cfg = dict(CFG)
    cfg.update(changes)
    return cfg


def _code(t_c, low=True, r_fixed=10000.0):
    r = calib.beta_resistance(t_c + K, *BETA)
    return int(calib.ohms_to_adc(r, r_fixed, low) + 0.5)


def _ntc(adc, low=True, **kw):
    kw.setdefault("filter", None)
    kw.setdefault("oversample", 1)
    return NTC.from_config(adc, _cfg(ntc_low=low), **kw)


def test_temperature_from_codes_across_the_range():
    for low in (True, False):
        adc = FakeADC(0)
        ntc = _ntc(adc, low)
        for t in range(-40, 151, 10):
            code = _code(t, low)
            adc.set(code)
            got = ntc.read_mc()
            want = calib.model_temp_c(calib.adc_to_ohms(code, 1e4, low), "beta", BETA) * 1000
            assert ntc.fault == FAULT_NONE and ntc.last_raw == code, (low, t)
            # LUT interpolation error (<= 54 m degC at 0..120, more beyond) only.
            assert abs(got - want) < (65 if 0 <= t <= 120 else 250), (low, t, got, want)
            assert abs(got - t * 1000) < 300, (low, t, got)


def test_open_and_short_low_side():
    adc = FakeADC(65535)
    ntc = _ntc(adc, True)
    assert ntc.read_mc() == INVALID_MC == NTC.INVALID and ntc.fault == FAULT_OPEN
    adc.set(0)
    assert ntc.read_mc() == INVALID_MC and ntc.fault == FAULT_SHORT
    lo, hi = ntc.valid_codes
    # 200 degC is ~74 ohm (code ~480); -55 degC ~1.29 Mohm (code ~65030).
    assert 256 <= lo <= 512 and 64768 <= hi <= 65280, (lo, hi)
    adc.set(lo - 1)
    assert ntc.read_mc() == INVALID_MC and ntc.fault == FAULT_SHORT
    adc.set(lo)
    assert ntc.read_mc() <= 200000 and ntc.fault == FAULT_NONE
    adc.set(hi + 1)
    assert ntc.read_mc() == INVALID_MC and ntc.fault == FAULT_OPEN
    adc.set(hi)
    assert ntc.read_mc() >= -55000 and ntc.fault == FAULT_NONE
    adc.set(32768)
    assert abs(ntc.read_mc() - 25000) < 5 and ntc.fault == FAULT_NONE


def test_open_and_short_high_side():
    adc = FakeADC(0)
    ntc = _ntc(adc, False)
    assert ntc.read_mc() == INVALID_MC and ntc.fault == FAULT_OPEN
    adc.set(65535)
    assert ntc.read_mc() == INVALID_MC and ntc.fault == FAULT_SHORT
    adc.set(_code(60.0, False))
    assert abs(ntc.read_mc() - 60000) < 50 and ntc.fault == FAULT_NONE


def test_explicit_fault_thresholds():
    lut, step = calib.build_lut("beta", BETA, 1e4, True)
    adc = FakeADC(0)
    ntc = NTC(adc, lut, step, oversample=1, filter=None, short_code=2000, open_code=60000)
    assert ntc.valid_codes == (2000, 60000)
    for code, fault in (
        (1999, FAULT_SHORT),
        (2000, FAULT_NONE),
        (60000, FAULT_NONE),
        (60001, FAULT_OPEN),
    ):
        adc.set(code)
        ntc.read_mc()
        assert ntc.fault == fault, (code, ntc.fault)
    # High side: short_code above open_code.
    lut, step = calib.build_lut("beta", BETA, 1e4, False)
    ntc = NTC(adc, lut, step, oversample=1, filter=None, short_code=63000, open_code=3000)
    for code, fault in ((2999, FAULT_OPEN), (3000, FAULT_NONE), (63001, FAULT_SHORT)):
        adc.set(code)
        ntc.read_mc()
        assert ntc.fault == fault, (code, ntc.fault)
    with raises(ValueError, match="both"):
        NTC(adc, lut, step, open_code=3000)


def test_oversampling_averages_n_reads():
    c = _code(40.0)
    adc = FakeADC([c - 40, c + 40, c - 8, c + 8, c - 1, c + 1, c, c] * 3)
    ntc = _ntc(adc, oversample=8)
    t = ntc.read_mc()
    assert adc.reads == 8 and ntc.last_raw == c, (adc.reads, ntc.last_raw)
    assert t == ntc.code_to_mc(c) and abs(t - 40000) < 30, t
    ntc.read_mc()
    assert adc.reads == 16
    # Rounded mean: 3 reads of 100, 101, 101 -> 100.67 -> 101.
    ntc = _ntc(FakeADC([30000, 30001, 30001]), oversample=3)
    ntc.read_mc()
    assert ntc.last_raw == 30001
    with raises(ValueError, match="oversample"):
        _ntc(adc, oversample=0)


def test_median_rejects_a_spike():
    adc = FakeADC(_code(50.0))
    ntc = _ntc(adc, filter="median5")
    base = [ntc.read_mc() for _ in range(4)][-1]
    adc.set(_code(90.0))  # a one-sample glitch, still a valid code
    assert ntc.read_mc() == base
    adc.set(_code(50.0))
    for _ in range(5):
        assert ntc.read_mc() == base  # the spike never shows, and leaves the window
    # A real step passes after 3 of 5 samples.
    adc.set(_code(70.0))
    got = [ntc.read_mc() for _ in range(3)]
    assert got[0] == base and got[1] == base and abs(got[2] - 70000) < 50, got


def test_median_of_fewer_than_five():
    adc = FakeADC(_code(30.0))
    ntc = _ntc(adc, filter="median5")
    first = ntc.read_mc()
    assert abs(first - 30000) < 30  # the first reading passes straight through
    adc.set(_code(80.0))
    assert ntc.read_mc() == (first + ntc.code_to_mc(_code(80.0))) >> 1  # median of 2 = mean
    adc.set(_code(31.0))
    assert ntc.read_mc() == ntc.code_to_mc(_code(31.0))


def test_ema_converges_exactly():
    adc = FakeADC(_code(25.0))
    ntc = _ntc(adc, filter="ema", ema_alpha=64)
    start = ntc.read_mc()
    adc.set(_code(50.0))
    target = ntc.code_to_mc(_code(50.0))
    first = ntc.read_mc()
    # One step of alpha = 64/256 = 1/4.
    assert abs(first - (start + (target - start) // 4)) <= 1, (start, first, target)
    prev = first
    for _ in range(100):
        t = ntc.read_mc()
        assert prev <= t <= target, (prev, t, target)
        prev = t
    assert prev == target, (prev, target)
    # And downwards.
    adc.set(_code(20.0))
    for _ in range(100):
        t = ntc.read_mc()
    assert t == ntc.code_to_mc(_code(20.0)), t
    with raises(ValueError, match="ema_alpha"):
        _ntc(adc, filter="ema", ema_alpha=0)


class _Recorder:
    def __init__(self):
        self.seen = []
        self.resets = 0

    def update(self, value):
        self.seen.append(value)
        return value

    def reset(self):
        self.resets += 1


def test_fault_does_not_poison_the_filter():
    for kind in ("median5", "ema"):
        adc = FakeADC(_code(45.0))
        ntc = _ntc(adc, filter=kind)
        for _ in range(5):
            good = ntc.read_mc()
        adc.set(65535)
        for _ in range(3):
            assert ntc.read_mc() == INVALID_MC and ntc.fault == FAULT_OPEN
        assert ntc.last_mc == INVALID_MC
        adc.set(_code(60.0))
        t = ntc.read_mc()
        # The filter restarted: the first good reading after the fault is itself,
        # neither the sentinel nor a stale 45 degC mix.
        assert ntc.fault == FAULT_NONE and t == ntc.code_to_mc(_code(60.0)), (kind, t, good)
    rec = _Recorder()
    adc = FakeADC(_code(45.0))
    ntc = _ntc(adc, filter=rec)
    ntc.read_mc()
    adc.set(0)
    ntc.read_mc()
    ntc.read_mc()
    adc.set(_code(46.0))
    ntc.read_mc()
    assert INVALID_MC not in rec.seen and len(rec.seen) == 2 and rec.resets == 1, rec.seen
    with raises(ValueError, match="filter"):
        _ntc(adc, filter="mean")


def test_from_config_sh_correction_and_options():
    sh = calib_fit.fit_steinhart_hart(
        [(calib.beta_resistance(t + K, *BETA), t) for t in (25.0, 50.0, 75.0)]
    )
    adc = FakeADC(_code(60.0))
    ntc = NTC.from_config(
        adc, _cfg(model="sh", sh=list(sh), correction=[0.5], oversample=4, filter=None)
    )
    assert abs(ntc.read_mc() - 60500) < 40 and adc.reads == 4
    # Keyword arguments override config keys.
    adc = FakeADC(_code(60.0))
    ntc = NTC.from_config(adc, _cfg(oversample=4, filter="ema"), oversample=2)
    ntc.read_mc()
    assert adc.reads == 2
    assert abs(ntc.ohms(32767.5) - 10000.0) < 1e-6
    lut, step = calib.build_lut("beta", BETA, 1e4)
    with raises(ValueError, match="from_config"):
        NTC(adc, lut, step).ohms(100)
    with raises(calib.CalibrationError, match="non-monotonic"):
        NTC.from_config(adc, _cfg(correction=[0.0, -2.0]))


def test_from_config_shares_tables_only_between_equal_curves():
    luts = {}
    a = NTC.from_config(FakeADC(_code(40.0)), _cfg(), luts=luts)
    b = NTC.from_config(FakeADC(_code(40.0)), _cfg(filter="ema"), luts=luts)
    assert a._lut is b._lut and len(luts) == 1  # filters are not part of the table
    others = [
        _cfg(beta=3435),
        _cfg(r0=4700),
        _cfg(t0_mc=30000),
        _cfg(r_fixed=4700),
        _cfg(ntc_low=False),
        _cfg(correction=[0.5]),
        _cfg(model="sh", sh=[1.1e-3, 2.4e-4, 7.5e-8]),
    ]
    for cfg in others:
        c = NTC.from_config(FakeADC(_code(40.0)), cfg, luts=luts)
        assert c._lut is not a._lut, cfg
    assert len(luts) == 1 + len(others)
    c = NTC.from_config(FakeADC(_code(40.0)), _cfg(correction=[0.5]), luts=luts)
    assert len(luts) == 1 + len(others) and abs(c.read_mc() - 40500) < 40, c.last_mc


def test_sample_raw_for_calibration():
    adc = FakeADC([32000, 32010, 31990, 32005])
    ntc = _ntc(adc)
    mean_x16, lo, hi = ntc.sample_raw(4)
    assert (mean_x16, lo, hi) == (32001 * 16 + 4, 31990, 32010), (mean_x16, lo, hi)
    # Large n: sum beyond 2**30 is fine here (allocation allowed in commands).
    adc.set(65535)
    assert ntc.sample_raw(20000) == (65535 * 16, 65535, 65535)
    with raises(ValueError):
        ntc.sample_raw(0)


def test_read_mc_allocates_nothing():
    # Under heap_lock on MicroPython any allocation raises MemoryError. Covers both
    # filters, both orientations, a spike, fault entry (filter reset) and recovery.
    cases = []
    for low in (True, False):
        temps = (30.0, 31.0, 90.0, 31.0, 32.0, None, None, 33.0, 120.0, -20.0, 33.0)
        codes = [(0 if low else 65535) if t is None else _code(t, low) for t in temps]
        codes[6] = 65535 if low else 0  # one open, one short
        for kind in ("median5", "ema", None):
            adc = FakeADC(0)
            cases.append((adc, _ntc(adc, low, filter=kind, oversample=8), codes, kind))
    results = [0] * (len(cases) * 11)
    if IS_MICROPYTHON:
        import micropython

        micropython.heap_lock()
    try:
        k = 0
        for adc, ntc, codes, _ in cases:
            i = 0
            while i < 11:
                adc.set(codes[i])
                results[k] = ntc.read_mc()
                k += 1
                i += 1
    finally:
        if IS_MICROPYTHON:
            micropython.heap_unlock()
    for n, (adc, ntc, _, kind) in enumerate(cases):
        assert adc.reads == 88 and ntc.fault == FAULT_NONE, (adc.reads, ntc.fault)
        row = results[n * 11 : (n + 1) * 11]
        assert row[5] == INVALID_MC and row[6] == INVALID_MC, row
        if kind == "median5":  # 90 degC spike rejected; median of 33/120/-20/33 = 33
            assert row[2] < 32000 and abs(row[10] - 33000) < 50, row
        elif kind is None:
            assert abs(row[2] - 90000) < 50 and abs(row[10] - 33000) < 50, row


def test_read_mc_ints_stay_small():
    # CPython only (tests/intcheck.py rewrites the source): every intermediate of the
    # hot path stays within +-2**30 at the worst cases: the coarsest table (17 points,
    # step 4096), every valid code, both filters, and the largest oversample.
    if IS_MICROPYTHON:
        return
    from intcheck import load_checked

    # the hot path, table interpolation included (lut_interp_mc), is all in the driver
    drv, chk_drv = load_checked("device/drivers/ntc.py")
    adc = FakeADC(0)
    ntcs = []
    for low in (True, False):
        for points in (17, 257):
            lut, step = calib.build_lut("beta", BETA, 1e4, low, None, points)
            for kind in ("median5", "ema"):
                ntcs.append(drv.NTC(adc, lut, step, oversample=1, filter=kind))
    big = drv.NTC(adc, lut, step, oversample=16384, filter=None)
    with chk_drv:
        for ntc in ntcs:
            lo, hi = ntc.valid_codes
            for code in list(range(lo, hi + 1, 97)) + [hi, 65535, 0, lo, hi]:
                adc.set(code)
                ntc.read_mc()
        adc.set(65535)
        big.read_mc()
    assert chk_drv.count > 1000, chk_drv.count
    print("peak |int|: ntc", chk_drv.peak)
    assert chk_drv.peak < 2**30, chk_drv.peak
