"""Fixed-point PID for the reverse-acting cooling loop: duty rises when it is hot.

    pid = PID(kp=4000, ki=100, kd=20000, kff=50, slew_per_s=6553)
    pid.track(boot_duty, temp_mc)           # manual -> auto without a bump
    duty = pid.step(temp_mc, setpoint_mc, dt_ms, ff_mw=gpu_power_mw)

error = measurement - setpoint (m degC); positive error -> more cooling. The output is

    u = P + I + D + FF,  P = Kp*e,  I = integral(Ki*e dt),  D = Kd * d(measurement)/dt,
    FF = Kff * gpu_power

then clamped to [out_min, out_max] and slew-limited (separate rates up and down;
after ``track()`` or ``reset()`` the output falls at the rise's rate until it first
reaches the law's value: a boot, fail-safe or manual duty is not the loop's, and
the slow fall is for the loop's own output near the setpoint).
Features: derivative on the measurement (no kick on a setpoint change) through a
first-order low-pass of time constant ``d_filter_ms``; a deadband (``deadband_mc``:
errors within +-deadband count as 0, larger ones are reduced by it, so P and I see
a continuous error that is zero near the setpoint and the output does not hunt on
sensor noise or quantisation); conditional integration (the integrator stops while
the applied output is held, by a limit or by the slew limiter, in the direction the
error pushes; while the error is more than ``i_band_mc`` below the setpoint it
leaks toward zero with the tracking time constant instead; above the band it
integrates at the band's rate: a large error that persists still
reaches full cooling, but the rise of a load step does not wind it up faster than a
band-sized error would); an integral clamp [i_min,
i_max]; back-calculation anti-windup that only *unwinds* (when the clamped output
differs from the unclamped one, the integrator moves toward zero with tracking time
constant Tt = ``tracking_ms``, by default Ti = kp/ki, and never past zero), so P
and the feed-forward saturating the output are never absorbed into the integrator:
after a long time at the minimum the feed-forward still moves the fans at once;
bumpless manual -> auto transfer (``track``); GPU-power feed-forward so a load step
moves the fans before the heat arrives, with an optional guard (``step``'s
``keep_q8``) that keeps a share of it from being cancelled by a negative P + I + D
(the caller decides when: device/app.py's hosted law, while the die is heading for
its setpoint after a power rise); dt of 1..1000 ms (longer gaps count as 1000
ms, dt <= 0 returns the previous duty unchanged).

Gains (``set_gains``) are the wire's milli-units (protocol/catalog.py, pid_gains),
ints in 0..1000000 each:

    kp   0.001 %duty per degC          ki   0.001 %duty per (degC*s)
    kd   0.001 %duty*s per degC        kff  0.001 %duty per W

Fixed point (converted once, at set time; the tick uses only small ints)
--------------------------------------------------------------------------
* Internal signal unit "Q13 duty": duty_u16 * 2**13. Full scale 65535 << 13 =
  536862720 < 2**29. Every term (P, I, D, FF) and every partial sum is saturated to
  +-_SAT = +-(2**29 - 1), so adding two of them stays below 2**30 - 1.
* Each gain is a real number g = m / 2**sh with a 14-bit mantissa 0 <= m < 2**14
  (relative precision better than 1e-4) and sh <= 28 (sh < 0 for huge gains),
  plus ``lim``: the input magnitude beyond which the term saturates. ``mul(a, m, sh,
  lim)`` computes round(a*m / 2**sh) for |a| < 2**30 by splitting a into a high part
  (a >> 14, |.| <= 2**16) and a low 14-bit part, so no partial product reaches 2**30
  (see its docstring for the bound of every intermediate).
* Conversion, with F = 65535 * 2**13 (Q13 duty at 100 %duty; a milli-gain times a
  milli-unit input gives 1e-6 %, hence 10**8 = 100 * 10**6):
      P   per m degC of error          g = kp  * F / 10**8
      I   per (m degC * ms)            g = ki  * F / 10**11    (input e*dt <= 1.4e8)
      D   per Q8 m degC/s              g = kd  * F / (10**8 * 256)
      FF  per mW                       g = kff * F / 10**8
      slew per ms                      g = slew_per_s * 2**13 / 1000 (each direction)
  e.g. kp = 5000 (5 %/degC): g = 26843 Q13 duty per m degC = 13422 * 2**1.
* Inputs are clamped before any arithmetic: measurement and setpoint to +-2**20
  m degC, error to +-131071 m degC (the design worst case is +-100000; the
  deadband, <= 20000, is taken off after the clamp), the
  per-tick measurement change to +-524287 m degC, the measured rate to +-131071
  m degC/s (10 degC/s is the design case), GPU power to 0..2097151 mW (1 kW is
  1000000), dt to 1..1000 ms. The derivative path keeps the filtered rate in Q8
  m degC/s (<= 2**25) so the low-pass converges instead of sticking a few counts off.
* The integrator lives in Q13 duty, clamped to [i_min, i_max] duty (within +-65535),
  so it is bounded whatever the history. Resolution: 1/8192 duty per tick. With
  ki = 0 there is no integral action: the integrator stays 0 (no back-calculation,
  no bumpless initialisation, whose permanent offset a P/PD loop could never undo);
  a manual -> auto switch is then smoothed by the slew limiter only.

Tests (tests/test_pid.py): on CPython every arithmetic result of step() is checked
against +-2**30 by an AST-instrumented copy of this module (tests/intcheck.py) over
all extreme gains and inputs; on MicroPython the same drive runs under
micropython.heap_lock() (no floats, tuples or other objects; the unix port's small
ints are 63-bit, so only the CPython check proves the 31-bit bound of the MCU).
"""

