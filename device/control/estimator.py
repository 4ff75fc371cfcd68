"""What the hosted loop regulates: the peak envelope of an estimate of the GPU die.

    est = DieEstimator()                       # allocated once
    env = est.update(ntc_mc, die_mc, fresh, power_mw, dt_ms)   # per tick, no allocation
    if env != INVALID: error = env - die_setpoint_mc

The NTC on the heatsink (or beside the memory MOSFETs) lags the die by seconds to
tens of seconds and reads several degC below it, by an offset that grows with the
power. The host's heartbeat carries the die temperature itself (NVML, whole degC,
about once a second) and the board power. With a fresh heartbeat temperature the
estimate is that temperature (+0.5 degC: NVML truncates); the estimator also learns
the die-NTC offset per watt from it, and when the heartbeat has power but no
temperature (or it is stale) the estimate is NTC + learned offset at the current
power. Without a host there is no estimate (``INVALID``): the caller falls back to
the NTC channels and their own setpoints.

The loop regulates the **peak envelope** of the estimate: its maximum over the last
``window_s`` seconds (a ring of per-second maxima; a rise counts at once, a fall
after the window). Under load bursts shorter than the window the die swings by tens
of degC within seconds; the envelope sits at the burst peaks and stays there, so
the fans hold still, and the peaks (what the slowdown threshold sees) are what is
regulated. NVML's whole degrees do not make it hunt either: a die at 76.9..77.1
reads 76 and 77 in turn, the envelope stays at 77.5.

``power_mw`` also goes into ``power_f``, the feed-forward input, as a peak envelope
too: it follows a rise at once (a load step moves the fans before the heat arrives),
holds for ``window_s`` while the power is lower, then falls with the time constant
``power_tau_ms``; load bursts shorter than the window hold the feed-forward at their
peak instead of moving the fans with every burst.

``ntc_mc`` goes into ``ntc_env`` the same way (a rise at once, held for ``window_s``,
then a fall with ``NTC_TAU_MS``; INVALID while the NTC is): the hosted loop counts
the GPU channel's NTC against its setpoint through it, so a fast NTC that swings with
every burst (one on the die's side of the heatsink) holds still at its peaks too,
and the channel never counts lower than its reading.

Integer only: temperatures are clamped to +-2**20 m degC, power to 0..2**21 mW, dt to
1..1000 ms; the offset model is kept in Q8 m degC per W (clamped); products
are bounded by the clamps (a filter step is diff * dt // (tau + dt) with |diff| <
2**20 and dt <= 1000, so no intermediate reaches 2**30; tests/test_estimator.py checks
every result with tests/intcheck.py and runs the tick under ``heap_lock``).
"""

try:
    from micropython import const
except ImportError:
    const = lambda x: x  # noqa: E731

from array import array

from device.control import clamp as _clamp

# as NTC.INVALID: -2**30 itself ends up a big int on 32-bit ports
INVALID = const(-0x3FFFFFFF)
_D_MAX = const(1048575)  # mW: |power step| taken per tick (so diff * dt < 2**30)
_T_LIM = const(1048575)
_P_MAX = const(2097151)
_DT_MAX = const(1000)
_R_MAX = const(32767)  # Q8 m degC/W: up to 128 degC per W, far above any heatsink
NTC_TAU_MS = const(30000)  # the NTC envelope's fall after its hold
WINDOW_MAX_S = 300  # the longest envelope window (the ring then takes 1.2 KB)
_W_MIN = const(20)  # W: below this the offset per watt is not learned (idle noise)


# The estimator's settings and state: one array('i') (``DieEstimator._a``), the ring of
# per-second maxima at its end; the first six are what ``__getattr__`` answers by name.
_WIN = const(0)  # window_s
_PTAU = const(1)  # power_tau_ms
_OTAU = const(2)  # offset_tau_ms
_EST = const(3)  # the estimate
_ENV = const(4)  # its envelope
_RQ8 = const(5)  # learned (die - NTC) per W, Q8 m degC/W; 0 = not learned
_P_LOW = const(6)  # how long the power has been below power_f
_N_LOW = const(7)  # how long the NTC has been below ntc_env
_POS = const(8)  # ring slot of the current second
_MS = const(9)  # ms into the current second
_SEC = const(10)  # seconds counted, mod _RISE_S
_ENV_AGO = const(11)  # the envelope at the end of each of the last _RISE_S seconds
_RING = const(21)  # the ring: window_s entries (1 without a window)
_RISE_S = const(10)  # rise_mc()'s span


