"""The virtual backend: the simulator's GPUs (:class:`modbridge.sim.gpu.VirtualGPU`)
behind the same interface as NVML, so ``--sim`` exercises the real bridge, policy and
actuator. The simulator's ``GpuLost`` becomes ours; a limit outside the constraints
(the simulator's InvalidArgument) becomes :class:`PowerLimitRefused`, and a clock
lock it refuses :class:`ClocksRefused`. Unlike NVML, the lock in force can be read
(``ClockState.lock_known``), and a locked clock really lowers the simulated GPU's power
and heat (modbridge.sim.gpu).
"""

from __future__ import annotations

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


class VirtualBackend(GpuBackend):
    """``gpus``: VirtualGPU objects (anything with the VirtualGPU methods)."""

    name = "virtual"

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
        try:
            return self._sample_at_once(gpu)
        except Exception:  # noqa: BLE001 - the careful way below says what failed
            return self._sample(gpu)

    def _sample_at_once(self, gpu) -> GpuSample:
        """:meth:`_sample` for a VirtualGPU that has every method and raises nothing:
        the same reads in the same order, without a wrapper per read."""
        lo, hi = gpu.power_limit_constraints_w()
        temp = gpu.temperature_c()
        mem = gpu.memory_temperature_c()
        util = gpu.utilization()
        fan = gpu.fan_speed_pct()
        default = gpu.default_power_limit_w()
        thresholds = gpu.temperature_thresholds_c() or {}
        return GpuSample(
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            timestamp=self._clock(),
            temperature_c=None if temp is None else float(temp),
            memory_temperature_c=None if mem is None else float(mem),
            power_w=gpu.power_w(),
            enforced_limit_w=gpu.power_limit_w(),
            default_limit_w=default,
            min_limit_w=lo,
            max_limit_w=hi,
            clocks_event_reasons=gpu.clocks_event_reasons(),
            utilization=util,
            fan_speed_ratio=None if fan is None else fan / 100.0,
            slowdown_temp_c=thresholds.get("slowdown"),
            shutdown_temp_c=thresholds.get("shutdown"),
            max_operating_temp_c=thresholds.get("max_operating"),
        )

    def _sample(self, gpu) -> GpuSample:
        """Every read wrapped: a missing method reads as None, an error of the
        simulator's becomes ours, naming the read."""

        def read(what, name):
            fn = getattr(gpu, name, None)
            return None if fn is None else self._call(gpu, what, fn)

        lo_hi = read("constraints", "power_limit_constraints_w")
        temp = read("temperature", "temperature_c")
        mem = read("memory temperature", "memory_temperature_c")
        util = read("utilization", "utilization")
        fan = read("fan speed", "fan_speed_pct")
        default = read("default limit", "default_power_limit_w")
        thresholds = read("thresholds", "temperature_thresholds_c") or {}
        return GpuSample(
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            timestamp=self._clock(),
            temperature_c=None if temp is None else float(temp),
            memory_temperature_c=None if mem is None else float(mem),
            power_w=read("power", "power_w"),
            enforced_limit_w=read("power limit", "power_limit_w"),
            default_limit_w=default,
            min_limit_w=None if lo_hi is None else lo_hi[0],
            max_limit_w=None if lo_hi is None else lo_hi[1],
            clocks_event_reasons=read("clocks-event reasons", "clocks_event_reasons"),
            utilization=util,
            fan_speed_ratio=None if fan is None else fan / 100.0,
            slowdown_temp_c=thresholds.get("slowdown"),
            shutdown_temp_c=thresholds.get("shutdown"),
            max_operating_temp_c=thresholds.get("max_operating"),
        )

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