from array import array

try:
    from micropython import const
except ImportError:
    const = lambda x: x  # noqa: E731

# The limits: const() (folded, no module dict entries); read by name through the
# module's __getattr__ (GAIN_MAX, DUTY_MAX, SLEW_MAX, D_FILTER_MAX_MS, DEADBAND_MAX,
# I_BAND_MAX, TRACKING_MAX_MS).
_GAIN_MAX = const(1000000)  # wire limit of every gain (milli-units)
_DUTY_MAX = const(65535)
_SLEW_MAX = const(6553500)  # duty per second: full scale in 10 ms; 0 disables the limiter
_D_FILTER_MAX_MS = const(60000)
_DEADBAND_MAX = const(20000)  # m degC
_I_BAND_MAX = const(131071)  # m degC; the largest error, i.e. "always integrate"
_TRACKING_MAX_MS = const(600000)

_Q = const(13)  # Q13 duty
_HALF_Q = const(4096)
_SAT = const(536870911)  # 2**29 - 1
_A_MAX = const(1073741823)  # 2**30 - 1: "never saturate" input limit for mul()
_T_LIM = const(1048575)  # m degC, measurement / setpoint clamp
_E_MAX = const(131071)  # m degC, error clamp
_DM_MAX = const(524287)  # m degC, measurement change per tick clamp
_R_MAX = const(131071)  # m degC/s, measured rate clamp
_R_Q = const(8)  # filtered rate in Q8 m degC/s
_P_MAX_MW = const(2097151)  # feed-forward input clamp
_DT_MAX = const(1000)  # ms

# Q13 duty at 100 %duty (65535 << 13); set_gains() divides it down to the units.
_FULL_Q = const(536862720)


def __getattr__(name):
    """The limits by name (see above)."""
    if name == "GAIN_MAX":
        return _GAIN_MAX
    if name == "DUTY_MAX":
        return _DUTY_MAX
    if name == "SLEW_MAX":
        return _SLEW_MAX
    if name == "D_FILTER_MAX_MS":
        return _D_FILTER_MAX_MS
    if name == "DEADBAND_MAX":
        return _DEADBAND_MAX
    if name == "I_BAND_MAX":
        return _I_BAND_MAX
    if name == "TRACKING_MAX_MS":
        return _TRACKING_MAX_MS
    raise AttributeError(name)


