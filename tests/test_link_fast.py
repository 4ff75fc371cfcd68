"""The link's cheaper ways to the reference's bytes: the host signer's one-shot HMAC
(:class:`~modbridge.link.session.HostSigner`) gives :class:`protocol.sign.Signer`'s
trailers, and a heartbeat encoded from fields checked once is the reference frame.
CPython only (the host's link)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.link.codec import encode_fast, fast_keyed
from modbridge.link.heartbeat import HEARTBEAT
from modbridge.link.session import HostSigner, _signer_clock
from protocol.frame import encode_frame
from protocol.sign import Signer, SigningError, _default_clock


class Clock:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self):
        return self.ts


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.binary(min_size=32, max_size=32),
    st.integers(0, 255),
    st.binary(min_size=8, max_size=8),
    st.binary(max_size=300),
    st.lists(st.integers(0, 2**48 - 8), min_size=1, max_size=4),
)
def test_host_signer_trailers_are_the_reference_ones(key, link_id, nonce, data, clocks):
    ours, ref = HostSigner(key, link_id, clock=Clock(0)), Signer(key, link_id, clock=Clock(0))
    ours.nonce = ref.nonce = nonce
    for ts in clocks:  # the clock going back too: next_ts's rule, the same for both
        ours.clock.ts = ref.clock.ts = ts
        assert ours.trailer(data) == ref.trailer(data)
        assert ours.last_ts == ref.last_ts


def test_host_signer_refuses_what_the_reference_refuses():
    for nonce in (None, b"short"):
        s = HostSigner(bytes(32), 0)
        s.nonce = nonce
        with pytest.raises(SigningError):
            s.trailer(b"abc")


def test_the_links_signer_clock_is_the_default_one():
    a, b, c = _default_clock(), _signer_clock(), _default_clock()
    assert a <= b <= c


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.fixed_dictionaries(
        {"host_time": st.integers(0, 2**32 - 1), "period_ms": st.integers(1, 600000)},
        optional={
            "gpu_temp": st.integers(-40000, 200000),
            "gpu_power": st.integers(0, 4_100_000),
            "power_limit": st.integers(0, 4_100_000),
            "gpu_mem_temp": st.integers(-55000, 200000),
            "gpu_slowdown": st.integers(40000, 125000),
        },
    ),
    st.integers(0, 0xFFFF),
    st.booleans(),
)
def test_a_heartbeat_from_checked_fields_is_the_reference_frame(fields, seq, signed):
    keyed = fast_keyed(HEARTBEAT, fields)
    sa = sb = None
    if signed:
        sa, sb = (HostSigner(bytes(range(32)), 1, clock=Clock(5)),
                  Signer(bytes(range(32)), 1, clock=Clock(5)))  # fmt: skip
        sa.nonce = sb.nonce = bytes(8)
    try:
        want = encode_frame("heartbeat", fields, seq, signer=sb)
    except Exception as e:  # noqa: BLE001 - then the fast one raises the same kind
        with pytest.raises(type(e)):
            encode_fast("heartbeat", fields, seq, signer=sa, keyed=keyed)
        return
    assert encode_fast("heartbeat", fields, seq, signer=sa, keyed=keyed) == want
