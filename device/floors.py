"""Compiled-in safety floors and limits: code, not configuration.

Every number here is a lower bound that no command, config file or calibration can
move down. Configuration may ask for *more* cooling (``safety.*`` above these, a
higher ``fans.*.min_duty``); ``device.config`` refuses anything below them, and
``device.safety`` enforces them on every tick whatever the config says. See
docs/safety.md for the reasoning behind each value.

Duties are 0..65535 (``machine.PWM.duty_u16``), temperatures milli-degC.

Fan models
----------
A board names its fan model (``hal.fan_model``, default ``"pwm4"``). A model gives
the duty below which a 4-wire fan may stop, the spin-up kick, and what the tach must
read for the duty to be believed (``device.drivers.fan`` plausibility):

``min_spin``      duty below which the fan may stop: the lowest duty ever applied
``kick``          minimum spin-up kick duty from standstill, for at least ``kick_ms``
``rpm_floor_pct`` at a settled duty d >= ``rpm_check_duty``, a turning fan reads at
                  least this percentage of ``rpm_nominal`` x d / 100 %; less (a
                  stopped rotor with noise edges reads a few hundred RPM) is
                  ``tach_implausible``. ``rpm_floor(model)`` is the floor at 100 %.
``rpm_nominal``   RPM at 100 % of the slowest fan the model covers
"""

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


_DUTY_FULL = const(65535)


def _t(*items):
    """A tuple built at import, not folded into a constant: a constant tuple's ints
    outside -0x2000..0x1FFF freeze as big ints, whose arithmetic allocates on the MCU
    (tests/test_frozen_ints.py)."""
    return items


# --- per-cause floors (the largest active cause wins) --------------------------------
# (These, DUTY_FULL, STALL_MAX_MS, HOST_TIMEOUT_MAX_MS, FAN_MODEL_DEFAULT and FM_*, read
# when configuring only, are served by ``__getattr__`` (end of file) under their public
# names: ``floors.FLOOR_BOOT``. A module-level name is a slot of the module's table in
# RAM; only what a tick reads stays one.)
_FLOOR_BOOT = const(45875)  # 70 % until the sensors are valid
_FLOOR_HOST_LOST = const(26214)  # 40 % in STANDALONE once a host was seen
_FLOOR_SENSOR = const(52428)  # 80 % with an open/short/stuck/implausible controlled NTC
_FLOOR_STALL = const(65535)  # a stalled or implausible fan: both fans flat out
_FLOOR_OVER_TEMP = const(52428)  # 80 % above a warning limit
_FLOOR_CRITICAL = const(65535)  # above a critical limit: fixed
_FLOOR_MANUAL = const(19661)  # 30 %: the lowest duty a MANUAL command may ask for

# Config key in ``safety`` -> its compiled minimum (config may only raise them):
# ``SAFETY_MINIMUMS``, made by ``__getattr__`` (end of file) when read: configuring
# and tests only, no tuple of it kept in RAM.

# --- the hot floor: rises with temperature, whatever the control law says ------------
# Per channel (gpu, vram, mos, amb): from HOT_START_MC the floor ramps linearly from
# the fan's min_spin to 100 % at HOT_FULL_MC. Set above every factory setpoint and
# warning limit, so normal regulation never meets it; it catches a control law that
# was configured into uselessness (all gains 0, setpoints at their ceiling).
# Ambient air is not cooled by the fans: no hot floor (start = full = None).
HOT_START_MC = _t(80000, 88000, 110000, None)
HOT_FULL_MC = _t(95000, 100000, 130000, None)

# --- the die-margin floor: the GPU's own margin to its slowdown -----------------------
# With a host, the heartbeat carries the die temperature and the GPU's slowdown
# temperature. A fresh die within _DIE_START_MARGIN_MC of the slowdown ramps the floor
# linearly from the fan's min_spin to 100 % at slowdown - _DIE_FULL_MARGIN_MC, whatever
# the mode, curve or gains say. It starts above the die loop's setpoint (slowdown -
# 5 degC, device/app.py), so normal regulation never meets it.
_DIE_START_MARGIN_MC = const(4000)
_DIE_FULL_MARGIN_MC = const(1000)

# --- standalone: limits from the last slowdown and probe-to-die offset seen ----------
# The module keeps the last slowdown it was sent and the largest recent offset between
# the host's die and the GPU channel's protection reading (clamped to 0..OFFSET_MAX_MC,
# low-passed over OFFSET_TAU_MS, then raised at once and lowered by OFFSET_DOWN_MC
# every OFFSET_DOWN_MS); without a host the GPU channel warns at min(configured,
# slowdown - offset - STANDALONE_WARN_MARGIN_MC) and is critical at min(configured,
# slowdown - offset - STANDALONE_CRIT_MARGIN_MC) (device.failsafe.follow_slowdown).
OFFSET_MAX_MC = const(15000)
OFFSET_TAU_MS = const(30000)  # the offset seen is low-passed over this first
OFFSET_DOWN_MC = const(1000)
OFFSET_DOWN_MS = const(600000)  # 1 degC per 10 minutes
_STANDALONE_WARN_MARGIN_MC = const(3000)  # (these two: ``__getattr__``)
_STANDALONE_CRIT_MARGIN_MC = const(0)

