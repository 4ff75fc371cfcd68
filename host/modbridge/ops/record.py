"""Recordings: module and GPU telemetry plus events, to CSV or JSON lines, and back.

``modbridge record`` (docs/recording.md) samples a running
:class:`~modbridge.bridge.Bridge` every interval: one :class:`SampleRow` per module
(its telemetry, its paired GPU's reading, the policy's level and target), one per GPU
that no module is paired with, and one :class:`EventRow` per line the bridge writes to
its event log (decisions, power-limit actions, module events, links, start/stop).
Values are in the units a person reads (degC, W, V, A, percent, rpm), never wire units;
the column names carry them (``temp_gpu_c``, ``fan1_duty_pct``, ``gpu_limit_w``).

Two file formats, one schema (:data:`SAMPLE_FIELDS`, :data:`EVENT_FIELDS`):

* **CSV**: a comment line ``# modbridge recording v1 ...`` (what, when, the units),
  then a header row, then one row per sample or event; the ``kind`` column says which
  (``sample`` or ``event``), a column that does not apply to the kind is empty. Lists
  (``faults``, ``policy_reasons``) are space-separated names, ``detail`` is compact JSON.
* **JSON lines**: a first ``{"kind": "meta", ...}`` object (version, units, columns),
  then ``{"kind": "sample", ...}`` and ``{"kind": "event", ...}`` objects; a value the
  module or GPU does not have is ``null``.

:func:`read_recording` reads either back (auto-detected) into the same rows. A last
line cut short (the recorder was killed mid-write) is dropped with a note; any other
line that does not parse is a :class:`RecordingError` naming it. Writers flush at
every interval, so a killed recording is complete up to its last interval.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from modbridge.errors import ModbridgeError
from modbridge.sanitize import sanitize

SCHEMA_VERSION = 1
FORMATS = ("csv", "jsonl")
CSV_MAGIC = "# modbridge recording"

#: units of the columns (a column not named here has none: names, states, text)
UNITS = {
    "time_unix": "s (Unix time)",
    "elapsed_s": "s since the recording started",
    "world_s": "s of simulated world time (--sim only)",
    "temp_gpu_c": "degC",
    "temp_vram_c": "degC",
    "temp_mos_c": "degC",
    "temp_amb_c": "degC",
    "fan1_rpm": "rpm",
    "fan1_duty_pct": "%",
    "fan2_rpm": "rpm",
    "fan2_duty_pct": "%",
    "v_in_v": "V",
    "i_in_a": "A",
    "p_in_w": "W",
    "gpu_temp_c": "degC",
    "gpu_power_w": "W",
    "gpu_limit_w": "W",
    "policy_target_w": "W",
    "policy_original_w": "W",
}


class RecordingError(ModbridgeError):
    """A recording that cannot be read (empty, not a recording, a bad line), or an
    output that cannot be written; the message names the file and what to do."""

    exit_code = 2


class OutputError(RecordingError):
    """An output file that cannot be written: a runtime error (exit 1), the same for
    ``record -o`` and ``report -o`` (docs/bridge.md exit codes)."""

    exit_code = 1


@dataclass
class SampleRow:
    """One module (and its GPU) at one instant; None: not known, not sent, no GPU."""

    time_unix: float
    elapsed_s: float
    world_s: float | None = None  # --sim: the module's world clock (it runs --sim-speed x)
    module: str | None = None  # module id (the port until its hello)
    port: str | None = None
    link_up: bool | None = None
    state: str | None = None  # BOOT, HOSTED, STANDALONE, FAILSAFE, MANUAL
    reason: str | None = None
    faults: tuple[str, ...] = ()
    temp_gpu_c: float | None = None
    temp_vram_c: float | None = None
    temp_mos_c: float | None = None
    temp_amb_c: float | None = None
    fan1_rpm: int | None = None
    fan1_duty_pct: float | None = None
    fan2_rpm: int | None = None
    fan2_duty_pct: float | None = None
    v_in_v: float | None = None
    i_in_a: float | None = None
    p_in_w: float | None = None
    gpu_uuid: str | None = None
    gpu_temp_c: float | None = None
    gpu_power_w: float | None = None
    gpu_limit_w: float | None = None  # the enforced power limit
    policy_level: str | None = None  # NORMAL, WARN, CRITICAL
    policy_reasons: tuple[str, ...] = ()
    policy_target_w: float | None = None  # None: the original limit
    policy_original_w: float | None = None

    kind = "sample"


@dataclass
class EventRow:
    """One line of the bridge's event log (docs/bridge.md, docs/policy.md)."""

    time_unix: float
    elapsed_s: float
    module: str | None = None
    gpu_uuid: str | None = None
    event_kind: str = ""  # the event log's kind: decision, power_limit, module_event, ...
    event: str = ""  # a short label: "fan_stall", "limit lower 490 W", "NORMAL -> WARN"
    level: str | None = None  # info, warning, alarm, alert, ...
    message: str | None = None
    detail: dict = field(default_factory=dict)  # the event's other fields

    kind = "event"


SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(SampleRow))
EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(EventRow))
_SHARED = ("time_unix", "elapsed_s", "module", "gpu_uuid")
#: the CSV header: kind, the shared columns, the sample columns, the event columns
CSV_COLUMNS = (
    ("kind",)
    + _SHARED
    + tuple(n for n in SAMPLE_FIELDS if n not in _SHARED)
    + tuple(n for n in EVENT_FIELDS if n not in _SHARED)
)
_LISTS = frozenset({"faults", "policy_reasons"})
_INTS = frozenset({"fan1_rpm", "fan2_rpm"})
_BOOLS = frozenset({"link_up"})
_REQUIRED_FLOATS = frozenset({"time_unix", "elapsed_s"})
_FLOATS = frozenset(UNITS) - _INTS
_TEXT_DEFAULT = {"event_kind": "", "event": ""}  # EventRow's non-optional strings


@dataclass
class RecordingMeta:
    """What the file's first line says: the schema version, when, from what."""

    version: int = SCHEMA_VERSION
    started_unix: float | None = None
    interval_s: float | None = None
    source: str | None = None  # "sim" or "serial"
    ports: tuple[str, ...] = ()
    backend: str | None = None
    dry_run: bool | None = None

    def as_dict(self) -> dict:
        return {
            "kind": "meta",
            "format": "modbridge recording",
            "version": self.version,
            "started_unix": self.started_unix,
            "started": _iso(self.started_unix),
            "interval_s": self.interval_s,
            "source": self.source,
            "ports": list(self.ports),
            "backend": self.backend,
            "dry_run": self.dry_run,
            "units": dict(UNITS),
            "sample_columns": list(SAMPLE_FIELDS),
            "event_columns": list(EVENT_FIELDS),
        }

    @classmethod
    def from_dict(cls, d: dict) -> RecordingMeta:
        def num(k):
            v = d.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        version = d.get("version")
        return cls(
            version=version if isinstance(version, int) else SCHEMA_VERSION,
            started_unix=num("started_unix"),
            interval_s=num("interval_s"),
            source=d.get("source") if isinstance(d.get("source"), str) else None,
            ports=tuple(p for p in d.get("ports") or () if isinstance(p, str)),
            backend=d.get("backend") if isinstance(d.get("backend"), str) else None,
            dry_run=d.get("dry_run") if isinstance(d.get("dry_run"), bool) else None,
        )


@dataclass
class Recording:
    """A recording read back: its meta (None: a CSV without the comment line), the
    samples and events in file order, and notes on what was tolerated."""

    meta: RecordingMeta | None
    samples: list[SampleRow]
    events: list[EventRow]
    format: str
    notes: list[str] = field(default_factory=list)

    def modules(self) -> list[str]:
        """The modules in the samples, in order of appearance."""
        return list(dict.fromkeys(s.module for s in self.samples if s.module is not None))


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


