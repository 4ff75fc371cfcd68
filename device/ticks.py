"""Wrapping millisecond ticks, the same arithmetic on every interpreter.

The firmware compares times only with :func:`ticks_diff` and moves deadlines only with
:func:`ticks_add`, over a period of 2**30 ms (12.4 days): the period of
``time.ticks_ms()`` on every 32-bit MicroPython port. The unix port's own ticks wrap at
2**62 and CPython has no ticks at all, so this module does the arithmetic itself and
a HAL's ``ticks_ms()`` must return values in ``0 .. 2**30 - 1`` (``time.ticks_ms()`` on
an MCU port does; the sim board and the test clock wrap the same way). Every value
stays a small int: nothing here allocates.
"""

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


PERIOD = const(1 << 30)
_MASK = const((1 << 30) - 1)
_HALF = const(1 << 29)


def ticks_diff(a, b):
    """Signed ``a - b`` in the wrapping tick space (valid for |a - b| < 2**29)."""
    return ((a - b + _HALF) & _MASK) - _HALF


def ticks_add(t, delta):
    """``t + delta`` wrapped into the tick space."""
    return (t + delta) & _MASK
