"""Event log: JSON lines with ISO timestamps, thread-safe, never raising on a full disk."""

from __future__ import annotations

import errno
import io
import json
import os
import threading

import pytest

from modbridge.eventlog import EventLog, iso_utc
from modbridge.gpu.base import GpuSample
from modbridge.model import ModuleStatus
from modbridge.policy import PairPolicy, PolicyConfig
from protocol import catalog as C


def test_iso_utc():
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1714564803.25) == "2024-05-01T12:00:03.250Z"


def test_a_line_per_event_with_the_fields_in_order():
    lines: list[str] = []
    ev = EventLog(lines, clock=lambda: 1714564803.25)
    assert ev.write(
        "decision",
        values={"gpu_temp_c": 84.5},
        reasons=["over_temp"],
        target_w=245.0,
        level="WARN",
        gpu_uuid="GPU-0",
        module_id="m1",
    )
    (line,) = lines
    assert "\n" not in line
    rec = json.loads(line)
    assert list(rec) == [
        "ts",
        "kind",
        "module_id",
        "gpu_uuid",
        "level",
        "target_w",
        "reasons",
        "values",
    ]
    assert rec["ts"] == "2024-05-01T12:00:03.250Z"
    assert rec["values"] == {"gpu_temp_c": 84.5}
    assert (ev.written, ev.dropped) == (1, 0)


def test_non_json_values_are_made_safe():
    lines: list[str] = []
    ev = EventLog(lines, clock=lambda: 0)
    ev.write(
        "alert",
        values={"eta_s": float("inf"), "nan": float("nan"), 3: (1, 2), "s": {"b", "a"}},
        obj=object,
    )
    rec = json.loads(lines[0])
    assert rec["values"] == {"eta_s": None, "nan": None, "3": [1, 2], "s": ["a", "b"]}
    assert rec["obj"] == str(object)


def test_decisions_from_the_policy_parse_and_carry_their_values():
    lines: list[str] = []
    ev = EventLog(lines, clock=lambda: 0)
    p = PairPolicy(PolicyConfig(), "m1", "GPU-0")
    m = ModuleStatus(
        port="/dev/null",
        module_id="m1",
        last_frame_at=0.0,
        fans=2,
        telemetry={"faults": C.FAULT_FAN1_STALL, "temp_gpu": 60000, "v_in": 11900},
    )
    g = GpuSample(uuid="GPU-0", temperature_c=60.0, default_limit_w=300.0, min_limit_w=100.0)
    d = p.evaluate(0.0, m, g)
    assert d.changed
    ev.write("decision", **d.as_event())
    rec = json.loads(lines[0])
    assert rec["module_id"] == "m1" and rec["gpu_uuid"] == "GPU-0"
    assert (rec["level"], rec["previous_level"], rec["target_w"]) == ("WARN", "NORMAL", 210.0)
    assert rec["reasons"] == ["fan_stall"]
    assert rec["values"]["stalled_fans"] == 1
    assert rec["values"]["v_in_v"] == 11.9
    assert rec["values"]["sources"] == {"fan_stall": ["module"]}


def test_file_sink_appends(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"kind":"earlier"}\n')
    with EventLog(path, clock=lambda: 0) as ev:
        ev.write("decision", level="NORMAL")
        ev.write("decision", level="WARN")
    rows = [json.loads(s) for s in path.read_text().splitlines()]
    assert [r.get("level") for r in rows] == [None, "NORMAL", "WARN"]


def test_copytruncate_keeps_writing_at_the_start(tmp_path):
    path = tmp_path / "events.jsonl"
    ev = EventLog(str(path), clock=lambda: 0)
    ev.write("a", n=1)
    os.truncate(path, 0)  # what logrotate's copytruncate does after copying
    ev.write("b", n=2)
    ev.close()
    assert [json.loads(s)["kind"] for s in path.read_text().splitlines()] == ["b"]


def test_stream_sink():
    buf = io.StringIO()
    ev = EventLog(buf, clock=lambda: 0)
    ev.write("x")
    assert json.loads(buf.getvalue()) == {"ts": "1970-01-01T00:00:00.000Z", "kind": "x"}


class FullDisk(io.StringIO):
    def write(self, s):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_is_counted_never_raised(caplog):
    ev = EventLog(FullDisk())
    with caplog.at_level("WARNING", logger="modbridge.eventlog"):
        assert ev.write("decision", level="WARN") is False
        assert ev.write("decision", level="WARN") is False
    assert (ev.written, ev.dropped) == (0, 2)
    assert caplog.text.count("dropping events") == 1  # warned once


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_dev_full():
    ev = EventLog("/dev/full")
    assert ev.write("decision") is False
    assert ev.dropped == 1
    ev.close()


def test_closed_stream_is_counted():
    buf = io.StringIO()
    ev = EventLog(buf)
    buf.close()
    assert ev.write("x") is False
    assert ev.dropped == 1


def test_bad_sink_type():
    with pytest.raises(TypeError, match="path, a text stream or a list"):
        EventLog(42)


def test_thread_safe_lines_never_interleave(tmp_path):
    path = tmp_path / "events.jsonl"
    ev = EventLog(path)
    big = "x" * 5000

    def writer(n):
        for i in range(200):
            ev.write("t", thread=n, i=i, pad=big)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ev.close()
    rows = [json.loads(s) for s in path.read_text().splitlines()]
    assert len(rows) == 1600 == ev.written
    assert sorted((r["thread"], r["i"]) for r in rows) == [
        (n, i) for n in range(8) for i in range(200)
    ]
