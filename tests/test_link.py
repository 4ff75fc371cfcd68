"""The serial link: handshake, telemetry, events, heartbeats, requests, garbage,
unplug/replug, exclusive open, error mapping, CPU cost and the fast decoder.

Most tests run a :class:`ptypeer.PtyPeer` (a fake module on a real pty) against a
real :class:`ModuleLink` with pyserial; every wait is bounded. The CPU-cost test uses a
scripted serial port and a fake clock, so it counts calls instead of timing them.
"""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
import serial
from ptypeer import DEFAULT_TELEMETRY, DEFAULT_UID, PtyPeer, hello_fields

from modbridge.link import session as L
from modbridge.link.io import LinkIO
from modbridge.link.requests import timeout_scale
from modbridge.link.session import (
    BadRequest,
    CommandRefused,
    HostDecoder,
    LinkDown,
    LinkError,
    ModuleLink,
    PortBusy,
    PortNotFound,
    PortPermissionDenied,
    RequestTimeout,
)
from modbridge.model import ModuleStatus
from protocol import catalog as C
from protocol import sign
from protocol.frame import StreamDecoder, encode_frame

REPO = Path(__file__).resolve().parent.parent
# upper bound of every wait on real time: a loaded machine runs the peer and the link's
# thread late, so $MODBRIDGE_TIMEOUT_SCALE (conftest: 4) stretches it
WAIT = 5.0 * timeout_scale()


@pytest.fixture(autouse=True)
def no_leaked_threads():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        extra = [
            t
            for t in set(threading.enumerate()) - before
            if t.is_alive() and t.name.startswith(("modbridge-link", "ptypeer"))
        ]
        if not extra:
            return
        time.sleep(0.02)
    pytest.fail(f"threads left running: {extra}")


@pytest.fixture
def links():
    """Start links through this; all are stopped at the end of the test."""
    made = []

    def make(port, **kw):
        kw.setdefault("heartbeat_period_s", 0.1)
        link = ModuleLink(str(port), **kw)
        made.append(link)
        return link

    yield make
    for link in made:
        link.stop()


def wait_for(pred, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


# ----------------------------------------------------------------------------- handshake


def test_handshake_fills_status(links):
    uid = "a1b2c3d4e5f6a7b8c9d0e1f2"
    with PtyPeer(uid=uid, fw_version="1.2.3", board="blackpill_f411") as peer:
        status = ModuleStatus(port=peer.path)
        link = links(peer.path, status=status).start()
        assert link.wait_up(WAIT)
        assert link.status is status
        assert status.link_up is True
        assert status.module_id == "a1b2c3d4e5f6a7b8c9d0e1f2"
        assert status.fw_version == "1.2.3"
        assert status.board == "blackpill_f411"
        assert status.channels == ("gpu", "vram", "mos", "amb")
        assert status.fans == 2
        assert status.proto_version == "1.0"
        assert status.connected_at is not None and status.last_error is None
        assert link.max_frame == 512
        assert peer.hello_requests == 1
        # the handshake started with a flush byte, then hello_request
        first = peer.received[0]
        assert first.ok and first.name == "hello_request"
        assert status.reconnects == 0 and status.module_resets == 0
        link.stop()
        assert status.link_up is False and link.state == L.STOPPED


def test_hello_retried_until_the_module_answers(links):
    with PtyPeer(answer_hello=False) as peer:
        link = links(peer.path, hello_timeout_s=0.05).start()
        assert wait_for(lambda: peer.hello_requests >= L.HELLO_TRIES + 1)
        assert link.state == L.HANDSHAKE and not link.status.link_up
        assert "no hello from the module" in link.status.last_error
        assert "firmware running" in link.status.last_error
        with pytest.raises(LinkDown, match="no hello"):
            link.request("config_save")
        peer.answer_hello = True
        assert link.wait_up(WAIT)
        assert link.status.last_error is None


def test_version_mismatch_reported_and_link_stays_down(links):
    with PtyPeer(major=2, minor=3) as peer:
        link = links(peer.path, heartbeat_period_s=0.02).start()
        assert link.wait_state(lambda lk: lk.state == L.INCOMPATIBLE, WAIT)
        err = link.status.last_error
        assert "module speaks protocol 2.3, modbridge speaks 1.x" in err
        assert "upgrade modbridge or reflash the module" in err
        assert "\n" not in err
        assert link.status.link_up is False
        assert link.status.frame_errors["version"] >= 1
        peer.send("telemetry", peer.telemetry)  # refused frames keep being counted
        assert wait_for(lambda: link.status.frame_errors["version"] >= 2)
        with pytest.raises(LinkDown, match="speaks protocol 2.3"):
            link.request("config_save")
        time.sleep(0.3)  # 15 heartbeat periods: none may go to this module
        assert peer.commands("heartbeat") == []
        assert link.status.telemetry == {}
        assert link.status.module_id is None


def test_incompatible_module_reflashed_comes_up(links):
    with PtyPeer(major=2) as peer:
        link = links(peer.path).start()
        assert link.wait_state(lambda lk: lk.state == L.INCOMPATIBLE, WAIT)
        peer.major = 1  # reflashed: it boots and says hello in version 1
        peer.boot()
        assert link.wait_up(WAIT)
        assert link.status.last_error is None
        assert link.status.module_id == peer.uid


def test_module_refusing_our_version_is_incompatible(links):
    with PtyPeer(answer_hello=False) as peer:
        link = links(peer.path).start()
        assert wait_for(lambda: peer.hello_requests >= 1)
        req = peer.commands("hello_request")[0]
        peer.send("nack", {"ref": req.seq, "ref_type": req.type, "code": C.ERR_VERSION})
        assert link.wait_state(lambda lk: lk.state == L.INCOMPATIBLE, WAIT)
        assert "module refused protocol 1.0" in link.status.last_error


# ----------------------------------------------------------------------------- receive


def test_telemetry_updates_status_in_base_units(links):
    got = []
    with PtyPeer() as peer:
        link = links(peer.path, on_telemetry=lambda st, msg: got.append((st, msg))).start()
        assert link.wait_up(WAIT)
        tm = dict(peer.telemetry)
        tm.update(temp_gpu=72300, v_in=11920, i_in=-1500, p_in=180000, fan1_duty=65535)
        tm["state"] = C.STATE_FAILSAFE
        tm["reason"] = C.REASON_FAN_STALL
        tm["faults"] = C.FAULT_FAN2_STALL | C.FAULT_NTC_AMB | (1 << 30)  # unknown bit
        del tm["temp_amb"]  # a faulted sensor's field is absent
        peer.send("telemetry", tm)
        assert wait_for(lambda: len(got) == 1)
        st = link.status
        assert st.telemetry == tm
        assert st.temperature_c("gpu") == pytest.approx(72.3)
        assert st.temperature_c("amb") is None
        assert st.v_in_v == pytest.approx(11.92)
        assert st.i_in_a == pytest.approx(-1.5)
        assert st.p_in_w == pytest.approx(180.0)
        assert st.fan_duty_ratio(1) == 1.0
        assert st.fan_rpm(2) == 2900
        assert st.state == "FAILSAFE" and st.reason == "fan_stall"
        assert st.fault_names() == ["ntc_amb", "fan2_stall"]
        assert st.stalled_fans() == 1
        assert st.telemetry_at is not None and st.telemetry_at == st.last_frame_at
        assert st.frames_total >= 2  # hello + telemetry
        assert got[0][0] is st and got[0][1].name == "telemetry"
        assert json.loads(json.dumps(st.as_dict()))["temp_gpu_c"] == 72.3


def test_events_counted_by_reason_and_bounded(links):
    seen = []
    with PtyPeer() as peer:
        link = links(peer.path, on_event=lambda st, msg: seen.append(msg)).start()
        assert link.wait_up(WAIT)
        peer.send("event", {"code": C.REASON_FAN_STALL, "severity": C.SEV_ALARM, "index": 1})
        peer.send("event", {"code": C.REASON_FAN_STALL, "severity": C.SEV_ALARM, "index": 2})
        peer.send("event", {"code": 200, "severity": C.SEV_INFO})  # a newer minor's code
        for _ in range(L.RECENT_EVENTS):
            peer.send("event", {"code": C.REASON_OVER_TEMP, "severity": C.SEV_WARNING})
        n = 3 + L.RECENT_EVENTS
        assert wait_for(lambda: len(seen) == n)
        st = link.status
        assert st.events_total["fan_stall"] == 2
        assert st.events_total["200"] == 1
        assert st.events_total["over_temp"] == L.RECENT_EVENTS
        assert len(st.recent_events) == L.RECENT_EVENTS
        assert st.recent_events[-1]["reason"] == "over_temp"
        assert st.recent_events[-1]["severity"] == C.SEV_WARNING


def test_garbage_is_counted_by_kind_and_the_link_continues(links):
    with PtyPeer() as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        good = encode_frame("telemetry", peer.telemetry, 1)
        bad_crc = bytearray(good)
        bad_crc[3] ^= 0x40
        peer.send_raw(b"Traceback (most recent call last):\r\n")  # noise
        peer.send_raw(bytes(bad_crc))  # crc
        peer.send_raw(b"\x05\x01\x02\x00")  # framing (too short)
        peer.send_raw(b"\x02\x01" + b"\x07" * 700 + b"\x00")  # oversize
        peer.send_raw(encode_frame("heartbeat", {"gpu_temp": 1}, 2))  # wrong direction
        peer.send_raw(b'{"type":"telemetry","v":"1.0","seq":3,"state":"BOOT"}\n')
        assert wait_for(lambda: link.status.telemetry.get("state") == C.STATE_BOOT)
        fe = link.status.frame_errors
        assert fe["noise"] == 1
        assert fe["crc"] == 1
        assert fe["framing"] == 1
        assert fe["oversize"] == 1
        assert fe["invalid"] == 1
        peer.send("telemetry", peer.telemetry)
        assert wait_for(lambda: link.status.telemetry.get("state") == C.STATE_HOSTED)
        assert link.status.link_up


def test_module_reset_rereads_identity_and_is_counted(links):
    with PtyPeer(fw_version="1.0.0") as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        peer.fw_version = "1.1.0"  # reflashed and reset
        peer.boot()  # banner + unsolicited hello
        assert wait_for(lambda: link.status.fw_version == "1.1.0")
        assert link.status.module_resets == 1
        peer.send("hello", peer.hello_fields())  # hello without banner: also a reset
        assert wait_for(lambda: link.status.module_resets == 2)
        assert link.status.link_up
        # a solicited hello is no reset
        assert link.request("hello_request").name == "hello"
        assert link.status.module_resets == 2


# ----------------------------------------------------------------------------- heartbeats


def test_heartbeats_at_the_period_with_the_source_values(links):
    values = {"gpu_temp": 71500, "gpu_power": 312000, "power_limit": 350000, "gpu_mem_temp": None}
    with PtyPeer() as peer:
        link = links(peer.path, heartbeat_period_s=0.1, heartbeat_source=lambda: values).start()
        assert link.wait_up(WAIT)
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 8)
        hbs = list(peer.heartbeats)
        for _, f in hbs:
            assert f["gpu_temp"] == 71500
            assert f["gpu_power"] == 312000
            assert f["power_limit"] == 350000
            assert "gpu_mem_temp" not in f  # None: omitted
            assert f["period_ms"] == 100
            assert abs(f["host_time"] - time.time()) < 60
        times = [t for t, _ in hbs]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        mean = sum(gaps) / len(gaps)
        # never faster than the period (the next send is the next grid point after now,
        # no catch-up burst); how much slower a loaded machine makes it is not a
        # property of the link: the grid itself is checked without a clock in
        # test_heartbeats_are_on_a_common_grid
        assert mean > 0.08, gaps
        assert link.heartbeats_sent >= len(hbs)


