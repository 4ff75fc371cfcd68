"""The virtual GPU answers like the recorded H200 and its power limit changes the heat."""

import json
from pathlib import Path

import pytest

from modbridge.sim import GpuInvalidArgument, GpuLost, Profile, World, load_params
from modbridge.sim import gpu as vgpu

FIXTURE = Path(__file__).parent / "fixtures" / "nvidia-h200" / "nvml_h200.json"


@pytest.fixture(scope="module")
def nvml():
    return json.loads(FIXTURE.read_text())


def quiet():
    return load_params("default").override({"adc.noise_lsb": 0.0})


def world(profile="idle", **kw):
    w = World(quiet(), seed=0, profile=profile, **kw)
    w.set_duties(32768, 32768)
    w.equilibrate()
    return w


def test_identity_matches_the_h200_recording(nvml):
    g = world().gpu
    assert g.name == nvml["nvmlDeviceGetName"]["ok"]
    assert g.uuid == nvml["nvmlDeviceGetUUID"]["ok"]
    assert g.pci_bus_id == nvml["nvmlDeviceGetPciInfo"]["ok"]["busId"]
    lo, hi = nvml["nvmlDeviceGetPowerManagementLimitConstraints"]["ok"]
    assert g.power_limit_constraints_w() == (lo / 1000, hi / 1000) == (200.0, 700.0)
    assert (
        g.default_power_limit_w() == nvml["nvmlDeviceGetPowerManagementDefaultLimit"]["ok"] / 1000
    )
    assert g.power_limit_w() == 700.0
    assert nvml["nvmlDeviceGetFanSpeed"]["error"] == "NVMLError_NotSupported"
    assert g.fan_speed_pct() is None


def test_clocks_event_constants_are_nvmls(nvml):
    c = nvml["clocks_event_reason_constants"]
    assert vgpu.CLOCKS_EVENT_NONE == c["nvmlClocksEventReasonNone"]
    assert vgpu.CLOCKS_EVENT_GPU_IDLE == c["nvmlClocksEventReasonGpuIdle"]
    assert (
        vgpu.CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING
        == (c["nvmlClocksEventReasonApplicationsClocksSetting"])
    )
    assert vgpu.CLOCKS_EVENT_SW_POWER_CAP == c["nvmlClocksEventReasonSwPowerCap"]
    assert vgpu.CLOCKS_EVENT_HW_SLOWDOWN == c["nvmlClocksEventReasonHwSlowdown"]
    assert vgpu.CLOCKS_EVENT_SYNC_BOOST == c["nvmlClocksEventReasonSyncBoost"]
    assert vgpu.CLOCKS_EVENT_SW_THERMAL_SLOWDOWN == c["nvmlClocksEventReasonSwThermalSlowdown"]
    assert vgpu.CLOCKS_EVENT_HW_THERMAL_SLOWDOWN == c["nvmlClocksEventReasonHwThermalSlowdown"]
    assert (
        vgpu.CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN
        == (c["nvmlClocksEventReasonHwPowerBrakeSlowdown"])
    )
    assert vgpu.CLOCKS_EVENT_DISPLAY_CLOCK_SETTING == c["nvmlClocksEventReasonDisplayClockSetting"]


def test_idle_reads_like_the_recording():
    g = world().gpu
    assert g.power_w() == 80.0
    assert g.clocks_event_reasons() == vgpu.CLOCKS_EVENT_GPU_IDLE
    assert g.utilization() == 0.0
    assert isinstance(g.temperature_c(), int)
    assert isinstance(g.memory_temperature_c(), int)


def test_limit_write_changes_heat_input_and_sets_sw_power_cap():
    free = world("step650")
    capped = world("step650")
    capped.gpu.set_power_limit_w(450)
    assert capped.gpu.power_limit_w() == 450.0
    for w in (free, capped):
        w.step(60_000 + 300_000)  # idle minute, then 5 min of 650 W demand
    assert free.snapshot()["gpu_draw_w"] == 650.0
    assert free.gpu.clocks_event_reasons() == 0
    assert capped.snapshot()["gpu_draw_w"] == 450.0
    assert capped.gpu.power_w() == 450.0
    assert capped.gpu.clocks_event_reasons() == vgpu.CLOCKS_EVENT_SW_POWER_CAP
    assert capped.gpu.utilization() == 1.0
    assert free.T[0] - capped.T[0] > 5.0  # 200 W less heat: a clearly cooler die
    # Raising the limit again lifts the cap at once; the ~1 s power average follows.
    capped.gpu.set_power_limit_w(700.0)
    capped.step(500)
    assert 450.0 < capped.gpu.power_w() < 650.0
    capped.step(1000)
    assert capped.gpu.power_w() == 650.0
    assert capped.gpu.clocks_event_reasons() == 0


