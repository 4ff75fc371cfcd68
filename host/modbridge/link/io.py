"""One I/O thread for many module links: a selector over their ports, deadlines for
everything else.

:class:`LinkIO` owns one daemon thread. It sleeps in ``epoll.poll()`` (a
``selectors`` fallback where there is no epoll) on every
open port's file descriptor (and a wake-up pipe) with a timeout that ends at the
earliest deadline any link has (its next heartbeat, hello retry, reopen, silence
deadline). A port with bytes waiting is serviced at once: frames are read, decoded
and stamped when they arrive, not at a poll. A link whose deadline has come is
serviced too; nothing else wakes the thread, so an idle fleet costs one wake-up per
heartbeat grid point (links put their heartbeats on a common grid) and one per frame.
Deadlines are kept between wake-ups: only the links just stepped compute theirs
again (all of them after a change of links or ports, or a wake-up by another thread),
and a wake-up for data before the earliest deadline steps only the links with data.

The links do the work (:meth:`ModuleLink._step` reads, decodes, dispatches, runs
its timers, reopens a lost port), each under its own supervisor: an exception that
escapes one link's step restarts that link (close, back off, reopen, hello) and is
reported on that link, the others go on. The hub's own loop (the selector, the
registrations) runs under a supervisor too: an exception that escapes it is
counted (``restarts``, ``episodes``, ``failing``, ``error``), logged at ERROR once
per episode, every link is told (its ``thread_restarts`` and ``last_error``), and the
loop starts over with a fresh selector after a back-off that doubles from
``THREAD_BACKOFF_MIN_S``; ``THREAD_HEALTHY_S`` without a failure ends the episode.

The thread's own pauses. With the links on ``time.monotonic`` the thread knows how
long it meant to be away (the poll's timeout, plus a moment for its work): a wake-up
later than that by more than ``PAUSE_SLACK_S`` means the bridge did not run (SIGSTOP,
a VM pause, swapping, a starved host), and each link is told
(:meth:`ModuleLink._note_pause`) so that the gap is not counted against its module;
``pauses`` and ``paused_s`` count them. The links then read their ports before any
verdict.

A port object without a ``fileno()`` (a test double) cannot be selected: it is
serviced every ``poll_period_s`` of its link instead.

Only the hub thread touches the selector: :meth:`add` and :meth:`remove` queue the
change and wake the thread; a link's (re)opened or closed port is picked up at the
next iteration by comparing the port object with the one registered.
"""

from __future__ import annotations

import logging
import random
import select
import threading
import time
from collections import deque

from modbridge.link.supervise import Episodes, supervised
from modbridge.wakepipe import WakePipe

log = logging.getLogger(__name__)

MAX_WAIT_S = 5.0  # never sleep longer than this (a deadline computed wrong heals)
THREAD_BACKOFF_MIN_S = 0.1
THREAD_BACKOFF_MAX_S = 5.0
THREAD_HEALTHY_S = 30.0
JOIN_TIMEOUT_S = 2.0
PAUSE_SLACK_S = 0.2  # a wake-up this much later than meant (or work this long) is a pause
_INF = float("inf")
_EPOLLIN = getattr(select, "EPOLLIN", 1)


class _Selectors:
    """``select.epoll``'s few calls used here over :mod:`selectors`, for platforms
    without epoll: ``poll`` answers ``(fd, mask)`` pairs as epoll does."""

    def __init__(self):
        import selectors

        self._sel = selectors.DefaultSelector()
        self._read = selectors.EVENT_READ

    def register(self, fd: int, _mask) -> None:
        self._sel.register(fd, self._read)

    def unregister(self, fd: int) -> None:
        self._sel.unregister(fd)

    def poll(self, timeout: float):
        return [(key.fd, mask) for key, mask in self._sel.select(timeout)]

    def close(self) -> None:
        self._sel.close()


def _poller():
    return select.epoll() if hasattr(select, "epoll") else _Selectors()


