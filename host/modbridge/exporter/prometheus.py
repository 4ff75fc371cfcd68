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
* One walk of the snapshot (:class:`_Blocks`) decides every family, label and value
  exported; :class:`BridgeCollector` turns its blocks into prometheus_client
  families (for a registry, and for what the endpoint does not write itself),
  :class:`Renderer` into text once per snapshot version, byte for byte what
  prometheus_client would write of those families. :class:`Endpoint` answers HTTP
  requests as prometheus_client's WSGI app does (negotiation, ``name[]``, gzip).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import queue
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

try:
    import resource
except ImportError:  # not Unix: prometheus_client's ProcessCollector (which has no /proc)
    resource = None

from prometheus_client import CollectorRegistry, exposition
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

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


# Families whose values depend on the scrape's clock, not only on the snapshot: made
# per scrape by _clocked; everything else by _Blocks, once per snapshot version.
CLOCKED = ("snapshot_age", "m_age")


def _module_label(m: ModuleStatus) -> str:
    # Before the hello arrives the module id is unknown: the port stands in for it.
    # Wire strings are sanitised: an escape sequence in an id must not reach a
    # terminal that shows the scrape (valid hex ids pass through unchanged).
    return _clean(m.module_id or m.port)


_cleaned: dict[str, str] = {}  # wire string -> sanitize(it): the same few, every scrape


def _clean(value: str) -> str:
    """``sanitize(value)``, remembered (bounded: strings come from the wire)."""
    got = _cleaned.get(value)
    if got is None:
        got = sanitize(value)
        if len(_cleaned) < 4096:
            _cleaned[value] = got
    return got


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
        return [_family(typ, name, labels, doc) for _, typ, name, labels, doc in FAMILIES]

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        blocks = _Blocks(snap)
        clocked = _clocked(snap, blocks.modules, self._clock())
        for attr, typ, name, labels, doc in FAMILIES:
            rows = clocked[attr] if attr in CLOCKED else _rows(blocks.families[attr])
            if not rows:  # an empty family (nothing known yet) is left out
                continue
            family = _family(typ, name, labels, doc)
            for label_values, v in rows:
                # _z's "-0.0" back to the float; an info sample's value is its labels
                family.add_metric(list(label_values), {} if typ == "info" else _float_z(v))
            yield family


def _clocked(snap, modules: list[ModuleStatus], now: float) -> dict[str, list]:
    """The CLOCKED families as ``(label values, value)`` rows: ages at the scrape's
    ``now`` (``modules`` as :class:`_Blocks` exported them)."""
    rows = {"snapshot_age": [], "m_age": []}
    if snap is None:
        return rows
    rows["snapshot_age"].append(((), max(0.0, now - snap.taken_at)))
    for m in modules:
        age = m.last_frame_age_s(now)
        if age is not None:
            rows["m_age"].append(((_module_label(m),), max(0.0, age)))
    return rows


def _rows(blocks: list) -> list[tuple[tuple, object]]:
    """A family's blocks as ``(label values, value)`` rows, in exposition order."""
    return [row for key, values in blocks for row in zip(_labels_of(key), values, strict=True)]


def _float_z(v):
    """The value :func:`_z` was given (its "-0.0" back to the float)."""
    return float(v) if type(v) is str else v


# -- rendering: once per snapshot version ----------------------------------------------
TEXT = "text"  # Prometheus text format 0.0.4
OPENMETRICS = "openmetrics"  # OpenMetrics 1.0.0
_GENERATE = {TEXT: exposition.generate_latest, OPENMETRICS: om_exposition.generate_latest}
_EOF = "# EOF\n"
# The 8-module body (91 KB of text), measured on a warm thread: level 1 8.4 KB in
# ~0.13 ms of CPU, 6 (Go's default, client_golang's promhttp) 7.2 KB in ~0.6 ms, 9
# (prometheus_client's gzip.compress default) 6.7 KB in ~2 ms. 1.3-1.7 KB per 15 s
# scrape is nothing to a network; the 0.5-1.9 ms would be most of a scrape's CPU.
GZIP_LEVEL = 1


def value_text(v) -> str:
    """prometheus_client's ``floatToGoString(v)``, quicker for the common values: below
    1e6 in magnitude Python's repr is Go's (Go writes exponents from 1e21 down to
    1e6 where Python does not; NaN fails the comparison and goes the long way)."""
    d = float(v)
    if -1e6 < d < 1e6:
        return repr(d)
    return floatToGoString(d)


class _Given:
    """A registry stand-in whose collect() yields the families it was given."""

    def __init__(self, *families: Metric):
        self._families = families

    def collect(self):
        return self._families


