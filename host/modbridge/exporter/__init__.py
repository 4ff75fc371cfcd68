"""What the bridge tells the world: Prometheus metrics and the event log.

``prometheus.py`` is the metrics' front door (``serve``) and maps the modules a
scrape goes through (families, walk, render, collector, process, endpoint, server);
``eventlog.py`` is the event log.
"""
