"""``modbridge run``: modules + GPUs + policy + power limits + exporter, in one loop.

Threads: one per module link (serial I/O, heartbeats), the metrics server, and the
bridge loop here. Every ``tick_s`` (and at once when a module reports an event) the
loop reads all GPUs (one NVML pass, or one nvidia-smi call), pairs each module with
its GPU, lets the policy decide, has the power limiters act, and publishes a fresh
:class:`~modbridge.model.BridgeSnapshot` that scrapes and ``status`` read. The links'
heartbeats carry the cached GPU reading of their pair; nothing slow runs in a link
thread or in a scrape.

Pairing: the config's ``[[module]]`` tables map module ids (the MCU unique id from
hello) or ports to GPU UUIDs / PCI bus ids; with one module and one GPU and no
mapping, they pair automatically. An unmapped module still gets heartbeats (without
GPU values) and metrics; its policy acts on no GPU.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .actuator import PowerLimiter
from .config import BridgeConfig, match_gpu
from .eventlog import EventLog
from .gpu.base import GpuBackend, GpuError, GpuSample
from .link import ModuleLink
from .model import BridgeSnapshot, ModuleStatus, PairState
from .policy import PairInput, PolicyEngine

log = logging.getLogger(__name__)


def heartbeat_fields(sample: GpuSample | None) -> dict | None:
    """A GPU reading as heartbeat fields in wire units (None fields omitted)."""
    if sample is None or sample.state != "ok":
        return None
    out = {}
    if sample.temperature_c is not None:
        out["gpu_temp"] = int(round(sample.temperature_c * 1000))
    if sample.memory_temperature_c is not None:
        out["gpu_mem_temp"] = int(round(sample.memory_temperature_c * 1000))
    if sample.power_w is not None:
        out["gpu_power"] = max(0, int(round(sample.power_w * 1000)))
    if sample.enforced_limit_w is not None:
        out["power_limit"] = max(0, int(round(sample.enforced_limit_w * 1000)))
    return out


class Bridge:
    def __init__(
        self,
        config: BridgeConfig,
        backend: GpuBackend,
        ports: list[str],
        event_log: EventLog | None = None,
        link_factory: Callable[..., ModuleLink] = ModuleLink,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.backend = backend
        self.ports = list(dict.fromkeys(ports))
        self.event_log = event_log
        self.clock = clock
        self.engine = PolicyEngine(config.policy, event_log)
        self.links: dict[str, ModuleLink] = {}
        self.limiters: dict[str, PowerLimiter] = {}
        self.samples: dict[str, GpuSample] = {}
        self.pairs: dict[str, PairState] = {}  # by port
        self.decision_at: dict[str, float] = {}  # reaction-time bookkeeping by GPU
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._snapshot = BridgeSnapshot(taken_at=clock(), backend=backend.name)
        self._link_factory = link_factory
        self.ticks = 0
        self.last_event_at: float | None = None

    # -- life cycle -----------------------------------------------------------------
    def start(self) -> Bridge:
        for info in self.backend.devices():
            lim = PowerLimiter(
                self.backend,
                info.uuid,
                dry_run=self.config.dry_run,
                on_exit=self.config.on_exit,
                log=self.event_log,
            )
            try:
                lim.start()
            except GpuError as e:
                log.warning("GPU %s: cannot read its power limit: %s", info.uuid, e)
            self.limiters[info.uuid] = lim
        self._refresh_gpus()
        for port in self.ports:
            status = ModuleStatus(port=port)
            link = self._link_factory(
                port,
                status=status,
                heartbeat_period_s=self.config.heartbeat_period_s,
                heartbeat_source=lambda p=port: self._heartbeat(p),
                on_event=self._on_event,
            )
            self.links[port] = link
            link.start()
        return self

    def stop(self, reason: str = "exit") -> None:
        """Stop the loop and the links; put the power limits back (per ``on_exit``)."""
        self._stop.set()
        self._wake.set()
        for link in self.links.values():
            link.stop()
        for lim in self.limiters.values():
            try:
                lim.close(reason)
            except Exception:  # noqa: BLE001 - restore every GPU whatever one does
                log.exception("restoring the power limit of %s failed", lim.uuid)

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Tick until :meth:`stop` (or ``until()`` is true)."""
        while not self._stop.is_set():
            self.tick()
            if until is not None and until():
                break
            self._wake.wait(self.config.tick_s)
            self._wake.clear()

    # -- callbacks from link threads ---------------------------------------------------
    def _on_event(self, status: ModuleStatus, msg) -> None:
        self.last_event_at = self.clock()
        self._wake.set()  # decide now, not at the next tick

    def _heartbeat(self, port: str) -> dict | None:
        pair = self.pairs.get(port)
        if pair is None or pair.gpu_uuid is None:
            return None
        return heartbeat_fields(self.samples.get(pair.gpu_uuid))

    # -- the tick ---------------------------------------------------------------------
    def _refresh_gpus(self) -> None:
        try:
            samples = self.backend.sample_all()
        except GpuError as e:
            log.warning("reading GPUs failed: %s", e)
            return
        self.samples = {s.uuid: s for s in samples}

    def _gpu_for(self, status: ModuleStatus) -> str | None:
        maps = self.config.modules
        for m in maps:
            if (m.module_id and m.module_id == status.module_id) or (
                m.port and m.port == status.port
            ):
                if m.gpu is None:
                    return next(iter(self.samples), None) if len(self.samples) == 1 else None
                for s in self.samples.values():
                    if match_gpu(m.gpu, s.uuid, s.pci_bus_id):
                        return s.uuid
                return None
        if not maps and len(self.links) == 1 and len(self.samples) == 1:
            return next(iter(self.samples))
        return None

    def tick(self) -> BridgeSnapshot:
        now = self.clock()
        self.ticks += 1
        self._refresh_gpus()
        inputs = []
        for port, link in self.links.items():
            st = link.status
            uuid = self._gpu_for(st)
            pair = self.pairs.get(port)
            if pair is None or pair.gpu_uuid != uuid or pair.module_id != st.module_id:
                pair = PairState(module_id=st.module_id, gpu_uuid=uuid)
                self.pairs[port] = pair
            lim = self.limiters.get(uuid) if uuid else None
            pair.original_limit_w = lim.original_w if lim else None
            inputs.append(
                PairInput(
                    module_id=st.module_id or port,
                    gpu_uuid=uuid,
                    module=st,
                    gpu=self.samples.get(uuid) if uuid else None,
                    link_up=st.link_up,
                    last_frame_age_s=st.last_frame_age_s(now),
                    original_limit_w=pair.original_limit_w,
                )
            )
        decisions = self.engine.step(now, inputs)
        by_key = {(d.module_id, d.gpu_uuid): d for d in decisions}
        for port, inp in zip(list(self.links), inputs, strict=True):
            d = by_key.get((inp.module_id, inp.gpu_uuid))
            pair = self.pairs[port]
            if d is None:
                continue
            pair.level = d.level
            pair.reasons = tuple(d.reasons)
            pair.eta_s = d.eta_s
            lim = self.limiters.get(inp.gpu_uuid) if inp.gpu_uuid else None
            if lim is None or not d.can_actuate:
                continue
            if d.target_limit_w is None:
                res = lim.restore("policy")
            else:
                res = lim.apply(d.target_limit_w, ",".join(d.reasons), d.values)
            if res is not None and res.action != "skip":
                self.decision_at[inp.gpu_uuid] = self.clock()
            pair.target_limit_w = d.target_limit_w
            pair.actions_total = lim.actions_total
            pair.limit_writes_refused = lim.refused_total
        self._snapshot = BridgeSnapshot(
            taken_at=self.clock(),
            modules=[link.status for link in self.links.values()],
            gpus=list(self.samples.values()),
            pairs=list(self.pairs.values()),
            backend=self.backend.name,
        )
        return self._snapshot

    def snapshot(self) -> BridgeSnapshot:
        """The latest snapshot (what a scrape serves): never blocks."""
        return self._snapshot
