"""What is exported: every metric family, in exposition order (the table to read first).

``FAMILIES`` holds, per family, its attribute (the key walk.py fills), type, name,
labels and help; docs/metrics.md lists the same metrics for operators. Everything is
in base units with one ``modbridge_`` prefix. :func:`_family` makes the empty
prometheus_client family of a row: collector.py fills it, render.py has
prometheus_client write its header and sample prefixes once.

Choices worth knowing (docs/metrics.md says more):

* One-hot "state set" metrics (module state, fault bits, policy level, GPU state) are
  gauges with an explicit label (``state``, ``fault``, ``level``), the way
  kube-state-metrics does it. prometheus_client's StateSetMetricFamily would name the
  label after the metric (``modbridge_module_state{modbridge_module_state="..."}``)
  and is exposed as a plain gauge in the Prometheus text format anyway.
* GPU power limits are separate metrics (``..._power_limit_watts``,
  ``..._power_limit_default_watts``, ``_min_``, ``_max_``, ``_original_``), not one
  metric with a ``kind`` label: summing or averaging across such a label would be
  meaningless, which is the Prometheus rule for splitting a metric.
"""

from __future__ import annotations

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from modbridge.gpu.base import GpuError

# Base units (plus rpm and ratio) a gauge name may end with; docs/metrics.md.
UNITS = ("celsius", "volts", "amperes", "watts", "seconds", "rpm", "ratio")
POLICY_LEVELS = ("NORMAL", "WARN", "CRITICAL")  # PairState.level 0, 1, 2
# PairState.actions_total keys (actuator.py); others it may add are exported too
POLICY_ACTIONS = ("lower", "restore", "refused", "failed", "dry_run")


def _gpu_states() -> tuple[str, ...]:
    """The state "ok" plus every GpuError.state the backends can report."""
    seen, todo = [], [GpuError]
    while todo:
        cls = todo.pop()
        if cls.state not in seen:
            seen.append(cls.state)
        todo.extend(cls.__subclasses__())
    return ("ok",) + tuple(sorted(seen))


GPU_STATES = _gpu_states()


# label sets
_M, _MC, _MF = ("module",), ("module", "channel"), ("module", "fan")
_G, _P = ("gpu",), ("module", "gpu")

