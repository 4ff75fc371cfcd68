"""HAL parts only some boards use, imported by those boards alone (boards/_build.py
for a ``"stdio"`` port, boards/pico.py for its muxed ADC): on a board that never makes
one, a class is RAM for nothing (~200 B each: the type, its dict, its functions).
"""

from boards._common import UartPort


class StdioPort(UartPort):
    """Protocol on the REPL port itself (USB VCP, or a NUCLEO's ST-LINK UART).

    Ctrl-C is disabled (``micropython.kbd_intr(-1)``) while the protocol owns the
    port, so a 0x03 byte in a frame cannot raise KeyboardInterrupt; :meth:`release`
    restores it so ``mpremote`` can interrupt and reflash. Writes go through
    UartPort's writer on ``stdout``.
    """

    shares_repl = True

    def __init__(self, stdin, stdout, poller, kbd_intr):
        UartPort.__init__(self, stdout)
        self._stdin = stdin
        self._poll = poller
        self._kbd_intr = kbd_intr
        self._one = bytearray(1)
        kbd_intr(-1)

    def readinto(self, buf):
        """Non-blocking: one byte per ``ipoll(0)`` readiness, at most ``len(buf)``."""
        n = 0
        cap = len(buf)
        one = self._one
        while n < cap:
            ready = False
            for _ in self._poll.ipoll(0):
                ready = True
            if not ready:
                break
            if not self._stdin.readinto(one):
                break
            buf[n] = one[0]
            n += 1
        return n

    def release(self):
        self._kbd_intr(3)


class MuxedADC:
    """One ADC input shared by two dividers through an SPDT analog switch.

    ``read_u16`` drives the select pin, then converts. The 100 nF capacitor of each
    divider sits *before* the switch, so the selected node is already settled: the
    ADC's sample capacitor (~pF) barely disturbs 100 nF and no wait is needed.
    """

    def __init__(self, adc, select_pin, level):
        self._adc = adc
        self._sel = select_pin
        self._level = level

    def read_u16(self):
        self._sel.value(self._level)
        return self._adc.read_u16()
