"""Rewrite the results rows of the docs from bench/results.json.

Docs quote results.json, never hand-copied numbers: every ``| `key` | value |`` row of
a results table in :data:`DOCS` carries the file's value for ``key``, and so does every
``| `key` | value | ...`` row of docs/firmware.md's "Budget on ARM" section
(:data:`SECTIONS`; tests/test_docs_results.py and tests/qemu/test_budget_doc.py check
them). After a benchmark run:

    python -m bench.doc_tables            # rewrite the rows that moved, list them
    python -m bench.doc_tables --check    # exit 1 if a row disagrees (what the test does)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
DOCS = ("docs/safety.md", "docs/boards.md", "docs/metrics.md", "docs/fleet.md")
ROW = re.compile(r"^\| `([a-z0-9_]+)` \| ([-0-9.]+) \|$")
# (doc, section title): rows with more columns after the value, in that section only
SECTIONS = (("docs/firmware.md", "Budget on ARM"),)
ROW_PREFIX = re.compile(r"^(\| `([a-z0-9_]+)` \| )([-0-9.]+)( \|.*)$")


def _fmt(v) -> str:
    """A results value as the docs write it: integers without a decimal point."""
    return str(int(v)) if float(v) == int(v) else repr(float(v))


def sync(results: dict, write: bool) -> list[str]:
    """The rows that disagree (``doc: key old -> new``), rewritten when ``write``.
    A row whose key is not in results is reported and left as it is."""
    changes = _sync_sections(results, write)
    for doc in DOCS:
        path = ROOT / doc
        lines = path.read_text(encoding="utf-8").split("\n")
        moved = False
        for i, line in enumerate(lines):
            m = ROW.match(line)
            if not m:
                continue
            key, value = m.groups()
            if key not in results:
                changes.append(f"{doc}: {key} is not in bench/results.json")
                continue
            if float(value) != float(results[key]):
                changes.append(f"{doc}: {key} {value} -> {_fmt(results[key])}")
                lines[i] = f"| `{key}` | {_fmt(results[key])} |"
                moved = True
        if write and moved:
            path.write_text("\n".join(lines), encoding="utf-8")
    return changes


def _sync_sections(results: dict, write: bool) -> list[str]:
    changes = []
    for doc, title in SECTIONS:
        path = ROOT / doc
        lines = path.read_text(encoding="utf-8").split("\n")
        inside = moved = False
        for i, line in enumerate(lines):
            if line.startswith("## "):
                inside = line == "## " + title
                continue
            m = ROW_PREFIX.match(line) if inside else None
            if not m:
                continue
            head, key, value, tail = m.groups()
            if key not in results:
                changes.append(f"{doc}: {key} is not in bench/results.json")
            elif float(value) != float(results[key]):
                changes.append(f"{doc}: {key} {value} -> {_fmt(results[key])}")
                lines[i] = head + _fmt(results[key]) + tail
                moved = True
        if write and moved:
            path.write_text("\n".join(lines), encoding="utf-8")
    return changes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report; exit 1 on a change")
    args = ap.parse_args(argv)
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    changes = sync(results, write=not args.check)
    for c in changes:
        print(c)
    return 1 if args.check and changes else 0


if __name__ == "__main__":
    sys.exit(main())
