"""The one build step pyproject.toml cannot declare: the firmware goes into the wheel
under the project's namespace, as ``modbridge/_fw/``.

The firmware's packages keep their own top-level names (``device``, ``boards``,
``protocol``: the MCU imports them so, and so does the host), which must not be
top-level names in site-packages; ``import modbridge`` puts ``modbridge/_fw/`` first on
``sys.path`` (host/modbridge/__init__.py). :class:`BuildPy` copies into it what the
installed commands need from the repository root:

- ``device/``, ``boards/`` (with ``boards/manifests/``), ``protocol/`` (with SPEC.md and
  the golden vectors): ``modbridge flash`` deploys them, ``--sim`` runs them in the
  MicroPython unix port, the host imports them;
- ``firmware/``'s image build tooling (``python -m modbridge.tools.image <board>``);
  not its qemu test target;
- ``examples/`` (``modbridge config example``);
- ``images/<board>/``: the stm32 boards' prebuilt MicroPython images, only when
  ``$MODBRIDGE_WHEEL_IMAGES`` names the folder holding them (``make dist`` builds them
  with ``python -m firmware.stm32 <board>`` and sets it; a wheel without them says how
  to get one).

An editable install (``pip install -e``, ``make setup``) copies nothing: the checkout's
root plays the role of ``modbridge/_fw/``.
"""

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: (folder of the repository, what of it ships; None = every file)
FW_TREES = (
    ("device", None),
    ("boards", None),
    ("protocol", None),
    ("firmware", ("__init__.py", "allowlist.py", "mpsource.py", "stm32.py")),
    ("examples", None),
)
#: What ``modbridge flash`` writes of each board's image (host/modbridge/tools/flash.py).
IMAGE_FILES = (
    "firmware.dfu",
    "firmware.hex",
    "firmware0.bin",
    "firmware1.bin",
    "firmware.bin",
    "image.json",
)
SKIP_SUFFIXES = (".pyc", ".pyo", ".mpy")


def _tree_files(top, only):
    base = ROOT / top
    if only is not None:
        return [base / name for name in only]
    return sorted(
        p
        for p in base.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in SKIP_SUFFIXES
    )


class BuildPy(build_py):
    """build_py, then the firmware trees (and images) into modbridge/_fw/."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "modbridge" / "_fw"
        shutil.rmtree(dest, ignore_errors=True)
        for top, only in FW_TREES:
            for src in _tree_files(top, only):
                out = dest / src.relative_to(ROOT)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out)
        images = os.environ.get("MODBRIDGE_WHEEL_IMAGES")
        if images:
            self._copy_images(Path(images), dest / "images")

    def _copy_images(self, src, dest):
        boards = sorted(p for p in src.iterdir() if (p / "image.json").is_file())
        if not boards:
            raise SystemExit(f"MODBRIDGE_WHEEL_IMAGES={src}: no <board>/image.json there")
        for board in boards:
            missing = [n for n in IMAGE_FILES if not (board / n).is_file()]
            if missing:
                raise SystemExit(f"{board}: {', '.join(missing)} missing")
            (dest / board.name).mkdir(parents=True, exist_ok=True)
            for name in IMAGE_FILES:
                shutil.copyfile(board / name, dest / board.name / name)


setup(cmdclass={"build_py": BuildPy})
