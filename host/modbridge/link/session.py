"""The serial link to one module: handshake, receive, heartbeat, commands, replug.

:class:`ModuleLink` is the facade (pyserial / liquidctl style: small modules behind
one class) over the link's parts in this package:

* :mod:`~modbridge.link.port` opens the port (exclusive, 115200 8N1, non-blocking)
  and maps open errors to messages that say what to do; the reopen back-off.
* :mod:`~modbridge.link.codec` decodes the module's bytes (:class:`HostDecoder`, a
  CPython fast path beside the reference decoder, boot banners).
* :mod:`~modbridge.link.requests` matches answers to pending requests.
* :mod:`~modbridge.link.heartbeat` builds and checks the heartbeat's fields.
* :mod:`~modbridge.link.io` is the thread: one selector over every port
  (:class:`~modbridge.link.io.LinkIO`), shared by all the bridge's links; a link
  started alone gets one of its own.
* :mod:`~modbridge.link.errors` the exceptions.

What the link does. Bytes are read when they arrive (the selector wakes on the
port's fd) and every frame is stamped then (``status.last_frame_at``), decoded,
and put into the module's :class:`~modbridge.model.ModuleStatus`; callbacks
(``on_telemetry``, ``on_event``, ``on_silent``) run in the I/O thread. While the
link is up a heartbeat is sent every ``heartbeat_period_s`` on a grid common to all
links (one wake-up serves all of them). When the port goes away (pyserial raises
``SerialException``; ``is_open`` stays True, so it is never trusted) the link goes
down at once (``status.lost_at``), the port is closed and reopened with exponential
backoff; the path is opened afresh each time, so a udev-style symlink that now
points elsewhere is followed. After every open: a 0x00 flush, ``hello_request``,
and the ``hello`` fills the module's identity and its telemetry period. A module of
another protocol major version is reported in ``status.last_error`` and never sent
heartbeats or commands.

Freshness is decided here, once (:func:`modbridge.model.grade`), and published as
``status.freshness`` (a :class:`~modbridge.model.LinkFreshness`: fresh, late or
silent), which the policy takes as a fact. The link wakes when the next frame is late
(:meth:`ModuleStatus.late_deadline`) and when the module would be silent
(:meth:`ModuleStatus.silence_deadline`: a timeout from the hello's telemetry period,
:func:`modbridge.model.silence_timeout_s`, capped by ``silence_max_s``, the policy's
``module_silent_s``; or ``UNPLUG_DEBOUNCE_S`` after a lost port if that is sooner).
Every step reads the port before it judges (a bridge that did not run is not a module
that did not send: frames waiting in the port's buffer are stamped first), and the I/O
thread's own pauses (:meth:`_note_pause`, measured by :class:`LinkIO`) are not
counted against the module. A late frame is counted (``status.late_total``); on
silence ``on_silent(status)`` is called once (until the next frame): the bridge
decides at once.

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

Supervision. Each link's step in the I/O thread runs under a supervisor: an
exception that escapes it (a bug in decoding, a handler, a callback path not already
guarded) never ends the thread. The port is closed, pending requests fail with
:class:`LinkDown`, and the link starts over (reopen, hello) after a back-off that
doubles per failure from ``THREAD_BACKOFF_MIN_S`` to ``THREAD_BACKOFF_MAX_S``; the
other links are not disturbed. The first failure of an episode is logged at ERROR
with its traceback and put in ``status.last_error``; the rest of the episode at
DEBUG. The episode ends (INFO "running again", back-off reset) once the link has run
``THREAD_HEALTHY_S`` without failing. Counters for the status and the exporter:
``thread_restarts`` (every restart, the I/O thread's own included), ``thread_episodes``,
``thread_failing`` (in an episode now) and ``thread_error`` (the last failure, one
line). A lost port (``SerialException``/``OSError``) is not a failure: it is the
ordinary reconnect path. The I/O thread's own loop is supervised the same way
(:mod:`modbridge.link.io`).

Strings from the wire (the module's id, firmware version and board, a NACK's field
and text) go through :func:`modbridge.sanitize.sanitize` wherever they reach a log
line, ``status.last_error`` or an exception's message; the status fields
(``module_id``, ``fw_version``, ``board``) and :class:`CommandRefused`'s ``field``
and ``text`` keep the raw values, for matching, and whoever prints them sanitises.

The link only reports: what a silent module means is the policy's business.

Cost. A thread wake-up is what costs (~50-200 us of CPU on a small VM), so there is
one thread for all links, it wakes for data and for deadlines only (no poll), and
heartbeats share one grid: at 1 Hz telemetry (the default is 5 Hz), 8 modules cost ~9
wake-ups a second. Good binary frames take a CPython fast path (:class:`HostDecoder`),
2-4x cheaper than the pure-Python reference decoder it falls back to for anything
unusual.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import select
import sys
import threading
import time
from collections.abc import Callable

import serial

try:  # POSIX: the output queue of a port (_out_queued)
    import fcntl
    import termios
except ImportError:  # pragma: no cover - Windows: pyserial's own out_waiting
    fcntl = termios = None

from modbridge.firmware_host.sign_host import TS_PER_S
from modbridge.link.codec import (  # noqa: F401 - re-exported: the link's public names
    BANNER_PREFIX,
    Banner,
    HostDecoder,
    _cobs_decode,
    encode_fast,
    fast_keyed,
)
from modbridge.link.errors import (  # noqa: F401 - re-exported
    BadRequest,
    CommandRefused,
    IncompatibleModule,
    LinkDown,
    LinkError,
    NotPaired,
    PortBusy,
    PortNotFound,
    PortPermissionDenied,
    RequestTimeout,
    Unauthorized,
    key_missing_text,
    not_paired_text,
    version_error_text,
)
from modbridge.link.heartbeat import HEARTBEAT, checked_fields, heartbeat_fields
from modbridge.link.io import LinkIO
from modbridge.link.keys import PAIRING_WINDOW_S, KeyStore, KeyStoreError, check_uid
from modbridge.link.port import (  # noqa: F401 - re-exported
    BACKOFF_JITTER,
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    BAUDRATE,
    WRITE_TIMEOUT_S,
    Backoff,
    open_error,
    open_port,
)
from modbridge.link.requests import (  # noqa: F401 - re-exported
    OPEN_REQUESTS,
    REPLY_TYPES,
    REQUEST_TIMEOUT_S,
    PendingRequests,
    ref_type,
)
from modbridge.link.requests import REQUEST_TIMEOUTS as _REQUEST_TIMEOUTS
from modbridge.link.stamps import TS_SUFFIX, Reservation
from modbridge.link.supervise import Episodes, supervised
from modbridge.model import (  # noqa: F401 - UNPLUG_DEBOUNCE_S re-exported
    FRESH,
    LATE,
    UNPLUG_DEBOUNCE_S,
    ModuleStatus,
    grade,
    silence_timeout_s,
)
from modbridge.sanitize import sanitize
from protocol import VERSION_MAJOR, VERSION_MINOR
from protocol import catalog as C
from protocol.errors import ProtocolError
from protocol.frame import encode_frame
from protocol.message import Message, lookup
from protocol.sign import NONCE_LEN, SIG_LEN, TS_LEN, TS_MAX, TS_UNIX_EPOCH, Signer

log = logging.getLogger(__name__)

POLL_PERIOD_S = 0.5  # only for a port object without a fileno() (a test double)
READ_CHUNK = 4096  # bytes a read takes at most (a pty holds 4 KB; a UART's FIFO far less)
HELLO_TIMEOUT_S = 1.0  # first wait for a hello; doubles per retry up to BACKOFF_MAX_S
HELLO_TRIES = 3  # unanswered hello_requests before last_error says so
STOP_TIMEOUT_S = 2.0
THREAD_BACKOFF_MIN_S = 0.1  # first restart of a link after an escaped exception
THREAD_BACKOFF_MAX_S = 5.0
THREAD_HEALTHY_S = 30.0  # this long without a failure ends an episode
RECENT_EVENTS = 32
OUT_QUEUE_MAX = 1024  # bytes waiting in the port's output queue: the module is not reading
DEFAULT_MAX_FRAME = 512  # until the module's hello says otherwise
LINK_ID = 0  # the bridge's signing link id (one link per module: exclusive open)
# A refusal for a stale signing timestamp (the host's clock went back further than the
# kept reservation covers): jump this far ahead, doubling per refusal up to the max.
TS_JUMP_MIN = 60 * TS_PER_S
TS_JUMP_MAX = 2**20 * TS_PER_S  # ~12 days a step

# link states
DOWN = "down"  # port closed (not opened yet, or lost): reopening with backoff
HANDSHAKE = "handshake"  # port open, waiting for the module's hello
UP = "up"  # hello received, protocol compatible: heartbeats flow
INCOMPATIBLE = "incompatible"  # the module speaks another major version
STOPPED = "stopped"

_INF = math.inf

# The signers' clock: protocol.sign's default (10 us units since 2015-01-01 UTC, from
# time.time_ns()), with the time module's epoch looked up once, not per heartbeat.
_TS_OFFSET_NS = ((946684800 if time.gmtime(0)[0] == 2000 else 0) - TS_UNIX_EPOCH) * 1_000_000_000


def _signer_clock() -> int:
    return (time.time_ns() + _TS_OFFSET_NS) // 10000


_SHA256_BLOCK = 64
_TIOCOUTQ = getattr(termios, "TIOCOUTQ", None) if termios is not None else None
_INT_ZERO = bytes(4)  # the ioctl's int argument (pyserial's TIOCM_zero_str)


def stale_timestamp(nack: Message) -> bool:
    """Whether an ``unauthorized`` NACK refuses a signature's timestamp as not newer
    than the link's last (SPEC 14.1: ``field`` ``ts``; firmware before that field
    says so in its ``text``, "replayed: ..."), not the signature itself."""
    f = nack.fields
    text = f.get("text")
    return f.get("field") == "ts" or (isinstance(text, str) and text.startswith("replayed"))


class HostSigner(Signer):
    """:class:`protocol.sign.Signer` with the trailer's HMAC-SHA256 from OpenSSL's
    SHA-256 states of the key's two pads, computed once (RFC 2104: each MAC is then a
    copy of each state and two updates, not the key's two blocks hashed again and the
    digest looked up by name as ``hmac.digest`` does each call): the same trailer
    bytes (a test holds them equal), a heartbeat a second per module signed cheaper."""

    def __init__(self, key, link_id=0, clock=None, reserve=None):
        super().__init__(key, link_id=link_id, clock=clock, reserve=reserve)
        secret = bytes(key)
        if len(secret) > _SHA256_BLOCK:
            secret = hashlib.sha256(secret).digest()
        secret = secret.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in secret))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in secret))

    def trailer(self, data):
        nonce = self.nonce
        if nonce is None or len(nonce) != NONCE_LEN:
            return super().trailer(data)  # raises SigningError, as ever
        head = bytes((self.link_id,)) + self.next_ts().to_bytes(TS_LEN, "big")
        inner = self._inner.copy()
        inner.update(b"".join((nonce, data, head)))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return head + outer.digest()[:SIG_LEN]


class ModuleLink:
    """One module on one serial port, served by an I/O thread (:class:`LinkIO`:
    ``io``, shared with other links; None: one of its own, started with the link).

    ``heartbeat_source()`` returns the heartbeat fields in wire units (``gpu_temp``
    m degC, ``gpu_power``/``power_limit`` mW, ``gpu_mem_temp``, ``host_time`` s,
    ``period_ms``); None values are omitted, ``host_time`` and ``period_ms`` are
    filled in when absent, and a source returning None (no GPU reading right now)
    still sends a heartbeat (the host is alive). The source, ``on_telemetry(status,
    msg)``, ``on_event(status, msg)`` and ``on_silent(status)`` (the silence deadline
    passed, see the module docstring; once until the next frame) run in the I/O
    thread and must be quick (return cached GPU readings, set an event; never run
    nvidia-smi from here). ``silence_max_s`` caps the silence timeout (None: no
    deadline unless the hello announces a telemetry period).

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
        on_silent: Callable | None = None,
        silence_max_s: float | None = None,
        io: LinkIO | None = None,
    ):
        self.port = port
        self.status = status if status is not None else ModuleStatus(port=port)
        self.heartbeat_period_s = heartbeat_period_s
        self.heartbeat_source = heartbeat_source
        self.on_event = on_event
        self.on_telemetry = on_telemetry
        self.on_silent = on_silent
        self.silence_max_s = silence_max_s
        self.clock = clock
        self.open_fn = open_fn
        self.poll_period_s = poll_period_s
        self.hello_timeout_s = hello_timeout_s

        self.state = DOWN
        self.max_frame = DEFAULT_MAX_FRAME
        self.telemetry_ms: int | None = None
        self.heartbeats_sent = 0
        self.heartbeats_skipped = 0  # held back: the module was not reading its input
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
        self._hb_nonces: dict[int, bytes] = {}  # seq -> nonce of the last signed heartbeats
        self._hb_ts: dict[int, int] = {}  # seq -> timestamp of the last signed heartbeats
        # the signing timestamp kept on disk beside the module's key (link/stamps.py)
        self.stamps: Reservation | None = None
        self._stamps_uid: str | None = None
        self._ts_step = TS_JUMP_MIN  # the next jump ahead after a stale-timestamp refusal
        self._jumped_to = 0  # the timestamp the last jump went to (refusals below: older)
        self.ts_jumps = 0  # jumps ahead made (the module refused a stale timestamp)
        self._key_error_shown: str | None = None  # the last_error the key situation set

        self._ser = None
        self._fd: int | None = None  # a pyserial port's fd: read and written directly
        self._stop = threading.Event()
        self._up = threading.Condition()
        self._wlock = threading.Lock()
        self._seq_lock = threading.Lock()
        self._seq = 0
        self._pending = PendingRequests()
        self._rng = random.Random()
        self._backoff = Backoff(rng=self._rng)
        self._reopen_at = 0.0  # clock time of the next open attempt while the port is closed
        self._selectable = True  # the I/O thread says: its port has a file descriptor
        self._last_service = 0.0
        self._silent_reported = False  # on_silent called for this silence already
        self._started = False
        self._io = io
        self._own_io = False
        self.reads = 0  # reads that returned bytes
        self.bytes_read = 0
        self._lost_once = False  # the port was open before: a reopen is a reconnect
        self._next_hb = 0.0
        self._hello_seqs: set[int] = set()
        self._hello_deadline = 0.0
        self._hello_tries = 0
        self._banner_reset = False
        self._flush_next = False
        self._logged: set[str] = set()
        # supervision (see the module docstring)
        self.supervision = Episodes(
            f"{port}: link thread", log, THREAD_BACKOFF_MIN_S, THREAD_BACKOFF_MAX_S,
            THREAD_HEALTHY_S, "thread_restarts",
        )  # fmt: skip

    # -- lifecycle -------------------------------------------------------------------
    def start(self, fail_fast: bool = True) -> ModuleLink:
        """Open the port and have the I/O thread serve the link.

        With ``fail_fast`` the first open happens here and a busy port or a
        permission problem raises (they will not fix themselves); a missing port
        never raises, the link keeps trying (the module may be plugged in later;
        ``status.last_error`` says so). Without it every error is retried. A link
        made without ``io`` starts an I/O thread of its own.
        """
        if self._started:
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
        self._started = True
        if self._io is None:
            self._io = LinkIO(name=f"modbridge-link {self.port}")
            self._own_io = True
        self._io.add(self)
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop serving the link and close the port; done within ``timeout``."""
        self._stop.set()
        io = self._io
        if io is not None and self._started:
            if not io.remove(self, timeout):
                log.warning("%s: link did not stop within %.1f s", self.port, timeout)
            if self._own_io:
                io.stop(timeout)
        else:
            self._close()
        self._set_state(STOPPED)
        self._settle_stamps()  # nothing is signed any more: keep the last one used
        self._fail_pending(LinkDown(f"{self.port}: link stopped"))

    def __enter__(self) -> ModuleLink:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def _thread(self) -> threading.Thread | None:
        """The I/O thread serving this link (shared with the bridge's other links)."""
        return self._io.thread if self._io is not None else None

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
            if stale_timestamp(e.nack):  # our clock went back: jump ahead until taken
                return self._ahead_of_stale(name, fields, timeout)
            if self.nonce == used:  # no new hello meanwhile: did the module reboot?
                try:
                    self._exchange("hello_request", None, None, None)
                except LinkError:
                    raise self._unauthorized(name, e.nack) from None
                if self.nonce == used:
                    raise self._unauthorized(name, e.nack) from None
        return self._exchange(name, fields, timeout, self._need_signer(name))

    def _ahead_of_stale(self, name: str, fields: dict | None, timeout: float | None):
        """``name`` was refused for a stale timestamp: jump ahead (doubling) and send
        it again until the module takes it (at most ~45 days ahead in 16 tries)."""
        for _ in range(16):
            self._timestamp_behind(None)
            try:
                return self._exchange(name, fields, timeout, self._need_signer(name))
            except CommandRefused as e:
                if e.code != C.ERR_UNAUTHORIZED or not stale_timestamp(e.nack):
                    if e.code == C.ERR_UNAUTHORIZED:
                        raise self._unauthorized(name, e.nack) from None
                    raise
                nack = e.nack
        raise self._unauthorized(name, nack)

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
        if self.stamps is None and self.status.module_id:  # first pairing: the key
            self._load_stamps(self.status.module_id)  # file is there now
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
        stamps = self.stamps
        signer = HostSigner(bytes(key), link_id=self.link_id, clock=_signer_clock,
                            reserve=stamps.reserve if stamps is not None else None)  # fmt: skip
        signer.nonce = self.nonce
        return signer

    def _load_stamps(self, uid: str) -> None:
        """Keep module ``uid``'s signing timestamps in ``<uid>.ts`` beside its key file,
        and continue above the one kept there (link/stamps.py). Not with the lock."""
        if self._stamps_uid == uid:
            return
        try:
            key_path = self.keys.find(uid)
            stem = check_uid(uid)
        except KeyStoreError:
            return
        if key_path is None:
            return
        stamps = Reservation(key_path.with_name(stem + TS_SUFFIX))
        floor = stamps.load()
        with self._wlock:
            self._last_ts = max(self._last_ts, floor)
            self.stamps, self._stamps_uid = stamps, uid

    def _settle_stamps(self) -> None:
        """A clean stop: the kept timestamp becomes the last one used."""
        stamps = self.stamps
        if stamps is not None:
            with self._wlock:  # no frame is signed meanwhile; one signed later reserves
                stamps.settle(self._last_ts)
                if self._signer is not None:
                    self._signer.reserved = min(self._signer.reserved, stamps.ceiling)

    def _timestamp_behind(self, sent_ts: int | None) -> None:
        """The module refused our timestamp as not newer than the last it accepted on
        our link (the clock went back further than the kept reservation covers, or
        the file was lost): jump ahead, doubling per refusal. A refusal of a frame
        sent before the last jump (``sent_ts``) is old news: nothing to do."""
        with self._wlock:
            if sent_ts is not None and sent_ts <= self._jumped_to:
                return
            step = self._ts_step
            self._jumped_to = min(max(self._last_ts, _signer_clock()) + step, TS_MAX - 1)
            self._last_ts = self._jumped_to
            self._ts_step = min(step * 2, TS_JUMP_MAX)
        self.ts_jumps += 1
        uid = sanitize(self.status.module_id or "?")
        msg = (
            f"{self.port}: module {uid} refused our signing timestamp as not newer than "
            f"the last it accepted: this host's clock went back (or another sender uses "
            f"link {self.link_id}); the key is fine, no need to re-pair: timestamps "
            f"jumped {step // TS_PER_S} s ahead"
        )
        if "ts behind" not in self._logged:  # once per link: the jumps are counted
            self._logged.add("ts behind")
            log.warning("%s", msg)

    def _unauthorized(self, name: str, nack: Message, unsigned: bool = False) -> Unauthorized:
        uid = sanitize(self.status.module_id or "?")
        if unsigned:
            hint = "the module needs a signed command (is it paired? `modbridge pair`)"
        elif stale_timestamp(nack):
            hint = (
                f"module {uid} refuses our signing timestamps as not newer than the last "
                f"it accepted, even {self._ts_step // TS_PER_S} s ahead: another sender "
                f"uses link {self.link_id}, or this host's clock went far back; the key "
                "is fine: power-cycle the module (a new boot forgets its timestamps)"
            )
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
        p = self._pending.add(seq, name, mdef[C.M_TYPE], fields)
        try:
            try:
                self._send(name, fields or {}, seq, signer)
            except (serial.SerialException, OSError) as e:
                raise LinkDown(f"{self.port}: cannot send {name}: {e}") from None
            if not p.done.wait(timeout):
                raise RequestTimeout(f"{self.port}: no answer to {name} within {timeout:g} s")
        finally:
            self._pending.discard(seq)
        reply = p.reply
        if isinstance(reply, LinkError):
            raise reply
        if reply.name == "nack":
            raise CommandRefused(self.port, name, reply)
        return reply

    # -- in the I/O thread -------------------------------------------------------------
    def _due(self) -> bool:
        return self.clock() >= self._deadline()

    def _deadline(self) -> float:
        """When the I/O thread must step this link even without data (clock time)."""
        if self._stop.is_set():
            return _INF
        if self._ser is None:
            due = self._reopen_at
        else:
            due = _INF
            state = self.state
            if state == UP:
                due = self._next_hb
                if self._nonce_stale:
                    due = min(due, self._hello_deadline)
            elif state == HANDSHAKE:
                due = self._hello_deadline
            if not self._selectable:
                due = min(due, self._last_service + self.poll_period_s)
        if not self._silent_reported:  # the next verdict: late, then silent
            st = self.status
            silent_at = st.silence_deadline()
            if silent_at is not None and silent_at < due:
                due = silent_at
            f = st.freshness
            if f is None or f.state == FRESH:
                late_at = st.late_deadline()
                if late_at is not None and late_at < due:
                    due = late_at
        return due

    def _step(self, readable: bool = True) -> None:
        """Service the link once (read what is waiting, run its timers, reopen a lost
        port) under the link's supervisor: a lost port is the reconnect path, anything
        else restarts the link (:meth:`_loop_failed`); nothing escapes to the thread.
        ``readable``: the selector says the port has bytes (or hung up); a port it does
        not watch (no fd) is read every time."""
        if self._stop.is_set():
            return
        try:
            self.supervision.check_recovered()
            try:
                if self._ser is None:
                    if self.clock() >= self._reopen_at:
                        self._try_open()
                else:
                    self._service(readable)
            except (serial.SerialException, OSError) as e:
                self._lost(e)
            self._check_silence()
        except BaseException as e:  # noqa: BLE001 - the supervisor: restart, never die
            self._loop_failed(e)

    def _service(self, readable: bool = True) -> None:
        """Read everything waiting (stamped now), dispatch it, run the timers. The
        read is non-blocking and happens on a deadline too (``readable`` False): no
        verdict on the module before what the port holds is read. On an unplugged port
        it raises, which :meth:`_step` turns into a reconnect."""
        data = self._read() if readable or not self._selectable or self._waiting() else b""
        now = self.clock()
        self._last_service = now
        if data:
            self.bytes_read += len(data)
            self.reads += 1
            for item in self.decoder.feed(data):
                self._dispatch(item, now)
        state = self.state
        if state == UP:
            if now >= self._next_hb:
                self._send_heartbeat(now)
            if self._nonce_stale and now >= self._hello_deadline:
                self._send_hello_request(now)  # a reset without its hello yet: ask again
        elif state == HANDSHAKE and now >= self._hello_deadline:
            if self._hello_tries >= HELLO_TRIES:
                self._note_error(
                    LinkError(
                        f"{self.port}: no hello from the module after "
                        f"{self._hello_tries} tries: is the modbridge firmware running on it?"
                    )
                )
            self._send_hello_request(now)

    def _waiting(self) -> bool:
        """The port has bytes now (a deadline's step: read them before any verdict).
        A poll, not a read: pyserial's termios (VMIN 0) makes an empty read look like
        a hang-up."""
        fd = self._fd
        if fd is None:
            return True  # read through pyserial's in_waiting
        return bool(select.select((fd,), (), (), 0)[0])

    def _read(self) -> bytes:
        """What the port holds now. A pyserial port's fd is read directly (one
        syscall; pyserial's read adds an ioctl and a select): ready but empty means the
        device is gone, as pyserial says it."""
        fd = self._fd
        if fd is None:
            ser = self._ser
            n = ser.in_waiting
            return ser.read(n if n > 0 else 1)
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return b""
        if not data:
            raise serial.SerialException(
                "device reports readiness to read but returned no data (device disconnected?)"
            )
        return data

    def _note_pause(self, gap_s: float) -> None:
        """The I/O thread did not run for ``gap_s`` more than it meant to (SIGSTOP, a VM
        pause, swapping): not the module's silence (I/O thread)."""
        if self.status.last_frame_at is not None:
            self.status.paused_s += gap_s

    def _check_silence(self) -> None:
        """Publish the link's verdict (after the step has read the port): late is
        counted, silent calls ``on_silent`` once."""
        st = self.status
        if self._silent_reported:
            return
        now = self.clock()
        due = st.late_deadline() if st.freshness is None or st.freshness.state == FRESH else None
        silent_at = st.silence_deadline()
        if silent_at is not None and (due is None or silent_at < due):
            due = silent_at
        if due is None or now < due:
            return
        f = st.grade(now)
        was = st.freshness
        st.freshness = f
        if f.state == LATE and (was is None or was.state == FRESH):
            st.late_total += 1
            log.debug("%s: frame late (%d missed, %.2f s)", self.port, f.missed_frames, f.age_s)
        if not f.silent:
            return
        self._silent_reported = True
        if self.on_silent is None:
            return
        try:
            self.on_silent(self.status)
        except Exception:  # noqa: BLE001 - a callback bug must not break the link
            if "cb on_silent" not in self._logged:
                self._logged.add("cb on_silent")
                log.exception("%s: on_silent callback failed", self.port)

    def _loop_failed(self, exc: BaseException) -> None:
        """An exception escaped the link's step: report (once per episode), clean up,
        reopen after a back-off (the I/O thread goes on with the other links)."""
        msg = self.supervision.failed(exc)
        try:
            self.status.last_error = msg
            self._lost_once = True  # the reopen counts as a reconnect
            if self.state in (UP, HANDSHAKE, INCOMPATIBLE):
                self.status.lost_at = self.clock()
            self._close()
            self._set_state(DOWN)
            self._fail_pending(LinkDown(f"{self.port}: link thread restarted"))
        except Exception:  # noqa: BLE001 - the port state is unknown: reopen anyway
            log.debug("%s: cleaning up after a link thread failure", self.port, exc_info=True)
            self._ser = None
        delay = self.supervision.backoff * self._rng.uniform(1 - BACKOFF_JITTER,
                                                             1 + BACKOFF_JITTER)  # fmt: skip
        self._reopen_at = self.clock() + delay

    # the supervisor's counters, for the status and the exporter
    thread_restarts = supervised("restarts")
    thread_episodes = supervised("episodes")
    thread_failing = supervised("failing")
    thread_error = supervised("error")
    _thread_backoff = supervised("backoff")

    def _io_failed(self, msg: str) -> None:
        """The shared I/O thread's loop failed and is restarting (reported per link;
        the port stays open)."""
        self.supervision.restarts += 1
        self.supervision.error = msg
        self.status.last_error = msg

    def _try_open(self) -> bool:
        try:
            self._ser = open_port(self.port, self.open_fn)
        except LinkError as e:
            self._note_error(e)
            self._reopen_at = self.clock() + self._backoff.next()
            return False
        self._opened()
        return True

    def _opened(self) -> None:
        # a pyserial port itself (not a wrapper or a test double): its fd directly
        self._fd = self._ser.fd if type(self._ser) is serial.Serial else None
        if self._lost_once:
            self.status.reconnects += 1
            log.info("%s: port reopened (reconnect %d)", self.port, self.status.reconnects)
        self.decoder.reset()
        self._hello_seqs.clear()
        self._hello_tries = 0
        self._flush_next = True
        self._selectable = True  # until the I/O thread finds it has no fd
        self._set_state(HANDSHAKE)
        self._send_hello_request(self.clock())

    def _lost(self, exc: BaseException) -> None:
        was = self.state
        self._close()
        self._lost_once = True
        if not self._stop.is_set():
            msg = f"{self.port}: link lost: {exc}"
            self.status.last_error = msg
            if was in (UP, HANDSHAKE, INCOMPATIBLE):
                self.status.lost_at = self.clock()
                log.warning("%s", msg)
            self._set_state(DOWN)
            self._fail_pending(LinkDown(f"{self.port}: link lost"))
            self._reopen_at = self.clock() + self._backoff.next()

    def _close(self) -> None:
        with self._wlock:  # a writer in another thread never has the fd closed under it
            self._fd = None
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

    def _send(self, name: str, fields: dict, seq: int, signer: Signer | None,
              keyed: dict | None = None) -> None:  # fmt: skip
        """Encode (signing with ``signer``) and write one frame (``keyed``: the
        fields' :func:`fast_keyed`, if the caller has it).

        The signature's timestamp is taken under the write lock: frames of one link
        reach the module in timestamp order (a later timestamp sent first would make
        the earlier frame a replay)."""
        if signer is None:
            frame = encode_fast(name, fields, seq, keyed=keyed)
            self._check_size(name, frame)
            self._write(frame)
            return
        if self._ser is None:
            raise serial.SerialException("port is closed")
        with self._wlock:
            # one timestamp sequence per link id, whichever signer (key) signs
            signer.last_ts = max(signer.last_ts, self._last_ts)
            try:
                frame = encode_fast(name, fields, seq, signer=signer, keyed=keyed)
            except ProtocolError as e:
                raise BadRequest(f"{self.port}: {name}: {e}") from None
            self._last_ts = signer.last_ts
            self._check_size(name, frame)
            self._write_locked(frame)

    def _check_size(self, name: str, frame: bytes) -> None:
        n = len(frame) - 2  # a frame below one COBS block: one code byte, the delimiter
        if n >= 254:
            n = len(_cobs_decode(frame[:-1]) or b"")
        if n > self.max_frame:
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
            fd = self._fd
            if fd is not None:  # a pyserial port: write what the fd takes now
                try:
                    n = os.write(fd, frame)
                except BlockingIOError:
                    n = 0
                if n == len(frame):
                    return
                frame = frame[n:]  # the rest the way pyserial waits for it (timeout)
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

    def _once(self, key: str) -> bool:
        if key in self._logged:
            return False
        self._logged.add(key)
        return True

    def heartbeat_fields(self) -> dict:
        """The next heartbeat's fields (wire units), from ``heartbeat_source``."""
        return heartbeat_fields(self.heartbeat_source, self.heartbeat_period_s, self._once,
                                self.port)  # fmt: skip

    def _out_queued(self) -> int:
        """Bytes written to the port and not yet taken by the device: pyserial's
        ``out_waiting``, for a pyserial port one ioctl on its fd (no property, no
        struct) since every heartbeat asks."""
        fd = self._fd
        if fd is not None and _TIOCOUTQ is not None:
            return int.from_bytes(fcntl.ioctl(fd, _TIOCOUTQ, _INT_ZERO), sys.byteorder)
        return self._ser.out_waiting if self._ser is not None else 0

    def _send_heartbeat(self, now: float) -> None:
        """One heartbeat now; the next at the following point of the period's grid
        (``k * period`` on the link's clock), common to every link of that period, so
        that one wake-up of the I/O thread serves them all.

        Not while the port's output queue holds more than ``OUT_QUEUE_MAX`` bytes: the
        module is not reading (hung, a full pty), and a write would block the one I/O
        thread for ``WRITE_TIMEOUT_S``, every link with it (``heartbeats_skipped``)."""
        period = self.heartbeat_period_s
        self._next_hb = (math.floor(now / period) + 1) * period
        try:
            queued = self._out_queued()
        except (AttributeError, OSError, serial.SerialException):
            queued = 0  # no TIOCOUTQ (a test double): write as ever
        if queued > OUT_QUEUE_MAX:
            self.heartbeats_skipped += 1
            self._flush_next = True  # the module resyncs on the next frame
            if self._once("hb-queue"):
                log.warning("%s: %d bytes not taken by the module: heartbeats held back "
                            "until it reads again", self.port, queued)  # fmt: skip
            return
        fields = self.heartbeat_fields()
        keyed = fast_keyed(HEARTBEAT, fields)  # checked once, encoded from it
        if keyed is None:  # a field the catalog refuses: dropped
            fields = checked_fields(fields, self._once, self.port)
            if fields is None:
                return
        seq = self._next_seq()
        if not self.signing_supported:
            try:
                frame = encode_fast("heartbeat", fields, seq, keyed=keyed)
            except ProtocolError as e:  # too large for a frame: nothing to drop here
                if self._once(f"hb-encode {e}"):
                    log.warning("%s: heartbeat not sent: %s", self.port, e)
                return
            self._write(frame)
            self.heartbeats_sent += 1
            return
        signer = self._signer
        if signer is None or self._nonce_stale:
            self.heartbeats_withheld += 1  # an unsigned one would not count: not sent
            return
        try:
            self._send("heartbeat", fields, seq, signer, keyed)
        except BadRequest as e:
            self._note_error(e)
            return
        self.heartbeats_sent += 1
        self._hb_nonces[seq] = signer.nonce  # a refusal names the seq: which nonce was it?
        self._hb_ts[seq] = signer.last_ts
        if len(self._hb_nonces) > 16:
            del self._hb_nonces[next(iter(self._hb_nonces))]
        if len(self._hb_ts) > 16:
            del self._hb_ts[next(iter(self._hb_ts))]

    # -- receiving -------------------------------------------------------------------
    def _dispatch(self, item, now: float) -> None:
        st = self.status
        if item.ok:
            st.frames_total += 1
            st.last_frame_at = now
            st.paused_s = 0.0
            self._silent_reported = False
            if st.freshness is None or st.freshness.state != FRESH:
                st.freshness = grade(0.0, st.silent_after_s, st.telemetry_period_s)
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
            elif name in REPLY_TYPES:
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
        st.silent_after_s = silence_timeout_s(self.telemetry_ms, self.silence_max_s)
        st.telemetry_period_s = self.telemetry_ms / 1000.0 if self.telemetry_ms else None
        self._on_nonce(uid, f.get("nonce"), f.get("paired"))
        if ref is not None:
            self._complete(ref, msg)
        if self.state != UP:
            st.connected_at = now
            st.last_error = None
            st.lost_at = None
            self._backoff.reset()
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
            if key is not None:
                why = None
            elif paired:  # the module has a secret: this host only lacks the file
                why = key_missing_text(self.port, uid, getattr(self.keys, "dir", "?"))
            else:
                why = not_paired_text(self.port, uid)
        except KeyStoreError as e:
            key, why = None, sanitize(f"module {sanitize(uid)}: {e}", None)
        if key is not None:
            self._load_stamps(uid)
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
                self._ts_step = TS_JUMP_MIN  # a new boot: its links' last are cleared
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
            if ref_type(msg) == C.T_HEARTBEAT:
                used = self._hb_nonces.pop(ref, None)
                sent_ts = self._hb_ts.pop(ref, None)
                if used is not None and used != self.nonce:
                    return  # signed over a nonce replaced since: it crossed a reset
                self.auth_refusals += 1
                if stale_timestamp(msg):  # the key is right, our timestamp behind
                    self._timestamp_behind(sent_ts)
                    return
                self._heartbeat_refused()
                return
            self.auth_refusals += 1
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
        self._pending.complete(ref, msg)

    def _fail_pending(self, err: LinkError) -> None:
        self._pending.fail_all(err)

    def _incompatible(self, text: str) -> None:
        msg = f"{self.port}: {text}"
        if self.state != INCOMPATIBLE:
            log.error("%s", msg)
        self.status.last_error = msg
        self._set_state(INCOMPATIBLE)
        self._fail_pending(IncompatibleModule(msg))
