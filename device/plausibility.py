"""NTC plausibility: stuck and implausible channels, from readings the drivers call valid.

An open or short NTC is caught by its driver (``device.drivers.ntc``). What the driver
cannot see is a channel that reads a believable but wrong value: a frozen ADC, a
divider pinned by a leak, a sensor that came off its heatsink. ``NtcWatch`` looks at
the channels against each other and against the load, once per control tick:

    watch = NtcWatch(4, controlled=0b0111, ambient=3)
    watch.update(temps_mc, valid_mask, power_mw, now_ms)   # every tick
    watch.stuck, watch.implausible, watch.faults            # bitmasks by channel

``temps_mc``: the channels' readings (milli-degC; only bits set in ``valid_mask``
are looked at); ``power_mw``: the INA226 input power (mW), negative when unknown (no
power monitor): the load-based checks then make no progress. The verdicts change
only on evidence: a check that cannot be made (a channel invalid, the power unknown)
keeps a bit as it is.

Stuck (channels in ``stuck_mask``, by default the controlled ones: the ambient
channel sits in inlet air that need not follow the GPU's load):

- Flat under a load swing. Time is cut into ``bucket_ms`` (10 s) buckets; each keeps
  every channel's minimum and maximum and the mean input power. Over the last
  ``window_ms`` (120 s) of complete buckets, a channel whose peak-to-peak stays below
  ``stuck_pp_mc`` (0.3 degC) while the bucket power means span ``swing_mw`` (100 W)
  or more is a candidate; a candidate for ``confirm_ms`` (60 s) is stuck. Bucket
  means, not samples: a swing must hold for seconds to count, so a 100 ms burst
  that no heatsink could follow is not one. The confirmation gives the channel a
  minute to answer a swing that happened at the end of the window (a heatsink NTC
  moves degrees within a minute of a 300 W step). In the simulated plants (slowest
  controlled node: the VRAM, time constant about 9 s) the least any controlled
  channel moved over a window with a 100 W swing was 0.7 degC, on a channel the PID
  was holding at its setpoint (tests/test_plausibility_world.py): 2.4x the band.
  A single step is judged if the watch has run a minute before it (the swing stays
  in the window for 120 s). A really idle machine never swings: never judged.
- Frozen. A reading bit-identical for ``frozen_ms`` (30 min) while every bucket's
  mean power was at least ``frozen_min_mw`` (20 W: the GPU is on) and the means
  spanned at least ``frozen_swing_mw`` (5 W): a live channel carries ADC noise and
  follows the load's wander; a noiseless simulation held at a constant load settles
  to an exact steady state and is not flagged.
- A stuck channel clears once it has moved ``clear_pp_mc`` (0.6 degC, twice the
  noise band) peak-to-peak since it was flagged.

Implausible:

- Colder than the air (controlled channels): a controlled channel reading more than
  ``cold_mc`` (8 degC) below the ambient channel for ``cold_ms`` (30 s) while both
  are valid: a heated node cannot be colder than the air that cools it (the
  simulated plants never are: heat only flows from the heatsink to the air). It
  clears after ``cold_ms`` no more than ``cold_clear_mc`` (6 degC) below. Not judged
  while the ambient channel itself is jumpy.
- Jumping (every channel): a change of more than ``jump_mc`` (15 degC) between two
  valid readings at most ``jump_dt_ms`` (1 s) apart. Thermal mass makes that
  impossible -- the fastest simulated channel, the GPU NTC (70 % die, 2 s time
  constant), moves at most ~1.5 degC per 100 ms tick and ~6 degC per second on a
  700 W step -- while a loose contact or a crimp with intermittent resistance does
  it easily. Clears ``jump_hold_ms`` (30 s) after the last jump. A reading after an
  invalid one is never a jump (the driver's filter restarts).

``stuck`` and ``implausible`` are per-channel bitmasks, ``cold`` and ``jumpy`` the
two halves of ``implausible``, ``faults = stuck | implausible``; ``stuck_count`` and
``implausible_count`` count the bits raised. No events: the supervisor raises them
on the edges. ``update()`` allocates nothing (ints < 2**30, arrays made here).
"""

from array import array

from device.ticks import ticks_diff

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


_BIG = const(0x3FFFFFFF)
_MAX_BUCKETS = const(64)

_STUCK_PP_MC = const(300)
_CLEAR_PP_MC = const(600)
WINDOW_MS = const(120000)
_BUCKET_MS = const(10000)
CONFIRM_MS = const(60000)
_SWING_MW = const(100000)
FROZEN_MS = const(1800000)
_FROZEN_MIN_MW = const(20000)
_FROZEN_SWING_MW = const(5000)
COLD_MC = const(8000)
_COLD_CLEAR_MC = const(6000)
_COLD_MS = const(30000)
_JUMP_MC = const(15000)
_JUMP_DT_MS = const(1000)
_JUMP_HOLD_MS = const(30000)


