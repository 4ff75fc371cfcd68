"""Allocation-free telemetry encoder for the firmware's control tick.

The control loop writes wire values (fixed-point ints) into ``enc.values`` by field
index and marks them present; ``encode_cbor(seq)`` or ``encode_json(seq)`` then writes
one complete frame (COBS + delimiter, or a JSON line) into the preallocated ``enc.out``
and returns its length. Nothing on that path allocates on MicroPython as long as the
values are small ints (|v| < 2**30), which the catalog ranges guarantee except at the
top of the u32 fields (``uptime_s``, ``faults``: those are still sent exactly); a test
runs it under ``micropython.heap_lock()``. A port then sends it without slicing::

    n = enc.encode_cbor(seq)
    uart.write(enc.out, n)      # MicroPython streams take (buf, len)

The bytes are identical to :func:`protocol.frame.encode_frame` and
:func:`protocol.jsonl.encode_line` for the same fields (tested).
"""

from protocol import catalog as C
from protocol import cobs
from protocol.cbor import put_head, put_int
from protocol.crc import crc16

if __import__("sys").implementation.name != "micropython":
    # CPython's stand-in; MicroPython's compiler folds ``NAME = const(value)`` itself
    # (not importing it keeps ``const`` out of this module's dict on the MCU).

    def const(x):
        return x


# Constants of the catalog, protocol (VERSION_*), protocol.cbor and protocol.frame this
# module reads (in the tick among others): copies, folded by the compiler (another
# module's names are dict lookups, and imported ones slots in this module's dict on
# the MCU); tests/test_catalog_copies.py checks them.
_VERSION_MAJOR = const(1)
_VERSION_MINOR = const(0)
_MAJOR_MAP = const(5)
_T_TELEMETRY = const(0x10)
_HEADER_LEN = const(5)  # protocol.frame's
_M_FIELDS = const(3)
_F_KEY = const(0)
_F_NAME = const(1)
_F_KIND = const(2)
_F_SCALE = const(6)
_K_ENUM = const("e")

FIELDS = C.by_type(_T_TELEMETRY)[_M_FIELDS]
N_FIELDS = len(FIELDS)


