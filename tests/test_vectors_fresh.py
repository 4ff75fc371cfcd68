"""The committed golden vectors are what protocol/vectors/generate.py writes today."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATOR = REPO_ROOT / "protocol" / "vectors" / "generate.py"
COMMITTED = REPO_ROOT / "protocol" / "vectors" / "v1.json"


def test_committed_vectors_are_up_to_date(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        cwd=tmp_path,  # the generator must not depend on the working directory
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fresh = (tmp_path / "v1.json").read_bytes()
    assert COMMITTED.read_bytes() == fresh, (
        "protocol/vectors/v1.json is stale: run `python protocol/vectors/generate.py` "
        "and review the diff (a changed vector is a wire-format change)"
    )


def test_generator_is_deterministic(tmp_path):
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from protocol.vectors import generate
    finally:
        sys.path.remove(str(REPO_ROOT))
    assert generate.render(generate.build()) == generate.render(generate.build())
    assert "." not in "".join(str(v) for v in _numbers(generate.build()))  # no floats


def _numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj
