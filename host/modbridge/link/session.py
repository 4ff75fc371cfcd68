"""The serial link to one module: open, handshake, receive, heartbeat, commands, replug.

:class:`ModuleLink` owns one port and one thread. The thread reads everything
waiting on the port, feeds it to a stream decoder, updates the module's
:class:`~modbridge.model.ModuleStatus`, sends a heartbeat every
``heartbeat_period_s`` while the link is up, and completes the requests other threads
made with :meth:`ModuleLink.request`. When the port goes away (pyserial raises
``SerialException``; ``is_open`` stays True, so it is never trusted) the link goes
down, the port is closed and reopened with exponential backoff; the port path is
opened afresh each time, so a udev-style symlink that now points elsewhere is
followed. After every open: a 0x00 flush, ``hello_request``, and the ``hello`` fills
the module's identity. A module of another protocol major version is reported in
``status.last_error`` and never sent heartbeats or commands.

Signing (docs/pairing.md). A module that announces a ``nonce`` in its hello (a fresh
one every boot) verifies every command but the open reads (:data:`OPEN_REQUESTS`),
and uses a heartbeat only if it is signed. The link looks the module's key up in its
:class:`~modbridge.link.keys.KeyStore` by the hello's ``uid`` and signs with a
:class:`protocol.sign.Signer` of its own ``link_id`` over that nonce; every hello
(after a reset, a replug, or a ``hello_request`` when a boot banner or a refused
signature says the nonce may be stale) re-reads the key and the nonce. Timestamps are
taken under the write lock, so frames reach the module in timestamp order. Without a
usable key the link stays up and reads work; a command that needs a signature raises
:class:`NotPaired`, heartbeats are withheld (logged once: the module stays STANDALONE
and cools on its own), and ``status.last_error`` says to run ``modbridge pair``. A
module without a nonce in its hello (firmware from before signing) gets unsigned
frames, as it always did.

Supervision. The thread runs its loop under a supervisor: an exception that escapes
the loop (a bug in decoding, a handler, a callback path not already guarded) never
ends the thread. The port is closed, pending requests fail with :class:`LinkDown`,
and the loop starts over (reopen, hello) after a back-off that doubles per failure
from ``THREAD_BACKOFF_MIN_S`` to ``THREAD_BACKOFF_MAX_S``. The first failure of an
episode is logged at ERROR with its traceback and put in ``status.last_error``; the
rest of the episode at DEBUG. The episode ends (INFO "running again", back-off
reset) once the loop has run ``THREAD_HEALTHY_S`` without failing. Counters for the
status and the exporter: ``thread_restarts`` (every restart), ``thread_episodes``,
``thread_failing`` (in an episode now) and ``thread_error`` (the last failure, one
line). A lost port (``SerialException``/``OSError``) is not a failure: it is the
ordinary reconnect path.

Strings from the wire (the module's id, firmware version and board, a NACK's field
and text) go through :func:`modbridge.sanitize.sanitize` wherever they reach a log
line, ``status.last_error`` or an exception's message; the status fields
(``module_id``, ``fw_version``, ``board``) and :class:`CommandRefused`'s ``field``
and ``text`` keep the raw values, for matching, and whoever prints them sanitises.

The link only reports: deciding that a silent module is a problem (``last_frame_at``
too old) is the policy's job.

Cost. A thread wake-up is what costs (about 50 us of CPU on a small VM even for a
bare ``sleep``), so the loop is paced rather than woken by every byte or frame: it
sleeps on an event until the next poll (``POLL_PERIOD_S``, twice a second) or the
next heartbeat, whichever comes first, then makes one non-blocking ``in_waiting`` +
``read(max(1, in_waiting))`` for everything that arrived (5 telemetry frames at
10 Hz). Frames are therefore stamped (``last_frame_at``) up to ``POLL_PERIOD_S``
after they arrived. While a request waits for its answer, during the handshake, or
after a read of more than ``BIG_READ`` bytes (the tty buffer must not overflow), it
polls every ``FAST_POLL_S``, so answers come back within ~10 ms. A pyserial read on
an unplugged port raises at once, so an unplug is seen within one poll. Good binary
frames take a CPython fast path (:class:`HostDecoder`), 2-4x cheaper than the
pure-Python reference decoder it falls back to for anything unusual.
"""

from __future__ import annotations

import binascii
import errno
import logging
import random
import threading
import time
from collections.abc import Callable

import cbor2
import serial

from modbridge.errors import ModbridgeError
from modbridge.link.keys import PAIRING_WINDOW_S, KeyStore, KeyStoreError
from modbridge.model import ModuleStatus
from modbridge.sanitize import sanitize
from protocol import VERSION_MAJOR, VERSION_MINOR
from protocol import catalog as C
from protocol.errors import ProtocolError
from protocol.frame import MIN_FRAME, StreamDecoder, encode_frame
from protocol.message import FMT_CBOR, Message, fields_from_keys, lookup
from protocol.sign import Signer

log = logging.getLogger(__name__)

BAUDRATE = 115200
POLL_PERIOD_S = 0.5  # pacing of the read loop (telemetry is processed <= this late)
FAST_POLL_S = 0.01  # while a request is pending, during the handshake, after a big read
BIG_READ = 1024  # bytes in one read that mean "more is coming": poll again soon
WRITE_TIMEOUT_S = 0.5
HELLO_TIMEOUT_S = 1.0  # first wait for a hello; doubles per retry up to BACKOFF_MAX_S
HELLO_TRIES = 3  # unanswered hello_requests before last_error says so
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
BACKOFF_JITTER = 0.2  # +-20 %
STOP_TIMEOUT_S = 2.0
THREAD_BACKOFF_MIN_S = 0.1  # first restart of the loop after an escaped exception
THREAD_BACKOFF_MAX_S = 5.0
THREAD_HEALTHY_S = 30.0  # this long without a failure ends an episode
RECENT_EVENTS = 32
BANNER_PREFIX = b"MODULER READY v"
DEFAULT_MAX_FRAME = 512  # until the module's hello says otherwise

