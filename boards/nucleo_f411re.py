"""ST NUCLEO-F411RE (STM32F411RE, 100 MHz as MicroPython clocks it at 96 MHz, 128 KB RAM).

Wiring, sources and the reasons for each choice: docs/boards.md.
USART2 (PA2/PA3) is wired to the ST-LINK and is MicroPython's REPL: it stays the
REPL (mpremote, reflashing). The protocol gets a CH340 on USART6 (PC6 on the CN10
morpho header, PC7 = Arduino D9), the only other UART MicroPython's NUCLEO_F411RE
build defines. Set PINS["port"] = {"kind": "stdio"} to run the protocol over the
ST-LINK VCP instead (no CH340; Ctrl-C is then disabled while the app runs).
"""

from boards import _build

NAME = "nucleo_f411re"
MCU = "STM32F411RE"
FS_DIR = "/flash"  # the stm32 port mounts the internal flash at /flash; "/" is not writable
ADC_BITS = 12
WDT_MAX_MS = 32767
FAN_MODEL = "pwm4"  # device/floors.py FAN_MODELS: generic 4-wire fans (the user's)

PINS = {
    # Arduino A0, A1, A2, A3 = PA0, PA1, PA4, PB0 = ADC1_IN0, IN1, IN4, IN8
    "ntc": ("PA0", "PA1", "PA4", "PB0"),
    # Arduino D5 = PB4 -> TIM3_CH1, D4 = PB5 -> TIM3_CH2 (one TIM AF each)
    "fan_pwm": ("PB4", "PB5"),
    # Arduino D7 = PA8 (EXTI 8), D2 = PA10 (EXTI 10)
    "tach": ("PA8", "PA10"),
    # I2C1 on Arduino D15 (SCL) / D14 (SDA)
    "i2c": {"id": 1, "scl": "PB8", "sda": "PB9"},
    "ina226_alert": "PA6",  # Arduino D12, EXTI 6
    "port": {"kind": "uart", "id": 6, "tx": "PC6", "rx": "PC7"},
}

LABELS = {
    "PA0": "A0", "PA1": "A1", "PA4": "A2", "PB0": "A3",
    "PB4": "D5", "PB5": "D4", "PA8": "D7", "PA10": "D2",
    "PB8": "D15", "PB9": "D14", "PA6": "D12", "PC6": "CN10-4", "PC7": "D9",
}


def make_hal(machine=None):
    if machine is None:
        import machine
    return _build.build(
        machine,
        NAME,
        FS_DIR,
        PINS,
        WDT_MAX_MS,
        resolve=lambda p: _build.stm32_pin(machine, p),
        fan_model=FAN_MODEL,
        family="stm32",
    )
