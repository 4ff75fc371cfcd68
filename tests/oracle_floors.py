"""The safety oracle's own floors, written from docs/safety.md, not from device/floors.py.

The harness (tests/safety_harness.py) checks every control tick of the real firmware
against these numbers. They are copied by hand from the tables of docs/safety.md
("The compiled floors", "The die-margin floor", "Why these numbers"): a floor function
or constant changed in the firmware is caught here, where an oracle that called
``device.floors`` would have agreed with it (issue 23 item 14;
tests/test_oracle_mutation.py proves it). Importable on CPython and MicroPython; ints
only, rounded the way a percentage of the 16-bit duty is (``pct``).
"""

DUTY_FULL = 65535


def pct(p):
    """A duty from a percentage of 65535, rounded to the nearest."""
    return (p * DUTY_FULL + 50) // 100


# "The compiled floors" (docs/safety.md), per cause
MIN_SPIN = pct(20)  # fan model minimum spin (the generic 4-wire fan of the fake board)
BOOT = pct(70)
HOST_LOST = pct(40)
SENSOR = pct(80)
OVER_TEMP = pct(80)
STALL = pct(100)
CRITICAL = pct(100)
MANUAL_MIN = pct(30)

# hot floor: per channel (gpu, vram, mos, amb) the protection reading, milli-degC,
# where it leaves min spin and where it reaches 100 % (also the compiled critical end)
HOT = ((80000, 95000), (88000, 100000), (110000, 130000), None)

# die-margin floor: the host's fresh die against the GPU's slowdown; min spin at
# slowdown - 4 degC, 100 % at slowdown - 1 degC
DIE_START_BELOW_MC = 4000
DIE_FULL_BELOW_MC = 1000
# the alarm that follows the measured die (issue 25 item 3, docs/safety.md): a fresh die
# at or above slowdown - 2 degC is an over-temperature warning at the latest
DIE_WARN_MARGIN_MC = 2000

# S2: the calibration band, and S5: the MANUAL lease
CAL_BAND_MC = 5000
MANUAL_LEASE_MS = 600000

# the boards' nominal NTC: 10 kOhm at 25 degC, B25/50 = 3950, on a 10 kOhm divider
# with the NTC to ground (docs/safety.md, S2)
NTC_NOMINAL = (3950, 10000, 25000, 10000, True)


def _ramp(t, start, full, low):
    """``low`` at ``start``, 100 % at ``full``, linear between; 0 below ``start``.
    Rounded down and less 2 counts: the firmware's integer steps may land a little
    under the exact line, never more."""
    if t < start:
        return 0
    if t >= full:
        return DUTY_FULL
    v = low + (t - start) * (DUTY_FULL - low) // (full - start) - 2
    return v if v > low else low


def hot_floor(ch, prot_mc):
    """The hot floor of channel ``ch`` (0..3) at protection reading ``prot_mc``."""
    row = HOT[ch]
    if row is None:
        return 0
    return _ramp(prot_mc, row[0], row[1], MIN_SPIN)


def hot_full(ch):
    """The compiled critical end of channel ``ch``, None when it has no hot floor."""
    row = HOT[ch]
    return None if row is None else row[1]


def die_floor(die_mc, slowdown_mc):
    """The die-margin floor of a fresh die at ``die_mc`` under ``slowdown_mc``."""
    if not slowdown_mc:
        return 0
    return _ramp(die_mc, slowdown_mc - DIE_START_BELOW_MC, slowdown_mc - DIE_FULL_BELOW_MC,
                 MIN_SPIN)
