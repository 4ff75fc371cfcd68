"""Recordings and their plots (docs/recording.md): modbridge.ops.record (writers,
reader, recorder), modbridge.ops.report (the figure), and `modbridge record/report`.

One virtual module (the real firmware in MicroPython, 20x real time, fan 1 stalling)
is recorded through the CLI, ended by a SIGINT as Ctrl-C would; everything else runs
on hand-made rows, the fake NVML or plain files.
"""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import threading
import time

import pytest
import serial
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modbridge.cli import record as cli_record
from modbridge.cli.main import main
from modbridge.gpu import select
from modbridge.gpu.fake_nvml import FakeNvml
from modbridge.gpu.nvml import NvmlBackend
from modbridge.link import discovery
from modbridge.ops import record as R
from modbridge.ops import report as P

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(autouse=True)
def no_default_config_or_ports(monkeypatch, tmp_path):
    """Never the machine's config, state dir or serial adapters."""
    from modbridge import config

    monkeypatch.setattr(config, "DEFAULT_PATHS", (tmp_path / "absent.toml",))
    monkeypatch.setenv("MODBRIDGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setattr(discovery, "_default_lister", lambda: [])
    yield
    assert not [t for t in threading.enumerate() if t.name.startswith("modbridge-link")]


@pytest.fixture
def fake_nvml(monkeypatch):
    """``--backend nvml`` gets NVML over the recorded H200."""
    nv = FakeNvml()
    real = select.open_backend

    def open_backend(kind="auto", **kw):
        if kind in ("auto", "nvml"):
            return NvmlBackend(nvml=nv)
        return real(kind, **kw)

    monkeypatch.setattr(select, "open_backend", open_backend)
    return nv


# ----------------------------------------------------------------------------- rows

finite = st.floats(allow_nan=False, allow_infinity=False)
maybe_float = st.one_of(st.none(), finite, st.sampled_from([float("nan"), float("inf")]))
maybe_text = st.one_of(st.none(), st.text(max_size=30))
names = st.lists(st.text(max_size=12), max_size=4).map(tuple)
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), finite, st.text(max_size=10)),
    lambda kids: st.one_of(st.lists(kids, max_size=3),
                           st.dictionaries(st.text(max_size=8), kids, max_size=3)),
    max_leaves=8,
)  # fmt: skip

samples = st.builds(
    R.SampleRow,
    time_unix=finite,
    elapsed_s=finite,
    module=maybe_text,
    port=maybe_text,
    link_up=st.one_of(st.none(), st.booleans()),
    state=maybe_text,
    reason=maybe_text,
    faults=names,
    temp_gpu_c=maybe_float,
    temp_vram_c=maybe_float,
    temp_mos_c=maybe_float,
    temp_amb_c=maybe_float,
    fan1_rpm=st.one_of(st.none(), st.integers(-(2**63), 2**63)),
    fan1_duty_pct=maybe_float,
    fan2_rpm=st.one_of(st.none(), st.integers(0, 20000)),
    fan2_duty_pct=maybe_float,
    v_in_v=maybe_float,
    i_in_a=maybe_float,
    p_in_w=maybe_float,
    gpu_uuid=maybe_text,
    gpu_temp_c=maybe_float,
    gpu_power_w=maybe_float,
    gpu_limit_w=maybe_float,
    policy_level=maybe_text,
    policy_reasons=names,
    policy_target_w=maybe_float,
    policy_original_w=maybe_float,
)
events = st.builds(
    R.EventRow,
    time_unix=finite,
    elapsed_s=finite,
    module=maybe_text,
    gpu_uuid=maybe_text,
    event_kind=st.text(max_size=12),
    event=st.text(max_size=20),
    level=maybe_text,
    message=maybe_text,
    detail=st.dictionaries(st.text(max_size=8), json_value, max_size=4),
)


