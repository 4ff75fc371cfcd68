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


# --- field kinds -----------------------------------------------------------
K_UINT = const("u")  # int >= 0
K_INT = const("i")  # int
K_STR = const("s")  # text
K_BYTES = const("b")  # byte string
K_BOOL = const("?")  # true/false
K_LIST = const("l")  # array
K_MAP = const("m")  # map with text keys
K_NUM = const("n")  # int or float (calibration coefficients)
K_ENUM = const("e")  # int on the wire, a name in JSON lines

# --- JSON display scales: (mul, div, decimals) ----------------------------------
# q = round(wire * mul / div) is the display value times 10**decimals; it is rendered
# with integer arithmetic, trailing zeros trimmed. ``mul`` is 1 or a multiple of
# 1000 so the product can be split and stay a small int on the MCU.
MILLI = const((1, 1, 3))  # milli-unit -> unit (m degC -> degC, mV -> V, mA -> A, mW -> W)
# 0..65535 -> 0.000..100.000 % (lossless round trip). A constant: its ints above
# 0x1FFF freeze as big ints (tests/test_frozen_ints.py), exact but allocating in
# arithmetic, so the allocation-free user (protocol.telemetry's JSON line) takes them
# through scale_ints() first; JSON lines (protocol.jsonl) allocate anyway. Built at run
# time instead it kept MESSAGES and every message that names it out of flash (~0.9 KB
# of RAM on the MCU).
# frozen-ints: made small before arithmetic (scale_ints)
DUTY_PCT = const((100000, 65535, 3))
GAIN = const((1, 1, 3))  # milli-gain -> gain
RAW = const(None)

# --- enumerations (append-only) ---------------------------------------------
STATES = const(("BOOT", "HOSTED", "STANDALONE", "FAILSAFE", "MANUAL"))
STATE_BOOT = const(0)
STATE_HOSTED = const(1)
STATE_STANDALONE = const(2)
STATE_FAILSAFE = const(3)
STATE_MANUAL = const(4)

