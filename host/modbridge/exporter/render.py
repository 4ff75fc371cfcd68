"""The blocks as exposition text: :class:`Renderer`, once per snapshot version.

    snapshot -> walk (blocks) -> Renderer: a text per family, kept -> [bytes, ...]

The parts go to endpoint.py (joined, or gzipped as they are). They are byte for
byte what prometheus_client's ``generate_latest`` (text format 0.0.4) or its
OpenMetrics one (1.0.0) writes of a registry holding collector.py's
``BridgeCollector`` and the process metrics: every header and sample prefix is
prometheus_client's own text, made once and kept, and a value is written by
:func:`value_text` (``floatToGoString``, quicker). The Renderer's docstring says
what a scrape costs and what is kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, exposition
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.utils import floatToGoString

from modbridge.exporter.families import _FAMILY_DEF, CLOCKED, FAMILIES, _family
from modbridge.exporter.walk import SnapshotSource, _Blocks, _clocked, _labels_of, _live_version
from modbridge.model import BridgeSnapshot

TEXT = "text"  # Prometheus text format 0.0.4
OPENMETRICS = "openmetrics"  # OpenMetrics 1.0.0
_GENERATE = {TEXT: exposition.generate_latest, OPENMETRICS: om_exposition.generate_latest}
_EOF = "# EOF\n"


def value_text(v) -> str:
    """prometheus_client's ``floatToGoString(v)``, quicker for the common values: below
    1e6 in magnitude Python's repr is Go's (Go writes exponents from 1e21 down to
    1e6 where Python does not; NaN fails the comparison and goes the long way)."""
    d = float(v)
    if -1e6 < d < 1e6:
        return repr(d)
    return floatToGoString(d)


class _Given:
    """A registry stand-in whose collect() yields the families it was given."""

    def __init__(self, *families: Metric):
        self._families = families

    def collect(self):
        return self._families


def _text_of(fmt: str, registry) -> str:
    """prometheus_client's own rendering of ``registry``, without OpenMetrics' # EOF."""
    text = _GENERATE[fmt](registry).decode("utf-8")
    return text[: -len(_EOF)] if fmt == OPENMETRICS else text


def _lines(prefixes: list[str], values: tuple) -> str:
    if len(values) == 1:  # most blocks: one sample
        return f"{prefixes[0]}{value_text(values[0])}\n"
    return "".join([f"{p}{value_text(v)}\n" for p, v in zip(prefixes, values, strict=True)])


