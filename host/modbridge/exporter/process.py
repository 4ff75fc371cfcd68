"""The process metrics: ``process_*`` as prometheus_client's ProcessCollector writes
them, for a fraction of its cost per scrape, and ``python_info``.

:func:`_add_process_collectors` puts :class:`_ProcessMetrics` and prometheus_client's
PlatformCollector (``python_info``) in a registry. The endpoint's Renderer writes
that registry after the bridge's families (its ``extra``: endpoint.py), and
collector.py's ``make_registry`` registers them beside the BridgeCollector.
"""

from __future__ import annotations

import os

try:
    import resource
except ImportError:  # not Unix: prometheus_client's ProcessCollector (which has no /proc)
    resource = None

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector


def _add_process_collectors(reg: CollectorRegistry) -> CollectorRegistry:
    reg.register(_ProcessMetrics())
    PlatformCollector(registry=reg)
    return reg


class _ProcessMetrics:
    """prometheus_client's ProcessCollector (the same ``process_*`` families, help
    and values) for a cost per scrape a fraction of its own. It reads
    /proc/self/stat and /proc/self/limits and lists /proc/self/fd at every scrape;
    here the start time (constant) is its own, read once, and a scrape reads the
    small /proc/self/statm (the same page counts as stat's vsize and rss), asks the
    kernel for CPU times (``os.times``: the same clock ticks as stat's utime and
    stime) and the open-file limit (``getrlimit``: the soft limit, which limits
    shows), and lists /proc/self/fd as it does. Where /proc cannot be read it is
    ProcessCollector itself."""

    def __init__(self):
        self._fallback = ProcessCollector(registry=None)
        self._start = None
        self._pagesize = resource.getpagesize() if resource else 4096
        try:
            first = {m.name: m for m in self._fallback.collect()}
            self._start = first["process_start_time_seconds"].samples[0].value
            self._read_statm()
        except (OSError, KeyError, IndexError, ValueError):
            self._start = None

    @staticmethod
    def _read_statm() -> list[bytes]:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            return os.read(fd, 256).split()
        finally:
            os.close(fd)

    def collect(self) -> list[Metric]:
        if self._start is None or resource is None:
            return self._fallback.collect()
        try:
            pages = self._read_statm()
            open_fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            return self._fallback.collect()
        t = os.times()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return [
            GaugeMetricFamily(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                value=float(int(pages[0]) * self._pagesize),
            ),
            GaugeMetricFamily(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                value=float(pages[1]) * self._pagesize,
            ),
            GaugeMetricFamily(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                value=self._start,
            ),
            CounterMetricFamily(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                value=t.user + t.system,
            ),
            GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", open_fds),
            GaugeMetricFamily(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                value=float("inf") if soft == resource.RLIM_INFINITY else float(soft),
            ),
        ]
