"""JSON-lines event log: one line per policy decision, alert or guard transition.

Each line is one JSON object, keys in a fixed order::

    {"ts":"2025-05-01T12:00:03.250Z","kind":"decision","module_id":"e6614c31...",
     "gpu_uuid":"GPU-4b1e...","level":"WARN","target_w":245.0,"reasons":["fan_stall"],
     "values":{"stalled_fans":1,...}}

``ts`` is UTC ISO 8601 with milliseconds from ``clock`` (``time.time`` by default);
``kind`` and the fields given to :meth:`EventLog.write` follow. Floats that are not
finite (an infinite ETA) are written as ``null``; anything JSON cannot encode is
written as its ``str()``.

The sink is a path (opened for append, so ``logrotate``'s ``copytruncate`` works: see
docs/policy.md), a text stream, or a list (lines are appended as strings, for tests).
Writing is thread-safe and never raises: a line that cannot be written (disk full,
closed stream) is counted in :attr:`EventLog.dropped` and logged once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from datetime import datetime, timezone

log = logging.getLogger(__name__)

# Keys written first, in this order, when given.
_HEAD = ("module_id", "gpu_uuid", "level", "target_w", "reasons")


def iso_utc(t: float) -> str:
    """``2025-05-01T12:00:03.250Z`` for Unix time ``t``.

    >>> iso_utc(0.25)
    '1970-01-01T00:00:00.250Z'
    """
    dt = datetime.fromtimestamp(t, timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _clean(v):
    """JSON-safe copy: non-finite floats -> None, tuples/sets -> lists, keys -> str."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_clean(x) for x in v), key=str)
    return v


class EventLog:
    """Append JSON lines to ``sink``: a path, a text stream, or a list (tests)."""

    def __init__(self, sink, clock=time.time):
        self._clock = clock
        self._lock = threading.RLock()
        self._owned = False
        self._list = None
        self._stream = None
        self.path = None
        self.written = 0
        self.dropped = 0
        self._warned = False
        if isinstance(sink, list):
            self._list = sink
        elif isinstance(sink, (str, os.PathLike)):
            self.path = os.fspath(sink)
            # "a" is O_APPEND: after a copytruncate the next line lands at offset 0.
            self._stream = open(self.path, "a", encoding="utf-8", buffering=1)
            self._owned = True
        elif hasattr(sink, "write"):
            self._stream = sink
        else:
            raise TypeError(f"EventLog sink must be a path, a text stream or a list: {sink!r}")

    def format(self, kind: str, **fields) -> str:
        """The line ``write`` would write (without the newline)."""
        record = {"ts": iso_utc(self._clock()), "kind": kind}
        for k in _HEAD:
            if k in fields:
                record[k] = fields.pop(k)
        record.update(fields)
        return json.dumps(_clean(record), separators=(",", ":"), allow_nan=False, default=str)

    def write(self, kind: str, **fields) -> bool:
        """Write one event; True if written, False if dropped (never raises)."""
        try:
            line = self.format(kind, **fields)
        except (TypeError, ValueError) as err:  # a value with a broken __str__, say
            return self._drop(f"cannot encode {kind!r} event: {err}")
        with self._lock:
            try:
                if self._list is not None:
                    self._list.append(line)
                else:
                    self._stream.write(line + "\n")
                    self._stream.flush()
            except (OSError, ValueError) as err:  # disk full, closed file
                return self._drop(f"cannot write to {self.path or self._stream!r}: {err}")
            self.written += 1
        return True

    def _drop(self, why: str) -> bool:
        with self._lock:
            self.dropped += 1
            warn, self._warned = not self._warned, True
        if warn:
            log.warning("event log: %s (dropping events; count in EventLog.dropped)", why)
        return False

    def close(self) -> None:
        with self._lock:
            if self._owned and self._stream is not None:
                try:
                    self._stream.close()
                except OSError as err:
                    log.warning("event log: closing %s: %s", self.path, err)
            self._owned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
