"""Integer filters for sensor readings: median-of-N, exponential moving average, slew.

All three allocate their buffers in ``__init__``; ``update``/``step`` and ``reset``
allocate nothing and keep every intermediate within +-2**30 for inputs within the
documented ranges (sensor values in m degC, mV, mA, mW: all well inside +-2**20).

    med = Median(5)
    ema = EMA(64)                       # alpha = 64/256 = 0.25 per sample
    t_mc = ema.update(med.update(raw_mc))
"""

from array import array

from device.control import ema_update, filter_reset, median_update

MEDIAN_MAX = 31
VALUE_LIMIT = 1048575  # EMA/slew inputs are clamped to +-(2**20 - 1)


def _check_int(name, value, lo, hi):
    if type(value) is not int or value < lo or value > hi:
        raise ValueError("%s must be an int in %d..%d, got %r" % (name, lo, hi, value))


def _clamp(v):
    if v > VALUE_LIMIT:
        return VALUE_LIMIT
    if v < -VALUE_LIMIT:
        return -VALUE_LIMIT
    return v


class Median:
    """Median of the last ``n`` values (1..31): rejects single-sample spikes.

    Until ``n`` values have arrived, the median of those seen so far. With an even
    count the mean (rounded down) of the two middle values. Values are stored in
    ``array('i')``: keep them within +-2**29. (``device.control.median_update`` over
    this object's state array; an NTC channel keeps the same state in its own.)
    """

    def __init__(self, n=5):
        _check_int("n", n, 1, MEDIAN_MAX)
        self.n = n
        self._s = array("i", bytes(4 * (3 + 2 * n)))
        self._s[0] = n
        self.value = 0

    def reset(self):
        """Forget all values."""
        filter_reset(self._s, 0)
        self.value = 0

    def update(self, v):
        """Add ``v``; return the median of the window."""
        med = median_update(self._s, 0, v)
        self.value = med
        return med


class EMA:
    """Integer exponential moving average: y += alpha/256 * (x - y), no drift.

    ``alpha_256`` is 1..256 (256 = no smoothing). The state is kept in Q8, the
    increment rounds toward zero but moves at least one Q8 step, so a constant
    input is reached exactly (no offset, no limit cycle). The first ``update`` after
    construction or ``reset()`` starts at the input. Inputs are clamped to
    +-(2**20 - 1): (x - y) < 2**29 in Q8, and its product with alpha is split
    (high byte * alpha <= 2**29) so nothing reaches 2**30
    (``device.control.ema_update`` over this object's state array).
    """

    def __init__(self, alpha_256):
        _check_int("alpha_256", alpha_256, 1, 256)
        self.alpha = alpha_256
        self._s = array("i", [alpha_256, 0, 0])  # alpha, y (Q8), primed
        self.value = 0

    def reset(self, value=None):
        """Forget history; with ``value`` start from it instead of the next input."""
        if value is None:
            filter_reset(self._s, 0)
            self.value = 0
        else:
            value = _clamp(value)
            self._s[1] = value << 8
            self._s[2] = 1
            self.value = value

    def update(self, x):
        """Add a sample; return the filtered value (int, same unit as ``x``)."""
        out = ema_update(self._s, 0, x)
        self.value = out
        return out


class Slew:
    """Move toward a target by at most ``per_s`` units per second (1..2**20).

    Fractions of a unit are carried between steps, so slow rates still move. dt is
    clamped to 0..1000 ms per step.
    """

    def __init__(self, per_s, value=0):
        _check_int("per_s", per_s, 1, VALUE_LIMIT)
        self.per_s = per_s
        self._whole = per_s // 1000  # per ms
        self._frac = per_s % 1000  # thousandths per ms
        self._carry = 0
        self.value = _clamp(value)

    def reset(self, value):
        """Jump to ``value`` immediately."""
        self._carry = 0
        self.value = _clamp(value)

    def step(self, target, dt_ms):
        """Advance ``dt_ms`` toward ``target``; return the new value."""
        target = _clamp(target)
        if dt_ms <= 0:
            return self.value
        if dt_ms > 1000:
            dt_ms = 1000
        c = self._carry + self._frac * dt_ms
        limit = self._whole * dt_ms + c // 1000
        self._carry = c % 1000
        v = self.value
        if target > v + limit:
            v += limit
        elif target < v - limit:
            v -= limit
        else:
            v = target
            self._carry = 0
        self.value = v
        return v
