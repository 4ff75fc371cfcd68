"""The bridge's local control socket: ``modbridge set/config/selftest/...`` while
``modbridge run`` holds the serial ports (docs/control.md).

A Unix stream socket (default ``$RUNTIME_DIRECTORY/control.sock``, else
``<state_dir>/control.sock``), mode 0660, owned by root (when the bridge runs as
root) and the group ``control_group``, set on the socket itself, never through a path
that could be a link; its directory must be one only root or the bridge's user can
write (:func:`modbridge.fsutil.check_private_dir`). Every connection's peer is checked with
``SO_PEERCRED``: root, the bridge's own uid, or a member of that group; anyone else
gets ``{"ok": false, "error": "forbidden", ...}`` and is logged.

Protocol: one JSON object per connection, one line (at most
:data:`MAX_REQUEST` bytes, nested at most :data:`MAX_DEPTH` deep), answered by one JSON
line::

    {"module": "gpu0", "name": "fan_mode", "fields": {"mode": 1, "duty1": 26214},
     "telemetry": true}
    -> {"ok": true, "module_id": "b9bd...", "port": "/dev/gpu_module0",
        "reply": {"name": "ack", "fields": {...}}, "telemetry": {...}}
    -> {"ok": false, "error": "unknown_module", "message": "..."}

``op`` (default ``request``) may also be ``ping`` (is a bridge there), ``modules``
(the bridge's modules), ``resolve`` (which module ``module`` names), ``telemetry``
(a module's last frame) or ``report`` (what ``modbridge status --json`` prints,
:func:`modbridge.bridge.report` of the last tick's snapshot, plus ``bridge``: pid,
ticks, the snapshot's age; ``modbridge status`` and ``modbridge healthcheck`` ask for
it: docs/schedulers.md). Fields and replies are in wire units (the catalog's);
:mod:`modbridge.ops.control` converts.

The server never slows the bridge loop: it runs in its own threads (one accepting,
sleeping in a selector with a wake-up pipe, no poll; one per connection, at most
:data:`MAX_CLIENTS`, more are answered ``busy`` at once; accept() failing for want
of descriptors pauses 0.1 s, never spins), a connection has :data:`READ_TIMEOUT_S`
in total to send its line,
requests to one module run one at a time (another waits at most
:data:`MODULE_WAIT_S`, then ``busy``), and the request itself goes through the
module's :class:`~modbridge.link.session.ModuleLink` (thread-safe; the I/O thread
does the reading). Garbage gets an error reply and a log line; nothing a client sends
raises out of the server.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from modbridge.errors import ModbridgeError
from modbridge.fsutil import UnsafeDirectory, check_private_dir, chmod_chown_nofollow
from modbridge.link.requests import timeout_scale
from modbridge.ops import control as ctl
from modbridge.sanitize import sanitize
from modbridge.wakepipe import WakePipe

log = logging.getLogger(__name__)

SOCKET_NAME = "control.sock"
MAX_REQUEST = 16384  # bytes of one request line (a 64-key config_set is ~3 KB)
MAX_DEPTH = 16  # nesting of a request's arrays and objects (a fan curve's is 3)
MAX_REPLY = 1 << 20
READ_TIMEOUT_S = 2.0  # a client has this long to send its request line
WRITE_TIMEOUT_S = 2.0
MODULE_WAIT_S = 1.0  # a second request to a busy module waits this long, then busy
MAX_CLIENTS = 8
# The longest request timeout a client may ask for (selftest: 75 s), times this
# process's $MODBRIDGE_TIMEOUT_SCALE like the link's defaults.
MAX_TIMEOUT_S = 120.0 * timeout_scale()
CLIENT_EXTRA_S = 5.0  # the client waits the request's timeout plus this
#: What the socket forwards (reads and the control commands); never ``pair`` (a key
#: on a socket) nor ``heartbeat`` (the bridge's own).
ALLOWED = ("hello_request", "fan_mode", "setpoints", "pid_gains", "fan_curve", "config_get",
           "config_set", "config_save", "config_reset", "selftest", "reboot", "repl",
           "cal_read", "cal_write")  # fmt: skip
_SUN_PATH_MAX = 107


class SocketError(ModbridgeError):
    """The control socket cannot be used; the message says why."""


class StaleSocket(SocketError):
    """A socket file with no bridge listening (left by one that was killed)."""


class SocketRefused(SocketError):
    """The bridge (or the file's permissions) refused this user."""

    exit_code = 1


class SocketBusy(SocketError):
    """Another bridge answers on the socket's path."""


# --------------------------------------------------------------------- paths


def default_path(state_dir=None, environ=None) -> Path | None:
    """``$RUNTIME_DIRECTORY/control.sock`` (systemd ``RuntimeDirectory=``), else
    ``<state_dir>/control.sock``; None without either."""
    env = os.environ if environ is None else environ
    if env.get("RUNTIME_DIRECTORY"):
        return Path(env["RUNTIME_DIRECTORY"].split(":")[0]) / SOCKET_NAME
    if state_dir is not None:
        return Path(state_dir) / SOCKET_NAME
    return None


def client_paths(config=None, explicit: str | None = None, environ=None,
                 state_dir=None) -> list[str]:  # fmt: skip
    """Where a CLI looks for a bridge's socket: ``explicit``; else ``<state_dir>`` (a
    command's ``--state-dir``: where ``run --state-dir`` put it), the config's
    ``control_socket``, ``$RUNTIME_DIRECTORY``, /run/modbridge, the default state dir.
    Only paths that exist."""
    if explicit:
        return [str(explicit)]
    from modbridge.actuator.journal import default_state_dir

    env = os.environ if environ is None else environ
    cands = []
    if state_dir is not None:
        cands.append(Path(state_dir).expanduser() / SOCKET_NAME)
    if config is not None and getattr(config, "control_socket", None):
        cands.append(Path(config.control_socket).expanduser())
    p = default_path(None, env)
    if p is not None:
        cands.append(p)
    cands.append(Path("/run/modbridge") / SOCKET_NAME)
    cands.append(default_state_dir(config, env) / SOCKET_NAME)
    out = []
    for c in cands:
        s = str(c)
        if s not in out and os.path.exists(s):
            out.append(s)
    return out


# ------------------------------------------------------------------- peers


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of a Unix socket's peer (``SO_PEERCRED``)."""
    data = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)