def test_heartbeat_survives_a_broken_source_and_bad_values(links):
    calls = []

    def source():
        calls.append(1)
        if len(calls) % 2:
            raise RuntimeError("NVML went away")
        return {"gpu_temp": 999_999_999, "gpu_power": 250_000.4, "period_ms": 100}

    with PtyPeer() as peer:
        link = links(peer.path, heartbeat_period_s=0.05, heartbeat_source=source).start()
        assert link.wait_up(WAIT)
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 4)
        fields = [f for _, f in peer.heartbeats]
        assert {"host_time", "period_ms"} <= set(fields[0])  # failing source: still alive
        assert any(f.get("gpu_power") == 250000 for f in fields)  # rounded to wire int
        assert all("gpu_temp" not in f for f in fields)  # out of range: dropped


# ----------------------------------------------------------------------------- requests


def test_request_ack(links):
    with PtyPeer() as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        reply = link.request("fan_mode", {"mode": 1, "duty1": 30000, "duty2": 30000})
        assert reply.name == "ack"
        cmd = peer.commands("fan_mode")[0]
        assert reply.fields == {"ref": cmd.seq, "ref_type": cmd.type}
        assert cmd.fields == {"mode": 1, "duty1": 30000, "duty2": 30000}


def test_request_nack_raises_with_code(links):
    rules = {"setpoints": (C.ERR_OUT_OF_RANGE, "sp_gpu", "sp_gpu above the critical limit")}
    with PtyPeer(nack_rules=rules) as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        with pytest.raises(CommandRefused) as ei:
            link.request("setpoints", {"sp_gpu": 100000})
        e = ei.value
        assert isinstance(e, LinkError)
        assert e.code == C.ERR_OUT_OF_RANGE and e.code_name == "out_of_range"
        assert e.field == "sp_gpu" and e.text == "sp_gpu above the critical limit"
        assert str(e) == (
            f"{peer.path}: module refused setpoints: out_of_range (sp_gpu): "
            "sp_gpu above the critical limit"
        )
        assert link.status.link_up  # a nack is an answer, not a link problem


def test_requests_answered_by_data_and_concurrent(links):
    replies = {
        "config_get": ("config", {"values": {"fan.min_duty": 0.2}, "version": 3}),
        "selftest": ("selftest_report", {"passed": True, "text": "ok"}),
    }
    with PtyPeer(replies=replies) as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        assert link.request("config_get").fields["values"] == {"fan.min_duty": 0.2}
        report = link.request("selftest", timeout=WAIT)
        assert report.name == "selftest_report" and report.fields["passed"] is True
        out, errs = [], []

        def worker():
            try:
                for _ in range(10):
                    out.append(link.request("config_save").name)
            except Exception as e:  # noqa: BLE001
                errs.append(e)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert errs == [] and out == ["ack"] * 40


