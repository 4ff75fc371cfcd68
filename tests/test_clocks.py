"""The locked-clocks actuator (modbridge.actuator.clocks) and the fallback between power
limits and clocks (modbridge.actuator.Combined), against the virtual GPU (which reads
its lock back) and the fake NVML (which, like NVML, cannot)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st

from modbridge.actuator import Combined, make_actuator, restore_journaled
from modbridge.actuator.clocks import ClockFractions, ClockLocker
from modbridge.actuator.journal import ClockJournal, LimitJournal
from modbridge.actuator.power import PowerLimiter
from modbridge.gpu.base import ClocksRefused, GpuNoPermission, PowerLimitRefused
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend
from modbridge.gpu.virtual import VirtualBackend
from modbridge.sim import World, load_params

WARN, CRITICAL, NORMAL = 1, 2, 0
WARN_MHZ, CRITICAL_MHZ = 1575, 990  # 0.8 / 0.5 x 1980 snapped to the 15 MHz grid


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def virtual():
    w = World(load_params("default").override({"adc.noise_lsb": 0.0}), seed=0, profile="idle")
    return w.gpu, VirtualBackend([w.gpu])


def locker(backend, uuid, tmp_path=None, **kw):
    journal = ClockJournal(tmp_path / "state") if tmp_path is not None else None
    events = []
    lim = ClockLocker(backend, uuid, journal=journal, log=events.append, **kw)
    return lim, events


def nvml_locker(tmp_path, **kw):
    nv = FakeNvml()
    b = NvmlBackend(nvml=nv)
    uuid = b.devices()[0].uuid
    lim, events = locker(b, uuid, tmp_path, **kw)
    return nv, b, uuid, lim, events


def acts(events, action=None):
    return [e for e in events if action is None or e["action"] == action]


# ----------------------------------------------------------------------------- mapping


def test_levels_map_to_documented_fractions_of_the_max_clock(tmp_path):
    gpu, b = virtual()
    lim, _ = locker(b, gpu.uuid, tmp_path)
    lim.start()
    assert lim.target_mhz(NORMAL) is None
    assert lim.target_mhz(WARN) == WARN_MHZ
    assert lim.target_mhz(CRITICAL) == CRITICAL_MHZ
    assert lim.target_mhz(NORMAL, target_w=550.0) == WARN_MHZ  # the PSU guard: WARN's clock
    assert lim.wants(WARN, None) and not lim.wants(NORMAL, None)
    with pytest.raises(ValueError):
        ClockFractions(warn_fraction=0.5, critical_fraction=0.6)


def test_lock_journaled_before_the_write_and_restored(tmp_path):
    gpu, b = virtual()
    lim, events = locker(b, gpu.uuid, tmp_path)
    lim.start()
    journal = ClockJournal(tmp_path / "state")
    seen = []
    real = b.set_locked_clocks_mhz

    def spy(uuid, lo, hi):
        entry, problem = journal.read(uuid, quarantine=False)
        seen.append((entry.original, entry.intended_max_mhz, problem))
        return real(uuid, lo, hi)

    b.set_locked_clocks_mhz = spy
    res = lim.apply(None, "fan_stall", level=WARN)
    assert res.action == "lower" and gpu.locked_clocks_mhz() == (345, WARN_MHZ)
    assert seen == [(None, WARN_MHZ, None)]  # on disk before the driver saw it
    assert lim.holding
    assert lim.apply(None, "fan_stall", level=WARN).action == "skip"
    assert lim.apply(None, "both_fans_stalled", level=CRITICAL).action == "lower"
    assert gpu.locked_clocks_mhz() == (345, CRITICAL_MHZ)
    assert lim.restore("clear").action == "restore"
    assert gpu.locked_clocks_mhz() is None and not lim.holding
    assert journal.uuids() == []  # cleared once the original is back
    assert lim.restore("again") is None  # idempotent
    assert [e["action"] for e in events] == ["lower", "lower", "restore"]
    assert all(e["event"] == "clocks" for e in events)
    c = lim.counters()
    assert c["actions_total"] == {"lower": 2, "restore": 1} and c["max_mhz"] == 1980
    assert (c["locked"], c["original"], c["holding"], c["refused_total"]) == (None, None, False, 0)


def test_no_journal_no_write(tmp_path):
    gpu, b = virtual()
    blocker = tmp_path / "state"
    blocker.write_text("a file, not a directory")
    lim = ClockLocker(b, gpu.uuid, journal=ClockJournal(blocker))
    lim.start()
    res = lim.apply(None, "fan_stall", level=WARN)
    assert res.action == "failed" and gpu.locked_clocks_mhz() is None and gpu.lock_writes == 0


def test_dry_run_writes_nothing_not_even_the_journal(tmp_path):
    gpu, b = virtual()
    lim, events = locker(b, gpu.uuid, tmp_path, dry_run=True)
    lim.start()
    assert lim.apply(None, "fan_stall", level=WARN).action == "dry_run"
    assert lim.apply(None, "fan_stall", level=WARN).action == "skip"
    assert lim.restore("clear").action == "dry_run"
    assert gpu.lock_writes == 0 and not (tmp_path / "state").exists()
    assert [e["action"] for e in events] == ["dry_run", "dry_run"]
    assert "would set clocks lower: 345..1575 MHz" in events[0]["message"]


def test_an_operators_lock_is_the_original_and_never_raised(tmp_path):
    gpu, b = virtual()
    gpu.set_locked_clocks_mhz(345, 1200)  # nvidia-smi -lgc 345,1200 before the bridge
    lim, events = locker(b, gpu.uuid, tmp_path)
    lim.start()
    assert lim.original == (345, 1200) and not lim.holding
    assert "kept as the original" in acts(events, "start")[0]["message"]
    assert lim.apply(None, "fan_stall", level=WARN).action == "skip"  # 1575 > 1200: nothing
    assert gpu.locked_clocks_mhz() == (345, 1200)
    lim.apply(None, "stall", level=CRITICAL)
    assert gpu.locked_clocks_mhz() == (345, CRITICAL_MHZ)
    lim.close("exit")
    assert gpu.locked_clocks_mhz() == (345, 1200)  # the operator's lock, not "unlocked"
    gpu.set_locked_clocks_mhz(1500, 1800)  # an operator's floor: not kept while throttling
    lim, _ = locker(b, gpu.uuid, tmp_path)
    lim.start()
    lim.apply(None, "stall", level=CRITICAL)
    assert gpu.locked_clocks_mhz() == (345, CRITICAL_MHZ)
    lim.close()
    assert gpu.locked_clocks_mhz() == (1500, 1800)


def test_external_change_is_seen_and_the_hold_written_again(tmp_path):
    gpu, b = virtual()
    lim, events = locker(b, gpu.uuid, tmp_path)
    lim.start()
    lim.apply(None, "stall", level=WARN)
    gpu.reset_locked_clocks()  # an operator: nvidia-smi -rgc
    lim.observe(None)
    ext = acts(events, "external")
    assert len(ext) == 1 and ext[0]["level"] == "alert" and lim.holding
    entry, _ = ClockJournal(tmp_path / "state").read(gpu.uuid)
    assert entry.original is None and entry.intended_max_mhz == WARN_MHZ
    assert lim.apply(None, "stall", level=WARN).action == "lower"  # the hold again
    assert gpu.locked_clocks_mhz() == (345, WARN_MHZ)
    gpu.set_locked_clocks_mhz(345, 900)  # the operator goes lower: theirs now
    lim.observe(None)
    assert not lim.holding and lim.original == (345, 900)
    assert ClockJournal(tmp_path / "state").uuids() == []
    lim.close()
    assert gpu.locked_clocks_mhz() == (345, 900)


# ----------------------------------------------------------------------------- NVML


def test_nvml_lock_restore_and_an_external_reset_seen_by_the_clock(tmp_path):
    nv, b, uuid, lim, events = nvml_locker(tmp_path)
    lim.start()
    assert lim.original is None  # NVML cannot read a lock: "unlocked"
    lim.apply(None, "stall", level=WARN)
    assert nv.devices[0].locked == (345, WARN_MHZ)
    nv.devices[0].locked = None  # reset behind our back: the clock reads 1980 again
    lim.observe(None)
    assert len(acts(events, "external")) == 1 and lim.holding
    lim.apply(None, "stall", level=WARN)
    assert nv.devices[0].locked == (345, WARN_MHZ)
    lim.close()
    assert nv.devices[0].locked is None
    calls = [w["call"] for w in nv.writes]
    assert calls == ["nvmlDeviceSetGpuLockedClocks"] * 2 + ["nvmlDeviceResetGpuLockedClocks"]


def test_refused_writes_back_off_with_one_alert_per_episode(tmp_path):
    clock = Clock()
    nv, b, uuid, lim, events = nvml_locker(tmp_path, monotonic=clock)
    lim.start()
    nv.read_only = True
    tries = []
    for _ in range(200):  # 200 s of decisions, one a second
        tries.append(lim.apply(None, "stall", level=WARN).action)
        clock.t += 1.0
    assert tries.count("refused") == 8  # 1, 2, 4 ... 128 s apart
    assert len(acts(events, "refused")) == 1  # one alert
    nv.read_only = False
    clock.t += 300
    assert lim.apply(None, "stall", level=WARN).action == "lower"
    assert len(acts(events, "recovered")) == 1 and lim.backoff_s == 0.0
    assert lim.refused_total == 8


def test_not_supported_is_a_refusal_flagged_not_supported(tmp_path):
    nv, b, uuid, lim, events = nvml_locker(tmp_path)
    nv.fail("nvmlDeviceSetGpuLockedClocks", "NVMLError_NotSupported")
    lim.start()
    assert lim.apply(None, "stall", level=WARN).action == "refused"
    assert acts(events, "refused")[0]["not_supported"] is True
    assert not lim.holding and lim.close() is None  # nothing of ours in force
    # the entry written before the refused write is gone again: nothing to undo
    assert ClockJournal(tmp_path / "state").uuids() == [] and nv.devices[0].locked is None


# ----------------------------------------------------------------------------- crash safety


def test_start_after_a_crash_puts_the_journaled_original_back(tmp_path):
    gpu, b = virtual()
    gpu.set_locked_clocks_mhz(345, 1800)  # the operator's
    first, _ = locker(b, gpu.uuid, tmp_path)
    first.start()
    first.apply(None, "stall", level=CRITICAL)
    assert gpu.locked_clocks_mhz() == (345, CRITICAL_MHZ)
    del first  # SIGKILL: no close
    second, events = locker(b, gpu.uuid, tmp_path)
    second.start()
    assert gpu.locked_clocks_mhz() == (345, 1800) and second.original == (345, 1800)
    assert not second.holding and ClockJournal(tmp_path / "state").uuids() == []
    assert acts(events, "start") and acts(events, "restore")


def test_with_nvml_a_journaled_gpu_is_always_put_back_at_start(tmp_path):
    nv, _, uuid, lim, _ = nvml_locker(tmp_path)
    ClockJournal(tmp_path / "state").record(uuid, None, CRITICAL_MHZ)
    nv.devices[0].locked = (345, CRITICAL_MHZ)  # what the dead run left
    lim.start()
    assert nv.devices[0].locked is None and not lim.holding


def _entry(uuid_ok, kind, original, intended, drop):
    d = {"version": 1, "kind": kind, "uuid": None if not uuid_ok else "<uuid>",
         "original": original, "intended_max_mhz": intended, "time": 1.0, "pid": 7}  # fmt: skip
    for key in drop:
        d.pop(key, None)
    return json.dumps(d).encode()


LOCKS = st.one_of(st.none(), st.lists(st.integers(-5, 5000), min_size=2, max_size=2),
                  st.lists(st.integers(-5, 5000), max_size=3), st.text(max_size=4))  # fmt: skip
JUNK = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
        st.sampled_from(["version", "kind", "uuid", "original", "intended_max_mhz", "pid"]),
        st.one_of(st.none(), st.integers(-5, 5000), st.text(max_size=8), st.booleans(),
                  st.lists(st.integers(-5, 5000), max_size=3), st.floats()),
        max_size=6)),
    # well-formed but for the values: most of the mass, so the checks are exercised
    st.builds(_entry, st.booleans(), st.sampled_from(["clocks", "clocks", "power", None]),
              LOCKS, st.one_of(st.none(), st.integers(-5, 5000)),
              st.lists(st.sampled_from(["kind", "original", "uuid", "version"]), max_size=1)),
    st.builds(_entry, st.just(True), st.just("clocks"),
              st.lists(st.integers(300, 2100), min_size=2, max_size=2).map(sorted),
              st.none(), st.just([])),
)  # fmt: skip


@given(raw=JUNK, left=st.one_of(st.none(), st.sampled_from(range(345, 1981, 15))),
       uuid_ok=st.booleans())  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_a_corrupt_or_foreign_journal_never_leaves_clocks_low_nor_above_defaults(
    tmp_path_factory, raw, left, uuid_ok
):
    """Whatever bytes the journal holds and whatever lock a dead run left: after start
    the clocks are unlocked or locked at the journal's original (checked), never lower;
    nothing is above the default (unlocked), and the GPU's max never moves."""
    tmp = tmp_path_factory.mktemp("j")
    gpu, b = virtual()
    raw = raw.replace(b'"<uuid>"', json.dumps(gpu.uuid).encode())
    if uuid_ok and raw.startswith(b"{"):
        try:
            d = json.loads(raw)
            d["uuid"] = gpu.uuid
            raw = json.dumps(d).encode()
        except (ValueError, TypeError):
            pass
    journal = ClockJournal(tmp / "state").ensure()
    journal.path(gpu.uuid).write_bytes(raw)
    if left is not None:
        gpu.set_locked_clocks_mhz(345, left)
    entry, problem = ClockJournal(tmp / "state").read(gpu.uuid, quarantine=False)
    lim = ClockLocker(b, gpu.uuid, journal=journal)
    lim.start()
    after = gpu.locked_clocks_mhz()
    assert not lim.holding
    if entry is None or entry.original is None or entry.original[1] > 1965:
        assert after is None  # unusable or "unlocked": the default
    else:
        assert after is not None and after[1] >= entry.original[1]  # never lower
        assert after[1] < 1980 and after[0] <= after[1]
        assert after[0] >= min(entry.original[0], after[1])
    assert gpu.max_graphics_clock_mhz() == 1980
    note(f"entry={entry} problem={problem} after={after}")
    event("valid lock entry" if entry is not None and entry.original else
          "unlocked entry" if entry is not None else "unusable")  # fmt: skip