class Renderer:
    """The exposition text of a snapshot source, rendered once per snapshot version.

    ``render(fmt)`` returns exactly the bytes prometheus_client's ``generate_latest``
    (or its OpenMetrics one) makes of a registry holding ``BridgeCollector(source,
    clock)`` and then ``extra``'s collectors: the same blocks (:class:`_Blocks`), and
    every header and sample prefix is
    prometheus_client's own text, made once and kept. A scrape of a snapshot version
    already rendered costs the CLOCKED samples (ages), ``extra`` (the process
    metrics) and a join; a new version costs one walk over the snapshot, a tuple
    comparison per family (in C) and, in a family that changed, per block (a module's
    frame errors, a GPU's power, a pair's actions), and a line per sample of the
    blocks whose values changed. Texts and prefixes a
    render did not use (a module that went away) are dropped after the next render
    of that format. ``renders`` counts the versions rendered (tests count it; no
    timing in tests).
    """

    def __init__(
        self,
        source: SnapshotSource,
        clock: Callable[[], float] = time.monotonic,
        extra: CollectorRegistry | None = None,
    ):
        self._source = source
        self._clock = clock
        self._extra = extra
        self._lock = threading.Lock()
        self._snap: BridgeSnapshot | None = None
        self._version: tuple | None = None
        self._blocks: _Blocks | None = None
        self._parts: dict[str, list] = {}  # fmt -> [bytes | CLOCKED attr, ...]
        self._headers: dict[tuple[str, str], str] = {}
        # (fmt, attr) -> {label values: text before the value}: the CLOCKED families'
        self._prefixes: dict[tuple[str, str], dict] = {}
        # (fmt, attr) -> (blocks, text, [(values, text, prefixes) per block]) of the
        # last render of fmt
        self._family_texts: dict[tuple[str, str], tuple] = {}
        # fmt -> {extra family's shape: (header, prefixes) or None} of the last scrape
        self._extra_shapes: dict[str, dict] = {}
        self.renders = 0

    def render(self, fmt: str = TEXT) -> bytes:
        return b"".join(self.render_parts(fmt))

    def render_parts(self, fmt: str = TEXT) -> list[bytes]:
        """:meth:`render`'s bytes in pieces, not joined (for :class:`_Gzip`)."""
        snap = self._source()
        now = self._clock()
        with self._lock:
            version = _live_version(snap)
            if self._blocks is None or snap is not self._snap or version != self._version:
                self._blocks = _Blocks(snap)
                self._snap, self._version = snap, version
                self._parts = {}
                self.renders += 1
            parts = self._parts.get(fmt)
            if parts is None:
                parts = self._parts[fmt] = self._segments(fmt)
            clocked = _clocked(snap, self._blocks.modules, now)
            out = [
                p if type(p) is bytes else self._family(fmt, p, clocked[p]).encode() for p in parts
            ]
            if self._extra is not None:
                out.append(self._extra_text(fmt).encode())
        if fmt == OPENMETRICS:
            out.append(_EOF.encode())
        return out

    def _segments(self, fmt: str) -> list:
        """The blocks as text, cut where a CLOCKED family goes in. A block whose values
        equal its values in the last render of ``fmt`` keeps its text."""
        parts, text = [], []
        for attr, *_ in FAMILIES:
            if attr in CLOCKED:
                parts.append("".join(text).encode())
                parts.append(attr)
                text = []
                continue
            blocks = self._blocks.families[attr]
            if blocks:
                text.append(self._family_text(fmt, attr, blocks))
            else:
                self._family_texts.pop((fmt, attr), None)
        parts.append("".join(text).encode())
        return parts

    def _family_text(self, fmt: str, attr: str, blocks: list) -> str:
        key = (fmt, attr)
        last = self._family_texts.get(key)
        if last is not None and last[0] == blocks:
            return last[1]  # every block as in the last render (one comparison, in C)
        if (
            last is not None
            and len(last[0]) == len(blocks)
            and all(a[0] == b[0] for a, b in zip(last[0], blocks, strict=True))
        ):
            kept = last[2]  # the same blocks in the same order (the same modules)
        else:
            kept = self._kept(fmt, attr, blocks, last)
        out = [self._header(fmt, attr)]
        now = []
        for (_, values), k in zip(blocks, kept, strict=True):
            if k[0] != values:
                k = (values, _lines(k[2], values), k[2])
            now.append(k)
            out.append(k[1])
        text = "".join(out)
        self._family_texts[key] = (blocks, text, now)
        return text

    def _kept(self, fmt: str, attr: str, blocks: list, last: tuple | None) -> list:
        """Per block, its ``(values, text, prefixes)`` in the last render, or for a
        block that was not there its prefixes from prometheus_client (all new
        blocks' at once) and its text."""
        old = {} if last is None else dict(zip([b for b, _ in last[0]], last[2], strict=True))
        new = [(block, values) for block, values in blocks if block not in old]
        if new:
            labels = [_labels_of(block) for block, _ in new]
            flat = self._new_prefixes(fmt, attr, [lv for ls in labels for lv in ls])
            i = 0
            for (block, values), ls in zip(new, labels, strict=True):
                prefixes = flat[i : i + len(ls)]
                i += len(ls)
                old[block] = (values, _lines(prefixes, values), prefixes)
        return [old[block] for block, _ in blocks]

    def _header(self, fmt: str, attr: str) -> str:
        header = self._headers.get((fmt, attr))
        if header is None:
            header = self._headers[fmt, attr] = _text_of(fmt, _Given(_family(*_FAMILY_DEF[attr])))
        return header

    def _new_prefixes(self, fmt: str, attr: str, labels: list[tuple]) -> list[str]:
        """Samples' lines up to their values, as prometheus_client writes them (name,
        suffix, labels escaped): the samples rendered, their values cut off."""
        family = _family(*_FAMILY_DEF[attr])
        for lv in labels:
            family.add_metric(list(lv), {} if family.type == "info" else 0)
        body = _text_of(fmt, _Given(family))[len(self._header(fmt, attr)) :]
        return [line[: line.rindex(" ") + 1] for line in body.split("\n")[:-1]]

    def _family(self, fmt: str, attr: str, rows: list) -> str:
        """A CLOCKED family's text from its rows (every scrape)."""
        if not rows:
            return ""
        old = self._prefixes.get((fmt, attr), {})
        labels = [lv for lv, _ in rows]
        prefixes = {lv: old[lv] for lv in labels if lv in old}  # a module gone: dropped
        missing = [lv for lv in labels if lv not in prefixes]
        if missing:
            prefixes.update(zip(missing, self._new_prefixes(fmt, attr, missing), strict=True))
        self._prefixes[fmt, attr] = prefixes
        lines = [self._header(fmt, attr)]
        lines += [f"{prefixes[lv]}{value_text(v)}\n" for lv, v in rows]
        return "".join(lines)

    def _extra_text(self, fmt: str) -> str:
        """``extra``'s families (the process metrics) as prometheus_client writes them.
        Their values change every scrape, their names, labels and help do not: a family
        of the same shape as in the last scrape keeps its header and sample prefixes
        and gets its values written; any other is written by prometheus_client (and
        its header and prefixes kept if its text is header, then a line per sample
        ending in the value)."""
        old = self._extra_shapes.get(fmt, {})
        shapes, out = {}, []
        for family in self._extra.collect():
            samples = family.samples
            if any(v is not None for s in samples for v in s[3:]):  # timestamps, exemplars
                out.append(_text_of(fmt, _Given(family)))
                continue
            shape = (family.name, family.type, family.documentation, family.unit)
            shape += tuple((s.name, tuple(s.labels.items())) for s in samples)
            kept = old[shape] if shape in old else _text_shape(fmt, family)
            shapes[shape] = kept
            if kept is None:
                out.append(_text_of(fmt, _Given(family)))
                continue
            out.append(kept[0])
            out += [f"{p}{value_text(s.value)}\n" for p, s in zip(kept[1], samples, strict=True)]
        self._extra_shapes[fmt] = shapes
        return "".join(out)

    def cached_label_values(self) -> set:
        """Every label value a cached text or prefix holds (a test's view)."""
        out = set()
        for blocks, _, _ in self._family_texts.values():
            for block, _ in blocks:
                for lv in _labels_of(block):
                    out.update(lv)
        for prefixes in self._prefixes.values():
            for lv in prefixes:
                out.update(lv)
        return out


def _text_shape(fmt: str, family: Metric) -> tuple[str, list[str]] | None:
    """(header, sample prefixes) of prometheus_client's text of ``family``: the text
    is the header then one line per sample, the prefix and the value; else None."""
    samples = family.samples
    text = _text_of(fmt, _Given(family))
    lines = text.split("\n")[:-1]
    if len(lines) < len(samples):
        return None
    header = "".join(f"{line}\n" for line in lines[: len(lines) - len(samples)])
    prefixes = [
        line[: line.rindex(" ") + 1] for line in lines[len(lines) - len(samples) :] if " " in line
    ]
    if len(prefixes) != len(samples):
        return None
    values = [value_text(s.value) for s in samples]
    if header + "".join(f"{p}{v}\n" for p, v in zip(prefixes, values, strict=True)) != text:
        return None
    return header, prefixes