def _write(fmt, rows, meta=None):
    buf = io.StringIO()
    w = R.writer_for(fmt, buf)
    meta = meta or R.RecordingMeta(started_unix=1_700_000_000.25, interval_s=1.0,
                                   source="sim", backend="virtual", dry_run=True)  # fmt: skip
    w.write_meta(meta)
    w.write_all(rows)
    return buf.getvalue(), w


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.one_of(samples, events), max_size=6), fmt=st.sampled_from(R.FORMATS))
def test_any_rows_round_trip_through_either_format(rows, fmt):
    text, w = _write(fmt, rows)
    rec = R.parse_recording(text)
    want = [R.normalized(r) for r in rows]
    assert rec.samples == [r for r in want if isinstance(r, R.SampleRow)]
    assert rec.events == [r for r in want if isinstance(r, R.EventRow)]
    assert rec.format == fmt and rec.notes == []
    assert rec.meta.version == R.SCHEMA_VERSION and rec.meta.source == "sim"
    assert rec.meta.started_unix == pytest.approx(1_700_000_000.25, abs=1e-3)
    assert w.bytes_written == len(text.encode())
    assert (w.samples, w.events) == (len(rec.samples), len(rec.events))
    # what is written is printable: no escape sequence reaches a terminal that cats it
    assert all(c.isprintable() or c == "\n" for c in text)


@settings(max_examples=100, deadline=None)
@given(row=st.one_of(samples, events))
def test_normalized_is_idempotent_and_keeps_finite_numbers(row):
    n = R.normalized(row)
    assert R.normalized(n) == n
    if isinstance(row, R.SampleRow) and row.temp_gpu_c is not None:
        assert n.temp_gpu_c == (row.temp_gpu_c if row.temp_gpu_c == row.temp_gpu_c
                                and abs(row.temp_gpu_c) != float("inf") else None)  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.one_of(samples, events), min_size=1, max_size=4),
       fmt=st.sampled_from(R.FORMATS), data=st.data())  # fmt: skip
def test_a_last_line_cut_anywhere_is_dropped_with_a_note(rows, fmt, data):
    text, _ = _write(fmt, rows)
    body = text.rstrip("\n")
    start = body.rfind("\n") + 1  # the last row's line
    cut = data.draw(st.integers(start + 1, len(body)))
    rec = R.parse_recording(text[:cut], name="rec")
    got = rec.samples + rec.events
    whole = [R.normalized(r) for r in rows]
    n = len(got)
    assert n in (len(rows), len(rows) - 1)
    if n == len(rows) - 1:
        assert rec.notes and "cut short" in rec.notes[0]
    kept = whole if n == len(rows) else whole[:-1]
    assert rec.samples == [r for r in kept if isinstance(r, R.SampleRow)]
    assert rec.events == [r for r in kept if isinstance(r, R.EventRow)]


def test_the_files_say_their_schema_first():
    text, _ = _write("csv", [R.SampleRow(1.0, 0.0, module="m", temp_gpu_c=40.5)])
    first, header = text.splitlines()[:2]
    assert first.startswith("# modbridge recording v1; started 2023-11-14T22:13:20.250Z")
    assert "temp_gpu_c degC" in first and "fan1_duty_pct %" in first
    assert header.split(",") == list(R.CSV_COLUMNS) and header.startswith("kind,time_unix")
    text, _ = _write("jsonl", [])
    meta = json.loads(text.splitlines()[0])
    assert meta["kind"] == "meta" and meta["version"] == 1
    assert meta["units"]["gpu_limit_w"] == "W" and meta["units"]["fan1_duty_pct"] == "%"
    assert meta["sample_columns"][0] == "time_unix" and "detail" in meta["event_columns"]


