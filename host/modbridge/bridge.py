"""``modbridge run``: modules + GPUs + policy + power limits + exporter, in one loop.

Threads: one I/O thread for every module link (:class:`~modbridge.link.io.LinkIO`: a
selector, serial I/O, heartbeats), the metrics server, and the bridge loop here.
Every ``tick_s`` the loop ticks (on a grid of the monotonic clock, just after the
links' heartbeats: :func:`tick_wait_s`): it reads all GPUs (one NVML pass, or one nvidia-smi
call), pairs each module with its GPU, lets the policy decide, has the power limiters
act, and publishes a fresh :class:`~modbridge.model.BridgeSnapshot` that scrapes and
``status`` read. An alarm event, a change of fault bits or a silence deadline is
decided at once, for that module's pair only: the I/O thread decides it right after
reading the frames (:meth:`Bridge._decide_urgent`, :meth:`Bridge._decide_pairs`;
ticks and urgent decisions take turns under one lock). The links' heartbeats carry
the cached GPU reading of their pair; nothing slow runs in a scrape.

Pairing: the config's ``[[module]]`` tables map module ids (the MCU unique id from
hello) or ports to GPU UUIDs / PCI bus ids; with one module and one GPU and no
mapping, they pair automatically. An unmapped module still gets heartbeats (without
GPU values) and metrics; its policy acts on no GPU.

Power limits (docs/bridge.md, "Power limits: journal, restore, ownership"): with a
state directory (``state_dir``; the CLI always gives one) every GPU the bridge may
act on is locked (:mod:`modbridge.actuator.gpulock`: a second bridge fails to start, naming
the first one's pid) and its limiter journals originals there
(:mod:`modbridge.actuator.journal`); a GPU found below its journaled original is restored at
start, before any module is opened. Without one (library use, tests) there is no
journal and no lock. Dry runs (``status``, ``monitor``) read the journal, never lock.

Stopping: :meth:`Bridge.request_stop` only sets flags (safe from a signal handler);
the loop returns and the caller runs :meth:`Bridge.stop`, which stops the links and
puts every power limit back (``on_exit``). :meth:`Bridge.install_signal_handlers`
wires SIGTERM/SIGINT/SIGHUP/SIGQUIT to that; a second signal restores at once and
exits 128+n.

Also here, for the CLI (docs/bridge.md): :func:`probe_modules` (``modbridge list``),
:func:`report` (the one object ``status`` prints as a table or as JSON, and the
monitor draws), and :func:`open_sim` (``--sim``: a :class:`SimFleet` and the mapping
module i -> GPU i).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

from modbridge.actuator import Actuator, ClockFractions, make_actuator
from modbridge.actuator.gpulock import GpuLock
from modbridge.actuator.journal import LimitJournal
from modbridge.actuator.power import SIGNALS, signal_name
from modbridge.chassis import ChassisLearner, ChassisReport
from modbridge.config import BridgeConfig, ModuleMapping, match_gpu
from modbridge.errors import ModbridgeError
from modbridge.exporter.eventlog import EventLog
from modbridge.gpu import simguard
from modbridge.gpu.base import (
    GpuBackend,
    GpuError,
    GpuInfo,
    GpuSample,
    error_sample,
    throttle_temp_c,
)
from modbridge.link.io import MAX_WAIT_S, LinkIO
from modbridge.link.keys import KeyStore
from modbridge.link.session import LinkError, ModuleLink
from modbridge.model import SILENT, BridgeSnapshot, LinkFreshness, ModuleStatus, PairState
from modbridge.policy.blindspots import FAN_MODE_AUTO
from modbridge.policy.engine import LEVEL_NAMES, PairInput, PolicyEngine
from modbridge.sanitize import sanitize

log = logging.getLogger(__name__)

# A refused power-limit write is retried (same target) at most this often: the
# driver's answer will not change every tick, and each refusal is an alert line.
REFUSED_RETRY_S = 30.0

# A tick that fails this many times in a row, for at least this long, is not one bad
# reading: the bridge restores every limit and exits non-zero (TickFailing), so that
# systemd's Restart=on-failure starts it again from a known state.
TICK_FAIL_LIMIT = 10
STOP_TICK_WAIT_S = 5.0  # stop() waits this long for a tick in progress
# The links' I/O thread wakes at least every MAX_WAIT_S (every heartbeat while a link is
# up): not woken for this long of the loop's running time, it is wedged, and the links'
# verdicts (its own) cannot be news: every module with frames is taken for silent.
IO_STALL_S = MAX_WAIT_S + 2.0
TICK_FAIL_MIN_S = 5.0


class NoModuleFound(ModbridgeError):
    """No module port to serve (none given, none discovered)."""

    exit_code = 3


class TickFailing(ModbridgeError):
    """The bridge loop failed :data:`TICK_FAIL_LIMIT` ticks in a row (and for at least
    :data:`TICK_FAIL_MIN_S`): every limit was restored, the process should exit."""

    exit_code = 1


class UnknownModule(ModbridgeError):
    """A module id that none of the connected modules has."""

    exit_code = 3


#: the loop ticks this long after the links' heartbeat grid points (tick_wait_s)
TICK_LAG_S = 0.002

# heartbeat ``gpu_slowdown`` range (protocol/catalog.py), degC
SLOWDOWN_MIN_C = 40
SLOWDOWN_MAX_C = 125


# Pushing a converged chassis model to its module (Bridge._push_chassis): again only when
# its estimate would move by MODEL_PUSH_MOVE_MC at some operating point and an hour has
# passed (each push is a flash save); a failed push is retried after 5 minutes.
MODEL_PUSH_MIN_S = 3600.0
MODEL_PUSH_RETRY_S = 300.0
MODEL_PUSH_MOVE_MC = 1000


def model_moved(old: dict, new: dict) -> bool:
    """Whether the model ``new`` (``model.*`` config fields) moves an estimate by
    ``MODEL_PUSH_MOVE_MC`` or more against ``old`` at one of a few operating points
    (probe 40..90 degC over an ambient of 25, 0..600 W, duty 20..100 %), or changes
    ``ok``, ``slow_mc`` or ``unc_mc`` by a degree or more."""
    if old.get("model.ok") != new.get("model.ok"):
        return True
    for k in ("model.slow_mc", "model.unc_mc"):
        if abs(int(old.get(k, 0)) - int(new.get(k, 0))) >= MODEL_PUSH_MOVE_MC:
            return True
    from modbridge.chassis import fw

    po = {k[6:]: int(v) for k, v in old.items() if k.startswith("model.")}
    pn = {k[6:]: int(v) for k, v in new.items() if k.startswith("model.")}
    for g in (40000, 65000, 90000):
        for p in (0, 300000, 600000):
            for d in (13107, 65535):
                eo = fw.estimate(po, g, g, 25000, p, d)
                en = fw.estimate(pn, g, g, 25000, p, d)
                if abs(eo - en) >= MODEL_PUSH_MOVE_MC:
                    return True
    return False


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
    slowdown = throttle_temp_c(sample)
    if slowdown is not None and slowdown <= SLOWDOWN_MAX_C:  # above: lowers nothing
        out["gpu_slowdown"] = max(SLOWDOWN_MIN_C * 1000, int(round(slowdown * 1000)))
    return out


def tick_wait_s(now: float, tick_s: float, lag_s: float = TICK_LAG_S) -> float:
    """Seconds from ``now`` (the monotonic clock) to the loop's next tick: the next
    point of the grid ``k * tick_s + lag_s``, a wake-up up to 5 % of ``tick_s`` early
    counted as on time (so it never ticks twice for one point), hence between 0.95
    and 1.05 ``tick_s`` after a tick on the grid, less after an urgent one.

    The links' heartbeats fall on ``k * period`` of the same clock
    (:meth:`ModuleLink._send_heartbeat`), so with the default 1 s period every other
    tick comes ``lag_s`` after the I/O thread has sent the heartbeats: the two threads
    run back to back once a second, the tick on the interpreter's code and data the
    heartbeats have just brought back into the caches, instead of waking apart
    (docs/bridge-benchmarks.md, CPU). A tick a few ms before the heartbeats would give
    them a fresher GPU reading but saves nothing: measured, the same CPU as no grid.

    >>> [round(tick_wait_s(t, 0.5), 3) for t in (100.002, 100.0, 100.25, 100.49, 100.5)]
    [0.5, 0.502, 0.252, 0.512, 0.502]
    """
    k = math.floor((now - lag_s) / tick_s + 0.05)
    return max(0.0, (k + 1) * tick_s + lag_s - now)


def _same_port(a: str | None, b: str | None) -> bool:
    """The same device: equal paths, or paths resolving to the same node."""
    if not a or not b:
        return False
    return a == b or os.path.realpath(a) == os.path.realpath(b)


class Bridge:
    def __init__(
        self,
        config: BridgeConfig,
        backend: GpuBackend,
        ports: list[str],
        event_log: EventLog | None = None,
        link_factory: Callable[..., ModuleLink] = ModuleLink,
        clock: Callable[[], float] = time.monotonic,
        keys: KeyStore | None = None,
        state_dir: str | os.PathLike | None = None,
    ):
        self.config = config
        # the journal of original limits and the GPU locks; None: the config's (or none)
        self.state_dir = state_dir if state_dir is not None else config.state_dir
        self.journal: LimitJournal | None = None
        self.locks: dict[str, GpuLock] = {}
        # the modules' signing keys (docs/pairing.md); None: the config's, else the default
        self.keys = keys if keys is not None else KeyStore.for_config(config)
        self.backend = backend
        self.ports = list(dict.fromkeys(ports))
        self.event_log = event_log
        self.clock = clock
        # silence is the links' verdict (status.freshness), taken by the policy as a fact
        self.engine = PolicyEngine(config.policy, event_log)
        self.io = LinkIO()  # one I/O thread (a selector) for every module link
        self.io.after_iteration = self._decide_urgent
        self.urgent_ticks = 0  # ticks run at once for an alarm, fault change or silence
        self.inline_ticks = 0  # of those, run in the I/O thread (no hand-off)
        # Urgent ticks run in the I/O thread right after the frames are read, unless
        # a GPU read is a subprocess (nvidia-smi: ~21 ms that would hold every port)
        self.decide_inline = backend.name != "nvidia-smi"
        self._urgent_ports: set[str] = set()  # ports whose pair is to be decided now
        self._tick_lock = threading.Lock()  # one tick at a time, whichever thread
        self.links: dict[str, ModuleLink] = {}
        self.limiters: dict[str, Actuator] = {}  # power, clocks or both, per GPU
        self.samples: dict[str, GpuSample] = {}
        self.pairs: dict[str, PairState] = {}  # by port
        self.decision_at: dict[str, float] = {}  # reaction-time bookkeeping by GPU
        self._wake = threading.Event()
        self._faults_seen: dict[str, tuple] = {}  # port -> (faults, module id, reconnects)
        self._stop = threading.Event()
        self._stopped = False
        self._snapshot = BridgeSnapshot(taken_at=clock(), backend=backend.name)
        self._link_factory = link_factory
        self._link_seen: dict[str, tuple] = {}  # port -> (link_up, module_id, reconnects)
        self._mapping_checked = False
        self._refused: dict[str, tuple[float, float]] = {}  # uuid -> (target W, when)
        self.duplicates: dict[str, tuple[str, ...]] = {}  # module id -> its ports (>= 2)
        self._had_module: set[str] = set()  # GPUs a module was mapped to once
        self._refused_pairs: set[tuple] = set()  # (port, id) told why it has no GPU
        self._untrusted: dict[str, str] = {}  # GPU -> why its module is untrusted (alerted)
        self._id_port: dict[str, str] = {}  # module id -> the one port that may map it
        self._mapped: dict[tuple, str | None] = {}  # _gpu_for's answers, while valid for
        self._mapped_for: tuple | None = None  # (GPUs read, _id_port, duplicates)
        self.ticks = 0
        self.io_stalled_s = 0.0  # the loop's running time since the I/O thread last woke
        self._io_watch: tuple | None = None  # (its iterations, the loop's last tick)
        self.tick_errors = 0
        self.tick_failures_in_a_row = 0
        self._failing_since: float | None = None
        self.last_event_at: float | None = None
        self.stop_reason: str | None = None
        self.signal_received: int | None = None
        self.control = None  # the control socket's server (serve_control), if any
        # the chassis model per module key (modbridge.chassis, docs/control.md)
        self.chassis: dict[str, ChassisLearner] = {}
        self.chassis_reports: dict[str, ChassisReport] = {}
        self._chassis_fed: dict[str, object] = {}  # port -> the telemetry dict last fed
        self.wall_clock: Callable[[], float] = time.time  # the trend's days
        self.push_models = True  # send converged chassis models (_push_chassis)
        self._chassis_pushed: dict[str, tuple[dict, float, bool]] = {}  # key -> last push

    # -- life cycle -----------------------------------------------------------------
    def _owned_gpus(self) -> list:
        """The GPUs this bridge may act on: those the config maps (all of them when a
        mapping names no GPU, or there is no mapping)."""
        infos = self.backend.devices()
        specs = [m.gpu for m in self.config.modules]
        if not specs or any(g is None for g in specs):
            return infos
        return [i for i in infos if any(match_gpu(g, i.uuid, i.pci_bus_id) for g in specs)]

    def _open_state(self, infos) -> None:
        """The journal and (not in a dry run) one lock per GPU; on GpuBusy or
        JournalError the locks already taken are released and the error raised."""
        if self.state_dir is None:
            log.warning("no state directory: power-limit originals are not journaled")
            return
        self.journal = LimitJournal(self.state_dir)
        if self.config.dry_run:
            return
        try:
            self.journal.ensure()
            for info in infos:
                self.locks[info.uuid] = GpuLock(
                    self.state_dir, info.uuid, key=self.backend.owner_key(info.uuid)
                ).acquire()
        except ModbridgeError:
            self._release_locks()
            raise
        present = {i.uuid for i in self.backend.devices()}
        for uuid in self.journal.uuids():
            if uuid not in present:
                msg = (
                    f"GPU {uuid} has a journaled original limit but is not present: it "
                    "cannot be restored now (`modbridge restore` once it is back)"
                )
                log.warning("%s", msg)
                self._write_event("power_limit", gpu_uuid=uuid, level="alert",
                                  action="journal", message=msg)  # fmt: skip

    def _release_locks(self) -> None:
        for lock in self.locks.values():
            lock.release()
        self.locks.clear()

    def start(self) -> Bridge:
        """Lock and journal (with a state dir), save every GPU's power limit (restoring
        a journaled original first), read the GPUs once, open every module link.

        Another bridge owning a GPU raises :class:`~modbridge.actuator.gpulock.GpuBusy`, an
        unusable state dir :class:`~modbridge.actuator.journal.JournalError`, before anything is
        written. A port that cannot be opened for good (busy, permission) raises its
        :class:`~modbridge.link.session.LinkError` after the links already started are
        stopped again; a missing port is retried by its link (plug it in later).
        """
        infos = self._owned_gpus()
        self._open_state(infos)
        for info in infos:
            lim = make_actuator(  # docs/bridge.md, "Locked clocks"
                self.config.actuator_for(info.uuid, info.pci_bus_id),
                self.backend,
                info.uuid,
                fallback=self.config.fallback,
                fractions=ClockFractions(
                    self.config.clocks_warn_fraction, self.config.clocks_critical_fraction
                ),
                dry_run=self.config.dry_run,
                on_exit=self.config.on_exit,
                log=self.event_log,
                journal=self.journal,
                monotonic=self.clock,
            )
            try:
                lim.start()
            except GpuError as e:
                log.warning("GPU %s: cannot read its power limit: %s", info.uuid, e)
            self.limiters[info.uuid] = lim
        self._refresh_gpus()
        for port in self.ports:
            link = self._link_factory(
                port,
                status=ModuleStatus(port=port),
                heartbeat_period_s=self.config.heartbeat_period_s,
                heartbeat_source=lambda p=port: self._heartbeat(p),
                on_event=self._on_event,
                on_telemetry=self._on_telemetry,
                on_silent=self._on_silent,
                silence_max_s=self.config.policy.module_silent_s,
                keys=self.keys,
                io=self.io,
            )
            try:
                link.start()
            except LinkError:
                for started in self.links.values():
                    started.stop()
                self.links.clear()
                self.io.stop()
                raise
            self.links[port] = link
        # A first snapshot at once: a scrape before the first tick sees the modules.
        self._snapshot = self._build_snapshot()
        self._write_event(
            "bridge",
            action="start",
            backend=self.backend.name,
            ports=list(self.ports),
            gpus=list(self.limiters),
            dry_run=self.config.dry_run,
        )
        return self

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every link is up and has sent telemetry (or ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        for link in self.links.values():
            left = deadline - time.monotonic()
            if left <= 0 or not link.wait_up(left):
                return False
        while time.monotonic() < deadline:
            if all(link.status.telemetry for link in self.links.values()):
                return True
            time.sleep(0.02)
        return all(link.status.telemetry for link in self.links.values())

    def request_stop(self, reason: str = "stop") -> None:
        """Make :meth:`run` return soon. Only sets flags: safe in a signal handler."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()
        self._wake.set()

    def stop(self, reason: str | None = None) -> bool:
        """Stop the loop and the links; put the power limits back (per ``on_exit``).

        Idempotent. Returns False if a limit could not be restored (the event log
        and the log say which and why)."""
        reason = reason or self.stop_reason or "exit"
        self.request_stop(reason)
        if self._stopped:
            return True
        self._stopped = True
        if self.control is not None:
            self.control.stop()
        for link in self.links.values():
            link.stop()
        self.io.stop()
        # an urgent tick the I/O thread was running is over (stop joined it); one the
        # loop runs is not (signals): wait for it, bounded, before restoring
        got = self._tick_lock.acquire(timeout=STOP_TICK_WAIT_S)
        try:
            return self._restore_all(reason)
        finally:
            if got:
                self._tick_lock.release()

    def _restore_all(self, reason: str) -> bool:
        ok = True
        for lim in self.limiters.values():
            try:
                res = lim.close(reason)
            except Exception:  # noqa: BLE001 - restore every GPU whatever one does
                log.exception("restoring the power limit of %s failed", lim.uuid)
                ok = False
                continue
            if res is not None and res.error is not None:
                ok = False
            if lim.holding and lim.on_exit == "restore" and not lim.dry_run:
                ok = False
        self._release_locks()
        self._write_event("bridge", action="stop", reason=reason, limits_restored=ok)
        return ok

    def restore_limits(self, reason: str) -> None:
        """Close every limiter now (a second signal: do not wait for the loop)."""
        for lim in self.limiters.values():
            try:
                lim.close(reason)
            except Exception:  # noqa: BLE001 - restore the others whatever one does
                log.exception("restoring the power limit of %s failed", lim.uuid)

    def install_signal_handlers(self, signals=SIGNALS) -> Callable:
        """Any signal that would end the process (SIGTERM, SIGINT, SIGHUP, SIGQUIT,
        SIGUSR1, SIGUSR2...: :data:`~modbridge.actuator.power.SIGNALS`):
        :meth:`request_stop` (the caller's :meth:`stop` restores the limits and the
        process exits 0). A second signal
        before that: restore now and exit 128 + n. Main thread only; returns a function
        putting the old ones back."""

        def handler(signum, frame):
            name = signal_name(signum)
            if self._stop.is_set():
                self.restore_limits(f"signal {name} (second)")
                raise SystemExit(128 + signum)
            self.signal_received = signum
            self.request_stop(f"signal {name}")

        previous = {sig: signal.signal(sig, handler) for sig in signals}

        def uninstall():
            for sig, old in previous.items():
                signal.signal(sig, old)

        return uninstall

    def run(
        self,
        until: Callable[[], bool] | None = None,
        on_tick: Callable[[BridgeSnapshot], None] | None = None,
    ) -> None:
        """Tick until :meth:`request_stop`/:meth:`stop` (or ``until()`` is true).

        A tick that raises is logged and counted (``tick_errors``); the loop goes on:
        the module keeps cooling, and the next tick may well work. One that keeps
        failing (:data:`TICK_FAIL_LIMIT` in a row over at least :data:`TICK_FAIL_MIN_S`)
        is not going to: :meth:`fail_safe` restores every limit and :class:`TickFailing`
        is raised (``modbridge run`` exits 1, systemd restarts it)."""
        while not self._stop.is_set():
            try:
                snap = self.tick()
            except Exception as e:  # noqa: BLE001 - one failing tick never ends the loop
                snap = self._tick_failed(e)
            else:
                self.tick_failures_in_a_row = 0
                self._failing_since = None
            if on_tick is not None:
                on_tick(snap)
            if until is not None and until():
                break
            # an alarm, a change of fault bits or a silence deadline (the I/O thread)
            # sets _wake: the next tick runs at once, not at the next grid point
            if self._wake.wait(tick_wait_s(self.clock(), self.config.tick_s)) and (
                not self._stop.is_set()
            ):
                self.urgent_ticks += 1
            self._wake.clear()

    def _tick_failed(self, exc: Exception) -> BridgeSnapshot:
        self.tick_errors += 1
        self.tick_failures_in_a_row += 1
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            log.exception("bridge tick failed (%d so far)", self.tick_errors)
        else:
            log.debug("bridge tick failed again (%d in a row)", self.tick_failures_in_a_row,
                      exc_info=True)  # fmt: skip
        failing_s = now - self._failing_since
        if self.tick_failures_in_a_row >= TICK_FAIL_LIMIT and failing_s >= TICK_FAIL_MIN_S:
            why = (
                f"the bridge loop failed {self.tick_failures_in_a_row} ticks in a row over "
                f"{failing_s:.1f} s (last: {type(exc).__name__}: {sanitize(exc)})"
            )
            ok = self.fail_safe(why)
            raise TickFailing(
                f"{why}: {'limits restored' if ok else 'NOT every limit could be restored'}; "
                "exiting so that the service restarts from a known state"
            ) from exc
        return self._snapshot

    def fail_safe(self, why: str) -> bool:
        """Stop, restore every limit through the limiters, then once more from the
        journal (whatever state the limiters are in after the failures). Returns
        False if a GPU could not be put back."""
        log.error("%s: restoring every power limit", why)
        self._write_event("bridge", level="alert", action="fail_safe", message=why)
        ok = self.stop(why)
        if self.journal is not None and not self.config.dry_run:
            from modbridge.actuator import restore_journaled

            try:
                rows = restore_journaled(self.backend, self.state_dir, log=self.event_log)
            except Exception:  # noqa: BLE001 - the limiters' restore above stands
                log.exception("restoring from the journal %s failed", self.state_dir)
                return False
            ok = ok and all(r.get("ok", False) for r in rows)
        return ok

    # -- callbacks from link threads ---------------------------------------------------
    def _on_telemetry(self, status: ModuleStatus, msg) -> None:
        """A change of the module's fault bits is news: decide now, not at the next
        tick (one int comparison per frame; the firmware also sends telemetry at once
        after an alarm event)."""
        # the first frame of a module (a new id on the port) is news too: a duplicate id;
        # a frame before the module's hello names no module yet: the tick decides it
        if status.module_id is None:
            return
        seen = (msg.fields.get("faults", 0), status.module_id, status.reconnects)
        if self._faults_seen.get(status.port, (0,)) != seen:
            self._faults_seen[status.port] = seen
            self._urgent(status.port)

    def _on_silent(self, status: ModuleStatus) -> None:
        """A module's silence deadline passed (I/O thread): decide now."""
        self._urgent(status.port)

    def _urgent(self, port: str) -> None:
        """Decide ``port``'s pair now (called in the I/O thread): by
        :meth:`_decide_urgent` once the frames of this wake-up are all read, or by the
        loop (a full tick) if it cannot be inline."""
        self._urgent_ports.add(port)
        if not self.decide_inline:
            self._wake.set()

    def _decide_urgent(self) -> None:
        """After a wake-up of the I/O thread: the pairs an alarm, a change of fault bits
        or a silence asked for, decided right here (no hand-off to the loop's thread),
        and only those (:meth:`_decide_pairs`: their GPUs read, their limits acted on;
        the other pairs wait for the loop's next tick). The I/O thread never waits for
        the loop: if the loop is ticking now, or the decision fails, the loop ticks
        again at once (and counts a failure: ``run``'s fail-safe sees every failing
        tick)."""
        if not self._urgent_ports:
            return
        ports = [p for p in self.links if p in self._urgent_ports]
        self._urgent_ports.clear()
        if self._stop.is_set() or not self.decide_inline:
            return
        if not self._tick_lock.acquire(blocking=False):
            self._wake.set()
            return
        try:
            self._decide_pairs(ports)
        except Exception:  # noqa: BLE001 - the loop's own tick reports and counts it
            log.debug("urgent decision in the I/O thread failed", exc_info=True)
            self._wake.set()
        else:
            self.urgent_ticks += 1
            self.inline_ticks += 1
        finally:
            self._tick_lock.release()

    def _on_event(self, status: ModuleStatus, msg) -> None:
        self.last_event_at = self.clock()
        ev = status.recent_events[-1] if status.recent_events else {}
        self._write_event(
            "module_event",
            module_id=status.module_id or status.port,
            port=status.port,
            reason=ev.get("reason"),
            fields={k: v for k, v in msg.fields.items()},
        )
        self._urgent(status.port)  # decide now, not at the next tick

    def _heartbeat(self, port: str) -> dict | None:
        pair = self.pairs.get(port)
        if pair is None or pair.gpu_uuid is None:
            return None
        return heartbeat_fields(self.samples.get(pair.gpu_uuid))

    def _write_event(self, kind: str, **fields) -> None:
        if self.event_log is not None:
            self.event_log.write(kind, **fields)

    # -- the tick ---------------------------------------------------------------------
    def _refresh_gpus(self) -> None:
        try:
            samples = self.backend.sample_all()
        except GpuError as e:
            log.warning("reading GPUs failed: %s", e)
            return
        self.samples = {s.uuid: s for s in samples}

    def _refresh_gpu(self, uuid: str) -> GpuSample | None:
        """Read one GPU again (an urgent decision: the one its pair acts on)."""
        old = self.samples.get(uuid)
        try:
            sample = self.backend.sample(uuid)
        except GpuError as e:
            if old is None:
                return None
            sample = error_sample(GpuInfo(uuid, old.name, old.pci_bus_id), e)
        self.samples[uuid] = sample
        return sample

    def _gpu_for(self, status: ModuleStatus) -> str | None:
        """The GPU a module is mapped to (None: none, or not now). Remembered per
        (port, module id, reconnects) while the GPUs read, the duplicate ids and the
        ports that may map an id stay the same."""
        m = self._mapped_for
        if (m is None or m[0] != self.samples.keys() or m[1] != self._id_port
                or m[2] != self.duplicates):  # fmt: skip
            self._mapped = {}
            self._mapped_for = (set(self.samples), dict(self._id_port), dict(self.duplicates))
        key = (status.port, status.module_id, status.reconnects)
        if key not in self._mapped:
            self._mapped[key] = self._find_gpu(status)
        return self._mapped[key]

    def _find_gpu(self, status: ModuleStatus) -> str | None:
        why = simguard.refusal(status.board, getattr(self.backend, "simulated", False))
        if why is not None:  # never a simulated module on a real GPU, nor the reverse
            self._refuse_pair(status, why)
            return None
        mid = status.module_id
        maps = self.config.modules
        if mid is not None and mid in self.duplicates:
            # two live modules with one id: which one cools the GPU is unknown, unless a
            # [[module]] port pins this one (the GPU of a module left unmapped is
            # protected by its own pair: _gpu_inputs)
            maps = [m for m in maps if m.port and _same_port(m.port, status.port)]
            if not maps:
                return None
        elif mid is not None and self._id_port.get(mid, status.port) != status.port:
            return None  # a link down whose id is live on another port: it moved there
        # exact matches first: resolving symlinks costs a syscall per path and pair
        exact = [
            m
            for m in maps
            if (m.module_id and m.module_id == status.module_id) or m.port == status.port
        ]
        for m in exact or maps:
            if (m.module_id and m.module_id == status.module_id) or (
                m.port and _same_port(m.port, status.port)
            ):
                if m.module_id and status.module_id and m.module_id != status.module_id:
                    continue  # the port's mapping names another module: not this one
                if m.gpu is None:
                    return next(iter(self.samples), None) if len(self.samples) == 1 else None
                for s in self.samples.values():
                    if match_gpu(m.gpu, s.uuid, s.pci_bus_id):
                        return s.uuid
                return None
        if not maps and len(self.links) == 1 and len(self.samples) == 1:
            return next(iter(self.samples))
        return None

    def _refuse_pair(self, status: ModuleStatus, why: str) -> None:
        """Say once per module (port and id) why it is paired with no GPU."""
        key = (status.port, status.module_id)
        if key in self._refused_pairs:
            return
        self._refused_pairs.add(key)
        msg = f"module {sanitize(status.module_id or '?')} on {status.port}: {why}"
        log.warning("%s", msg)
        self._write_event("config", level="alert", module_id=status.module_id or status.port,
                          port=status.port, message=msg)  # fmt: skip

    def _note_links(self) -> None:
        """Log link transitions (up, down, reconnect, another module) once each."""
        for port, link in self.links.items():
            st = link.status
            now = (st.link_up, st.module_id, st.reconnects)
            was = self._link_seen.get(port)
            if was == now:
                continue
            self._link_seen[port] = now
            if was is None and not st.link_up:
                continue  # not up yet at start: not news
            self._write_event(
                "link",
                module_id=st.module_id or port,
                port=port,
                up=st.link_up,
                reconnects=st.reconnects,
                fw_version=st.fw_version,
                error=None if st.link_up else st.last_error,
            )
        if not self._mapping_checked and all(link.status.module_id for link in self.links.values()):
            self._mapping_checked = True
            for problem in self.check_mapped_modules():
                log.warning("config: %s", problem)
                self._write_event("config", level="alert", message=problem)

    def _note_duplicates(self) -> None:
        """Two (or more) links up with modules announcing the same unique id: neither is
        mapped to a GPU (``_gpu_for``), each keeps a pair and metrics of its own under
        ``<id>@<port>``, and the alert (log + event log, once per episode) names every
        port. When all but one go away, the survivor is mapped again."""
        ports_of: dict[str, list[str]] = {}
        id_port: dict[str, str] = {}
        for port, link in self.links.items():
            st = link.status
            if st.module_id is None:
                continue
            if st.link_up:
                ports_of.setdefault(st.module_id, []).append(port)
                id_port[st.module_id] = port
            else:  # a link down keeps its last id: it maps only if no live link has it
                id_port.setdefault(st.module_id, port)
        self._id_port = id_port
        dups = {uid: tuple(p) for uid, p in ports_of.items() if len(p) > 1}
        if dups == self.duplicates:
            return
        for uid, ports in dups.items():
            if self.duplicates.get(uid) == ports:
                continue
            msg = (
                f"module id {sanitize(uid)} is announced on {len(ports)} ports "
                f"({', '.join(ports)}): two modules with one unique id (a cloned board?); "
                "none of them is mapped to a GPU until only one is left"
            )
            log.warning("%s", msg)
            self._write_event("duplicate_module", level="alert", module_id=uid,
                              ports=list(ports), message=msg)  # fmt: skip
        for uid in self.duplicates:
            if uid not in dups:
                left = ports_of.get(uid, [])
                msg = (
                    f"module id {sanitize(uid)} is on one port again "
                    f"({', '.join(left) or 'none connected'}): mapped as configured"
                )
                log.info("%s", msg)
                self._write_event("duplicate_module", level="info", module_id=uid,
                                  ports=list(left), message=msg)  # fmt: skip
        self.duplicates = dups
        for link in self.links.values():
            st = link.status
            st.duplicate_ports = dups.get(st.module_id, ()) if st.link_up else ()

    def _return_to_auto(self, port: str, d) -> None:
        """Ask the module on ``port`` for automatic fan control, off the loop's thread
        (the policy rate-limits the asks: docs/policy.md, "Returning a module to
        automatic control"); the outcome is logged and written as a ``fan_mode`` event."""
        link = self.links.get(port)
        if link is None:
            return
        ask = dict(d.values.get("return_to_auto") or {})
        who = sanitize(d.module_id or port)

        def send():
            try:
                link.request("fan_mode", dict(FAN_MODE_AUTO))
                result, msg = "ok", "module returned to automatic fan control"
            except LinkError as e:
                result, msg = "failed", str(e)
            (log.info if result == "ok" else log.warning)(
                "module %s: fan_mode auto (attempt %s): %s", who, ask.get("attempt"), msg
            )
            self._write_event("fan_mode", module_id=d.module_id, port=port, action="auto",
                              result=result, message=msg, **ask)  # fmt: skip

        log.warning("module %s in MANUAL below automatic while hot: asking for fan_mode auto",
                    who)  # fmt: skip
        threading.Thread(target=send, name=f"modbridge-auto {port}", daemon=True).start()

    def _act(self, uuid: str, lim: Actuator, d, now: float):
        if not lim.wants(d.level, d.target_limit_w):
            self._refused.pop(uuid, None)
            return lim.restore("policy: " + (",".join(d.reasons) or "all clear"))
        refused = self._refused.get(uuid)
        want = (d.level, d.target_limit_w)
        if refused is not None and refused[0] == want and now - refused[1] < REFUSED_RETRY_S:
            return None  # refused a moment ago: not again every tick
        res = lim.apply(d.target_limit_w, ",".join(d.reasons), d.values, level=d.level)
        if res.action == "backoff":
            return None
        if res.action in ("refused", "failed"):  # the same back-off for both
            self._refused[uuid] = (want, now)
        else:
            self._refused.pop(uuid, None)
        return res

    def tick(self) -> BridgeSnapshot:
        """Read the GPUs, decide for every pair, act, publish a snapshot. Thread-safe:
        the loop and the I/O thread's urgent decisions take turns."""
        with self._tick_lock:
            return self._tick()

    def _tick(self) -> BridgeSnapshot:
        now = self.clock()
        self.ticks += 1
        self._watch_io(now)
        self._refresh_gpus()
        for uuid, lim in self.limiters.items():
            lim.observe(self.samples.get(uuid))  # the current limit is the truth
        self._note_links()
        self._note_duplicates()
        ports = list(self.links)
        inputs = [self._pair_input(port, now) for port in ports]
        keys, more = self._gpu_inputs(inputs)
        ports, inputs = ports + keys, inputs + more
        self._apply(ports, inputs, self.engine.step(now, inputs), now)
        self._note_untrusted(inputs)
        self._learn_chassis()
        if self.push_models:
            self._push_chassis(now)
        self._snapshot = self._build_snapshot()
        return self._snapshot

    # -- the chassis model ---------------------------------------------------------------
    def _chassis_path(self, key: str):
        if self.state_dir is None:
            return None
        safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in key)[:120]
        return os.path.join(os.fspath(self.state_dir), "chassis", safe + ".json")

    def _learn_chassis(self) -> None:
        """Feed each paired module's learner what this tick has: the module's latest
        telemetry (once per frame) and its GPU's reading. A failing learner is logged
        and skipped: the model never stops the tick."""
        for port, link in self.links.items():
            st = link.status
            pair = self.pairs.get(port)
            tel = st.telemetry
            if st.module_id is None or not tel or pair is None or pair.gpu_uuid is None:
                continue
            if self._chassis_fed.get(port) is tel:
                continue
            sample = self.samples.get(pair.gpu_uuid)
            if sample is None or sample.state != "ok":
                continue
            self._chassis_fed[port] = tel
            key = st.key()
            try:
                learner = self.chassis.get(key)
                if learner is None:
                    learner = self.chassis[key] = ChassisLearner(self._chassis_path(key))
                learner.observe(
                    t_s=self.wall_clock(),
                    g=tel.get("temp_gpu"),
                    a=tel.get("temp_amb"),
                    p_mw=tel.get("p_in"),
                    duties=(tel.get("fan1_duty"), tel.get("fan2_duty")),
                    rpms=(tel.get("fan1_rpm"), tel.get("fan2_rpm")),
                    die_c=sample.temperature_c,
                    gpu_power_w=sample.power_w,
                    slowdown_c=throttle_temp_c(sample),
                )
                self.chassis_reports[key] = learner.report()
            except Exception:  # noqa: BLE001 - a model bug must not stop the bridge
                log.exception("the chassis model of %s failed", key)

    def _push_chassis(self, now: float) -> None:
        """Send each converged model to its module (signed ``config_set`` of the
        ``model.*`` keys, then ``config_save``), off the loop's thread: once when it
        first converges, then again only when an estimate would move by
        ``MODEL_PUSH_MOVE_MC`` or more and ``MODEL_PUSH_MIN_S`` have passed (flash
        wear: every push is a save). A refused or failed push is logged and retried
        after ``MODEL_PUSH_RETRY_S``. The module bounds and checks every key itself
        (docs/firmware.md, "The chassis model"): a model only adds protection there."""
        for port, link in list(self.links.items()):
            key = link.status.key() if link.status.module_id else None
            learner = self.chassis.get(key) if key else None
            if learner is None:
                continue
            try:
                fields = learner.config_fields()
            except Exception:  # noqa: BLE001 - a model bug must not stop the bridge
                log.exception("the chassis model of %s failed", key)
                continue
            if not fields:
                continue
            last = self._chassis_pushed.get(key)
            if last is not None:
                sent, at, ok = last
                wait = MODEL_PUSH_MIN_S if ok else MODEL_PUSH_RETRY_S
                if now - at < wait or (ok and not model_moved(sent, fields)):
                    continue
            self._chassis_pushed[key] = (fields, now, True)
            threading.Thread(
                target=self._send_model, args=(link, key, fields, now),
                name=f"modbridge-model {port}", daemon=True,
            ).start()  # fmt: skip

    def _send_model(self, link, key: str, fields: dict, now: float) -> None:
        try:
            link.request("config_set", {"values": dict(fields)})
            link.request("config_save", None, timeout=10.0)
            result, msg = "ok", "chassis model sent and saved"
        except LinkError as e:
            self._chassis_pushed[key] = (fields, now, False)
            result, msg = "failed", str(e)
        (log.info if result == "ok" else log.warning)("module %s: %s", sanitize(key), msg)
        self._write_event("chassis_model", module_id=key, result=result, message=msg,
                          fields=dict(fields))  # fmt: skip

    def chassis_config_fields(self, module: str) -> dict | None:
        """The ``config_set`` fields of ``module``'s converged probe -> die model
        (``model.*`` ints within the firmware's bounds, ``model.ok`` 1), or None
        before it has converged. The caller sends them (signed) and ``config_save``."""
        learner = self.chassis.get(module)
        return None if learner is None else learner.config_fields()

    def _expected_gpus(self) -> list[str]:
        """The GPUs a module is meant to cool: those a ``[[module]]`` table names (the
        one GPU, for a table naming none), or with no table the one GPU there is when
        there are modules. With no table and several GPUs, which ones have a module is
        unknown: none is expected (``status`` shows the unpaired)."""
        maps = self.config.modules
        if not maps:
            return list(self.samples) if len(self.samples) == 1 and self.links else []
        out = []
        for s in self.samples.values():
            if any(match_gpu(m.gpu, s.uuid, s.pci_bus_id) if m.gpu is not None
                   else len(self.samples) == 1 for m in maps):  # fmt: skip
                out.append(s.uuid)
        return out

    def _gpu_inputs(self, inputs: list[PairInput]) -> tuple[list[str], list[PairInput]]:
        """A pair of its own for every GPU a module is meant to cool that no trusted
        module is mapped to now: the policy treats it as a GPU without working cooling
        (``module_untrusted``: ``duplicate_id`` while its module's id is announced twice,
        ``module_lost`` once a module was mapped to it, else ``unmapped`` after the
        never-heard grace), never as one that needs nothing. Keys ``gpu:<uuid>``."""
        mapped = {i.gpu_uuid for i in inputs if i.gpu_uuid is not None}
        self._had_module.update(mapped)
        keys, out = [], []
        for uuid in self._expected_gpus():
            key = f"gpu:{uuid}"
            if uuid in mapped:
                self.pairs.pop(key, None)
                continue
            why = "duplicate_id" if self._duplicate_for(uuid) else (
                "module_lost" if uuid in self._had_module else "unmapped")  # fmt: skip
            pair = self.pairs.get(key)
            if pair is None:
                pair = self.pairs[key] = PairState(module_id=None, gpu_uuid=uuid)
            lim = self.limiters.get(uuid)
            pair.original_limit_w = lim.original_w if lim else None
            keys.append(key)
            out.append(PairInput(module_id=None, gpu_uuid=uuid, gpu=self.samples.get(uuid),
                                 original_limit_w=pair.original_limit_w,
                                 untrusted=why))  # fmt: skip
        for key in [k for k in self.pairs if k.startswith("gpu:") and k not in keys]:
            del self.pairs[key]  # a GPU no longer there
        return keys, out

    def _duplicate_for(self, uuid: str) -> bool:
        """Is a module meant for GPU ``uuid`` one whose id is announced twice? (By the
        mapping's id; without one, any duplicate: which module cools it is unknown.)"""
        if not self.duplicates:
            return False
        s = self.samples.get(uuid)
        named = [m for m in self.config.modules if s is not None and (
            m.gpu is None or match_gpu(m.gpu, s.uuid, s.pci_bus_id))]  # fmt: skip
        return not named or any(m.module_id in self.duplicates or m.module_id is None
                                for m in named)  # fmt: skip

    def _note_untrusted(self, inputs: list[PairInput]) -> None:
        """One alert per episode for a GPU protected because its module cannot be
        trusted (log + event log ``untrusted_module``), one info when it ends."""
        now_untrusted = {}
        for inp in inputs:
            pair = self.pairs.get(f"gpu:{inp.gpu_uuid}") if inp.untrusted else None
            if pair is not None and "module_untrusted" in pair.reasons:
                now_untrusted[inp.gpu_uuid] = inp.untrusted
        for uuid, why in now_untrusted.items():
            if self._untrusted.get(uuid) == why:
                continue
            msg = (f"GPU {uuid}: its module cannot be trusted ({why}): treated as a GPU "
                   "without working cooling, its power limit cut (policy module_untrusted) "
                   "until a module is mapped to it again")  # fmt: skip
            log.warning("%s", msg)
            self._write_event("untrusted_module", level="alert", gpu_uuid=uuid, why=why,
                              message=msg)  # fmt: skip
        for uuid in [u for u in self._untrusted if u not in now_untrusted]:
            msg = f"GPU {uuid}: a trusted module is mapped to it again"
            log.info("%s", msg)
            self._write_event("untrusted_module", level="info", gpu_uuid=uuid, message=msg)
        self._untrusted = now_untrusted

    def _decide_pairs(self, ports: list[str]) -> None:
        """Decide only the pairs of ``ports`` now (an alarm, a change of fault bits or a
        silence on their module), as a tick decides them: their GPU read again and its
        current limit observed, the pair evaluated (the PSU guard's caps of the last
        tick), the limit acted on, and a fresh snapshot; every other pair keeps its
        state until the loop's next tick. Under the tick lock."""
        now = self.clock()
        for port in ports:
            uuid = self._gpu_for(self.links[port].status)
            if uuid is not None and uuid in self.limiters:
                self.limiters[uuid].observe(self._refresh_gpu(uuid))
        if self._mapping_changed():  # a duplicate id appeared or went: every pair now
            self._tick()
            return
        inputs = [self._pair_input(port, now) for port in ports]
        self._apply(ports, inputs, self.engine.step_pairs(now, inputs), now)
        self._snapshot = self._build_snapshot()

    def _mapping_changed(self) -> bool:
        """Note the duplicate ids now; True if they (or the ports that may map an id)
        changed since the last look."""
        before = (dict(self.duplicates), dict(self._id_port))
        self._note_duplicates()
        return before != (self.duplicates, self._id_port)

    def _watch_io(self, now: float) -> None:
        """The loop's watch on the I/O thread (the one that decides silence): its
        running time without a wake-up of that thread, the loop's own pauses left out
        (a tick counts at most two tick periods and a half second)."""
        if self.io.thread is None:  # links of their own (tests' doubles): nothing to watch
            return
        it = self.io.iterations
        seen = self._io_watch
        self._io_watch = (it, now)
        if seen is None or seen[0] != it:
            if self.io_stalled_s > IO_STALL_S:
                log.warning("the links' I/O thread runs again")
            self.io_stalled_s = 0.0
            return
        was = self.io_stalled_s
        self.io_stalled_s += min(max(now - seen[1], 0.0), 2 * self.config.tick_s + 0.5)
        if was <= IO_STALL_S < self.io_stalled_s:
            log.error("the links' I/O thread has not run for %.1f s: every module is taken "
                      "for silent until it does", self.io_stalled_s)  # fmt: skip

    def _pair_input(self, port: str, now: float) -> PairInput:
        """The policy's input for ``port``'s pair (its state made anew if its module
        or its GPU changed)."""
        st = self.links[port].status
        uuid = self._gpu_for(st)
        module_key = st.key()
        # a module mapped to no GPU (none configured, or its id announced twice) has no
        # GPU to lose: its pair reports its conditions and writes nothing
        no_gpu = uuid is None and not self._named_gpu_absent(st)
        pair = self.pairs.get(port)
        if pair is None or pair.gpu_uuid != uuid or pair.module_id != module_key:
            pair = PairState(module_id=module_key, gpu_uuid=uuid)
            self.pairs[port] = pair
        lim = self.limiters.get(uuid) if uuid else None
        pair.original_limit_w = lim.original_w if lim else None
        return PairInput(
            module_id=module_key,
            gpu_uuid=uuid,
            module=st,
            gpu=self.samples.get(uuid) if uuid else None,
            link_up=st.link_up,
            last_frame_age_s=st.last_frame_age_s(now),
            link=self._link_verdict(st, now),
            original_limit_w=pair.original_limit_w,
            no_gpu=no_gpu,
        )

    def _link_verdict(self, st: ModuleStatus, now: float) -> LinkFreshness | None:
        """The link's verdict on its module, unless the I/O thread that makes it is
        wedged (:meth:`_watch_io`; judged in the loop only)."""
        if (self.io_stalled_s > IO_STALL_S and st.last_frame_at is not None
                and threading.current_thread() is not self.io.thread):  # fmt: skip
            return LinkFreshness(SILENT, st.last_frame_age_s(now))
        return st.freshness

    def _named_gpu_absent(self, st: ModuleStatus) -> bool:
        """Does a ``[[module]]`` table that applies to this module name a GPU that is not
        there (not read: ``gpu_lost``, not "no GPU")?"""
        if st.module_id is not None and st.module_id in self.duplicates:
            return False
        for m in self.config.modules:
            by_id = m.module_id and m.module_id == st.module_id
            by_port = m.port and _same_port(m.port, st.port)
            if (by_id and (not m.port or by_port)) or (by_port and not m.module_id):
                return m.gpu is not None and not any(
                    match_gpu(m.gpu, s.uuid, s.pci_bus_id) for s in self.samples.values()
                )
        return False

    def _apply(self, ports: list[str], inputs: list[PairInput], decisions, now: float) -> None:
        """The decisions into the pairs' state; the limiters act on them."""
        by_key = {(d.module_id, d.gpu_uuid): d for d in decisions}
        for port, inp in zip(ports, inputs, strict=True):
            d = by_key.get((inp.module_id, inp.gpu_uuid))
            pair = self.pairs[port]
            if d is None:
                continue
            pair.level = d.level
            pair.reasons = tuple(d.reasons)
            pair.eta_s = d.eta_s
            pair.target_limit_w = d.target_limit_w
            if d.want_auto:  # [policy] return_to_auto: a signed fan_mode auto
                self._return_to_auto(port, d)
            lim = self.limiters.get(inp.gpu_uuid) if inp.gpu_uuid else None
            if lim is None:
                continue
            if d.can_actuate:
                res = self._act(inp.gpu_uuid, lim, d, now)
                if res is not None and res.action not in ("skip", "backoff"):
                    self.decision_at[inp.gpu_uuid] = self.clock()
            pair.actions_total = lim.actions_total
            pair.limit_writes_refused = lim.refused_total

    def _build_snapshot(self) -> BridgeSnapshot:
        modules = []
        for link in self.links.values():
            st = link.status
            if st.duplicate_ports:  # apart by port: its own pair, metrics and report row
                st = dataclasses.replace(st, module_id=st.key())
            modules.append(st)
        return BridgeSnapshot(
            taken_at=self.clock(),
            modules=modules,
            gpus=list(self.samples.values()),
            pairs=list(self.pairs.values()),
            backend=self.backend.name,
            chassis=dict(self.chassis_reports),
        )

    def snapshot(self) -> BridgeSnapshot:
        """The latest snapshot (what a scrape serves): never blocks."""
        return self._snapshot

    # -- the control socket (modbridge.ops.ctlsock, docs/control.md) --------------------
    def serve_control(self, path, group: str | None = None):
        """Answer ``modbridge set/config/selftest/...`` on the Unix socket ``path``
        (its own threads; stopped by :meth:`stop`). Returns the server."""
        from modbridge.ops import ctlsock

        self.control = ctlsock.serve(self, path, group)
        return self.control

    def control_entries(self) -> list[tuple[str, str | None, list[str]]]:
        """``(port, module id, [[module]] names)`` of every link."""
        out = []
        for port, link in list(self.links.items()):  # a socket thread: a copy
            mid = link.status.module_id
            names = [
                m.name
                for m in self.config.modules
                if getattr(m, "name", None)
                and ((m.module_id and m.module_id == mid) or _same_port(m.port, port))
            ]
            out.append((port, mid, names))
        return out

    def control_link(self, module: str) -> ModuleLink:
        """The link of ``module``: a port, a module id (or a unique prefix) or a
        ``[[module]]`` name; :class:`modbridge.ops.control.TargetNotFound` otherwise."""
        from modbridge.ops.control import pick_module

        return self.links[pick_module(module, self.control_entries())]

    def forward(
        self,
        module: str,
        name: str,
        fields: dict | None = None,
        timeout: float | None = None,
        then_telemetry: bool = False,
    ):
        """Send ``name`` to ``module`` through its link (signed with the bridge's
        keys); the module's answer as a :class:`modbridge.ops.control.Reply`."""
        from modbridge.ops.control import link_request

        return link_request(self.control_link(module), name, fields, timeout, then_telemetry)

    def check_mapped_modules(self) -> list[str]:
        """Config ``[[module]]`` ids that no connected module has (one text each)."""
        seen = {link.status.module_id for link in self.links.values()}
        return [
            f"module[{i}].id {m.module_id} is not among the connected modules "
            f"({', '.join(sorted(x for x in seen if x)) or 'none'}): `modbridge list` shows them"
            for i, m in enumerate(self.config.modules)
            if m.module_id and m.module_id not in seen
        ]


