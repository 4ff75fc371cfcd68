"""Message catalog of protocol v1: types, fields, units, enumerations and codes.

This module is the single source of truth; protocol/SPEC.md documents it and a test
checks that the two agree. Everything is constant tuples (see MESSAGES), which stay
in flash when frozen into a MicroPython image. The descriptions of messages and
fields live in host/modbridge/firmware_host/catalog_doc.py, which is host-only (SPEC.md, humans) and
never flashed.

Field keys are small integers, append-only: a field keeps its key for the life of the
major version, new fields take new keys, and a receiver ignores keys it does not know.
Keys are ascending in catalog order, so the deterministic CBOR map order is also the
catalog order.

Units on the wire are integers in fixed point so the device never needs floats:
milli-degC, mV, mA, mW, RPM, duty in 1/65535. JSON lines show the same values in
display units (degC, V, A, W, percent); ``json_scale`` of a field says how.
"""

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x

    _HOST = True


# --- field kinds -----------------------------------------------------------
_K_UINT = const("u")  # int >= 0
_K_INT = const("i")  # int
_K_STR = const("s")  # text
_K_BYTES = const("b")  # byte string
_K_BOOL = const("?")  # true/false
_K_LIST = const("l")  # array
_K_MAP = const("m")  # map with text keys
_K_NUM = const("n")  # int or float (calibration coefficients)
_K_ENUM = const("e")  # int on the wire, a name in JSON lines

# --- JSON display scales: (mul, div, decimals) ----------------------------------
# q = round(wire * mul / div) is the display value times 10**decimals; it is rendered
# with integer arithmetic, trailing zeros trimmed. ``mul`` is 1 or a multiple of
# 1000 so the product can be split and stay a small int on the MCU.
_MILLI = const((1, 1, 3))  # milli-unit -> unit (m degC -> degC, mV -> V, mA -> A, mW -> W)
# 0..65535 -> 0.000..100.000 % (lossless round trip). A constant: its ints above
# 0x1FFF freeze as big ints (tests/test_frozen_ints.py), exact but allocating in
# arithmetic, so the allocation-free user (protocol.telemetry's JSON line) takes them
# through scale_ints() first; JSON lines (protocol.jsonl) allocate anyway. Built at run
# time instead it kept MESSAGES and every message that names it out of flash (~0.9 KB
# of RAM on the MCU).
# frozen-ints: made small before arithmetic (scale_ints)
_DUTY_PCT = const((100000, 65535, 3))
_GAIN = const((1, 1, 3))  # milli-gain -> gain
_RAW = const(None)

# --- enumerations (append-only) ---------------------------------------------
_STATES = const(("BOOT", "HOSTED", "STANDALONE", "FAILSAFE", "MANUAL"))
STATE_BOOT = const(0)
STATE_HOSTED = const(1)
STATE_STANDALONE = const(2)
STATE_FAILSAFE = const(3)
STATE_MANUAL = const(4)

