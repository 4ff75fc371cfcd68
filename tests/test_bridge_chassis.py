"""The bridge's chassis learners: fed once per telemetry frame with the paired GPU's
reading, reported in the snapshot, never able to stop a tick."""

from __future__ import annotations

from test_bridge_config import UUID_A, FakeBackend, make_bridge

from modbridge.chassis import ChassisReport
from modbridge.config import BridgeConfig


def _frame(i):
    return {"state": 1, "faults": 0, "temp_gpu": 50000 + i, "temp_amb": 25000,
            "p_in": 200000, "fan1_duty": 30000, "fan2_duty": 30000,
            "fan1_rpm": 1400, "fan2_rpm": 1380, "v_in": 12000}  # fmt: skip


def test_learner_fed_once_per_frame_and_reported(tmp_path):
    b = make_bridge(BridgeConfig(), FakeBackend(UUID_A), ["/dev/ttyUSB0"], state_dir=tmp_path)
    t = [1000.0]
    b.wall_clock = lambda: t[0]
    link = b.links["/dev/ttyUSB0"]
    link.hello("aa01")
    for i in range(5):
        link.status.telemetry = _frame(i)  # a new frame replaces the dict
        t[0] += 1.0
        b.tick()
        b.tick()  # the same frame again: not fed twice
    learner = b.chassis["aa01"]
    assert learner.probe.n_train + learner.probe.n_holdout == 5
    report = b.snapshot().chassis["aa01"]
    assert isinstance(report, ChassisReport) and not report.converged
    assert b.chassis_config_fields("aa01") is None  # not converged: nothing to send
    assert b.chassis_config_fields("nobody") is None
    b.stop()


def test_a_failing_learner_does_not_stop_the_tick(monkeypatch):
    b = make_bridge(BridgeConfig(), FakeBackend(UUID_A), ["/dev/ttyUSB0"])
    link = b.links["/dev/ttyUSB0"]
    link.hello("aa01")
    link.status.telemetry = _frame(0)
    b.tick()

    def boom(*a, **k):
        raise ZeroDivisionError("a model bug")

    monkeypatch.setattr(b.chassis["aa01"], "observe", boom)
    link.status.telemetry = _frame(1)
    snap = b.tick()
    assert snap.pairs[0].gpu_uuid == UUID_A
    b.stop()
