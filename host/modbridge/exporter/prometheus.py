"""Prometheus exporter: turns the bridge's latest :class:`BridgeSnapshot` into metrics.

The exporter is *handed* its source, a callable returning the latest snapshot that
the bridge loop built. A scrape calls ``source()`` once and reads that object: it
never touches a serial port or NVML, so a slow module or a hung driver can never
make a scrape hang. Everything is in base units with one ``modbridge_`` prefix;
docs/metrics.md lists every metric.

    server = serve(lambda: bridge.snapshot)      # http://127.0.0.1:9659/metrics
    ...
    server.stop()

This module is the front door: the names the rest of the code imports, from the
modules that do the work, one job each, in the order a scrape goes through them:

    snapshot -> walk.py: blocks -> render.py: text -> endpoint.py: gzip -> server.py: HTTP
                              -> collector.py: prometheus_client families (a registry)

* ``families.py``: what is exported. ``FAMILIES``, every family's name, type,
  labels and help, in exposition order; the label sets known in advance.
* ``walk.py``: one walk of a snapshot (``_Blocks``) decides every family, label and
  value exported, as blocks; also what of a snapshot may still change
  (``_live_version``) and the ages, made per scrape (``_clocked``).
* ``render.py``: :class:`Renderer`, the blocks as exposition text once per
  snapshot version, byte for byte what prometheus_client would write of them.
* ``collector.py``: :class:`BridgeCollector`, the same blocks as prometheus_client
  families, and :func:`make_registry` (for what the endpoint does not write itself).
* ``process.py``: the ``process_*`` metrics, prometheus_client's for less CPU.
* ``endpoint.py``: :class:`Endpoint`, what /metrics answers, as prometheus_client's
  WSGI app does (negotiation, ``name[]``, gzip from a deflate state kept).
* ``server.py``: :func:`serve`, the HTTP server: one loop thread (accepts, reads
  requests) and a few workers (answers, each in one ``sendall``), every connection,
  second and descriptor a client can take bounded (:class:`ServerLimits`);
  :class:`MetricsServer`, its handle.
"""

from __future__ import annotations

from modbridge.exporter.collector import BridgeCollector, make_registry
from modbridge.exporter.endpoint import GZIP_LEVEL, Endpoint
from modbridge.exporter.families import (
    CLOCKED,
    FAMILIES,
    GPU_STATES,
    POLICY_ACTIONS,
    POLICY_LEVELS,
    UNITS,
)
from modbridge.exporter.render import OPENMETRICS, TEXT, Renderer, value_text
from modbridge.exporter.server import (
    DEFAULT_ADDR,
    DEFAULT_PORT,
    ExporterError,
    MetricsServer,
    ServerLimits,
    serve,
)
from modbridge.exporter.walk import SnapshotSource

__all__ = [
    "CLOCKED",
    "DEFAULT_ADDR",
    "DEFAULT_PORT",
    "FAMILIES",
    "GPU_STATES",
    "GZIP_LEVEL",
    "OPENMETRICS",
    "POLICY_ACTIONS",
    "POLICY_LEVELS",
    "TEXT",
    "UNITS",
    "BridgeCollector",
    "Endpoint",
    "ExporterError",
    "MetricsServer",
    "Renderer",
    "ServerLimits",
    "SnapshotSource",
    "make_registry",
    "serve",
    "value_text",
]
