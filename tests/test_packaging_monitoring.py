"""packaging/grafana and packaging/prometheus: the dashboard, the alert rules and their
provisioning and scrape configs.

* promtool (Debian's ``prometheus`` package): ``check rules``, ``test rules`` (the
  unit tests in alerts_test.yml), ``check config``, and every dashboard query parsed
  as PromQL; skipped with a message where promtool is missing.
* Without promtool: the dashboard's JSON (uid, variables, grid, data sources, units,
  the panels the issue asks for) and every metric and label name in every query of
  the dashboard and the rules, against the exporter's ``FAMILIES`` and
  docs/metrics.md; the provisioning YAML's fields.

PyYAML is not a dependency: :func:`parse_yaml` reads the block-style subset these
files are written in (and refuses what it does not know, so a file that grows past
it fails loudly here rather than being half read).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from modbridge.exporter.families import FAMILIES
from modbridge.exporter.server import DEFAULT_PORT

REPO = Path(__file__).resolve().parent.parent
PACKAGING = REPO / "packaging"
PROM = PACKAGING / "prometheus"
GRAFANA = PACKAGING / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "modbridge.json"
ALERTS = PROM / "alerts.yml"
ALERTS_TEST = PROM / "alerts_test.yml"
PROM_CONFIG = PROM / "prometheus.yml"
PROVISION_DASHBOARDS = GRAFANA / "provisioning" / "dashboards" / "modbridge.yaml"
PROVISION_DATASOURCE = GRAFANA / "provisioning" / "datasources" / "prometheus.yaml"
METRICS_DOC = REPO / "docs" / "metrics.md"

PROMTOOL_MISSING = "promtool not found: apt-get install prometheus"
REQUIRED_ALERTS = (
    "ModbridgeFanStalled", "ModbridgeOverTemperature", "ModbridgeUnderVoltage",
    "ModbridgeModuleDown", "ModbridgePowerLimitLowered", "ModbridgeSensorDisagreement",
    "ModbridgeTimeToThresholdShort", "ModbridgeExporterStale",
)  # fmt: skip
TARGET_LABELS = frozenset({"instance", "job"})  # what Prometheus adds to every series


# --------------------------------------------------------------------------- YAML


class YamlSubsetError(ValueError):
    """A line this subset of YAML does not read (with its 1-based line number)."""


_KEY = re.compile(r"^([A-Za-z_][\w.-]*|\"[^\"]*\"|'[^']*'):(?:\s+(.*))?$")
_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][-+]?\d+)$")


def _strip_comment(text: str) -> str:
    """``text`` without a trailing ``# comment`` (a # outside quotes, after a space)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and (i == 0 or text[i - 1] in " [{,:"):
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text.rstrip()


