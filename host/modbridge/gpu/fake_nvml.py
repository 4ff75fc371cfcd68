"""A fake ``pynvml`` (nvidia-ml-py) that answers the way the recorded NVIDIA H200 did.

Built from ``tests/fixtures/nvidia-h200/nvml_h200.json``: every recorded call returns
its recorded answer or raises its recorded error class. The error classes, the
``NVML_*`` constants and the result structures (``c_nvmlFieldValue_t``,
``c_nvmlUtilization_t``, ``nvmlPciInfo_t``) are the real ones from the installed
``pynvml``, so ``except pynvml.NVMLError_NotSupported`` means exactly what it means
against a real GPU. Nothing here ever calls into ``libnvidia-ml``.

    nv = FakeNvml(devices=2)                   # two H200s, distinct UUIDs and bus ids
    backend = NvmlBackend(nvml=nv)
    nv.set_temperature(80, device=1)           # script a reading
    nv.fail("nvmlDeviceGetPowerUsage", "NVMLError_GpuIsLost", device=0)
    nv.read_only = True                        # writes raise NVMLError_NoPermission
    nv.writes                                  # every power-limit and clock write, in order
    nv.devices[0].locked                       # the (min, max) clock lock, None: unlocked
    nv.calls["nvmlDeviceGetTemperature"]       # how often each function was called
    nv.play_trace(load_trace(), clock=...)     # replay the 10 Hz thermal trace

Functions the recording does not hold are absent (``AttributeError``), as in an old
binding; ``remove(name)`` makes a recorded one absent too. Calls before ``nvmlInit``
raise ``NVMLError_Uninitialized`` as the real library does.
"""

from __future__ import annotations

import bisect
import copy
import csv
import importlib
import json
import time
from collections import Counter
from pathlib import Path

FIXTURE_DIR = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "nvidia-h200"
FIXTURE = FIXTURE_DIR / "nvml_h200.json"
TRACE = FIXTURE_DIR / "h200_thermal_trace.csv"
SMI_XML = FIXTURE_DIR / "nvidia_smi_q.xml"  # the supported clocks (not in the NVML recording)

_SYSTEM_CALLS = (
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
)
# Names delegated to the real binding: constants, error classes, result structures.
_DELEGATED_PREFIXES = (
    "NVML_",
    "NVMLError",
    "nvmlClocksEventReason",
    "nvmlClocksThrottleReason",
    "c_nvml",
    "nvmlPciInfo_t",
)
# Recorded calls taking (handle, parameter), keyed by the fixture's prefix.
_PARAM_CALLS = {
    "threshold_": ("nvmlDeviceGetTemperatureThreshold", "NVML_TEMPERATURE_THRESHOLD_"),
    "maxclock_": ("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_"),
    "clock_": ("nvmlDeviceGetClockInfo", "NVML_CLOCK_"),
}
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def load_fixture(path=FIXTURE) -> dict:
    """The recording as a dict (raises FileNotFoundError naming the path)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_trace(path=TRACE) -> list[dict]:
    """The 10 Hz thermal trace: a list of rows with float/int values (``phase`` a str)."""
    rows = []
    with open(path, encoding="utf-8", newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for key, value in raw.items():
                if key == "phase":
                    row[key] = value
                elif key in (
                    "gpu_temp_c",
                    "mem_temp_c",
                    "sm_clock_mhz",
                    "util_pct",
                    "clocks_event_reasons",
                ):
                    row[key] = int(value)
                else:
                    row[key] = float(value)
            rows.append(row)
    return rows


def _recorded_supported_clocks() -> dict[int, list[int]]:
    """The H200's supported clocks as ``nvidia-smi -q -x`` listed them."""
    from modbridge.gpu.smi import parse_supported_clocks_xml

    tables = parse_supported_clocks_xml(SMI_XML.read_text(encoding="utf-8"))
    return next(iter(tables.values()), {})