def _text_of(fmt: str, registry) -> str:
    """prometheus_client's own rendering of ``registry``, without OpenMetrics' # EOF."""
    text = _GENERATE[fmt](registry).decode("utf-8")
    return text[: -len(_EOF)] if fmt == OPENMETRICS else text


_FAMILY_DEF = {attr: (typ, name, labels, doc) for attr, typ, name, labels, doc in FAMILIES}


def _live_version(snap: BridgeSnapshot | None) -> tuple:
    """What changes in a snapshot's objects after it was built: a module's status is
    the link thread's live object (frames, telemetry, link up/down between two
    snapshots), a pair the policy's. Any change here means a new render, so a scrape
    shows what the old per-scrape renderer showed at that instant."""
    if snap is None:
        return ()
    return (
        tuple(
            (
                m.frames_total,
                m.link_up,
                m.last_frame_at,
                id(m.telemetry),  # replaced, never updated, by each telemetry frame
                m.reconnects,
                m.module_resets,
                m.module_id,
                m.fw_version,
                m.proto_version,
                m.board,
                m.fans,
                sum(m.frame_errors.values()),
                sum(m.events_total.values()),
            )
            for m in snap.modules
        ),
        tuple(
            (
                p.level,
                p.eta_s,
                p.target_limit_w,
                p.original_limit_w,
                p.limit_writes_refused,
                sum(p.actions_total.values()),
                p.module_id,
                p.gpu_uuid,
            )
            for p in snap.pairs
        ),
        tuple(id(s) for s in snap.gpus),
    )


def _sources(snap: BridgeSnapshot):
    """(modules, gpus, pairs, gpu_by_uuid, gpu_of_module) of a snapshot, deduplicated
    as they are exported."""
    gpus = _dedupe(snap.gpus, key=lambda s: s.uuid)
    pairs = _dedupe(snap.pairs, key=lambda p: (p.module_id or "", p.gpu_uuid or ""))
    modules = _dedupe(
        snap.modules,
        key=_module_label,
        prefer=lambda m: (not m.link_up, -(m.last_frame_at or float("-inf"))),
    )
    gpu_by_uuid = {s.uuid: s for s in gpus}
    gpu_of_module = {p.module_id: p.gpu_uuid for p in pairs if p.module_id}
    return modules, gpus, pairs, gpu_by_uuid, gpu_of_module


_ONE = (1,)  # an info sample's value
_ERROR_KINDS = tuple(ERROR_KINDS)
_CLOCK_NAMES = tuple(CLOCKS_EVENT_REASONS)
_CLOCK_MASKS = tuple(CLOCKS_EVENT_REASONS.values())
_GPU_VALUES = (
    ("g_temp", "temperature_c"), ("g_mem_temp", "memory_temperature_c"),
    ("g_slowdown", "slowdown_temp_c"), ("g_shutdown", "shutdown_temp_c"),
    ("g_max_op", "max_operating_temp_c"), ("g_power", "power_w"),
    ("g_limit", "enforced_limit_w"), ("g_limit_default", "default_limit_w"),
    ("g_limit_min", "min_limit_w"), ("g_limit_max", "max_limit_w"),
    ("g_util", "utilization"), ("g_fan", "fan_speed_ratio"),
)  # fmt: skip


_known_sets: dict[tuple, tuple] = {}  # known names -> (their set, zeros)


def _counts(known: tuple, counts) -> tuple[tuple, tuple]:
    """(names, values) of a counter with a known label set, exported at 0 from the
    start: every known name (0 if not counted), then the counted names not known,
    in their order."""
    got = _known_sets.get(known)
    if got is None:
        got = _known_sets[known] = (frozenset(known), (0,) * len(known))
    if counts.keys() <= got[0]:
        return known, tuple(map(counts.get, known, got[1]))
    names = known + tuple(k for k in counts if k not in got[0])
    return names, tuple(counts.get(k, 0) for k in names)


_hots: dict = {}  # (known names, active) -> (names, values)


def _hot(known: tuple, active) -> tuple[tuple, tuple]:
    """(names, values) of a one-hot state set: 1.0 for ``active``, 0.0 for the other
    names; an ``active`` newer than ``known`` (a newer firmware's state) is shown too."""
    got = _hots.get((known, active))
    if got is None:
        names = known if active is None or active in known else known + (active,)
        got = (names, tuple(1.0 if n == active else 0.0 for n in names))
        if len(_hots) < 4096:  # states from the wire: bounded
            _hots[known, active] = got
    return got


def _bits(names: tuple, bits: tuple, value: int) -> tuple:
    """0/1 per bit of ``value`` (fault bits, clocks event reasons)."""
    got = _bit_values.get((names, value))
    if got is None:
        got = tuple(1.0 if value & bit else 0.0 for bit in bits)
        if len(_bit_values) < 4096:
            _bit_values[names, value] = got
    return got


