"""A fake GPU whose state lives in a JSON file, so it outlives the processes that set
its power limit (the kill test SIGKILLs bridges; the GPU must remember what they did).

    FileGpu.create(path, limit_w=650.0)          # a 700 W-default GPU at 650 W
    backend = FileGpuBackend(path)               # in any process
    FileGpu(path).update(limit_w=400.0)          # `nvidia-smi -pl 400` by an operator
    FileGpu(path).update(read_only=True)         # writes: GpuNoPermission
    FileGpu(path).update(present=False)          # unplugged: GpuNotFound
    FileGpu(path).update(lock=[345, 1200])       # `nvidia-smi -lgc 345,1200`
    FileGpu(path).update(lock_known=False)       # like NVML: the lock cannot be read back

Clocks answer like the H200 (max 1980 MHz, 345..1980 in 15 MHz steps); the clock
"now" is the lock's max (or 1980 unlocked), so an NVML-like reader sees a reset.

The file is replaced atomically on every change, like a driver that either took a
limit or did not. ``write_delay_s`` sleeps before and after a write, to widen the
window in which a kill can land mid-write.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from modbridge.gpu.base import (
    ClocksRefused,
    ClockState,
    GpuBackend,
    GpuInfo,
    GpuNoPermission,
    GpuNotFound,
    GpuSample,
    PowerLimitRefused,
)

UUID = "GPU-0f11e000-0000-4000-8000-00000000f11e"
MAX_MHZ = 1980
SUPPORTED_MHZ = tuple(range(345, MAX_MHZ + 1, 15))


class FileGpu:
    def __init__(self, path):
        self.path = Path(path)

    @classmethod
    def create(cls, path, limit_w=700.0, default_w=700.0, min_w=200.0, max_w=700.0,
               uuid=UUID, write_delay_s=0.0) -> FileGpu:  # fmt: skip
        gpu = cls(path)
        gpu._save({"uuid": uuid, "limit_w": limit_w, "default_w": default_w, "min_w": min_w,
                   "max_w": max_w, "present": True, "read_only": False,
                   "write_delay_s": write_delay_s, "writes": 0, "lock": None,
                   "lock_known": True, "clock_writes": 0})  # fmt: skip
        return gpu

    def read(self) -> dict:
        return json.loads(self.path.read_text())

    def _save(self, state) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)

    def update(self, **changes) -> dict:
        state = {**self.read(), **changes}
        self._save(state)
        return state

    @property
    def limit_w(self) -> float:
        return self.read()["limit_w"]

    @property
    def lock(self) -> tuple[int, int] | None:
        lock = self.read().get("lock")
        return None if lock is None else tuple(lock)


class FileGpuBackend(GpuBackend):
    name = "file"

    def __init__(self, path):
        self.gpu = FileGpu(path)
        self.attempts = 0

    def owner_key(self, uuid):
        """The GPU is the file: bridges on one file exclude each other machine-wide."""
        return f"{uuid}.file-{os.path.realpath(self.gpu.path)}"

    def devices(self):
        st = self.gpu.read()
        return [GpuInfo(0, st["uuid"], "FileGPU", "00000000:00:06.0")] if st["present"] else []

    def _state(self, uuid):
        st = self.gpu.read()
        if not st["present"] or uuid != st["uuid"]:
            raise GpuNotFound(f"no GPU {uuid}")
        return st

    def sample(self, uuid):
        st = self._state(uuid)
        return GpuSample(uuid=uuid, name="FileGPU", pci_bus_id="00000000:00:06.0",
                         timestamp=time.monotonic(), temperature_c=50.0, power_w=100.0,
                         enforced_limit_w=st["limit_w"], default_limit_w=st["default_w"],
                         min_limit_w=st["min_w"], max_limit_w=st["max_w"])  # fmt: skip

    def set_power_limit_w(self, uuid, watts):
        self.attempts += 1
        st = self._state(uuid)
        if st["read_only"]:
            raise GpuNoPermission(f"GPU {uuid}: no permission (run as root)")
        if not st["min_w"] <= watts <= st["max_w"]:
            raise PowerLimitRefused(f"{watts} W outside the constraints", requested_w=watts)
        time.sleep(st["write_delay_s"])
        self.gpu.update(limit_w=float(watts), writes=st["writes"] + 1)
        time.sleep(st["write_delay_s"])
        return float(watts)

    # ------------------------------------------------------------------ clocks

    def clock_state(self, uuid):
        st = self._state(uuid)
        lock = None if st.get("lock") is None else tuple(st["lock"])
        return ClockState(max_mhz=MAX_MHZ, supported_mhz=SUPPORTED_MHZ,
                          current_mhz=MAX_MHZ if lock is None else lock[1],
                          locked=lock if st.get("lock_known", True) else None,
                          lock_known=st.get("lock_known", True))  # fmt: skip

    def _clock_write(self, uuid, lock):
        self.attempts += 1
        st = self._state(uuid)
        if st["read_only"]:
            raise GpuNoPermission(f"GPU {uuid}: no permission (run as root)")
        if lock is not None and not (lock[0] <= lock[1] and set(lock) <= set(SUPPORTED_MHZ)):
            raise ClocksRefused(f"{lock} is not a supported lock", requested_mhz=lock[1])
        time.sleep(st["write_delay_s"])
        self.gpu.update(lock=lock, clock_writes=st.get("clock_writes", 0) + 1)
        time.sleep(st["write_delay_s"])
        return self.clock_state(uuid)

    def set_locked_clocks_mhz(self, uuid, min_mhz, max_mhz):
        return self._clock_write(uuid, [int(min_mhz), int(max_mhz)])

    def reset_locked_clocks(self, uuid):
        return self._clock_write(uuid, None)