def test_power_reading_is_a_one_second_average():
    w = world(Profile.parse("idle 10s\nhold 600W 10s"))
    w.step(10_000)
    assert w.gpu.power_w() == 80.0
    w.step(500)
    assert w.gpu.power_w() == pytest.approx(340.0, abs=1.0)  # half the window at 600 W
    w.step(500)
    assert w.gpu.power_w() == 600.0


def test_out_of_constraint_limits_are_refused_not_clamped():
    g = world().gpu
    for bad in (199.999, 700.001, 0, -5, 1e9):
        with pytest.raises(GpuInvalidArgument, match="outside the constraints 200..700 W"):
            g.set_power_limit_w(bad)
        assert g.power_limit_w() == 700.0
    for bad in ("500", None, True):
        with pytest.raises(GpuInvalidArgument, match="must be a number"):
            g.set_power_limit_w(bad)
    with pytest.raises(ValueError):  # also a ValueError, like a bad argument
        g.set_power_limit_w(100)
    g.set_power_limit_w(200)
    g.set_power_limit_w(700)
    g.set_power_limit_w(512.3456)
    assert g.power_limit_w() == 512.346  # NVML's unit is the mW


def test_gpu_lost_raises_from_every_query_until_cleared():
    w = world()
    g = w.gpu
    w.gpu_lost()
    calls = (
        g.temperature_c,
        g.memory_temperature_c,
        g.power_w,
        g.power_limit_w,
        g.default_power_limit_w,
        g.power_limit_constraints_w,
        g.clocks_event_reasons,
        g.utilization,
        g.fan_speed_pct,
        g.total_energy_j,
        lambda: g.set_power_limit_w(500),
    )
    for call in calls:
        with pytest.raises(GpuLost, match="GPU lost: .*injected fault"):
            call()
    assert w.snapshot()["gpu_lost"] is True
    assert w.faults()["gpu_lost"] is True
    w.step(1000)  # the world keeps running; the board idles
    assert w.snapshot()["gpu_draw_w"] == 80.0
    w.gpu_lost(False)
    for call in calls[:-1]:
        call()
    assert g.power_limit_w() == 700.0


def test_memory_temperature_not_supported_is_none():
    p = quiet().override({"gpu.memory_temperature_supported": False})
    w = World(p, profile="idle")
    assert w.gpu.memory_temperature_c() is None
    assert isinstance(w.gpu.temperature_c(), int)


def test_thermal_slowdown_and_shutdown():
    w = world("step650")
    w.fan_stall(0)
    w.fan_stall(1)
    hottest = 0.0
    seen = 0
    for _ in range(900):  # 15 min, 1 s ticks
        w.step(1000)
        hottest = max(hottest, w.T[0])
        seen |= w.gpu.clocks_event_reasons()
    assert seen & vgpu.CLOCKS_EVENT_SW_THERMAL_SLOWDOWN
    assert w.snapshot()["gpu_draw_w"] < 650.0  # throttled
    assert 87.0 < hottest < 95.0  # slowdown holds it below shutdown
    assert not w.gpu.lost
    # A GPU that cannot shed heat enough shuts down and is lost.
    p = quiet().override({"gpu.slowdown_w_per_k": 0.0, "gpu.hw_slowdown_power_fraction": 1.0})
    w = World(p, profile="step650")
    for _ in range(1800):
        w.step(1000)
        if w.gpu.lost:
            break
    with pytest.raises(GpuLost, match="thermal shutdown at 95"):
        w.gpu.temperature_c()
    assert w.snapshot()["gpu_draw_w"] == 0.0
    w.gpu_lost(False)  # a reset brings it back
    assert w.gpu.temperature_c() > 60  # still hot, cooling fast with no power


def test_energy_counter_integrates_power():
    w = world(Profile.parse("hold 500W 10s"))
    e0 = w.gpu.total_energy_j()
    w.step(10_000)
    assert w.gpu.total_energy_j() - e0 == pytest.approx(5000.0, abs=0.01)
