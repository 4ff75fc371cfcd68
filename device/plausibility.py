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
on the edges. ``update()`` allocates nothing (ints < 2**30, one array made here: the configuration,
the verdicts and the state; ``stuck`` and ``implausible``, which the app reads every
tick, are attributes too, the rest is read by name through ``__getattr__``).
"""

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

# Everything an NtcWatch holds, in one array of ints (an instance attribute each took
# a slot of its 59-slot table and most of the per-channel arrays a 32 B block of their
# own: 1,360 B on ARM): first the configuration and the verdicts, readable by name
# through ``__getattr__`` (in this order: its names tuple), then the state ...
_N = const(0)
_CTL = const(1)  # controlled
_AMB = const(2)  # ambient channel, -1: none
_SMASK = const(3)  # stuck_mask
_STUCK_PP = const(4)
_CLEAR_PP = const(5)
_WIN = const(6)  # window_ms
_BKT = const(7)  # bucket_ms
_CONFIRM = const(8)
_SWING = const(9)
_FROZEN = const(10)
_FMIN = const(11)  # frozen_min_mw
_FSWING = const(12)  # frozen_swing_mw
_COLD_MC_I = const(13)
_COLD_CLR = const(14)
_COLD_MS_I = const(15)
_JUMP_MC_I = const(16)
_JUMP_DT = const(17)
_JUMP_HOLD = const(18)
_NB = const(19)  # complete buckets in the window
_STUCK = const(20)  # the verdicts (``stuck`` and ``implausible`` are attributes too)
_IMPL = const(21)
_COLD = const(22)
_JUMPY = const(23)
_FAULTS = const(24)
_SCOUNT = const(25)  # stuck_count
_ICOUNT = const(26)  # implausible_count
_HEAD = const(27)  # ring slot the next complete bucket goes to
_CBAD = const(28)  # channels invalid at some tick of the current bucket
_PMEAN = const(29)  # mean power of the current bucket (incremental)
_PN = const(30)
_PBAD = const(31)  # power unknown at some tick of the current bucket
_PVB = const(32)  # consecutive complete buckets with known power
_BSTART = const(33)
_STARTED = const(34)
_LAST_MS = const(35)
_CAND = const(36)  # channels flat under a swing at the last evaluation
_RUN = const(37)  # channels whose reading is unchanged (and valid) since their _SAME_MS
_FPBAD = const(38)  # runs that saw a bucket with unknown power
_COLD_C = const(39)  # channels colder than ambient - cold_mc, since their _COLD_T
_WARM_C = const(40)  # flagged channels back within cold_clear_mc, since their _COLD_T
_PREV_OK = const(41)  # channels valid at the previous tick
_OBP = const(42)  # where the ring's bucket power means start (nb of them)
_OBMIN = const(43)  # ... the ring's minima: nb per channel of stuck_mask, by channel
_OBMAX = const(44)  # ... and maxima (the other channels are never judged stuck)
_CH = const(45)  # then one record of _K ints per channel:
_CMIN = const(0)  # the current bucket's minimum
_CMAX = const(1)  # ... and maximum
_VB = const(2)  # consecutive complete valid buckets
_CAND_MS = const(3)
_LAST = const(4)  # last valid reading
_SAME_MS = const(5)
_FPMIN = const(6)  # bucket power means over the frozen run
_FPMAX = const(7)
_SMIN = const(8)  # movement since flagged stuck
_SMAX = const(9)
_COLD_T = const(10)
_JUMP_T = const(11)
_K = const(12)

del const  # folded at compile time: a module name less (its table has 12 slots)


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
        from array import array

        n = n_channels
        nb = window_ms // bucket_ms
        ns = 0  # channels judged stuck or not
        m = stuck_mask
        while m:
            ns += m & 1
            m >>= 1
        # the records, then the ring: nb bucket power means, nb minima and maxima for
        # each channel of stuck_mask
        obp = _CH + _K * n
        a = array("i", bytes(4 * (obp + nb * (2 * ns + 1))))
        cfg = (n, controlled, ambient, stuck_mask, stuck_pp_mc, clear_pp_mc, window_ms)
        cfg += (bucket_ms, confirm_ms, swing_mw, frozen_ms, frozen_min_mw, frozen_swing_mw)
        cfg += (cold_mc, cold_clear_mc, cold_ms, jump_mc, jump_dt_ms, jump_hold_ms, nb)
        k = 0
        for v in cfg:
            a[k] = v
            k += 1
        a[_OBP] = obp
        a[_OBMIN] = obp + nb
        a[_OBMAX] = obp + nb + ns * nb
        o = _CH
        while o < obp:
            a[o + _CMIN] = _BIG
            a[o + _CMAX] = -_BIG
            o += _K
        self._a = a
        self.stuck = 0
        self.implausible = 0

    def __getattr__(self, name):
        """The configuration and the other verdicts by name (``watch.cold``,
        ``watch.stuck_count``, ``watch.nb``): read-only, from the array."""
        names = (
            "n",
            "controlled",
            "ambient",
            "stuck_mask",
            "stuck_pp_mc",
            "clear_pp_mc",
            "window_ms",
            "bucket_ms",
            "confirm_ms",
            "swing_mw",
            "frozen_ms",
            "frozen_min_mw",
            "frozen_swing_mw",
            "cold_mc",
            "cold_clear_mc",
            "cold_ms",
            "jump_mc",
            "jump_dt_ms",
            "jump_hold_ms",
            "nb",
            "stuck",
            "implausible",
            "cold",
            "jumpy",
            "faults",
            "stuck_count",
            "implausible_count",
        )
        if name in names:
            return self._a[names.index(name)]
        raise AttributeError(name)

    # -- the tick --------------------------------------------------------------
    def update(self, temps_mc, valid_mask, power_mw, now_ms):
        """One control tick; returns ``faults``. Allocation-free."""
        a = self._a
        if not a[_STARTED]:
            a[_STARTED] = 1
            a[_BSTART] = now_ms
            a[_LAST_MS] = now_ms
        dt = ticks_diff(now_ms, a[_LAST_MS])
        a[_LAST_MS] = now_ms
        n = a[_N]
        full = (1 << n) - 1
        valid = valid_mask & full

        _implausible(a, temps_mc, valid, dt, now_ms)

        # the current bucket
        o = _CH
        i = 0
        while i < n:
            if valid & (1 << i):
                t = temps_mc[i]
                if t < a[o + _CMIN]:
                    a[o + _CMIN] = t
                if t > a[o + _CMAX]:
                    a[o + _CMAX] = t
            o += _K
            i += 1
        a[_CBAD] |= full & ~valid
        if power_mw < 0:
            a[_PBAD] = 1
        else:
            if power_mw > _BIG:
                power_mw = _BIG
            pn = a[_PN] + 1
            a[_PN] = pn
            a[_PMEAN] += (power_mw - a[_PMEAN]) // pn

        _frozen_tick(a, temps_mc, valid, now_ms)
        s = a[_STUCK] & valid
        if s:  # a stuck channel that moved clear_pp_mc since it was flagged is not stuck
            o = _CH
            i = 0
            while i < n:
                bit = 1 << i
                if s & bit:
                    t = temps_mc[i]
                    if t < a[o + _SMIN]:
                        a[o + _SMIN] = t
                    if t > a[o + _SMAX]:
                        a[o + _SMAX] = t
                    if a[o + _SMAX] - a[o + _SMIN] >= a[_CLEAR_PP]:
                        a[_STUCK] &= ~bit
                        a[_CAND] &= ~bit
                        a[_RUN] &= ~bit
                o += _K
                i += 1
        if ticks_diff(now_ms, a[_BSTART]) >= a[_BKT]:
            _close_bucket(a, now_ms)

        stuck = a[_STUCK]
        implausible = a[_COLD] | a[_JUMPY]
        faults = stuck | implausible
        a[_IMPL] = implausible
        a[_FAULTS] = faults
        self.stuck = stuck
        self.implausible = implausible
        return faults


# -- implausible ---------------------------------------------------------------------
def _implausible(a, temps_mc, valid, dt, now_ms):
    """Jumping channels (every one), then channels colder than the air (controlled)."""
    n = a[_N]
    both = valid & a[_PREV_OK] if 0 < dt <= a[_JUMP_DT] else 0
    lim = a[_JUMP_MC_I]
    jumpy = a[_JUMPY]
    o = _CH
    i = 0
    while i < n:
        bit = 1 << i
        if both & bit:
            d = temps_mc[i] - a[o + _LAST]
            if d > lim or -d > lim:
                if not jumpy & bit:
                    jumpy |= bit
                    a[_ICOUNT] += 1
                a[o + _JUMP_T] = now_ms
        if jumpy & bit and ticks_diff(now_ms, a[o + _JUMP_T]) >= a[_JUMP_HOLD]:
            jumpy &= ~bit
        o += _K
        i += 1
    a[_JUMPY] = jumpy
    a[_PREV_OK] = valid

    amb_i = a[_AMB]
    if amb_i < 0:
        return
    abit = 1 << amb_i
    if not valid & abit or a[_JUMPY] & abit:
        a[_COLD_C] = 0
        a[_WARM_C] = 0
        return
    amb = temps_mc[amb_i]
    ctl = a[_CTL]
    cold = a[_COLD]
    cold_c = a[_COLD_C]
    warm_c = a[_WARM_C]
    o = _CH
    i = 0
    while i < n:
        bit = 1 << i
        if ctl & bit:
            if not valid & bit:
                cold_c &= ~bit
                warm_c &= ~bit
            elif cold & bit:
                if temps_mc[i] >= amb - a[_COLD_CLR]:
                    if not warm_c & bit:
                        warm_c |= bit
                        a[o + _COLD_T] = now_ms
                    elif ticks_diff(now_ms, a[o + _COLD_T]) >= a[_COLD_MS_I]:
                        cold &= ~bit
                        warm_c &= ~bit
                else:
                    warm_c &= ~bit
            elif temps_mc[i] < amb - a[_COLD_MC_I]:
                if not cold_c & bit:
                    cold_c |= bit
                    a[o + _COLD_T] = now_ms
                elif ticks_diff(now_ms, a[o + _COLD_T]) >= a[_COLD_MS_I]:
                    cold |= bit
                    cold_c &= ~bit
                    a[_ICOUNT] += 1
            else:
                cold_c &= ~bit
        o += _K
        i += 1
    a[_COLD] = cold
    a[_COLD_C] = cold_c
    a[_WARM_C] = warm_c


# -- stuck -----------------------------------------------------------------------------
def _frozen_tick(a, temps_mc, valid, now_ms):
    n = a[_N]
    smask = a[_SMASK]
    run = a[_RUN]
    fpbad = a[_FPBAD]
    o = _CH
    i = 0
    while i < n:
        bit = 1 << i
        if not valid & bit:
            run &= ~bit
        else:
            t = temps_mc[i]
            if not run & bit or t != a[o + _LAST]:
                run |= bit
                a[o + _SAME_MS] = now_ms
                a[o + _FPMIN] = _BIG
                a[o + _FPMAX] = -_BIG
                fpbad &= ~bit
                a[o + _LAST] = t
            elif (
                smask & bit
                and not fpbad & bit
                and ticks_diff(now_ms, a[o + _SAME_MS]) >= a[_FROZEN]
                and a[o + _FPMIN] >= a[_FMIN]
                and a[o + _FPMAX] - a[o + _FPMIN] >= a[_FSWING]
            ) and not a[_STUCK] & bit:
                a[_STUCK] |= bit  # stuck (frozen) at t
                a[_SCOUNT] += 1
                a[o + _SMIN] = t
                a[o + _SMAX] = t
        o += _K
        i += 1
    a[_RUN] = run
    a[_FPBAD] = fpbad
    # _LAST keeps the last valid reading of every channel (the jump check's too)


def _close_bucket(a, now_ms):
    n = a[_N]
    nb = a[_NB]
    h = a[_HEAD]
    cbad = a[_CBAD]
    bmin = a[_OBMIN]
    bmax = a[_OBMAX]
    smask = a[_SMASK]
    o = _CH
    r = h  # slot h of the channel's ring (channels of stuck_mask only have one)
    i = 0
    while i < n:
        if smask & (1 << i):
            a[bmin + r] = a[o + _CMIN]
            a[bmax + r] = a[o + _CMAX]
            r += nb
        if cbad & (1 << i):
            a[o + _VB] = 0
        elif a[o + _VB] < nb:
            a[o + _VB] += 1
        a[o + _CMIN] = _BIG
        a[o + _CMAX] = -_BIG
        o += _K
        i += 1
    a[_CBAD] = 0
    pknown = not a[_PBAD] and a[_PN] > 0
    pmean = a[_PMEAN]
    bp = a[_OBP]
    a[bp + h] = pmean
    if pknown:
        if a[_PVB] < nb:
            a[_PVB] += 1
    else:
        a[_PVB] = 0
    a[_PMEAN] = 0
    a[_PN] = 0
    a[_PBAD] = 0
    a[_HEAD] = h + 1 if h + 1 < nb else 0
    a[_BSTART] = now_ms

    # frozen runs: the power they have seen
    run = a[_RUN]
    o = _CH
    i = 0
    while i < n:
        bit = 1 << i
        if run & bit:
            if not pknown:
                a[_FPBAD] |= bit
            else:
                if pmean < a[o + _FPMIN]:
                    a[o + _FPMIN] = pmean
                if pmean > a[o + _FPMAX]:
                    a[o + _FPMAX] = pmean
        o += _K
        i += 1

    # flat under a swing, over the last nb complete buckets
    if a[_PVB] < nb:
        a[_CAND] = 0
        return
    lo = _BIG
    hi = -_BIG
    k = bp
    while k < bp + nb:
        p = a[k]
        if p < lo:
            lo = p
        if p > hi:
            hi = p
        k += 1
    if hi - lo < a[_SWING]:
        a[_CAND] = 0
        return
    cand = a[_CAND]
    o = _CH
    r = 0  # the channel's ring
    i = 0
    while i < n:
        bit = 1 << i
        if not smask & bit or a[o + _VB] < nb:
            cand &= ~bit
        else:
            lo = _BIG
            hi = -_BIG
            k = r
            while k < r + nb:
                if a[bmin + k] < lo:
                    lo = a[bmin + k]
                if a[bmax + k] > hi:
                    hi = a[bmax + k]
                k += 1
            if hi - lo >= a[_STUCK_PP]:
                cand &= ~bit
            elif not cand & bit:
                cand |= bit
                a[o + _CAND_MS] = now_ms
            elif ticks_diff(now_ms, a[o + _CAND_MS]) >= a[_CONFIRM] and not a[_STUCK] & bit:
                a[_STUCK] |= bit  # stuck (flat under the swing) at its last reading
                a[_SCOUNT] += 1
                a[o + _SMIN] = a[o + _LAST]
                a[o + _SMAX] = a[o + _LAST]
        if smask & bit:
            r += nb
        o += _K
        i += 1
    a[_CAND] = cand