class DieEstimator:
    """Die temperature estimate (m degC) and its peak envelope; see the module docstring.

    ``power_f`` and ``ntc_env`` (what the tick reads) are attributes; ``est``, ``env``,
    ``r_q8``, ``window_s``, ``power_tau_ms``, ``offset_tau_ms`` read back by name from
    the one ``array('i')`` that holds the rest and the ring.
    """

    def __init__(self, window_s=90, power_tau_ms=300000, offset_tau_ms=60000):
        self._a = None  # sized to the window by configure()
        self.power_f = 0
        self.ntc_env = INVALID
        self.configure(window_s, power_tau_ms, offset_tau_ms)

    def __getattr__(self, name):
        """The settings, the estimate and the learned offset by name (read-only)."""
        names = ("window_s", "power_tau_ms", "offset_tau_ms", "est", "env", "r_q8")
        for i in range(len(names)):
            if names[i] == name:
                return self._a[i]
        raise AttributeError(name)

    def configure(self, window_s, power_tau_ms, offset_tau_ms):
        for name, v, hi in (
            ("window_s", window_s, WINDOW_MAX_S),
            ("power_tau_ms", power_tau_ms, 600000),
            ("offset_tau_ms", offset_tau_ms, 600000),
        ):
            if type(v) is not int or v < 0 or v > hi:
                raise ValueError("%s must be an int in 0..%d, got %r" % (name, hi, v))
        a = self._a
        size = _RING + (window_s if window_s else 1)
        if a is None or len(a) != size:
            rq = 0 if a is None else a[_RQ8]  # the learned offset stays
            self._a = a = None  # the old one is garbage before the new one is made
            a = array("i", bytes(4 * size))  # sized to need: 4 bytes a second
            a[_RQ8] = rq
            self._a = a
        a[_WIN] = window_s
        a[_PTAU] = power_tau_ms
        a[_OTAU] = offset_tau_ms
        self.reset()

    def reset(self):
        """Forget the estimate and the envelope (keeps the learned offset)."""
        a = self._a
        a[_EST] = INVALID
        a[_ENV] = INVALID
        self.power_f = 0
        a[_P_LOW] = 0
        self.ntc_env = INVALID
        a[_N_LOW] = 0
        self._forget()

    def _forget(self):
        a = self._a
        n = len(a)
        i = _RING
        while i < n:
            a[i] = INVALID
            i += 1
        a[_POS] = 0
        a[_MS] = 0
        i = _ENV_AGO
        while i < _RING:
            a[i] = INVALID
            i += 1

    def rise_mc(self):
        """How much the envelope rose over the last 10 s (``RISE_S``; m degC, >= 0
        with a window: the envelope of a load that bursts holds its peaks); 0
        without an envelope now or then. No allocation."""
        a = self._a
        k = a[_SEC] + 1
        then = a[_ENV_AGO + (k if k < _RISE_S else 0)]  # the oldest: _RISE_S s ago
        now = a[_ENV]
        if now == INVALID or then == INVALID:
            return 0
        return now - then

    def update(self, ntc_mc, die_mc, fresh, power_mw, dt_ms):
        """One tick: return the envelope (m degC), or INVALID without an estimate.

        ``die_mc`` is the heartbeat's die temperature, used when ``fresh``; ``ntc_mc``
        the GPU channel's NTC (INVALID when that sensor is bad); ``power_mw`` the
        heartbeat's board power (0 when absent: no offset model either).
        """
        a = self._a
        dt = _clamp(dt_ms, 1, _DT_MAX)
        p = _clamp(power_mw, 0, _P_MAX)
        pf = self.power_f
        tau = a[_PTAU]
        if tau == 0 or p >= pf:
            pf = p  # a rise at once: the feed-forward acts on a load step
            a[_P_LOW] = 0
        elif a[_P_LOW] < a[_WIN] * 1000:
            a[_P_LOW] += dt  # held for the envelope's window (bursts), then a fall
        else:
            pf += _clamp(p - pf, -_D_MAX, _D_MAX) * dt // (tau + dt)
        self.power_f = pf
        ntc_ok = ntc_mc != INVALID
        ne = self.ntc_env
        if not ntc_ok:
            ne = INVALID
        else:
            n = _clamp(ntc_mc, -_T_LIM, _T_LIM)
            if ne == INVALID or n >= ne:
                ne = n  # a rise at once
                a[_N_LOW] = 0
            elif a[_N_LOW] < a[_WIN] * 1000:
                a[_N_LOW] += dt  # held for the window, then a fall
            else:
                ne += _clamp(n - ne, -_D_MAX, _D_MAX) * dt // (NTC_TAU_MS + dt)
        self.ntc_env = ne
        w = p // 1000
        if fresh:
            est = _clamp(die_mc, -_T_LIM, _T_LIM) + 500  # NVML truncates to whole degC
            otau = a[_OTAU]
            if ntc_ok and w >= _W_MIN and otau:
                # learn (die - NTC) / W, low-passed with offset_tau_ms
                off = _clamp(est - _clamp(ntc_mc, -_T_LIM, _T_LIM), -_T_LIM, _T_LIM)
                r = _clamp((off << 8) // w, -_R_MAX, _R_MAX)
                rq = a[_RQ8]
                rq += (r - rq) * dt // (otau + dt)
                a[_RQ8] = rq
        elif ntc_ok and a[_RQ8] != 0 and w > 0:
            est = _clamp(ntc_mc, -_T_LIM, _T_LIM) + ((a[_RQ8] * w) >> 8)
        else:
            if a[_EST] != INVALID:
                self._forget()
            a[_EST] = INVALID
            a[_ENV] = INVALID
            return INVALID
        a[_EST] = est
        n = a[_WIN]
        if n == 0:
            a[_ENV] = est
            return est
        pos = a[_POS]
        ms = a[_MS] + dt
        if ms >= 1000:  # a new second: a new slot, then the maximum over the window
            ms -= 1000
            pos += 1
            if pos >= n:
                pos = 0
            a[_RING + pos] = est
            env = est
            i = _RING
            end = _RING + n
            while i < end:
                v = a[i]
                if v > env:
                    env = v
                i += 1
            k = a[_SEC] + 1
            if k >= _RISE_S:
                k = 0
            a[_SEC] = k
            a[_ENV_AGO + k] = a[_ENV]  # the envelope as the last second ended
        else:
            if est > a[_RING + pos]:
                a[_RING + pos] = est
            env = a[_ENV]
            if env == INVALID or est > env:
                env = est
        a[_POS] = pos
        a[_MS] = ms
        a[_ENV] = env
        return env
