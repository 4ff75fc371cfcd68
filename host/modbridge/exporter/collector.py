"""The blocks as prometheus_client families: :class:`BridgeCollector`, and
:func:`make_registry`, the registry that holds it.

The endpoint writes the common scrape itself (render.py); a registry serves what
it does not write (``name[]`` filters, an escaping scheme that rewrites names,
another OpenMetrics version: endpoint.py hands those to prometheus_client), the
name clash check of ``describe()``, and anyone who wants the metrics in a registry
of their own. Its families come from the same walk (walk.py's ``_Blocks``), so its
text and the Renderer's are the same (a test holds them equal, byte for byte).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from modbridge.exporter.families import CLOCKED, FAMILIES, _family
from modbridge.exporter.process import _add_process_collectors
from modbridge.exporter.walk import SnapshotSource, _Blocks, _clocked, _labels_of


class BridgeCollector:
    """A prometheus_client collector over a snapshot source.

    ``source()`` must return the latest prebuilt :class:`BridgeSnapshot` (or None
    before the first one); it is called exactly once per scrape and never from
    ``describe()``. ``clock`` is ``time.monotonic`` (the snapshot's clock).
    """

    def __init__(self, source: SnapshotSource, clock: Callable[[], float] = time.monotonic):
        self._source = source
        self._clock = clock

    def describe(self) -> list[Metric]:
        # Lets the registry check for name clashes at register() without a scrape.
        return [_family(typ, name, labels, doc) for _, typ, name, labels, doc in FAMILIES]

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        blocks = _Blocks(snap)
        clocked = _clocked(snap, blocks.modules, self._clock())
        for attr, typ, name, labels, doc in FAMILIES:
            rows = clocked[attr] if attr in CLOCKED else _rows(blocks.families[attr])
            if not rows:  # an empty family (nothing known yet) is left out
                continue
            family = _family(typ, name, labels, doc)
            for label_values, v in rows:
                # _z's "-0.0" back to the float; an info sample's value is its labels
                family.add_metric(list(label_values), {} if typ == "info" else _float_z(v))
            yield family


def _rows(blocks: list) -> list[tuple[tuple, object]]:
    """A family's blocks as ``(label values, value)`` rows, in exposition order."""
    return [row for key, values in blocks for row in zip(_labels_of(key), values, strict=True)]


def _float_z(v):
    """The value :func:`_z` was given (its "-0.0" back to the float)."""
    return float(v) if type(v) is str else v


def make_registry(
    source: SnapshotSource,
    process_metrics: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> CollectorRegistry:
    """A registry of its own (never the global one) holding a BridgeCollector.

    With ``process_metrics`` the standard ``process_*`` (RSS, CPU, open fds, start
    time; Linux /proc) and ``python_info`` metrics are added: cheap, no I/O beyond
    /proc, and they show a leaking or restarting bridge. The GC collector is left out.
    """
    reg = CollectorRegistry()
    reg.register(BridgeCollector(source, clock))
    if process_metrics:
        _add_process_collectors(reg)
    return reg
