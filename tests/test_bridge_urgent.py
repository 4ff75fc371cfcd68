"""Urgent decisions (issue 9, part 8): an alarm, a change of fault bits or a silence on
one module decides that module's pair at once, in the I/O thread, and only that pair
(``Bridge._decide_pairs``). The rule: the pairs decided urgently end up exactly as a
full tick at that moment would leave them (state, limit written), and every other
pair is left exactly as it was (state, limit, its policy's memory) until the loop's
next tick.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bridge_config import FakeBackend, make_bridge

from modbridge.config import BridgeConfig, ModuleMapping
from protocol import catalog as C

N = 4
PORTS = [f"/dev/ttyUSB{i}" for i in range(N)]
UUIDS = [f"GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e00{i:02x}" for i in range(N)]
# what a module may report: all well, one fan stalled, both stalled, an NTC open, low 12 V
FAULTS = (0, C.FAULT_FAN1_STALL, C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL, 1 << 3, "low_v")


def _bridge(clock):
    cfg = BridgeConfig(
        modules=[ModuleMapping(None, u, port=p) for p, u in zip(PORTS, UUIDS, strict=True)]
    )
    return make_bridge(cfg, FakeBackend(*UUIDS), PORTS, clock=clock)


def _report(b, port, fault, now):
    link = b.links[port]
    if link.status.module_id is None:
        link.hello(f"aa{PORTS.index(port):02x}")
    tel = dict(link.status.telemetry)
    tel["faults"] = 0 if fault == "low_v" else fault
    tel["v_in"] = 10500 if fault == "low_v" else 12000
    link.status.telemetry = tel
    link.status.last_frame_at = now


def _state(b, port):
    p = b.pairs[port]
    uuid = UUIDS[PORTS.index(port)]
    return (p.level, p.reasons, p.target_limit_w, b.backend.limits[uuid])


def _memory(b, port):
    """The pair's policy memory (levels, latches, histories), comparable."""
    pair = b.engine.pairs[(b.pairs[port].module_id, b.pairs[port].gpu_uuid)]
    return pickle.dumps(pair)


@settings(max_examples=60, deadline=None)
@given(
    first=st.lists(st.sampled_from(FAULTS), min_size=N, max_size=N),
    then=st.lists(st.sampled_from(FAULTS), min_size=N, max_size=N),
    urgent=st.sets(st.integers(0, N - 1), min_size=1),
    later_s=st.floats(0.05, 120.0),
)
def test_an_urgent_decision_is_a_tick_for_its_pairs_and_nothing_for_the_others(
    first, then, urgent, later_s
):
    now = [1000.0]
    urgent_b, full_b = _bridge(lambda: now[0]), _bridge(lambda: now[0])
    for b in (urgent_b, full_b):
        for port, fault in zip(PORTS, first, strict=True):
            _report(b, port, fault, now[0])
        b.tick()
    before = {p: (_state(urgent_b, p), _memory(urgent_b, p)) for p in PORTS}
    now[0] += later_s
    for b in (urgent_b, full_b):
        for port, fault in zip(PORTS, then, strict=True):
            _report(b, port, fault, now[0])
    for i in sorted(urgent):
        urgent_b._urgent(PORTS[i])
    urgent_b._decide_urgent()
    full_b.tick()
    assert urgent_b.inline_ticks == 1
    for i, port in enumerate(PORTS):
        if i in urgent:  # decided now: as the full tick decided it
            assert _state(urgent_b, port) == _state(full_b, port), port
        else:  # untouched until the loop's next tick
            assert (_state(urgent_b, port), _memory(urgent_b, port)) == before[port], port
    # the snapshot shows the urgent decisions at once
    assert urgent_b.snapshot().pairs == list(urgent_b.pairs.values())
    urgent_b.stop()
    full_b.stop()


# ----------------------------------------------------------------------------- the tick grid

_TICK_S = st.sampled_from([0.05, 0.1, 0.5, 1.0, 2.5, 10.0])


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(now=st.floats(0.0, 1e7), tick_s=_TICK_S)
def test_the_loop_ticks_on_its_grid_never_later_than_a_tick_and_a_bit(now, tick_s):
    """tick_wait_s: the next tick is a point of the grid ``k * tick_s + TICK_LAG_S``
    (just after the links' heartbeat points), never more than 1.05 ticks away."""
    from modbridge.bridge import TICK_LAG_S, tick_wait_s

    wait = tick_wait_s(now, tick_s)
    assert 0.0 <= wait <= 1.05 * tick_s + 1e-6
    phase = (now + wait - TICK_LAG_S) / tick_s
    assert abs(phase - round(phase)) < 1e-6 * max(1.0, phase)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(k=st.integers(1, 10**6), tick_s=_TICK_S, late=st.floats(-0.04, 0.3))
def test_a_tick_on_time_early_or_late_is_followed_by_the_next_grid_point(k, tick_s, late):
    """A wake-up a little early (timer rounding) or late (a slow tick) counts for its
    grid point: the loop never ticks twice for one point, nor skips one."""
    from modbridge.bridge import TICK_LAG_S, tick_wait_s

    now = k * tick_s + TICK_LAG_S + late * tick_s
    assert tick_wait_s(now, tick_s) == pytest.approx((1 - late) * tick_s, abs=1e-6 * k)
