"""The one interface every GPU backend implements, and the errors they raise.

Backends: ``nvml`` (nvidia-ml-py, the real thing), ``nvidia-smi`` (fallback: a
subprocess per query, ~2000x slower), ``virtual`` (the simulator's GPU). The bridge,
the policy and the exporter only ever see :class:`GpuSample` and these errors.

Values a GPU does not support are ``None`` (absent), never 0: a data-centre GPU has no
fan, and "0 % fan" would be a lie that alerts fire on.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field

from modbridge.errors import ModbridgeError

# NVML clocks-event reason bits (nvmlClocksEventReason*), as recorded on the H200.
CLOCKS_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


class GpuError(ModbridgeError):
    """A GPU could not be read or changed; ``state`` names the condition."""

    state = "error"


class GpuNotFound(GpuError):
    state = "not_found"


class GpuLost(GpuError):
    state = "lost"


class GpuNoPermission(GpuError):
    state = "no_permission"


class GpuDriverNotLoaded(GpuError):
    state = "driver_not_loaded"


class PowerLimitRefused(GpuError):
    """The driver refused a power-limit write (or read back something else).

    ``requested_w`` is what was asked; ``enforced_w`` the limit read back afterwards
    (None when it could not be read).
    """

    state = "limit_refused"

    def __init__(self, message, requested_w=None, enforced_w=None, not_supported=False):
        super().__init__(message)
        self.requested_w = requested_w
        self.enforced_w = enforced_w
        self.not_supported = not_supported  # the GPU has no settable limit (consumer cards)


class ClocksRefused(GpuError):
    """The driver refused to lock (or reset) the graphics clocks.

    ``not_supported``: the GPU cannot lock clocks at all (NVML NotSupported; GeForce
    cards before Volta, vGPU guests); the clocks actuator then falls back to the power
    limit (docs/bridge.md, "Locked clocks").
    """

    state = "clocks_refused"

    def __init__(self, message, requested_mhz=None, not_supported=False):
        super().__init__(message)
        self.requested_mhz = requested_mhz
        self.not_supported = not_supported


@dataclass(frozen=True)
class ClockState:
    """A GPU's graphics clocks (MHz) as far as the backend can read them.

    ``locked`` is the ``(min, max)`` lock in force, None when unlocked. NVML and
    nvidia-smi have no call that reads a lock back: there ``lock_known`` is False and
    ``locked`` says nothing; the actuator then checks ``current_mhz`` against the lock
    it set (a clock above it means the lock is gone).
    """

    max_mhz: int
    supported_mhz: tuple[int, ...]  # ascending; at least max_mhz
    current_mhz: int | None = None
    locked: tuple[int, int] | None = None
    lock_known: bool = True

    @property
    def min_mhz(self) -> int:
        return self.supported_mhz[0] if self.supported_mhz else self.max_mhz

    def snap_up(self, mhz: float) -> int:
        """The lowest supported clock at or above ``mhz`` (the max if none)."""
        for clock in self.supported_mhz:
            if clock >= mhz:
                return clock
        return self.max_mhz

    def snap_down(self, mhz: float) -> int:
        """The highest supported clock at or below ``mhz`` (the lowest one if none)."""
        best = self.min_mhz
        for clock in self.supported_mhz:
            if clock <= mhz:
                best = clock
        return min(best, self.max_mhz)


def supported_clocks(values, max_mhz) -> tuple[int, ...]:
    """Supported graphics clocks as an ascending tuple of ints within 1..``max_mhz``
    (what a driver lists, cleaned: duplicates, zeros and clocks above max dropped)."""
    out = sorted({int(v) for v in values if 0 < int(v) <= max_mhz})
    return tuple(out) if out else (int(max_mhz),)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    pci_bus_id: str  # "00000000:00:06.0"


@dataclass
class GpuSample:
    """One reading of one GPU. Units: degC, W, ratio 0..1. None = not supported."""

    uuid: str
    name: str = ""
    pci_bus_id: str = ""
    timestamp: float = 0.0  # time.monotonic() of the reading
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    enforced_limit_w: float | None = None
    default_limit_w: float | None = None
    min_limit_w: float | None = None
    max_limit_w: float | None = None
    clocks_event_reasons: int | None = None
    utilization: float | None = None
    fan_speed_ratio: float | None = None
    # the GPU's own thresholds (NVML temperature thresholds), for policy defaults
    slowdown_temp_c: float | None = None
    shutdown_temp_c: float | None = None
    max_operating_temp_c: float | None = None
    state: str = "ok"  # "ok" or a GpuError.state
    error: str | None = None  # message for a non-ok state
    extra: dict = field(default_factory=dict)


class GpuBackend(abc.ABC):
    """A source of GPU readings and the power-limit actuator's only way to write."""

    name = "abstract"
    #: Its GPUs are the simulator's (virtual); a module is paired with a GPU only when
    #: both are simulated or both are real (:func:`modbridge.bridge.pairing_refusal`).
    simulated = False

    def owner_key(self, uuid: str) -> str:
        """The name under which ``uuid`` is owned machine-wide, whatever the state dir
        (:mod:`modbridge.actuator.gpulock`): the UUID for a real GPU. A simulated GPU
        lives in one world (a process, a file): its backend adds what tells that world
        apart, so unrelated test bridges never share a name."""
        return uuid

    @abc.abstractmethod
    def devices(self) -> list[GpuInfo]:
        """GPUs visible to this backend."""

    @abc.abstractmethod
    def sample(self, uuid: str) -> GpuSample:
        """Read one GPU. Raises GpuError subclasses (GpuLost, GpuNoPermission...)."""

    @abc.abstractmethod
    def set_power_limit_w(self, uuid: str, watts: float) -> float:
        """Write the power limit and return the enforced limit read back (W).

        Raises PowerLimitRefused when the driver refuses, GpuNoPermission without
        root. Callers clamp to the constraints first.
        """

    def _no_clocks(self) -> ClocksRefused:
        return ClocksRefused(f"the {self.name} backend cannot lock GPU clocks", not_supported=True)

    # Locked graphics clocks (the clocks actuator, modbridge.actuator.clocks). A backend
    # that cannot lock clocks keeps these: every call is a not-supported refusal.

    def clock_state(self, uuid: str) -> ClockState:
        """The graphics clocks: max, supported, current and (where readable) the lock."""
        raise self._no_clocks()

    def set_locked_clocks_mhz(self, uuid: str, min_mhz: int, max_mhz: int) -> ClockState:
        """Lock the graphics clock within ``min_mhz..max_mhz`` (supported clocks, the
        caller snaps them) and return the state read back. Raises ClocksRefused,
        GpuNoPermission."""
        raise self._no_clocks()

    def reset_locked_clocks(self, uuid: str) -> ClockState:
        """Unlock the graphics clocks (the driver's default) and return the state."""
        raise self._no_clocks()

    def sample_all(self) -> list[GpuSample]:
        """Read every GPU. A GPU that cannot be read comes back as a sample with
        ``state``/``error`` set instead of raising, so one lost GPU never hides the rest.
        Backends with a cheaper batch read (nvidia-smi) override this."""
        samples = []
        for info in self.devices():
            try:
                samples.append(self.sample(info.uuid))
            except GpuError as e:
                samples.append(error_sample(info, e))
        return samples

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the library / processes."""


def throttle_temp_c(sample: GpuSample) -> float | None:
    """The temperature at which the GPU starts to slow itself down: the lower of NVML's
    SLOWDOWN (``slowdown_temp_c``) and GPU_MAX (``max_operating_temp_c``, where the
    software thermal slowdown begins), None when neither is known. The module keeps
    its GPU-channel limits under it (heartbeat ``gpu_slowdown``, docs/autotune.md)."""
    known = [t for t in (sample.slowdown_temp_c, sample.max_operating_temp_c) if t is not None]
    return min(known) if known else None


def error_sample(info: GpuInfo, err: GpuError) -> GpuSample:
    """The sample of a GPU that could not be read: ids, ``state`` and ``error`` only."""
    return GpuSample(
        uuid=info.uuid,
        name=info.name,
        pci_bus_id=info.pci_bus_id,
        timestamp=time.monotonic(),
        state=err.state,
        error=str(err),
    )