def test_request_errors(links):
    with PtyPeer() as peer:
        link = links(peer.path)
        with pytest.raises(LinkDown, match="cannot send config_save"):
            link.request("config_save")
        link.start()
        assert link.wait_up(WAIT)
        with pytest.raises(BadRequest, match="sp_gpu"):
            link.request("setpoints", {"sp_gpu": 5})
        with pytest.raises(BadRequest, match="not a request"):
            link.request("telemetry", {"state": 1})
        with pytest.raises(BadRequest, match="unknown message type"):
            link.request("make_coffee")
        peer.answer_hello = False
        with pytest.raises(RequestTimeout, match="no answer to hello_request within 0.2 s"):
            link.request("hello_request", timeout=0.2)


def test_pending_request_fails_fast_on_unplug(links, tmp_path):
    with PtyPeer(symlink=tmp_path / "mod", ignore={"config_get"}) as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        result = []

        def ask():
            try:
                link.request("config_get", timeout=WAIT)
            except LinkError as e:
                result.append(e)

        t = threading.Thread(target=ask)
        t.start()
        assert peer.wait_for(lambda: peer.commands("config_get"))
        t0 = time.monotonic()
        peer.unplug()
        t.join(WAIT)
        assert result and isinstance(result[0], LinkDown), result
        assert time.monotonic() - t0 < WAIT / 2  # not the request's timeout (WAIT)


# ----------------------------------------------------------------------------- unplug


def test_unplug_and_replug_through_a_symlink(links, tmp_path):
    port = tmp_path / "gpu-module-0"
    with PtyPeer(symlink=port, telemetry_period_s=0.05) as peer:
        link = links(port, heartbeat_period_s=0.05).start()
        assert link.wait_up(WAIT)
        first_pty = peer.port
        uid = link.status.module_id
        assert wait_for(lambda: link.status.telemetry_at is not None)

        peer.unplug()
        assert link.wait_state(lambda lk: not lk.status.link_up, 2.0)
        assert link.state == L.DOWN
        assert "link lost" in link.status.last_error
        age = link.status.last_frame_age_s()
        time.sleep(0.3)  # several reopen attempts fail (the symlink is gone)
        assert link.status.last_frame_age_s() > age  # grows while down
        assert not link.status.link_up
        assert "no such port" in link.status.last_error

        n_hb = len(peer.heartbeats)
        peer.replug()
        assert peer.port != first_pty or os.path.realpath(port) == peer.port
        assert link.wait_up(WAIT)
        st = link.status
        assert st.module_id == uid
        assert st.reconnects == 1
        assert st.last_error is None
        assert peer.wait_for(lambda: len(peer.heartbeats) > n_hb)
        assert wait_for(lambda: st.last_frame_age_s() < 0.5)
        assert st.module_resets == 0  # an unplug is not a module reset


def test_backoff_doubles_to_the_cap_with_jitter_and_resets(links):
    link = links("/nonexistent")
    link._backoff = L.Backoff(rng=random.Random(1))
    delays = [link._backoff.next() for _ in range(10)]
    nominal = [min(0.1 * 2**i, 5.0) for i in range(10)]
    for d, n in zip(delays, nominal, strict=True):
        assert n * 0.8 <= d <= min(n * 1.2, 5.0), (d, n)
    assert len({round(d, 6) for d in delays}) > 5  # jittered, not lockstep
    link._on_hello(L.Message(C.T_HELLO, "hello", 0, hello_fields()), now=0.0)  # success
    assert link._backoff.current == L.BACKOFF_MIN_S


def test_a_failed_open_is_retried_at_the_backoff_deadline_not_by_sleeping(links):
    """The I/O thread never sleeps for one link: a failed open sets the link's next
    open attempt (its deadline), the thread goes on serving the others."""
    link = links("/nonexistent", clock=lambda: 100.0)
    link._backoff = L.Backoff(rng=random.Random(2))
    assert not link._try_open()
    first = link._reopen_at - 100.0
    assert 0.08 <= first <= 0.12 and link._deadline() == link._reopen_at
    assert not link._try_open()
    assert 0.16 <= link._reopen_at - 100.0 <= 0.24  # doubled


def test_missing_port_is_retried_until_the_module_appears(links, tmp_path):
    port = tmp_path / "later"
    link = links(port).start()  # does not raise: the module may be plugged in later
    assert wait_for(lambda: link.status.last_error is not None)
    assert link.status.last_error == (
        f"{port}: no such port: is the module plugged in? `modbridge list` shows modules"
    )
    with PtyPeer(symlink=port):
        assert link.wait_up(WAIT)
        assert link.status.reconnects == 0


# ----------------------------------------------------------------------------- opening


def test_exclusive_open_second_link_fails_clearly(links):
    with PtyPeer() as peer:
        first = links(peer.path).start()
        assert first.wait_up(WAIT)
        second = links(peer.path)
        with pytest.raises(PortBusy) as ei:
            second.start()
        assert str(ei.value) == (
            f"{peer.path}: port in use by another program (another modbridge? mpremote?)"
        )
        assert second.status.last_error == str(ei.value)
        assert first.status.link_up
        # in the background the busy port is retried, never crashes the thread
        third = links(peer.path).start(fail_fast=False)
        assert wait_for(lambda: third.status.last_error == str(ei.value))
        assert not third.status.link_up


@pytest.mark.parametrize(
    "exc, cls, text",
    [
        (
            serial.SerialException(
                errno.EACCES, "could not open port /dev/ttyUSB0: [Errno 13] Permission denied"
            ),
            PortPermissionDenied,
            "add your user to the dialout group (sudo usermod -aG dialout $USER) and log in again",
        ),
        (PermissionError(errno.EACCES, "Permission denied"), PortPermissionDenied, "dialout"),
        (
            serial.SerialException(errno.EBUSY, "could not open port: Device or resource busy"),
            PortBusy,
            "port in use by another program (another modbridge? mpremote?)",
        ),
        (
            serial.SerialException(
                errno.ENOENT, "could not open port: [Errno 2] No such file or directory"
            ),
            PortNotFound,
            "no such port: is the module plugged in? `modbridge list` shows modules",
        ),
        (serial.SerialException("something odd"), LinkError, "cannot open: something odd"),
    ],
)
def test_open_errors_are_mapped(exc, cls, text):
    def open_fn(*a, **kw):
        raise exc

    with pytest.raises(cls) as ei:
        L.open_port("/dev/ttyUSB0", open_fn)
    assert type(ei.value) is cls
    msg = str(ei.value)
    assert msg.startswith("/dev/ttyUSB0: ") and text in msg and "\n" not in msg


def test_permission_denied_fails_fast(links):
    def open_fn(*a, **kw):
        raise serial.SerialException(errno.EACCES, "[Errno 13] Permission denied")

    link = links("/dev/ttyUSB7", open_fn=open_fn)
    with pytest.raises(PortPermissionDenied, match="dialout"):
        link.start()
    assert link._thread is None


def test_open_uses_exclusive_115200_and_a_short_timeout():
    seen = {}

    class Dummy:
        def __init__(self, port, baudrate, **kw):
            seen.update(port=port, baudrate=baudrate, **kw)

    L.open_port("/dev/x", Dummy)
    assert seen["baudrate"] == 115200 and seen["exclusive"] is True
    assert seen["timeout"] == 0 and seen["write_timeout"] > 0


