"""One owner per GPU, machine-wide (issue 23, item 3): a second bridge with another
``--state-dir`` on the same GPU refuses to start, naming the first's pid; the lock goes
with its process however it dies; simulated GPUs of unrelated worlds never share a lock.
GPUs: the file GPU (tests/filegpu.py), the fake NVML and virtual GPUs; never a real one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid as uuidlib

import pytest
from filegpu import UUID, FileGpu, FileGpuBackend
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kill_restore import CHILD, TESTS, TRUE_ORIGINAL_W, finish, ready

from modbridge.actuator.gpulock import GpuBusy, GpuLock
from modbridge.bridge import Bridge
from modbridge.config import BridgeConfig
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend
from modbridge.gpu.virtual import VirtualBackend


def fresh_uuid() -> str:
    """A GPU UUID no other test (or test run on this machine) uses."""
    return f"GPU-{uuidlib.uuid4()}"


def spawn_bridge(tmp_path, state_dir, seed):
    """tests/test_kill_restore.py's child bridge on tmp_path/gpu.json, with ``state_dir``."""
    script = tmp_path / "child.py"
    if not script.exists():
        script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(script), str(TESTS), str(tmp_path / "gpu.json"), str(state_dir),
         str(seed), "power"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_a_second_bridge_with_another_state_dir_refuses_naming_the_first(tmp_path):
    """The reproduction: on 4092283 the second bridge ran beside the first (its own
    state dir, its own flock) on the same GPU, with no warning."""
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=TRUE_ORIGINAL_W)
    first = spawn_bridge(tmp_path, tmp_path / "state-a", seed=3)
    try:
        ready(first)
        second = spawn_bridge(tmp_path, tmp_path / "state-b", seed=4)
        try:
            out, err = second.communicate(timeout=60)
        finally:
            finish(second)
        assert second.returncode != 0 and "ready" not in out, (out, err)
        assert f"owned by another modbridge (pid {first.pid}" in err, err
        assert "machine-wide" in err and UUID in err and "kill" in err
        assert first.poll() is None  # the first one goes on
        assert not list((tmp_path / "state-b").glob("limits/*.json"))  # b journaled nothing
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
        assert first.returncode == 0
    finally:
        finish(first)
    assert gpu.limit_w == TRUE_ORIGINAL_W


def test_the_machine_wide_lock_goes_with_its_process_however_it_dies(tmp_path):
    key = fresh_uuid()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from modbridge.actuator.gpulock import GpuLock\n"
         f"lock = GpuLock(sys.argv[1], {key!r}).acquire(); print('held', flush=True)\n"
         "sys.stdin.read()", str(tmp_path / "a")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(GpuBusy) as e:
            GpuLock(tmp_path / "b", key).acquire()
        assert e.value.pid == holder.pid and f"pid {holder.pid}, uid {os.geteuid()}" in str(e.value)
        assert not (tmp_path / "b" / "locks" / f"{key}.lock").exists()  # refused before it
        holder.kill()
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(30)
        holder.stdin.close()
        holder.stdout.close()
    with GpuLock(tmp_path / "b", key) as lock:  # the kernel released it with the process
        assert lock.held


def test_two_bridges_of_one_process_on_one_fake_nvml_exclude_each_other(tmp_path):
    nv = FakeNvml()
    backend = NvmlBackend(nvml=nv)
    a = Bridge(BridgeConfig(), backend, [], state_dir=tmp_path / "a").start()
    try:
        b = Bridge(BridgeConfig(), backend, [], state_dir=tmp_path / "b")
        with pytest.raises(GpuBusy, match=f"pid {os.getpid()}"):
            b.start()
        b.stop("start failed")
    finally:
        a.stop()
    again = Bridge(BridgeConfig(), backend, [], state_dir=tmp_path / "b").start()
    again.stop()


def test_simulated_gpus_of_unrelated_worlds_never_share_a_lock(tmp_path):
    from modbridge.sim.gpu import VirtualGPU

    assert NvmlBackend(nvml=FakeNvml()).owner_key(UUID) != NvmlBackend(
        nvml=FakeNvml()).owner_key(UUID)  # fmt: skip
    g1, g2 = VirtualGPU.__new__(VirtualGPU), VirtualGPU.__new__(VirtualGPU)
    for g in (g1, g2):  # two worlds' GPUs with the world file's fixed UUID
        g.uuid, g.name, g.pci_bus_id = UUID, "virtual", "00000000:00:06.0"
    k1, k2 = VirtualBackend([g1]).owner_key(UUID), VirtualBackend([g2]).owner_key(UUID)
    assert k1 != k2 and VirtualBackend([g1]).owner_key(UUID) == k1
    assert FileGpuBackend(tmp_path / "x.json").owner_key(UUID) != FileGpuBackend(
        tmp_path / "y.json").owner_key(UUID)  # fmt: skip
    with GpuLock(tmp_path / "a", UUID, key=k1), GpuLock(tmp_path / "b", UUID, key=k2):
        pass  # both at once: different GPUs
    # a real GPU's key is its UUID: the same on every bridge of the machine
    import pynvml

    class Real(NvmlBackend):
        def __init__(self):
            self._nv = pynvml

    assert Real().owner_key(UUID) == UUID


OPS = st.lists(
    st.tuples(st.sampled_from(["acquire", "release"]), st.integers(0, 3), st.integers(0, 2),
              st.integers(0, 1)),  # (op, lock object, state dir, GPU)
    max_size=25,
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_property_at_most_one_owner_per_gpu_whatever_the_state_dir(tmp_path_factory, ops):
    """Oracle from docs/bridge.md: a GPU has at most one owner on the machine, whatever
    the state dirs; an acquire succeeds exactly when no other holder has that GPU."""
    root = tmp_path_factory.mktemp("own")
    gpus = [fresh_uuid(), fresh_uuid()]
    locks: dict[tuple[int, int, int], GpuLock] = {}
    holder: dict[int, tuple] = {}  # GPU -> the lock object (obj, dir) holding it
    try:
        for op, obj, d, g in ops:
            ident = (obj, d, g)
            lock = locks.setdefault(ident, GpuLock(root / f"s{d}", gpus[g]))
            if op == "acquire":
                expect_ok = holder.get(g) in (None, ident)
                try:
                    lock.acquire()
                    ok = True
                except GpuBusy as e:
                    ok = False
                    assert e.pid == os.getpid()
                assert ok == expect_ok, (ops, ident, holder)
                if ok:
                    holder[g] = ident
            else:
                lock.release()
                if holder.get(g) == ident:
                    del holder[g]
            assert {g for g in range(2) if any(lk.held and k[2] == g for k, lk in locks.items())} \
                == set(holder)  # fmt: skip
    finally:
        for lock in locks.values():
            lock.release()
