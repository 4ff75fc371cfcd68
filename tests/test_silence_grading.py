"""Issue 23 item 2: the one grading of a link's frames (fresh, late, silent), with the
bridge's own pauses left out. The oracle is written from docs/bridge.md ("Silence and
unplug"): a module is silent once no frame has arrived for 1.75 s (and at least 2.5
telemetry periods, at most ``module_silent_s``) of the bridge's *running* time; late
once one frame is missing (1.5 periods); a stretch when the bridge did not run does
not count against the module.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.model import ModuleStatus, silence_timeout_s

PERIOD_MS = 200  # the firmware's default telemetry (device/config.py)


def oracle_threshold(period_s: float, module_silent_s: float) -> float:
    return min(max(1.75, 2.5 * period_s), module_silent_s)


def running_since(t0: float, now: float, pauses: list[tuple[float, float]]) -> float:
    """Seconds in (t0, now] the bridge ran: wall time less the pauses' overlap."""
    paused = sum(max(0.0, min(b, now) - max(a, t0)) for a, b in pauses)
    return (now - t0) - paused


# a timeline: events in order, each a frame arriving (the bridge running) or a pause
event = st.one_of(
    st.tuples(st.just("frame"), st.floats(0.01, 3.0)),  # a frame this long after the last event
    st.tuples(st.just("pause"), st.floats(0.3, 40.0)),  # the bridge stops this long
)


@settings(max_examples=300, deadline=None)
@given(st.lists(event, min_size=1, max_size=30), st.floats(0.0, 4.0),
       st.sampled_from([100, 200, 250, 1000]), st.sampled_from([1.0, 5.0, 30.0]))  # fmt: skip
def test_silent_only_past_the_threshold_of_running_time(events, tail, period_ms, max_s):
    period = period_ms / 1000.0
    threshold = oracle_threshold(period, max_s)
    m = ModuleStatus(port="p", last_frame_at=0.0)
    m.silent_after_s = silence_timeout_s(period_ms, max_s)
    m.telemetry_period_s = period
    now, last, pauses = 0.0, 0.0, []
    for kind, dt in events:
        if kind == "frame":  # the link stamps a frame when it reads it
            now += dt
            m.last_frame_at, m.paused_s, last = now, 0.0, now
        else:  # the I/O thread measures the gap and tells the link
            pauses.append((now, now + dt))
            if m.last_frame_at is not None:
                m.paused_s += dt
            now += dt
    now += tail  # the bridge runs `tail` more seconds; nothing arrives
    ran = running_since(last, now, pauses)
    f = m.grade(now)
    assert abs(f.age_s - ran) < 1e-6
    if min(abs(ran - threshold), abs(ran - 1.5 * period)) < 1e-6:
        return  # on a boundary to float rounding: either side is right
    if ran <= threshold:
        assert not f.silent  # frames arrived within the threshold of running time
    else:
        assert f.silent
    if ran > 1.5 * period and ran <= threshold:
        assert f.state == "late"
    if ran <= 1.5 * period and ran <= threshold:
        assert f.state == "fresh"


@given(st.sampled_from([100, 200, 1000]), st.floats(0.0, 0.499))
def test_one_lost_frame_is_never_silent(period_ms, phase):
    """A frame destroyed on the wire: the next arrives one period later, at most two
    periods after the last good one (plus up to half a period of jitter)."""
    period = period_ms / 1000.0
    m = ModuleStatus(port="p", last_frame_at=0.0)
    m.silent_after_s = silence_timeout_s(period_ms, 5.0)
    m.telemetry_period_s = period
    f = m.grade(2 * period + phase * period)
    assert f.state == "late" and 1 <= f.missed_frames <= 2


def test_the_default_telemetry_tells_several_missed_frames_within_2_s():
    from device import config

    period_ms = config.defaults()["control"]["telemetry_ms"]
    timeout = silence_timeout_s(period_ms, 5.0)
    assert timeout <= 2.0 and timeout / (period_ms / 1000.0) >= 3  # several, within 2 s