# Reason codes: why a state was entered, what an event reports.
REASONS = const(
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
REASON_NONE = const(0)
REASON_BOOT = const(1)
REASON_HOST_OK = const(2)
REASON_HOST_TIMEOUT = const(3)
REASON_SENSOR_OPEN = const(4)
REASON_SENSOR_SHORT = const(5)
REASON_SENSOR_STALE = const(6)
REASON_FAN_STALL = const(7)
REASON_OVER_TEMP = const(8)
REASON_CRITICAL_TEMP = const(9)
REASON_UNDER_VOLTAGE = const(10)
REASON_POWER_MONITOR_FAULT = const(11)
REASON_MANUAL_OVERRIDE = const(12)
REASON_CONFIG_CORRUPT = const(13)
REASON_CONFIG_SAVED = const(14)
REASON_WATCHDOG_RESET = const(15)
REASON_CLEARED = const(16)
REASON_SELFTEST = const(17)
REASON_CALIBRATION = const(18)
REASON_MANUAL_EXPIRED = const(19)
REASON_TACH_IMPLAUSIBLE = const(20)
REASON_SENSOR_STUCK = const(21)
REASON_SENSOR_IMPLAUSIBLE = const(22)
REASON_CONFIG_FALLBACK = const(23)
REASON_UNAUTHORIZED = const(24)
REASON_INTERNAL_ERROR = const(25)
REASON_PAIRED = const(26)
REASON_AUTOTUNE = const(27)

SEVERITIES = const(("info", "warning", "alarm", "critical"))
SEV_INFO = const(0)
SEV_WARNING = const(1)
SEV_ALARM = const(2)
SEV_CRITICAL = const(3)

# NACK error codes.
ERRORS = const(
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
ERR_OK = const(0)
ERR_MALFORMED = const(1)
ERR_VERSION = const(2)
ERR_UNKNOWN_TYPE = const(3)
ERR_MISSING_FIELD = const(4)
ERR_BAD_TYPE = const(5)
ERR_OUT_OF_RANGE = const(6)
ERR_BAD_STATE = const(7)
ERR_BUSY = const(8)
ERR_STORAGE = const(9)
ERR_UNSUPPORTED = const(10)
ERR_INTERNAL = const(11)
ERR_DIRECTION = const(12)
ERR_UNAUTHORIZED = const(13)
ERR_RATE_LIMITED = const(14)

# Relay autotune (device/control/autotune.py): where a test is, or why it stopped.
TUNE_STATUS = const(
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
TUNE_IDLE = const(0)
TUNE_RUNNING = const(1)
TUNE_DONE = const(2)
TUNE_ABORTED = const(3)
TUNE_SAFETY = const(4)
TUNE_NOT_HOSTED = const(5)
TUNE_TOO_HOT = const(6)
TUNE_TIMEOUT = const(7)
TUNE_FLOOR = const(8)
TUNE_INCONSISTENT = const(9)
TUNE_ACTIONS = const(("start", "abort"))

CHANNELS = const(("gpu", "vram", "mos", "amb"))  # NTC channels, index order
FAN_MODES = const(("auto", "manual", "curve"))
CAL_MODELS = const(("sh", "beta", "poly"))

# Telemetry ``faults`` bitmask.
FAULT_NTC_GPU = const(1 << 0)
FAULT_NTC_VRAM = const(1 << 1)
FAULT_NTC_MOS = const(1 << 2)
FAULT_NTC_AMB = const(1 << 3)
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
FAULT_BITS = const(
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
TEMP_MIN_MC = const(-55000)
TEMP_MAX_MC = const(200000)
DUTY_MAX = const(65535)
U16 = const(0xFFFF)
U32 = const(0xFFFFFFFF)
I32_MIN = const(-0x80000000)
I32_MAX = const(0x7FFFFFFF)

# --- messages -------------------------------------------------------------------
# Directions
D2H = const("d2h")  # module -> host
H2D = const("h2d")  # host -> module

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


F_KEY = const(0)
F_NAME = const(1)
F_KIND = const(2)
F_REQUIRED = const(3)
F_LO = const(4)
F_HI = const(5)
F_SCALE = const(6)
F_UNIT = const(7)

T_HELLO = const(0x01)
T_HELLO_REQUEST = const(0x02)
T_TELEMETRY = const(0x10)
T_EVENT = const(0x11)
T_CAL_RAW = const(0x12)
T_CONFIG = const(0x13)
T_ACK = const(0x14)
T_NACK = const(0x15)
T_HEARTBEAT = const(0x20)
T_FAN_MODE = const(0x30)
T_SETPOINTS = const(0x31)
T_PID_GAINS = const(0x32)
T_FAN_CURVE = const(0x33)
T_CONFIG_GET = const(0x40)
T_CONFIG_SET = const(0x41)
T_CONFIG_SAVE = const(0x42)
T_CONFIG_RESET = const(0x43)
T_CAL_READ = const(0x50)
T_CAL_WRITE = const(0x51)
T_SELFTEST_REPORT = const(0x16)
T_REBOOT = const(0x60)
T_REPL = const(0x61)
T_SELFTEST = const(0x62)
T_PAIR = const(0x63)
T_AUTOTUNE = const(0x34)
T_AUTOTUNE_REPORT = const(0x17)


# frozen-ints: compared only
MESSAGES = (
    (
        T_HELLO,
        "hello",
        D2H,
        (
            (0, "fw_version", K_STR, True, 1, 32, None, ""),
            (1, "proto_minor", K_UINT, True, 0, 255, None, ""),
            (2, "board", K_STR, True, 1, 32, None, ""),
            (3, "uid", K_STR, True, 1, 64, None, ""),
            (4, "channels", K_LIST, True, 0, 8, None, ""),
            (5, "fans", K_UINT, True, 0, 8, None, ""),
            (6, "max_frame", K_UINT, True, 64, 4096, None, "B"),
            (7, "telemetry_ms", K_UINT, False, 0, 60000, None, "ms"),
            (8, "state", K_ENUM, False, 0, 255, STATES, ""),
            (9, "ref", K_UINT, False, 0, U16, None, ""),
            (10, "nonce", K_BYTES, False, 8, 8, None, ""),
            (11, "paired", K_BOOL, False, None, None, None, ""),
        ),
    ),
    (T_HELLO_REQUEST, "hello_request", H2D, ()),
    (
        T_TELEMETRY,
        "telemetry",
        D2H,
        (
            (0, "uptime_s", K_UINT, False, 0, U32, None, "s"),
            (1, "state", K_ENUM, True, 0, 255, STATES, ""),
            (2, "reason", K_ENUM, False, 0, 255, REASONS, ""),
            (3, "faults", K_UINT, False, 0, U32, None, ""),
            (4, "temp_gpu", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
            (5, "temp_vram", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
            (6, "temp_mos", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
            (7, "temp_amb", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
            (8, "fan1_rpm", K_UINT, False, 0, 100000, None, "RPM"),
            (9, "fan2_rpm", K_UINT, False, 0, 100000, None, "RPM"),
            (10, "fan1_duty", K_UINT, False, 0, DUTY_MAX, DUTY_PCT, "1/65535"),
            (11, "fan2_duty", K_UINT, False, 0, DUTY_MAX, DUTY_PCT, "1/65535"),
            (12, "v_in", K_UINT, False, 0, 40000, MILLI, "mV"),
            (13, "i_in", K_INT, False, -100000, 100000, MILLI, "mA"),
            (14, "p_in", K_INT, False, 0, 4000000, MILLI, "mW"),
            (15, "target", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
            (16, "flash_writes", K_UINT, False, 0, U32, None, ""),
            (17, "auth_failures", K_UINT, False, 0, U32, None, ""),
            (18, "internal_errors", K_UINT, False, 0, U32, None, ""),
        ),
    ),
    (
        T_EVENT,
        "event",
        D2H,
        (
            (0, "code", K_ENUM, True, 0, 255, REASONS, ""),
            (1, "severity", K_ENUM, True, 0, 3, SEVERITIES, ""),
            (2, "active", K_BOOL, False, None, None, None, ""),
            (3, "state", K_ENUM, False, 0, 255, STATES, ""),
            (4, "prev_state", K_ENUM, False, 0, 255, STATES, ""),
            (5, "index", K_INT, False, -1, 255, None, ""),
            (6, "value", K_INT, False, I32_MIN, I32_MAX, None, ""),
            (7, "text", K_STR, False, 0, 96, None, ""),
            (8, "uptime_s", K_UINT, False, 0, U32, None, "s"),
        ),
    ),
    (
        T_CAL_RAW,
        "cal_raw",
        D2H,
        (
            (0, "ref", K_UINT, True, 0, U16, None, ""),
            (1, "channel", K_UINT, True, 0, 7, None, ""),
            (2, "samples", K_UINT, True, 1, 65535, None, ""),
            (3, "raw_mean_x16", K_UINT, True, 0, 65535 * 16, None, "ADC/16"),
            (4, "raw_min", K_UINT, True, 0, 65535, None, "ADC"),
            (5, "raw_max", K_UINT, True, 0, 65535, None, "ADC"),
            (6, "ohms", K_UINT, False, 0, U32, None, "ohm"),
            (7, "temp", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
        ),
    ),
    (
        T_CONFIG,
        "config",
        D2H,
        (
            (0, "ref", K_UINT, True, 0, U16, None, ""),
            (1, "values", K_MAP, True, 0, 64, None, ""),
            (2, "version", K_UINT, False, 0, U16, None, ""),
        ),
    ),
    (
        T_ACK,
        "ack",
        D2H,
        (
            (0, "ref", K_UINT, True, 0, U16, None, ""),
            (1, "ref_type", K_UINT, True, 0, 255, None, ""),
        ),
    ),
    (
        T_NACK,
        "nack",
        D2H,
        (
            (0, "ref", K_UINT, True, 0, U16, None, ""),
            (1, "ref_type", K_UINT, True, 0, 255, None, ""),
            (2, "code", K_ENUM, True, 0, 255, ERRORS, ""),
            (3, "field", K_STR, False, 0, 32, None, ""),
            (4, "text", K_STR, False, 0, 96, None, ""),
        ),
    ),
    (
        T_HEARTBEAT,
        "heartbeat",
        H2D,
        (
            (0, "gpu_temp", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
            (1, "gpu_power", K_UINT, False, 0, 4000000, MILLI, "mW"),
            (2, "power_limit", K_UINT, False, 0, 4000000, MILLI, "mW"),
            (3, "host_time", K_UINT, False, 0, U32, None, "s"),
            (4, "gpu_mem_temp", K_INT, False, TEMP_MIN_MC, TEMP_MAX_MC, MILLI, "m degC"),
            (5, "period_ms", K_UINT, False, 0, 600000, None, "ms"),
            (6, "gpu_slowdown", K_INT, False, 40000, 125000, MILLI, "m degC"),
        ),
    ),
    (
        T_FAN_MODE,
        "fan_mode",
        H2D,
        (
            (0, "mode", K_ENUM, True, 0, 2, FAN_MODES, ""),
            (1, "duty1", K_UINT, False, 0, DUTY_MAX, DUTY_PCT, "1/65535"),
            (2, "duty2", K_UINT, False, 0, DUTY_MAX, DUTY_PCT, "1/65535"),
        ),
    ),
    (
        T_SETPOINTS,
        "setpoints",
        H2D,
        (
            (0, "sp_gpu", K_INT, False, 20000, 110000, MILLI, "m degC"),
            (1, "sp_vram", K_INT, False, 20000, 110000, MILLI, "m degC"),
            (2, "sp_mos", K_INT, False, 20000, 125000, MILLI, "m degC"),
            (3, "sp_amb", K_INT, False, 10000, 60000, MILLI, "m degC"),
        ),
    ),
    (
        T_PID_GAINS,
        "pid_gains",
        H2D,
        (
            (0, "kp", K_INT, False, 0, 1000000, GAIN, "m %/degC"),
            (1, "ki", K_INT, False, 0, 1000000, GAIN, "m %/(degC s)"),
            (2, "kd", K_INT, False, 0, 1000000, GAIN, "m % s/degC"),
            (3, "kff", K_INT, False, 0, 1000000, GAIN, "m %/W"),
        ),
    ),
    (
        T_FAN_CURVE,
        "fan_curve",
        H2D,
        (
            (0, "points", K_LIST, True, 2, 16, None, ""),
            (1, "hysteresis", K_UINT, False, 0, 20000, MILLI, "m degC"),
        ),
    ),
    (T_CONFIG_GET, "config_get", H2D, ((0, "section", K_STR, False, 0, 32, None, ""),)),
    (T_CONFIG_SET, "config_set", H2D, ((0, "values", K_MAP, True, 1, 64, None, ""),)),
    (T_CONFIG_SAVE, "config_save", H2D, ()),
    (T_CONFIG_RESET, "config_reset", H2D, ()),
    (
        T_CAL_READ,
        "cal_read",
        H2D,
        (
            (0, "channel", K_UINT, True, 0, 7, None, ""),
            (1, "samples", K_UINT, False, 1, 4096, None, ""),
        ),
    ),
    (
        T_CAL_WRITE,
        "cal_write",
        H2D,
        (
            (0, "channel", K_UINT, True, 0, 7, None, ""),
            (1, "model", K_ENUM, True, 0, 2, CAL_MODELS, ""),
            (2, "coeffs", K_LIST, True, 1, 8, None, ""),
            (3, "correction", K_LIST, False, 0, 8, None, ""),
        ),
    ),
    (
        T_SELFTEST_REPORT,
        "selftest_report",
        D2H,
        (
            (0, "ref", K_UINT, True, 0, U16, None, ""),
            (1, "passed", K_BOOL, True, None, None, None, ""),
            (2, "fan1_rpm", K_LIST, False, 0, 8, None, ""),
            (3, "fan2_rpm", K_LIST, False, 0, 8, None, ""),
            (4, "fans_ok", K_LIST, False, 0, 8, None, ""),
            (5, "channels_ok", K_LIST, False, 0, 8, None, ""),
            (6, "power_monitor_ok", K_BOOL, False, None, None, None, ""),
            (7, "v_in", K_UINT, False, 0, 40000, MILLI, "mV"),
            (8, "text", K_STR, False, 0, 96, None, ""),
        ),
    ),
    (T_REBOOT, "reboot", H2D, ()),
    (T_REPL, "repl", H2D, ()),
    # abort (1.x, append-only): end a running self-test now, fans back to the controller
    (T_SELFTEST, "selftest", H2D, ((0, "abort", K_BOOL, False, None, None, None, ""),)),
    (T_PAIR, "pair", H2D, ((0, "key", K_BYTES, True, 32, 32, None, ""),)),
    (
        T_AUTOTUNE,
        "autotune",
        H2D,
        (
            (0, "action", K_ENUM, True, 0, 1, TUNE_ACTIONS, ""),
            (1, "amplitude", K_UINT, False, 3277, 32767, DUTY_PCT, "1/65535"),
            (2, "hysteresis", K_UINT, False, 50, 5000, MILLI, "m degC"),
            (3, "max_rise", K_UINT, False, 1000, 20000, MILLI, "m degC"),
            (4, "timeout_s", K_UINT, False, 60, 7200, None, "s"),
            (5, "cycles", K_UINT, False, 2, 8, None, ""),
        ),
    ),
    (
        T_AUTOTUNE_REPORT,
        "autotune_report",
        D2H,
        (
            (0, "ref", K_UINT, True, 0, U16, None, ""),
            (1, "status", K_ENUM, True, 0, 255, TUNE_STATUS, ""),
            (2, "cycles", K_UINT, False, 0, 255, None, ""),
            (3, "elapsed_s", K_UINT, False, 0, U32, None, "s"),
            (4, "bias", K_UINT, False, 0, DUTY_MAX, DUTY_PCT, "1/65535"),
            (5, "relay", K_UINT, False, 0, DUTY_MAX, DUTY_PCT, "1/65535"),
            (6, "period_ms", K_UINT, False, 0, U32, None, "ms"),
            (7, "amplitude", K_UINT, False, 0, 200000, MILLI, "m degC"),
            (8, "causes", K_UINT, False, 0, 255, None, ""),
            (9, "ku", K_UINT, False, 0, 1000000, GAIN, "m %/degC"),
            (10, "pu_ms", K_UINT, False, 0, U32, None, "ms"),
            (11, "kp", K_INT, False, 0, 1000000, GAIN, "m %/degC"),
            (12, "ki", K_INT, False, 0, 1000000, GAIN, "m %/(degC s)"),
            (13, "kd", K_INT, False, 0, 1000000, GAIN, "m % s/degC"),
            (14, "center", K_INT, False, -200000, 200000, MILLI, "m degC"),
        ),
    ),
)

M_TYPE = const(0)
M_NAME = const(1)
M_DIR = const(2)
M_FIELDS = const(3)


# Applying a scale (protocol.jsonl and protocol.telemetry, one table of powers for both).
# From a list: a constant tuple's ints above 0x1FFF freeze as big ints
# (tests/test_frozen_ints.py).
_POW10 = tuple([1, 10, 100, 1000, 10000, 100000, 1000000])


def mul_div_round(v, mul, div):
    """round(v * mul / div), half up, for v >= 0; intermediates stay below 2**30 for
    v < 2**16 and mul a multiple of 1000 up to 10**6 (the duty scale) so the MCU never
    makes a big int.

    >>> mul_div_round(30000, 100000, 65535)
    45777
    """
    if mul > 1000:
        x = v * (mul // 1000)
        hi = x // div  # not divmod(): a tuple would allocate
        r = x - hi * div
        return hi * 1000 + (r * 2000 + div) // (2 * div)
    return (v * mul * 2 + div) // (2 * div)


def scale_ints(scale):
    """A JSON display scale ``(mul, div, decimals)`` with small ints on the MCU
    (frozen, its ints above 0x1FFF are big ints: see DUTY_PCT). Allocates."""
    return tuple([int(str(v)) for v in scale])


def by_type(type_id):
    """Message definition for a type id, or None."""
    for m in MESSAGES:
        if m[M_TYPE] == type_id:
            return m
    return None


def by_name(name):
    """Message definition for a name, or None."""
    for m in MESSAGES:
        if m[M_NAME] == name:
            return m
    return None


def field_index(msg_def, name):
    """Index of field ``name`` in a message definition, or -1."""
    fields = msg_def[M_FIELDS]
    i = 0
    while i < len(fields):
        if fields[i][F_NAME] == name:
            return i
        i += 1
    return -1
