"""A tiny PNG line-plot writer (standard library only: zlib, struct).

    fig = Plot(640, 360, panels=2)
    fig.panel(0, x_range=(0, 600), y_range=(20, 90), y_ticks=(20, 40, 60, 80))
    fig.line(0, xs, ys, color=(200, 40, 40))
    fig.hline(0, 80.0, color=(0, 0, 0), dash=6)
    fig.save("plot.png")

Panels are stacked vertically; each has a frame, light grid lines at its ticks and
the tick values written in a 3x5 pixel digit font. Enough for the control
benchmark's per-case plots (docs/control-benchmark/), without a plotting dependency.
Palette images with filter 0: a 640x360 plot is a few KB.
"""

from __future__ import annotations

import struct
import zlib

# 3x5 glyphs, rows top to bottom, 3 bits each (MSB left)
_FONT = {
    "0": (7, 5, 5, 5, 7),
    "1": (2, 6, 2, 2, 7),
    "2": (7, 1, 7, 4, 7),
    "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7),
    "6": (7, 4, 7, 5, 7),
    "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7),
    "9": (7, 5, 7, 1, 7),
    "-": (0, 0, 7, 0, 0),
    ".": (0, 0, 0, 0, 2),
    "%": (5, 1, 2, 4, 5),
    "s": (0, 3, 2, 1, 6),
}
_BG = (255, 255, 255)
_FRAME = (0, 0, 0)
_GRID = (225, 225, 225)
_LEFT = 26
_RIGHT = 8
_GAP = 14


class Plot:
    def __init__(self, width, height, panels=1):
        self.w = width
        self.h = height
        self.palette = [_BG]
        self.px = bytearray(width * height)  # palette indices, 0 = background
        inner = (height - _GAP * (panels + 1) - 8) // panels
        self.boxes = [
            (_LEFT, _GAP + i * (inner + _GAP), width - _RIGHT, _GAP + i * (inner + _GAP) + inner)
            for i in range(panels)
        ]
        self.ranges = [((0.0, 1.0), (0.0, 1.0))] * panels

    def _color(self, rgb):
        if rgb not in self.palette:
            self.palette.append(rgb)
        return self.palette.index(rgb)

    def _set(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            self.px[y * self.w + x] = c

    def _seg(self, x0, y0, x1, y1, c):
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx = 1 if x0 < x1 else -1
        sy = 1 if y0 < y1 else -1
        err = dx + dy
        while True:
            self._set(x0, y0, c)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, rgb=_FRAME):
        c = self._color(rgb)
        for ch in s:
            rows = _FONT.get(ch)
            if rows is not None:
                for r, bits in enumerate(rows):
                    for b in range(3):
                        if bits & (4 >> b):
                            self._set(x + b, y + r, c)
            x += 4

    def panel(self, i, x_range, y_range, y_ticks=(), x_ticks=()):
        self.ranges[i] = (x_range, y_range)
        x0, y0, x1, y1 = self.boxes[i]
        grid = self._color(_GRID)
        for t in y_ticks:
            _, yy = self._map(i, x_range[0], t)
            self._seg(x0, yy, x1, yy, grid)
            label = f"{t:g}"
            self.text(x0 - 2 - 4 * len(label), yy - 2, label)
        for t in x_ticks:
            xx, _ = self._map(i, t, y_range[0])
            self._seg(xx, y0, xx, y1, grid)
            if i == len(self.boxes) - 1:
                label = f"{t:g}s"
                self.text(xx - 2 * len(label), y1 + 3, label)
        f = self._color(_FRAME)
        for a, b, c, d in ((x0, y0, x1, y0), (x0, y1, x1, y1), (x0, y0, x0, y1), (x1, y0, x1, y1)):
            self._seg(a, b, c, d, f)

    def _map(self, i, x, y):
        (xa, xb), (ya, yb) = self.ranges[i]
        x0, y0, x1, y1 = self.boxes[i]
        fx = (x - xa) / (xb - xa) if xb != xa else 0.0
        fy = (y - ya) / (yb - ya) if yb != ya else 0.0
        fy = min(1.0, max(0.0, fy))
        return int(round(x0 + fx * (x1 - x0))), int(round(y1 - fy * (y1 - y0)))

    def line(self, i, xs, ys, color):
        c = self._color(color)
        prev = None
        for x, y in zip(xs, ys, strict=True):
            if y is None:
                prev = None
                continue
            p = self._map(i, x, y)
            if prev is not None:
                self._seg(prev[0], prev[1], p[0], p[1], c)
            prev = p

    def hline(self, i, y, color, dash=6):
        c = self._color(color)
        x0, _, x1, _ = self.boxes[i]
        _, yy = self._map(i, self.ranges[i][0][0], y)
        for x in range(x0, x1):
            if (x // dash) % 2 == 0:
                self._set(x, yy, c)

    def png(self) -> bytes:
        raw = bytearray()
        for y in range(self.h):
            raw.append(0)
            raw += self.px[y * self.w : (y + 1) * self.w]

        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        pal = b"".join(bytes(c) for c in self.palette)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 3, 0, 0, 0))
            + chunk(b"PLTE", pal)
            + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
            + chunk(b"IEND", b"")
        )

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.png())
