"""The write-ahead journal of original power limits, in the bridge's state directory.

    journal = LimitJournal("/var/lib/modbridge")     # limits/<uuid>.json, 0700 / 0600
    journal.record(uuid, original_w=700.0, intended_w=490.0)   # before the write
    entry, problem = journal.read(uuid)     # JournalEntry or None, and why it was ignored
    journal.clear(uuid)                     # once the original is read back as enforced
    journal.entries()                       # every journaled GPU (``modbridge restore``)

The locked-clocks actuator (:mod:`modbridge.actuator.clocks`) keeps its originals the
same way in ``clocks/<uuid>.json`` (:class:`ClockJournal`): ``"original": null`` for
"unlocked" or ``[min, max]`` MHz for an operator's lock.

One JSON file per GPU UUID, ``limits/<uuid>.json``::

    {"version": 1, "uuid": "GPU-...", "original_w": 700.0, "intended_w": 490.0,
     "time": 1733050000.1, "pid": 4242}

Every write is a transaction: a temporary file in the same directory, ``fsync``,
``rename`` over the old one, ``fsync`` of the directory. A crash at any instant leaves
the old entry or the new one, never half of one. The power-limit actuator
(:mod:`modbridge.actuator.power`) records the original before every write that moves the
limit away from it and clears the entry only once the original is read back as
enforced, so a bridge killed at any instant (SIGKILL, OOM, power loss) leaves the
true original behind for the next start or ``modbridge restore``.

What is read back is not trusted: a file that is not JSON, names another GPU, or holds
numbers that are not finite positive watts is reported as a ``problem`` (and kept
aside as ``<uuid>.json.bad``); the actuator clamps what is left to the GPU's own
default limit and constraints (docs/bridge.md, "Power limits").
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from modbridge.errors import ModbridgeError
from modbridge.fsutil import (  # noqa: F401 - fsync_dir re-exported
    UnsafeDirectory,
    atomic_write,
    create_new,
    ensure_private_dir,
    fsync_dir,
)

log = logging.getLogger(__name__)

VERSION = 1
DEFAULT_STATE_DIR = "/var/lib/modbridge"
ENV_STATE_DIR = "MODBRIDGE_STATE_DIR"
_SUBDIR = "limits"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class JournalError(ModbridgeError):
    """The state directory cannot hold the journal (permission, not a directory...)."""

    exit_code = 1


def default_state_dir(config=None, environ=None) -> Path:
    """``$MODBRIDGE_STATE_DIR``, else ``[bridge] state_dir``, else systemd's
    ``$STATE_DIRECTORY`` (``StateDirectory=modbridge``), else /var/lib/modbridge."""
    env = os.environ if environ is None else environ
    if env.get(ENV_STATE_DIR):
        return Path(env[ENV_STATE_DIR]).expanduser()
    if config is not None and getattr(config, "state_dir", None):
        return Path(config.state_dir).expanduser()
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    return Path(DEFAULT_STATE_DIR)


def file_name(uuid: str) -> str:
    """A GPU UUID as a file name (refused if it could name anything else)."""
    if not _SAFE_NAME.match(uuid) or uuid in (".", ".."):
        raise JournalError(f"GPU UUID {uuid!r} cannot name a journal file")
    return uuid


def state_dir_error(path, e: OSError, doing: str = "use") -> JournalError:
    """A JournalError for an OSError on the state directory, saying what to do."""
    hint = {
        errno.ENOSPC: f"Free space on its file system (`df {path}`)",
        errno.EDQUOT: "Raise the quota or free space",
        errno.EROFS: "It is on a read-only file system: give --state-dir DIR",
    }.get(e.errno, "Run as the service user (root, with StateDirectory=modbridge), "
          "or give --state-dir DIR")  # fmt: skip
    return JournalError(f"cannot {doing} the state directory {path}: {e.strerror or e}. {hint}")


def ensure_dir(path: Path, mode: int = 0o700) -> Path:
    """Create ``path`` (and parents) if needed and check that only root or this user can
    write it (:func:`modbridge.fsutil.check_private_dir`: UnsafeDirectory) and that a
    file can be created in it (never through a link); JournalError saying what to do."""
    path = Path(path)
    try:
        ensure_private_dir(path, mode, what="state directory")
        probe = path / f".probe-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)  # a left-over (or planted link): removed, never followed
        fd = create_new(probe)
        try:
            os.write(fd, b"\n")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise state_dir_error(path, e) from e
    except UnsafeDirectory as e:
        raise JournalError(str(e)) from e
    return path


@dataclass(frozen=True)
class JournalEntry:
    """One GPU's journaled limits (W) and who wrote them (Unix time, pid)."""

    uuid: str
    original_w: float
    intended_w: float | None
    time: float
    pid: int

    def as_dict(self) -> dict:
        return {
            "version": VERSION,
            "uuid": self.uuid,
            "original_w": self.original_w,
            "intended_w": self.intended_w,
            "time": self.time,
            "pid": self.pid,
        }