# Reason codes: why a state was entered, what an event reports.
_REASONS = const(
    (
        "none",  # 0
        "boot",  # 1  firmware started
        "host_ok",  # 2  heartbeats arriving
        "host_timeout",  # 3  no heartbeat within the timeout
        "sensor_open",  # 4  NTC open circuit (index = channel)
        "sensor_short",  # 5  NTC short circuit (index = channel)
        "sensor_stale",  # 6  sensor not updating / I2C read failed repeatedly
        "fan_stall",  # 7  commanded above minimum, 0 RPM (index = fan)
        "over_temp",  # 8  a channel above its warning limit (index = channel)
        "critical_temp",  # 9  a channel above its critical limit: fans forced to 100 %
        "under_voltage",  # 10 12 V input below the threshold
        "power_monitor_fault",  # 11 INA226 absent, wrong id or not answering
        "manual_override",  # 12 host switched fans to manual
        "config_corrupt",  # 13 stored config unreadable: factory defaults in use
        "config_saved",  # 14 config written to flash
        "watchdog_reset",  # 15 last reset was caused by the watchdog
        "cleared",  # 16 the condition named in ``value`` is gone
        "selftest",  # 17 self-test ran (value = 1 pass, 0 fail)
        "calibration",  # 18 calibration coefficients changed (index = channel)
        "manual_expired",  # 19 the MANUAL lease ended (value: 0 time, 1 host lost, 2 safety)
        "tach_implausible",  # 20 tach reading does not fit the commanded duty (index = fan)
        "sensor_stuck",  # 21 NTC reading frozen while the load changes (index = channel)
        "sensor_implausible",  # 22 NTC disagrees with its neighbours (index = channel)
        "config_fallback",  # 23 saved config did not configure: value 1 last good, 0 factory
        "unauthorized",  # 24 unsigned, forged or replayed command refused (value = type)
        "internal_error",  # 25 a command hit a firmware bug; answered nack internal
        "paired",  # 26 a new signing secret was provisioned
        "autotune",  # 27 a relay autotune ended (value = its tune_status)
    )
)
_REASON_NONE = const(0)
REASON_BOOT = const(1)
REASON_HOST_OK = const(2)
REASON_HOST_TIMEOUT = const(3)
REASON_SENSOR_OPEN = const(4)
REASON_SENSOR_SHORT = const(5)
_REASON_SENSOR_STALE = const(6)
REASON_FAN_STALL = const(7)
REASON_OVER_TEMP = const(8)
REASON_CRITICAL_TEMP = const(9)
REASON_UNDER_VOLTAGE = const(10)
REASON_POWER_MONITOR_FAULT = const(11)
REASON_MANUAL_OVERRIDE = const(12)
_REASON_CONFIG_CORRUPT = const(13)
_REASON_CONFIG_SAVED = const(14)
_REASON_WATCHDOG_RESET = const(15)
_REASON_CLEARED = const(16)
_REASON_SELFTEST = const(17)
_REASON_CALIBRATION = const(18)
_REASON_MANUAL_EXPIRED = const(19)
REASON_TACH_IMPLAUSIBLE = const(20)
REASON_SENSOR_STUCK = const(21)
REASON_SENSOR_IMPLAUSIBLE = const(22)
_REASON_CONFIG_FALLBACK = const(23)
_REASON_UNAUTHORIZED = const(24)
_REASON_INTERNAL_ERROR = const(25)
_REASON_PAIRED = const(26)
_REASON_AUTOTUNE = const(27)

_SEVERITIES = const(("info", "warning", "alarm", "critical"))
SEV_INFO = const(0)
SEV_WARNING = const(1)
SEV_ALARM = const(2)
SEV_CRITICAL = const(3)

# NACK error codes.
_ERRORS = const(
    (
        "ok",  # 0 (never sent in a nack)
        "malformed",  # 1 frame or payload could not be decoded
        "version",  # 2 protocol major version not supported
        "unknown_type",  # 3 message type not in this catalog
        "missing_field",  # 4 a required field is absent
        "bad_type",  # 5 a field has the wrong type
        "out_of_range",  # 6 a value is outside its allowed range
        "bad_state",  # 7 not allowed in the current state
        "busy",  # 8 try again later
        "storage",  # 9 flash read/write failed
        "unsupported",  # 10 valid request this module cannot do
        "internal",  # 11 firmware error (a bug: please report it)
        "direction",  # 12 message only valid in the other direction
        "unauthorized",  # 13 needs a valid signature (unsigned, forged or replayed)
        "rate_limited",  # 14 too many requests of this kind: wait and retry
    )
)
_ERR_OK = const(0)
_ERR_MALFORMED = const(1)
_ERR_VERSION = const(2)
_ERR_UNKNOWN_TYPE = const(3)
_ERR_MISSING_FIELD = const(4)
_ERR_BAD_TYPE = const(5)
_ERR_OUT_OF_RANGE = const(6)
_ERR_BAD_STATE = const(7)
_ERR_BUSY = const(8)
_ERR_STORAGE = const(9)
_ERR_UNSUPPORTED = const(10)
_ERR_INTERNAL = const(11)
_ERR_DIRECTION = const(12)
_ERR_UNAUTHORIZED = const(13)
_ERR_RATE_LIMITED = const(14)

# Relay autotune (device/control/autotune.py): where a test is, or why it stopped.
_TUNE_STATUS = const(
    (
        "idle",  # 0 no test has run
        "running",  # 1 relay cycles being measured
        "done",  # 2 consistent cycles measured: ku, pu and gains are in the report
        "aborted",  # 3 the host aborted it
        "safety",  # 4 a safety cause appeared (``causes`` says which)
        "not_hosted",  # 5 no longer HOSTED in automatic mode (host lost, manual, fail-safe)
        "too_hot",  # 6 the error rose past max_rise
        "timeout",  # 7 not done within timeout_s
        "floor",  # 8 a safety floor kept the relay's level from the fans
        "inconsistent",  # 9 cycles did not agree within the tolerance
    )
)
_TUNE_IDLE = const(0)
TUNE_RUNNING = const(1)
TUNE_DONE = const(2)
_TUNE_ABORTED = const(3)
_TUNE_SAFETY = const(4)
_TUNE_NOT_HOSTED = const(5)
_TUNE_TOO_HOT = const(6)
_TUNE_TIMEOUT = const(7)
_TUNE_FLOOR = const(8)
_TUNE_INCONSISTENT = const(9)
_TUNE_ACTIONS = const(("start", "abort"))

