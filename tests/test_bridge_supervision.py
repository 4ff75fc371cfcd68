"""A bridge tick that fails again and again (issue 9, part 6): after TICK_FAIL_LIMIT
failures in a row over at least TICK_FAIL_MIN_S the bridge restores every limit
(through its limiters, then from the journal) and exits non-zero, so that systemd
starts it again from a known state. Failures are injected through the fakes: a GPU
backend whose batch read breaks after the limit was lowered.
"""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner
from test_bridge_config import UUID_A, FakeBackend, make_bridge

from modbridge import bridge as br
from modbridge.actuator.journal import LimitJournal
from modbridge.config import BridgeConfig
from modbridge.gpu.virtual import VirtualBackend
from protocol import catalog as C

STALLED = C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL


class BatchBreaks(FakeBackend):
    """The batch read raises a non-GpuError (a bug, not a lost GPU) once ``broken``;
    single reads and writes still work, so the limits can be put back."""

    broken = False

    def sample_all(self):
        if self.broken:
            raise RuntimeError("batch read bug")
        return super().sample_all()


@pytest.fixture
def fast_fail(monkeypatch):
    monkeypatch.setattr(br, "TICK_FAIL_MIN_S", 0.2)


def _lowered(tmp_path, clock):
    gpus = BatchBreaks(UUID_A)
    b = make_bridge(BridgeConfig(tick_s=0.02), gpus, ["/dev/ttyUSB0"],
                    clock=clock, state_dir=tmp_path / "state")  # fmt: skip
    link = b.links["/dev/ttyUSB0"]
    link.hello("aa01", stalled=STALLED)
    link.status.last_frame_at = clock()
    b.tick()
    assert gpus.limits[UUID_A] == 200.0  # both fans stalled: the minimum
    assert LimitJournal(tmp_path / "state").uuids() == [UUID_A]
    return b, gpus


def test_repeated_failures_restore_every_limit_and_raise(tmp_path, fast_fail, caplog):
    now = [1000.0]
    b, gpus = _lowered(tmp_path, lambda: now[0])
    gpus.broken = True
    with pytest.raises(br.TickFailing) as e:
        b.run()
    assert b.tick_failures_in_a_row >= br.TICK_FAIL_LIMIT
    assert gpus.limits[UUID_A] == 700.0  # back at the original
    assert LimitJournal(tmp_path / "state").uuids() == []  # nothing left to restore
    assert "limits restored" in str(e.value) and "batch read bug" in str(e.value)
    assert e.value.exit_code == 1
    assert not b.locks  # released: the restarted bridge can take the GPU
    # one ERROR with the traceback for the episode, not one per tick
    tracebacks = [r for r in caplog.records if r.levelname == "ERROR" and r.exc_info]
    assert len(tracebacks) == 1


def test_a_good_tick_resets_the_count(tmp_path, fast_fail):
    now = [1000.0]
    b, gpus = _lowered(tmp_path, lambda: now[0])
    runs = [0]

    def flaky():  # fails LIMIT - 1 times, works once, and so on
        runs[0] += 1
        if runs[0] % br.TICK_FAIL_LIMIT == 0:
            return FakeBackend.sample_all(gpus)
        raise RuntimeError("sometimes")

    gpus.sample_all = flaky
    b.run(until=lambda: runs[0] >= 4 * br.TICK_FAIL_LIMIT)
    assert b.tick_errors == 4 * (br.TICK_FAIL_LIMIT - 1)
    assert gpus.limits[UUID_A] == 200.0  # still the policy's: the bridge did not give up
    b.stop()
    assert gpus.limits[UUID_A] == 700.0


def test_failures_shorter_than_the_minimum_time_do_not_exit(tmp_path, monkeypatch):
    monkeypatch.setattr(br, "TICK_FAIL_MIN_S", 3600.0)
    now = [1000.0]
    b, gpus = _lowered(tmp_path, lambda: now[0])
    gpus.broken = True
    b.run(until=lambda: b.tick_errors >= 3 * br.TICK_FAIL_LIMIT)
    assert gpus.limits[UUID_A] == 200.0
    b.stop()


