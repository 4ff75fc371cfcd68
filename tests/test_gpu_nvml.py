"""NVML backend against the fake pynvml built from the H200 recording (never a real GPU)."""

from __future__ import annotations

import ctypes.util

import pynvml
import pytest

from modbridge.gpu.base import (
    GpuDriverNotLoaded,
    GpuError,
    GpuLost,
    GpuNoPermission,
    GpuNotFound,
    PowerLimitRefused,
)
from modbridge.gpu.fake_nvml import FakeNvml, load_fixture, load_trace
from modbridge.gpu.nvml import NvmlBackend

UUID = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"


@pytest.fixture
def nv():
    return FakeNvml()


@pytest.fixture
def backend(nv):
    b = NvmlBackend(nvml=nv)
    yield b
    b.close()


# --------------------------------------------------------------------------- the fake itself


def test_fake_reuses_the_real_exception_classes_and_constants(nv):
    assert nv.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert nv.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert nv.NVML_FI_DEV_MEMORY_TEMP == pynvml.NVML_FI_DEV_MEMORY_TEMP
    assert nv.nvmlClocksEventReasonSwPowerCap == 4


def test_fake_needs_init_like_the_real_library(nv):
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()
    nv.nvmlInit()
    assert nv.nvmlDeviceGetCount() == 1


def test_fake_answers_recorded_calls_and_errors(nv):
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetSerial(h) == "1650000000001"
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetFanSpeed(h)
    with pytest.raises(AttributeError):
        nv.nvmlDeviceGetSomethingNeverRecorded  # noqa: B018


def test_fake_clones_devices_with_distinct_ids():
    nv = FakeNvml(devices=3)
    b = NvmlBackend(nvml=nv)
    infos = b.devices()
    assert [i.index for i in infos] == [0, 1, 2]
    assert len({i.uuid for i in infos}) == 3
    assert len({i.pci_bus_id for i in infos}) == 3
    assert infos[0].uuid == UUID
    assert infos[1].pci_bus_id == "00000000:00:07.0"


# --------------------------------------------------------------------------- sample


def test_devices_match_the_fixture(backend):
    (info,) = backend.devices()
    assert (info.index, info.uuid, info.name, info.pci_bus_id) == (
        0,
        UUID,
        "NVIDIA H200",
        "00000000:00:06.0",
    )


def test_sample_matches_the_fixture(backend):
    rec = load_fixture()
    s = backend.sample(UUID)
    assert s.state == "ok" and s.error is None
    assert s.temperature_c == rec["temp_gpu"]["ok"] == 33
    assert s.memory_temperature_c == rec["fieldValues"]["NVML_FI_DEV_MEMORY_TEMP"]["value"] == 31
    assert s.power_w == pytest.approx(124.884)
    assert s.enforced_limit_w == 700.0
    assert s.default_limit_w == 700.0
    assert (s.min_limit_w, s.max_limit_w) == (200.0, 700.0)
    assert s.clocks_event_reasons == 0x1  # GPU idle
    assert s.utilization == 0.0
    assert s.fan_speed_ratio is None  # the H200 has no fans: absent, never 0
    assert (s.slowdown_temp_c, s.shutdown_temp_c, s.max_operating_temp_c) == (89.0, 95.0, 87.0)
    assert (s.name, s.pci_bus_id) == ("NVIDIA H200", "00000000:00:06.0")


def test_sample_cost_in_nvml_calls(nv, backend):
    """Deterministic cost: 12 calls for the first sample (static values and the
    NotSupported fan are learnt once), 6 per sample after that."""
    nv.calls.clear()
    backend.sample(UUID)
    first = sum(nv.calls.values())
    nv.calls.clear()
    backend.sample(UUID)
    steady = sum(nv.calls.values())
    assert first == 12, nv.calls
    assert steady == 6, nv.calls
    assert "nvmlDeviceGetFanSpeed" not in nv.calls


def test_fan_speed_is_read_on_a_gpu_with_fans(nv, backend):
    nv.set_fan(55)
    backend.sample(UUID)
    nv.calls.clear()
    assert backend.sample(UUID).fan_speed_ratio == pytest.approx(0.55)
    assert sum(nv.calls.values()) == 7


def test_clocks_event_reasons_use_the_new_call(nv, backend):
    nv.set_reasons(0x4)
    assert backend.sample(UUID).clocks_event_reasons == 0x4
    assert nv.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert nv.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0


def test_clocks_throttle_reasons_only_for_an_old_binding(nv):
    nv.remove("nvmlDeviceGetCurrentClocksEventReasons")
    nv.set_reasons(0x20)
    b = NvmlBackend(nvml=nv)
    assert b.sample(UUID).clocks_event_reasons == 0x20
    assert nv.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


