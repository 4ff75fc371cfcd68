"""The virtual GPUs of ``modbridge sim`` for a bridge in another process (issue 26, item
5: ``run --port PTY`` against a virtual GPU on a machine without one), and the rule that
keeps simulated and real apart (docs/bridge.md, "Simulated modules and real GPUs").

- the rule (modbridge.gpu.simguard), against an oracle written from the docs;
- the bridge applies it: a ``sim`` board's module is never mapped to a real GPU, a real
  board's never to a virtual one, whatever the config says; one warning each;
- the socket (modbridge.sim.gpuserver) and its client (modbridge.gpu.remote) in one
  process over a real world: limits change the world, are clamped or refused like
  NVML's, read back; a lost GPU and a stopped simulator are GpuLost;
- end to end: ``modbridge sim`` in a subprocess, ``modbridge run --port <symlink>
  --backend sim-remote`` in another: a fan stall lowers the virtual GPU's limit and its
  end gives it back (read through the sim's socket); ``status --json`` too.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from e2e_helpers import wait_for
from hypothesis import given
from hypothesis import strategies as st
from test_bridge_config import UUID_A, FakeBackend, make_bridge

from modbridge.config import BridgeConfig, ModuleMapping
from modbridge.gpu import remote, simguard
from modbridge.gpu.base import ClocksRefused, GpuLost, PowerLimitRefused
from modbridge.gpu.virtual import VirtualBackend

UID = "b9bddcc21aff921d00d1d986"


# -- the rule ---------------------------------------------------------------------------
def oracle(board, gpu_simulated) -> bool:
    """docs/bridge.md: a module whose hello says board ``sim`` (or ``sim_<variant>``) is
    a virtual one; a virtual module is paired only with a virtual GPU, a real module
    only with a real GPU; a module that has not said its board yet is not judged."""
    if board is None:
        return True
    virtual_module = board == "sim" or board.startswith("sim_")
    return virtual_module == gpu_simulated


BOARDS = st.one_of(st.none(), st.sampled_from(["sim", "sim_ina226", "pico", "blackpill_f411",
                                               "simulator", "xsim", "Sim", ""]), st.text())


@given(BOARDS, st.booleans())
def test_the_rule_matches_the_docs(board, gpu_simulated):
    why = simguard.refusal(board, gpu_simulated)
    assert (why is None) == oracle(board, gpu_simulated)
    if why is not None:  # one line that says what to do instead
        assert "\n" not in why and "--backend" in why


def test_what_each_refusal_says():
    to_real = simguard.refusal("sim", gpu_simulated=False)
    assert "sim-remote" in to_real and "real GPU" in to_real
    to_virtual = simguard.refusal("pico", gpu_simulated=True)
    assert "virtual GPU" in to_virtual and "nvml" in to_virtual
    assert "\x1b" not in simguard.refusal("p\x1b[2J", True)  # the board is a wire string


def test_each_backend_says_what_it_is(tmp_path):
    from modbridge.gpu.fake_nvml import FakeNvml
    from modbridge.gpu.nvml import NvmlBackend
    from modbridge.gpu.smi import SmiBackend

    assert not NvmlBackend.simulated and not SmiBackend.simulated
    assert VirtualBackend.simulated and remote.SimRemoteBackend.simulated
    # NVML's stand-in over a recorded H200 (the tests' GPU) is no real GPU either
    assert NvmlBackend(nvml=FakeNvml()).simulated


# -- the bridge applies it --------------------------------------------------------------
class SimulatedFake(FakeBackend):
    simulated = True


def _paired(backend, board, config=None, caplog=None):
    b = make_bridge(config or BridgeConfig(), backend, ["/dev/ttyX"])
    try:
        link = b.links["/dev/ttyX"]
        link.hello(UID)
        link.status.board = board
        b.tick()
        b.tick()
        return b.snapshot().pairs[0].gpu_uuid
    finally:
        b.stop()


@pytest.mark.parametrize("board,simulated,expect", [
    ("sim", False, None), ("sim", True, UUID_A),
    ("pico", True, None), ("pico", False, UUID_A),
])  # fmt: skip
def test_the_bridge_pairs_simulated_with_simulated_only(board, simulated, expect, caplog):
    backend = (SimulatedFake if simulated else FakeBackend)(UUID_A)
    with caplog.at_level(logging.WARNING, logger="modbridge.bridge"):
        assert _paired(backend, board) == expect
    said = [r.getMessage() for r in caplog.records if "never paired" in r.getMessage()]
    assert len(said) == (0 if expect else 1), said  # once, however many ticks


def test_a_mapping_does_not_pair_a_simulated_module_with_a_real_gpu():
    cfg = BridgeConfig(modules=[ModuleMapping(UID, UUID_A, port="/dev/ttyX")])
    assert _paired(FakeBackend(UUID_A), "sim", cfg) is None
    assert _paired(FakeBackend(UUID_A), "blackpill_f411", cfg) == UUID_A


# -- the socket and its client ------------------------------------------------------------
def _fleet(tmp_path, n=1):
    """What gpuserver reads of a SimFleet: worlds' GPUs, modules, pace, keys."""
    from modbridge.sim import World, load_params

    worlds = [World(load_params("default"), seed=i, profile="idle") for i in range(n)]
    for i, w in enumerate(worlds):
        w.gpu.uuid = w.gpu.uuid[:-4] + f"{i:04x}"
    mods = [SimpleNamespace(uid=bytes.fromhex(UID[:-2] + f"{i:02x}"),
                            port_symlink=tmp_path / f"module-{i}.tty") for i in range(n)]
    return SimpleNamespace(gpus=[w.gpu for w in worlds], modules=mods, speed=5.0,
                           keys=SimpleNamespace(dir=tmp_path / "keys"), state_dir=tmp_path,
                           worlds=worlds)  # fmt: skip