# Default answer timeouts (SPEC 10: at least 1 s; more for flash and sampling).
REQUEST_TIMEOUT_S = 1.0
_REQUEST_TIMEOUTS = {"config_save": 3.0, "config_reset": 3.0, "cal_read": 5.0, "selftest": 20.0}
# Requests answered by something other than ack; selftest is acked first, then reported.
_FINAL_REPLY = {
    "hello_request": "hello",
    "config_get": "config",
    "cal_read": "cal_raw",
    "selftest": "selftest_report",
}
_REPLY_TYPES = ("ack", "nack", "config", "cal_raw", "selftest_report")
#: Requests a signing module accepts unsigned (reads); every other one, and every
#: heartbeat, is signed.
OPEN_REQUESTS = ("hello_request", "config_get", "cal_read")
LINK_ID = 0  # the bridge's signing link id (one link per module: exclusive open)

# link states
DOWN = "down"  # port closed (not opened yet, or lost): reopening with backoff
HANDSHAKE = "handshake"  # port open, waiting for the module's hello
UP = "up"  # hello received, protocol compatible: heartbeats flow
INCOMPATIBLE = "incompatible"  # the module speaks another major version
STOPPED = "stopped"


# ----------------------------------------------------------------------------- errors


class LinkError(ModbridgeError):
    """The serial link to a module failed; the message says what to do."""


class PortNotFound(LinkError):
    """The port path does not exist (module unplugged, wrong path)."""


class PortPermissionDenied(LinkError):
    """The user may not open the port."""


class PortBusy(LinkError):
    """Another process holds the port."""


class IncompatibleModule(LinkError):
    """The module speaks another protocol major version."""


class LinkDown(LinkError):
    """A request was made while the link is not up."""


class RequestTimeout(LinkError):
    """The module did not answer a request in time."""


class BadRequest(LinkError):
    """A request that does not fit the protocol catalog (never sent)."""


class NotPaired(LinkError):
    """The module verifies signatures and the key store has no usable key for it."""


class CommandRefused(LinkError):
    """The module answered a request with a NACK; nothing changed on the module."""

    def __init__(self, port: str, request: str, nack: Message):
        code = nack.fields.get("code", 0)
        self.code = code
        self.code_name = C.ERRORS[code] if 0 <= code < len(C.ERRORS) else str(code)
        self.field = nack.fields.get("field")
        self.text = nack.fields.get("text")
        self.nack = nack
        where = f" ({sanitize(self.field)})" if self.field else ""
        detail = f": {sanitize(self.text)}" if self.text else ""
        super().__init__(f"{port}: module refused {request}: {self.code_name}{where}{detail}")


class Unauthorized(CommandRefused):
    """The module refused a signed request's signature (wrong key, or a replay)."""

    def __init__(self, port: str, request: str, nack: Message, hint: str):
        super().__init__(port, request, nack)
        self.args = (f"{self.args[0]}: {hint}",)


def not_paired_text(port: str, uid: str, why: str | None = None) -> str:
    detail = f" ({why})" if why else ""
    return f"module {sanitize(uid)} is not paired{detail}: run `modbridge pair {port}`"


def version_error_text(major: int, minor: int | None = None) -> str:
    theirs = f"{major}.{minor}" if minor is not None else f"{major}.x"
    return (
        f"module speaks protocol {theirs}, modbridge speaks {VERSION_MAJOR}.x: "
        "upgrade modbridge or reflash the module"
    )


def open_error(port: str, exc: BaseException) -> LinkError:
    """Map an exception from opening ``port`` to a one-line error that says what to do."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in (errno.EACCES, errno.EPERM) or isinstance(exc, PermissionError):
        return PortPermissionDenied(
            f"{port}: permission denied: add your user to the dialout group "
            "(sudo usermod -aG dialout $USER) and log in again"
        )
    if code in (errno.EBUSY, errno.EAGAIN, errno.EWOULDBLOCK) or "exclusively lock" in text:
        return PortBusy(f"{port}: port in use by another program (another modbridge? mpremote?)")
    if code in (errno.ENOENT, errno.ENODEV, errno.ENXIO) or isinstance(exc, FileNotFoundError):
        return PortNotFound(
            f"{port}: no such port: is the module plugged in? `modbridge list` shows modules"
        )
    return LinkError(f"{port}: cannot open: {text}")


def open_port(port: str, open_fn: Callable = serial.Serial, timeout: float = 0):
    """Open ``port`` exclusively at 115200 8N1; raises a :class:`LinkError` subclass.

    ``timeout`` is pyserial's read timeout: 0 (the link's choice) makes reads
    non-blocking, the link paces itself.
    """
    try:
        return open_fn(
            port, BAUDRATE, timeout=timeout, write_timeout=WRITE_TIMEOUT_S, exclusive=True
        )
    except (serial.SerialException, OSError) as e:
        raise open_error(port, e) from e


# ----------------------------------------------------------------------------- decoder


def _cobs_decode(enc: bytes) -> bytes | None:
    """Canonical COBS decode block by block (slices, not bytes); None if malformed."""
    out = bytearray()
    i = 0
    n = len(enc)
    while i < n:
        code = enc[i]
        j = i + code
        if code == 0 or j > n:
            return None
        out += enc[i + 1 : j]
        i = j
        if code < 0xFF and i < n:
            out.append(0)
    return bytes(out)


_INT_MIN = -(1 << 64)
_INT_MAX = (1 << 64) - 1
_MAX_DEPTH = 8


def _plain(value, depth: int) -> bool:
    """True if ``value`` holds only what the project's CBOR subset can carry."""
    t = type(value)
    if t is int:
        return _INT_MIN <= value <= _INT_MAX
    if t is str or t is bytes or t is bool or t is float:
        return True
    if depth >= _MAX_DEPTH:
        return False
    if t is list:
        return all(_plain(v, depth + 1) for v in value)
    if t is dict:
        for k, v in value.items():
            if type(k) not in (int, str, bytes) or not _plain(k, depth + 1):
                return False
            if not _plain(v, depth + 1):
                return False
        return True
    return False  # None, tags, datetimes, sets, ...: the reference decoder decides


