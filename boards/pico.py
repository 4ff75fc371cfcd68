"""Raspberry Pi Pico (RP2040, 133 MHz, 264 KB RAM): pin map and HAL.

Wiring, sources and the reasons for each choice: docs/boards.md.
The Pico brings out only three ADC inputs (GP26..28); ADC3 is GP29, wired on the
board to VSYS/3 and not on the header. So ``mos`` and ``amb`` share ADC2 (GP28)
through an SPDT analog switch (e.g. 74LVC1G3157) selected by GP22, each divider
keeping its own 100 nF before the switch. A board that breaks GP29 out as a plain
ADC input can set ``"ntc": (26, 27, 28, 29)`` and ``"adc_mux": None``.
"""

from boards import _build

NAME = "pico"
MCU = "RP2040"
FS_DIR = "/"
ADC_BITS = 12  # read_u16() scales to 0..65535; see RP2040-E11 (DNL spikes) in docs
WDT_MAX_MS = 8388  # RP2040 limit (MicroPython machine.WDT docs)
FAN_MODEL = "pwm4"  # device/floors.py FAN_MODELS: generic 4-wire fans (the user's)

PINS = {
    # gpu ADC0, vram ADC1, mos ADC2 via switch (GP22 low), amb ADC2 via switch (GP22 high)
    "ntc": (26, 27, 28, 28),
    "adc_mux": {"select": 22, "channels": (2, 3)},  # ntc indices behind the switch
    # GP16/GP17 = PWM slice 0 A/B: one 25 kHz timebase, two duties
    "fan_pwm": (16, 17),
    "tach": (18, 19),
    "i2c": {"id": 0, "scl": 5, "sda": 4},  # I2C0 on GP5/GP4
    "ina226_alert": 20,
    # UART0 on GP0 (TX) / GP1 (RX); the REPL is on USB
    "port": {"kind": "uart", "id": 0, "tx": 0, "rx": 1, "pass_pins": True},
}

LABELS = {}  # silkscreen GPn = GPIO n


def make_hal(machine=None):
    if machine is None:
        import machine
    i2c_cfg = PINS["i2c"]
    i2c = machine.I2C(
        i2c_cfg["id"],
        scl=machine.Pin(i2c_cfg["scl"]),
        sda=machine.Pin(i2c_cfg["sda"]),
        freq=_build.I2C_FREQ_HZ,
    )
    adc = None
    mux = PINS["adc_mux"]
    if mux:
        from boards._optional import MuxedADC

        sel = machine.Pin(mux["select"], machine.Pin.OUT, value=0)
        adc = []
        shared = None
        for i, gp in enumerate(PINS["ntc"]):
            if i in mux["channels"]:
                if shared is None:
                    shared = machine.ADC(machine.Pin(gp))
                adc.append(MuxedADC(shared, sel, mux["channels"].index(i)))
            else:
                adc.append(machine.ADC(machine.Pin(gp)))
    return _build.build(
        machine,
        NAME,
        FS_DIR,
        PINS,
        WDT_MAX_MS,
        adc_ids=adc,
        i2c=i2c,
        fan_model=FAN_MODEL,
        family="rp2",
    )