# ----------------------------------------------------------------------------- views


#: The status document's version (``schema``): 2 since the names of docs/vocabulary.md
#: (flat ``temp_gpu_c``, ``fan1_duty_pct``, ``gpu.temp_c``, ``policy.target_w``).
REPORT_SCHEMA = 2

# GpuSample fields whose JSON name differs (docs/vocabulary.md: the unit in the name,
# percent for a share), with the factor from the sample's unit
_GPU_JSON = {
    "temperature_c": ("temp_c", 1),
    "memory_temperature_c": ("memory_temp_c", 1),
    "enforced_limit_w": ("limit_w", 1),
    "utilization": ("utilization_pct", 100),
    "fan_speed_ratio": ("fan_speed_pct", 100),
}


def gpu_dict(sample: GpuSample | None) -> dict | None:
    """A GPU reading as JSON (docs/vocabulary.md's names): values the GPU does not
    support are absent, never 0."""
    if sample is None:
        return None
    d = dataclasses.asdict(sample)
    d.pop("timestamp", None)
    extra = d.pop("extra", None) or {}
    out = {}
    for k, v in d.items():
        if v is None:
            continue
        name, factor = _GPU_JSON.get(k, (k, 1))
        out[name] = v if factor == 1 else round(v * factor, 3)
    if extra:
        out["extra"] = extra
    return out


