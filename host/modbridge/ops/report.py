"""Plots of a recording (``modbridge report``, docs/recording.md): PNG through
matplotlib's Agg canvas (no display, no pyplot state).

Small multiples: one row of panels per module (and per GPU that no module ever
cooled, if it has readings of its own), on one shared time axis, columns:

1. temperatures: the module's NTCs (gpu, vram, mos, amb) and the GPU's own sensor;
2. fans: commanded duty (%) and tach (rpm, right axis);
3. power: the module's 12 V input, the GPU's draw, its enforced power limit (a step
   line) and the policy's target while it holds a lowered one (dashed);
4. the row's events, numbered, as a list.

The policy level shades the three plots (WARN yellow, CRITICAL red). Events are
vertical lines across the row with a number at the top of its temperature panel
(numbers that would touch are staggered; events closer than 1 % of the time span
share one number); the list beside the row says what each number is: alarms the
module raised (red), power-limit and clock actions (purple), policy level changes
(orange), links lost and back (grey). Their artists carry ``gid="event"`` (the list:
``gid="event-list"``), so a test finds them. The y ranges are shared down each
column, so modules compare at a glance; the figure is 1,600 px wide and grows
about 190 px per module.
"""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from dataclasses import dataclass, field

from modbridge.ops.record import (
    EventRow,
    OutputError,
    Recording,
    RecordingError,
    SampleRow,
    read_recording,
)
from modbridge.sanitize import sanitize

LEVELS = ("NORMAL", "WARN", "CRITICAL")
CHANNEL_COLORS = {"gpu": "tab:red", "vram": "tab:orange", "mos": "tab:brown", "amb": "tab:blue"}
MARK_COLORS = {"alarm": "tab:red", "limit": "tab:purple", "policy": "tab:orange",
               "link": "tab:gray"}  # fmt: skip
LIMIT_ACTIONS = ("lower", "restore", "refused", "external", "failed", "recovered", "dry_run")
LEVEL_SHADES = {"WARN": "gold", "CRITICAL": "tab:red"}
WIDTH_IN, DPI = 16.0, 100  # 1,600 px wide whatever the number of modules
WIDTH_RATIOS = (4.0, 4.0, 4.0, 2.9)  # temperatures, fans, power, the event list
GROUP_SPAN = 0.01  # events closer than this fraction of the time span share a number
LIST_FONT = 6.8
LIST_CHARS = 44  # an event list line's text (two lines at most per number)


def row_height_in(n: int) -> float:
    """Inches per module row: roomy for one, compact for many."""
    return 4.2 if n <= 1 else 2.8 if n <= 2 else 2.3 if n <= 4 else 1.9 if n <= 8 else 1.6


@dataclass
class Marker:
    """An event drawn as a vertical line."""

    elapsed_s: float
    label: str
    category: str  # alarm, limit, policy, link


@dataclass
class Panel:
    """What one row of panels shows: a module (with its GPU), or a GPU no module
    ever cooled."""

    title: str
    samples: list[SampleRow]
    markers: list[Marker] = field(default_factory=list)
    modules: set = field(default_factory=set)  # whose events are marked here
    gpus: set = field(default_factory=set)
    lone: bool = False  # a GPU without a module


Column = Panel  # its name when the modules were columns


@dataclass
class ReportResult:
    """What ``modbridge report`` wrote (``--json``)."""

    path: str
    recording: str
    format: str
    samples: int
    events: int
    markers: int
    panels: list[str]  # one title per row of panels (a module, or a GPU alone)
    bytes_written: int
    width_px: int = 0
    height_px: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        """:attr:`panels` by its old name (the modules were columns once)."""
        return self.panels

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["columns"] = list(self.panels)  # the old name, for scripts that read it
        return d


def _short(ident: str | None, n: int = 12, tail: int = 4) -> str:
    """An id or UUID by its head and its tail (UUIDs of one host often share a head).

    >>> _short("GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e0001"), _short("abc")
    ('GPU-5e1f0c2a..0001', 'abc')
    """
    ident = sanitize(ident or "?", 80)
    return ident if len(ident) <= n + tail + 2 else f"{ident[:n]}..{ident[-tail:]}"


