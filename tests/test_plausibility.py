"""device.plausibility.NtcWatch: stuck channels (flat under a load swing, frozen) and
implausible ones (colder than the air, jumping), with hysteresis, no allocation."""

from array import array

from fakes import TICKS_PERIOD, FakeClock
from mpcompat import heap_locked, raises

from device.plausibility import (
    CONFIRM_MS,
    FROZEN_MS,
    WINDOW_MS,
    NtcWatch,
)

DUAL = True
MPY_TIMEOUT = 600

GPU, VRAM, MOS, AMB = 0, 1, 2, 3
ALL = 0b1111
INVALID = -0x3FFFFFFF


class _Bench:
    """Four channels, a load and a clock; ``run`` ticks the watch."""

    def __init__(self, start_ms=0, tick_ms=100, **kw):
        self.clock = FakeClock(start_ms=start_ms)
        self.tick_ms = tick_ms
        self.watch = NtcWatch(4, **kw)
        self.temps = array("i", [45000, 50000, 55000, 25000])
        self.valid = ALL
        self.power = 150000
        self.k = 0  # ticks so far
        self.seen = 0  # every fault bit seen so far

    def tick(self):
        self.watch.update(self.temps, self.valid, self.power, self.clock.ticks_ms())
        self.seen |= self.watch.faults
        self.clock.advance(self.tick_ms)
        self.k += 1

    def run(self, ms, fn=None):
        """Tick for ``ms``; ``fn(bench)`` sets the inputs before each tick."""
        for _ in range(ms // self.tick_ms):
            if fn is not None:
                fn(self)
            self.tick()


def _set(b, ch, value_mc):
    b.temps[ch] = value_mc


def _noise(k, amp_mc):
    """A deterministic pseudo-noise in -amp..amp (triangle of incommensurate periods)."""
    a = (k * 37) % 23 - 11
    b = (k * 11) % 7 - 3
    return (a * 8 + b * 14) * amp_mc // 130


def _load_swing(period_ms, lo_mw, hi_mw):
    def fn(b):
        t = b.k * b.tick_ms
        b.power = hi_mw if (t // period_ms) % 2 else lo_mw
        # healthy channels follow the load
        hot = b.power > lo_mw
        b.temps[VRAM] = 50000 + (3000 if hot else 0) + _noise(b.k, 100)
        b.temps[MOS] = 55000 + (2000 if hot else 0) + _noise(b.k + 5, 100)
        b.temps[AMB] = 25000 + _noise(b.k + 9, 100)

    return fn


# --------------------------------------------------------------------------- construction


def test_construction_and_bad_arguments():
    w = NtcWatch(4)
    assert (w.controlled, w.ambient, w.stuck_mask) == (0b0111, 3, 0b0111)
    assert (w.stuck, w.implausible, w.faults, w.stuck_count, w.implausible_count) == (0,) * 5
    assert w.nb == WINDOW_MS // 10000
    w = NtcWatch(4, controlled=0b1111, ambient=3)
    assert w.controlled == 0b0111  # the reference is not compared with itself
    w = NtcWatch(2, controlled=0b11, ambient=None)
    assert w.ambient == -1
    for kw in (
        {"n_channels": 0},
        {"ambient": 4},
        {"controlled": 0b10000},
        {"stuck_mask": 0b10000},
        {"window_ms": 125000},  # not a multiple of the bucket
        {"bucket_ms": 10},
        {"window_ms": 10000 * 65},
        {"clear_pp_mc": 100},  # below the stuck band: no hysteresis
        {"cold_clear_mc": 9000},
        {"jump_mc": 0},
        {"confirm_ms": 0},
        {"swing_mw": -1},
        {"cold_mc": 8000.0},
    ):
        args = {"n_channels": 4}
        args.update(kw)
        with raises(ValueError):
            NtcWatch(**args)


# --------------------------------------------------------------------------- stuck


def test_stuck_ntc_under_a_power_swing_is_flagged():
    # Problem 2: the GPU channel reads 45 degC with a little noise whatever the load
    # does; 100 W <-> 400 W every 30 s moves every live channel by degrees.
    b = _Bench()
    swing = _load_swing(30000, 100000, 400000)

    def fn(b):
        swing(b)
        b.temps[GPU] = 45000 + _noise(b.k, 120)  # 240 mdegC peak-to-peak: flat

    b.run(WINDOW_MS + 10000, fn)
    assert b.watch.stuck == 0  # a full window first
    b.run(CONFIRM_MS + 20000, fn)
    w = b.watch
    assert w.stuck == 1 << GPU and w.faults == 1 << GPU and w.implausible == 0, w.stuck
    assert w.stuck_count == 1 and b.seen == 1 << GPU
    b.run(600000, fn)
    assert w.stuck == 1 << GPU and w.stuck_count == 1  # raised once
    # moving within the band does not clear it; moving beyond it (0.6 degC) does
    b.temps[GPU] = 45400
    b.run(1000, lambda b: swing(b))
    assert w.stuck == 1 << GPU
    b.temps[GPU] = 45800
    b.run(1000, lambda b: swing(b))
    assert w.stuck == 0 and w.faults == 0


def test_a_flat_reading_with_constant_power_is_not_flagged():
    # An idle machine: the load does not move, so a flat reading says nothing. Bit
    # identical readings for 2 h at a constant load (a noiseless plant's steady state).
    for power in (0, 80000, 400000):
        b = _Bench(tick_ms=500)
        b.power = power
        b.run(7200000)
        assert b.seen == 0 and b.watch.stuck_count == 0, power


def test_a_flat_reading_with_a_small_load_wander_is_not_flagged_for_30_min():
    # Load wanders +-20 W (below the 100 W swing): only the frozen rule can judge, and
    # only after 30 minutes of a bit-identical reading.
    b = _Bench(tick_ms=500)

    def fn(b):
        b.power = 150000 + _noise(b.k // 20, 20000)
        b.temps[VRAM] = 50000 + _noise(b.k, 150)
        b.temps[MOS] = 55000 + _noise(b.k + 3, 150)
        b.temps[AMB] = 25000 + _noise(b.k + 7, 150)

    b.run(FROZEN_MS - 20000, fn)
    assert b.seen == 0
    b.run(40000, fn)
    assert b.watch.stuck == 1 << GPU and b.watch.stuck_count == 1  # frozen at 45.000
    b.temps[GPU] = 45001  # it moves again, but by less than the band: still stuck
    b.run(5000, fn)
    assert b.watch.stuck == 1 << GPU
    b.run(5000, lambda b: (fn(b), _set(b, GPU, 44000 + _noise(b.k, 500))))
    assert b.watch.stuck == 0


def test_frozen_needs_a_powered_machine_and_a_known_power():
    b = _Bench(tick_ms=1000)
    b.run(2 * FROZEN_MS, lambda b: setattr(b, "power", 5000 + _noise(b.k // 10, 4000)))
    assert b.seen == 0  # 1..9 W: the GPU is off, the sensors read the room
    b = _Bench(tick_ms=1000)
    swing = _load_swing(30000, 100000, 400000)

    def fn(b):
        swing(b)  # the channels follow the load...
        b.power = -1  # ...but there is no power monitor to tell

    b.run(2 * FROZEN_MS, fn)
    assert b.seen == 0


def test_noise_in_the_stuck_band_on_a_live_channel_is_not_flagged():
    # Every channel alive and following the load, each with +-0.2 degC of noise.
    b = _Bench()
    swing = _load_swing(30000, 100000, 400000)

    def fn(b):
        swing(b)
        b.temps[GPU] = 45000 + (4000 if b.power > 100000 else 0) + _noise(b.k + 1, 200)

    b.run(900000, fn)
    assert b.seen == 0


def test_a_swing_at_the_end_of_the_window_gives_the_channel_time():
    # The load steps after 5 quiet minutes; the channel answers with a 9 s lag (VRAM-like
    # time constant: it moves 0.6 degC 20 s after the step). Not stuck.
    b = _Bench()

    def fn(b):
        t = b.k * b.tick_ms
        b.power = 100000 if t < 300000 else 400000
        rise = 0 if t < 300000 else min(3000, (t - 300000) * 3000 // 90000)
        b.temps[GPU] = 45000 + rise
        b.temps[VRAM] = 50000 + rise
        b.temps[MOS] = 55000 + rise

    b.run(900000, fn)
    assert b.seen == 0


def test_an_invalid_channel_restarts_its_window():
    b = _Bench()
    swing = _load_swing(30000, 100000, 400000)

    def fn(b):
        swing(b)
        b.valid = ALL if (b.k * b.tick_ms) % 100000 < 95000 else ALL & ~(1 << GPU)
        b.temps[GPU] = 45000 if b.valid & 1 else INVALID

    b.run(900000, fn)
    assert b.seen == 0  # never a full valid window: no verdict


def test_the_ambient_channel_is_not_judged_stuck_by_default():
    # Inlet air need not follow the GPU's load: a flat ambient is no fault unless asked.
    swing = _load_swing(30000, 100000, 400000)

    def fn(b):
        swing(b)
        b.temps[AMB] = 25000

    b = _Bench()
    b.run(900000, fn)
    assert b.watch.stuck == 1 << GPU  # the flat GPU channel of the bench, not AMB
    b = _Bench(stuck_mask=ALL)
    b.run(900000, fn)
    assert b.watch.stuck == (1 << GPU) | (1 << AMB)


def test_stuck_mask_with_gaps_judges_each_channel_on_its_own_readings():
    # The window's buckets are kept for the channels of stuck_mask only, one ring each:
    # with gaps in the mask, each judged channel is judged on its own readings.
    swing = _load_swing(30000, 100000, 400000)

    def flat_amb(b):
        swing(b)
        b.temps[AMB] = 25000  # the bench's GPU channel is flat too, but not judged

    b = _Bench(stuck_mask=0b1010)  # VRAM follows the load, AMB is flat
    b.run(900000, flat_amb)
    assert b.watch.stuck == 1 << AMB, b.watch.stuck

    def flat_vram(b):
        swing(b)
        b.temps[VRAM] = 50000

    b = _Bench(stuck_mask=0b0110)  # VRAM flat, MOS follows the load
    b.run(900000, flat_vram)
    assert b.watch.stuck == 1 << VRAM, b.watch.stuck
    b = _Bench(stuck_mask=0)  # nothing judged stuck: no ring at all
    b.run(900000, flat_vram)
    assert b.watch.stuck == 0 and b.watch.stuck_count == 0


# --------------------------------------------------------------------------- implausible


def test_a_channel_colder_than_ambient_is_implausible():
    # Problem 3: the VRAM channel reads 15 degC below the chassis air.
    b = _Bench()
    b.temps[AMB] = 35000
    b.temps[VRAM] = 20000
    b.run(29000)
    assert b.watch.implausible == 0  # not yet 30 s
    b.run(2000)
    w = b.watch
    assert w.implausible == 1 << VRAM and w.cold == 1 << VRAM and w.jumpy == 0
    assert w.faults == 1 << VRAM and w.stuck == 0 and w.implausible_count == 1
    # 7 degC below: inside the hysteresis, stays
    b.run(5000, lambda b: _set(b, VRAM, 28000 + _noise(b.k, 300)))
    b.run(60000, lambda b: _set(b, VRAM, 28000 + _noise(b.k, 300)))
    assert w.implausible == 1 << VRAM
    # within 6 degC for 30 s: cleared
    b.run(5000, lambda b: _set(b, VRAM, 30000 + _noise(b.k, 1000)))
    b.run(20000, lambda b: _set(b, VRAM, 31000 + _noise(b.k, 300)))
    assert w.implausible == 1 << VRAM
    b.run(11000, lambda b: _set(b, VRAM, 31000 + _noise(b.k, 300)))
    assert w.implausible == 0 and w.faults == 0 and w.implausible_count == 1


def test_noise_within_the_cold_band_is_not_flagged():
    # 7 degC below the air with +-1 degC of noise, dipping under the 8 degC line for
    # less than 30 s at a time: never implausible. The ambient channel itself may be
    # far colder than a controlled one (that is normal).
    b = _Bench()
    b.temps[AMB] = 40000

    def fn(b):
        t = b.k * b.tick_ms
        dip = 2500 if (t // 20000) % 2 else 0  # 20 s under the line, 20 s above
        b.temps[GPU] = 33000 - dip + _noise(b.k, 1000)
        b.temps[VRAM] = 60000 + _noise(b.k + 2, 1000)

    b.run(600000, fn)
    assert b.seen == 0


def test_no_cold_verdict_without_a_valid_ambient():
    b = _Bench()
    b.temps[GPU] = 10000
    b.temps[AMB] = INVALID
    b.valid = ALL & ~(1 << AMB)
    b.run(120000)
    assert b.seen == 0
    b.valid = ALL
    b.temps[AMB] = 30000
    b.run(31000)
    assert b.watch.cold == 1 << GPU
    # the ambient goes away: the verdict stays until there is evidence
    b.valid = ALL & ~(1 << AMB)
    b.temps[GPU] = 45000
    b.run(120000)
    assert b.watch.cold == 1 << GPU
    # a controlled channel that goes invalid keeps its bit too
    b.valid = ALL
    b.run(31000)
    assert b.watch.cold == 0


def test_a_jump_between_ticks_is_implausible_for_30_s():
    b = _Bench(start_ms=TICKS_PERIOD - 10000)  # across the tick wrap
    b.run(5000)
    b.temps[MOS] = 75000  # +20 degC in one tick
    b.run(100)
    w = b.watch
    assert w.jumpy == 1 << MOS and w.implausible == 1 << MOS and w.implausible_count == 1
    b.run(29800)
    assert w.jumpy == 1 << MOS
    b.run(300)
    assert w.jumpy == 0 and w.faults == 0
    # a fast but physical move: 10 degC in a tick, 15 degC/s over 5 ticks
    b.temps[MOS] = 85000
    b.run(100)
    b.run(500, lambda b: _set(b, MOS, b.temps[MOS] + 3000))
    assert b.seen == 1 << MOS and w.jumpy == 0 and w.implausible_count == 1


def test_no_jump_across_an_invalid_reading_or_a_long_gap():
    b = _Bench()
    b.run(5000)
    b.valid = ALL & ~(1 << GPU)
    b.temps[GPU] = INVALID
    b.run(1000)
    b.valid = ALL
    b.temps[GPU] = 90000  # back from an open circuit 45 degC higher
    b.run(1000)
    assert b.seen == 0
    b = _Bench(tick_ms=2000)  # a loop that stalled: 2 s between readings
    b.run(10000)
    b.temps[GPU] = 70000
    b.run(2000)
    assert b.seen == 0


def test_a_jumpy_ambient_is_no_reference():
    b = _Bench()
    b.temps[GPU] = 30000
    b.temps[AMB] = 25000
    b.run(1000)

    def fn(b):
        b.temps[AMB] = 25000 if (b.k // 50) % 2 else 45000  # jumps every 5 s

    b.run(120000, fn)
    assert b.watch.jumpy == 1 << AMB and b.watch.cold == 0


# --------------------------------------------------------------------------- allocation


def _locked_run(b, ms, fn):
    for _ in range(ms // b.tick_ms):
        fn(b)
        heap_locked(b.tick)


def test_update_does_not_allocate():
    # Every path under the lock: buckets closing, a swing, stuck raised and cleared,
    # frozen raised, cold raised and cleared, a jump raised and cleared, unknown power,
    # an invalid channel, the tick wrap.
    b = _Bench(start_ms=TICKS_PERIOD - 100000, tick_ms=500, frozen_ms=300000)
    swing = _load_swing(30000, 100000, 400000)

    def phase1(b):  # the GPU is stuck under a swing
        swing(b)
        b.temps[GPU] = 45000

    def phase2(b):  # it moves; the VRAM is cold; MOS jumps once; AMB is invalid a while
        swing(b)
        b.temps[GPU] = 47000
        b.temps[VRAM] = 10000
        t = b.k * b.tick_ms
        if 30000 <= t % 90000 < 31000:
            b.temps[MOS] = 90000
        b.valid = ALL if t % 60000 > 5000 else ALL & ~(1 << AMB)

    def phase3(b):  # all well; unknown power; then a frozen VRAM under a small wander
        b.valid = ALL
        b.power = -1 if b.k % 200 < 20 else 150000 + _noise(b.k // 20, 20000)
        b.temps[GPU] = 45000 + _noise(b.k, 500)
        b.temps[VRAM] = 52000
        b.temps[MOS] = 55000 + _noise(b.k + 1, 500)

    _locked_run(b, 300000, phase1)
    assert b.watch.stuck == 1 << GPU, b.watch.stuck
    _locked_run(b, 120000, phase2)
    assert b.watch.stuck == 0 and b.watch.cold == 1 << VRAM and b.seen & (1 << MOS)
    _locked_run(b, 400000, phase3)
    w = b.watch
    assert w.cold == 0 and w.jumpy == 0 and w.stuck == 0  # power unknown now and then
    b.temps[VRAM] = 52500  # a new run, with the power known throughout

    def phase4(b):
        phase3(b)
        b.power = 150000 + _noise(b.k // 20, 20000)
        b.temps[VRAM] = 52500

    _locked_run(b, 400000, phase4)
    assert w.stuck == 1 << VRAM, w.stuck
    assert w.stuck_count == 2 and w.implausible_count >= 2