def _watts(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _load(uuid: str, raw: bytes, kind: str | None) -> tuple[dict | None, str | None]:
    """A file's JSON object if it is a version-1 entry of ``kind`` for ``uuid``."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"not JSON ({e.__class__.__name__}: {str(e)[:80]})"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    if data.get("version") != VERSION:
        return None, f"unknown version {data.get('version')!r}"
    if data.get("kind") != kind:
        return None, f"not a {kind or 'power-limit'} entry (kind {str(data.get('kind'))[:16]!r})"
    if data.get("uuid") != uuid:
        return None, f"names another GPU ({str(data.get('uuid'))[:64]!r})"
    return data, None


def _stamp(data: dict) -> dict:
    """``time`` and ``pid`` of an entry (0 when absent or not numbers)."""
    ts, pid = data.get("time"), data.get("pid")
    return {
        "time": float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else 0.0,
        "pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else 0,
    }


def parse_entry(uuid: str, raw: bytes) -> tuple[JournalEntry | None, str | None]:
    """An entry from a file's bytes, or None and why it cannot be used."""
    data, problem = _load(uuid, raw, None)
    if data is None:
        return None, problem
    original = _watts(data.get("original_w"))
    if original is None:
        return None, f"original_w is not a power in W ({str(data.get('original_w'))[:32]!r})"
    intended = data.get("intended_w")
    intended = None if intended is None else _watts(intended)
    return JournalEntry(uuid=uuid, original_w=original, intended_w=intended, **_stamp(data)), None


class _JournalDir:
    """One JSON file per GPU under ``state_dir``/``subdir``: atomic writes, checked reads
    (an unusable file is set aside as ``.bad``), clear, list."""

    subdir = _SUBDIR
    what = "original power limit"

    def __init__(self, state_dir, clock=time.time):
        self.state_dir = Path(state_dir)
        self.dir = self.state_dir / self.subdir
        self._clock = clock
        self._ready = False

    def ensure(self):
        """Create the directories (0700) and check they are writable (JournalError)."""
        if not self._ready:
            ensure_dir(self.state_dir)
            ensure_dir(self.dir)
            self._ready = True
        return self

    def path(self, uuid: str) -> Path:
        return self.dir / f"{file_name(uuid)}.json"

    def _write(self, uuid: str, entry):
        try:
            self.ensure()
            data = json.dumps(entry.as_dict(), sort_keys=True).encode() + b"\n"
            atomic_write(self.path(uuid), data)
        except OSError as e:
            raise JournalError(
                f"cannot journal the {self.what} of {uuid} in {self.dir}: {e.strerror or e}"
            ) from e
        return entry

    @staticmethod
    def _parse(uuid: str, raw: bytes):
        return parse_entry(uuid, raw)

    def read(self, uuid: str, quarantine=True) -> tuple:
        """``(entry, None)``, ``(None, None)`` (no entry) or ``(None, problem)``: a file
        that cannot be used, set aside as ``.bad`` (``quarantine``) so it is reported once."""
        path = self.path(uuid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None, None
        except OSError as e:
            return None, f"cannot read {path}: {e.strerror or e}"
        try:
            raw = os.read(fd, 65536)
        finally:
            os.close(fd)
        entry, problem = self._parse(uuid, raw)
        if problem is not None:
            problem = f"{path}: {problem}"
            try:
                if not quarantine:
                    raise OSError("kept")
                os.replace(path, path.with_name(path.name + ".bad"))
            except OSError:
                pass
        return entry, problem

    def clear(self, uuid: str) -> None:
        """Forget ``uuid``'s entry (the original is enforced again)."""
        try:
            os.unlink(self.path(uuid))
            fsync_dir(self.dir)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise JournalError(f"cannot clear the journal entry of {uuid}: {e}") from e

    def uuids(self) -> list[str]:
        """The GPUs with an entry (or a file that claims to be one)."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise JournalError(f"cannot list the journal {self.dir}: {e.strerror or e}") from e
        return [n[: -len(".json")] for n in names if n.endswith(".json") and not n.startswith(".")]


class LimitJournal(_JournalDir):
    """The journal of original power limits under ``state_dir``/limits (module docstring)."""

    def record(self, uuid: str, original_w: float, intended_w: float | None) -> JournalEntry:
        """Journal ``original_w`` (and the limit about to be written), fsync'd.
        Raises JournalError: the caller must then not write the limit."""
        entry = JournalEntry(uuid, float(original_w), intended_w, self._clock(), os.getpid())
        return self._write(uuid, entry)


# ----------------------------------------------------------------------------- clocks


@dataclass(frozen=True)
class ClockEntry:
    """One GPU's journaled clock lock: ``original`` is the ``(min, max)`` lock found
    before the first write (an operator's), None for "unlocked" (the default); the
    lock about to be written is ``intended_max_mhz``."""

    uuid: str
    original: tuple[int, int] | None
    intended_max_mhz: int | None
    time: float
    pid: int

    def as_dict(self) -> dict:
        return {
            "version": VERSION,
            "kind": "clocks",
            "uuid": self.uuid,
            "original": None if self.original is None else list(self.original),
            "intended_max_mhz": self.intended_max_mhz,
            "time": self.time,
            "pid": self.pid,
        }


def _mhz(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 < value < 100_000 else None


def parse_clock_entry(uuid: str, raw: bytes) -> tuple[ClockEntry | None, str | None]:
    """A clock entry from a file's bytes, or None and why it cannot be used."""
    data, problem = _load(uuid, raw, "clocks")
    if data is None:
        return None, problem
    original = data.get("original")
    if original is not None:
        pair = original if isinstance(original, list) and len(original) == 2 else [None, None]
        lo, hi = _mhz(pair[0]), _mhz(pair[1])
        if lo is None or hi is None or lo > hi:
            return None, f"original is not a clock lock in MHz ({str(original)[:40]!r})"
        original = (lo, hi)
    intended = _mhz(data.get("intended_max_mhz"))
    return ClockEntry(uuid=uuid, original=original, intended_max_mhz=intended,
                      **_stamp(data)), None  # fmt: skip


class ClockJournal(_JournalDir):
    """The journal of original clock locks under ``state_dir``/clocks: the same
    transactions as :class:`LimitJournal` (one fsync'd file per GPU)."""

    subdir = "clocks"
    what = "original clock lock"

    def record(self, uuid: str, original: tuple[int, int] | None,
               intended_max_mhz: int | None) -> ClockEntry:  # fmt: skip
        """Journal the original lock (None: unlocked) before a lock is written."""
        entry = ClockEntry(uuid, None if original is None else tuple(original),
                           intended_max_mhz, self._clock(), os.getpid())  # fmt: skip
        return self._write(uuid, entry)

    @staticmethod
    def _parse(uuid: str, raw: bytes):
        return parse_clock_entry(uuid, raw)