def mul(a, m, sh, lim):
    """Return round(a * m / 2**sh) (half up), saturated to +-(2**29 - 1).

    Preconditions, established by ``gain()``: |a| <= 2**30 - 1, 0 <= m < 2**14,
    sh <= 28, and |a| < lim implies |a*m / 2**sh| <= 2**29 - 2. Intermediates:
    sh <= 0: |a*m| <= 2**29 before and after the left shift (lim bounds it).
    sh > 0: hi = (a >> 14) * m < 2**16 * 2**14 = 2**30; lo = (a & 0x3FFF) * m < 2**28.
      sh >= 14: ((hi mod 2**(sh-14)) << 14) < 2**sh <= 2**28, plus lo and the
      rounding half: < 2**28 + 2**28 + 2**27 < 2**30.
      0 < sh < 14: |hi << (14-sh)| <= |a*m|/2**sh + 2**(28-sh) <= 2**29 + 2**27.
    """
    if a >= lim:
        return _SAT
    if a <= -lim:
        return -_SAT
    if sh <= 0:
        return (a * m) << -sh
    hi = (a >> 14) * m
    lo = (a & 0x3FFF) * m
    if sh >= 14:
        s2 = sh - 14
        return (hi >> s2) + ((((hi & ((1 << s2) - 1)) << 14) + lo + (1 << (sh - 1))) >> sh)
    return (hi << (14 - sh)) + ((lo + (1 << (sh - 1))) >> sh)


def _zero_gain():
    # Built at run time: ``return 0, 14, _A_MAX`` is a constant tuple, and freezing
    # stores its 2**30 - 1 as a big int whose arithmetic allocates on the MCU
    # (tests/test_frozen_ints.py).
    lim = _A_MAX
    return 0, 14, lim


def gain(num, den):
    """Convert the real gain num/den (ints >= 0) into ``(m, sh, lim)`` for ``mul``.

    Runs at set time only (it may use big ints).

    >>> gain(3, 2)
    (12288, 13, 357913941)
    >>> mul(1000, *gain(3, 2))
    1500
    """
    if num == 0:
        return _zero_gain()
    sh = 28
    while True:
        if sh >= 0:
            m = (num * (2 << sh) + den) // (2 * den)
        else:
            m = (num * 2 + (den << -sh)) // ((2 * den) << -sh)
        if m < 0x4000:
            break
        sh -= 1
    if m == 0:  # too small to represent: behaves as zero
        return _zero_gain()
    if sh >= 0:
        lim = ((_SAT - 1) << sh) // m + 1
    else:
        lim = (_SAT - 1) // (m << -sh) + 1
    if lim > _A_MAX:
        lim = _A_MAX
    return m, sh, lim


def _check_int(name, value, lo, hi, unit):
    if type(value) is not int or value < lo or value > hi:
        raise ValueError("%s must be an int in %d..%d (%s), got %r" % (name, lo, hi, unit, value))


# The PID's settings and state: one array('i') (``PID._a``), indexed by these. The
# first 14 are what ``__getattr__`` answers by name (``_PUBLIC``'s order).
_KP = const(0)  # the gains as set (milli-units)
_KI = const(1)
_KD = const(2)
_KFF = const(3)
_OUT_MIN = const(4)  # duty
_OUT_MAX = const(5)
_SLEW = const(6)  # slew_per_s
_SDN = const(7)  # slew_down_per_s
_DB = const(8)  # deadband_mc
_IBAND = const(9)  # i_band_mc
_TAU = const(10)  # d_filter_ms
_TRACK = const(11)  # tracking_ms as set, -1 = None (Ti)
_AW = const(12)  # antiwindup, 0/1
_DUTY = const(13)  # the last output
_KP_M = const(14)  # each gain as mul()'s (m, sh, lim)
_KP_S = const(15)
_KP_L = const(16)
_KI_M = const(17)
_KI_S = const(18)
_KI_L = const(19)
_KD_M = const(20)
_KD_S = const(21)
_KD_L = const(22)
_KFF_M = const(23)
_KFF_S = const(24)
_KFF_L = const(25)
_SL_M = const(26)  # rise slew per ms
_SL_S = const(27)
_SL_L = const(28)
_SD_M = const(29)  # fall slew per ms
_SD_S = const(30)
_SD_L = const(31)
_LO = const(32)  # output limits, Q13 duty
_HI = const(33)
_I_LO = const(34)  # integral limits, Q13 duty
_I_HI = const(35)
_TT = const(36)  # back-calculation time constant in use, ms
_TT_AUTO = const(37)  # 1: Tt = Ti, follows the gains
_I = const(38)  # integrator, Q13 duty
_U = const(39)  # applied output, Q13 duty
_RF = const(40)  # filtered rate, Q8 m degC/s
_M_PREV = const(41)  # previous measurement
_UP = const(42)  # last P, D, FF terms, Q13 duty
_UD = const(43)
_UF = const(44)
_FRESH = const(45)  # no step since reset(): no previous sample
_PENDING = const(46)  # tracked: the next step starts bumplessly
_HELD = const(47)  # the applied output held up (1) / down (-1) by a limit or the slew
_DROP = const(48)  # a tracked duty falls at the rise's rate until the law's is reached
_N_STATE = const(49)