def marker_for(ev: EventRow) -> Marker | None:
    """The marker an event gets, or None (start/stop, a cleared alarm, a hold)."""
    k, label = ev.event_kind, ev.event
    if k == "module_event":
        if label.endswith(" cleared") or ev.level not in ("warning", "alarm", "critical"):
            return None
        return Marker(ev.elapsed_s, label, "alarm")
    if k in ("power_limit", "clocks"):
        action = ev.detail.get("action")
        if action not in LIMIT_ACTIONS:
            return None
        return Marker(ev.elapsed_s, label, "limit")
    if k == "decision":
        return Marker(ev.elapsed_s, label, "policy") if "->" in label else None
    if k == "link":
        return Marker(ev.elapsed_s, label, "link")
    if k in ("duplicate_module", "actuator"):
        return Marker(ev.elapsed_s, label, "alarm" if ev.level == "alert" else "limit")
    return None


_GPU_FIELDS = ("gpu_uuid", "gpu_temp_c", "gpu_power_w", "gpu_limit_w")


def _merge_gpu_rows(rows: list[SampleRow], gpu_rows: list[SampleRow]) -> list[SampleRow]:
    """A module's rows with its GPU's rows from while they were not paired yet (the
    recorder writes a GPU alone until the bridge pairs it): at an instant the module
    has a row, the GPU's reading fills its GPU fields; otherwise the GPU's row joins."""
    by_t = {r.elapsed_s: i for i, r in enumerate(rows)}
    out = list(rows)
    for g in gpu_rows:
        i = by_t.get(g.elapsed_s)
        if i is None:
            out.append(g)
        elif out[i].gpu_uuid is None:
            out[i] = dataclasses.replace(out[i], **{k: getattr(g, k) for k in _GPU_FIELDS})
    return sorted(out, key=lambda r: r.elapsed_s)


def _has_gpu_data(rows: list[SampleRow]) -> bool:
    return any(getattr(r, k) is not None for r in rows for k in _GPU_FIELDS[1:])


def panels(rec: Recording) -> list[Panel]:
    """The recording split into rows of panels: one per module, then one per GPU
    that no module was ever paired with and that has readings of its own (a GPU
    written alone before its module was paired is that module's); each with the
    markers of its events."""
    by_module: dict[str, list[SampleRow]] = {}  # by port (a module is its port until
    lone: dict[str, list[SampleRow]] = {}  # its hello), else by module
    for s in rec.samples:
        if s.module is not None:
            by_module.setdefault(s.port or s.module, []).append(s)
        elif s.gpu_uuid is not None:
            lone.setdefault(s.gpu_uuid, []).append(s)
    out = []
    for key, rows in by_module.items():
        mods = list(dict.fromkeys(r.module for r in rows))
        named = [m for m in mods if m != key] or mods
        gpus = {r.gpu_uuid for r in rows if r.gpu_uuid}
        for uuid in sorted(gpus & set(lone)):
            rows = _merge_gpu_rows(rows, lone.pop(uuid))
        gpu_note = f"  GPU {_short(sorted(gpus)[0])}" if len(gpus) == 1 else ""
        title = f"module {', '.join(_short(m) for m in named)}{gpu_note}"
        out.append(Panel(title, rows, modules=set(mods), gpus=gpus))
    for uuid, rows in lone.items():
        if _has_gpu_data(rows):
            out.append(Panel(f"GPU {_short(uuid)} (no module cools it)", rows, gpus={uuid},
                             lone=True))  # fmt: skip
    first_link: set = set()
    for panel in out:
        for ev in rec.events:
            mine = ev.module in panel.modules or (
                ev.gpu_uuid is not None and ev.gpu_uuid in panel.gpus
            )
            if not mine and not (ev.module is None and ev.gpu_uuid is None):
                continue
            m = marker_for(ev)
            if m is None:
                continue
            if ev.event_kind == "link" and m.label == "link up" and ev.module not in first_link:
                first_link.add(ev.module)  # the first connection: not news
                continue
            panel.markers.append(m)
    return out


columns = panels  # its name when the modules were columns


def _series(rows: list[SampleRow], name: str) -> list[float]:
    out = []
    for r in rows:
        v = getattr(r, name)
        out.append(math.nan if v is None else float(v))
    return out


