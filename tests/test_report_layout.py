"""`modbridge report` at 1, 4 and 8 modules (docs/recording.md, "report"): one row of
panels per module on a shared time axis, a sensible size, no row for a GPU that a
module cools (the recorder writes it alone until the bridge pairs it), a row for a GPU
no module cools only if it has readings, and event numbers and list lines that do not
overlap. The recordings go through the recorder's own rows (``sample_rows`` from
bridge report dicts) and its CSV writer.
"""

from __future__ import annotations

import io
import itertools

import pytest

from modbridge.ops import record as R
from modbridge.ops import report as P

PAIRED_AFTER_S = 3.0  # the bridge pairs module i with GPU i from here on
END_S = 120.0


def _gpu(i: int, t: float, limit: float = 700.0) -> dict:
    return {"uuid": f"GPU-5e1f0c2a-0000-4c8e-9a61-00000000000{i}", "name": "NVIDIA H200",
            "temp_c": 40.0 + t / 6 + i, "power_w": 300.0 + 2 * t, "limit_w": limit,
            "state": "ok"}  # fmt: skip


def _report(n: int, t: float, extra_gpus=()) -> dict:
    """The bridge's report at ``t``: module 2 (if any) stalls a fan at 40 s (FAILSAFE,
    WARN, limit 490 W); module 5 (if any) goes CRITICAL at 80 s."""
    mods, gpus = [], []
    for i in range(n):
        stalled = i == 2 and t >= 40
        critical = i == 5 and t >= 80
        limit = 490.0 if stalled else 350.0 if critical else 700.0
        g = _gpu(i, t, limit)
        gpus.append(g)
        paired = t >= PAIRED_AFTER_S
        mods.append({
            "port": f"/dev/ttyACM{i}", "module_id": f"{i:02d}c0ffee{i:016d}", "link_up": True,
            "state": "FAILSAFE" if stalled else "HOSTED",
            "reason": "fan_stall" if stalled else "host_ok", "faults": [],
            "temp_gpu_c": 38 + t / 6, "temp_vram_c": 41 + t / 8, "temp_mos_c": 36.0,
            "temp_amb_c": 25.0, "fan1_rpm": 0 if stalled else 1400,
            "fan1_duty_pct": 100.0 if stalled else 40.0, "fan2_rpm": 1500,
            "fan2_duty_pct": 100.0 if stalled else 40.0,
            "v_in_v": 12.0, "i_in_a": 20.0, "p_in_w": 240.0 + i,
            "gpu": g if paired else None,
            "policy": {"level": "CRITICAL" if critical else "WARN" if stalled else "NORMAL",
                       "reasons": [], "target_w": limit if limit < 700 else None,
                       "original_w": 700.0} if paired else None,
        })  # fmt: skip
    return {"backend": "virtual", "modules": mods, "gpus": gpus + list(extra_gpus)}


def _events(n: int) -> list[R.EventRow]:
    """A burst of events close together (the labels that used to collide), on every
    module, and module 2's stall."""
    out = []
    for i in range(n):
        mid = f"{i:02d}c0ffee{i:016d}"
        uuid = _gpu(i, 0)["uuid"]
        for dt, kind, ev, level, detail in (
            (0.0, "module_event", "tach_implausible fan1", "warning", {}),
            (0.8, "module_event", "under_voltage", "warning", {}),
            (1.7, "decision", "NORMAL -> WARN", "warning", {}),
            (2.6, "power_limit", "limit lower 490 W", "info", {"action": "lower"}),
            (3.5, "module_event", "fan_stall fan1", "alarm", {}),
            (30.0, "decision", "WARN -> NORMAL", "info", {}),
            (31.0, "power_limit", "limit restore 700 W", "info", {"action": "restore"}),
        ):
            t = 10.0 + 5 * i + dt
            on_gpu = kind == "power_limit"
            out.append(R.EventRow(1000.0 + t, t, module=None if on_gpu else mid,
                                  gpu_uuid=uuid if on_gpu else None, event_kind=kind, event=ev,
                                  level=level, detail=detail))  # fmt: skip
    return sorted(out, key=lambda e: e.elapsed_s)


