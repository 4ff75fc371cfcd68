"""MicroPython stm32 images with the module firmware frozen in (``make firmware``).

``build_image(board)`` builds MicroPython v1.28.0's stm32 port for one of this
project's stm32 boards with ``boards/manifests/<board>.py`` frozen, through
:func:`firmware.mpsource.cached_build` (a second build of the same inputs reuses the
cached folder), and puts what the flash tools need in ``build/firmware/<board>/``:

- ``firmware.dfu``: both flash regions, for ``dfu-util`` (the ROM bootloader's DFU);
- ``firmware.hex``: both regions with their addresses;
- ``firmware0.bin`` (sector 0, at 0x08000000) and ``firmware1.bin`` (the application
  region, at 0x08020000), written separately by ``st-flash`` so the filesystem sectors
  between them (config, calibration, the signing key) are kept;
- ``firmware.bin``: one contiguous image from 0x08000000 (the filesystem sectors
  filled with 0xFF, so it erases the filesystem), for a NUCLEO's ST-LINK drive;
- ``image.json``: sizes, and the headroom left in each flash region of the board's
  linker script.

MicroPython's features the firmware does not use are switched off (:data:`TRIM`) in a
copy of the upstream board folder (``build/firmware/boards/<MP board>/``, the upstream
``mpconfigboard.h`` plus the defines below), so each image fits its 384 KB (F411) or
896 KB (F405) application region with room to spare.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from firmware import mpsource

REPO_ROOT = mpsource.REPO_ROOT
MANIFESTS = REPO_ROOT / "boards" / "manifests"
OUT_ROOT = mpsource.BUILD_ROOT / "firmware"


@dataclass(frozen=True)
class Board:
    mp_board: str  # the board folder in ports/stm32/boards/
    linker_script: str  # the first of its LD_FILES: it holds the MEMORY regions
    flash_method: str  # how a user writes the image (host/modbridge/tools/flash.py)


BOARDS = {
    "blackpill_f411": Board("WEACT_F411_BLACKPILL", "stm32f411.ld", "dfu"),
    "nucleo_f411re": Board("NUCLEO_F411RE", "stm32f411.ld", "stlink"),
    "pyboard_v11": Board("PYBV11", "stm32f405.ld", "dfu"),
}

#: make variables of every image build. btree needs lib/berkeley-db-1.xx, which the
#: shared source does not hold, and the firmware does not use it.
MAKE_VARS = {"MICROPY_PY_BTREE": "0"}

#: (define, value, why it can go). Appended to the board's mpconfigboard.h; each is
#: a ``#ifndef``-guarded default upstream, so the board-level value wins. Checked
#: against what device/, protocol/ and boards/ import (`grep -rn import device
#: protocol boards`): os, sys, time, gc, math, struct, array, select, micropython,
#: machine; nothing else. Kept although unused: machine's CAN (the pyboard's pyb.CAN
#: links against it), FAT (the stm32 port formats a fresh filesystem as FAT),
#: littlefs2, hashlib and binascii (small; mpremote's file commands may use them).
TRIM = (
    ("MICROPY_EMIT_THUMB", 0, "no @native/@viper code in the firmware (re-enable to add some)"),
    ("MICROPY_EMIT_INLINE_THUMB", 0, "no @asm_thumb code"),
    ("MICROPY_PY_ASYNCIO", 0, "the control loop is a plain loop, no asyncio"),
    ("MICROPY_PY_HEAPQ", 0, "only asyncio would use it"),
    ("MICROPY_PY_FRAMEBUF", 0, "no display"),
    ("MICROPY_PY_DEFLATE", 0, "nothing compressed"),
    ("MICROPY_PY_JSON", 0, "protocol/jsonparse.py and jsonl.py are the firmware's own JSON"),
    ("MICROPY_PY_RE", 0, "no regular expressions"),
    ("MICROPY_PY_UCTYPES", 0, "no C structs"),
    ("MICROPY_PY_CMATH", 0, "no complex math"),
    ("MICROPY_PY_MATH_SPECIAL_FUNCTIONS", 0, "erf/gamma unused (calibration uses log/exp)"),
    ("MICROPY_PY_MATH_FACTORIAL", 0, "unused"),
    ("MICROPY_PY_BUILTINS_COMPLEX", 0, "no complex numbers (fixed point; cmath is off already)"),
    ("MICROPY_PY_RANDOM", 0, "unused (the signing nonce comes from os.urandom where present)"),
    ("MICROPY_PY_PLATFORM", 0, "unused"),
    ("MICROPY_PY_COLLECTIONS_DEQUE", 0, "ring buffers are preallocated arrays"),
    ("MICROPY_PY_COLLECTIONS_ORDEREDDICT", 0, "unused"),
    ("MICROPY_PY_BUILTINS_HELP", 0, "no help() text on a module's REPL"),
    ("MICROPY_PY_BUILTINS_INPUT", 0, "input() unused; the REPL and mpremote do not need it"),
    ("MICROPY_PY_NETWORK", 0, "no network interface on these boards"),
    ("MICROPY_PY_ONEWIRE", 0, "no 1-Wire sensors (NTCs on the ADC)"),
    ("MICROPY_PY_MACHINE_BITSTREAM", 0, "no NeoPixels"),
    ("MICROPY_PY_STM", 0, "no raw register access (stm.mem32 and its constant tables)"),
    ("MICROPY_PY_PYB_LEGACY", 0, "the firmware uses machine, not pyb's legacy functions"),
    ("MICROPY_HW_ENABLE_SERVO", 0, "no hobby servos"),
    (
        "MICROPY_HW_USB_MSC",
        0,
        "no USB mass storage: a PC mounting the FAT filesystem while the firmware "
        "writes its config would corrupt it; mpremote reaches files over the REPL",
    ),
)


#: MicroPython's pystack, in words (4 bytes each), on every image: the stm32 boards
#: here and the qemu test image (firmware/qemu.py copies this value). Every bytecode
#: call's frame (its code state) then comes from this fixed static array in .bss,
#: never from the GC heap. Without it py/objfun.c (v1.28, VM_MAX_STATE_ON_STACK = 11
#: words) puts each frame over 11 words on the GC heap and frees it on return: a
#: gc_alloc per call, whose search through a fragmented heap made the tick's cost
#: depend on the heap layout (bench/bench_arm.py: max 11.22 % of a 96 MHz core at
#: 100 ms without, 9.2 % with), and transient blocks that fragment the F411's heap
#: (bench/bench_arm_stress.py failed at reboot in both modes without it).
#:
#: Why 768 and not the stm32 port's own 384 (``static mp_obj_t pystack[384]`` in
#: ports/stm32/main.c, used only where a board enables it; these boards do not): the
#: deepest use measured is 602 words (2,408 B) by the firmware in the fragmentation
#: stress and 632 words (2,528 B) by the DUAL tests' [qemu-arm] column (the high-water
#: mark of the qemu image's array, qemu_board.pystack_peak()); at 384 words 88 of the
#: column's 740 items failed with "pystack exhausted", at 768 none. 768 is the deepest
#: use plus 21 % (27 % over the firmware's own): 3 KB of .bss, which the GC heap gives
#: up (gc_heap_bytes_<board> in image.json).
#:
#: Exhausted, ``mp_pystack_alloc`` raises RuntimeError("pystack exhausted") in the
#: calling code: an exception like any other, which the firmware's command dispatch
#: answers as ``nack internal`` and the control loop's tick survives
#: (tests/qemu/test_pystack.py runs that on the image).
PYSTACK_WORDS = 768

#: (define, value, why) MicroPython features the firmware turns ON, appended like TRIM.
ENABLE = (
    (
        "MICROPY_ENABLE_PYSTACK",
        1,
        f"bytecode frames from a fixed static pystack of {PYSTACK_WORDS} words "
        "(PYSTACK_WORDS; main.c's copy in the board folder sizes it), never from the GC "
        "heap per call: the tick's cost stops depending on the heap layout and calls "
        "leave no transient blocks",
    ),
)
#: The lines of upstream ports/stm32/main.c that the board folder's copy replaces
#: (:func:`patched_main_c`); an upstream main.c without them fails the build loudly.
PYSTACK_UPSTREAM = (
    "    static mp_obj_t pystack[384];\n    mp_pystack_init(pystack, &pystack[384]);\n"
)
PYSTACK_PATCHED = (
    f"    static mp_obj_t pystack[{PYSTACK_WORDS}];  // firmware/stm32.py PYSTACK_WORDS\n"
    f"    mp_pystack_init(pystack, &pystack[{PYSTACK_WORDS}]);\n"
)
#: Where the copy of main.c lives in the board folder: a subfolder, since the port's
#: Makefile compiles every ``$(BOARD_DIR)/*.c`` besides its own main.c.
MAIN_C_COPY = "pystack/main.c"
#: Appended to the board's mpconfigboard.mk: main.o from the copy. An explicit rule
#: with a recipe, so make takes it over the port's ``$(BUILD)/%.o: %.c`` pattern rule
#: (whose ``main.c`` is the upstream one in the port folder); compile_c (py/mkrules.mk)
#: compiles ``$<`` with the port's CFLAGS. main.c's quoted includes resolve through
#: the port's ``-I.`` (the port folder) as before. QSTR extraction still reads the
#: upstream main.c: the copy differs only in the array's size, no names.
MAIN_C_RULE = f"""
# ---- appended by firmware/stm32.py: main.o from {MAIN_C_COPY} (upstream main.c,
# ---- its pystack {PYSTACK_WORDS} words instead of 384: PYSTACK_WORDS there)
$(BUILD)/main.o: $(BOARD_DIR)/{MAIN_C_COPY}
\t$(call compile_c)
"""


class ImageError(RuntimeError):
    """The image cannot be built or does not fit; the message says why."""


def _region(ld_text: str, name: str) -> tuple[int, int]:
    """(origin, length in bytes) of a MEMORY region in a linker script."""
    m = re.search(
        rf"^\s*{name}\s*\([a-z]+\)\s*:\s*ORIGIN\s*=\s*(0x[0-9A-Fa-f]+)\s*,\s*LENGTH\s*=\s*(\d+)([KM]?)",
        ld_text,
        re.M,
    )
    if not m:
        raise ImageError(f"no {name} region in the linker script")
    scale = {"": 1, "K": 1024, "M": 1024 * 1024}[m.group(3)]
    return int(m.group(1), 16), int(m.group(2)) * scale


def trim_header() -> str:
    """The defines appended to the upstream mpconfigboard.h."""
    lines = [
        "",
        "// ---- appended by firmware/stm32.py: MicroPython features the module",
        "// ---- firmware does not use (the reasons are in TRIM there)",
    ]
    for name, value, _why in TRIM:
        lines += [f"#undef {name}", f"#define {name} ({value})"]
    lines += ["// ---- and features it turns on (ENABLE there)"]
    for name, value, _why in ENABLE:
        lines += [f"#undef {name}", f"#define {name} ({value})"]
    return "\n".join(lines) + "\n"


def patched_main_c(src: Path) -> str:
    """Upstream ports/stm32/main.c with the pystack :data:`PYSTACK_WORDS` words long.
    Raises :class:`ImageError` when upstream no longer has the lines it replaces."""
    main_c = (src / "ports" / "stm32" / "main.c").read_text()
    if main_c.count(PYSTACK_UPSTREAM) != 1:
        raise ImageError(
            "ports/stm32/main.c changed: it no longer declares and initialises its "
            f"pystack as\n{PYSTACK_UPSTREAM}(firmware/stm32.py sizes the pystack by "
            "replacing those lines in a copy; look at how main.c sets it up now)"
        )
    return main_c.replace(PYSTACK_UPSTREAM, PYSTACK_PATCHED)


def board_files(board: str, src: Path) -> dict[str, bytes]:
    """The trimmed board folder's files, relative path -> bytes: the upstream board
    folder's with :func:`trim_header` appended to mpconfigboard.h, :data:`MAIN_C_RULE`
    to mpconfigboard.mk, and the copy of main.c (:func:`patched_main_c`)."""
    upstream = src / "ports" / "stm32" / "boards" / BOARDS[board].mp_board
    files = {p.name: p.read_bytes() for p in upstream.iterdir() if p.is_file()}
    files["mpconfigboard.h"] += trim_header().encode()
    files["mpconfigboard.mk"] += MAIN_C_RULE.encode()
    files[MAIN_C_COPY] = patched_main_c(src).encode()
    return files


def _tree(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def board_dir(board: str, src: Path, out_root: Path = OUT_ROOT) -> Path:
    """The trimmed copy of the upstream board folder (rewritten only when it differs).
    Every file in it is an input of the build's cache key (:func:`build_image`)."""
    dest = out_root / "boards" / BOARDS[board].mp_board
    wanted = board_files(board, src)
    current = {}
    if dest.is_dir():
        current = {p.relative_to(dest).as_posix(): p.read_bytes() for p in _tree(dest)}
    if current != wanted:
        shutil.rmtree(dest, ignore_errors=True)
        for name, data in wanted.items():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(data)
    return dest