# ----------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "empty: nothing was recorded"),
        (b" \n\n", "empty"),
        (b"hello world\n", "not a modbridge recording"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not a modbridge recording"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[1, 2, 3]\n", "not a modbridge recording"),
        (b"{not json\n{\"kind\":\"meta\"}\n", "not a modbridge recording"),
        (b"kind,when\nsample,1\n", "not a recording's header"),
        (b"# modbridge recording v1; started None\n", "header row is missing"),
        (b'{"kind":"meta","version":99}\n', "newer than this modbridge"),
        (b'{"kind":"meta","version":1}\n{"kind":"sample","elapsed_s":1}\n{"kind":"event",'
         b'"time_unix":1,"elapsed_s":0}\n', "line 2: time_unix missing"),
        (b'{"kind":"meta","version":1}\n{"kind":"bogus","time_unix":1,"elapsed_s":0}\n'
         b'{"kind":"meta"}\n', "line 2: kind 'bogus'"),
        (b'{"kind":"meta","version":1}\n{"kind":"sample","time_unix":1,"elapsed_s":0,'
         b'"fan1_rpm":"fast"}\n\n', "line 2: fan1_rpm: an integer"),
    ],
)  # fmt: skip
def test_garbage_is_refused_by_name_with_what_to_do(tmp_path, content, says):
    f = tmp_path / "rec.jsonl"
    f.write_bytes(content)
    with pytest.raises(R.RecordingError, match=r".*") as e:
        R.read_recording(f)
    assert says in str(e.value) and str(f) in str(e.value)
    res = run("report", str(f), "-o", str(tmp_path / "out.png"))
    assert res.exit_code == 2
    assert res.output.startswith("modbridge report: ") and says in res.output
    assert not (tmp_path / "out.png").exists()


def test_an_unwritable_output_is_exit_1_for_report_as_for_record(tmp_path):
    """docs/bridge.md: a file that cannot be written is a runtime error (1) whichever
    command writes it; a recording that cannot be read is a usage error (2)."""
    text, _ = _write("csv", [R.SampleRow(1.0, 0.0, module="m")] * 3)
    (tmp_path / "rec.csv").write_text(text)
    out = tmp_path / "no-such-dir" / "out.png"
    res = run("report", str(tmp_path / "rec.csv"), "-o", str(out))
    assert res.exit_code == 1 and "cannot write the report" in res.output, res.output
    res = run("record", "--sim", "--duration", "1", "-o", str(tmp_path / "no-such-dir" / "r.csv"))
    assert res.exit_code == 1 and "cannot write" in res.output, res.output


def test_a_bad_csv_line_in_the_middle_is_named(tmp_path):
    text, _ = _write("csv", [R.SampleRow(1.0, 0.0, module="m")] * 3)
    lines = text.splitlines(keepends=True)
    lines[3] = lines[3].replace(",0.0,", ",warm,", 1)
    with pytest.raises(R.RecordingError, match=r"line 4: elapsed_s: a number, got 'warm'"):
        R.parse_recording("".join(lines), "x.csv")
    lines = text.splitlines(keepends=True)
    lines[2] = "sample,1.0\n"
    with pytest.raises(R.RecordingError, match=r"line 3: 2 fields, the header has 34"):
        R.parse_recording("".join(lines), "x.csv")


def test_a_missing_file_and_a_recording_without_samples(tmp_path):
    with pytest.raises(R.RecordingError, match="cannot read"):
        R.read_recording(tmp_path / "absent.csv")
    text, _ = _write("csv", [])
    rec = R.parse_recording(text)
    assert rec.samples == [] and rec.events == []
    with pytest.raises(R.RecordingError, match="no samples"):
        P.figure(rec)
    (tmp_path / "empty.csv").write_text(text)
    res = run("report", str(tmp_path / "empty.csv"))
    assert res.exit_code == 2 and "no samples" in res.output


# ----------------------------------------------------------------------------- the figure


def _handmade(n=30, modules=("aa11", "bb22"), stall_at=10.0):
    rows = []
    for i in range(n):
        t = float(i)
        for k, mod in enumerate(modules):
            stalled = mod == modules[0] and t >= stall_at
            rows.append(R.SampleRow(
                1000.0 + t, t, module=mod, port=f"/dev/ttyUSB{k}", link_up=True,
                state="FAILSAFE" if stalled else "HOSTED",
                reason="fan_stall" if stalled else "host_ok",
                temp_gpu_c=40 + t / 3, temp_vram_c=42.0, temp_mos_c=38.0, temp_amb_c=25.0,
                fan1_rpm=0 if stalled else 1200, fan1_duty_pct=100.0 if stalled else 40.0,
                fan2_rpm=1500, fan2_duty_pct=40.0, v_in_v=12.0, i_in_a=20.0, p_in_w=240.0 + k,
                gpu_uuid=f"GPU-{k}", gpu_temp_c=45 + t / 2, gpu_power_w=230.0,
                gpu_limit_w=490.0 if stalled else 700.0,
                policy_level="WARN" if stalled else "NORMAL",
                policy_target_w=490.0 if stalled else None, policy_original_w=700.0,
            ))  # fmt: skip
    ev = [
        R.EventRow(1000 + stall_at, stall_at, module=modules[0], event_kind="module_event",
                   event="fan_stall", level="alarm", message="fan_stall active"),
        R.EventRow(1000 + stall_at, stall_at, module=modules[0], event_kind="module_event",
                   event="fan_stall cleared", level="alarm"),
        R.EventRow(1000 + stall_at + 2, stall_at + 2, gpu_uuid="GPU-0", event_kind="power_limit",
                   event="limit lower 490 W", level="info", detail={"action": "lower"}),
        R.EventRow(1000.0, 0.0, event_kind="bridge", event="bridge start"),
    ]  # fmt: skip
    return R.Recording(R.RecordingMeta(started_unix=1000.0, interval_s=1.0), rows, ev, "csv")


