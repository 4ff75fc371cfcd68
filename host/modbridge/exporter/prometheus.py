"""Prometheus exporter: turns the bridge's latest :class:`BridgeSnapshot` into metrics.

The collector is *handed* its source, a callable returning the latest snapshot that
the bridge loop built. A scrape calls ``source()`` once and reads that object: it
never touches a serial port or NVML, so a slow module or a hung driver can never
make a scrape hang. Everything is in base units with one ``modbridge_`` prefix;
docs/metrics.md lists every metric.

    server = serve(lambda: bridge.snapshot)      # http://127.0.0.1:9659/metrics
    ...
    server.stop()

Choices worth knowing (docs/metrics.md says more):

* Default port 9659: marked FREE in the Prometheus "Default port allocations" list
  (exporters take 9100-9999 so they do not collide); 9101, the seed's choice, is the
  HAProxy exporter's. Bound to 127.0.0.1 unless told otherwise.
* One-hot "state set" metrics (module state, fault bits, policy level, GPU state) are
  gauges with an explicit label (``state``, ``fault``, ``level``), the way
  kube-state-metrics does it. prometheus_client's StateSetMetricFamily would name the
  label after the metric (``modbridge_module_state{modbridge_module_state="..."}``)
  and is exposed as a plain gauge in the Prometheus text format anyway.
* GPU power limits are separate metrics (``..._power_limit_watts``,
  ``..._power_limit_default_watts``, ``_min_``, ``_max_``, ``_original_``), not one
  metric with a ``kind`` label: summing or averaging across such a label would be
  meaningless, which is the Prometheus rule for splitting a metric.
* A value the source does not have (faulted NTC, NotSupported on the GPU, no ETA) is
  absent, never 0. Counters with a known label set (event reasons, frame error
  kinds, policy actions) are exported at 0 from the start so ``increase()`` sees the
  first increment.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from modbridge import __version__
from modbridge.errors import ModbridgeError
from modbridge.gpu.base import CLOCKS_EVENT_REASONS, GpuError, GpuSample
from modbridge.model import BridgeSnapshot, ModuleStatus, PairState
from modbridge.sanitize import sanitize
from protocol import catalog as C
from protocol.frame import ERROR_KINDS

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 9659

# Base units (plus rpm and ratio) a gauge name may end with; docs/metrics.md.
UNITS = ("celsius", "volts", "amperes", "watts", "seconds", "rpm", "ratio")
POLICY_LEVELS = ("NORMAL", "WARN", "CRITICAL")  # PairState.level 0, 1, 2
# PairState.actions_total keys (actuator.py); others it may add are exported too
POLICY_ACTIONS = ("lower", "restore", "refused", "failed", "dry_run")

SnapshotSource = Callable[[], "BridgeSnapshot | None"]


class ExporterError(ModbridgeError):
    """The metrics endpoint could not be started."""


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
_NTC_FAULT = {ch: 1 << C.FAULT_BITS.index("ntc_" + ch) for ch in C.CHANNELS}  # by channel


def _one_hot(names: Iterable[str], active: str | None) -> Iterator[tuple[str, float]]:
    names = list(names)
    if active is not None and active not in names:
        names.append(active)  # a value newer than this catalog: still shown
    for name in names:
        yield name, 1.0 if name == active else 0.0


def _with_zeros(known: Iterable[str], counts: dict) -> dict:
    out = dict.fromkeys(known, 0)
    out.update(counts)
    return out


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
)  # fmt: skip


def _family(typ: str, name: str, labels: tuple, doc: str) -> Metric:
    if typ == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    if typ == "info":
        return InfoMetricFamily(name, doc, labels=labels)
    unit = name.rsplit("_", 1)[1]  # OpenMetrics scrapes get it as a # UNIT line
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit if unit in UNITS else "")


class _Families:
    """Every metric family of one scrape, created empty, filled per source object."""

    def __init__(self):
        self.all: list[Metric] = []
        for attr, typ, name, labels, doc in FAMILIES:
            family = _family(typ, name, labels, doc)
            setattr(self, attr, family)
            self.all.append(family)


def _module_label(m: ModuleStatus) -> str:
    # Before the hello arrives the module id is unknown: the port stands in for it.
    # Wire strings are sanitised: an escape sequence in an id must not reach a
    # terminal that shows the scrape (valid hex ids pass through unchanged).
    return sanitize(m.module_id or m.port)


def _dedupe(items, key, prefer=None):
    """First item per key (after sorting by ``prefer``); duplicates would be rejected."""
    if prefer is not None:
        items = sorted(items, key=prefer)
    seen, out = set(), []
    for it in items:
        k = key(it)
        if k in seen:
            log.debug("exporter: duplicate %r skipped", k)
            continue
        seen.add(k)
        out.append(it)
    return out


class BridgeCollector:
    """A prometheus_client collector over a snapshot source.

    ``source()`` must return the latest prebuilt :class:`BridgeSnapshot` (or None
    before the first one); it is called exactly once per scrape and never from
    ``describe()``. ``clock`` is ``time.monotonic`` (the snapshot's clock).
    """

    def __init__(self, source: SnapshotSource, clock: Callable[[], float] = time.monotonic):
        self._source = source
        self._clock = clock

    def describe(self) -> list[Metric]:
        # Lets the registry check for name clashes at register() without a scrape.
        return _Families().all

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        now = self._clock()
        f = _Families()
        f.build_info.add_metric([__version__, snap.backend if snap else ""], {})
        if snap is not None:
            f.snapshot_age.add_metric([], max(0.0, now - snap.taken_at))
            gpus = _dedupe(snap.gpus, key=lambda s: s.uuid)
            pairs = _dedupe(snap.pairs, key=lambda p: (p.module_id or "", p.gpu_uuid or ""))
            modules = _dedupe(
                snap.modules,
                key=_module_label,
                prefer=lambda m: (not m.link_up, -(m.last_frame_at or float("-inf"))),
            )
            gpu_by_uuid = {s.uuid: s for s in gpus}
            gpu_of_module = {p.module_id: p.gpu_uuid for p in pairs if p.module_id}
            for m in modules:
                self._module(f, m, now, gpu_of_module, gpu_by_uuid)
            for s in gpus:
                self._gpu(f, s)
            self._original_limits(f, pairs)
            for p in pairs:
                self._pair(f, p)
        for family in f.all:
            if family.samples:  # an empty family (nothing known yet) is left out
                yield family

    # -- per source object ----------------------------------------------------
    @staticmethod
    def _module(f: _Families, m: ModuleStatus, now, gpu_of_module, gpu_by_uuid) -> None:
        mod = _module_label(m)
        gpu_uuid = gpu_of_module.get(m.module_id) or ""
        gpu = gpu_by_uuid.get(gpu_uuid)
        info = [m.fw_version, m.proto_version, m.board, gpu_uuid, gpu.name if gpu else ""]
        f.m_info.add_metric([mod, m.port] + [sanitize(v) if v else "" for v in info], {})
        f.m_up.add_metric([mod, m.port], 1.0 if m.link_up else 0.0)
        age = m.last_frame_age_s(now)
        if age is not None:
            f.m_age.add_metric([mod], max(0.0, age))
        f.m_frames.add_metric([mod], m.frames_total)
        for kind, n in _with_zeros(ERROR_KINDS, dict(m.frame_errors)).items():
            f.m_frame_errors.add_metric([mod, kind], n)
        f.m_reconnects.add_metric([mod], m.reconnects)
        f.m_resets.add_metric([mod], m.module_resets)
        for reason, n in _with_zeros(C.REASONS, dict(m.events_total)).items():
            f.m_events.add_metric([mod, reason], n)

        if not m.telemetry:
            return  # no telemetry yet: no readings, no state, no faults
        if not m.link_up:
            # a link that is down has no current readings: they vanish from the scrape
            # at once (Prometheus marks missing series stale), instead of repeating
            # the last state for seconds; up, info, age and the counters stay
            return
        faults = m.faults
        for ch in C.CHANNELS:
            t = m.temperature_c(ch)
            if t is not None and not faults & _NTC_FAULT[ch]:
                f.m_temp.add_metric([mod, ch], t)
        for fan in range(1, (m.fans or 2) + 1):
            rpm, duty = m.fan_rpm(fan), m.fan_duty_ratio(fan)
            if rpm is not None:
                f.m_fan_rpm.add_metric([mod, str(fan)], rpm)
            if duty is not None:
                f.m_fan_duty.add_metric([mod, str(fan)], duty)
        for fam, value in ((f.m_volts, m.v_in_v), (f.m_amps, m.i_in_a), (f.m_watts, m.p_in_w)):
            if value is not None:
                fam.add_metric([mod], value)
        if m.state is not None:
            for state, v in _one_hot(C.STATES, m.state):
                f.m_state.add_metric([mod, state], v)
        if "faults" in m.telemetry:
            for i, name in enumerate(C.FAULT_BITS):
                f.m_fault.add_metric([mod, name], 1.0 if faults & (1 << i) else 0.0)

    @staticmethod
    def _gpu(f: _Families, s: GpuSample) -> None:
        gpu = s.uuid
        f.g_info.add_metric([gpu, s.name, s.pci_bus_id], {})
        f.g_up.add_metric([gpu], 1.0 if s.state == "ok" else 0.0)
        for state, v in _one_hot(GPU_STATES, s.state):
            f.g_state.add_metric([gpu, state], v)
        for fam, value in (
            (f.g_temp, s.temperature_c),
            (f.g_mem_temp, s.memory_temperature_c),
            (f.g_slowdown, s.slowdown_temp_c),
            (f.g_shutdown, s.shutdown_temp_c),
            (f.g_max_op, s.max_operating_temp_c),
            (f.g_power, s.power_w),
            (f.g_limit, s.enforced_limit_w),
            (f.g_limit_default, s.default_limit_w),
            (f.g_limit_min, s.min_limit_w),
            (f.g_limit_max, s.max_limit_w),
            (f.g_util, s.utilization),
            (f.g_fan, s.fan_speed_ratio),
        ):
            if value is not None:
                fam.add_metric([gpu], value)
        if s.clocks_event_reasons is not None:
            for reason, bit in CLOCKS_EVENT_REASONS.items():
                f.g_clocks.add_metric([gpu, reason], 1.0 if s.clocks_event_reasons & bit else 0.0)

    @staticmethod
    def _original_limits(f: _Families, pairs: list[PairState]) -> None:
        seen = set()
        for p in pairs:
            if p.gpu_uuid and p.original_limit_w is not None and p.gpu_uuid not in seen:
                seen.add(p.gpu_uuid)
                f.g_limit_original.add_metric([p.gpu_uuid], p.original_limit_w)

    @staticmethod
    def _pair(f: _Families, p: PairState) -> None:
        labels = [p.module_id or "", p.gpu_uuid or ""]
        f.p_level.add_metric(labels, p.level)
        level = POLICY_LEVELS[p.level] if 0 <= p.level < len(POLICY_LEVELS) else str(p.level)
        for name, v in _one_hot(POLICY_LEVELS, level):
            f.p_state.add_metric(labels + [name], v)
        for action, n in _with_zeros(POLICY_ACTIONS, dict(p.actions_total)).items():
            f.p_actions.add_metric(labels + [action], n)
        f.p_refused.add_metric(labels, p.limit_writes_refused)
        if p.eta_s is not None:
            f.p_eta.add_metric(labels, max(0.0, p.eta_s))
        target = p.target_limit_w if p.target_limit_w is not None else p.original_limit_w
        if target is not None:
            f.p_target.add_metric(labels, target)


# -- HTTP endpoint ------------------------------------------------------------------
def make_registry(source: SnapshotSource, process_metrics: bool = True) -> CollectorRegistry:
    """A registry of its own (never the global one) holding a BridgeCollector.

    With ``process_metrics`` the standard ``process_*`` (RSS, CPU, open fds, start
    time; Linux /proc) and ``python_info`` metrics are added: cheap, no I/O beyond
    /proc, and they show a leaking or restarting bridge. The GC collector is left out.
    """
    reg = CollectorRegistry()
    reg.register(BridgeCollector(source))
    if process_metrics:
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
    return reg


class MetricsServer:
    """Handle of a running /metrics endpoint; ``stop()`` frees the port."""

    def __init__(self, httpd, thread: threading.Thread, registry: CollectorRegistry):
        self._httpd = httpd
        self._thread = thread
        self.registry = registry
        host, port = httpd.server_address[:2]
        self.addr: str = host
        self.port: int = port

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        if self._httpd is None:
            return
        httpd, self._httpd = self._httpd, None
        httpd.shutdown()  # ends serve_forever()
        httpd.server_close()  # closes the listening socket: the port is free
        self._thread.join(timeout)
        log.info("metrics endpoint on %s stopped", self.url)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    source: SnapshotSource,
    addr: str = DEFAULT_ADDR,
    port: int = DEFAULT_PORT,
    process_metrics: bool = True,
) -> MetricsServer:
    """Serve the snapshot source's metrics over HTTP on ``addr:port`` (0: any free port)."""
    registry = make_registry(source, process_metrics=process_metrics)
    try:
        httpd, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as e:
        hint = (
            "another process holds it; choose another --metrics-port"
            if e.errno == errno.EADDRINUSE
            else "check the address"
        )
        raise ExporterError(
            f"cannot serve metrics on {addr}:{port}: {e.strerror or e}; {hint}"
        ) from e
    thread.name = "modbridge-metrics"
    server = MetricsServer(httpd, thread, registry)
    log.info("serving metrics on %s", server.url)
    return server