# ----------------------------------------------------------------------------- cost


@pytest.mark.parametrize("telemetry_period_s", [None, 0.05])
def test_the_io_thread_wakes_for_data_and_deadlines_only(links, telemetry_period_s):
    """No poll: the I/O thread wakes when bytes arrive (one read for what is waiting)
    and at deadlines (heartbeats), whether the module is silent or sends 20 Hz
    telemetry. Counted, not timed."""
    with PtyPeer(telemetry_period_s=telemetry_period_s) as peer:
        link = links(peer.path, heartbeat_period_s=0.2).start()
        assert link.wait_up(WAIT)
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 2)
        io = link._io
        it0, hb0 = io.iterations, link.heartbeats_sent
        fr0, rd0 = link.status.frames_total, link.reads
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 8, 2 * WAIT)
        wakes = io.iterations - it0
        beats = link.heartbeats_sent - hb0
        frames = link.status.frames_total - fr0
        reads = link.reads - rd0
    assert beats >= 5
    assert reads <= frames  # a read returns at least one frame's bytes (or several)
    assert wakes <= beats + reads + 3, (wakes, beats, reads)
    if telemetry_period_s:
        assert frames >= 10 and link.decoder.fast_frames >= frames
    else:
        assert frames == 0 and wakes <= beats + 3  # a silent module: heartbeats only


@pytest.mark.parametrize("poller", ["epoll", "selectors"])
def test_the_io_thread_serves_ports_through_either_poller(links, monkeypatch, poller):
    """The thread sleeps in epoll where there is one and in :mod:`selectors` (its
    fallback) elsewhere: both wake for frames and deadlines, and see an unplug."""
    from modbridge.link import io as link_io

    if poller == "selectors":
        monkeypatch.setattr(link_io, "_poller", link_io._Selectors)
    with PtyPeer(telemetry_period_s=0.05) as peer:
        link = links(peer.path, heartbeat_period_s=0.2).start()
        assert link.wait_up(WAIT)
        fr0 = link.status.frames_total
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 3)
        assert wait_for(lambda: link.status.frames_total >= fr0 + 5)
        assert type(link._io._fd_link) is dict and link in link._io._fd_link.values()
    assert wait_for(lambda: not link.status.link_up)  # the pty closed: the link knows


def test_heartbeats_are_on_a_common_grid():
    """Every link of one period sends on the same grid points (one wake-up for all)."""
    links_ = [ModuleLink(f"p{i}", heartbeat_period_s=0.5) for i in range(3)]
    for i, link in enumerate(links_):
        link._write = lambda frame: None
        link._send_heartbeat(100.0 + 0.1 * i)
    assert {link._next_hb for link in links_} == {100.5}
    links_[0]._send_heartbeat(100.5)
    assert links_[0]._next_hb == 101.0


def test_a_module_that_does_not_read_gets_no_heartbeat_that_would_block():
    """A full output queue (the module hung, a pty nobody reads): the heartbeat is held
    back instead of a write that would stall the shared I/O thread."""

    class Stuck:
        out_waiting = 4096

        def write(self, data):
            raise AssertionError("a write to a module that does not read")

    link = ModuleLink("stuck", heartbeat_period_s=1.0)
    link._ser = Stuck()
    link._send_heartbeat(10.0)
    assert (link.heartbeats_sent, link.heartbeats_skipped) == (0, 1)
    assert link._next_hb == 11.0 and link._flush_next
    link._ser.out_waiting = 0
    written = []
    link._ser.write = written.append
    link._send_heartbeat(11.0)
    assert link.heartbeats_sent == 1 and written[0].startswith(b"\x00")  # flushed first


def test_the_output_queue_is_read_as_pyserial_reads_it():
    """_out_queued (one ioctl on the fd, every heartbeat) says what pyserial's
    out_waiting says, with nothing queued and with bytes unread. A pty hands written
    bytes to its master at once (its queue reads 0), so the fd here is a socket's, for
    which Linux answers the same ioctl (SIOCOUTQ is TIOCOUTQ) with what is unread."""
    import socket

    import serial

    a, b = socket.socketpair()
    with a, b:

        class Port:  # what pyserial's out_waiting reads of a Serial: its fd
            fd = a.fileno()

        link = ModuleLink("sock", heartbeat_period_s=1.0)
        link._ser, link._fd = Port(), a.fileno()
        seen = []
        for chunk in (b"", b"x" * 300, b"y" * 2000):
            a.send(chunk)
            seen.append(link._out_queued())
            assert seen[-1] == serial.Serial.out_waiting.fget(Port())
        assert seen[0] == 0 < seen[1] < seen[2]


def test_an_answer_is_read_when_it_arrives(links):
    """A request's answer wakes the I/O thread (no fast poll needed): with heartbeats
    10 s apart the link has no deadline for seconds, and the answer is still read."""
    with PtyPeer() as peer:
        link = links(peer.path, heartbeat_period_s=10.0).start()
        assert link.wait_up(WAIT)
        it0 = link._io.iterations
        assert link.request("config_save", timeout=WAIT).name == "ack"
        assert link._io.iterations - it0 <= 3  # the answer's bytes, maybe split


# ----------------------------------------------------------------------------- decoder


def _items(decoder, data):
    out = []
    for it in decoder.feed(data):
        if it.ok:
            # repr: NaN inside a list must compare equal to itself
            out.append(("msg", it.type, it.name, it.seq, repr(it.fields), it.minor, it.fmt))
        elif isinstance(it, L.Banner):
            out.append(("banner", it.fw_version))
        else:
            out.append(("bad", it.kind, it.code, it.type, it.seq, it.field))
    return out


def _strip_banners(items):
    return [i for i in items if i[0] != "banner"]