@pytest.fixture
def served(tmp_path):
    from modbridge.sim import gpuserver

    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    fleet = _fleet(d, 2)
    server = gpuserver.serve(fleet)
    try:
        yield fleet, server
    finally:
        server.stop()


def test_the_socket_is_private_and_found_beside_the_ports(served, tmp_path):
    fleet, server = served
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    port = fleet.modules[1].port_symlink
    port.symlink_to("/dev/null")
    assert remote.find_socket([str(port)], environ={}) == server.path
    assert remote.find_socket(["/dev/null"], environ={}) is None
    assert remote.find_socket([], environ={remote.ENV: "/x/gpu.sock"}) == Path("/x/gpu.sock")


def test_the_client_reads_what_the_world_says(served):
    fleet, server = served
    b = remote.SimRemoteBackend(server.path)
    here = VirtualBackend(fleet.gpus)
    assert b.devices() == here.devices() and b.speed == 5.0
    assert b.keys_dir == str(fleet.keys.dir)
    for got, want in zip(b.sample_all(), here.sample_all(), strict=True):
        got.timestamp = want.timestamp
        assert got == want
    assert b.owner_key(fleet.gpus[0].uuid) != fleet.gpus[0].uuid  # never a real GPU's name


def test_a_limit_written_remotely_changes_the_world(served):
    fleet, server = served
    b = remote.SimRemoteBackend(server.path)
    gpu, world = fleet.gpus[0], fleet.worlds[0]
    assert b.set_power_limit_w(gpu.uuid, 400.0) == 400.0
    assert gpu.power_limit_w() == 400.0 == b.sample(gpu.uuid).enforced_limit_w
    assert fleet.gpus[1].power_limit_w() == 700.0  # module 1's GPU untouched
    from modbridge.sim.profiles import Profile

    full = Profile([(0, 10**9, "linear", (700.0, 700.0))], name="full")  # wants 700 W
    world.profile = gpu.profile = full
    world.step(5000)
    assert b.sample(gpu.uuid).power_w == pytest.approx(400.0, abs=5)
    with pytest.raises(PowerLimitRefused) as e:  # outside 200..700 W: NVML's InvalidArgument
        b.set_power_limit_w(gpu.uuid, 50.0)
    assert e.value.requested_w == 50.0 and gpu.power_limit_w() == 400.0
    state = b.set_locked_clocks_mhz(gpu.uuid, 345, 1200)
    assert state.locked == (345, 1200) and gpu.locked_clocks_mhz() == (345, 1200)
    with pytest.raises(ClocksRefused):
        b.set_locked_clocks_mhz(gpu.uuid, 1200, 345)
    assert b.reset_locked_clocks(gpu.uuid).locked is None