@pytest.mark.parametrize(
    "call, param, attr",
    [
        ("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU, "temperature_c"),
        ("nvmlDeviceGetPowerUsage", None, "power_w"),
        ("nvmlDeviceGetEnforcedPowerLimit", None, "enforced_limit_w"),
        ("nvmlDeviceGetPowerManagementDefaultLimit", None, "default_limit_w"),
        ("nvmlDeviceGetPowerManagementLimitConstraints", None, "min_limit_w"),
        ("nvmlDeviceGetPowerManagementLimitConstraints", None, "max_limit_w"),
        ("nvmlDeviceGetCurrentClocksEventReasons", None, "clocks_event_reasons"),
        ("nvmlDeviceGetUtilizationRates", None, "utilization"),
        ("nvmlDeviceGetFanSpeed", None, "fan_speed_ratio"),
        (
            "nvmlDeviceGetTemperatureThreshold",
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            "slowdown_temp_c",
        ),
        (
            "nvmlDeviceGetTemperatureThreshold",
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
            "shutdown_temp_c",
        ),
        (
            "nvmlDeviceGetTemperatureThreshold",
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
            "max_operating_temp_c",
        ),
    ],
)
def test_not_supported_is_none_never_zero(nv, call, param, attr):
    nv.set_answer(call, "NVMLError_NotSupported", param=param)
    s = NvmlBackend(nvml=nv).sample(UUID)
    assert getattr(s, attr) is None
    assert s.state == "ok"


def test_memory_temperature_field_not_supported_is_none(nv, backend):
    nv.set_memory_temperature(None)
    assert backend.sample(UUID).memory_temperature_c is None
    nv.calls.clear()
    backend.sample(UUID)
    assert nv.calls["nvmlDeviceGetFieldValues"] == 0  # learnt: not asked again


def test_everything_not_supported_gives_an_empty_sample(nv):
    nv.init_count = 1  # answer directly; the backend inits again, harmless
    for key in list(nv.devices[0].answers):
        if key not in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo"):
            nv.devices[0].answers[key] = pynvml.NVMLError_NotSupported
    nv.devices[0].fields.clear()
    s = NvmlBackend(nvml=nv).sample(UUID)
    values = [
        s.temperature_c,
        s.memory_temperature_c,
        s.power_w,
        s.enforced_limit_w,
        s.default_limit_w,
        s.min_limit_w,
        s.max_limit_w,
        s.clocks_event_reasons,
        s.utilization,
        s.fan_speed_ratio,
        s.slowdown_temp_c,
        s.shutdown_temp_c,
        s.max_operating_temp_c,
    ]
    assert values == [None] * len(values)


def test_no_permission_says_what_to_do(nv, backend):
    nv.fail("nvmlDeviceGetPowerUsage", "NVMLError_NoPermission")
    with pytest.raises(GpuNoPermission) as e:
        backend.sample(UUID)
    msg = str(e.value)
    assert "root" in msg and "CAP_SYS_ADMIN" in msg and "nvidia-smi -pm 1" in msg
    assert e.value.state == "no_permission"


def test_gpu_is_lost_says_what_to_do(nv, backend):
    nv.fail("nvmlDeviceGetTemperature", pynvml.NVMLError_GpuIsLost)
    with pytest.raises(GpuLost) as e:
        backend.sample(UUID)
    msg = str(e.value)
    assert "fell off the bus" in msg and "Xid 79" in msg and UUID in msg
    assert isinstance(e.value.__cause__, pynvml.NVMLError_GpuIsLost)


@pytest.mark.parametrize("error", ["NVMLError_DriverNotLoaded", "NVMLError_LibraryNotFound"])
def test_driver_not_loaded_at_init(nv, error):
    nv.fail("nvmlInit", error)
    with pytest.raises(GpuDriverNotLoaded) as e:
        NvmlBackend(nvml=nv)
    msg = str(e.value)
    assert "NVIDIA driver not loaded" in msg
    assert "--backend nvidia-smi" in msg and "--sim" in msg


@pytest.mark.parametrize(
    "error, text", [("NVMLError_Unknown", "Unknown Error"), ("NVMLError_Timeout", "Timeout")]
)
def test_other_errors_carry_the_nvml_string(nv, backend, error, text):
    nv.fail("nvmlDeviceGetEnforcedPowerLimit", error)
    with pytest.raises(GpuError) as e:
        backend.sample(UUID)
    assert type(e.value) is GpuError
    assert text in str(e.value) and "nvmlDeviceGetEnforcedPowerLimit" in str(e.value)


def test_uninitialized_after_close_is_a_gpu_error(nv):
    b = NvmlBackend(nvml=nv)
    b.close()
    b.close()  # idempotent
    assert nv.calls["nvmlShutdown"] == 1
    with pytest.raises(GpuError, match="Uninitialized"):
        b.sample(UUID)


def test_unknown_uuid(backend):
    with pytest.raises(GpuNotFound, match="GPU-nope"):
        backend.sample("GPU-nope")


def test_sample_all_marks_only_the_lost_gpu():
    nv = FakeNvml(devices=2)
    b = NvmlBackend(nvml=nv)
    nv.fail("nvmlDeviceGetPowerUsage", "NVMLError_GpuIsLost", device=1)
    good, lost = b.sample_all()
    assert good.state == "ok" and good.power_w == pytest.approx(124.884)
    assert lost.state == "lost" and "Xid 79" in lost.error and lost.temperature_c is None


def test_a_gpu_lost_at_enumeration_is_skipped():
    nv = FakeNvml(devices=2)
    nv.fail("nvmlDeviceGetHandleByIndex", "NVMLError_GpuIsLost", device=1)
    assert [i.index for i in NvmlBackend(nvml=nv).devices()] == [0]


def test_trace_replay_drives_the_readings(nv, backend):
    now = [0.0]
    nv.play_trace(load_trace(), clock=lambda: now[0])
    idle = backend.sample(UUID)
    assert (idle.temperature_c, idle.memory_temperature_c) == (34.0, 37.0)
    now[0] = 100.0  # mid-load: ~690 W, capped by SwPowerCap
    load = backend.sample(UUID)
    assert load.power_w > 600 and load.temperature_c > 50
    assert load.clocks_event_reasons & 0x4
    assert load.utilization > 0.9


def test_power_reading_never_exceeds_the_enforced_limit(nv, backend):
    nv.set_power_w(690)
    backend.set_power_limit_w(UUID, 400)
    assert backend.sample(UUID).power_w == 400.0


# --------------------------------------------------------------------------- the write


def test_set_power_limit_uses_v1_in_milliwatts_and_reads_back(nv, backend):
    assert backend.set_power_limit_w(UUID, 450) == 450.0
    assert nv.writes == [
        {
            "call": "nvmlDeviceSetPowerManagementLimit",
            "device": 0,
            "value_mw": 450000,
            "result": "ok",
        }
    ]
    assert nv.calls["nvmlDeviceSetPowerManagementLimit_v2"] == 0
    assert nv.calls["nvmlDeviceGetEnforcedPowerLimit"] >= 1
    assert backend.sample(UUID).enforced_limit_w == 450.0


def test_set_power_limit_rounds_to_milliwatts(nv, backend):
    assert backend.set_power_limit_w(UUID, 333.3334) == pytest.approx(333.333)
    assert nv.writes[-1]["value_mw"] == 333333


def test_write_without_root_is_no_permission(nv, backend):
    nv.read_only = True
    with pytest.raises(GpuNoPermission) as e:
        backend.set_power_limit_w(UUID, 450)
    assert "root" in str(e.value) and "450" in str(e.value)
    assert nv.writes[-1]["result"] == "NVMLError_NoPermission"
    assert backend.sample(UUID).enforced_limit_w == 700.0


def test_write_outside_constraints_is_refused(nv, backend):
    backend.sample(UUID)  # learn the constraints for the message
    with pytest.raises(PowerLimitRefused) as e:
        backend.set_power_limit_w(UUID, 150)
    assert "Invalid Argument" in str(e.value) and "200.0..700.0" in str(e.value)
    assert e.value.requested_w == 150


def test_write_not_supported_is_refused(nv, backend):
    nv.fail("nvmlDeviceSetPowerManagementLimit", "NVMLError_NotSupported")
    with pytest.raises(PowerLimitRefused, match="Not Supported"):
        backend.set_power_limit_w(UUID, 450)


def test_write_to_a_lost_gpu(nv, backend):
    nv.fail("nvmlDeviceSetPowerManagementLimit", "NVMLError_GpuIsLost")
    with pytest.raises(GpuLost, match="Xid 79"):
        backend.set_power_limit_w(UUID, 450)


def test_write_that_does_not_take_is_refused(nv, backend, monkeypatch):
    monkeypatch.setattr(nv, "nvmlDeviceSetPowerManagementLimit", lambda handle, mw: None)
    with pytest.raises(PowerLimitRefused) as e:
        backend.set_power_limit_w(UUID, 450)
    assert (e.value.requested_w, e.value.enforced_w) == (450, 700.0)


def test_lower_enforced_limit_is_returned(nv, backend, monkeypatch):
    """Another limiter below ours: the write took, the lower enforced value is returned."""
    real_set = nv.nvmlDeviceSetPowerManagementLimit

    def set_and_cap(handle, mw):
        real_set(handle, mw)
        nv.devices[0].answers["nvmlDeviceGetEnforcedPowerLimit"] = 300000

    monkeypatch.setattr(nv, "nvmlDeviceSetPowerManagementLimit", set_and_cap)
    assert backend.set_power_limit_w(UUID, 450) == 300.0


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed"
)
def test_real_pynvml_without_a_driver_is_driver_not_loaded():
    with pytest.raises(GpuDriverNotLoaded, match="libnvidia-ml.so.1 not found"):
        NvmlBackend()
