"""Issue 23 item 6: a bridge restarted after the wall clock went back is not locked out.

The module accepts a signed frame only if its timestamp is greater than the last it
accepted on that link (SPEC 14.1). The rule the host keeps (MAVLink 2's, docs/pairing.md
"Replay"): its timestamps never repeat or go back, across restarts too, whatever the
clock does; a refusal for a stale timestamp is said to be that (clock went back), not
a bad key, and the bridge recovers by jumping ahead.

The end-to-end tests run the real firmware (MicroPython, sim board) on a pty and the
bridge's :class:`ModuleLink`, with the signers' clock shifted back an hour for the
second run. The property test's oracle is the spec's rule, checked over the
timestamps put on the wire, not the code's own arithmetic.
"""

from __future__ import annotations

import logging
import os
import threading

import pytest
from e2e_helpers import wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.firmware_host.sign_host import TS_PER_S
from modbridge.link import session
from modbridge.link import stamps as S
from modbridge.link.keys import KeyStore
from modbridge.link.session import ModuleLink
from protocol import sign

HOUR = 3600 * TS_PER_S
REPAIR_WORDS = ("pair --force", "is not its secret", "re-pair the module")


@pytest.fixture(autouse=True)
def no_leaked_links():
    yield
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("modbridge-link")],
        5, "link threads to end",
    )  # fmt: skip


# ----------------------------------------------------------------------------- the file


def test_reservation_is_kept_ahead_and_settled_at_a_clean_stop(tmp_path):
    p = tmp_path / "ab.ts"
    r = S.Reservation(p, window=1000)
    assert r.load() == 0 and not p.exists()
    assert r.reserve(5000) == 6000 and S.read_stamp(p) == 6000
    assert r.reserve(5500) == 6000 and r.writes == 1  # inside the window: no write
    assert r.reserve(6001) == 7001 and r.writes == 2
    r.settle(6100)
    assert S.read_stamp(p) == 6100
    assert oct(os.stat(p).st_mode & 0o777) == "0o600"
    assert S.Reservation(p).load() == 6100


@pytest.mark.parametrize(
    "content", [b"", b"garbage\n", b"-5\n", b"1" * 40, b"\xff\xfe", b"12 34\n", b"9" * 15 + b"\n"]
)
def test_a_corrupt_stamp_file_is_warned_about_and_the_clock_is_used(tmp_path, caplog, content):
    p = tmp_path / "ab.ts"
    p.write_bytes(content)
    caplog.set_level(logging.WARNING, logger="modbridge.link.stamps")
    r = S.Reservation(p, window=100)
    assert r.load() == 0
    assert any("continue from this host's clock" in m for m in caplog.messages), caplog.messages
    assert r.reserve(42) == 142 and S.read_stamp(p) == 142  # rewritten at the next one


def test_a_symlink_or_a_directory_is_not_read_and_a_failed_write_never_raises(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="modbridge.link.stamps")
    target = tmp_path / "elsewhere"
    target.write_text("99999999\n")
    (tmp_path / "ln.ts").symlink_to(target)
    assert S.Reservation(tmp_path / "ln.ts").load() == 0
    (tmp_path / "dir.ts").mkdir()
    r = S.Reservation(tmp_path / "dir.ts", window=10)
    assert r.load() == 0
    assert r.reserve(5) == 15  # the write fails (a directory is in the way): warned
    assert r.write_failures == 1 and "cannot keep the signing timestamp" in r.error
    assert target.read_text() == "99999999\n"
    assert len(caplog.messages) == 3