def _event_lines(ax):
    return [ln for ln in ax.lines if ln.get_gid() == "event"]


def _row_axes(fig, row):
    """Row ``row``'s (temperatures, fans, power, event list) axes (not the rpm twin)."""
    out = {}
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if spec is not None and spec.rowspan.start == row and ax.get_ylabel() != "rpm":
            out.setdefault(spec.colspan.start, ax)
    return tuple(out[j] for j in range(4))


def _listed(ax):
    return [t.get_text() for t in ax.texts if t.get_gid() == "event-list"]


def test_the_figure_has_the_curves_and_the_event_markers():
    rec = _handmade()
    fig = P.figure(rec, title="bench 3")
    grid = fig.axes[0].get_subplotspec().get_gridspec()
    assert (grid.nrows, grid.ncols) == (2, 4)  # modules x (temps, fans, power, events)
    temps, fans, power, events = _row_axes(fig, 0)
    assert (temps.get_ylabel(), fans.get_ylabel(), power.get_ylabel()) == ("degC", "duty %", "W")
    labels = [ln.get_label() for ln in temps.lines if ln.get_gid() != "event"]
    assert labels == ["NTC gpu", "NTC vram", "NTC mos", "NTC amb", "GPU (NVML)"]
    assert {"GPU power limit", "policy target", "GPU power", "module input"} <= {
        ln.get_label() for ln in power.lines}
    assert {"fan1 duty", "fan2 duty"} <= {ln.get_label() for ln in fans.lines}
    # module aa11: its alarm and its GPU's limit action, on every plot; not the cleared
    # alarm, not the bridge's start; numbered on the temperatures, listed beside
    for ax in (temps, fans, power):
        assert sorted(ln.get_xdata()[0] for ln in _event_lines(ax)) == [10.0, 12.0]
    texts = [t.get_text() for t in temps.texts if t.get_gid() == "event"]
    assert texts == ["1", "2"]
    listed = _listed(events)
    assert listed[0] == "events (s)" and "fan_stall" in listed[1] and listed[1].startswith(" 1")
    assert "limit lower 490 W" in listed[2] and listed[2].startswith(" 2")
    # the WARN while fan 1 stalled: shaded on the three plots
    assert any(p.get_gid() == "policy" for p in temps.patches)
    assert power.get_xlabel() == ""  # the bottom row has the time axis
    assert _row_axes(fig, 1)[0].get_xlabel() == "elapsed (s)"  # no world time: the wall's
    assert "bench 3" in fig.get_suptitle() and "2 modules" in fig.get_suptitle()
    assert temps.get_title(loc="left").startswith("module aa11  GPU GPU-0")
    # module bb22 had no event
    other = _row_axes(fig, 1)
    assert _event_lines(other[0]) == [] and "bb22" in other[0].get_title(loc="left")
    assert _listed(other[3]) == ["no events"]
    # the limit line steps down where the limit was lowered
    limit = next(ln for ln in power.lines if ln.get_label() == "GPU power limit")
    assert list(limit.get_ydata()[9:11]) == [700.0, 490.0]