def report(snap: BridgeSnapshot, now: float | None = None) -> dict:
    """The one view of a snapshot that ``status`` prints (table or ``--json``) and the
    monitor draws: every module with its paired GPU's reading and its policy level,
    then every GPU."""
    now = time.monotonic() if now is None else now
    gpus = {s.uuid: s for s in snap.gpus}
    pairs = {p.module_id: p for p in snap.pairs}
    modules = []
    for m in snap.modules:
        d = m.as_dict(now)
        pair = pairs.get(m.module_id or m.port)
        d["gpu"] = gpu_dict(gpus.get(pair.gpu_uuid)) if pair and pair.gpu_uuid else None
        d["policy"] = (
            {
                "level": LEVEL_NAMES[pair.level],
                "reasons": list(pair.reasons),
                "target_w": pair.target_limit_w,
                "original_w": pair.original_limit_w,
                "eta_s": pair.eta_s,
                "actions": dict(pair.actions_total),
                "limit_writes_refused": pair.limit_writes_refused,
            }
            if pair is not None
            else None
        )
        modules.append(d)
    return {
        "schema": REPORT_SCHEMA,
        "backend": snap.backend,
        "modules": modules,
        "gpus": [gpu_dict(s) for s in snap.gpus],
    }


# ----------------------------------------------------------------------------- list


