"""The virtual module: the real firmware in ``micropython``, lockstepped with a world.

``VirtualModule(world, state_dir)`` spawns the MicroPython unix port running
``from device.main import run; run("sim")`` (the firmware's own sources, unmodified,
with ``boards/sim.py`` as the board) and drives it over the private link of
``link.py``: every ``sleep_ms`` of the firmware is one exchange, in which the runner
steps the world by exactly that long. The world is the clock, so a run depends only
on the world's seed and on the host bytes delivered at each exchange.

The protocol port is a pty: the slave path (``port``, and the stable symlink
``port_symlink`` that follows replugs, like udev's for a CH340) is what a host opens
with pyserial; the runner holds the master. Faults it owns::

    host_silence(on)    bytes the host writes are dropped while on
    mcu_reset(cause)    kill + restart micropython ("power" by default); config persists
    unplug() / replug() close the pty master (the host's pyserial raises
                        SerialException; the path disappears) / a new pty, symlink moved
    starve_watchdog()   the board drops watchdog feeds (a hung control loop): the
                        runner resets the MCU with cause "watchdog" after the timeout
    world_fault(name, *args)   any fault of the world (``fan_stall``, ``ntc_open``, ...),
                        applied between two exchanges

Two ways to drive it: ``run_for(sim_ms)`` in the caller's thread (deterministic: host
bytes are delivered at the exchange boundaries the caller chooses, e.g. with
``host_write``), or ``start()`` / ``stop()`` with a thread paced at ``speed`` x real
time (``speed=0`` or ``"max"``: as fast as it goes). ``stop()`` (also at exit) kills
the process and closes the pty.

What the MCU does that the runner mirrors: at power-up and at every reset the PWM
pins float, so the fans run at 100 % for ``boot_ms`` of world time before the new
process answers; a firmware that stops exchanging leaves the last duties on the fans
while the world goes on, and a started watchdog that is no longer fed resets it. A
firmware that hands the port back (``repl``) or whose process ends (it returned, or
an uncaught exception: the traceback goes to the port) leaves the MCU at MicroPython's
REPL, which a thread serves on the pty (``repl.py``: friendly, raw and raw-paste REPL
for mpremote, code in a persistent ``micropython`` with ``fs_dir`` as its
filesystem); a soft reset at the friendly REPL or ``machine.reset()`` starts the
firmware again. A process that does not answer within ``hang_timeout_s`` of wall time
(an endless loop that never sleeps; 10 s by default, times ``$MODBRIDGE_TIMEOUT_SCALE``:
a loaded machine compiles a configuring command's modules slowly) or breaks the link
is killed: the MCU is halted.
Each change is a :class:`McuEvent` in ``mcu_events`` (``on_mcu_event``,
``wait_mcu_event``); a REPL tool's Ctrl-C / Ctrl-A while the firmware runs is a
``note`` event (the firmware ignores them, as a board's does with Ctrl-C disabled).

Signing: before its first boot the module is provisioned like a paired board: a
32-byte secret in ``secret.key`` in its flash directory (kept if one is there from an
earlier run or a ``pair``) and the same key in a host :class:`~modbridge.link.keys.KeyStore`
(``keys=``; by default one in ``<state_dir>/host-keys`` that is attached for lookups in
this process, so a :class:`~modbridge.link.session.ModuleLink` or a bridge here finds it).
``key`` is the module's current secret, ``host_key_path`` the host copy, ``nonce`` the
one of the last hello, and :meth:`VirtualModule.encode` signs a frame the way a host
does, for :meth:`~VirtualModule.host_write`. ``provision=False``: a module without a
secret (in its pairing window for 60 s of world time after power-on).

An internal tap decodes everything the firmware sends (``last_telemetry``,
``telemetry_count``, ``events``, ``hellos``, ``banners``, ``messages``), so tests and
the CLI can follow the firmware's state without a host on the pty. From the link
itself: ``wdt_feeds`` (every watchdog feed since the first power-up: the firmware
feeds once per completed control tick) and, after ``request_heap()`` and one more
exchange, ``heap_used`` (the MicroPython heap in use after a collection; benchmarks
watch it for leaks).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import hashlib
import logging
import os
import pty
import select
import subprocess
import threading
import time
import tty
from dataclasses import dataclass
from pathlib import Path

from modbridge.extras import install_hint
from modbridge.link.keys import KeyStore, attach_dir, detach_dir, write_key_file
from modbridge.link.requests import timeout_scale
from modbridge.sim import link as L
from modbridge.sim import repl as R
from modbridge.tools import mpy
from protocol import catalog as C
from protocol.frame import StreamDecoder, encode_frame
from protocol.sign import KEY_LEN, Signer, new_key

#: Wall time a firmware process may go without a request before it is taken as hung.
HANG_TIMEOUT_S = 10.0 * timeout_scale()

log = logging.getLogger(__name__)

BOOTSTRAP = "from device.main import run; run('sim')"
BANNER_PREFIX = b"MODULER READY v"
TICKS_MASK = (1 << 30) - 1
UID_LEN = 12  # bytes, like an STM32's 96-bit unique id
SECRET_FILE = "secret.key"  # the firmware's signing secret, beside config.json
HOST_LINK_ID = 1  # encode()'s signing link id (a ModuleLink's default is 0)
#: host -> module messages the firmware takes unsigned (modbridge.link.session.OPEN_REQUESTS)
OPEN_REQUESTS = ("hello_request", "config_get", "cal_read")
MICROPYTHON_MISSING = (
    "micropython not found: the virtual module (--sim) runs the firmware in the "
    "MicroPython unix port, from the optional [sim] extra: " + install_hint("sim")
)
#: what the sim says when a REPL tool knocks (Ctrl-C, Ctrl-A) while the firmware runs
NOTE_FIRMWARE_OWNS_PORT = (
    "Ctrl-C/Ctrl-A from the host ignored (mpremote?): the firmware owns the port: "
    'send `repl` first (modbridge repl / {"type":"repl"})'
)
#: byte runs that only a REPL tool sends: mpremote's "\r\x03" then "\r\x01",
#: pyboard.py's (and a person's) Ctrl-C twice
REPL_KNOCKS = (b"\x03\r\x01", b"\r\x03\x03")
#: machine.reset_cause() at the REPL for each reset cause (stm32's constants)
_CAUSE_CODES = {"power": 1, "hard": 2, "watchdog": 3, "soft": 5}


@dataclass(frozen=True)
class McuEvent:
    """One change of what the virtual MCU does (``VirtualModule.mcu_events``).

    ``kind``: ``running`` (the firmware's first hello after a boot: ``version``, and
    the reset cause in ``why``), ``repl`` (at the REPL: why), ``soft_reset``,
    ``reset`` (cause and why), ``halted`` (why), ``off``, ``unplugged``, ``plugged``,
    ``note`` (something the sim tells a person, e.g. a REPL tool knocking while the
    firmware owns the port). ``t_ms`` is world time, ``seq`` counts from 1.
    """

    seq: int
    t_ms: int
    kind: str
    why: str = ""
    version: str = ""

    @property
    def text(self) -> str:
        k, why = self.kind, self.why
        if k == "running":
            return f"running firmware v{self.version or '?'} (reset cause: {why})"
        if k == "repl":
            return f"at the REPL: {why}"
        if k == "off":
            return "powered off" + (f" ({why})" if why else "")
        if k == "note":
            return why
        label = {"soft_reset": "soft reset", "plugged": "plugged in"}.get(k, k)
        return f"{label}: {why}" if why else label


def _micropython() -> str:
    """The interpreter's path, or MicroPythonMissing with MICROPYTHON_MISSING."""
    try:
        return mpy.micropython_path()
    except mpy.MicroPythonMissing:
        override = os.environ.get("MICROPYTHON")
        extra = f" ($MICROPYTHON={override!r} is not an executable)" if override else ""
        raise mpy.MicroPythonMissing(MICROPYTHON_MISSING + extra) from None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def unique_id(seed: int, instance: int) -> bytes:
    """The virtual MCU's unique id: stable for (seed, instance), different across them."""
    return hashlib.sha256(f"modbridge-sim/{seed}/{instance}".encode()).digest()[:UID_LEN]


