"""Locked graphics clocks through every backend: NVML (fake pynvml answering like the
recorded H200), nvidia-smi (argv and exit codes), and the virtual GPU, whose locked
clock really lowers the power it draws and the heat the world sees."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.gpu.base import ClocksRefused, ClockState, GpuNoPermission, supported_clocks
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend
from modbridge.gpu.smi import SmiBackend, parse_supported_clocks_xml
from modbridge.gpu.virtual import VirtualBackend
from modbridge.sim import World, load_params
from modbridge.sim import gpu as vgpu

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-h200"
H200_CLOCKS = tuple(range(345, 1981, 15))


def nvml_backend(**kw):
    nv = FakeNvml(**kw)
    b = NvmlBackend(nvml=nv)
    return nv, b, b.devices()[0].uuid


# ----------------------------------------------------------------------------- model


def test_snap_down_picks_the_highest_supported_clock_at_or_below():
    s = ClockState(max_mhz=1980, supported_mhz=H200_CLOCKS)
    assert s.snap_down(1584.0) == 1575
    assert s.snap_down(1980.0) == 1980 and s.snap_down(5000) == 1980
    assert s.snap_down(100) == 345 == s.min_mhz


@given(st.lists(st.integers(-5, 4000), max_size=40), st.integers(1, 3000), st.floats(0, 5000))
@settings(max_examples=300, deadline=None)
def test_snapping_never_leaves_the_supported_range(values, top, target):
    s = ClockState(max_mhz=top, supported_mhz=supported_clocks(values, top))
    snapped = s.snap_down(target)
    assert snapped in s.supported_mhz or snapped == top
    assert s.min_mhz <= snapped <= top
    assert snapped <= max(target, s.min_mhz)


# ----------------------------------------------------------------------------- NVML


def test_nvml_clock_state_is_the_recorded_h200s():
    nv, b, uuid = nvml_backend()
    s = b.clock_state(uuid)
    xml = parse_supported_clocks_xml((FIXTURES / "nvidia_smi_q.xml").read_text())
    assert s.max_mhz == 1980 and s.current_mhz == 1980
    assert s.supported_mhz == H200_CLOCKS == tuple(sorted(xml[uuid][3201]))
    assert s.lock_known is False  # NVML cannot read a lock back
    before = nv.calls["nvmlDeviceGetSupportedGraphicsClocks"]
    b.clock_state(uuid)  # the supported list is read once
    assert nv.calls["nvmlDeviceGetSupportedGraphicsClocks"] == before == 1


def test_nvml_lock_and_reset_are_the_two_documented_calls():
    nv, b, uuid = nvml_backend()
    s = b.set_locked_clocks_mhz(uuid, 345, 1500)
    assert nv.devices[0].locked == (345, 1500) and s.current_mhz == 1500
    s = b.reset_locked_clocks(uuid)
    assert nv.devices[0].locked is None and s.current_mhz == 1980
    assert [(w["call"], w["value_mhz"], w["result"]) for w in nv.writes] == [
        ("nvmlDeviceSetGpuLockedClocks", [345, 1500], "ok"),
        ("nvmlDeviceResetGpuLockedClocks", None, "ok"),
    ]


def test_nvml_refusals_map_to_not_supported_no_permission_and_invalid():
    nv, b, uuid = nvml_backend()
    nv.fail("nvmlDeviceSetGpuLockedClocks", "NVMLError_NotSupported", times=1)
    with pytest.raises(ClocksRefused, match="Not Supported") as e:
        b.set_locked_clocks_mhz(uuid, 345, 1500)
    assert e.value.not_supported and e.value.requested_mhz == 1500
    with pytest.raises(ClocksRefused, match="Invalid Argument") as e:
        b.set_locked_clocks_mhz(uuid, 1500, 345)
    assert not e.value.not_supported
    nv.read_only = True
    with pytest.raises(GpuNoPermission, match="Insufficient Permissions"):
        b.set_locked_clocks_mhz(uuid, 345, 1500)
    with pytest.raises(GpuNoPermission):
        b.reset_locked_clocks(uuid)
    assert nv.devices[0].locked is None


def test_nvml_without_a_max_clock_cannot_lock():
    nv, b, uuid = nvml_backend()
    nv.set_answer("nvmlDeviceGetMaxClockInfo", "NVMLError_NotSupported",
                  param=nv.NVML_CLOCK_GRAPHICS)  # fmt: skip
    with pytest.raises(ClocksRefused) as e:
        b.clock_state(uuid)
    assert e.value.not_supported


def test_power_limit_not_supported_is_flagged_for_the_fallback():
    from modbridge.gpu.base import PowerLimitRefused

    nv, b, uuid = nvml_backend()
    nv.fail("nvmlDeviceSetPowerManagementLimit", "NVMLError_NotSupported")
    with pytest.raises(PowerLimitRefused) as e:
        b.set_power_limit_w(uuid, 500)
    assert e.value.not_supported


# ----------------------------------------------------------------------------- nvidia-smi

UUID = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"
ROW = (
    f"0, {UUID}, NVIDIA H200, 00000000:00:06.0, 32, 31, 55, 94.38, "
    "700.00, 700.00, 700.00, 200.00, 700.00, 0x0000000000000001, 0, [N/A]\n"
)


class Runner:
    """subprocess.run for nvidia-smi: answers from the recording, remembers argv."""

    def __init__(self, lgc_rc=0, stderr=""):
        self.argvs = []
        self.lgc_rc, self.stderr = lgc_rc, stderr
        self.current = 1980

    def __call__(self, argv, **kw):
        args = argv[1:]
        self.argvs.append(args)
        out, rc, err = "", 0, ""
        if args[0].startswith("--query-gpu=uuid,clocks"):
            out = f"{UUID}, 1980, {self.current}\n"
        elif args[0].startswith("--query-gpu="):
            out = ROW
        elif args[:2] == ["-q", "-x"]:
            out = (FIXTURES / "nvidia_smi_q.xml").read_text()
        elif "-lgc" in args or "-rgc" in args:
            rc, err = self.lgc_rc, self.stderr
            if rc == 0 and "-lgc" in args:
                self.current = int(args[args.index("-lgc") + 1].split(",")[1])
            elif rc == 0:
                self.current = 1980
        return subprocess.CompletedProcess(argv, rc, out, err)


def test_smi_lgc_and_rgc_argv_and_state():
    r = Runner()
    b = SmiBackend(smi_path="/usr/bin/nvidia-smi", runner=r)
    s = b.clock_state(UUID)
    assert (s.max_mhz, s.current_mhz, s.lock_known) == (1980, 1980, False)
    assert s.supported_mhz == H200_CLOCKS
    assert b.set_locked_clocks_mhz(UUID, 345, 1500).current_mhz == 1500
    assert ["-i", UUID, "-lgc", "345,1500"] in r.argvs
    assert b.reset_locked_clocks(UUID).current_mhz == 1980
    assert ["-i", UUID, "-rgc"] in r.argvs
    assert sum(a[:2] == ["-q", "-x"] for a in r.argvs) == 1  # supported clocks: once


@pytest.mark.parametrize(
    "rc,stderr,error,not_supported",
    [
        (3, "Setting locked GPU clocks is not supported for GPU ...", ClocksRefused, True),
        (2, "Invalid combination of input arguments.", ClocksRefused, False),
        (4, "Insufficient Permissions", GpuNoPermission, None),
    ],
)
def test_smi_refusals(rc, stderr, error, not_supported):
    b = SmiBackend(smi_path="/usr/bin/nvidia-smi", runner=Runner(lgc_rc=rc, stderr=stderr))
    with pytest.raises(error) as e:
        b.set_locked_clocks_mhz(UUID, 345, 1500)
    if not_supported is not None:
        assert e.value.not_supported is not_supported


# ----------------------------------------------------------------------------- virtual


def world(profile="idle"):
    w = World(load_params("default").override({"adc.noise_lsb": 0.0}), seed=0, profile=profile)
    w.set_duties(32768, 32768)
    w.equilibrate()
    return w


def test_virtual_backend_reads_and_writes_the_lock():
    w = world()
    b = VirtualBackend([w.gpu])
    s = b.clock_state(w.gpu.uuid)
    assert (s.max_mhz, s.supported_mhz, s.locked, s.lock_known) == (1980, H200_CLOCKS, None, True)
    assert b.set_locked_clocks_mhz(w.gpu.uuid, 345, 1185).locked == (345, 1185)
    with pytest.raises(ClocksRefused, match="not a supported graphics clock"):
        b.set_locked_clocks_mhz(w.gpu.uuid, 345, 1186)
    with pytest.raises(ClocksRefused, match="min above max"):
        b.set_locked_clocks_mhz(w.gpu.uuid, 1500, 1185)
    assert w.gpu.locked_clocks_mhz() == (345, 1185)
    assert b.reset_locked_clocks(w.gpu.uuid).locked is None


def test_a_locked_max_clock_lowers_power_and_heat_in_the_sim():
    free, locked = world("step650"), world("step650")
    locked.gpu.set_locked_clocks_mhz(345, 1395)  # ~0.7 x 1980
    for w in (free, locked):
        w.step(60_000 + 300_000)  # idle minute, then 5 min of 650 W demand
    expected = vgpu.clock_power_w(80.0, 650.0, 1395)
    assert free.snapshot()["gpu_draw_w"] == 650.0
    assert locked.snapshot()["gpu_draw_w"] == pytest.approx(expected)
    assert 350.0 < expected < 400.0  # (1395/1980)^2 of the dynamic power
    assert locked.gpu.clocks_event_reasons() == vgpu.CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING
    assert locked.gpu.graphics_clock_mhz() <= 1395 < free.gpu.graphics_clock_mhz()
    assert free.T[0] - locked.T[0] > 5.0  # a clearly cooler die
    locked.gpu.reset_locked_clocks()
    locked.step(2000)
    assert locked.gpu.power_w() == 650.0 and locked.gpu.clocks_event_reasons() == 0


def test_a_lock_above_what_the_power_limit_allows_changes_nothing():
    w = world("step650")
    w.gpu.set_power_limit_w(300)
    w.gpu.set_locked_clocks_mhz(345, 1800)
    w.step(60_000 + 60_000)
    assert w.snapshot()["gpu_draw_w"] == 300.0
    assert w.gpu.clocks_event_reasons() == vgpu.CLOCKS_EVENT_SW_POWER_CAP
