"""The nvidia-smi backend: the fallback when NVML cannot be loaded.

One ``nvidia-smi --query-gpu`` subprocess costs ~21 ms on an H200 (against ~11 us for a
whole NVML scrape, ``fixtures/nvidia-h200/nvml_h200.json``), so every GPU is read in one
call and the rows are cached for ``max_age_s``: ``sample_all()`` is one subprocess, and
``sample(uuid)`` right after it is free. Commands are argv lists, never a shell string.

Field names are this driver's (``nvidia-smi --help-query-gpu``, recorded in
``nvidia_smi_help_query_gpu.txt``): ``clocks_event_reasons.active`` (alias of the
deprecated ``clocks_throttle_reasons.active``), ``power.draw`` (1 s average on Ampere
and newer, like nvmlDeviceGetPowerUsage), ``enforced.power.limit`` (what the GPU
enforces) beside ``power.limit`` (what software requested). An older nvidia-smi that
rejects a field (``Field "x" is not a valid field to query.``) is asked again with the
alias, or without the optional field.

The GPU's temperature thresholds are not in ``--query-gpu``; they are read once from
``nvidia-smi -q -x``. This driver reports them relative to T.Limit (the recording:
current 32 C, T.Limit margin 55 C, shutdown -8 C, slowdown -2 C, max operating 0 C),
which gives the same 95/89/87 degC NVML reports; older drivers give absolute
``gpu_temp_max_threshold``/``gpu_temp_slow_threshold``.

Locked clocks (the clocks actuator): ``-i <uuid> -lgc MIN,MAX`` and ``-rgc``; the
supported graphics clocks come once from ``-q -x -d SUPPORTED_CLOCKS`` (the top
memory clock's list), the max and current clock from one ``--query-gpu`` per read.
nvidia-smi cannot show a lock in force (``ClockState.lock_known`` is False).
"""

from __future__ import annotations

import csv
import logging
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET

from modbridge.gpu.base import (
    ClocksRefused,
    ClockState,
    GpuBackend,
    GpuDriverNotLoaded,
    GpuError,
    GpuInfo,
    GpuLost,
    GpuNoPermission,
    GpuNotFound,
    GpuSample,
    PowerLimitRefused,
    error_sample,
    supported_clocks,
)

log = logging.getLogger(__name__)

QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "temperature.gpu",
    "temperature.memory",
    "temperature.gpu.tlimit",
    "power.draw",
    "power.limit",
    "enforced.power.limit",
    "power.default_limit",
    "power.min_limit",
    "power.max_limit",
    "clocks_event_reasons.active",
    "utilization.gpu",
    "fan.speed",
)
# Asked again under the older name when nvidia-smi rejects the newer one.
FIELD_ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
# Dropped when nvidia-smi rejects them.
OPTIONAL_FIELDS = frozenset({"temperature.gpu.tlimit", "temperature.memory", "power.limit"})
_TEXT_FIELDS = frozenset({"uuid", "name", "gpu_name", "gpu_uuid", "pci.bus_id", "pstate"})
# Values nvidia-smi prints for "no value".
_ABSENT = frozenset({"", "n/a", "[n/a]", "not supported", "[not supported]", "[unknown error]"})
_LOST_MARKERS = ("gpu is lost", "fallen off the bus")
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query', re.IGNORECASE)
_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_.]*")
_NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?")

# nvidia-smi's exit codes (its man page) mirror nvmlReturn_t.
_EXIT_INVALID_ARGUMENT = 2
_EXIT_NOT_SUPPORTED = 3
_EXIT_NO_PERMISSION = 4
_EXIT_DRIVER_NOT_LOADED = 9
_EXIT_LIBRARY_NOT_FOUND = 12
_EXIT_GPU_IS_LOST = 15

_ROOT_HINT = (
    "run modbridge as root (or grant it CAP_SYS_ADMIN), and enable persistence mode "
    "with `nvidia-smi -pm 1` so the driver keeps the limit"
)


def parse_value(field: str, text: str):
    """One CSV cell: None for N/A / Not Supported, int for hex bitmasks, float for
    numbers (units such as " W", " %", " MHz" dropped), str for text fields.

    >>> parse_value("power.draw [W]", "94.38 W"), parse_value("fan.speed", "[N/A]")
    (94.38, None)
    >>> parse_value("clocks_event_reasons.active", "0x0000000000000004")
    4
    """
    text = text.strip()
    if text.lower() in _ABSENT:
        return None
    name = field.split(" [", 1)[0]
    if name in _TEXT_FIELDS:
        return text
    if text.lower().startswith("0x"):
        return int(text, 16)
    m = _NUMBER.match(text)
    if m is None:
        return text  # e.g. "[GPU is lost]": the caller decides
    number = m.group(0)
    return float(number)


