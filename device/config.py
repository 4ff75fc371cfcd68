"""Module configuration: factory defaults, validation, merge, and storage in flash.

Runs unchanged on MicroPython and CPython. Config is read at boot and changed by
commands only, never in the control tick, so this module allocates freely and uses
floats (Steinhart-Hart coefficients).

The configuration is a nested dict of plain JSON values (see ``defaults()``). Units
are in the names (``_mc`` milli-degC, ``_ms``, ``_mv``, ``_ma``, ``_uohm``, ``_us``);
duties are ints 0..65535 like ``machine.PWM.duty_u16``; PID gains are in milli-units
as in the ``pid_gains`` message (``kp`` 5000 = 5 % duty per degC).

API
---
``defaults()``, ``DEFAULTS``    a fresh factory config (built per call: no RAM copy)
``SCHEMA``                      every key, its type and range (a constant, in flash)
``validate(cfg)``               raises ``ConfigError`` naming the path and the problem
``merge(base, changes)``        new validated config with ``config_set`` changes applied
``save(cfg, dirpath)``          -> bool: store atomically, keep the previous config;
                                False (nothing written) when nothing changed
``is_saved(cfg, dirpath)``      -> bool: config.json stores exactly ``cfg``
``candidates(dirpath)``         -> ``(cands, writes, problems)``: what to try at boot
``load(dirpath)``               -> ``(cfg, status, detail)``, the first candidate,
                                status ``ok|prev|missing|corrupt``
``flash_writes(dirpath)``       lifetime number of saves (flash wear)
``factory_reset(dirpath)``      delete the stored configs, return the defaults
``get_section(cfg, name)``      flat ``{dotted key: value}`` map for ``config_get``
``pages(cfg)``                  section names whose maps each fit one ``config`` message
``flatten`` / ``unflatten``     nested config <-> dotted keys
``encode_file`` / ``decode_file``  the bytes of a stored file <-> a config

Storage functions take ``fs=os`` (a stand-in with ``stat``, ``rename``, ``remove``
and optionally ``fsync``/``sync``, for tests).

Errors carry the path twice: ``str(e)`` reads ``channels[2].crit_mc: must be > warn_mc
(110000), got 100000`` for a human; ``e.path`` is the dotted key ``channels.2.crit_mc``
that ``config_set`` uses (the nack ``field``) and ``e.problem`` the text after it.

What validation guarantees
--------------------------
Besides types and ranges of every field and the rules between fields:

- floors are code (``device/floors.py``), config can raise them, never lower them:
  every ``safety.<key>`` >= its ``floors.SAFETY_MINIMUMS`` entry (``critical`` is
  exactly 100 %), ``fans.*.min_duty`` >= the fan model's ``min_spin``,
  ``kick_duty`` >= its ``kick`` and ``kick_ms`` >= its ``kick_ms``. The board's fan
  model is not known here, so the default model (``floors.fan_model(None)``) is the
  floor; ``device.safety`` applies the board's own at run time;
- a channel's ``correction`` (added to the model temperature, as ``device.calib``
  does) stays within +-``floors.CAL_BAND_MC`` at every whole degC from -20 to 150;
- no value nests containers deeper than ``_MAX_DEPTH`` (6; the schema needs 4):
  ``merge``, ``flatten``, ``unflatten`` and file decoding refuse deeper values with
  a ``ConfigError`` ("nested deeper than 6 levels") before anything recursive walks
  them, and error messages never ``repr`` such a value.

Dotted keys (the protocol form)
-------------------------------
``config``/``config_set`` carry a map with text keys, at most 64 entries. A key is the
path of a leaf: dict keys and list indices joined by dots, ``"pid.kp"``,
``"channels.1.setpoint_mc"``, ``"fans.0.min_duty"``. Only dicts and lists of dicts
(``channels``, ``fans``) are expanded; every other list travels whole as one value:
``"curve.points": [[30000, 13107], ...]``, ``"channels.0.sh": [A, B, C]`` (floats)
or null, ``"channels.0.correction": []``. The whole config is about 100 entries, so
``config_get`` without a section is answered page by page (``pages()``); each page
is a top-level section, and a list section too big for one message is split per
item (``"channels.0"``...).

Storage
-------
Two files in ``<fs_dir>``: ``config.json``, the current config, and
``config.prev.json``, the config that was current before the last save (the
last-good copy). Each holds one line of canonical JSON (below)::

    {"config":{...},"crc":12345,"version":1,"writes":7}

``crc`` is the CRC-16 (``protocol.crc``) of the bytes of the ``config`` value exactly
as written. Decoding checks those raw bytes, so the check never depends on how an
interpreter prints a float (single-precision MCU builds print fewer digits than
CPython); a file rewritten by hand or by a host tool in another layout is accepted if
the CRC matches the canonical serialisation of its parsed ``config`` instead.
``writes`` is the lifetime number of saves (this file was save number ``writes``);
the CRC does not cover it. A file without it (written before it existed, or by
``encode_file(cfg)``, e.g. ``modbridge flash``) counts as 0.

Canonical JSON is ``protocol.jsonl.dump_value``: compact, keys sorted, ASCII only,
identical bytes on both interpreters (MicroPython's ``json.dumps`` has neither
``sort_keys`` nor a stable dict order).

Flash wear: ``save`` first reads ``config.json``; if it stores exactly the canonical
bytes of ``cfg`` (same schema version, CRC good) it returns False without opening
anything for writing, renaming or removing. Otherwise the new file is save number
``max(writes of config.json, writes of config.prev.json) + 1``. ``flash_writes``
reports that count; ``factory_reset`` deletes the files, so it restarts from 0, and
a file set aside as corrupt no longer counts.

A save, step by step (a power cut can stop it anywhere; no ack is sent before it
returns):

1. write ``config.json.tmp``, flush it (``os.fsync`` on CPython, ``os.sync()`` on
   MCU ports that have it);
2. if ``config.json`` decodes: rename it to ``config.prev.json`` (the older prev is
   replaced; a corrupt current is not kept as the last good copy);
3. rename ``config.json.tmp`` to ``config.json``; sync.

Rename replaces the target on littlefs and POSIX (checked on the MicroPython unix
port, and on its ``VfsLfs2`` and ``VfsFat``). A FAT driver that refuses with EEXIST
gets the target removed first (``_rename_over``). An OSError in step 3 renames the
current config back from ``config.prev.json`` (the older prev is then gone) and
removes the ``.tmp``. What an interrupted save leaves, and what boot
(``candidates``) makes of it:

- cut in step 1 or 2 (``config.json`` present, ``.tmp`` partial or complete; on
  FAT maybe ``config.prev.json`` already removed): the save never happened; the
  ``.tmp`` is deleted and ``config.json`` is current (without a prev, in the FAT
  case);
- cut between the renames (``config.prev.json`` and a complete ``.tmp``, no
  ``config.json``; also a first save cut before its rename, or FAT replacing a
  corrupt current): the ``.tmp`` was flushed in step 1, so it is checked and
  renamed into place: the save completes (the detail says "recovered from an
  interrupted save"); a ``.tmp`` that does not decode is deleted ("removed an
  unfinished config.json.tmp") and boot falls back to ``config.prev.json`` (the
  config that was running) or the factory defaults;
- cut after step 3: done.

Boot: ``candidates`` -> ``(cands, writes, problems)``.

- ``cands``: ``(source, cfg, detail)`` tuples in the order to try, each ``cfg`` a
  fresh object: ``("current", ...)`` if config.json decodes, ``("prev", ...)`` if
  config.prev.json decodes, always last ``("factory", defaults(), ...)``;
  ``detail`` is a line for the boot log;
- ``writes``: the lifetime save count (of the files as found);
- ``problems``: one text per stored file that did not decode (unreadable, not
  UTF-8, not JSON, nested too deep, wrong envelope, CRC mismatch, schema version
  newer than this firmware or with no migration, invalid values), e.g.
  ``"config.json: CRC mismatch (stored 1, computed 2); kept as config.json.bad"``.
  The file is renamed to ``<name>.bad`` for diagnosis, so the next boot no longer
  sees it and the problem is reported once.

The app configures the real objects from each candidate in turn and uses the first
that works. It raises ``REASON_CONFIG_CORRUPT`` for the problems (their text as the
event text) and ``REASON_CONFIG_FALLBACK`` when it runs a candidate other than
``"current"`` while something was stored, i.e. ``source != "current" and
(len(cands) > 1 or problems)``: value 1 for ``"prev"``, 0 for ``"factory"``. A
first boot (nothing stored: ``cands`` is the factory entry alone, no problems) is
not a fallback.

Status of ``load`` (the first candidate, for callers that need no fallback):

- ``ok``       config.json (maybe migrated from an older schema version, or
  recovered from an interrupted save);
- ``prev``     config.json is missing (set aside as corrupt at an earlier boot, or
  an interrupted save's ``.tmp`` did not decode): config.prev.json;
- ``missing``  nothing stored: factory defaults, a normal first boot, no event;
- ``corrupt``  a stored file was corrupt and set aside; config.prev.json or the
  factory defaults are in use; the caller raises ``REASON_CONFIG_CORRUPT`` with the
  detail as its text.

``detail`` ends with the lifetime save count (``"...; flash writes: 7"``).

Schema versions and migration: ``SCHEMA_VERSION`` is 1, the only version so far, so
``_MIGRATIONS`` is empty. When the schema changes, bump ``SCHEMA_VERSION`` and add
``_MIGRATIONS[n] = fn`` where ``fn(cfg)`` turns a version-n config into version n+1
(including its ``"version"`` field); decoding chains them and validates the result.
A stored version without a migration path is corrupt.
"""