_CHANNELS = const(("gpu", "vram", "mos", "amb"))  # NTC channels, index order
_FAN_MODES = const(("auto", "manual", "curve"))
_CAL_MODELS = const(("sh", "beta", "poly"))

# Telemetry ``faults`` bitmask.
_FAULT_NTC_GPU = const(1 << 0)
_FAULT_NTC_VRAM = const(1 << 1)
_FAULT_NTC_MOS = const(1 << 2)
_FAULT_NTC_AMB = const(1 << 3)
FAULT_FAN1_STALL = const(1 << 4)
FAULT_FAN2_STALL = const(1 << 5)
FAULT_POWER_MONITOR = const(1 << 6)
FAULT_UNDER_VOLTAGE = const(1 << 7)
FAULT_OVER_TEMP = const(1 << 8)
FAULT_CRITICAL_TEMP = const(1 << 9)
FAULT_HOST_TIMEOUT = const(1 << 10)
FAULT_FAN1_TACH = const(1 << 11)  # tach reading implausible for the duty
FAULT_FAN2_TACH = const(1 << 12)
FAULT_NTC_STUCK = const(1 << 13)  # a channel frozen (its ntc_* bit is set too)
FAULT_NTC_IMPLAUSIBLE = const(1 << 14)  # a channel disagrees (its ntc_* bit is set too)
_FAULT_BITS = const(
    (
        "ntc_gpu",
        "ntc_vram",
        "ntc_mos",
        "ntc_amb",
        "fan1_stall",
        "fan2_stall",
        "power_monitor",
        "under_voltage",
        "over_temp",
        "critical_temp",
        "host_timeout",
        "fan1_tach",
        "fan2_tach",
        "ntc_stuck",
        "ntc_implausible",
    )
)

# Bounds used for validation (protocol-level sanity; the firmware adds its own
# safety limits on top).
_TEMP_MIN_MC = const(-55000)
_TEMP_MAX_MC = const(200000)
_DUTY_MAX = const(65535)
_U16 = const(0xFFFF)
_U32 = const(0xFFFFFFFF)
_I32_MIN = const(-0x80000000)
_I32_MAX = const(0x7FFFFFFF)

# --- messages -------------------------------------------------------------------
# Directions
_D2H = const("d2h")  # module -> host
_H2D = const("h2d")  # host -> module

# A field: (key, name, kind, required, lo, hi, json_scale, unit)
# ``lo``/``hi`` bound integers (and list/str/bytes/map lengths); None = unbounded.
# ``json_scale`` is one of the scales above, or for K_ENUM the tuple of names.
# A message: (type id, name, direction, fields)
# The prose (what a message or field means) is in
# host/modbridge/firmware_host/catalog_doc.py, keyed by these names: it is for SPEC.md
# and humans, so it stays on the host (not flashed).
#
# Every field is a literal of constants (the names above are ``const()``), so
# MicroPython's compiler folds it into one constant tuple, which stays in flash when
# frozen: the catalog costs the MCU's heap only its module dict and the few messages
# that hold DUTY_PCT (built at import, see there). Bounds beyond 0x1FFF freeze as
# big ints: they are only compared with (message.check_value, frame's decoder
# copies them into an array), never computed with.


_F_KEY = const(0)
_F_NAME = const(1)
_F_KIND = const(2)
_F_REQUIRED = const(3)
_F_LO = const(4)
_F_HI = const(5)
_F_SCALE = const(6)
_F_UNIT = const(7)

