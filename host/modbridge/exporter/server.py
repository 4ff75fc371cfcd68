"""The HTTP server: :func:`serve` puts endpoint.py's ``Endpoint`` on a socket.

    connection -> _WorkerServer (a worker thread) -> _Handler -> Endpoint.respond
               -> status line, headers and body in one sendall -> close

:class:`_WorkerServer` is a ThreadingHTTPServer whose requests run on long-lived
worker threads; :class:`_Handler` answers one HTTP/1.0 request; :class:`MetricsServer`
is the handle ``serve()`` returns (its URL, ``stop()``).

Default port 9659: marked FREE in the Prometheus "Default port allocations" list
(exporters take 9100-9999 so they do not collide); 9101, the seed's choice, is the
HAProxy exporter's. Bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import errno
import logging
import queue
import selectors
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from modbridge.errors import ModbridgeError
from modbridge.exporter.endpoint import Endpoint
from modbridge.exporter.walk import SnapshotSource
from modbridge.wakepipe import WakePipe

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 9659


class ExporterError(ModbridgeError):
    """The metrics endpoint could not be started."""


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.0 request (the connection closes after it) answered by ``endpoint``.
    The status line, headers and body leave in one ``sendall`` (the base class writes
    headers and body apart), with Nagle off: the answer is never held back waiting for
    the client's ACK of a first small segment."""

    endpoint: Endpoint  # set on the per-server subclass
    disable_nagle_algorithm = True  # TCP_NODELAY (StreamRequestHandler.setup)

    def _answer(self) -> None:
        url = urlsplit(self.path)
        try:
            status, headers, body = self.endpoint.respond(
                self.command,
                url.path,
                url.query,
                self.headers.get("Accept"),
                self.headers.get("Accept-Encoding"),
            )
        except Exception:  # a bug must cost one scrape, not the endpoint
            log.exception("metrics: a scrape failed")
            status, headers, body = 500, [("Content-Type", "text/plain")], b"scrape failed\n"
        head = [
            f"{self.protocol_version} {status} {self.responses[status][0]}",
            f"Server: {self.version_string()}",
            f"Date: {self.date_time_string()}",
        ]
        head += [f"{name}: {value}" for name, value in headers]
        head += [f"Content-Length: {len(body)}", "", ""]
        out = "\r\n".join(head).encode("latin-1")
        self.wfile.write(out if self.command == "HEAD" else out + body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        """No line per scrape."""


class _WorkerServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with its requests on long-lived worker threads (daemons).

    A request goes to an idle worker, or to a new one when none is idle: a client
    that connects and stalls holds its own thread, never another scrape, as with a
    thread per request. Up to ``IDLE_WORKERS`` wait for the next request instead of
    ending. A scrape on a thread that served the last one costs about 0.2 ms less CPU
    than on a new thread (its caches; measured on the 8-module body), besides the
    thread's start. ``server_close()`` ends the idle ones (a busy one ends when its
    request does); it waits for none of them.

    The accepting thread sleeps until a connection or ``shutdown()`` (a wake-up
    pipe), not in socketserver's 0.5 s poll: an endpoint nobody scrapes costs no
    wake-ups."""

    daemon_threads = True
    IDLE_WORKERS = 2

    def __init__(self, *args, **kwargs):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._workers_lock = threading.Lock()
        self._idle = 0  # workers waiting on _requests, none of them promised a request
        self._closed = False
        self._stopping = False
        self._stopped = threading.Event()
        self._stopped.set()  # not serving: shutdown() has nothing to wait for
        self._wake = WakePipe()
        super().__init__(*args, **kwargs)

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Accept connections until :meth:`shutdown` (``poll_interval`` is ignored:
        the loop sleeps until there is something to do)."""
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self, selectors.EVENT_READ)
                sel.register(self._wake, selectors.EVENT_READ)
                while not self._stopping:
                    ready = {key.fileobj for key, _ in sel.select()}
                    if self._wake in ready:
                        self._wake.drain()
                    if self._stopping:
                        break
                    if self in ready:
                        self._handle_request_noblock()
                    self.service_actions()
        finally:
            self._stopping = False  # served again after a shutdown, as socketserver
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` (called from another thread) and wait for it.
        Before it started (a thread just launched): it returns at once when it does."""
        self._stopping = True
        self._wake.wake()
        if not self._stopped.is_set():
            self._stopped.wait()

    def process_request(self, request, client_address) -> None:
        with self._workers_lock:
            if self._idle:
                self._idle -= 1  # that worker takes this request
            else:
                threading.Thread(
                    target=self._work, name="modbridge-metrics-worker", daemon=True
                ).start()
        self._requests.put((request, client_address))

    def _work(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
            with self._workers_lock:
                if self._closed or self._idle >= self.IDLE_WORKERS:
                    return
                self._idle += 1

    def server_close(self) -> None:
        super().server_close()
        self._wake.close()
        with self._workers_lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._requests.put(None)


def _server(addr: str, port: int, endpoint: Endpoint) -> ThreadingHTTPServer:
    """Requests on worker threads (:class:`_WorkerServer`), IPv4 or IPv6 as the
    address says."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(_WorkerServer):
        address_family = family

    class Handler(_Handler):
        pass

    Handler.endpoint = endpoint
    return Server((sockaddr[0], port), Handler)


class MetricsServer:
    """Handle of a running /metrics endpoint; ``stop()`` frees the port."""

    def __init__(self, httpd, thread: threading.Thread, registry: CollectorRegistry):
        self._httpd = httpd
        self._thread = thread
        self.registry = registry
        host, port = httpd.server_address[:2]
        self.addr: str = host
        self.port: int = port

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        if self._httpd is None:
            return
        httpd, self._httpd = self._httpd, None
        httpd.shutdown()  # ends serve_forever()
        httpd.server_close()  # closes the listening socket: the port is free
        self._thread.join(timeout)
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
) -> MetricsServer:
    """Serve the snapshot source's metrics over HTTP on ``addr:port`` (0: any free port)."""
    endpoint = Endpoint(source, process_metrics=process_metrics)
    try:
        httpd = _server(addr, port, endpoint)
    except OSError as e:
        hint = (
            "another process holds it; choose another --metrics-port"
            if e.errno == errno.EADDRINUSE
            else "check the address"
        )
        raise ExporterError(
            f"cannot serve metrics on {addr}:{port}: {e.strerror or e}; {hint}"
        ) from e
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    thread.name = "modbridge-metrics"
    server = MetricsServer(httpd, thread, endpoint.registry)
    server.endpoint = endpoint
    server.renderer = endpoint.renderer
    log.info("serving metrics on %s", server.url)
    return server
