"""The HAL the MicroPython boards run (see device/README.md): what stays in RAM.

``boards/_build.py`` constructs it from a board's pin table at boot (``build``), and
device.main forgets that module after: its functions and tables are needed once. What
is here is what the HAL hands out and keeps calling on every board: the UART port
and its transmit writer, the software reset. What only some boards use (a port on
the REPL's own stream, a muxed ADC) is in boards/_optional.py, imported by those:
each class is ~200 B of RAM on a board that never makes one. Everything is set up
once at boot; the callables never allocate (the control tick uses them).
"""

try:
    from time import sleep_ms, ticks_ms
except ImportError:  # CPython (tests): the same contract from time.monotonic
    import time as _time

    def ticks_ms():
        return int(_time.monotonic() * 1000) & 0x3FFFFFFF

    def sleep_ms(ms):
        _time.sleep(ms / 1000)


# --- reset causes from the real flags (issue 23 item 12) --------------------------
# machine.reset_cause() alone is wrong for a software reset on both MCU families
# (MicroPython v1.28.0):
# - stm32 (ports/stm32/modmachine.c machine_init): WDT if IWDGRSTF/WWDGRSTF, POWER_ON
#   if PORRSTF/BORRSTF, else HARD if PINRSTF, else SOFT; then it sets RMVF, which clears
#   RCC_CSR before any Python runs. NVIC_SystemReset (machine.reset()) pulls NRST low,
#   so PINRSTF is set with SFTRSTF and a software reset reads HARD_RESET, like the
#   reset button. SFTRSTF (RCC_CSR bit 28 at 0x40023874 on the F4) is gone by then, so
#   the firmware leaves its own mark: HAL.reset() writes _REBOOT_MARK to the RTC backup
#   register BKP0R (kept through a system reset, lost with VDD unless a battery holds
#   VBAT) and the next boot reads HARD + mark as "soft" and clears the mark.
#   (BKP19R is MicroPython's, MICROPY_HW_CLK_LAST_FREQ on the pyboard.)
# - rp2 (ports/rp2/modmachine.c): WDT_RESET if watchdog_caused_reboot() (WATCHDOG
#   REASON != 0), else PWRON_RESET; machine.reset() is watchdog_reboot(0, SRAM_END, 0),
#   so a software reset reads WDT_RESET. pico-sdk's watchdog_enable() (machine.WDT)
#   writes WATCHDOG_NON_REBOOT_MAGIC to scratch[4] and watchdog_reboot() writes 0 there,
#   so REASON != 0 with the magic is the watchdog, without it a software reset.
_STM32_RCC_APB1ENR = 0x40023840  # PWREN bit 28: the PWR interface clock
_STM32_PWR_CR = 0x40007000  # DBP bit 8: write access to the backup domain
_STM32_RTC_BKP0R = 0x40002850  # RTC base 0x40002800 + 0x50 (RM0383 / RM0090)
_REBOOT_MARK = 0x2EB0072D  # a small int on the MCU (< 2**30)


def _stm32_backup_write(mem, value):
    mem[_STM32_RCC_APB1ENR] = mem[_STM32_RCC_APB1ENR] | (1 << 28)
    mem[_STM32_PWR_CR] = mem[_STM32_PWR_CR] | (1 << 8)
    mem[_STM32_RTC_BKP0R] = value


def stm32_reboot(machine):
    """A software reset that the next boot reads as "soft": mark, then reset."""
    mem = getattr(machine, "mem32", None)
    if mem is not None:
        _stm32_backup_write(mem, _REBOOT_MARK)
    machine.reset()


