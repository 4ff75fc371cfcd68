"""Quick look at the firmware's heap on 32-bit ARM (the qemu image of bench_arm.py).

    python -m bench.arm_heap

Prints ``mode heap``'s per-module import breakdown (bytes each firmware module leaves
in the heap when imported, leaves first) and, after ``App(hal)`` + ``boot()``, what
each of the App's attributes holds exclusively: the bytes freed when that one
attribute is set to None (an object shared with another attribute frees nothing, so
the rows do not add up to ``app_objects``), with the attribute count of its instance
dict. An aid for iterating on the budget; the keys come from ``bench.run arm``.
"""

from __future__ import annotations

import json

from bench.bench_arm import TARGET, _last_json
from firmware import qemu

PER_OBJECT = """
import gc, json
import mpy_firmware_bench as B
B.import_firmware()
fakehal, hal = B.make_board()
app = B.boot(fakehal, hal)
out = {}
names = sorted(app.__dict__)
for name in names:
    v = getattr(app, name)
    if v is None or isinstance(v, (int, bool)):
        continue
    n = len(v.__dict__) if hasattr(v, '__dict__') else -1
    v = None
    gc.collect()
    a = gc.mem_alloc()
    keep = getattr(app, name)
    setattr(app, name, None)
    keep = None
    gc.collect()
    b = gc.mem_alloc()
    out[name] = [a - b, n]
print(json.dumps({"attrs": len(names), "objects": out}))
"""


def main() -> None:
    elf = qemu.image(TARGET).artefacts["elf"]
    with qemu.Session(elf, target=TARGET) as s:
        heap = _last_json(
            s.check("import mpy_firmware_bench\nmpy_firmware_bench.main(['', 'heap'])")
        )
    mods = heap.pop("modules")
    print(json.dumps(heap))
    for name, n in sorted(mods.items(), key=lambda kv: -kv[1]):
        print(f"  {n:6d}  {name}")
    print(f"  {sum(mods.values()):6d}  (sum)")
    with qemu.Session(elf, target=TARGET) as s:
        res = s.run(PER_OBJECT, timeout_s=600)
    if res.err:
        raise SystemExit(res.err + res.out)
    per = _last_json(res.out)
    print(f"App attributes: {per['attrs']}")
    for name, (n, k) in sorted(per["objects"].items(), key=lambda kv: -kv[1][0]):
        print(f"  {n:6d}  {name}  ({k} attrs)" if k >= 0 else f"  {n:6d}  {name}")


if __name__ == "__main__":
    main()
