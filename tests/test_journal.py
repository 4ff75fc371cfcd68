"""The journal of original limits, the GPU lock, and what the actuator does with them:
restore at start, a journal that lies, the current limit as the truth (external
changes), refusals backing off, `restore_journaled`. GPUs: the fake NVML (the recorded
H200) and the file GPU (tests/filegpu.py); never a real one."""

from __future__ import annotations

import json
import os
import stat

import pytest
from filegpu import UUID as FILE_UUID
from filegpu import FileGpu, FileGpuBackend

from modbridge.actuator import journal as jmod
from modbridge.actuator.gpulock import GpuBusy, GpuLock
from modbridge.actuator.journal import JournalError, LimitJournal
from modbridge.actuator.power import PowerLimiter, restore_journaled
from modbridge.bridge import Bridge
from modbridge.config import BridgeConfig
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend

UUID = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"  # the fake NVML's H200 (700 W default)
TEST_KEY = f"{UUID}.test-{os.getpid()}"  # machine-wide lock name: this run's own


@pytest.fixture
def nv():
    fake = FakeNvml()
    fake.nvmlInit()
    return fake


@pytest.fixture
def journal(tmp_path):
    return LimitJournal(tmp_path / "state")


def set_limit(nv, watts):
    """Someone else (an operator, a dead bridge) sets the limit."""
    nv.nvmlDeviceSetPowerManagementLimit(nv.devices[0].handle, int(watts * 1000))
    nv.writes.clear()


def written(nv):
    return [w["value_mw"] / 1000 for w in nv.writes if w["result"] == "ok"]


def limiter(nv, journal, events, mono=None, **kw):
    mono = mono if mono is not None else [0.0]
    return PowerLimiter(NvmlBackend(nvml=nv), UUID, log=events.append, journal=journal,
                        monotonic=lambda: mono[0], **kw)  # fmt: skip


# --------------------------------------------------------------------------- the file


def test_record_read_clear_atomic_and_private(journal):
    entry = journal.record(UUID, 700.0, 490.0)
    path = journal.path(UUID)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(journal.dir.stat().st_mode) == 0o700
    assert sorted(os.listdir(journal.dir)) == [f"{UUID}.json"]  # no temp file left
    got, problem = journal.read(UUID)
    assert problem is None and got == entry and got.pid == os.getpid()
    assert json.loads(path.read_text())["intended_w"] == 490.0
    assert journal.uuids() == [UUID]
    journal.clear(UUID)
    assert journal.read(UUID) == (None, None) and journal.uuids() == []
    journal.clear(UUID)  # idempotent


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"\x00\xff garbage \x13", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"version": 1, "uuid": "GPU-other", "original_w": 700}', "names another GPU"),
        (b'{"version": 1, "uuid": "%s", "original_w": "NaN"}' % UUID.encode(), "original_w"),
        (b'{"version": 1, "uuid": "%s", "original_w": -5}' % UUID.encode(), "original_w"),
        (b'{"version": 7, "uuid": "%s", "original_w": 700}' % UUID.encode(), "version"),
    ],
)
def test_unusable_entries_are_reported_and_set_aside(journal, raw, why):
    journal.ensure()
    journal.path(UUID).write_bytes(raw)
    entry, problem = journal.read(UUID)
    assert entry is None and why in problem
    assert not journal.path(UUID).exists()
    assert journal.path(UUID).with_name(f"{UUID}.json.bad").read_bytes() == raw
    assert journal.read(UUID) == (None, None)  # reported once


def test_uuid_that_could_name_another_file_is_refused(journal):
    with pytest.raises(JournalError, match="cannot name"):
        journal.record("../../etc/passwd", 700.0, 490.0)


