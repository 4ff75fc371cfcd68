"""Loopback Prometheus stacks for tests and benchmarks: Debian's ``prometheus`` and
``modbridge run --sim``, each started on 127.0.0.1 in a directory of its own and
stopped again, every wait bounded.

* :class:`Prometheus`: a config text (and the rule files it names, written beside it)
  in ``workdir``, a free port, ``--storage.tsdb.path`` under ``workdir``; ready when
  ``/-/ready`` answers. :meth:`Prometheus.query`, :meth:`Prometheus.query_range`,
  :meth:`Prometheus.alerts`, :meth:`Prometheus.rules` go through the HTTP API.
* :class:`Bridge`: ``modbridge run --sim`` with its own ``--state-dir`` and event log,
  ``--metrics-port 0``; its port is read from the bridge's "metrics on" line.
* :class:`Deadline`: one budget for several waits; :class:`GaveUp` (an
  AssertionError, so pytest reports it as a failure) names what did not come.

Both classes are context managers, and :meth:`stop` is safe to call twice: SIGTERM
(the bridge restores its power limits), then SIGKILL after 10 s. Used by
tests/test_prometheus_integration.py, tests/test_prometheus_federation.py and
bench/bench_fleet.py (which puts tests/ on sys.path).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

PROMETHEUS = shutil.which("prometheus")
PROMETHEUS_MISSING = "prometheus not found: apt-get install prometheus"
READY_S = 15.0  # Prometheus answers /-/ready within a second or two here
BRIDGE_UP_S = 20.0  # `modbridge run --sim` prints its metrics line within ~2 s


class GaveUp(AssertionError):
    """A bounded wait ran out (or the process it waited on exited)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, name: str) -> None:
    """SIGTERM (the bridge restores its power limits), then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode is not None, f"{name} is still running"


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def wait(self, what: str, check, every: float = 0.5, proc=None, log=None):
        """Call ``check`` until it returns something true; raise GaveUp naming
        ``what`` when the budget runs out, or at once when ``proc`` has exited (with
        the end of ``log``)."""
        last = None
        while True:
            try:
                result = check()
            except (OSError, ValueError) as e:  # not up yet, a bad answer
                result, last = None, e
            if result:
                return result
            died = proc is not None and proc.poll() is not None
            if died or self.left() <= 0:
                tail = Path(log).read_text(errors="replace")[-3000:] if log else ""
                state = f"it exited with {proc.returncode}" if died else f"last error: {last}"
                raise GaveUp(f"gave up waiting for {what} ({state})\n{tail}")
            time.sleep(every)


def get(port: int, path: str, **params):
    """GET a JSON answer from 127.0.0.1:``port``."""
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def ready(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
        return r.status == 200


def query(port: int, expr: str, **params) -> list[dict]:
    """An instant query's result (``time=`` and the like in ``params``)."""
    body = get(port, "/api/v1/query", query=expr, **params)
    assert body["status"] == "success", body
    return body["data"]["result"]


def query_range(port: int, expr: str, start: float, end: float, step: float) -> list[dict]:
    body = get(port, "/api/v1/query_range", query=expr, start=start, end=end, step=step)
    assert body["status"] == "success", body
    return body["data"]["result"]


class Prometheus:
    """``prometheus`` on a free loopback port with ``config`` (YAML text) and
    ``files`` ({name: text}, the rule files it names) written to ``workdir``."""

    def __init__(self, workdir: Path, config: str, files: dict[str, str] | None = None,
                 name: str = "prometheus"):  # fmt: skip
        if PROMETHEUS is None:
            raise FileNotFoundError(PROMETHEUS_MISSING)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.config = self.workdir / f"{name}.yml"
        self.config.write_text(config)
        for fname, text in (files or {}).items():
            (self.workdir / fname).write_text(text)
        self.log = self.workdir / f"{name}.log"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        with open(self.log, "w") as logf:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.workdir / (self.name + '-tsdb')}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=logf, stderr=subprocess.STDOUT, cwd=self.workdir,
            )  # fmt: skip
        return self

    def wait_ready(self, deadline: Deadline | None = None) -> Prometheus:
        (deadline or Deadline(READY_S)).wait(
            f"{self.name} to be ready", lambda: ready(self.port), proc=self.proc, log=self.log
        )
        return self

    def query(self, expr: str, **params) -> list[dict]:
        return query(self.port, expr, **params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return query_range(self.port, expr, start, end, step)

    def alerts(self) -> list[dict]:
        return get(self.port, "/api/v1/alerts")["data"]["alerts"]

    def rules(self) -> list[dict]:
        return [r for g in get(self.port, "/api/v1/rules")["data"]["groups"] for r in g["rules"]]

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, self.name)

    def __enter__(self) -> Prometheus:
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


