"""docs/firmware.md's "Budget on ARM" quotes bench/results.json (bench/bench_arm.py),
never hand-copied numbers: every key of the budget is in the section's table, with
the value the file holds."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z0-9_]+)` \| ([-0-9.]+) \|")
BUDGET_KEYS = (
    "heap_after_boot_bytes_armv7m",
    "heap_firmware_imports_bytes_armv7m",
    "heap_app_objects_bytes_armv7m",
    "min_heap_kb_armv7m",
    "tick_alloc_bytes_armv7m_hosted",
    "tick_heap_locked_armv7m_hosted",
    "tick_instructions_armv7m",
    "tick_cpu_share_pct_96mhz_100ms",
    "tick_instructions_armv7m_max",
    "tick_cpu_share_pct_96mhz_100ms_max",
)


def _section(text: str, title: str) -> str:
    start = text.index("\n## " + title + "\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_budget_on_arm_table_matches_results_json():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    section = _section((ROOT / "docs" / "firmware.md").read_text(), "Budget on ARM")
    rows = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = m.group(2)
    missing = [k for k in BUDGET_KEYS if k not in rows]
    assert not missing, f"docs/firmware.md: Budget on ARM does not quote {missing}"
    for key, value in rows.items():
        assert key in results, f"docs/firmware.md: {key} is not in bench/results.json"
        assert float(value) == float(results[key]), (key, value, results[key])