_bit_values: dict = {}
_FAULT_MASKS = tuple(1 << i for i in range(len(C.FAULT_BITS)))


class _Blocks:
    """One walk of a snapshot as blocks: per family, a list of ``(key, values)`` in
    exposition order, where ``key = (head, names)`` gives the block's label values
    (``head``, or ``head + (name,)`` for each of ``names``) and ``values`` its samples'
    values, grouped so that a block whose values did not change keeps its text.

    The one place that decides what is exported: :class:`BridgeCollector` (the
    registry) and :class:`Renderer` (the endpoint) both read these blocks, so the two
    can differ only in how they write them (a test holds the texts equal, byte for
    byte). A value that is -0.0 is kept as ``_z``'s "-0.0" (blocks compare equal only
    when their text is the same); the collector turns it back into the float."""

    def __init__(self, snap: BridgeSnapshot | None):
        self.families: dict[str, list] = {attr: [] for attr, *_ in FAMILIES}
        self.modules: list[ModuleStatus] = []
        f = self.families
        f["build_info"].append((((__version__, snap.backend if snap else ""), None), _ONE))
        if snap is None:
            return
        modules, gpus, pairs, gpu_by_uuid, gpu_of_module = _sources(snap)
        self.modules = modules
        for m in modules:
            self._module(m, gpu_of_module, gpu_by_uuid)
        for s in gpus:
            self._gpu(s)
        seen = set()
        for p in pairs:
            if p.gpu_uuid and p.original_limit_w is not None and p.gpu_uuid not in seen:
                seen.add(p.gpu_uuid)
                w = p.original_limit_w
                f["g_limit_original"].append((((p.gpu_uuid,), None), (w if w else _z(w),)))
        for p in pairs:
            self._pair(p)

    def _module(self, m: ModuleStatus, gpu_of_module, gpu_by_uuid) -> None:
        f = self.families
        mod = _module_label(m)
        head = (mod,)
        gpu_uuid = gpu_of_module.get(m.module_id) or ""
        gpu = gpu_by_uuid.get(gpu_uuid)
        info = (m.fw_version, m.proto_version, m.board, gpu_uuid, gpu.name if gpu else "")
        info = (mod, m.port) + tuple(_clean(v) if v else "" for v in info)
        f["m_info"].append(((info, None), _ONE))
        f["m_up"].append((((mod, m.port), None), (1.0 if m.link_up else 0.0,)))
        f["m_frames"].append(((head, None), (m.frames_total,)))
        names, values = _counts(_ERROR_KINDS, m.frame_errors)
        f["m_frame_errors"].append(((head, names), values))
        f["m_reconnects"].append(((head, None), (m.reconnects,)))
        f["m_resets"].append(((head, None), (m.module_resets,)))
        names, values = _counts(C.REASONS, m.events_total)
        f["m_events"].append(((head, names), values))
        if not m.telemetry:
            return  # no telemetry yet: no readings, no state, no faults
        if not m.link_up:
            # a link that is down has no current readings: they vanish from the scrape
            # at once (Prometheus marks missing series stale), instead of repeating
            # the last state for seconds; up, info, age and the counters stay
            return
        faults = m.faults
        chans, temps = [], []
        for ch in C.CHANNELS:
            t = m.temperature_c(ch)
            if t is not None and not faults & _NTC_FAULT[ch]:
                chans.append(ch)
                temps.append(t if t else _z(t))
        if chans:
            f["m_temp"].append(((head, tuple(chans)), tuple(temps)))
        rpm_n, rpm_v, duty_n, duty_v = [], [], [], []
        for fan in range(1, (m.fans or 2) + 1):
            rpm, duty = m.fan_rpm(fan), m.fan_duty_ratio(fan)
            if rpm is not None:
                rpm_n.append(str(fan))
                rpm_v.append(rpm if rpm else _z(rpm))
            if duty is not None:
                duty_n.append(str(fan))
                duty_v.append(duty if duty else _z(duty))
        if rpm_n:
            f["m_fan_rpm"].append(((head, tuple(rpm_n)), tuple(rpm_v)))
        if duty_n:
            f["m_fan_duty"].append(((head, tuple(duty_n)), tuple(duty_v)))
        for attr, value in (("m_volts", m.v_in_v), ("m_amps", m.i_in_a), ("m_watts", m.p_in_w)):
            if value is not None:
                f[attr].append(((head, None), (value if value else _z(value),)))
        state = m.state
        if state is not None:
            names, values = _hot(C.STATES, state)
            f["m_state"].append(((head, names), values))
        if "faults" in m.telemetry:
            values = _bits(C.FAULT_BITS, _FAULT_MASKS, faults)
            f["m_fault"].append(((head, C.FAULT_BITS), values))

    def _gpu(self, s: GpuSample) -> None:
        f = self.families
        head = (s.uuid,)
        f["g_info"].append((((s.uuid, s.name, s.pci_bus_id), None), _ONE))
        f["g_up"].append(((head, None), (1.0 if s.state == "ok" else 0.0,)))
        names, values = _hot(GPU_STATES, s.state)
        f["g_state"].append(((head, names), values))
        for attr, field in _GPU_VALUES:
            value = getattr(s, field)
            if value is not None:
                f[attr].append(((head, None), (value if value else _z(value),)))
        reasons = s.clocks_event_reasons
        if reasons is not None:
            values = _bits(_CLOCK_NAMES, _CLOCK_MASKS, reasons)
            f["g_clocks"].append(((head, _CLOCK_NAMES), values))

    def _pair(self, p: PairState) -> None:
        f = self.families
        head = (p.module_id or "", p.gpu_uuid or "")
        f["p_level"].append(((head, None), (p.level,)))
        level = POLICY_LEVELS[p.level] if 0 <= p.level < len(POLICY_LEVELS) else str(p.level)
        names, values = _hot(POLICY_LEVELS, level)
        f["p_state"].append(((head, names), values))
        names, values = _counts(POLICY_ACTIONS, p.actions_total)
        f["p_actions"].append(((head, names), values))
        f["p_refused"].append(((head, None), (p.limit_writes_refused,)))
        if p.eta_s is not None:
            eta = max(0.0, p.eta_s)
            f["p_eta"].append(((head, None), (eta if eta else _z(eta),)))
        target = p.target_limit_w if p.target_limit_w is not None else p.original_limit_w
        if target is not None:
            f["p_target"].append(((head, None), (target if target else _z(target),)))


