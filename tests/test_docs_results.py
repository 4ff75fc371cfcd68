"""Docs quote bench/results.json, never hand-copied numbers: every `| `key` | value |`
row of a results table in the docs below must match the file."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("docs/safety.md", "docs/boards.md", "docs/metrics.md")
ROW = re.compile(r"^\| `([a-z0-9_]+)` \| ([-0-9.]+) \|$")


def test_results_tables_match_results_json():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    checked = 0
    for doc in DOCS:
        for line in (ROOT / doc).read_text().splitlines():
            m = ROW.match(line)
            if not m:
                continue
            key, value = m.group(1), m.group(2)
            assert key in results, f"{doc}: {key} is not in bench/results.json"
            assert float(value) == float(results[key]), (doc, key, value, results[key])
            checked += 1
    assert checked >= 8, checked
