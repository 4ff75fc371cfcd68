"""``time.ticks_*`` on MicroPython, the same arithmetic on CPython.

MicroPython's ``ticks_ms()`` wraps with period 2**30 on every port; differences must
be taken with ``ticks_diff`` and deadlines moved with ``ticks_add``. CPython's ``time``
has neither, so this module provides the same semantics for tests and the simulator.
"""

try:
    from time import ticks_add, ticks_diff, ticks_ms, sleep_ms
except ImportError:  # CPython
    import time as _time

    _PERIOD = 1 << 30
    _HALF = 1 << 29
    _MASK = _PERIOD - 1

    def ticks_ms():
        return int(_time.monotonic() * 1000) & _MASK

    def ticks_diff(a, b):
        """Signed a - b in the wrapping tick space."""
        return ((a - b + _HALF) & _MASK) - _HALF

    def ticks_add(t, delta):
        return (t + delta) & _MASK

    def sleep_ms(ms):
        _time.sleep(ms / 1000)
