"""Plots of a recording (``modbridge report``, docs/recording.md): PNG through
matplotlib's Agg canvas (no display, no pyplot state).

One column of panels per module (and per GPU no module is paired with), on one shared
time axis, rows:

1. temperatures: the module's NTCs (gpu, vram, mos, amb) and the GPU's own sensor;
2. fans: commanded duty (%) and tach (rpm, right axis);
3. power: the module's 12 V input, the GPU's draw, its enforced power limit (a step
   line) and the policy's target while it holds a lowered one (dashed);
4. the policy level (NORMAL, WARN, CRITICAL).

Events are vertical lines across every panel, labelled on the top one: alarms the
module raised (red), power-limit and clock actions (purple), policy level changes
(orange), links lost and back (grey). Their artists carry ``gid="event"``, so a test
finds them among the axes' lines and texts.
"""

from __future__ import annotations

import dataclasses
import math
import os
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
PANEL_HEIGHTS = (3.0, 2.2, 2.6, 1.0)
MAX_LABELS = 40  # labelled markers per column; more are drawn but not labelled


@dataclass
class Marker:
    """An event drawn as a vertical line."""

    elapsed_s: float
    label: str
    category: str  # alarm, limit, policy, link


@dataclass
class Column:
    """What one column of panels shows: a module (with its GPU), or a lone GPU."""

    title: str
    samples: list[SampleRow]
    markers: list[Marker] = field(default_factory=list)
    modules: set = field(default_factory=set)  # whose events are marked here
    gpus: set = field(default_factory=set)


@dataclass
class ReportResult:
    """What ``modbridge report`` wrote (``--json``)."""

    path: str
    recording: str
    format: str
    samples: int
    events: int
    markers: int
    columns: list[str]
    bytes_written: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


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


def columns(rec: Recording) -> list[Column]:
    """The recording split into columns: one per module, then one per GPU that no
    module is paired with; each with the markers of its events."""
    by_module: dict[str, list[SampleRow]] = {}  # by port (a module is its port until
    lone: dict[str, list[SampleRow]] = {}  # its hello), else by module
    for s in rec.samples:
        if s.module is not None:
            by_module.setdefault(s.port or s.module, []).append(s)
        elif s.gpu_uuid is not None:
            lone.setdefault(s.gpu_uuid, []).append(s)
    cols = []
    for key, rows in by_module.items():
        mods = list(dict.fromkeys(r.module for r in rows))
        named = [m for m in mods if m != key] or mods
        gpus = {r.gpu_uuid for r in rows if r.gpu_uuid}
        gpu_note = f"  GPU {_short(sorted(gpus)[0])}" if len(gpus) == 1 else ""
        title = f"module {', '.join(_short(m) for m in named)}{gpu_note}"
        cols.append(Column(title, rows, modules=set(mods), gpus=gpus))
    for uuid, rows in lone.items():
        cols.append(Column(f"GPU {_short(uuid)} (no module)", rows, gpus={uuid}))
    first_link: set = set()
    for col in cols:
        for ev in rec.events:
            mine = ev.module in col.modules or (ev.gpu_uuid is not None and ev.gpu_uuid in col.gpus)
            if not mine and not (ev.module is None and ev.gpu_uuid is None):
                continue
            m = marker_for(ev)
            if m is None:
                continue
            if ev.event_kind == "link" and m.label == "link up" and ev.module not in first_link:
                first_link.add(ev.module)  # the first connection: not news
                continue
            col.markers.append(m)
    return cols


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
    cols = columns(rec)
    when, axis = time_axis(rec)
    t_all = [when(s.elapsed_s) for s in rec.samples] + [when(e.elapsed_s) for e in rec.events]
    t_min = min(t_all)
    span = max(t_all) - t_min
    scale, unit = _time_scale(span)
    ncol = len(cols)
    fig = Figure(figsize=(max(9.0, 6.5 * ncol), sum(PANEL_HEIGHTS) + 1.2), dpi=100,
                 layout="constrained")  # fmt: skip
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(PANEL_HEIGHTS), ncol, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": PANEL_HEIGHTS})  # fmt: skip
    rpms = [v for s in rec.samples for v in (s.fan1_rpm, s.fan2_rpm) if v is not None]
    rpm_top = max(max(rpms, default=0) * 1.05, 100)
    for j, col in enumerate(cols):
        _draw_column(axes[:, j], col, scale, j == 0, when, rpm_top)
    for ax in axes[-1, :]:
        ax.set_xlabel(f"{axis} ({unit})")
    # one y range per row across the columns (compare modules at a glance)
    for i in range(len(PANEL_HEIGHTS) - 1):
        lows, highs = zip(*(ax.get_ylim() for ax in axes[i, :]), strict=True)
        for ax in axes[i, :]:
            ax.set_ylim(min(lows), max(highs))
    lo = t_min / scale
    hi = (t_min + span) / scale if span > 0 else lo + 1.0
    axes[0, 0].set_xlim(lo, hi)
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
    sub.append(f"{len(rec.samples)} samples, {len(rec.events)} events")
    fig.suptitle(sanitize(heading, 120) + "\n" + ", ".join(sub), fontsize=11)
    return fig