def test_a_state_dir_that_cannot_be_used_says_what_to_do(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(JournalError, match="--state-dir"):
        LimitJournal(blocker / "state").ensure()


def test_default_state_dir_order(tmp_path):
    cfg = BridgeConfig(state_dir=str(tmp_path / "cfg"))
    env = {"MODBRIDGE_STATE_DIR": "/x", "STATE_DIRECTORY": "/y:/z"}
    assert str(jmod.default_state_dir(cfg, env)) == "/x"
    assert jmod.default_state_dir(cfg, {"STATE_DIRECTORY": "/y"}) == tmp_path / "cfg"
    assert str(jmod.default_state_dir(None, {"STATE_DIRECTORY": "/y:/z"})) == "/y"
    assert str(jmod.default_state_dir(None, {})) == "/var/lib/modbridge"


# --------------------------------------------------------------------------- the lock


def test_lock_is_exclusive_names_the_owner_and_goes_with_it(tmp_path):
    a = GpuLock(tmp_path, UUID, key=TEST_KEY).acquire()
    with pytest.raises(GpuBusy, match=f"pid {os.getpid()}") as e:
        GpuLock(tmp_path, UUID, key=TEST_KEY).acquire()
    assert e.value.pid == os.getpid() and e.value.uuid == UUID
    a.release()
    with GpuLock(tmp_path, UUID, key=TEST_KEY) as b:
        assert b.held
    assert not b.held


# --------------------------------------------------------------------------- the actuator


def test_lowering_journals_first_and_the_restore_clears_it(nv, journal):
    events = []
    lim = limiter(nv, journal, events)
    lim.start()
    lim.apply(490, "hot")
    entry, _ = journal.read(UUID)
    assert (entry.original_w, entry.intended_w) == (700.0, 490.0)
    lim.restore("cool")
    assert journal.read(UUID) == (None, None)
    assert written(nv) == [490.0, 700.0]


def test_start_below_the_journaled_original_restores_first(nv, journal):
    journal.record(UUID, 700.0, 490.0)
    set_limit(nv, 490)  # a bridge died holding 490 W
    events = []
    lim = limiter(nv, journal, events)
    lim.start()
    assert written(nv) == [700.0] and lim.original_w == 700.0 and not lim.holding
    assert journal.read(UUID) == (None, None)
    assert "journaled original 700 W" in events[0]["message"]
    assert [e["action"] for e in events] == ["start", "restore"]


def test_start_at_or_above_the_journaled_original_adopts_it_and_clears(nv, journal):
    journal.record(UUID, 600.0, 420.0)
    events = []
    lim = limiter(nv, journal, events)
    lim.start()  # at 700 W: someone put it back (or raised it) meanwhile
    assert nv.writes == [] and lim.original_w == 700.0
    assert journal.read(UUID) == (None, None)


def test_a_foreign_journal_cannot_raise_the_limit_above_the_default(nv, journal):
    journal.record(UUID, 2000.0, 490.0)  # 2000 W: another GPU's, or a forged file
    set_limit(nv, 300)
    events = []
    lim = limiter(nv, journal, events)
    lim.start()
    assert written(nv) == [700.0] and lim.original_w == 700.0
    (ignored,) = [e for e in events if e["action"] == "journal"]
    assert ignored["level"] == "alert" and "2000 W" in ignored["message"]
    assert ignored["ceiling_w"] == 700.0


def test_the_ceiling_is_the_lower_of_default_and_max(nv, journal):
    nv.set_answer("nvmlDeviceGetPowerManagementDefaultLimit", 650000)
    journal.record(UUID, 700.0, 490.0)
    set_limit(nv, 490)
    lim = limiter(nv, journal, [])
    lim.start()
    assert written(nv) == [650.0] and lim.original_w == 650.0


def test_garbage_journal_keeps_the_current_limit_and_says_so(nv, journal):
    journal.ensure()
    journal.path(UUID).write_bytes(os.urandom(64) + b"\x00")
    set_limit(nv, 490)
    events = []
    lim = limiter(nv, journal, events)
    lim.start()
    assert nv.writes == [] and lim.original_w == 490.0  # nothing to trust: no write
    # the garbage is the alert; the limit below the default it leaves is the operator's
    # baseline as far as the bridge can tell: said, as info (docs/bridge.md "At start")
    actions = [(e["action"], e["level"]) for e in events]
    assert actions == [("journal", "alert"), ("start", "info")]
    assert "journal entry ignored" in events[0]["message"]
    assert "below the default" in events[1]["message"]


def test_no_journal_no_lowering(nv, journal, monkeypatch):
    lim = limiter(nv, journal, events := [])
    lim.start()

    def denied(path, data, mode=0o600):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(jmod, "atomic_write", denied)
    r = lim.apply(490, "hot")
    assert (r.action, r.wrote) == ("failed", False) and "Permission denied" in r.error
    assert nv.writes == [] and events[-1]["level"] == "alert"


def test_dry_run_reads_the_journal_and_writes_nothing(nv, journal):
    journal.record(UUID, 700.0, 490.0)
    set_limit(nv, 490)
    lim = limiter(nv, journal, events := [], dry_run=True)
    lim.start()
    assert nv.writes == [] and lim.original_w == 700.0 and lim.holding
    assert journal.read(UUID)[0] is not None  # left for the real run
    assert lim.restore("clear").action == "dry_run"
    assert events[0]["action"] == "start"


# --------------------------------------------------------------------------- the truth


def test_external_change_while_not_holding_becomes_the_original(nv, journal):
    events = []
    lim = limiter(nv, journal, events)
    lim.start()
    set_limit(nv, 400)  # nvidia-smi -pl 400
    r = lim.apply(490, "fan stall")  # WARN: 0.7 x the old original
    assert r.action == "skip" and nv.writes == []  # never "lower" to above the current
    assert lim.original_w == 400.0 and lim.external_changes == 1
    ext = [e for e in events if e["action"] == "external"]
    assert ext and "700 W -> 400 W" in ext[0]["message"]
    lim.apply(280, "fan stall")  # 0.7 x the new original
    lim.restore("clear")
    assert written(nv) == [280.0, 400.0]  # back to the operator's value, not 700


def test_external_raise_while_holding_keeps_the_hold_and_restores_to_it(nv, journal):
    lim = limiter(nv, journal, events := [])
    lim.start()
    lim.apply(300, "critical")
    set_limit(nv, 600)  # the operator raises it under the bridge's feet
    lim.observe(NvmlBackend(nvml=nv).sample(UUID))
    assert lim.original_w == 600.0 and lim.holding
    assert journal.read(UUID)[0].original_w == 600.0
    lim.apply(300, "critical")  # the lower of the two is kept
    lim.restore("clear")
    assert written(nv) == [300.0, 600.0]  # (set_limit forgot the first 300 W)
    ext = [e for e in events if e["action"] == "external"]
    assert ext[0]["level"] == "alert" and "300 W is kept" in ext[0]["message"]


def test_external_lower_below_the_hold_ends_the_hold(nv, journal):
    lim = limiter(nv, journal, [])
    lim.start()
    lim.apply(490, "warn")
    set_limit(nv, 300)
    assert lim.restore("clear") is None  # the operator's lower value is the original now
    assert lim.original_w == 300.0 and not lim.holding
    assert journal.read(UUID) == (None, None) and nv.writes == []


# --------------------------------------------------------------------------- back-off


def test_refused_restores_back_off_with_one_alert_per_episode(nv, journal):
    mono = [0.0]
    lim = limiter(nv, journal, events := [], mono=mono)
    lim.start()
    lim.apply(490, "hot")
    nv.read_only = True  # permission lost mid-run
    tries = []
    for _ in range(17 * 10):  # 17 s of ticks at 10 Hz (the 86 alerts)
        r = lim.restore("clear")
        if r.action == "refused":
            tries.append(mono[0])
        mono[0] = round(mono[0] + 0.1, 6)
    assert tries == [0.0, 1.0, 3.0, 7.0, 15.0]  # 1 s doubling
    alerts = [e for e in events if e["level"] == "alert"]
    assert len(alerts) == 1 and alerts[0]["action"] == "refused"
    assert lim.refused_total == 5 and lim.backoff_s == 16.0
    for _ in range(3000):  # the delay stops doubling at 5 min
        lim.restore("clear")
        mono[0] += 1.0
    assert lim.backoff_s == 300.0 and len([e for e in events if e["level"] == "alert"]) == 1
    nv.read_only = False
    mono[0] += 300.0
    assert lim.restore("clear").action == "restore"
    assert events[-2]["action"] == "recovered" and lim.backoff_s == 0.0
    assert journal.read(UUID) == (None, None)


def test_close_restores_even_while_backing_off(nv, journal):
    lim = limiter(nv, journal, [])
    lim.start()
    lim.apply(490, "hot")
    nv.read_only = True
    assert lim.restore("clear").action == "refused"
    nv.read_only = False
    assert lim.close("exit").action == "restore"


# --------------------------------------------------------------------------- the bridge


def test_bridge_locks_journals_and_a_second_one_is_refused(tmp_path):
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=650.0)
    state = tmp_path / "state"
    a = Bridge(BridgeConfig(), FileGpuBackend(gpu.path), [], state_dir=state).start()
    with pytest.raises(GpuBusy, match=f"pid {os.getpid()}"):
        Bridge(BridgeConfig(), FileGpuBackend(gpu.path), [], state_dir=state).start()
    assert a.stop() is True
    b = Bridge(BridgeConfig(), FileGpuBackend(gpu.path), [], state_dir=state).start()
    b.stop()


