"""The bridge's chassis learners: fed once per telemetry frame with the paired GPU's
reading, reported in the snapshot, never able to stop a tick."""

from __future__ import annotations

import threading

from test_bridge_config import UUID_A, FakeBackend, make_bridge

from modbridge import bridge as br
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


# -- pushing a converged model to its module (Bridge._push_chassis) --------------------
MODEL = {"model.ok": 1, "model.lead_ms": 4000, "model.ga_q12": 410, "model.rp_mcw": 20,
         "model.rpd_mcw": 5, "model.off_mc": 1500, "model.unc_mc": 1200,
         "model.slow_mc": 87000}  # fmt: skip


class _Learner:
    """A converged learner: ``fields`` is what it would send."""

    def __init__(self, fields):
        self.fields = fields

    def config_fields(self):
        return None if self.fields is None else dict(self.fields)


def _pushing_bridge(fail=None):
    b = make_bridge(BridgeConfig(), FakeBackend(UUID_A), ["/dev/ttyUSB0"])
    link = b.links["/dev/ttyUSB0"]
    link.hello("aa01")
    sent = []

    def request(name, fields=None, timeout=None):
        sent.append((name, fields))
        if fail is not None and fail[0]:
            raise br.LinkError("module went away")

    link.request = request

    def event(kind, **f):
        if kind == "chassis_model":
            sent.append(("event", f["result"]))

    b._write_event = event
    return b, sent


def _push(b, now):
    b._push_chassis(now)
    for t in threading.enumerate():
        if t.name.startswith("modbridge-model"):
            t.join(5)


def test_a_converged_model_is_sent_signed_and_saved_once():
    b, sent = _pushing_bridge()
    b.chassis["aa01"] = _Learner(None)
    _push(b, 0.0)
    assert sent == []  # not converged: nothing
    b.chassis["aa01"] = _Learner(MODEL)
    _push(b, 10.0)
    assert sent == [("config_set", {"values": MODEL}), ("config_save", None), ("event", "ok")]
    _push(b, 20.0)
    _push(b, 10.0 + br.MODEL_PUSH_MIN_S + 1)  # an hour on, the same model: not again
    assert len(sent) == 3
    b.stop()


def test_a_model_that_moved_is_sent_again_after_the_hour_only():
    b, sent = _pushing_bridge()
    b.chassis["aa01"] = _Learner(MODEL)
    _push(b, 0.0)
    moved = dict(MODEL, **{"model.off_mc": 3500})  # every estimate 2 degC higher
    b.chassis["aa01"] = _Learner(moved)
    _push(b, 60.0)
    assert len(sent) == 3  # within the hour: flash wear
    _push(b, br.MODEL_PUSH_MIN_S + 1)
    assert sent[3:] == [("config_set", {"values": moved}), ("config_save", None), ("event", "ok")]
    b.stop()


def test_a_failed_push_is_retried_after_the_retry_time():
    fail = [True]
    b, sent = _pushing_bridge(fail)
    b.chassis["aa01"] = _Learner(MODEL)
    _push(b, 0.0)
    assert sent == [("config_set", {"values": MODEL}), ("event", "failed")]
    _push(b, br.MODEL_PUSH_RETRY_S - 1)
    assert len(sent) == 2
    fail[0] = False
    _push(b, br.MODEL_PUSH_RETRY_S + 1)
    assert sent[2:] == [("config_set", {"values": MODEL}), ("config_save", None), ("event", "ok")]
    b.stop()


def test_model_moved_oracle():
    assert not br.model_moved(MODEL, dict(MODEL))
    assert not br.model_moved(MODEL, dict(MODEL, **{"model.off_mc": 1900}))  # 0.4 degC
    assert br.model_moved(MODEL, dict(MODEL, **{"model.off_mc": 2500}))  # 1 degC
    assert br.model_moved(MODEL, dict(MODEL, **{"model.rp_mcw": 22}))  # 1.2 degC at 600 W
    assert br.model_moved(MODEL, dict(MODEL, **{"model.ok": 0}))
    assert br.model_moved(MODEL, dict(MODEL, **{"model.unc_mc": 2500}))
    assert br.model_moved(MODEL, dict(MODEL, **{"model.slow_mc": 83000}))
