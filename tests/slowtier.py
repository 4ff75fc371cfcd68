"""The fast tier (`make check`) and the slow one, from measured durations.

A test is ``slow`` when a full run took it at least :data:`SLOW_S`; every
``[qemu-arm]`` item is slow (the column builds and boots an ARM image), and so is every
``[micropython]`` item of a module whose MicroPython run took :data:`MODULE_SLOW_S` or
more (one interpreter process runs the whole module, so its items go together).
``make check`` deselects them (``-m "not slow"``): under 3 minutes on the 2-core
machine. ``make test`` runs everything, as CI does.

The list is data, kept in ``tests/slow_tests.txt``; after a ``make test`` (which writes
``build/junit.xml``) ``make durations`` rewrites it:

    python tests/slowtier.py build/junit.xml

A new test not in the list counts as fast until the list is written again.

The same command writes ``tests/file_seconds.txt``: each test file's measured seconds.
Under pytest-xdist (``make test`` runs two workers, whole files each: ``--dist
loadfile``) the files are handed out longest first (conftest), so that no worker is
left with a long file at the end while the other idles.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

SLOW_S = 0.5
MODULE_SLOW_S = 2.0
LIST = Path(__file__).resolve().parent / "slow_tests.txt"
FILE_SECONDS = LIST.with_name("file_seconds.txt")
MPY = "[micropython]"
ARM = "[qemu-arm]"


def nodeid(classname: str, name: str) -> str:
    """pytest's node id from junit's ``classname`` (``tests.test_x.Class``) and name."""
    parts = classname.split(".")
    # the module is the first part named test_*: tests/qemu/test_x.py is tests.qemu.test_x
    i = next((k for k, p in enumerate(parts) if p.startswith("test_")), 1)
    path = "/".join(parts[: i + 1]) + ".py"
    return "::".join([path, *parts[i + 1 :], name])


def slow_ids(junit: Path) -> list[str]:
    cases = [(c.get("classname") or "", c.get("name") or "", float(c.get("time") or 0))
             for c in ET.parse(junit).getroot().iter("testcase")]  # fmt: skip
    module_mpy = Counter()
    for cl, name, t in cases:
        if name.endswith(MPY):
            module_mpy[cl.split(".")[1] if "." in cl else cl] += t
    out = set()
    for cl, name, t in cases:
        mod = cl.split(".")[1] if "." in cl else cl
        if name.endswith(ARM):
            continue  # all of them, by rule (conftest)
        if name.endswith(MPY):
            if module_mpy[mod] >= MODULE_SLOW_S:
                out.add(nodeid(cl, name))
        elif t >= SLOW_S:
            out.add(nodeid(cl, name))
    return sorted(out)


def file_seconds(junit: Path) -> dict[str, float]:
    """Each test file's measured seconds (its items' times summed)."""
    out: Counter = Counter()
    for c in ET.parse(junit).getroot().iter("testcase"):
        path = nodeid(c.get("classname") or "", "").split("::", 1)[0]
        out[path] += float(c.get("time") or 0)
    return dict(out)


def load_file_seconds(path: Path = FILE_SECONDS) -> dict[str, float]:
    """``tests/file_seconds.txt`` as {path: seconds}; a line that does not parse, or a
    missing file, is left out (the order it gives is an optimisation only)."""
    out = {}
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return out
    for ln in lines:
        parts = ln.split()
        if len(parts) == 2 and not ln.startswith("#"):
            try:
                out[parts[1]] = float(parts[0])
            except ValueError:
                continue
    return out


def longest_files_first(paths: list[str], seconds: dict[str, float]) -> list[str]:
    """``paths`` (each once) by measured seconds, longest first; unmeasured files (new
    ones) after them in their own order."""
    order = {p: i for i, p in enumerate(paths)}
    return sorted(order, key=lambda p: (-seconds.get(p, 0.0), order[p]))


def load(path: Path = LIST) -> set[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return set()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def is_slow(nodeid_: str, listed: set[str]) -> bool:
    return nodeid_.endswith(ARM) or nodeid_ in listed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/slowtier.py build/junit.xml", file=sys.stderr)
        return 2
    ids = slow_ids(Path(argv[0]))
    LIST.write_text(
        "# Tests a full run measured at >= 0.5 s (and the [micropython] items of modules\n"
        "# whose MicroPython run took >= 2 s): `make check` leaves them out. Written by\n"
        "# `make durations` (tests/slowtier.py) from build/junit.xml; do not edit.\n"
        + "".join(i + "\n" for i in ids),
        encoding="utf-8",
    )
    print(f"{LIST}: {len(ids)} slow tests")
    secs = file_seconds(Path(argv[0]))
    FILE_SECONDS.write_text(
        "# Each test file's seconds in a full run, longest first: pytest-xdist hands them\n"
        "# out in this order (conftest). Written by `make durations`; do not edit.\n"
        + "".join(f"{t:.1f} {p}\n" for p, t in sorted(secs.items(), key=lambda kv: -kv[1])),
        encoding="utf-8",
    )
    print(f"{FILE_SECONDS}: {len(secs)} files, {sum(secs.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
