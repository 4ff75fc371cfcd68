"""firmware.mpsource: finding the MicroPython tree, hashing build inputs, the cache."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from firmware import mpsource as M


def _fake_tree(root: Path) -> Path:
    tree = root / M.TREE_NAME
    (tree / "py").mkdir(parents=True)
    (tree / "py" / "mpconfig.h").write_text(
        "#define MICROPY_VERSION_MAJOR 1\n#define MICROPY_VERSION_MINOR 28\n"
        "#define MICROPY_VERSION_MICRO 0\n"
    )
    return tree


def test_source_dir_prefers_micropy_dir(tmp_path, monkeypatch):
    tree = _fake_tree(tmp_path / "user")
    monkeypatch.setenv("MICROPY_DIR", str(tree))
    assert M.source_dir(build_root=tmp_path / "build") == tree.resolve()


def test_source_dir_rejects_a_micropy_dir_that_is_not_a_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROPY_DIR", str(tmp_path))
    with pytest.raises(M.SourceMissing, match="no py/mpconfig.h"):
        M.source_dir(build_root=tmp_path / "build")


def test_source_dir_without_anything_says_how_to_enable(tmp_path, monkeypatch):
    monkeypatch.delenv("MICROPY_DIR", raising=False)
    monkeypatch.setattr(M, "SHARED_TARBALL", tmp_path / "absent.tar.xz")
    with pytest.raises(M.SourceMissing) as e:
        M.source_dir(build_root=tmp_path / "build")
    assert "MICROPY_DIR" in str(e.value) and "make micropython" in str(e.value)
    assert not (tmp_path / "build" / M.TREE_NAME).exists()  # nothing cloned


def test_source_dir_unpacks_the_tarball_once(tmp_path, monkeypatch):
    monkeypatch.delenv("MICROPY_DIR", raising=False)
    tree = _fake_tree(tmp_path / "src")
    tarball = tmp_path / "mp.tar.xz"
    with tarfile.open(tarball, "w:xz") as tar:
        tar.add(tree, arcname=M.TREE_NAME)
    monkeypatch.setattr(M, "SHARED_TARBALL", tarball)
    build = tmp_path / "build"
    got = M.source_dir(build_root=build)
    assert got == build / M.TREE_NAME and (got / "py" / "mpconfig.h").is_file()
    tarball.unlink()  # the second call uses the unpacked tree
    assert M.source_dir(build_root=build) == got
    assert M.source_identity(got) == "1.28.0@" + M.RELEASE_COMMIT


def test_input_key_covers_vars_and_file_bytes_not_order(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    key = M.input_key("1.28.0@c", "qemu", "NETDUINO2", {"H": "1", "G": "2"}, [a, b])
    assert key == M.input_key("1.28.0@c", "qemu", "NETDUINO2", {"G": "2", "H": "1"}, [b, a])
    assert key != M.input_key("1.28.0@d", "qemu", "NETDUINO2", {"H": "1", "G": "2"}, [a, b])
    assert key != M.input_key("1.28.0@c", "qemu", "NETDUINO2", {"H": "2", "G": "2"}, [a, b])
    assert key != M.input_key("1.28.0@c", "qemu", "MPS2", {"H": "1", "G": "2"}, [a, b])
    a.write_text("x = 3\n")
    assert key != M.input_key("1.28.0@c", "qemu", "NETDUINO2", {"H": "1", "G": "2"}, [a, b])


def _tree_with_manifest_reader(tmp_path: Path) -> Path:
    """A fake tree whose tools/ is the real manifestfile.py (from the real tree)."""
    real = M.source_dir()
    tree = _fake_tree(tmp_path)
    shutil.copytree(real / "tools", tree / "tools", ignore=shutil.ignore_patterns("*.a"))
    (tree / "ports" / "qemu" / "boards" / "B").mkdir(parents=True)
    return tree


def test_cached_build_hashes_frozen_files_and_reuses_a_complete_build(tmp_path, monkeypatch):
    try:
        tree = _tree_with_manifest_reader(tmp_path / "tree")
    except M.SourceMissing as e:
        pytest.skip(str(e))
    app = tmp_path / "app"
    app.mkdir()
    (app / "mod.py").write_text("A = 1\n")
    manifest = tmp_path / "manifest.py"
    manifest.write_text(f"module('mod.py', base_path={str(app)!r})\n")
    calls = []

    def fake_make(directory, make_vars, log=None):
        calls.append((Path(directory).name, dict(make_vars)))
        if "BOARD" in make_vars:
            (Path(make_vars["BUILD"]) / "firmware.elf").write_bytes(b"\x7fELF")
        else:
            Path(make_vars["BUILD"]).mkdir(parents=True, exist_ok=True)
            (Path(make_vars["BUILD"]) / "mpy-cross").write_bytes(b"")

    monkeypatch.setattr(M, "_make", fake_make)
    cache = tmp_path / "cache"
    first = M.cached_build("qemu", "B", {"X": "1"}, manifest, src=tree, cache_dir=cache)
    assert first.rebuilt and first.artefacts["elf"].read_bytes() == b"\x7fELF"
    assert [c[0] for c in calls] == ["mpy-cross", "qemu"]
    port_vars = calls[1][1]
    assert port_vars["BOARD"] == "B" and port_vars["X"] == "1"
    assert port_vars["BUILD"] == str(first.build_dir)
    assert port_vars["FROZEN_MANIFEST"] == str(manifest.resolve())
    record = json.loads((first.build_dir / M._COMPLETE).read_text())
    assert str(app / "mod.py") in record["inputs"]

    again = M.cached_build("qemu", "B", {"X": "1"}, manifest, src=tree, cache_dir=cache)
    assert not again.rebuilt and again.build_dir == first.build_dir and len(calls) == 2

    (app / "mod.py").write_text("A = 2\n")  # a frozen file changed: a new build
    third = M.cached_build("qemu", "B", {"X": "1"}, manifest, src=tree, cache_dir=cache)
    assert third.rebuilt and third.key != first.key
    assert [c[0] for c in calls] == ["mpy-cross", "qemu", "qemu"]  # mpy-cross once


def test_failed_make_is_not_cached(tmp_path, monkeypatch):
    tree = _fake_tree(tmp_path / "tree")
    (tree / "mpy-cross").mkdir()
    (tree / "mpy-cross" / "Makefile").write_text("all:\n\t@echo broken-on-purpose; exit 3\n")
    with pytest.raises(M.BuildError, match="broken-on-purpose"):
        M.mpy_cross(tree, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob(f"*/{M._COMPLETE}"))


def test_mpy_cross_of_the_tree_is_built_once_and_compiles(tmp_path):
    """Integration: the real tree's mpy-cross (needs a C compiler and the source)."""
    try:
        src = M.source_dir()
    except M.SourceMissing as e:
        pytest.skip(str(e))
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    exe = M.mpy_cross(src)
    stamp = exe.parent / M._COMPLETE
    mtime = stamp.stat().st_mtime_ns
    assert M.mpy_cross(src) == exe and stamp.stat().st_mtime_ns == mtime  # cached
    (tmp_path / "m.py").write_text("def f(x):\n    return x + 1\n")
    import subprocess

    subprocess.run([str(exe), "-march=armv7m", str(tmp_path / "m.py")], check=True)
    assert (tmp_path / "m.mpy").read_bytes()[:2] == b"M\x06"
