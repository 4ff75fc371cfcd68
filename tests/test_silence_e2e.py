"""Issue 23 item 2: a paused bridge took its live module for silent, and one frame lost
to line noise was taken for silence. The real bridge and the real firmware on a virtual
module (tests/e2e_helpers.py), in real time.

On 4092283 the bridge's loop judged silence itself (``Bridge._frame_age`` against the
link's deadline): after a stall of its I/O thread the loop's next tick saw an old
frame and went CRITICAL at once, and one destroyed frame at the 1 Hz default was a
silence (deadline 1.75 periods). Now the link decides once, from what its port
delivered, leaves the bridge's own pauses out, and grades a missed frame as late.
"""

from __future__ import annotations

import threading
import time

from e2e_helpers import ORIGINAL_W, bridged, wait_for

from modbridge.model import SILENT_S, UNPLUG_DEBOUNCE_S

PAUSE_S = 3.0  # > the 1.75 s deadline, < the firmware's 5 s host timeout
SLACK_S = 0.5  # a loaded machine's scheduling, on top of the decided age
REAL_TIME = dict(speed=1.0, module_silent_s=5.0, min_hold_s=60.0)


def lowered(r) -> int:
    return sum(lim.actions_total.get("lower", 0) for lim in r.bridge.limiters.values())


def silent_decisions(r) -> list:
    return [d for d in r.decisions("module_silent") if d["level"] == "CRITICAL"]


def wedge_io(r, at_most_s: float):
    """The links' I/O thread stops (at most ``at_most_s``) after its next wake-up;
    returns the function that lets it go."""
    io = r.bridge.io
    real = io.after_iteration
    blocked, release = threading.Event(), threading.Event()

    def stuck():
        if not release.is_set():
            blocked.set()
            release.wait(at_most_s)
        real()

    def let_go():
        release.set()
        io.after_iteration = real

    io.after_iteration = stuck
    wait_for(blocked.is_set, 10, "the I/O thread stopped")
    return let_go


def stall_bridge(r, seconds: float) -> None:
    """Both bridge threads stop for ``seconds`` (what SIGSTOP does to them), the module
    keeps writing; the loop is let go first, the I/O thread 0.5 s later (the worst
    order: the loop ticks before anything has read the port)."""
    let_go = wedge_io(r, seconds + 5)
    with r.bridge._tick_lock:  # the loop's next tick waits here
        time.sleep(seconds)
    time.sleep(0.5)  # the loop ticks on a port nobody has read for `seconds`
    let_go()


def test_a_stalled_bridge_does_not_take_its_live_module_for_silent():
    with bridged(**REAL_TIME) as r:
        wait_for(lambda: r.module().freshness is not None, 10, "a verdict")
        frames = r.module().frames_total
        stall_bridge(r, PAUSE_S)
        wait_for(lambda: r.module().frames_total > frames + 5, 10, "frames after the stall")
        time.sleep(0.5)
        assert silent_decisions(r) == []
        assert lowered(r) == 0 and r.pair().target_limit_w is None
        assert r.bridge.io.pauses >= 1 and r.bridge.io.paused_s >= PAUSE_S - SLACK_S


def test_one_frame_lost_to_noise_is_late_not_silent():
    with bridged(**REAL_TIME) as r:
        vm = r.vm
        real = vm._relay_tx
        bursts = []

        def noisy(data: bytes) -> None:
            if bursts and bursts[-1] is None and len(data) > 8:
                bursts[-1] = data
                data = data[:3] + bytes(range(1, 17)) + data[3:]  # 16 bytes inside a frame
            real(data)

        vm._relay_tx = noisy
        st = r.bridge.links[r.fleet.ports[0]].status
        wait_for(lambda: st.freshness is not None, 10, "a verdict")
        for _ in range(3):
            errors = sum(st.frame_errors.values())
            bursts.append(None)
            wait_for(lambda: bursts[-1] is not None, 10, "a burst")
            wait_for(lambda e=errors: sum(st.frame_errors.values()) > e, 10, "the frame lost")
            time.sleep(1.0)
        assert silent_decisions(r) == []
        assert lowered(r) == 0 and r.pair().level == 0


def test_real_silence_within_2_s_and_an_unplug_within_1_s():
    with bridged(**REAL_TIME) as r:
        link = r.bridge.links[r.fleet.ports[0]]
        st = link.status
        wait_for(lambda: st.freshness is not None, 10, "a verdict")
        r.vm.pause()  # hung firmware, still plugged: no frame any more
        wait_for(lambda: silent_decisions(r), 10, "the silence decided")
        f = st.freshness
        assert f.silent and not f.unplugged
        assert SILENT_S <= f.age_s <= 2.0 + SLACK_S  # the decided age, running time
        assert lowered(r) == 1
    with bridged(**REAL_TIME) as r:
        st = r.bridge.links[r.fleet.ports[0]].status
        wait_for(lambda: st.freshness is not None and st.telemetry, 10, "telemetry")
        r.vm.unplug()
        wait_for(lambda: st.freshness is not None and st.freshness.silent, 10, "the unplug")
        f = st.freshness
        assert f.unplugged and st.lost_at is not None
        decided = max(st.lost_at, st.last_frame_at) + UNPLUG_DEBOUNCE_S
        assert decided - st.lost_at <= 1.0  # the unplug's verdict, by construction
        wait_for(lambda: silent_decisions(r), 10, "the unplug decided")
        # the decision is journalled before the limiter acts on it: wait for the write
        wait_for(lambda: (r.pair().target_limit_w or ORIGINAL_W) < ORIGINAL_W, 10,
                 "the limit lowered")


def test_a_wedged_io_thread_is_not_taken_for_a_fresh_module():
    """The link decides silence in the I/O thread; if that thread is wedged while the
    loop runs, its last verdict is no news: the loop takes the module for silent."""
    from modbridge.bridge import IO_STALL_S

    with bridged(**REAL_TIME) as r:
        wait_for(lambda: r.module().freshness is not None, 10, "a verdict")
        let_go = wedge_io(r, IO_STALL_S + 20)
        try:
            wait_for(lambda: silent_decisions(r), IO_STALL_S + 15, "silence from the loop")
            assert r.bridge.io_stalled_s > IO_STALL_S
        finally:
            let_go()
