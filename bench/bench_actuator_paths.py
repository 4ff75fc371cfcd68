"""Alerts per actuator episode and the time an untrusted module's GPU goes unprotected
(issue 23 items 4 and 5).

``alerts_per_episode_max`` (goal 1): every actuator path is driven into one long
failure episode through the real :class:`~modbridge.bridge.Bridge` (its policy, its
30 s refused-write gate, its actuators, journal and event log) on a fake NVML
(``modbridge.gpu.fake_nvml``) with a fake clock, its module a ``FakeLink`` of
tests/test_bridge_config.py whose fans stall. Each episode lasts ``EPISODE_TICKS``
ticks of ``TICK_S`` (10 minutes: the actuators' back-off, 1 s doubling, reaches its
5 min ceiling) and every ``level: alert`` line of the event log during it is counted.
Paths: the power-limit write refused / failing (no fallback), the power limit's
journal refused (the clocks stand in), every journal refused (EMFILE: the clocks
cannot stand in either), the clocks fallback's write raising while the power limit
is refused, the clocks alone failing, and the restore after an all-clear refused.
``alerts_per_episode_min`` is there to show no episode went unannounced (goal 1 too).

``unsafe_gpu_unprotected_s`` (goal 0): the real bridge loop on virtual GPUs and
virtual modules (the firmware in MicroPython on ptys, as tests/test_untrusted_module.py
builds them), each GPU mapped to its module by id in ``[[module]]`` tables. Cases:

- ``duplicate``: a running module reboots announcing its neighbour's id. Its
  neighbour's GPU is now cooled by a duplicate id (allowance 0), and its own GPU has
  lost its module (``lost_by_duplicate``, allowance 0).
- ``lost``: a running module reboots as another module (an id no table names): its
  GPU's module is gone (allowance 0).
- ``absent``: the module a table names never appears (another one is on the port):
  allowance ``module_grace_s`` from the pair's first evaluation, which is the loop's
  first tick, at most ``tick_s`` after start; so ``module_grace_s + tick_s``.

The clock starts, for a module that becomes untrusted, when the bridge's link first
delivers a telemetry frame of the module under its new id (the bridge's own
``on_telemetry`` callback, in the I/O thread: the earliest moment the bridge can know
the id is a duplicate or foreign; the reboot before it is a silent module, not an
untrusted one), and for an absent module when ``Bridge.start()`` returns. It stops
when the GPU's power limit is written at the minimum (the backend's write, timed).
The key is the largest time beyond the case's allowance; ``untrusted_<case>_detect_s``
are the raw times, ``untrusted_<case>_alert_s`` the time to the ``untrusted_module``
alert. GPUs: fakes and virtual ones (never a real GPU).
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

TICK_S = 1.0  # the fake clock's step between bridge ticks
EPISODE_TICKS = 600  # 10 minutes of ticks: the back-off reaches its 5 min ceiling
GRACE_S = 3.0  # module_grace_s for the loop cases
LOOP_TICK_S = 0.1
REPEATS = 3  # runs of each loop case (the worst is kept)


def _tests_on_path() -> None:
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


class _TimedLines(list):
    """An event log sink (a list of lines) that also keeps when each line came."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def append(self, line) -> None:
        self.times.append(time.monotonic())
        super().append(line)

    def events(self, start: int = 0) -> list[tuple[float, dict]]:
        return [(t, json.loads(s)) for t, s in zip(self.times[start:], self[start:], strict=True)]