def _vector_frames():
    data = json.loads((REPO / "protocol" / "vectors" / "v1.json").read_text())
    frames = []

    def walk(obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k in ("wire", "frame", "encoded", "hex") and isinstance(v, str):
                    try:
                        frames.append(bytes.fromhex(v))
                    except ValueError:
                        pass
                else:
                    walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(data)
    return frames


def _d2h_frames():
    samples = [
        ("telemetry", {"state": 1, "temp_gpu": -55000, "p_in": 4000000, "faults": 2**32 - 1}),
        ("hello", hello_fields(telemetry_ms=100, ref=7)),
        ("event", {"code": 7, "severity": 2, "active": True, "text": "fan 2 stalled é"}),
        ("config", {"ref": 1, "values": {"a": 1.5, "b": [1, 2, {"c": -0.0}], "d": "x"}}),
        (
            "cal_raw",
            {
                "ref": 2,
                "channel": 0,
                "samples": 64,
                "raw_mean_x16": 1,
                "raw_min": 0,
                "raw_max": 65535,
                "temp": 25000,
            },
        ),
        ("nack", {"ref": 3, "ref_type": 48, "code": 6, "field": "duty1", "text": "too low"}),
        ("selftest_report", {"ref": 4, "passed": False, "fans_ok": [True, False]}),
    ]
    return [encode_frame(n, f, i * 1000) for i, (n, f) in enumerate(samples)]


def _random_value(rng, fdef=None):
    """A value near what a field allows, or of the wrong kind, or nested, or odd."""
    pick = rng.random()
    lo = fdef[C.F_LO] if fdef else None
    hi = fdef[C.F_HI] if fdef else None
    if pick < 0.45:
        edges = [0, -1, 1, 255, 256, 2**31, -(2**31) - 1, 2**64 - 1, -(2**64), 2**63]
        for b in (lo, hi):
            if b is not None:
                edges += [b - 1, b, b + 1]
        return rng.choice(edges) if rng.random() < 0.6 else rng.randint(-70000, 4100000)
    if pick < 0.55:
        return rng.random() < 0.5
    if pick < 0.7:
        n = rng.choice([0, 1, 5, 31, 32, 33, 64, 65, 96, 97])
        return "".join(rng.choice("abcé\u20ac") for _ in range(n))
    if pick < 0.78:
        return rng.choice([1.5, -0.0, 1e300, float("nan"), float("inf")])
    if pick < 0.86:
        return [_random_value(rng) for _ in range(rng.randint(0, 9))]
    if pick < 0.92:
        return {rng.choice(["a", "b", "cc"]): _random_value(rng) for _ in range(rng.randint(0, 3))}
    if pick < 0.96:
        return None
    return b"\x00\x01"


def _valid_value(rng, f):
    kind, lo, hi = f[C.F_KIND], f[C.F_LO], f[C.F_HI]
    if kind in (C.K_UINT, C.K_INT, C.K_ENUM):
        lo = lo if lo is not None else (0 if kind == C.K_UINT else -(2**31))
        hi = hi if hi is not None else 2**32 - 1
        return rng.choice([lo, hi, rng.randint(lo, hi)])
    if kind == C.K_BOOL:
        return rng.random() < 0.5
    n = rng.randint(lo or 0, min(hi if hi is not None else 8, 8))
    if kind == C.K_STR:
        return "".join(rng.choice("ab9_é") for _ in range(n))
    if kind == C.K_LIST:
        return [rng.choice([1, -5, True, "gpu", [1, 2]]) for _ in range(n)]
    if kind == C.K_MAP:
        return {f"k{i}": rng.choice([1, 2.5, "x", [1]]) for i in range(n)}
    if kind == C.K_NUM:
        return rng.choice([1, -2, 0.25, 1e-9])
    return b"\x01" * n


def _random_payloads(rng, n):
    """(type, CBOR payload) pairs with catalog-ish fields, valid or not, some with
    keys a newer minor would add; encoded by cbor2, so the CRC is right."""
    import cbor2

    d2h = [m for m in (C.by_type(t) for t in range(256)) if m and m[C.M_DIR] == C.D2H]
    out = []
    for _ in range(n):
        m = rng.choice(d2h)
        fields = {}
        for f in m[C.M_FIELDS]:
            if f[C.F_REQUIRED] or rng.random() < 0.5:
                odd = rng.random() < 0.1
                fields[f[C.F_KEY]] = _random_value(rng, f) if odd else _valid_value(rng, f)
        if rng.random() < 0.2:
            fields[rng.choice([40, 200, 70000])] = _random_value(rng)
        if rng.random() < 0.05:
            fields["x"] = 1
        try:
            out.append((m[C.M_TYPE], cbor2.dumps(fields)))
        except Exception:  # noqa: BLE001 - a value cbor2 cannot encode: skip it
            pass
    return out


def test_fast_decoder_agrees_with_the_reference():
    frames = _d2h_frames() + _vector_frames()
    assert len(frames) > 10
    rng = random.Random(1234)
    streams = [b"".join(frames)]
    for _ in range(3000):
        f = bytearray(rng.choice(frames))
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            i = rng.randrange(len(f))
            if op < 0.5:
                f[i] = rng.randrange(256)
            elif op < 0.7:
                del f[i]
            elif op < 0.85:
                f.insert(i, rng.randrange(256))
            else:
                f = f[: i + 1]
        streams.append(bytes(f) + b"\x00")
    # frames with a correct CRC but odd payloads (only the reference may decide those)
    from protocol.cobs import encode as cobs_encode
    from protocol.crc import crc16

    def framed(payload, type_id=C.T_TELEMETRY, major=1):
        raw = bytes([major, 0, type_id, 0, 9]) + payload
        c = crc16(raw)
        return cobs_encode(raw + bytes([c >> 8, c & 0xFF])) + b"\x00"

    odd_payloads = [
        b"\xa1\x01\x19\x00\x01",  # non-shortest head: accepted by both
        b"\xa1\x01\xc1\x01",  # tag
        b"\xa1\x01\xc2\x49\x01" + b"\x00" * 8,  # bignum tag
        b"\xa2\x01\x01\x01\x02",  # duplicate key
        b"\xa1\x01\x01\xff",  # trailing byte
        b"\xa2\x04\x01\x01\x01",  # unsorted keys
        b"\xa1\x01\xf7",  # undefined
        b"\xa1\x01\xf6",  # null
        b"\xa1\x01\xfa\x3f\x80\x00\x00",  # float32
        b"\xbf\x01\x01\xff",  # indefinite map
        b"\x81\x01",  # not a map
        b"\xa0",  # empty map
        b"",
    ]
    for p in odd_payloads:
        streams.append(framed(p))
    streams.append(framed(b"", type_id=C.T_HELLO_REQUEST))  # wrong direction
    streams.append(framed(b"", type_id=0xEE))  # unknown type
    streams.append(framed(b"\xa1\x01\x01", major=3))  # version
    streams.append(b"MODULER READY v1.0.0\r\n")
    streams += [framed(p, t) for t, p in _random_payloads(random.Random(99), 4000)]
    for s in streams:
        fast, ref = HostDecoder(), StreamDecoder(accept=C.D2H)
        a = _items(fast, s)
        b = _items(ref, s)
        assert _strip_banners(a) == b, s.hex()
        assert fast.errors == ref.errors and fast.frames == ref.frames
    assert _items(HostDecoder(), b"MODULER READY v1.0.0\r\n")[0] == ("banner", "1.0.0")
    d = HostDecoder()
    d.feed(framed(b"\xa1\x01\x01", major=3))
    assert d.peer_version == (3, 0)


def test_fast_decoder_is_cheaper(record_property):
    frame = encode_frame("telemetry", DEFAULT_TELEMETRY, 7)
    fast, ref = HostDecoder(), StreamDecoder(accept=C.D2H)
    n = 300

    def cost(dec):
        t = time.process_time()
        for _ in range(n):
            dec.feed(frame)
        return (time.process_time() - t) / n

    cost(fast), cost(ref)  # warm up
    f, r = min(cost(fast) for _ in range(3)), min(cost(ref) for _ in range(3))
    record_property("decode_us_fast", round(f * 1e6, 1))
    record_property("decode_us_reference", round(r * 1e6, 1))
    assert fast.fast_frames == 4 * n
    assert f < r  # not a benchmark: only that the fast path is in use and not slower


# ----------------------------------------------------------------------------- robustness


def test_callback_and_read_errors_never_kill_the_thread(links):
    def boom(st, msg):
        raise RuntimeError("callback bug")

    class Flaky:
        """A pyserial port whose first read raises something unexpected."""

        first = True

        def __init__(self, *a, **kw):
            self._s = serial.Serial(*a, **kw)

        def __getattr__(self, name):
            return getattr(self._s, name)

        @property
        def in_waiting(self):
            return self._s.in_waiting

        def read(self, n=1):
            if Flaky.first:
                Flaky.first = False
                raise ValueError("driver bug")
            return self._s.read(n)

    with PtyPeer(telemetry_period_s=0.05) as peer:
        link = links(peer.path, on_telemetry=boom, open_fn=Flaky).start()
        assert link.wait_up(WAIT)
        assert wait_for(lambda: link.status.frames_total > 5)
        assert link._thread.is_alive() and link.status.link_up
        assert link.status.reconnects == 1  # the unexpected error reopened the port


# ----------------------------------------------------------------------------- signing


@pytest.fixture
def store(tmp_path):
    from modbridge.link.keys import KeyStore

    return KeyStore(tmp_path / "keys")


def paired_peer(store, **kw):
    key = sign.new_key()
    store.save(DEFAULT_UID, key)
    return PtyPeer(nonce=True, key=key, **kw), key


def test_signed_heartbeats_and_commands_open_reads_unsigned(links, store):
    replies = {"config_get": ("config", {"values": {}, "version": 1})}
    peer, key = paired_peer(store, replies=replies)
    with peer:
        link = links(peer.path, keys=store).start()
        assert link.wait_up(WAIT)
        assert link.signing_supported and link.paired is True and link.nonce == peer.nonce
        assert link.key_error is None and link.status.last_error is None
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 3)
        assert link.request("fan_mode", {"mode": 1, "duty1": 30000}).name == "ack"
        assert link.request("config_get").name == "config"
        assert peer.refused == []
        by_name = {m.name: m for m in peer.commands()}
        assert by_name["heartbeat"].auth == sign.AUTH_OK and by_name["heartbeat"].link == 0
        assert by_name["fan_mode"].auth == sign.AUTH_OK
        assert by_name["config_get"].auth == sign.AUTH_NONE  # reads stay open
        assert by_name["hello_request"].auth == sign.AUTH_NONE


