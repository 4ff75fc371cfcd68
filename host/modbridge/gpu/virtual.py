"""The virtual backend: the simulator's GPUs (:class:`modbridge.sim.gpu.VirtualGPU`)
behind the same interface as NVML, so ``--sim`` exercises the real bridge, policy and
actuator. The simulator's ``GpuLost`` becomes ours; a limit outside the constraints
(the simulator's InvalidArgument) becomes :class:`PowerLimitRefused`, and a clock
lock it refuses :class:`ClocksRefused`. Unlike NVML, the lock in force can be read
(``ClockState.lock_known``), and a locked clock really lowers the simulated GPU's power
and heat (modbridge.sim.gpu).
"""

from __future__ import annotations

import os
import time

from modbridge.gpu.base import (
    ClocksRefused,
    ClockState,
    GpuBackend,
    GpuError,
    GpuInfo,
    GpuLost,
    GpuNotFound,
    GpuSample,
    PowerLimitRefused,
)


def _sim_errors():
    """The simulator's exception classes (imported late: the sim is optional)."""
    from modbridge.sim import gpu as sim_gpu

    return sim_gpu.GpuLost, sim_gpu.GpuInvalidArgument, sim_gpu.VirtualGpuError


# what a sample reads, in this order: (what an error names, the VirtualGPU method)
_READS = (
    ("constraints", "power_limit_constraints_w"),
    ("temperature", "temperature_c"),
    ("memory temperature", "memory_temperature_c"),
    ("utilization", "utilization"),
    ("fan speed", "fan_speed_pct"),
    ("default limit", "default_power_limit_w"),
    ("thresholds", "temperature_thresholds_c"),
    ("power", "power_w"),
    ("power limit", "power_limit_w"),
    ("clocks-event reasons", "clocks_event_reasons"),
)


class VirtualBackend(GpuBackend):
    """``gpus``: VirtualGPU objects (anything with the VirtualGPU methods)."""

    name = "virtual"
    simulated = True

    def __init__(self, gpus, clock=time.monotonic):
        self._gpus = {}
        self._infos = []
        for index, gpu in enumerate(gpus):
            self._gpus[gpu.uuid] = gpu
            self._infos.append(GpuInfo(index, gpu.uuid, gpu.name, gpu.pci_bus_id))
        self._clock = clock
        self._lost, self._invalid, self._any = _sim_errors()

    def devices(self) -> list[GpuInfo]:
        return list(self._infos)

    def owner_key(self, uuid: str) -> str:
        """A virtual GPU lives in this process: its key is the object's (two bridges
        of one process on one VirtualGPU still exclude each other)."""
        return f"{uuid}.sim-{os.getpid()}-{id(self._gpus.get(uuid)):x}"

    def _gpu(self, uuid):
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise GpuNotFound(
                f"no virtual GPU with UUID {uuid} (GPUs: {', '.join(self._gpus) or 'none'})"
            )
        return gpu

    def _call(self, gpu, what, fn, *args):
        try:
            return fn(*args)
        except self._lost as e:
            raise GpuLost(
                f"virtual GPU {gpu.uuid} ({gpu.pci_bus_id}) fell off the bus ({e}); on real "
                "hardware: check `dmesg` for Xid 79, then reseat or power-cycle it"
            ) from e
        except self._any as e:
            raise GpuError(f"virtual GPU {gpu.uuid}: {what}: {e}") from e

    def sample(self, uuid: str) -> GpuSample:
        gpu = self._gpu(uuid)
        try:  # a VirtualGPU with every method that raises nothing: no wrapper per read
            values = [getattr(gpu, name)() for _, name in _READS]
        except Exception:  # noqa: BLE001 - the careful way says what failed
            values = [self._read(gpu, what, name) for what, name in _READS]
        lo_hi, temp, mem, util, fan, default, thresholds, power, limit, reasons = values
        thresholds = thresholds or {}
        return GpuSample(
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            timestamp=self._clock(),
            temperature_c=None if temp is None else float(temp),
            memory_temperature_c=None if mem is None else float(mem),
            power_w=power,
            enforced_limit_w=limit,
            default_limit_w=default,
            min_limit_w=None if lo_hi is None else lo_hi[0],
            max_limit_w=None if lo_hi is None else lo_hi[1],
            clocks_event_reasons=reasons,
            utilization=util,
            fan_speed_ratio=None if fan is None else fan / 100.0,
            slowdown_temp_c=thresholds.get("slowdown"),
            shutdown_temp_c=thresholds.get("shutdown"),
            max_operating_temp_c=thresholds.get("max_operating"),
        )

    def _read(self, gpu, what: str, name: str):
        """One read, wrapped: a missing method reads as None, an error of the
        simulator's becomes ours, naming the read."""
        fn = getattr(gpu, name, None)
        return None if fn is None else self._call(gpu, what, fn)

    def set_power_limit_w(self, uuid: str, watts: float) -> float:
        gpu = self._gpu(uuid)
        try:
            self._call(gpu, "set power limit", gpu.set_power_limit_w, watts)
        except GpuError as e:
            if isinstance(e.__cause__, self._invalid):
                raise PowerLimitRefused(
                    f"virtual GPU {uuid} refused a power limit of {watts:g} W: {e.__cause__}",
                    requested_w=watts,
                ) from e.__cause__
            raise
        enforced = self._call(gpu, "read back the power limit", gpu.power_limit_w)
        if enforced > watts + 1.0:
            raise PowerLimitRefused(
                f"virtual GPU {uuid}: set {watts:g} W but the enforced limit reads {enforced:g} W",
                requested_w=watts,
                enforced_w=enforced,
            )
        return enforced

    # ------------------------------------------------------------------ clocks

    def clock_state(self, uuid: str) -> ClockState:
        gpu = self._gpu(uuid)
        return ClockState(
            max_mhz=self._call(gpu, "max clock", gpu.max_graphics_clock_mhz),
            supported_mhz=tuple(self._call(gpu, "clocks", gpu.supported_graphics_clocks_mhz)),
            current_mhz=self._call(gpu, "clock", gpu.graphics_clock_mhz),
            locked=self._call(gpu, "locked clocks", gpu.locked_clocks_mhz),
            lock_known=True,
        )

    def _clock_write(self, uuid, what, fn, *args) -> ClockState:
        gpu = self._gpu(uuid)
        try:
            self._call(gpu, what, fn, *args)
        except GpuError as e:
            if isinstance(e.__cause__, self._invalid):
                raise ClocksRefused(
                    f"virtual GPU {uuid} refused to {what}: {e.__cause__}",
                    requested_mhz=args[-1] if args else None,
                ) from e.__cause__
            raise
        return self.clock_state(uuid)

    def set_locked_clocks_mhz(self, uuid: str, min_mhz: int, max_mhz: int) -> ClockState:
        gpu = self._gpu(uuid)
        return self._clock_write(
            uuid, f"lock clocks {min_mhz},{max_mhz} MHz", gpu.set_locked_clocks_mhz,
            min_mhz, max_mhz,
        )  # fmt: skip

    def reset_locked_clocks(self, uuid: str) -> ClockState:
        gpu = self._gpu(uuid)
        return self._clock_write(uuid, "reset locked clocks", gpu.reset_locked_clocks)