# -- alerts per episode -------------------------------------------------------------------
def _episode(actuator="power", fallback=True, fail=None, restore=False) -> tuple[int, int]:
    """Alerts and failed tries (refused or failed writes, the journal's included,
    counted by the actuators) in one episode of ``EPISODE_TICKS``
    ticks: ``fail(nv)`` makes the path fail (and returns an undo, or None) just before
    the fans stall; with ``restore`` the fans are stalled (and the limit cut) first and
    the failure begins with their all-clear, so that what fails is the step down and
    the restore."""
    from test_bridge_config import make_bridge

    from modbridge.config import BridgeConfig
    from modbridge.exporter.eventlog import EventLog
    from modbridge.gpu.fake_nvml import FakeNvml
    from modbridge.gpu.nvml import NvmlBackend
    from protocol import catalog as C

    stall = C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL
    nv, now, lines = FakeNvml(), [1000.0], _TimedLines()
    with tempfile.TemporaryDirectory(prefix="bench-actuator-") as d:
        cfg = BridgeConfig(actuator=actuator, fallback=fallback, state_dir=d)
        b = make_bridge(cfg, NvmlBackend(nvml=nv), ["/dev/ttyUSB0"], clock=lambda: now[0],
                        event_log=EventLog(lines))  # fmt: skip
        link = b.links["/dev/ttyUSB0"]
        link.hello("aa01", stalled=stall if restore else 0)

        def tick():
            link.status.last_frame_at = now[0]  # the module keeps sending
            b.tick()
            now[0] += TICK_S

        undo = None
        try:
            for _ in range(3):
                tick()
            if restore:
                assert b.limiters[b.pairs["/dev/ttyUSB0"].gpu_uuid].holding, "nothing to restore"
            undo = fail(nv)
            link.status.telemetry["faults"] = 0 if restore else stall
            lim = next(iter(b.limiters.values()))

            def failed():
                return sum(n for a, n in lim.actions_total.items() if a in ("refused", "failed"))

            start, failed0 = len(lines), failed()
            for _ in range(EPISODE_TICKS):
                tick()
            alerts = [e for _, e in lines.events(start) if e.get("level") == "alert"]
            tries = failed() - failed0
        finally:
            if undo is not None:
                undo()
            b.stop()
    return len(alerts), tries


def _refuse_power(nv):
    nv.fail("nvmlDeviceSetPowerManagementLimit", "NVMLError_NoPermission")


def _raise_power(nv):
    nv.fail("nvmlDeviceSetPowerManagementLimit", "NVMLError_Unknown")


def _raise_clocks(nv):
    nv.fail("nvmlDeviceSetGpuLockedClocks", "NVMLError_Unknown")


def _refuse_power_raise_clocks(nv):
    _refuse_power(nv)
    _raise_clocks(nv)


def _refuse_power_journal(nv):
    """The power limit's journal refused (the clocks' one works: they stand in)."""
    from modbridge.actuator.journal import JournalError, LimitJournal

    real = LimitJournal.record

    def record(self, *a, **k):
        raise JournalError("cannot journal the original power limit: Too many open files")

    LimitJournal.record = record
    return lambda: setattr(LimitJournal, "record", real)


def _refuse_every_journal(nv):
    """Every journal file refused, power limit and clocks alike, as with the file
    descriptors exhausted in item 1 (both journals write through ``atomic_write``)."""
    from modbridge.actuator import journal

    real = journal.atomic_write

    def atomic_write(path, data, *a, **k):
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    journal.atomic_write = atomic_write
    return lambda: setattr(journal, "atomic_write", real)


def _refuse_writes(nv):
    nv.read_only = True  # every write: NVMLError_NoPermission


PATHS = {  # name: (actuator, fallback, fail, restore)
    "power_refused": ("power", False, _refuse_power, False),
    "power_raises": ("power", False, _raise_power, False),
    "power_journal_refused": ("power", True, _refuse_power_journal, False),
    "every_journal_refused": ("power", True, _refuse_every_journal, False),
    "clocks_fallback_raises": ("power", True, _refuse_power_raise_clocks, False),
    "clocks_raises": ("clocks", False, _raise_clocks, False),
    "restore_refused": ("power", True, _refuse_writes, True),
}