def test_markers_close_together_share_one_number_and_a_gpu_alone_gets_a_row():
    rec = _handmade(modules=("aa11",))
    rec.events.append(R.EventRow(1010.05, 10.05, module="aa11", event_kind="decision",
                                 event="NORMAL -> WARN", level="warning"))  # fmt: skip
    rec.samples += [R.SampleRow(1000.0 + i, float(i), gpu_uuid="GPU-9", gpu_temp_c=30.0,
                                gpu_power_w=50.0) for i in range(5)]  # fmt: skip
    fig = P.figure(rec)
    temps, _f, _p, events = _row_axes(fig, 0)
    texts = [t.get_text() for t in temps.texts if t.get_gid() == "event"]
    assert texts == ["1", "2"]
    assert "fan_stall, NORMAL -> WARN" in _listed(events)[1]
    lone = _row_axes(fig, 1)[0]
    assert lone.get_title(loc="left").startswith("GPU GPU-9 (no module cools it)")


def test_a_module_known_by_its_port_before_its_hello_is_one_column():
    rows = [R.SampleRow(1.0, 0.0, module="/dev/ttyUSB0", port="/dev/ttyUSB0", link_up=False),
            R.SampleRow(2.0, 1.0, module="abc", port="/dev/ttyUSB0", temp_gpu_c=30.0)]
    cols = P.columns(R.Recording(None, rows, [], "jsonl"))
    assert len(cols) == 1 and cols[0].title == "module abc"