def test_timestamps_stay_in_order_under_concurrent_senders(links, store):
    peer, _ = paired_peer(store)
    with peer:
        link = links(peer.path, keys=store, heartbeat_period_s=0.01).start()
        assert link.wait_up(WAIT)
        errors = []

        def send(i):
            try:
                for _ in range(10):
                    link.request("fan_mode", {"mode": 0})
            except LinkError as e:  # pragma: no cover - the assertion below says
                errors.append(e)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == [] and peer.refused == []  # no frame arrived as a replay
        assert len(peer.commands("fan_mode")) == 40


def test_without_a_key_reads_work_commands_raise_heartbeats_withheld(links, store, caplog):
    replies = {"config_get": ("config", {"values": {}, "version": 1})}
    with PtyPeer(nonce=True, key=sign.new_key(), replies=replies) as peer:
        caplog.set_level("WARNING", logger="modbridge.link.session")
        link = links(peer.path, keys=store).start()
        assert link.wait_up(WAIT)
        assert link.request("config_get").name == "config"  # reads are open
        with pytest.raises(L.NotPaired) as e:
            link.request("fan_mode", {"mode": 0})
        # the module has a key (its hello says paired), this host's store has none
        want = f"module {DEFAULT_UID} is paired, but there is no key for it in {store.dir}"
        assert want in str(e.value) and f"modbridge pair {peer.path} --force" in str(e.value)
        assert wait_for(lambda: link.heartbeats_withheld >= 3)
        assert link.heartbeats_sent == 0 and peer.commands("heartbeat") == []
        assert peer.commands("fan_mode") == []  # never sent
        assert want in link.status.last_error and link.status.link_up
        peer.boot()  # a reset: logged once all the same
        assert wait_for(lambda: link.status.module_resets == 1)
        warned = [r for r in caplog.records if "no key for it" in r.getMessage()]
        assert len(warned) == 1 and "STANDALONE" in warned[0].getMessage()


def test_an_insecure_key_file_is_not_used_and_says_chmod(links, store):
    peer, _ = paired_peer(store)
    store.path(DEFAULT_UID).chmod(0o644)
    with peer:
        link = links(peer.path, keys=store).start()
        assert link.wait_up(WAIT)
        assert "chmod 600" in link.key_error and "chmod 600" in link.status.last_error
        with pytest.raises(L.NotPaired, match="chmod 600"):
            link.request("reboot")
        assert wait_for(lambda: link.heartbeats_withheld >= 2) and link.heartbeats_sent == 0


def test_a_wrong_key_is_an_unauthorized_error_that_says_pair_force(links, store):
    store.save(DEFAULT_UID, sign.new_key())
    with PtyPeer(nonce=True, key=sign.new_key()) as peer:
        link = links(peer.path, keys=store).start()
        assert link.wait_up(WAIT)
        with pytest.raises(L.Unauthorized) as ei:
            link.request("fan_mode", {"mode": 0})
        e = ei.value
        assert isinstance(e, CommandRefused) and e.code == C.ERR_UNAUTHORIZED
        msg = str(e)
        assert "refused fan_mode: unauthorized" in msg and "is not its secret" in msg
        assert f"modbridge pair --force {peer.path}" in msg and str(store.path(DEFAULT_UID)) in msg
        # refused heartbeats: one fresh hello (the nonce may be stale), then it says so
        assert wait_for(lambda: "refuses our signed heartbeats" in (link.status.last_error or ""))
        assert link.auth_refusals >= 3 and link.status.link_up


def test_module_reboot_new_nonce_is_signed_again(links, store):
    peer, _ = paired_peer(store)
    with peer:
        link = links(peer.path, keys=store).start()
        assert link.wait_up(WAIT)
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 2)
        first = peer.nonce
        for hello in (True, False):  # the boot hello arrives, or is lost
            peer.boot(hello=hello)
            assert wait_for(lambda: link.nonce == peer.nonce), (hello, link.nonce)
            n = len(peer.heartbeats)
            assert peer.wait_for(lambda n=n: len(peer.heartbeats) >= n + 3)
            assert link.request("fan_mode", {"mode": 0}).name == "ack"
        assert link.nonce != first and link.status.module_resets == 2
        # a heartbeat may have crossed the reset (signed over the old nonce): at most
        # one refused per reset, and no command
        assert [n for n, _ in peer.refused if n != "heartbeat"] == []
        assert len(peer.refused) <= 2, peer.refused


def test_a_lost_boot_hello_and_a_lost_answer_are_asked_for_again(links, store):
    peer, _ = paired_peer(store)
    with peer:
        link = links(peer.path, keys=store, hello_timeout_s=0.05).start()
        assert link.wait_up(WAIT)
        peer.answer_hello = False
        peer.boot(hello=False)  # banner only, and the first hello_request unanswered
        assert wait_for(lambda: link._nonce_stale)
        asked = peer.hello_requests
        with pytest.raises(L.LinkDown, match="new hello .* has not arrived"):
            link.request("reboot", timeout=0.2)
        n = len(peer.heartbeats)
        assert wait_for(lambda: peer.hello_requests >= asked + 2)  # asked again, bounded
        assert len(peer.heartbeats) == n  # nothing signed over a stale nonce meanwhile
        peer.answer_hello = True
        assert wait_for(lambda: link.nonce == peer.nonce and not link._nonce_stale)
        assert link.request("reboot").name == "ack"


