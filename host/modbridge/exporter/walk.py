"""The walk: one pass over a :class:`BridgeSnapshot` into blocks, the one place that
decides every family, label and value exported.

    snapshot -> _Blocks(snap).families = {attr: [((head, names), values), ...]}

A block is the samples of one family that share a label head (a module, a GPU, a
pair): its key gives their label values, ``values`` their values, grouped so that
the Renderer keeps the text of a block whose values did not change. Both writers
read these blocks: render.py (the endpoint's text) and collector.py
(prometheus_client families); they differ only in how they write them.

Beside the walk, because they must name the same fields: :func:`_live_version`
(what of a snapshot can still change after it was built; a change makes the
Renderer walk again) and :func:`_clocked` (the ages: they depend on the scrape's
clock, so they are made per scrape, not per walk).

A value the source does not have (faulted NTC, NotSupported on the GPU, no ETA) is
absent, never 0. Counters with a known label set (event reasons, frame error kinds,
policy actions) are exported at 0 from the start so ``increase()`` sees the first
increment.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from modbridge import __version__
from modbridge.exporter.families import (
    COOLING_CAUSES,
    FAMILIES,
    GPU_STATES,
    POLICY_ACTIONS,
    POLICY_LEVELS,
)
from modbridge.gpu.base import CLOCKS_EVENT_REASONS, GpuSample
from modbridge.model import BridgeSnapshot, ModuleStatus, PairState
from modbridge.sanitize import sanitize
from protocol import catalog as C
from protocol.frame import ERROR_KINDS

log = logging.getLogger(__name__)

# The latest snapshot the bridge loop built (None before the first): every reader
# of the exporter is handed one of these and calls it once per scrape.
SnapshotSource = Callable[[], "BridgeSnapshot | None"]

_NTC_FAULT = {ch: 1 << C.FAULT_BITS.index("ntc_" + ch) for ch in C.CHANNELS}  # by channel


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
        exported = {_module_label(m) for m in modules}
        for key in sorted(snap.chassis or {}):
            if _clean(key) in exported:
                self._chassis(_clean(key), snap.chassis[key])

    def _chassis(self, mod: str, r) -> None:
        """The chassis model's report of module ``mod`` (a ChassisReport)."""
        f = self.families
        head = (mod,)
        f["c_converged"].append(((head, None), (1.0 if r.converged else _z(0.0),)))
        for attr, value in (("c_unc", r.unc_c), ("c_ratio", r.conductance_ratio),
                            ("c_inlet", r.inlet_c)):  # fmt: skip
            if value is not None:
                f[attr].append(((head, None), (value if value else _z(value),)))
        names, values = [], []
        for name, v in (("current", r.time_to_throttle_s), ("full", r.time_to_throttle_full_s)):
            if v is not None:
                names.append(name)
                values.append(max(0.0, v) if v else _z(v))
        if names:
            f["c_ttt"].append(((head, tuple(names)), tuple(values)))
        fans = [(str(i + 1), v) for i, v in enumerate(r.fan_rpm_ratios) if v is not None]
        if fans:
            f["c_fan_ratio"].append(((head, tuple(n for n, _ in fans)), tuple(v for _, v in fans)))
        active = r.cause if r.cooling_degraded else None
        values = tuple(1.0 if c == active else 0.0 for c in COOLING_CAUSES)
        f["c_degraded"].append(((head, COOLING_CAUSES), values))
        if r.throttle_in_days is not None:
            s = r.throttle_in_days * 86400.0
            f["c_days"].append(((head, None), (s if s else _z(s),)))

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


def _z(v):
    """A zero as its text tells it: -0.0 (which equals 0.0 but is written "-0.0") as
    a string that ``float()`` reads back, so that blocks compare equal only when their
    text is the same. For values from outside (telemetry, GPU readings, the policy);
    call it only on a falsy value: ``v if v else _z(v)``."""
    return "-0.0" if type(v) is float and math.copysign(1.0, v) < 0 else v


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