# ----------------------------------------------------------------------------- fallback


class NoPowerLimit(VirtualBackend):
    """A consumer card: the power limit cannot be set (NVML NotSupported)."""

    def set_power_limit_w(self, uuid, watts):
        raise PowerLimitRefused("Not Supported (test)", requested_w=watts, not_supported=True)


class NoClocks(VirtualBackend):
    def set_locked_clocks_mhz(self, uuid, lo, hi):
        raise GpuNoPermission("clocks: Insufficient Permissions (test)")


def build(kind, backend_cls, tmp_path, gpu=None, **kw):
    if gpu is None:
        gpu, _ = virtual()
    b = backend_cls([gpu])
    events = []
    clock = Clock()
    lim = make_actuator(kind, b, gpu.uuid, log=events.append, monotonic=clock,
                        journal=LimitJournal(tmp_path / "state"), **kw)  # fmt: skip
    lim.start()
    return gpu, lim, events, clock


def test_power_refused_falls_back_to_clocks_with_one_alert(tmp_path):
    gpu, lim, events, clock = build("power", NoPowerLimit, tmp_path)
    assert isinstance(lim, Combined) and isinstance(lim.primary, PowerLimiter)
    for _ in range(20):
        res = lim.apply(490.0, "fan_stall", level=WARN)
        clock.t += 1.0
    assert res.action == "skip" and gpu.locked_clocks_mhz() == (345, WARN_MHZ)
    assert gpu.power_limit_w() == 700.0
    fallbacks = [e for e in events if e["action"] == "fallback"]
    assert len(fallbacks) == 1 and fallbacks[0]["stands_in"] is True
    assert lim.holding and lim.fallen
    lim.close()
    assert gpu.locked_clocks_mhz() is None and not lim.holding


