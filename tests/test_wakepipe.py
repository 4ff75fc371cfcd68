"""modbridge.wakepipe.WakePipe: the wake-up of the link's I/O thread and of the
exporter's accepting thread. A wake() after a drain() always makes the pipe
readable, whatever other wake()s raced with that drain()."""

from __future__ import annotations

import os
import select
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.wakepipe import WakePipe


def readable(w: WakePipe) -> bool:
    return bool(select.select([w], [], [], 0)[0])


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(st.lists(st.sampled_from(["wake", "drain", "race"]), max_size=30))
def test_a_wake_after_any_history_is_seen(ops):
    """Any sequence of wake(), drain() and a wake() landing inside a drain() (after
    its reads, before it returns: "race"), then one wake(): the pipe is readable,
    and one drain() empties it."""
    w = WakePipe()
    try:
        for op in ops:
            if op == "wake":
                w.wake()
            elif op == "drain":
                w.drain()
            else:  # a wake() from another thread in the middle of drain()
                _drain_with_a_wake_inside(w)
        w.wake()
        assert readable(w)
        w.drain()
        assert not readable(w)
    finally:
        w.close()


def _drain_with_a_wake_inside(w: WakePipe) -> None:
    """drain(), with a wake() right after a read that emptied the pipe."""
    real = os.read

    def read(fd, n):
        got = real(fd, n)
        if not got or len(got) < n:  # the pipe is empty now: the racing wake()
            w.wake()
        return got

    os.read = read
    try:
        w.drain()
    finally:
        os.read = real


def test_concurrent_wakes_are_never_lost():
    """A waker and a drainer on two threads; after each round the waker's last
    wake() is visible to the next select(), as the sleeping thread needs."""
    w = WakePipe()
    stop = threading.Event()

    def drainer():
        while not stop.is_set():
            if select.select([w], [], [], 0.01)[0]:
                w.drain()

    t = threading.Thread(target=drainer, daemon=True)
    t.start()
    try:
        for _ in range(2000):
            w.wake()
        stop.set()
        t.join(5)
        w.wake()
        assert readable(w)
    finally:
        w.close()


def test_closed_pipe_wakes_nothing_and_raises_nothing():
    w = WakePipe()
    w.close()
    w.wake()
    w.drain()
    w.close()