def probe_modules(
    ports: Iterable, timeout: float = 3.0, link_factory: Callable[..., ModuleLink] = ModuleLink
) -> list[dict]:
    """Open each port briefly (all at once), wait for its hello, close it again.

    ``ports`` are discovery :class:`~modbridge.link.discovery.PortInfo` objects (or
    paths). Returns one dict per port: the port's description plus ``module_id``,
    ``fw_version``, ``board``, ``protocol``, ``link_up``, ``error``, ``paired`` (the
    module's hello) and ``key_error`` (None: this host can sign for it, or it does not
    verify)."""
    rows: list[tuple[dict, ModuleLink | None]] = []
    for p in ports:
        info = p.as_dict() if hasattr(p, "as_dict") else {"device": os.fspath(p)}
        link = link_factory(info["device"], heartbeat_period_s=60.0)
        try:
            link.start()
        except LinkError as e:
            info["error"] = str(e)
            link = None
        rows.append((info, link))
    deadline = time.monotonic() + timeout
    out = []
    try:
        for _info, link in rows:
            if link is not None:
                link.wait_up(max(0.0, deadline - time.monotonic()))
    finally:
        for info, link in rows:
            if link is not None:
                st = link.status
                info.update(
                    module_id=st.module_id,
                    fw_version=st.fw_version,
                    board=st.board,
                    protocol=st.proto_version,
                    link_up=st.link_up,
                    error=None if st.link_up else (st.last_error or "no hello"),
                    # signing (docs/pairing.md): the module's word, and whether we can sign
                    paired=getattr(link, "paired", None),
                    key_error=getattr(link, "key_error", None),
                )
                link.stop()
            else:
                info.update(
                    module_id=None, fw_version=None, board=None, protocol=None, link_up=False,
                    paired=None, key_error=None,
                )  # fmt: skip
            out.append(info)
    return out


