"""Control laws: pure integer math, no I/O.

The two sensor filters keep their state in an ``array('i')`` at an offset ``at``, so
an owner holds them in its own array instead of one filter object each: the NTC
channels (device.drivers.ntc) keep theirs in the channel's state array, and
device.control.filters' ``Median`` and ``EMA`` wrap them for everyone else. Neither
allocates; every intermediate stays within +-2**30 for values within +-2**29 (the
median) or any int (the EMA clamps its input to +-(2**20 - 1)).

- median of the last ``n``: ``s[at]`` = n (1..31), ``s[at+1]`` the next ring slot,
  ``s[at+2]`` how many have arrived (at most n), ``s[at+3 .. at+3+n]`` the ring,
  ``s[at+3+n .. at+3+2n]`` scratch for the sort: ``3 + 2 * n`` entries;
- EMA: ``s[at]`` = alpha (1..256, in 1/256), ``s[at+1]`` the value in Q8, ``s[at+2]``
  1 once primed: 3 entries.

``filter_reset(s, at)`` forgets either (zeroes ``s[at+1]`` and ``s[at+2]``).
"""

try:
    from micropython import const
except ImportError:  # CPython
    const = lambda x: x  # noqa: E731

_LIM = const(1048575)  # EMA input clamp: 2**20 - 1 (filters.VALUE_LIMIT)


def clamp(x, lo, hi):
    """``x`` within ``lo``..``hi``."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def filter_reset(s, at):
    """Forget the values of the median or EMA at ``s[at]`` (its size/alpha stays)."""
    s[at + 1] = 0
    s[at + 2] = 0


def median_update(s, at, v):
    """Add ``v``; return the median of the window (of those seen, until it is full;
    with an even count the mean, rounded down, of the two middle values)."""
    n = s[at]
    r = at + 3  # the ring
    nxt = s[at + 1]
    s[r + nxt] = v
    nxt += 1
    if nxt == n:
        nxt = 0
    s[at + 1] = nxt
    count = s[at + 2]
    if count < n:
        count += 1
        s[at + 2] = count
    # Insertion sort of the live part of the ring into the scratch (ring slot p goes
    # to scratch slot p + n, then down to its place).
    w = r + n
    p = r
    end = r + count
    while p < end:
        x = s[p]
        k = p + n
        while k > w and s[k - 1] > x:
            s[k] = s[k - 1]
            k -= 1
        s[k] = x
        p += 1
    half = w + (count >> 1)
    if count & 1:
        return s[half]
    return (s[half - 1] + s[half]) >> 1


def ema_update(s, at, x):
    """Add a sample; return the filtered value: y += alpha/256 * (x - y) in Q8.

    The increment rounds toward zero but moves at least one Q8 step, so a constant
    input is reached exactly; the first sample after a reset starts the filter. The
    input is clamped to +-(2**20 - 1): (x - y) < 2**29 in Q8, and its product with
    alpha is split (high byte * alpha <= 2**29) so nothing reaches 2**30."""
    if x > _LIM:
        x = _LIM
    elif x < -_LIM:
        x = -_LIM
    xq = x << 8
    if not s[at + 2]:
        s[at + 2] = 1
        y = xq
    else:
        y = s[at + 1]
        d = xq - y
        a = s[at]
        if d > 0:
            inc = (d >> 8) * a + (((d & 255) * a) >> 8)
            y += inc if inc else 1
        elif d < 0:
            d = -d
            inc = (d >> 8) * a + (((d & 255) * a) >> 8)
            y -= inc if inc else 1
    s[at + 1] = y
    return (y + 128) >> 8
