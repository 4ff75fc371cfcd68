"""The power-limit actuator, over the NVML backend and the fake pynvml (never a real GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from modbridge.actuator.power import PowerLimiter, install_signal_handlers
from modbridge.gpu.base import GpuError
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend

UUID = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"


@pytest.fixture
def nv():
    return FakeNvml()


@pytest.fixture
def events():
    return []


@pytest.fixture
def mono():
    return [100.0]  # the limiter's monotonic clock (back-off), advanced by hand


@pytest.fixture
def limiter(nv, events, mono):
    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID, log=events.append, clock=lambda: 1234.5,
                       monotonic=lambda: mono[0])  # fmt: skip
    lim.start()
    return lim


def written(nv):
    return [w["value_mw"] for w in nv.writes if w["result"] == "ok"]


def test_start_saves_the_original_and_the_constraints(limiter):
    c = limiter.counters()
    assert (c["original_w"], c["min_w"], c["max_w"], c["default_w"], c["current_w"]) == (
        700.0,
        200.0,
        700.0,
        700.0,
        700.0,
    )
    assert c["last_write_ts"] is None and c["refused_total"] == 0


def test_lower_writes_and_reads_back(nv, limiter, events):
    r = limiter.apply(450, "module over-temperature", {"gpu_c": 84.0})
    assert (r.requested_w, r.clamped_w, r.enforced_w, r.wrote, r.error, r.action) == (
        450,
        450.0,
        450.0,
        True,
        None,
        "lower",
    )
    assert written(nv) == [450000]
    assert limiter.current_w == 450.0 and limiter.last_write_ts == 1234.5
    assert limiter.actions_total == {"lower": 1}
    (e,) = events
    assert e["event"] == "power_limit" and e["action"] == "lower" and e["level"] == "info"
    assert e["gpu_uuid"] == UUID
    assert e["reason"] == "module over-temperature" and e["values"] == {"gpu_c": 84.0}


def test_clamped_to_the_constraints(nv, limiter):
    r = limiter.apply(50, "fan failure")
    assert (r.clamped_w, r.enforced_w) == (200.0, 200.0)
    r = limiter.apply(900, "recovered")
    assert (r.clamped_w, r.action) == (700.0, "restore")
    assert written(nv) == [200000, 700000]


def test_within_one_watt_is_skipped(nv, limiter):
    assert limiter.apply(700.5, "noop").action == "skip"
    limiter.apply(450, "hot")
    r = limiter.apply(450.9, "still hot")
    assert (r.wrote, r.action, r.enforced_w) == (False, "skip", 450.0)
    assert written(nv) == [450000]


def test_dry_run_writes_nothing(nv, events):
    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID, dry_run=True, log=events.append)
    lim.start()
    r = lim.apply(450, "hot")
    assert (r.wrote, r.action, r.clamped_w, r.enforced_w) == (False, "dry_run", 450.0, 700.0)
    assert lim.apply(450, "still hot").action == "skip"  # the decision is logged once
    assert lim.restore("cool").action == "dry_run"
    assert lim.restore("cool again") is None
    assert nv.writes == []
    assert lim.actions_total == {"dry_run": 2}
    assert [e["dry_run"] for e in events] == [True, True]
    assert "would lower the power limit to 450 W" in events[0]["message"]


def test_refusal_is_counted_and_not_raised(nv, limiter, events):
    nv.read_only = True
    r = limiter.apply(450, "hot")
    assert (r.wrote, r.action, r.enforced_w) == (False, "refused", 700.0)
    assert "root" in r.error
    assert limiter.refused_total == 1 and limiter.actions_total == {"refused": 1}
    assert events[-1]["level"] == "alert" and events[-1]["action"] == "refused"


def test_invalid_argument_refusal(nv, limiter, mono):
    nv.fail("nvmlDeviceSetPowerManagementLimit", "NVMLError_InvalidArgument", times=1)
    r = limiter.apply(450, "hot")
    assert r.action == "refused" and "Invalid Argument" in r.error
    assert limiter.apply(450, "hot").action == "backoff"  # not at once: backing off
    mono[0] += 1.0
    assert limiter.apply(450, "hot").action == "lower"  # after 1 s it tries again


def test_lost_gpu_is_a_failed_action_not_an_exception(nv, limiter, events):
    nv.fail("nvmlDeviceSetPowerManagementLimit", "NVMLError_GpuIsLost")
    r = limiter.apply(450, "hot")
    assert (r.action, r.wrote) == ("failed", False) and "Xid 79" in r.error
    assert events[-1]["state"] == "lost" and limiter.refused_total == 0


def test_apply_starts_lazily_and_survives_an_unreadable_gpu(nv, events):
    nv.fail("nvmlDeviceGetEnforcedPowerLimit", "NVMLError_GpuIsLost")
    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID, log=events.append)
    r = lim.apply(450, "hot")
    assert r.action == "failed" and nv.writes == []
    nv.clear_failures()
    assert lim.apply(450, "hot").action == "lower"
    assert lim.original_w == 700.0


def test_start_without_a_limit_raises(nv):
    nv.set_answer("nvmlDeviceGetEnforcedPowerLimit", "NVMLError_NotSupported")
    with pytest.raises(GpuError, match="does not report its power limit"):
        PowerLimiter(NvmlBackend(nvml=nv), UUID).start()


def test_start_below_default_is_the_baseline_not_an_alert(nv, events):
    """Issue 23 item 5: an operator's lower limit is the baseline; on 4092283 every
    start raised an alert for it."""
    nv.nvmlInit()
    nv.nvmlDeviceSetPowerManagementLimit(nv.devices[0].handle, 400000)
    nv.writes.clear()
    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID, log=events.append)
    lim.start()
    assert lim.original_w == 400.0
    assert events[0]["level"] == "info" and "no journal entry" in events[0]["message"]
    assert not [e for e in events if e["level"] == "alert"]


def test_restore_is_idempotent(nv, limiter):
    assert limiter.restore("nothing to do") is None
    limiter.apply(450, "hot")
    r = limiter.restore("cool")
    assert (r.action, r.enforced_w, r.wrote) == ("restore", 700.0, True)
    assert limiter.restore("cool") is None
    assert limiter.close() is None
    assert written(nv) == [450000, 700000]
    assert limiter.actions_total == {"lower": 1, "restore": 1}


def test_close_restores_by_default(nv, limiter):
    limiter.apply(450, "hot")
    assert limiter.close("exit").action == "restore"
    assert limiter.close("exit") is None
    assert written(nv) == [450000, 700000]


def test_close_keep(nv, events):
    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID, on_exit="keep", log=events.append)
    lim.start()
    lim.apply(450, "hot")
    assert lim.close() is None
    assert written(nv) == [450000]
    assert events[-1]["action"] == "keep"


def test_on_exit_is_checked(nv):
    with pytest.raises(ValueError, match="on_exit"):
        PowerLimiter(NvmlBackend(nvml=nv), UUID, on_exit="maybe")


def test_a_broken_event_sink_does_not_stop_the_write(nv):
    def sink(event):
        raise RuntimeError("disk full")

    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID, log=sink)
    assert lim.apply(450, "hot").action == "lower"


# --------------------------------------------------------------------------- signals

SCRIPT = r"""
import sys, time
from modbridge.actuator.power import PowerLimiter, install_signal_handlers
from modbridge.gpu.base import GpuBackend, GpuInfo, GpuSample

