"""The lockstep link between the sim board and the simulated world: format and codec.

The firmware runs in the MicroPython unix port with ``boards/sim.py`` as its board.
That process's stdin/stdout are this private binary link to the runner
(``runner.py``, CPython), never the protocol port. The world is the clock: each
``hal.sleep_ms(ms)`` of the firmware is one exchange, a request from the board and one
reply from the runner; nothing moves in between.

This module is the format's one description and the runner's codec for both ends. It
imports on CPython and MicroPython (tests decode the board's real output with it
under both). The board's own allocation-free implementation is in ``boards/sim.py``;
``tests/test_sim_board.py`` round-trips every message kind between the two.

Every message (both directions), little-endian::

    header   B magic    MAGIC_REQ (board -> runner) or MAGIC_REP (runner -> board)
             B version  VERSION
             B kind
             H length   of the body that follows

Request body (board -> runner), the same for every kind::

    I  sleep_ms        SLEEP: how long the firmware sleeps; 0 otherwise
    H  duty1, duty2    PWM duty_u16 the fans see now
    I  freq1, freq2    PWM frequency, Hz
    H  wdt_feeds       watchdog feeds since the previous request (saturates at 65535)
    I  wdt_timeout_ms  0 while the watchdog is not started
    H  tx_n            protocol bytes the firmware wrote since the previous request
    tx_n bytes
    [I heap_used]      optional, only in the request that follows a reply with
                       FLAG_HEAP: MicroPython heap in use (``gc.mem_alloc()`` right
                       after a ``gc.collect()``), 0 where the interpreter cannot tell
                       (CPython). The body length says whether it is there.

Request kinds: REQ_BOOT (first message of a process, expects a REP_BOOT reply),
REQ_SLEEP (expects a REP_STEP reply), REQ_TX (the board's transmit buffer is full:
relay, no reply, no time passes), REQ_RESET (the firmware called ``hal.reset()``: no
reply; the runner restarts the process, reset cause "soft"), REQ_REPL (the firmware
handed the port back to the REPL: no reply; the process ends; the MCU sits at the
REPL, where a started watchdog is no longer fed).

Reply body (runner -> board). REP_BOOT starts with a boot section::

    B  reset_cause     index into RESET_CAUSES
    H  poll_ms         longest sleep the firmware should take (``hal.poll_ms``)
    B  uid_n, uid_n bytes      the MCU's unique id
    B  fs_n,  fs_n bytes       fs_dir (UTF-8): the MCU's flash, a host directory

then, for REP_BOOT and REP_STEP alike, the step section::

    I  ticks_ms        the board's time after the sleep (0 .. 2**30-1, wrapping)
    B  flags           FLAG_STOP | FLAG_INA_ABSENT | FLAG_STARVE_WDT | FLAG_HEAP
    i  bus_mv          INA226 inputs (ignored with FLAG_INA_ABSENT)
    i  current_ma
    H  pulses1, pulses2  tach pulses each fan made during the sleep
    B  n_adc           samples per channel (1 .. MAX_ADC)
    4 x n_adc H        ADC codes, channel-major (gpu, vram, mos, amb); read_u16()
                       serves a channel's samples cyclically until the next reply
    H  rx_n            protocol bytes from the host (at most MAX_RX)
    rx_n bytes

FLAG_STOP ends the firmware process (a clean shutdown of the simulation).
FLAG_HEAP asks the board for ``heap_used`` in its next request (benchmarks poll it
now and then: measuring walks the whole heap, so it is never done unasked).
FLAG_STARVE_WDT makes the board drop watchdog feeds (a test hook that stands for a
hung control loop). Sizes are bounded: MAX_TX bytes per request, MAX_RX and MAX_ADC
per reply, so both ends use fixed buffers of MAX_REQUEST / MAX_REPLY bytes.
"""

import struct

MAGIC_REQ = 0xB5
MAGIC_REP = 0x5B
VERSION = 1
HEADER = "<BBBH"
HEADER_SIZE = 5

REQ_BOOT = 0
REQ_SLEEP = 1
REQ_TX = 2
REQ_RESET = 3
REQ_REPL = 4
REQ_KINDS = ("boot", "sleep", "tx", "reset", "repl")

REP_BOOT = 0
REP_STEP = 1

FLAG_STOP = 1
FLAG_INA_ABSENT = 2
FLAG_STARVE_WDT = 4
FLAG_HEAP = 8

RESET_CAUSES = ("power", "watchdog", "soft", "hard")

REQ_FIXED = "<IHHIIHIH"
REQ_FIXED_SIZE = 24
HEAP_FIELD = "<I"  # the optional heap_used after the tx bytes
HEAP_FIELD_SIZE = 4
BOOT_FIXED = "<BH"  # then uid, fs_dir (each length-prefixed by one byte)
STEP_FIXED = "<IBiiHHB"
STEP_FIXED_SIZE = 18

