"""Early warning: the GPU temperature's recent slope -> the time to the warn threshold.

Off by default (``early_warning``); WARN with reason ``early_warning`` when the warn
threshold is nearer than ``early_warning_horizon_s`` at the least-squares slope of the
last ``early_warning_window_s``; it clears once the ETA is back above the horizon x
:data:`EARLY_WARNING_CLEAR_FACTOR` (or gone).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import repeat
from operator import mul, sub

# An early warning clears once the ETA is back above horizon * this (or gone).
EARLY_WARNING_CLEAR_FACTOR = 1.25


def lsq_slope(points: Iterable[tuple[float, float]]) -> float | None:
    """Least-squares slope dy/dt of ``(t, y)`` points; None for < 2 points or one instant.

    >>> lsq_slope([(0, 50.0), (10, 51.0), (20, 52.0)])
    0.1
    """
    pts = list(points)
    return _slope([p[0] for p in pts], [p[1] for p in pts])


def _slope(ts, ys) -> float | None:
    """:func:`lsq_slope` of the points ``zip(ts, ys)`` (two sequences of one length):
    the textbook sums (``sum`` of the terms in the points' order, as generators over
    the points would give them; a test holds the two equal bit for bit), over lists
    and C iterators (no Python-level loop). The pairs' early warning keeps exact
    running sums instead (:class:`EarlyWarning`)."""
    n = len(ts)
    if n < 2:
        return None
    mt = sum(ts) / n
    my = sum(ys) / n
    dts = list(map(sub, ts, repeat(mt)))  # t - mt
    stt = sum(map(pow, dts, repeat(2)))  # (t - mt) ** 2
    if stt <= 0.0:
        return None
    return sum(map(mul, dts, map(sub, ys, repeat(my)))) / stt  # (t - mt) * (y - my)


def time_to_threshold(
    current_c: float | None, threshold_c: float, slope_c_per_s: float | None
) -> float | None:
    """Seconds until ``threshold_c`` at the current slope: 0 if already there, None if
    not heading there (slope <= 0 or unknown).

    >>> time_to_threshold(81.0, 87.0, 0.02)
    300.0
    >>> time_to_threshold(81.0, 87.0, -0.01) is None
    True
    """
    if current_c is None:
        return None
    if current_c >= threshold_c:
        return 0.0
    if slope_c_per_s is None or slope_c_per_s <= 0.0:
        return None
    return (threshold_c - current_c) / slope_c_per_s


#: the history's exact units: times in ns, temperatures in micro-degC (integers)
NS_PER_S = 1_000_000_000
MICRO = 1_000_000


class EarlyWarning:
    """The temperature history of one pair and whether its early warning is on.

    The least-squares slope is kept exact and cheap: each reading is stored as
    integers (its time in ns, its temperature in micro-degC, both rounded), and the
    sums the slope needs (n, sum t, sum t^2, sum y, sum t*y) are kept as Python ints,
    added to as a reading enters the window and subtracted from as it leaves. The
    slope ``(n*Sty - St*Sy) / (n*Stt - St^2)`` is then one correctly rounded
    division: the exact least-squares slope of the rounded readings (the centred
    textbook form gives the same number in exact arithmetic; tests/test_policy_exact.py
    holds it to a Fraction reference). A tick costs the same whatever the window's
    length, and touches a few objects instead of the whole history.
    """

    def __init__(self, window_s: float, horizon_s: float):
        self.window_s = window_s
        self.horizon_s = horizon_s
        self.active = False
        self._pts: deque[tuple[float, int, int]] = deque()  # (t s, t ns, y micro-degC)
        self._clear()

    def _clear(self) -> None:
        self._pts.clear()
        self._st = self._stt = self._sy = self._sty = 0

    def observe(self, now: float, gpu_c: float) -> None:
        """One GPU temperature reading at ``now`` (time going back starts over)."""
        pts = self._pts
        if pts and now < pts[-1][0]:
            self._clear()
        t = round(now * NS_PER_S)
        y = round(gpu_c * MICRO)
        pts.append((now, t, y))
        self._st += t
        self._stt += t * t
        self._sy += y
        self._sty += t * y
        start = now - self.window_s
        while pts[0][0] < start:
            _, t, y = pts.popleft()
            self._st -= t
            self._stt -= t * t
            self._sy -= y
            self._sty -= t * y

    def slope(self) -> float | None:
        """The exact least-squares slope (degC/s) of the window, correctly rounded;
        None for < 2 readings or one instant."""
        n = len(self._pts)
        if n < 2:
            return None
        st = self._st
        den = n * self._stt - st * st  # n^2 * variance of t: >= 0, 0 for one instant
        if den <= 0:
            return None
        return (n * self._sty - st * self._sy) * (NS_PER_S // MICRO) / den

    def estimate_eta(self, current_c: float | None, threshold_c: float):
        """(eta_s, slope_c_per_s) from the history of the last window; (None, None)
        until half a window (and 3 points)."""
        pts = self._pts
        if len(pts) < 3 or pts[-1][0] - pts[0][0] < self.window_s / 2:
            return None, None
        slope = self.slope()
        return time_to_threshold(current_c, threshold_c, slope), slope

    def warns(self, eta_s: float | None) -> bool:
        """Is the early warning on for this ETA (with the clearing hysteresis)?"""
        clear_at = self.horizon_s * EARLY_WARNING_CLEAR_FACTOR
        self.active = eta_s is not None and (
            eta_s < self.horizon_s or (self.active and eta_s <= clear_at)
        )
        return self.active