def _has(ys: list[float]) -> bool:
    return any(not math.isnan(y) for y in ys)


def _time_scale(span_s: float) -> tuple[float, str]:
    if span_s > 3 * 3600:
        return 3600.0, "h"
    if span_s > 3 * 60:
        return 60.0, "min"
    return 1.0, "s"


def time_axis(rec: Recording):
    """``(elapsed s -> x s, name)``: the world time of a --sim recording (samples carry
    it; events between samples are placed by linear interpolation, outside them at
    the nearest sample's), else the elapsed wall-clock time."""
    pts = sorted({(s.elapsed_s, s.world_s) for s in rec.samples if s.world_s is not None})
    if len(pts) < 2:
        return (lambda e: e), "elapsed"
    import numpy as np

    xs = np.array([p[0] for p in pts])
    ws = np.array([p[1] for p in pts])

    def world(e: float) -> float:
        return float(np.interp(e, xs, ws))

    return world, "world time"


def figure(rec: Recording, title: str | None = None):
    """The report's :class:`matplotlib.figure.Figure` (an Agg canvas attached).

    Raises :class:`RecordingError` if the recording has no sample."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not rec.samples:
        raise RecordingError(
            "the recording has no samples (it was stopped before its first interval): "
            "record for longer, e.g. `modbridge record --duration 60`"
        )
    rows = panels(rec)
    when, axis = time_axis(rec)
    t_all = [when(s.elapsed_s) for s in rec.samples] + [when(e.elapsed_s) for e in rec.events]
    t_min = min(t_all)
    span = max(t_all) - t_min
    scale, unit = _time_scale(span)
    n = len(rows)
    row_h = row_height_in(n)
    fig = Figure(figsize=(WIDTH_IN, n * row_h + 1.5), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(n, len(WIDTH_RATIOS), width_ratios=WIDTH_RATIOS)
    first = fig.add_subplot(grid[0, 0])
    axes = [[first if (i, j) == (0, 0) else fig.add_subplot(grid[i, j], sharex=first)
             for j in range(3)] + [fig.add_subplot(grid[i, 3])] for i in range(n)]  # fmt: skip
    rpms = [v for s in rec.samples for v in (s.fan1_rpm, s.fan2_rpm) if v is not None]
    rpm_top = max(max(rpms, default=0) * 1.05, 100)
    lo = t_min / scale
    hi = (t_min + span) / scale if span > 0 else lo + 1.0
    for i, panel in enumerate(rows):
        _draw_row(axes[i], panel, scale, when, rpm_top, (lo, hi), unit, row_h)
        if i < n - 1:
            for ax in axes[i][:3]:
                ax.tick_params(labelbottom=False)
    for ax in axes[-1][:3]:
        ax.set_xlabel(f"{axis} ({unit})")
    # one y range down each column (compare modules at a glance)
    for j in range(3):
        if j == 1:
            continue  # duty is 0-100 %, rpm one range already
        lows, highs = zip(*(r[j].get_ylim() for r in axes), strict=True)
        for r in axes:
            r[j].set_ylim(min(lows), max(highs))
    first.set_xlim(lo, hi)
    for j, name in ((1, "fans: duty % (steps), rpm (dotted)"), (2, "power (W)")):
        axes[0][j].set_title(name, fontsize=8.5, loc="right", color="dimgray")
    handles: dict = {}
    for ax in fig.axes:  # every row's lines (and the rpm twins): one legend for all
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
                   ncol=min(len(handles), 8), fontsize=7.5, frameon=False)  # fmt: skip
    heading = title or "modbridge recording"
    meta = rec.meta
    sub = []
    if meta is not None and meta.started_unix is not None:
        from modbridge.ops.record import _iso

        sub.append(f"started {(_iso(meta.started_unix) or '')[:19].replace('T', ' ')} UTC")
    if meta is not None and meta.source:
        sub.append(f"source {meta.source}")
    if meta is not None and meta.interval_s:
        sub.append(f"every {meta.interval_s:g} s")
    n_mod = sum(1 for p in rows if not p.lone)
    sub.append(f"{n_mod} module{'s' if n_mod != 1 else ''}")
    sub.append(f"{len(rec.samples)} samples, {len(rec.events)} events")
    fig.suptitle(sanitize(heading, 120) + "\n" + ", ".join(sub), fontsize=11)
    return fig


def _shade_levels(axes, rows: list[SampleRow], t: list[float]) -> None:
    """WARN and CRITICAL as shaded spans behind the plots (a level lasts until the
    next sample's)."""
    i = 0
    while i < len(rows):
        level = rows[i].policy_level
        j = i
        while j + 1 < len(rows) and rows[j + 1].policy_level == level:
            j += 1
        if level in LEVEL_SHADES:
            end = t[j + 1] if j + 1 < len(t) else t[j]
            for k, ax in enumerate(axes):
                ax.axvspan(t[i], end, color=LEVEL_SHADES[level], alpha=0.13, lw=0, gid="policy",
                           label=f"policy {level}" if k == 0 else None)  # fmt: skip
        i = j + 1


def _draw_row(axes, panel: Panel, scale: float, when, rpm_top: float, xlim, unit: str,
              row_h: float) -> None:  # fmt: skip
    rows = panel.samples
    t = [when(r.elapsed_s) / scale for r in rows]
    ax_t, ax_f, ax_p, ax_e = axes
    ax_t.set_title(sanitize(panel.title, 80), fontsize=9, loc="left", fontweight="bold")

    for ch, color in CHANNEL_COLORS.items():
        ys = _series(rows, f"temp_{ch}_c")
        if _has(ys):
            ax_t.plot(t, ys, color=color, lw=1.2, label=f"NTC {ch}")
    ys = _series(rows, "gpu_temp_c")
    if _has(ys):
        ax_t.plot(t, ys, color="black", lw=1.2, ls="--", label="GPU (NVML)")
    ax_t.set_ylabel("degC")

    rpm_ax = None
    for fan, color in ((1, "tab:green"), (2, "tab:cyan")):
        ys = _series(rows, f"fan{fan}_duty_pct")
        if _has(ys):
            ax_f.plot(t, ys, color=color, lw=1.2, drawstyle="steps-post", label=f"fan{fan} duty")
        rpm = _series(rows, f"fan{fan}_rpm")
        if _has(rpm):
            if rpm_ax is None:
                rpm_ax = ax_f.twinx()
                rpm_ax.set_ylabel("rpm")
                rpm_ax.set_ylim(-0.02 * rpm_top, rpm_top)  # one range for every row
            rpm_ax.plot(t, rpm, color=color, lw=1.0, ls=":", label=f"fan{fan} rpm")
    ax_f.set_ylabel("duty %")
    ax_f.set_ylim(-2, 105)
    if panel.lone:
        ax_f.text(0.5, 0.5, "no module: no fans", transform=ax_f.transAxes, ha="center",
                  va="center", fontsize=8, color="dimgray")  # fmt: skip

    for name, label, kw in (
        ("p_in_w", "module input", {"color": "tab:blue", "lw": 1.0}),
        ("gpu_power_w", "GPU power", {"color": "tab:red", "lw": 1.0}),
        ("gpu_limit_w", "GPU power limit", {"color": "black", "lw": 1.8,
                                            "drawstyle": "steps-post"}),
        ("policy_target_w", "policy target", {"color": "tab:purple", "lw": 1.4, "ls": "--",
                                              "drawstyle": "steps-post"}),
    ):  # fmt: skip
        ys = _series(rows, name)
        if _has(ys):
            ax_p.plot(t, ys, label=label, **kw)
    ax_p.set_ylabel("W")
    _shade_levels((ax_t, ax_f, ax_p), rows, t)
    for ax in (ax_t, ax_f, ax_p):
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7.5)
    if rpm_ax is not None:
        rpm_ax.tick_params(labelsize=7.5)

    groups = list(_label_groups(panel.markers, scale, xlim, when))
    levels: list[float] = []
    for k, (x, color, _labels) in enumerate(groups):
        for ax in (ax_t, ax_f, ax_p):
            ax.axvline(x, color=color, lw=0.8, alpha=0.7, gid="event")
        # stagger: a number within 3 % of the span of the previous one goes lower
        near = k > 0 and x - groups[k - 1][0] < 0.03 * (xlim[1] - xlim[0])
        level = (levels[-1] + 1) % 3 if near and levels else 0
        levels.append(level)
        ax_t.annotate(str(k + 1), xy=(x, 1.0), xycoords=("data", "axes fraction"),
                      xytext=(0, -3 - 11 * level), textcoords="offset points", ha="center",
                      va="top", fontsize=6.5, color="white", fontweight="bold", gid="event",
                      bbox={"boxstyle": "round,pad=0.15", "fc": color, "ec": "none"})  # fmt: skip
    _event_list(ax_e, groups, unit, row_h)


