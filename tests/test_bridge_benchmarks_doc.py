"""docs/bridge-benchmarks.md's results table is generated from bench/results.json
(``python -m bench.bench_bridge --doc``): it must be exactly what the generator makes
of the file, so no number in it is hand-copied or stale."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_bridge as bb

ROOT = Path(__file__).resolve().parent.parent


def test_the_results_table_is_generated_from_results_json():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    doc = (ROOT / "docs" / "bridge-benchmarks.md").read_text()
    table = bb.doc_table(results)
    assert table in doc, "run `python -m bench.bench_bridge --doc`"
    assert doc.count(bb.BEGIN) == 1
    for key, _what, _goal in bb.DOC_ROWS:
        assert f"| `{key}` | " in table and key in results


def test_no_stale_bridge_keys_in_results_json():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    assert not [k for k in bb.STALE_KEYS if k in results]


def test_wire_time_is_ten_bits_a_byte_at_115200():
    assert bb.wire_ms(11520) == 1000.0
    assert bb.wire_ms(0) == 0.0
