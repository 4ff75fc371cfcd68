"""Virtual backend over the simulator's VirtualGPU, and backend auto-selection."""

from __future__ import annotations

import pytest

from modbridge.gpu.base import GpuError, GpuLost, GpuNotFound, PowerLimitRefused
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend
from modbridge.gpu.select import open_backend
from modbridge.gpu.smi import SmiBackend
from modbridge.gpu.virtual import VirtualBackend
from modbridge.sim import params
from modbridge.sim.world import World

UUID = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"


@pytest.fixture
def world():
    w = World(params.load("default"), seed=1)
    w.step(2000)
    return w


@pytest.fixture
def backend(world):
    return VirtualBackend([world.gpu])


def test_devices(backend):
    (info,) = backend.devices()
    assert (info.index, info.uuid, info.name, info.pci_bus_id) == (
        0,
        UUID,
        "NVIDIA H200",
        "00000000:00:06.0",
    )


def test_sample_reads_the_world(world, backend):
    s = backend.sample(UUID)
    assert s.state == "ok"
    assert s.temperature_c == world.gpu.temperature_c()
    assert s.memory_temperature_c is not None
    assert s.power_w == world.gpu.power_w()
    assert (s.enforced_limit_w, s.default_limit_w) == (700.0, 700.0)
    assert (s.min_limit_w, s.max_limit_w) == (200.0, 700.0)
    assert s.fan_speed_ratio is None  # NotSupported, like the H200
    assert isinstance(s.clocks_event_reasons, int)
    assert 0.0 <= s.utilization <= 1.0


def test_set_power_limit_reads_back(world, backend):
    assert backend.set_power_limit_w(UUID, 450) == 450.0
    assert world.gpu.power_limit_w() == 450.0
    assert backend.sample(UUID).enforced_limit_w == 450.0


def test_limit_outside_the_constraints_is_refused(backend):
    with pytest.raises(PowerLimitRefused, match="outside the constraints") as e:
        backend.set_power_limit_w(UUID, 100)
    assert e.value.requested_w == 100


def test_lost_gpu(world, backend):
    world.gpu_lost()
    with pytest.raises(GpuLost, match="fell off the bus"):
        backend.sample(UUID)
    with pytest.raises(GpuLost):
        backend.set_power_limit_w(UUID, 450)
    (s,) = backend.sample_all()
    assert s.state == "lost" and s.uuid == UUID and s.temperature_c is None


def test_unknown_uuid(backend):
    with pytest.raises(GpuNotFound):
        backend.sample("GPU-nope")


class StandIn:
    """The VirtualGPU interface with nothing behind it, plus optional thresholds."""

    name, uuid, pci_bus_id = "Stand-in", "GPU-standin", "00000000:01:00.0"

    def __init__(self):
        self.limit = 300.0

    def temperature_c(self):
        return 40

    def memory_temperature_c(self):
        return None

    def power_w(self):
        return 100.0

    def power_limit_w(self):
        return self.limit

    def power_limit_constraints_w(self):
        return (100.0, 300.0)

    def default_power_limit_w(self):
        return 300.0

    def set_power_limit_w(self, w):
        self.limit = w

    def clocks_event_reasons(self):
        return 0

    def utilization(self):
        return 0.25

    def fan_speed_pct(self):
        return 60

    def temperature_thresholds_c(self):
        return {"slowdown": 90.0, "shutdown": 100.0, "max_operating": 85.0}


def test_stand_in_with_fan_and_thresholds():
    s = VirtualBackend([StandIn()]).sample("GPU-standin")
    assert s.fan_speed_ratio == 0.6 and s.memory_temperature_c is None
    assert (s.slowdown_temp_c, s.shutdown_temp_c, s.max_operating_temp_c) == (90.0, 100.0, 85.0)


# --------------------------------------------------------------------------- selection


def test_auto_prefers_nvml():
    b = open_backend("auto", nvml_module=FakeNvml(), smi_path="/nonexistent/nvidia-smi")
    assert isinstance(b, NvmlBackend) and b.name == "nvml"


def test_auto_falls_back_to_nvidia_smi(tmp_path):
    nv = FakeNvml()
    nv.fail("nvmlInit", "NVMLError_DriverNotLoaded")
    smi = tmp_path / "nvidia-smi"
    row = (
        "0, GPU-x, NVIDIA H200, 00000000:00:06.0, 32, 31, 55, 94.38, 700.00, 700.00, 700.00, "
        "200.00, 700.00, 0x1, 0, [N/A]"
    )
    smi.write_text(f"#!/bin/sh\necho '{row}'\n")
    smi.chmod(0o755)
    b = open_backend("auto", nvml_module=nv, smi_path=str(smi))
    assert isinstance(b, SmiBackend) and [i.uuid for i in b.devices()] == ["GPU-x"]


def test_auto_with_no_driver_says_it_once_in_one_short_line(caplog):
    """A machine without a GPU: no NVML library, no nvidia-smi. One line, no
    'trying nvidia-smi' warning, no reason or advice repeated."""
    nv = FakeNvml()
    nv.fail("nvmlInit", "NVMLError_LibraryNotFound")
    with caplog.at_level("WARNING"), pytest.raises(GpuError) as e:
        open_backend("auto", nvml_module=nv, smi_path="/nonexistent/nvidia-smi")
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 100, msg
    assert msg.count("install") == 1 and "--sim" in msg and "nvidia-smi" in msg, msg
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_auto_with_a_broken_driver_says_what_was_tried_and_what_to_do(caplog):
    nv = FakeNvml()
    nv.fail("nvmlInit", "NVMLError_DriverNotLoaded")
    with caplog.at_level("WARNING"), pytest.raises(GpuError) as e:
        open_backend("auto", nvml_module=nv, smi_path="/nonexistent/nvidia-smi")
    msg = str(e.value)
    assert msg.startswith("no NVIDIA GPU backend: NVML: NVIDIA driver not loaded"), msg
    assert "nvidia-smi: nvidia-smi not found" in msg
    assert msg.endswith("Install the NVIDIA driver, or run with --sim")
    assert msg.lower().count("install") == 1, msg
    assert not caplog.records


def test_sim(world):
    b = open_backend("sim", sim_gpus=[world.gpu])
    assert isinstance(b, VirtualBackend) and b.devices()[0].uuid == UUID


def test_sim_needs_gpus():
    with pytest.raises(GpuError, match="--sim"):
        open_backend("sim")


def test_explicit_kinds_and_unknown():
    assert isinstance(open_backend("nvml", nvml_module=FakeNvml()), NvmlBackend)
    with pytest.raises(GpuError, match="nvidia-smi not found"):
        open_backend("nvidia-smi", smi_path="/nonexistent/nvidia-smi")
    with pytest.raises(GpuError, match="unknown GPU backend 'cuda'"):
        open_backend("cuda")
