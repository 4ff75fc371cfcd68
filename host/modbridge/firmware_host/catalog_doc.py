"""Descriptions of the protocol messages and fields (host-only; never flashed).

The prose half of :mod:`protocol.catalog`: ``DOCS[name]`` says what a message is for,
``DOCS[(name, field)]`` what one of its fields means ("" where the name, type, unit
and range already say it all). :mod:`modbridge.firmware_host.specgen` renders them
into SPEC.md; the module never needs them, so they are not flashed (they are not in
firmware/allowlist.py) and cost no RAM there. tests/test_catalog.py checks that every
message and field of the catalog has an entry here, and that nothing here names a
message or field the catalog does not have.
"""

DOCS = {
    "hello": "Capabilities; sent after the boot banner and in answer to hello_request.",
    ("hello", "fw_version"): "firmware version, e.g. 1.0.0",
    ("hello", "proto_minor"): "protocol minor version spoken",
    ("hello", "board"): "board module name, e.g. pyboard_v11",
    ("hello", "uid"): "MCU unique id, lowercase hex",
    ("hello", "channels"): "NTC channel names in index order",
    ("hello", "fans"): "number of fans",
    ("hello", "max_frame"): "largest frame accepted",
    ("hello", "telemetry_ms"): "telemetry period",
    ("hello", "state"): "current state",
    ("hello", "ref"): "seq of the hello_request it answers; absent in the boot hello",
    ("hello", "nonce"): "random per boot; every signature covers it (no replay across boots)",
    ("hello", "paired"): "a signing secret is provisioned",
    "hello_request": "Ask the module for its hello.",
    "telemetry": "Periodic readings. A faulted sensor's field is absent, never a made-up value.",
    ("telemetry", "uptime_s"): "seconds since boot",
    ("telemetry", "state"): "control state",
    ("telemetry", "reason"): "why the state was entered",
    ("telemetry", "faults"): "active faults, bitmask FAULT_*",
    ("telemetry", "temp_gpu"): "GPU core NTC",
    ("telemetry", "temp_vram"): "VRAM NTC",
    ("telemetry", "temp_mos"): "power MOSFET NTC",
    ("telemetry", "temp_amb"): "ambient NTC",
    ("telemetry", "fan1_rpm"): "fan 1 speed",
    ("telemetry", "fan2_rpm"): "fan 2 speed",
    ("telemetry", "fan1_duty"): "fan 1 PWM",
    ("telemetry", "fan2_duty"): "fan 2 PWM",
    ("telemetry", "v_in"): "12 V input bus voltage",
    ("telemetry", "i_in"): "12 V input current",
    ("telemetry", "p_in"): "12 V input power",
    ("telemetry", "target"): "controlled error: worst channel temperature minus its setpoint",
    ("telemetry", "flash_writes"): "config writes to flash over the module's life",
    ("telemetry", "auth_failures"): "commands refused as unsigned, forged or replayed, since boot",
    ("telemetry", "internal_errors"): "commands answered nack internal since boot",
    "event": "An alarm or state transition; sent once per transition, never repeated per tick.",
    ("event", "code"): "what happened",
    ("event", "severity"): "",
    ("event", "active"): "true: condition raised, false: cleared",
    ("event", "state"): "state after the event",
    ("event", "prev_state"): "state before the event",
    ("event", "index"): "channel or fan index, -1 = none",
    ("event", "value"): "the value that caused it",
    ("event", "text"): "short human-readable detail",
    ("event", "uptime_s"): "",
    "cal_raw": "Averaged raw ADC reading of one channel, for calibration.",
    ("cal_raw", "ref"): "seq of the cal_read it answers",
    ("cal_raw", "channel"): "",
    ("cal_raw", "samples"): "",
    ("cal_raw", "raw_mean_x16"): "mean ADC code in 1/16 LSB",
    ("cal_raw", "raw_min"): "",
    ("cal_raw", "raw_max"): "",
    ("cal_raw", "ohms"): "NTC resistance at the mean",
    ("cal_raw", "temp"): "temperature, current coeffs",
    "config": "Config values (all, or the requested section).",
    ("config", "ref"): "seq of the config_get it answers",
    ("config", "values"): "config keys and values",
    ("config", "version"): "config schema version",
    "ack": "Command accepted and applied.",
    ("ack", "ref"): "seq of the command",
    ("ack", "ref_type"): "type of the command",
    "nack": "Command refused; nothing changed on the module.",
    ("nack", "ref"): "seq of the command (0 if unknown)",
    ("nack", "ref_type"): "type of the command (0 if unknown)",
    ("nack", "code"): "error code",
    ("nack", "field"): "offending field",
    ("nack", "text"): "what is wrong, for a human",
    "heartbeat": "Host is alive; GPU readings for feed-forward and cross-checks. Absent = unknown.",
    ("heartbeat", "gpu_temp"): "GPU core (NVML)",
    ("heartbeat", "gpu_power"): "GPU board power",
    ("heartbeat", "power_limit"): "enforced limit",
    ("heartbeat", "host_time"): "host Unix time",
    ("heartbeat", "gpu_mem_temp"): "GPU memory",
    ("heartbeat", "period_ms"): "host heartbeat period (informs the module's timeout)",
    ("heartbeat", "gpu_slowdown"): (
        "GPU's own slowdown temperature (NVML SLOWDOWN / GPU_MAX, the lower): the GPU "
        "channel's warn/crit limits follow it down"
    ),
    "fan_mode": "Select the control mode; manual duty is still floored by the safety floor.",
    ("fan_mode", "mode"): "auto: PID; manual: duty1/duty2; curve: the fan curve",
    ("fan_mode", "duty1"): "manual duty fan 1",
    ("fan_mode", "duty2"): "manual duty fan 2",
    "setpoints": "Per-channel control setpoints; absent fields are unchanged.",
    ("setpoints", "sp_gpu"): "",
    ("setpoints", "sp_vram"): "",
    ("setpoints", "sp_mos"): "",
    ("setpoints", "sp_amb"): "",
    "pid_gains": "PID gains in milli-units; absent fields are unchanged.",
    ("pid_gains", "kp"): "proportional",
    ("pid_gains", "ki"): "integral",
    ("pid_gains", "kd"): "derivative",
    ("pid_gains", "kff"): "GPU-power feed-forward",
    "fan_curve": "Piecewise-linear fan curve used in curve mode and STANDALONE.",
    ("fan_curve", "points"): "[[temp m degC, duty 1/65535], ...] ascending in temperature",
    ("fan_curve", "hysteresis"): "",
    "config_get": "Read config; answered with a config message.",
    ("config_get", "section"): "config section; absent = all",
    "config_set": "Change config in RAM (validated as a whole); config_save persists it.",
    ("config_set", "values"): "keys and new values",
    "config_save": "Write the running config to flash atomically.",
    "config_reset": "Factory defaults, in RAM and in flash.",
    "cal_read": "Sample one channel; answered with cal_raw.",
    ("cal_read", "channel"): "",
    ("cal_read", "samples"): "ADC samples to average (default 64)",
    "cal_write": "Write calibration coefficients of one channel (floats allowed here).",
    ("cal_write", "channel"): "",
    ("cal_write", "model"): "sh: Steinhart-Hart; beta; poly: correction only",
    ("cal_write", "coeffs"): "sh: [A, B, C]; beta: [beta, r0_ohm, t0_mc]; poly: [c0, c1, ...]",
    ("cal_write", "correction"): "polynomial correction in degC, lowest order first",
    "selftest_report": (
        "Result of a self-test, sent when it finishes: 30-40 s after the ack with healthy "
        "fans, at most 60 s (4 steps of at most 15 s, or 10 RPM windows if longer)."
    ),
    ("selftest_report", "ref"): "seq of the selftest it answers",
    ("selftest_report", "passed"): "every part passed",
    ("selftest_report", "fan1_rpm"): "fan 1 settled RPM at each duty step",
    ("selftest_report", "fan2_rpm"): "fan 2 settled RPM at each duty step",
    ("selftest_report", "fans_ok"): "per fan: settled at every step, as its fan model expects",
    ("selftest_report", "channels_ok"): "per NTC channel: valid and in range",
    ("selftest_report", "power_monitor_ok"): "INA226 answered, 12 V in range",
    ("selftest_report", "v_in"): "12 V input during the test",
    ("selftest_report", "text"): (
        "summary for a human: the failed parts, a fan with why (stalled, weak, tach "
        "implausible, untested) at which duty"
    ),
    "reboot": "Acknowledge, then reset the MCU.",
    "repl": "Acknowledge, then hand the port back to the MicroPython REPL.",
    "selftest": (
        "Burn-in style self-test: fans 100/75/50/25 % (the safety floor still applies), "
        "each step held until the tach readings agree, each fan judged against its fan "
        "model (docs/firmware.md 'Self-test'); every channel range-checked, the INA226 "
        "read. Acked at once; selftest_report follows. With abort true (minor 1.x): "
        "the running self-test ends now, its report (passed false, text 'aborted by "
        "the host') answers it, the fans go back to the controller; acked either way."
    ),
    "pair": (
        "Provision the 32-byte signing secret. Signed with the old secret, or unsigned "
        "during the pairing window (the first 60 s after power-on of a module that has "
        "no secret yet); see 'Signed commands' in SPEC.md."
    ),
    ("pair", "key"): "the new secret (32 bytes)",
    "autotune": (
        "Start or abort a relay autotune (docs/autotune.md): the PID is replaced by the "
        "current duty until the temperature is steady, then by a relay about that "
        "temperature until the oscillation's period and amplitude "
        "agree over `cycles` cycles; acked at once, autotune_report follows per cycle. "
        "Needs HOSTED in auto mode; aborted by any safety cause. Gains are not applied: "
        "the host writes them with pid_gains."
    ),
    ("autotune", "action"): "start or abort",
    ("selftest", "abort"): "true: end the running self-test now (the host's Ctrl-C)",
    ("autotune", "amplitude"): "relay half-amplitude d (default 20 %)",
    ("autotune", "hysteresis"): "relay hysteresis on the error (default 0.3 degC)",
    ("autotune", "max_rise"): "abort above setpoint + this (default 8 degC)",
    ("autotune", "timeout_s"): "abort after this long (default 1800 s)",
    ("autotune", "cycles"): "agreeing cycles needed (default 3)",
    "autotune_report": (
        "Progress (status running, one per measured cycle) and result of an autotune."
    ),
    ("autotune_report", "ref"): "seq of the autotune start it answers",
    ("autotune_report", "status"): "running, done or why it stopped",
    ("autotune_report", "cycles"): "cycles measured so far",
    ("autotune_report", "elapsed_s"): "time since the start",
    ("autotune_report", "bias"): "relay centre duty",
    ("autotune_report", "relay"): "relay half-amplitude d",
    ("autotune_report", "period_ms"): "last cycle's period",
    ("autotune_report", "amplitude"): "last cycle's amplitude a (0: too small or clipped)",
    ("autotune_report", "causes"): "safety CAUSE_* bits that aborted it",
    ("autotune_report", "ku"): "ultimate gain 4d/(pi a)",
    ("autotune_report", "pu_ms"): "ultimate period",
    ("autotune_report", "kp"): "Tyreus-Luyben Ku/3.2",
    ("autotune_report", "ki"): "kp / (2.2 Pu)",
    ("autotune_report", "kd"): "0 (PI rule)",
    ("autotune_report", "center"): "error the relay switches about (after holding the bias)",
}


def message_doc(name):
    """What message ``name`` is for (KeyError if the catalog has no such message)."""
    return DOCS[name]


def field_doc(message, field):
    """What ``field`` of ``message`` means; "" when its table row says it all."""
    return DOCS[(message, field)]