def _finite(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _name(s: str) -> str:
    """A list item as one space-free token (names from the catalog already are)."""
    return re.sub(r"\s+", "_", s) or "_"


def normalized(row):
    """``row`` as a writer stores it and a reader gives it back: non-finite floats as
    None, empty strings as None, list items as space-free names, ints as ints."""
    out = {}
    for f in dataclasses.fields(row):
        v = getattr(row, f.name)
        if f.name in _LISTS:
            v = tuple(_name(sanitize(x, None)) for x in v)
        elif f.name in _REQUIRED_FLOATS:
            v = _finite(v) or 0.0
        elif f.name in _FLOATS:
            v = _finite(v)
        elif f.name in _INTS:
            v = None if v is None else int(v)
        elif f.name == "detail":
            v = _json_safe(v) if v else {}
        elif f.name in _TEXT_DEFAULT:
            v = "" if v is None else sanitize(v, None)
        elif f.name in _BOOLS:
            v = None if v is None else bool(v)
        elif v is not None:
            v = sanitize(v, None) or None
        out[f.name] = v
    return type(row)(**out)


def _json_safe(v):
    """A JSON value's copy that JSON round-trips: non-finite floats as None, keys and
    other objects as text, tuples as lists."""
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


# ----------------------------------------------------------------------------- writers


class RecordingWriter:
    """Writes a recording to a text stream: :meth:`write_meta` once, then rows;
    :meth:`flush` after each interval. ``bytes_written`` counts what was written."""

    format = ""

    def __init__(self, stream):
        self.stream = stream
        self.bytes_written = 0
        self.samples = 0
        self.events = 0

    def _put(self, text: str) -> None:
        self.stream.write(text)
        self.bytes_written += len(text.encode("utf-8"))

    def write_meta(self, meta: RecordingMeta) -> None:
        raise NotImplementedError

    def write(self, row: SampleRow | EventRow) -> None:
        self._write(normalized(row))
        if isinstance(row, SampleRow):
            self.samples += 1
        else:
            self.events += 1

    def _write(self, row) -> None:
        raise NotImplementedError

    def write_all(self, rows: Iterable) -> None:
        for r in rows:
            self.write(r)

    def flush(self) -> None:
        self.stream.flush()


class JsonlWriter(RecordingWriter):
    format = "jsonl"

    def write_meta(self, meta: RecordingMeta) -> None:
        self._put(json.dumps(meta.as_dict(), separators=(",", ":")) + "\n")

    def _write(self, row) -> None:
        d = {"kind": row.kind}
        for name in SAMPLE_FIELDS if row.kind == "sample" else EVENT_FIELDS:
            v = getattr(row, name)
            d[name] = list(v) if name in _LISTS else v
        self._put(json.dumps(d, separators=(",", ":"), allow_nan=False, default=str) + "\n")


class CsvWriter(RecordingWriter):
    format = "csv"

    def __init__(self, stream):
        super().__init__(stream)
        self._buf = io.StringIO()
        self._csv = csv.writer(self._buf, lineterminator="\n")

    def _row(self, values) -> None:
        self._csv.writerow(values)
        self._put(self._buf.getvalue())
        self._buf.seek(0)
        self._buf.truncate()

    def write_meta(self, meta: RecordingMeta) -> None:
        units = ", ".join(f"{k} {v}" for k, v in UNITS.items() if k not in ("time_unix",))
        parts = [f"{CSV_MAGIC} v{meta.version}"]
        parts.append(f"started {_iso(meta.started_unix)}")
        if meta.interval_s is not None:
            parts.append(f"interval {meta.interval_s:g} s")
        if meta.source:
            parts.append(f"source {meta.source}")
        if meta.backend:
            parts.append(f"backend {meta.backend}")
        if meta.dry_run is not None:
            parts.append(f"dry_run {str(meta.dry_run).lower()}")
        line = "; ".join(parts) + f"; units: {units}; kind sample|event (docs/recording.md)"
        self._put(sanitize(line, 4096).replace("\n", " ") + "\n")
        self._row(CSV_COLUMNS)

    def _write(self, row) -> None:
        values = []
        for name in CSV_COLUMNS:
            if name == "kind":
                values.append(row.kind)
                continue
            v = getattr(row, name, None)
            values.append(_csv_cell(name, v))
        self._row(values)


def _csv_cell(name: str, v) -> str:
    if v is None:
        return ""
    if name in _LISTS:
        return " ".join(v)
    if name == "detail":
        return json.dumps(v, separators=(",", ":"), allow_nan=False, default=str) if v else ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def writer_for(fmt: str, stream) -> RecordingWriter:
    if fmt == "csv":
        return CsvWriter(stream)
    if fmt == "jsonl":
        return JsonlWriter(stream)
    raise ValueError(f"unknown recording format {fmt!r}: one of {', '.join(FORMATS)}")


def format_for_path(path: str | None, given: str | None = None) -> str:
    """``given``, else from the file name (``.jsonl``/``.json``/``.ndjson``: jsonl), else csv.

    >>> format_for_path("run.jsonl"), format_for_path("run.csv"), format_for_path("x", "jsonl")
    ('jsonl', 'csv', 'jsonl')
    """
    if given:
        return given
    if path and path.lower().endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    return "csv"


# ----------------------------------------------------------------------------- reader


def read_recording(path: str | os.PathLike) -> Recording:
    """Read a CSV or JSON-lines recording (auto-detected) back into rows.

    Raises :class:`RecordingError` for a missing or empty file, one that is neither
    format, or a line that does not parse (named by its number). A last line without
    its newline that does not parse (a recorder killed mid-write) is dropped and
    said in ``notes``."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RecordingError(f"{p}: cannot read: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordingError(
            f"{p}: not a modbridge recording (not UTF-8 text at byte {e.start}): "
            "`modbridge record -o FILE` writes one"
        ) from e
    return parse_recording(text, name=p)


def parse_recording(text: str, name: str = "<recording>") -> Recording:
    """:func:`read_recording` on text already read."""
    if not text.strip():
        raise RecordingError(f"{name}: empty: nothing was recorded (`modbridge record` "
                             "writes its first line at start)")  # fmt: skip
    first = text.lstrip()
    if first.startswith("{"):
        return _parse_jsonl(text, name)
    if first.startswith(CSV_MAGIC) or first.startswith("kind,"):
        return _parse_csv(text, name)
    line = sanitize(first.splitlines()[0], 60)
    raise RecordingError(
        f"{name}: not a modbridge recording (neither its CSV header nor JSON lines; "
        f"it starts with {line!r}): `modbridge record -o FILE` writes one"
    )


def _lines(text: str) -> tuple[list[str], bool]:
    """The lines, and whether the last one ended without a newline."""
    lines = text.split("\n")
    cut = lines[-1] != ""
    if not cut:
        lines.pop()
    return lines, cut


def _parse_jsonl(text: str, name: str) -> Recording:
    lines, cut = _lines(text)
    meta, samples, events, notes = None, [], [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = i == len(lines)
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            kind = obj.get("kind")
            if kind == "meta":
                if meta is not None or samples or events:
                    raise ValueError("a second meta line")
                meta = RecordingMeta.from_dict(obj)
                _check_version(meta, name)
            elif kind == "sample":
                samples.append(_row_from(SampleRow, obj))
            elif kind == "event":
                events.append(_row_from(EventRow, obj))
            else:
                raise ValueError(f"kind {sanitize(kind, 40)!r} is none of meta, sample, event")
        except (ValueError, TypeError) as e:
            if last and cut:
                notes.append(f"{name}: line {i} is cut short (the recording was stopped "
                             "mid-write): ignored")  # fmt: skip
                continue
            if i == 1 and meta is None:
                raise RecordingError(
                    f"{name}: not a modbridge recording (line 1: {sanitize(e, 120)})"
                ) from e
            raise RecordingError(f"{name}: line {i}: {sanitize(e, 200)}") from e
    if meta is None and (samples or events):
        notes.append(f"{name}: no meta line (schema assumed v{SCHEMA_VERSION})")
    return Recording(meta, samples, events, "jsonl", notes)


def _check_version(meta: RecordingMeta, name: str) -> None:
    if meta.version > SCHEMA_VERSION:
        raise RecordingError(
            f"{name}: recording schema v{meta.version} is newer than this modbridge's "
            f"v{SCHEMA_VERSION}: upgrade modbridge to read it"
        )


def _row_from(cls, obj: dict):
    """A row from a JSON object (unknown keys ignored, types checked)."""
    vals = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            if f.name in _REQUIRED_FLOATS:
                raise ValueError(f"{f.name} missing")
            continue
        vals[f.name] = _typed(f.name, obj[f.name])
    return normalized(cls(**vals))


def _typed(name: str, v):
    if name in _REQUIRED_FLOATS:
        f = _finite(v)
        if f is None or isinstance(v, str):
            raise ValueError(f"{name}: a number, got {sanitize(repr(v), 40)}")
        return f
    if v is None:
        return None
    if name in _LISTS:
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"{name}: a list of names, got {sanitize(repr(v), 40)}")
        return tuple(v)
    if name in _INTS:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
            raise ValueError(f"{name}: an integer, got {sanitize(repr(v), 40)}")
        return int(v)
    if name in _FLOATS:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{name}: a number, got {sanitize(repr(v), 40)}")
        return float(v)
    if name in _BOOLS:
        if not isinstance(v, bool):
            raise ValueError(f"{name}: true or false, got {sanitize(repr(v), 40)}")
        return v
    if name == "detail":
        if not isinstance(v, dict):
            raise ValueError(f"detail: an object, got {sanitize(repr(v), 40)}")
        return v
    if not isinstance(v, str):
        raise ValueError(f"{name}: text, got {sanitize(repr(v), 40)}")
    return v


def _parse_meta_comment(line: str) -> RecordingMeta:
    m = re.match(re.escape(CSV_MAGIC) + r" v(\d+)", line)
    meta = RecordingMeta(version=int(m.group(1)) if m else SCHEMA_VERSION)
    for part in line.split(";"):
        key, _, value = part.strip().partition(" ")
        value = value.strip()
        if key == "started" and value not in ("", "None"):
            try:
                meta.started_unix = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                pass
        elif key == "interval":
            meta.interval_s = _finite(value.split(" ")[0])
        elif key == "source":
            meta.source = value or None
        elif key == "backend":
            meta.backend = value or None
        elif key == "dry_run":
            meta.dry_run = {"true": True, "false": False}.get(value)
    return meta


def _parse_csv(text: str, name: str) -> Recording:
    lines, cut = _lines(text)
    notes: list[str] = []
    meta = None
    start = 0
    while start < len(lines) and lines[start].startswith("#"):
        if lines[start].startswith(CSV_MAGIC) and meta is None:
            meta = _parse_meta_comment(lines[start])
            _check_version(meta, name)
        start += 1
    if start >= len(lines):
        raise RecordingError(f"{name}: the CSV header row is missing (the recording was "
                             "stopped before it was written)")  # fmt: skip
    body = "\n".join(lines[start:]) + ("" if cut else "\n")
    reader = csv.reader(io.StringIO(body, newline=""))
    try:
        header = next(reader)
    except csv.Error as e:
        raise RecordingError(f"{name}: line {start + 1}: {e}") from e
    if "kind" not in header or "time_unix" not in header:
        raise RecordingError(
            f"{name}: line {start + 1}: not a recording's header (it needs the columns "
            "kind and time_unix; `modbridge record --format csv` writes one)"
        )
    samples, events = [], []
    rows = []
    try:
        for r in reader:
            rows.append((start + reader.line_num, r))
    except csv.Error as e:
        if not cut:
            raise RecordingError(f"{name}: line {start + reader.line_num}: {e}") from e
        notes.append(f"{name}: the last line is cut short (the recording was stopped "
                     "mid-write): ignored")  # fmt: skip
        cut = False  # said
    for idx, (lineno, r) in enumerate(rows):
        if not r:
            continue
        last = idx == len(rows) - 1
        try:
            if len(r) != len(header):
                raise ValueError(f"{len(r)} fields, the header has {len(header)}")
            d = dict(zip(header, r, strict=True))
            kind = d.get("kind")
            if kind == "sample":
                samples.append(_row_from_csv(SampleRow, d))
            elif kind == "event":
                events.append(_row_from_csv(EventRow, d))
            else:
                raise ValueError(f"kind {sanitize(kind, 40)!r} is neither sample nor event")
        except (ValueError, TypeError) as e:
            if last and cut:
                notes.append(f"{name}: line {lineno} is cut short (the recording was "
                             "stopped mid-write): ignored")  # fmt: skip
                continue
            raise RecordingError(f"{name}: line {lineno}: {sanitize(e, 200)}") from e
    return Recording(meta, samples, events, "csv", notes)


def _row_from_csv(cls, d: dict):
    vals = {}
    for f in dataclasses.fields(cls):
        cell = d.get(f.name)
        if cell is None:  # a column this file does not have
            if f.name in _REQUIRED_FLOATS:
                raise ValueError(f"{f.name} missing")
            continue
        vals[f.name] = _from_cell(f.name, cell)
    return normalized(cls(**vals))


def _from_cell(name: str, cell: str):
    if name in _REQUIRED_FLOATS:
        f = _finite(cell)
        if f is None:
            raise ValueError(f"{name}: a number, got {sanitize(repr(cell), 40)}")
        return f
    if name in _LISTS:
        return tuple(cell.split())
    if cell == "":
        return {} if name == "detail" else None
    if name in _INTS:
        try:
            return int(cell)
        except ValueError:
            raise ValueError(f"{name}: an integer, got {sanitize(repr(cell), 40)}") from None
    if name in _FLOATS:
        f = _finite(cell)
        if f is None:
            raise ValueError(f"{name}: a number, got {sanitize(repr(cell), 40)}")
        return f
    if name in _BOOLS:
        if cell not in ("true", "false"):
            raise ValueError(f"{name}: true or false, got {sanitize(repr(cell), 40)}")
        return cell == "true"
    if name == "detail":
        try:
            v = json.loads(cell)
        except ValueError:
            raise ValueError(f"detail: JSON, got {sanitize(repr(cell), 40)}") from None
        if not isinstance(v, dict):
            raise ValueError("detail: a JSON object")
        return v
    return cell


# ----------------------------------------------------------------------------- rows from a bridge


# a module's quantities under the same name in the status document and a recording
# (docs/vocabulary.md); its GPU's and policy's carry the object's name as a prefix here
_MODULE_QUANTITIES = ("temp_gpu_c", "temp_vram_c", "temp_mos_c", "temp_amb_c", "fan1_rpm",
                      "fan1_duty_pct", "fan2_rpm", "fan2_duty_pct", "v_in_v", "i_in_a",
                      "p_in_w")  # fmt: skip


def sample_rows(rep: dict, time_unix: float, elapsed_s: float) -> list[SampleRow]:
    """Rows for one instant from :func:`modbridge.bridge.report`: one per module (with
    its paired GPU and policy: ``gpu.temp_c`` is ``gpu_temp_c``, ``policy.target_w``
    ``policy_target_w``), then one per GPU no module is paired with. Times are kept to
    the millisecond."""
    time_unix, elapsed_s = round(time_unix, 3), round(elapsed_s, 3)
    rows = []
    paired = set()
    for m in rep.get("modules", ()):
        gpu = m.get("gpu") or {}
        pol = m.get("policy") or {}
        if gpu.get("uuid"):
            paired.add(gpu["uuid"])
        rows.append(
            SampleRow(
                time_unix=time_unix,
                elapsed_s=elapsed_s,
                module=m.get("module_id") or m.get("port"),
                port=m.get("port"),
                link_up=m.get("link_up"),
                state=m.get("state"),
                reason=m.get("reason"),
                faults=tuple(m.get("faults") or ()),
                **{k: m.get(k) for k in _MODULE_QUANTITIES},
                gpu_uuid=gpu.get("uuid"),
                gpu_temp_c=gpu.get("temp_c"),
                gpu_power_w=gpu.get("power_w"),
                gpu_limit_w=gpu.get("limit_w"),
                policy_level=pol.get("level"),
                policy_reasons=tuple(pol.get("reasons") or ()),
                policy_target_w=pol.get("target_w"),
                policy_original_w=pol.get("original_w"),
            )
        )
    for g in rep.get("gpus", ()):
        if g and g.get("uuid") and g["uuid"] not in paired:
            rows.append(
                SampleRow(
                    time_unix=time_unix,
                    elapsed_s=elapsed_s,
                    gpu_uuid=g["uuid"],
                    gpu_temp_c=g.get("temp_c"),
                    gpu_power_w=g.get("power_w"),
                    gpu_limit_w=g.get("limit_w"),
                )
            )
    return rows


def _ts_unix(ts) -> float | None:
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _state_name(v):
    from protocol import catalog as C

    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(C.STATES):
        return C.STATES[v]
    return v


def _severity(v) -> str | None:
    from protocol import catalog as C

    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(C.SEVERITIES):
        return C.SEVERITIES[v]
    return None


_FAN_REASONS = frozenset({"fan_stall", "tach_implausible"})
_CHANNEL_REASONS = frozenset({"sensor_open", "sensor_short", "over_temp", "critical_temp",
                              "calibration", "sensor_stuck", "sensor_implausible"})  # fmt: skip


def _indexed(reason: str, index) -> tuple[str, object, str] | None:
    """A module event's ``index`` as what a person calls it (protocol/catalog.py):
    ``("fan", 1, "fan1")`` for fan 0, ``("channel", "gpu", "ntc gpu")`` for channel 0."""
    from protocol import catalog as C

    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return None
    if reason in _FAN_REASONS:
        return "fan", index + 1, f"fan{index + 1}"
    if reason in _CHANNEL_REASONS and index < len(C.CHANNELS):
        return "channel", C.CHANNELS[index], f"ntc {C.CHANNELS[index]}"
    return None


def event_row(ev: dict, started_unix: float, fallback_unix: float | None = None) -> EventRow:
    """An event-log record (a decoded line) as an :class:`EventRow`: a short label, a
    level, a message; a module event's wire fields as names (state, severity), its
    wire-unit ``value`` left out (the telemetry rows have the values in units)."""
    ev = dict(ev)
    t = _ts_unix(ev.pop("ts", None))
    if t is None:
        t = fallback_unix if fallback_unix is not None else time.time()
    kind = str(ev.pop("kind", "") or "")
    module = ev.pop("module_id", None)
    gpu = ev.pop("gpu_uuid", None)
    level = ev.pop("level", None)
    message = ev.pop("message", None)
    action = ev.get("action")
    label = kind if action is None else f"{kind} {action}"
    if kind == "module_event":
        fields = ev.pop("fields", None) or {}
        reason = ev.get("reason") or "event"
        active = fields.get("active")
        what = _indexed(str(reason), fields.get("index"))
        if what:
            ev[what[0]] = what[1]
        subject = f"{reason} {what[2]}" if what else str(reason)
        label = subject if active is not False else f"{subject} cleared"
        level = level or _severity(fields.get("severity"))
        for k in ("active", "uptime_s"):
            if k in fields:
                ev[k] = fields[k]
        for k in ("state", "prev_state"):
            if k in fields:
                ev[k] = _state_name(fields[k])
        state = ev.get("state")
        message = message or (
            f"{subject} {'active' if active is not False else 'cleared'}"
            + (f", module {state}" if state else "")
        )
    elif kind == "decision":
        prev, new = ev.get("previous_level"), ev.get("level_name") or level
        label = f"{prev} -> {new}" if prev and prev != new else f"policy {new}"
        reasons = ev.get("reasons") or ()
        target = ev.get("target_w")
        message = message or (
            f"policy {new}: {', '.join(map(str, reasons)) or 'all clear'}"
            + (f", target {target:g} W" if isinstance(target, (int, float)) else "")
        )
        ev.pop("values", None)  # the policy's inputs: in the samples already
    elif kind in ("power_limit", "clocks"):
        what = "limit" if kind == "power_limit" else "clocks"
        watts = ev.get("enforced_w", ev.get("requested_w"))
        label = f"{what} {action}" + (
            f" {watts:g} W" if kind == "power_limit" and isinstance(watts, (int, float)) else ""
        )
    elif kind == "link":
        label = "link up" if ev.get("up") else "link down"
    if kind == "decision" and isinstance(level, str) and level in ("NORMAL", "WARN", "CRITICAL"):
        ev["policy_level"] = level
        level = {"NORMAL": "info", "WARN": "warning", "CRITICAL": "critical"}[level]
    return normalized(
        EventRow(
            time_unix=round(t, 3),
            elapsed_s=round(t - started_unix, 3),
            module=module if isinstance(module, str) else None,
            gpu_uuid=gpu if isinstance(gpu, str) else None,
            event_kind=kind,
            event=label,
            level=level if isinstance(level, str) else None,
            message=message if isinstance(message, str) else None,
            detail=ev,
        )
    )


# ----------------------------------------------------------------------------- the recorder


@dataclass
class Progress:
    """What the progress line shows."""

    elapsed_s: float
    samples: int
    events: int
    bytes_written: int
    modules_up: int = 0
    modules: int = 0


@dataclass
class RecordResult:
    """What a recording wrote (``modbridge record --json``)."""

    path: str | None
    format: str
    samples: int
    events: int
    bytes_written: int
    elapsed_s: float
    stop_reason: str | None = None
    limits_restored: bool = True

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class EventTap:
    """The bridge's event log as rows: an :class:`~modbridge.exporter.eventlog.EventLog`
    whose sink is a list (sanitised JSON, thread-safe appends), drained by the recorder."""

    def __init__(self, clock: Callable[[], float] = time.time):
        from modbridge.exporter.eventlog import EventLog

        self.lines: list[str] = []
        self.log = EventLog(self.lines, clock=clock)

    def drain(self, started_unix: float) -> list[EventRow]:
        n = len(self.lines)  # appends only go to the end: taking the first n is safe
        batch = self.lines[:n]
        del self.lines[:n]
        out = []
        for line in batch:
            try:
                ev = json.loads(line)
            except ValueError:  # EventLog writes JSON: not expected
                continue
            out.append(event_row(ev, started_unix))
        return out


class Recorder:
    """Samples a started bridge into a writer.

    ``bridge`` needs ``snapshot()``, ``run(until, on_tick)`` and ``request_stop()``
    (a :class:`~modbridge.bridge.Bridge` made with ``event_log=tap.log``). The caller
    starts the bridge before and stops it after :meth:`run` (its stop writes the last
    events: call :meth:`finish` then)."""

    def __init__(
        self,
        bridge,
        writer: RecordingWriter,
        tap: EventTap,
        interval_s: float = 1.0,
        duration_s: float | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        meta: RecordingMeta | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_samples: int | None = None,
        started: tuple[float, float] | None = None,
        world_time: Callable[[str | None], float | None] | None = None,
    ):
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.bridge, self.writer, self.tap = bridge, writer, tap
        self.interval_s, self.duration_s = interval_s, duration_s
        self.on_progress = on_progress
        self.monotonic, self.wall = monotonic, wall
        self.max_samples = max_samples
        self.world_time = world_time  # port -> its simulated world's clock (s), --sim
        self.meta = meta or RecordingMeta()
        # (monotonic, Unix) time 0: given (taken before the bridge started, so that
        # its start and link events are at elapsed >= 0), else now
        self._t0, self.started_unix = started or (self.monotonic(), self.wall())
        self.meta.started_unix = self.started_unix
        self.meta.interval_s = interval_s
        self._next = self._t0
        self.intervals = 0
        self._header = False

    def elapsed(self) -> float:
        return self.monotonic() - self._t0

    def start(self) -> None:
        if not self._header:
            self.writer.write_meta(self.meta)
            self.writer.flush()
            self._header = True

    def _done(self) -> bool:
        if self.duration_s is not None and self.elapsed() >= self.duration_s:
            return True
        return self.max_samples is not None and self.intervals >= self.max_samples

    def on_tick(self, snap) -> None:
        """The bridge loop's tick: events at once, a sample when the interval is due."""
        from modbridge.bridge import report

        self.start()
        self.writer.write_all(self.tap.drain(self.started_unix))
        now = self.monotonic()
        if now >= self._next:
            rep = report(snap, now)
            rows = sample_rows(rep, self.wall(), now - self._t0)
            if self.world_time is not None:
                for r in rows:
                    r.world_s = self.world_time(r.port)
            self.writer.write_all(rows)
            self.intervals += 1
            # on the interval's grid; a late tick does not shift every later sample
            missed = math.floor((now - self._next) / self.interval_s)
            self._next += self.interval_s * (missed + 1)
            self.writer.flush()
            if self.on_progress is not None:
                mods = rep.get("modules", ())
                self.on_progress(self.progress(sum(1 for m in mods if m.get("link_up")), len(mods)))

    def progress(self, up: int = 0, modules: int = 0) -> Progress:
        return Progress(self.elapsed(), self.writer.samples, self.writer.events,
                        self.writer.bytes_written, up, modules)  # fmt: skip

    def run(self) -> None:
        """Loop the bridge until the duration is over or it is asked to stop."""
        self.start()
        self.bridge.run(until=self._done, on_tick=self.on_tick)

    def finish(self) -> None:
        """After the bridge stopped: its last events (stop, restores), flushed."""
        self.start()
        self.writer.write_all(self.tap.drain(self.started_unix))
        self.writer.flush()
