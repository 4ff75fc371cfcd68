"""The bridge's control socket (modbridge.ops.ctlsock) on a temporary socket: a
request and its reply, the peer check refusing (a fake check), garbage and oversize
requests answered with an error and the server still serving, a client that never
sends its line timed out without holding others up, a stale socket file, the
bridge's side (module resolution, allowed messages, one request at a time per
module) with fake links. No module, no subprocess."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

from modbridge.bridge import Bridge
from modbridge.config import BridgeConfig, ModuleMapping
from modbridge.ops import control as ctl
from modbridge.ops import ctlsock


@pytest.fixture
def sockdir():
    # a short path: a Unix socket's path has at most 107 bytes (pytest's tmp_path may not)
    with tempfile.TemporaryDirectory(prefix="mbctl-", dir="/tmp") as d:
        yield d


def _echo(req):
    return {"ok": True, "echo": req}


def _raw(path, data: bytes, timeout=5.0) -> dict:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(data)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    return json.loads(buf)


@pytest.fixture
def server(sockdir):
    srv = ctlsock.ControlServer(_echo, os.path.join(sockdir, "control.sock"),
                                read_timeout_s=0.3).start()  # fmt: skip
    yield srv
    srv.stop()


def test_request_and_reply_and_the_socket_mode(server):
    c = ctlsock.Client(server.path)
    assert c.call({"op": "x", "fields": {"a": [1, 2]}}) == {
        "ok": True, "echo": {"op": "x", "fields": {"a": [1, 2]}}}  # fmt: skip
    mode = stat.S_IMODE(os.stat(server.path).st_mode)
    assert mode == 0o660 and stat.S_ISSOCK(os.stat(server.path).st_mode)
    assert server.requests == 1


def test_stop_removes_the_socket_and_ends_the_thread(sockdir):
    path = os.path.join(sockdir, "c.sock")
    srv = ctlsock.ControlServer(_echo, path).start()
    t = srv._thread
    srv.stop()
    assert not os.path.exists(path) and not t.is_alive()


def test_a_refused_peer_gets_a_clear_error_and_is_counted(sockdir):
    seen = []

    def check(pid, uid, gid):
        seen.append((pid, uid, gid))
        return f"uid {uid} may not control the bridge's modules (test)"

    srv = ctlsock.ControlServer(_echo, os.path.join(sockdir, "c.sock"), peer_check=check).start()
    try:
        with pytest.raises(ctlsock.SocketRefused, match=r"refused: uid \d+ may not control"):
            ctlsock.Client(srv.path).call({"op": "ping"})
        assert seen == [(os.getpid(), os.geteuid(), os.getegid())]  # SO_PEERCRED
        assert srv.refused == 1 and srv.requests == 0
    finally:
        srv.stop()


def test_the_default_peer_check():
    check = ctlsock.make_peer_check(None, own_uid=1000)
    assert check(1, 0, 0) is None and check(1, 1000, 5) is None
    assert "uid 1001 may not control" in check(1, 1001, 1001)
    # a member by its primary group (the peer's gid), or by /proc/<pid>/status Groups
    grp = ctlsock.make_peer_check(4242, own_uid=1000)
    assert grp(os.getpid(), 1001, 4242) is None
    assert "member of group 4242" in grp(os.getpid(), 1001, 1001) or 4242 in os.getgroups()
    with pytest.raises(ctlsock.SocketError, match="no such group"):
        ctlsock.group_gid("no-such-group-mbctl")
    assert ctlsock.group_gid("0") == 0 and ctlsock.group_gid(None) is None


@pytest.mark.parametrize("data, code", [
    (b"not json\n", "malformed"),
    (b"[1, 2]\n", "malformed"),
    (b"\xff\xfe\x00garbage\n", "malformed"),
    (b'{"op": "ping"' + b" " * 20000 + b"}\n", "too_large"),
])  # fmt: skip
def test_garbage_gets_an_error_reply_and_the_server_goes_on(server, data, code):
    r = _raw(str(server.path), data)
    assert r["ok"] is False and r["error"] == code and r["message"]
    assert ctlsock.Client(server.path).call({"op": "ping"})["ok"] is True
    assert server.errors >= 1


def test_a_silent_client_is_timed_out_without_holding_others_up(server):
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.settimeout(5)
    slow.connect(str(server.path))
    slow.sendall(b'{"op": "pi')  # and never the rest
    assert ctlsock.Client(server.path).call({"op": "ping"})["ok"] is True  # served meanwhile
    r = json.loads(slow.recv(4096))
    slow.close()
    assert r["error"] == "timeout" and "no request line within 0.3 s" in r["message"]


def test_clients_beyond_the_limit_are_told_busy(sockdir):
    release = threading.Event()

    def slow(req):
        release.wait(5)
        return {"ok": True}

    srv = ctlsock.ControlServer(slow, os.path.join(sockdir, "c.sock"), max_clients=1).start()
    try:
        first = threading.Thread(target=lambda: ctlsock.Client(srv.path).call({"op": "a"}))
        first.start()
        deadline = time.monotonic() + 5
        while srv.requests == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = ctlsock.Client(srv.path).call({"op": "b"})
        assert r["error"] == "busy"
        release.set()
        first.join(5)
    finally:
        release.set()
        srv.stop()


def _stale(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens


def test_a_stale_socket_is_ignored_by_clients_and_replaced_by_a_server(sockdir):
    path = os.path.join(sockdir, "c.sock")
    _stale(path)
    with pytest.raises(ctlsock.StaleSocket, match="stale control socket .* ignored"):
        ctlsock.Client(path).call({"op": "ping"})
    notes = []
    with pytest.raises(ctl.ControlError):
        ctl.open_target(os.path.join(sockdir, "ttyNONE"), socket_path=path, notes=notes,
                        keys=None)  # fmt: skip
    assert notes and "stale control socket" in notes[0]
    srv = ctlsock.ControlServer(_echo, path).start()
    try:
        assert ctlsock.Client(path).call({"op": "ping"})["ok"]
        with pytest.raises(ctlsock.SocketBusy, match="another bridge answers"):
            ctlsock.ControlServer(_echo, path).start()
    finally:
        srv.stop()


def test_a_file_that_is_not_a_socket_is_never_removed(sockdir):
    path = os.path.join(sockdir, "c.sock")
    with open(path, "w") as f:
        f.write("precious")
    with pytest.raises(ctlsock.SocketError, match="is not a socket"):
        ctlsock.ControlServer(_echo, path).start()
    assert open(path).read() == "precious"
    with pytest.raises(ctlsock.SocketError, match="too long"):
        ctlsock.ControlServer(_echo, "/tmp/" + "x" * 120).start()


def test_serve_run_reports_and_goes_on_without_a_socket(sockdir):
    msgs = []
    bridge = SimpleNamespace(serve_control=lambda p, g: (_ for _ in ()).throw(
        ctlsock.SocketError("cannot listen: test")))  # fmt: skip
    assert ctlsock.serve_run(bridge, BridgeConfig(), sockdir, echo=msgs.append) is None
    assert msgs == ["modbridge: control socket disabled: cannot listen: test"]
    assert ctlsock.serve_run(bridge, BridgeConfig(), sockdir, enabled=False) is None
    assert ctlsock.default_path(sockdir, {}) == ctlsock.Path(sockdir) / "control.sock"
    assert str(ctlsock.default_path(None, {"RUNTIME_DIRECTORY": "/run/mb"})) == \
        "/run/mb/control.sock"  # fmt: skip
    assert ctlsock.default_path(None, {}) is None


# ------------------------------------------------------------- the bridge's side


class FakeLink:
    def __init__(self, port, uid, answer="ack"):
        self.port = port
        self.status = SimpleNamespace(module_id=uid, telemetry={"state": 1}, telemetry_at=1.0)
        self.link_up = True
        self.answer = answer
        self.sent = []
        self.gate = None

    def request(self, name, fields=None, timeout=None):
        self.sent.append((name, fields, timeout))
        if self.gate is not None:
            self.gate.wait(5)
        if self.answer == "nack":
            return SimpleNamespace(name="nack", fields={"ref": 1, "code": 6, "field": "sp_gpu"})
        return SimpleNamespace(name="ack", fields={"ref": 1, "ref_type": 0x31})


class FakeBridge:
    control_entries = Bridge.control_entries
    control_link = Bridge.control_link
    forward = Bridge.forward

    def __init__(self, links, modules=()):
        self.links = {lk.port: lk for lk in links}
        self.config = BridgeConfig(modules=list(modules))


@pytest.fixture
def bridge_server(sockdir):
    m0, m1 = FakeLink("/dev/m0", "b9bd00aa"), FakeLink("/dev/m1", "c0ffee11", "nack")
    b = FakeBridge([m0, m1], [ModuleMapping("b9bd00aa", None, name="gpu0")])
    srv = ctlsock.ControlServer(ctlsock.BridgeControl(b), os.path.join(sockdir, "c.sock")).start()
    yield srv, m0, m1
    srv.stop()


def test_the_bridge_resolves_and_forwards(bridge_server):
    srv, m0, m1 = bridge_server
    c = ctlsock.Client(srv.path)
    t = ctlsock.BridgeTarget(c, "gpu0")
    assert (t.module_id, t.port, t.via) == ("b9bd00aa", "/dev/m0", "bridge")
    r = t.request("setpoints", {"sp_gpu": 70000})
    assert r.name == "ack" and m0.sent == [("setpoints", {"sp_gpu": 70000}, None)]
    assert t.telemetry() == {"state": 1}
    o = ctl.set_setpoint(ctlsock.BridgeTarget(c, "c0ff"), "gpu", 70)
    assert o.status == "refused" and o.via == "bridge" and o.port == "/dev/m1"
    mods = c.call({"op": "modules"})["modules"]
    assert [(m["port"], m["module_id"], m["names"]) for m in mods] == [
        ("/dev/m0", "b9bd00aa", ["gpu0"]), ("/dev/m1", "c0ffee11", [])]  # fmt: skip


@pytest.mark.parametrize("req, code, text", [
    ({"module": "nosuch", "name": "reboot"}, "unknown_module", "no module nosuch"),
    ({"module": "gpu0", "name": "pair", "fields": {"key": "00"}}, "bad_request", "name: one of"),
    ({"module": "gpu0", "name": "heartbeat"}, "bad_request", "name: one of"),
    ({"module": "gpu0", "name": "reboot", "fields": [1]}, "bad_request", "fields"),
    ({"module": "gpu0", "name": "reboot", "timeout": 1e9}, "bad_request", "timeout"),
    ({"module": 7, "name": "reboot"}, "bad_request", "module"),
    ({"module": "gpu0", "op": "dance"}, "bad_request", "op: one of"),
])  # fmt: skip
def test_the_bridge_refuses_what_it_does_not_forward(bridge_server, req, code, text):
    srv, m0, _ = bridge_server
    r = ctlsock.Client(srv.path).call(req)
    assert r["ok"] is False and r["error"] == code and text in r["message"]
    assert m0.sent == []
    with pytest.raises(ctl.TargetNotFound):
        ctlsock.BridgeTarget(ctlsock.Client(srv.path), "nosuch")


def test_one_request_at_a_time_per_module(bridge_server, monkeypatch):
    srv, m0, m1 = bridge_server
    monkeypatch.setattr(ctlsock, "MODULE_WAIT_S", 0.05)
    m0.gate = threading.Event()
    c = ctlsock.Client(srv.path)
    first = threading.Thread(target=lambda: c.call({"module": "gpu0", "name": "selftest"}, 10))
    first.start()
    deadline = time.monotonic() + 5
    while not m0.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    r = c.call({"module": "b9bd00aa", "name": "reboot"})
    assert r["error"] == "busy" and "another control request" in r["message"]
    assert c.call({"module": "/dev/m1", "name": "reboot"})["ok"]  # another module: served
    m0.gate.set()
    first.join(5)
    assert c.call({"module": "gpu0", "name": "reboot"})["ok"]


def test_a_directory_it_may_not_create_is_a_socket_error(sockdir):
    ro = os.path.join(sockdir, "ro")
    os.mkdir(ro, 0o500)
    try:
        if os.geteuid() == 0:
            pytest.skip("root may create anything")
        with pytest.raises(ctlsock.SocketError, match="cannot listen"):
            ctlsock.ControlServer(_echo, os.path.join(ro, "sub", "c.sock")).start()
    finally:
        os.chmod(ro, 0o700)