def _ina_absent(world) -> bool:
    """The world's INA226-absent fault: ``ina_present`` (property) or ``ina_absent`` (bool)."""
    present = getattr(world, "ina_present", None)
    if isinstance(present, bool):
        return not present
    absent = getattr(world, "ina_absent", False)
    return absent if isinstance(absent, bool) else False


class SimError(RuntimeError):
    """The virtual module could not do what was asked (the message says why)."""


class VirtualModule:
    """One virtual GPU module: firmware process + world + pty. See the module docstring."""

    def __init__(
        self,
        world,
        state_dir,
        speed=1.0,
        seed=0,
        link_path=None,
        port_symlink=None,
        *,
        instance=0,
        poll_ms=100,
        adc_samples=8,
        boot_ms=200,
        ticks_start=0,
        heapsize="1M",
        code_root=None,
        hang_timeout_s=None,
        record_tx=False,
        keys=None,
        provision=True,
    ):
        self._micropython = _micropython()  # before anything is made: a clear error
        self.world = world
        self.state_dir = Path(state_dir)
        self.fs_dir = self.state_dir / "flash"
        self.fs_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.state_dir / "mcu.log"
        self.speed = 0.0 if speed in (0, "max", None) else float(speed)
        self.seed = seed
        self.instance = instance
        self.uid = unique_id(seed, instance)
        self.link_path = Path(link_path) if link_path else None
        self.port_symlink = Path(port_symlink) if port_symlink else None
        self.poll_ms = int(poll_ms)
        if not 1 <= adc_samples <= L.MAX_ADC:
            raise ValueError(f"adc_samples must be 1..{L.MAX_ADC}")
        self.adc_samples = adc_samples
        self.boot_ms = int(boot_ms)
        self.ticks_start = int(ticks_start) & TICKS_MASK
        self.heapsize = heapsize
        self.code_root = Path(code_root) if code_root else mpy.CODE_ROOT
        self.hang_timeout_s = HANG_TIMEOUT_S if hang_timeout_s is None else hang_timeout_s

        self.lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._out_fd = -1
        self._in_fd = -1
        self._log_file = None
        self._link_file = open(self.link_path, "ab") if self.link_path else None  # noqa: SIM115
        self._master = -1
        self._slave = -1
        self.port: str | None = None
        self.mcu_state = "off"  # off | running | repl | halted
        self.halt_reason = ""  # why it is at the REPL or halted
        self._repl: R.Repl | None = None
        self._repl_out = bytearray()  # REPL output the pty did not take yet
        self._repl_thread: threading.Thread | None = None
        self._boot_cause = "power"
        self._await_hello = False
        self._host_tail = b""
        self._knock_at = -1e9
        self._boot_world_ms = 0
        self._reset_at = 0
        self._duty = (65535, 65535)
        self._wdt_ms = 0
        self._last_feed_ms = 0
        self._silence = False
        self._starve = False
        self._inject: collections.deque[bytes] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stop_evt = threading.Event()
        self._closed = False
        self._pace_wall = 0.0
        self._pace_sim = 0

        # observability
        self.exchanges = 0
        # Observers: ``on_exchange(now_ms, duty, adc)`` after every firmware request,
        # with the duties it asked for and the ADC samples of the step it acted on
        # (the soak checks the safety invariants there); None: nobody watches.
        self.on_exchange = None
        self.last_adc = None
        self.bytes_to_host = 0
        self.bytes_from_host = 0
        self.host_bytes_dropped = 0
        self.tx_dropped = 0
        self.boots = 0
        self.wdt_feeds = 0  # watchdog feeds reported over the link, all boots
        self.heap_used: int | None = None  # bytes, the board's last heap report
        self.heap_used_at_ms: int | None = None  # world time of that report
        self._heap_req = False
        self.resets: list[str] = []  # reset causes after the first power-up
        self.reset_times: list[int] = []  # world ms of each of those resets
        self.last_crash = ""
        self.decoder = StreamDecoder(accept=C.D2H)
        self.last_telemetry: dict | None = None
        self.telemetry_count = 0
        self.events: list[dict] = []
        self.hellos: list[dict] = []
        self.banners = 0
        self.messages: collections.deque = collections.deque(maxlen=512)
        self.tx_log = bytearray() if record_tx else None
        self._banner_tail = b""
        # what the MCU does, one McuEvent per change (tests: wait_mcu_event);
        # on_mcu_event(event) hears each as it happens (the CLI prints them)
        self._mcu_events: collections.deque[McuEvent] = collections.deque(maxlen=1000)
        self.on_mcu_event = None
        self._mcu_seq = 0
        self._mcu_cond = threading.Condition()

        self.keys: KeyStore | None = None
        self._attached = None
        self._signers: dict[int, tuple[bytes, Signer]] = {}
        if provision:
            self._provision(keys)

        self._open_pty()
        atexit.register(self.stop)

    # ------------------------------------------------------------------ public API

    @property
    def sim_time_ms(self) -> int:
        return self.world.now_ms

    @property
    def plugged(self) -> bool:
        return self._master >= 0

    # -- signing -----------------------------------------------------------------

    @property
    def key_path(self) -> Path:
        """The module's secret (``secret.key`` in its flash directory)."""
        return self.fs_dir / SECRET_FILE

    @property
    def key(self) -> bytes | None:
        """The module's current secret (None: none, or not a key)."""
        try:
            data = self.key_path.read_bytes()
        except OSError:
            return None
        return data if len(data) == KEY_LEN else None

    @property
    def host_key_path(self) -> Path | None:
        """The host's copy of the key (None: not provisioned)."""
        return None if self.keys is None else self.keys.path(self.uid.hex())

    @property
    def nonce(self) -> bytes | None:
        """The nonce of the firmware's last hello (None: no hello yet, or no signing)."""
        with self.lock:
            for h in reversed(self.hellos):
                return h.get("nonce")
        return None

    def encode(self, name, fields=None, seq=0, *, link_id=HOST_LINK_ID) -> bytes:
        """A frame for ``host_write``, signed like a host signs it: every message but
        the open reads, over the last hello's nonce, with the module's secret."""
        if name in OPEN_REQUESTS:
            return encode_frame(name, fields or {}, seq)
        if self.nonce is None:
            raise SimError("no hello from the firmware yet (its nonce signs): run it first")
        key = self.key
        if key is None:
            raise SimError("the virtual module has no secret: nothing to sign with")
        held = self._signers.get(link_id)
        if held is None or held[0] != key:
            held = self._signers[link_id] = (key, Signer(key, link_id=link_id))
        signer = held[1]
        signer.nonce = self.nonce
        return encode_frame(name, fields or {}, seq, signer=signer)

    def _provision(self, keys) -> None:
        """The module's secret (kept if it has one) and the host's copy of it."""
        key = self.key
        if key is None:
            key = new_key()
            write_key_file(self.key_path, key)
        if keys is None:
            keys = KeyStore(self.state_dir / "host-keys")
            attach_dir(keys.dir)
            self._attached = keys.dir
        uid = self.uid.hex()
        try:
            same = keys.load(uid) == key
        except Exception:  # noqa: BLE001 - a broken host copy is replaced below
            same = False
        if not same:
            keys.save(uid, key, overwrite=True)
        self.keys = keys

    def stats(self) -> dict:
        return {
            "sim_time_ms": self.world.now_ms,
            "mcu_state": self.mcu_state,
            "halt_reason": self.halt_reason,
            "exchanges": self.exchanges,
            "bytes_to_host": self.bytes_to_host,
            "bytes_from_host": self.bytes_from_host,
            "host_bytes_dropped": self.host_bytes_dropped,
            "tx_dropped": self.tx_dropped,
            "boots": self.boots,
            "resets": list(self.resets),
            "telemetry": self.telemetry_count,
            "port": self.port,
        }

    def power_on(self) -> None:
        """Start the firmware if it is not running (first power-up: cause "power")."""
        with self.lock:
            self._check_open()
            if self.mcu_state == "off":
                self._boot("power")

    def run_for(self, sim_ms: int) -> None:
        """Run ``sim_ms`` of world time in this thread (powers on first if needed)."""
        if self._thread is not None:
            raise SimError("run_for() while the runner thread is running: stop() it first")
        self.power_on()
        end = self.world.now_ms + int(sim_ms)
        self._pace_reset()
        while self.world.now_ms < end:
            with self.lock:
                self._exchange(end)
            self._pace()

    def start(self) -> None:
        """Power on and run in a background thread until ``stop()``."""
        if self._thread is not None:
            return
        self.power_on()
        self._stop_evt.clear()
        self._pace_reset()
        self._thread = threading.Thread(target=self._loop, name="virtual-module", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """Stop the runner thread, keeping the process and the pty (``run_for`` works)."""
        t = self._thread
        if t is None:
            return
        self._stop_evt.set()
        t.join(timeout=self.hang_timeout_s + 5)
        self._thread = None

    def stop(self) -> None:
        """Stop everything: thread, process (killed), pty, symlink. Idempotent."""
        if self._closed:
            return
        self.pause()
        with self.lock:
            was = self.mcu_state
            self._closed = True
            self._close_repl()
            self._kill()
            self.mcu_state = "off"
            self._close_pty()
            if self._link_file is not None:
                self._link_file.close()
                self._link_file = None
            t, self._repl_thread = self._repl_thread, None
        if was != "off":
            self._emit("off")
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2)
        if self._attached is not None:
            detach_dir(self._attached)
            self._attached = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    close = stop

    def __enter__(self) -> VirtualModule:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------

    def host_silence(self, on: bool = True) -> None:
        """While on, bytes from the host never reach the firmware (they are dropped)."""
        with self.lock:
            self._silence = bool(on)

    def starve_watchdog(self, on: bool = True) -> None:
        """The board stops counting watchdog feeds (until the next MCU reset)."""
        with self.lock:
            self._starve = bool(on)

    def mcu_reset(self, cause: str = "power") -> None:
        """Kill and restart the firmware process; ``cause`` is what reset_cause() says."""
        if cause not in L.RESET_CAUSES:
            raise ValueError(f"cause must be one of {', '.join(L.RESET_CAUSES)}")
        with self.lock:
            self._check_open()
            self._boot(cause)

    def unplug(self) -> None:
        """Close the pty master: the host sees a disconnect; the slave path disappears."""
        with self.lock:
            was = self.plugged
            self._close_pty()
            if was:
                self._emit("unplugged", "the port is gone (the MCU keeps running)")

    def replug(self) -> None:
        """A new pty (a new path); the symlink now points at it."""
        with self.lock:
            self._check_open()
            if self.plugged:
                self._close_pty()
            self._open_pty()
            self._emit("plugged", str(self.port))

    # -- what the MCU does ---------------------------------------------------------

    @property
    def mcu_events(self) -> list[McuEvent]:
        """The last 1,000 McuEvents, oldest first (a copy)."""
        with self._mcu_cond:
            return list(self._mcu_events)

    @property
    def mcu_status(self) -> str:
        """The last change as one line (``"off"`` before the first)."""
        with self._mcu_cond:
            return self._mcu_events[-1].text if self._mcu_events else "off"

    @property
    def mcu_event_count(self) -> int:
        """How many McuEvents so far (``seq`` of the last one)."""
        return self._mcu_seq

    def wait_mcu_event(self, kind: str, after: int = 0, timeout: float = 10.0):
        """The first McuEvent of ``kind`` with ``seq > after`` (None after ``timeout``
        seconds of wall time). ``after=vm.mcu_event_count`` waits for a new one."""
        end = time.monotonic() + timeout
        with self._mcu_cond:
            while True:
                for ev in self._mcu_events:
                    if ev.seq > after and ev.kind == kind:
                        return ev
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._mcu_cond.wait(left)

    def _emit(self, kind: str, why: str = "", version: str = "") -> None:
        with self._mcu_cond:
            self._mcu_seq += 1
            ev = McuEvent(self._mcu_seq, self.world.now_ms, kind, why, version)
            self._mcu_events.append(ev)
            self._mcu_cond.notify_all()
        log.info("virtual MCU %s: %s", self.uid.hex()[:12], ev.text)
        cb = self.on_mcu_event
        if cb is not None:
            try:
                cb(ev)
            except Exception:  # noqa: BLE001 - a listener must not stop the MCU
                log.exception("on_mcu_event failed")

    def world_fault(self, name: str, *args, **kwargs):
        """Call ``world.<name>(*args, **kwargs)`` between two exchanges; its result."""
        with self.lock:
            return getattr(self.world, name)(*args, **kwargs)

    def request_heap(self) -> None:
        """Ask the board for its heap in use: ``heap_used`` is set one exchange later."""
        with self.lock:
            self._heap_req = True

    def host_write(self, data: bytes) -> None:
        """Bytes from the host, delivered at the next exchange (ahead of pty input).

        The deterministic way in: a write to the pty reaches the master after a
        kernel-dependent delay, this does not. Host silence drops them too.
        """
        with self.lock:
            if data:
                self._inject.append(bytes(data))

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        try:
            while not self._stop_evt.is_set():
                with self.lock:
                    self._exchange(None)
                self._pace()
        except Exception:  # noqa: BLE001 - the thread must not die silently
            log.exception("virtual module runner stopped")
            raise

    def _pace_reset(self) -> None:
        self._pace_wall = time.monotonic()
        self._pace_sim = self.world.now_ms

    def _pace(self) -> None:
        if self.speed <= 0:
            return
        due = self._pace_wall + (self.world.now_ms - self._pace_sim) / 1000.0 / self.speed
        delay = due - time.monotonic()
        if delay < -1.0:  # far behind (slow host): do not race to catch up
            self._pace_reset()
        elif delay > 0:
            self._stop_evt.wait(min(delay, 0.5))

    def _exchange(self, end_ms: int | None) -> None:
        """One request/reply with the firmware, or one idle step when it is not running.

        ``end_ms`` (run_for's end) bounds an idle step; a firmware sleep is never cut.
        """
        if self._closed:
            raise SimError("the virtual module is stopped")
        if self.mcu_state != "running":
            self._idle_step(end_ms)
            return
        req = self._read_request()
        if req is None:
            return  # halted: the next call idles
        self.exchanges += 1
        self.wdt_feeds += req.wdt_feeds
        if req.heap_used is not None:
            self.heap_used = req.heap_used
            self.heap_used_at_ms = self.world.now_ms
        if req.tx:
            self._relay_tx(req.tx)
        self._duty = req.duty
        if self.on_exchange is not None and self.last_adc is not None:
            self.on_exchange(self.world.now_ms, req.duty, self.last_adc)
        kind = req.kind
        if kind == L.REQ_TX:
            return
        if kind == L.REQ_RESET:
            self._boot("soft", "the firmware reset itself")
            return
        if kind == L.REQ_REPL:
            self._to_repl()
            return
        if kind != L.REQ_SLEEP:
            self._crash(f"unexpected {L.REQ_KINDS[kind]} request")
            return
        now = self.world.now_ms
        if req.wdt_timeout_ms and not self._wdt_ms:
            self._last_feed_ms = now  # machine.WDT counts from its creation
        self._wdt_ms = req.wdt_timeout_ms
        if req.wdt_feeds:
            self._last_feed_ms = now
        dt = req.sleep_ms
        if self._wdt_ms:
            deadline = self._last_feed_ms + self._wdt_ms
            if now + dt >= deadline:
                self._step_world(max(0, deadline - now))
                self._boot("watchdog", f"not fed for {self._wdt_ms} ms")
                return
        self._step_world(dt)
        self._reply(self._make_step())

    def _idle_step(self, end_ms: int | None) -> None:
        """World time passes with the MCU not exchanging (off, at the REPL, crashed)."""
        now = self.world.now_ms
        dt = self.poll_ms
        if end_ms is not None:
            dt = max(1, min(dt, end_ms - now))
        if self.mcu_state in ("halted", "repl") and self._wdt_ms:
            # a started watchdog runs on at the REPL too: nothing feeds it there
            deadline = self._last_feed_ms + self._wdt_ms
            if now + dt >= deadline:
                self._step_world(max(0, deadline - now))
                self._boot("watchdog", f"not fed for {self._wdt_ms} ms")
                return
        if self.mcu_state == "off":
            self._duty = (0, 0)  # unpowered module
        self._step_world(dt)
        self.world.tach_pulses()  # nobody counts them
        if self.mcu_state != "repl":  # at the REPL its thread reads the port
            self._drain_host()

    def _step_world(self, dt: int) -> None:
        w = self.world
        w.set_duties(int(self._duty[0]), int(self._duty[1]))
        if dt:
            w.step(int(dt))

    def _ticks(self) -> int:
        return (self.world.now_ms - self._boot_world_ms + self.ticks_start) & TICKS_MASK

    def _make_step(self, pulses=None) -> L.Step:
        w = self.world
        flags = 0
        if self._starve:
            flags |= L.FLAG_STARVE_WDT
        if self._heap_req:
            self._heap_req = False
            flags |= L.FLAG_HEAP
        bus_mv = current_ma = 0
        if _ina_absent(w):
            flags |= L.FLAG_INA_ABSENT
        else:
            bus_mv, current_ma = w.ina226_inputs()
        if pulses is None:
            pulses = w.tach_pulses()
        adc = [[min(65535, max(0, int(c))) for c in ch] for ch in w.adc_codes(self.adc_samples)]
        self.last_adc = adc
        return L.Step(
            self._ticks(),
            flags,
            int(bus_mv),
            int(current_ma),
            (min(0xFFFF, int(pulses[0])), min(0xFFFF, int(pulses[1]))),
            adc,
            self._gather_host(),
        )

    # ------------------------------------------------------------------ process

    def _boot(self, cause: str, why: str | None = "") -> None:
        """(Re)start the firmware: fans at 100 % for boot_ms, a new process, boot reply.

        Announced as a ``reset`` McuEvent (``cause``, ``why``) after the first
        power-up; ``why=None``: the caller announced it (a soft reset at the REPL)."""
        first = self.mcu_state == "off" and self.boots == 0
        if not first and why is not None:
            self._emit("reset", f"{cause} ({why})" if why else cause)
        self._close_repl()
        self._reset_at = self.world.now_ms
        self._kill()
        self._wdt_ms = 0
        self._starve = False
        self._duty = (65535, 65535)  # PWM pins float during reset: fans flat out
        self._step_world(self.boot_ms)
        self.world.tach_pulses()
        self._drain_host()
        self.decoder.reset()
        self._spawn()
        req = self._read_request(timeout_s=max(self.hang_timeout_s, 30.0))
        if req is None:
            return
        if req.kind != L.REQ_BOOT:
            self._crash(f"first request is {L.REQ_KINDS[req.kind]}, not boot")
            return
        self._boot_world_ms = self.world.now_ms
        self.boots += 1
        if not first:
            self.resets.append(cause)
            self.reset_times.append(self._reset_at)
        boot = L.Boot(cause, self.poll_ms, self.uid, str(self.fs_dir))
        self._boot_cause = cause
        self._await_hello = True  # "running firmware" when its first hello comes
        self._reply(self._make_step(pulses=(0, 0)), boot)
        log.info("virtual MCU up (%s) at t=%d ms", cause, self.world.now_ms)

    def _spawn(self) -> None:
        if self._log_file is None:
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115
        env = dict(os.environ)
        env["MICROPYPATH"] = os.pathsep.join([str(self.code_root), ".frozen"])
        argv = [self._micropython, "-X", f"heapsize={self.heapsize}", "-c", BOOTSTRAP]
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log_file,
                cwd=self.state_dir,
                env=env,
                bufsize=0,
                start_new_session=True,
            )
        except (FileNotFoundError, PermissionError) as e:
            self.mcu_state = "off"
            raise mpy.MicroPythonMissing(
                f"{MICROPYTHON_MISSING} ({self._micropython}: {e.strerror})"
            ) from None
        self._out_fd = self._proc.stdout.fileno()
        self._in_fd = self._proc.stdin.fileno()
        self.mcu_state = "running"
        self.halt_reason = ""

    def _kill(self) -> None:
        p = self._proc
        if p is None:
            return
        self._proc = None
        self._out_fd = self._in_fd = -1
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
        for f in (p.stdin, p.stdout):
            with contextlib.suppress(OSError):
                f.close()

    def _halt(self, reason: str) -> None:
        """The firmware stopped exchanging and nothing answers on the port (a hang, a
        broken link); the MCU keeps its last outputs."""
        self._kill()
        self.mcu_state = "halted"
        self.halt_reason = reason
        self._emit("halted", reason)

    def _crash(self, why: str, garbage: bytes = b"", hung: bool = False) -> None:
        """The firmware stopped: its process exited (returned, or an uncaught
        exception: the board drops to its REPL, the traceback on the port) or it is
        still there but broke the link or hangs (killed: halted)."""
        rest = garbage + (b"" if hung else self._read_rest())
        text = rest.decode("utf-8", "replace")
        self.last_crash = f"{why}\n{text}".strip()
        if self._log_file is not None:
            self._log_file.write(f"--- t={self.world.now_ms} ms: {why}\n".encode() + rest)
            self._log_file.flush()
        log.warning("virtual MCU: %s %s", why, text.strip()[-500:])
        p, rc = self._proc, None
        if p is not None and not hung:
            rc = p.poll()
            if rc is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rc = p.wait(timeout=0.2)
        self._kill()
        if rc is None:
            self._halt(why)
            return
        last = _last_line(text)
        if rc == 0:
            reason = "the firmware exited"
        elif last:
            reason = f"the firmware crashed: {last}"
        else:
            reason = f"the firmware exited with status {rc}"
        start = rest.find(b"Traceback")
        if start >= 0:
            shown = rest[start:]
        else:
            shown = rest if rest[:1] != bytes((L.MAGIC_REQ,)) else b""
        self._enter_repl(reason, shown)

    def _to_repl(self) -> None:
        """REQ_REPL: the firmware handed the port back; what it prints next (main.py's
        note) reaches the port, then the REPL's banner."""
        rest = b""
        p = self._proc
        if p is not None:
            rest = self._read_rest(timeout_s=2.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=2)
        self._kill()
        self._enter_repl("repl command", rest)

    # ------------------------------------------------------------------ the REPL

    def _enter_repl(self, why: str, preamble: bytes = b"") -> None:
        """The MCU sits at MicroPython's REPL: a thread serves it on the pty."""
        self._close_repl()
        self.mcu_state = "repl"
        self.halt_reason = why
        try:
            repl = R.Repl(self._repl_interpreter, notify=self._emit)
        except R.ReplError as e:
            self._halt(f"{why}; no REPL: {e}")
            return
        repl.start(preamble)
        self._repl = repl
        self._repl_out += repl.take_output()
        self._flush_repl_out()
        self._emit("repl", why)
        t = threading.Thread(
            target=self._repl_loop, args=(repl,), name="virtual-module-repl", daemon=True
        )
        self._repl_thread = t
        t.start()

    def _repl_interpreter(self) -> R.Interpreter:
        if self._log_file is None:
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115
        return R.Interpreter(
            self.fs_dir,
            micropython=self._micropython,
            uid=self.uid,
            reset_cause=_CAUSE_CODES.get(self._boot_cause, 1),
            heapsize=self.heapsize,
            stderr=self._log_file,
        )

    def _close_repl(self) -> None:
        repl, self._repl = self._repl, None
        if repl is not None:
            self._flush_repl_out()  # e.g. "MPY: soft reboot" before the firmware's banner
            repl.close()
        self._repl_out.clear()

    def _repl_loop(self, repl: R.Repl) -> None:
        """Serve the REPL on the pty until it is closed (reset, soft reset, stop)."""
        while True:
            with self.lock:
                if self._repl is not repl:
                    return
                rfds = list(repl.fds)
                if self._master >= 0:
                    rfds.append(self._master)
                wfds = [self._master] if self._repl_out and self._master >= 0 else []
            try:
                select.select(rfds, wfds, [], 0.05)
            except (OSError, ValueError):  # an fd closed meanwhile: look again
                time.sleep(0.01)
            with self.lock:
                if self._repl is not repl or self._closed:
                    return
                try:
                    self._repl_service(repl)
                except Exception:  # noqa: BLE001 - the REPL thread must not die silently
                    log.exception("virtual MCU REPL")
                    time.sleep(0.05)

    def _repl_service(self, repl: R.Repl) -> None:
        data = b""
        while self._inject:
            data += self._inject.popleft()
        data += self._read_master(4096)
        if data:
            if self._silence:
                self.host_bytes_dropped += len(data)
            else:
                self.bytes_from_host += len(data)
                repl.feed(data)
        repl.poll()
        self._repl_out += repl.take_output()
        self._flush_repl_out()
        if repl.action == "soft":
            self._emit("soft_reset", "from the friendly REPL: main.py runs the firmware again")
            self._boot("soft", None)
        elif repl.action == "reset":
            self._boot("soft", "machine.reset() at the REPL")

    def _flush_repl_out(self) -> None:
        out = self._repl_out
        if not out:
            return
        if self._master < 0:
            self.tx_dropped += len(out)
            out.clear()
            return
        try:
            n = os.write(self._master, out)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self.tx_dropped += len(out)
            out.clear()
            return
        self.bytes_to_host += n
        del out[:n]
        if len(out) > R.MAX_PENDING * 16:  # nobody reads the port: drop the oldest
            self.tx_dropped += len(out) - R.MAX_PENDING * 16
            del out[: len(out) - R.MAX_PENDING * 16]

    def _knock(self, data: bytes) -> None:
        """A REPL tool's Ctrl-C / Ctrl-A among the host's bytes: say what is wrong
        (at most every 2 s). The bytes go on to the firmware, which ignores them."""
        scan = self._host_tail + data
        self._host_tail = scan[-2:]
        if not any(k in scan for k in REPL_KNOCKS):
            return
        now = time.monotonic()
        if now - self._knock_at < 2.0:
            return
        self._knock_at = now
        if self.mcu_state == "running":
            self._emit("note", NOTE_FIRMWARE_OWNS_PORT)
        elif self.mcu_state == "halted":
            self._emit("note", f"the MCU is halted ({self.halt_reason}): nothing answers")

    def _read_rest(self, timeout_s: float = 1.0) -> bytes:
        out = b""
        fd = self._out_fd
        end = time.monotonic() + timeout_s
        while fd >= 0 and len(out) < 65536:
            left = end - time.monotonic()
            if left <= 0:
                break
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
        return out

    def _read_exact(self, n: int, timeout_s: float) -> bytes | None:
        buf = b""
        end = time.monotonic() + timeout_s
        while len(buf) < n:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self._out_fd], [], [], left)
            if not r:
                continue
            chunk = os.read(self._out_fd, n - len(buf))
            if not chunk:
                return None if not buf else buf
            buf += chunk
        return buf

    def _read_request(self, timeout_s: float | None = None) -> L.Request | None:
        """The next request, or None after handling a crash, a hang or an exit."""
        t = self.hang_timeout_s if timeout_s is None else timeout_s
        try:
            hdr = self._read_exact(L.HEADER_SIZE, t)
            if hdr is None or len(hdr) < L.HEADER_SIZE:
                self._crash("the firmware process exited", hdr or b"")
                return None
            try:
                kind, n = L.decode_header(hdr, L.MAGIC_REQ)
            except L.LinkError as e:
                self._crash(f"not a link message ({e}): the firmware printed", hdr)
                return None
            body = self._read_exact(n, t)
            if body is None or len(body) < n:
                self._crash("the firmware process exited mid-message", hdr + (body or b""))
                return None
        except TimeoutError:
            self._crash(f"no request for {t:g} s of wall time: the firmware hangs", hung=True)
            return None
        if self._link_file is not None:
            self._link_file.write(hdr + body)
        try:
            return L.decode_request_body(kind, body)
        except L.LinkError as e:
            self._crash(f"bad request: {e}", hdr + body)
            return None

    def _reply(self, step: L.Step, boot: L.Boot | None = None) -> None:
        data = L.encode_reply(step, boot)
        if self._link_file is not None:
            self._link_file.write(data)
        try:
            os.write(self._in_fd, data)  # < 64 KB: one pipe write, never partial
        except (BrokenPipeError, OSError):
            self._crash("the firmware process closed its stdin")

    # ------------------------------------------------------------------ the pty

    def _check_open(self) -> None:
        if self._closed:
            raise SimError("the virtual module is stopped")

    def _open_pty(self) -> None:
        master, slave = pty.openpty()
        tty.setraw(slave)  # no echo, no line discipline until (and unless) a host changes it
        os.set_blocking(master, False)
        self._master, self._slave = master, slave
        self.port = os.ttyname(slave)
        if self.port_symlink is not None:
            tmp = self.port_symlink.with_name(self.port_symlink.name + ".new")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.symlink(self.port, tmp)
            os.replace(tmp, self.port_symlink)

    def _close_pty(self) -> None:
        for fd in (self._master, self._slave):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._master = self._slave = -1
        self.port = None
        if self.port_symlink is not None:
            with contextlib.suppress(FileNotFoundError):
                self.port_symlink.unlink()

    def _read_master(self, n: int) -> bytes:
        if self._master < 0 or n <= 0:
            return b""
        try:
            return os.read(self._master, n)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as e:
            if e.errno in (errno.EIO, errno.EAGAIN):
                return b""
            raise

    def _gather_host(self) -> bytes:
        """Host bytes for this reply (injected first, then the pty), at most MAX_RX."""
        if self._silence:
            self._drain_host()
            return b""
        out = b""
        while self._inject and len(out) < L.MAX_RX:
            chunk = self._inject.popleft()
            room = L.MAX_RX - len(out)
            if len(chunk) > room:
                self._inject.appendleft(chunk[room:])
                chunk = chunk[:room]
            out += chunk
        out += self._read_master(L.MAX_RX - len(out))
        self.bytes_from_host += len(out)
        if out:
            self._knock(out)
        return out

    def _drain_host(self) -> None:
        """Drop what the host sent (silence, or nobody listening on the MCU side)."""
        n = sum(len(c) for c in self._inject)
        self._inject.clear()
        while True:
            chunk = self._read_master(4096)
            if not chunk:
                break
            n += len(chunk)
            if self.mcu_state == "halted":
                self._knock(chunk)
        self.host_bytes_dropped += n

    def _relay_tx(self, data: bytes) -> None:
        self._tap(data)
        if self._master < 0:
            self.tx_dropped += len(data)
            return
        try:
            n = os.write(self._master, data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            n = 0
        self.bytes_to_host += n
        self.tx_dropped += len(data) - n  # nobody reads the port: a full buffer drops

    # ------------------------------------------------------------------ the tap

    def _tap(self, data: bytes) -> None:
        if self.tx_log is not None:
            self.tx_log += data
        scan = self._banner_tail + data
        self.banners += scan.count(BANNER_PREFIX)
        self._banner_tail = scan[-(len(BANNER_PREFIX) - 1) :]
        for item in self.decoder.feed(data):
            if not item.ok:
                continue
            self.messages.append((item.name, item.fields))
            if item.name == "telemetry":
                self.last_telemetry = item.fields
                self.telemetry_count += 1
            elif item.name == "event":
                self.events.append(item.fields)
            elif item.name == "hello":
                self.hellos.append(item.fields)
                if self._await_hello:
                    self._await_hello = False
                    version = str(item.fields.get("fw_version", ""))
                    self._emit("running", self._boot_cause, version)


def stage_mpy(dest) -> Path:
    """Compile the firmware as the sim runs it into ``dest`` (``.mpy`` bytecode, the
    way ``modbridge flash`` stages a board) and return it, for ``code_root=``."""
    from modbridge.tools import flash

    dest = Path(dest)
    files = sorted(set(flash.firmware_sources("sim")) | {"boards/sim_ina226.py"})
    flash.stage("sim", dest, files=files, march=None)
    return dest
