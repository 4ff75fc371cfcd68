"""packaging/prometheus/fleet: host and fleet recording rules, fleet alerts, the host
and global (federation) Prometheus configs, and their promtool unit tests.

* promtool (Debian's ``prometheus`` package): ``check rules``, ``check config``,
  ``test rules fleet_test.yml``; then mutations: every alert with ``for: 0s`` and a
  list of hand-made breakages must each make fleet_test.yml fail (so the unit tests
  do check the blip, the threshold, the grouping and the host filter), and
  hypothesis-made fleets whose expected stalls and rack shares are computed here
  and compared with what promtool evaluates. Skipped with a message where promtool
  is missing (CI installs it).
* Without promtool: every metric and label in every rule and alert against the
  exporter's FAMILIES (check_expr of tests/test_packaging_monitoring.py), the
  host-level rules against the raw series, the fleet rules and alerts against what
  the global Prometheus federates (its match[]) and makes; the naming
  (level:metric:operations) and grouping per level; the fan-stall and throttled
  definitions identical to ModbridgeFanStalled's and ModbridgePowerLimitLowered's in
  alerts.yml; every alert's for/severity/summary/description/runbook; and that
  fleet_test.yml fires every alert for one host or rack of several, and checks it
  quiet.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_packaging_monitoring import (
    PROM,
    PROMTOOL_MISSING,
    REPO,
    PromQLError,
    alert_rules,
    check_expr,
    duration_s,
    known_metrics,
    promql_names,
)

FLEET = PROM / "fleet"
HOST_RULES = FLEET / "host_rules.yml"
FLEET_RULES = FLEET / "fleet_rules.yml"
FLEET_ALERTS = FLEET / "fleet_alerts.yml"
FLEET_TEST = FLEET / "fleet_test.yml"
HOST_CONFIG = FLEET / "host-prometheus.yml"
GLOBAL_CONFIG = FLEET / "global-prometheus.yml"
FLEET_DOC = REPO / "docs" / "fleet.md"
FLEET_LABELS = frozenset({"host", "rack"})
HOST_KEY = {"instance", "job", "host", "rack"}  # what a host-level series keeps
FEDERATE_JOB = "modbridge-federate"
RECORD_NAME = re.compile(r"^(host|gpu|rack|fleet):(modbridge_[a-z0-9_]+):([a-z0-9_]+)$")
REQUIRED_ALERTS = (
    "ModbridgeFleetFanStalled", "ModbridgeFleetGpusThrottled", "ModbridgeRackDegraded",
    "ModbridgeFleetHostMissing", "ModbridgeRackTimeToThresholdShort",
)  # fmt: skip


def load(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def rules_of(path: Path, kind: str) -> list[dict]:
    return [r for g in load(path)["groups"] for r in g["rules"] if kind in r]


def fleet_alerts() -> list[dict]:
    return rules_of(FLEET_ALERTS, "alert")


def promtool_path() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(PROMTOOL_MISSING)
    return path


def promtool(*args, cwd=FLEET, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run([promtool_path(), *args], cwd=cwd, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    if check:
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r


def squash(expr: str) -> str:
    return re.sub(r"\s+", " ", expr).strip()


# --------------------------------------------------------------------------- known names


def raw_known() -> dict:
    """The exporter's series as a host Prometheus has them: FAMILIES' labels plus
    host and rack (target labels where set)."""
    return {n: (None if labels is None else labels | FLEET_LABELS)
            for n, labels in known_metrics().items()}  # fmt: skip


def recorded(path: Path, known: dict) -> dict:
    """The series ``path``'s recording rules make, with the labels they can carry
    (each rule checked against ``known`` and the rules before it)."""
    out = {}
    for r in rules_of(path, "record"):
        labels = check_expr(r["expr"], {**known, **out})
        out[r["record"]] = frozenset(labels | set(r.get("labels", {})))
    return out


def federated_matchers() -> list[str]:
    [job] = [j for j in load(GLOBAL_CONFIG)["scrape_configs"] if j["job_name"] == FEDERATE_JOB]
    return job["params"]["match[]"]


def matched_by_federation(name: str, labels: dict[str, str]) -> bool:
    """True if a series ``name{labels}`` is selected by one of the global's match[]
    (the selectors used there: __name__ and label equality or regex matchers)."""
    for sel in federated_matchers():
        matchers = re.findall(r'(\w+)\s*(=~|=)\s*"([^"]*)"', sel)
        assert matchers, sel
        ok = True
        for label, op, value in matchers:
            have = name if label == "__name__" else labels.get(label, "")
            ok &= bool(re.fullmatch(value, have)) if op == "=~" else have == value
        if ok:
            return True
    return False


def global_known() -> dict:
    """What the global Prometheus has: the federated series (host_rules.yml's, the raw
    ones its match[] names, the hosts' ALERTS), `up` of its own jobs, and the rack
    and fleet series of fleet_rules.yml."""
    host = recorded(HOST_RULES, raw_known())
    known = {n: labels for n, labels in host.items() if matched_by_federation(n, {})}
    for name, labels in raw_known().items():
        if name.startswith("modbridge_") and matched_by_federation(name, {}):
            known[name] = labels
    known["up"] = FLEET_LABELS  # the federation job's targets carry host and rack
    known["ALERTS"] = None
    known.update(recorded(FLEET_RULES, known))
    return known


# --------------------------------------------------------------------------- promtool


def test_promtool_check_rules():
    for path, n in ((HOST_RULES, 11), (FLEET_RULES, 26), (FLEET_ALERTS, 7)):
        out = promtool("check", "rules", path.name).stdout
        assert f"SUCCESS: {n} rules found" in out, out


def test_promtool_check_configs():
    for path, files in ((HOST_CONFIG, 2), (GLOBAL_CONFIG, 2)):
        out = promtool("check", "config", path.name).stdout
        assert "is valid prometheus config file syntax" in out, out
        assert f"SUCCESS: {files} rule files found" in out, out


def test_promtool_test_rules():
    out = promtool("test", "rules", FLEET_TEST.name)
    assert "SUCCESS" in out.stdout + out.stderr


def _mutated_run(tmp_path: Path, path: Path, old: str, new: str, count: int = 1):
    """fleet_test.yml run against a copy of the fleet directory where ``path`` has
    ``old`` replaced by ``new`` (which must occur ``count`` times)."""
    shutil.copytree(PROM, tmp_path / "prometheus")
    copy = tmp_path / "prometheus" / "fleet" / path.name
    text = copy.read_text()
    assert text.count(old) == count, f"{old!r} occurs {text.count(old)} times in {path.name}"
    copy.write_text(text.replace(old, new))
    return promtool("test", "rules", FLEET_TEST.name, cwd=copy.parent, check=False)


@pytest.mark.parametrize("index", range(len(fleet_alerts())))
def test_every_alert_needs_its_for(tmp_path, index):
    """With ``for: 0s`` on one alert, a blip test of fleet_test.yml fails: each alert's
    `for:` is tested, not only its condition."""
    rule = fleet_alerts()[index]
    text = FLEET_ALERTS.read_text()
    fors = list(re.finditer(r"^(\s+for:) (\S+)$", text, re.M))
    assert len(fors) == len(fleet_alerts()), "one for: line per alert rule"
    m = fors[index]
    assert m.group(2) == rule["for"]
    shutil.copytree(PROM, tmp_path / "prometheus")
    copy = tmp_path / "prometheus" / "fleet" / FLEET_ALERTS.name
    copy.write_text(text[: m.start()] + f"{m.group(1)} 0s" + text[m.end() :])
    r = promtool("test", "rules", FLEET_TEST.name, cwd=copy.parent, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"{rule['alert']} {rule['labels']}: for: 0s passes the tests"
    failed = re.findall(r"name: (.+),", out)
    assert any(rule["alert"] in name for name in failed), failed


RPM, DUTY = "modbridge_module_fan_speed_rpm", "modbridge_module_fan_duty_ratio"
STALLED, RATIO = "host:modbridge_fans_stalled:count", "rack:modbridge_gpus_throttled:ratio"
MUTATIONS = [
    # a fan at 60 rpm and 50 % duty is a stall; one at 50 rpm and 20 % duty is not
    (HOST_RULES, f"{RPM} < 100", f"{RPM} < 50"),
    (HOST_RULES, f"{DUTY} >= 0.3", f"{DUTY} >= 0.1"),
    (HOST_RULES, 'fault=~"fan[12]_stall"} == 1', 'fault=~"fan[12]_stall"} == 2'),
    # the throttled comparison is strict: a GPU at its original limit is not throttled
    (HOST_RULES, "modbridge_policy_target_limit_watts\n            < on",
     "modbridge_policy_target_limit_watts\n            <= on"),
    # host rules keep host and rack
    (HOST_RULES, "max by (instance, job, host, rack) (modbridge_gpu_temperature_celsius)",
     "max by (instance, job) (modbridge_gpu_temperature_celsius)"),
    # a healthy host reads 0, not nothing
    (HOST_RULES, f"0 * count by (instance, job, host, rack) ({RPM})", "vector(0)"),
    # dcgm-exporter's label names
    (HOST_RULES, '"UUID", "$1", "gpu", "(.+)"', '"uuid", "$1", "gpu", "(.+)"'),
    (HOST_RULES, '"Hostname", "$1", "host", "(.+)"', '"hostname", "$1", "host", "(.+)"'),
    # rack rules group by rack, fleet rules by nothing
    (FLEET_RULES, f"expr: sum by (rack) ({STALLED})", f"expr: sum by (rack, host) ({STALLED})"),
    (FLEET_RULES, "(sum by (rack) (host:modbridge_gpus:count) > 0)",
     "(sum by (rack) (host:modbridge_modules:count) > 0)"),
    # thresholds: a host with no stalled fan, a rack at exactly 25 %, 2 hot hosts
    (FLEET_ALERTS, f"{STALLED} > 0", f"{STALLED} >= 0"),
    (FLEET_ALERTS, f"{RATIO} >= 0.25", f"{RATIO} > 0.25"),
    (FLEET_ALERTS, "rack:modbridge_hosts_hot:count >= 2", "rack:modbridge_hosts_hot:count >= 1"),
    (FLEET_ALERTS, "< 300", "< 100"),
    # series_gone stays quiet while federation_down explains it
    (FLEET_ALERTS, "host:modbridge_modules:count\n            unless on (host)\n"
     '          up{job="modbridge-federate"} == 0', "host:modbridge_modules:count"),
    # ... and only while the host was seen within the hour
    (FLEET_ALERTS, "[1h]", "[2h]"),
]  # fmt: skip


@pytest.mark.parametrize("path, old, new", MUTATIONS, ids=lambda v: getattr(v, "name", None))
def test_fleet_tests_catch_a_broken_rule(tmp_path, path, old, new):
    r = _mutated_run(tmp_path, path, old, new)
    assert r.returncode != 0, f"{path.name}: {old!r} -> {new!r} passes fleet_test.yml"
    assert "FAILED" in r.stdout + r.stderr


# --------------------------------------------------------------------------- hypothesis

_FAN = st.tuples(
    st.sampled_from([0, 50, 99, 100, 2400]),  # rpm
    st.sampled_from([0.2, 0.29, 0.3, 0.5, 1.0]),  # duty
    st.sampled_from([0, 1, None]),  # the module's stall bit (None: not exported)
)
_HOST = st.fixed_dictionaries(
    {
        "rack": st.sampled_from(["r1", "r2", "r3"]),
        "fans": st.lists(_FAN, min_size=1, max_size=4),
        "gpus": st.integers(1, 8),
        "throttled": st.integers(0, 8),
    }
)


def _fleet_case(hosts: list[dict]) -> dict:
    """A promtool test of the raw series of ``hosts`` (host-level rules, fleet rules
    and the two alerts whose answer is computed here)."""
    series, stalled, racks = [], {}, {}
    for h, host in enumerate(hosts):
        name, rack = f"h{h}", host["rack"]
        base = f'instance="{name}:9659",job="modbridge",host="{name}",rack="{rack}"'
        count = 0
        for f, (rpm, duty, bit) in enumerate(host["fans"]):
            fan = f'{base},module="m{f // 2}",fan="{f % 2 + 1}"'
            series.append((f"modbridge_module_fan_speed_rpm{{{fan}}}", rpm))
            series.append((f"modbridge_module_fan_duty_ratio{{{fan}}}", duty))
            if bit is not None:
                fault = f'{base},module="m{f // 2}",fault="fan{f % 2 + 1}_stall"'
                series.append((f"modbridge_module_fault{{{fault}}}", bit))
            count += bit == 1 or (rpm < 100 and duty >= 0.3)
        stalled[name] = (rack, count)
        throttled = min(host["throttled"], host["gpus"])
        for g in range(host["gpus"]):
            gpu = f'{base},gpu="GPU-{name}-{g}"'
            target = 490 if g < throttled else 700
            series.append((f"modbridge_gpu_power_limit_original_watts{{{gpu}}}", 700))
            series.append((f"modbridge_gpu_up{{{gpu}}}", 1))
            pair = f'{base},module="m{g}",gpu="GPU-{name}-{g}"'
            series.append((f"modbridge_policy_target_limit_watts{{{pair}}}", target))
        t, n = racks.get(rack, (0, 0))
        racks[rack] = (t + throttled, n + host["gpus"])
    fan_alerts = [
        {"labels": f'ALERTS{{alertname="ModbridgeFleetFanStalled",alertstate="firing",'
                   f'severity="critical",instance="{h}:9659",job="modbridge",host="{h}",'
                   f'rack="{rack}"}}', "value": 1}
        for h, (rack, count) in stalled.items() if count > 0
    ]  # fmt: skip
    share_alerts = [
        {"labels": f'ALERTS{{alertname="ModbridgeRackDegraded",alertstate="firing",'
                   f'severity="warning",cause="throttled_share",rack="{rack}"}}', "value": 1}
        for rack, (t, n) in racks.items() if t / n >= 0.25
    ]  # fmt: skip
    return {
        "rule_files": [HOST_RULES.name, FLEET_RULES.name, FLEET_ALERTS.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "hypothesis fleet",
                "interval": "1m",
                "input_series": [{"series": s, "values": f"{v}x20"} for s, v in series],
                "promql_expr_test": [
                    {
                        "expr": "host:modbridge_fans_stalled:count",
                        "eval_time": "15m",
                        "exp_samples": [
                            {
                                "labels": f'host:modbridge_fans_stalled:count{{instance="{h}:9659",'
                                f'job="modbridge",host="{h}",rack="{rack}"}}',
                                "value": count,
                            }
                            for h, (rack, count) in stalled.items()
                        ],
                    },
                    {
                        "expr": "rack:modbridge_gpus_throttled:ratio",
                        "eval_time": "15m",
                        "exp_samples": [
                            {
                                "labels": f'rack:modbridge_gpus_throttled:ratio{{rack="{rack}"}}',
                                "value": t / n,
                            }
                            for rack, (t, n) in racks.items()
                        ],
                    },
                    {
                        "expr": 'ALERTS{alertstate="firing",alertname="ModbridgeFleetFanStalled"}',
                        "eval_time": "15m",
                        "exp_samples": fan_alerts,
                    },
                    {
                        "expr": 'ALERTS{alertstate="firing",alertname="ModbridgeRackDegraded"}',
                        "eval_time": "15m",
                        "exp_samples": share_alerts,
                    },
                ],  # fmt: skip
            }
        ],
    }


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_HOST, min_size=1, max_size=5))
def test_random_fleets_stall_and_share_as_computed(tmp_path, hosts):
    """For any fleet: each host's stalled-fan count is the ModbridgeFanStalled
    definition counted here, each rack's throttled share is sum/sum, and the fleet
    fan-stall and rack-share alerts fire for exactly the hosts and racks computed."""
    promtool_path()
    work = tmp_path / "case"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    for path in (HOST_RULES, FLEET_RULES, FLEET_ALERTS):
        shutil.copy(path, work)
    (work / "case_test.yml").write_text(yaml.safe_dump(_fleet_case(hosts), sort_keys=False))
    r = promtool("test", "rules", "case_test.yml", cwd=work, check=False)
    assert r.returncode == 0, f"{hosts}\n{r.stdout}\n{r.stderr}"


# --------------------------------------------------------------------------- names


def test_host_rules_name_only_exported_metrics_and_labels():
    known = raw_known()
    out = recorded(HOST_RULES, known)  # raises PromQLError on an unknown name
    assert set(out) == {r["record"] for r in rules_of(HOST_RULES, "record")}


def test_fleet_rules_and_alerts_read_only_what_the_global_has():
    """The rack/fleet rules and the fleet alerts read federated series (the global's
    match[] selects them), `up` of the federation job and their own rack/fleet series:
    a rule that reads a raw per-fan series would find nothing at the global."""
    known = global_known()
    for r in rules_of(FLEET_RULES, "record"):
        for name, _labels in promql_names(r["expr"])[0]:
            assert name.startswith("host:"), f"{r['record']} reads {name}, not a host series"
    for r in fleet_alerts():
        try:
            available = check_expr(r["expr"], known)
        except PromQLError as e:
            pytest.fail(f"{r['alert']}: {e}")
        for name, _labels in promql_names(r["expr"])[0]:
            if name == "up":
                assert f'job="{FEDERATE_JOB}"' in r["expr"], r["alert"]
        for text in r["annotations"].values():
            for label in re.findall(r"\$labels\.(\w+)", text):
                assert label in available, f"{r['alert']}: $labels.{label}"


def test_check_expr_refuses_what_the_global_does_not_have():
    known = global_known()
    with pytest.raises(PromQLError, match="not an exported metric"):
        check_expr("modbridge_module_fan_speed_rpm > 0", known)  # not federated
    with pytest.raises(PromQLError, match="grouping by"):
        check_expr("max by (module) (host:modbridge_gpu_temperature_celsius:max)", known)


def test_federation_matches_every_host_series_and_the_alerts():
    for r in rules_of(HOST_RULES, "record"):
        assert matched_by_federation(r["record"], {}), f"{r['record']} is not federated"
    assert matched_by_federation("ALERTS", {"alertname": "ModbridgeFanStalled"})
    assert matched_by_federation("up", {"job": "modbridge"})
    assert matched_by_federation("modbridge_gpu_temperature_celsius", {})
    # and not the per-fan, per-channel raw series, nor other jobs' ALERTS
    for name in ("modbridge_module_fan_speed_rpm", "modbridge_module_temperature_celsius",
                 "modbridge_module_events_total", "process_cpu_seconds_total"):  # fmt: skip
        assert not matched_by_federation(name, {}), name
    assert not matched_by_federation("ALERTS", {"alertname": "NodeDown"})
    assert not matched_by_federation("up", {"job": "node"})


def test_record_names_and_grouping_per_level():
    """level:metric:operations; host rules keep exactly instance, job, host and rack
    (module, fan, gpu and channel aggregated away), rack rules group by rack, fleet
    rules by nothing."""
    for path, levels in ((HOST_RULES, {"host", "gpu"}), (FLEET_RULES, {"rack", "fleet"})):
        for r in rules_of(path, "record"):
            m = RECORD_NAME.match(r["record"])
            assert m, f"{r['record']}: not level:modbridge_metric:operations"
            level = m.group(1)
            assert level in levels, f"{r['record']} in {path.name}"
            grouping = _outer_groupings(r["expr"])
            if level == "host":
                assert grouping and all(g == HOST_KEY for g in grouping), (r["record"], grouping)
            elif level == "rack":
                assert grouping and all(g == {"rack"} for g in grouping), (r["record"], grouping)
            elif level == "fleet":
                assert all(g == set() for g in grouping), (r["record"], grouping)
    names = [r["record"] for p in (HOST_RULES, FLEET_RULES) for r in rules_of(p, "record")]
    assert len(names) == len(set(names)), "a series recorded twice"
    # each host series has its rack and its fleet series (the `gpu:` one is per GPU)
    host = {RECORD_NAME.match(n).group(2) for n in names if n.startswith("host:")}
    for level in ("rack", "fleet"):
        have = {RECORD_NAME.match(n).group(2) for n in names if n.startswith(level + ":")}
        assert host <= have, f"no {level} series for {sorted(host - have)}"


def _outer_groupings(expr: str) -> list[set[str]]:
    """The label sets of the aggregations at the top of each `or`/`/` operand:
    ``agg by (a, b) (...)`` -> {a, b}; ``agg (...)`` -> set()."""
    out = []
    agg = r"(?:^|\bor\b|/|\*)\s*(?:\(\s*)?(sum|max|min|count|avg)\s*(by\s*\(([^)]*)\))?\s*\("
    for m in re.finditer(agg, expr):
        depth = expr[: m.start()].count("(") - expr[: m.start()].count(")")
        if depth <= 1:
            out.append({x.strip() for x in (m.group(3) or "").split(",") if x.strip()})
    return out


def test_fan_stall_and_throttled_are_the_host_alerts_definitions():
    """host:modbridge_fans_stalled:count counts exactly what ModbridgeFanStalled
    fires on, host:modbridge_gpus_throttled:count what ModbridgePowerLimitLowered does."""
    alerts = {r["alert"]: r["expr"] for r in alert_rules()}
    host = {r["record"]: r["expr"] for r in rules_of(HOST_RULES, "record")}
    for record, alert in (
        ("host:modbridge_fans_stalled:count", "ModbridgeFanStalled"),
        ("host:modbridge_gpus_throttled:count", "ModbridgePowerLimitLowered"),
    ):
        inner = squash(alerts[alert])
        assert f"count by (instance, job, host, rack) ( {inner} )" in squash(host[record]), record


def test_dcgm_series_has_dcgm_label_names():
    [rule] = [r for r in rules_of(HOST_RULES, "record") if r["record"].startswith("gpu:")]
    _sel, _grouping, made = promql_names(rule["expr"])
    assert {"UUID", "Hostname"} <= made
    assert '"gpu", "", "", ""' in rule["expr"], "our gpu (a UUID) would clash with dcgm's index"


# --------------------------------------------------------------------------- alerts


def test_alerts_have_for_severity_annotations_and_runbook():
    rules = fleet_alerts()
    assert set(REQUIRED_ALERTS) <= {r["alert"] for r in rules}
    seen = set()
    for r in rules:
        name = r["alert"]
        assert name.startswith("Modbridge"), name  # the global federates Modbridge.* ALERTS
        assert duration_s(r["for"]) >= 60, f"{name}: a fleet page waits at least a minute"
        assert r["labels"]["severity"] in ("warning", "critical"), name
        key = (name, tuple(sorted(r["labels"].items())))
        assert key not in seen, f"{name}: two rules with the same labels"
        seen.add(key)
        if sum(x["alert"] == name for x in rules) > 1:
            assert "cause" in r["labels"], f"{name}: several rules, tell them apart by cause"
        ann = r["annotations"]
        assert {"summary", "description", "runbook"} <= set(ann), name
        assert re.search(r"\$labels\.(host|rack)", ann["summary"]), name
        assert re.search(r"\$labels\.(host|rack)", ann["description"]), name
        assert "$value" in ann["description"] or "$labels.instance" in ann["description"], name
        assert "docs/fleet.md#fleet-alerts" in ann["runbook"], name


def test_fleet_alerts_last_longer_than_the_host_alerts_they_follow():
    host_for = {r["alert"]: duration_s(r["for"]) for r in alert_rules()}
    fleet_for = {r["alert"]: duration_s(r["for"]) for r in fleet_alerts()}
    assert fleet_for["ModbridgeFleetFanStalled"] > host_for["ModbridgeFanStalled"]
    assert fleet_for["ModbridgeFleetGpusThrottled"] > host_for["ModbridgePowerLimitLowered"]


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_runbook_anchors_exist():
    if not FLEET_DOC.exists():
        pytest.skip("docs/fleet.md is not written yet (issue 13, item 4)")
    headings = re.findall(r"^#+ (.+)$", FLEET_DOC.read_text(encoding="utf-8"), re.M)
    anchors = {_slug(h) for h in headings}
    for r in fleet_alerts():
        for doc, anchor in re.findall(r"(docs/[\w-]+\.md)#([\w-]+)", r["annotations"]["runbook"]):
            assert (REPO / doc).is_file(), doc
            if doc == "docs/fleet.md":
                assert anchor in anchors, f"{r['alert']}: docs/fleet.md#{anchor}"


def _hosts_and_racks(test: dict) -> tuple[set, set]:
    hosts, racks = set(), set()
    for s in test["input_series"]:
        labels = dict(re.findall(r'\b(\w+)="([^"]*)"', s["series"]))
        hosts.add(labels.get("host") or labels.get("instance"))  # a host without labels
        racks.add(labels.get("rack"))
    return hosts, racks


def test_every_alert_fires_for_one_of_several_and_stays_quiet():
    """fleet_test.yml, per alert rule (name and cause): a case where it fires, among
    inputs with more hosts (or racks) than it fires for, and a case where it does not."""
    doc = load(FLEET_TEST)
    assert doc["rule_files"] == [HOST_RULES.name, FLEET_RULES.name, FLEET_ALERTS.name]
    rules = {(r["alert"], r["labels"].get("cause")): r for r in fleet_alerts()}
    fires, quiet = set(), set()
    for test in doc["tests"]:
        hosts, racks = _hosts_and_racks(test)
        for case in test.get("alert_rule_test", []):
            name = case["alertname"]
            causes = {c for n, c in rules if n == name}
            assert causes, f"{test['name']}: unknown alert {name}"
            if not case["exp_alerts"]:
                quiet |= {(name, c) for c in causes}
                continue
            for alert in case["exp_alerts"]:
                labels = alert["exp_labels"]
                key = (name, labels.get("cause"))
                assert key in rules, f"{test['name']}: {key}"
                assert labels["severity"] == rules[key]["labels"]["severity"]
                assert set(alert["exp_annotations"]) == set(rules[key]["annotations"])
                fired_hosts = {a["exp_labels"].get("host") or a["exp_labels"].get("instance")
                               for a in case["exp_alerts"]}  # fmt: skip
                fired_racks = {a["exp_labels"].get("rack") for a in case["exp_alerts"]}
                per_host = fired_hosts != {None}
                assert (hosts - fired_hosts) if per_host else (racks - fired_racks), (
                    f"{test['name']}: {name} is not tested against a healthy host or rack"
                )
                fires.add(key)
    assert fires == set(rules), f"never fired: {set(rules) - fires}"
    assert quiet == set(rules), f"never checked quiet: {set(rules) - quiet}"


# --------------------------------------------------------------------------- configs


def test_host_config_labels_and_rules():
    doc = load(HOST_CONFIG)
    external = doc["global"]["external_labels"]
    assert set(external) == FLEET_LABELS
    [job] = [j for j in doc["scrape_configs"] if j["job_name"] == "modbridge"]
    [static] = job["static_configs"]
    assert static["labels"] == external, "target labels and external labels must agree"
    assert static["targets"] == ["127.0.0.1:9659"]
    assert doc["rule_files"] == ["../alerts.yml", HOST_RULES.name]


def test_global_config_federates_with_honor_labels():
    doc = load(GLOBAL_CONFIG)
    [job] = [j for j in doc["scrape_configs"] if j["job_name"] == FEDERATE_JOB]
    assert job["metrics_path"] == "/federate"
    assert job["honor_labels"] is True, "else the hosts' job/instance become exported_*"
    assert duration_s(job["scrape_timeout"]) < duration_s(job["scrape_interval"])
    for static in job["static_configs"]:
        assert set(static["labels"]) == FLEET_LABELS, "up{job=...} must name host and rack"
    hosts = [s["labels"]["host"] for s in job["static_configs"]]
    assert len(hosts) == len(set(hosts))
    assert doc["rule_files"] == [FLEET_RULES.name, FLEET_ALERTS.name]


def test_readme_names_every_file_rule_and_alert():
    text = (FLEET / "README.md").read_text(encoding="utf-8")
    for path in FLEET.iterdir():
        if path.name != "README.md":
            assert f"`{path.name}`" in text, path.name
    for r in rules_of(HOST_RULES, "record"):
        assert f"`{r['record']}`" in text, r["record"]
    for r in fleet_alerts():
        assert f"`{r['alert']}`" in text, r["alert"]
        assert f"| {r['for']}" in text or f"/ {r['for']}" in text, (r["alert"], r["for"])