def _event_list(ax, groups, unit: str, row_h: float) -> None:
    """The numbered events of a row beside it, as many as its height holds."""
    ax.axis("off")
    fits = max(2, int(row_h * 72 / (LIST_FONT * 1.45)) - 1)
    head = f"events ({unit})" if groups else "no events"
    ax.text(0.0, 1.0, head, transform=ax.transAxes, va="top", fontsize=LIST_FONT,
            color="dimgray", gid="event-list")  # fmt: skip
    step = 1.0 / (fits + 1)
    line = 1
    for k, (x, color, labels) in enumerate(groups):
        parts = textwrap.wrap(", ".join(labels), LIST_CHARS, max_lines=2, placeholder="..")
        left = len(groups) - k
        if line + len(parts) > fits - (left > 1):  # keep a line to say how many are left
            ax.text(0.0, 1.0 - line * step, f"   + {left} more (the recording's event rows)",
                    transform=ax.transAxes, va="top", fontsize=LIST_FONT, color="dimgray",
                    gid="event-list")  # fmt: skip
            break
        when = f"{x:.1f}" if unit == "s" else f"{x:.2f}"
        text = f"{k + 1:>2} {when:>6} " + ("\n" + " " * 10).join(parts)
        ax.text(0.0, 1.0 - line * step, text, transform=ax.transAxes, va="top",
                fontsize=LIST_FONT, color=color, family="monospace", linespacing=1.25,
                gid="event-list")  # fmt: skip
        line += len(parts)