# --- calibration band ---------------------------------------------------------------
# A channel's calibrated reading is clamped to the board's nominal NTC curve
# +- CAL_BAND_MC, so no correction can hide a hot sensor by more than this.
CAL_BAND_MC = const(5000)

# Nominal NTC of the boards (the seed's part): 10 kOhm at 25 degC, B25/50 = 3950, on a
# 10 kOhm divider with the NTC to ground. A board with another part overrides these
# in its board module (``hal.ntc_nominal = (beta, r0_ohm, t0_mc, r_fixed_ohm, low)``).
# ``NTC_NOMINAL``: made by ``__getattr__`` when read (the safety layer's construction).

# --- leaving a fault: bounded ramp-down ----------------------------------------------
# After a cause clears, the duty may fall at most this much per second (100 % -> 20 %
# takes 16 s), so a flapping fault cannot pump the fans.
RAMP_DOWN_PER_S = const(3276)  # 5 % per second

# --- detection times: config may shorten them, never stretch them past these -------
# A stalled fan unnoticed for a minute at 650 W, or a dead host whose heartbeats are
# waited for ten minutes, would be cooling made worse by configuration.
_STALL_MAX_MS = const(10000)  # fans.*.stall_ms
_HOST_TIMEOUT_MAX_MS = const(30000)  # control.host_timeout_ms

# --- MANUAL is a lease -----------------------------------------------------------
# (``__getattr__``: read by a MANUAL tick only)
_MANUAL_LEASE_MS = const(600000)  # 10 min: then back to automatic control, with an event

# --- fan models ---------------------------------------------------------------------
# name: (min_spin, kick, kick_ms, rpm_check_duty, rpm_floor_pct, rpm_nominal)
# The tach floor at a settled duty d is rpm_nominal * rpm_floor_pct / 100 * d / 100 %
# (device/drivers/fan.py). From rpm_check_duty up a fan's RPM curve lies on or above
# the line from 0 to its full speed (real curves have a positive intercept; the few
# that sag at the bottom are past it by 50 %), so a fan of the model keeps at least
# 100 / rpm_floor_pct times the floor at every checked duty; the 300 RPM that 10 noise
# edges/s fake at 2 ppr are below the floor at 100 % of every model.
FAN_MODELS = {
    # A generic 4-wire PWM fan (Intel spec): may stop below 20 %, 1,000..20,000 RPM at
    # full speed. Floor 400 RPM at 100 %, 200 at 50 % (a 1,000 RPM fan keeps 2.5x);
    # checked from 50 %: the curve of an unknown fan is not trusted below.
    "pwm4": _t(13107, 45875, 300, 32768, 40, 1000),
    # 40 mm server fans (the seed's module, H200 chassis): >= 8,000 RPM at full speed.
    # Floor 2,000 RPM at 100 % (4x), 1,000 at 50 %.
    "pwm4_server": _t(13107, 45875, 300, 32768, 25, 8000),
    # The simulated fans (host/modbridge/sim/worlds/*.toml, boards/sim.py): 120 mm at
    # 3,000 RPM (default) and 80 mm at 12,000 RPM (h200_2u) at full speed, RPM
    # proportional to duty above the stop duty (10 % / 5 %). Floor 1,500 RPM at 100 %,
    # 300 at 20 %: the slower world keeps 2x at every duty from min_spin, the faster 8x.
    "sim": _t(13107, 45875, 300, 13107, 50, 3000),
}
# FAN_MODEL_DEFAULT: "pwm4" (``__getattr__``; fan_model(None) names it too)
_FM_MIN_SPIN = const(0)  # FM_*: the fields of a model tuple
_FM_KICK = const(1)
_FM_KICK_MS = const(2)
_FM_RPM_CHECK_DUTY = const(3)
_FM_RPM_FLOOR_PCT = const(4)
_FM_RPM_NOMINAL = const(5)

del const  # folded at compile time: a module name less (its table has 17 slots)


def fan_model(name):
    """The tuple of fan model ``name``; None is the factory default,
    ``FAN_MODEL_DEFAULT``. Any other name must be in ``FAN_MODELS``: a misspelt one
    raises ValueError naming the known models (it used to become ``pwm4`` silently,
    which took a server fan's tach floor from 2,000 to 400 RPM)."""
    if name is None:
        name = "pwm4"  # FAN_MODEL_DEFAULT
    m = FAN_MODELS.get(name)
    if m is None:
        known = ", ".join(sorted(FAN_MODELS))  # "pwm4, pwm4_server, sim"
        raise ValueError("unknown fan model %r (known: %s)" % (name, known))
    return m


