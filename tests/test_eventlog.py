"""Event log: JSON lines with ISO timestamps, thread-safe, never raising on a full disk."""

from __future__ import annotations

import errno
import io
import json
import os
import threading
from pathlib import Path

import pytest

from modbridge.exporter.eventlog import EventLog, iso_utc
from modbridge.gpu.base import GpuSample
from modbridge.model import ModuleStatus
from modbridge.policy.engine import PairPolicy, PolicyConfig
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
    with caplog.at_level("WARNING", logger="modbridge.exporter.eventlog"):
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


# --- the file: O_NOFOLLOW, mode, refusals ------------------------------------------------
from modbridge.exporter import eventlog as E  # noqa: E402
from modbridge.exporter.eventlog import EventLogError  # noqa: E402


def _rows(path):
    return [json.loads(s) for s in open(path, encoding="ascii").read().splitlines()]


def _all_rows(path, keep):
    """Every line of ``path`` and its rotated files, oldest first."""
    rows = []
    for i in range(keep, 0, -1):
        if os.path.exists(f"{path}.{i}"):
            rows += _rows(f"{path}.{i}")
    return rows + (_rows(path) if os.path.exists(path) else [])


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_at_the_path_is_refused_not_followed(tmp_path, dangling):
    target = tmp_path / "elsewhere"
    if not dangling:
        target.write_text("precious\n")
    link = tmp_path / "events.jsonl"
    link.symlink_to(target)
    with pytest.raises(EventLogError, match="is a symbolic link: the event log never follows"):
        EventLog(link)
    with pytest.raises(OSError):  # callers catching OSError (cli_bridge) still do
        EventLog(str(link))
    if dangling:
        assert not target.exists()  # not created through the link
    else:
        assert target.read_text() == "precious\n"