def gpu_infos(backend: GpuBackend) -> list[dict]:
    return [dataclasses.asdict(i) for i in backend.devices()]


# ----------------------------------------------------------------------------- --sim


def open_sim(
    n: int = 1,
    world: str = "default",
    profile: str | None = "demo",
    speed: float = 1.0,
    seed: int = 0,
    faults=(),
    keys_dir=None,
):
    """Start a :class:`~modbridge.sim.fleet.SimFleet` of ``n`` virtual modules.

    Returns ``(fleet, mappings)``: the started fleet and the ``[[module]]`` mapping
    module i (its port) -> GPU i (its UUID; the fleet gives each GPU its own). Each
    module is provisioned with a key, kept in ``keys_dir`` (default: a temporary
    directory the bridge finds through the fleet, ``fleet.keys``)."""
    from modbridge.sim.fleet import SimFleet

    fleet = SimFleet(
        n, world=world, profile=profile, speed=speed, seed=seed, faults=faults, keys_dir=keys_dir
    )
    gpus = fleet.gpus
    mappings = [
        ModuleMapping(module_id=None, gpu=g.uuid, port=port)
        for port, g in zip(fleet.ports, gpus, strict=True)
    ]
    fleet.start()
    return fleet, mappings


def sim_heartbeat_period_s(configured: float, speed: float) -> float:
    """Heartbeats often enough in world time: the firmware's host timeout (5 s of its
    time) must not expire between two of them when the world runs ``speed`` x faster.

    >>> sim_heartbeat_period_s(1.0, 1.0), sim_heartbeat_period_s(1.0, 20.0)
    (1.0, 0.1)
    """
    if speed <= 0:
        return 0.1
    return max(0.1, min(configured, 2.0 / speed))
