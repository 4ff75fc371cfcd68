"""The MicroPython source tree and cached builds of its ports (stm32, qemu).

Two functions are the interface:

- :func:`source_dir` finds the MicroPython v1.28.0 tree: ``$MICROPY_DIR`` if set;
  else ``build/micropython-1.28.0`` (unpacked from ``../shared/micropython/
  micropython-1.28.0.tar.xz`` beside the checkout when that tarball exists); else, only
  when asked (``allow_clone=True``, what ``make micropython`` passes), a clone of the
  pinned upstream release with the submodules the builds use. Tests and CI never
  download: without a tree :class:`SourceMissing` says how to provide one.
- :func:`cached_build` runs ``make -C ports/<port> BOARD=... BUILD=... -j2`` with the
  firmware frozen from a manifest, in ``build/mp-cache/<key>/``, where ``key`` hashes
  every input: the make variables, the MicroPython version and commit, the manifest's
  text (and every manifest it includes), the bytes of every file it freezes, and any
  extra ``inputs`` (patched linker scripts, C files of a user module). A second call
  with the same inputs finds the folder complete and does not run make. Make itself
  does not rebuild objects when a define changes, which is why a change of inputs gets
  a fresh folder rather than an incremental build.

``mpy-cross`` of the tree is built once per tree (``build/mp-cache/mpy-cross-<key>``)
and handed to every port build.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "1.28.0"
#: The release's commit (tag v1.28.0), also the one ../shared's tarball was cut from.
RELEASE_COMMIT = "e0e9fbb17ed6fd06bb76e266ae554784c9c80804"
UPSTREAM = "https://github.com/micropython/micropython.git"
#: Submodules the stm32 and qemu builds use (the rest of lib/ is not needed).
SUBMODULES = ("lib/micropython-lib", "lib/stm32lib", "lib/tinyusb", "lib/littlefs")

REPO_ROOT = Path(__file__).resolve().parent.parent
#: In an installed wheel REPO_ROOT is modbridge/_fw/ (read-only site-packages): builds
#: go to $MODBRIDGE_BUILD_DIR, else ~/.cache/modbridge/build; in a checkout to build/.
INSTALLED = REPO_ROOT.name == "_fw" and (REPO_ROOT.parent / "__init__.py").is_file()
BUILD_ROOT = (
    Path(
        os.environ.get("MODBRIDGE_BUILD_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "modbridge" / "build"
    )
    if INSTALLED
    else REPO_ROOT / "build"
)
TREE_NAME = f"micropython-{VERSION}"
SHARED_TARBALL = REPO_ROOT.parent / "shared" / "micropython" / f"{TREE_NAME}.tar.xz"
CACHE_DIR = BUILD_ROOT / "mp-cache"
JOBS = 2
_COMPLETE = ".complete.json"  # written last: its presence means the build finished

HOW_TO_ENABLE = (
    "set MICROPY_DIR to a MicroPython v{v} checkout with submodules "
    "(git clone -b v{v} {url} && git -C micropython submodule update --init {subs}), "
    "or put {tar} beside the checkout at {shared}, or run `make micropython` to clone "
    "the release into build/"
).format(
    v=VERSION,
    url=UPSTREAM,
    subs=" ".join(SUBMODULES),
    tar=SHARED_TARBALL.name,
    shared=SHARED_TARBALL.parent,
)


class SourceMissing(RuntimeError):
    """No MicroPython tree is available; the message says how to provide one."""


class BuildError(RuntimeError):
    """make failed; the message carries the command and the end of its output."""


# --------------------------------------------------------------------------- source


def source_dir(allow_clone: bool = False, build_root: Path = BUILD_ROOT) -> Path:
    """The MicroPython v1.28.0 tree, unpacking the shared tarball if needed.

    ``allow_clone`` permits a network clone of the release (users only, never tests).
    """
    env = os.environ.get("MICROPY_DIR")
    if env:
        path = Path(env).expanduser().resolve()
        if not (path / "py" / "mpconfig.h").is_file():
            raise SourceMissing(f"MICROPY_DIR={env} is not a MicroPython tree (no py/mpconfig.h)")
        return path
    tree = build_root / TREE_NAME
    if (tree / "py" / "mpconfig.h").is_file():
        return tree
    if SHARED_TARBALL.is_file():
        return unpack(SHARED_TARBALL, build_root)
    if allow_clone:
        return clone(tree)
    raise SourceMissing("no MicroPython source: " + HOW_TO_ENABLE)


def unpack(tarball: Path, build_root: Path) -> Path:
    """Unpack ``tarball`` (which holds ``micropython-<v>/``) into ``build_root``.

    Unpacks into a temporary folder first and renames it, so an interrupted unpack
    never looks like a tree; under a lock, so that two processes wanting it at once
    (pytest-xdist workers, two test runs side by side) unpack it once."""
    build_root.mkdir(parents=True, exist_ok=True)
    tree = build_root / TREE_NAME
    with _locked(tree):
        if (tree / "py" / "mpconfig.h").is_file():
            return tree  # unpacked by another process while we waited
        tmp = build_root / f".{TREE_NAME}.unpacking"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")
        (tmp / TREE_NAME).rename(tree)
        tmp.rmdir()
    return tree


def clone(dest: Path) -> Path:
    """Clone the pinned release with the submodules the builds use (network)."""
    git = shutil.which("git")
    if git is None:
        raise SourceMissing("cloning MicroPython needs git; or " + HOW_TO_ENABLE)
    tmp = dest.with_name("." + dest.name + ".cloning")
    shutil.rmtree(tmp, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [git, "clone", "--depth", "1", "--branch", f"v{VERSION}", UPSTREAM, str(tmp)],
        check=True,
    )
    subprocess.run(
        [git, "-C", str(tmp), "submodule", "update", "--init", "--depth", "1", *SUBMODULES],
        check=True,
    )
    tmp.rename(dest)
    return dest


def source_identity(src: Path) -> str:
    """``<version>@<commit>`` of a tree: its git HEAD if it is a checkout, else the
    release commit (an unpacked release tarball carries no git metadata)."""
    text = (src / "py" / "mpconfig.h").read_text()
    parts = [
        re.search(rf"#define MICROPY_VERSION_{p} (\d+)", text) for p in ("MAJOR", "MINOR", "MICRO")
    ]
    version = ".".join(m.group(1) if m else "?" for m in parts)
    commit = RELEASE_COMMIT
    if (src / ".git").exists() and shutil.which("git"):
        out = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        if out.returncode == 0:
            commit = out.stdout.strip()
    return f"{version}@{commit}"


def toolchain_missing(port: str = "qemu") -> str | None:
    """None if the tools a ``port`` build (and, for qemu, its run) needs are on PATH,
    else a message naming what is missing and the Debian packages that provide it."""
    need = {"arm-none-eabi-gcc": "gcc-arm-none-eabi", "make": "make"}
    if port == "qemu":
        need["qemu-system-arm"] = "qemu-system-arm"
    missing = [tool for tool in need if shutil.which(tool) is None]
    if not missing:
        return None
    pkgs = sorted({need[t] for t in missing} | {"libnewlib-arm-none-eabi"} - {"make"})
    return f"{', '.join(missing)} not found (Debian: apt-get install {' '.join(pkgs)})"


# --------------------------------------------------------------------------- hashing


def manifest_files(
    manifest: Path, src: Path, port: str, board_dir: Path
) -> tuple[list[Path], list[Path]]:
    """(frozen source files, manifest files) that ``manifest`` refers to, resolved by
    MicroPython's own manifest reader (tools/manifestfile.py), sorted."""
    tools = str(src / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import manifestfile  # noqa: PLC0415 - lives in the MicroPython tree

    path_vars = {
        "MPY_DIR": str(src),
        "MPY_LIB_DIR": str(src / "lib" / "micropython-lib"),
        "PORT_DIR": str(src / "ports" / port),
        "BOARD_DIR": str(board_dir),
    }
    m = manifestfile.ManifestFile(manifestfile.MODE_FREEZE, path_vars)
    m.execute(str(manifest))
    frozen = sorted({Path(f.full_path) for f in m.files()})
    manifests = sorted({Path(p) for p in m._visited} | {manifest.resolve()})
    return frozen, manifests


def input_key(
    identity: str,
    port: str,
    board: str,
    make_vars: Mapping[str, str],
    files: Iterable[Path],
) -> str:
    """The cache key: sha256 over the tree's identity, port, board, make variables
    (sorted) and the path and bytes of every input file (sorted by path)."""
    h = hashlib.sha256()

    def put(label: str, data: bytes) -> None:
        h.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    put("identity", identity.encode())
    put("port", port.encode())
    put("board", board.encode())
    for name in sorted(make_vars):
        put("var:" + name, str(make_vars[name]).encode())
    for path in sorted({Path(p).resolve() for p in files}):
        put("file:" + _display(path), path.read_bytes())
    return h.hexdigest()[:20]


def _display(path: Path) -> str:
    """A path as hashed: relative to the checkout when inside it, so the key does not
    depend on where the checkout lives."""
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.as_posix()


# --------------------------------------------------------------------------- building


@dataclass
class Build:
    """A finished build: its folder, key, and artefacts by suffix (``elf``, ``bin``,
    ``hex``, ``dfu``, whichever the port produced)."""

    key: str
    build_dir: Path
    artefacts: dict[str, Path] = field(default_factory=dict)
    rebuilt: bool = False  # False: found complete in the cache


def mpy_cross(src: Path, cache_dir: Path = CACHE_DIR) -> Path:
    """The tree's mpy-cross, built once into ``cache_dir/mpy-cross-<key>/``."""
    key = input_key(source_identity(src), "mpy-cross", "-", {}, [])
    out = cache_dir / f"mpy-cross-{key}"
    exe = out / "mpy-cross"
    with _locked(out):
        if (out / _COMPLETE).is_file() and exe.is_file():
            return exe
        shutil.rmtree(out, ignore_errors=True)
        _make(src / "mpy-cross", {"BUILD": str(out)})
        (out / _COMPLETE).write_text(json.dumps({"source": str(src)}) + "\n")
    return exe


@contextlib.contextmanager
def _locked(out: Path):
    """Hold ``<out>.lock`` (flock): two processes wanting the same build (pytest
    workers, a bench beside a test run) build it once; the second one waits."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_build(
    port: str,
    board: str,
    make_vars: Mapping[str, str] | None = None,
    manifest: Path | None = None,
    inputs: Iterable[Path] = (),
    src: Path | None = None,
    cache_dir: Path = CACHE_DIR,
) -> Build:
    """Build ``ports/<port>`` for ``board`` with ``manifest`` frozen, or reuse the
    build in the cache folder of the same inputs.

    ``make_vars`` are passed on make's command line (``MICROPY_HEAP_SIZE``, ``LDSCRIPT``,
    ``USER_C_MODULES``...); ``inputs`` are further files whose bytes the build depends
    on (a patched linker script, a user C module's sources).
    """
    src = src or source_dir()
    make_vars = dict(make_vars or {})
    files = list(inputs)
    board_dir = src / "ports" / port / "boards" / board
    if manifest is not None:
        manifest = Path(manifest).resolve()
        frozen, manifests = manifest_files(manifest, src, port, board_dir)
        files += frozen + manifests
        make_vars["FROZEN_MANIFEST"] = str(manifest)
    key = input_key(source_identity(src), port, board, make_vars, files)
    out = cache_dir / f"{port}-{board}-{key}"
    if (out / _COMPLETE).is_file():
        return Build(key, out, _artefacts(out), rebuilt=False)
    cross = mpy_cross(src, cache_dir)
    with _locked(out):
        if (out / _COMPLETE).is_file():  # built by another process while we waited
            return Build(key, out, _artefacts(out), rebuilt=False)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        _make(
            src / "ports" / port,
            {"BOARD": board, **make_vars, "BUILD": str(out), "MICROPY_MPYCROSS": str(cross)},
            log=out / "make.log",
        )
        record = {"port": port, "board": board, "make_vars": make_vars, "source": str(src)}
        record["inputs"] = sorted(_display(Path(p).resolve()) for p in files)
        (out / _COMPLETE).write_text(json.dumps(record, indent=1) + "\n")
    return Build(key, out, _artefacts(out), rebuilt=True)


def _artefacts(out: Path) -> dict[str, Path]:
    return {
        p.suffix[1:]: p
        for p in sorted(out.glob("firmware.*"))
        if p.suffix[1:] in ("elf", "bin", "hex", "dfu")
    }


def _make(directory: Path, make_vars: Mapping[str, str], log: Path | None = None) -> None:
    cmd = ["make", "-C", str(directory), f"-j{JOBS}"] + [f"{k}={v}" for k, v in make_vars.items()]
    env = dict(os.environ)
    src = directory.parent if directory.name == "mpy-cross" else directory.parent.parent
    if not (src / ".git").exists():
        # An unpacked release: without this, MicroPython's version header would
        # describe whatever git repository encloses build/ (the project's).
        env.setdefault("MICROPY_GIT_TAG", f"v{VERSION}")
        env.setdefault("MICROPY_GIT_HASH", RELEASE_COMMIT[:10])
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    if log is not None:
        log.write_text(proc.stdout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise BuildError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")


def main(argv: list[str] | None = None) -> int:
    """``python -m firmware.mpsource [--clone]``: print the tree, fetching it with
    ``--clone`` when there is none (``make micropython``)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        print(source_dir(allow_clone="--clone" in argv))
    except SourceMissing as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