def _split_flow(body: str, lineno: int) -> list[str]:
    parts, depth, quote, cur = [], 0, None, ""
    for ch in body:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if quote or depth:
        raise YamlSubsetError(f"line {lineno}: unbalanced flow collection: {body!r}")
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _scalar(text: str, lineno: int):
    """A flow value: quoted or plain scalar, ``[...]`` or ``{...}``."""
    if text.startswith("["):
        if not text.endswith("]"):
            raise YamlSubsetError(f"line {lineno}: unclosed [: {text!r}")
        return [_scalar(p, lineno) for p in _split_flow(text[1:-1], lineno)]
    if text.startswith("{"):
        if not text.endswith("}"):
            raise YamlSubsetError(f"line {lineno}: unclosed {{: {text!r}")
        out = {}
        for part in _split_flow(text[1:-1], lineno):
            m = _KEY.match(part)
            if not m:
                raise YamlSubsetError(f"line {lineno}: not a key: value pair: {part!r}")
            out[_scalar(m.group(1), lineno)] = _scalar(m.group(2) or "", lineno)
        return out
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"'):
            raise YamlSubsetError(f"line {lineno}: unclosed double quote: {text!r}")
        return json.loads(text)
    if text.startswith("'"):
        if len(text) < 2 or not text.endswith("'"):
            raise YamlSubsetError(f"line {lineno}: unclosed single quote: {text!r}")
        return text[1:-1].replace("''", "'")
    if text.startswith(("&", "*", "!", "|", ">", "%", "@", "`")):
        raise YamlSubsetError(f"line {lineno}: unsupported YAML syntax: {text!r}")
    if text in ("", "~", "null"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def parse_yaml(text: str):
    """Block mappings and sequences, plain/quoted scalars, one-line flow collections,
    ``|``/``|-``/``>``/``>-`` block scalars, comments. Anything else raises
    :class:`YamlSubsetError` naming the line."""
    raw = text.split("\n")
    lines = []  # (indent, content, lineno, index into raw)
    for n, line in enumerate(raw):
        body = line.lstrip(" ")
        if body.startswith("\t"):
            raise YamlSubsetError(f"line {n + 1}: a tab in the indentation")
        content = _strip_comment(body)
        if content and content not in ("---",):
            lines.append((len(line) - len(body), content, n + 1, n))
    pos = 0

    def block_scalar(style: str, after: int, parent_indent: int, lineno: int) -> str:
        nonlocal pos
        body, indent = [], None
        n = after + 1
        while n < len(raw):
            line = raw[n]
            if line.strip():
                ind = len(line) - len(line.lstrip(" "))
                if ind <= parent_indent:
                    break
                indent = ind if indent is None else indent
                if ind < indent:
                    raise YamlSubsetError(f"line {n + 1}: block scalar less indented")
                body.append(line[indent:])
            else:
                body.append("")
            n += 1
        if indent is None:
            raise YamlSubsetError(f"line {lineno}: empty block scalar")
        while body and not body[-1]:
            body.pop()
        while pos < len(lines) and lines[pos][3] < n:
            pos += 1  # the scalar's lines are not mapping lines
        if style[0] == "|":
            out = "\n".join(body)
        else:  # folded: lines joined with spaces, blank lines kept as newlines
            out = re.sub(r"(?<!\n)\n(?!\n)", " ", "\n".join(body))
        return out if style.endswith("-") else out + "\n"

    def value(rest: str | None, indent: int, lineno: int, index: int):
        nonlocal pos
        if rest in ("|", "|-", ">", ">-"):
            return block_scalar(rest, index, indent, lineno)
        if rest:
            return _scalar(rest, lineno)
        if pos < len(lines) and (
            lines[pos][0] > indent or (lines[pos][0] == indent and lines[pos][1][0] == "-")
        ):
            return node(lines[pos][0])
        return None

    def node(indent: int):
        nonlocal pos
        is_seq = lines[pos][1] == "-" or lines[pos][1].startswith("- ")
        out: list | dict = [] if is_seq else {}
        while pos < len(lines):
            ind, content, lineno, index = lines[pos]
            if ind < indent:
                break
            if ind > indent:
                raise YamlSubsetError(f"line {lineno}: unexpected indentation")
            if is_seq:
                if not (content == "-" or content.startswith("- ")):
                    break
                item = content[2:].lstrip() if content != "-" else ""
                if not item:
                    pos += 1
                    out.append(value(None, indent, lineno, index))
                elif (
                    item == "-"
                    or item.startswith("- ")
                    or (_KEY.match(item) and not item.startswith(("[", "{", '"', "'")))
                ):
                    # "- key: v" or "- - v": a node whose first line starts after the dash
                    lines[pos] = (indent + 2 + (len(content) - 2 - len(item)), item,
                                  lineno, index)  # fmt: skip
                    out.append(node(lines[pos][0]))
                else:
                    pos += 1
                    out.append(_scalar(item, lineno))
            else:
                if content.startswith("- "):
                    break
                m = _KEY.match(content)
                if not m:
                    raise YamlSubsetError(f"line {lineno}: not a key: value line: {content!r}")
                key = _scalar(m.group(1), lineno)
                if key in out:
                    raise YamlSubsetError(f"line {lineno}: duplicate key {key!r}")
                pos += 1
                out[key] = value(m.group(2), indent, lineno, index)
        return out

    if not lines:
        return None
    result = node(lines[0][0])
    if pos != len(lines):
        raise YamlSubsetError(f"line {lines[pos][2]}: unexpected indentation")
    return result


def load_yaml(path: Path):
    return parse_yaml(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- metrics


def known_metrics() -> dict[str, frozenset[str]]:
    """Exported metric name -> its labels: the exporter's FAMILIES (counters with
    ``_total``, infos with ``_info``), prometheus_client's process metrics (docs/
    metrics.md "Endpoint"), and what Prometheus itself makes (``up``, ``ALERTS``)."""
    out = {}
    for _attr, typ, name, labels, _doc in FAMILIES:
        suffix = {"counter": "_total", "info": "_info"}.get(typ, "")
        out[name + suffix] = frozenset(labels)
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    for fam in reg.collect():
        for sample in fam.samples:
            out[sample.name] = frozenset(sample.labels)
    out["up"] = frozenset()
    out["ALERTS"] = None  # the alert's own labels: any
    return out


def documented_metrics() -> set[str]:
    """The metric names in docs/metrics.md's tables."""
    text = METRICS_DOC.read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(modbridge_[a-z0-9_]+)` \|", text, re.M))


# --------------------------------------------------------------------------- PromQL

PROMQL_FUNCTIONS = frozenset(
    """abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min
    count_over_time day_of_month day_of_week days_in_month delta deriv exp floor
    histogram_quantile holt_winters hour idelta increase irate label_join label_replace
    last_over_time ln log2 log10 max_over_time min_over_time minute month
    predict_linear present_over_time quantile_over_time rate resets round scalar sgn sort
    sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time time timestamp vector
    year""".split()
)
PROMQL_AGGREGATIONS = frozenset(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile".split()
)
PROMQL_GROUPING = frozenset("by without on ignoring group_left group_right".split())
PROMQL_WORDS = frozenset("and or unless bool offset inf nan".split())
GRAFANA_VARS = re.compile(r"\$\{?(__rate_interval|__interval|__range)\}?|\$\{?([A-Za-z]\w*)\}?")

_TOKEN = re.compile(
    r"""\s+|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:ms|s|m|h|d|w|y)?(?:\d+(?:ms|s|m|h|d|w|y))*)
    |(?P<ident>[A-Za-z_:][\w:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){}\[\],:@])""",
    re.X,
)


class PromQLError(ValueError):
    """An expression this checker cannot read, or one that names what is not exported."""


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus would accept."""
    return GRAFANA_VARS.sub(lambda m: "5m" if m.group(1) else "x", expr)


def promql_names(expr: str):
    """(selectors, grouping labels, label-making calls) of a PromQL expression:
    selectors as (metric, {label names}); grouping labels from by/without/on/ignoring/
    group_left/group_right; labels created by label_replace/label_join."""
    tokens, i = [], 0
    while i < len(expr):
        m = _TOKEN.match(expr, i)
        if not m:
            raise PromQLError(f"cannot read {expr[i : i + 20]!r} in {expr!r}")
        i = m.end()
        if m.lastgroup:
            tokens.append((m.lastgroup, m.group(m.lastgroup)))
    selectors, grouping, made = [], set(), set()
    depth = {"(": 0, "[": 0}
    k = 0
    while k < len(tokens):
        kind, text = tokens[k]
        nxt = tokens[k + 1][1] if k + 1 < len(tokens) else None
        if kind == "op":
            if text in "([":
                depth[text] += 1
            elif text in ")]":
                depth["(" if text == ")" else "["] -= 1
                if min(depth.values()) < 0:
                    raise PromQLError(f"unbalanced {text!r} in {expr!r}")
            elif text == "{":
                raise PromQLError(f"a selector without a metric name in {expr!r}")
            elif text == "}":
                raise PromQLError(f"unbalanced '}}' in {expr!r}")
            k += 1
            continue
        if kind != "ident" or depth["["]:
            k += 1
            continue
        if text in PROMQL_GROUPING:
            k += 1
            if k < len(tokens) and tokens[k][1] == "(":
                k += 1
                while k < len(tokens) and tokens[k][1] != ")":
                    if tokens[k][0] == "ident":
                        grouping.add(tokens[k][1])
                    k += 1
                k += 1
            continue
        if text in PROMQL_WORDS:
            k += 1
            continue
        if nxt == "(":
            if text not in PROMQL_FUNCTIONS | PROMQL_AGGREGATIONS:
                raise PromQLError(f"unknown function {text!r} in {expr!r}")
            if text in ("label_replace", "label_join"):
                made.add(_first_argument_string(tokens, k + 1)[1:-1])
            k += 1
            continue
        if text in PROMQL_AGGREGATIONS:  # "sum by (...) (...)": by comes next
            k += 1
            continue
        labels = set()
        k += 1
        if k < len(tokens) and tokens[k][1] == "{":
            k += 1
            while k < len(tokens) and tokens[k][1] != "}":
                if tokens[k][0] == "ident":
                    labels.add(tokens[k][1])
                    if k + 1 >= len(tokens) or tokens[k + 1][1] not in ("=", "!=", "=~", "!~"):
                        raise PromQLError(f"a label matcher without an operator in {expr!r}")
                k += 1
            if k >= len(tokens):
                raise PromQLError(f"unclosed '{{' in {expr!r}")
            k += 1
        selectors.append((text, labels))
    if depth["("] or depth["["]:
        raise PromQLError(f"unbalanced brackets in {expr!r}")
    return selectors, grouping, made


def _first_argument_string(tokens, start: int) -> str:
    """The first string argument of the call whose "(" is tokens[start] (not one
    inside a selector's braces or a nested call): label_replace's new label."""
    parens = braces = 0
    for kind, text in tokens[start:]:
        if text == "(":
            parens += 1
        elif text == ")":
            parens -= 1
            if not parens:
                break
        elif text in "{}":
            braces += 1 if text == "{" else -1
        elif kind == "str" and parens == 1 and not braces:
            return text
    raise PromQLError("label_replace/label_join without a label argument")


def check_expr(expr: str, known: dict) -> set[str]:
    """Raise PromQLError unless every metric and label in ``expr`` is exported;
    return the labels its series can carry (for legend checks)."""
    selectors, grouping, made = promql_names(grafana_to_promql(expr))
    if not selectors:
        raise PromQLError(f"no metric in {expr!r}")
    available = set(TARGET_LABELS) | made
    for metric, labels in selectors:
        if metric not in known:
            raise PromQLError(f"{metric!r} is not an exported metric (in {expr!r})")
        own = known[metric]
        if own is None:
            available |= labels
            continue
        unknown = labels - own - TARGET_LABELS
        if unknown:
            raise PromQLError(f"{metric!r} has no label {sorted(unknown)} (in {expr!r})")
        available |= own
    bad = grouping - available
    if bad:
        raise PromQLError(f"grouping by {sorted(bad)}, which no series here has ({expr!r})")
    return available


# --------------------------------------------------------------------------- helpers


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(PROMTOOL_MISSING)
    return path


def run_promtool(*args, cwd=PROM):
    r = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def dashboard():
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def all_panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs(dash):
    """(where, expr) for every query of the dashboard's panels and annotations (the
    variables' label_values queries are checked on their own)."""
    for p in all_panels(dash):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t.get('refId')}", t["expr"]
    for a in dash["annotations"]["list"]:
        if "expr" in a:
            yield f"annotation {a['name']!r}", a["expr"]


def alert_rules():
    doc = load_yaml(ALERTS)
    return [r for g in doc["groups"] for r in g["rules"]]


def duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * units[u] for n, u in parts)


# --------------------------------------------------------------------------- the YAML reader


def test_parse_yaml_reads_the_subset():
    doc = parse_yaml(
        "# comment\n"
        "a: 1\n"
        "b: 'it''s'   # trailing comment\n"
        'c: "x # not a comment"\n'
        "d:\n"
        "  - name: one\n"
        "    vals: [1, 2.5, x]\n"
        "  - {k: v, e: []}\n"
        "  - plain\n"
        "e:\n"
        "- 1\n"
        "f: |\n"
        "  line one # kept\n"
        "    indented\n"
        "\n"
        "g: >-\n"
        "  folded\n"
        "  text\n"
        "h: true\n"
        "i:\n"
    )
    assert doc == {
        "a": 1, "b": "it's", "c": "x # not a comment",
        "d": [{"name": "one", "vals": [1, 2.5, "x"]}, {"k": "v", "e": []}, "plain"],
        "e": [1], "f": "line one # kept\n  indented\n", "g": "folded text", "h": True,
        "i": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    "text, message",
    [
        ("a:\n\tb: 1\n", "tab"),
        ("a: 1\n  b: 2\n", "unexpected indentation"),
        ("a: 1\na: 2\n", "duplicate key"),
        ("a: [1, 2\n", "unclosed"),
        ("a: &anchor 1\n", "unsupported"),
        ("just text\n", "not a key: value"),
        ('a: "open\n', "unclosed double quote"),
        ("a: |\nb: 1\n", "empty block scalar"),
    ],
)
def test_parse_yaml_refuses_what_it_does_not_read(text, message):
    with pytest.raises(YamlSubsetError, match=message):
        parse_yaml(text)


_plain = st.from_regex(r"[a-z][a-z0-9_ ]{0,10}[a-z0-9]", fullmatch=True).filter(
    lambda s: s not in ("true", "false", "null")
)
_leaf = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.none(), _plain,
                  st.text(st.characters(codec="ascii", exclude_categories=("Cc",)),
                          max_size=12))  # fmt: skip
_tree = st.recursive(
    _leaf,
    lambda kids: st.one_of(
        st.lists(kids, min_size=1, max_size=4),
        st.dictionaries(
            st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), kids, min_size=1, max_size=4
        ),
    ),
    max_leaves=20,
)


def _emit(node, indent=0) -> list[str]:
    """Block-style YAML of ``node``, as the packaging files are written."""
    pad = " " * indent
    if isinstance(node, dict):
        out = []
        for k, v in node.items():
            if isinstance(v, (dict, list)):
                out.append(f"{pad}{k}:")
                out.extend(_emit(v, indent + 2))
            else:
                out.append(f"{pad}{k}: {_emit_scalar(v)}")
        return out
    if isinstance(node, list):
        out = []
        for v in node:
            if isinstance(v, (dict, list)):
                inner = _emit(v, indent + 2)
                out.append(f"{pad}- {inner[0].lstrip()}")
                out.extend(inner[1:])
            else:
                out.append(f"{pad}- {_emit_scalar(v)}")
        return out
    return [pad + _emit_scalar(node)]


def _emit_scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)


@given(st.one_of(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
                                 _tree, min_size=1, max_size=4),
                 st.lists(_tree, min_size=1, max_size=4)))  # fmt: skip
def test_parse_yaml_round_trips_block_style(tree):
    assert parse_yaml("\n".join(_emit(tree)) + "\n") == tree


# --------------------------------------------------------------------------- metric names


def test_families_and_docs_list_the_same_metrics():
    exported = {n for n in known_metrics() if n.startswith("modbridge_")}
    documented = documented_metrics()
    assert exported - documented == set(), "exported but not in docs/metrics.md"
    assert documented - exported == set(), "in docs/metrics.md but not exported"


def test_check_expr_reads_real_promql():
    known = known_metrics()
    labels = check_expr(
        "sum by (instance, module, reason) (increase(modbridge_module_events_total"
        '{instance=~"$instance", reason!="none"}[$__rate_interval])) > 0',
        known,
    )
    assert {"module", "reason", "instance"} <= labels
    sel, grouping, made = promql_names(
        'label_replace(modbridge_module_fault{fault=~"fan[12]_stall"} == 1, "fan", "$1",'
        ' "fault", "fan([12])_stall") and on (module, fan) modbridge_module_fan_speed_rpm'
        " offset 5m < bool 100 or vector(0) and max_over_time(up[1h:5m])"
    )
    assert sel == [("modbridge_module_fault", {"fault"}),
                   ("modbridge_module_fan_speed_rpm", set()), ("up", set())]  # fmt: skip
    assert grouping == {"module", "fan"} and made == {"fan"}


@pytest.mark.parametrize(
    "expr, message",
    [
        ("modbridge_module_temp_celsius > 80", "not an exported metric"),
        ("rate(modbridge_module_frames[5m])", "not an exported metric"),  # no _total
        ('modbridge_module_temperature_celsius{chanel="gpu"}', "has no label"),
        ("sum by (fan) (modbridge_module_input_watts)", "grouping by"),
        ("rat(modbridge_module_frames_total[5m])", "unknown function"),
        ("sum(modbridge_module_input_watts", "unbalanced"),
        ('{__name__="modbridge_module_up"}', "without a metric name"),
        ("modbridge_module_up{module}", "without an operator"),
        ("1 + 1", "no metric"),
        ("modbridge_module_up ?", "cannot read"),
    ],
)
def test_check_expr_refuses_what_is_not_exported(expr, message):
    with pytest.raises(PromQLError, match=message):
        check_expr(expr, known_metrics())


_NAMES = [(n, sorted(labels)) for n, labels in known_metrics().items() if labels]


@given(
    st.sampled_from(_NAMES).flatmap(
        lambda nl: st.tuples(st.just(nl[0]), st.lists(st.sampled_from(nl[1]), unique=True))
    )
)
def test_promql_names_finds_every_selector(name_labels):
    """A selector with any of its metric's labels, inside functions and aggregations,
    is found with exactly those labels."""
    name, labels = name_labels
    matchers = ", ".join(f'{lab}=~"a.*{{b}}"' for lab in labels)
    expr = f"max by (instance) (last_over_time({name}{{{matchers}}}[5m])) > 0"
    assert promql_names(expr)[0] == [(name, set(labels))]
    check_expr(expr, known_metrics())


# --------------------------------------------------------------------------- dashboard


def test_dashboard_identity_and_variables():
    dash = dashboard()
    assert dash["uid"] == "modbridge-overview"
    assert dash["schemaVersion"] >= 36 and dash.get("id") is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert list(variables)[:4] == ["datasource", "instance", "module", "gpu"]
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    known = known_metrics()
    for name in ("instance", "module", "gpu"):
        var = variables[name]
        assert var["type"] == "query" and var["datasource"]["uid"] == "${datasource}"
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
        assert m, f"variable {name}: {var['query']!r} is not label_values(metric, label)"
        assert m.group(2) == name
        assert name in check_expr(m.group(1), known)


def test_dashboard_grid_ids_and_datasources():
    dash = dashboard()
    panels = list(all_panels(dash))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    taken = set()
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["h"] > 0
        assert pos["x"] + pos["w"] <= 24, f"panel {p['title']!r} is wider than the grid"
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                 for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not cells & taken, f"panel {p['title']!r} overlaps another"
        taken |= cells
        if p["type"] == "row":
            continue
        assert p["title"] and p.get("description"), f"panel {p['id']} needs a title and text"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], f"{p['title']}: a fixed data source"
    titles = [p["title"] for p in panels if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "two panels with one title"


def test_dashboard_queries_name_only_exported_metrics_and_labels():
    known = known_metrics()
    dash = dashboard()
    for p in all_panels(dash):
        for t in p.get("targets", []):
            try:
                available = check_expr(t["expr"], known)
            except PromQLError as e:
                pytest.fail(f"panel {p['title']!r} {t['refId']}: {e}")
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")):
                assert label in available, f"{p['title']!r}: legend {{{{{label}}}}}"
    for a in dash["annotations"]["list"]:
        if "expr" in a:
            available = check_expr(a["expr"], known)
            for field in ("titleFormat", "textFormat"):
                for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", a[field]):
                    assert label in available, f"annotation {a['name']!r}: {label}"


UNIT_OF_SUFFIX = {
    "celsius": "celsius",
    "watts": "watt",
    "volts": "volt",
    "amperes": "amp",
    "rpm": "rpm",
    "ratio": "percentunit",
    "seconds": "s",
}


def test_dashboard_units_follow_the_metric_names():
    """A target that graphs a gauge with a unit in its name is shown in that unit
    (the panel's unit, or its refId override's)."""
    checked = 0
    for p in all_panels(dashboard()):
        if p["type"] not in ("timeseries", "stat"):
            continue
        default = p["fieldConfig"]["defaults"].get("unit")
        by_ref = {}
        for o in p["fieldConfig"]["overrides"]:
            if o["matcher"]["id"] == "byFrameRefID":
                for prop in o["properties"]:
                    if prop["id"] == "unit":
                        by_ref[o["matcher"]["options"]] = prop["value"]
        for t in p["targets"]:
            if re.search(r"\b(rate|increase|count)\(", t["expr"]):
                continue
            names = {n for n, _ in promql_names(grafana_to_promql(t["expr"]))[0]}
            suffixes = {n.rsplit("_", 1)[-1] for n in names} & set(UNIT_OF_SUFFIX)
            if len(suffixes) == 1:
                unit = by_ref.get(t["refId"], default)
                assert unit == UNIT_OF_SUFFIX[suffixes.pop()], f"{p['title']} {t['refId']}"
                checked += 1
    assert checked >= 20


def _panels_using(dash, *metrics):
    """Titles of panels whose queries use all of ``metrics``."""
    out = []
    for p in all_panels(dash):
        names = set()
        for t in p.get("targets", []):
            names |= {n for n, _ in promql_names(grafana_to_promql(t["expr"]))[0]}
        if set(metrics) <= names:
            out.append(p["title"])
    return out


@pytest.mark.parametrize(
    "topic, metrics",
    [
        ("module vs GPU temperature (the seed's correlation)",
         ("modbridge_module_temperature_celsius", "modbridge_gpu_temperature_celsius",
          "modbridge_module_info")),
        ("fan speed", ("modbridge_module_fan_speed_rpm",)),
        ("fan duty", ("modbridge_module_fan_duty_ratio",)),
        ("input power vs GPU power", ("modbridge_module_input_watts",
                                      "modbridge_gpu_power_watts")),
        ("power limits", ("modbridge_gpu_power_limit_watts",
                          "modbridge_gpu_power_limit_original_watts",
                          "modbridge_policy_target_limit_watts")),
        ("policy level", ("modbridge_policy_level",)),
        ("module events", ("modbridge_module_events_total",)),
        ("policy actions", ("modbridge_policy_actions_total",)),
        ("time to threshold", ("modbridge_policy_time_to_threshold_seconds",)),
        ("module up", ("modbridge_module_up",)),
        ("frame age", ("modbridge_module_last_frame_age_seconds",)),
        ("bridge health", ("modbridge_scrape_snapshot_age_seconds", "up")),
    ],
)  # fmt: skip
def test_dashboard_has_the_panels_the_issue_asks_for(topic, metrics):
    assert _panels_using(dashboard(), *metrics), f"no panel for {topic}"


def test_dashboard_correlation_panel_graphs_the_difference():
    """The seed's panel: NTC, NVML, and one query that subtracts them, on the right axis."""
    dash = dashboard()
    titles = _panels_using(
        dash, "modbridge_module_temperature_celsius", "modbridge_gpu_temperature_celsius"
    )
    [panel] = [p for p in all_panels(dash) if p["title"] in titles and len(p["targets"]) >= 3]
    diff = [t for t in panel["targets"]
            if "modbridge_module_temperature_celsius" in t["expr"]
            and "modbridge_gpu_temperature_celsius" in t["expr"]]  # fmt: skip
    assert len(diff) == 1 and re.search(r"\)\s*-\s*on \(", diff[0]["expr"])
    right = [o for o in panel["fieldConfig"]["overrides"]
             if o["matcher"]["options"] == diff[0]["refId"]]  # fmt: skip
    assert any(p == {"id": "custom.axisPlacement", "value": "right"}
               for o in right for p in o["properties"])  # fmt: skip


def test_dashboard_annotates_power_limit_actions():
    names = [a for a in dashboard()["annotations"]["list"] if "expr" in a]
    assert any("modbridge_policy_actions_total" in a["expr"] and a["enable"] for a in names)
    assert all(a["datasource"]["uid"] == "${datasource}" for a in names)


def test_dashboard_queries_are_promql(tmp_path):
    """promtool parses every dashboard query (Grafana's variables substituted) as the
    expression of a recording rule."""
    tool = promtool()
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    exprs = list(dashboard_exprs(dashboard()))
    for n, (_where, expr) in enumerate(exprs):
        lines.append(f"      - record: dashboard:query:{n}")
        lines.append(f"        expr: {json.dumps(grafana_to_promql(expr))}")
    rules = tmp_path / "dashboard_rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    r = subprocess.run([tool, "check", "rules", str(rules)], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n" + "\n".join(
        f"{n}: {where}" for n, (where, _e) in enumerate(exprs)
    )
    assert f"{len(exprs)} rules found" in r.stdout


# --------------------------------------------------------------------------- alert rules


def test_promtool_check_rules():
    out = run_promtool("check", "rules", ALERTS.name)
    assert "SUCCESS" in out and f"{len(alert_rules())} rules found" in out


def test_promtool_test_rules():
    out = run_promtool("test", "rules", ALERTS_TEST.name)
    assert "SUCCESS" in out


def test_promtool_check_config():
    out = run_promtool("check", "config", PROM_CONFIG.name)
    assert "is valid prometheus config file syntax" in out and "1 rule files found" in out


def test_alert_rules_have_for_severity_annotations_and_runbook():
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert set(REQUIRED_ALERTS) <= names, set(REQUIRED_ALERTS) - names
    seen = set()
    for r in rules:
        name = r["alert"]
        assert duration_s(r["for"]) > 0, f"{name}: no for:, so a blip would fire it"
        assert r["labels"]["severity"] in ("warning", "critical"), name
        key = (name, tuple(sorted(r["labels"].items())))
        assert key not in seen, f"{name}: two rules with the same labels"
        seen.add(key)
        ann = r["annotations"]
        assert {"summary", "description", "runbook"} <= set(ann), name
        assert "{{ $labels.instance }}" in ann["description"], name
        assert "modbridge doctor" in ann["runbook"], name
        assert re.search(r"docs/\w+\.md", ann["runbook"]), name


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_alert_runbooks_point_at_existing_docs():
    for r in alert_rules():
        for doc, anchor in re.findall(
            r"(docs/[\w-]+\.md)(?:#([\w-]+))?", r["annotations"]["runbook"]
        ):
            path = REPO / doc
            assert path.is_file(), f"{r['alert']}: {doc} does not exist"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
                assert anchor in {_slug(h) for h in headings}, f"{r['alert']}: {doc}#{anchor}"


def test_alert_rules_name_only_exported_metrics_and_labels():
    known = known_metrics()
    for r in alert_rules():
        try:
            available = check_expr(r["expr"], known)
        except PromQLError as e:
            pytest.fail(f"{r['alert']}: {e}")
        for text in r["annotations"].values():
            for label in re.findall(r"\$labels\.(\w+)", text):
                assert label in available, f"{r['alert']}: $labels.{label}"


def test_every_alert_has_unit_tests_that_fire_and_stay_quiet():
    """alerts_test.yml has, per alert, a case where it fires and one where it does not,
    and every fired case is a labelled alert of the right severity."""
    doc = load_yaml(ALERTS_TEST)
    assert doc["rule_files"] == [ALERTS.name]
    severity = {r["alert"]: set() for r in alert_rules()}
    for r in alert_rules():
        severity[r["alert"]].add(r["labels"]["severity"])
    fires, quiet = set(), set()
    for test in doc["tests"]:
        for case in test["alert_rule_test"]:
            name = case["alertname"]
            assert name in severity, f"{test['name']}: unknown alert {name}"
            if case["exp_alerts"]:
                fires.add(name)
                for alert in case["exp_alerts"]:
                    assert alert["exp_labels"]["severity"] in severity[name]
                    assert alert["exp_annotations"]["summary"]
            else:
                quiet.add(name)
    assert fires == set(severity), f"never fired: {set(severity) - fires}"
    assert quiet == set(severity), f"never checked quiet: {set(severity) - quiet}"


def test_example_scrape_config_targets_the_default_port():
    doc = load_yaml(PROM_CONFIG)
    [job] = [j for j in doc["scrape_configs"] if j["job_name"] == "modbridge"]
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{DEFAULT_PORT}"]
    assert doc["rule_files"] == [ALERTS.name]
    # the rules match job="modbridge": the example must call its job that
    assert any('job="modbridge"' in r["expr"] for r in alert_rules())


# --------------------------------------------------------------------------- provisioning


def test_dashboard_provisioning():
    doc = load_yaml(PROVISION_DASHBOARDS)
    assert doc["apiVersion"] == 1
    [provider] = doc["providers"]
    assert provider["type"] == "file" and provider["name"] == "modbridge"
    assert provider["options"]["path"].startswith("/")
    assert isinstance(provider["updateIntervalSeconds"], int)
    assert isinstance(provider["disableDeletion"], bool)


def test_datasource_provisioning():
    doc = load_yaml(PROVISION_DATASOURCE)
    assert doc["apiVersion"] == 1
    [ds] = doc["datasources"]
    assert ds["type"] == "prometheus" and ds["access"] == "proxy"
    assert re.fullmatch(r"https?://[\w.-]+:\d+", ds["url"])
    assert ds["uid"] and ds["isDefault"] is False
    # $__rate_interval is 4 x this: it should be the bridge job's scrape interval
    job = next(j for j in load_yaml(PROM_CONFIG)["scrape_configs"]
               if j["job_name"] == "modbridge")  # fmt: skip
    assert ds["jsonData"]["timeInterval"] == job["scrape_interval"]


def test_packaging_readme_names_every_file():
    text = (PACKAGING / "README.md").read_text(encoding="utf-8")
    for path in (DASHBOARD, ALERTS, ALERTS_TEST, PROM_CONFIG, PROVISION_DASHBOARDS,
                 PROVISION_DATASOURCE):  # fmt: skip
        assert str(path.relative_to(PACKAGING)) in text, path.name
    assert "packaging/README.md" in METRICS_DOC.read_text(encoding="utf-8")
