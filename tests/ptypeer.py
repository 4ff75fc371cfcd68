"""A fake module on a real pty, speaking the protocol with ``protocol.frame``.

For host-side tests that need a module peer but not the firmware: answers
``hello_request`` with ``hello``, records heartbeats (decoded, with arrival times),
acks commands (or nacks them per ``nack_rules``), optionally sends telemetry every
``telemetry_period_s``, and can unplug / replug like a USB adapter (the pty master
is closed, the slave path disappears, a new pty takes its place and the stable
symlink is moved to it, as udev does for a CH340).

    with PtyPeer(symlink=tmp_path / "module0", telemetry_period_s=0.1) as peer:
        link = ModuleLink(str(peer.symlink)).start()
        ...
        peer.unplug(); peer.replug()

Signing, like the firmware (docs/pairing.md): ``nonce=True`` (a fresh random nonce at
every ``boot()``) or fixed bytes puts ``nonce`` and ``paired`` in the hello; with
``key`` the peer verifies every host frame with :class:`protocol.sign.Verifier`:
heartbeats count (``heartbeats``) only when signed, every other command but the open
reads must be signed, and the rest get ``nack unauthorized`` (``refused`` lists them).
``pair`` is accepted signed with the current key, or unsigned while
``pairing_window`` is open (by default: a peer without a key). ``nonce=None`` is a
firmware from before signing: no nonce, nothing verified.

Everything is bounded: the peer's thread polls with a 20 ms timeout and ``close()``
joins it.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import threading
import time
import tty
from pathlib import Path

from modbridge.link.requests import timeout_scale
from protocol import catalog as C
from protocol import sign
from protocol.frame import StreamDecoder, encode_frame

OPEN_REQUESTS = ("hello_request", "config_get", "cal_read")

DEFAULT_TELEMETRY = {
    "uptime_s": 1,
    "state": C.STATE_HOSTED,
    "reason": C.REASON_HOST_OK,
    "faults": 0,
    "temp_gpu": 65250,
    "temp_vram": 58000,
    "temp_mos": 51500,
    "temp_amb": 27000,
    "fan1_rpm": 2850,
    "fan2_rpm": 2900,
    "fan1_duty": 32768,
    "fan2_duty": 65535,
    "v_in": 11920,
    "i_in": 20500,
    "p_in": 244360,
    "target": -1500,
}


DEFAULT_UID = "0123456789abcdef01234567"


def hello_fields(
    uid=DEFAULT_UID,
    fw_version="1.0.0",
    board="fake",
    channels=C.CHANNELS,
    fans=2,
    minor=0,
    telemetry_ms=None,
    ref=None,
    nonce=None,
    paired=None,
) -> dict:
    """A valid ``hello`` field dict (``ref`` None: the boot hello)."""
    f = {
        "fw_version": fw_version,
        "proto_minor": minor,
        "board": board,
        "uid": uid,
        "channels": list(channels),
        "fans": fans,
        "max_frame": 512,
        "state": C.STATE_HOSTED,
    }
    if telemetry_ms:
        f["telemetry_ms"] = telemetry_ms
    if ref is not None:
        f["ref"] = ref
    if nonce is not None:
        f["nonce"] = bytes(nonce)
    if paired is not None:
        f["paired"] = paired
    return f


class PtyPeer:
    """The module end of a pty. ``port`` is the slave path, ``symlink`` the stable one."""

    def __init__(
        self,
        symlink: str | Path | None = None,
        uid: str = DEFAULT_UID,
        fw_version: str = "1.0.0",
        board: str = "fake",
        channels=C.CHANNELS,
        fans: int = 2,
        major: int = 1,
        minor: int = 0,
        telemetry_period_s: float | None = None,
        answer_hello: bool = True,
        nack_rules: dict | None = None,
        replies: dict | None = None,
        ignore=(),
        nonce=None,
        key: bytes | None = None,
        pairing_window: bool | None = None,
        nack_heartbeats: bool = True,
    ):
        self.symlink = Path(symlink) if symlink else None
        self.uid = uid
        self.fw_version = fw_version
        self.board = board
        self.channels = list(channels)
        self.fans = fans
        self.major = major
        self.minor = minor
        self.telemetry_period_s = telemetry_period_s
        self.telemetry = dict(DEFAULT_TELEMETRY)
        self.answer_hello = answer_hello
        # name -> (code, field, text): answer that request with a nack
        self.nack_rules = dict(nack_rules or {})
        # name -> (reply name, fields): answer with this message (ref added)
        self.replies = dict(replies or {})
        self.ignore = set(ignore)  # requests never answered (the host must time out)
        # signing: nonce None = no signing; True = random per boot; bytes = fixed
        self._random_nonce = nonce is True
        self.nonce = os.urandom(sign.NONCE_LEN) if nonce is True else nonce
        self.key = key
        self.pairing_window = (key is None) if pairing_window is None else pairing_window
        self.nack_heartbeats = nack_heartbeats
        self.verifier = None
        if self.nonce is not None:
            self.verifier = sign.Verifier(key)
            self.verifier.set_nonce(self.nonce)
        self.refused: list = []  # (name, auth) of every frame refused as unauthorized
        self.paired_keys: list[bytes] = []  # keys accepted by ``pair``
        self.lose_pair_answers = 0  # this many accepted pairs are not answered
        self.received: list = []  # every decoded item from the host (Message/BadFrame)
        self.heartbeats: list[tuple[float, dict]] = []  # (time.monotonic(), fields)
        self.hello_requests = 0
        self.telemetry_sent = 0
        self.lock = threading.Lock()
        self._seq = 0
        self._master = -1
        self._slave = -1
        self.port: str | None = None
        self._decoder = StreamDecoder(accept=C.H2D, verifier=self.verifier)
        self._stop = threading.Event()
        self._plugged = threading.Event()
        self._open_pty()
        self._thread = threading.Thread(target=self._run, name="ptypeer", daemon=True)
        self._thread.start()

    # -- control ---------------------------------------------------------------------
    def __enter__(self) -> PtyPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with self.lock:
            self._close_pty()
        if self.symlink is not None:
            with contextlib.suppress(FileNotFoundError):
                self.symlink.unlink()

    @property
    def path(self) -> str:
        """What a host opens: the symlink if there is one, else the pty's slave path."""
        return str(self.symlink) if self.symlink else self.port

    def unplug(self) -> None:
        """Close the master (the host's reads fail); the slave path and symlink vanish."""
        with self.lock:
            self._close_pty()
            self._plugged.clear()
        if self.symlink is not None:
            with contextlib.suppress(FileNotFoundError):
                self.symlink.unlink()

    def replug(self) -> None:
        """A new pty (a new path); the symlink is moved to it."""
        with self.lock:
            self._decoder.reset()
            self._open_pty()

    def boot(self, hello: bool = True) -> None:
        """What a module does after a reset: the banner line, then a hello without ref
        (``hello=False``: the hello is lost). A new nonce if the peer draws them."""
        if self._random_nonce:
            self.nonce = os.urandom(sign.NONCE_LEN)
        if self.verifier is not None:
            self.verifier.set_nonce(self.nonce)  # also forgets every link's timestamps
        self.send_raw(b"MODULER READY v" + self.fw_version.encode() + b"\r\n")
        if hello:
            self.send("hello", self.hello_fields())

    def set_key(self, key: bytes | None) -> None:
        """The module's secret changes (or goes, with None)."""
        with self.lock:
            self.key = key
            if self.verifier is not None:
                self.verifier.set_key(key)

    # -- sending ---------------------------------------------------------------------
    def hello_fields(self, ref: int | None = None) -> dict:
        tm = int(self.telemetry_period_s * 1000) if self.telemetry_period_s else None
        paired = None if self.nonce is None else self.key is not None
        return hello_fields(
            self.uid, self.fw_version, self.board, self.channels, self.fans, self.minor, tm, ref,
            self.nonce, paired,
        )  # fmt: skip

    def send(self, name: str, fields: dict | None = None) -> None:
        with self.lock:
            seq = self._seq
            self._seq = (self._seq + 1) & 0xFFFF
        self.send_raw(encode_frame(name, fields or {}, seq, minor=self.minor, major=self.major))

    def send_raw(self, data: bytes) -> None:
        with self.lock:
            if self._master < 0:
                return
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self._master, view)
                except BlockingIOError:
                    time.sleep(0.001)
                    continue
                except OSError:
                    return
                view = view[n:]

    def wait_for(self, pred, timeout: float | None = None) -> bool:
        """Poll ``pred()`` every 10 ms until true or ``timeout`` (default 5 s times
        $MODBRIDGE_TIMEOUT_SCALE: a loaded machine runs both ends late)."""
        if timeout is None:
            timeout = 5.0 * timeout_scale()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.01)
        return bool(pred())

    def commands(self, name: str | None = None) -> list:
        with self.lock:
            return [m for m in self.received if m.ok and (name is None or m.name == name)]

    # -- the thread ------------------------------------------------------------------
    def _open_pty(self) -> None:
        self._master, self._slave = pty.openpty()
        tty.setraw(self._slave)  # raw before any host opens it: no echo, no CR mapping
        os.set_blocking(self._master, False)
        self.port = os.ttyname(self._slave)
        if self.symlink is not None:
            tmp = self.symlink.with_name(self.symlink.name + ".new")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.symlink(self.port, tmp)
            os.replace(tmp, self.symlink)
        self._plugged.set()

    def _close_pty(self) -> None:
        for fd in (self._master, self._slave):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._master = self._slave = -1

    def _run(self) -> None:
        next_tm = time.monotonic()
        while not self._stop.is_set():
            if not self._plugged.wait(0.02):
                continue
            master = self._master
            try:
                ready, _, _ = select.select([master], [], [], 0.02)
                data = os.read(master, 4096) if ready else b""
            except (OSError, ValueError):
                data = b""
                time.sleep(0.01)  # unplugged under our feet, or no host side yet
            now = time.monotonic()
            if data:
                for item in self._decoder.feed(data):
                    self._handle(item, now)
            if self.telemetry_period_s and now >= next_tm:
                next_tm = max(next_tm + self.telemetry_period_s, now)
                self.telemetry["uptime_s"] = int(now) & 0xFFFF
                self.send("telemetry", self.telemetry)
                self.telemetry_sent += 1

    def _handle(self, item, now: float) -> None:
        with self.lock:
            self.received.append(item)
        if not item.ok:
            return
        name = item.name
        if name in self.ignore and name != "hello_request":
            return  # never answered, nothing done
        if self.verifier is not None and name not in OPEN_REQUESTS:
            ok = item.auth == sign.AUTH_OK
            if name == "pair" and not ok and item.auth == sign.AUTH_NONE:
                ok = self.pairing_window
            if not ok:
                with self.lock:
                    self.refused.append((name, item.auth))
                if name != "heartbeat" or self.nack_heartbeats:
                    self._nack(item, C.ERR_UNAUTHORIZED, None, None)
                return
        if name == "heartbeat":
            with self.lock:
                self.heartbeats.append((now, dict(item.fields)))
            return
        if name == "hello_request":
            with self.lock:
                self.hello_requests += 1
            if self.answer_hello:
                self.send("hello", self.hello_fields(ref=item.seq))
            return
        rule = self.nack_rules.get(name)
        if rule is not None:
            self._nack(item, *rule)
            return
        if name == "pair" and self.verifier is not None:
            key = bytes(item.fields["key"])
            self.set_key(key)
            self.pairing_window = False
            with self.lock:
                self.paired_keys.append(key)
            if self.lose_pair_answers > 0:  # taken, but the answer never arrives
                self.lose_pair_answers -= 1
                return
        if name in self.replies:
            reply, fields = self.replies[name]
            if name == "selftest":
                self.send("ack", {"ref": item.seq, "ref_type": item.type})
            self.send(reply, dict(fields, ref=item.seq))
            return
        self.send("ack", {"ref": item.seq, "ref_type": item.type})

    def _nack(self, item, code, field, text) -> None:
        f = {"ref": item.seq, "ref_type": item.type, "code": code}
        if field:
            f["field"] = field
        if text:
            f["text"] = text
        self.send("nack", f)
