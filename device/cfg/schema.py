"""The config's schema, factory defaults and validation (``device.config``'s first part).

Imported by every configuring command that checks a config (``validate``); the rest of
``device.config`` lives in ``device.cfg.edit`` (merge, flatten, sections),
``device.cfg.store`` (decoding and boot), ``device.cfg.writer`` (saving) and
``device.cfg.files`` (file primitives, the learned record): each module a command imports
is one small module dict (the fragmentation stress, bench/bench_arm_stress.py, found
device.config's 776 B one the first block to fail). What they guarantee:
device/config.py's docstring.
"""

from device import floors
from protocol import catalog as C

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


SCHEMA_VERSION = const(1)
# Containers nested in a config value: the config itself is 4 deep (root, channels,
# a channel, its correction list) and a config_set map 4 as well; deeper is refused
# before anything recursive walks it (a hostile value cannot exhaust the C stack).
_MAX_DEPTH = const(6)

_DUTY_FULL = const(65535)


class ConfigError(ValueError):
    """A config value is wrong. ``path`` is the dotted key, ``problem`` the reason."""

    def __init__(self, path, problem, display=None):
        self.path = path
        self.problem = problem
        super().__init__((display or path or "config") + ": " + problem)


# --- factory defaults ------------------------------------------------------------
#
# Temperature limits per NTC channel, (setpoint, warn, crit) in degC. The NTCs sit
# on a package, heatsink or PCB next to the part and read a few degC below its
# junction, so the limits sit below the parts' own limits:
#   gpu   70/85/90  NVIDIA H200 (fixtures/nvidia-h200): GPU_MAX 87, SLOWDOWN 89,
#                   SHUTDOWN 95; GeForce RTX 30xx "max GPU temperature" 93; the seed
#                   calls 85 degC the red line. crit 90 (not 95): at 95 on an NTC the
#                   die is already past an H200's shutdown and a 3080's maximum.
#   vram  80/90/95  GDDR6 (Micron, Samsung) and HBM (H200 MEM_MAX 95) allow a case
#                   temperature of 95 degC: full cooling at 95, warning 5 below.
#                   (The requested 95/105 put the warning at the limit itself and
#                   the critical level 10 degC beyond it.)
#   mos   90/110/125 power stages (DrMOS) allow Tj 150 degC; an NTC on the PCB beside
#                   them reads ~15-25 degC lower; FR-4 Tg is 130-140 degC.
#   amb   45/60/65  the module's probe sits in the chassis air, which runs 5-20 degC
#                   above the room at load (host/modbridge/sim/worlds); GPUs are
#                   specified for 35-45 degC inlet, so a 40 degC room must not trip
#                   it (docs/control-benchmark.md) while a 60 degC chassis does.
#                   Fans cannot cool the intake: watched, not controlled.
# ``crit_mc`` can be configured up to a hard ceiling per channel (_CRIT_CEILING_MC),
# so no config_set can switch critical protection off by raising it out of reach.


def _channel(name, setpoint_c, warn_c, crit_c, controlled):
    return {
        "name": name,
        "model": "beta",  # "sh" once calibrated (cal_write)
        "beta": 3950,  # B25/50 of the seed's 10 k NTC
        "r0": 10000,  # ohm at t0
        "t0_mc": 25000,
        "sh": None,  # [A, B, C] Steinhart-Hart, 1/T = A + B ln R + C (ln R)^3
        "correction": [],  # polynomial in degC, lowest order first, <= 8 coeffs
        "r_fixed": 10000,  # ohm, the divider's fixed resistor
        "ntc_low": True,  # NTC between ADC pin and ground
        "setpoint_mc": setpoint_c * 1000,
        "warn_mc": warn_c * 1000,
        "crit_mc": crit_c * 1000,
        "controlled": controlled,  # takes part in the PID's worst-channel error
        "oversample": 8,  # ADC reads averaged per sample (power of two)
        "filter": "median5",  # "median5" | "ema" | "none" (no filter)
    }