def test_clocks_refused_falls_back_to_power_and_ends_when_clocks_work(tmp_path):
    gpu, lim, events, clock = build("clocks", NoClocks, tmp_path)
    res = lim.apply(490.0, "fan_stall", level=WARN)
    assert res.action == "lower" and gpu.power_limit_w() == 490.0
    assert gpu.locked_clocks_mhz() is None
    lim.primary.backend.set_locked_clocks_mhz = VirtualBackend.set_locked_clocks_mhz.__get__(
        lim.primary.backend)  # permission back  # fmt: skip
    clock.t += 31.0  # the primary is tried again after 30 s
    res = lim.apply(490.0, "fan_stall", level=WARN)
    assert res.action == "lower" and gpu.locked_clocks_mhz() == (345, WARN_MHZ)
    assert gpu.power_limit_w() == 700.0  # the stand-in released
    assert [e["action"] for e in events if e["event"] == "actuator"] == [
        "fallback", "fallback_end"]  # fmt: skip
    assert lim.restore("clear").action == "restore" and gpu.locked_clocks_mhz() is None


def test_combined_counts_are_always_both_members_counts(tmp_path):
    """Combined.actions_total (summed again only when a member's count moved) is the
    members' sum after every step of a fallback episode, its end and the restores."""
    gpu, lim, _, clock = build("clocks", NoClocks, tmp_path)

    def check():
        assert lim.actions_total == lim.primary.actions_total + lim.secondary.actions_total

    check()
    for _ in range(3):
        lim.apply(490.0, "fan_stall", level=WARN)
        check()
        clock.t += 1.0
    lim.primary.backend.set_locked_clocks_mhz = VirtualBackend.set_locked_clocks_mhz.__get__(
        lim.primary.backend)  # fmt: skip
    clock.t += 31.0
    lim.apply(490.0, "fan_stall", level=WARN)
    check()
    lim.restore("clear")
    check()
    assert lim.actions_total["lower"] >= 2 and lim.actions_total["restore"] >= 1