N_ADC_CHANNELS = 4
MAX_TX = 2048
MAX_RX = 512
MAX_ADC = 16
MAX_UID = 16
MAX_FS = 255
MAX_REQUEST = HEADER_SIZE + REQ_FIXED_SIZE + MAX_TX + HEAP_FIELD_SIZE
MAX_REPLY = (
    HEADER_SIZE
    + 3
    + 1
    + MAX_UID
    + 1
    + MAX_FS
    + STEP_FIXED_SIZE
    + 2 * N_ADC_CHANNELS * MAX_ADC
    + 2
    + MAX_RX
)


class LinkError(ValueError):
    """A message that does not follow this format (bad magic, version, length, kind)."""


class Request:
    """One board -> runner message, decoded."""

    def __init__(
        self,
        kind,
        sleep_ms=0,
        duty=(65535, 65535),
        freq=(0, 0),
        wdt_feeds=0,
        wdt_timeout_ms=0,
        tx=b"",
        heap_used=None,
    ):
        self.kind = kind
        self.sleep_ms = sleep_ms
        self.duty = tuple(duty)
        self.freq = tuple(freq)
        self.wdt_feeds = wdt_feeds
        self.wdt_timeout_ms = wdt_timeout_ms
        self.tx = bytes(tx)
        self.heap_used = heap_used  # None: not reported in this request

    def __eq__(self, other):
        return isinstance(other, Request) and self._key() == other._key()

    def _key(self):
        return (
            self.kind,
            self.sleep_ms,
            self.duty,
            self.freq,
            self.wdt_feeds,
            self.wdt_timeout_ms,
            self.tx,
            self.heap_used,
        )

    def __repr__(self):
        kind = REQ_KINDS[self.kind] if 0 <= self.kind < len(REQ_KINDS) else self.kind
        return (
            f"Request({kind}, sleep_ms={self.sleep_ms}, duty={self.duty!r},"
            f" feeds={self.wdt_feeds}, wdt={self.wdt_timeout_ms}, tx={len(self.tx)} B)"
        )


class Boot:
    """The boot section of a REP_BOOT reply."""

    def __init__(self, reset_cause="power", poll_ms=100, uid=b"", fs_dir="/"):
        self.reset_cause = reset_cause
        self.poll_ms = poll_ms
        self.uid = bytes(uid)
        self.fs_dir = fs_dir

    def __eq__(self, other):
        return isinstance(other, Boot) and (
            self.reset_cause,
            self.poll_ms,
            self.uid,
            self.fs_dir,
        ) == (other.reset_cause, other.poll_ms, other.uid, other.fs_dir)


class Step:
    """The step section of a reply: what the world gives the board for the next sleep."""

    def __init__(
        self,
        ticks_ms=0,
        flags=0,
        bus_mv=0,
        current_ma=0,
        pulses=(0, 0),
        adc=((0,), (0,), (0,), (0,)),
        rx=b"",
    ):
        self.ticks_ms = ticks_ms
        self.flags = flags
        self.bus_mv = bus_mv
        self.current_ma = current_ma
        self.pulses = tuple(pulses)
        self.adc = tuple(tuple(ch) for ch in adc)
        self.rx = bytes(rx)

    def _key(self):
        return (
            self.ticks_ms,
            self.flags,
            self.bus_mv,
            self.current_ma,
            self.pulses,
            self.adc,
            self.rx,
        )

    def __eq__(self, other):
        return isinstance(other, Step) and self._key() == other._key()


# --------------------------------------------------------------------------- requests


def encode_request(req):
    """Bytes of a request (what the board writes; the board has its own encoder)."""
    if len(req.tx) > MAX_TX:
        raise LinkError(f"tx of {len(req.tx)} bytes exceeds MAX_TX {MAX_TX}")
    body = (
        struct.pack(
            REQ_FIXED,
            req.sleep_ms,
            req.duty[0],
            req.duty[1],
            req.freq[0],
            req.freq[1],
            min(req.wdt_feeds, 0xFFFF),
            req.wdt_timeout_ms,
            len(req.tx),
        )
        + req.tx
    )
    if req.heap_used is not None:
        body += struct.pack(HEAP_FIELD, req.heap_used)
    return struct.pack(HEADER, MAGIC_REQ, VERSION, req.kind, len(body)) + body


def decode_header(header, magic):
    """``(kind, body_length)`` from HEADER_SIZE bytes; LinkError if they are not ours."""
    if len(header) != HEADER_SIZE:
        raise LinkError(f"short header: {len(header)} bytes")
    m, version, kind, n = struct.unpack(HEADER, header)
    if m != magic:
        raise LinkError(f"bad magic 0x{m:02x} (expected 0x{magic:02x})")
    if version != VERSION:
        raise LinkError(f"link version {version}, expected {VERSION}")
    return kind, n