def _check(value, lo, hi, what):
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or value > hi:
        raise ValueError("%s must be an int %d..%d, got %r" % (what, lo, hi, value))


class NtcWatch:
    """Stuck and implausible NTC channels; see the module docstring."""

    def __init__(
        self,
        n_channels=4,
        controlled=0b0111,
        ambient=3,
        stuck_mask=None,
        stuck_pp_mc=_STUCK_PP_MC,
        clear_pp_mc=_CLEAR_PP_MC,
        window_ms=WINDOW_MS,
        bucket_ms=_BUCKET_MS,
        confirm_ms=CONFIRM_MS,
        swing_mw=_SWING_MW,
        frozen_ms=FROZEN_MS,
        frozen_min_mw=_FROZEN_MIN_MW,
        frozen_swing_mw=_FROZEN_SWING_MW,
        cold_mc=COLD_MC,
        cold_clear_mc=_COLD_CLEAR_MC,
        cold_ms=_COLD_MS,
        jump_mc=_JUMP_MC,
        jump_dt_ms=_JUMP_DT_MS,
        jump_hold_ms=_JUMP_HOLD_MS,
    ):
        _check(n_channels, 1, 16, "n_channels")
        full = (1 << n_channels) - 1
        if ambient is None:
            ambient = -1
        _check(ambient, -1, n_channels - 1, "ambient")
        _check(controlled, 0, full, "controlled")
        if ambient >= 0:
            controlled &= ~(1 << ambient)  # the reference is not compared with itself
        if stuck_mask is None:
            stuck_mask = controlled
        _check(stuck_mask, 0, full, "stuck_mask")
        _check(bucket_ms, 100, 600000, "bucket_ms")
        _check(window_ms, bucket_ms, bucket_ms * _MAX_BUCKETS, "window_ms")
        if window_ms % bucket_ms:
            raise ValueError("window_ms must be a multiple of bucket_ms")
        for value, what in (
            (stuck_pp_mc, "stuck_pp_mc"),
            (clear_pp_mc, "clear_pp_mc"),
            (cold_mc, "cold_mc"),
            (cold_clear_mc, "cold_clear_mc"),
            (jump_mc, "jump_mc"),
        ):
            _check(value, 1, 100000, what)
        if clear_pp_mc < stuck_pp_mc:
            raise ValueError("clear_pp_mc must be >= stuck_pp_mc (hysteresis)")
        if cold_clear_mc > cold_mc:
            raise ValueError("cold_clear_mc must be <= cold_mc (hysteresis)")
        for value, what in (
            (confirm_ms, "confirm_ms"),
            (frozen_ms, "frozen_ms"),
            (cold_ms, "cold_ms"),
            (jump_dt_ms, "jump_dt_ms"),
            (jump_hold_ms, "jump_hold_ms"),
        ):
            _check(value, 1, 1 << 28, what)  # ticks_diff is valid below 2**29
        for value, what in (
            (swing_mw, "swing_mw"),
            (frozen_min_mw, "frozen_min_mw"),
            (frozen_swing_mw, "frozen_swing_mw"),
        ):
            _check(value, 0, 100000000, what)
        self.n = n_channels
        self.controlled = controlled
        self.ambient = ambient
        self.stuck_mask = stuck_mask
        self.stuck_pp_mc = stuck_pp_mc
        self.clear_pp_mc = clear_pp_mc
        self.window_ms = window_ms
        self.bucket_ms = bucket_ms
        self.confirm_ms = confirm_ms
        self.swing_mw = swing_mw
        self.frozen_ms = frozen_ms
        self.frozen_min_mw = frozen_min_mw
        self.frozen_swing_mw = frozen_swing_mw
        self.cold_mc = cold_mc
        self.cold_clear_mc = cold_clear_mc
        self.cold_ms = cold_ms
        self.jump_mc = jump_mc
        self.jump_dt_ms = jump_dt_ms
        self.jump_hold_ms = jump_hold_ms
        nb = window_ms // bucket_ms
        self.nb = nb
        n = n_channels

        # verdicts
        self.stuck = 0
        self.cold = 0
        self.jumpy = 0
        self.implausible = 0
        self.faults = 0
        self.stuck_count = 0
        self.implausible_count = 0

        # buckets: a ring of nb complete ones per channel, plus the current one
        self._bmin = array("i", [0] * (n * nb))
        self._bmax = array("i", [0] * (n * nb))
        self._bpow = array("i", [0] * nb)
        self._head = 0  # slot the next complete bucket goes to
        self._cmin = array("i", [_BIG] * n)
        self._cmax = array("i", [-_BIG] * n)
        self._cbad = 0  # channels invalid at some tick of the current bucket
        self._pmean = 0  # mean power of the current bucket (incremental)
        self._pn = 0
        self._pbad = False  # power unknown at some tick of the current bucket
        self._vb = array("i", [0] * n)  # consecutive complete valid buckets
        self._pvb = 0  # consecutive complete buckets with known power
        self._bstart = 0
        self._started = False
        self._last_ms = 0

        # stuck: flat under a swing
        self._cand = 0  # channels flat under a swing at the last evaluation
        self._cand_ms = array("i", [0] * n)
        # stuck: frozen
        self._last = array("i", [0] * n)  # last valid reading
        self._run = 0  # channels whose reading is unchanged (and valid) since _same_ms
        self._same_ms = array("i", [0] * n)
        self._fpmin = array("i", [0] * n)  # bucket power means over the run
        self._fpmax = array("i", [0] * n)
        self._fpbad = 0  # runs that saw a bucket with unknown power
        # stuck: movement since flagged
        self._smin = array("i", [0] * n)
        self._smax = array("i", [0] * n)

        # implausible
        self._cold_c = 0  # channels colder than ambient - cold_mc, since _cold_ms
        self._warm_c = 0  # flagged channels back within cold_clear_mc, since _cold_ms
        self._cold_ms = array("i", [0] * n)
        self._prev_ok = 0  # channels valid at the previous tick
        self._jump_ms = array("i", [0] * n)

    # -- the tick --------------------------------------------------------------
    def update(self, temps_mc, valid_mask, power_mw, now_ms):
        """One control tick; returns ``faults``. Allocation-free."""
        if not self._started:
            self._started = True
            self._bstart = now_ms
            self._last_ms = now_ms
        dt = ticks_diff(now_ms, self._last_ms)
        self._last_ms = now_ms
        n = self.n
        valid = valid_mask & ((1 << n) - 1)

        self._jumps(temps_mc, valid, dt, now_ms)
        self._colder(temps_mc, valid, now_ms)

        # the current bucket
        cmin = self._cmin
        cmax = self._cmax
        i = 0
        while i < n:
            bit = 1 << i
            if valid & bit:
                t = temps_mc[i]
                if t < cmin[i]:
                    cmin[i] = t
                if t > cmax[i]:
                    cmax[i] = t
            i += 1
        self._cbad |= ((1 << n) - 1) & ~valid
        if power_mw < 0:
            self._pbad = True
        else:
            if power_mw > _BIG:
                power_mw = _BIG
            self._pn += 1
            self._pmean += (power_mw - self._pmean) // self._pn

        self._frozen_tick(temps_mc, valid, now_ms)
        self._stuck_moves(temps_mc, valid)
        if ticks_diff(now_ms, self._bstart) >= self.bucket_ms:
            self._close_bucket(now_ms)

        self.implausible = self.cold | self.jumpy
        self.faults = self.stuck | self.implausible
        return self.faults

    # -- implausible -------------------------------------------------------------
    def _jumps(self, temps_mc, valid, dt, now_ms):
        n = self.n
        last = self._last
        both = valid & self._prev_ok
        i = 0
        while i < n:
            bit = 1 << i
            if both & bit and 0 < dt <= self.jump_dt_ms:
                d = temps_mc[i] - last[i]
                if d > self.jump_mc or -d > self.jump_mc:
                    if not self.jumpy & bit:
                        self.jumpy |= bit
                        self.implausible_count += 1
                    self._jump_ms[i] = now_ms
            if self.jumpy & bit and ticks_diff(now_ms, self._jump_ms[i]) >= self.jump_hold_ms:
                self.jumpy &= ~bit
            i += 1
        self._prev_ok = valid

    def _colder(self, temps_mc, valid, now_ms):
        a = self.ambient
        if a < 0:
            return
        abit = 1 << a
        if not valid & abit or self.jumpy & abit:
            self._cold_c = 0
            self._warm_c = 0
            return
        amb = temps_mc[a]
        n = self.n
        i = 0
        while i < n:
            bit = 1 << i
            if self.controlled & bit:
                if not valid & bit:
                    self._cold_c &= ~bit
                    self._warm_c &= ~bit
                elif self.cold & bit:
                    if temps_mc[i] >= amb - self.cold_clear_mc:
                        if not self._warm_c & bit:
                            self._warm_c |= bit
                            self._cold_ms[i] = now_ms
                        elif ticks_diff(now_ms, self._cold_ms[i]) >= self.cold_ms:
                            self.cold &= ~bit
                            self._warm_c &= ~bit
                    else:
                        self._warm_c &= ~bit
                elif temps_mc[i] < amb - self.cold_mc:
                    if not self._cold_c & bit:
                        self._cold_c |= bit
                        self._cold_ms[i] = now_ms
                    elif ticks_diff(now_ms, self._cold_ms[i]) >= self.cold_ms:
                        self.cold |= bit
                        self._cold_c &= ~bit
                        self.implausible_count += 1
                else:
                    self._cold_c &= ~bit
            i += 1

    # -- stuck -------------------------------------------------------------------
    def _flag_stuck(self, i, t):
        bit = 1 << i
        if self.stuck & bit:
            return
        self.stuck |= bit
        self.stuck_count += 1
        self._smin[i] = t
        self._smax[i] = t

    def _stuck_moves(self, temps_mc, valid):
        """A stuck channel that moved clear_pp_mc since it was flagged is not stuck."""
        s = self.stuck & valid
        if not s:
            return
        n = self.n
        i = 0
        while i < n:
            bit = 1 << i
            if s & bit:
                t = temps_mc[i]
                if t < self._smin[i]:
                    self._smin[i] = t
                if t > self._smax[i]:
                    self._smax[i] = t
                if self._smax[i] - self._smin[i] >= self.clear_pp_mc:
                    self.stuck &= ~bit
                    self._cand &= ~bit
                    self._run &= ~bit
            i += 1

    def _frozen_tick(self, temps_mc, valid, now_ms):
        n = self.n
        last = self._last
        i = 0
        while i < n:
            bit = 1 << i
            if not valid & bit:
                self._run &= ~bit
            else:
                t = temps_mc[i]
                if not self._run & bit or t != last[i]:
                    self._run |= bit
                    self._same_ms[i] = now_ms
                    self._fpmin[i] = _BIG
                    self._fpmax[i] = -_BIG
                    self._fpbad &= ~bit
                    last[i] = t
                elif (
                    self.stuck_mask & bit
                    and not self._fpbad & bit
                    and ticks_diff(now_ms, self._same_ms[i]) >= self.frozen_ms
                    and self._fpmin[i] >= self.frozen_min_mw
                    and self._fpmax[i] - self._fpmin[i] >= self.frozen_swing_mw
                ):
                    self._flag_stuck(i, t)
            i += 1
        # _last keeps the last valid reading of every channel (the jump check's too)

    def _close_bucket(self, now_ms):
        n = self.n
        nb = self.nb
        h = self._head
        cmin = self._cmin
        cmax = self._cmax
        vb = self._vb
        i = 0
        while i < n:
            bit = 1 << i
            o = i * nb + h
            self._bmin[o] = cmin[i]
            self._bmax[o] = cmax[i]
            if self._cbad & bit:
                vb[i] = 0
            elif vb[i] < nb:
                vb[i] += 1
            cmin[i] = _BIG
            cmax[i] = -_BIG
            i += 1
        self._cbad = 0
        pknown = not self._pbad and self._pn > 0
        pmean = self._pmean
        self._bpow[h] = pmean
        if pknown:
            if self._pvb < nb:
                self._pvb += 1
        else:
            self._pvb = 0
        self._pmean = 0
        self._pn = 0
        self._pbad = False
        self._head = h + 1 if h + 1 < nb else 0
        self._bstart = now_ms

        # frozen runs: the power they have seen
        run = self._run
        i = 0
        while i < n:
            bit = 1 << i
            if run & bit:
                if not pknown:
                    self._fpbad |= bit
                else:
                    if pmean < self._fpmin[i]:
                        self._fpmin[i] = pmean
                    if pmean > self._fpmax[i]:
                        self._fpmax[i] = pmean
            i += 1

        # flat under a swing, over the last nb complete buckets
        if self._pvb < nb:
            self._cand = 0
            return
        bp = self._bpow
        lo = _BIG
        hi = -_BIG
        k = 0
        while k < nb:
            p = bp[k]
            if p < lo:
                lo = p
            if p > hi:
                hi = p
            k += 1
        if hi - lo < self.swing_mw:
            self._cand = 0
            return
        i = 0
        while i < n:
            bit = 1 << i
            if not self.stuck_mask & bit or vb[i] < nb:
                self._cand &= ~bit
                i += 1
                continue
            o = i * nb
            lo = _BIG
            hi = -_BIG
            k = 0
            while k < nb:
                if self._bmin[o + k] < lo:
                    lo = self._bmin[o + k]
                if self._bmax[o + k] > hi:
                    hi = self._bmax[o + k]
                k += 1
            if hi - lo >= self.stuck_pp_mc:
                self._cand &= ~bit
            elif not self._cand & bit:
                self._cand |= bit
                self._cand_ms[i] = now_ms
            elif ticks_diff(now_ms, self._cand_ms[i]) >= self.confirm_ms:
                self._flag_stuck(i, self._last[i])
            i += 1