def _labels_of(key: tuple) -> list[tuple]:
    head, names = key
    return [head] if names is None else [head + (n,) for n in names]


def _lines(prefixes: list[str], values: tuple) -> str:
    if len(values) == 1:  # most blocks: one sample
        return f"{prefixes[0]}{value_text(values[0])}\n"
    return "".join([f"{p}{value_text(v)}\n" for p, v in zip(prefixes, values, strict=True)])


def _z(v):
    """A zero as its text tells it: -0.0 (which equals 0.0 but is written "-0.0") as
    a string that ``float()`` reads back, so that blocks compare equal only when their
    text is the same. For values from outside (telemetry, GPU readings, the policy);
    call it only on a falsy value: ``v if v else _z(v)``."""
    return "-0.0" if type(v) is float and math.copysign(1.0, v) < 0 else v


class Renderer:
    """The exposition text of a snapshot source, rendered once per snapshot version.

    ``render(fmt)`` returns exactly the bytes prometheus_client's ``generate_latest``
    (or its OpenMetrics one) makes of a registry holding ``BridgeCollector(source,
    clock)`` and then ``extra``'s collectors: the same blocks (:class:`_Blocks`), and
    every header and sample prefix is
    prometheus_client's own text, made once and kept. A scrape of a snapshot version
    already rendered costs the CLOCKED samples (ages), ``extra`` (the process
    metrics) and a join; a new version costs one walk over the snapshot, a tuple
    comparison per family (in C) and, in a family that changed, per block (a module's
    frame errors, a GPU's power, a pair's actions), and a line per sample of the
    blocks whose values changed. Texts and prefixes a
    render did not use (a module that went away) are dropped after the next render
    of that format. ``renders`` counts the versions rendered (tests count it; no
    timing in tests).
    """

    def __init__(
        self,
        source: SnapshotSource,
        clock: Callable[[], float] = time.monotonic,
        extra: CollectorRegistry | None = None,
    ):
        self._source = source
        self._clock = clock
        self._extra = extra
        self._lock = threading.Lock()
        self._snap: BridgeSnapshot | None = None
        self._version: tuple | None = None
        self._blocks: _Blocks | None = None
        self._parts: dict[str, list] = {}  # fmt -> [bytes | CLOCKED attr, ...]
        self._headers: dict[tuple[str, str], str] = {}
        # (fmt, attr) -> {label values: text before the value}: the CLOCKED families'
        self._prefixes: dict[tuple[str, str], dict] = {}
        # (fmt, attr) -> (blocks, text, [(values, text, prefixes) per block]) of the
        # last render of fmt
        self._family_texts: dict[tuple[str, str], tuple] = {}
        # fmt -> {extra family's shape: (header, prefixes) or None} of the last scrape
        self._extra_shapes: dict[str, dict] = {}
        self.renders = 0

    def render(self, fmt: str = TEXT) -> bytes:
        return b"".join(self.render_parts(fmt))

    def render_parts(self, fmt: str = TEXT) -> list[bytes]:
        """:meth:`render`'s bytes in pieces, not joined (for :class:`_Gzip`)."""
        snap = self._source()
        now = self._clock()
        with self._lock:
            version = _live_version(snap)
            if self._blocks is None or snap is not self._snap or version != self._version:
                self._blocks = _Blocks(snap)
                self._snap, self._version = snap, version
                self._parts = {}
                self.renders += 1
            parts = self._parts.get(fmt)
            if parts is None:
                parts = self._parts[fmt] = self._segments(fmt)
            clocked = _clocked(snap, self._blocks.modules, now)
            out = [
                p if type(p) is bytes else self._family(fmt, p, clocked[p]).encode() for p in parts
            ]
            if self._extra is not None:
                out.append(self._extra_text(fmt).encode())
        if fmt == OPENMETRICS:
            out.append(_EOF.encode())
        return out

    def _segments(self, fmt: str) -> list:
        """The blocks as text, cut where a CLOCKED family goes in. A block whose values
        equal its values in the last render of ``fmt`` keeps its text."""
        parts, text = [], []
        for attr, *_ in FAMILIES:
            if attr in CLOCKED:
                parts.append("".join(text).encode())
                parts.append(attr)
                text = []
                continue
            blocks = self._blocks.families[attr]
            if blocks:
                text.append(self._family_text(fmt, attr, blocks))
            else:
                self._family_texts.pop((fmt, attr), None)
        parts.append("".join(text).encode())
        return parts

    def _family_text(self, fmt: str, attr: str, blocks: list) -> str:
        key = (fmt, attr)
        last = self._family_texts.get(key)
        if last is not None and last[0] == blocks:
            return last[1]  # every block as in the last render (one comparison, in C)
        if (
            last is not None
            and len(last[0]) == len(blocks)
            and all(a[0] == b[0] for a, b in zip(last[0], blocks, strict=True))
        ):
            kept = last[2]  # the same blocks in the same order (the same modules)
        else:
            kept = self._kept(fmt, attr, blocks, last)
        out = [self._header(fmt, attr)]
        now = []
        for (_, values), k in zip(blocks, kept, strict=True):
            if k[0] != values:
                k = (values, _lines(k[2], values), k[2])
            now.append(k)
            out.append(k[1])
        text = "".join(out)
        self._family_texts[key] = (blocks, text, now)
        return text

    def _kept(self, fmt: str, attr: str, blocks: list, last: tuple | None) -> list:
        """Per block, its ``(values, text, prefixes)`` in the last render, or for a
        block that was not there its prefixes from prometheus_client (all new
        blocks' at once) and its text."""
        old = {} if last is None else dict(zip([b for b, _ in last[0]], last[2], strict=True))
        new = [(block, values) for block, values in blocks if block not in old]
        if new:
            labels = [_labels_of(block) for block, _ in new]
            flat = self._new_prefixes(fmt, attr, [lv for ls in labels for lv in ls])
            i = 0
            for (block, values), ls in zip(new, labels, strict=True):
                prefixes = flat[i : i + len(ls)]
                i += len(ls)
                old[block] = (values, _lines(prefixes, values), prefixes)
        return [old[block] for block, _ in blocks]

    def _header(self, fmt: str, attr: str) -> str:
        header = self._headers.get((fmt, attr))
        if header is None:
            header = self._headers[fmt, attr] = _text_of(fmt, _Given(_family(*_FAMILY_DEF[attr])))
        return header

    def _new_prefixes(self, fmt: str, attr: str, labels: list[tuple]) -> list[str]:
        """Samples' lines up to their values, as prometheus_client writes them (name,
        suffix, labels escaped): the samples rendered, their values cut off."""
        family = _family(*_FAMILY_DEF[attr])
        for lv in labels:
            family.add_metric(list(lv), {} if family.type == "info" else 0)
        body = _text_of(fmt, _Given(family))[len(self._header(fmt, attr)) :]
        return [line[: line.rindex(" ") + 1] for line in body.split("\n")[:-1]]

    def _family(self, fmt: str, attr: str, rows: list) -> str:
        """A CLOCKED family's text from its rows (every scrape)."""
        if not rows:
            return ""
        old = self._prefixes.get((fmt, attr), {})
        labels = [lv for lv, _ in rows]
        prefixes = {lv: old[lv] for lv in labels if lv in old}  # a module gone: dropped
        missing = [lv for lv in labels if lv not in prefixes]
        if missing:
            prefixes.update(zip(missing, self._new_prefixes(fmt, attr, missing), strict=True))
        self._prefixes[fmt, attr] = prefixes
        lines = [self._header(fmt, attr)]
        lines += [f"{prefixes[lv]}{value_text(v)}\n" for lv, v in rows]
        return "".join(lines)

    def _extra_text(self, fmt: str) -> str:
        """``extra``'s families (the process metrics) as prometheus_client writes them.
        Their values change every scrape, their names, labels and help do not: a family
        of the same shape as in the last scrape keeps its header and sample prefixes
        and gets its values written; any other is written by prometheus_client (and
        its header and prefixes kept if its text is header, then a line per sample
        ending in the value)."""
        old = self._extra_shapes.get(fmt, {})
        shapes, out = {}, []
        for family in self._extra.collect():
            samples = family.samples
            if any(v is not None for s in samples for v in s[3:]):  # timestamps, exemplars
                out.append(_text_of(fmt, _Given(family)))
                continue
            shape = (family.name, family.type, family.documentation, family.unit)
            shape += tuple((s.name, tuple(s.labels.items())) for s in samples)
            kept = old[shape] if shape in old else _text_shape(fmt, family)
            shapes[shape] = kept
            if kept is None:
                out.append(_text_of(fmt, _Given(family)))
                continue
            out.append(kept[0])
            out += [f"{p}{value_text(s.value)}\n" for p, s in zip(kept[1], samples, strict=True)]
        self._extra_shapes[fmt] = shapes
        return "".join(out)

    def cached_label_values(self) -> set:
        """Every label value a cached text or prefix holds (a test's view)."""
        out = set()
        for blocks, _, _ in self._family_texts.values():
            for block, _ in blocks:
                for lv in _labels_of(block):
                    out.update(lv)
        for prefixes in self._prefixes.values():
            for lv in prefixes:
                out.update(lv)
        return out


