"""CPython-only properties of protocol.sha256 and protocol.sign: hypothesis against
hashlib/hmac, and every integer the hot paths compute stays a 32-bit MCU small int."""

import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st
from intcheck import load_checked

from protocol import frame as F
from protocol import sign
from protocol.sha256 import Sha256, sha256


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=600))
def test_equals_hashlib(data):
    assert sha256(data) == hashlib.sha256(data).digest()


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(0, 600), max_size=6))
def test_incremental_equals_hashlib(data, cuts):
    h = Sha256()
    pos = 0
    for c in sorted(c for c in cuts if c <= len(data)):
        h.update_from(data, pos, c)
        pos = c
    h.update_from(data, pos, len(data))
    out = bytearray(32)
    h.digest_into(out, 0)
    assert bytes(out) == hashlib.sha256(data).digest()


@settings(max_examples=150, deadline=None)
@given(
    st.binary(min_size=32, max_size=32),
    st.binary(min_size=8, max_size=8),
    st.binary(max_size=520),
)
def test_mac48_equals_hmac(key, nonce, data):
    out = bytearray(10)
    sign.Mac(key).mac48_into(nonce, data, 0, len(data), out, 2)
    want = hmac.new(key, nonce + data, hashlib.sha256).digest()[:6]
    assert bytes(out[2:8]) == want
    assert out[:2] == b"\0\0" and out[8:] == b"\0\0"


def test_sha256_stays_within_small_ints():
    mod, chk = load_checked("protocol/sha256.py")
    h = mod.Sha256()
    out = bytearray(32)
    with chk:
        for n in (0, 55, 56, 64, 300, 1000):
            data = bytes([0xFF]) * n  # all-ones words maximise every sum
            h.reset()
            h.update_from(data, 0, n)
            h.digest_into(out, 0)
            assert bytes(out) == hashlib.sha256(data).digest()
    assert chk.count > 100000 and chk.peak < 2**30, (chk.peak, chk.where)


def test_verifier_and_heartbeat_path_stay_within_small_ints():
    smod, schk = load_checked("protocol/sign.py")
    key = bytes(range(32))
    nonce = b"\xff" * 8
    signer = sign.Signer(key, 7, clock=lambda: sign.TS_MAX - 10)
    signer.nonce = nonce
    ver = smod.Verifier(key)
    ver.set_nonce(nonce)
    fields = {"gpu_temp": 200000, "gpu_power": 4000000, "host_time": 0xFFFFFFFF}
    frame = F.encode_frame("heartbeat", fields, 0xFFFF, signer=signer)
    raw = bytearray(512)
    from protocol import cobs

    n = cobs.decode_into(frame, len(frame) - 1, raw)
    with schk:
        assert ver.verify(raw, n) == sign.AUTH_OK
        assert ver.verify(raw, n) == sign.AUTH_REPLAY
    assert schk.peak < 2**30, (schk.peak, schk.where)

    fmod, fchk = load_checked("protocol/frame.py")
    hb = fmod.HeartbeatState()
    ver2 = sign.Verifier(key)
    ver2.set_nonce(nonce)
    dec = fmod.StreamDecoder(accept="h2d", verifier=ver2, heartbeat=hb)
    rx = bytearray(frame)
    seen = []
    with fchk:
        dec.feed(rx, len(rx), seen.append)
        for neg in (-55000, 0):
            f2 = F.encode_frame(
                "heartbeat", {"gpu_temp": neg, "period_ms": 600000}, 1, signer=signer
            )
            dec.feed(bytearray(f2), None, seen.append)
    assert not seen and hb.accepted == 3, (seen, hb.accepted)
    assert fchk.peak < 2**30, (fchk.peak, fchk.where)
