"""docs/vocabulary.md's table against what the outputs emit, both ways.

Every quantity key (a name ending in a unit suffix, or a float) that `status --json`,
`sim --watch --json`, `record --format jsonl`, the event log or Prometheus emits is a
row of the table, in the column of that output, with the row's unit suffix; every row
appears in the outputs it names (unless its cell says "when ..." or "control socket":
conditions a short run does not meet).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from modbridge.cli.main import main
from modbridge.exporter.families import FAMILIES
from modbridge.exporter.families import UNITS as PROM_UNITS
from modbridge.gpu.base import GpuSample
from modbridge.model import ModuleStatus
from modbridge.policy.config import PolicyConfig
from modbridge.policy.pair import PairPolicy
from protocol import catalog as C

DOC = Path(__file__).resolve().parent.parent / "docs" / "vocabulary.md"
#: the table's unit -> the name's suffix, and the Prometheus suffix (None: not exported)
UNIT = {
    "degC": ("_c", "celsius"), "%": ("_pct", "ratio"), "rpm": ("_rpm", "rpm"),
    "V": ("_v", "volts"), "A": ("_a", "amperes"), "W": ("_w", "watts"),
    "s": ("_s", "seconds"), "degC/s": ("_c_per_s", None), "MHz": ("_mhz", None),
    "Unix s": ("_unix", None),
}  # fmt: skip
QUANTITY = re.compile(r"_(c|pct|rpm|v|a|w|s|mhz|unix)$")
COLUMNS = ("name", "unit", "meaning", "status", "sim", "record", "events", "prometheus")
WIRE = {"value"}  # sim --watch --json's event value: wire units, said in the doc's rule


def _ticks(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _rows() -> list[dict]:
    lines = DOC.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| name | unit |"))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        assert len(cells) == len(COLUMNS), ln
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


ROWS = _rows()


def _optional(cell: str) -> bool:
    return "when " in cell or "control socket" in cell


def _column(col: str, optional: bool = True) -> set[str]:
    return {t for r in ROWS if optional or not _optional(r[col]) for t in _ticks(r[col])}


def _is_quantity(key: str, value) -> bool:
    return bool(QUANTITY.search(key)) or isinstance(value, float)


def _status_path(path: str) -> str:
    """A module's GPU is the same object as its entry in ``gpus``."""
    return path.replace("modules[].gpu.", "gpus[].")


def _leaves(obj: dict, prefix: str):
    for k, v in obj.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield prefix + k, k, v


# ----------------------------------------------------------------------------- the table
def test_every_name_ends_in_its_unit_and_maps_to_a_prometheus_unit():
    assert len(ROWS) > 30
    names = [_ticks(r["name"])[0] for r in ROWS]
    assert len(names) == len(set(names)), "one row per quantity"
    for r in ROWS:
        name, (suffix, prom) = _ticks(r["name"])[0], UNIT[r["unit"]]
        assert name.endswith(suffix), r
        for col in ("status", "sim", "record", "events"):
            for where in _ticks(r[col]):
                assert where.endswith(suffix), (col, where, r)
        for series in _ticks(r["prometheus"]):
            assert prom is not None and series.split("{")[0].endswith("_" + prom), r


def test_prometheus_names_are_the_exporters_and_every_unit_gauge_is_mapped():
    families = {name for _a, _t, name, _l, _h in FAMILIES}
    mapped = {s.split("{")[0] for s in _column("prometheus")}
    assert mapped <= families, mapped - families
    with_unit = {name for _a, typ, name, _l, _h in FAMILIES
                 if typ == "gauge" and name.rsplit("_", 1)[1] in PROM_UNITS}  # fmt: skip
    assert with_unit <= mapped, with_unit - mapped