def test_a_request_refused_over_a_stale_nonce_is_retried_once(links, store):
    peer, _ = paired_peer(store)
    with peer:
        link = links(peer.path, keys=store, heartbeat_period_s=30).start()
        assert link.wait_up(WAIT) and peer.wait_for(lambda: len(peer.heartbeats) == 1)
        peer.nonce = os.urandom(8)  # rebooted unseen (banner and hello lost)
        peer.verifier.set_nonce(peer.nonce)
        assert link.request("fan_mode", {"mode": 0}).name == "ack"
        assert [n for n, _ in peer.refused] == ["fan_mode"] and link.nonce == peer.nonce


def test_replug_rereads_the_nonce(links, store, tmp_path):
    peer, _ = paired_peer(store, symlink=tmp_path / "mod0")
    with peer:
        link = links(peer.path, keys=store).start()
        assert link.wait_up(WAIT)
        peer.unplug()
        assert link.wait_state(lambda lk: not lk.status.link_up, WAIT)
        peer.nonce = os.urandom(8)  # power came back with the plug: a new boot
        peer.verifier.set_nonce(peer.nonce)
        peer.replug()
        assert link.wait_up(WAIT) and wait_for(lambda: link.nonce == peer.nonce)
        n = len(peer.heartbeats)
        assert peer.wait_for(lambda: len(peer.heartbeats) >= n + 2)
        assert link.request("reboot").name == "ack"


def test_pairing_later_is_picked_up_at_the_next_hello(links, store):
    with PtyPeer(nonce=True, key=None) as peer:
        link = links(peer.path, keys=store).start()
        assert link.wait_up(WAIT) and link.key_error
        key = sign.new_key()
        peer.set_key(key)
        store.save(DEFAULT_UID, key)
        peer.boot()
        assert wait_for(lambda: link.key_error is None)
        assert link.status.last_error is None
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 2)


# ----------------------------------------------------------------------------- simulator


def test_against_the_virtual_module(links, tmp_path):
    """The real firmware (MicroPython, sim board) on the simulator's pty."""
    runner = pytest.importorskip("modbridge.sim.runner")
    from modbridge.sim import World, load_params

    world = World(load_params("default"), seed=3)
    world.set_duties(19661, 19661)
    world.equilibrate()
    vm = runner.VirtualModule(world, tmp_path / "vm", speed=1.0, port_symlink=tmp_path / "mod0")
    try:
        vm.start()
        hb = {"gpu_temp": 60000, "gpu_power": 250000}
        link = links(tmp_path / "mod0", heartbeat_period_s=0.2, heartbeat_source=lambda: hb)
        link.start()
        assert link.wait_up(30)
        st = link.status
        assert st.module_id == vm.uid.hex()
        assert st.board and st.fw_version and st.fans == 2
        assert wait_for(lambda: st.state == "HOSTED", 30), st.telemetry
        assert st.temperature_c("gpu") is not None
        assert link.request("config_get").name == "config"
        # signed: the virtual module was provisioned, its key found through the store
        assert link.signing_supported and link.paired and link.key_error is None
        assert link.request("setpoints", {"sp_gpu": 66000}).name == "ack"
        vm.unplug()
        assert link.wait_state(lambda lk: not lk.status.link_up, 5)
        vm.replug()
        assert link.wait_up(30)
        assert st.module_id == vm.uid.hex() and st.reconnects == 1
        # a reboot mid-run: a new nonce, signed again without a word from anyone
        nonce = link.nonce
        vm.mcu_reset()
        assert wait_for(lambda: link.nonce not in (None, nonce), 30), link.nonce
        assert link.nonce == vm.nonce
        assert link.request("setpoints", {"sp_gpu": 65000}).name == "ack"
        assert wait_for(lambda: st.state == "HOSTED", 30), st.telemetry
        assert link.auth_refusals <= 1  # at most a heartbeat that crossed the reset
    finally:
        vm.stop()


# ----------------------------------------------------------------------------- supervision


def _break_service(link, failures, exc=None):
    """Make the next ``failures`` service steps raise ``exc``; returns their times."""
    exc = exc if exc is not None else RuntimeError("service bug")
    real = link._service
    times = []

    def broken(*args):
        if len(times) < failures:
            times.append(time.monotonic())
            raise exc
        return real(*args)

    link._service = broken
    return times


def _errors(caplog, text="link thread failed"):
    return [r for r in caplog.records if r.levelname == "ERROR" and text in r.getMessage()]


def test_a_dead_link_thread_is_restarted_with_backoff_and_reported_once(links, caplog):
    with PtyPeer() as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        thread = link._thread
        with caplog.at_level("DEBUG", logger="modbridge.link.session"):
            times = _break_service(link, 4)
            assert wait_for(lambda: len(times) == 4, 2 * WAIT)
            assert wait_for(lambda: link.link_up)
        assert link._thread is thread and thread.is_alive()  # the loop, restarted
        assert (link.thread_restarts, link.thread_episodes) == (4, 1)
        assert link.thread_failing and link.thread_error == "RuntimeError: service bug"
        (err,) = _errors(caplog)  # one ERROR for the episode, with the traceback
        assert err.exc_info is not None and "service bug" in err.getMessage()
        # back-off doubles (jitter +-20 %)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        for i, gap in enumerate(gaps):
            assert gap >= L.THREAD_BACKOFF_MIN_S * 2**i * (1 - L.BACKOFF_JITTER) - 0.01
        assert gaps[0] < gaps[1] < gaps[2]
        assert link.status.reconnects == 4  # each restart reopened the port
        assert link.request("config_save").name == "ack"  # and it works again


def test_a_request_pending_when_the_thread_dies_fails_at_once(links):
    with PtyPeer(ignore=("selftest",)) as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        got = []

        def ask():
            try:
                link.request("selftest", timeout=WAIT)
            except LinkError as e:
                got.append(e)

        t = threading.Thread(target=ask)
        t.start()
        time.sleep(0.05)
        _break_service(link, 1)
        t.join(WAIT)
        assert got and isinstance(got[0], LinkDown), got


def test_a_new_episode_after_a_healthy_spell_is_reported_again(links, caplog, monkeypatch):
    monkeypatch.setattr(L, "THREAD_HEALTHY_S", 0.3)
    with PtyPeer() as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        with caplog.at_level("INFO", logger="modbridge.link.session"):
            times = _break_service(link, 1)
            assert wait_for(lambda: times and link.link_up)
            assert wait_for(lambda: not link.thread_failing)  # healthy for 0.3 s
            assert "link thread running again" in caplog.text
            times = _break_service(link, 1, KeyError("another bug"))
            # ``times`` fills before the step raises: wait for the failure's report
            # too (a loaded machine ran the count between the raise and the log)
            assert wait_for(lambda: times and len(_errors(caplog)) == 2 and link.link_up)
        assert (link.thread_restarts, link.thread_episodes) == (2, 2)
        assert len(_errors(caplog)) == 2
        assert link._thread_backoff == L.THREAD_BACKOFF_MIN_S  # reset per episode


@pytest.mark.parametrize("exc", [SystemExit(3), GeneratorExit(), KeyboardInterrupt()])
def test_even_a_base_exception_does_not_end_the_thread(links, exc):
    with PtyPeer() as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        times = _break_service(link, 2, exc)
        assert wait_for(lambda: len(times) == 2 and link.link_up)
        assert link._thread.is_alive() and link.thread_restarts == 2


