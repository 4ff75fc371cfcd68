"""The file primitives device.config's parts and device.learned share: paths, an atomic
temp file, a rename that replaces its target, a read in one block.

``fs`` is the ``os`` module or a stand-in with ``stat``, ``rename``, ``remove`` and
optionally ``fsync``/``sync`` (tests). Every file is opened through ``open_file``: tests
wrap it to count what reaches the flash. Imported on demand (booting, configuring, the
learned record); device.app._release forgets it.
"""

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