def _peer_groups(pid: int, uid: int, gid: int) -> set[int]:
    groups = {gid}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Groups:"):
                    groups.update(int(g) for g in line.split()[1:])
                    return groups
    except (OSError, ValueError):
        pass
    try:
        import pwd

        groups.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        pass
    return groups


def group_gid(group: str | None) -> int | None:
    """The gid of ``group`` (a name or a number); SocketError if there is none."""
    if group is None or group == "":
        return None
    if str(group).isdigit():
        return int(group)
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise SocketError(f"control_group {group!r}: no such group (groupadd it, or "
                          "change [bridge] control_group)") from None  # fmt: skip


def make_peer_check(gid: int | None, own_uid: int | None = None) -> Callable:
    """``check(pid, uid, gid) -> None`` (allowed) or the reason it is not: root, the
    bridge's uid, or a member of group ``gid``."""
    me = os.geteuid() if own_uid is None else own_uid

    def check(pid: int, uid: int, peer_gid: int) -> str | None:
        if uid == 0 or uid == me:
            return None
        if gid is not None and gid in _peer_groups(pid, uid, peer_gid):
            return None
        who = f"uid {uid}"
        need = f"root, uid {me}" + (f" or a member of group {gid}" if gid is not None else "")
        return f"{who} may not control the bridge's modules (allowed: {need}; docs/control.md)"

    return check


# ------------------------------------------------------------------ server


def _check_path_len(path: Path) -> None:
    if len(os.fsencode(str(path))) > _SUN_PATH_MAX:
        raise SocketError(f"{path}: too long for a Unix socket ({_SUN_PATH_MAX} bytes at most): "
                          "choose a shorter --control-socket")  # fmt: skip