class _Crash(Exception):
    pass


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(
        st.tuples(
            st.lists(st.integers(-2 * HOUR, 2 * HOUR), min_size=1, max_size=12),  # clock steps
            st.integers(0, 12),  # frames signed before the run ends
            st.booleans(),  # a clean stop (settle) or a crash
        ),
        min_size=1,
        max_size=6,
    ),
    window=st.integers(1, 120 * TS_PER_S),
)
def test_timestamps_never_repeat_or_go_back_across_restarts_and_crashes(tmp_path_factory, runs,
                                                                        window):  # fmt: skip
    """The spec's rule over every timestamp put on the wire by successive processes,
    each with a clock that may jump back or forward, ending cleanly or by a crash at
    any frame: strictly increasing (the oracle is only that, SPEC 14.1)."""
    path = tmp_path_factory.mktemp("ts") / "m.ts"
    wire: list[int] = []
    now = 500 * HOUR
    for steps, frames, clean in runs:
        clock_vals = iter(steps * (frames // len(steps) + 1))

        def clock(vals=clock_vals):
            nonlocal now
            now = max(0, now + next(vals))
            return now

        res = S.Reservation(path, window=window)
        signer = sign.Signer(bytes(32), clock=clock, reserve=res.reserve)
        signer.last_ts = res.load()
        for _ in range(frames):
            wire.append(signer.next_ts())
        if clean:
            res.settle(signer.last_ts)
    assert all(a < b for a, b in zip(wire, wire[1:], strict=False)), wire


# ----------------------------------------------------------------------------- real firmware


@pytest.fixture
def vm(tmp_path):
    runner = pytest.importorskip("modbridge.sim.runner")
    from modbridge.sim import World, load_params

    world = World(load_params("default"), seed=7)
    world.set_duties(19661, 19661)
    world.equilibrate()
    store = KeyStore(tmp_path / "keys")
    m = runner.VirtualModule(world, tmp_path / "vm", speed=2.0, seed=7,
                             port_symlink=tmp_path / "mod0", keys=store)  # fmt: skip
    m.start()
    m.test_store = store
    try:
        yield m
    finally:
        m.stop()


def _run_until_hosted(vm, tmp_path, timeout=30):
    link = ModuleLink(str(tmp_path / "mod0"), keys=vm.test_store, heartbeat_period_s=0.2).start()
    try:
        assert link.wait_up(30)
        wait_for(lambda: link.status.state == "HOSTED", timeout, "the module HOSTED")
        # a command that changes state, signed: accepted too
        assert link.request("setpoints", {"sp_gpu": 65000}).name == "ack"
    finally:
        link.stop()
    return link


def _shift_clock(monkeypatch, by):
    real = session._signer_clock
    monkeypatch.setattr(session, "_signer_clock", lambda: real() + by)


def _hosted_immediately(vm, tmp_path):
    """A link that sees the module HOSTED before it refused a single heartbeat."""
    link = ModuleLink(str(tmp_path / "mod0"), keys=vm.test_store, heartbeat_period_s=0.2).start()
    try:
        assert link.wait_up(30)
        wait_for(lambda: link.status.state == "HOSTED", 30, "the module HOSTED")
        assert link.request("setpoints", {"sp_gpu": 66000}).name == "ack"
        return link
    finally:
        link.stop()


def test_a_bridge_restarted_with_the_clock_an_hour_back_is_accepted_at_once(
    vm, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING)
    first = _run_until_hosted(vm, tmp_path)
    assert first.auth_refusals == 0
    ts_file = vm.test_store.path(vm.uid.hex()).with_suffix(".ts")
    kept = S.read_stamp(ts_file) if ts_file.exists() else None
    _shift_clock(monkeypatch, -HOUR)  # NTP stepped the wall clock back an hour
    second = _hosted_immediately(vm, tmp_path)
    assert second.auth_refusals == 0
    assert not [m for m in caplog.messages if any(w in m for w in REPAIR_WORDS)], caplog.messages
    assert second.ts_jumps == 0
    assert kept is not None and kept == first._last_ts  # settled at the clean stop


def test_a_crashed_bridge_continues_above_its_reservation(vm, tmp_path, monkeypatch, caplog):
    """No clean stop (SIGKILL): the reservation on disk is above every timestamp used."""
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(session.ModuleLink, "_settle_stamps", lambda self: None)
    _run_until_hosted(vm, tmp_path)
    monkeypatch.undo()
    _shift_clock(monkeypatch, -HOUR)
    second = _hosted_immediately(vm, tmp_path)
    assert second.auth_refusals == 0 and second.ts_jumps == 0
    assert not [m for m in caplog.messages if any(w in m for w in REPAIR_WORDS)], caplog.messages


@pytest.mark.parametrize("damage", ["lost", "corrupt"])
def test_without_the_kept_timestamp_the_bridge_jumps_ahead_and_says_why(
    vm, tmp_path, monkeypatch, caplog, damage
):
    """The file is lost or corrupt: the module refuses the first timestamps as stale;
    the warning says the clock went back (not a bad key) and the bridge jumps ahead
    until HOSTED; a signed command gets through the same way."""
    caplog.set_level(logging.WARNING)
    _run_until_hosted(vm, tmp_path)
    ts_file = vm.test_store.path(vm.uid.hex()).with_suffix(".ts")
    if damage == "lost":
        ts_file.unlink()
    else:
        ts_file.write_bytes(b"\x00garbage")
    _shift_clock(monkeypatch, -HOUR)
    link = ModuleLink(str(tmp_path / "mod0"), keys=vm.test_store, heartbeat_period_s=0.2).start()
    try:
        assert link.wait_up(30)
        assert link.request("setpoints", {"sp_gpu": 64000}).name == "ack"  # jumps itself
        wait_for(lambda: link.status.state == "HOSTED", 30, "the module HOSTED")
        assert link.ts_jumps >= 1
    finally:
        link.stop()
    msgs = caplog.messages
    assert any("clock went back" in m and "no need to re-pair" in m for m in msgs), msgs
    assert not [m for m in msgs if any(w in m for w in REPAIR_WORDS)], msgs
    if damage == "corrupt":
        assert any("does not hold a timestamp" in m for m in msgs), msgs
    assert (S.read_stamp(ts_file) or 0) >= link._last_ts  # kept again


def test_a_bad_key_is_still_reported_as_a_bad_key(vm, tmp_path, caplog):
    """The stale-timestamp path does not swallow the real thing."""
    caplog.set_level(logging.WARNING)
    path = vm.test_store.path(vm.uid.hex())
    path.write_bytes(os.urandom(32))
    link = ModuleLink(str(tmp_path / "mod0"), keys=vm.test_store, heartbeat_period_s=0.2).start()
    try:
        assert link.wait_up(30)
        wait_for(lambda: any("is not its secret" in m for m in caplog.messages), 30,
                 "the bad-key warning")  # fmt: skip
        assert link.ts_jumps == 0
    finally:
        link.stop()
