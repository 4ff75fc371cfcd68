"""The heartbeat a link sends: its fields (from the bridge's source, in wire units)
and its frame, with any field the catalog refuses dropped (and logged once) rather
than the whole heartbeat lost: the module must keep hearing that the host is alive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from protocol.errors import ProtocolError
from protocol.message import lookup, validate_fields

log = logging.getLogger(__name__)

MAX_PERIOD_MS = 600000  # the catalog's period_ms maximum
HEARTBEAT = lookup("heartbeat")


def wire_int(v):
    """Heartbeat values must be ints on the wire; round floats, keep the rest for the check."""
    if isinstance(v, float) and v == v and abs(v) < 1e12:
        return round(v)
    return v


def heartbeat_fields(source: Callable[[], dict | None] | None, period_s: float,
                     once: Callable[[str], bool], port: str) -> dict:  # fmt: skip
    """The next heartbeat's fields: ``source()`` (None values omitted; a source that
    raises or returns None still gives a heartbeat: the host is alive), plus
    ``host_time`` and ``period_ms`` when absent. ``once(key)`` is True the first time
    a key is seen (log once)."""
    fields = {}
    if source is not None:
        try:
            got = source()
        except Exception:  # noqa: BLE001 - a broken source must not stop heartbeats
            if once("hb-source"):
                log.exception("%s: heartbeat source failed", port)
            got = None
        if got:
            fields = {k: wire_int(v) for k, v in got.items() if v is not None}
    fields.setdefault("host_time", int(time.time()) & 0xFFFFFFFF)
    fields.setdefault("period_ms", min(int(period_s * 1000), MAX_PERIOD_MS))
    return fields


def checked_fields(fields: dict, once: Callable[[str], bool], port: str) -> dict | None:
    """``fields`` less any the catalog refuses (checked, not encoded: the caller
    encodes once, signed or not); None if not even an empty heartbeat would do."""
    for _ in range(len(fields) + 1):
        try:
            validate_fields(HEARTBEAT, fields)
            return fields
        except ProtocolError as e:
            bad = getattr(e, "field", None)
            if once(f"hb-field {bad}"):
                log.warning("%s: heartbeat field dropped: %s", port, e)
            if bad not in fields:
                return None
            fields = {k: v for k, v in fields.items() if k != bad}
    return None  # pragma: no cover - every loop drops a field or returns
