"""What /metrics answers: :class:`Endpoint` turns a request into (status, headers,
body), with no socket in sight (server.py puts it on HTTP).

    request -> negotiation (Accept, Accept-Encoding; remembered per pair)
            -> the Renderer's parts, or prometheus_client's text of the registry
               (``name[]`` filters, a format the Renderer does not write)
            -> gzip (:class:`_Gzip`: one deflate state kept) -> (status, headers, body)

The same methods, paths, negotiation, filters and gzip as prometheus_client's
``make_wsgi_app``; :func:`_fast_format` says which negotiated formats the Renderer
writes. Two paths are not metrics: ``/healthz`` (liveness: the bridge loop still
builds snapshots, the newest younger than :data:`LIVE_MAX_AGE_S`) and ``/readyz``
(readiness: a first snapshot exists, so a scrape has something to show). Readiness
does not look at the modules or the GPUs: a module in trouble must stay scraped
(its alerts come from these metrics), never be taken out of a Service
(docs/metrics.md, "Health endpoints").
"""

from __future__ import annotations

import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, exposition
from prometheus_client.openmetrics import exposition as om_exposition

from modbridge.exporter.collector import make_registry
from modbridge.exporter.families import FAMILIES
from modbridge.exporter.process import _add_process_collectors
from modbridge.exporter.render import OPENMETRICS, TEXT, Renderer
from modbridge.exporter.walk import SnapshotSource

# The 8-module body (91 KB of text), measured on a warm thread: level 1 8.4 KB in
# ~0.13 ms of CPU, 6 (Go's default, client_golang's promhttp) 7.2 KB in ~0.6 ms, 9
# (prometheus_client's gzip.compress default) 6.7 KB in ~2 ms. 1.3-1.7 KB per 15 s
# scrape is nothing to a network; the 0.5-1.9 ms would be most of a scrape's CPU.
GZIP_LEVEL = 1

# /healthz fails once the newest snapshot is older than this: the loop ticks every
# [bridge] tick_s (at most 10 s, config.py), so three of the longest ticks missed is
# a loop that stopped, not a slow one. ModbridgeExporterStale pages at 10 s for 1m;
# a liveness failure restarts the container (the journal restores the limits).
LIVE_MAX_AGE_S = 30.0
_HEALTH_HEADERS = [("Content-Type", "text/plain; charset=utf-8")]


