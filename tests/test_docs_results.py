"""Docs quote bench/results.json, never hand-copied numbers: every `| `key` | value |`
row of a results table in the docs (bench.doc_tables.DOCS) must match the file;
``python -m bench.doc_tables`` rewrites them after a benchmark run."""

import json

from bench import doc_tables


def test_results_tables_match_results_json():
    results = json.loads(doc_tables.RESULTS.read_text())
    assert doc_tables.sync(results, write=False) == []
    rows = sum(
        1
        for doc in doc_tables.DOCS
        for line in (doc_tables.ROOT / doc).read_text().splitlines()
        if doc_tables.ROW.match(line)
    )
    assert rows >= 8, rows


def test_a_moved_value_is_reported_and_not_written_in_check_mode():
    results = json.loads(doc_tables.RESULTS.read_text())
    key = next(
        m.group(1)
        for line in (doc_tables.ROOT / "docs/boards.md").read_text().splitlines()
        if (m := doc_tables.ROW.match(line))
    )
    before = (doc_tables.ROOT / "docs/boards.md").read_text()
    moved = dict(results, **{key: results[key] + 1})
    changes = doc_tables.sync(moved, write=False)
    assert any(c.startswith(f"docs/boards.md: {key} ") for c in changes), changes
    assert (doc_tables.ROOT / "docs/boards.md").read_text() == before
    missing = {k: v for k, v in results.items() if k != key}
    assert any("is not in bench/results.json" in c for c in doc_tables.sync(missing, False))
