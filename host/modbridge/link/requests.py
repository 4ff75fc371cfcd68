"""Requests to a module and the answers that complete them.

A request is registered under its frame's sequence number before it is sent; an
``ack``/``nack`` (matched by ``ref`` and ``ref_type``) or the data reply its kind
expects (``hello``, ``config``, ``cal_raw``, ``selftest_report``) completes it. A
``selftest`` is acked first and completed by its report. Late answers (the request
timed out) and answers to someone else's request are dropped. When the link goes
down every pending request fails at once with the link's error.
"""

from __future__ import annotations

import os
import threading

from protocol.message import Message

#: ``$MODBRIDGE_TIMEOUT_SCALE`` multiplies the default answer timeouts below: a module
#: behind a slow hub or a busy USB-serial bridge, or a simulated module on a loaded
#: machine (the test suite sets it). At least 1 (SPEC 10's minimum stays the floor), at
#: most 60; anything else is ignored.
TIMEOUT_SCALE_ENV = "MODBRIDGE_TIMEOUT_SCALE"


def timeout_scale(environ=os.environ) -> float:
    try:
        scale = float(environ.get(TIMEOUT_SCALE_ENV) or 1.0)
    except ValueError:
        return 1.0
    return scale if 1.0 <= scale <= 60.0 else 1.0


_SCALE = timeout_scale()
# Default answer timeouts (SPEC 10: at least 1 s; more for flash and sampling).
REQUEST_TIMEOUT_S = 1.0 * _SCALE
REQUEST_TIMEOUTS = {
    name: s * _SCALE
    for name, s in {"config_save": 3.0, "config_reset": 3.0, "cal_read": 5.0,
                    "selftest": 75.0}.items()  # fmt: skip
}
# Requests answered by something other than ack; selftest is acked first, then reported.
FINAL_REPLY = {
    "hello_request": "hello",
    "config_get": "config",
    "cal_read": "cal_raw",
    "selftest": "selftest_report",
}
REPLY_TYPES = ("ack", "nack", "config", "cal_raw", "selftest_report")
#: Requests a signing module accepts unsigned (reads); every other one, and every
#: heartbeat, is signed.
OPEN_REQUESTS = ("hello_request", "config_get", "cal_read")


def ref_type(msg: Message) -> int:
    return msg.fields.get("ref_type", 0)


class Pending:
    """One request waiting for its answer (``reply``: a Message or a LinkError)."""

    __slots__ = ("name", "type", "final", "done", "reply", "acked")

    def __init__(self, name: str, type_id: int, final: str | None):
        self.name = name
        self.type = type_id
        self.final = final  # reply type that completes it; None: ack
        self.done = threading.Event()
        self.reply = None
        self.acked = False


class PendingRequests:
    """The link's table of pending requests by sequence number; thread-safe."""

    def __init__(self):
        self._by_seq: dict[int, Pending] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_seq)

    def __contains__(self, seq: int) -> bool:
        with self._lock:
            return seq in self._by_seq

    def add(self, seq: int, name: str, type_id: int, fields: dict | None = None) -> Pending:
        final = FINAL_REPLY.get(name)
        if name == "selftest" and fields and fields.get("abort"):
            final = None  # an abort is acked; the report it causes answers the test itself
        p = Pending(name, type_id, final)
        with self._lock:
            self._by_seq[seq] = p
        return p

    def discard(self, seq: int) -> None:
        with self._lock:
            self._by_seq.pop(seq, None)

    def complete(self, ref: int, msg: Message) -> None:
        """An answer with ``ref`` arrived: complete the request it answers, if any."""
        with self._lock:
            p = self._by_seq.get(ref)
        if p is None:
            return  # late, or the answer to a request that timed out
        if msg.name in ("ack", "nack") and ref_type(msg) not in (p.type, 0):
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

    def fail_all(self, err: Exception) -> None:
        with self._lock:
            pending = list(self._by_seq.values())
        for p in pending:
            if not p.done.is_set():
                p.reply = err
                p.done.set()
