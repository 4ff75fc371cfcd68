"""Files beside the config: the primitives device.config's parts share (paths, an
atomic temp file, a rename that replaces its target, a read in one block) and the
record of what the module learned from its host (``load_learned``, ``save_learned``),
which the App reads at boot and writes while hosted without the config code.

``fs`` is the ``os`` module or a stand-in with ``stat``, ``rename``, ``remove`` and
optionally ``fsync``/``sync`` (tests). Every file is opened through ``open_file``: tests
wrap it to count what reaches the flash. Imported on demand (booting, configuring, the
learned record); device.app._release forgets it.
"""

import os

from device import floors
from protocol.crc import crc16

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


_ENOENT = const(2)
_EEXIST = const(17)


def path(dirpath, name):
    return dirpath.rstrip("/") + "/" + name


def exists(fs, p):
    try:
        fs.stat(p)
        return True
    except OSError:
        return False


def remove_quiet(fs, p):
    try:
        fs.remove(p)
    except OSError:
        pass


def rename_over(fs, src, dst):
    """Rename replacing ``dst``: native on littlefs/POSIX; FAT needs remove first."""
    try:
        fs.rename(src, dst)
        return
    except OSError as e:
        if not e.args or e.args[0] != _EEXIST:
            raise  # any other error: leave dst alone
    fs.remove(dst)  # FAT: from here until the rename only ``src`` exists
    fs.rename(src, dst)


def open_file(p, mode):
    """``open``, through one name: tests wrap it to count what reaches the flash."""
    return open(p, mode)


def sync(fs):
    if hasattr(fs, "sync") and not hasattr(fs, "fsync"):  # MicroPython MCU ports
        fs.sync()


def write_tmp(fs, tmp, write, a, b):
    """``tmp`` written by ``write(f, a, b)``, flushed and fsynced (config.json and
    learned.bin alike); on any failure no partial ``tmp`` is left."""
    try:
        with open_file(tmp, "wb") as f:
            write(f, a, b)
            f.flush()
            if hasattr(fs, "fsync") and hasattr(f, "fileno"):
                fs.fsync(f.fileno())
    except Exception:  # OSError, or a MemoryError on the way: no partial .tmp left
        remove_quiet(fs, tmp)
        raise


def read(fs, p, limit):
    """Bytes of ``p``; None if missing. OSError for other trouble or a file of more
    than ``limit`` bytes."""
    try:
        size = fs.stat(p)[6]
    except OSError as e:
        if e.args and e.args[0] == _ENOENT:
            return None
        raise
    if size > limit:
        raise OSError("file is %d bytes, more than %d" % (size, limit))
    with open_file(p, "rb") as f:
        return f.read(size)  # one block of the size: read() grows its buffer by steps


# The last GPU slowdown temperature a host sent and the probe-to-die offset the module
# saw, kept beside the config in a record of its own: 12 bytes (a magic and schema
# version, two int32 milli-degC, a CRC-16), written rarely by the app (when a value
# moved by a degree or more, at most once per ``LEARNED_SAVE_MS``) and never with the
# config, so learning never persists a ``config_set`` that was not saved, nor costs
# the config's write count. A missing, short, foreign-version or corrupt record is
# "never hosted": the factory limits. Values are bounded on load as on learning.
LEARNED_NAME = "learned.bin"
LEARNED_VERSION = const(1)
_LEARNED_MAGIC = const(0x4C)  # "L"
_SLOWDOWN_MIN_MC = const(40000)  # the heartbeat's ``gpu_slowdown`` range (catalog)
_SLOWDOWN_MAX_MC = const(125000)


def _learned_bytes(slowdown_mc, offset_mc):
    b = bytearray(12)
    b[0] = _LEARNED_MAGIC
    b[1] = LEARNED_VERSION
    for k, v in ((2, slowdown_mc), (6, offset_mc)):
        v &= 0xFFFFFFFF
        b[k] = v & 0xFF
        b[k + 1] = (v >> 8) & 0xFF
        b[k + 2] = (v >> 16) & 0xFF
        b[k + 3] = v >> 24
    crc = crc16(bytes(b[:10]))
    b[10] = crc & 0xFF
    b[11] = crc >> 8
    return bytes(b)


def _i32(b, k):
    v = b[k] | (b[k + 1] << 8) | (b[k + 2] << 16) | (b[k + 3] << 24)
    return v - 0x100000000 if v & 0x80000000 else v


def load_learned(dirpath, fs=os):
    """``(slowdown_mc, offset_mc)`` from the learned record; ``(0, 0)`` when there is
    none or it is not valid (the factory's limits). Never raises for a bad file."""
    try:
        with open_file(path(dirpath, LEARNED_NAME), "rb") as f:
            b = f.read(13)
    except OSError:
        return 0, 0
    if len(b) != 12 or b[0] != _LEARNED_MAGIC or b[1] != LEARNED_VERSION:
        return 0, 0
    if crc16(b[:10]) != b[10] | (b[11] << 8):
        return 0, 0
    slow = _i32(b, 2)
    off = _i32(b, 6)
    if not _SLOWDOWN_MIN_MC <= slow <= _SLOWDOWN_MAX_MC:
        return 0, 0
    return slow, min(max(off, 0), floors.OFFSET_MAX_MC)


def save_learned(dirpath, slowdown_mc, offset_mc, fs=os):
    """Store the learned record atomically (temp file + rename); raises ``OSError``."""
    final = path(dirpath, LEARNED_NAME)
    tmp = final + ".tmp"
    write_tmp(fs, tmp, _write, slowdown_mc, offset_mc)
    sync(fs)
    rename_over(fs, tmp, final)
    sync(fs)


def _write(f, slowdown_mc, offset_mc):
    f.write(_learned_bytes(slowdown_mc, offset_mc))
