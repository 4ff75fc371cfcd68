"""The wheel, installed the way users install it: a fresh venv in a temporary
directory, no checkout on the path (cwd elsewhere, PYTHONPATH unset), then every
command that runs without hardware.

One wheel (built from a copy of what the sdist holds, so the repository is not
written), one venv: first the base install (its size, what is in site-packages, every
command's ``--help``, ``config example`` and ``validate``, ``flash --dry-run`` for every
board, each missing extra's one-line message), then the ``[sim]`` and ``[report]``
extras into the same venv (``status --sim``, ``list --sim``, ``record --sim`` and
``report`` of that recording). The dependencies come from the package index pip is
configured with, with pip's cache (skipped with the reason if none answers): about
25 s with the cache warm, a minute or two cold. The test's wheel carries one stand-in
stm32 image (as ``make dist``'s carries them all) and lacks the others, so ``flash``
is checked both ways.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modbridge import __version__

ROOT = Path(__file__).resolve().parents[1]
#: What setup.py and pyproject.toml build the wheel from (MANIFEST.in's sdist).
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "host", "device",
           "boards", "protocol", "firmware", "examples")  # fmt: skip
#: Never a top-level name in site-packages (DESIGN.md "Packaging facts").
NOT_TOP_LEVEL = ("device", "boards", "protocol", "firmware", "examples")
BASE_MAX_MB = 40
PACKAGED_BOARD = "pyboard_v11"  # the board whose image the test's wheel carries
IMAGE_FILES = ("firmware.dfu", "firmware.hex", "firmware0.bin", "firmware1.bin",
               "firmware.bin", "image.json")  # fmt: skip
UNREACHABLE = r"No matching distribution|Could not find a version|Network is unreachable"


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.mpy", "*.egg-info")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


class Venv:
    """The fresh venv and how to run its commands from outside the checkout."""

    def __init__(self, path: Path, cwd: Path):
        self.path, self.cwd = path, cwd
        self.py = path / "bin" / "python"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MICROPYTHON")}  # fmt: skip
        self.env["PATH"] = f"{path / 'bin'}:/usr/bin:/bin"
        self.env["HOME"] = str(cwd / "home")  # flash's staging and keys: not the user's
        self.env.pop("XDG_CACHE_HOME", None)

    def pip_install(self, *targets: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.py), "install", "-q", *targets],
            capture_output=True, text=True, timeout=600, cwd=self.cwd,
        )  # fmt: skip
        if done.returncode != 0 and re.search(UNREACHABLE, done.stderr):
            pytest.skip(f"the package index is not reachable: {done.stderr[-300:]}")
        assert done.returncode == 0, done.stderr[-2000:]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.path / "bin" / "modbridge"), *args], cwd=self.cwd, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def python(self, code: str) -> str:
        done = subprocess.run([str(self.py), "-c", code], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    def site_packages(self) -> Path:
        (sp,) = self.path.glob("lib/python3*/site-packages")
        return sp

    def size_mb(self) -> int:
        """``du -sm`` of site-packages (what docs/install.md quotes)."""
        du = subprocess.run(["du", "-sm", str(self.site_packages())], capture_output=True,
                            text=True, check=True, timeout=60)  # fmt: skip
        return int(du.stdout.split()[0])


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    """The wheel built from a copy of the sources, installed alone (the venv has no
    pip of its own: the outer pip installs into it, so site-packages is the install)."""
    src = tmp_path_factory.mktemp("src")
    _copy_sources(src)
    wheels = tmp_path_factory.mktemp("wheels")
    # one stm32 board's image (stand-in bytes), as `make dist` puts them in: the others
    # have none, so both cases are checked
    images = tmp_path_factory.mktemp("images")
    (images / PACKAGED_BOARD).mkdir()
    for name in IMAGE_FILES:
        (images / PACKAGED_BOARD / name).write_bytes(b"{}" if name.endswith(".json") else b"x")
    env = {**os.environ, "MODBRIDGE_WHEEL_IMAGES": str(images)}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), "."],
        cwd=src, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if built.returncode != 0 and re.search(UNREACHABLE, built.stderr):
        pytest.skip(f"no package index for the build backend: {built.stderr[-300:]}")
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("modbridge-*.whl")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "home").mkdir()
    path = elsewhere / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=60)  # fmt: skip
    v = Venv(path, elsewhere)
    v.wheel = wheel
    v.pip_install(str(wheel))
    return v


def _commands(v: Venv) -> list[list[str]]:
    """Every command path of the installed CLI (groups and their subcommands)."""
    out = v.python(
        "import json, click\n"
        "from modbridge.cli.main import main\n"
        "def walk(cmd, path):\n"
        "    yield path\n"
        "    if isinstance(cmd, click.Group):\n"
        "        for name, sub in sorted(cmd.commands.items()):\n"
        "            yield from walk(sub, path + [name])\n"
        "print(json.dumps(list(walk(main, []))))\n"
    )
    return json.loads(out)


# ------------------------------------------------------------------------- base


def test_base_install_is_small_and_has_only_the_projects_namespace(venv):
    sp = venv.site_packages()
    tops = {p.name for p in sp.iterdir()}
    assert "modbridge" in tops
    assert not set(NOT_TOP_LEVEL) & tops, sorted(tops)
    assert not [t for t in tops if t.startswith(("matplotlib", "micropython", "jonnor"))]
    size = venv.size_mb()
    print(f"base install: {size} MB in site-packages")
    assert size <= BASE_MAX_MB, f"{size} MB"
    fw = sp / "modbridge" / "_fw"
    for rel in ("device/main.py", "boards/pico.py", "protocol/SPEC.md", "firmware/stm32.py",
                "firmware/allowlist.py", "boards/manifests/firmware.py",
                "examples/modbridge.toml"):  # fmt: skip
        assert (fw / rel).is_file(), rel
    assert not (fw / "firmware" / "qemu.py").exists()  # test tooling stays in the checkout
    # the firmware is imported from the wheel, under its own names
    where = venv.python("import modbridge, protocol, device, boards, firmware\n"
                        "print(protocol.__file__, device.__file__, firmware.__file__)")  # fmt: skip
    assert all(p.startswith(str(fw)) for p in where.split()), where


def test_every_command_answers_version_and_help(venv):
    version = venv.run("--version")
    assert version.returncode == 0 and version.stdout.split()[-1] == __version__, version
    paths = _commands(venv)
    assert ["flash"] in paths and ["config", "example"] in paths and len(paths) > 20
    for path in paths:
        done = venv.run(*path, "--help")
        assert done.returncode == 0, (path, done.stderr[-500:])
        assert "Usage: modbridge" in done.stdout, path


def test_config_example_from_package_data_validates(venv):
    example = venv.run("config", "example")
    assert example.returncode == 0, example.stderr
    assert "[bridge]" in example.stdout or "[[module]]" in example.stdout, example.stdout[:300]
    path = venv.cwd / "modbridge.toml"
    path.write_text(example.stdout)
    valid = venv.run("config", "validate", str(path))
    assert valid.returncode == 0, valid.stdout + valid.stderr


def test_flash_dry_run_for_every_board(venv):
    boards = json.loads(venv.python("import json, modbridge\nfrom boards import BOARDS\n"
                                    "print(json.dumps(sorted(BOARDS)))"))  # fmt: skip
    images = json.loads(venv.python("import json, modbridge\nfrom firmware.stm32 import BOARDS\n"
                                     "print(json.dumps(sorted(BOARDS)))"))  # fmt: skip
    assert {"pico", "blackpill_f411"} <= set(boards) and images
    for board in boards:
        if board == "sim":  # the virtual board: nothing to flash
            continue
        done = venv.run("flash", "--board", board, "--port", "/dev/ttyACM0", "--dry-run")
        assert done.returncode == 0, (board, done.stderr[-1000:])
        assert "mpremote connect /dev/ttyACM0" in done.stdout + done.stderr, board
    # the pico's .mpy deploy is compiled from the wheel's sources
    home = venv.cwd / "home"
    staged = sorted(p.as_posix() for p in home.rglob("*.mpy"))
    assert any(s.endswith("flash/pico/device/main.mpy") for s in staged), staged[:5]
    # a board whose image the wheel lacks: one line says how to get one
    lacking = [b for b in images if b != PACKAGED_BOARD][0]
    real = venv.run("flash", "--board", lacking, "--port", "/dev/ttyACM0", "--no-key")
    assert real.returncode != 0
    (line,) = real.stderr.strip().splitlines()
    assert f"no image for {lacking}" in line and "make dist" in line, line
    assert f"python -m modbridge.tools.image {lacking}" in line, line
    # the packaged one is flashed from the wheel (here dfu-util is what is missing)
    dry = venv.run("flash", "--board", PACKAGED_BOARD, "--port", "/dev/ttyACM0", "--dry-run")
    assert "flashes the image this modbridge carries" in dry.stderr + dry.stdout, dry
    assert f"_fw/images/{PACKAGED_BOARD}/firmware.dfu" in dry.stdout, dry.stdout
    real = venv.run("flash", "--board", PACKAGED_BOARD, "--port", "/dev/ttyACM0", "--no-key")
    assert real.returncode != 0 and "no image" not in real.stderr, real.stderr


def test_list_without_hardware(venv):
    listed = venv.run("list")
    assert listed.returncode == 3, listed  # docs/bridge.md: 3 = nothing found
    assert "modules: none" in listed.stdout, listed.stdout


def test_each_missing_extra_says_so_in_one_line(venv):
    status = venv.run("status", "--sim")
    assert status.returncode != 0
    assert "pip install 'modbridge[sim]'" in status.stderr, status.stderr
    assert len(status.stderr.strip().splitlines()) == 1, status.stderr
    recording = venv.cwd / "empty.csv"
    recording.write_text("t\n")
    report = venv.run("report", str(recording))
    assert report.returncode != 0
    assert "pip install 'modbridge[report]'" in report.stderr, report.stderr
    assert len(report.stderr.strip().splitlines()) == 1, report.stderr


# ----------------------------------------------------------------------- extras


@pytest.fixture(scope="module")
def with_extras(venv) -> Venv:
    """The same venv with ``[sim,report]`` added (after the base checks)."""
    venv.pip_install(f"{venv.wheel}[sim,report]")
    print(f"with [sim,report]: {venv.size_mb()} MB in site-packages")
    return venv


def test_sim_commands_run_from_the_wheel(with_extras):
    v = with_extras
    status = v.run("status", "--sim", timeout=120)
    assert status.returncode == 0, status.stderr[-2000:]
    assert "HOSTED" in status.stdout, status.stdout
    once = v.run("run", "--sim", "--once", "--no-control", "--no-metrics",
                 "--state-dir", str(v.cwd / "state"), timeout=120)  # fmt: skip
    assert once.returncode == 0, once.stderr[-2000:]


def test_record_then_report(with_extras):
    v = with_extras
    rec = v.cwd / "rec.csv"
    record = v.run("record", "--sim", "--duration", "4", "--interval", "0.5", "-q",
                   "-o", str(rec), timeout=180)  # fmt: skip
    assert record.returncode == 0, record.stderr[-2000:]
    report = v.run("report", str(rec), "-o", str(v.cwd / "rec.png"), timeout=180)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (v.cwd / "rec.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