class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns: an opaque handle (here: the index)."""

    def __init__(self, index):
        self.index = index

    def __repr__(self):
        return f"<FakeHandle {self.index}>"


class FakeDevice:
    """One GPU's answers: ``answers[name]`` or ``answers[(name, param)]`` holds a value
    or an exception class; ``fields[field_id]`` holds ``(nvmlReturn, valueType, value)``."""

    def __init__(self, nvml, index, recording):
        self.index = index
        self.handle = FakeHandle(index)
        self.answers = {}
        self.fields = {}
        self.locked = None  # (min, max) MHz from nvmlDeviceSetGpuLockedClocks
        self.supported_clocks = nvml._supported_clocks  # {memory MHz: [graphics MHz]}
        real = nvml._real
        for key, entry in recording.items():
            if key == "fieldValues":
                for fname, fv in entry.items():
                    fid = getattr(real, fname, None)
                    if fid is not None:
                        self.fields[fid] = (fv["nvmlReturn"], fv["valueType"], fv["value"])
                continue
            if not isinstance(entry, dict) or not ("ok" in entry or "error" in entry):
                continue
            answer = nvml._answer_of(entry)
            if key == "temp_gpu":
                self.answers[("nvmlDeviceGetTemperature", real.NVML_TEMPERATURE_GPU)] = answer
            elif key.startswith("nvmlDevice"):
                self.answers[key] = answer
            else:
                for prefix, (call, const_prefix) in _PARAM_CALLS.items():
                    if key.startswith(prefix):
                        param = getattr(real, const_prefix + key[len(prefix) :], None)
                        if param is not None:
                            self.answers[(call, param)] = answer
                        break
        if index:
            uuid = self.answers["nvmlDeviceGetUUID"]
            self.answers["nvmlDeviceGetUUID"] = (
                f"{uuid[:-4]}{(int(uuid[-4:], 16) + index) & 0xFFFF:04x}"
            )
            pci = dict(self.answers["nvmlDeviceGetPciInfo"])
            pci["device"] = pci["device"] + index
            pci["busId"] = f"{pci['domain']:08X}:{pci['bus']:02X}:{pci['device']:02X}.0"
            pci["busIdLegacy"] = f"{pci['domain']:04X}:{pci['bus']:02X}:{pci['device']:02X}.0"
            self.answers["nvmlDeviceGetPciInfo"] = pci
            serial = self.answers.get("nvmlDeviceGetSerial")
            if isinstance(serial, str):
                self.answers["nvmlDeviceGetSerial"] = str(int(serial) + index)

    @property
    def uuid(self):
        return self.answers["nvmlDeviceGetUUID"]


class FakeNvml:
    """A module-like stand-in for ``pynvml``. See the module docstring."""

    SIMULATED = True  # no real GPU behind it: NvmlBackend.simulated (gpu/simguard.py)

    def __init__(self, fixture=None, devices=1, *, real=None):
        self._removed = set()
        self._real = real if real is not None else importlib.import_module("pynvml")
        recording = fixture if isinstance(fixture, dict) else load_fixture(fixture or FIXTURE)
        self._recording = copy.deepcopy(recording)
        self._supported_clocks = _recorded_supported_clocks()
        self._system = {
            name: self._answer_of(recording[name]) for name in _SYSTEM_CALLS if name in recording
        }
        self.devices = [FakeDevice(self, i, recording) for i in range(devices)]
        self.init_count = 0
        self.read_only = False  # True: writes raise NVMLError_NoPermission (not root)
        self.cap_power = True  # power readings never exceed the enforced limit
        self.calls = Counter()
        self.writes = []  # dicts: call, device, value_mw, result ("ok" or the error name)
        self._failures = {}  # (name, device index or None) -> [exception, times or None]
        self._trace = None  # (rows, times, clock, t0, speed, devices)

    # ------------------------------------------------------------------ scripting

    def _answer_of(self, entry):
        if "error" in entry:
            return getattr(self._real, entry["error"])
        return entry["ok"]

    def _error_class(self, error):
        if isinstance(error, str):
            return getattr(self._real, error)
        return error

    def fail(self, name, error, device=None, times=None):
        """Make ``name`` raise ``error`` (a class, an instance or a class name such as
        ``"NVMLError_GpuIsLost"``) for one device (None: all), ``times`` times (None:
        until ``clear_failures``)."""
        self._failures[(name, device)] = [self._error_class(error), times]

    def clear_failures(self):
        self._failures.clear()

    def remove(self, name):
        """Make a function absent, like an old binding that predates it."""
        self._removed.add(name)

    def set_answer(self, name, value, device=0, param=None):
        """Set what ``name`` (with ``param``, e.g. a threshold constant) answers; an
        exception class or name makes it raise."""
        if isinstance(value, str) and value.startswith("NVMLError"):
            value = self._error_class(value)
        key = name if param is None else (name, param)
        self.devices[device].answers[key] = value

    def _devs(self, device):
        return self.devices if device is None else [self.devices[device]]

    def set_temperature(self, celsius, device=None):
        for d in self._devs(device):
            d.answers[("nvmlDeviceGetTemperature", self._real.NVML_TEMPERATURE_GPU)] = int(celsius)

    def set_memory_temperature(self, celsius, device=None):
        """None makes the memory-temperature field NotSupported."""
        fid = self._real.NVML_FI_DEV_MEMORY_TEMP
        for d in self._devs(device):
            if celsius is None:
                d.fields[fid] = (self._real.NVML_ERROR_NOT_SUPPORTED, 1, 0)
            else:
                d.fields[fid] = (0, self._real.NVML_VALUE_TYPE_UNSIGNED_INT, int(celsius))

    def set_power_w(self, watts, device=None):
        for d in self._devs(device):
            d.answers["nvmlDeviceGetPowerUsage"] = int(round(watts * 1000))

    def set_reasons(self, bits, device=None):
        for d in self._devs(device):
            d.answers["nvmlDeviceGetCurrentClocksEventReasons"] = int(bits)
            d.answers["nvmlDeviceGetCurrentClocksThrottleReasons"] = int(bits)

    def set_utilization(self, gpu_pct, memory_pct=0, device=None):
        for d in self._devs(device):
            d.answers["nvmlDeviceGetUtilizationRates"] = {"gpu": gpu_pct, "memory": memory_pct}

    def set_fan(self, pct, device=None):
        """A fan speed in % (None: NotSupported, as on the fanless H200)."""
        for d in self._devs(device):
            d.answers["nvmlDeviceGetFanSpeed"] = (
                self._real.NVMLError_NotSupported if pct is None else int(pct)
            )

    def apply_trace_row(self, row, device=None):
        """Set temperature, memory temperature, power, reasons and utilization from a
        trace row (``load_trace()``). The enforced limit stays the actuator's."""
        self.set_temperature(row["gpu_temp_c"], device)
        self.set_memory_temperature(row["mem_temp_c"], device)
        self.set_power_w(row["power_w"], device)
        self.set_reasons(row["clocks_event_reasons"], device)
        self.set_utilization(row["util_pct"], device=device)

    def play_trace(self, rows=None, clock=time.monotonic, speed=1.0, device=None, loop=False):
        """Replay the trace against ``clock()`` (seconds) from now: every read shows the
        latest row at or before ``(clock() - start) * speed``."""
        rows = rows if rows is not None else load_trace()
        times = [r["t_s"] for r in rows]
        self._trace = (rows, times, clock, clock(), speed, device, loop)
        self._advance_trace()

    def _advance_trace(self):
        if self._trace is None:
            return
        rows, times, clock, t0, speed, device, loop = self._trace
        t = (clock() - t0) * speed
        if loop and times[-1] > 0:
            t %= times[-1]
        i = max(0, bisect.bisect_right(times, t) - 1)
        self.apply_trace_row(rows[i], device)

    # ------------------------------------------------------------------ plumbing

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name.startswith(_DELEGATED_PREFIXES):
            return getattr(self._real, name)
        if name in self._removed:
            raise AttributeError(f"fake pynvml has no {name} (removed)")
        if name in self._system:
            return lambda: self._system_call(name)
        if name.startswith("nvmlDevice") and any(
            (k == name or (isinstance(k, tuple) and k[0] == name)) for k in self.devices[0].answers
        ):
            return lambda handle, *args: self._device_call(name, handle, *args)
        raise AttributeError(f"fake pynvml has no {name} (not in the H200 recording)")

    def __getattribute__(self, name):
        if not name.startswith("_") and name in object.__getattribute__(self, "_removed"):
            raise AttributeError(f"fake pynvml has no {name} (removed)")
        return object.__getattribute__(self, name)

    def _enter(self, name, device_index=None, check_init=True):
        self.calls[name] += 1
        if check_init and self.init_count <= 0:
            raise self._real.NVMLError_Uninitialized()
        for key in ((name, device_index), (name, None)):
            failure = self._failures.get(key)
            if failure is None:
                continue
            error, times = failure
            if times is not None:
                failure[1] = times - 1
                if failure[1] <= 0:
                    del self._failures[key]
            raise error() if isinstance(error, type) else error

    def _device(self, handle):
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.devices):
            raise self._real.NVMLError_InvalidArgument()
        return self.devices[handle.index]

    def _recorded(self, dev, key):
        if key not in dev.answers:
            raise self._real.NVMLError_InvalidArgument()
        answer = dev.answers[key]
        if isinstance(answer, type) and issubclass(answer, BaseException):
            raise answer()
        return copy.deepcopy(answer)

    def _system_call(self, name):
        self._enter(name)
        answer = self._system[name]
        if isinstance(answer, type):
            raise answer()
        return answer

    def _device_call(self, name, handle, *args):
        dev = self._device(handle)
        self._enter(name, dev.index)
        self._advance_trace()
        key = name if not args else (name, args[0])
        return self._recorded(dev, key)

    # ------------------------------------------------------------------ the binding's API

    def nvmlInit(self):
        self._enter("nvmlInit", check_init=False)
        self.init_count += 1

    def nvmlInitWithFlags(self, flags=0):
        self.nvmlInit()

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.init_count -= 1

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.devices):
            raise self._real.NVMLError_InvalidArgument()
        return self.devices[index].handle

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._enter("nvmlDeviceGetHandleByUUID")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for d in self.devices:
            if d.uuid == uuid:
                return d.handle
        raise self._real.NVMLError_NotFound()

    def nvmlDeviceGetPciInfo(self, handle):
        dev = self._device(handle)
        self._enter("nvmlDeviceGetPciInfo", dev.index)
        raw = self._recorded(dev, "nvmlDeviceGetPciInfo")
        info = self._real.nvmlPciInfo_t()
        for key, value in raw.items():
            setattr(info, key, value.encode() if isinstance(value, str) else value)
        return info

    def nvmlDeviceGetUtilizationRates(self, handle):
        dev = self._device(handle)
        self._enter("nvmlDeviceGetUtilizationRates", dev.index)
        self._advance_trace()
        raw = self._recorded(dev, "nvmlDeviceGetUtilizationRates")
        return self._real.c_nvmlUtilization_t(gpu=raw["gpu"], memory=raw["memory"])

    def nvmlDeviceGetPowerUsage(self, handle):
        dev = self._device(handle)
        self._enter("nvmlDeviceGetPowerUsage", dev.index)
        self._advance_trace()
        mw = self._recorded(dev, "nvmlDeviceGetPowerUsage")
        if self.cap_power and isinstance(dev.answers.get("nvmlDeviceGetEnforcedPowerLimit"), int):
            mw = min(mw, dev.answers["nvmlDeviceGetEnforcedPowerLimit"])
        return mw

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        dev = self._device(handle)
        self._enter("nvmlDeviceGetFieldValues", dev.index)
        self._advance_trace()
        values = (self._real.c_nvmlFieldValue_t * len(fieldIds))()
        for i, fid in enumerate(fieldIds):
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            values[i].fieldId = fid
            values[i].scopeId = scope
            ret, vtype, value = dev.fields.get(fid, (self._real.NVML_ERROR_NOT_SUPPORTED, 0, 0))
            values[i].nvmlReturn = ret
            values[i].valueType = vtype
            if ret == 0:
                setattr(values[i].value, _VALUE_MEMBERS[vtype], value)
        return values

    def nvmlDeviceSetPowerManagementLimit(self, handle, limit):
        dev = self._device(handle)
        entry = {
            "call": "nvmlDeviceSetPowerManagementLimit",
            "device": dev.index,
            "value_mw": limit,
            "result": "ok",
        }
        self.writes.append(entry)
        try:
            self._enter("nvmlDeviceSetPowerManagementLimit", dev.index)
            if not isinstance(limit, int) or isinstance(limit, bool):
                raise TypeError(f"an integer is required (got {type(limit).__name__})")
            if self.read_only:
                raise self._real.NVMLError_NoPermission()
            lo, hi = self._recorded(dev, "nvmlDeviceGetPowerManagementLimitConstraints")
            if not lo <= limit <= hi:
                raise self._real.NVMLError_InvalidArgument()
        except Exception as e:
            entry["result"] = type(e).__name__
            raise
        dev.answers["nvmlDeviceGetPowerManagementLimit"] = limit
        dev.answers["nvmlDeviceGetEnforcedPowerLimit"] = limit

    def nvmlDeviceSetPowerManagementLimit_v2(self, device, powerScope, powerLimit, version=None):
        """Like the real wrapper: reports success whatever the driver said."""
        try:
            self.nvmlDeviceSetPowerManagementLimit(device, powerLimit)
        except Exception:  # noqa: BLE001 - the real _v2 wrapper drops the return code
            pass
        self.writes[-1]["call"] = "nvmlDeviceSetPowerManagementLimit_v2"
        return 0

    # ------------------------------------------------------------------ clocks

    def nvmlDeviceGetClockInfo(self, handle, clock_type):
        """The recorded clock; the graphics/SM clock never above a lock's max."""
        dev = self._device(handle)
        self._enter("nvmlDeviceGetClockInfo", dev.index)
        mhz = self._recorded(dev, ("nvmlDeviceGetClockInfo", clock_type))
        gfx = (self._real.NVML_CLOCK_GRAPHICS, self._real.NVML_CLOCK_SM)
        if dev.locked is not None and clock_type in gfx:
            mhz = min(mhz, dev.locked[1])
        return mhz

    def nvmlDeviceGetSupportedMemoryClocks(self, handle):
        dev = self._device(handle)
        self._enter("nvmlDeviceGetSupportedMemoryClocks", dev.index)
        return sorted(dev.supported_clocks, reverse=True)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle, memoryClockMHz):
        dev = self._device(handle)
        self._enter("nvmlDeviceGetSupportedGraphicsClocks", dev.index)
        if memoryClockMHz not in dev.supported_clocks:
            raise self._real.NVMLError_InvalidArgument()
        return list(dev.supported_clocks[memoryClockMHz])

    def _clock_write(self, name, dev, value):
        entry = {"call": name, "device": dev.index, "value_mhz": value, "result": "ok"}
        self.writes.append(entry)
        try:
            self._enter(name, dev.index)
            if self.read_only:
                raise self._real.NVMLError_NoPermission()
        except Exception as e:
            entry["result"] = type(e).__name__
            raise
        return entry

    def nvmlDeviceSetGpuLockedClocks(self, handle, minGpuClockMHz, maxGpuClockMHz):
        """Like the driver: InvalidArgument unless whole MHz with min <= max (values
        between supported clocks are taken, as a real driver rounds them)."""
        dev = self._device(handle)
        entry = self._clock_write("nvmlDeviceSetGpuLockedClocks", dev,
                                  [minGpuClockMHz, maxGpuClockMHz])  # fmt: skip
        values = (minGpuClockMHz, maxGpuClockMHz)
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values) or (
            minGpuClockMHz > maxGpuClockMHz
        ):
            entry["result"] = "NVMLError_InvalidArgument"
            raise self._real.NVMLError_InvalidArgument()
        dev.locked = (minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle):
        dev = self._device(handle)
        self._clock_write("nvmlDeviceResetGpuLockedClocks", dev, None)
        dev.locked = None
