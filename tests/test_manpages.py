"""Man pages and completion scripts: generated from the click commands, up to date in
packaging/ and in the package, valid roff, and completion that completes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modbridge.cli.main import main as cli
from modbridge.tools import manpages

ROOT = Path(__file__).resolve().parent.parent
DESTS = (ROOT / "packaging", ROOT / "host" / "modbridge")


def _commands(cmd, path):
    """Every command path, walked here (not through manpages._walk)."""
    yield path
    for name, sub in getattr(cmd, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, [*path, name])


@pytest.mark.parametrize("dest", DESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_files_are_up_to_date(dest):
    want = manpages.files(cli)
    have = {rel: (dest / rel).read_text(encoding="utf-8") if (dest / rel).is_file() else None
            for rel in want}  # fmt: skip
    stale = [rel for rel, text in want.items() if have[rel] != text]
    extra = sorted(p.name for p in (dest / "man").glob("*.1") if f"man/{p.name}" not in want)
    assert not stale and not extra, (
        f"out of date in {dest.relative_to(ROOT)}: {stale} (extra: {extra}); run `make man`"
    )


def test_every_command_has_a_page():
    names = {"-".join(p) + ".1" for p in _commands(cli, ["modbridge"])}
    assert names == set(manpages.pages(cli)), names ^ set(manpages.pages(cli))
    run = manpages.pages(cli)["modbridge-run.1"]
    for option in ("\\-\\-state\\-dir", "\\-\\-sim", "\\-\\-metrics\\-port"):
        assert option in run, option


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff not installed")
def test_pages_are_valid_roff(tmp_path):
    bad = {}
    for name, text in manpages.pages(cli).items():
        page = tmp_path / name
        page.write_text(text, encoding="utf-8")
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(page)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        if r.returncode or r.stderr.strip():
            bad[name] = r.stderr.strip()[:300]
        rendered = subprocess.run(["groff", "-man", "-Tascii", str(page)],
                                  capture_output=True, text=True, timeout=60).stdout  # fmt: skip
        rendered = re.sub(".\x08", "", rendered)  # overstrike bold
        assert "NAME" in rendered and "SYNOPSIS" in rendered, name
    assert not bad, bad


def test_a_hostile_help_text_stays_text():
    """A help line starting with '.' or containing a backslash is not a roff request."""
    assert manpages._roff(".TH evil") == "\\&.TH evil"
    assert manpages._roff("a\\b") == "a\\eb"


def _complete(words: list[str], shell: str = "bash") -> list[str]:
    """What the installed command completes for ``words`` (click's env protocol)."""
    env = dict(os.environ, _MODBRIDGE_COMPLETE=f"{shell}_complete",
               COMP_WORDS=" ".join(words), COMP_CWORD=str(len(words) - 1))  # fmt: skip
    exe = Path(sys.executable).parent / "modbridge"
    r = subprocess.run([str(exe) if exe.exists() else "modbridge"], env=env,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return [ln.split(",", 1)[1] for ln in r.stdout.splitlines() if "," in ln]


def test_bash_completion_completes_commands_and_choices():
    assert "run" in _complete(["modbridge", "ru"])
    assert {"set", "get"} <= set(_complete(["modbridge", "config", ""]))
    assert "--state-dir" in _complete(["modbridge", "run", "--state"])


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_script_registers_the_completion(tmp_path):
    script = ROOT / "packaging" / "completion" / "modbridge.bash"
    r = subprocess.run(["bash", "-c", f"source {script} && complete -p modbridge"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "modbridge" in r.stdout, (r.stdout, r.stderr)


def test_zsh_and_fish_scripts_name_the_command():
    assert "#compdef modbridge" in manpages.completion(cli, "zsh")
    assert "complete" in manpages.completion(cli, "fish")
    assert "_MODBRIDGE_COMPLETE" in manpages.completion(cli, "fish")