def test_render_writes_a_png(tmp_path):
    res = P.render(_handmade(), tmp_path / "r.png", title="t")
    data = (tmp_path / "r.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and res.bytes_written == len(data) > 30_000
    assert res.markers == 2 and len(res.columns) == 2


# ----------------------------------------------------------------------------- the recorder


class _FakeBridge:
    """A bridge that ticks on a fake clock: ``run`` calls ``on_tick`` every 0.25 s."""

    def __init__(self, clock, tap):
        self.clock, self.tap = clock, tap
        self.stopped = False

    def run(self, until=None, on_tick=None):
        from modbridge.model import BridgeSnapshot, ModuleStatus

        st = ModuleStatus(port="/dev/x", module_id="m1", link_up=True, fans=2,
                          telemetry={"state": 1, "temp_gpu": 41250, "fan1_rpm": 900,
                                     "fan1_duty": 32768, "v_in": 12010})  # fmt: skip
        n = 0
        while not self.stopped:
            n += 1
            if n == 5:
                self.tap.log.write("module_event", module_id="m1", reason="fan_stall",
                                   fields={"active": True, "severity": 2, "state": 3,
                                           "index": 1, "value": 12345})  # fmt: skip
                self.tap.log.write("module_event", module_id="m1", reason="sensor_open",
                                   fields={"active": False, "severity": 2, "index": 0})
            on_tick(BridgeSnapshot(taken_at=self.clock[0], modules=[st]))
            if until():
                break
            self.clock[0] += 0.25


def test_the_recorder_samples_on_its_interval_and_writes_events_between():
    clock = [100.0]
    tap = R.EventTap(clock=lambda: 5000.0 + clock[0])
    buf = io.StringIO()
    b = _FakeBridge(clock, tap)
    seen = []
    rec = R.Recorder(b, R.JsonlWriter(buf), tap, interval_s=1.0, duration_s=4.0,
                     on_progress=seen.append, monotonic=lambda: clock[0],
                     wall=lambda: 5000.0 + clock[0])  # fmt: skip
    rec.run()
    rec.finish()
    got = R.parse_recording(buf.getvalue())
    assert [s.elapsed_s for s in got.samples] == [0.0, 1.0, 2.0, 3.0, 4.0]
    s = got.samples[0]
    assert (s.module, s.state, s.temp_gpu_c) == ("m1", "HOSTED", 41.25)
    assert (s.fan1_rpm, s.v_in_v) == (900, 12.01)
    assert s.fan1_duty_pct == pytest.approx(50.0, abs=0.01)  # percent, not 1/65535
    ev, ev2 = got.events
    assert (ev.event, ev.level, ev.module, ev.elapsed_s) == ("fan_stall fan2", "alarm", "m1", 1.0)
    assert ev.detail["state"] == "FAILSAFE" and ev.detail["fan"] == 2
    assert "value" not in ev.detail and "index" not in ev.detail  # no wire units, no 0-based
    assert ev.message == "fan_stall fan2 active, module FAILSAFE"
    assert (ev2.event, ev2.detail["channel"]) == ("sensor_open ntc gpu cleared", "gpu")
    assert P.marker_for(ev) is not None and P.marker_for(ev2) is None
    assert got.meta.interval_s == 1.0 and got.meta.started_unix == 5100.0
    assert [p.samples for p in seen] == [1, 2, 3, 4, 5] and seen[-1].bytes_written > 500


def test_the_progress_line_redraws_on_a_tty_and_prints_lines_otherwise():
    p = R.Progress(12.4, 24, 3, 4200, 1, 1)
    assert cli_record.progress_text(p, "r.csv") == (
        "recording 12 s  24 samples  3 events  4.1 KB  1/1 modules up -> r.csv")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    line = cli_record._ProgressLine("r.csv", stream=out)
    line(p)
    line(p)  # within 0.5 s: not redrawn
    line(p, final=True)
    # redrawn in place (CR, erase), the final state kept on its own line
    assert out.getvalue().count("\r") == 2 and out.getvalue().endswith("-> r.csv\n")
    out = io.StringIO()
    line = cli_record._ProgressLine("r.csv", stream=out)
    line(p)
    line(p)
    line(p, final=True)
    assert out.getvalue().count("\n") == 2 and "\r" not in out.getvalue()


# ----------------------------------------------------------------------------- the CLI


def test_record_reads_real_gpus_only_and_ignores_a_running_bridges_lock(tmp_path, fake_nvml):
    """Real hardware: a dry run. A GPU locked by a running bridge does not stop it, and
    it takes no lock of its own; a port without a module is recorded as down."""
    from modbridge.actuator.gpulock import GpuLock

    state = tmp_path / "state"
    uuid = NvmlBackend(nvml=FakeNvml()).devices()[0].uuid
    held = GpuLock(state, uuid, key=f"{uuid}.test-{os.getpid()}").acquire()  # "the service"
    master, slave = pty.openpty()
    try:
        out = tmp_path / "r.csv"
        res = run("record", "--port", os.ttyname(slave), "--backend", "nvml", "--state-dir",
                  str(state), "--duration", "0.6", "--interval", "0.2", "-o", str(out), "--json")
        assert res.exit_code == 0, res.output
        summary = json.loads(res.output[res.output.index("{\n"):])
        assert summary["samples"] >= 2 and summary["limits_restored"] is True
        rec = R.read_recording(out)
        assert rec.meta.dry_run is True and rec.meta.source == "serial"
        assert rec.samples[0].link_up is False and rec.samples[0].module == os.ttyname(slave)
        gpu = next(s for s in rec.samples if s.gpu_uuid == uuid)
        assert gpu.gpu_limit_w == 700.0 and gpu.gpu_temp_c is not None
        assert [e.event for e in rec.events][0] == "bridge start"
        assert sorted(p.name for p in (state / "locks").iterdir()) == [held.path.name]
        # the file exists now: not overwritten without --force
        res = run("record", "--port", os.ttyname(slave), "--backend", "nvml", "-o", str(out))
        assert res.exit_code == 2 and "exists: give --force" in res.output
    finally:
        held.release()
        os.close(master)
        os.close(slave)


def test_a_port_the_service_holds_is_refused_with_what_to_do(tmp_path, fake_nvml):
    master, slave = pty.openpty()
    service = serial.Serial(os.ttyname(slave), exclusive=True)  # the bridge service's link
    try:
        res = run("record", "--port", os.ttyname(slave), "--backend", "nvml", "-o",
                  str(tmp_path / "r.csv"), "--duration", "1")
    finally:
        service.close()
        os.close(master)
        os.close(slave)
    assert res.exit_code == 1
    assert res.output.startswith("modbridge record: ") and "port in use" in res.output
    assert "systemctl stop modbridge" in res.output and "never takes the GPUs" in res.output
    assert not (tmp_path / "r.csv").exists()


def test_record_without_a_module_or_with_bad_options(tmp_path, fake_nvml):
    res = run("record", "--backend", "nvml", "-o", str(tmp_path / "r.csv"))
    assert res.exit_code == 3 and "no module found" in res.output
    res = run("record", "--sim-fault", "fan_stall:1@1s", "-o", str(tmp_path / "r.csv"))
    assert res.exit_code == 2 and "--sim-fault needs --sim" in res.output
    res = run("record", "--interval", "0", "-o", str(tmp_path / "r.csv"))
    assert res.exit_code == 2
    res = run("record", "--sim", "-o", str(tmp_path))
    assert res.exit_code == 2 and "is a directory" in res.output


def test_a_simulated_stall_recorded_then_plotted(tmp_path):
    """A virtual module at 20x real time, fan 1 stalling from 10 s to 30 s of world
    time, recorded as JSON lines until SIGINT (Ctrl-C) once the limit was lowered; then
    `modbridge report` on it."""
    out = tmp_path / "stall.jsonl"

    def interrupt_when_lowered():
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            text = out.read_text() if out.exists() else ""
            if '"limit lower' in text and text.count('"kind":"sample"') >= 12:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    t = threading.Thread(target=interrupt_when_lowered, daemon=True)
    t.start()
    res = run("record", "--sim", "--sim-speed", "20", "--sim-fault", "fan_stall:1@10s-30s",
              "--interval", "0.2", "--duration", "45", "-o", str(out), "-q")
    t.join(1)
    assert res.exit_code == 0, res.output
    assert "stopped by signal SIGINT" in res.output and "is complete" in res.output
    text = out.read_text()
    assert text.endswith("\n")
    rec = R.read_recording(out)
    assert rec.notes == [] and rec.meta.source == "sim" and rec.meta.dry_run is False
    ids = rec.modules()
    mod = next(m for m in ids if not m.startswith("/"))
    rows = [s for s in rec.samples if s.module == mod]
    assert len(rows) >= 10
    assert all(s.temp_gpu_c is not None and s.gpu_power_w is not None for s in rows)
    # the world's clock beside the wall's: it runs about 20x faster
    worlds = [s.world_s for s in rows]
    assert worlds == sorted(worlds) and worlds[-1] - worlds[0] > 5 * (
        rows[-1].elapsed_s - rows[0].elapsed_s)
    assert any(s.fan1_rpm == 0 or "fan1_stall" in s.faults for s in rows)
    assert any(s.gpu_limit_w == 490.0 for s in rows) and rows[0].gpu_limit_w == 700.0
    kinds = {(e.event_kind, e.event) for e in rec.events}
    assert ("module_event", "fan_stall fan1") in kinds and ("decision", "NORMAL -> WARN") in kinds
    assert ("power_limit", "limit lower 490 W") in kinds
    # Ctrl-C: the bridge stopped and put the limit back, and the file says so last
    assert rec.events[-1].event == "bridge stop" and rec.events[-1].detail["limits_restored"]
    assert ("power_limit", "limit restore 700 W") in kinds
    assert all(0 <= e.elapsed_s < 60 for e in rec.events)

    png = tmp_path / "stall.png"
    res = run("report", str(out), "--title", "fan 1 stall", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["path"] == str(png) and info["markers"] >= 3 and len(info["columns"]) == 1
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 40_000
    fig = P.figure(rec)
    assert fig.axes[-1].get_xlabel() == "world time (s)" or any(
        ax.get_xlabel() == "world time (s)" for ax in fig.axes)
    from matplotlib import image

    pixels = image.imread(png)
    assert pixels.shape[0] > 500 and pixels.shape[1] > 800
    assert pixels[..., :3].std() > 0.05  # not one colour
    assert len({tuple(p) for p in pixels[::7, ::7, :3].reshape(-1, 3).round(2)}) > 20

    # a cut last line (the recorder killed mid-write): plotted, with a note
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 5])
    res = run("report", str(cut), "-o", str(tmp_path / "cut.png"))
    assert res.exit_code == 0 and "note: " in res.output and "cut short" in res.output
    assert (tmp_path / "cut.png").read_bytes().startswith(PNG_MAGIC)
