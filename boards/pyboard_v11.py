"""pyboard v1.1 (STM32F405RG, 168 MHz, 192 KB RAM): pin map and HAL.

Wiring, sources and the reasons for each choice: docs/boards.md.
Names are the CPU's (STM32 datasheet); the pyboard's silkscreen label is in LABELS.
"""

from boards import _build

NAME = "pyboard_v11"
MCU = "STM32F405RG"
FS_DIR = "/flash"  # internal flash; a card in the slot boots from /sd instead
ADC_BITS = 12  # read_u16() scales the 12-bit result to 0..65535
WDT_MAX_MS = 32767  # IWDG: /256 prescaler, 12-bit reload, LSI ~32 kHz (ports/stm32/machine_wdt.c)
FAN_MODEL = "pwm4"  # device/floors.py FAN_MODELS: generic 4-wire fans (the user's)

PINS = {
    # channel order gpu, vram, mos, amb; PC0..PC3 = ADC123_IN10..13
    "ntc": ("PC0", "PC1", "PC2", "PC3"),
    # machine.PWM takes the pin's 2nd TIMx_CHy AF on F4: PB8 -> TIM10_CH1, PB9 -> TIM11_CH1
    "fan_pwm": ("PB8", "PB9"),
    # EXTI lines 12 and 13 (STM32: one IRQ pin per line number)
    "tach": ("PB12", "PB13"),
    # I2C2 ("Y" bus) alone for the INA226; I2C1 (X9/X10) carries the on-board MMA7660
    "i2c": {"id": 2, "scl": "PB10", "sda": "PB11"},
    "ina226_alert": "PB14",  # EXTI line 14; open drain, 10 k pull-up
    # UART6 ("YA") to the CH340; the REPL stays on the pyboard's own USB
    "port": {"kind": "uart", "id": 6, "tx": "PC6", "rx": "PC7"},
}

LABELS = {
    "PC0": "X19", "PC1": "X20", "PC2": "X21", "PC3": "X22",
    "PB8": "Y3", "PB9": "Y4", "PB12": "Y5", "PB13": "Y6", "PB14": "Y7",
    "PB10": "Y9", "PB11": "Y10", "PC6": "Y1", "PC7": "Y2",
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
