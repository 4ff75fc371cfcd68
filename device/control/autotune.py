"""Relay autotune (Astrom-Hagglund), the way ESPHome's ``pid: autotune`` does it.

    tune = RelayTune()
    tune.start(bias=30000, amp=13107, floor=13107)      # ValueError: cannot start
    duty = tune.update(dt_ms, err_mc, causes, hosted, floor)   # -1: not running
    if tune.report_pending: send tune.report() ...

The control law is replaced by a relay on the regulated error ``err`` (measurement
minus setpoint, m degC; the app's worst-channel error): the fans run at ``bias + d``
while the error is above ``+hyst`` and at ``bias - d`` once it falls below ``-hyst``
(the hysteresis keeps NTC noise from chattering the relay). A lagging plant answers
with a limit cycle; each rising switch closes one cycle, whose period is the time
since the last rising switch and whose amplitude ``a`` is half the error's
peak-to-peak over it. When the last ``cycles`` cycles agree (each period and each
amplitude within ``TOL_PCT`` % of their mean, every amplitude at least 1.5 ``hyst``
and no floor clipping inside the cycle), the describing function of an ideal relay
gives the ultimate gain and period

    Ku = 4 d / (pi a)          Pu = mean period

and the gains follow the Tyreus-Luyben PI rule

    Kp = Ku / 3.2      Ti = 2.2 Pu      (ki = Kp / Ti, kd = 0)

Why Tyreus-Luyben: Ziegler-Nichols (Kp = 0.6 Ku, Ti = Pu / 2) is tuned for a
quarter-amplitude decay, which on a thermal plant with an NTC lag is a ringing loop
and fan noise; "no overshoot" ZN (0.2 Ku, Pu / 2) still puts the integral time at half
the ultimate period, and an integral time that short is what limit-cycles a lagging
chassis (issue 11: Ti under ~10 s oscillates with a 12 s NTC lag). Tyreus-Luyben was
made for lag-dominated process loops: a gain margin of about 3 and an integral time of
2.2 Pu. No derivative: the NTC's ADC noise and the 100 ms tick make D mostly noise,
and the rule's PI form is the one with the documented margins. docs/autotune.md.

Gains come out in the wire's milli-units (``pid_gains``): kp in 0.001 %duty/degC, ki in
0.001 %duty/(degC s). With d in duty_u16 and a in m degC,

    Ku[m %/degC] = 1000 * 4 * (100 d / 65535) / (pi * a / 1000) = 1942.85 d / a

computed as ``d * 9714 // (5 * a)`` (9714 / 5 = 1942.8, 3e-5 low).

The test aborts (``status``) on any safety cause (``device.safety`` CAUSE_* bits),
when the app is no longer HOSTED in automatic mode (host lost, manual, fail-safe), when
the error rises past ``max_rise``, when a floor keeps the relay's low level from
reaching the fans for ``FLOOR_GRACE_MS``, after ``MAX_CYCLES`` cycles without
agreement (``inconsistent``) and at ``timeout``. The safety layer still applies its
floors to the relay's duty every tick (the relay is a request like the PID's).

Fixed point and bounded: every value stays a small int (< 2**30; tests/intcheck.py),
``update`` allocates nothing (preallocated arrays); ``report`` allocates a dict, once
per cycle or at the end.
"""

from array import array

from protocol import catalog as C

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


DUTY_FULL = const(65535)
MAX_CYCLES = const(12)  # cycles measured before giving up (inconsistent)
TOL_PCT = const(15)  # each cycle's period and amplitude within 15 % of their mean
FLOOR_GRACE_MS = const(30000)  # a floor above the relay's low level this long: abort
DT_MAX_MS = const(1000)
# Before the relay: hold the bias until the error is steady (it changes by at most
# hyst / 2 over each of two STEADY_STEP_MS steps, and over more when the loop's
# signal holds its peaks (``hold_ms``: the die envelope's window, a plateau that is
# not a steady state), after at least SETTLE_MIN_MS; at most SETTLE_MAX_MS); the
# relay then switches about that error (``center``).
SETTLE_MIN_MS = const(30000)
SETTLE_MAX_MS = const(600000)
STEADY_STEP_MS = const(10000)