def test_dry_run_bridge_takes_no_lock(tmp_path):
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=650.0)
    state = tmp_path / "state"
    a = Bridge(BridgeConfig(), FileGpuBackend(gpu.path), [], state_dir=state).start()
    b = Bridge(BridgeConfig(dry_run=True), FileGpuBackend(gpu.path), [], state_dir=state)
    b.start().stop()  # `modbridge status` beside the service
    a.stop()


def test_bridge_state_dir_unusable_fails_before_any_write(tmp_path):
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=650.0)
    (tmp_path / "file").write_text("")
    with pytest.raises(JournalError, match="state directory"):
        Bridge(BridgeConfig(), FileGpuBackend(gpu.path), [], state_dir=tmp_path / "file").start()
    assert gpu.read()["writes"] == 0


def test_a_journaled_gpu_that_is_missing_is_reported(tmp_path):
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=650.0)
    state = tmp_path / "state"
    LimitJournal(state).record("GPU-00000000-0000-4000-8000-000000000bad", 700.0, 490.0)
    lines = []
    from modbridge.exporter.eventlog import EventLog

    b = Bridge(BridgeConfig(), FileGpuBackend(gpu.path), [], state_dir=state,
               event_log=EventLog(lines)).start()  # fmt: skip
    b.stop()
    missing = [json.loads(x) for x in lines if '"action":"journal"' in x]
    assert missing and "not present" in missing[0]["message"]
    rows = restore_journaled(FileGpuBackend(gpu.path), state)
    assert [(r["action"], r["ok"]) for r in rows] == [("missing", False)]
    assert LimitJournal(state).uuids()  # kept for when it is back