def decode_request_body(kind, body):
    if kind >= len(REQ_KINDS):
        raise LinkError(f"unknown request kind {kind}")
    if len(body) < REQ_FIXED_SIZE:
        raise LinkError(f"request body of {len(body)} bytes is too short")
    sleep_ms, d1, d2, f1, f2, feeds, wdt_ms, tx_n = struct.unpack_from(REQ_FIXED, body, 0)
    end = REQ_FIXED_SIZE + tx_n
    heap_used = None
    if end + HEAP_FIELD_SIZE == len(body):
        (heap_used,) = struct.unpack_from(HEAP_FIELD, body, end)
    elif end != len(body):
        raise LinkError(f"request tx_n {tx_n} does not match the body length {len(body)}")
    tx = body[REQ_FIXED_SIZE:end]
    return Request(kind, sleep_ms, (d1, d2), (f1, f2), feeds, wdt_ms, tx, heap_used)


def decode_request(data):
    """A Request from the bytes of one whole message."""
    kind, n = decode_header(data[:HEADER_SIZE], MAGIC_REQ)
    body = data[HEADER_SIZE:]
    if len(body) != n:
        raise LinkError(f"body of {len(body)} bytes, header says {n}")
    return decode_request_body(kind, body)


# --------------------------------------------------------------------------- replies


def encode_reply(step, boot=None):
    """Bytes of a REP_STEP reply, or a REP_BOOT one when ``boot`` is given."""
    parts = []
    if boot is not None:
        uid = bytes(boot.uid)
        fs = boot.fs_dir.encode()
        if len(uid) > MAX_UID or len(fs) > MAX_FS:
            raise LinkError("uid or fs_dir too long")
        parts.append(struct.pack(BOOT_FIXED, RESET_CAUSES.index(boot.reset_cause), boot.poll_ms))
        parts.append(bytes((len(uid),)) + uid + bytes((len(fs),)) + fs)
    n_adc = len(step.adc[0])
    if len(step.adc) != N_ADC_CHANNELS or not 1 <= n_adc <= MAX_ADC:
        raise LinkError(f"adc must be {N_ADC_CHANNELS} channels of 1..{MAX_ADC} samples")
    for ch in step.adc:
        if len(ch) != n_adc:
            raise LinkError("every ADC channel needs the same number of samples")
    if len(step.rx) > MAX_RX:
        raise LinkError(f"rx of {len(step.rx)} bytes exceeds MAX_RX {MAX_RX}")
    parts.append(
        struct.pack(
            STEP_FIXED,
            step.ticks_ms,
            step.flags,
            step.bus_mv,
            step.current_ma,
            min(step.pulses[0], 0xFFFF),
            min(step.pulses[1], 0xFFFF),
            n_adc,
        )
    )
    codes = []
    for ch in step.adc:
        codes.extend(ch)
    parts.append(struct.pack(f"<{len(codes)}H", *codes))
    parts.append(struct.pack("<H", len(step.rx)) + step.rx)
    body = b"".join(parts)
    kind = REP_STEP if boot is None else REP_BOOT
    return struct.pack(HEADER, MAGIC_REP, VERSION, kind, len(body)) + body


def decode_reply(data):
    """``(kind, step, boot)`` from the bytes of one whole reply (boot None for a step)."""
    kind, n = decode_header(data[:HEADER_SIZE], MAGIC_REP)
    body = data[HEADER_SIZE:]
    if len(body) != n:
        raise LinkError(f"body of {len(body)} bytes, header says {n}")
    o = 0
    boot = None
    if kind == REP_BOOT:
        cause, poll_ms = struct.unpack_from(BOOT_FIXED, body, 0)
        o = 3
        uid_n = body[o]
        uid = bytes(body[o + 1 : o + 1 + uid_n])
        o += 1 + uid_n
        fs_n = body[o]
        fs = bytes(body[o + 1 : o + 1 + fs_n]).decode()
        o += 1 + fs_n
        boot = Boot(RESET_CAUSES[cause], poll_ms, uid, fs)
    elif kind != REP_STEP:
        raise LinkError(f"unknown reply kind {kind}")
    ticks, flags, bus, cur, p1, p2, n_adc = struct.unpack_from(STEP_FIXED, body, o)
    o += STEP_FIXED_SIZE
    adc = []
    for _ in range(N_ADC_CHANNELS):
        adc.append(struct.unpack_from(f"<{n_adc}H", body, o))
        o += 2 * n_adc
    (rx_n,) = struct.unpack_from("<H", body, o)
    o += 2
    rx = bytes(body[o : o + rx_n])
    if o + rx_n != len(body):
        raise LinkError(f"reply rx_n {rx_n} does not match the body length")
    return kind, Step(ticks, flags, bus, cur, (p1, p2), adc, rx), boot


def iter_messages(data):
    """``(magic, kind, body)`` for each whole message in ``data`` (a link trace, as the
    runner's ``link_path`` records it: requests and replies in order)."""
    o = 0
    while o + HEADER_SIZE <= len(data):
        magic = data[o]
        kind, n = decode_header(data[o : o + HEADER_SIZE], magic)
        if magic not in (MAGIC_REQ, MAGIC_REP):
            raise LinkError(f"bad magic 0x{magic:02x} at offset {o}")
        yield magic, kind, data[o + HEADER_SIZE : o + HEADER_SIZE + n]
        o += HEADER_SIZE + n