def _draw_column(axes, col: Column, scale: float, first: bool, when, rpm_top: float) -> None:
    rows = col.samples
    t = [when(r.elapsed_s) / scale for r in rows]
    ax_t, ax_f, ax_p, ax_l = axes
    ax_t.set_title(col.title, fontsize=10, loc="left")

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
                rpm_ax.set_ylim(-0.02 * rpm_top, rpm_top)  # one range for every column
            rpm_ax.plot(t, rpm, color=color, lw=1.0, ls=":", label=f"fan{fan} rpm")
    ax_f.set_ylabel("duty %")
    ax_f.set_ylim(-2, 105)

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

    levels = [math.nan if r.policy_level not in LEVELS else LEVELS.index(r.policy_level)
              for r in rows]  # fmt: skip
    if _has(levels):
        ax_l.plot(t, levels, color="tab:orange", lw=1.5, drawstyle="steps-post", label="policy")
    ax_l.set_yticks(range(len(LEVELS)), LEVELS, fontsize=7)
    ax_l.set_ylim(-0.4, len(LEVELS) - 0.6)
    ax_l.set_ylabel("policy")

    for x, color, labels in _label_groups(col.markers, scale, t, when):
        for ax in axes:
            ax.axvline(x, color=color, lw=0.8, alpha=0.7, gid="event")
        if labels:
            ax_t.annotate("\n".join(labels), xy=(x, 1.0), xycoords=("data", "axes fraction"),
                          xytext=(2, -2), textcoords="offset points", rotation=90, va="top",
                          ha="left", fontsize=6.5, color=color, gid="event")  # fmt: skip

    for ax in (ax_t, ax_f, ax_p):
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if ax is ax_f and rpm_ax is not None:
            h2, l2 = rpm_ax.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        if handles and first:
            ax.legend(handles, labels, fontsize=7, loc="best", ncol=2)
    ax_l.grid(True, alpha=0.3)


def _label_groups(markers: list[Marker], scale: float, t: list[float], when):
    """``(x, colour, labels)`` per marker line: markers closer than 0.5 % of the time
    span share one line and one label (a label once, the first category's colour);
    after :data:`MAX_LABELS` labels, lines only."""
    span = max((t[-1] - t[0]) if t else 0.0, 1e-9)
    groups: list[list] = []
    for m in sorted(markers, key=lambda m: m.elapsed_s):
        x = when(m.elapsed_s) / scale
        if groups and x - groups[-1][0] <= 0.005 * span:
            if m.label not in groups[-1][2]:
                groups[-1][2].append(m.label)
            continue
        groups.append([x, MARK_COLORS.get(m.category, "tab:gray"), [m.label]])
    shown = 0
    for g in groups:
        labels = [sanitize(x, 40) for x in g[2]] if shown < MAX_LABELS else []
        shown += bool(labels)
        yield g[0], g[1], labels


def render(rec: Recording, path: str | os.PathLike, title: str | None = None,
           name: str = "<recording>") -> ReportResult:  # fmt: skip
    """Draw ``rec`` and write it as a PNG at ``path``."""
    fig = figure(rec, title)
    out = os.fspath(path)
    try:
        fig.savefig(out, format="png")
    except OSError as e:
        raise OutputError(f"{out}: cannot write the report: {e.strerror or e}") from e
    cols = columns(rec)
    return ReportResult(
        path=out,
        recording=name,
        format=rec.format,
        samples=len(rec.samples),
        events=len(rec.events),
        markers=sum(len(c.markers) for c in cols),
        columns=[c.title for c in cols],
        bytes_written=os.path.getsize(out),
        notes=list(rec.notes),
    )


def report_file(recording: str | os.PathLike, path: str | os.PathLike,
                title: str | None = None) -> ReportResult:  # fmt: skip
    """Read the recording at ``recording`` (CSV or JSON lines) and render it to ``path``."""
    rec = read_recording(recording)
    return render(rec, path, title, name=os.fspath(recording))
