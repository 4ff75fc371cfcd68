"""Issue 23 item 10: an unauthenticated heartbeat never undoes an authenticated one.

On a paired module only a heartbeat with an ``ok`` signature counts (SPEC section
14.1): it sets the GPU values and restarts the host-timeout clock. An unsigned,
forged or replayed heartbeat changes nothing, whether it arrives in the same read as
the host's signed one (before or after it) or in another; it is counted
(``auth_failures``) and answered ``nack unauthorized`` (rate-limited). On 4092283 the
decoder's heartbeat path kept only the last heartbeat of a read, so an unsigned one
right behind the signed one made the module drop the signed one, and 100 unsigned
heartbeats a second made it flap HOSTED/STANDALONE under a running bridge.

The oracle of the random walk is written from that rule, not from the firmware.
DUAL: runs on CPython and under MicroPython.
"""

from fakehal import FakeHal, run, signer_for

from device.app import App
from protocol import catalog as C
from protocol import frame, sign

DUAL = True
MPY_TIMEOUT = 600

_RX = 128  # device/app.py _RX_SIZE: the bytes one step reads


def _booted():
    hal = FakeHal()
    app = App(hal)
    app.boot()
    signer = signer_for(hal, app)
    run(app, hal, 1000)
    hal.take()
    return hal, app, signer


def _signed(signer, seq, power, temp=60000):
    return frame.encode_frame(
        "heartbeat", {"gpu_power": power, "gpu_temp": temp, "period_ms": 1000}, seq, signer=signer
    )


def _unsigned(seq, power, temp=20000):
    return frame.encode_frame("heartbeat", {"gpu_power": power, "gpu_temp": temp}, seq)


def _forged(signer, seq, power):
    bad = sign.Signer(bytes(32), 1, lambda: 10**12 + seq)  # the wrong key
    bad.nonce = signer.nonce
    return frame.encode_frame("heartbeat", {"gpu_power": power, "gpu_temp": 20000}, seq, signer=bad)


def _read(hal, app, data):
    """``data`` arrives and the module reads it in one step."""
    assert len(data) <= _RX, len(data)
    hal.send(data)
    app.step()
    assert hal.rx_pending() == 0
    hal.advance(10)


def test_unsigned_right_behind_the_signed_one_in_one_read():
    hal, app, signer = _booted()
    fails = app.auth_failures
    _read(hal, app, _signed(signer, 1, 321000) + _unsigned(2, 4000000))
    assert app.hb_seen and app.gpu_power_mw == 321000, (app.hb_seen, app.gpu_power_mw)
    assert app.hb_ms == hal.ticks_ms() - 10
    assert app.auth_failures == fails + 1


def test_unsigned_before_the_signed_one_in_one_read():
    hal, app, signer = _booted()
    fails = app.auth_failures
    _read(hal, app, _unsigned(2, 4000000) + _signed(signer, 3, 123000))
    assert app.hb_seen and app.gpu_power_mw == 123000
    assert app.auth_failures == fails + 1


def test_unsigned_in_the_next_read_refreshes_nothing():
    hal, app, signer = _booted()
    _read(hal, app, _signed(signer, 1, 321000))
    t0 = app.hb_ms
    hal.advance(3000)
    _read(hal, app, _unsigned(2, 4000000) + _forged(signer, 3, 5000))
    assert app.hb_ms == t0 and app.gpu_power_mw == 321000, (app.hb_ms, t0, app.gpu_power_mw)
    hal.advance(2500)  # 5.5 s after the signed one: past the 5 s host timeout
    run(app, hal, 200)
    assert app.sup.state == C.STATE_STANDALONE, app.sup.state


def test_the_refusals_are_answered_and_counted():
    hal, app, signer = _booted()
    fails = app.auth_failures
    _read(hal, app, _signed(signer, 1, 1000) + _unsigned(7, 2000) + _unsigned(8, 3000))
    got = [m for m in hal.take() if m.ok and m.name == "nack"]
    assert len(got) == 1 and got[0].fields["code"] == C.ERR_UNAUTHORIZED, got
    assert got[0].fields["ref"] == 8 and got[0].fields["ref_type"] == C.T_HEARTBEAT
    assert app.auth_failures == fails + 2


def test_a_flood_of_unsigned_heartbeats_does_not_make_the_module_flap():
    """A bridge's signed heartbeat every second, 100 unsigned ones a second around it
    (some in the same read as the signed one): HOSTED throughout, no host_timeout."""
    hal, app, signer = _booted()
    seq = 1
    _read(hal, app, _signed(signer, seq, 300000))
    run(app, hal, 300)
    assert app.sup.state == C.STATE_HOSTED, app.sup.state
    hal.take()
    standalone = 0
    t = 0
    while t < 20000:
        if t % 1000 == 0:
            seq += 1
            data = _signed(signer, seq, 300000) + _unsigned(seq, 4000000, 20000)
        else:
            data = _unsigned(seq, 4000000, 20000)
        _read(hal, app, data)
        if app.sup.state != C.STATE_HOSTED:
            standalone += 1
        hal.advance(0)
        t += 10
    assert standalone == 0, standalone
    codes = [m.fields["code"] for m in hal.take() if m.ok and m.name == "event"]
    assert C.REASON_HOST_TIMEOUT not in codes, codes
    assert app.gpu_power_mw == 300000


class _Lcg:
    """A seeded generator that behaves the same on both interpreters."""

    def __init__(self, seed):
        self.s = seed

    def __call__(self, n):
        self.s = (self.s * 1103515245 + 12345) & 0x7FFFFFFF
        return (self.s >> 8) % n


def test_random_walk_unauthenticated_heartbeats_change_nothing():
    """Reads of 1..4 heartbeats, each signed, unsigned, forged or a replay of an earlier
    signed one, at random times. Oracle (SPEC 14.1): after each read the GPU power is
    the one of the read's last good signed heartbeat (else unchanged), the host clock
    restarted at that read iff it held one, and every other heartbeat was counted."""
    for seed in (1, 2, 3):
        rnd = _Lcg(seed)
        hal, app, signer = _booted()
        power = app.gpu_power_mw
        hb_ms = app.hb_ms
        sent = []  # good signed frames (for replays)
        seq = 0
        step = 0
        while step < 150:
            data = b""
            good = None
            refused = 0
            k = 1 + rnd(4)
            while k:
                k -= 1
                seq += 1
                kind = rnd(4)
                if kind == 0 or (kind == 3 and not sent):
                    p = rnd(4000001)
                    f = _signed(signer, seq, p, 30000 + rnd(60000))
                elif kind == 1:
                    f = _unsigned(seq, rnd(4000001))
                elif kind == 2:
                    f = _forged(signer, seq, rnd(4000001))
                else:
                    f = sent[rnd(len(sent))]
                if len(data) + len(f) > _RX:
                    break  # the rest goes to the next read
                data += f
                if kind == 0 or (kind == 3 and not sent):
                    sent.append(f)
                    good = p
                else:
                    refused += 1
            fails = app.auth_failures
            now = hal.ticks_ms()
            _read(hal, app, data)
            if good is not None:
                power = good
                hb_ms = now
            ctx = (seed, step, good, refused)
            assert app.gpu_power_mw == power, (ctx, app.gpu_power_mw, power)
            assert app.hb_ms == hb_ms, (ctx, app.hb_ms, hb_ms)
            assert app.auth_failures == fails + refused, (ctx, app.auth_failures, fails)
            hal.advance((0, 100, 900, 2000, 6000)[rnd(5)])
            run(app, hal, 20)
            hal.take()
            step += 1