# ----------------------------------------------------------------------------- status --json
@pytest.fixture(scope="module")
def status_doc() -> dict:
    res = CliRunner().invoke(main, ["status", "--sim", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_status_json_keys_are_the_tables(status_doc):
    assert status_doc["schema"] == 2
    documented = {_status_path(p) for p in _column("status")}
    seen = set()
    for m in status_doc["modules"]:
        for path, key, value in _leaves(m, "modules[]."):
            path = _status_path(path)
            seen.add(path)
            if _is_quantity(key, value) and not path.startswith("gpus[].extra."):
                assert path in documented, (path, value)
    for g in status_doc["gpus"]:
        for path, key, value in _leaves(g, "gpus[]."):
            seen.add(path)
            if _is_quantity(key, value):
                assert path in documented, (path, value)
    for path in _column("status", optional=False):
        assert _status_path(path) in seen, path


# ----------------------------------------------------------------------------- sim --watch
def test_sim_watch_json_keys_are_the_tables():
    res = CliRunner().invoke(main, ["sim", "--watch", "--json", "--world-duration", "1",
                                    "--speed", "max"], catch_exceptions=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    objs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    documented = _column("sim")
    status = [o for o in objs if o["type"] == "status"]
    assert status, objs
    for o in objs:
        for _path, key, value in _leaves(o, ""):
            if _is_quantity(key, value) and key not in WIRE:
                assert key in documented, (o["type"], key, value)
    for name in _column("sim", optional=False):
        assert all(name in o for o in status), name


# ----------------------------------------------------------------------------- record
def test_record_columns_and_event_details_are_the_tables(tmp_path):
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["record", "--sim", "--format", "jsonl", "--duration", "2",
                                    "--sim-speed", "max", "-o", str(out)],
                             catch_exceptions=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    meta, samples = lines[0], [x for x in lines if x["kind"] == "sample"]
    events = [x for x in lines if x["kind"] == "event"]
    assert meta["kind"] == "meta" and samples and events
    documented = _column("record")
    for key in meta["sample_columns"] + meta["event_columns"]:
        if _is_quantity(key, None):
            assert key in documented, key
    for s in samples:
        for key, value in s.items():
            if _is_quantity(key, value):
                assert key in documented, (key, value)
    for name in _column("record", optional=False):
        assert name in meta["sample_columns"] and all(name in s for s in samples), name
    # the event log's fields, as a recording keeps them (its detail)
    leaves = {w.rsplit(".", 1)[1] for w in _column("events")}
    seen = set()
    for e in events:
        for _path, key, value in _leaves(e["detail"], ""):
            seen.add(f"{e['event_kind']}.{key}")
            if _is_quantity(key, value):
                assert key in leaves, (e["event_kind"], key, value)
    assert "module_event.uptime_s" in seen  # the table's module_event.fields.uptime_s


# ----------------------------------------------------------------------------- event log
def _decision() -> dict:
    now = 100.0
    policy = PairPolicy(PolicyConfig())
    gpu = GpuSample(uuid="GPU-0", temperature_c=60.0, power_w=250.0, enforced_limit_w=300.0,
                    default_limit_w=300.0, min_limit_w=100.0, max_limit_w=400.0)  # fmt: skip
    tel = {"state": C.STATE_HOSTED, "faults": 0, "temp_gpu": 59_000, "temp_vram": 55_000,
           "temp_mos": 60_000, "temp_amb": 30_000, "fan1_rpm": 2000, "fan2_rpm": 2000,
           "fan1_duty": 30_000, "fan2_duty": 30_000, "v_in": 12_000, "i_in": 20_000,
           "p_in": 240_000}  # fmt: skip
    module = ModuleStatus(port="/dev/null", module_id="m1", link_up=True, last_frame_at=now,
                          fans=2, telemetry=tel)  # fmt: skip
    d = policy.evaluate(now, module, gpu)
    return json.loads(json.dumps(d.as_event()))


def test_event_log_decision_fields_are_the_tables():
    ev = _decision()
    documented = {w for w in _column("events") if w.startswith("decision.")}
    seen = set()
    for path, key, value in _leaves(ev, "decision."):
        seen.add(path)
        if _is_quantity(key, value):
            assert path in documented, (path, value)
    for path in _column("events", optional=False):
        if path.startswith("decision."):
            assert path in seen, path