def test_both_drives_both_and_restores_both(tmp_path):
    gpu, lim, _, _ = build("both", VirtualBackend, tmp_path)
    lim.apply(490.0, "fan_stall", level=WARN)
    assert gpu.power_limit_w() == 490.0 and gpu.locked_clocks_mhz() == (345, WARN_MHZ)
    lim.close()
    assert gpu.power_limit_w() == 700.0 and gpu.locked_clocks_mhz() is None


def test_without_fallback_the_chosen_actuator_alone(tmp_path):
    gpu, lim, events, _ = build("clocks", NoClocks, tmp_path, fallback=False)
    assert isinstance(lim.primary, ClockLocker) and lim.mode == "only"
    assert lim.apply(490.0, "fan_stall", level=WARN).action == "refused"
    assert gpu.power_limit_w() == 700.0 and not lim.fallen


def test_without_fallback_the_other_journal_is_still_restored_at_start(tmp_path):
    gpu, lim, _, _ = build("both", VirtualBackend, tmp_path)
    lim.apply(490.0, "fan_stall", level=WARN)  # then the bridge dies; next run: power only
    assert gpu.locked_clocks_mhz() == (345, WARN_MHZ) and gpu.power_limit_w() == 490.0
    _, again, _, _ = build("power", VirtualBackend, tmp_path, gpu=gpu, fallback=False)
    assert gpu.locked_clocks_mhz() is None and gpu.power_limit_w() == 700.0
    assert not again.holding


