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

    def __init__(self, message, requested_w=None, enforced_w=None):
        super().__init__(message)
        self.requested_w = requested_w
        self.enforced_w = enforced_w


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