class FileBackend(GpuBackend):
    name = "file"
    def __init__(self, path):
        self.path = path
        self.limit = 700.0
    def devices(self):
        return [GpuInfo(0, "GPU-f", "file", "0")]
    def sample(self, uuid):
        return GpuSample(uuid, enforced_limit_w=self.limit, min_limit_w=200.0,
                         max_limit_w=700.0, default_limit_w=700.0)
    def set_power_limit_w(self, uuid, watts):
        self.limit = watts
        with open(self.path, "a") as f:
            f.write("%g\n" % watts)
        return watts

lim = PowerLimiter(FileBackend(sys.argv[1]), "GPU-f", on_exit=sys.argv[2])
lim.start()
install_signal_handlers([lim])
lim.apply(300, "hot")
print("ready", flush=True)
if sys.argv[3] == "exit":
    sys.exit(0)
while True:
    time.sleep(0.05)
"""


def run_script(tmp_path, on_exit, how):
    out = tmp_path / "writes.txt"
    script = tmp_path / "limiter.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), on_exit, "exit" if how == "exit" else "wait"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        if how != "exit":
            proc.send_signal(how)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, out.read_text().split()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_restores_then_exits_128_plus_n(tmp_path, sig):
    rc, writes = run_script(tmp_path, "restore", sig)
    assert rc == 128 + sig
    assert writes == ["300", "700"]


def test_normal_exit_restores_via_atexit(tmp_path):
    rc, writes = run_script(tmp_path, "restore", "exit")
    assert rc == 0 and writes == ["300", "700"]


def test_signal_with_keep_keeps(tmp_path):
    rc, writes = run_script(tmp_path, "keep", signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM and writes == ["300"]


def test_uninstall_puts_the_old_handlers_back(nv):
    before = signal.getsignal(signal.SIGTERM)
    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID)
    uninstall = install_signal_handlers([lim])
    assert signal.getsignal(signal.SIGTERM) is not before
    uninstall()
    assert signal.getsignal(signal.SIGTERM) is before


def test_events_go_to_an_event_log(nv, tmp_path):
    import json

    from modbridge.exporter.eventlog import EventLog

    lines = []
    lim = PowerLimiter(NvmlBackend(nvml=nv), UUID, log=EventLog(lines))
    lim.apply(450, "hot")
    (line,) = lines
    event = json.loads(line)
    assert event["kind"] == "power_limit" and event["gpu_uuid"] == UUID
    assert event["action"] == "lower" and event["enforced_w"] == 450.0