def test_modbridge_restore_puts_clocks_and_limits_back(tmp_path):
    gpu, lim, _, _ = build("both", VirtualBackend, tmp_path)
    lim.apply(490.0, "fan_stall", level=WARN)  # then the bridge dies
    b = VirtualBackend([gpu])
    rows = restore_journaled(b, tmp_path / "state")
    assert {r.get("actuator", "power"): r["action"] for r in rows} == {
        "power": "restored", "clocks": "restored"}  # fmt: skip
    assert gpu.power_limit_w() == 700.0 and gpu.locked_clocks_mhz() is None
    assert restore_journaled(b, tmp_path / "state") == []
    assert not os.listdir(tmp_path / "state" / "clocks")


def test_clock_refusal_classes_are_gpu_errors():
    assert issubclass(ClocksRefused, Exception) and ClocksRefused("x").state == "clocks_refused"


# ----------------------------------------------------------------------------- costs


def test_nvml_calls_per_decision_are_counted_not_timed(tmp_path):
    nv, b, uuid, lim, _ = nvml_locker(tmp_path)
    lim.start()
    nv.calls.clear()
    lim.observe(None)
    assert sum(nv.calls.values()) == 0  # not holding: no clock read per tick
    lim.apply(None, "stall", level=WARN)
    # re-read (1 clock), the lock, the read-back (1 clock)
    assert dict(nv.calls) == {"nvmlDeviceGetClockInfo": 2, "nvmlDeviceSetGpuLockedClocks": 1}
    nv.calls.clear()
    lim.observe(None)
    assert dict(nv.calls) == {"nvmlDeviceGetClockInfo": 1}  # holding: one read per tick
    nv.calls.clear()
    assert lim.apply(None, "stall", level=WARN).action == "skip"
    assert dict(nv.calls) == {"nvmlDeviceGetClockInfo": 1}  # the truth, then nothing