def nesting_within(line: bytes, limit: int) -> bool:
    """Whether the JSON text ``line`` nests arrays and objects at most ``limit`` deep
    (brackets inside strings do not count). Checked before ``json.loads``, whose
    recursion a flood of ``[`` would otherwise exhaust."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return True
    depth, in_str, esc = 0, False, False
    for b in line:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:  # backslash
                esc = True
            elif b == 0x22:  # quote
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return False
        elif b in (0x5D, 0x7D):  # ] }
            depth -= 1
    return True


def _dumps(obj) -> bytes:
    def default(o):
        if isinstance(o, (bytes, bytearray)):
            return bytes(o).hex()
        return str(o)

    return (json.dumps(obj, default=default, separators=(",", ":")) + "\n").encode()


def _error(code: str, message: str) -> dict:
    return {"ok": False, "error": code, "message": message}


class ControlServer:
    """The control socket at ``path``, answering with ``handler(request) -> reply``.

    ``group``: the socket's group (name or gid; its members may connect);
    ``peer_check(pid, uid, gid)`` (default :func:`make_peer_check`) returns None or
    the reason a peer is refused."""

    def __init__(
        self,
        handler: Callable[[dict], dict],
        path,
        group=None,
        peer_check: Callable | None = None,
        max_clients: int = MAX_CLIENTS,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_request: int = MAX_REQUEST,
    ):
        self.handler = handler
        self.path = Path(path)
        self.group = group
        self._gid = group_gid(group)
        self.peer_check = peer_check or make_peer_check(self._gid)
        self.read_timeout_s = read_timeout_s
        self.max_request = max_request
        self._slots = threading.BoundedSemaphore(max_clients)
        self._sock: socket.socket | None = None
        self._ino: int | None = None
        self._wake = WakePipe()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests = 0
        self.refused = 0  # peers refused by the check
        self.errors = 0  # malformed, oversize, timed-out requests

    # -- life cycle ---------------------------------------------------------------
    def start(self) -> ControlServer:
        _check_path_len(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            check_private_dir(self.path.parent, "control socket's directory")
            self._clear_stale()
        except OSError as e:
            raise SocketError(f"{self.path}: cannot listen: {e}") from None
        except UnsafeDirectory as e:
            raise SocketError(str(e)) from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            chmod_chown_nofollow(self.path, 0o660)  # never through a link planted there
            self._set_owner()
            sock.listen(MAX_CLIENTS)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise SocketError(f"{self.path}: cannot listen: {e}") from None
        self._sock = sock
        self._ino = os.stat(self.path).st_ino
        self._thread = threading.Thread(target=self._serve, name="modbridge-control",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        log.info("control socket on %s", self.path)
        return self

    def _clear_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketError(f"{self.path} exists and is not a socket: remove it or choose "
                              "another --control-socket")  # fmt: skip
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(self.path))
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("%s: a stale control socket (no bridge listening): replaced", self.path)
            os.unlink(self.path)
            return
        except OSError as e:
            raise SocketError(f"{self.path}: cannot check the existing socket: {e}") from None
        finally:
            probe.close()
        raise SocketBusy(f"{self.path}: another bridge answers on this control socket")

    def _set_owner(self) -> None:
        uid = 0 if os.geteuid() == 0 else -1
        gid = -1 if self._gid is None else self._gid
        if uid == -1 and gid == -1:
            return
        try:
            chmod_chown_nofollow(self.path, 0o660, uid, gid)
        except OSError as e:
            log.warning("%s: cannot give the control socket to group %s: %s (only this "
                        "user and root can use it)", self.path, self.group, e)  # fmt: skip

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close and remove the socket (if it is still ours)."""
        self._stop.set()
        self._wake.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                if os.stat(self.path).st_ino == self._ino:
                    os.unlink(self.path)
            except OSError:
                pass
        self._wake.close()

    # -- accepting ---------------------------------------------------------------
    def _serve(self) -> None:
        # a selector (epoll), not select(): a descriptor above 1023 is no error (the
        # bridge raises RLIMIT_NOFILE: docs/bridge.md, "File descriptors")
        with selectors.DefaultSelector() as sel:
            try:
                sel.register(self._sock, selectors.EVENT_READ)
                sel.register(self._wake, selectors.EVENT_READ)
            except (OSError, ValueError):
                return  # closed under us: stopping
            while not self._stop.is_set():
                try:
                    ready = {key.fileobj for key, _ in sel.select()}
                except (OSError, ValueError):
                    return  # closed under us: stopping
                if self._wake in ready:
                    self._wake.drain()
                    continue
                try:
                    conn, _ = self._sock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        log.warning("control socket: %s", e)  # no spinning: a pause
                        self._stop.wait(0.1)
                        continue
                    return
                try:
                    self._admit(conn)
                except Exception:  # noqa: BLE001 - one connection never ends the server
                    log.exception("control socket: a connection failed")
                    conn.close()

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.settimeout(WRITE_TIMEOUT_S)
        try:
            pid, uid, gid = peer_credentials(conn)
        except OSError as e:
            self._reply_close(conn, _error("forbidden", f"cannot identify the peer: {e}"))
            return
        why = self.peer_check(pid, uid, gid)
        if why is not None:
            self.refused += 1
            log.warning("control socket: refused pid %d: %s", pid, why)
            self._reply_close(conn, _error("forbidden", why))
            return
        if not self._slots.acquire(blocking=False):
            busy = f"the bridge is serving {MAX_CLIENTS} control requests: try again"
            self._reply_close(conn, _error("busy", busy))
            return
        t = threading.Thread(target=self._client, args=(conn, pid), daemon=True,
                             name="modbridge-control-req")  # fmt: skip
        try:
            t.start()
        except RuntimeError:
            self._slots.release()
            conn.close()

    def _reply_close(self, conn: socket.socket, reply: dict) -> None:
        try:
            conn.sendall(_dumps(reply))
        except OSError:
            pass
        finally:
            conn.close()

    # -- one request -------------------------------------------------------------
    def _client(self, conn: socket.socket, pid: int) -> None:
        try:
            line = self._read_line(conn)
            if isinstance(line, dict):  # an error already
                reply = line
            else:
                reply = self._answer(line, pid)
            self._reply_close(conn, reply)
        except Exception:  # noqa: BLE001 - a client never takes the server down
            log.exception("control socket: request from pid %d failed", pid)
            self._reply_close(conn, _error("internal", "the bridge failed to answer: see its log"))
        finally:
            self._slots.release()

    def _read_line(self, conn: socket.socket):
        # read_timeout_s for the whole line, not per recv: a client sending a byte
        # every second must not hold one of the MAX_CLIENTS slots for long
        deadline = time.monotonic() + self.read_timeout_s
        buf = bytearray()
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                conn.settimeout(left)
                chunk = conn.recv(4096)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > self.max_request:
                    self.errors += 1
                    log.warning("control socket: a request over %d bytes refused",
                                self.max_request)  # fmt: skip
                    return _error("too_large", f"a request is at most {self.max_request} bytes")
        except TimeoutError:
            self.errors += 1
            log.warning("control socket: no complete request within %.1f s",
                        self.read_timeout_s)  # fmt: skip
            return _error("timeout", f"no request line within {self.read_timeout_s:g} s")
        except OSError as e:
            return _error("malformed", f"cannot read the request: {e}")
        return bytes(buf.split(b"\n", 1)[0])

    def _answer(self, line: bytes, pid: int) -> dict:
        if not nesting_within(line, MAX_DEPTH):
            self.errors += 1
            log.warning("control socket: a request from pid %d nested deeper than %d refused",
                        pid, MAX_DEPTH)  # fmt: skip
            return _error("malformed", f"a request nests arrays and objects {MAX_DEPTH} deep "
                          "at most")  # fmt: skip
        try:
            req = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            self.errors += 1
            log.warning("control socket: malformed request from pid %d: %s (%r)", pid, e,
                        sanitize(line[:60].decode("utf-8", "replace")))  # fmt: skip
            return _error("malformed", f"not one JSON object per line: {e}")
        if not isinstance(req, dict):
            self.errors += 1
            log.warning("control socket: malformed request from pid %d: not an object", pid)
            return _error("malformed", "the request must be a JSON object")
        self.requests += 1
        return self.handler(req)


