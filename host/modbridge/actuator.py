"""The power-limit actuator: the only code in modbridge that changes a GPU setting.

    limiter = PowerLimiter(backend, uuid, log=events.append)
    limiter.start()                      # saves the original limit and the constraints
    limiter.apply(450, "module over-temperature", {"gpu_c": 84.0})
    limiter.restore("module healthy")    # back to the original (idempotent)
    limiter.close()                      # on_exit="restore" (default) or "keep"
    install_signal_handlers([limiter])   # SIGTERM/SIGINT/exit restore too

Targets are clamped to the GPU's constraints, a write within 1 W of the current limit
is skipped, and the enforced limit is read back after every write. A refused write
(PowerLimitRefused, GpuNoPermission) is an alert event and a count, never an exception
for the caller: the bridge keeps running and the module keeps cooling. ``dry_run``
logs every decision and writes nothing.

Events go to ``log``: an :class:`modbridge.eventlog.EventLog` (``write("power_limit",
**fields)``) or any callable taking a dict (``{"event": "power_limit", **fields}``).
Fields: ``gpu_uuid``, ``level`` (``info``/``alert``), ``action`` (lower, restore,
refused, dry_run, failed, keep, start), ``reason``, ``message``, ``dry_run`` and the
numbers (``requested_w``, ``clamped_w``, ``current_w``, ``original_w``, ``enforced_w``,
``values``). Everything is also logged through :mod:`logging`.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass

from .gpu.base import GpuBackend, GpuError, GpuNoPermission, PowerLimitRefused

_log = logging.getLogger(__name__)

SKIP_BAND_W = 1.0  # a target within this of the current limit is not written
ON_EXIT = ("restore", "keep")


@dataclass
class ApplyResult:
    """What one ``apply``/``restore`` did. ``action``: lower, restore, refused, dry_run,
    failed (the GPU could not be reached) or skip (already there)."""

    requested_w: float | None
    clamped_w: float | None
    enforced_w: float | None
    wrote: bool
    error: str | None = None
    action: str = "skip"


class PowerLimiter:
    """Owns one GPU's power limit. See the module docstring."""

    def __init__(
        self,
        backend: GpuBackend,
        uuid: str,
        dry_run=False,
        on_exit="restore",
        log=None,
        clock=time.time,
    ):
        if on_exit not in ON_EXIT:
            raise ValueError(f"on_exit must be one of {ON_EXIT}, got {on_exit!r}")
        self.backend = backend
        self.uuid = uuid
        self.dry_run = dry_run
        self.on_exit = on_exit
        self._emit = log
        self._clock = clock
        self._lock = threading.RLock()  # the signal handler may restore mid-apply
        self.original_w: float | None = None
        self.min_w: float | None = None
        self.max_w: float | None = None
        self.default_w: float | None = None
        self.current_w: float | None = None  # the enforced limit, as last read
        self.last_write_ts: float | None = None  # wall clock of the last successful write
        self.actions_total: Counter = Counter()
        self.refused_total = 0
        self._touched = False  # a write of ours changed the limit since the last restore
        self._dry_target_w: float | None = None
        self._closed = False

    # ------------------------------------------------------------------ events

    def _event(self, level, action, reason, message, **numbers):
        fields = {
            "gpu_uuid": self.uuid,
            "level": level,
            "action": action,
            "reason": reason,
            "message": message,
            "dry_run": self.dry_run,
            **numbers,
        }
        (_log.warning if level == "alert" else _log.info)("%s: %s", self.uuid, message)
        if self._emit is None:
            return
        try:
            if hasattr(self._emit, "write"):  # an eventlog.EventLog
                self._emit.write("power_limit", **fields)
            else:
                self._emit({"event": "power_limit", **fields})
        except Exception:  # noqa: BLE001 - a broken sink must not stop the actuator
            _log.exception("power-limit event sink failed")

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Save the original enforced limit and the constraints. Raises GpuError when
        the GPU cannot be read (nothing can be restored without the original)."""
        with self._lock:
            sample = self.backend.sample(self.uuid)
            if sample.enforced_limit_w is None:
                raise GpuError(
                    f"GPU {self.uuid} does not report its power limit: the power-limit "
                    "actuator cannot run (use --dry-run, or a GPU with power management)"
                )
            self.original_w = self.current_w = sample.enforced_limit_w
            self.min_w, self.max_w = sample.min_limit_w, sample.max_limit_w
            self.default_w = sample.default_limit_w
            self._closed = False
            if self.default_w is not None and self.original_w < self.default_w - SKIP_BAND_W:
                self._event(
                    "alert",
                    "start",
                    "start",
                    f"the limit is {self.original_w:g} W, below the default "
                    f"{self.default_w:g} W: a previous run may have died without restoring "
                    f"(reset with `nvidia-smi -i {self.uuid} -pl {self.default_w:g}`)",
                    original_w=self.original_w,
                    default_w=self.default_w,
                )

    def clamp(self, watts: float) -> float:
        if self.min_w is not None and watts < self.min_w:
            watts = self.min_w
        if self.max_w is not None and watts > self.max_w:
            watts = self.max_w
        return watts

    def apply(self, target_w: float, reason: str, values: dict | None = None) -> ApplyResult:
        """Set the limit to ``target_w`` (clamped). Never raises a GpuError."""
        with self._lock:
            if self.original_w is None:
                try:
                    self.start()
                except GpuError as e:
                    return self._failed(target_w, None, reason, e, values)
            clamped = self.clamp(float(target_w))
            action = "restore" if clamped >= self.original_w - SKIP_BAND_W else "lower"
            return self._write(target_w, clamped, action, reason, values)

    def restore(self, reason: str = "restore") -> ApplyResult | None:
        """Write the original limit back if a write of ours changed it (idempotent)."""
        with self._lock:
            if self.original_w is None:
                return None
            dry_moved = self._dry_target_w is not None and (
                abs(self._dry_target_w - self.original_w) > SKIP_BAND_W
            )
            if not (self._touched or dry_moved):
                return None
            result = self._write(self.original_w, self.original_w, "restore", reason, None)
            if result.error is None:
                self._touched = False
            return result

    def close(self, reason: str = "exit") -> ApplyResult | None:
        """Obey ``on_exit``: restore the original limit, or keep the current one."""
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            if self.on_exit == "restore":
                return self.restore(reason)
            if self._touched:
                self._event(
                    "info",
                    "keep",
                    reason,
                    f"keeping the power limit at {self.current_w} W (on_exit=keep)",
                    current_w=self.current_w,
                    original_w=self.original_w,
                )
            return None

    # ------------------------------------------------------------------ the write

    def _write(self, requested, clamped, action, reason, values) -> ApplyResult:
        numbers = {
            "requested_w": requested,
            "clamped_w": clamped,
            "current_w": self.current_w,
            "original_w": self.original_w,
            **({"values": values} if values else {}),
        }
        believed = self.current_w
        if self.dry_run and self._dry_target_w is not None:
            believed = self._dry_target_w  # what the limit would be, had we written
        if believed is not None and abs(clamped - believed) <= SKIP_BAND_W:
            return ApplyResult(requested, clamped, self.current_w, False, None, "skip")
        if self.dry_run:
            self._dry_target_w = clamped
            self.actions_total["dry_run"] += 1
            self._event(
                "info",
                "dry_run",
                reason,
                f"dry run: would {action} the power limit to {clamped:g} W ({reason})",
                **numbers,
            )
            return ApplyResult(requested, clamped, self.current_w, False, None, "dry_run")
        try:
            enforced = self.backend.set_power_limit_w(self.uuid, clamped)
        except (PowerLimitRefused, GpuNoPermission) as e:
            self.refused_total += 1
            self.actions_total["refused"] += 1
            if isinstance(e, PowerLimitRefused) and e.enforced_w is not None:
                self.current_w = e.enforced_w
            self._event(
                "alert",
                "refused",
                reason,
                f"power limit {clamped:g} W refused ({reason}): {e}",
                **numbers,
            )
            return ApplyResult(requested, clamped, self.current_w, False, str(e), "refused")
        except GpuError as e:
            return self._failed(requested, clamped, reason, e, values)
        self.current_w = enforced
        self.last_write_ts = self._clock()
        self._touched = abs(enforced - self.original_w) > SKIP_BAND_W
        self.actions_total[action] += 1
        self._event(
            "info",
            action,
            reason,
            f"power limit {action}: {clamped:g} W requested, {enforced:g} W enforced ({reason})",
            enforced_w=enforced,
            **numbers,
        )
        return ApplyResult(requested, clamped, enforced, True, None, action)

    def _failed(self, requested, clamped, reason, err, values) -> ApplyResult:
        self.actions_total["failed"] += 1
        self._event(
            "alert",
            "failed",
            reason,
            f"power limit {clamped if clamped is not None else requested} W not "
            f"written ({reason}): {err}",
            requested_w=requested,
            clamped_w=clamped,
            state=err.state,
            **({"values": values} if values else {}),
        )
        return ApplyResult(requested, clamped, self.current_w, False, str(err), "failed")

    # ------------------------------------------------------------------ exporter

    def counters(self) -> dict:
        """Numbers for the exporter (W, wall-clock seconds, counts)."""
        return {
            "uuid": self.uuid,
            "original_w": self.original_w,
            "min_w": self.min_w,
            "max_w": self.max_w,
            "default_w": self.default_w,
            "current_w": self.current_w,
            "last_write_ts": self.last_write_ts,
            "actions_total": dict(self.actions_total),
            "refused_total": self.refused_total,
            "dry_run": self.dry_run,
        }


def install_signal_handlers(limiters, signals=(signal.SIGTERM, signal.SIGINT)):
    """Close every limiter (restoring, unless on_exit="keep") on SIGTERM/SIGINT, then
    exit with 128 + the signal number; and at interpreter exit. Main thread only.
    Returns a function that puts the previous handlers back."""
    limiters = list(limiters)

    def close_all(reason):
        for limiter in limiters:
            try:
                limiter.close(reason)
            except Exception:  # noqa: BLE001 - restore the others whatever one does
                _log.exception("closing the power limiter of %s failed", limiter.uuid)

    def handler(signum, frame):
        close_all(f"signal {signal.Signals(signum).name}")
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    atexit.register(close_all, "exit")

    def uninstall():
        for sig, old in previous.items():
            signal.signal(sig, old)
        atexit.unregister(close_all)

    return uninstall