class Bridge:
    """``modbridge run --sim`` with ``args`` (``--sim-speed``, ``--sim-fault``, ...),
    its state dir, event log and stderr in ``workdir``; ``port`` once started."""

    def __init__(self, workdir: Path, *args: str, duration: float = 90.0):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.args = args
        self.duration = duration
        self.err = self.workdir / "bridge.err"
        self.events = self.workdir / "events.jsonl"
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    def start(self) -> Bridge:
        # the venv's bin (micropython for the virtual module) ahead of PATH
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        with open(self.err, "w") as errf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "modbridge", "run", "--sim", *self.args,
                 "--state-dir", str(self.workdir / "state"), "--metrics-port", "0",
                 "--status-every", "0", "--duration", str(self.duration),
                 "--event-log", str(self.events)],
                stdout=subprocess.DEVNULL, stderr=errf, cwd=self.workdir,
                env={**os.environ, "PATH": path},
            )  # fmt: skip
        return self

    def wait_up(self, deadline: Deadline | None = None) -> Bridge:
        found = (deadline or Deadline(BRIDGE_UP_S)).wait(
            "the bridge's metrics line",
            lambda: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics",
                              self.err.read_text()),
            proc=self.proc, log=self.err,
        )  # fmt: skip
        self.port = int(found.group(1))
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        """One scrape of /metrics (the Prometheus text format)."""
        with urllib.request.urlopen(f"http://{self.target}/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, "modbridge run --sim")

    def __enter__(self) -> Bridge:
        return self.start().wait_up()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- a fleet

REPO = Path(__file__).resolve().parent.parent
PROM_DIR = REPO / "packaging" / "prometheus"
FLEET_DIR = PROM_DIR / "fleet"
_FOR = re.compile(r"^(\s+for:) \S+$", re.M)


def shorten_for(rules: str, short: str) -> str:
    """``rules`` (an alert rule file's text) with every ``for:`` set to ``short``."""
    n_alerts = len(re.findall(r"^\s+- alert: ", rules, re.M))
    rules, n = _FOR.subn(rf"\1 {short}", rules)
    assert n == n_alerts, "every alert rule has a for: line to shorten"
    return rules


class FleetStack:
    """The loopback fleet of packaging/prometheus/fleet: per host a Prometheus made
    from host-prometheus.yml (external and target labels host/rack, ../alerts.yml and
    host_rules.yml) scraping that host's bridge, and a global Prometheus made from
    global-prometheus.yml federating them all (its match[] and honor_labels as
    shipped, one target per host Prometheus labelled host/rack) with fleet_rules.yml
    and fleet_alerts.yml. Intervals shortened to ``interval`` (the bridges' scrapes
    to ``scrape_interval``, one for all or {host: interval}, default ``interval``)
    and every ``for:`` to ``short_for``.

    ``hosts`` maps a host name to (rack, bridge target "127.0.0.1:port")."""

    def __init__(self, workdir: Path, hosts: dict[str, tuple[str, str]], *,
                 interval: str = "1s", scrape_interval: str | dict[str, str] | None = None,
                 short_for: str = "2s"):  # fmt: skip
        import yaml  # PyYAML: a dev dependency, only the fleet needs it

        self.workdir = Path(workdir)
        alerts = shorten_for((PROM_DIR / "alerts.yml").read_text(), short_for)
        host_rules = (FLEET_DIR / "host_rules.yml").read_text()
        self.hosts: dict[str, Prometheus] = {}
        self.racks = {host: rack for host, (rack, _t) in hosts.items()}
        for host, (rack, target) in hosts.items():
            doc = yaml.safe_load((FLEET_DIR / "host-prometheus.yml").read_text())
            labels = {"host": host, "rack": rack}
            doc["global"].update(scrape_interval=interval, evaluation_interval=interval,
                                 external_labels=labels)  # fmt: skip
            doc["rule_files"] = ["alerts.yml", "host_rules.yml"]
            [job] = doc["scrape_configs"]
            scrape = (scrape_interval.get(host) if isinstance(scrape_interval, dict)
                      else scrape_interval) or interval  # fmt: skip
            job.update(scrape_interval=scrape, scrape_timeout=scrape)
            job["static_configs"] = [{"targets": [target], "labels": labels}]
            self.hosts[host] = Prometheus(
                self.workdir / f"prom-{host}", yaml.safe_dump(doc),
                {"alerts.yml": alerts, "host_rules.yml": host_rules}, name=f"prom-{host}",
            )  # fmt: skip
        doc = yaml.safe_load((FLEET_DIR / "global-prometheus.yml").read_text())
        doc["global"].update(scrape_interval=interval, evaluation_interval=interval)
        [job] = doc["scrape_configs"]
        job.update(scrape_interval=interval, scrape_timeout=interval)
        job["static_configs"] = [
            {"targets": [f"127.0.0.1:{p.port}"], "labels": {"host": h, "rack": self.racks[h]}}
            for h, p in self.hosts.items()
        ]
        self.global_ = Prometheus(
            self.workdir / "prom-global", yaml.safe_dump(doc),
            {"fleet_rules.yml": (FLEET_DIR / "fleet_rules.yml").read_text(),
             "fleet_alerts.yml": shorten_for((FLEET_DIR / "fleet_alerts.yml").read_text(),
                                             short_for)},
            name="prom-global",
        )  # fmt: skip

    def all(self) -> list[Prometheus]:
        return [*self.hosts.values(), self.global_]

    def start(self, deadline: Deadline | None = None) -> FleetStack:
        deadline = deadline or Deadline(READY_S)
        try:
            for p in self.all():
                p.start()
            for p in self.all():
                p.wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for p in self.all():
            p.stop()

    def __enter__(self) -> FleetStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