class Banner:
    """A boot banner line (``MODULER READY v<fw>``) seen on the stream."""

    ok = False
    kind = "banner"

    def __init__(self, fw_version: str):
        self.fw_version = fw_version


class HostDecoder(StreamDecoder):
    """:class:`~protocol.frame.StreamDecoder` for module -> host traffic, CPython fast.

    A binary frame is first tried on a fast path (slice-wise COBS,
    ``binascii.crc_hqx`` for the CRC-16/IBM-3740, ``cbor2`` for the payload, accepted
    only when ``cbor2`` re-encodes it to the very same bytes and every value is of a
    subset type, then the catalog's own ``fields_from_keys``). Anything the fast path
    does not accept outright goes to the reference decoder, which decides and counts;
    so results are identical, only cheaper for good frames. Also records the peer's
    version when a frame of another major version arrives (``peer_version``) and
    yields a :class:`Banner` item (before the ``noise`` it is counted as) for a boot
    banner line.
    """

    def __init__(self):
        super().__init__(accept=C.D2H)
        self.peer_version: tuple[int, int] | None = None
        self.fast_frames = 0

    def _end_binary(self, out):
        enc = bytes(self._buf[: self._n])
        raw = _cobs_decode(enc)
        if raw is not None and MIN_FRAME <= len(raw) <= len(self._raw):
            n = len(raw)
            if binascii.crc_hqx(raw[: n - 2], 0xFFFF) == (raw[n - 2] << 8) | raw[n - 1]:
                if raw[0] != VERSION_MAJOR:
                    self.peer_version = (raw[0], raw[1])
                else:
                    msg = _fast_message(raw)
                    if msg is not None:
                        self._n = 0
                        self._state = 0  # _IDLE
                        self.frames += 1
                        self.fast_frames += 1
                        out.append(msg)
                        return
        super()._end_binary(out)

    def _end_text(self, out):
        line = bytes(self._buf[: self._n]).strip()
        if line.startswith(BANNER_PREFIX):
            fw = line[len(BANNER_PREFIX) :].decode("ascii", "replace")
            out.append(Banner(fw))
        super()._end_text(out)


_INT_KINDS = (C.K_UINT, C.K_INT, C.K_ENUM)
_fast_specs: dict = {}


def _fast_spec(mdef):
    """key -> (name, kind, lo, hi) of a message's fields, and its required names."""
    spec = _fast_specs.get(mdef[C.M_TYPE])
    if spec is None:
        by_key = {
            f[C.F_KEY]: (f[C.F_NAME], f[C.F_KIND], f[C.F_LO], f[C.F_HI]) for f in mdef[C.M_FIELDS]
        }
        required = frozenset(f[C.F_NAME] for f in mdef[C.M_FIELDS] if f[C.F_REQUIRED])
        spec = _fast_specs[mdef[C.M_TYPE]] = (by_key, required)
    return spec


def _fast_fields(mdef, keyed: dict) -> dict | None:
    """The catalog check of ``fields_from_keys`` for the common cases (integer, bool
    and text fields, integer keys); None for anything else, which then goes the
    reference way. A differential test keeps the two in agreement."""
    by_key, required = _fast_spec(mdef)
    out = {}
    prev = -1
    for k, v in keyed.items():
        if type(k) is not int or k <= prev:  # ascending keys: same field order as the catalog
            return None
        prev = k
        tv = type(v)
        if tv is int and not _INT_MIN <= v <= _INT_MAX:
            return None
        f = by_key.get(k)
        if f is None:  # a newer minor's field: ignored, if it is a plain int
            if tv is int:
                continue
            return None
        name, kind, lo, hi = f
        if tv is int:
            if kind not in _INT_KINDS:
                return None
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                return None
            if kind == C.K_UINT and v < 0:
                return None
        elif tv is bool:
            if kind != C.K_BOOL:
                return None
        elif tv is str:
            if (
                kind != C.K_STR
                or (lo is not None and len(v) < lo)
                or (hi is not None and len(v) > hi)
            ):
                return None
        else:
            return None
        out[name] = v
    if not required.issubset(out):
        return None
    return out


def _fast_message(raw: bytes) -> Message | None:
    mdef = C.by_type(raw[2])
    if mdef is None or mdef[C.M_DIR] != C.D2H:
        return None
    payload = raw[5:-2]
    if payload:
        try:
            keyed = cbor2.loads(payload)
            if type(keyed) is not dict or cbor2.dumps(keyed) != payload:
                return None
        except Exception:  # noqa: BLE001 - anything odd: the reference decoder decides
            return None
    else:
        keyed = {}
    fields = _fast_fields(mdef, keyed)
    if fields is None:
        if not _plain(keyed, 0):
            return None
        try:
            fields = fields_from_keys(mdef, keyed)
        except ProtocolError:
            return None
    seq = (raw[3] << 8) | raw[4]
    return Message(raw[2], mdef[C.M_NAME], seq, fields, raw[1], FMT_CBOR)


# ----------------------------------------------------------------------------- link


class _Pending:
    __slots__ = ("name", "type", "final", "done", "reply", "acked")

    def __init__(self, name: str, type_id: int, final: str | None):
        self.name = name
        self.type = type_id
        self.final = final  # reply type that completes it; None: ack
        self.done = threading.Event()
        self.reply: Message | None = None
        self.acked = False


def _wire_int(v):
    """Heartbeat values must be ints on the wire; round floats, keep the rest for the check."""
    if isinstance(v, float) and v == v and abs(v) < 1e12:
        return round(v)
    return v