def _recording(tmp_path, n: int, extra_gpus=()) -> str:
    """Module rows through the recorder's sample_rows and its CSV writer."""
    buf = io.StringIO()
    w = R.CsvWriter(buf)
    w.write_meta(R.RecordingMeta(started_unix=1000.0, interval_s=1.0, source="test"))
    events = _events(n)
    t = 0.0
    while t <= END_S:
        w.write_all(R.sample_rows(_report(n, t, extra_gpus), 1000.0 + t, t))
        while events and events[0].elapsed_s <= t:
            w.write(events.pop(0))
        t += 1.0
    w.write_all(events)
    path = tmp_path / f"rec{n}.csv"
    path.write_text(buf.getvalue())
    return str(path)


def _overlaps(boxes) -> list:
    return [(a, b) for a, b in itertools.combinations(boxes, 2)
            if a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1]  # fmt: skip


SIZES = {1: (500, 700), 4: (900, 1200), 8: (1500, 1900)}  # height bounds, px


@pytest.mark.parametrize("n", [1, 4, 8])
def test_a_row_per_module_at_a_sensible_size(tmp_path, n):
    from matplotlib import image

    rec_path = _recording(tmp_path, n)
    png = tmp_path / f"rec{n}.png"
    res = P.report_file(rec_path, png, title=f"{n} modules")
    h, w = image.imread(png).shape[:2]
    lo, hi = SIZES[n]
    assert (w, h) == (res.width_px, res.height_px) and w == 1600 and lo <= h <= hi, (w, h)
    # one row per module, none for the GPUs they cool (written alone before pairing)
    assert len(res.panels) == n and all(p.startswith("module ") for p in res.panels)
    assert not any("no module" in p for p in res.panels)
    fig = P.figure(R.read_recording(rec_path), title=f"{n} modules")
    grid = fig.axes[0].get_subplotspec().get_gridspec()
    assert (grid.nrows, grid.ncols) == (n, 4)
    # a module's GPU curve starts before its pairing: the alone rows joined its row
    temps = next(ax for ax in fig.axes if ax.get_ylabel() == "degC")
    gpu_line = next(ln for ln in temps.lines if ln.get_label() == "GPU (NVML)")
    assert gpu_line.get_xdata()[0] == 0.0
    _no_collisions(fig)


def _no_collisions(fig):
    """Event numbers do not overlap each other; list lines neither, and stay inside
    the figure."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    fw, fh = fig.canvas.get_width_height()
    rows = 0
    for ax in fig.axes:
        numbers = [t for t in ax.texts if t.get_gid() == "event"]
        if numbers:
            rows += 1
            boxes = [t.get_window_extent(r) for t in numbers]
            assert not _overlaps(boxes), [t.get_text() for t in numbers]
        listed = [t for t in ax.texts if t.get_gid() == "event-list"]
        boxes = [t.get_window_extent(r) for t in listed]
        assert not _overlaps(boxes), [t.get_text() for t in listed]
        assert all(0 <= b.x0 and b.x1 <= fw and 0 <= b.y0 and b.y1 <= fh for b in boxes)
    assert rows >= 1


def test_a_gpu_no_module_cools_gets_a_row_only_with_readings(tmp_path):
    lone = {"uuid": "GPU-lone-0001", "name": "NVIDIA A100", "temp_c": 33.0,
            "power_w": 60.0, "limit_w": 400.0, "state": "ok"}  # fmt: skip
    empty = {"uuid": "GPU-empty-0002", "state": "lost"}  # no reading at all
    res = P.report_file(_recording(tmp_path, 8, (lone, empty)), tmp_path / "r.png")
    assert len(res.panels) == 9, res.panels
    assert res.panels[-1] == "GPU GPU-lone-0001 (no module cools it)"
    assert not any("GPU-empty" in p for p in res.panels)


def test_many_events_on_one_row_are_listed_as_far_as_the_row_holds(tmp_path):
    rec = R.read_recording(_recording(tmp_path, 1))
    mid = rec.samples[-1].module
    rec.events += [R.EventRow(1000.0 + t, float(t), module=mid, event_kind="module_event",
                              event=f"over_temp #{t}", level="alarm")
                   for t in range(5, 115, 4)]  # fmt: skip
    fig = P.figure(rec)
    listed = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == "event-list"]
    assert listed[-1].startswith("   + ") and "more" in listed[-1]
    _no_collisions(fig)
