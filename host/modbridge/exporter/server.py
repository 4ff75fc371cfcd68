"""The HTTP server: :func:`serve` puts endpoint.py's ``Endpoint`` on a socket, with
every resource a client can make it hold bounded.

    connection -> the loop thread (one selector: accept, read the request's head)
               -> a complete head -> the queue -> a worker thread -> Endpoint.respond
               -> status line, headers and body in one sendall -> close

The bridge runs as root and its exporter is reachable by every local user (issue 23:
a thread per connection, no count, no timeout; ~100 idle connections used up the
process's file descriptors and the power-limit journal's write failed with EMFILE).
So, whatever clients do (:class:`ServerLimits`, docs/metrics.md "Endpoint"):

* **threads**: one loop thread and ``workers`` worker threads, started with the
  server; a connection never gets a thread of its own.
* **connections**: at most ``max_pending`` accepted connections whose request is not
  read yet, and ``max_queued`` complete requests waiting for a worker. A connection
  beyond those is closed at once, unread, and counted
  (``modbridge_exporter_connections_rejected_total{reason="over_capacity"|"busy"}``):
  with every pending slot taken, the oldest pending connection makes room for the
  new one. Idle connections therefore cannot keep a scraper out: each connection
  gets at least ``max_pending / accept_rate`` s (32 ms by default) to send its
  request, and a scraper sends it with the handshake.
* **time**: a request's head (request line and headers) must be complete within
  ``request_timeout_s`` of the accept, in total: a client trickling a header byte
  every few seconds is closed then (``reason="timeout"``), as is a head over
  ``max_head`` bytes (``reason="too_large"``). The answer's ``sendall`` has
  ``write_timeout_s`` in total.
* **accepting**: at most ``accept_rate`` connections a second (a token bucket of
  ``accept_burst``): beyond that they wait in the kernel's listen backlog, which costs
  the process nothing, and the loop thread's CPU (and its share of the GIL, which the
  bridge's safety path needs) stays bounded under a connection flood. ``accept()``
  failing for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) stops
  accepting for ``accept_pause_s`` (``modbridge_exporter_accept_pauses_total``), never
  a loop that spins on a listening socket it cannot empty.

The file descriptors the server can hold are therefore at most
:meth:`ServerLimits.max_fds`; :meth:`ServerLimits.for_fd_limit` scales the limits
down so that they stay a small part of RLIMIT_NOFILE (docs/bridge.md, "File
descriptors").

The loop thread sleeps until a connection, a client's bytes, a deadline or
:meth:`MetricsServer.stop` (a wake-up pipe): an endpoint nobody scrapes costs no
wake-ups. :class:`MetricsServer` is the handle ``serve()`` returns (its URL,
``stop()``).

Default port 9659: marked FREE in the Prometheus "Default port allocations" list
(exporters take 9100-9999 so they do not collide); 9101, the seed's choice, is the
HAProxy exporter's. Bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import collections
import dataclasses
import email.utils
import errno
import http.client
import io
import logging
import queue
import selectors
import socket
import struct
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from modbridge.errors import ModbridgeError
from modbridge.exporter.endpoint import Endpoint
from modbridge.exporter.walk import SnapshotSource
from modbridge.fdlimit import RESERVED_FDS, nofile
from modbridge.wakepipe import WakePipe

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 9659

#: The loop's own descriptors: the listening socket, the selector, the wake-up
#: pipe's two ends, and one accepted connection on its way to being closed.
_OWN_FDS = 5
_RECV = 4096
_ACCEPTS_PER_WAKE = 64  # then the other connections' bytes and deadlines get a turn
_PAUSE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
#: REJECT_REASONS: why a connection was closed without an answer (the label values
#: of modbridge_exporter_connections_rejected_total, every one present from zero)
OVER_CAPACITY, BUSY, TIMEOUT, TOO_LARGE = "over_capacity", "busy", "timeout", "too_large"
REJECT_REASONS = (OVER_CAPACITY, BUSY, TIMEOUT, TOO_LARGE)
_SERVER = f"{BaseHTTPRequestHandler.server_version} Python/{sys.version.split()[0]}"
_LINGER_RESET = struct.pack("ii", 1, 0)  # close() sends RST: no TIME_WAIT kept for it


class ExporterError(ModbridgeError):
    """The metrics endpoint could not be started."""


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What the server may hold, whatever clients do (the module docstring)."""

    workers: int = 2  # threads that render and send; a scrape takes ~1 ms
    max_pending: int = 32  # accepted connections whose request head is not read yet
    max_queued: int = 8  # complete requests waiting for a worker
    request_timeout_s: float = 2.0  # accept -> the head's last byte, in total
    write_timeout_s: float = 5.0  # the answer's sendall, in total
    max_head: int = 8192  # bytes of request line and headers
    accept_rate: float = 1000.0  # connections accepted a second, at most (sustained)
    accept_burst: int = 256
    accept_pause_s: float = 0.1  # after accept() failed for want of fds or memory
    backlog: int = 128  # the kernel's queue of connections not yet accepted

    def max_connections(self) -> int:
        """Connections open at once, at most: pending, queued, being answered."""
        return self.max_pending + self.max_queued + self.workers

    def max_fds(self) -> int:
        """File descriptors the server holds at once, at most."""
        return self.max_connections() + _OWN_FDS

    @classmethod
    def for_fd_limit(cls, soft: int | None = None, reserved: int = RESERVED_FDS) -> ServerLimits:
        """The default limits, the pending and queued connections cut so that
        :meth:`max_fds` is at most a quarter of what ``soft`` (RLIMIT_NOFILE's soft
        limit; None: this process's) leaves beyond ``reserved``, never below 4
        pending and 2 queued.

        >>> ServerLimits.for_fd_limit(1024).max_fds(), ServerLimits.for_fd_limit(256).max_fds()
        (47, 32)
        >>> ServerLimits.for_fd_limit(64).max_pending
        4
        """
        if soft is None:
            soft = nofile()[0]
        base = cls()
        if soft is None:  # unlimited, or not Unix
            return base
        room = max(0, soft - reserved) // 4 - _OWN_FDS - base.workers
        queued = max(2, min(base.max_queued, room // 4))
        pending = max(4, min(base.max_pending, room - queued))
        return dataclasses.replace(base, max_pending=pending, max_queued=queued)


class ServerStats:
    """The server's counters, exported beside the bridge's families (the endpoint's
    extra registry): a collector. Written by the loop thread, ``handed`` also by the
    workers (under ``lock``)."""

    def __init__(self, limits: ServerLimits):
        self.limits = limits
        self.accepted = 0
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.accept_pauses = 0
        self.pending = 0  # connections whose head is being read
        self.lock = threading.Lock()
        self.handed = 0  # complete requests queued or being answered (under lock)

    def open_connections(self) -> int:
        return self.pending + self.handed

    def collect(self):
        acc = CounterMetricFamily(
            "modbridge_exporter_connections_accepted",
            "Connections the metrics endpoint accepted.",
        )
        acc.add_metric([], self.accepted)
        rej = CounterMetricFamily(
            "modbridge_exporter_connections_rejected",
            "Connections the metrics endpoint closed without an answer: over_capacity "
            "(every pending slot taken), busy (every worker and queue slot taken), timeout "
            "(no complete request in time), too_large (a request head over the limit).",
            labels=["reason"],
        )
        for reason in REJECT_REASONS:
            rej.add_metric([reason], self.rejected[reason])
        pauses = CounterMetricFamily(
            "modbridge_exporter_accept_pauses",
            "Times accepting paused because accept() failed for want of file "
            "descriptors or memory.",
        )
        pauses.add_metric([], self.accept_pauses)
        open_ = GaugeMetricFamily(
            "modbridge_exporter_connections_open",
            "Connections the metrics endpoint holds: being read, queued or answered.",
            value=self.open_connections(),
        )
        limit = GaugeMetricFamily(
            "modbridge_exporter_connections_max",
            "The most connections the metrics endpoint holds at once.",
            value=self.limits.max_connections(),
        )
        return [acc, rej, pauses, open_, limit]


class _Pending:
    __slots__ = ("conn", "deadline", "buf")

    def __init__(self, conn: socket.socket, deadline: float):
        self.conn = conn
        self.deadline = deadline
        self.buf = bytearray()


class _BadRequest(Exception):
    pass


def _head_complete(buf: bytes | bytearray) -> bool:
    """The request line and headers are all there (the blank line after them), or
    the request line is and it is not an HTTP/1.x one (answered 400)."""
    if b"\r\n\r\n" in buf or b"\n\n" in buf:
        return True
    nl = buf.find(b"\n")
    return nl >= 0 and len(bytes(buf[:nl]).split()) != 3


def _parse_head(head: bytes) -> tuple[str, str, http.client.HTTPMessage]:
    """(method, target, headers) of a request head; _BadRequest with the reason."""
    line, _, rest = head.partition(b"\n")
    words = line.rstrip(b"\r").decode("iso-8859-1").split()
    if len(words) != 3:
        raise _BadRequest("not an HTTP/1.x request line")
    method, target, version = words
    if not version.startswith("HTTP/1."):
        raise _BadRequest(f"unsupported version {version[:16]!r}")
    try:
        headers = http.client.parse_headers(io.BytesIO(rest))
    except (http.client.HTTPException, ValueError) as e:
        raise _BadRequest(f"bad headers: {type(e).__name__}") from None
    return method, target, headers


def _response(status: int, headers: list[tuple[str, str]], body: bytes, head_only: bool) -> bytes:
    """HTTP/1.0: status line, Server, Date, ``headers``, Content-Length, blank line and
    (unless ``head_only``) the body, as one bytes."""
    head = [
        f"HTTP/1.0 {status} {HTTPStatus(status).phrase}",
        f"Server: {_SERVER}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
    ]
    head += [f"{name}: {value}" for name, value in headers]
    head += [f"Content-Length: {len(body)}", "", ""]
    out = "\r\n".join(head).encode("latin-1")
    return out if head_only else out + body


class BoundedServer:
    """The listening socket, the loop thread's work and the worker pool (the module
    docstring). :meth:`start` starts the threads; :meth:`stop` ends them and frees
    the port."""

    def __init__(self, addr: str, port: int, endpoint: Endpoint, limits: ServerLimits,
                 stats: ServerStats | None = None):  # fmt: skip
        self.endpoint = endpoint
        self.limits = limits
        self.stats = stats or ServerStats(limits)
        family, _, _, _, sockaddr = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server
            sock.bind((sockaddr[0], port) + tuple(sockaddr[2:]))
            sock.listen(limits.backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.socket = sock
        self.server_address = sock.getsockname()
        # every descriptor of the server's own is taken here, before serve() returns: a
        # process short of descriptors later cannot stop the loop from starting
        try:
            self._wake = WakePipe()
        except OSError:
            sock.close()
            raise
        try:
            self._sel = selectors.DefaultSelector()
        except OSError:
            self._wake.close()
            sock.close()
            raise
        self._sel.register(sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake, selectors.EVENT_READ, self._wake)
        self._stopping = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: collections.OrderedDict[int, _Pending] = collections.OrderedDict()
        self._tokens = float(limits.accept_burst)
        self._refilled = time.monotonic()
        self._accept_at: float | None = None  # accepting paused until then
        self._pause_logged = False
        self.loop_thread = threading.Thread(target=self._loop, name="modbridge-metrics",
                                            daemon=True)  # fmt: skip
        self.workers = [
            threading.Thread(target=self._work, name="modbridge-metrics-worker", daemon=True)
            for _ in range(limits.workers)
        ]

    def start(self) -> BoundedServer:
        for w in self.workers:
            w.start()
        self.loop_thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection not handed to a worker and the
        listening socket (the port is free on return), end the threads."""
        self._stopping = True
        self._wake.wake()
        if self.loop_thread.ident is not None:
            self.loop_thread.join(timeout)
        self._close()
        end = time.monotonic() + timeout
        for w in self.workers:
            if w.ident is not None:
                w.join(max(0.0, end - time.monotonic()))

    # -- the loop thread ----------------------------------------------------------------
    def _loop(self) -> None:
        sel = self._sel
        try:
            while not self._stopping:
                events = sel.select(self._timeout(time.monotonic()))
                now = time.monotonic()
                for key, _ in events:
                    if key.data is None:
                        self._accept(now)
                    elif key.data is self._wake:
                        self._wake.drain()
                    else:
                        self._read(key.data, now)
                self._expire(now)
                if self._accept_at is not None and now >= self._accept_at:
                    self._accept_at = None
                    sel.register(self.socket, selectors.EVENT_READ, None)
        except Exception:  # a bug: logged; stop() still frees the port
            log.exception("metrics endpoint: the server loop failed")
        finally:
            self._close()

    def _timeout(self, now: float) -> float | None:
        due = []
        if self._pending:
            due.append(next(iter(self._pending.values())).deadline)
        if self._accept_at is not None:
            due.append(self._accept_at)
        return max(0.0, min(due) - now) if due else None

    def _pause_accepting(self, until: float) -> None:
        self._accept_at = until
        self._sel.unregister(self.socket)

    def _accept(self, now: float) -> None:
        lim = self.limits
        self._tokens = min(
            lim.accept_burst, self._tokens + (now - self._refilled) * lim.accept_rate
        )
        self._refilled = now
        for _ in range(_ACCEPTS_PER_WAKE):
            if self._tokens < 1.0:  # the rest wait in the kernel's backlog
                self._pause_accepting(now + (1.0 - self._tokens) / lim.accept_rate)
                return
            try:
                conn, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _PAUSE_ERRNOS:
                    self.stats.accept_pauses += 1
                    if not self._pause_logged:
                        self._pause_logged = True
                        log.warning("metrics endpoint: cannot accept: %s; accepting paused "
                                    "for %g s at a time until it can", e.strerror or e,
                                    lim.accept_pause_s)  # fmt: skip
                    self._pause_accepting(now + lim.accept_pause_s)
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that connection's trouble, not the listener's
                log.warning("metrics endpoint: accept failed: %s", e)
                self._pause_accepting(now + lim.accept_pause_s)
                return
            if self._pause_logged:
                self._pause_logged = False
                log.info("metrics endpoint: accepting again")
            self._tokens -= 1.0
            self.stats.accepted += 1
            self._admit(conn, now)

    def _admit(self, conn: socket.socket, now: float) -> None:
        """A new connection takes a pending slot; with every slot taken, the one
        accepted longest ago (the nearest its deadline) is closed unread to make room:
        a connection that stalls holds a slot until ``max_pending`` newer ones come,
        and each gets at least ``max_pending / accept_rate`` s to send its request."""
        conn.setblocking(False)
        if len(self._pending) >= self.limits.max_pending:
            oldest = next(iter(self._pending.values()))
            self._drop(oldest)
            self._reject(oldest.conn, OVER_CAPACITY)
        p = _Pending(conn, now + self.limits.request_timeout_s)
        self._pending[conn.fileno()] = p
        self.stats.pending = len(self._pending)
        self._sel.register(conn, selectors.EVENT_READ, p)
        self._read(p, now)  # a scraper's request comes with the handshake: often there

    def _read(self, p: _Pending, now: float) -> None:
        if p.conn.fileno() < 0:  # closed earlier in this round (evicted for a newer one)
            return
        try:
            chunk = p.conn.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away (or reset): nothing to answer
            self._drop(p)
            p.conn.close()
            return
        p.buf += chunk
        if len(p.buf) > self.limits.max_head:
            self._drop(p)
            self._reject(p.conn, TOO_LARGE)
        elif _head_complete(p.buf):
            self._drop(p)
            self._hand(p)

    def _drop(self, p: _Pending) -> None:
        """``p`` is no longer pending (its socket is not closed)."""
        fd = p.conn.fileno()
        if self._pending.pop(fd, None) is not None:
            self._sel.unregister(p.conn)
            self.stats.pending = len(self._pending)

    def _expire(self, now: float) -> None:
        while self._pending:
            p = next(iter(self._pending.values()))
            if p.deadline > now:
                return
            self._drop(p)
            self._reject(p.conn, TIMEOUT)

    def _hand(self, p: _Pending) -> None:
        """A complete head to the workers, or closed (every worker and queue slot
        taken)."""
        with self.stats.lock:
            busy = self.stats.handed >= self.limits.max_queued + self.limits.workers
            if not busy:
                self.stats.handed += 1
        if busy:
            self._reject(p.conn, BUSY)
            return
        self._requests.put((p.conn, bytes(p.buf)))

    def _reject(self, conn: socket.socket, reason: str) -> None:
        self.stats.rejected[reason] += 1
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            pass
        conn.close()

    def _close(self) -> None:
        """Close the listening socket, the pending connections and the wake-up pipe;
        tell the workers to end (idempotent, any thread)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.socket.close()
        for p in self._pending.values():
            p.conn.close()
        self._pending.clear()
        self.stats.pending = 0
        self._sel.close()
        self._wake.close()
        for _ in self.workers:
            self._requests.put(None)

    # -- the workers ----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            conn, head = item
            try:
                out = self._answer(head)
                conn.setblocking(True)
                conn.settimeout(self.limits.write_timeout_s)  # sendall's total (3.5+)
                conn.sendall(out)
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the client went away, or did not read its answer in time
            except Exception:  # noqa: BLE001 - a bug must cost one scrape, not the endpoint
                log.exception("metrics: a request failed")
            finally:
                conn.close()
                with self.stats.lock:
                    self.stats.handed -= 1

    def _answer(self, head: bytes) -> bytes:
        try:
            method, target, headers = _parse_head(head)
        except _BadRequest as e:
            body = f"bad request: {e}\n".encode()
            return _response(400, [("Content-Type", "text/plain")], body, False)
        url = urlsplit(target)
        try:
            status, out_headers, body = self.endpoint.respond(
                method, url.path, url.query, headers.get("Accept"), headers.get("Accept-Encoding")
            )
        except Exception:  # a bug must cost one scrape, not the endpoint
            log.exception("metrics: a scrape failed")
            status, out_headers, body = 500, [("Content-Type", "text/plain")], b"scrape failed\n"
        return _response(status, out_headers, body, method == "HEAD")


class MetricsServer:
    """Handle of a running /metrics endpoint; ``stop()`` frees the port."""

    def __init__(self, server: BoundedServer, registry: CollectorRegistry):
        self._server = server
        self._thread = server.loop_thread
        self.registry = registry
        self.limits = server.limits
        self.stats = server.stats
        host, port = server.server_address[:2]
        self.addr: str = host
        self.port: int = port

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def threads(self) -> list[threading.Thread]:
        """The server's threads: the loop's and the workers'."""
        s = self._server
        return [s.loop_thread, *s.workers] if s is not None else []

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.stop(timeout)
        log.info("metrics endpoint on %s stopped", self.url)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    source: SnapshotSource,
    addr: str = DEFAULT_ADDR,
    port: int = DEFAULT_PORT,
    process_metrics: bool = True,
    limits: ServerLimits | None = None,
) -> MetricsServer:
    """Serve the snapshot source's metrics over HTTP on ``addr:port`` (0: any free
    port), within ``limits`` (default: :meth:`ServerLimits.for_fd_limit` of this
    process's RLIMIT_NOFILE)."""
    limits = limits or ServerLimits.for_fd_limit()
    stats = ServerStats(limits)
    endpoint = Endpoint(source, process_metrics=process_metrics, collectors=[stats])
    try:
        server = BoundedServer(addr, port, endpoint, limits, stats)
    except OSError as e:
        hint = (
            "another process holds it; choose another --metrics-port"
            if e.errno == errno.EADDRINUSE
            else "check the address"
        )
        raise ExporterError(
            f"cannot serve metrics on {addr}:{port}: {e.strerror or e}; {hint}"
        ) from e
    server.start()
    handle = MetricsServer(server, endpoint.registry)
    handle.endpoint = endpoint
    handle.renderer = endpoint.renderer
    log.info("serving metrics on %s (at most %d connections)", handle.url,
             limits.max_connections())  # fmt: skip
    return handle