class ModuleLink:
    """One module on one serial port, served by its own daemon thread.

    ``heartbeat_source()`` returns the heartbeat fields in wire units (``gpu_temp``
    m degC, ``gpu_power``/``power_limit`` mW, ``gpu_mem_temp``, ``host_time`` s,
    ``period_ms``); None values are omitted, ``host_time`` and ``period_ms`` are
    filled in when absent, and a source returning None (no GPU reading right now)
    still sends a heartbeat (the host is alive). The source, ``on_telemetry(status,
    msg)`` and ``on_event(status, msg)`` run in the link thread and must be quick
    (return cached GPU readings; never run nvidia-smi from here).

    ``keys`` is the :class:`~modbridge.link.keys.KeyStore` the module's key is looked up in
    (default: ``KeyStore()``, see :func:`modbridge.link.keys.default_dir`); ``link_id`` the
    signing link id (the module keeps one replay slot per ``link_id & 7``). After a
    hello: ``signing_supported``, ``nonce``, ``paired`` (the module's word),
    ``key_error`` (why commands and heartbeats cannot be signed, or None),
    ``heartbeats_withheld`` and ``auth_refusals``.
    """

    def __init__(
        self,
        port: str,
        status: ModuleStatus | None = None,
        heartbeat_period_s: float = 1.0,
        heartbeat_source: Callable[[], dict | None] | None = None,
        on_event: Callable | None = None,
        on_telemetry: Callable | None = None,
        clock: Callable[[], float] = time.monotonic,
        open_fn: Callable = serial.Serial,
        poll_period_s: float = POLL_PERIOD_S,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        keys: KeyStore | None = None,
        link_id: int = LINK_ID,
    ):
        self.port = port
        self.status = status if status is not None else ModuleStatus(port=port)
        self.heartbeat_period_s = heartbeat_period_s
        self.heartbeat_source = heartbeat_source
        self.on_event = on_event
        self.on_telemetry = on_telemetry
        self.clock = clock
        self.open_fn = open_fn
        self.poll_period_s = poll_period_s
        self.hello_timeout_s = hello_timeout_s

        self.state = DOWN
        self.max_frame = DEFAULT_MAX_FRAME
        self.telemetry_ms: int | None = None
        self.heartbeats_sent = 0
        self.decoder = HostDecoder()
        # signing (see the module docstring)
        self.keys = keys if keys is not None else KeyStore()
        self.link_id = link_id
        self.signing_supported = False  # the module's hello carries a nonce
        self.nonce: bytes | None = None
        self.paired: bool | None = None  # the module's hello: it has a secret
        self.key_error: str | None = None  # why there is no signer (None: signing, or n/a)
        self.heartbeats_withheld = 0  # not sent: the module would not use them unsigned
        self.auth_refusals = 0  # nacks "unauthorized" from the module
        self._key: bytes | None = None
        self._signer: Signer | None = None
        self._last_ts = 0  # the last signature timestamp this link sent (any signer)
        self._nonce_stale = False  # a boot banner: wait for the new hello before signing
        self._auth_rehello = False  # a refused heartbeat asked for a fresh nonce already
        self._key_error_shown: str | None = None  # the last_error the key situation set

        self._ser = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: poll now (stop, a new request)
        self._up = threading.Condition()
        self._wlock = threading.Lock()
        self._seq_lock = threading.Lock()
        self._seq = 0
        self._pending: dict[int, _Pending] = {}
        self._plock = threading.Lock()
        self._rng = random.Random()
        self._backoff = BACKOFF_MIN_S
        self._lost_once = False  # the port was open before: a reopen is a reconnect
        self._next_hb = 0.0
        self._hello_seqs: set[int] = set()
        self._hello_deadline = 0.0
        self._hello_tries = 0
        self._banner_reset = False
        self._flush_next = False
        self._logged: set[str] = set()
        # supervision (see the module docstring)
        self.thread_restarts = 0
        self.thread_episodes = 0
        self.thread_failing = False
        self.thread_error: str | None = None
        self._thread_backoff = THREAD_BACKOFF_MIN_S
        self._failed_at = 0.0  # time.monotonic() of the last escaped exception

    # -- lifecycle -------------------------------------------------------------------
    def start(self, fail_fast: bool = True) -> ModuleLink:
        """Open the port and start the link thread.

        With ``fail_fast`` the first open happens here and a busy port or a
        permission problem raises (they will not fix themselves); a missing port
        never raises, the thread keeps trying (the module may be plugged in later;
        ``status.last_error`` says so). Without it every error is retried.
        """
        if self._thread is not None:
            raise RuntimeError("link already started")
        if fail_fast:
            try:
                self._ser = open_port(self.port, self.open_fn)
            except (PortBusy, PortPermissionDenied) as e:
                self.status.last_error = str(e)
                raise
            except LinkError as e:
                self._note_error(e)
            else:
                self._opened()
        self._thread = threading.Thread(
            target=self._run, name=f"modbridge-link {self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the thread and close the port; joins within ``timeout``."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if t.is_alive():
                log.warning("%s: link thread did not stop within %.1f s", self.port, timeout)
        if t is None:
            self._close()
        self._set_state(STOPPED)
        self._fail_pending(LinkDown(f"{self.port}: link stopped"))

    def __enter__(self) -> ModuleLink:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def link_up(self) -> bool:
        return self.state == UP

    def wait_up(self, timeout: float) -> bool:
        """Block until the link is up (or ``timeout`` s pass); returns link_up."""
        with self._up:
            return self._up.wait_for(lambda: self.state == UP, timeout)

    def wait_state(self, pred: Callable[[ModuleLink], bool], timeout: float) -> bool:
        """Block until ``pred(link)`` holds (checked on every state change)."""
        with self._up:
            return self._up.wait_for(lambda: pred(self), timeout)

    # -- requests --------------------------------------------------------------------
    def request(self, name: str, fields: dict | None = None, timeout: float | None = None):
        """Send a command and wait for its answer; thread-safe.

        Returns the answering Message (``ack``, or ``config``/``cal_raw``/``hello``/
        ``selftest_report`` for the requests answered that way). Signed when the
        module verifies signatures and ``name`` is not an open read. Raises
        :class:`CommandRefused` on a NACK (``code``, ``code_name``, ``field``,
        ``text``; :class:`Unauthorized` for a refused signature, after one retry with
        a fresh nonce), :class:`NotPaired` (no key: never sent), :class:`RequestTimeout`,
        :class:`LinkDown`, :class:`BadRequest`.
        """
        if not self.signing_supported or name in OPEN_REQUESTS:
            return self._exchange(name, fields, timeout, None)
        signer = self._need_signer(name)
        used = signer.nonce
        try:
            return self._exchange(name, fields, timeout, signer)
        except CommandRefused as e:
            if e.code != C.ERR_UNAUTHORIZED:
                raise
            if self.nonce == used:  # no new hello meanwhile: did the module reboot?
                try:
                    self._exchange("hello_request", None, None, None)
                except LinkError:
                    raise self._unauthorized(name, e.nack) from None
                if self.nonce == used:
                    raise self._unauthorized(name, e.nack) from None
        return self._exchange(name, fields, timeout, self._need_signer(name))

    def request_with_key(self, name: str, fields: dict | None, key: bytes | None,
                         timeout: float | None = None):  # fmt: skip
        """:meth:`request`, signed with ``key`` (None: unsigned) instead of the store's
        key, whatever the catalog needs (``modbridge pair``). No retry."""
        signer = None
        if key is not None:
            if self.nonce is None:
                raise NotPaired(f"{self.port}: the module announced no nonce: cannot sign")
            signer = self._make_signer(key)
        try:
            return self._exchange(name, fields, timeout, signer)
        except CommandRefused as e:
            if e.code == C.ERR_UNAUTHORIZED:
                raise self._unauthorized(name, e.nack, key is None) from None
            raise

    def use_key(self, key: bytes) -> None:
        """Sign with ``key`` from now on (after ``pair`` changed the module's secret)."""
        signer = self._make_signer(key)
        with self._wlock:
            self._key = bytes(key)
            self._signer = signer
            self.key_error = None
            self._auth_rehello = False

    def refresh_hello(self, timeout: float | None = None) -> bool | None:
        """Re-read the module's hello (identity, nonce, key); returns its ``paired``."""
        self._exchange("hello_request", None, timeout, None)
        return self.paired

    def _need_signer(self, name: str) -> Signer:
        signer = self._signer
        if signer is not None and self._nonce_stale:  # just rebooted: its nonce is due
            if not self.wait_state(lambda lk: not lk._nonce_stale, REQUEST_TIMEOUT_S):
                raise LinkDown(
                    f"{self.port}: cannot send {name}: the module restarted and its "
                    "new hello (the nonce to sign with) has not arrived yet"
                )
            signer = self._signer
        if signer is None:
            uid = sanitize(self.status.module_id or "?")
            why = self.key_error or not_paired_text(self.port, uid)
            raise NotPaired(f"{self.port}: cannot send {name}: {why}")
        return signer

    def _make_signer(self, key: bytes) -> Signer:
        signer = Signer(bytes(key), link_id=self.link_id)
        signer.nonce = self.nonce
        return signer

    def _unauthorized(self, name: str, nack: Message, unsigned: bool = False) -> Unauthorized:
        uid = sanitize(self.status.module_id or "?")
        if unsigned:
            hint = "the module needs a signed command (is it paired? `modbridge pair`)"
        else:
            try:
                raw = self.status.module_id or "?"
                where = self.keys.find(raw) or self.keys.path(raw)
            except KeyStoreError:
                where = self.keys.dir
            hint = (
                f"module {uid} does not accept our signature: the key in {where} is not "
                f"its secret (or this host's clock went back); run "
                f"`modbridge pair --force {self.port}`"
            )
        return Unauthorized(self.port, name, nack, hint)

    def _exchange(self, name: str, fields: dict | None, timeout: float | None,
                  signer: Signer | None):  # fmt: skip
        if timeout is None:
            timeout = _REQUEST_TIMEOUTS.get(name, REQUEST_TIMEOUT_S)
        if self.state != UP:
            why = self.status.last_error or f"link is {self.state}"
            raise LinkDown(f"{self.port}: cannot send {name}: {why}")
        try:
            mdef = lookup(name)
        except ProtocolError as e:
            raise BadRequest(f"{self.port}: {e}") from None
        if mdef[C.M_DIR] != C.H2D or name == "heartbeat":
            raise BadRequest(f"{self.port}: {name} is not a request modbridge can send")
        seq = self._next_seq()
        try:
            encode_frame(name, fields or {}, seq)  # validate before taking a timestamp
        except ProtocolError as e:
            raise BadRequest(f"{self.port}: {name}: {e}") from None
        p = _Pending(name, mdef[C.M_TYPE], _FINAL_REPLY.get(name))
        with self._plock:
            self._pending[seq] = p
        self._wake.set()  # the loop switches to fast polling until the answer is in
        try:
            try:
                self._send(name, fields or {}, seq, signer)
            except (serial.SerialException, OSError) as e:
                raise LinkDown(f"{self.port}: cannot send {name}: {e}") from None
            if not p.done.wait(timeout):
                raise RequestTimeout(f"{self.port}: no answer to {name} within {timeout:g} s")
        finally:
            with self._plock:
                self._pending.pop(seq, None)
        reply = p.reply
        if isinstance(reply, LinkError):
            raise reply
        if reply.name == "nack":
            raise CommandRefused(self.port, name, reply)
        return reply

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        """The thread: :meth:`_loop` under a supervisor that restarts it."""
        try:
            while not self._stop.is_set():
                try:
                    self._loop()
                except BaseException as e:  # noqa: BLE001 - the supervisor: restart, never die
                    self._loop_failed(e)
        finally:
            self._close()
            self._set_state(STOPPED)

    def _loop(self) -> None:
        """Open, service, wait, until stopped; a lost port is reopened here. Anything
        else that raises escapes to the supervisor (:meth:`_run`)."""
        while not self._stop.is_set():
            if self.thread_failing and time.monotonic() - self._failed_at >= THREAD_HEALTHY_S:
                self._loop_recovered()
            try:
                if self._ser is None:
                    if not self._try_open():
                        self._sleep_backoff()
                        continue
                delay = self._service()
            except (serial.SerialException, OSError) as e:
                self._lost(e)
                continue
            self._wait(delay)

    def _loop_failed(self, exc: BaseException) -> None:
        """An exception escaped the loop: report (once per episode), clean up, back off."""
        now = time.monotonic()
        self.thread_restarts += 1
        self._failed_at = now
        self.thread_error = f"{type(exc).__name__}: {sanitize(exc)}"
        msg = f"{self.port}: link thread failed ({self.thread_error}): restarting it"
        if not self.thread_failing:
            self.thread_failing = True
            self.thread_episodes += 1
            self._thread_backoff = THREAD_BACKOFF_MIN_S
            log.error(
                "%s (logged once until it runs %g s without failing; restarts are counted "
                "in thread_restarts)",
                msg, THREAD_HEALTHY_S, exc_info=exc,
            )  # fmt: skip
        else:
            self._thread_backoff = min(self._thread_backoff * 2, THREAD_BACKOFF_MAX_S)
            log.debug("%s (restart %d)", msg, self.thread_restarts)
        try:
            self.status.last_error = msg
            self._lost_once = True  # the reopen counts as a reconnect
            self._close()
            self._set_state(DOWN)
            self._fail_pending(LinkDown(f"{self.port}: link thread restarted"))
        except Exception:  # noqa: BLE001 - the port state is unknown: reopen anyway
            log.debug("%s: cleaning up after a link thread failure", self.port, exc_info=True)
            self._ser = None
        delay = self._thread_backoff * self._rng.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
        self._stop.wait(delay)

    def _loop_recovered(self) -> None:
        self.thread_failing = False
        self._thread_backoff = THREAD_BACKOFF_MIN_S
        log.info(
            "%s: link thread running again (%g s without failing; %d restarts so far)",
            self.port, THREAD_HEALTHY_S, self.thread_restarts,
        )  # fmt: skip

    def _try_open(self) -> bool:
        try:
            self._ser = open_port(self.port, self.open_fn)
        except LinkError as e:
            self._note_error(e)
            return False
        self._opened()
        return True

    def _opened(self) -> None:
        if self._lost_once:
            self.status.reconnects += 1
            log.info("%s: port reopened (reconnect %d)", self.port, self.status.reconnects)
        self.decoder.reset()
        self._hello_seqs.clear()
        self._hello_tries = 0
        self._flush_next = True
        self._set_state(HANDSHAKE)
        self._send_hello_request(self.clock())

    def _wait(self, delay: float) -> None:
        """Sleep until the next poll; a request or stop() wakes it early."""
        self._wake.wait(delay)
        self._wake.clear()

    def _service(self) -> float:
        """One poll: read what is waiting, dispatch it, run the timers.

        Returns how long to sleep before the next poll. The read is non-blocking;
        on an unplugged port it raises (``in_waiting`` alone would not notice).
        """
        ser = self._ser
        n = ser.in_waiting
        data = ser.read(n if n > 0 else 1)
        now = self.clock()
        if data:
            for item in self.decoder.feed(data):
                self._dispatch(item, now)
        state = self.state
        if state == UP:
            if now >= self._next_hb:
                self._send_heartbeat(now)
            deadline = self._next_hb
            if self._nonce_stale:  # a reset without its hello yet: ask (again)
                if now >= self._hello_deadline:
                    self._send_hello_request(now)
                deadline = min(deadline, self._hello_deadline)
        elif state == HANDSHAKE:
            if now >= self._hello_deadline:
                if self._hello_tries >= HELLO_TRIES:
                    self._note_error(
                        LinkError(
                            f"{self.port}: no hello from the module after "
                            f"{self._hello_tries} tries: is the modbridge firmware running on it?"
                        )
                    )
                self._send_hello_request(now)
            deadline = self._hello_deadline
        else:
            deadline = now + self.poll_period_s
        delay = min(self.poll_period_s, deadline - now)
        if (
            self._pending
            or len(data) >= BIG_READ
            or (state == HANDSHAKE and self._hello_tries <= 1)
        ):
            delay = min(delay, FAST_POLL_S)  # an answer is due, or more data: fetch it soon
        return max(delay, 0.0)

    def _lost(self, exc: BaseException) -> None:
        was = self.state
        self._close()
        self._lost_once = True
        if not self._stop.is_set():
            msg = f"{self.port}: link lost: {exc}"
            self.status.last_error = msg
            if was in (UP, HANDSHAKE, INCOMPATIBLE):
                log.warning("%s", msg)
            self._set_state(DOWN)
            self._fail_pending(LinkDown(f"{self.port}: link lost"))
            self._sleep_backoff()

    def _sleep_backoff(self) -> None:
        delay = self._backoff * self._rng.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        self._stop.wait(min(delay, BACKOFF_MAX_S))

    def _close(self) -> None:
        ser, self._ser = self._ser, None
        if ser is not None:
            try:
                ser.close()
            except Exception:  # noqa: BLE001 - the port is gone anyway
                pass
        if self.state in (UP, HANDSHAKE, INCOMPATIBLE):
            self._set_state(DOWN)

    def _set_state(self, state: str) -> None:
        with self._up:
            self.state = state
            self.status.link_up = state == UP
            self._up.notify_all()

    def _note_error(self, err: LinkError) -> None:
        """Record an error; log each distinct message once (a retry loop must not spam)."""
        msg = sanitize(err, None)
        self.status.last_error = msg
        if msg not in self._logged:
            self._logged.add(msg)
            log.warning("%s", msg)

    # -- sending ---------------------------------------------------------------------
    def _next_seq(self) -> int:
        with self._seq_lock:
            s = self._seq
            self._seq = (s + 1) & 0xFFFF
            return s

    def _send(self, name: str, fields: dict, seq: int, signer: Signer | None) -> None:
        """Encode (signing with ``signer``) and write one frame.

        The signature's timestamp is taken under the write lock: frames of one link
        reach the module in timestamp order (a later timestamp sent first would make
        the earlier frame a replay)."""
        if signer is None:
            frame = encode_frame(name, fields, seq)
            self._check_size(name, frame)
            self._write(frame)
            return
        if self._ser is None:
            raise serial.SerialException("port is closed")
        with self._wlock:
            # one timestamp sequence per link id, whichever signer (key) signs
            signer.last_ts = max(signer.last_ts, self._last_ts)
            try:
                frame = encode_frame(name, fields, seq, signer=signer)
            except ProtocolError as e:
                raise BadRequest(f"{self.port}: {name}: {e}") from None
            self._last_ts = signer.last_ts
            self._check_size(name, frame)
            self._write_locked(frame)

    def _check_size(self, name: str, frame: bytes) -> None:
        if len(_cobs_decode(frame[:-1]) or b"") > self.max_frame:
            raise BadRequest(
                f"{self.port}: {name} is larger than the module's {self.max_frame}-byte frames"
            )

    def _write(self, frame: bytes) -> None:
        with self._wlock:
            self._write_locked(frame)

    def _write_locked(self, frame: bytes) -> None:
        ser = self._ser
        if ser is None:
            raise serial.SerialException("port is closed")
        if self._flush_next:
            frame = b"\x00" + frame
            self._flush_next = False
        try:
            ser.write(frame)
        except serial.SerialTimeoutException:
            # The module is not reading (host_silence, a full pty): not a lost
            # port. Start the next frame with a flush (the module resyncs).
            self._flush_next = True
            self._note_error(LinkError(f"{self.port}: write timed out: module not reading"))

    def _send_hello_request(self, now: float) -> None:
        seq = self._next_seq()
        self._hello_seqs.add(seq)
        self._write(encode_frame("hello_request", None, seq))
        timeout = min(self.hello_timeout_s * (2**self._hello_tries), BACKOFF_MAX_S)
        self._hello_tries += 1
        self._hello_deadline = now + timeout

    def heartbeat_fields(self) -> dict:
        """The next heartbeat's fields (wire units), from ``heartbeat_source``."""
        fields = {}
        if self.heartbeat_source is not None:
            try:
                got = self.heartbeat_source()
            except Exception:  # noqa: BLE001 - a broken source must not stop heartbeats
                if "hb-source" not in self._logged:
                    self._logged.add("hb-source")
                    log.exception("%s: heartbeat source failed", self.port)
                got = None
            if got:
                fields = {k: _wire_int(v) for k, v in got.items() if v is not None}
        fields.setdefault("host_time", int(time.time()) & 0xFFFFFFFF)
        fields.setdefault("period_ms", min(int(self.heartbeat_period_s * 1000), 600000))
        return fields

    def _send_heartbeat(self, now: float) -> None:
        period = self.heartbeat_period_s
        self._next_hb = self._next_hb + period if self._next_hb + period > now else now + period
        fields = self.heartbeat_fields()
        seq = self._next_seq()
        for _ in range(len(fields) + 1):
            try:
                frame = encode_frame("heartbeat", fields, seq)
                break
            except ProtocolError as e:
                bad = getattr(e, "field", None)
                key = f"hb-field {bad}"
                if key not in self._logged:
                    self._logged.add(key)
                    log.warning("%s: heartbeat field dropped: %s", self.port, e)
                if bad not in fields:
                    return
                del fields[bad]
        else:  # pragma: no cover - every loop drops a field or breaks
            return
        if not self.signing_supported:
            self._write(frame)
            self.heartbeats_sent += 1
            return
        signer = self._signer
        if signer is None or self._nonce_stale:
            self.heartbeats_withheld += 1  # an unsigned one would not count: not sent
            return
        try:
            self._send("heartbeat", fields, seq, signer)
        except BadRequest as e:
            self._note_error(e)
            return
        self.heartbeats_sent += 1

    # -- receiving -------------------------------------------------------------------
    def _dispatch(self, item, now: float) -> None:
        st = self.status
        if item.ok:
            st.frames_total += 1
            st.last_frame_at = now
            name = item.name
            if name == "telemetry":
                st.telemetry = item.fields
                st.telemetry_at = now
                st.telemetry_seq = item.seq  # a frozen seq is stale telemetry (policy)
                self._callback(self.on_telemetry, item)
            elif name == "event":
                self._on_event(item, now)
            elif name == "hello":
                self._on_hello(item, now)
            elif name in _REPLY_TYPES:
                self._on_reply(item)
            return
        if isinstance(item, Banner):
            self._on_banner(item)
            return
        st.frame_errors[item.kind] += 1
        if item.kind == "version":
            self._incompatible(version_error_text(*(self.decoder.peer_version or (0, None))))

    def _callback(self, fn, msg) -> None:
        if fn is None:
            return
        try:
            fn(self.status, msg)
        except Exception:  # noqa: BLE001 - a callback bug must not break the link
            key = f"cb {getattr(fn, '__name__', fn)}"
            if key not in self._logged:
                self._logged.add(key)
                log.exception("%s: %s callback failed", self.port, msg.name)

    def _on_event(self, msg: Message, now: float) -> None:
        code = msg.fields["code"]
        name = C.REASONS[code] if 0 <= code < len(C.REASONS) else str(code)
        st = self.status
        st.events_total[name] += 1
        ev = dict(msg.fields)
        ev["reason"] = name
        ev["at"] = now
        st.recent_events.append(ev)
        if len(st.recent_events) > RECENT_EVENTS:
            del st.recent_events[: len(st.recent_events) - RECENT_EVENTS]
        self._callback(self.on_event, msg)

    def _on_banner(self, banner: Banner) -> None:
        if self.state in (UP, INCOMPATIBLE):
            self.status.module_resets += 1
            self._banner_reset = True
            log.info("%s: module restarted (firmware %s)", self.port, sanitize(banner.fw_version))
            if self.state == UP and self.signing_supported:
                # a new boot, a new nonce: sign nothing until its hello is in (asked
                # for too, in case the boot hello is lost)
                self._nonce_stale = True
                self._send_hello_request(self.clock())

    def _on_hello(self, msg: Message, now: float) -> None:
        f = msg.fields
        st = self.status
        ref = f.get("ref")
        solicited = ref is not None and ref in self._hello_seqs
        if self.state in (UP, INCOMPATIBLE) and not solicited:
            with self._plock:
                requested = ref is not None and ref in self._pending
            if not requested:
                if self._banner_reset:
                    self._banner_reset = False
                else:
                    st.module_resets += 1
                    log.info("%s: module restarted (unsolicited hello)", self.port)
        uid = f["uid"]
        if st.module_id is not None and st.module_id != uid:
            log.warning(
                "%s: now module %s (was %s)", self.port, sanitize(uid), sanitize(st.module_id)
            )
        st.module_id = uid
        st.fw_version = f["fw_version"]
        st.board = f["board"]
        st.channels = tuple(f["channels"])
        st.fans = f["fans"]
        st.proto_version = f"{VERSION_MAJOR}.{f['proto_minor']}"
        self.max_frame = f["max_frame"]
        self.telemetry_ms = f.get("telemetry_ms")
        self._on_nonce(uid, f.get("nonce"), f.get("paired"))
        if ref is not None:
            self._complete(ref, msg)
        if self.state != UP:
            st.connected_at = now
            st.last_error = None
            self._backoff = BACKOFF_MIN_S
            self._logged.clear()
            self._next_hb = now  # first heartbeat right away: the module goes HOSTED
            self._set_state(UP)
            log.info(
                "%s: module %s up (firmware %s, board %s, protocol %s)",
                self.port,
                sanitize(uid),
                sanitize(st.fw_version),
                sanitize(st.board),
                st.proto_version,
            )
            if msg.minor != VERSION_MINOR:
                log.info(
                    "%s: module protocol minor %d, ours %d", self.port, msg.minor, VERSION_MINOR
                )
        if self.key_error is None:
            if st.last_error is not None and st.last_error == self._key_error_shown:
                st.last_error = None  # a key now: that error is over
            self._key_error_shown = None
        else:
            st.last_error = self._key_error_shown = f"{self.port}: {self.key_error}"
            key = f"key {self.key_error}"
            if key not in self._logged:
                self._logged.add(key)
                log.warning(
                    "%s: %s; no heartbeats until then (the module cools on its own, "
                    "STANDALONE), commands refused",
                    self.port,
                    self.key_error,
                )

    def _on_nonce(self, uid: str, nonce: bytes | None, paired: bool | None) -> None:
        """A hello's signing fields: (re)load the key, sign over the new nonce."""
        self.paired = paired
        if nonce is None:  # firmware from before signing: unsigned, as ever
            with self._wlock:
                self.signing_supported = False
                self.nonce = None
                self._signer = None
                self._key = None
                self.key_error = None
            self._clear_stale()
            return
        try:
            key = self.keys.load(uid, f"modbridge pair {self.port}")
            why = None if key is not None else not_paired_text(self.port, uid)
        except KeyStoreError as e:
            key, why = None, sanitize(f"module {sanitize(uid)}: {e}", None)
        if key is not None and paired is False and f"unpaired {uid}" not in self._logged:
            self._logged.add(f"unpaired {uid}")
            log.warning(
                "%s: module %s says it has no secret, the key store has a key for it: "
                "run `modbridge pair %s` (its pairing window is the first %d s after "
                "power-on)",
                self.port, sanitize(uid), self.port, PAIRING_WINDOW_S,
            )  # fmt: skip
        with self._wlock:
            if nonce != self.nonce:
                self._auth_rehello = False
            self.signing_supported = True
            self.nonce = bytes(nonce)
            if key is None:
                self._signer = None
            elif key != self._key or self._signer is None:
                self._signer = self._make_signer(key)
            else:
                self._signer.nonce = self.nonce
            self._key = key
            self.key_error = why
        self._clear_stale()

    def _clear_stale(self) -> None:
        with self._up:
            self._nonce_stale = False
            self._up.notify_all()

    def _on_reply(self, msg: Message) -> None:
        f = msg.fields
        ref = f["ref"]
        if msg.name == "nack" and f.get("code") == C.ERR_VERSION and ref in self._hello_seqs:
            self._incompatible(f"module refused protocol {VERSION_MAJOR}.{VERSION_MINOR}")
            return
        if msg.name == "nack" and f.get("code") == C.ERR_UNAUTHORIZED:
            self.auth_refusals += 1
            if _ref_type(msg) == C.T_HEARTBEAT:
                self._heartbeat_refused()
                return
        self._complete(ref, msg)

    def _heartbeat_refused(self) -> None:
        """The module refused a signed heartbeat: first a fresh nonce (it may have
        rebooted unseen); refused again over the same nonce: the key is wrong."""
        if self.state != UP:
            return
        if not self._auth_rehello:
            self._auth_rehello = True
            self._send_hello_request(self.clock())
            return
        uid = sanitize(self.status.module_id or "?")
        msg = (
            f"{self.port}: module {uid} refuses our signed heartbeats: the key in the store "
            f"is not its secret; run `modbridge pair --force {self.port}`"
        )
        self.status.last_error = msg
        if msg not in self._logged:
            self._logged.add(msg)
            log.warning("%s", msg)

    def _complete(self, ref: int, msg: Message) -> None:
        with self._plock:
            p = self._pending.get(ref)
        if p is None:
            return  # late, or the answer to a request that timed out
        if msg.name in ("ack", "nack") and _ref_type(msg) not in (p.type, 0):
            return
        if msg.name == "ack" and p.final is not None and p.final != "ack":
            if p.final != "selftest_report":
                p.reply = msg  # an ack where data was expected: still an answer
                p.done.set()
            else:
                p.acked = True
            return
        if msg.name not in ("ack", "nack") and msg.name != (p.final or "ack"):
            return
        p.reply = msg
        p.done.set()

    def _fail_pending(self, err: LinkError) -> None:
        with self._plock:
            pending = list(self._pending.values())
        for p in pending:
            if not p.done.is_set():
                p.reply = err
                p.done.set()

    def _incompatible(self, text: str) -> None:
        msg = f"{self.port}: {text}"
        if self.state != INCOMPATIBLE:
            log.error("%s", msg)
        self.status.last_error = msg
        self._set_state(INCOMPATIBLE)
        self._fail_pending(IncompatibleModule(msg))


def _ref_type(msg: Message) -> int:
    return msg.fields.get("ref_type", 0)