# ----------------------------------------------------------- the bridge's side


class BridgeControl:
    """The handler the bridge serves: resolves ``module`` among its links and
    forwards the request through the link (signed with the bridge's keys)."""

    def __init__(self, bridge):
        self.bridge = bridge
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, port: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(port, threading.Lock())

    def report(self) -> dict:
        """``bridge.report()`` of the last tick's snapshot (built on this thread: the
        loop is never waited for, nor does it wait), ages as of now, plus ``bridge``:
        its pid, ticks so far, ``snapshot_age_s`` (a loop that stopped ticking shows
        here, docs/schedulers.md) and ``tick_s``."""
        from modbridge.bridge import report

        b = self.bridge
        snap = b.snapshot()
        for attempt in range(3):  # the I/O thread may grow a counter dict under us
            try:
                now = b.clock()
                rep = report(snap, now)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        rep["bridge"] = {
            "pid": os.getpid(),
            "ticks": b.ticks,
            "snapshot_age_s": max(0.0, now - snap.taken_at),
            "tick_s": getattr(b.config, "tick_s", None),
            "dry_run": bool(getattr(b.config, "dry_run", False)),
        }
        return rep

    def __call__(self, req: dict) -> dict:
        op = req.get("op", "request")
        if op == "ping":
            return {"ok": True, "bridge": {"pid": os.getpid(), "modules": len(self.bridge.links)}}
        if op == "report":
            return {"ok": True, "report": self.report()}
        if op == "modules":
            return {"ok": True, "modules": [
                {"port": p, "module_id": mid, "names": names,
                 "link_up": self.bridge.links[p].link_up}
                for p, mid, names in self.bridge.control_entries()
            ]}  # fmt: skip
        module = req.get("module")
        if not isinstance(module, str) or not module or len(module) > 256:
            return _error("bad_request", "module: a port, a module id or a [[module]] name")
        try:
            link = self.bridge.control_link(module)
        except ctl.TargetNotFound as e:
            return _error("unknown_module", str(e))
        head = {"ok": True, "module_id": link.status.module_id, "port": link.port}
        if op == "resolve":
            return head
        if op == "telemetry":
            t = link.status.telemetry
            return {**head, "telemetry": dict(t) if t else None}
        if op != "request":
            return _error("bad_request", "op: one of request, ping, modules, resolve, "
                          f"telemetry, report, got {sanitize(str(op))!r}")  # fmt: skip
        name = req.get("name")
        fields = req.get("fields") or {}
        if name not in ALLOWED:
            return _error("bad_request", f"name: one of {', '.join(ALLOWED)}, "
                                         f"got {sanitize(str(name))!r}")  # fmt: skip
        if not isinstance(fields, dict):
            return _error("bad_request", "fields: a JSON object")
        timeout = req.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                    not 0 < timeout <= MAX_TIMEOUT_S:  # fmt: skip
                return _error("bad_request", f"timeout: seconds, 0..{MAX_TIMEOUT_S:g}")
        lock = self._lock(link.port)
        if not lock.acquire(timeout=MODULE_WAIT_S):
            return _error("busy", f"{link.port}: another control request to this module is "
                                  "running (a selftest takes up to 75 s): try again")  # fmt: skip
        try:
            reply = self.bridge.forward(link.port, name, fields, timeout,
                                        bool(req.get("telemetry")))  # fmt: skip
        except ctl.ControlError as e:
            return _error("failed", str(e))
        finally:
            lock.release()
        log.info("control: %s to %s: %s", name, sanitize(link.status.module_id or link.port),
                 reply.name)  # fmt: skip
        return {**head, "reply": {"name": reply.name, "fields": reply.fields},
                "telemetry": reply.telemetry}


