"""One alert per episode on every actuator path (issue 23 item 5).

On 4092283 a fallback that could not write either (the journal refused) alerted once
per tick (24 alerts in 3.9 s), and a restore after an all-clear waited for the refused
write's back-off. The oracle is docs/bridge.md: a failing write backs off 1 s doubling
to 5 min with one alert per episode; another write (the restore) is tried at once.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.actuator import make_actuator
from modbridge.actuator.journal import ClockJournal, JournalError, LimitJournal
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend

WARN = 1


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _build(tmp_path, kind="power"):
    nv = FakeNvml()
    backend = NvmlBackend(nvml=nv)
    uuid = backend.devices()[0].uuid
    events, clock = [], Clock()
    lim = make_actuator(kind, backend, uuid, log=events.append, monotonic=clock,
                        journal=LimitJournal(tmp_path / "state"))  # fmt: skip
    lim.start()
    return nv, lim, events, clock


def _alerts(events):
    return [e for e in events if e.get("level") == "alert"]


def _refuse_journal(monkeypatch):
    def record(self, *a, **k):
        raise JournalError("cannot journal the original: Too many open files")

    monkeypatch.setattr(LimitJournal, "record", record)
    monkeypatch.setattr(ClockJournal, "record", record)


def test_a_fallback_that_cannot_journal_either_alerts_once(tmp_path, monkeypatch):
    nv, lim, events, clock = _build(tmp_path)
    _refuse_journal(monkeypatch)  # both journals: the clocks cannot stand in either
    for _ in range(120):  # 12 s of 0.1 s ticks
        lim.apply(490.0, "fan_stall", level=WARN)
        clock.t += 0.1
    assert nv.writes == [] and nv.devices[0].locked is None  # nothing written at all
    assert len(_alerts(events)) == 1, [e["message"] for e in _alerts(events)]


def test_the_restore_after_an_all_clear_is_tried_at_once(tmp_path):
    nv, lim, events, clock = _build(tmp_path)
    assert lim.apply(490.0, "fan_stall", level=WARN).action == "lower"
    nv.read_only = True  # a deeper cut is refused: back-off
    assert lim.apply(200.0, "both_fans_stalled", level=2).action in ("refused", "lower")
    nv.read_only = False
    clock.t += 0.5  # well inside the refused write's back-off
    assert lim.restore("all clear").action == "restore"
    assert not lim.holding


@settings(max_examples=30, deadline=None)
@given(ticks=st.lists(st.booleans(), min_size=1, max_size=300))
def test_property_at_most_one_alert_per_failure_episode(tmp_path_factory, ticks):
    """Each tick the power write works (True) or is refused (False); an episode is a run
    of refusals: at most one alert in each."""
    nv, lim, events, clock = _build(tmp_path_factory.mktemp("s"), kind="power")
    lim = lim.primary  # the power limiter alone
    target = 490.0
    episode_alerts = []
    for ok in ticks:
        nv.read_only = not ok
        before = len(_alerts(events))
        res = lim.apply(target, "fan_stall", level=WARN)
        if res.action in ("lower", "restore"):
            episode_alerts.clear()
        episode_alerts.extend(_alerts(events)[before:])
        assert len(episode_alerts) <= 1
        target = 450.0 if target == 490.0 else 490.0
        clock.t += 0.5