def parse_query_csv(text: str, fields=QUERY_FIELDS) -> list[dict]:
    """Rows of ``--query-gpu`` output as dicts keyed by field name (units stripped).

    Takes ``--format=csv,noheader,nounits`` output (columns are ``fields``) and also the
    form with a header and units (``nvidia_smi_query.csv``): a first line whose first
    cell is a field name is a header, and its names (``power.draw [W]`` ->
    ``power.draw``) are used instead.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    rows = list(csv.reader(lines, skipinitialspace=True))
    if not rows:
        return []
    names = list(fields)
    first = [c.strip().split(" [", 1)[0] for c in rows[0]]
    if all(_FIELD_NAME.fullmatch(c) for c in first):  # a header: data has digits/capitals
        names = first
        rows = rows[1:]
    out = []
    for row in rows:
        if len(row) != len(names):
            raise GpuError(
                f"nvidia-smi printed {len(row)} columns where {len(names)} were asked "
                f"({', '.join(names)}): {','.join(row)!r}"
            )
        out.append({name: parse_value(name, cell) for name, cell in zip(names, row, strict=True)})
    return out


def _temp(text):
    if text is None:
        return None
    m = _NUMBER.match(text.strip())
    return float(m.group(0)) if m else None


def parse_thresholds_xml(text: str) -> dict[str, dict]:
    """Temperature thresholds per GPU UUID from ``nvidia-smi -q -x``: keys
    ``shutdown_temp_c``, ``slowdown_temp_c``, ``max_operating_temp_c`` (None if absent)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise GpuError(f"nvidia-smi -q -x printed XML that does not parse: {e}") from e
    out = {}
    for gpu in root.iter("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        t = gpu.find("temperature")
        if not uuid or t is None:
            continue
        cur, margin = _temp(t.findtext("gpu_temp")), _temp(t.findtext("gpu_temp_tlimit"))
        tlimit_c = cur + margin if cur is not None and margin is not None else None

        def from_tlimit(tag, t=t, tlimit_c=tlimit_c):
            offset = _temp(t.findtext(tag))
            return None if offset is None or tlimit_c is None else tlimit_c - offset

        def threshold(absolute_tag, tlimit_tag, t=t):
            value = _temp(t.findtext(absolute_tag))  # older drivers: absolute degC
            return value if value is not None else from_tlimit(tlimit_tag)

        out[uuid] = {
            "shutdown_temp_c": threshold("gpu_temp_max_threshold", "gpu_temp_max_tlimit_threshold"),
            "slowdown_temp_c": threshold(
                "gpu_temp_slow_threshold", "gpu_temp_slow_tlimit_threshold"
            ),
            "max_operating_temp_c": threshold(
                "gpu_temp_max_gpu_threshold", "gpu_temp_max_gpu_tlimit_threshold"
            ),
        }
    return out


def parse_supported_clocks_xml(text: str) -> dict[str, dict[int, list[int]]]:
    """Supported clocks per GPU UUID from ``nvidia-smi -q -x`` (``-d SUPPORTED_CLOCKS``):
    ``{uuid: {memory MHz: [graphics MHz, ...]}}``, in the order listed."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise GpuError(f"nvidia-smi -q -x printed XML that does not parse: {e}") from e
    out: dict[str, dict[int, list[int]]] = {}
    for gpu in root.iter("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        table: dict[int, list[int]] = {}
        for mem in gpu.iter("supported_mem_clock"):
            mem_mhz = _temp(mem.findtext("value"))
            if mem_mhz is None:
                continue
            clocks = [_temp(c.text or "") for c in mem.findall("supported_graphics_clock")]
            table[int(mem_mhz)] = [int(c) for c in clocks if c is not None]
        if uuid:
            out[uuid] = table
    return out


class SmiBackend(GpuBackend):
    """GPUs through the ``nvidia-smi`` command. ``runner`` is ``subprocess.run``."""

    name = "nvidia-smi"

    def __init__(
        self,
        smi_path=None,
        timeout_s=5.0,
        max_age_s=0.5,
        clock=time.monotonic,
        runner=subprocess.run,
    ):
        path = smi_path or shutil.which("nvidia-smi")
        if path is None:
            raise GpuDriverNotLoaded(
                "nvidia-smi not found on PATH: install the NVIDIA driver or use --sim"
            )
        self.path = str(path)
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._run_cmd = runner
        self._fields = list(QUERY_FIELDS)
        self._cache: tuple[float, dict[str, dict]] | None = None
        self._thresholds: dict[str, dict] | None = None
        self._supported: dict[str, dict[int, list[int]]] | None = None
        self.subprocesses = 0  # how many times nvidia-smi ran (cost accounting)
        rows = self._query()
        self._infos = {
            r["uuid"]: GpuInfo(int(r["index"]), r["uuid"], r["name"], r["pci.bus_id"])
            for r in rows.values()
        }

    # ------------------------------------------------------------------ running it

    def _run(self, args: list[str], what: str, check: bool = True):
        """nvidia-smi's stdout; with ``check=False`` the CompletedProcess, any exit code."""
        argv = [self.path, *args]
        self.subprocesses += 1
        try:
            proc = self._run_cmd(
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as e:
            raise GpuDriverNotLoaded(
                f"nvidia-smi not found at {self.path}: install the NVIDIA driver or use --sim"
            ) from e
        except PermissionError as e:
            raise GpuError(f"cannot run {self.path} ({e}): check its permissions") from e
        except subprocess.TimeoutExpired as e:
            raise GpuError(
                f"nvidia-smi did not answer {what} within {self.timeout_s:g} s: the driver "
                "may be hung (check `dmesg` for Xid errors)"
            ) from e
        except OSError as e:
            raise GpuError(f"cannot run {self.path} ({e})") from e
        if not check:
            return proc
        if proc.returncode != 0:
            raise self._exit_error(proc, what)
        return proc.stdout

    def _exit_error(self, proc, what: str) -> GpuError:
        said = " ".join((proc.stderr or "").split() + (proc.stdout or "").split())[:300]
        said = said or "no output"
        rc = proc.returncode
        low = said.lower()
        if rc == _EXIT_GPU_IS_LOST or any(m in low for m in _LOST_MARKERS):
            return GpuLost(
                f"a GPU fell off the bus (nvidia-smi {what}: {said}): check `dmesg` for "
                "Xid 79, then reseat or power-cycle it"
            )
        if rc == _EXIT_NO_PERMISSION or "insufficient permissions" in low:
            return GpuNoPermission(f"nvidia-smi {what} was refused ({said}): {_ROOT_HINT}")
        if (
            rc in (_EXIT_DRIVER_NOT_LOADED, _EXIT_LIBRARY_NOT_FOUND)
            or "couldn't communicate" in low
        ):
            return GpuDriverNotLoaded(
                f"NVIDIA driver not loaded (nvidia-smi {what}: {said}): load it "
                "(`modprobe nvidia`) or use --sim"
            )
        return GpuError(f"nvidia-smi {what} failed with exit code {rc}: {said}")

    def _query(self) -> dict[str, dict]:
        """One subprocess for every GPU; rows by UUID, cached."""
        for _ in range(len(FIELD_ALIASES) + len(OPTIONAL_FIELDS) + 1):
            args = [f"--query-gpu={','.join(self._fields)}", "--format=csv,noheader,nounits"]
            try:
                out = self._run(args, "--query-gpu")
            except GpuError as e:
                if not self._drop_invalid_field(str(e)):
                    raise
                continue
            rows = {r["uuid"]: r for r in parse_query_csv(out, self._fields)}
            self._cache = (self._clock(), rows)
            return rows
        raise GpuError(f"nvidia-smi rejects the query fields {','.join(self._fields)}")

    def _drop_invalid_field(self, message: str) -> bool:
        m = _INVALID_FIELD.search(message)
        if m is None or m.group(1) not in self._fields:
            return False
        bad = m.group(1)
        i = self._fields.index(bad)
        if bad in FIELD_ALIASES:
            self._fields[i] = FIELD_ALIASES[bad]
        elif bad in OPTIONAL_FIELDS:
            del self._fields[i]
        else:
            return False
        log.info("nvidia-smi does not know %s; asking %s", bad, ",".join(self._fields))
        return True

    def _rows(self, fresh: bool) -> dict[str, dict]:
        if not fresh and self._cache is not None:
            taken, rows = self._cache
            if self._clock() - taken <= self.max_age_s:
                return rows
        return self._query()

    def _threshold_for(self, uuid: str) -> dict:
        if self._thresholds is None:
            try:
                self._thresholds = parse_thresholds_xml(self._run(["-q", "-x"], "-q -x"))
            except GpuError as e:
                log.warning("temperature thresholds unavailable: %s", e)
                self._thresholds = {}
        return self._thresholds.get(uuid, {})

    # ------------------------------------------------------------------ GpuBackend

    def devices(self) -> list[GpuInfo]:
        return list(self._infos.values())

    def _to_sample(self, uuid: str, row: dict, taken: float) -> GpuSample:
        lost = [
            k
            for k, v in row.items()
            if isinstance(v, str)
            and k not in _TEXT_FIELDS
            and any(m in v.lower() for m in _LOST_MARKERS)
        ]
        info = self._infos.get(uuid)
        where = f"GPU {uuid} ({row.get('pci.bus_id')})"
        if lost:
            raise GpuLost(
                f"{where} fell off the bus (nvidia-smi: {row[lost[0]]}): check `dmesg` "
                "for Xid 79, then reseat or power-cycle it"
            )

        def num(key):
            v = row.get(key)
            return v if isinstance(v, float) else None

        temp, tlimit = num("temperature.gpu"), num("temperature.gpu.tlimit")
        reasons = row.get("clocks_event_reasons.active", row.get("clocks_throttle_reasons.active"))
        util, fan = num("utilization.gpu"), num("fan.speed")
        thresholds = dict(self._threshold_for(uuid))
        if thresholds.get("max_operating_temp_c") is None and temp is not None and tlimit:
            thresholds["max_operating_temp_c"] = temp + tlimit
        extra = {}
        if num("power.limit") is not None:
            extra["requested_limit_w"] = num("power.limit")
        return GpuSample(
            uuid=uuid,
            name=info.name if info else str(row.get("name") or ""),
            pci_bus_id=info.pci_bus_id if info else str(row.get("pci.bus_id") or ""),
            timestamp=taken,
            temperature_c=temp,
            memory_temperature_c=num("temperature.memory"),
            power_w=num("power.draw"),
            enforced_limit_w=num("enforced.power.limit"),
            default_limit_w=num("power.default_limit"),
            min_limit_w=num("power.min_limit"),
            max_limit_w=num("power.max_limit"),
            clocks_event_reasons=reasons if isinstance(reasons, int) else None,
            utilization=None if util is None else util / 100.0,
            fan_speed_ratio=None if fan is None else fan / 100.0,
            slowdown_temp_c=thresholds.get("slowdown_temp_c"),
            shutdown_temp_c=thresholds.get("shutdown_temp_c"),
            max_operating_temp_c=thresholds.get("max_operating_temp_c"),
            extra=extra,
        )

    def _missing(self, uuid: str) -> GpuError:
        if uuid in self._infos:
            info = self._infos[uuid]
            return GpuLost(
                f"GPU {uuid} ({info.pci_bus_id}) is no longer listed by nvidia-smi: it fell "
                "off the bus? check `dmesg` for Xid 79, then reseat or power-cycle it"
            )
        return GpuNotFound(f"no GPU with UUID {uuid} (GPUs: {', '.join(self._infos) or 'none'})")

    def sample(self, uuid: str) -> GpuSample:
        rows = self._rows(fresh=False)
        if uuid not in rows:
            raise self._missing(uuid)
        return self._to_sample(uuid, rows[uuid], self._cache[0])

    def sample_all(self) -> list[GpuSample]:
        """Every GPU from one subprocess (a failed query marks every GPU)."""
        try:
            rows = self._rows(fresh=True)
        except GpuError as e:
            return [error_sample(info, e) for info in self._infos.values()]
        samples = []
        for info in self._infos.values():
            try:
                if info.uuid not in rows:
                    raise self._missing(info.uuid)
                samples.append(self._to_sample(info.uuid, rows[info.uuid], self._cache[0]))
            except GpuError as e:
                samples.append(error_sample(info, e))
        return samples

    def set_power_limit_w(self, uuid: str, watts: float) -> float:
        """``nvidia-smi -i <uuid> -pl <W>``, then the enforced limit re-queried."""
        if uuid not in self._infos:
            raise self._missing(uuid)
        gpu = f"GPU {uuid} ({self._infos[uuid].pci_bus_id})"
        what = f"-i {uuid} -pl {watts:.2f}"
        proc = self._run(["-i", uuid, "-pl", f"{watts:.2f}"], what, check=False)
        if proc.returncode != 0:
            err = self._exit_error(proc, what)
            said = err.args[0].lower()
            if type(err) is GpuError and (
                proc.returncode in (_EXIT_INVALID_ARGUMENT, _EXIT_NOT_SUPPORTED)
                or "not a valid power limit" in said
                or "not supported" in said
            ):
                raise PowerLimitRefused(
                    f"{gpu} refused a power limit of {watts:g} W: {err}", requested_w=watts,
                    not_supported=proc.returncode == _EXIT_NOT_SUPPORTED or "not supported" in said,
                )  # fmt: skip
            raise err
        self._cache = None
        rows = self._query()
        if uuid not in rows:
            raise self._missing(uuid)
        enforced = rows[uuid].get("enforced.power.limit")
        if not isinstance(enforced, float):
            raise PowerLimitRefused(
                f"{gpu}: set the power limit to {watts:g} W but nvidia-smi shows no "
                "enforced limit to check it against",
                requested_w=watts,
            )
        if enforced > watts + 1.0:
            raise PowerLimitRefused(
                f"{gpu}: set the power limit to {watts:g} W but the enforced limit reads "
                f"{enforced:g} W; the write did not take",
                requested_w=watts,
                enforced_w=enforced,
            )
        return enforced

    # ------------------------------------------------------------------ clocks

    def _gpu_name(self, uuid: str) -> str:
        if uuid not in self._infos:
            raise self._missing(uuid)
        return f"GPU {uuid} ({self._infos[uuid].pci_bus_id})"

    def clock_state(self, uuid: str) -> ClockState:
        """One ``--query-gpu`` for the max and current graphics clock; the supported
        list once per backend."""
        gpu = self._gpu_name(uuid)
        fields = ("uuid", "clocks.max.graphics", "clocks.current.graphics")
        out = self._run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                        "--query-gpu clocks")  # fmt: skip
        rows = {r["uuid"]: r for r in parse_query_csv(out, fields)}
        row = rows.get(uuid)
        if row is None:
            raise self._missing(uuid)
        top = row.get("clocks.max.graphics")
        if not isinstance(top, float):
            raise ClocksRefused(f"{gpu}: nvidia-smi shows no maximum graphics clock",
                                not_supported=True)  # fmt: skip
        if self._supported is None:
            try:
                xml = self._run(["-q", "-x", "-d", "SUPPORTED_CLOCKS"], "-q -x -d SUPPORTED_CLOCKS")
                self._supported = parse_supported_clocks_xml(xml)
            except GpuError as e:
                log.warning("supported clocks unavailable: %s", e)
                self._supported = {}
        table = self._supported.get(uuid) or {}
        listed = table[max(table)] if table else []
        current = row.get("clocks.current.graphics")
        return ClockState(
            max_mhz=int(top),
            supported_mhz=supported_clocks(listed, int(top)),
            current_mhz=int(current) if isinstance(current, float) else None,
            locked=None,
            lock_known=False,
        )

    def _clock_write(self, uuid: str, args: list[str], what: str, mhz) -> ClockState:
        gpu = self._gpu_name(uuid)
        proc = self._run(["-i", uuid, *args], what, check=False)
        if proc.returncode != 0:
            err = self._exit_error(proc, what)
            if type(err) is GpuError:
                unsupported = proc.returncode == _EXIT_NOT_SUPPORTED or (
                    "not supported" in str(err).lower()
                )
                if unsupported or proc.returncode == _EXIT_INVALID_ARGUMENT:
                    raise ClocksRefused(f"{gpu} refused {what}: {err}", requested_mhz=mhz,
                                        not_supported=unsupported)  # fmt: skip
            raise err
        return self.clock_state(uuid)

    def set_locked_clocks_mhz(self, uuid: str, min_mhz: int, max_mhz: int) -> ClockState:
        """``nvidia-smi -i <uuid> -lgc MIN,MAX``."""
        lgc = f"{int(min_mhz)},{int(max_mhz)}"
        return self._clock_write(uuid, ["-lgc", lgc], f"-lgc {lgc}", max_mhz)

    def reset_locked_clocks(self, uuid: str) -> ClockState:
        """``nvidia-smi -i <uuid> -rgc``."""
        return self._clock_write(uuid, ["-rgc"], "-rgc", None)
