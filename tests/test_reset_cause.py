"""Issue 23 item 12: the reset cause of each board from its port's real flags.

MicroPython v1.28.0's stm32 port reports HARD_RESET for a software reset (PINRSTF is
set with SFTRSTF, and the port clears RCC_CSR at boot), its rp2 port WDT_RESET (its
machine.reset() is a watchdog reboot). boards/_common.py says how each board tells
them apart; this fake ``machine`` models what the chip and the port do on each kind
of reset, and each board's HAL must name it: a software reboot "soft" (no pairing
window, docs/pairing.md), power-on "power" and the reset button "hard" (the pairing
window), the watchdog "watchdog". On 4092283 a reboot read "hard" on every STM32
board and "watchdog" on the Pico. DUAL: runs on CPython and under MicroPython.
"""

from boards import _build, load

DUAL = True

STM32 = ("pyboard_v11", "blackpill_f411", "nucleo_f411re")
CSR_PINRSTF = 1 << 26
CSR_PORRSTF = 1 << 27
CSR_SFTRSTF = 1 << 28
CSR_IWDGRSTF = 1 << 29
RP2_SCRATCH4 = 0x4005801C
RP2_REASON = 0x40058008


class _Mem:
    """machine.mem32 over a dict: unset words read 0."""

    def __init__(self):
        self.words = {}

    def __getitem__(self, addr):
        return self.words.get(addr, 0)

    def __setitem__(self, addr, value):
        self.words[addr] = value & 0xFFFFFFFF


class _Dev:
    """Any peripheral: takes any arguments, reads mid-scale, writes everything."""

    IN = 0
    OUT = 1
    PULL_UP = 1
    IRQ_FALLING = 2
    cpu = None

    def __init__(self, *args, **kw):
        self.id = args[0] if args else 0

    def read_u16(self):
        return 30000

    def value(self, v=None):
        return 0

    def any(self):
        return 0

    def readinto(self, buf, n=None):
        return 0

    def write(self, buf):
        return len(buf)


class _Cpu:
    def __getattr__(self, name):
        return "cpu:" + name


_Dev.cpu = _Cpu()


class Chip:
    """The MCU with MicroPython on it: RAM is lost at a reset, ``mem`` (the backup
    domain, the watchdog's scratch registers) is not."""

    def __init__(self, family):
        self.family = family
        self.mem = _Mem()
        self.wdt_started = False
        self.boot("power")

    def boot(self, how):
        """Reset the chip by ``how`` and run the port's start-up code."""
        m = Machine  # the constants; the instance is made once the memory is settled
        if self.family == "stm32":
            csr = {"power": CSR_PORRSTF | CSR_PINRSTF, "pin": CSR_PINRSTF,
                   "software": CSR_SFTRSTF | CSR_PINRSTF,
                   "watchdog": CSR_IWDGRSTF | CSR_PINRSTF}[how]  # fmt: skip
            if csr & CSR_IWDGRSTF:  # ports/stm32/modmachine.c machine_init
                cause = m.WDT_RESET
            elif csr & CSR_PORRSTF:
                cause = m.PWRON_RESET
            elif csr & CSR_PINRSTF:
                cause = m.HARD_RESET
            else:
                cause = m.SOFT_RESET
            # then RMVF: RCC_CSR reads 0 from here on
            if how == "power":
                self.mem = _Mem()  # no battery on VBAT: the backup domain is reset
        else:
            if how in ("power", "pin"):  # power-on, brown-out, RUN pin: a chip reset
                self.mem = _Mem()
            elif how == "software":  # watchdog_reboot(0, SRAM_END, 0)
                self.mem[RP2_REASON] = 1
                self.mem[RP2_SCRATCH4] = 0
            else:  # the timer of a watchdog_enable()d watchdog ran out
                self.mem[RP2_REASON] = 1
            cause = m.WDT_RESET if self.mem[RP2_REASON] else m.PWRON_RESET
        self.machine = Machine(self)
        self.machine.cause = cause
        return self.machine


class Machine:
    Pin = _Dev
    ADC = _Dev
    PWM = _Dev
    I2C = _Dev
    UART = _Dev
    PWRON_RESET = 1
    HARD_RESET = 2
    WDT_RESET = 3
    SOFT_RESET = 0

    def __init__(self, chip):
        self.chip = chip
        self.mem32 = chip.mem
        self.cause = 0
        self.resets = 0
        if chip.family == "rp2":
            self.HARD_RESET = None  # rp2 has PWRON_RESET and WDT_RESET only
            self.SOFT_RESET = None

    def WDT(self, timeout=0):  # noqa: N802 - machine.WDT
        if self.chip.family == "rp2":
            self.chip.mem[RP2_SCRATCH4] = 0x6AB73121  # pico-sdk watchdog_enable()
        return _Dev()

    def reset_cause(self):
        return self.cause

    def unique_id(self):
        return b"\x01\x02"

    def reset(self):
        self.resets += 1


def _cause(board, chip, how):
    m = chip.boot(how)
    return load(board).make_hal(m).reset_cause()


def _reboot(board, chip):
    """The app's reboot command on this board: HAL.reset(), then the chip resets."""
    hal = load(board).make_hal(chip.machine)
    hal.reset()
    assert chip.machine.resets == 1, board
    return _cause(board, chip, "software")


def test_every_board_names_each_kind_of_reset():
    for board in STM32 + ("pico",):
        family = "rp2" if board == "pico" else "stm32"
        chip = Chip(family)
        assert _cause(board, chip, "power") == "power", board
        assert _reboot(board, chip) == "soft", board
        pin = _cause(board, chip, "pin")
        assert pin == ("power" if family == "rp2" else "hard"), (board, pin)
        chip.machine.WDT(timeout=1000)
        assert _cause(board, chip, "watchdog") == "watchdog", board
        assert _reboot(board, chip) == "soft", board  # the WDT was running: still soft


def test_the_mark_is_for_one_boot_only():
    for board in STM32:
        chip = Chip("stm32")
        assert _reboot(board, chip) == "soft"
        assert _cause(board, chip, "pin") == "hard", board  # the button after a reboot
        assert _reboot(board, chip) == "soft"
        assert _cause(board, chip, "power") == "power", board


def test_without_mem32_the_port_s_answer_stands():
    chip = Chip("stm32")
    m = chip.boot("software")
    del m.mem32
    assert _build.stm32_reset_cause(m) == "hard"
    assert _build.rp2_reset_cause(m) == "hard"


def test_the_pairing_window_follows():
    """docs/pairing.md: the window opens after power-on or the reset button only."""
    from fakehal import FakeHal

    from device.app import App

    for cause, window in (("power", True), ("hard", True), ("soft", False), ("watchdog", False)):
        hal = FakeHal(reset_cause=cause, secret=None)
        app = App(hal)
        app.boot()
        assert app._pair_window() == window, (cause, window)