# start() parameter ranges (the autotune message's ranges, protocol/catalog.py)
AMP_MIN = const(3277)  # 5 % duty
AMP_MAX = const(32767)  # 50 %
AMP_DEFAULT = const(13107)  # 20 %
HYST_MIN = const(50)
HYST_MAX = const(5000)
HYST_DEFAULT = const(300)  # 0.3 degC: a few ADC codes of an NTC at 70 degC
RISE_MIN = const(1000)
RISE_MAX = const(20000)
RISE_DEFAULT = const(8000)  # abort 8 degC above the setpoint
TIMEOUT_MIN_S = const(60)
TIMEOUT_MAX_S = const(7200)
TIMEOUT_DEFAULT_S = const(1800)
CYCLES_MIN = const(2)
CYCLES_MAX = const(8)
CYCLES_DEFAULT = const(3)

GAIN_MAX = const(1000000)  # wire limit of a gain (milli-units)

# ``status`` values: the catalog's ``tune_status`` enumeration.
RUNNING = C.TUNE_RUNNING
DONE = C.TUNE_DONE


def ultimate_gain(d, a_mc):
    """Ku in milli-%duty per degC for a relay half-amplitude ``d`` (duty_u16) and an
    oscillation amplitude ``a_mc`` (m degC, > 0): 4 d / (pi a).

    >>> ultimate_gain(13107, 1000)
    25464
    """
    if a_mc <= 0:
        return GAIN_MAX
    if d > AMP_MAX:
        d = AMP_MAX
    ku = d * 9714 // (5 * a_mc)  # d * 9714 < 2**29
    return GAIN_MAX if ku > GAIN_MAX else ku


def tyreus_luyben(ku, pu_ms):
    """``(kp, ki, kd)`` in the wire's milli-units from Ku (milli-%/degC) and Pu (ms):
    Kp = Ku / 3.2, Ti = 2.2 Pu, no derivative.

    >>> tyreus_luyben(25464, 60000)
    (7957, 60, 0)
    """
    kp = ku * 5 // 16
    if kp > GAIN_MAX:
        kp = GAIN_MAX
    ti_ms = pu_ms * 11 // 5
    if ti_ms <= 0:
        return kp, 0, 0
    ki = kp * 1000 // ti_ms  # kp <= 10**6: the product stays below 2**30
    if ki > GAIN_MAX:
        ki = GAIN_MAX
    return kp, ki, 0


def _agree(vals, first, n):
    """True when each of ``vals[first:first + n]`` is within TOL_PCT % of their mean
    (no slicing; ints only). Values are <= 2**23 (periods in ms <= 7.2e6)."""
    s = 0
    i = 0
    while i < n:
        s += vals[first + i]
        i += 1
    if s <= 0:
        return False
    i = 0
    while i < n:
        dev = vals[first + i] * n - s
        if dev < 0:
            dev = -dev
        if dev // n * 100 > TOL_PCT * (s // n):
            return False
        i += 1
    return True


