"""Quick look at the firmware's heap on 32-bit ARM (the qemu image of bench_arm.py).

    python -m bench.arm_heap [BOARD]

Prints ``mode heap``'s per-module import breakdown (bytes each firmware module leaves
in the heap when imported, leaves first) and, after ``App(hal)`` + ``boot()``, what
each of the App's attributes holds exclusively: the bytes freed when that one
attribute is set to None (an object shared with another attribute frees nothing, so
the rows do not add up to ``app_objects``), with the attribute count of its instance
dict. With a BOARD (blackpill_f411, nucleo_f411re, pyboard_v11): the same as that
board ships (``mode heap_board`` after bench_arm.store_as_flashed: the board's real
HAL on bench/fakemachine.py, the factory config stored), and the HAL's attributes
too. An aid for iterating on the budget; the keys come from ``bench.run arm``.
"""

from __future__ import annotations

import json
import sys

from bench.bench_arm import TARGET, _last_json, store_as_flashed
from firmware import qemu

SIM_BOOT = """
import gc, json
import mpy_firmware_bench as B
B.import_firmware()
fakehal, hal = B.make_board()
app = B.boot(fakehal, hal)
"""
BOARD_BOOT = """
import gc, json, fakemachine
import mpy_firmware_bench as B
B.import_firmware()
from device import main as dmain
hal = dmain.make_hal({board!r}, fakemachine)
app = B.boot(None, hal)
"""
PER_OBJECT = """
out = {{}}
for obj in ({objs}):
  names = sorted(obj.__dict__)
  for name in names:
    v = getattr(obj, name)
    if v is None or isinstance(v, (int, bool)) or callable(v):
        continue
    n = len(v.__dict__) if hasattr(v, '__dict__') else -1
    v = None
    gc.collect()
    a = gc.mem_alloc()
    keep = getattr(obj, name)
    setattr(obj, name, None)
    keep = None
    gc.collect()
    b = gc.mem_alloc()
    out[name] = [a - b, n]
print(json.dumps({{"attrs": len(names), "objects": out}}))
"""


def main(argv: list[str]) -> None:
    board = argv[0] if argv else None
    elf = qemu.image(TARGET).artefacts["elf"]
    prep = ""
    if board:
        import importlib

        prep = store_as_flashed(importlib.import_module(f"boards.{board}").FS_DIR)
        mode = f"'heap_board', {board!r}"
        boot = BOARD_BOOT.format(board=board) + PER_OBJECT.format(objs="hal, app")
    else:
        mode = "'heap'"
        boot = SIM_BOOT + PER_OBJECT.format(objs="app,")
    with qemu.Session(elf, target=TARGET) as s:
        if prep:
            s.check(prep)
        heap = _last_json(
            s.check(f"import mpy_firmware_bench\nmpy_firmware_bench.main(['', {mode}])")
        )
    mods = heap.pop("modules")
    print(json.dumps(heap))
    for name, n in sorted(mods.items(), key=lambda kv: -kv[1]):
        print(f"  {n:6d}  {name}")
    print(f"  {sum(mods.values()):6d}  (sum)")
    with qemu.Session(elf, target=TARGET) as s:
        if prep:
            s.check(prep)
        res = s.run(boot, timeout_s=600)
    if res.err:
        raise SystemExit(res.err + res.out)
    per = _last_json(res.out)
    print(f"App attributes: {per['attrs']}")
    for name, (n, k) in sorted(per["objects"].items(), key=lambda kv: -kv[1][0]):
        print(f"  {n:6d}  {name}  ({k} attrs)" if k >= 0 else f"  {n:6d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