class LinkIO:
    """The selector thread serving a set of links (see the module docstring)."""

    def __init__(self, name: str = "modbridge-link io"):
        self.name = name
        self._links: list = []
        self._ops: deque = deque()  # ("add"|"remove", link, done Event | None)
        self._ops_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake = WakePipe()
        self._watched: dict = {}  # link -> (port object, fd)
        self._fd_link: dict = {}  # fd -> link, for the fds registered with the epoll
        self._loop_links: list | None = None  # the loop's links, while it runs
        self._shared_clock = None  # their one clock, if they have one
        self._rng = random.Random()
        self.iterations = 0  # wake-ups of the thread
        self.pauses = 0  # wake-ups found late by more than PAUSE_SLACK_S (the bridge paused)
        self.paused_s = 0.0  # their total (s), not counted against any module
        self._ran_at: float | None = None  # when the last poll returned (time.monotonic)
        # called in the thread after each wake-up's links were stepped (the bridge
        # decides there what the frames just read made urgent)
        self.after_iteration = None
        # supervision of the thread's own loop (restarts, episodes, failing, error)
        self.supervision = Episodes(f"{name}: I/O thread", log, THREAD_BACKOFF_MIN_S,
                                    THREAD_BACKOFF_MAX_S, THREAD_HEALTHY_S, "restarts")  # fmt: skip

    restarts = supervised("restarts")
    episodes = supervised("episodes")
    failing = supervised("failing")
    error = supervised("error")

    # -- from any thread -------------------------------------------------------------
    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> LinkIO:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def add(self, link) -> None:
        self._queue("add", link, None)
        self.start()

    def remove(self, link, timeout: float = JOIN_TIMEOUT_S) -> bool:
        """Stop serving ``link`` (its port is closed in the I/O thread); True once
        done, False if the thread did not get to it within ``timeout``."""
        if threading.current_thread() is self._thread or self._thread is None:
            self._drop(link)
            return True
        done = threading.Event()
        self._queue("remove", link, done)
        return done.wait(timeout)

    def wake(self) -> None:
        """Make the thread recompute its deadlines now."""
        self._wake.wake()

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        self._stop.set()
        self.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if t.is_alive():
                log.warning("%s: I/O thread did not stop within %.1f s", self.name, timeout)
        for link in list(self._links):
            self._drop(link)
        self._apply_ops()  # complete removals queued after the thread ended
        self._wake.close()

    def _queue(self, op: str, link, done) -> None:
        with self._ops_lock:
            self._ops.append((op, link, done))
        self.wake()

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._loop()
                except BaseException as e:  # noqa: BLE001 - the supervisor: restart, never die
                    self._failed(e)
        finally:
            for link in list(self._links):
                self._drop(link)
            self._apply_ops()

    def _loop(self) -> None:
        ep = _poller()
        self._watched = {}
        self._fd_link = {}
        rfd = self._wake.fileno()
        try:
            ep.register(rfd, _EPOLLIN)
            links: list = []
            deadlines: list = []
            stepped: list = []  # the links stepped in the last iteration
            stale = True  # every deadline is to be computed again
            while not self._stop.is_set():
                self.supervision.check_recovered()
                if self._ops:
                    self._apply_ops()
                    stale = True
                # A link's port and deadline change only when it is stepped (here)
                # or when another thread changes the link and wakes this one (stop,
                # remove: a wake-up recomputes them all); so after a wake-up for data
                # or for a deadline only the stepped links are looked at again.
                if self._sync(ep, None if stale else stepped):
                    stale = True
                if stale or links != self._links:
                    links = list(self._links)
                    deadlines = [link._deadline() for link in links]
                    clock = links[0].clock if links else None
                    # one clock read per wake-up when every link has the same clock
                    self._shared_clock = clock if all(lk.clock is clock for lk in links) else None
                    self._loop_links = links
                    stale = False
                due_at = min(deadlines) if deadlines else _INF
                timeout = self._timeout(links, deadlines)
                if self._shared_clock is time.monotonic:
                    t0 = time.monotonic()
                    events = ep.poll(timeout)
                    self._account(links, t0, timeout)
                else:
                    events = ep.poll(timeout)
                self.iterations += 1
                stepped = []
                fd_link = self._fd_link
                for fd, _mask in events:  # readable, or hung up / in error: a read says
                    if fd == rfd:
                        self._wake.drain()
                        stale = True
                        continue
                    link = fd_link.get(fd)
                    if link is not None and link not in stepped:
                        link._step(True)
                        stepped.append(link)
                # deadlines: with one clock, only when the earliest has come
                shared = self._shared_clock
                now = shared() if shared is not None else None
                if shared is None or now >= due_at:
                    for i, link in enumerate(links):
                        if link in stepped:
                            continue
                        if (now if shared is not None else link.clock()) >= deadlines[i] and (
                            link in self._links
                        ):
                            link._step(False)  # a deadline: nothing to read
                            stepped.append(link)
                if stepped:
                    for i, link in enumerate(links):
                        if link in stepped:
                            deadlines[i] = link._deadline()
                if self.after_iteration is not None:
                    self._after()
        finally:
            self._watched = {}
            self._fd_link = {}
            ep.close()

    def _account(self, links: list, t0: float, timeout: float) -> None:
        """After a poll begun at ``t0`` for ``timeout`` s: time beyond what was meant
        (the work before it took over ``PAUSE_SLACK_S``, the wake-up came later than
        that past its timeout) is a pause of the bridge, told to every link."""
        t1 = time.monotonic()
        gap = 0.0
        if self._ran_at is not None and t0 - self._ran_at > PAUSE_SLACK_S:
            gap += t0 - self._ran_at - PAUSE_SLACK_S
        late = t1 - t0 - timeout
        if late > PAUSE_SLACK_S:
            gap += late
        self._ran_at = t1
        if gap <= 0.0:
            return
        self.pauses += 1
        self.paused_s += gap
        log.debug("%s: the I/O thread did not run for %.3f s (a pause of the bridge)",
                  self.name, gap)  # fmt: skip
        for link in links:
            link._note_pause(gap)

    def _after(self) -> None:
        try:
            self.after_iteration()
        except Exception:  # noqa: BLE001 - the owner's bug must not stop the I/O
            log.exception("%s: after_iteration failed", self.name)

    def _apply_ops(self) -> None:
        while True:
            with self._ops_lock:
                if not self._ops:
                    return
                op, link, done = self._ops.popleft()
            if op == "add":
                if link not in self._links:
                    self._links.append(link)
            else:
                self._drop(link)
            if done is not None:
                done.set()

    def _drop(self, link) -> None:
        if link in self._links:
            self._links.remove(link)
        got = self._watched.pop(link, None)
        if got is not None:
            self._forget_fd(link, got[1])
        try:
            link._close()
        except Exception:  # noqa: BLE001 - the port is gone anyway
            log.debug("%s: closing", getattr(link, "port", link), exc_info=True)

    def _forget_fd(self, link, fd: int | None) -> None:
        """``fd`` no longer maps to ``link`` (a newer port may hold the number now)."""
        if fd is not None and self._fd_link.get(fd) is link:
            del self._fd_link[fd]

    def _sync(self, sel, only: list | None = None) -> bool:
        """Make the selector match every link's current port (opened, closed, reopened),
        or only the ports of the links ``only``; True if anything changed."""
        if only is not None:
            for link in only:
                got = self._watched.get(link)
                if got is None or got[0] is not link._ser:
                    return self._sync(sel)  # a port changed: every link looked at
            return False
        stale = []
        for link, (ser, fd) in self._watched.items():
            if link._ser is not ser or link not in self._links:
                stale.append(link)
                if fd is not None:
                    self._forget_fd(link, fd)
                    try:
                        sel.unregister(fd)
                    except (KeyError, ValueError, OSError):
                        pass  # closed: the kernel has dropped it already
        for link in stale:
            del self._watched[link]
        changed = bool(stale)
        for link in self._links:
            ser = link._ser
            if ser is None or link in self._watched:
                continue
            changed = True
            try:
                fd = ser.fileno()
            except Exception:  # noqa: BLE001 - a port object without an fd: polled
                fd = None
            if fd is not None:
                try:
                    sel.register(fd, _EPOLLIN)
                    self._fd_link[fd] = link
                except (KeyError, ValueError, OSError):
                    fd = None  # serviced by its deadline (poll) instead
            link._selectable = fd is not None
            self._watched[link] = (ser, fd)
        return changed

    def _timeout(self, links: list | None = None, deadlines: list | None = None) -> float:
        """Seconds until the earliest deadline (``deadlines`` of ``links``, computed
        now when not given), at most ``MAX_WAIT_S``."""
        if links is None:
            links = self._links
            deadlines = [link._deadline() for link in links]
        wait = MAX_WAIT_S
        shared = self._shared_clock if links is self._loop_links else None
        if shared is not None:
            if deadlines:
                wait = min(wait, min(deadlines) - shared())
            return max(wait, 0.0)
        for link, due in zip(links, deadlines, strict=True):
            left = due - link.clock()
            if left < wait:
                wait = left
        return max(wait, 0.0)

    # -- supervision -------------------------------------------------------------------
    def _failed(self, exc: BaseException) -> None:
        msg = self.supervision.failed(exc)
        for link in list(self._links):
            try:
                link._io_failed(msg)
            except Exception:  # noqa: BLE001 - report the others whatever one does
                log.debug("%s: reporting an I/O failure", link, exc_info=True)
        self._stop.wait(self.supervision.backoff * self._rng.uniform(0.8, 1.2))