class RelayTune:
    """The relay test's state; see the module docstring. ``status`` is RUNNING while
    the test runs, then DONE or the reason it stopped (a catalog ``tune_status``)."""

    def __init__(self):
        self.periods = array("i", [0] * MAX_CYCLES)
        self.amps = array("i", [0] * MAX_CYCLES)
        self.status = C.TUNE_IDLE
        self.ref = 0
        self.bias = 0
        self.d = 0
        self.lo = 0
        self.hi = 0
        self.hyst = HYST_DEFAULT
        self.max_rise = RISE_DEFAULT
        self.need = CYCLES_DEFAULT
        self.timeout_ms = TIMEOUT_DEFAULT_S * 1000
        self.t_ms = 0  # time since start
        self.settling = False  # holding the bias before the relay
        self.center = 0  # error the relay switches about (m degC)
        self.s_prev = 0  # settle: the error at the last step
        self.s_next = 0  # settle: time of the next step
        self.s_steady = 0  # settle: steady steps in a row
        self.s_need = 2  # settle: steady steps needed
        self.high = False
        self.n = 0  # cycles measured
        self.t_rise = -1  # time of the last rising switch, -1 before the first
        self.e_max = 0
        self.e_min = 0
        self.clipped = False  # a floor clipped the relay inside the current cycle
        self.clip_ms = 0  # how long the floor has held the low level up
        self.cause = 0  # safety causes that aborted it
        self.ku = 0
        self.pu_ms = 0
        self.a_mc = 0
        self.kp = 0
        self.ki = 0
        self.kd = 0
        self.report_pending = False
        self.ended = False  # True once, at the tick that ended the test

    @property
    def running(self):
        return self.status == RUNNING

    def start(
        self,
        bias,
        floor,
        amp=AMP_DEFAULT,
        hyst=HYST_DEFAULT,
        max_rise=RISE_DEFAULT,
        timeout_s=TIMEOUT_DEFAULT_S,
        cycles=CYCLES_DEFAULT,
        ref=0,
        settle=True,
        hold_ms=0,
    ):
        """Begin a test around ``bias`` (the duty the loop holds now). The relay's
        levels are kept within ``[floor, 100 %]``: the bias moves up or down so the
        whole swing ``bias +- amp`` fits, and ``amp`` shrinks only if the room
        between the floor and full duty is smaller than the swing. With ``settle``
        the bias is held until the error is steady and the relay switches about that
        error (so a loop resting on its floor below the setpoint can be tuned);
        without, about 0. ValueError (with the limits) if a parameter is out of range
        or the swing does not fit."""
        _range("amplitude", amp, AMP_MIN, AMP_MAX)
        _range("hysteresis", hyst, HYST_MIN, HYST_MAX)
        _range("max_rise", max_rise, RISE_MIN, RISE_MAX)
        _range("timeout_s", timeout_s, TIMEOUT_MIN_S, TIMEOUT_MAX_S)
        _range("cycles", cycles, CYCLES_MIN, CYCLES_MAX)
        if floor < 0:
            floor = 0
        room = (DUTY_FULL - floor) // 2
        if amp > room:
            amp = room
        if amp < AMP_MIN:
            raise ValueError(
                "the floor (%d) leaves no room for a relay of at least %d duty" % (floor, AMP_MIN)
            )
        if bias < floor + amp:
            bias = floor + amp
        if bias > DUTY_FULL - amp:
            bias = DUTY_FULL - amp
        self.bias = bias
        self.d = amp
        self.lo = bias - amp
        self.hi = bias + amp
        self.hyst = hyst
        self.max_rise = max_rise
        self.timeout_ms = timeout_s * 1000
        self.need = cycles
        self.ref = ref
        self.t_ms = 0
        self.settling = bool(settle)
        self.center = 0
        self.s_prev = RISE_MAX + 1  # no sample yet
        self.s_next = STEADY_STEP_MS
        self.s_steady = 0
        need = hold_ms // STEADY_STEP_MS + 2 if hold_ms > 0 else 2
        self.s_need = need if need < SETTLE_MAX_MS // STEADY_STEP_MS else 2
        self.high = True  # the first half-cycle cools: the error starts where it is
        self.n = 0
        self.t_rise = -1
        self.e_max = -RISE_MAX
        self.e_min = RISE_MAX
        self.clipped = False
        self.clip_ms = 0
        self.cause = 0
        self.ku = self.pu_ms = self.a_mc = 0
        self.kp = self.ki = self.kd = 0
        self.status = RUNNING
        self.report_pending = True
        self.ended = False

    def abort(self, status=C.TUNE_ABORTED):
        """Stop the test (a host's abort, or ``status``); no-op when not running."""
        if self.status == RUNNING:
            self._end(status)

    def _end(self, status):
        self.status = status
        self.report_pending = True
        self.ended = True

    def update(self, dt_ms, err_mc, causes, hosted, floor):
        """One control tick: the duty the relay asks for (``-1`` when not running or
        when this tick ended the test). ``causes``: the safety CAUSE_* bits of this
        tick; ``hosted``: the app is HOSTED in automatic mode; ``floor``: the highest
        fan floor the safety layer applied on the tick before. Allocates nothing."""
        if self.status != RUNNING:
            return -1
        if dt_ms < 0:
            dt_ms = 0
        elif dt_ms > DT_MAX_MS:
            dt_ms = DT_MAX_MS
        t = self.t_ms + dt_ms
        self.t_ms = t
        if causes:
            self.cause = causes
            self._end(C.TUNE_SAFETY)
            return -1
        if not hosted:
            self._end(C.TUNE_NOT_HOSTED)
            return -1
        if err_mc > self.max_rise:
            self._end(C.TUNE_TOO_HOT)
            return -1
        if t >= self.timeout_ms:
            self._end(C.TUNE_TIMEOUT)
            return -1
        if self.settling:
            return self._settle(t, err_mc, floor, dt_ms)
        if floor > (self.hi if self.high else self.lo):
            self.clipped = True
            self.clip_ms += dt_ms
            if self.clip_ms >= FLOOR_GRACE_MS:
                self._end(C.TUNE_FLOOR)
                return -1
        else:
            self.clip_ms = 0
        e = err_mc - self.center
        if e > self.e_max:
            self.e_max = e
        if e < self.e_min:
            self.e_min = e
        h = self.hyst
        if self.high:
            if e < -h:
                self.high = False
        elif e > h:
            self.high = True
            self._rise(t)
            if self.status != RUNNING:
                return -1
        return self.hi if self.high else self.lo

    def _settle(self, t, err_mc, floor, dt_ms):
        """Hold the bias until the error is steady; then the relay starts about it."""
        if floor > self.bias:
            self.clip_ms += dt_ms
            if self.clip_ms >= FLOOR_GRACE_MS:
                self._end(C.TUNE_FLOOR)
                return -1
        else:
            self.clip_ms = 0
        if t >= self.s_next:
            self.s_next = t + STEADY_STEP_MS
            d = err_mc - self.s_prev
            if d < 0:
                d = -d
            self.s_steady = self.s_steady + 1 if 2 * d <= self.hyst else 0
            self.s_prev = err_mc
            if (t >= SETTLE_MIN_MS and self.s_steady >= self.s_need) or t >= SETTLE_MAX_MS:
                self.settling = False
                self.center = err_mc
                self.clip_ms = 0
                self.e_max = -RISE_MAX
                self.e_min = RISE_MAX
                self.report_pending = True
        return self.bias

    def _rise(self, t):
        """A rising switch: close the cycle that began at the previous one."""
        if self.t_rise >= 0:
            i = self.n
            amp = (self.e_max - self.e_min) // 2
            self.periods[i] = t - self.t_rise
            # a cycle too small to tell from noise, or clipped by a floor, is not a
            # measurement: it is recorded as 0 and breaks any run of agreeing cycles
            self.amps[i] = 0 if self.clipped or 2 * amp < 3 * self.hyst else amp
            self.n = i + 1
            self.report_pending = True
            need = self.need
            if self.n >= need and self._consistent(self.n - need, need):
                self._result(self.n - need, need)
                self._end(DONE)
                return
            if self.n >= MAX_CYCLES:
                self._end(C.TUNE_INCONSISTENT)
                return
        self.t_rise = t
        self.e_max = -RISE_MAX
        self.e_min = RISE_MAX
        self.clipped = False

    def _consistent(self, first, n):
        amps = self.amps
        i = 0
        while i < n:
            if amps[first + i] <= 0:
                return False
            i += 1
        return _agree(self.periods, first, n) and _agree(amps, first, n)

    def _result(self, first, n):
        ps = 0
        As = 0
        i = 0
        while i < n:
            ps += self.periods[first + i]
            As += self.amps[first + i]
            i += 1
        self.pu_ms = ps // n
        self.a_mc = As // n
        self.ku = ultimate_gain(self.d, self.a_mc)
        self.kp, self.ki, self.kd = tyreus_luyben(self.ku, self.pu_ms)

    def report(self):
        """The ``autotune_report`` fields (allocates: once per cycle or at the end);
        clears ``report_pending``."""
        self.report_pending = False
        n = self.n
        f = {
            "ref": self.ref & 0xFFFF,
            "status": self.status,
            "cycles": n,
            "elapsed_s": self.t_ms // 1000,
            "bias": self.bias,
            "relay": self.d,
            "center": self.center,
        }
        if n:
            f["period_ms"] = self.periods[n - 1]
            f["amplitude"] = self.amps[n - 1]
        if self.cause:
            f["causes"] = self.cause
        if self.status == DONE:
            f["ku"] = self.ku
            f["pu_ms"] = self.pu_ms
            f["kp"] = self.kp
            f["ki"] = self.ki
            f["kd"] = self.kd
        return f


def _range(name, v, lo, hi):
    if type(v) is not int or v < lo or v > hi:
        raise ValueError("%s must be an int in %d..%d, got %r" % (name, lo, hi, v))
