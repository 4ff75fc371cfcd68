"""``modbridge wire-demo``: the real protocol, live, between MicroPython and CPython.

A MicroPython process (the real unix port) encodes a synthetic telemetry stream with
the firmware's allocation-free encoder (heap locked while encoding) and writes it to a
pipe, with a JSON line now and then and bursts of line noise; this process decodes
it with the host's stream decoder and shows each frame, its size on the wire and the
decoder's error counters. It becomes ``modbridge run --sim`` once the virtual module
exists.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modbridge.tools import mpy
from protocol import frame
from protocol.message import FMT_JSON

DEVICE_SCRIPT = Path(__file__).with_name("wiredemo_device.py")


@dataclass
class DemoResult:
    frames_cbor: int = 0
    frames_json: int = 0
    bytes_cbor: int = 0
    bytes_json: int = 0
    bytes_total: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    device_note: str = ""
    exit_code: int = 0
    wall_s: float = 0.0

    @property
    def mean_cbor(self) -> float:
        return self.bytes_cbor / self.frames_cbor if self.frames_cbor else 0.0

    @property
    def mean_json(self) -> float:
        return self.bytes_json / self.frames_json if self.frames_json else 0.0


def _c(mc: int | None) -> str:
    return "   --" if mc is None else f"{mc / 1000:5.1f}"


def format_row(msg, size: int) -> str:
    f = msg.fields
    duty = f.get("fan1_duty")
    duty_s = "--" if duty is None else f"{duty * 100 / 65535:3.0f}%"
    v = f.get("v_in")
    p = f.get("p_in")
    return (
        f"{msg.seq:5d} {msg.fmt:4s} {size:4d} B | gpu {_c(f.get('temp_gpu'))} "
        f"vram {_c(f.get('temp_vram'))} mos {_c(f.get('temp_mos'))} amb {_c(f.get('temp_amb'))} C"
        f" | fan1 {f.get('fan1_rpm', 0):5d} rpm {duty_s} | "
        f"{(v or 0) / 1000:5.2f} V {(p or 0) / 1000:6.1f} W"
    )


def run(
    seconds: float = 10.0,
    period_ms: int = 100,
    json_every: int = 10,
    noise_every: int = 25,
    emit: Callable[[str], None] = print,
) -> DemoResult:
    """Run the demo; ``emit`` receives each output line. Returns the totals."""
    ticks = max(1, int(seconds * 1000 / period_ms))
    proc = mpy.spawn(
        DEVICE_SCRIPT,
        str(period_ms),
        str(ticks),
        str(json_every),
        str(noise_every),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    dec = frame.StreamDecoder()
    res = DemoResult()
    t0 = time.monotonic()
    emit(f"micropython pid {proc.pid}: {ticks} ticks at {period_ms} ms; decoding here (CPython)")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        res.bytes_total += len(chunk)
        for item in dec.feed(chunk):
            if not item.ok:
                emit(f"      resync: dropped {item.kind}: {item.detail}")
                continue
            size = len(frame.encode_message(item))  # deterministic: the same bytes
            if item.name == "telemetry":
                if item.fmt == FMT_JSON:
                    res.frames_json += 1
                    res.bytes_json += size
                else:
                    res.frames_cbor += 1
                    res.bytes_cbor += size
                emit(format_row(item, size))
            elif item.name == "event":
                res.device_note = item.fields.get("text", "")
    res.exit_code = proc.wait()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if res.exit_code and err:
        emit(err.rstrip())
    res.errors = {k: v for k, v in dec.errors.items() if v}
    res.wall_s = time.monotonic() - t0
    return res


def summary(res: DemoResult) -> list[str]:
    lines = [
        f"frames: {res.frames_cbor} CBOR (mean {res.mean_cbor:.1f} B on the wire), "
        f"{res.frames_json} JSON lines (mean {res.mean_json:.1f} B)",
        f"bytes received: {res.bytes_total} in {res.wall_s:.1f} s",
        "decoder errors (injected noise, all resynchronised): "
        + (", ".join(f"{k}={v}" for k, v in sorted(res.errors.items())) or "none"),
    ]
    if res.device_note:
        lines.append(f"device: {res.device_note}")
    lines.append(f"micropython exit code: {res.exit_code}")
    return lines