# (attribute, type, name, labels, help). Order = exposition order. Counter names are
# given without ``_total`` and info names without ``_info``: the client appends them.
FAMILIES = (
    # bridge
    ("build_info", "info", "modbridge_build", ("version", "backend"),
     "modbridge version and the GPU backend in use."),
    ("snapshot_age", "gauge", "modbridge_scrape_snapshot_age_seconds", (),
     "Age of the bridge snapshot this scrape read (grows if the bridge loop stalls)."),
    # module
    ("m_info", "info", "modbridge_module",
     ("module", "port", "firmware", "protocol", "board", "gpu", "gpu_name"),
     "Module identity: port, firmware, protocol, board, paired GPU."),
    ("m_up", "gauge", "modbridge_module_up", ("module", "port"),
     "1 if the serial link to the module is up."),
    ("m_age", "gauge", "modbridge_module_last_frame_age_seconds", _M,
     "Seconds since the last valid frame from the module."),
    ("m_frames", "counter", "modbridge_module_frames", _M,
     "Valid frames received from the module."),
    ("m_frame_errors", "counter", "modbridge_module_frame_errors", ("module", "kind"),
     "Bad frames from the module, by decoder error kind."),
    ("m_reconnects", "counter", "modbridge_module_reconnects", _M,
     "Times the serial link was reopened."),
    ("m_resets", "counter", "modbridge_module_resets", _M,
     "Module resets seen while connected (boot banner or unsolicited hello)."),
    ("m_events", "counter", "modbridge_module_events", ("module", "reason"),
     "Event frames from the module, by reason."),
    ("m_temp", "gauge", "modbridge_module_temperature_celsius", _MC,
     "NTC temperature; absent while the sensor is faulted."),
    ("m_fan_rpm", "gauge", "modbridge_module_fan_speed_rpm", _MF,
     "Fan speed from the tachometer."),
    ("m_fan_duty", "gauge", "modbridge_module_fan_duty_ratio", _MF,
     "Commanded fan PWM duty, 0..1."),
    ("m_volts", "gauge", "modbridge_module_input_volts", _M, "12 V input bus voltage (INA226)."),
    ("m_amps", "gauge", "modbridge_module_input_amperes", _M, "12 V input current (INA226)."),
    ("m_watts", "gauge", "modbridge_module_input_watts", _M, "12 V input power (INA226)."),
    ("m_state", "gauge", "modbridge_module_state", ("module", "state"),
     "Firmware fail-safe state, one-hot: 1 for the current state."),
    ("m_fault", "gauge", "modbridge_module_fault", ("module", "fault"),
     "Fault bits reported in telemetry, 0/1."),
    # gpu
    ("g_info", "info", "modbridge_gpu", ("gpu", "name", "pci_bus_id"), "GPU identity."),
    ("g_up", "gauge", "modbridge_gpu_up", _G, "1 if the GPU could be read at the last sample."),
    ("g_state", "gauge", "modbridge_gpu_state", ("gpu", "state"),
     "GPU backend state, one-hot (ok, lost, no_permission, ...)."),
    ("g_temp", "gauge", "modbridge_gpu_temperature_celsius", _G, "GPU core temperature."),
    ("g_mem_temp", "gauge", "modbridge_gpu_memory_temperature_celsius", _G,
     "GPU memory temperature; absent where NotSupported."),
    ("g_slowdown", "gauge", "modbridge_gpu_slowdown_temperature_celsius", _G,
     "The GPU's own slowdown temperature threshold."),
    ("g_shutdown", "gauge", "modbridge_gpu_shutdown_temperature_celsius", _G,
     "The GPU's own shutdown temperature threshold."),
    ("g_max_op", "gauge", "modbridge_gpu_max_operating_temperature_celsius", _G,
     "The GPU's maximum operating temperature."),
    ("g_power", "gauge", "modbridge_gpu_power_watts", _G, "GPU power draw."),
    ("g_limit", "gauge", "modbridge_gpu_power_limit_watts", _G,
     "Enforced GPU power limit, read back from the driver."),
    ("g_limit_default", "gauge", "modbridge_gpu_power_limit_default_watts", _G,
     "GPU default power limit."),
    ("g_limit_min", "gauge", "modbridge_gpu_power_limit_min_watts", _G,
     "Lowest power limit the driver accepts."),
    ("g_limit_max", "gauge", "modbridge_gpu_power_limit_max_watts", _G,
     "Highest power limit the driver accepts."),
    ("g_limit_original", "gauge", "modbridge_gpu_power_limit_original_watts", _G,
     "Power limit saved at bridge start; restored on exit."),
    ("g_clocks", "gauge", "modbridge_gpu_clocks_event_reason", ("gpu", "reason"),
     "NVML clocks event (throttle) reasons, 0/1 per reason."),
    ("g_util", "gauge", "modbridge_gpu_utilization_ratio", _G, "GPU utilization, 0..1."),
    ("g_fan", "gauge", "modbridge_gpu_fan_speed_ratio", _G,
     "GPU's own fan speed, 0..1; absent on fanless GPUs."),
    # policy
    ("p_level", "gauge", "modbridge_policy_level", _P,
     "Policy level: 0 NORMAL, 1 WARN, 2 CRITICAL."),
    ("p_state", "gauge", "modbridge_policy_state", ("module", "gpu", "level"),
     "Policy level, one-hot."),
    ("p_actions", "counter", "modbridge_policy_actions", ("module", "gpu", "action"),
     "Power-limit actions taken by the policy, by action."),
    ("p_refused", "counter", "modbridge_policy_limit_writes_refused", _P,
     "Power-limit writes the driver refused."),
    ("p_eta", "gauge", "modbridge_policy_time_to_threshold_seconds", _P,
     "Predicted time until the warn threshold; absent without a prediction."),
    ("p_target", "gauge", "modbridge_policy_target_limit_watts", _P,
     "Power limit the policy wants (the original limit when not lowering)."),
    # the chassis model (modbridge.chassis; docs/control.md, "The chassis model")
    ("c_converged", "gauge", "modbridge_chassis_model_converged", _M,
     "1 once the module's probe-to-die model has converged (its parameters can be sent)."),
    ("c_unc", "gauge", "modbridge_chassis_model_uncertainty_celsius", _M,
     "The probe-to-die model's held-out residual p95 (model.unc_mc)."),
    ("c_ttt", "gauge", "modbridge_time_to_throttle_seconds", ("module", "cooling"),
     "Predicted seconds until the die reaches the GPU's slowdown at the current power, "
     "fans as now (cooling=current) or at 100 % (cooling=full); +Inf: never."),
    ("c_ratio", "gauge", "modbridge_airflow_conductance_ratio", _M,
     "Airflow conductance at the same duty over its baseline (the first day)."),
    ("c_fan_ratio", "gauge", "modbridge_fan_speed_at_duty_ratio", _MF,
     "A fan's speed at a given duty over its baseline (RPM per duty; falls as it wears)."),
    ("c_degraded", "gauge", "modbridge_cooling_degraded", ("module", "cause"),
     "1 while cooling_degraded is raised, by cause (dust, fan_wear)."),
    ("c_days", "gauge", "modbridge_cooling_time_to_throttle_at_trend_seconds", _M,
     "At the airflow conductance's trend, time until the highest power seen would "
     "throttle with the fans at 100 %; +Inf: not falling."),
    ("c_inlet", "gauge", "modbridge_chassis_inlet_temperature_celsius", _M,
     "Inlet (room) temperature: the ambient probe less its learned load-driven rise."),
)  # fmt: skip
COOLING_CAUSES = ("dust", "fan_wear")  # modbridge_cooling_degraded's cause label


def _family(typ: str, name: str, labels: tuple, doc: str) -> Metric:
    if typ == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    if typ == "info":
        return InfoMetricFamily(name, doc, labels=labels)
    unit = name.rsplit("_", 1)[1]  # OpenMetrics scrapes get it as a # UNIT line
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit if unit in UNITS else "")


# Families whose values depend on the scrape's clock, not only on the snapshot: made
# per scrape by _clocked; everything else by _Blocks, once per snapshot version.
CLOCKED = ("snapshot_age", "m_age")


_FAMILY_DEF = {attr: (typ, name, labels, doc) for attr, typ, name, labels, doc in FAMILIES}