# --------------------------------------------------------------------------- restore


def test_restore_journaled_puts_it_back_and_dry_run_does_not(tmp_path):
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=455.0)
    state = tmp_path / "state"
    LimitJournal(state).record(FILE_UUID, 650.0, 455.0)
    (row,) = restore_journaled(FileGpuBackend(gpu.path), state, dry_run=True)
    assert (row["action"], row["ok"], gpu.limit_w) == ("would_restore", True, 455.0)
    (row,) = restore_journaled(FileGpuBackend(gpu.path), state)
    assert (row["action"], row["ok"], row["before_w"], row["after_w"]) == (
        "restored", True, 455.0, 650.0)  # fmt: skip
    assert gpu.limit_w == 650.0 and LimitJournal(state).uuids() == []


def test_restore_journaled_refused_and_busy(tmp_path):
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=455.0)
    state = tmp_path / "state"
    LimitJournal(state).record(FILE_UUID, 650.0, 455.0)
    gpu.update(read_only=True)
    (row,) = restore_journaled(FileGpuBackend(gpu.path), state)
    assert (row["action"], row["ok"]) == ("refused", False) and "root" in row["message"]
    assert LimitJournal(state).uuids() == [FILE_UUID]  # kept: not restored
    gpu.update(read_only=False)
    with GpuLock(state, FILE_UUID, key=TEST_KEY):
        (row,) = restore_journaled(FileGpuBackend(gpu.path), state)
    assert row["action"] == "busy" and "pid" in row["message"]
    assert gpu.limit_w == 455.0


def test_every_bridge_tick_reads_the_limit_and_adopts_an_external_change(tmp_path):
    from modbridge.exporter.eventlog import EventLog

    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=700.0)
    lines = []
    b = Bridge(BridgeConfig(), FileGpuBackend(gpu.path), [], state_dir=tmp_path / "state",
               event_log=EventLog(lines)).start()  # fmt: skip
    lim = b.limiters[FILE_UUID]
    lim.apply(490, "warn")
    gpu.update(limit_w=400.0)  # nvidia-smi -pl 400, below the hold
    b.tick()
    assert (lim.original_w, lim.current_w, lim.holding) == (400.0, 400.0, False)
    ext = [json.loads(x) for x in lines if '"action":"external"' in x]
    assert len(ext) == 1 and ext[0]["previous_original_w"] == 700.0
    assert LimitJournal(tmp_path / "state").uuids() == []
    assert b.stop() is True and gpu.limit_w == 400.0  # the operator's value stays