def _size(elf: Path) -> dict[str, int]:
    """text/data/bss of the ELF from ``arm-none-eabi-size`` (Berkeley format)."""
    out = subprocess.run(
        ["arm-none-eabi-size", str(elf)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    text, data, bss = (int(v) for v in out[1].split()[:3])
    return {"text": text, "data": data, "bss": bss}


def _symbols(elf: Path, names: tuple[str, ...]) -> dict[str, int]:
    out = subprocess.run(
        ["arm-none-eabi-nm", str(elf)], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] in names:
            found[parts[2]] = int(parts[0], 16)
    return found


def image_report(board: str, build_dir: Path, src: Path, key: str) -> dict:
    """Sizes of a finished build against the regions of the board's linker script."""
    spec = BOARDS[board]
    ld = (src / "ports" / "stm32" / "boards" / spec.linker_script).read_text()
    isr_origin, isr_len = _region(ld, "FLASH_START")
    text_origin, text_len = _region(ld, "FLASH_TEXT")
    _ram_origin, ram_len = _region(ld, "RAM")
    isr_used = (build_dir / "firmware0.bin").stat().st_size
    text_used = (build_dir / "firmware1.bin").stat().st_size
    elf = build_dir / "firmware.elf"
    sym = _symbols(elf, ("_heap_start", "_heap_end"))
    sizes = _size(elf)
    report = {
        "board": board,
        "micropython_board": spec.mp_board,
        "micropython": mpsource.source_identity(src),
        "cache_key": key,
        "flash_method": spec.flash_method,
        "isr_region": {"origin": hex(isr_origin), "length": isr_len, "used": isr_used},
        "text_region": {"origin": hex(text_origin), "length": text_len, "used": text_used},
        "flash_used_bytes": isr_used + text_used,
        "flash_headroom_bytes": text_len - text_used,
        "isr_headroom_bytes": isr_len - isr_used,
        "ram_region_bytes": ram_len,
        "static_ram_bytes": sizes["data"] + sizes["bss"],
        "size": sizes,
        "trimmed": [name for name, _v, _w in TRIM] + [k for k in MAKE_VARS],
        "enabled": [name for name, _v, _w in ENABLE],
        "pystack_bytes": PYSTACK_WORDS * 4,
    }
    if "_heap_start" in sym and "_heap_end" in sym:
        report["gc_heap_bytes"] = sym["_heap_end"] - sym["_heap_start"]
    return report


def contiguous_bin(build_dir: Path, src: Path, board: str) -> bytes:
    """firmware0.bin, 0xFF up to the application region, then firmware1.bin."""
    ld = (src / "ports" / "stm32" / "boards" / BOARDS[board].linker_script).read_text()
    isr_origin, _ = _region(ld, "FLASH_START")
    text_origin, _ = _region(ld, "FLASH_TEXT")
    first = (build_dir / "firmware0.bin").read_bytes()
    gap = text_origin - isr_origin - len(first)
    if gap < 0:
        raise ImageError(f"{board}: the vector table overflows sector 0 by {-gap} bytes")
    return first + b"\xff" * gap + (build_dir / "firmware1.bin").read_bytes()


#: Builds kept per board in the cache (~120 MB each): the newest, and two older ones
#: so switching back and forth between two firmware versions stays cached.
KEEP_BUILDS = 3


def prune_cache(prefix: str, current: Path, cache_dir: Path = mpsource.CACHE_DIR) -> list[Path]:
    """Remove all but the :data:`KEEP_BUILDS` newest cache folders named ``prefix*``
    (``current`` always stays); returns the removed ones."""
    folders = sorted(
        (p for p in cache_dir.glob(prefix + "*") if p.is_dir() and p != current),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    removed = folders[KEEP_BUILDS - 1 :]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


OUTPUTS = ("firmware.dfu", "firmware.hex", "firmware0.bin", "firmware1.bin", "firmware.elf")


def build_image(board: str, out_root: Path = OUT_ROOT) -> dict:
    """Build (or reuse) ``board``'s image; copy it to ``out_root/<board>/``; return
    its report (also written there as ``image.json``). Raises :class:`ImageError` when
    it does not fit, :class:`mpsource.SourceMissing` without a source tree."""
    if board not in BOARDS:
        raise ImageError(
            f"no image for {board!r}: images are built for {', '.join(sorted(BOARDS))}"
            + (" (the Pico takes the .mpy deploy: make flash)" if board == "pico" else "")
        )
    missing = mpsource.toolchain_missing("stm32")
    if missing:
        raise ImageError(missing)
    src = mpsource.source_dir()
    bdir = board_dir(board, src, out_root)
    manifest = MANIFESTS / f"{board}.py"
    build = mpsource.cached_build(
        "stm32",
        BOARDS[board].mp_board,
        make_vars={**MAKE_VARS, "BOARD_DIR": str(bdir)},
        manifest=manifest,
        inputs=_tree(bdir),
        src=src,
    )
    report = image_report(board, build.build_dir, src, build.key)
    report["rebuilt"] = build.rebuilt
    if build.rebuilt:
        prune_cache(f"stm32-{BOARDS[board].mp_board}-", build.build_dir)
    if report["flash_headroom_bytes"] < 0:
        raise ImageError(
            f"{board}: the image overflows its {report['text_region']['length'] // 1024} KB "
            f"application region by {-report['flash_headroom_bytes']} bytes"
        )
    dest = out_root / board
    dest.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        shutil.copyfile(build.build_dir / name, dest / name)
    (dest / "firmware.bin").write_bytes(contiguous_bin(build.build_dir, src, board))
    (dest / "image.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m firmware.stm32 [--if-image] <board>`` (``make firmware``; ``make
    flash`` passes ``--if-image``: a board without an image, the Pico, is no error)."""
    argv = sys.argv[1:] if argv is None else argv
    if_image = "--if-image" in argv
    argv = [a for a in argv if a != "--if-image"]
    if len(argv) != 1:
        print(f"usage: make firmware BOARD=<{'|'.join(sorted(BOARDS))}>", file=sys.stderr)
        return 2
    if if_image and argv[0] not in BOARDS:
        return 0
    try:
        r = build_image(argv[0])
    except (ImageError, mpsource.SourceMissing, mpsource.BuildError) as e:
        print(f"make firmware: {e}", file=sys.stderr)
        return 1
    text = r["text_region"]
    print(
        f"{r['board']} ({r['micropython_board']}, MicroPython {r['micropython'].split('@')[0]}): "
        f"{text['used']} of {text['length']} bytes in the application region, "
        f"headroom {r['flash_headroom_bytes']} bytes" + ("" if r["rebuilt"] else " (cached build)")
    )
    print(f"images in {OUT_ROOT.relative_to(REPO_ROOT) / r['board']}/: firmware.dfu .hex .bin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