class PID:
    """Integer PID for a cooling loop; see the module docstring for units and scaling.

    ``duty`` is the last output (``out_max`` before the first step: full cooling
    until the loop has run). The settings read back as attributes (``kp``, ``ki``,
    ``kd``, ``kff``, ``out_min``, ``out_max``, ``slew_per_s``, ``slew_down_per_s``,
    ``deadband_mc``, ``i_band_mc``, ``d_filter_ms``, ``tracking_ms``, ``antiwindup``)
    and change through the ``set_*`` methods; everything lives in one ``array('i')``
    (a 50-attribute instance dict was 496 B on a 32-bit port).
    """

    def __init__(
        self,
        kp=0,
        ki=0,
        kd=0,
        kff=0,
        out_min=0,
        out_max=_DUTY_MAX,
        slew_per_s=0,
        d_filter_ms=1000,
        i_min=-_DUTY_MAX,
        i_max=_DUTY_MAX,
        tracking_ms=None,
        antiwindup=True,
        slew_down_per_s=None,
        deadband_mc=0,
        i_band_mc=_I_BAND_MAX,
    ):
        # Every value the tick touches is in this array (nothing grows later).
        a = array("i", bytes(4 * _N_STATE))
        self._a = a
        lim = _A_MAX
        for i in (_KP_M, _KI_M, _KD_M, _KFF_M, _SL_M, _SD_M):
            a[i + 1] = 14  # the zero gain (gain(0, 1))
            a[i + 2] = lim
        a[_IBAND] = _I_BAND_MAX
        a[_HI] = _DUTY_MAX << _Q
        a[_I_LO] = -(_DUTY_MAX << _Q)
        a[_I_HI] = _DUTY_MAX << _Q
        a[_TT_AUTO] = 1
        a[_AW] = 1 if antiwindup else 0
        a[_OUT_MAX] = _DUTY_MAX
        a[_TRACK] = -1
        self.set_output_limits(out_min, out_max)
        self.set_integral_limits(i_min, i_max)
        self.set_slew(slew_per_s, slew_down_per_s)
        self.set_deadband(deadband_mc, i_band_mc)
        self.set_d_filter(d_filter_ms)
        self.set_tracking(tracking_ms)
        self.set_gains(kp, ki, kd, kff)
        self.reset()

    def __getattr__(self, name):
        """The settings and ``duty`` by name (read-only; the tick never asks here)."""
        names = (
            "kp",
            "ki",
            "kd",
            "kff",
            "out_min",
            "out_max",
            "slew_per_s",
            "slew_down_per_s",
            "deadband_mc",
            "i_band_mc",
            "d_filter_ms",
            "tracking_ms",
            "antiwindup",
            "duty",
        )
        for i in range(len(names)):
            if names[i] == name:
                v = self._a[i]
                if i == _TRACK:
                    return None if v < 0 else v
                if i == _AW:
                    return v != 0
                return v
        raise AttributeError(name)

    # ------------------------------------------------------------ configuration

    def set_gains(self, kp, ki, kd, kff):
        """Set all four gains (milli-units, ints 0..1000000); ValueError names the limits.

        Nothing changes unless all four are valid. The integrator is kept in duty
        units, so changing ki does not bump the output.
        """
        _check_int("kp", kp, 0, _GAIN_MAX, "0.001 %duty/degC")
        _check_int("ki", ki, 0, _GAIN_MAX, "0.001 %duty/(degC*s)")
        _check_int("kd", kd, 0, _GAIN_MAX, "0.001 %duty*s/degC")
        _check_int("kff", kff, 0, _GAIN_MAX, "0.001 %duty/W")
        a = self._a
        a[_KP_M], a[_KP_S], a[_KP_L] = gain(kp * _FULL_Q, 10**8)
        a[_KI_M], a[_KI_S], a[_KI_L] = gain(ki * _FULL_Q, 10**11)
        a[_KD_M], a[_KD_S], a[_KD_L] = gain(kd * _FULL_Q, 10**8 << _R_Q)
        a[_KFF_M], a[_KFF_S], a[_KFF_L] = gain(kff * _FULL_Q, 10**8)
        a[_KP], a[_KI], a[_KD], a[_KFF] = kp, ki, kd, kff
        if a[_TT_AUTO]:
            a[_TT] = _auto_tracking(kp, ki)

    def set_output_limits(self, out_min, out_max):
        """Clamp the output to out_min..out_max duty (0 <= out_min <= out_max <= 65535).

        Cheap enough to call every tick, e.g. to raise out_min to a safety floor: the
        back-calculation then keeps the integrator consistent with the floor.
        """
        _check_int("out_min", out_min, 0, _DUTY_MAX, "duty_u16")
        _check_int("out_max", out_max, out_min, _DUTY_MAX, "duty_u16, >= out_min")
        a = self._a
        a[_OUT_MIN] = out_min
        a[_OUT_MAX] = out_max
        a[_LO] = out_min << _Q
        a[_HI] = out_max << _Q

    def set_integral_limits(self, i_min, i_max):
        """Clamp the integral term to i_min..i_max duty (-65535 <= i_min <= i_max <= 65535)."""
        _check_int("i_min", i_min, -_DUTY_MAX, _DUTY_MAX, "duty_u16")
        _check_int("i_max", i_max, i_min, _DUTY_MAX, "duty_u16, >= i_min")
        self._a[_I_LO] = i_min << _Q
        self._a[_I_HI] = i_max << _Q

    def set_slew(self, slew_per_s, slew_down_per_s=None):
        """Limit the output's rise to slew_per_s and its fall to slew_down_per_s duty
        per second (0 = unlimited; None = the same as the rise). After track() or
        reset() the fall is limited by slew_per_s until the output first reaches the
        law's value."""
        _check_int("slew_per_s", slew_per_s, 0, _SLEW_MAX, "duty_u16 per s, 0 = off")
        if slew_down_per_s is None:
            slew_down_per_s = slew_per_s
        _check_int("slew_down_per_s", slew_down_per_s, 0, _SLEW_MAX, "duty_u16 per s, 0 = off")
        a = self._a
        a[_SLEW] = slew_per_s
        a[_SDN] = slew_down_per_s
        a[_SL_M], a[_SL_S], a[_SL_L] = gain(slew_per_s << _Q, 1000)
        a[_SD_M], a[_SD_S], a[_SD_L] = gain(slew_down_per_s << _Q, 1000)

    def set_deadband(self, deadband_mc, i_band_mc=_I_BAND_MAX):
        """Error deadband and the conditional-integration band, both m degC.

        |error| <= deadband_mc counts as 0 and larger errors are reduced by it
        (0..20000); the integrator stops more than i_band_mc below the setpoint and
        integrates at most i_band_mc above it (deadband..131071; 131071 = no band)."""
        _check_int("deadband_mc", deadband_mc, 0, _DEADBAND_MAX, "m degC")
        _check_int("i_band_mc", i_band_mc, deadband_mc, _I_BAND_MAX, "m degC, >= deadband")
        self._a[_DB] = deadband_mc
        self._a[_IBAND] = i_band_mc

    def set_d_filter(self, d_filter_ms):
        """Time constant of the derivative's first-order low-pass (0 = unfiltered)."""
        _check_int("d_filter_ms", d_filter_ms, 0, _D_FILTER_MAX_MS, "ms")
        self._a[_TAU] = d_filter_ms

    def set_tracking(self, tracking_ms=None):
        """Back-calculation time constant Tt in ms; None = Ti = kp/ki (0 = one tick)."""
        a = self._a
        if tracking_ms is None:
            a[_TT_AUTO] = 1
            a[_TT] = _auto_tracking(a[_KP], a[_KI])
            a[_TRACK] = -1
        else:
            _check_int("tracking_ms", tracking_ms, 0, _TRACKING_MAX_MS, "ms")
            a[_TT_AUTO] = 0
            a[_TT] = tracking_ms
            a[_TRACK] = tracking_ms

    # ------------------------------------------------------------------ state

    def reset(self):
        """Forget all history: integrator 0, no previous sample, duty = out_max."""
        a = self._a
        a[_I] = 0
        a[_U] = a[_HI]
        a[_RF] = 0
        a[_M_PREV] = 0
        a[_UP] = 0
        a[_UD] = 0
        a[_UF] = 0
        a[_FRESH] = 1
        a[_PENDING] = 0
        a[_HELD] = 0
        a[_DROP] = 1
        a[_DUTY] = a[_OUT_MAX]

    def track(self, duty_u16, measurement_mc):
        """Follow a duty imposed from outside (manual, boot, fail-safe).

        The next ``step()`` starts bumplessly: the integrator is initialised so that
        its output equals ``duty_u16`` (as far as the integral limits allow; not
        with ki = 0, see the module docstring), the slew limiter starts from it and
        the derivative starts from ``measurement_mc``. Call it every tick while not
        in automatic mode, or once at the switch.
        """
        if duty_u16 < 0:
            duty_u16 = 0
        elif duty_u16 > _DUTY_MAX:
            duty_u16 = _DUTY_MAX
        m = measurement_mc
        if m > _T_LIM:
            m = _T_LIM
        elif m < -_T_LIM:
            m = -_T_LIM
        a = self._a
        a[_U] = duty_u16 << _Q
        a[_M_PREV] = m
        a[_RF] = 0
        a[_FRESH] = 0
        a[_PENDING] = 1
        a[_HELD] = 0
        a[_DROP] = 1
        a[_DUTY] = duty_u16

    def set_auto(self, measurement_mc, current_duty_u16):
        """Switch manual -> auto: same as ``track(current_duty_u16, measurement_mc)``."""
        self.track(current_duty_u16, measurement_mc)

    def terms(self, out):
        """Write the last P, I, D and FF contributions (duty, may be negative) into out[0:4]."""
        a = self._a
        out[0] = (a[_UP] + _HALF_Q) >> _Q
        out[1] = (a[_I] + _HALF_Q) >> _Q
        out[2] = (a[_UD] + _HALF_Q) >> _Q
        out[3] = (a[_UF] + _HALF_Q) >> _Q

    # ------------------------------------------------------------------- tick

    def step(self, measurement_mc, setpoint_mc, dt_ms, ff_mw=0, keep_q8=0):
        """One control tick: return the duty (int 0..65535). Allocation-free.

        ``dt_ms`` is the time since the previous step (1..1000 ms; more counts as
        1000; <= 0 returns the previous duty and changes nothing). ``keep_q8``
        (0..256): the share of the feed-forward term, in 256ths, that a negative
        P + I + D may not take away (0: all of it may, the plain PID; 256: the
        output stays at least at the feed-forward); while it holds, the integrator
        does not integrate downward.
        """
        a = self._a
        if dt_ms <= 0:
            return a[_DUTY]
        dt = dt_ms
        if dt > _DT_MAX:
            dt = _DT_MAX
        m = measurement_mc
        if m > _T_LIM:
            m = _T_LIM
        elif m < -_T_LIM:
            m = -_T_LIM
        sp = setpoint_mc
        if sp > _T_LIM:
            sp = _T_LIM
        elif sp < -_T_LIM:
            sp = -_T_LIM
        e = m - sp
        if e > _E_MAX:
            e = _E_MAX
        elif e < -_E_MAX:
            e = -_E_MAX

        # Derivative on the measurement, low-pass filtered in Q8 m degC/s.
        fresh = a[_FRESH]
        dm = 0 if fresh else m - a[_M_PREV]
        a[_M_PREV] = m
        if dm > _DM_MAX:
            dm = _DM_MAX
        elif dm < -_DM_MAX:
            dm = -_DM_MAX
        r = dm * 1000 // dt
        if r > _R_MAX:
            r = _R_MAX
        elif r < -_R_MAX:
            r = -_R_MAX
        r <<= _R_Q
        tau = a[_TAU]
        if tau == 0:
            rf = r
        else:
            rf = a[_RF]
            rf += mul(r - rf, (dt << 13) // (tau + dt), 13, _A_MAX)
        a[_RF] = rf

        ff = ff_mw
        if ff < 0:
            ff = 0
        elif ff > _P_MAX_MW:
            ff = _P_MAX_MW

        # Deadband: |e| <= db counts as 0, beyond it the error is reduced by db, so
        # the P and I inputs stay continuous.
        db = a[_DB]
        ai = e if e >= 0 else -e
        if ai <= db:
            ed = 0
        elif e > 0:
            ed = e - db
        else:
            ed = e + db

        up = mul(ed, a[_KP_M], a[_KP_S], a[_KP_L])
        ud = mul(rf, a[_KD_M], a[_KD_S], a[_KD_L])
        uf = mul(ff, a[_KFF_M], a[_KFF_S], a[_KFF_L])
        pdf = _sat(_sat(up + ud) + uf)
        # The previous applied output held by a limit or the slew limiter in the
        # direction this error pushes: then no integration (conditional integration).
        held = a[_HELD]
        held = (ed > 0 and held > 0) or (ed < 0 and held < 0)
        pending = a[_PENDING]
        u_prev = a[_U]
        if a[_KI_M] == 0:
            i = 0
            integrating = False
        elif ed < -a[_IBAND]:
            # far below the setpoint: no integration; the integrator leaks toward 0
            # with Tt (what a boot or manual duty left in it must not stay forever).
            # A switch from manual here starts from I = 0: the slew limiter smooths it.
            i = 0 if pending else a[_I]
            i -= mul(i, (dt << 13) // (a[_TT] + dt), 13, _A_MAX)
            integrating = True
        elif pending:
            # Bumpless: choose I so that this first automatic output is the tracked duty.
            i = u_prev - pdf
            integrating = True
        elif held:
            i = a[_I]  # no integration while the output is held
            integrating = True
        else:
            # within the band; above it at the band's rate (a large error that persists
            # must still reach full cooling, but not wind up faster than the band's)
            ei = a[_IBAND]
            if ed <= ei:
                ei = ed
            i = a[_I] + mul(ei * dt, a[_KI_M], a[_KI_S], a[_KI_L])
            integrating = True
        a[_PENDING] = 0
        if i > a[_I_HI]:
            i = a[_I_HI]
        elif i < a[_I_LO]:
            i = a[_I_LO]

        u = _sat(pdf + i)
        if keep_q8 > 0:
            # the feed-forward guard: P + I + D may cancel at most (256 - keep) / 256
            # of FF (uf < 2**29: (uf >> 8) * 256 < 2**29)
            if keep_q8 > 256:
                keep_q8 = 256
            kf = (uf >> 8) * keep_q8
            if u < kf:
                u = kf
                if i < a[_I] and not pending:
                    i = a[_I]  # held by the guard: no downward integration
        v = u
        hold = 0
        if v > a[_HI]:
            v = a[_HI]
            hold = 1
        elif v < a[_LO]:
            v = a[_LO]
            hold = -1
        w = v  # clamped; then the slew limiter
        if not fresh:
            if a[_SL_M] and v > u_prev:
                limit = mul(dt, a[_SL_M], a[_SL_S], a[_SL_L])
                if v > u_prev + limit:
                    v = u_prev + limit
                    hold = 1
            elif v < u_prev:
                # a tracked duty (boot, fail-safe, manual) comes down at the rise's
                # rate until the law's value is reached; the loop's own at the fall's
                if a[_DROP]:
                    limit = a[_SL_M]
                    if limit:
                        limit = mul(dt, limit, a[_SL_S], a[_SL_L])
                else:
                    limit = a[_SD_M]
                    if limit:
                        limit = mul(dt, limit, a[_SD_S], a[_SD_L])
                if limit and v < u_prev - limit:
                    v = u_prev - limit
                    hold = -1
        if v <= w:
            a[_DROP] = 0  # the law's value reached (or it asks for more)
        a[_HELD] = hold

        if a[_AW] and integrating and w != u:
            # Back-calculation that only unwinds: I moves toward 0 by (clamped -
            # unclamped) * dt / (Tt + dt), never past 0, so P and FF are never absorbed.
            diff = _sat(w - u)
            adj = mul(diff, (dt << 13) // (a[_TT] + dt), 13, _A_MAX)
            if i > 0 and adj < 0:
                i += adj
                if i < 0:
                    i = 0
            elif i < 0 and adj > 0:
                i += adj
                if i > 0:
                    i = 0

        a[_I] = i
        a[_UP] = up
        a[_UD] = ud
        a[_UF] = uf
        a[_U] = v
        a[_FRESH] = 0
        duty = (v + _HALF_Q) >> _Q
        a[_DUTY] = duty
        return duty


def _sat(x):
    if x > _SAT:
        return _SAT
    if x < -_SAT:
        return -_SAT
    return x


def _auto_tracking(kp, ki):
    """Tt = Ti = kp/ki in ms (the integrator then settles at the applied output)."""
    if ki == 0:
        return 0
    tt = kp * 1000 // ki
    return _TRACKING_MAX_MS if tt > _TRACKING_MAX_MS else tt