class UartPort:
    """Protocol on a hardware UART (the seed's CH340 USB-UART at 115200 8N1).

    ``write(buf, n)`` sends ``buf[:n]`` without slicing: ``machine.UART.write`` is
    ``mp_stream_write1_obj`` (one argument, no max_len) in MicroPython's
    extmod/machine_uart.c, and slicing a memoryview allocates. So a CHUNK-byte transmit
    buffer and one memoryview of each power-of-two length up to CHUNK are made here,
    once (7 views, ~200 B; one per length 0..CHUNK took ~1.3 KB of the boot heap); a
    write copies ``buf`` through the transmit buffer in pieces of the largest power of
    two left, at most CHUNK (~1 us/byte on a Cortex-M4, against 87 us/byte on the wire
    at 115200): the same bytes in the same order, in at most log2(CHUNK) + 1 stream
    writes per CHUNK. Bytes a stream refuses (a full TX buffer past its timeout) are
    counted in ``dropped``; the peer resynchronises at the next frame delimiter.
    ``chunk`` must be a power of two. The board's other port kind (the REPL's own,
    boards/_optional.py) shares this writer.
    """

    shares_repl = False
    CHUNK = 64

    def __init__(self, uart, chunk=CHUNK):
        self._uart = uart
        self._write = uart.write
        self.tx = bytearray(chunk)
        mv = memoryview(self.tx)
        views = []
        size = 1
        while size <= chunk:
            views.append(mv[:size])
            size <<= 1
        self._views = views  # _views[k] is tx[:2**k]
        self.chunk = chunk
        self.dropped = 0

    def write(self, buf, n):
        tx = self.tx
        views = self._views
        i = 0
        while i < n:
            m = n - i
            k = len(views) - 1
            size = self.chunk
            while size > m:
                size >>= 1
                k -= 1
            j = 0
            while j < size:
                tx[j] = buf[i + j]
                j += 1
            w = self._write(views[k])
            if w is None:
                w = 0
            if w < size:
                self.dropped += size - w
            i += size

    def readinto(self, buf):
        """Non-blocking: read what is already buffered (at most ``len(buf)``)."""
        n = self._uart.any()
        if n <= 0:
            return 0
        cap = len(buf)
        got = self._uart.readinto(buf, n if n < cap else cap)
        return got if got else 0

    def release(self):
        """Nothing to give back: the REPL lives on another port."""


class Hal:
    """What ``make_hal()`` returns: the attributes listed in device/README.md.

    ``fan_model``: the name of the board's fan model in ``device.floors.FAN_MODELS``
    (None: the default model), the compiled facts the tach plausibility and the
    safety floors use.
    """

    fan_model = None

    def __init__(self, machine, name, fs_dir, adc, i2c, pwm, tach, port, wdt_max_ms):
        self._machine = machine
        self.name = name
        self.fs_dir = fs_dir
        self.adc = adc
        self.i2c = i2c
        self.pwm = pwm
        self.tach = tach
        self.IRQ_FALLING = machine.Pin.IRQ_FALLING
        self.port = port
        self.port_readinto = port.readinto
        self.port_write = port.write
        self.ticks_ms = ticks_ms
        self.sleep_ms = sleep_ms
        self.wdt_max_ms = wdt_max_ms
        self.reset = machine.reset
        # Both are constant for a run; read once so calls never allocate. The cause
        # is the port's name for it until boards._build.build() reads the real flags.
        self._uid = bytes(machine.unique_id())
        self._cause = "unknown"

    def unique_id(self):
        return self._uid

    def reset_cause(self):
        return self._cause

    def wdt_start(self, timeout_ms):
        """Start the hardware watchdog, clamped to what this MCU can do.

        Returns the ``machine.WDT`` (has ``feed()``), or None without a watchdog.
        Once started it cannot be stopped, not even by a soft reset.
        """
        if not self.wdt_max_ms:
            return None
        t = int(timeout_ms)
        if t > self.wdt_max_ms:
            t = self.wdt_max_ms
        if t < 1:
            t = 1
        return self._machine.WDT(timeout=t)

    def stm32_reset(self):
        """``reset`` on stm32 (boards._build.build): stm32_reboot of this machine."""
        stm32_reboot(self._machine)

    def repl(self):
        """Hand the port back to the REPL (restores Ctrl-C on a shared port)."""
        self.port.release()
