"""protocol/vectors/signing.json is what gen_signing.py writes today, and the worked
example of SPEC.md section 14.1 quotes it."""

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATOR = REPO_ROOT / "protocol" / "vectors" / "gen_signing.py"
COMMITTED = REPO_ROOT / "protocol" / "vectors" / "signing.json"
SPEC = REPO_ROOT / "protocol" / "SPEC.md"


def test_committed_signing_vectors_are_up_to_date(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert COMMITTED.read_bytes() == (tmp_path / "signing.json").read_bytes(), (
        "protocol/vectors/signing.json is stale: run `python protocol/vectors/gen_signing.py`"
        " and review the diff (a changed vector is a wire-format change)"
    )


def test_spec_worked_example_quotes_the_vectors():
    doc = json.loads(COMMITTED.read_text())
    hb = [v for v in doc["vectors"] if v["name"] == "heartbeat"][0]
    text = SPEC.read_text()
    section = text[text.index("### 14.1 Signed commands") :]
    section = section[: section.index("\n## ")]
    joined = "".join(section.split())
    for item in (doc["key_hex"], doc["nonce_hex"], hb["sig_hex"], str(hb["ts"])):
        assert item in joined, item
    assert hb["signed_hex"] in joined
    assert hb["json_line"].strip().replace(" ", "") in joined
