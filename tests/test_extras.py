"""A command that needs a missing optional extra says so in one line naming it
(host/modbridge/extras.py): ``report`` without matplotlib ([report]), every ``--sim``
without the MicroPython unix port ([sim])."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from modbridge import extras

MODBRIDGE = str(Path(sys.executable).parent / "modbridge")

# A sitecustomize that makes matplotlib unimportable, as in a base install.
NO_MATPLOTLIB = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, _Block())
"""


def _run(args, env=None, cwd=None):
    return subprocess.run([MODBRIDGE, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})}, cwd=cwd)  # fmt: skip


def test_require_names_the_extra():
    extras.require("json", "x", "report")  # present: nothing
    with pytest.raises(extras.ExtraMissing) as e:
        extras.require("no_such_module_here", "modbridge report", "report")
    want = ("modbridge report needs the optional [report] extra: "
            "pip install 'modbridge[report]' (in a checkout: make setup)")
    assert str(e.value) == want, str(e.value)


def test_report_without_matplotlib_is_one_line(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_MATPLOTLIB)
    rec = tmp_path / "r.csv"
    rec.write_text("elapsed_s\n0\n")
    res = _run(["report", str(rec)], env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "[report] extra" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_sim_without_micropython_is_one_line(tmp_path):
    res = _run(["status", "--sim"], env={"MICROPYTHON": str(tmp_path / "none")})
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr
    # $MICROPYTHON set to nothing runnable is its own error; without it and without the
    # port beside the interpreter or on PATH, the message names the [sim] extra
    env = {"PATH": str(tmp_path), "MICROPYTHON": ""}
    script = ("import sys; sys.executable = '/nonexistent/python'\n"
              "from modbridge.tools import mpy\n"
              "try:\n    mpy.micropython_path()\nexcept mpy.MicroPythonMissing as e:\n"
              "    print(e)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60).stdout  # fmt: skip
    assert "[sim] extra" in out and "pip install 'modbridge[sim]'" in out, out