import os

from device import floors
from device.calib import poly_eval
from protocol import catalog as C
from protocol import jsonparse
from protocol.crc import crc16

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


SCHEMA_VERSION = const(1)
FILE_NAME = "config.json"
PREV_NAME = "config.prev.json"  # the config before the last save (last good)
TMP_SUFFIX = ".tmp"
BAD_SUFFIX = ".bad"
MAX_FILE_BYTES = 16384  # the factory file is ~1.8 KB; never read a huge one into RAM
MAX_ENTRIES = 64  # text keys in one config / config_set message (catalog)
# Containers nested in a config value: the config itself is 4 deep (root, channels,
# a channel, its correction list) and a config_set map 4 as well; deeper is refused
# before anything recursive walks it (a hostile value cannot exhaust the C stack).
_MAX_DEPTH = const(6)

DUTY_FULL = const(65535)
_ENOENT = const(2)
_EEXIST = const(17)


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
    }


def __getattr__(name):
    """``config.DEFAULTS`` (for host tools and tests): the factory config, a fresh copy
    from ``defaults()`` on every access, so no dict of it is kept in RAM."""
    if name == "DEFAULTS":
        return defaults()
    raise AttributeError(name)


def _copy(v, parts=None, depth=1):
    """Deep copy of a plain value; ConfigError (at ``parts``) past ``_MAX_DEPTH``."""
    if isinstance(v, dict):
        if depth > _MAX_DEPTH:
            raise _too_deep(parts)
        return {k: _copy(x, parts, depth + 1) for k, x in v.items()}
    if isinstance(v, list):
        if depth > _MAX_DEPTH:
            raise _too_deep(parts)
        return [_copy(x, parts, depth + 1) for x in v]
    return v


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


