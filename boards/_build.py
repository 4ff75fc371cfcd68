"""Shared HAL construction for the MicroPython boards (see device/README.md).

Each ``boards/<board>.py`` holds a pin table and calls :func:`build` with the real
``machine`` module; tests call it with a fake one. It runs once, at boot: device.main
forgets this module after (``make_hal``), so its functions and tables give their RAM
back; the HAL's classes, which stay, are in boards/_common.py.

Pin names in the tables are the MCU's own (``"PC0"`` on STM32, GPIO numbers on
RP2040). On STM32 they are looked up through ``machine.Pin.cpu`` because board
names can shadow CPU names (NUCLEO's Arduino ``A2`` is PA4, the CPU pin ``A2`` is
PA2).
"""

from boards._common import (
    _REBOOT_MARK,
    _STM32_RTC_BKP0R,
    Hal,
    UartPort,
    _stm32_backup_write,
)

PWM_FREQ_HZ = 25000  # Intel 4-wire fan spec: 21..28 kHz, 25 kHz nominal
PWM_BOOT_DUTY = 65535  # full cooling until the app takes over (an unpowered pin = 100 % too)
I2C_FREQ_HZ = 400000  # INA226 fast mode
PORT_BAUD = 115200  # the seed's CH340 link
PORT_RXBUF = 1024  # bytes of UART receive ring buffer (one MAX_LINE JSON line)
# UART read/write timeout. Reads never wait (only what any() reports is read); a
# write waits at most this long for room (STM32: for the data register to empty,
# which takes one character time after the previous chunk; 0 would refuse it).
PORT_TIMEOUT_MS = 20

RESET_CAUSES = (
    ("PWRON_RESET", "power"),
    ("HARD_RESET", "hard"),
    ("WDT_RESET", "watchdog"),
    ("DEEPSLEEP_RESET", "deepsleep"),
    ("SOFT_RESET", "soft"),
)


# --- reset causes: boards/_common.py says why machine.reset_cause() is not enough
_RP2_WATCHDOG_REASON = 0x40058008  # bit 0 TIMER, bit 1 FORCE
_RP2_WATCHDOG_SCRATCH4 = 0x4005801C
_RP2_WDT_ENABLE_MAGIC = 0x6AB73121  # pico-sdk WATCHDOG_NON_REBOOT_MAGIC


def stm32_reset_cause(machine):
    """The reset cause on stm32: ``machine.reset_cause()``, except that HARD with the
    firmware's reboot mark is "soft" (a software reset, see above). Clears the mark."""
    name = reset_cause_name(machine)
    mem = getattr(machine, "mem32", None)
    if mem is None or mem[_STM32_RTC_BKP0R] != _REBOOT_MARK:
        return name
    _stm32_backup_write(mem, 0)
    return "soft" if name == "hard" else name


def rp2_reset_cause(machine):
    """The reset cause on rp2 from the watchdog's registers (see above): "watchdog"
    only for a watchdog that machine.WDT started, "soft" for machine.reset()."""
    name = reset_cause_name(machine)
    mem = getattr(machine, "mem32", None)
    if mem is None or not mem[_RP2_WATCHDOG_REASON] & 3:
        return name  # "power": power-on, brown-out or the RUN pin
    return "watchdog" if mem[_RP2_WATCHDOG_SCRATCH4] == _RP2_WDT_ENABLE_MAGIC else "soft"


def stm32_pin(machine, name):
    """``machine.Pin.cpu.<X><n>`` for a datasheet name such as ``"PB12"``."""
    if name[0] != "P":
        raise ValueError("STM32 pin names are like 'PB12', got %r" % (name,))
    return getattr(machine.Pin.cpu, name[1:])


def reset_cause_name(machine):
    """``machine.reset_cause()`` as one of ``power hard watchdog deepsleep soft``."""
    cause = machine.reset_cause()
    for attr, name in RESET_CAUSES:
        if getattr(machine, attr, None) == cause:
            return name
    return "unknown"


def make_uart(machine, cfg):
    """``machine.UART`` for a ``PORT`` table entry (pins passed only where the port
    lets you route them: rp2 yes, STM32 no — its UART pins are fixed per board)."""
    kw = {"timeout": PORT_TIMEOUT_MS, "rxbuf": cfg.get("rxbuf", PORT_RXBUF)}
    if cfg.get("pass_pins"):
        kw["tx"] = machine.Pin(cfg["tx"])
        kw["rx"] = machine.Pin(cfg["rx"])
    return machine.UART(cfg["id"], cfg.get("baud", PORT_BAUD), **kw)


def make_port(machine, cfg):
    if cfg["kind"] == "uart":
        return UartPort(make_uart(machine, cfg))
    if cfg["kind"] == "stdio":
        import sys
        import select
        import micropython

        from boards._optional import StdioPort

        poller = select.poll()
        poller.register(sys.stdin, select.POLLIN)
        return StdioPort(sys.stdin.buffer, sys.stdout.buffer, poller, micropython.kbd_intr)
    raise ValueError("unknown port kind %r (uart or stdio)" % (cfg["kind"],))


def make_fans(machine, pin_ids):
    pwm = []
    for p in pin_ids:
        pwm.append(machine.PWM(machine.Pin(p), freq=PWM_FREQ_HZ, duty_u16=PWM_BOOT_DUTY))
    return pwm


def make_tach(machine, pin_ids):
    """Tach inputs with the internal pull-up (~40 k) as a backstop: the fan's open
    collector wants an external 10 k to 3.3 V for clean edges at 25 kHz PWM noise."""
    tach = []
    for p in pin_ids:
        tach.append(machine.Pin(p, machine.Pin.IN, machine.Pin.PULL_UP))
    return tach


def build(
    machine,
    name,
    fs_dir,
    pins,
    wdt_max_ms,
    resolve=None,
    adc_ids=None,
    i2c=None,
    fan_model=None,
    family=None,
):
    """Construct the HAL from a board's ``PINS`` table.

    ``resolve`` maps a table name to what ``machine.Pin`` accepts (STM32: ``Pin.cpu``).
    ``adc_ids`` / ``i2c`` let a board override the ADC list (e.g. a mux) or the bus.
    ``fan_model`` is the board's ``FAN_MODEL`` (``hal.fan_model``). ``family``
    (``"stm32"``, ``"rp2"``) reads the reset cause from that port's real flags.
    """
    if resolve is None:

        def resolve(p):
            return p

    if adc_ids is None:
        adc = [machine.ADC(machine.Pin(resolve(p))) for p in pins["ntc"]]
    else:
        adc = adc_ids
    if i2c is None:
        i2c = machine.I2C(pins["i2c"]["id"], freq=pins["i2c"].get("freq", I2C_FREQ_HZ))
    pwm = make_fans(machine, [resolve(p) for p in pins["fan_pwm"]])
    tach = make_tach(machine, [resolve(p) for p in pins["tach"]])
    port_cfg = dict(pins["port"])
    if "tx" in port_cfg and port_cfg.get("pass_pins"):
        port_cfg["tx"] = resolve(port_cfg["tx"])
        port_cfg["rx"] = resolve(port_cfg["rx"])
    port = make_port(machine, port_cfg)
    hal = Hal(machine, name, fs_dir, adc, i2c, pwm, tach, port, wdt_max_ms)
    hal.fan_model = fan_model
    if family == "stm32":
        hal._cause = stm32_reset_cause(machine)
        hal.reset = hal.stm32_reset  # a method of the HAL's class: no closure over here
    elif family == "rp2":
        hal._cause = rp2_reset_cause(machine)
    else:
        hal._cause = reset_cause_name(machine)
    return hal