def test_modbridge_run_exits_1_with_the_limits_restored(tmp_path, monkeypatch, fast_fail):
    """The CLI end to end (``run --sim``, the real firmware): the demo ramp lowers the
    limit, then the batch read breaks; exit 1, every limit at its original."""
    monkeypatch.setattr("modbridge.config.DEFAULT_PATHS", (tmp_path / "absent.toml",))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    backends = []
    real_init = VirtualBackend.__init__
    real_set = VirtualBackend.set_power_limit_w
    real_all = VirtualBackend.sample_all

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        self.broken = False
        backends.append(self)

    def set_limit(self, uuid, watts):
        got = real_set(self, uuid, watts)
        if watts < 700.0:
            self.broken = True  # lowered: from now on the loop cannot read the GPUs
        return got

    def sample_all(self):
        if self.broken:
            raise RuntimeError("batch read bug")
        return real_all(self)

    monkeypatch.setattr(VirtualBackend, "__init__", init)
    monkeypatch.setattr(VirtualBackend, "set_power_limit_w", set_limit)
    monkeypatch.setattr(VirtualBackend, "sample_all", sample_all)
    cfg = tmp_path / "modbridge.toml"
    cfg.write_text("[bridge]\ntick_s = 0.05\n[policy]\nwarn_temp_c = 30.0\n"
                   "critical_temp_c = 80.0\nmin_hold_s = 60.0\n")  # fmt: skip
    events = tmp_path / "events.jsonl"
    state = tmp_path / "state"
    from modbridge.cli.main import main

    res = CliRunner().invoke(
        main,
        ["run", "--sim", "--sim-speed", "20", "--config", str(cfg), "--no-metrics",
         "--event-log", str(events), "--state-dir", str(state), "--status-every", "0",
         "--duration", "60"],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "ticks in a row" in res.output and "limits restored" in res.output
    (backend,) = backends
    assert backend.broken  # the limit was lowered before the loop broke
    assert all(g.power_limit_w() == 700.0 for g in backend._gpus.values())
    assert LimitJournal(state).uuids() == []
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    assert any(e["kind"] == "power_limit" and e["action"] == "lower" for e in lines)
    assert [e for e in lines if e["kind"] == "bridge" and e.get("action") == "fail_safe"]
    assert not [t for t in threading.enumerate() if t.name.startswith("modbridge-link")]


def test_an_urgent_decision_while_the_loop_ticks_is_left_to_the_loop(tmp_path, monkeypatch):
    """The I/O thread never waits for the loop: if a tick is running, the urgent
    decision is the loop's next tick (at once); and it never decides beside it."""
    now = [1000.0]
    b, gpus = _lowered(tmp_path, lambda: now[0])
    port = "/dev/ttyUSB0"
    ticks = b.ticks
    with b._tick_lock:  # the loop is in a tick
        b._urgent(port)
        b._decide_urgent()
    assert b.ticks == ticks and b._wake.is_set() and b.inline_ticks == 0
    b._wake.clear()
    b.links[port].status.telemetry["faults"] = 0  # the fans turn again
    now[0] += 600.0
    b.links[port].status.last_frame_at = now[0]
    b._urgent(port)
    b._decide_urgent()  # free now: decided right here, without a full tick
    assert b.ticks == ticks and b.inline_ticks == 1 and not b._wake.is_set()
    assert gpus.limits[UUID_A] > 200.0  # that pair's decision: no longer the minimum
    assert "both_fans_stalled" not in b.pairs[port].reasons

    def broken(now, inputs):
        raise RuntimeError("policy bug")

    monkeypatch.setattr(b.engine, "step_pairs", broken)
    b._urgent(port)
    b._decide_urgent()  # a failing urgent decision: the loop retries (and counts it)
    assert b._wake.is_set() and b.inline_ticks == 1
    b.stop()
    assert gpus.limits[UUID_A] == 700.0