def mul_div_round(v, mul, div):
    """round(v * mul / div), half up, for v >= 0; intermediates stay below 2**30 for
    v < 2**16 and mul a multiple of 1000 up to 10**6 (the duty scale) so the MCU never
    makes a big int.

    >>> mul_div_round(30000, 100000, 65535)
    45777
    """
    if mul > 1000:
        x = v * (mul // 1000)
        hi = x // div  # not divmod(): a tuple would allocate
        r = x - hi * div
        return hi * 1000 + (r * 2000 + div) // (2 * div)
    return (v * mul * 2 + div) // (2 * div)


def index(name):
    """Field index of telemetry field ``name`` (raises KeyError if unknown)."""
    i = C.field_index(C.by_type(_T_TELEMETRY), name)
    if i < 0:
        raise KeyError(name)
    return i


# Field indexes (``enc.set(T.TEMP_GPU, ...)``): const()-private, answered by
# __getattr__ (at the end) from flash on MicroPython, no slots in this module's dict
# (issue 24); plain attributes on CPython. The firmware (device/app.py) folds copies of
# its own. tests/test_catalog_copies.py checks each against ``index(name)``.
_UPTIME_S = const(0)
_STATE = const(1)
_REASON = const(2)
_FAULTS = const(3)
_TEMP_GPU = const(4)
_TEMP_VRAM = const(5)
_TEMP_MOS = const(6)
_TEMP_AMB = const(7)
_FAN1_RPM = const(8)
_FAN2_RPM = const(9)
_FAN1_DUTY = const(10)
_FAN2_DUTY = const(11)
_V_IN = const(12)
_I_IN = const(13)
_P_IN = const(14)
_TARGET = const(15)
_FLASH_WRITES = const(16)
_AUTH_FAILURES = const(17)
_INTERNAL_ERRORS = const(18)

_KIND_PLAIN = const(0)
_KIND_ENUM = const(1)
_KIND_SCALED = const(2)


def _put_uint(buf, o, v, width):
    """Decimal digits of v >= 0, zero-padded to ``width``."""
    n = 1
    t = v
    while t >= 10:
        t //= 10
        n += 1
    if n < width:
        n = width
    i = o + n - 1
    while i >= o:
        buf[i] = 0x30 + v % 10
        v //= 10
        i -= 1
    return o + n


def _put_fixed(buf, o, v, mul, div, dec, p):
    """Display text of wire value ``v`` (``p``: 10 ** dec); the same text as
    jsonl.format_fixed."""
    neg = v < 0
    if neg:
        v = -v
    if mul != div:
        v = mul_div_round(v, mul, div)
    if neg and v:
        buf[o] = 0x2D  # '-'
        o += 1
    ip = v // p
    fp = v - ip * p
    o = _put_uint(buf, o, ip, 0)
    if fp:
        buf[o] = 0x2E  # '.'
        o += 1
        while fp % 10 == 0:
            fp //= 10
            dec -= 1
        o = _put_uint(buf, o, fp, dec)
    return o


def _put_str(buf, o, s):
    """The ASCII text ``s`` (a catalog name, in flash) at ``o``: iterating a str and
    ``ord`` of its one-character items allocate nothing."""
    for c in s:
        buf[o] = ord(c)
        o += 1
    return o


# A JSON line's head, version VERSION_MAJOR.VERSION_MINOR (test_catalog_copies.py)
_JSON_HEAD = const('{"type":"telemetry","v":"1.0","seq":')
# The longest text of one value, with room: a u32 or an i32 prints at most 10 digits,
# a sign and a decimal point (12); a small int scaled by DUTY_PCT (x 1.53) as many.
_VALUE_TEXT = const(14)
_CBOR_FIELD = const(10)  # key (< 24: 1 byte) + an int head of up to 9 bytes


def max_cbor_len():
    """Unstuffed bytes of the longest telemetry frame: header, map head, every field
    with the widest int head, CRC (a fixed bound: the buffer is sized to it)."""
    return _HEADER_LEN + 1 + N_FIELDS * _CBOR_FIELD + 2


def max_json_len():
    """Bytes of the longest telemetry JSON line (every field, every value as long as
    any value can print, the newline)."""
    n = len(_JSON_HEAD) + 5 + 2  # seq, '}', newline
    i = 0
    while i < N_FIELDS:
        f = FIELDS[i]
        longest = _VALUE_TEXT
        if f[_F_KIND] == _K_ENUM:
            for name in f[_F_SCALE]:
                if len(name) + 2 > longest:
                    longest = len(name) + 2
        n += 1 + len(f[_F_NAME]) + 3 + longest  # ,"name": value
        i += 1
    return n


class TelemetryEncoder:
    """Preallocated telemetry frame builder; see the module docstring.

    Its buffers are sized to the longest telemetry frame and line (``max_cbor_len``,
    ``max_json_len``); the JSON text of names comes straight from the catalog's
    strings, so no table of encoded names is kept in RAM."""

    def __init__(self, json=True):
        # A list, not array("i"): uptime_s and faults are u32, which "i" would wrap
        # (silently on MicroPython), and reading an array("q") item allocates.
        self.values = [0] * N_FIELDS
        self.present = 0
        # ``json=False`` (the module, which sends frames unless a host speaks JSON
        # lines): ``out`` fits a frame, and the JSON tables (and a line's ``out``) are
        # made by the first encode_json: allocations when the format changes, none after.
        # encode_cbor writes the unstuffed frame at out[1:] and COBS-encodes it in place
        # to out[0:] (one buffer, not two: heap on the MCU), which takes a frame's COBS
        # overhead to be one byte: under 254 bytes.
        n = max_cbor_len()
        if cobs.max_encoded_len(n) != n + 1:  # pragma: no cover - the catalog's size
            raise ValueError("a telemetry frame of %d bytes is too long to stuff in place" % n)
        self.out = bytearray(n + 2)  # the code byte, the frame, the 0x00
        i = 0
        while i < N_FIELDS:  # encode_cbor writes field i's key as i: no table of keys
            if FIELDS[i][_F_KEY] != i:  # pragma: no cover - the catalog's keys
                raise ValueError("telemetry field keys are not 0..n-1")
            i += 1
        self._jhead = None
        if json:
            self._json_tables()

    def _json_tables(self):
        """What encode_json needs: kinds, scales, the line's head, room for a line."""
        kinds = bytearray(N_FIELDS)
        scales = []
        # Each name iterated once here, where allocating is allowed: MicroPython hands
        # each character out as an interned one-character string, made (in the heap's
        # string pool) the first time that character is seen, unless the image already
        # has it; encode_json then finds every character of its names interned (issue
        # 24: which ones the imports happen to intern is no guarantee).
        i = 0
        while i < N_FIELDS:
            f = FIELDS[i]
            for _c in f[_F_NAME]:
                pass
            if f[_F_KIND] == _K_ENUM:
                kinds[i] = _KIND_ENUM
                scales.append(f[_F_SCALE])
                for name in f[_F_SCALE]:
                    for _c in name:
                        pass
            elif f[_F_SCALE] is not None:
                kinds[i] = _KIND_SCALED
                s = C.scale_ints(f[_F_SCALE])  # small ints: no allocation
                scales.append((s[0], s[1], s[2], 10 ** s[2]))  # mul, div, decimals, 10**dec
            else:
                kinds[i] = _KIND_PLAIN
                scales.append(None)
            i += 1
        self._kinds = kinds
        self._scales = tuple(scales)
        line = max_json_len()
        if len(self.out) < line:
            self.out = bytearray(line)
        self._jhead = _JSON_HEAD.encode()

    def set(self, i, value):
        """Set field ``i`` (an index constant of this module) and mark it present."""
        self.values[i] = value
        self.present |= 1 << i

    def clear(self, i):
        """Mark field ``i`` absent (e.g. a faulted sensor)."""
        self.present &= ~(1 << i)

    def fields(self):
        """The present fields as a name -> value dict (allocates; for tests and hosts)."""
        out = {}
        i = 0
        while i < N_FIELDS:
            if self.present & (1 << i):
                out[FIELDS[i][_F_NAME]] = self.values[i]
            i += 1
        return out

    def encode_cbor(self, seq):
        """Write a complete binary frame into ``out``; return its length (with 0x00)."""
        raw = self.out  # the frame at [1:], stuffed in place (see __init__)
        raw[1] = _VERSION_MAJOR
        raw[2] = _VERSION_MINOR
        raw[3] = _T_TELEMETRY
        raw[4] = (seq >> 8) & 0xFF
        raw[5] = seq & 0xFF
        present = self.present
        values = self.values
        count = 0
        i = 0
        while i < N_FIELDS:
            if present & (1 << i):
                count += 1
            i += 1
        o = 1 + _HEADER_LEN
        if count:
            o = put_head(raw, o, _MAJOR_MAP, count)
            i = 0
            while i < N_FIELDS:
                if present & (1 << i):
                    o = put_head(raw, o, 0, i)  # the field's key (see __init__)
                    o = put_int(raw, o, values[i])
                i += 1
        crc = crc16(raw, 1, o)
        raw[o] = crc >> 8
        raw[o + 1] = crc & 0xFF
        n = cobs.encode_into(raw, o + 1, raw, 0, 1)
        raw[n] = 0
        return n + 1

    def encode_json(self, seq):
        """Write a complete JSON line into ``out``; return its length (with newline)."""
        if self._jhead is None:
            self._json_tables()
        buf = self.out
        head = self._jhead
        o = len(head)
        i = 0
        while i < o:
            buf[i] = head[i]
            i += 1
        o = _put_uint(buf, o, seq & 0xFFFF, 0)
        present = self.present
        values = self.values
        kinds = self._kinds
        i = 0
        while i < N_FIELDS:
            if present & (1 << i):
                buf[o] = 0x2C  # ','
                buf[o + 1] = 0x22  # '"'
                o = _put_str(buf, o + 2, FIELDS[i][_F_NAME])
                buf[o] = 0x22
                buf[o + 1] = 0x3A  # ':'
                o += 2
                v = values[i]
                k = kinds[i]
                if k == _KIND_ENUM:
                    names = self._scales[i]
                    if 0 <= v < len(names):
                        buf[o] = 0x22
                        o = _put_str(buf, o + 1, names[v])
                        buf[o] = 0x22
                        o += 1
                    else:
                        o = _put_fixed(buf, o, v, 1, 1, 0, 1)
                elif k == _KIND_SCALED:
                    s = self._scales[i]
                    o = _put_fixed(buf, o, v, s[0], s[1], s[2], s[3])
                else:
                    o = _put_fixed(buf, o, v, 1, 1, 0, 1)
            i += 1
        buf[o] = 0x7D  # '}'
        buf[o + 1] = 0x0A
        return o + 2


# Pairs: name, value (see _UPTIME_S).
_LAZY = const(
    (
        "UPTIME_S",
        _UPTIME_S,
        "STATE",
        _STATE,
        "REASON",
        _REASON,
        "FAULTS",
        _FAULTS,
        "TEMP_GPU",
        _TEMP_GPU,
        "TEMP_VRAM",
        _TEMP_VRAM,
        "TEMP_MOS",
        _TEMP_MOS,
        "TEMP_AMB",
        _TEMP_AMB,
        "FAN1_RPM",
        _FAN1_RPM,
        "FAN2_RPM",
        _FAN2_RPM,
        "FAN1_DUTY",
        _FAN1_DUTY,
        "FAN2_DUTY",
        _FAN2_DUTY,
        "V_IN",
        _V_IN,
        "I_IN",
        _I_IN,
        "P_IN",
        _P_IN,
        "TARGET",
        _TARGET,
        "FLASH_WRITES",
        _FLASH_WRITES,
        "AUTH_FAILURES",
        _AUTH_FAILURES,
        "INTERNAL_ERRORS",
        _INTERNAL_ERRORS,
    )
)


def __getattr__(name):
    """A name of ``_LAZY`` (``T.TEMP_GPU``); allocates nothing."""
    return __import__("protocol")._lazy(_LAZY, name)


if __import__("sys").implementation.name != "micropython":  # CPython: plain attributes
    __import__("protocol")._plain(globals(), _LAZY)