def alerts_per_episode() -> dict:
    out, counts = {}, []
    for name, (actuator, fallback, fail, restore) in PATHS.items():
        alerts, tries = _episode(actuator, fallback, fail, restore)
        out[f"alerts_per_episode_{name}"] = alerts
        out[f"alerts_episode_failed_tries_{name}"] = tries  # retried, backed off
        counts.append(alerts)
    out["alerts_per_episode_max"] = max(counts)
    out["alerts_per_episode_min"] = min(counts)
    out["alerts_episode_ticks"] = EPISODE_TICKS
    out["alerts_episode_s"] = EPISODE_TICKS * TICK_S
    return out


# -- unsafe_gpu_unprotected_s -------------------------------------------------------------
def _timed_backend(gpus):
    """The virtual GPUs' backend, each power-limit write timed: ``writes`` holds
    (monotonic, uuid, watts)."""
    from modbridge.gpu.virtual import VirtualBackend

    class Timed(VirtualBackend):
        def __init__(self, gpus):
            super().__init__(gpus)
            self.writes: list[tuple[float, str, float]] = []

        def set_power_limit_w(self, uuid, watts):
            got = super().set_power_limit_w(uuid, watts)
            self.writes.append((time.monotonic(), uuid, watts))
            return got

    return Timed(gpus)


class _Loop:
    """A fleet of ``n`` virtual modules, each GPU mapped by id to ``ids[i]`` (default:
    its own module's), and the real bridge looping in a thread. ``first_frame(port,
    uid)`` is when the bridge first heard a telemetry frame from ``uid`` on ``port``."""

    def __init__(self, n, ids=None):
        from e2e_helpers import FAST_POLICY, SPEED

        from modbridge.bridge import Bridge
        from modbridge.config import BridgeConfig, ModuleMapping
        from modbridge.exporter.eventlog import EventLog
        from modbridge.policy.engine import PolicyConfig
        from modbridge.sim.fleet import SimFleet

        self.fleet = SimFleet(n, world="default", profile="idle", speed=SPEED)
        ids = ids or [vm.uid.hex() for vm in self.fleet.modules]
        self.lines = _TimedLines()
        self.backend = _timed_backend(self.fleet.gpus)
        self._heard: dict[tuple[str, str], float] = {}
        maps = [ModuleMapping(i, g.uuid) for i, g in zip(ids, self.fleet.gpus, strict=True)]
        policy = PolicyConfig(**{**FAST_POLICY, "module_grace_s": GRACE_S})
        cfg = BridgeConfig(heartbeat_period_s=0.1, tick_s=LOOP_TICK_S, modules=maps,
                           policy=policy)  # fmt: skip
        self.fleet.start()
        self.bridge = Bridge(cfg, self.backend, self.fleet.ports, event_log=EventLog(self.lines))
        heard = self.bridge._on_telemetry  # the link calls what start() hands it

        def on_telemetry(status, msg):
            self._heard.setdefault((status.port, status.module_id), time.monotonic())
            heard(status, msg)

        self.bridge._on_telemetry = on_telemetry
        try:
            self.bridge.start()
        except BaseException:
            self.fleet.stop()
            raise
        self.started_at = time.monotonic()
        self.thread = threading.Thread(target=self.bridge.run, name="bridge-loop", daemon=True)
        self.thread.start()

    def first_frame(self, port, uid):
        return self._heard.get((port, uid))

    def cut_at(self, uuid, watts):
        return next((t for t, u, w in self.backend.writes if u == uuid and w <= watts), None)

    def alert_at(self, uuid):
        return next((t for t, e in self.lines.events() if e["kind"] == "untrusted_module"
                     and e["level"] == "alert" and e.get("gpu_uuid") == uuid), None)  # fmt: skip

    def close(self):
        self.bridge.stop("bench over")
        self.thread.join(5)
        self.fleet.stop()


