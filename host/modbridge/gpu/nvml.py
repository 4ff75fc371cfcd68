"""The NVML backend: nvidia-ml-py (``pynvml``), the real thing (~11 us per GPU scrape).

The binding is injected as a module object (``NvmlBackend(nvml=FakeNvml())`` in tests
and ``--fake-nvml`` dev runs); by default ``pynvml`` is imported on first use.

Cost of one ``sample()``, in NVML calls (asserted by tests/test_gpu_nvml.py): 6 on an
H200 in steady state (temperature, memory-temperature field, power, enforced limit,
clocks-event reasons, utilization; +1 fan speed on GPUs that have fans). The first
sample also reads what never changes (default limit, constraints, 3 temperature
thresholds) and learns which calls are NotSupported; those are never asked again.

Locked clocks: ``nvmlDeviceSetGpuLockedClocks(handle, min, max)`` and
``nvmlDeviceResetGpuLockedClocks``; the supported graphics clocks (at the top memory
clock) and the max clock are read once, the current clock on every ``clock_state``.
NVML has no call that reads a lock back (``ClockState.lock_known`` is False).

Error mapping (every call): NotSupported -> the value is None, never 0;
NoPermission -> GpuNoPermission; GpuIsLost -> GpuLost; DriverNotLoaded /
LibraryNotFound -> GpuDriverNotLoaded; anything else -> GpuError with NVML's string.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from modbridge.gpu.base import (
    ClocksRefused,
    ClockState,
    GpuBackend,
    GpuDriverNotLoaded,
    GpuError,
    GpuInfo,
    GpuLost,
    GpuNoPermission,
    GpuNotFound,
    GpuSample,
    PowerLimitRefused,
    supported_clocks,
)

log = logging.getLogger(__name__)

# nvmlReturn_t codes (nvml.h); read from the binding when it has them.
_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
}
# nvmlValueType_t -> c_nvmlValue_t member
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

_TEMPERATURE = ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV")
# The throttle-reasons call is deprecated: only for bindings that lack the new name.
_REASONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")

_ROOT_HINT = (
    "run modbridge as root (or grant it CAP_SYS_ADMIN), and enable persistence mode "
    "with `nvidia-smi -pm 1` so the driver keeps the limit"
)
_DRIVER_HINT = (
    "load it (`modprobe nvidia`; `nvidia-smi` must work), or use --backend nvidia-smi / --sim"
)


@dataclass
class _Device:
    info: GpuInfo
    handle: object
    static: dict | None = None  # default limit, constraints, thresholds (read once)
    clocks: tuple | None = None  # (max MHz, supported MHz): read once
    unsupported: set = field(default_factory=set)  # calls that answered NotSupported


def _memo_key(name: str, args: tuple) -> tuple:
    return (name, repr(args))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend(GpuBackend):
    """GPUs through NVML. ``nvml``: the ``pynvml`` module or a stand-in."""

    name = "nvml"

    def __init__(self, nvml=None, clock=time.monotonic):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as e:
                raise GpuDriverNotLoaded(
                    "nvidia-ml-py (pynvml) is not installed: `pip install nvidia-ml-py`, "
                    "or use --backend nvidia-smi / --sim"
                ) from e
        self._nv = nvml
        # a stand-in for pynvml over simulated GPUs (fake_nvml.FakeNvml) says so: its
        # GPUs may cool virtual modules (modbridge.gpu.simguard); pynvml never does
        self.simulated = getattr(nvml, "SIMULATED", False) is True
        self._clock = clock
        self._code = {k: getattr(nvml, k, v) for k, v in _CODES.items()}
        self._error_type = getattr(nvml, "NVMLError", None) or _NoSuchError
        self._devices: dict[str, _Device] = {}
        self._open = False
        try:
            nvml.nvmlInit()
        except self._error_type as e:
            raise self._map(e, "starting NVML (nvmlInit)") from e
        except OSError as e:
            raise GpuDriverNotLoaded(f"NVML could not be loaded ({e}): {_DRIVER_HINT}") from e
        self._open = True
        try:
            self._enumerate()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ errors

    def _map(self, err, what: str, dev: _Device | None = None) -> GpuError:
        """The GpuError for an NVMLError raised while doing ``what``."""
        code = getattr(err, "value", None)
        c = self._code
        gpu = f"GPU {dev.info.uuid} ({dev.info.pci_bus_id})" if dev else "the GPU"
        if code == c["NVML_ERROR_NO_PERMISSION"]:
            return GpuNoPermission(
                f"{what} on {gpu}: NVML says Insufficient Permissions: {_ROOT_HINT}"
            )
        if code == c["NVML_ERROR_GPU_IS_LOST"]:
            return GpuLost(
                f"{gpu} fell off the bus (NVML: GPU is lost, during {what}): check `dmesg` "
                "for Xid 79, then reseat or power-cycle it; NVML will not see it again "
                "until it is reset"
            )
        if code == c["NVML_ERROR_DRIVER_NOT_LOADED"]:
            return GpuDriverNotLoaded(f"NVIDIA driver not loaded (NVML, {what}): {_DRIVER_HINT}")
        if code == c["NVML_ERROR_LIBRARY_NOT_FOUND"]:
            return GpuDriverNotLoaded(
                f"NVIDIA driver not loaded: libnvidia-ml.so.1 not found ({what}); install "
                "the NVIDIA driver, or use --backend nvidia-smi / --sim"
            )
        return GpuError(f"{what} on {gpu}: NVML error: {err}")

    def _is(self, err, name: str) -> bool:
        return getattr(err, "value", None) == self._code[name]

    # ------------------------------------------------------------------ devices

    def _enumerate(self) -> None:
        nv = self._nv
        try:
            count = nv.nvmlDeviceGetCount()
        except self._error_type as e:
            raise self._map(e, "counting GPUs (nvmlDeviceGetCount)") from e
        first_error = None
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                info = GpuInfo(
                    index=index,
                    uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                    name=_text(nv.nvmlDeviceGetName(handle)),
                    pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(handle).busId),
                )
            except self._error_type as e:
                err = self._map(e, f"opening GPU index {index}")
                log.warning("NVML: skipping GPU index %d: %s", index, err)
                first_error = first_error or err
                continue
            self._devices[info.uuid] = _Device(info, handle)
        if count and not self._devices and first_error is not None:
            raise first_error

    def devices(self) -> list[GpuInfo]:
        return [d.info for d in self._devices.values()]

    def owner_key(self, uuid: str) -> str:
        """The UUID (machine-wide) with the real ``pynvml``; a stand-in binding (a
        :class:`~modbridge.gpu.fake_nvml.FakeNvml`) is a GPU of this process only."""
        if getattr(self._nv, "__name__", None) == "pynvml":
            return uuid
        return f"{uuid}.fake-{os.getpid()}-{id(self._nv):x}"

    def _device(self, uuid: str) -> _Device:
        dev = self._devices.get(uuid)
        if dev is None:
            known = ", ".join(self._devices) or "none"
            raise GpuNotFound(f"no GPU with UUID {uuid} on NVML (GPUs: {known})")
        return dev

    # ------------------------------------------------------------------ reads

    def _read(self, dev: _Device, names, *args):
        """Call the first of ``names`` the binding has, on ``dev``. NotSupported -> None
        (and that call is not made again for this GPU); other errors -> GpuError."""
        names = (names,) if isinstance(names, str) else names
        key = _memo_key(names[0], args)
        if key in dev.unsupported:
            return None
        for name in names:
            fn = getattr(self._nv, name, None)
            if fn is None:
                continue
            try:
                return fn(dev.handle, *args)
            except self._error_type as e:
                if self._is(e, "NVML_ERROR_NOT_SUPPORTED"):
                    dev.unsupported.add(key)
                    return None
                if self._is(e, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                    continue  # the driver predates this call: try the older one
                raise self._map(e, name, dev) from e
            except OSError as e:
                raise GpuError(f"{name} on GPU {dev.info.uuid}: {e}") from e
        dev.unsupported.add(key)
        return None

    def _field(self, dev: _Device, field_name: str):
        """One NVML field value (e.g. NVML_FI_DEV_MEMORY_TEMP), or None."""
        field_id = getattr(self._nv, field_name, None)
        if field_id is None:
            return None
        values = self._read(dev, "nvmlDeviceGetFieldValues", [field_id])
        if values is None:
            return None
        fv = values[0]
        if fv.nvmlReturn != 0:
            if fv.nvmlReturn == self._code["NVML_ERROR_NOT_SUPPORTED"]:
                dev.unsupported.add(_memo_key("nvmlDeviceGetFieldValues", ([field_id],)))
                return None
            err = self._error_type(fv.nvmlReturn)
            raise self._map(err, f"nvmlDeviceGetFieldValues({field_name})", dev)
        member = _VALUE_MEMBERS[fv.valueType] if 0 <= fv.valueType < 7 else "uiVal"
        return getattr(fv.value, member)

    def _static(self, dev: _Device) -> dict:
        if dev.static is None:
            nv = self._nv
            constraints = self._read(dev, "nvmlDeviceGetPowerManagementLimitConstraints")
            default = self._read(dev, "nvmlDeviceGetPowerManagementDefaultLimit")
            threshold = {}
            for key, const in (
                ("slowdown_temp_c", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
                ("shutdown_temp_c", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
                ("max_operating_temp_c", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
            ):
                which = getattr(nv, const, None)
                value = None
                if which is not None:
                    value = self._read(dev, "nvmlDeviceGetTemperatureThreshold", which)
                threshold[key] = None if value is None else float(value)
            dev.static = {
                "default_limit_w": None if default is None else default / 1000.0,
                "min_limit_w": None if constraints is None else constraints[0] / 1000.0,
                "max_limit_w": None if constraints is None else constraints[1] / 1000.0,
                **threshold,
            }
        return dev.static

    def sample(self, uuid: str) -> GpuSample:
        dev = self._device(uuid)
        static = self._static(dev)
        timestamp = self._clock()
        temp = self._read(dev, _TEMPERATURE, getattr(self._nv, "NVML_TEMPERATURE_GPU", 0))
        mem_temp = self._field(dev, "NVML_FI_DEV_MEMORY_TEMP")
        power = self._read(dev, "nvmlDeviceGetPowerUsage")
        enforced = self._read(dev, "nvmlDeviceGetEnforcedPowerLimit")
        reasons = self._read(dev, _REASONS)
        util = self._read(dev, "nvmlDeviceGetUtilizationRates")
        fan = self._read(dev, "nvmlDeviceGetFanSpeed")
        return GpuSample(
            uuid=dev.info.uuid,
            name=dev.info.name,
            pci_bus_id=dev.info.pci_bus_id,
            timestamp=timestamp,
            temperature_c=None if temp is None else float(temp),
            memory_temperature_c=None if mem_temp is None else float(mem_temp),
            power_w=None if power is None else power / 1000.0,
            enforced_limit_w=None if enforced is None else enforced / 1000.0,
            clocks_event_reasons=None if reasons is None else int(reasons),
            utilization=None if util is None else util.gpu / 100.0,
            fan_speed_ratio=None if fan is None else fan / 100.0,
            **static,
        )

    # ------------------------------------------------------------------ the one write

    def set_power_limit_w(self, uuid: str, watts: float) -> float:
        """``nvmlDeviceSetPowerManagementLimit`` (v1: the binding's ``_v2`` wrapper
        swallows failures), then the enforced limit read back, in W."""
        dev = self._device(uuid)
        gpu = f"GPU {dev.info.uuid} ({dev.info.pci_bus_id})"
        mw = int(round(watts * 1000))
        try:
            self._nv.nvmlDeviceSetPowerManagementLimit(dev.handle, mw)
        except self._error_type as e:
            if self._is(e, "NVML_ERROR_NO_PERMISSION"):
                raise GpuNoPermission(
                    f"setting the power limit of {gpu} to {watts:g} W was refused "
                    f"(NVML: Insufficient Permissions): {_ROOT_HINT}"
                ) from e
            if self._is(e, "NVML_ERROR_INVALID_ARGUMENT"):
                s = dev.static or {}
                raise PowerLimitRefused(
                    f"{gpu} refused a power limit of {watts:g} W (NVML: Invalid Argument): "
                    f"it must lie within {s.get('min_limit_w')}..{s.get('max_limit_w')} W",
                    requested_w=watts,
                ) from e
            if self._is(e, "NVML_ERROR_NOT_SUPPORTED"):
                raise PowerLimitRefused(
                    f"{gpu} does not let software set its power limit (NVML: Not "
                    "Supported); the clocks actuator can stand in (docs/bridge.md, "
                    '"Locked clocks")',
                    requested_w=watts,
                    not_supported=True,
                ) from e
            raise self._map(e, f"setting the power limit to {watts:g} W", dev) from e
        try:
            enforced_mw = self._nv.nvmlDeviceGetEnforcedPowerLimit(dev.handle)
        except self._error_type as e:
            raise self._map(e, "reading back the enforced power limit", dev) from e
        enforced = enforced_mw / 1000.0
        if enforced > watts + 1.0:
            raise PowerLimitRefused(
                f"{gpu}: set the power limit to {watts:g} W but the enforced limit reads "
                f"{enforced:g} W; the write did not take",
                requested_w=watts,
                enforced_w=enforced,
            )
        if enforced < watts - 1.0:
            log.info(
                "%s: asked for %g W, enforced %g W (a lower limiter is in force)",
                gpu,
                watts,
                enforced,
            )
        return enforced

    # ------------------------------------------------------------------ clocks

    def _clock_const(self, name):
        return getattr(self._nv, name, {"NVML_CLOCK_GRAPHICS": 0, "NVML_CLOCK_MEM": 2}[name])

    def clock_state(self, uuid: str) -> ClockState:
        dev = self._device(uuid)
        gfx = self._clock_const("NVML_CLOCK_GRAPHICS")
        if dev.clocks is None:
            top = self._read(dev, "nvmlDeviceGetMaxClockInfo", gfx)
            if top is None:
                raise ClocksRefused(
                    f"GPU {uuid} does not report its maximum graphics clock (NVML: Not "
                    "Supported): its clocks cannot be locked", not_supported=True)  # fmt: skip
            mem = self._read(dev, "nvmlDeviceGetMaxClockInfo", self._clock_const("NVML_CLOCK_MEM"))
            listed = []
            if mem is not None:
                listed = self._read(dev, "nvmlDeviceGetSupportedGraphicsClocks", int(mem)) or []
            dev.clocks = (int(top), supported_clocks(listed, int(top)))
        current = self._read(dev, "nvmlDeviceGetClockInfo", gfx)
        return ClockState(
            max_mhz=dev.clocks[0],
            supported_mhz=dev.clocks[1],
            current_mhz=None if current is None else int(current),
            locked=None,
            lock_known=False,
        )

    def _clock_write(self, uuid: str, what: str, name: str, *args) -> ClockState:
        dev = self._device(uuid)
        gpu = f"GPU {dev.info.uuid} ({dev.info.pci_bus_id})"
        fn = getattr(self._nv, name, None)
        if fn is None:
            raise ClocksRefused(f"this nvidia-ml-py has no {name}: {gpu} cannot {what}",
                                not_supported=True)  # fmt: skip
        try:
            fn(dev.handle, *args)
        except self._error_type as e:
            if self._is(e, "NVML_ERROR_NO_PERMISSION"):
                raise GpuNoPermission(
                    f"{what} on {gpu} was refused (NVML: Insufficient Permissions): {_ROOT_HINT}"
                ) from e
            if self._is(e, "NVML_ERROR_NOT_SUPPORTED"):
                raise ClocksRefused(
                    f"{gpu} cannot {what} (NVML: Not Supported); the power limit can stand in",
                    requested_mhz=args[-1] if args else None, not_supported=True,
                ) from e  # fmt: skip
            if self._is(e, "NVML_ERROR_INVALID_ARGUMENT"):
                raise ClocksRefused(f"{gpu} refused to {what} (NVML: Invalid Argument)",
                                    requested_mhz=args[-1] if args else None) from e  # fmt: skip
            raise self._map(e, what, dev) from e
        return self.clock_state(uuid)

    def set_locked_clocks_mhz(self, uuid: str, min_mhz: int, max_mhz: int) -> ClockState:
        """``nvmlDeviceSetGpuLockedClocks(handle, min, max)``."""
        what = f"lock its clocks at {min_mhz}..{max_mhz} MHz"
        call = "nvmlDeviceSetGpuLockedClocks"
        return self._clock_write(uuid, what, call, int(min_mhz), int(max_mhz))

    def reset_locked_clocks(self, uuid: str) -> ClockState:
        """``nvmlDeviceResetGpuLockedClocks(handle)``."""
        return self._clock_write(uuid, "reset its locked clocks", "nvmlDeviceResetGpuLockedClocks")

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._nv.nvmlShutdown()
        except self._error_type as e:
            log.debug("nvmlShutdown: %s", e)


class _NoSuchError(Exception):
    """Stands in for NVMLError with a binding that lacks it (never raised)."""