def rpm_floor(model):
    """RPM a turning fan of ``model`` reads at least at 100 % (x duty / 65535 below)."""
    return model[_FM_RPM_NOMINAL] * model[_FM_RPM_FLOOR_PCT] // 100


def hot_floor(i, temp_mc, min_spin):
    """The hot floor of channel ``i`` at ``temp_mc``: 0 below its start, rising
    linearly from ``min_spin`` to 100 % at its full temperature (ints only).

    >>> hot_floor(0, 70000, 13107), hot_floor(0, 95000, 13107)
    (0, 65535)
    """
    start = HOT_START_MC[i]
    if start is None or temp_mc < start:
        return 0
    full = HOT_FULL_MC[i]
    if temp_mc >= full:
        return _DUTY_FULL
    # (temp - start) < 50000 and span < 65536: the product stays below 2**32 / 1 --
    # split it so it stays a small int on a 32-bit MCU (< 2**30).
    span = _DUTY_FULL - min_spin
    num = temp_mc - start
    den = full - start
    return min_spin + (num // 10) * span // (den // 10)


def die_floor(die_mc, slowdown_mc, min_spin):
    """The die-margin floor for a fresh die temperature ``die_mc`` and the GPU's
    slowdown ``slowdown_mc`` (0: not known -> 0): 0 below slowdown - 4 degC, rising
    linearly from ``min_spin`` to 100 % at slowdown - 1 degC (ints only).

    >>> die_floor(80000, 87000, 13107), die_floor(86000, 87000, 13107)
    (0, 65535)
    """
    if slowdown_mc <= 0:
        return 0
    start = slowdown_mc - _DIE_START_MARGIN_MC
    if die_mc < start:
        return 0
    full = slowdown_mc - _DIE_FULL_MARGIN_MC
    if die_mc >= full:
        return _DUTY_FULL
    # (die - start) < 3000 and span < 65536: the product stays below 2**28
    return min_spin + (die_mc - start) * (_DUTY_FULL - min_spin) // (full - start)


def __getattr__(name):
    """The names read when configuring (``FLOOR_*``, ``DUTY_FULL``, ``FM_*``, ...): made
    on each access, so neither their module slots nor ``SAFETY_MINIMUMS`` and
    ``NTC_NOMINAL``'s tuples are kept in RAM (a test may still assign them). Ints
    without allocation: a tick may ask too (the MANUAL lease; the standalone margins
    when the slowdown they follow moves)."""
    if name == "MANUAL_LEASE_MS":
        return _MANUAL_LEASE_MS
    if name == "STANDALONE_WARN_MARGIN_MC":
        return _STANDALONE_WARN_MARGIN_MC
    if name == "STANDALONE_CRIT_MARGIN_MC":
        return _STANDALONE_CRIT_MARGIN_MC
    if name == "FLOOR_BOOT":
        return _FLOOR_BOOT
    if name == "FLOOR_HOST_LOST":
        return _FLOOR_HOST_LOST
    if name == "FLOOR_SENSOR":
        return _FLOOR_SENSOR
    if name == "FLOOR_STALL":
        return _FLOOR_STALL
    if name == "FLOOR_OVER_TEMP":
        return _FLOOR_OVER_TEMP
    if name == "FLOOR_MANUAL":
        return _FLOOR_MANUAL
    if name == "DUTY_FULL":
        return _DUTY_FULL
    if name == "FM_MIN_SPIN":
        return _FM_MIN_SPIN
    if name == "FM_KICK":
        return _FM_KICK
    if name == "FM_KICK_MS":
        return _FM_KICK_MS
    if name == "FM_RPM_CHECK_DUTY":
        return _FM_RPM_CHECK_DUTY
    if name == "FM_RPM_FLOOR_PCT":
        return _FM_RPM_FLOOR_PCT
    if name == "FM_RPM_NOMINAL":
        return _FM_RPM_NOMINAL
    if name == "STALL_MAX_MS":
        return _STALL_MAX_MS
    if name == "HOST_TIMEOUT_MAX_MS":
        return _HOST_TIMEOUT_MAX_MS
    if name == "FAN_MODEL_DEFAULT":
        return "pwm4"  # fan_model(None)
    if name == "SAFETY_MINIMUMS":
        return (
            _t("boot", _FLOOR_BOOT),
            _t("host_lost", _FLOOR_HOST_LOST),
            _t("sensor_fault", _FLOOR_SENSOR),
            _t("fan_stall", _FLOOR_STALL),
            _t("over_temp", _FLOOR_OVER_TEMP),
            _t("critical", _FLOOR_CRITICAL),
            _t("min_manual_duty", _FLOOR_MANUAL),
        )
    if name == "NTC_NOMINAL":
        return _t(3950, 10000, 25000, 10000, True)
    raise AttributeError(name)

