"""The hosted control tick allocates nothing: 1,000 ticks of the firmware on the fake
board under ``micropython.heap_lock()`` with a signed heartbeat arriving every second,
as the bridge sends them (tests/test_app.py's steady-state test freezes the host
instead). DUAL: CPython, the unix port and, in the [qemu-arm] column, 32-bit ARM,
where small ints are 31-bit and any intermediate beyond +-2**30 would allocate."""

from fakehal import FakeHal, run, signer_for
from mpcompat import heap_locked

from device.app import App
from protocol import catalog as C
from protocol import frame

DUAL = True
MPY_TIMEOUT = 600

TICKS = 1000
HB = {"gpu_temp": 61000, "gpu_power": 310000, "power_limit": 700000}


def test_hosted_ticks_with_heartbeats_do_not_allocate():
    hal = FakeHal()
    app = App(hal)
    app.boot()
    app.wdt = hal.wdt_start(app.cfg["watchdog_ms"])
    signer_for(hal, app)
    seq = 1000

    def beat(n):
        nonlocal seq
        out = []
        for _ in range(n):
            seq += 1
            out.append(frame.encode_frame("heartbeat", HB, seq, signer=hal.signer))
        return out

    hal.send(beat(1)[0])
    run(app, hal, 3000, step_ms=100)
    hal.take()
    assert app.sup.state == C.STATE_HOSTED, app.sup.state
    frames = beat(TICKS // 10)  # encoding and signing are the host's work: before
    accepted = app.hb.accepted
    n0 = app.ticks

    def ticks():
        k = 0
        while k < TICKS:
            if k % 10 == 0:
                hal.send(frames[k // 10])
            app.step()
            hal.advance(100)
            hal.tx_len = 0
            k += 1

    heap_locked(ticks)
    assert app.failures == 0 and app.missed == 0, (app.failures, app.missed)
    assert app.ticks - n0 == TICKS, app.ticks - n0
    assert app.hb.accepted - accepted == TICKS // 10, app.hb.accepted - accepted
    assert app.sup.state == C.STATE_HOSTED, app.sup.state
    assert app.hb_seen