def test_a_lost_gpu_and_a_stopped_simulator_are_lost(served):
    fleet, server = served
    b = remote.SimRemoteBackend(server.path)
    uuid = fleet.gpus[0].uuid
    fleet.worlds[0].gpu_lost(True)
    with pytest.raises(GpuLost):
        b.sample(uuid)
    with pytest.raises(GpuLost):
        b.set_power_limit_w(uuid, 500.0)
    assert [s.state for s in b.sample_all()] == ["lost", "ok"]
    server.stop()
    assert [s.state for s in b.sample_all()] == ["lost", "lost"]
    with pytest.raises(GpuLost, match="no simulator answers"):
        b.sample(fleet.gpus[1].uuid)


def test_the_pairs_it_publishes_are_those_of_the_ports_given(served):
    fleet, server = served
    b = remote.SimRemoteBackend(server.path)
    p0, p1 = (str(m.port_symlink) for m in fleet.modules)
    [one] = b.mappings([p1])
    assert (one["port"], one["gpu"]) == (p1, fleet.gpus[1].uuid)
    assert one["module_id"] == fleet.modules[1].uid.hex()
    every = b.mappings(["/dev/ttyUSB9"])  # no port of its own: by the unique id alone
    assert [m["port"] for m in every] == [None, None] and len({m["gpu"] for m in every}) == 2


def test_without_a_simulator_the_backend_says_what_to_do(tmp_path):
    from modbridge.gpu.base import GpuError

    with pytest.raises(GpuError, match="start `modbridge sim` first"):
        remote.SimRemoteBackend(None)
    with pytest.raises(GpuError, match="start `modbridge sim` first"):
        remote.SimRemoteBackend(tmp_path / "gpu.sock")


def test_cli_names_the_backend_of_a_sims_port(served, tmp_path):
    """A bridge told to use real GPUs on a sim's port: exit 3, the hint to sim-remote
    (no NVIDIA driver here; on a GPU host, the rule above refuses the pair)."""
    from modbridge.cli.main import main
    from modbridge.gpu import select

    fleet, server = served
    port = fleet.modules[0].port_symlink
    port.symlink_to("/dev/null")

    def no_driver(kind, **kw):
        if kind == "sim-remote":
            return remote.SimRemoteBackend(kw["sim_socket"])
        raise select.GpuError(select.NO_DRIVER)

    old = select.open_backend
    select.open_backend = no_driver
    try:
        r = CliRunner().invoke(main, ["status", "--port", str(port), "--json",
                                      "--state-dir", str(tmp_path / "b")])  # fmt: skip
    finally:
        select.open_backend = old
    assert r.exit_code == 3, r.output
    assert "add --backend sim-remote" in r.output


# -- end to end --------------------------------------------------------------------------
def _cli(*args):
    return [sys.executable, "-m", "modbridge", *args]