def serve(bridge, path, group=None) -> ControlServer:
    return ControlServer(BridgeControl(bridge), path, group).start()


# ------------------------------------------------------------------ client


class Client:
    """One request per connection to a bridge's control socket."""

    def __init__(self, path, timeout_s: float = 5.0):
        self.path = str(path)
        self.timeout_s = timeout_s

    def call(self, req: dict, timeout_s: float | None = None) -> dict:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s or self.timeout_s)
        try:
            try:
                sock.connect(self.path)
            except (ConnectionRefusedError, FileNotFoundError):
                raise StaleSocket(f"{self.path}: a stale control socket (no bridge listening): "
                                  "ignored") from None  # fmt: skip
            except PermissionError:
                raise SocketRefused(
                    f"{self.path}: permission denied: the bridge's control socket is for root "
                    "and its control_group (docs/control.md); or use --direct when no bridge "
                    "holds the port"
                ) from None
            try:
                sock.sendall(_dumps(req))
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered and closed at once (busy, forbidden): the reply is there
            buf = bytearray()
            while b"\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > MAX_REPLY:
                    raise SocketError(f"{self.path}: the reply is too large")
        except TimeoutError:
            raise SocketError(f"{self.path}: the bridge did not answer in time") from None
        except OSError as e:
            if isinstance(e, SocketError):
                raise
            raise SocketError(f"{self.path}: {e}") from None
        finally:
            sock.close()
        try:
            reply = json.loads(bytes(buf).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise SocketError(f"{self.path}: not a modbridge control socket (bad reply)") from None
        if not isinstance(reply, dict):
            raise SocketError(f"{self.path}: not a modbridge control socket (bad reply)")
        if reply.get("error") == "forbidden":
            raise SocketRefused(f"{self.path}: the bridge refused: {reply.get('message')}")
        return reply

    def ping(self) -> bool:
        return bool(self.call({"op": "ping"}, 2.0).get("ok"))


class BridgeTarget(ctl.Target):
    """A module behind the running bridge (its control socket)."""

    via = "bridge"

    def __init__(self, client: Client, module: str):
        self.client = client
        self.module = module
        r = client.call({"op": "resolve", "module": module})
        self._check(r)
        self.module_id = r.get("module_id")
        self.port = r.get("port")

    def _check(self, r: dict) -> dict:
        if r.get("ok"):
            return r
        code, msg = r.get("error"), r.get("message") or "no reason given"
        if code == "unknown_module":
            raise ctl.TargetNotFound(f"the bridge ({self.client.path}): {msg}")
        raise ctl.ControlError(f"the bridge ({self.client.path}): {code}: {msg}")

    def request(self, name, fields=None, timeout=None, then_telemetry=False) -> ctl.Reply:
        from modbridge.link.requests import REQUEST_TIMEOUT_S, REQUEST_TIMEOUTS

        req = {"module": self.module, "name": name, "fields": fields or {}}
        if timeout is not None:
            req["timeout"] = timeout
        if then_telemetry:
            req["telemetry"] = True
        wait = (timeout or REQUEST_TIMEOUTS.get(name, REQUEST_TIMEOUT_S)) + CLIENT_EXTRA_S
        if then_telemetry:
            wait += ctl.TELEMETRY_WAIT_S
        try:
            r = self._check(self.client.call(req, wait))
        except SocketError as e:
            raise ctl.ControlError(str(e)) from None
        rep = r.get("reply") or {}
        return ctl.Reply(str(rep.get("name")), dict(rep.get("fields") or {}), r.get("telemetry"))

    def telemetry(self) -> dict | None:
        try:
            r = self._check(self.client.call({"op": "telemetry", "module": self.module}))
        except SocketError as e:
            raise ctl.ControlError(str(e)) from None
        return r.get("telemetry")


def serve_run(bridge, config, state_dir, path=None, enabled: bool = True,
              echo: Callable[[str], None] = print) -> ControlServer | None:  # fmt: skip
    """``modbridge run``'s control socket: ``path`` (``--control-socket``), else the
    config's ``control_socket``, else :func:`default_path`. A socket that cannot be
    served is reported and the bridge runs without it (cooling comes first)."""
    if not enabled:
        return None
    where = path or getattr(config, "control_socket", None) or default_path(state_dir)
    if where is None:
        echo("modbridge: no control socket (no state directory): modules are controlled "
             "with --direct only while the bridge is stopped")  # fmt: skip
        return None
    try:
        server = bridge.serve_control(Path(where).expanduser(),
                                      getattr(config, "control_group", None))  # fmt: skip
    except SocketError as e:
        echo(f"modbridge: control socket disabled: {e}")
        return None
    echo(f"modbridge: control socket on {server.path}")
    return server