def _text_shape(fmt: str, family: Metric) -> tuple[str, list[str]] | None:
    """(header, sample prefixes) of prometheus_client's text of ``family``: the text
    is the header then one line per sample, the prefix and the value; else None."""
    samples = family.samples
    text = _text_of(fmt, _Given(family))
    lines = text.split("\n")[:-1]
    if len(lines) < len(samples):
        return None
    header = "".join(f"{line}\n" for line in lines[: len(lines) - len(samples)])
    prefixes = [
        line[: line.rindex(" ") + 1] for line in lines[len(lines) - len(samples) :] if " " in line
    ]
    if len(prefixes) != len(samples):
        return None
    values = [value_text(s.value) for s in samples]
    if header + "".join(f"{p}{v}\n" for p, v in zip(prefixes, values, strict=True)) != text:
        return None
    return header, prefixes


# -- HTTP endpoint ------------------------------------------------------------------
def make_registry(
    source: SnapshotSource,
    process_metrics: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> CollectorRegistry:
    """A registry of its own (never the global one) holding a BridgeCollector.

    With ``process_metrics`` the standard ``process_*`` (RSS, CPU, open fds, start
    time; Linux /proc) and ``python_info`` metrics are added: cheap, no I/O beyond
    /proc, and they show a leaking or restarting bridge. The GC collector is left out.
    """
    reg = CollectorRegistry()
    reg.register(BridgeCollector(source, clock))
    if process_metrics:
        _add_process_collectors(reg)
    return reg


def _add_process_collectors(reg: CollectorRegistry) -> CollectorRegistry:
    reg.register(_ProcessMetrics())
    PlatformCollector(registry=reg)
    return reg


class _ProcessMetrics:
    """prometheus_client's ProcessCollector (the same ``process_*`` families, help
    and values) for a cost per scrape a fraction of its own. It reads
    /proc/self/stat and /proc/self/limits and lists /proc/self/fd at every scrape;
    here the start time (constant) is its own, read once, and a scrape reads the
    small /proc/self/statm (the same page counts as stat's vsize and rss), asks the
    kernel for CPU times (``os.times``: the same clock ticks as stat's utime and
    stime) and the open-file limit (``getrlimit``: the soft limit, which limits
    shows), and lists /proc/self/fd as it does. Where /proc cannot be read it is
    ProcessCollector itself."""

    def __init__(self):
        self._fallback = ProcessCollector(registry=None)
        self._start = None
        self._pagesize = resource.getpagesize() if resource else 4096
        try:
            first = {m.name: m for m in self._fallback.collect()}
            self._start = first["process_start_time_seconds"].samples[0].value
            self._read_statm()
        except (OSError, KeyError, IndexError, ValueError):
            self._start = None

    @staticmethod
    def _read_statm() -> list[bytes]:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            return os.read(fd, 256).split()
        finally:
            os.close(fd)

    def collect(self) -> list[Metric]:
        if self._start is None or resource is None:
            return self._fallback.collect()
        try:
            pages = self._read_statm()
            open_fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            return self._fallback.collect()
        t = os.times()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return [
            GaugeMetricFamily(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                value=float(int(pages[0]) * self._pagesize),
            ),
            GaugeMetricFamily(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                value=float(pages[1]) * self._pagesize,
            ),
            GaugeMetricFamily(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                value=self._start,
            ),
            CounterMetricFamily(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                value=t.user + t.system,
            ),
            GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", open_fds),
            GaugeMetricFamily(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                value=float("inf") if soft == resource.RLIM_INFINITY else float(soft),
            ),
        ]


_LEGACY_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Escaping schemes that leave a legacy name as it is (``dots`` and ``values`` rewrite
# every underscore). Every name here is a legacy one (the naming lint in
# tests/test_exporter.py), so these schemes give the Renderer's text.
_SAME_TEXT_ESCAPINGS = (
    (om_exposition.UNDERSCORES, om_exposition.ALLOWUTF8)
    if all(
        _LEGACY_METRIC.fullmatch(name) and all(map(_LEGACY_LABEL.fullmatch, labels))
        for _, _, name, labels, _ in FAMILIES
    )
    else (om_exposition.UNDERSCORES,)
)


def _fast_format(encoder) -> str | None:
    """TEXT or OPENMETRICS if prometheus_client's choice of ``encoder`` is one the
    Renderer writes (the text format, OpenMetrics 1.0.0, escaping ``underscores`` or
    ``allow-utf-8``, which Prometheus 3 asks for); else None."""
    if encoder is exposition.generate_latest:
        return TEXT
    func = getattr(encoder, "func", None)
    kw = getattr(encoder, "keywords", {})
    if kw.get("escaping", om_exposition.UNDERSCORES) not in _SAME_TEXT_ESCAPINGS:
        return None
    if func is exposition.generate_latest:
        return TEXT
    if func is om_exposition.generate_latest and kw.get("version", "1.0.0") == "1.0.0":
        return OPENMETRICS
    return None


class _Gzip:
    """gzip bodies from one deflate state kept from response to response.

    ``gzip.compress`` sets up a deflate state per call (256 KB: window, hash chains,
    buffers) and frees it; the next call's state is memory the allocator gave back
    meanwhile, some 55 page faults a scrape on a worker thread (measured: half the
    ~0.3 ms it took). Here the state stays: each body is deflated, then flushed with
    ``Z_FULL_FLUSH`` (the output ends on a byte boundary and the state forgets all it
    saw, so the next body refers to nothing of this one), then closed by an empty
    final block, the bytes ``Z_FINISH`` writes at the end of a flushed stream. With
    the gzip header and the trailer (CRC-32, length) that is a complete gzip member:
    the deflate blocks a fresh state would write (none marked final) and up to 8
    bytes more (the flush's empty stored block, the empty final block)."""

    HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0
    LAST = b"\x03\x00"  # an empty final block, fixed Huffman codes

    def __init__(self, level: int):
        self._level = level
        self._lock = threading.Lock()
        self._deflate = self._new()

    def _new(self):
        return zlib.compressobj(self._level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def compress(self, parts: list[bytes]) -> bytes:
        out, crc, size = [self.HEADER], 0, 0
        with self._lock:
            deflate = self._deflate
            try:
                for part in parts:
                    out.append(deflate.compress(part))
                    crc = zlib.crc32(part, crc)
                    size += len(part)
                out.append(deflate.flush(zlib.Z_FULL_FLUSH))
            except BaseException:
                self._deflate = self._new()  # half a body in the state: never reused
                raise
        out.append(self.LAST)
        out.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(out)


class Endpoint:
    """What /metrics answers: prometheus_client's ``make_wsgi_app`` restated (same
    methods, paths, content negotiation, ``name[]`` filters and gzip) with the body
    from a :class:`Renderer`. A request the Renderer does not write (``name[]``, an
    escaping scheme that rewrites names, an OpenMetrics version other than 1.0.0) is
    rendered by prometheus_client from
    ``registry``: the same metrics."""

    def __init__(
        self,
        source: SnapshotSource,
        process_metrics: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        extra = _add_process_collectors(CollectorRegistry()) if process_metrics else None
        self.renderer = Renderer(source, clock, extra)
        self.registry = make_registry(source, process_metrics, clock)
        self._gzip = _Gzip(GZIP_LEVEL)
        # (Accept, Accept-Encoding) -> their negotiation: a scraper sends the same ones
        self._negotiated: dict[tuple, tuple] = {}

    def respond(
        self, method: str, path: str, query: str, accept: str | None, accept_encoding: str | None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """(status, headers, body) of one request."""
        if method == "OPTIONS":
            return 200, [("Allow", "OPTIONS,GET")], b""
        if method != "GET":
            body = f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()
            return 405, [("Allow", "OPTIONS,GET")], body
        if path == "/favicon.ico":
            return 200, [], b""  # for browsers; any other path is /metrics
        got = self._negotiated.get((accept, accept_encoding))
        if got is None:
            encoder, content_type = exposition.choose_encoder(accept or "")
            gzipped = exposition.gzip_accepted(accept_encoding or "")
            got = (encoder, content_type, _fast_format(encoder), gzipped)
            if len(self._negotiated) < 64:  # headers from the network: bounded
                self._negotiated[accept, accept_encoding] = got
        encoder, content_type, fmt, gzipped = got
        names = parse_qs(query).get("name[]") if query else None
        if names:
            parts = [encoder(self.registry.restricted_registry(names))]
        elif fmt is None:
            parts = [encoder(self.registry)]
        else:
            parts = self.renderer.render_parts(fmt)
        headers = [("Content-Type", content_type)]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
            return 200, headers, self._gzip.compress(parts)
        return 200, headers, b"".join(parts)


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.0 request (the connection closes after it) answered by ``endpoint``.
    The status line, headers and body leave in one ``sendall`` (the base class writes
    headers and body apart), with Nagle off: the answer is never held back waiting for
    the client's ACK of a first small segment."""

    endpoint: Endpoint  # set on the per-server subclass
    disable_nagle_algorithm = True  # TCP_NODELAY (StreamRequestHandler.setup)

    def _answer(self) -> None:
        url = urlsplit(self.path)
        try:
            status, headers, body = self.endpoint.respond(
                self.command,
                url.path,
                url.query,
                self.headers.get("Accept"),
                self.headers.get("Accept-Encoding"),
            )
        except Exception:  # a bug must cost one scrape, not the endpoint
            log.exception("metrics: a scrape failed")
            status, headers, body = 500, [("Content-Type", "text/plain")], b"scrape failed\n"
        head = [
            f"{self.protocol_version} {status} {self.responses[status][0]}",
            f"Server: {self.version_string()}",
            f"Date: {self.date_time_string()}",
        ]
        head += [f"{name}: {value}" for name, value in headers]
        head += [f"Content-Length: {len(body)}", "", ""]
        out = "\r\n".join(head).encode("latin-1")
        self.wfile.write(out if self.command == "HEAD" else out + body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        """No line per scrape."""


class _WorkerServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with its requests on long-lived worker threads (daemons).

    A request goes to an idle worker, or to a new one when none is idle: a client
    that connects and stalls holds its own thread, never another scrape, as with a
    thread per request. Up to ``IDLE_WORKERS`` wait for the next request instead of
    ending. A scrape on a thread that served the last one costs about 0.2 ms less CPU
    than on a new thread (its caches; measured on the 8-module body), besides the
    thread's start. ``server_close()`` ends the idle ones (a busy one ends when its
    request does); it waits for none of them."""

    daemon_threads = True
    IDLE_WORKERS = 2

    def __init__(self, *args, **kwargs):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._workers_lock = threading.Lock()
        self._idle = 0  # workers waiting on _requests, none of them promised a request
        self._closed = False
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        with self._workers_lock:
            if self._idle:
                self._idle -= 1  # that worker takes this request
            else:
                threading.Thread(
                    target=self._work, name="modbridge-metrics-worker", daemon=True
                ).start()
        self._requests.put((request, client_address))

    def _work(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
            with self._workers_lock:
                if self._closed or self._idle >= self.IDLE_WORKERS:
                    return
                self._idle += 1

    def server_close(self) -> None:
        super().server_close()
        with self._workers_lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._requests.put(None)


def _server(addr: str, port: int, endpoint: Endpoint) -> ThreadingHTTPServer:
    """Requests on worker threads (:class:`_WorkerServer`), IPv4 or IPv6 as the
    address says."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(_WorkerServer):
        address_family = family

    class Handler(_Handler):
        pass

    Handler.endpoint = endpoint
    return Server((sockaddr[0], port), Handler)


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
    endpoint = Endpoint(source, process_metrics=process_metrics)
    try:
        httpd = _server(addr, port, endpoint)
    except OSError as e:
        hint = (
            "another process holds it; choose another --metrics-port"
            if e.errno == errno.EADDRINUSE
            else "check the address"
        )
        raise ExporterError(
            f"cannot serve metrics on {addr}:{port}: {e.strerror or e}; {hint}"
        ) from e
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    thread.name = "modbridge-metrics"
    server = MetricsServer(httpd, thread, endpoint.registry)
    server.endpoint = endpoint
    server.renderer = endpoint.renderer
    log.info("serving metrics on %s", server.url)
    return server