_T_HELLO = const(0x01)
_T_HELLO_REQUEST = const(0x02)
_T_TELEMETRY = const(0x10)
_T_EVENT = const(0x11)
_T_CAL_RAW = const(0x12)
_T_CONFIG = const(0x13)
_T_ACK = const(0x14)
_T_NACK = const(0x15)
_T_HEARTBEAT = const(0x20)
_T_FAN_MODE = const(0x30)
_T_SETPOINTS = const(0x31)
_T_PID_GAINS = const(0x32)
_T_FAN_CURVE = const(0x33)
_T_CONFIG_GET = const(0x40)
_T_CONFIG_SET = const(0x41)
_T_CONFIG_SAVE = const(0x42)
_T_CONFIG_RESET = const(0x43)
_T_CAL_READ = const(0x50)
_T_CAL_WRITE = const(0x51)
_T_SELFTEST_REPORT = const(0x16)
_T_REBOOT = const(0x60)
_T_REPL = const(0x61)
_T_SELFTEST = const(0x62)
_T_PAIR = const(0x63)
_T_AUTOTUNE = const(0x34)
_T_AUTOTUNE_REPORT = const(0x17)


# frozen-ints: compared only
_MESSAGES = const(
    (
        (
            _T_HELLO,
            "hello",
            _D2H,
            (
                (0, "fw_version", _K_STR, True, 1, 32, None, ""),
                (1, "proto_minor", _K_UINT, True, 0, 255, None, ""),
                (2, "board", _K_STR, True, 1, 32, None, ""),
                (3, "uid", _K_STR, True, 1, 64, None, ""),
                (4, "channels", _K_LIST, True, 0, 8, None, ""),
                (5, "fans", _K_UINT, True, 0, 8, None, ""),
                (6, "max_frame", _K_UINT, True, 64, 4096, None, "B"),
                (7, "telemetry_ms", _K_UINT, False, 0, 60000, None, "ms"),
                (8, "state", _K_ENUM, False, 0, 255, _STATES, ""),
                (9, "ref", _K_UINT, False, 0, _U16, None, ""),
                (10, "nonce", _K_BYTES, False, 8, 8, None, ""),
                (11, "paired", _K_BOOL, False, None, None, None, ""),
            ),
        ),
        (_T_HELLO_REQUEST, "hello_request", _H2D, ()),
        (
            _T_TELEMETRY,
            "telemetry",
            _D2H,
            (
                (0, "uptime_s", _K_UINT, False, 0, _U32, None, "s"),
                (1, "state", _K_ENUM, True, 0, 255, _STATES, ""),
                (2, "reason", _K_ENUM, False, 0, 255, _REASONS, ""),
                (3, "faults", _K_UINT, False, 0, _U32, None, ""),
                (4, "temp_gpu", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
                (5, "temp_vram", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
                (6, "temp_mos", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
                (7, "temp_amb", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
                (8, "fan1_rpm", _K_UINT, False, 0, 100000, None, "RPM"),
                (9, "fan2_rpm", _K_UINT, False, 0, 100000, None, "RPM"),
                (10, "fan1_duty", _K_UINT, False, 0, _DUTY_MAX, _DUTY_PCT, "1/65535"),
                (11, "fan2_duty", _K_UINT, False, 0, _DUTY_MAX, _DUTY_PCT, "1/65535"),
                (12, "v_in", _K_UINT, False, 0, 40000, _MILLI, "mV"),
                (13, "i_in", _K_INT, False, -100000, 100000, _MILLI, "mA"),
                (14, "p_in", _K_INT, False, 0, 4000000, _MILLI, "mW"),
                (15, "target", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
                (16, "flash_writes", _K_UINT, False, 0, _U32, None, ""),
                (17, "auth_failures", _K_UINT, False, 0, _U32, None, ""),
                (18, "internal_errors", _K_UINT, False, 0, _U32, None, ""),
            ),
        ),
        (
            _T_EVENT,
            "event",
            _D2H,
            (
                (0, "code", _K_ENUM, True, 0, 255, _REASONS, ""),
                (1, "severity", _K_ENUM, True, 0, 3, _SEVERITIES, ""),
                (2, "active", _K_BOOL, False, None, None, None, ""),
                (3, "state", _K_ENUM, False, 0, 255, _STATES, ""),
                (4, "prev_state", _K_ENUM, False, 0, 255, _STATES, ""),
                (5, "index", _K_INT, False, -1, 255, None, ""),
                (6, "value", _K_INT, False, _I32_MIN, _I32_MAX, None, ""),
                (7, "text", _K_STR, False, 0, 96, None, ""),
                (8, "uptime_s", _K_UINT, False, 0, _U32, None, "s"),
            ),
        ),
        (
            _T_CAL_RAW,
            "cal_raw",
            _D2H,
            (
                (0, "ref", _K_UINT, True, 0, _U16, None, ""),
                (1, "channel", _K_UINT, True, 0, 7, None, ""),
                (2, "samples", _K_UINT, True, 1, 65535, None, ""),
                (3, "raw_mean_x16", _K_UINT, True, 0, 65535 * 16, None, "ADC/16"),
                (4, "raw_min", _K_UINT, True, 0, 65535, None, "ADC"),
                (5, "raw_max", _K_UINT, True, 0, 65535, None, "ADC"),
                (6, "ohms", _K_UINT, False, 0, _U32, None, "ohm"),
                (7, "temp", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
            ),
        ),
        (
            _T_CONFIG,
            "config",
            _D2H,
            (
                (0, "ref", _K_UINT, True, 0, _U16, None, ""),
                (1, "values", _K_MAP, True, 0, 64, None, ""),
                (2, "version", _K_UINT, False, 0, _U16, None, ""),
            ),
        ),
        (
            _T_ACK,
            "ack",
            _D2H,
            (
                (0, "ref", _K_UINT, True, 0, _U16, None, ""),
                (1, "ref_type", _K_UINT, True, 0, 255, None, ""),
            ),
        ),
        (
            _T_NACK,
            "nack",
            _D2H,
            (
                (0, "ref", _K_UINT, True, 0, _U16, None, ""),
                (1, "ref_type", _K_UINT, True, 0, 255, None, ""),
                (2, "code", _K_ENUM, True, 0, 255, _ERRORS, ""),
                (3, "field", _K_STR, False, 0, 32, None, ""),
                (4, "text", _K_STR, False, 0, 96, None, ""),
            ),
        ),
        (
            _T_HEARTBEAT,
            "heartbeat",
            _H2D,
            (
                (0, "gpu_temp", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
                (1, "gpu_power", _K_UINT, False, 0, 4000000, _MILLI, "mW"),
                (2, "power_limit", _K_UINT, False, 0, 4000000, _MILLI, "mW"),
                (3, "host_time", _K_UINT, False, 0, _U32, None, "s"),
                (4, "gpu_mem_temp", _K_INT, False, _TEMP_MIN_MC, _TEMP_MAX_MC, _MILLI, "m degC"),
                (5, "period_ms", _K_UINT, False, 0, 600000, None, "ms"),
                (6, "gpu_slowdown", _K_INT, False, 40000, 125000, _MILLI, "m degC"),
            ),
        ),
        (
            _T_FAN_MODE,
            "fan_mode",
            _H2D,
            (
                (0, "mode", _K_ENUM, True, 0, 2, _FAN_MODES, ""),
                (1, "duty1", _K_UINT, False, 0, _DUTY_MAX, _DUTY_PCT, "1/65535"),
                (2, "duty2", _K_UINT, False, 0, _DUTY_MAX, _DUTY_PCT, "1/65535"),
            ),
        ),
        (
            _T_SETPOINTS,
            "setpoints",
            _H2D,
            (
                (0, "sp_gpu", _K_INT, False, 20000, 110000, _MILLI, "m degC"),
                (1, "sp_vram", _K_INT, False, 20000, 110000, _MILLI, "m degC"),
                (2, "sp_mos", _K_INT, False, 20000, 125000, _MILLI, "m degC"),
                (3, "sp_amb", _K_INT, False, 10000, 60000, _MILLI, "m degC"),
            ),
        ),
        (
            _T_PID_GAINS,
            "pid_gains",
            _H2D,
            (
                (0, "kp", _K_INT, False, 0, 1000000, _GAIN, "m %/degC"),
                (1, "ki", _K_INT, False, 0, 1000000, _GAIN, "m %/(degC s)"),
                (2, "kd", _K_INT, False, 0, 1000000, _GAIN, "m % s/degC"),
                (3, "kff", _K_INT, False, 0, 1000000, _GAIN, "m %/W"),
            ),
        ),
        (
            _T_FAN_CURVE,
            "fan_curve",
            _H2D,
            (
                (0, "points", _K_LIST, True, 2, 16, None, ""),
                (1, "hysteresis", _K_UINT, False, 0, 20000, _MILLI, "m degC"),
            ),
        ),
        (_T_CONFIG_GET, "config_get", _H2D, ((0, "section", _K_STR, False, 0, 32, None, ""),)),
        (_T_CONFIG_SET, "config_set", _H2D, ((0, "values", _K_MAP, True, 1, 64, None, ""),)),
        (_T_CONFIG_SAVE, "config_save", _H2D, ()),
        (_T_CONFIG_RESET, "config_reset", _H2D, ()),
        (
            _T_CAL_READ,
            "cal_read",
            _H2D,
            (
                (0, "channel", _K_UINT, True, 0, 7, None, ""),
                (1, "samples", _K_UINT, False, 1, 4096, None, ""),
            ),
        ),
        (
            _T_CAL_WRITE,
            "cal_write",
            _H2D,
            (
                (0, "channel", _K_UINT, True, 0, 7, None, ""),
                (1, "model", _K_ENUM, True, 0, 2, _CAL_MODELS, ""),
                (2, "coeffs", _K_LIST, True, 1, 8, None, ""),
                (3, "correction", _K_LIST, False, 0, 8, None, ""),
            ),
        ),
        (
            _T_SELFTEST_REPORT,
            "selftest_report",
            _D2H,
            (
                (0, "ref", _K_UINT, True, 0, _U16, None, ""),
                (1, "passed", _K_BOOL, True, None, None, None, ""),
                (2, "fan1_rpm", _K_LIST, False, 0, 8, None, ""),
                (3, "fan2_rpm", _K_LIST, False, 0, 8, None, ""),
                (4, "fans_ok", _K_LIST, False, 0, 8, None, ""),
                (5, "channels_ok", _K_LIST, False, 0, 8, None, ""),
                (6, "power_monitor_ok", _K_BOOL, False, None, None, None, ""),
                (7, "v_in", _K_UINT, False, 0, 40000, _MILLI, "mV"),
                (8, "text", _K_STR, False, 0, 96, None, ""),
            ),
        ),
        (_T_REBOOT, "reboot", _H2D, ()),
        (_T_REPL, "repl", _H2D, ()),
        # abort (1.x, append-only): end a running self-test now, fans back to the controller
        (_T_SELFTEST, "selftest", _H2D, ((0, "abort", _K_BOOL, False, None, None, None, ""),)),
        (_T_PAIR, "pair", _H2D, ((0, "key", _K_BYTES, True, 32, 32, None, ""),)),
        (
            _T_AUTOTUNE,
            "autotune",
            _H2D,
            (
                (0, "action", _K_ENUM, True, 0, 1, _TUNE_ACTIONS, ""),
                (1, "amplitude", _K_UINT, False, 3277, 32767, _DUTY_PCT, "1/65535"),
                (2, "hysteresis", _K_UINT, False, 50, 5000, _MILLI, "m degC"),
                (3, "max_rise", _K_UINT, False, 1000, 20000, _MILLI, "m degC"),
                (4, "timeout_s", _K_UINT, False, 60, 7200, None, "s"),
                (5, "cycles", _K_UINT, False, 2, 8, None, ""),
            ),
        ),
        (
            _T_AUTOTUNE_REPORT,
            "autotune_report",
            _D2H,
            (
                (0, "ref", _K_UINT, True, 0, _U16, None, ""),
                (1, "status", _K_ENUM, True, 0, 255, _TUNE_STATUS, ""),
                (2, "cycles", _K_UINT, False, 0, 255, None, ""),
                (3, "elapsed_s", _K_UINT, False, 0, _U32, None, "s"),
                (4, "bias", _K_UINT, False, 0, _DUTY_MAX, _DUTY_PCT, "1/65535"),
                (5, "relay", _K_UINT, False, 0, _DUTY_MAX, _DUTY_PCT, "1/65535"),
                (6, "period_ms", _K_UINT, False, 0, _U32, None, "ms"),
                (7, "amplitude", _K_UINT, False, 0, 200000, _MILLI, "m degC"),
                (8, "causes", _K_UINT, False, 0, 255, None, ""),
                (9, "ku", _K_UINT, False, 0, 1000000, _GAIN, "m %/degC"),
                (10, "pu_ms", _K_UINT, False, 0, _U32, None, "ms"),
                (11, "kp", _K_INT, False, 0, 1000000, _GAIN, "m %/degC"),
                (12, "ki", _K_INT, False, 0, 1000000, _GAIN, "m %/(degC s)"),
                (13, "kd", _K_INT, False, 0, 1000000, _GAIN, "m % s/degC"),
                (14, "center", _K_INT, False, -200000, 200000, _MILLI, "m degC"),
            ),
        ),
    )
)

_M_TYPE = const(0)
_M_NAME = const(1)
_M_DIR = const(2)
_M_FIELDS = const(3)


def scale_ints(scale):
    """A JSON display scale ``(mul, div, decimals)`` with small ints on the MCU
    (frozen, its ints above 0x1FFF are big ints: see DUTY_PCT). Allocates."""
    return tuple([int(str(v)) for v in scale])


def by_type(type_id):
    """Message definition for a type id, or None."""
    for m in _MESSAGES:
        if m[_M_TYPE] == type_id:
            return m
    return None


def by_name(name):
    """Message definition for a name, or None."""
    for m in _MESSAGES:
        if m[_M_NAME] == name:
            return m
    return None


def field_index(msg_def, name):
    """Index of field ``name`` in a message definition, or -1."""
    fields = msg_def[_M_FIELDS]
    i = 0
    while i < len(fields):
        if fields[i][_F_NAME] == name:
            return i
        i += 1
    return -1


# The names above that the firmware does not read in its control tick (the host's,
# and those the module reads only at boot, in a command or in an event) are const()-
# private, so they cost the MCU no slot in this module's dict (8 B each, and the dict
# a size step or two smaller: issue 24's boot heap); module attribute lookups find them
# here instead, through __getattr__ below, in flash. The control tick's names
# (states, the fail-safe's reasons and fault bits, severities) stay plain module
# attributes. On CPython every name is a plain attribute too (the loop at the end).
# Pairs: name, value.
# fmt: off
# frozen-ints: compared only (U16, DUTY_MAX, TEMP_*; DUTY_PCT: see scale_ints)
_LAZY = (
    "K_UINT", _K_UINT,
    "K_INT", _K_INT,
    "K_STR", _K_STR,
    "K_BYTES", _K_BYTES,
    "K_BOOL", _K_BOOL,
    "K_LIST", _K_LIST,
    "K_MAP", _K_MAP,
    "K_NUM", _K_NUM,
    "K_ENUM", _K_ENUM,
    "MILLI", _MILLI,
    "DUTY_PCT", _DUTY_PCT,
    "GAIN", _GAIN,
    "RAW", _RAW,
    "STATES", _STATES,
    "REASONS", _REASONS,
    "REASON_NONE", _REASON_NONE,
    "REASON_SENSOR_STALE", _REASON_SENSOR_STALE,
    "REASON_CONFIG_CORRUPT", _REASON_CONFIG_CORRUPT,
    "REASON_CONFIG_SAVED", _REASON_CONFIG_SAVED,
    "REASON_WATCHDOG_RESET", _REASON_WATCHDOG_RESET,
    "REASON_CLEARED", _REASON_CLEARED,
    "REASON_SELFTEST", _REASON_SELFTEST,
    "REASON_CALIBRATION", _REASON_CALIBRATION,
    "REASON_MANUAL_EXPIRED", _REASON_MANUAL_EXPIRED,
    "REASON_CONFIG_FALLBACK", _REASON_CONFIG_FALLBACK,
    "REASON_UNAUTHORIZED", _REASON_UNAUTHORIZED,
    "REASON_INTERNAL_ERROR", _REASON_INTERNAL_ERROR,
    "REASON_PAIRED", _REASON_PAIRED,
    "REASON_AUTOTUNE", _REASON_AUTOTUNE,
    "SEVERITIES", _SEVERITIES,
    "ERRORS", _ERRORS,
    "ERR_OK", _ERR_OK,
    "ERR_MALFORMED", _ERR_MALFORMED,
    "ERR_VERSION", _ERR_VERSION,
    "ERR_UNKNOWN_TYPE", _ERR_UNKNOWN_TYPE,
    "ERR_MISSING_FIELD", _ERR_MISSING_FIELD,
    "ERR_BAD_TYPE", _ERR_BAD_TYPE,
    "ERR_OUT_OF_RANGE", _ERR_OUT_OF_RANGE,
    "ERR_BAD_STATE", _ERR_BAD_STATE,
    "ERR_BUSY", _ERR_BUSY,
    "ERR_STORAGE", _ERR_STORAGE,
    "ERR_UNSUPPORTED", _ERR_UNSUPPORTED,
    "ERR_INTERNAL", _ERR_INTERNAL,
    "ERR_DIRECTION", _ERR_DIRECTION,
    "ERR_UNAUTHORIZED", _ERR_UNAUTHORIZED,
    "ERR_RATE_LIMITED", _ERR_RATE_LIMITED,
    "TUNE_STATUS", _TUNE_STATUS,
    "TUNE_IDLE", _TUNE_IDLE,
    "TUNE_ABORTED", _TUNE_ABORTED,
    "TUNE_SAFETY", _TUNE_SAFETY,
    "TUNE_NOT_HOSTED", _TUNE_NOT_HOSTED,
    "TUNE_TOO_HOT", _TUNE_TOO_HOT,
    "TUNE_TIMEOUT", _TUNE_TIMEOUT,
    "TUNE_FLOOR", _TUNE_FLOOR,
    "TUNE_INCONSISTENT", _TUNE_INCONSISTENT,
    "TUNE_ACTIONS", _TUNE_ACTIONS,
    "CHANNELS", _CHANNELS,
    "FAN_MODES", _FAN_MODES,
    "CAL_MODELS", _CAL_MODELS,
    "FAULT_NTC_GPU", _FAULT_NTC_GPU,
    "FAULT_NTC_VRAM", _FAULT_NTC_VRAM,
    "FAULT_NTC_MOS", _FAULT_NTC_MOS,
    "FAULT_NTC_AMB", _FAULT_NTC_AMB,
    "FAULT_BITS", _FAULT_BITS,
    "TEMP_MIN_MC", _TEMP_MIN_MC,
    "TEMP_MAX_MC", _TEMP_MAX_MC,
    "DUTY_MAX", _DUTY_MAX,
    "U16", _U16,
    "U32", _U32,
    "I32_MIN", _I32_MIN,
    "I32_MAX", _I32_MAX,
    "D2H", _D2H,
    "H2D", _H2D,
    "F_KEY", _F_KEY,
    "F_NAME", _F_NAME,
    "F_KIND", _F_KIND,
    "F_REQUIRED", _F_REQUIRED,
    "F_LO", _F_LO,
    "F_HI", _F_HI,
    "F_SCALE", _F_SCALE,
    "F_UNIT", _F_UNIT,
    "T_HELLO", _T_HELLO,
    "T_HELLO_REQUEST", _T_HELLO_REQUEST,
    "T_TELEMETRY", _T_TELEMETRY,
    "T_EVENT", _T_EVENT,
    "T_CAL_RAW", _T_CAL_RAW,
    "T_CONFIG", _T_CONFIG,
    "T_ACK", _T_ACK,
    "T_NACK", _T_NACK,
    "T_HEARTBEAT", _T_HEARTBEAT,
    "T_FAN_MODE", _T_FAN_MODE,
    "T_SETPOINTS", _T_SETPOINTS,
    "T_PID_GAINS", _T_PID_GAINS,
    "T_FAN_CURVE", _T_FAN_CURVE,
    "T_CONFIG_GET", _T_CONFIG_GET,
    "T_CONFIG_SET", _T_CONFIG_SET,
    "T_CONFIG_SAVE", _T_CONFIG_SAVE,
    "T_CONFIG_RESET", _T_CONFIG_RESET,
    "T_CAL_READ", _T_CAL_READ,
    "T_CAL_WRITE", _T_CAL_WRITE,
    "T_SELFTEST_REPORT", _T_SELFTEST_REPORT,
    "T_REBOOT", _T_REBOOT,
    "T_REPL", _T_REPL,
    "T_SELFTEST", _T_SELFTEST,
    "T_PAIR", _T_PAIR,
    "T_AUTOTUNE", _T_AUTOTUNE,
    "T_AUTOTUNE_REPORT", _T_AUTOTUNE_REPORT,
    "M_TYPE", _M_TYPE,
    "M_NAME", _M_NAME,
    "M_DIR", _M_DIR,
    "M_FIELDS", _M_FIELDS,
)
# fmt: on


def __getattr__(name):
    """A name of ``_LAZY`` (``C.T_HELLO``, ``from protocol.catalog import MESSAGES``);
    allocates nothing when it is one."""
    if name == "MESSAGES":  # not in _LAZY: a second copy in flash, another object
        return _MESSAGES
    if name in _LAZY:
        i = _LAZY.index(name)
        if not i & 1:
            return _LAZY[i + 1]
    raise AttributeError(name)


if "_HOST" in globals():  # CPython (see const): plain attributes, dir() lists them
    for _i in range(0, len(_LAZY), 2):
        globals()[_LAZY[_i]] = _LAZY[_i + 1]
    del _i
    MESSAGES = _MESSAGES