def _label_groups(markers: list[Marker], scale: float, xlim, when):
    """``(x, colour, labels)`` per numbered marker: markers closer than
    :data:`GROUP_SPAN` of the time span share one number and one line (each label
    once, the first one's colour)."""
    span = max(xlim[1] - xlim[0], 1e-9)
    groups: list[list] = []
    for m in sorted(markers, key=lambda m: m.elapsed_s):
        x = when(m.elapsed_s) / scale
        if groups and x - groups[-1][0] <= GROUP_SPAN * span:
            if m.label not in groups[-1][2]:
                groups[-1][2].append(m.label)
            continue
        groups.append([x, MARK_COLORS.get(m.category, "tab:gray"), [m.label]])
    for g in groups:
        yield g[0], g[1], [sanitize(x, 40) for x in g[2]]


def render(rec: Recording, path: str | os.PathLike, title: str | None = None,
           name: str = "<recording>") -> ReportResult:  # fmt: skip
    """Draw ``rec`` and write it as a PNG at ``path``."""
    fig = figure(rec, title)
    out = os.fspath(path)
    try:
        fig.savefig(out, format="png")
    except OSError as e:
        raise OutputError(f"{out}: cannot write the report: {e.strerror or e}") from e
    rows = panels(rec)
    w, h = fig.canvas.get_width_height()
    return ReportResult(
        path=out,
        recording=name,
        format=rec.format,
        samples=len(rec.samples),
        events=len(rec.events),
        markers=sum(len(p.markers) for p in rows),
        panels=[p.title for p in rows],
        bytes_written=os.path.getsize(out),
        width_px=w,
        height_px=h,
        notes=list(rec.notes),
    )


def report_file(recording: str | os.PathLike, path: str | os.PathLike,
                title: str | None = None) -> ReportResult:  # fmt: skip
    """Read the recording at ``recording`` (CSV or JSON lines) and render it to ``path``."""
    rec = read_recording(recording)
    return render(rec, path, title, name=os.fspath(recording))