def _too_deep(parts):
    return _err(parts or [], "nested deeper than %d levels" % _MAX_DEPTH)


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

_DUTY = const(("int", 0, DUTY_FULL))  # frozen-ints: compared only
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
FAULT_FLOOR_MIN = 32768

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
    return (duty * 100 + DUTY_FULL // 2) // DUTY_FULL


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
    if safety["critical"] != DUTY_FULL:
        raise _err(
            ["safety", "critical"],
            "must be %d (full cooling; cannot be lowered), "
            "got %d" % (DUTY_FULL, safety["critical"]),
        )
    for key, floor in floors.SAFETY_MINIMUMS:  # read at each call: tests may swap it
        if safety[key] < floor:
            raise _err(
                ["safety", key],
                "must be >= %d (compiled floor, %d %%), got %d" % (floor, _pct(floor), safety[key]),
            )
    for key in _FAULT_FLOORS:  # a second line under the compiled ones
        if safety[key] < FAULT_FLOOR_MIN:
            raise _err(
                ["safety", key],
                "must be >= %d (hard minimum of a fault floor), "
                "got %d" % (FAULT_FLOOR_MIN, safety[key]),
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


# --- merge (config_set) ------------------------------------------------------------------


def merge(base, changes):
    """Return a new config: ``base`` with ``changes`` applied, validated as a whole.

    ``changes`` maps keys to values. A key is a dotted path (``"pid.kp"``,
    ``"channels.1.setpoint_mc"``) or a plain key whose value is a nested dict of
    partial changes (``{"pid": {"kp": 4000}}``, ``{"channels": {"1": {...}}}``). A
    list value replaces the whole list. Keys are applied in sorted order, so a
    deeper key overrides a shallower one on both interpreters. ``base`` is never
    modified; on any error ``ConfigError`` is raised and nothing changed.
    """
    if type(changes) is not dict:
        raise ConfigError("", "changes must be an object, got %s" % _show(changes))
    cfg = _copy(base)
    keys = list(changes)
    for k in keys:
        if type(k) is not str or not k:
            raise ConfigError("", "keys must be non-empty text, got %s" % _show(k))
    for key in sorted(keys):
        parts = [_index_or_key(p) for p in key.split(".")]
        _apply(cfg, parts, _copy(changes[key], parts), [])
    validate(cfg)
    return cfg


def _index_or_key(p):
    return int(p) if p.isdigit() else p


def _apply(node, parts, value, done):
    """Set ``value`` at ``parts`` below ``node``; dicts merge into dicts."""
    head = parts[0]
    here = done + [head]
    if type(node) is dict:
        if type(head) is int:
            head = str(head)
            here = done + [head]
        if len(parts) > 1 and head not in node:
            raise _err(here, "unknown key")
        if len(parts) == 1:
            old = node.get(head)
            if type(value) is dict and type(old) in (dict, list):
                _merge_into(old, value, here)
            else:
                node[head] = value  # an unknown key here is reported by validate()
            return
        _apply(node[head], parts[1:], value, here)
    elif type(node) is list:
        if type(head) is not int or head >= len(node):
            raise _err(here, "no such item (indices 0..%d)" % (len(node) - 1))
        here = done + [head]
        if len(parts) == 1:
            if type(value) is dict and type(node[head]) in (dict, list):
                _merge_into(node[head], value, here)
            else:
                node[head] = value
            return
        _apply(node[head], parts[1:], value, here)
    else:
        raise _err(done, "is a value, not a section (cannot set %s inside it)" % _show(head))


def _merge_into(node, changes, done):
    pairs = sorted([(str(k), v) for k, v in changes.items()], key=lambda kv: kv[0])
    for k, v in pairs:
        _apply(node, [_index_or_key(k)], v, done)


# --- flatten / sections (config_get) ----------------------------------------------------


def _expandable(v):
    if type(v) is dict:
        return True
    if type(v) is list and v:
        for x in v:
            if type(x) is not dict:
                return False
        return True
    return False


def flatten(value, prefix=""):
    """``{"pid": {"kp": 1}}`` -> ``{"pid.kp": 1}``; lists of dicts by index
    (``"channels.0.beta"``), other lists stay whole values. ConfigError for dicts
    nested deeper than ``_MAX_DEPTH``."""
    out = {}
    _flatten_into(out, value, prefix, 1)
    return out


def _flatten_into(out, v, prefix, depth):
    if not _expandable(v):
        out[prefix] = v
        return
    if depth > _MAX_DEPTH:
        raise ConfigError(prefix, "nested deeper than %d levels" % _MAX_DEPTH)
    items = v.items() if type(v) is dict else enumerate(v)
    for k, x in items:
        key = str(k) if not prefix else prefix + "." + str(k)
        _flatten_into(out, x, key, depth + 1)


def unflatten(flat):
    """Inverse of ``flatten``: dotted keys -> nested dicts, with dicts whose keys are
    exactly "0".."n-1" turned back into lists. ConfigError for a key of more than
    ``_MAX_DEPTH`` parts."""
    root = {}
    for key in flat:
        parts = key.split(".")
        if len(parts) > _MAX_DEPTH:
            raise ConfigError(key, "nested deeper than %d levels" % _MAX_DEPTH)
        node = root
        for p in parts[:-1]:
            nxt = node.get(p)
            if type(nxt) is not dict:
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = flat[key]
    return _listify(root)


def _listify(v):
    if type(v) is not dict:
        return v
    for k in list(v):
        v[k] = _listify(v[k])
    n = len(v)
    if n and all([str(i) in v for i in range(n)]):
        return [v[str(i)] for i in range(n)]
    return v


def get_section(cfg, name, limit=MAX_ENTRIES):
    """Flat ``{dotted key: value}`` map of one section for a ``config`` message.

    ``name`` is a top-level key (``"pid"``, ``"watchdog_ms"``) or a dotted path
    (``"channels.2"``, ``"pid.kp"``). Keys are full dotted paths, ready to send back
    in ``config_set``. Raises ``ConfigError`` for an unknown name or when the map has
    more than ``limit`` entries (``limit=None``: no limit).
    """
    if type(name) is not str or not name:
        raise ConfigError("", "section must be non-empty text, got %s" % _show(name))
    node = cfg
    done = []
    for p in name.split("."):
        k = _index_or_key(p)
        if type(node) is dict and p in node:
            node = node[p]
        elif type(node) is list and type(k) is int and k < len(node):
            node = node[k]
        else:
            raise _err(
                done + [k], "no such section; sections are %s" % ", ".join(_section_names(cfg))
            )
        done.append(k)
    flat = flatten(node, name)
    if limit is not None and len(flat) > limit:
        hint = ""
        if type(node) is list:
            hint = ": ask for %s.0 .. %s.%d" % (name, name, len(node) - 1)
        raise ConfigError(
            name, "%d entries do not fit one message (max %d)%s" % (len(flat), limit, hint)
        )
    return flat


def _section_names(cfg):
    names = [f[0] for f in SCHEMA[1]]
    if "_comment" in cfg:
        names.append("_comment")
    return names


def pages(cfg, limit=MAX_ENTRIES):
    """Section names whose ``get_section`` maps each fit in ``limit`` entries and
    together cover the whole config, in schema order: how to answer a ``config_get``
    without a section."""
    out = []
    for name in _section_names(cfg):
        v = cfg[name]
        if len(flatten(v, name)) <= limit or type(v) is not list:
            out.append(name)
        else:
            for i in range(len(v)):
                out.append("%s.%d" % (name, i))
    return out


# --- storage -----------------------------------------------------------------------------


def canonical(value):
    """Deterministic compact JSON text (sorted keys, ASCII): same on both interpreters."""
    from protocol.jsonl import dump_value  # not at import: JSON lines stay off the boot path

    return dump_value(value)


def _pieces(v):
    """``canonical(v)`` in pieces (a scalar, a key, a bracket): ``"".join`` of them is
    the same text, but saving and comparing never hold it whole (one ~1.8 KB string
    is a block a fragmented 90 KB heap may not have)."""
    from protocol.jsonl import dump_value  # device.app._release() forgets it

    if isinstance(v, dict):
        sep = "{"
        for k in sorted(v):
            yield sep + dump_value(str(k)) + ":"
            yield from _pieces(v[k])
            sep = ","
        yield "}" if sep == "," else "{}"
    elif isinstance(v, (list, tuple)):
        sep = "["
        for x in v:
            yield sep
            yield from _pieces(x)
            sep = ","
        yield "]" if sep == "," else "[]"
    else:
        yield dump_value(v)


def _path(dirpath, name):
    return dirpath.rstrip("/") + "/" + name


def _exists(fs, path):
    try:
        fs.stat(path)
        return True
    except OSError:
        return False


def _remove_quiet(fs, path):
    try:
        fs.remove(path)
    except OSError:
        pass


def _rename_over(fs, src, dst):
    """Rename replacing ``dst``: native on littlefs/POSIX; FAT needs remove first."""
    try:
        fs.rename(src, dst)
        return
    except OSError as e:
        if not e.args or e.args[0] != _EEXIST:
            raise  # any other error: leave dst alone
    fs.remove(dst)  # FAT: from here until the rename only ``src`` exists
    fs.rename(src, dst)


def _open(path, mode):
    """``open``, through one name: tests wrap it to count what reaches the flash."""
    return open(path, mode)


def _sync(fs):
    if hasattr(fs, "sync") and not hasattr(fs, "fsync"):  # MicroPython MCU ports
        fs.sync()


_HEAD = const(b'{"config":')
_CRC_KEY = const(b',"crc":')
_CRC_INIT = const(0xFFFF)  # protocol.crc.INIT
_CHUNK = const(256)  # about the bytes per write of a file being saved
_SCAN = const(128)  # save()'s read buffer; a trailer is < 64 bytes


def _trailer(crc, writes):
    return ',"crc":%d,"version":%d,"writes":%d}\n' % (crc, SCHEMA_VERSION, writes)


def encode_file(cfg, writes=0):
    """The exact text ``save`` writes for ``cfg`` as save number ``writes``
    (canonical envelope plus newline)."""
    body = canonical(cfg)
    return _HEAD.decode() + body + _trailer(crc16(body.encode()), writes)


def _write_tmp(fs, tmp, write, a, b):
    """``tmp`` written by ``write(f, a, b)``, flushed and fsynced (config.json and
    learned.bin alike); on any failure no partial ``tmp`` is left."""
    try:
        with _open(tmp, "wb") as f:
            write(f, a, b)
            f.flush()
            if hasattr(fs, "fsync") and hasattr(f, "fileno"):
                fs.fsync(f.fileno())
    except Exception:  # OSError, or a MemoryError on the way: no partial .tmp left
        _remove_quiet(fs, tmp)
        raise


def _write_learned(f, slowdown_mc, offset_mc):
    f.write(_learned_bytes(slowdown_mc, offset_mc))


def _write_file(f, cfg, writes):
    """Write ``encode_file(cfg, writes)`` to ``f`` from ``_pieces``, about ``_CHUNK``
    bytes a write, the CRC computed on the way."""
    parts = [_HEAD]
    size = len(_HEAD)
    crc = _CRC_INIT
    for piece in _pieces(cfg):
        b = piece.encode()
        crc = crc16(b, 0, -1, crc)
        parts.append(b)
        size += len(b)
        if size >= _CHUNK:
            f.write(b"".join(parts))
            parts = []
            size = 0
    parts.append(_trailer(crc, writes).encode())
    f.write(b"".join(parts))


def _holds(fs, path, cfg):
    """True if ``path`` stores exactly ``cfg``: its text is ``{"config":`` and the
    canonical text of ``cfg`` followed by the rest of the envelope, with the schema
    version and the CRC of that text, and the whole file is a JSON object (what
    ``_parse`` accepts). Compared piece by piece as read: neither the file nor the
    canonical text is held whole (the first difference ends it). False if the file is
    missing or unreadable."""
    try:
        size = fs.stat(path)[6]
    except OSError:
        return False
    if size > MAX_FILE_BYTES:
        return False  # ``_read`` refuses it: not a stored config
    try:
        with _open(path, "rb") as f:
            if f.read(len(_HEAD)) != _HEAD:
                return False
            crc = _CRC_INIT
            for piece in _pieces(cfg):
                b = piece.encode()
                if f.read(len(b)) != b:
                    return False
                crc = crc16(b, 0, -1, crc)
            rest = f.read()
    except OSError:
        return False
    if rest.rfind(_CRC_KEY) != 0:
        return False  # ``,"crc":`` must end the config's text, as ``_body_span`` finds it
    try:
        # the body is one valid JSON value, so the file parses as an object exactly
        # when it does with a 0 in the body's place
        doc = _parse(b'{"config":0' + rest)[1]
    except ConfigError:
        return False
    return doc.get("version") == SCHEMA_VERSION and doc.get("crc") == crc


def save(cfg, dirpath, fs=os):
    """Validate ``cfg`` and store it as ``<dirpath>/config.json``; the config it
    replaces becomes ``config.prev.json``. True if written; False if the stored
    config is already exactly ``cfg`` (then nothing is opened for writing, renamed
    or removed: a repeated ``config_save`` costs no flash wear).

    Raises ``ConfigError`` (nothing written) or ``OSError`` from the filesystem
    (``config.json`` is as before, though a failure after the rotation loses the
    older ``config.prev.json``; a partial ``.tmp`` is removed when possible). ``fs``
    is the ``os`` module or a stand-in with ``rename``, ``remove``, ``stat`` (tests).
    The steps and what a power cut between them leaves: the module docstring.
    """
    validate(cfg)
    final = _path(dirpath, FILE_NAME)
    prev = _path(dirpath, PREV_NAME)
    tmp = final + TMP_SUFFIX
    if _holds(fs, final, cfg):
        return False
    # the stored files are scanned in pieces, never read whole (a 2 KB block is what
    # a fragmented heap refuses first): the trailer's writes count and the body's CRC
    buf = bytearray(_SCAN)
    crc_ok, writes = _scan(fs, final, buf)
    rotate = crc_ok  # a corrupt current is not kept
    writes = max(writes, _scan(fs, prev, buf)[1]) + 1
    buf = None
    _write_tmp(fs, tmp, _write_file, cfg, writes)
    _sync(fs)  # the .tmp is complete on flash before any rename
    if rotate:
        try:
            _rename_over(fs, final, prev)
        except OSError:
            _remove_quiet(fs, tmp)
            raise
    try:
        _rename_over(fs, tmp, final)
    except OSError:
        if rotate:
            try:
                fs.rename(prev, final)  # put the current one back
            except OSError:
                pass
        _remove_quiet(fs, tmp)
        raise
    _sync(fs)
    return True


def is_saved(cfg, dirpath, fs=os):
    """True if ``config.json`` stores exactly ``cfg``: what ``save`` would skip (the
    app asks before it spends a flash-write token; it keeps no copy to compare)."""
    return _holds(fs, _path(dirpath, FILE_NAME), cfg)


def flash_writes(dirpath, fs=os):
    """Lifetime number of saves: the ``writes`` count of the stored files (0 if none)."""
    final = _path(dirpath, FILE_NAME)
    buf = bytearray(_SCAN)
    return max(_scan(fs, final, buf)[1], _scan(fs, _path(dirpath, PREV_NAME), buf)[1])




def _scan(fs, path, buf):
    """``(intact, writes)`` of a stored file, read in ``len(buf)`` pieces: ``intact``
    if it is laid out as ``save`` writes it (``{"config":``, the body, a trailer that
    parses with this schema's version) and the body's CRC matches; ``writes`` its
    lifetime save count (0 if none or unreadable). What ``save`` needs of the
    current and the last-good file; ``load`` checks the whole file at boot."""
    try:
        size = fs.stat(path)[6]
        if size > MAX_FILE_BYTES or size < len(_HEAD) + len(_CRC_KEY):
            return False, 0
        with _open(path, "rb") as f:
            n = len(buf)
            tail = size - n if size > n else 0
            f.seek(tail)
            got = f.readinto(buf)
            cut = bytes(buf[:got])
            at = cut.rfind(_CRC_KEY)
            if at < 0 or tail + at < len(_HEAD):
                return _scan_whole(fs, path)
            try:
                doc = _parse(b'{"config":0' + cut[at:])[1]
            except ConfigError:
                return _scan_whole(fs, path)
            w = doc.get("writes", 0)
            writes = w if type(w) is int and w >= 0 else 0
            f.seek(0)
            if f.read(len(_HEAD)) != _HEAD:
                return _scan_whole(fs, path)
            crc = _CRC_INIT
            left = tail + at - len(_HEAD)
            while left > 0:
                k = f.readinto(buf)  # whole pieces (CPython's readinto has no size)
                if not k:
                    return False, writes
                k = k if k < left else left
                crc = crc16(buf, 0, k, crc)
                left -= k
    except (OSError, ConfigError):
        return False, 0
    return doc.get("version") == SCHEMA_VERSION and doc.get("crc") == crc, writes


def _scan_whole(fs, path):
    """``_scan`` of a file in another layout (edited by hand; ``save`` rewrites it
    canonically once): read and checked whole, as ``load`` does."""
    try:
        data = _read(fs, path)
        if data is None:
            return False, 0
        data, doc = _parse(data)
    except (OSError, ConfigError):
        return False, 0
    writes = _writes_in((data, doc))
    try:
        _check_doc(doc, data)
    except ConfigError:
        return False, writes
    return True, writes


def _read(fs, path):
    """Bytes of ``path``; None if missing. OSError for other trouble or a huge file."""
    try:
        size = fs.stat(path)[6]
    except OSError as e:
        if e.args and e.args[0] == _ENOENT:
            return None
        raise
    if size > MAX_FILE_BYTES:
        raise OSError("file is %d bytes, more than %d" % (size, MAX_FILE_BYTES))
    with _open(path, "rb") as f:
        return f.read(size)  # one block of the size: read() grows its buffer by steps


def _writes_in(peeked):
    """The ``writes`` count of a peeked file; 0 if none or not a count."""
    if peeked is None or peeked[1] is None:
        return 0
    w = peeked[1].get("writes", 0)
    return w if type(w) is int and w >= 0 else 0


def decode_file(data):
    """Parse and check the bytes of a config file -> ``(cfg, detail)``.

    ``detail`` is "" or says the config was migrated. Raises ``ConfigError`` saying
    what is wrong (the caller treats it as corrupt).
    """
    data, doc = _parse(data)
    return _check_doc(doc, data)


def _parse(data):
    """Bytes -> ``(data, doc)``: UTF-8, JSON, an object, not too deep."""
    if not data:
        raise ConfigError("", "file is empty")
    try:
        if max(data) > 0x7F:  # ASCII (every file save writes) is UTF-8: no copy made
            data.decode()
    except UnicodeError:
        raise ConfigError("", "file is not UTF-8 text") from None
    try:
        # the protocol's strict parser: bounded depth, duplicate keys and bad UTF-8
        # refused, the same verdict on both interpreters
        doc = jsonparse.loads(data, max_depth=_MAX_DEPTH + 1, max_len=MAX_FILE_BYTES)
    except jsonparse.JSONError as e:
        if e.reason.startswith("nesting deeper"):
            doc = None
        else:
            raise ConfigError("", "file is not valid JSON (truncated?): %s" % e) from None
    if doc is None or _deeper_than(doc, _MAX_DEPTH):
        raise ConfigError("", "file is nested deeper than %d levels" % _MAX_DEPTH)
    if type(doc) is not dict:
        raise ConfigError("", "file holds %s, not an object" % type(doc).__name__)
    return data, doc


def _check_doc(doc, data):
    """The envelope and the config of a parsed file (its bytes ``data``) ->
    ``(cfg, detail)``."""
    for key in doc:
        if key not in ("config", "crc", "version", "writes"):
            raise ConfigError("", "file has an unknown key %s" % _show(key))
    version = doc.get("version")
    crc = doc.get("crc")
    cfg = doc.get("config")
    if type(version) is not int or type(crc) is not int or type(cfg) is not dict:
        raise ConfigError("", "file needs int version, int crc and an object config")
    writes = doc.get("writes", 0)
    if type(writes) is not int or writes < 0:
        raise ConfigError("", "file has a bad writes count %s" % _show(writes))
    if version > SCHEMA_VERSION:
        raise ConfigError(
            "",
            "schema version %d is newer than this firmware supports (%d)"
            % (version, SCHEMA_VERSION),
        )
    span = _body_span(data)
    if span is None or crc != crc16(data, span[0], span[1]):
        computed = crc16(canonical(cfg).encode())  # another layout: rare
        if crc != computed:
            raise ConfigError("", "CRC mismatch (stored %d, computed %d)" % (crc, computed))
    detail = ""
    if version < SCHEMA_VERSION:
        cfg = _migrate(cfg, version)
        detail = "migrated from schema version %d" % version
    filled = _fill_added(cfg)
    if filled:
        detail = (detail + "; " if detail else "") + (
            "%d key(s) added by this firmware set to factory values" % filled
        )
    try:
        validate(cfg)
    except ConfigError as e:
        raise ConfigError(e.path, "invalid value: " + str(e)) from None
    return cfg, detail


def _body_span(data):
    """``(start, end)`` of the config value's text in a file's bytes as ``save`` lays
    it out, or None (another layout)."""
    end = data.rfind(_CRC_KEY)
    if not data.startswith(_HEAD) or end < len(_HEAD):
        return None
    return len(_HEAD), end


_MIGRATIONS = {}  # version n -> fn(cfg) returning the version n+1 config; none yet

# Keys added to schema version 1 after its first release, with the factory value a
# config saved by an older firmware gets for them. Only these may be missing: any
# other missing key is still a corrupt file. (A key that changes meaning needs a
# schema version and a migration instead.)
_ADDED_IN_1 = (
    ("pid", "slew_down_pct_min"),
    ("pid", "deadband_mc"),
    ("pid", "i_band_mc"),
    ("pid", "die_sp_mc"),
    ("pid", "env_window_s"),
    ("pid", "ff_tau_ms"),
)


def _fill_added(cfg):
    """Fill the ``_ADDED_IN_1`` keys a stored config lacks; how many were filled."""
    n = 0
    factory = None
    for section, key in _ADDED_IN_1:
        node = cfg.get(section)
        if type(node) is dict and key not in node:
            if factory is None:
                factory = defaults()
            node[key] = factory[section][key]
            n += 1
    return n


def _migrate(cfg, version):
    while version < SCHEMA_VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise ConfigError("", "no migration from schema version %d" % version)
        cfg = step(cfg)
        version += 1
    return cfg


def candidates(dirpath, fs=os):
    """The configs to try at boot -> ``(cands, writes, problems)``.

    ``cands`` is a list of ``(source, cfg, detail)`` in the order the app tries
    them: ``("current", ...)`` if ``config.json`` decodes, ``("prev", ...)`` if
    ``config.prev.json`` decodes, and always last ``("factory", defaults(), ...)``.
    ``detail`` is a line for the boot log. ``writes`` is the lifetime save count
    (``flash_writes``). ``problems`` has one text per stored file found corrupt (it
    was renamed to ``.bad``): the app raises ``config_corrupt`` with it. An
    interrupted save is resolved first (module docstring). Never raises for a bad
    file.
    """
    final = _path(dirpath, FILE_NAME)
    note = _finish_save(fs, final, final + TMP_SUFFIX)
    problems = []
    cands = []
    writes = 0
    for source, name, what in (
        ("current", FILE_NAME, "loaded " + FILE_NAME),
        ("prev", PREV_NAME, PREV_NAME + ", the config before the last save"),
    ):
        got = _candidate(fs, _path(dirpath, name), name, problems)
        if got is None:
            continue
        cfg, detail, w = got
        writes = w if w > writes else writes
        if cfg is not None:
            cands.append((source, cfg, what + (", " + detail if detail else "")))
    cands.append(("factory", defaults(), "factory defaults"))
    if note:
        source, cfg, detail = cands[0]
        cands[0] = (source, cfg, detail + " (" + note + ")")
    return cands, writes, problems


def _candidate(fs, path, name, problems):
    """None if ``path`` is missing, else ``(cfg or None, detail, writes)``."""
    try:
        data = _read(fs, path)
    except OSError as e:
        problems.append(_set_aside(fs, path, name, "cannot read it: %s" % e))
        return None
    if data is None:
        return None
    writes = 0
    try:
        data, doc = _parse(data)
        writes = _writes_in((data, doc))
        cfg, detail = _check_doc(doc, data)
    except ConfigError as e:
        problems.append(_set_aside(fs, path, name, e.problem))
        return None, "", writes
    return cfg, detail, writes


def _finish_save(fs, final, tmp):
    """Resolve a ``.tmp`` left by an interrupted save; returns a note or ""."""
    if not _exists(fs, tmp):
        return ""
    if _exists(fs, final):
        _remove_quiet(fs, tmp)  # cut before the renames: the old file stands
        return ""
    try:
        data = _read(fs, tmp)
        if data is None:
            return ""
        decode_file(data)
        fs.rename(tmp, final)  # cut between the renames: complete the save
    except (ConfigError, OSError):
        _remove_quiet(fs, tmp)
        return "removed an unfinished %s%s" % (FILE_NAME, TMP_SUFFIX)
    return "recovered from an interrupted save"


def _set_aside(fs, path, name, why):
    """Rename a corrupt file to ``.bad`` (once: the next boot finds it missing)."""
    try:
        _rename_over(fs, path, path + BAD_SUFFIX)
        kept = "kept as %s%s" % (name, BAD_SUFFIX)
    except OSError:
        kept = "could not rename it to %s%s" % (name, BAD_SUFFIX)
    return "%s: %s; %s" % (name, why, kept)


def load(dirpath, fs=os):
    """The config to boot -> ``(cfg, status, detail)``: the first of ``candidates``.

    ``status`` is ``"ok"`` (config.json), ``"prev"`` (config.prev.json: config.json
    is missing), ``"missing"`` (nothing stored: factory defaults) or ``"corrupt"``
    (a stored file was corrupt and set aside; config.prev.json or the factory
    defaults in use). ``detail`` says what was found and the flash write count.
    Never raises for a bad file. The app uses ``candidates`` directly, to fall back
    when the first config does not configure.
    """
    cands, writes, problems = candidates(dirpath, fs)
    source, cfg, detail = cands[0]
    if source == "current":
        status = "ok"
    elif problems:
        status = "corrupt"
        detail = "; ".join(problems) + "; in use: " + detail
    else:
        status = "prev" if source == "prev" else "missing"
        if source == "factory":
            detail = "no %s: %s" % (FILE_NAME, detail)
    if source == "current" and problems:
        detail += "; " + "; ".join(problems)
    return cfg, status, "%s; flash writes: %d" % (detail, writes)


def factory_reset(dirpath, fs=os):
    """Delete the stored configs (and any ``.tmp``); return fresh factory defaults.

    The next boot then loads defaults with status ``missing``. ``.bad`` files are
    left for diagnosis. The flash write count starts again from 0. Removal order
    (``.tmp``, ``config.prev.json``, ``config.json``) means a power cut leaves the
    current config in place: the reset, never acknowledged, did not happen.
    """
    final = _path(dirpath, FILE_NAME)
    _remove_quiet(fs, final + TMP_SUFFIX)
    for path in (_path(dirpath, PREV_NAME), final):
        if _exists(fs, path):
            fs.remove(path)  # an OSError here means flash trouble: let the caller nack
    return defaults()


# --- what the module learned from its host (device/failsafe.py "standalone limits") --
# The last GPU slowdown temperature a host sent and the probe-to-die offset the module
# saw, kept beside the config in a record of its own: 12 bytes (a magic and schema
# version, two int32 milli-degC, a CRC-16), written rarely by the app (when a value
# moved by a degree or more, at most once per ``LEARNED_SAVE_MS``) and never with the
# config, so learning never persists a ``config_set`` that was not saved, nor costs
# the config's write count. A missing, short, foreign-version or corrupt record is
# "never hosted": the factory limits. Values are bounded on load as on learning.
LEARNED_NAME = "learned.bin"
LEARNED_VERSION = const(1)
_LEARNED_MAGIC = const(0x4C)  # "L"
_SLOWDOWN_MIN_MC = const(40000)  # the heartbeat's ``gpu_slowdown`` range (catalog)
_SLOWDOWN_MAX_MC = const(125000)


def _learned_bytes(slowdown_mc, offset_mc):
    b = bytearray(12)
    b[0] = _LEARNED_MAGIC
    b[1] = LEARNED_VERSION
    for k, v in ((2, slowdown_mc), (6, offset_mc)):
        v &= 0xFFFFFFFF
        b[k] = v & 0xFF
        b[k + 1] = (v >> 8) & 0xFF
        b[k + 2] = (v >> 16) & 0xFF
        b[k + 3] = v >> 24
    crc = crc16(bytes(b[:10]))
    b[10] = crc & 0xFF
    b[11] = crc >> 8
    return bytes(b)


def _i32(b, k):
    v = b[k] | (b[k + 1] << 8) | (b[k + 2] << 16) | (b[k + 3] << 24)
    return v - 0x100000000 if v & 0x80000000 else v


def load_learned(dirpath, fs=os):
    """``(slowdown_mc, offset_mc)`` from the learned record; ``(0, 0)`` when there is
    none or it is not valid (the factory's limits). Never raises for a bad file."""
    try:
        with _open(_path(dirpath, LEARNED_NAME), "rb") as f:
            b = f.read(13)
    except OSError:
        return 0, 0
    if len(b) != 12 or b[0] != _LEARNED_MAGIC or b[1] != LEARNED_VERSION:
        return 0, 0
    if crc16(b[:10]) != b[10] | (b[11] << 8):
        return 0, 0
    slow = _i32(b, 2)
    off = _i32(b, 6)
    if not _SLOWDOWN_MIN_MC <= slow <= _SLOWDOWN_MAX_MC:
        return 0, 0
    return slow, min(max(off, 0), floors.OFFSET_MAX_MC)


def save_learned(dirpath, slowdown_mc, offset_mc, fs=os):
    """Store the learned record atomically (temp file + rename); raises ``OSError``."""
    final = _path(dirpath, LEARNED_NAME)
    tmp = final + TMP_SUFFIX
    _write_tmp(fs, tmp, _write_learned, slowdown_mc, offset_mc)
    _sync(fs)
    _rename_over(fs, tmp, final)
    _sync(fs)
