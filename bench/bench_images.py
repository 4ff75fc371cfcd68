"""Flash budget of the stm32 images: each board's image built with the firmware frozen
(firmware/stm32.py, ``make firmware BOARD=<board>``), measured against its linker
script's regions.

    python -m bench.run images

Keys, per board (``blackpill_f411``, ``nucleo_f411re``, ``pyboard_v11``):
``flash_headroom_bytes_<board>`` (application region length minus the bytes of
firmware1.bin, > 0 or the build fails), ``flash_used_bytes_<board>`` (sector 0 plus
the application region), ``flash_region_bytes_<board>`` (the application region),
``static_ram_bytes_<board>`` (.data + .bss) and ``gc_heap_bytes_<board>`` (the heap
the linker script leaves MicroPython: ``_heap_end - _heap_start``).

Uses the cached builds in build/mp-cache/ (each stm32 build is ~3 minutes on 2 cores
the first time, seconds afterwards). Needs the MicroPython source (firmware/mpsource.py)
and gcc-arm-none-eabi; without them it fails with the message that says how to get them.
"""

from firmware import stm32


def run():
    out = {}
    for board in sorted(stm32.BOARDS):
        r = stm32.build_image(board)
        out[f"flash_headroom_bytes_{board}"] = r["flash_headroom_bytes"]
        out[f"flash_used_bytes_{board}"] = r["flash_used_bytes"]
        out[f"flash_region_bytes_{board}"] = r["text_region"]["length"]
        out[f"static_ram_bytes_{board}"] = r["static_ram_bytes"]
        if "gc_heap_bytes" in r:
            out[f"gc_heap_bytes_{board}"] = r["gc_heap_bytes"]
    return out