def _env(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(remote.ENV, None)
    env.pop("MODBRIDGE_KEYS_DIR", None)  # the sim publishes where its keys are
    return env


@pytest.fixture
def sim_process(tmp_path):
    """``modbridge sim`` at 2x with fan 1 stalled from 16 s to 36 s of its time (8-18 s
    of wall time: the bridge is up by then); yields (its state dir, the process)."""
    d = tmp_path / "sim"
    out = open(tmp_path / "sim.out", "w")  # noqa: SIM115 - closed below
    err = open(tmp_path / "sim.err", "w")  # noqa: SIM115
    p = subprocess.Popen(_cli("sim", "--state-dir", str(d), "--speed", "2",
                              "--fault", "fan_stall:1@16s-36s", "--duration", "240"),
                         stdout=out, stderr=err, env=_env(tmp_path), cwd=tmp_path)  # fmt: skip
    try:
        wait_for(lambda: "gpus " in (tmp_path / "sim.out").read_text() or p.poll() is not None,
                 60, "the sim's module line")  # fmt: skip
        assert p.poll() is None, (tmp_path / "sim.err").read_text()
        line = (tmp_path / "sim.out").read_text().splitlines()[0]
        assert f"{d}/module-0.tty" in line and f"gpus {d}/gpu.sock" in line
        yield d, p
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        out.close()
        err.close()
    assert p.returncode == 0, (tmp_path / "sim.err").read_text()
    assert not (d / "gpu.sock").exists()  # the sim took its socket with it


def test_status_json_through_the_sims_gpu(sim_process, tmp_path):
    d, _ = sim_process
    r = subprocess.run(_cli("status", "--port", str(d / "module-0.tty"),
                            "--backend", "sim-remote", "--json"),
                       capture_output=True, text=True, env=_env(tmp_path), timeout=120,
                       cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["backend"] == "sim-remote"
    [m] = rep["modules"]
    assert m["link_up"] and m["board"] == "sim"
    assert m["gpu"]["uuid"] == remote.SimRemoteBackend(d / "gpu.sock").devices()[0].uuid
    assert m["gpu"]["limit_w"] == 700.0


def test_run_lowers_the_virtual_gpu_on_a_fan_stall_and_gives_it_back(sim_process, tmp_path):
    d, sim = sim_process
    gpu = remote.SimRemoteBackend(d / "gpu.sock")
    uuid = gpu.devices()[0].uuid
    original = gpu.sample(uuid).enforced_limit_w
    (tmp_path / "c.toml").write_text("[policy]\nmin_hold_s = 0.5\n")
    elog = tmp_path / "events.jsonl"
    run = subprocess.Popen(_cli("run", "--port", str(d / "module-0.tty"), "--backend",
                                "sim-remote", "--config", str(tmp_path / "c.toml"),
                                "--no-metrics", "--no-control", "--event-log", str(elog),
                                "--status-every", "0", "--duration", "200"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_env(tmp_path), cwd=tmp_path)  # fmt: skip
    try:
        wait_for(lambda: gpu.sample(uuid).enforced_limit_w < original or run.poll() is not None,
                 120, "the bridge to lower the stalled GPU's limit")  # fmt: skip
        assert run.poll() is None, run.communicate()
        wait_for(lambda: gpu.sample(uuid).enforced_limit_w == original or run.poll() is not None,
                 150, "the limit given back once the fan turns again")  # fmt: skip
        assert run.poll() is None, run.communicate()
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert "stopped by signal SIGTERM; limits restored" in err
    assert gpu.sample(uuid).enforced_limit_w == original
    events = [json.loads(line) for line in elog.read_text().splitlines()]
    writes = [e for e in events if e.get("kind") == "power_limit" and e.get("gpu_uuid") == uuid]
    assert writes, [e.get("kind") for e in events]
    assert sim.poll() is None  # the simulator outlives the bridge


def test_run_once_pairs_the_sims_module_with_its_gpu(sim_process, tmp_path):
    """No config, no MODBRIDGE_KEYS_DIR: the sim's published pairs and keys; exit 0."""
    d, _ = sim_process
    r = subprocess.run(_cli("run", "--port", str(d / "module-0.tty"), "--backend",
                            "sim-remote", "--no-metrics", "--no-control", "--once"),
                       capture_output=True, text=True, env=_env(tmp_path), timeout=120,
                       cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "never paired" not in r.stderr
    assert "GPU-" in r.stdout