# ----------------------------------------------------------------------------- config


def test_config_actuator_keys():
    from modbridge.config import ConfigFileError, parse

    gpu_a = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"
    cfg = parse({"bridge": {"actuator": "clocks", "fallback": False},
                 "clocks": {"warn_fraction": 0.9, "critical_fraction": 0.6},
                 "module": [{"id": "ab", "gpu": gpu_a, "actuator": "both"},
                            {"id": "cd", "gpu": "00000000:00:07.0"}]})  # fmt: skip
    assert (cfg.actuator, cfg.fallback) == ("clocks", False)
    assert (cfg.clocks_warn_fraction, cfg.clocks_critical_fraction) == (0.9, 0.6)
    assert cfg.actuator_for(gpu_a, "00000000:00:06.0") == "both"
    assert cfg.actuator_for("GPU-other", "00000000:00:07.0") == "clocks"
    with pytest.raises(ConfigFileError) as e:
        parse({"bridge": {"actuator": "fans"},
               "clocks": {"warn_fraction": 0.5, "critical_fraction": 0.7, "x": 1},
               "module": [{"id": "ab", "actuator": "clocks"}]})  # fmt: skip
    text = "\n".join(e.value.problems)
    assert "bridge.actuator: must be one of power, clocks, both" in text
    assert "clocks.critical_fraction: must not be above warn_fraction" in text
    assert "clocks.x: unknown key" in text
    assert "module[0].actuator: needs the module's gpu" in text


# ----------------------------------------------------------------------------- safety


