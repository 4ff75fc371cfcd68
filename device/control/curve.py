"""Piecewise-linear fan curve (temperature m degC -> duty_u16) with hysteresis.

    curve = FanCurve([[40000, 13107], [60000, 32768], [80000, 65535]], hysteresis_mc=3000)
    duty = curve.duty(temp_mc)

2..16 points, temperatures strictly ascending within +-500000 m degC, duties
0..65535 and never decreasing (a cooling curve that spins fans down as it gets
hotter is a configuration mistake, so it is refused). Below the first point the
first duty, above the last the last duty.

Hysteresis is a backlash (play) on the temperature, the usual fan-control behaviour:
a rising temperature follows the curve at once; when it falls, the duty stays until
the temperature is ``hysteresis_mc`` below the point that produced it, and then
follows the curve shifted by the hysteresis (duty = curve(temp + hysteresis)). So a
reading dithering by less than the hysteresis never moves the fans, and nothing
jumps: the output is continuous in the temperature.

Integer interpolation: each segment's slope is precomputed as
k = round(dd * 2**s / span) with s = 29 - bitlength(dd) (so dd * 2**s < 2**29); then
duty = min(d1, d0 + round(k * x / 2**s)) with x = temp - t0 < span <= 10**6 < 2**20,
and k * x <= dd * 2**s + span/2 < 2**29 + 2**19. Exact at every point, monotonic;
between points the error is at most 1/2 + span / 2**(s+1) duty: 1 for a 10 degC
segment, 7 for a 100 degC one spanning 0..65535 (0.01 %). ``duty()`` and
``interpolate()`` allocate nothing.
"""

from array import array

try:
    from micropython import const
except ImportError:
    const = lambda x: x  # noqa: E731

MAX_POINTS = 16
TEMP_LIMIT_MC = 500000
HYSTERESIS_MAX_MC = 20000  # the wire's limit (protocol/catalog.py, fan_curve)
DUTY_MAX = 65535
_IN_LIMIT = const(1048575)  # duty()/interpolate() clamp their input to +-(2**20 - 1)
_T = const(0)  # a point's entries in FanCurve._p (4 a point)
_D = const(1)
_K = const(2)
_S = const(3)


def _bit_length(v):
    n = 0
    while v:
        v >>= 1
        n += 1
    return n


class FanCurve:
    """Fan curve with hysteresis; see the module docstring."""

    def __init__(self, points, hysteresis_mc=0):
        # One array, 4 entries a point: temperature, duty, and the slope k and shift s
        # of the segment it starts (_T, _D, _K, _S); sized to the points by configure()
        # (grown for a longer curve, never shrunk).
        self._p = array("i")
        self._n = 0
        self.hysteresis_mc = 0
        self._ref = 0
        self._primed = False
        self.configure(points, hysteresis_mc)

    def configure(self, points, hysteresis_mc=0):
        """Replace the curve. Everything is validated first: on error nothing changes.

        ``points`` is a sequence of ``[temp_mc, duty_u16]`` pairs (lists or tuples),
        as the fan_curve message carries them.
        """
        if not isinstance(points, (list, tuple)):
            raise ValueError("fan curve points must be a list of [temp_mc, duty] pairs")
        n = len(points)
        if n < 2 or n > MAX_POINTS:
            raise ValueError("fan curve needs 2..%d points, got %d" % (MAX_POINTS, n))
        if type(hysteresis_mc) is not int or not 0 <= hysteresis_mc <= HYSTERESIS_MAX_MC:
            raise ValueError(
                "hysteresis_mc must be an int in 0..%d m degC, got %r"
                % (HYSTERESIS_MAX_MC, hysteresis_mc)
            )
        prev_t = prev_d = None
        for i in range(n):
            p = points[i]
            if not isinstance(p, (list, tuple)) or len(p) != 2:
                raise ValueError("point %d: expected [temp_mc, duty], got %r" % (i, p))
            t, d = p
            if type(t) is not int or not -TEMP_LIMIT_MC <= t <= TEMP_LIMIT_MC:
                raise ValueError(
                    "point %d: temperature must be an int in %d..%d m degC, got %r"
                    % (i, -TEMP_LIMIT_MC, TEMP_LIMIT_MC, t)
                )
            if type(d) is not int or not 0 <= d <= DUTY_MAX:
                raise ValueError(
                    "point %d: duty must be an int in 0..%d, got %r" % (i, DUTY_MAX, d)
                )
            if prev_t is not None and t <= prev_t:
                raise ValueError(
                    "point %d: temperatures must rise strictly (%d after %d m degC)"
                    % (i, t, prev_t)
                )
            if prev_d is not None and d < prev_d:
                raise ValueError(
                    "point %d: duty falls from %d to %d; a cooling curve must not decrease"
                    % (i, prev_d, d)
                )
            prev_t, prev_d = t, d
        if len(self._p) < 4 * n:
            self._p = array("i", bytes(16 * n))
        p = self._p
        for i in range(n):
            p[4 * i + _T] = points[i][0]
            p[4 * i + _D] = points[i][1]
        for i in range(n - 1):
            j = 4 * i
            dd = p[j + 4 + _D] - p[j + _D]
            span = p[j + 4 + _T] - p[j + _T]
            s = 29 - _bit_length(dd)
            p[j + _S] = s
            p[j + _K] = ((dd << (s + 1)) + span) // (2 * span)
        self._n = n
        self.hysteresis_mc = hysteresis_mc
        self.reset()

    def points(self):
        """The curve as a list of [temp_mc, duty] pairs (allocates; not for the tick)."""
        p = self._p
        return [[p[4 * i + _T], p[4 * i + _D]] for i in range(self._n)]

    def reset(self):
        """Forget the hysteresis state: the next ``duty()`` follows the curve exactly."""
        self._primed = False
        self._ref = 0

    def interpolate(self, temp_mc):
        """The curve's duty at ``temp_mc``, without hysteresis."""
        t = temp_mc
        p = self._p
        last = 4 * (self._n - 1)
        if t <= p[_T]:
            return p[_D]
        if t >= p[last + _T]:
            return p[last + _D]
        j = 4
        while t >= p[j + _T]:
            j += 4
        j -= 4
        s = p[j + _S]
        d = p[j + _D] + ((p[j + _K] * (t - p[j + _T]) + (1 << (s - 1))) >> s)
        # The rounded slope may overshoot by a few counts near the segment's end.
        end = p[j + 4 + _D]
        return d if d < end else end

    def duty(self, temp_mc):
        """Duty for ``temp_mc`` with hysteresis (see the module docstring)."""
        t = temp_mc
        if t > _IN_LIMIT:
            t = _IN_LIMIT
        elif t < -_IN_LIMIT:
            t = -_IN_LIMIT
        if not self._primed:
            self._primed = True
            self._ref = t
        elif t > self._ref:
            self._ref = t
        elif t < self._ref - self.hysteresis_mc:
            self._ref = t + self.hysteresis_mc
        return self.interpolate(self._ref)

    @property
    def effective_mc(self):
        """The temperature the curve is currently evaluated at (after hysteresis)."""
        return self._ref