_LEGACY_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Escaping schemes that leave a legacy name as it is (``dots`` and ``values`` rewrite
# every underscore). Every name here is a legacy one (the naming lint in
# tests/test_exporter.py), so these schemes give the Renderer's text.
_SAME_TEXT_ESCAPINGS = (
    (om_exposition.UNDERSCORES, om_exposition.ALLOWUTF8)
    if all(
        _LEGACY_METRIC.fullmatch(name) and all(map(_LEGACY_LABEL.fullmatch, labels))
        for _, _, name, labels, _ in FAMILIES
    )
    else (om_exposition.UNDERSCORES,)
)


def _fast_format(encoder) -> str | None:
    """TEXT or OPENMETRICS if prometheus_client's choice of ``encoder`` is one the
    Renderer writes (the text format, OpenMetrics 1.0.0, escaping ``underscores`` or
    ``allow-utf-8``, which Prometheus 3 asks for); else None."""
    if encoder is exposition.generate_latest:
        return TEXT
    func = getattr(encoder, "func", None)
    kw = getattr(encoder, "keywords", {})
    if kw.get("escaping", om_exposition.UNDERSCORES) not in _SAME_TEXT_ESCAPINGS:
        return None
    if func is exposition.generate_latest:
        return TEXT
    if func is om_exposition.generate_latest and kw.get("version", "1.0.0") == "1.0.0":
        return OPENMETRICS
    return None


class _Gzip:
    """gzip bodies from one deflate state kept from response to response.

    ``gzip.compress`` sets up a deflate state per call (256 KB: window, hash chains,
    buffers) and frees it; the next call's state is memory the allocator gave back
    meanwhile, some 55 page faults a scrape on a worker thread (measured: half the
    ~0.3 ms it took). Here the state stays: each body is deflated, then flushed with
    ``Z_FULL_FLUSH`` (the output ends on a byte boundary and the state forgets all it
    saw, so the next body refers to nothing of this one), then closed by an empty
    final block, the bytes ``Z_FINISH`` writes at the end of a flushed stream. With
    the gzip header and the trailer (CRC-32, length) that is a complete gzip member:
    the deflate blocks a fresh state would write (none marked final) and up to 8
    bytes more (the flush's empty stored block, the empty final block)."""

    HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0
    LAST = b"\x03\x00"  # an empty final block, fixed Huffman codes

    def __init__(self, level: int):
        self._level = level
        self._lock = threading.Lock()
        self._deflate = self._new()

    def _new(self):
        return zlib.compressobj(self._level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def compress(self, parts: list[bytes]) -> bytes:
        out, crc, size = [self.HEADER], 0, 0
        with self._lock:
            deflate = self._deflate
            try:
                for part in parts:
                    out.append(deflate.compress(part))
                    crc = zlib.crc32(part, crc)
                    size += len(part)
                out.append(deflate.flush(zlib.Z_FULL_FLUSH))
            except BaseException:
                self._deflate = self._new()  # half a body in the state: never reused
                raise
        out.append(self.LAST)
        out.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(out)


class Endpoint:
    """What /metrics answers: prometheus_client's ``make_wsgi_app`` restated (same
    methods, paths, content negotiation, ``name[]`` filters and gzip) with the body
    from a :class:`Renderer`. A request the Renderer does not write (``name[]``, an
    escaping scheme that rewrites names, an OpenMetrics version other than 1.0.0) is
    rendered by prometheus_client from
    ``registry``: the same metrics. ``collectors`` (the server's counters) are
    written after the process metrics, by both."""

    def __init__(
        self,
        source: SnapshotSource,
        process_metrics: bool = True,
        clock: Callable[[], float] = time.monotonic,
        live_max_age_s: float = LIVE_MAX_AGE_S,
        collectors: Sequence = (),
    ):
        self._source = source
        self._clock = clock
        self.live_max_age_s = live_max_age_s
        extra = _add_process_collectors(CollectorRegistry()) if process_metrics else None
        self.registry = make_registry(source, process_metrics, clock)
        for c in collectors:  # the server's own counters (server.py's ServerStats)
            extra = extra or CollectorRegistry()
            extra.register(c)
            self.registry.register(c)
        self.renderer = Renderer(source, clock, extra)
        self._gzip = _Gzip(GZIP_LEVEL)
        # (Accept, Accept-Encoding) -> their negotiation: a scraper sends the same ones
        self._negotiated: dict[tuple, tuple] = {}

    def respond(
        self, method: str, path: str, query: str, accept: str | None, accept_encoding: str | None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """(status, headers, body) of one request."""
        if method == "OPTIONS":
            return 200, [("Allow", "OPTIONS,GET")], b""
        if method != "GET":
            body = f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()
            return 405, [("Allow", "OPTIONS,GET")], body
        if path == "/favicon.ico":
            return 200, [], b""  # for browsers; any other path but these is /metrics
        if path == "/healthz":
            return self._healthz()
        if path == "/readyz":
            return self._readyz()
        got = self._negotiated.get((accept, accept_encoding))
        if got is None:
            encoder, content_type = exposition.choose_encoder(accept or "")
            gzipped = exposition.gzip_accepted(accept_encoding or "")
            got = (encoder, content_type, _fast_format(encoder), gzipped)
            if len(self._negotiated) < 64:  # headers from the network: bounded
                self._negotiated[accept, accept_encoding] = got
        encoder, content_type, fmt, gzipped = got
        names = parse_qs(query).get("name[]") if query else None
        if names:
            parts = [encoder(self.registry.restricted_registry(names))]
        elif fmt is None:
            parts = [encoder(self.registry)]
        else:
            parts = self.renderer.render_parts(fmt)
        headers = [("Content-Type", content_type)]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
            return 200, headers, self._gzip.compress(parts)
        return 200, headers, b"".join(parts)

    def _healthz(self) -> tuple[int, list[tuple[str, str]], bytes]:
        """Liveness: 200 while the newest snapshot is younger than ``live_max_age_s``
        (the bridge loop is alive), else 503 with the reason."""
        snap = self._source()
        if snap is None:
            return 503, _HEALTH_HEADERS, b"not live: no snapshot yet\n"
        age = self._clock() - snap.taken_at
        if age > self.live_max_age_s:
            body = (
                f"not live: the newest snapshot is {age:.1f} s old "
                f"(limit {self.live_max_age_s:g} s): the bridge loop is not ticking\n"
            )
            return 503, _HEALTH_HEADERS, body.encode()
        return 200, _HEALTH_HEADERS, f"ok: snapshot {max(0.0, age):.1f} s old\n".encode()

    def _readyz(self) -> tuple[int, list[tuple[str, str]], bytes]:
        """Readiness: 200 once the bridge has a snapshot (the exporter answering this
        is the other half). Module and GPU health are the metrics' business, not
        this: a sick module must stay in the Service so that its alerts can fire."""
        if self._source() is None:
            return 503, _HEALTH_HEADERS, b"not ready: no snapshot yet\n"
        return 200, _HEALTH_HEADERS, b"ready\n"