def test_a_symlink_swapped_in_while_running_is_refused(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0\n")
    ev = EventLog(path, clock=lambda: 0)
    assert ev.write("a")
    path.unlink()
    path.symlink_to(target)
    with caplog.at_level("WARNING", logger="modbridge.exporter.eventlog"):
        assert ev.write("b") is False
        assert ev.write("c") is False
    assert target.read_text() == "root:x:0:0\n"
    assert ev.dropped == 2 and caplog.text.count("symbolic link") == 1
    path.unlink()  # the link removed: the log picks up again with a new file
    assert ev.write("d")
    assert [r["kind"] for r in _rows(path)] == ["d"]
    ev.close()


def test_a_directory_at_the_path_is_refused(tmp_path):
    with pytest.raises(EventLogError, match="is a directory: give the event log a file name"):
        EventLog(tmp_path)


def test_a_missing_directory_says_create_it(tmp_path):
    with pytest.raises(EventLogError, match="no directory .*create it") as e:
        EventLog(tmp_path / "nope" / "events.jsonl")
    assert e.value.errno == errno.ENOENT


def test_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(EventLogError, match="regular files only"):
        EventLog(fifo)  # no reader: never blocks
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(EventLogError, match="regular files only"):
            EventLog(fifo)  # a reader: opens, then refused
    finally:
        os.close(r)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_a_new_file_is_0640_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        with EventLog(tmp_path / "events.jsonl", max_bytes=100) as ev:
            for i in range(10):
                ev.write("x", i=i)  # rotates: the new files are 0640 too
    finally:
        os.umask(old)
    assert ev.rotations > 0
    for p in tmp_path.iterdir():
        assert oct(p.stat().st_mode & 0o777) == oct(0o640), p


@pytest.mark.parametrize("before,after", [(0o666, 0o640), (0o644, 0o640), (0o600, 0o600)])
def test_an_existing_file_is_narrowed_never_widened(tmp_path, before, after):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    os.chmod(path, before)
    EventLog(path).close()
    assert path.stat().st_mode & 0o777 == after


def test_permission_denied_says_what_to_check(tmp_path, monkeypatch):
    def denied(*a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(E.os, "open", denied)
    with pytest.raises(EventLogError, match="permission denied: .*LogsDirectory"):
        EventLog(tmp_path / "events.jsonl")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_directory(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    (d / "events.jsonl").write_text("")
    d.chmod(0o500)
    try:
        with pytest.raises(EventLogError, match="permission denied"):
            EventLog(d / "other.jsonl")
        ev = EventLog(d / "events.jsonl", max_bytes=100)  # the file is writable
        for i in range(5):
            assert ev.write("x", i=i)  # past max_bytes: rotation fails, lines go on
        assert ev.rotate_failures > 0 and ev.rotations == 0
        ev.close()
    finally:
        d.chmod(0o700)


def test_a_char_device_is_accepted_and_never_rotated():
    with EventLog(os.devnull, max_bytes=10) as ev:
        for _ in range(5):
            assert ev.write("x")
    assert ev.rotations == 0 and ev.written == 5


def test_bad_bounds():
    with pytest.raises(ValueError):
        EventLog([], max_bytes=-1)
    with pytest.raises(ValueError):
        EventLog([], backup_count=-1)


# --- rotation ----------------------------------------------------------------------------
def _line_len(kind="x", **fields):
    return len(EventLog([], clock=lambda: 0).format(kind, **fields)) + 1


def test_defaults_are_10_mib_times_5():
    assert (E.DEFAULT_MAX_BYTES, E.DEFAULT_BACKUP_COUNT) == (10 * 1024 * 1024, 5)


def test_rotation_boundaries(tmp_path):
    path = tmp_path / "events.jsonl"
    n = _line_len(i=0)  # every line below has this length (i < 10)
    ev = EventLog(path, clock=lambda: 0, max_bytes=3 * n, backup_count=2)
    for i in range(3):
        ev.write("x", i=i)
    assert path.stat().st_size == 3 * n and ev.rotations == 0  # exactly full: no rotation
    ev.write("x", i=3)  # would pass max_bytes: rotate first
    assert ev.rotations == 1
    assert [r["i"] for r in _rows(f"{path}.1")] == [0, 1, 2]
    assert [r["i"] for r in _rows(path)] == [3]
    for i in range(4, 10):
        ev.write("x", i=i)
    # 10 lines, 3 a file, 2 kept: the oldest went
    assert [r["i"] for r in _rows(f"{path}.2")] == [3, 4, 5]
    assert [r["i"] for r in _rows(f"{path}.1")] == [6, 7, 8]
    assert [r["i"] for r in _rows(path)] == [9]
    assert not os.path.exists(f"{path}.3")
    assert ev.rotations == 3 and ev.counters() == {
        "written": 10, "dropped": 0, "rotations": 3, "rotate_failures": 0,
    }  # fmt: skip
    ev.close()


def test_a_line_longer_than_max_bytes_gets_a_file_of_its_own(tmp_path):
    path = tmp_path / "events.jsonl"
    ev = EventLog(path, clock=lambda: 0, max_bytes=100, backup_count=3)
    ev.write("a")
    ev.write("big", pad="x" * 300)
    ev.write("b")
    ev.close()
    assert [r["kind"] for r in _rows(f"{path}.2")] == ["a"]
    assert [r["kind"] for r in _rows(f"{path}.1")] == ["big"]
    assert [r["kind"] for r in _rows(path)] == ["b"]


def test_backup_count_0_deletes_and_max_bytes_0_never_rotates(tmp_path):
    a = tmp_path / "a.jsonl"
    with EventLog(a, max_bytes=200, backup_count=0) as ev:
        for i in range(50):
            ev.write("x", i=i)
    assert a.stat().st_size <= 200 and _rows(a)[-1]["i"] == 49
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]
    b = tmp_path / "b.jsonl"
    with EventLog(b, max_bytes=0) as ev:
        for i in range(50):
            ev.write("x", i=i)
    assert len(_rows(b)) == 50 and ev.rotations == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


def test_existing_backups_are_shifted_not_lost(tmp_path):
    path = tmp_path / "events.jsonl"
    for i in (1, 2):
        Path(f"{path}.{i}").write_text(json.dumps({"kind": f"old{i}"}) + "\n")
    path.write_text(json.dumps({"kind": "current"}) + "\n")
    with EventLog(path, max_bytes=30, backup_count=3) as ev:
        ev.write("new")
    assert [r["kind"] for r in _all_rows(path, 3)] == ["old2", "old1", "current", "new"]


def test_a_failed_rotation_keeps_writing_warns_once_and_retries(tmp_path, monkeypatch, caplog):
    path = tmp_path / "events.jsonl"
    ev = EventLog(path, clock=lambda: 0, max_bytes=60, backup_count=2)
    real = os.replace

    def read_only(src, dst):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(E.os, "replace", read_only)
    with caplog.at_level("INFO", logger="modbridge.exporter.eventlog"):
        for i in range(6):
            assert ev.write("x", i=i)
        assert ev.rotate_failures >= 4 and ev.rotations == 0 and ev.dropped == 0
        assert caplog.text.count("cannot rotate") == 1
        monkeypatch.setattr(E.os, "replace", real)
        ev.write("x", i=6)
    assert ev.rotations == 1 and "rotates again" in caplog.text
    assert [r["i"] for r in _all_rows(path, 2)] == list(range(7))
    ev.close()


def test_renamed_behind_its_back_it_reopens(tmp_path):
    """logrotate without copytruncate (rename, then create): the next line goes to a
    new file at the path, not to the renamed one."""
    path = tmp_path / "events.jsonl"
    ev = EventLog(path, clock=lambda: 0, max_bytes=0)
    ev.write("a")
    os.rename(path, f"{path}.old")
    ev.write("b")
    os.unlink(path)
    ev.write("c")
    ev.close()
    assert [r["kind"] for r in _rows(f"{path}.old")] == ["a"]
    assert [r["kind"] for r in _rows(path)] == ["c"]


def test_concurrent_writers_in_one_process_rotate_once_and_lose_nothing(tmp_path):
    """Two EventLogs on one path (and four threads each) with a small max_bytes: every
    line is in exactly one file, whole, and no file passes max_bytes."""
    path = tmp_path / "events.jsonl"
    max_bytes, keep = 4096, 1000
    logs = [EventLog(path, max_bytes=max_bytes, backup_count=keep) for _ in range(2)]

    def writer(ev, n):
        for i in range(150):
            assert ev.write("t", thread=n, i=i, pad="y" * (i % 97))

    threads = [threading.Thread(target=writer, args=(logs[n % 2], n)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ev in logs:
        ev.close()
    rows = _all_rows(path, keep)
    assert sorted((r["thread"], r["i"]) for r in rows) == [
        (n, i) for n in range(8) for i in range(150)
    ]
    files = [p for p in tmp_path.iterdir()]
    assert len(files) > 10
    assert all(p.stat().st_size <= max_bytes for p in files)
    assert sum(ev.rotations for ev in logs) == len(files) - 1
    # per thread, lines are in order across the rotated files
    for n in range(8):
        assert [r["i"] for r in rows if r["thread"] == n] == list(range(150))


# --- failures mid-run ----------------------------------------------------------------------
def test_a_short_write_on_a_full_disk_leaves_one_torn_line_only(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    ev = EventLog(path, clock=lambda: 0)
    real = os.write
    calls = []

    def filling(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, data[:10])  # half a line, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    ev.write("a")
    monkeypatch.setattr(E.os, "write", filling)
    assert ev.write("b") is False
    assert ev.write("c") is False
    monkeypatch.setattr(E.os, "write", real)
    assert ev.write("d")
    ev.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["kind"] == "a"
    with pytest.raises(ValueError):
        json.loads(lines[1])  # the torn one
    assert json.loads(lines[2])["kind"] == "d"  # whole, on a line of its own
    assert (ev.written, ev.dropped) == (2, 2)


def test_permission_lost_mid_run_is_one_warning_per_episode(tmp_path, monkeypatch, caplog):
    path = tmp_path / "events.jsonl"
    ev = EventLog(path, clock=lambda: 0)
    ev.write("a")
    real_open = os.open

    def denied(*a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied")

    with caplog.at_level("INFO", logger="modbridge.exporter.eventlog"):
        for episode in range(2):
            path.unlink()  # removed, and the directory no longer writable
            monkeypatch.setattr(E.os, "open", denied)
            for _ in range(20):
                assert ev.write("lost") is False
            monkeypatch.setattr(E.os, "open", real_open)
            assert ev.write("back", episode=episode)
    assert caplog.text.count("dropping events") == 2
    assert caplog.text.count("writing again (20 events dropped before)") == 2
    assert (ev.written, ev.dropped) == (3, 40)
    assert [r["kind"] for r in _rows(path)] == ["back"]
    ev.close()


def test_write_after_close_is_dropped(tmp_path):
    ev = EventLog(tmp_path / "events.jsonl")
    ev.close()
    assert ev.write("x") is False and ev.dropped == 1


# --- strings from the wire -----------------------------------------------------------------
EVIL = "e661\x1b]0;pwned\x07\x1b[2J\u202etxt.exe\x00\nforged\x9b31m"


def test_wire_strings_are_sanitised_in_every_string_of_a_record(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path, clock=lambda: 0) as ev:
        ev.write(
            "module_event",
            module_id=EVIL,
            fields={"text": EVIL, EVIL: 1},
            reasons=[EVIL],
            message=b"raw\x1b",
            obj=type("Evil", (), {"__str__": lambda self: EVIL})(),
        )
    raw = path.read_bytes()
    assert raw.count(b"\n") == 1 and raw.endswith(b"\n")  # one line: nothing forged
    assert all(0x20 <= b < 0x7F for b in raw[:-1])  # ASCII, no control byte
    (rec,) = _rows(path)
    strings = [rec["module_id"], rec["fields"]["text"], rec["reasons"][0], rec["obj"]]
    strings += [k for k in rec["fields"] if k != "text"] + [rec["message"]]
    for s in strings:  # decoded, too, nothing a terminal would act on
        assert s.isprintable(), s
    assert rec["module_id"] == (
        "e661\\x1b]0;pwned\\x07\\x1b[2J\\u202etxt.exe\\x00\\nforged\\x9b31m"
    )
    assert rec["message"] == "raw\\x1b"


def test_strings_are_bounded():
    lines: list[str] = []
    EventLog(lines, clock=lambda: 0).write("x", text="\x1b" * 5000)
    assert len(json.loads(lines[0])["text"]) <= E.MAX_STR