class Flaky(VirtualBackend):
    """Every write refused or not as ``script`` says (the GPU otherwise works)."""

    def __init__(self, gpus, script):
        super().__init__(gpus)
        self.script = script

    def _maybe(self, what):
        if self.script and self.script.pop(0):
            raise GpuNoPermission(f"{what}: refused (test)")

    def set_power_limit_w(self, uuid, watts):
        self._maybe("power")
        return super().set_power_limit_w(uuid, watts)

    def set_locked_clocks_mhz(self, uuid, lo, hi):
        self._maybe("clocks")
        return super().set_locked_clocks_mhz(uuid, lo, hi)

    def reset_locked_clocks(self, uuid):
        self._maybe("reset")
        return super().reset_locked_clocks(uuid)


DECISION = st.tuples(st.sampled_from([NORMAL, WARN, CRITICAL]),
                     st.one_of(st.none(), st.floats(200, 700)), st.floats(0, 400))  # fmt: skip


@given(kind=st.sampled_from(["power", "clocks", "both"]), fallback=st.booleans(),
       decisions=st.lists(DECISION, max_size=25), refusals=st.lists(st.booleans(), max_size=40),
       crash=st.booleans())  # fmt: skip
# found by this test: an apply within the skip band of the original (699 W of 700) was
# counted as the restore and left the GPU 1 W below its original for good
@example(kind="power", fallback=False, decisions=[(NORMAL, 200.0, 0.0), (NORMAL, 699.0, 0.0)],
         refusals=[], crash=False)  # fmt: skip
@settings(max_examples=150, deadline=None)
def test_no_decision_sequence_or_refusal_leaves_a_gpu_throttled(
    tmp_path_factory, kind, fallback, decisions, refusals, crash
):
    """Whatever the policy asks, whatever the driver refuses (then stops refusing), a
    stop -- or a crash and the next start -- leaves the power limit at 700 W and the
    clocks unlocked, and nothing is ever raised above the defaults."""
    state = tmp_path_factory.mktemp("s") / "state"
    gpu, _ = virtual()
    backend = Flaky([gpu], list(refusals))
    clock = Clock()
    lim = make_actuator(kind, backend, gpu.uuid, fallback=fallback, monotonic=clock,
                        journal=LimitJournal(state))  # fmt: skip
    lim.start()
    for level, target_w, dt in decisions:
        if lim.wants(level, target_w):
            lim.apply(target_w, "test", level=level)
        else:
            lim.restore("test")
        assert gpu.power_limit_w() <= 700.0
        lock = gpu.locked_clocks_mhz()
        assert lock is None or lock[1] <= 1980
        clock.t += dt
    backend.script.clear()  # the driver takes writes again
    if crash:  # SIGKILL: no close; the next run's start puts things back
        lim = make_actuator(kind, VirtualBackend([gpu]), gpu.uuid, fallback=fallback,
                            journal=LimitJournal(state))  # fmt: skip
        lim.start()
    lim.close("exit")
    assert gpu.power_limit_w() == 700.0 and gpu.locked_clocks_mhz() is None
    assert not LimitJournal(state).uuids() and not ClockJournal(state).uuids()


def test_restore_of_a_gpu_owned_by_a_bridge_is_busy_for_both_journals(tmp_path):
    from modbridge.actuator.gpulock import GpuLock

    gpu, lim, _, _ = build("both", VirtualBackend, tmp_path)
    lim.apply(490.0, "fan_stall", level=WARN)
    with GpuLock(tmp_path / "state", gpu.uuid, key=f"{gpu.uuid}.test-{os.getpid()}"):
        rows = restore_journaled(VirtualBackend([gpu]), tmp_path / "state")
    assert [(r.get("actuator", "power"), r["action"]) for r in rows] == [
        ("power", "busy"), ("clocks", "busy")]  # fmt: skip
    assert gpu.locked_clocks_mhz() == (345, WARN_MHZ)  # untouched: its owner restores it
