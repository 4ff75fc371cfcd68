"""WeAct BlackPill STM32F411CE (100 MHz, 128 KB RAM): pin map and HAL.

Wiring, sources and the reasons for each choice: docs/boards.md.
MicroPython's WEACT_F411_BLACKPILL build puts a REPL on USART1 (PA9/PA10) as well as
USB, so the protocol uses USART2. PA4..PA7 are the optional SPI-flash footprint (U3):
PA4 is used here, so build without the SPI-flash variant (the default) and leave U3
empty. PA0 is the KEY button.
"""

from boards import _build

NAME = "blackpill_f411"
MCU = "STM32F411CE"
FS_DIR = "/flash"  # the stm32 port mounts the internal flash at /flash; "/" is not writable
ADC_BITS = 12
WDT_MAX_MS = 32767
FAN_MODEL = "pwm4"  # device/floors.py FAN_MODELS: generic 4-wire fans (the user's)

PINS = {
    # gpu, vram, mos, amb: ADC1_IN1, IN4, IN8, IN9
    "ntc": ("PA1", "PA4", "PB0", "PB1"),
    # 2nd TIM AF on F4: PB8 -> TIM10_CH1, PB9 -> TIM11_CH1 (stm32f411_af.csv)
    "fan_pwm": ("PB8", "PB9"),
    "tach": ("PB12", "PB13"),  # EXTI 12, 13
    "i2c": {"id": 1, "scl": "PB6", "sda": "PB7"},
    "ina226_alert": "PB14",  # EXTI 14
    "port": {"kind": "uart", "id": 2, "tx": "PA2", "rx": "PA3"},
}

LABELS = {}  # the BlackPill silkscreen uses the CPU names


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