def _fan():
    # Each value is at or above the default fan model's compiled floor
    # (device/floors.py: min_spin 13107, kick 45875, kick_ms 300); config may only
    # raise them.
    return {
        "min_duty": 13107,  # 20 %: below this a 4-wire fan may stop
        "kick_duty": 65535,  # spin-up kick from standstill
        "kick_ms": 500,
        "ppr": 2,  # tach pulses per revolution
        "stall_ms": 3000,  # commanded >= min_duty but 0 RPM this long = stall
        "max_rpm": 20000,  # tach glitch limit: above any real fan (server fans reach 12k)
    }


def defaults():
    """A fresh, independent copy of the factory config. Built on every call, so no
    copy of it stays in RAM beside the one the app runs (a module-level dict would)."""
    return {
        "version": SCHEMA_VERSION,
        "control": {
            "period_ms": 100,  # control tick, 10 Hz
            "telemetry_ms": 200,  # 5 Hz (docs/bridge.md, silence); a multiple of period_ms
            "telemetry_format": "cbor",  # "cbor" frames or "json" lines
            "host_timeout_ms": 5000,  # no heartbeat this long -> STANDALONE
            "mode": "auto",  # boot mode: auto (PID) | manual | curve
            "manual_duty": 32768,  # manual mode's duty until the host sends one
        },
        "channels": [
            _channel("gpu", 70, 85, 90, True),
            _channel("vram", 80, 90, 95, True),
            _channel("mos", 90, 110, 125, True),
            _channel("amb", 45, 60, 65, False),
        ],
        "pid": {  # milli-units, as in the pid_gains message
            "kp": 5000,  # 5 % duty per degC of error
            "ki": 200,  # 0.2 % per degC per second
            "kd": 0,  # no D: the die envelope steps by NVML degrees, D would kick on each
            "kff": 100,  # 0.1 % per W of GPU power (heartbeat feed-forward)
            "slew_pct_s": 20,  # duty may rise at most 20 % per second
            "d_filter_ms": 2000,  # time constant of the derivative's low-pass, 0 = none
            # anti-hunting and the hosted die loop (docs/control-benchmark.md)
            "slew_down_pct_min": 54,  # duty may fall at most 54 % per minute (0.9 %/s)
            "deadband_mc": 1000,  # errors within +-1 degC count as 0
            "i_band_mc": 8000,  # integrate only while |error| <= 8 degC
            # with a host: the die envelope's setpoint, at most the GPU's slowdown (heartbeat
            # gpu_slowdown) - 5 degC, or 76.5 without one; 100000 = follow it; 0 = NTC only
            "die_sp_mc": 100000,
            "env_window_s": 90,  # the die envelope: the maximum of the last 90 s
            "ff_tau_ms": 300000,  # the feed-forward power envelope falls with this
        },
        "curve": {  # curve mode and the fallback when the PID has no input
            "points": [
                [30000, 13107],
                [50000, 19661],
                [65000, 32768],
                [75000, 45875],
                [85000, 65535],
            ],
            "hysteresis_mc": 2000,
        },
        "fans": [_fan(), _fan()],
        "safety": {  # duty floors, the largest active cause wins; each at or above its
            # compiled minimum (floors.SAFETY_MINIMUMS): config can raise them, not lower
            "boot": 45875,  # 70 % until the sensors are valid
            "host_lost": 26214,  # 40 % in STANDALONE (no GPU power feed-forward)
            "sensor_fault": 52428,  # 80 %: an open/short/stale NTC is blind
            "fan_stall": 65535,  # the other fan, flat out
            "over_temp": 52428,  # 80 % above a warning limit
            "critical": 65535,  # above a critical limit; fixed, cannot be lowered
            "min_manual_duty": 19661,  # 30 %: a forgotten manual override still moves air
        },
        "ina226": {
            "addr": 0x40,
            "shunt_uohm": 1000,  # 1 mOhm: 81.9 A full scale, a 700 W GPU draws ~58 A at 12 V
            "max_current_ma": 80000,  # sets current_LSB = max / 2**15
            "avg": 16,  # samples averaged (reset default 1 is noisy)
            "ct_us": 1100,  # bus and shunt conversion time
            "uv_mv": 11400,  # under-voltage alert (12 V - 5 %), 0 = off
        },
        "watchdog_ms": 2000,
        # the chassis model the bridge learned (device/control/chassis.py; docs/control.md
        # "The chassis model"): none at the factory, the module runs on its probes alone
        "model": {
            "ok": 0,  # 1: a converged model, used standalone; 0: none
            "lead_ms": 0,  # probe-lag compensation
            "ga_q12": 0,  # gain on (probe - ambient), Q12
            "rp_mcw": 0,  # m degC per W of input power
            "rpd_mcw": 0,  # extra m degC per W at zero duty (scaled by 1 - duty)
            "off_mc": 0,  # offset
            "unc_mc": 15000,  # the fit's uncertainty, added to the estimate
            "slow_mc": 0,  # the GPU's slowdown the model was fitted against, 0 = none
        },
    }