def _become(vm, uid: bytes, keys, key_from=None) -> None:
    """``vm`` reboots as the module ``uid`` (with ``key_from``'s key file: a clone;
    else its own key, the host's copy saved under the new id: another paired module)."""
    with vm.lock:
        vm.uid = uid
        if key_from is not None:
            shutil.copy2(key_from.key_path, vm.key_path)
        else:
            keys.save(uid.hex(), vm.key, overwrite=True)
    vm.mcu_reset("power")


def _wait(pred, timeout):
    from e2e_helpers import wait_for

    return wait_for(pred, timeout, "the bench's condition", step=0.01)


def _untrusted_case(kind) -> dict:
    """Raw times (s) of one loop case: {gpu label: (detect_s, alert_s, allowance_s)}."""
    from e2e_helpers import MIN_W, ORIGINAL_W

    from modbridge.sim.runner import unique_id

    if kind == "absent":
        run = _Loop(1, ids=[unique_id(99, 99).hex()])  # no module has this id
        try:
            gpu = run.fleet.gpus[0].uuid
            t_cut = _wait(lambda: run.cut_at(gpu, MIN_W), GRACE_S + 15)
            t_alert = _wait(lambda: run.alert_at(gpu), 5)
            t0 = run.started_at
            return {"absent": (t_cut - t0, t_alert - t0, GRACE_S + LOOP_TICK_S)}
        finally:
            run.close()
    run = _Loop(2)
    try:
        a, b = run.fleet.modules
        gpu_a, gpu_b = (g.uuid for g in run.fleet.gpus)
        _wait(lambda: {p.gpu_uuid for p in run.bridge.snapshot().pairs} >= {gpu_a, gpu_b}, 20)
        assert run.backend.writes == [] and a.world.gpu.power_limit_w() == ORIGINAL_W
        port_b = run.fleet.ports[1]
        if kind == "duplicate":  # b reboots as a clone of a
            _become(b, a.uid, run.fleet.keys, key_from=a)
        else:  # b reboots as a module no table names: gpu_b's module is gone
            _become(b, unique_id(77, 77), run.fleet.keys)
        uid = b.uid.hex()
        t0 = _wait(lambda: run.first_frame(port_b, uid), 20)
        out = {}
        for label, gpu in ((("duplicate", gpu_a), ("lost_by_duplicate", gpu_b))
                           if kind == "duplicate" else (("lost", gpu_b),)):  # fmt: skip
            t_cut = _wait(lambda g=gpu: run.cut_at(g, MIN_W), 10)
            t_alert = _wait(lambda g=gpu: run.alert_at(g), 5)
            out[label] = (t_cut - t0, t_alert - t0, 0.0)
        return out
    finally:
        run.close()


def unsafe_gpu_unprotected() -> dict:
    """Every case ``REPEATS`` times; the worst of each is kept."""
    cases: dict[str, tuple[float, float, float]] = {}
    for _ in range(REPEATS):
        for kind in ("duplicate", "lost", "absent"):
            for label, got in _untrusted_case(kind).items():
                cases[label] = max(cases.get(label, got), got)
    out = {}
    for label, (detect_s, alert_s, allowance_s) in cases.items():
        out[f"untrusted_{label}_detect_s"] = round(detect_s, 4)
        out[f"untrusted_{label}_alert_s"] = round(alert_s, 4)
        out[f"untrusted_{label}_allowance_s"] = allowance_s
    out["untrusted_runs_per_case"] = REPEATS
    beyond = [max(0.0, d - allow) for d, _, allow in cases.values()]
    out["unsafe_gpu_unprotected_s"] = round(max(beyond), 4)
    return out


def run() -> dict:
    _tests_on_path()
    t0 = time.monotonic()
    out = alerts_per_episode()
    out["alerts_per_episode_check_s"] = round(time.monotonic() - t0, 3)
    t0 = time.monotonic()
    out.update(unsafe_gpu_unprotected())
    out["unsafe_gpu_check_s"] = round(time.monotonic() - t0, 3)
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