def test_a_failure_in_the_lost_port_handler_is_restarted_too(links, caplog):
    """The old loop caught the service's exceptions, but one raised while handling
    them (here: in ``_lost``) ended the thread for good."""
    with PtyPeer() as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        real_lost = link._lost
        calls = []

        def lost(e):
            calls.append(e)
            if len(calls) == 1:
                raise RuntimeError("handler bug")
            real_lost(e)

        link._lost = lost
        _break_service(link, 1, serial.SerialException("gone"))
        assert wait_for(lambda: calls and link.link_up)
        assert link._thread.is_alive() and link.thread_restarts == 1
        assert "handler bug" in link.thread_error


def test_stop_during_the_restart_backoff_is_prompt(links, monkeypatch):
    monkeypatch.setattr(L, "THREAD_BACKOFF_MIN_S", 30.0)
    with PtyPeer() as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        times = _break_service(link, 1)
        assert wait_for(lambda: times)
        t0 = time.monotonic()
        link.stop()
        assert time.monotonic() - t0 < 2.0 * timeout_scale()  # not the 30 s backoff
        assert not link._thread.is_alive() and link.state == L.STOPPED


def test_a_crash_of_the_io_thread_itself_restarts_it_and_is_reported(links, caplog):
    """The selector loop (not one link's step) fails: the thread lives on, builds a
    fresh selector, every link is told, and the links still work."""
    with PtyPeer() as peer1, PtyPeer() as peer2:
        io = LinkIO(name="modbridge-link test-io")
        a = links(peer1.path, io=io).start()
        b = links(peer2.path, io=io).start()
        assert a.wait_up(WAIT) and b.wait_up(WAIT)
        assert a._thread is b._thread  # one thread for both
        real = io._timeout
        boom = [2]

        def broken(*args):
            if boom[0]:
                boom[0] -= 1
                raise RuntimeError("selector bug")
            return real(*args)

        with caplog.at_level("DEBUG", logger="modbridge.link.io"):
            io._timeout = broken
            io.wake()
            assert wait_for(lambda: io.restarts == 2)
        assert io.thread.is_alive() and io.episodes == 1 and io.failing
        assert "selector bug" in io.error
        assert [r for r in caplog.records if r.levelname == "ERROR" and "I/O thread failed"
                in r.getMessage()]  # fmt: skip
        # every link is told right after the count (the thread may be between the two)
        assert wait_for(lambda: a.thread_restarts == 2) and "selector bug" in a.thread_error
        assert a.request("config_save").name == "ack" and b.request("config_save").name == "ack"
        n = len(peer2.heartbeats)
        assert peer2.wait_for(lambda: len(peer2.heartbeats) > n)
        for link in (a, b):
            link.stop()
        io.stop()
        assert not io.thread.is_alive()


def test_one_failing_link_does_not_disturb_the_others_on_the_same_thread(links):
    with PtyPeer(telemetry_period_s=0.05) as peer1, PtyPeer(telemetry_period_s=0.05) as peer2:
        io = LinkIO(name="modbridge-link test-io")
        a = links(peer1.path, io=io).start()
        b = links(peer2.path, io=io).start()
        assert a.wait_up(WAIT) and b.wait_up(WAIT)
        times = _break_service(a, 3)
        frames = b.status.frames_total
        assert wait_for(lambda: len(times) == 3 and a.link_up)
        assert b.status.frames_total > frames and b.thread_restarts == 0
        assert b.status.reconnects == 0 and a.status.reconnects == 3
        for link in (a, b):
            link.stop()
        io.stop()


def test_silence_is_a_deadline_and_an_unplug_is_silent_after_the_debounce(links, tmp_path):
    """The hello's telemetry period gives the silence timeout; on_silent comes once,
    not before the deadline; an unplug makes the deadline UNPLUG_DEBOUNCE_S after the
    loss when that is sooner than the timeout."""
    silent = []
    with PtyPeer(symlink=tmp_path / "m", telemetry_period_s=0.2) as peer:
        link = links(tmp_path / "m", on_silent=lambda st: silent.append(time.monotonic()),
                     silence_max_s=5.0).start()  # fmt: skip
        assert link.wait_up(WAIT)
        st = link.status
        assert st.silent_after_s == 1.75  # max(SILENT_S, 2.5 x 200 ms), under 5 s
        assert wait_for(lambda: st.telemetry_at is not None)
        assert silent == []  # frames keep coming
        peer.unplug()
        assert wait_for(lambda: silent)
        assert st.lost_at is not None and not st.link_up
        due = st.silence_deadline()
        assert due == min(st.last_frame_at + st.paused_s + 1.75, st.lost_at + L.UNPLUG_DEBOUNCE_S)
        assert silent[0] >= due  # not early
        time.sleep(0.2)
        assert len(silent) == 1  # once per silence
        peer.replug()
        assert link.wait_up(WAIT) and st.lost_at is None
    assert L.silence_timeout_s(1000, 5.0) == 2.5 and L.silence_timeout_s(1000, 1.2) == 1.2


# ----------------------------------------------------------------------------- wire strings

EVIL = "e661\x1b]0;pwned\x07\x1b[2J\u202egnp.exe\x9b31m"


def _raw(text: str) -> bool:
    return any(c in text for c in ("\x1b", "\x07", "\u202e", "\x9b"))


def test_wire_strings_in_log_lines_are_sanitised(links, caplog):
    with PtyPeer(uid=EVIL, fw_version="1\x1b[5m", board="b\u202eoard") as peer:
        with caplog.at_level("DEBUG", logger="modbridge.link.session"):
            link = links(peer.path).start()
            assert link.wait_up(WAIT)
            assert link.status.module_id == EVIL  # the status keeps the raw value

            def up():  # logged just after the state changes: wait for it
                return [r.getMessage() for r in caplog.records if " up (firmware" in r.getMessage()]

            assert wait_for(up)
        up = up()
        assert not any(_raw(m) for m in up)
        assert "e661\\x1b]0;pwned\\x07\\x1b[2J\\u202egnp.exe\\x9b31m" in up[0]
        assert "1\\x1b[5m" in up[0] and "b\\u202eoard" in up[0]
        assert not _raw(caplog.text)


def test_a_nack_text_from_the_wire_is_sanitised_in_the_error(links):
    rules = {"config_save": (C.ERR_BUSY, "k\x1b[2J", "busy\x1b]0;x\x07\nforged line")}
    with PtyPeer(nack_rules=rules) as peer:
        link = links(peer.path).start()
        assert link.wait_up(WAIT)
        with pytest.raises(CommandRefused) as e:
            link.request("config_save")
        assert not _raw(str(e.value)) and "\n" not in str(e.value)
        assert "busy\\x1b]0;x\\x07\\nforged line" in str(e.value)
        assert e.value.text == "busy\x1b]0;x\x07\nforged line"  # raw, for matching


def test_not_paired_and_key_errors_are_sanitised(links, store, caplog):
    with PtyPeer(uid=EVIL, nonce=True) as peer:
        with caplog.at_level("DEBUG", logger="modbridge.link.session"):
            link = links(peer.path, keys=store).start()
            assert link.wait_up(WAIT)
            with pytest.raises(L.NotPaired) as e:
                link.request("config_save")
        assert not _raw(str(e.value))
        assert not _raw(link.status.last_error or "") and not _raw(link.key_error or "")
        assert not _raw(caplog.text)