def _deeper_than(v, limit):
    """True if containers nest more than ``limit`` levels in ``v`` (iterative)."""
    if type(v) is not dict and type(v) is not list:
        return False
    stack = [(v, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for x in node.values() if type(node) is dict else node:
            if type(x) is dict or type(x) is list:
                stack.append((x, depth + 1))
    return False


# --- schema --------------------------------------------------------------------
#
# Ordered tuples (dict order differs between interpreters, and errors must be the
# same on both). Kinds: ("int", lo, hi), ("num", lo, hi) int or finite float,
# ("bool",), ("str", min_len, max_len), ("enum", choices) (str or int choices),
# ("opt", spec) null or spec, ("list", item, min_len, max_len), ("tuple", specs)
# fixed-length list, ("obj", ((key, spec), ...)).
#
# The schema is one constant (in flash when frozen; no RAM): every name in it is a
# ``const()`` of this module, since a name from another module (C.CHANNELS, the
# floors) would make MicroPython build the tuples at import, in RAM. Those values
# are written out here; tests/test_config.py checks them against their sources.
# Its bounds freeze as big ints where above 0x1FFF, which is harmless: they are
# compared, never computed with or copied into a value ("frozen-ints: compared
# only", tests/test_frozen_ints.py).

_DUTY = const(("int", 0, _DUTY_FULL))  # frozen-ints: compared only
# frozen-ints: compared only (C.TEMP_MIN_MC, C.TEMP_MAX_MC)
_TEMP = const(("int", -55000, 200000))
_GAIN = const(("int", 0, 1000000))  # frozen-ints: compared only (pid_gains range)
_OHM = const(("int", 100, 1000000))  # frozen-ints: compared only
_COEF = const(("num", -1, 1))  # int bounds: the same error text on both interpreters

_SAFETY_KEYS = const(
    ("boot", "host_lost", "sensor_fault", "fan_stall", "over_temp", "critical", "min_manual_duty")
)

# frozen-ints: compared only
_CHANNEL = const(
    (
        "obj",
        (
            ("name", ("enum", ("gpu", "vram", "mos", "amb"))),  # C.CHANNELS
            ("model", ("enum", ("beta", "sh"))),
            ("beta", ("int", 1000, 10000)),
            ("r0", _OHM),
            ("t0_mc", ("int", 0, 100000)),
            ("sh", ("opt", ("tuple", (_COEF, _COEF, _COEF)))),
            ("correction", ("list", ("num", -1000000, 1000000), 0, 8)),
            ("r_fixed", _OHM),
            ("ntc_low", ("bool",)),
            ("setpoint_mc", _TEMP),
            ("warn_mc", _TEMP),
            ("crit_mc", _TEMP),
            ("controlled", ("bool",)),
            ("oversample", ("enum", (1, 2, 4, 8, 16, 32, 64))),  # power of two: shift to average
            # "none" means no filter: the app passes None to device.drivers.ntc.NTC
            ("filter", ("enum", ("median5", "ema", "none"))),
        ),
    )
)

# frozen-ints: compared only
_FAN = const(
    (
        "obj",
        (
            ("min_duty", _DUTY),
            ("kick_duty", _DUTY),
            ("kick_ms", ("int", 0, 5000)),
            ("ppr", ("int", 1, 4)),
            ("stall_ms", ("int", 500, 10000)),  # floors.STALL_MAX_MS
            ("max_rpm", ("int", 100, 50000)),
        ),
    )
)

# frozen-ints: compared only
SCHEMA = const(
    (
        "obj",
        (
            ("version", ("int", SCHEMA_VERSION, SCHEMA_VERSION)),
            (
                "control",
                (
                    "obj",
                    (
                        ("period_ms", ("int", 20, 1000)),
                        ("telemetry_ms", ("int", 20, 60000)),
                        ("telemetry_format", ("enum", ("cbor", "json"))),
                        ("host_timeout_ms", ("int", 1000, 30000)),  # floors.HOST_TIMEOUT_MAX_MS
                        ("mode", ("enum", ("auto", "manual", "curve"))),  # C.FAN_MODES
                        ("manual_duty", _DUTY),
                    ),
                ),
            ),
            ("channels", ("list", _CHANNEL, 4, 4)),  # len(C.CHANNELS)
            (
                "pid",
                (
                    "obj",
                    (
                        ("kp", _GAIN),
                        ("ki", _GAIN),
                        ("kd", _GAIN),
                        ("kff", _GAIN),
                        ("slew_pct_s", ("int", 1, 1000)),
                        ("d_filter_ms", ("int", 0, 60000)),
                        ("slew_down_pct_min", ("int", 1, 60000)),
                        ("deadband_mc", ("int", 0, 20000)),
                        ("i_band_mc", ("int", 0, 131071)),
                        ("die_sp_mc", ("int", 0, 100000)),
                        ("env_window_s", ("int", 0, 300)),
                        ("ff_tau_ms", ("int", 0, 600000)),
                    ),
                ),
            ),
            (
                "curve",
                (
                    "obj",
                    (
                        ("points", ("list", ("tuple", (_TEMP, _DUTY)), 2, 16)),
                        ("hysteresis_mc", ("int", 0, 20000)),
                    ),
                ),
            ),
            ("fans", ("list", _FAN, 2, 2)),
            (
                "safety",
                (
                    "obj",
                    (  # _SAFETY_KEYS, in order
                        ("boot", _DUTY),
                        ("host_lost", _DUTY),
                        ("sensor_fault", _DUTY),
                        ("fan_stall", _DUTY),
                        ("over_temp", _DUTY),
                        ("critical", _DUTY),
                        ("min_manual_duty", _DUTY),
                    ),
                ),
            ),
            (
                "ina226",
                (
                    "obj",
                    (
                        ("addr", ("int", 0x40, 0x4F)),  # A0/A1 strapping
                        ("shunt_uohm", ("int", 100, 1000000)),
                        ("max_current_ma", ("int", 100, 100000)),
                        ("avg", ("enum", (1, 4, 16, 64, 128, 256, 512, 1024))),
                        ("ct_us", ("enum", (140, 204, 332, 588, 1100, 2116, 4156, 8244))),
                        ("uv_mv", ("int", 0, 36000)),  # INA226 bus range is 0..36 V
                    ),
                ),
            ),
            # 1000..8000: the RP2040 watchdog cannot exceed 8388 ms.
            ("watchdog_ms", ("int", 1000, 8000)),
            (
                "model",  # device.control.chassis: the bounds of issue 25's design
                (
                    "obj",
                    (  # chassis.KEYS, in order
                        ("ok", ("int", 0, 1)),
                        ("lead_ms", ("int", 0, 20000)),
                        ("ga_q12", ("int", -2048, 8192)),
                        ("rp_mcw", ("int", 0, 500)),
                        ("rpd_mcw", ("int", -500, 500)),
                        ("off_mc", ("int", -10000, 20000)),
                        ("unc_mc", ("int", 500, 15000)),
                        ("slow_mc", ("int", 0, 100000)),  # and 0 or >= _MODEL_SLOW_MIN_MC
                    ),
                ),
            ),
        ),
    )
)

_ROOT_EXTRA = const(("_comment", ("str", 0, 256)))  # a note for humans, top level only

# Per channel: the setpoints message's range for setpoint_mc, and a hard ceiling
# for crit_mc (above every part's own limit: GPU shutdown, GDDR6X/HBM maximum,
# MOSFET Tj 150, hot inlet air).
# frozen-ints: compared only
_SETPOINT_RANGE_MC = const(((20000, 110000), (20000, 110000), (20000, 125000), (10000, 60000)))
# frozen-ints: compared only
_CRIT_CEILING_MC = const((100000, 110000, 150000, 70000))

# The range of model temperatures (degC) over which a correction must stay within
# floors.CAL_BAND_MC of zero: every GPU-module NTC reading that matters is in it.
_CAL_LO_C = const(-20)
_CAL_HI_C = const(150)
_CAL_SHOW_MAX_C = const(1000000)  # offsets beyond this are shown as "more than" it

# Fault floors that must stay at least half duty whatever min_duty is (the compiled
# floors, device/floors.py, are higher; this holds if those ever change).
_FAULT_FLOORS = const(("boot", "sensor_fault", "fan_stall", "over_temp"))
_FAULT_FLOOR_MIN = const(32768)

# model.slow_mc: 0 (not known) or a GPU slowdown at least this (the schema's 0..100000)
_MODEL_SLOW_MIN_MC = const(60000)

# INA226: shunt full scale 81.92 mV; CAL = 0.00512 / (current_LSB * R_shunt) with
# current_LSB = max_current / 2**15 must fit 15 bits.
_INA_SHUNT_FS_UV = const(81920)
_INA_CAL_MAX = const(0x7FFF)


# --- paths and messages -------------------------------------------------------------


def _dotted(parts):
    return ".".join([str(p) for p in parts])


def _display(parts):
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += "[%d]" % p
        elif out:
            out += "." + p
        else:
            out = p
    return out


def _err(parts, problem):
    return ConfigError(_dotted(parts), problem, _display(parts))


def _show(v):
    if _deeper_than(v, _MAX_DEPTH):  # repr() would recurse without bound
        return "a %s nested deeper than %d levels" % (type(v).__name__, _MAX_DEPTH)
    text = repr(v)
    if len(text) > 40:
        text = text[:37] + "..."
    return text


def _pct(duty):
    return (duty * 100 + _DUTY_FULL // 2) // _DUTY_FULL


def _choices(choices):
    return ", ".join([repr(c) for c in choices])


# --- validation ---------------------------------------------------------------------


def _is_number(v):
    t = type(v)
    if t is int:
        return True
    if t is float:
        return v - v == 0.0  # finite: inf - inf and nan - nan are nan
    return False


def _check(spec, v, parts):
    kind = spec[0]
    if kind == "int":
        if type(v) is not int or v < spec[1] or v > spec[2]:
            raise _err(parts, "expected int %d..%d, got %s" % (spec[1], spec[2], _show(v)))
    elif kind == "num":
        if not _is_number(v) or v < spec[1] or v > spec[2]:
            raise _err(
                parts, "expected a finite number %s..%s, got %s" % (spec[1], spec[2], _show(v))
            )
    elif kind == "bool":
        if type(v) is not bool:
            raise _err(parts, "expected true or false, got %s" % _show(v))
    elif kind == "str":
        if type(v) is not str or not spec[1] <= len(v) <= spec[2]:
            raise _err(
                parts, "expected text of %d..%d characters, got %s" % (spec[1], spec[2], _show(v))
            )
    elif kind == "enum":
        choices = spec[1]
        if type(v) is not type(choices[0]) or v not in choices:
            raise _err(parts, "expected one of %s, got %s" % (_choices(choices), _show(v)))
    elif kind == "opt":
        if v is not None:
            _check(spec[1], v, parts)
    elif kind == "list":
        lo, hi = spec[2], spec[3]
        if type(v) is not list or not lo <= len(v) <= hi:
            want = ("%d" % lo) if lo == hi else ("%d..%d" % (lo, hi))
            got = ("%d items" % len(v)) if type(v) is list else _show(v)
            raise _err(parts, "expected a list of %s items, got %s" % (want, got))
        for i in range(len(v)):
            _check(spec[1], v[i], parts + [i])
    elif kind == "tuple":
        specs = spec[1]
        if type(v) is not list or len(v) != len(specs):
            got = ("%d items" % len(v)) if type(v) is list else _show(v)
            raise _err(parts, "expected a list of %d items, got %s" % (len(specs), got))
        for i in range(len(specs)):
            _check(specs[i], v[i], parts + [i])
    elif kind == "obj":
        _check_obj(spec[1], v, parts, ())
    else:  # pragma: no cover - a schema typo
        raise ValueError("bad schema kind " + kind)


def _check_obj(fields, v, parts, extra):
    if type(v) is not dict:
        raise _err(parts, "expected an object, got %s" % _show(v))
    names = [f[0] for f in fields] + [f[0] for f in extra]
    unknown = sorted([str(k) for k in v if k not in names])
    if unknown:
        where = _display(parts) or "the config"
        raise _err(
            parts + [unknown[0]], "unknown key (typo?); %s has %s" % (where, ", ".join(names))
        )
    for key, spec in fields:
        if key not in v:
            raise _err(parts + [key], "missing")
        _check(spec, v[key], parts + [key])
    for key, spec in extra:
        if key in v:
            _check(spec, v[key], parts + [key])


def validate(cfg):
    """Check every field of ``cfg`` and the rules between fields.

    Raises ``ConfigError`` for the first problem found, in schema order (the same on
    both interpreters); returns None when the config is usable.
    """
    _check_obj(SCHEMA[1], cfg, [], (_ROOT_EXTRA,))
    _check_rules(cfg)


def _check_rules(cfg):
    """Cross-field rules; the types and ranges are already known to be right."""
    ctl = cfg["control"]
    period = ctl["period_ms"]
    tele = ctl["telemetry_ms"]
    if tele < period or tele % period:
        raise _err(
            ["control", "telemetry_ms"],
            "must be a multiple of control.period_ms (%d), got %d" % (period, tele),
        )
    if cfg["watchdog_ms"] < 5 * period:
        raise _err(
            ["watchdog_ms"],
            "must be >= 5 x control.period_ms (%d), got %d" % (5 * period, cfg["watchdog_ms"]),
        )

    channels = cfg["channels"]
    any_controlled = False
    for i in range(len(channels)):
        _check_channel(i, channels[i])
        any_controlled = any_controlled or channels[i]["controlled"]
    if not any_controlled:
        raise _err(["channels"], "at least one channel must be controlled")

    points = cfg["curve"]["points"]
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            raise _err(
                ["curve", "points", i, 0],
                "temperatures must ascend: %d after %d" % (points[i][0], points[i - 1][0]),
            )
        if points[i][1] < points[i - 1][1]:
            raise _err(
                ["curve", "points", i, 1],
                "duty must not fall as temperature "
                "rises: %d after %d" % (points[i][1], points[i - 1][1]),
            )

    fans = cfg["fans"]
    model = floors.fan_model(None)  # the board's model is not known here: the default
    model_name = floors.FAN_MODEL_DEFAULT
    min_duty = 0
    min_fan = 0
    for i in range(len(fans)):
        fan = fans[i]
        for key, floor in (
            ("min_duty", model[floors.FM_MIN_SPIN]),
            ("kick_duty", model[floors.FM_KICK]),
        ):
            if fan[key] < floor:
                raise _err(
                    ["fans", i, key],
                    "must be >= %d (compiled floor of fan model %s, %d %%), got %d"
                    % (floor, model_name, _pct(floor), fan[key]),
                )
        if fan["kick_duty"] < fan["min_duty"]:
            raise _err(
                ["fans", i, "kick_duty"],
                "must be >= min_duty (%d), got %d" % (fan["min_duty"], fan["kick_duty"]),
            )
        if fan["kick_ms"] < model[floors.FM_KICK_MS]:
            raise _err(
                ["fans", i, "kick_ms"],
                "must be >= %d (compiled floor of fan model %s), got %d"
                % (model[floors.FM_KICK_MS], model_name, fan["kick_ms"]),
            )
        if fan["stall_ms"] <= fan["kick_ms"]:
            raise _err(
                ["fans", i, "stall_ms"],
                "must be > kick_ms (%d), got %d" % (fan["kick_ms"], fan["stall_ms"]),
            )
        if fan["min_duty"] > min_duty:
            min_duty = fan["min_duty"]
            min_fan = i

    safety = cfg["safety"]
    if safety["critical"] != _DUTY_FULL:
        raise _err(
            ["safety", "critical"],
            "must be %d (full cooling; cannot be lowered), "
            "got %d" % (_DUTY_FULL, safety["critical"]),
        )
    for key, floor in floors.SAFETY_MINIMUMS:  # read at each call: tests may swap it
        if safety[key] < floor:
            raise _err(
                ["safety", key],
                "must be >= %d (compiled floor, %d %%), got %d" % (floor, _pct(floor), safety[key]),
            )
    for key in _FAULT_FLOORS:  # a second line under the compiled ones
        if safety[key] < _FAULT_FLOOR_MIN:
            raise _err(
                ["safety", key],
                "must be >= %d (hard minimum of a fault floor), "
                "got %d" % (_FAULT_FLOOR_MIN, safety[key]),
            )
    for key in _SAFETY_KEYS:
        if safety[key] < min_duty:
            raise _err(
                ["safety", key],
                "must be >= fans[%d].min_duty (%d), got %d" % (min_fan, min_duty, safety[key]),
            )
    if ctl["manual_duty"] < safety["min_manual_duty"]:
        raise _err(
            ["control", "manual_duty"],
            "must be >= safety.min_manual_duty (%d), "
            "got %d" % (safety["min_manual_duty"], ctl["manual_duty"]),
        )

    slow = cfg["model"]["slow_mc"]
    if 0 < slow < _MODEL_SLOW_MIN_MC:
        raise _err(
            ["model", "slow_mc"],
            "expected 0 (not known) or int %d..100000, got %d" % (_MODEL_SLOW_MIN_MC, slow),
        )

    ina = cfg["ina226"]
    product = ina["max_current_ma"] * ina["shunt_uohm"]  # mA * uohm = nV
    if product > _INA_SHUNT_FS_UV * 1000:
        raise _err(
            ["ina226", "max_current_ma"],
            "%d mA through %d uohm is %d uV, beyond "
            "the INA226 shunt range of %d uV"
            % (ina["max_current_ma"], ina["shunt_uohm"], product // 1000, _INA_SHUNT_FS_UV),
        )
    cal = 167772160000 // product  # 0.00512 * 2**15 in mA * uohm units
    if cal > _INA_CAL_MAX:
        raise _err(
            ["ina226", "max_current_ma"],
            "calibration value %d exceeds %d: raise "
            "max_current_ma or shunt_uohm (shunt voltage at max current must be "
            ">= 5120 uV)" % (cal, _INA_CAL_MAX),
        )


def _check_channel(i, ch):
    name = C.CHANNELS[i]
    if ch["name"] != name:
        raise _err(
            ["channels", i, "name"],
            "must be %r (channel order is fixed: %s), "
            "got %r" % (name, ", ".join(C.CHANNELS), ch["name"]),
        )
    lo, hi = _SETPOINT_RANGE_MC[i]
    sp, warn, crit = ch["setpoint_mc"], ch["warn_mc"], ch["crit_mc"]
    if not lo <= sp <= hi:
        raise _err(
            ["channels", i, "setpoint_mc"],
            "expected int %d..%d for %s, got %d" % (lo, hi, name, sp),
        )
    if warn <= sp:
        raise _err(["channels", i, "warn_mc"], "must be > setpoint_mc (%d), got %d" % (sp, warn))
    if crit <= warn:
        raise _err(["channels", i, "crit_mc"], "must be > warn_mc (%d), got %d" % (warn, crit))
    if crit > _CRIT_CEILING_MC[i]:
        raise _err(
            ["channels", i, "crit_mc"],
            "must be <= %d (hard ceiling for %s), got %d" % (_CRIT_CEILING_MC[i], name, crit),
        )
    sh = ch["sh"]
    if ch["model"] == "sh" and sh is None:
        raise _err(["channels", i, "sh"], "required ([A, B, C]) when model is 'sh'")
    if sh is not None and not _sh_plausible(sh, ch["r0"]):
        raise _err(
            ["channels", i, "sh"],
            "not an NTC curve: temperature must fall as "
            "resistance rises (checked at r0/20, r0, r0*20) and stay within "
            "-55..200 degC at r0",
        )
    corr = ch["correction"]
    if corr:
        t_c, off_mc = _worst_offset_mc(corr)
        if off_mc is None or off_mc > floors.CAL_BAND_MC or off_mc < -floors.CAL_BAND_MC:
            by = "more than %d" % _CAL_SHOW_MAX_C if off_mc is None else _fmt_mc(off_mc)
            raise _err(
                ["channels", i, "correction"],
                "moves the reading by %s degC at %d degC, more than the compiled "
                "calibration band of +-%s degC (checked every degC from %d to %d)"
                % (by, t_c, _fmt_mc(floors.CAL_BAND_MC), _CAL_LO_C, _CAL_HI_C),
            )


def _worst_offset_mc(corr):
    """(degC, milli-degC) of the largest offset ``corr`` adds in the checked range
    (milli-degC None beyond +-``_CAL_SHOW_MAX_C`` degC).

    device.calib applies a correction as ``t += poly_eval(correction, t)`` with ``t``
    the model temperature in degC: the same evaluation, at every whole degC.
    """
    from device.calib import poly_eval  # here: configuring imports device.calib anyway

    worst_t = _CAL_LO_C
    worst = 0.0
    for t in range(_CAL_LO_C, _CAL_HI_C + 1):
        off = poly_eval(corr, float(t))
        if abs(off) > abs(worst):
            worst_t = t
            worst = off
    if worst > _CAL_SHOW_MAX_C or worst < -_CAL_SHOW_MAX_C:  # keep a small int
        return worst_t, None
    return worst_t, int(worst * 1000.0 + (0.5 if worst >= 0 else -0.5))


def _fmt_mc(mc):
    """Milli-degC int as degC text: 5000 -> "5", -40250 -> "-40.25"."""
    sign = "-" if mc < 0 else ""
    mc = -mc if mc < 0 else mc
    frac = mc % 1000
    if not frac:
        return "%s%d" % (sign, mc // 1000)
    return ("%s%d.%03d" % (sign, mc // 1000, frac)).rstrip("0")


def _sh_kelvin(sh, r_ohm):
    from math import log  # here: a module global costs every import its dict slot

    ln = log(r_ohm)
    inv = sh[0] + sh[1] * ln + sh[2] * ln * ln * ln
    return 1.0 / inv if inv > 0 else None


def _sh_plausible(sh, r0):
    temps = [_sh_kelvin(sh, r0 / 20), _sh_kelvin(sh, r0), _sh_kelvin(sh, r0 * 20)]
    if None in temps or not temps[0] > temps[1] > temps[2]:
        return False
    t0_mc = (temps[1] - 273.15) * 1000
    return C.TEMP_MIN_MC <= t0_mc <= C.TEMP_MAX_MC
