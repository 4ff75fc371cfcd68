"""Hysteresis for conditions: latches on thresholds, and reasons that stay a while.

:class:`Latches` turns a reading and a threshold into an on/off condition that turns
on past the threshold and off only ``hysteresis`` back; :class:`Sticky` keeps a
reason for ``clear_s`` after its condition was last seen (a loose connector does not
flap it). :func:`temperature_reason` is the one temperature rule: ``critical_temp``
or ``over_temp`` (never both) for one sensor.
"""

from __future__ import annotations

from modbridge.policy.levels import R_CRITICAL_TEMP, R_OVER_TEMP


class Latches:
    """Named hysteresis latches.

    >>> la = Latches()
    >>> [la.above("t", v, 80.0, 3.0) for v in (81.0, 78.0, 77.0)]
    [True, True, False]
    """

    def __init__(self):
        self._on: set[str] = set()

    def above(self, key: str, value, threshold, hysteresis) -> bool:
        """On above ``threshold``, off at or below ``threshold - hysteresis``."""
        if value is None or threshold is None:
            self._on.discard(key)
            return False
        on = value > threshold or (key in self._on and value > threshold - hysteresis)
        (self._on.add if on else self._on.discard)(key)
        return on

    def below(self, key: str, value, threshold, hysteresis) -> bool:
        """On below ``threshold``, off at or above ``threshold + hysteresis``."""
        if value is None:
            self._on.discard(key)
            return False
        on = value < threshold or (key in self._on and value < threshold + hysteresis)
        (self._on.add if on else self._on.discard)(key)
        return on

    def discard(self, *keys: str) -> None:
        for key in keys:
            self._on.discard(key)

    def clear(self) -> None:
        self._on.clear()


_LATCH_KEYS: dict[str, tuple[str, str]] = {}  # key -> its two latches' names


def temperature_reason(latches: Latches, key: str, t, warn_c, critical_c, hysteresis_c):
    """``critical_temp``, ``over_temp`` or None for reading ``t`` (latched per ``key``)."""
    names = _LATCH_KEYS.get(key)
    if names is None:
        names = (f"crit:{key}", f"warn:{key}")
        if len(_LATCH_KEYS) < 256:  # a few fixed sensor keys; bounded whatever callers do
            _LATCH_KEYS[key] = names
    crit = latches.above(names[0], t, critical_c, hysteresis_c)
    over = latches.above(names[1], t, warn_c, hysteresis_c)
    if crit:
        return R_CRITICAL_TEMP
    return R_OVER_TEMP if over else None


class Sticky:
    """Reasons that stay ``clear_s`` after their condition was last on.

    >>> s = Sticky(10.0)
    >>> s.holds("r", True, 0.0), s.holds("r", False, 9.0), s.holds("r", False, 11.0)
    (True, True, False)
    """

    def __init__(self, clear_s: float):
        self.clear_s = clear_s
        self._last: dict[str, float] = {}  # reason -> last time its condition held

    def holds(self, reason: str, on: bool, now: float) -> bool:
        """Is ``reason`` active: its condition ``on`` now, or on within ``clear_s``?"""
        if on:
            self._last[reason] = now
        last = self._last.get(reason)
        if last is None:
            return False
        if now - last <= self.clear_s and now >= last:
            return True
        del self._last[reason]
        return False

    def drop(self, reason: str) -> None:
        self._last.pop(reason, None)

    def clear(self) -> None:
        self._last.clear()
