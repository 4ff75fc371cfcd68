"""``modbridge doctor``: the seed's four-layer fault isolation as one command.

The seed (``seeds/001``, section 2.3) splits a GPU module into four layers so that a
fault is looked for layer by layer instead of "a tangle": L1 physical (fans, NTCs,
the 12 V input), L2 firmware (the MCU's firmware and its config), L3 driver (the
NVIDIA driver, NVML) and L4 application (the bridge's exporter, event log, state
directory and journal). Every check here is one function that takes the facts it
judges and returns a :class:`Check`: ``pass``, ``warn``, ``fail`` or ``skip`` (not
run, and why), a one-line finding and the next thing to try. The facts are gathered
once (:func:`probe_module`, :func:`probe_gpus`, :func:`probe_app`) so each check can
be tested alone with made-up facts; :func:`run_doctor` gathers and judges them all.

    report = run_doctor(DoctorOptions(ports=["/dev/ttyUSB0"]))
    for c in report.checks: print(c.layer, c.name, c.status, c.detail, c.hint)
    report.exit_code     # 0 pass, 4 warnings only, 1 a fail, 3 nothing found

Nothing here changes a GPU: the power-limit permission is judged from the process's
privileges and the GPU's constraints, never by a write. The only command sent to a
module is the optional ``--active`` fan step (a signed ``fan_mode`` manual at 100 %,
which only raises cooling, then ``fan_mode`` auto again). Files are probed with a
temporary file that is removed at once; the journal is read without setting
unusable entries aside (``modbridge restore`` and the bridge do that).

While the bridge runs it holds the module ports (exclusive open): the module's
readings then come from the bridge's own ``/metrics`` (temperatures, fans, 12 V,
state, faults, event counts), and what only the link can tell (config, flash
writes) is skipped with a word saying so.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from device import floors as _floors
from modbridge.errors import ModbridgeError
from modbridge.link.requests import timeout_scale
from protocol import VERSION_MAJOR, VERSION_MINOR
from protocol import catalog as C

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)
_RANK = {SKIP: 0, PASS: 0, WARN: 1, FAIL: 2}
LAYERS = {"L1": "physical", "L2": "firmware", "L3": "driver", "L4": "application"}

# Exit codes (docs/doctor.md): docs/bridge.md's 0, 1, 2 and 3, and 4 for "only warnings"
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_WARN = 0, 1, 2, 3, 4

# --- L1 thresholds ------------------------------------------------------------------
NTC_MIN_C = -20.0  # a reading outside -20..125 degC is a wiring or calibration fault
NTC_MAX_C = 125.0
AMBIENT_MIN_C = 5.0  # an "ambient" channel outside 5..50 degC is not the room's air
AMBIENT_MAX_C = 50.0
COLD_MARGIN_C = 5.0  # a channel colder than ambient by more than this (the firmware
# raises sensor_implausible at 8 degC for 30 s: device/plausibility.py COLD_MC)
V_NOMINAL = 12.0
V_PASS_FRACTION = 0.03  # 11.64..12.36 V pass; ATX allows +-5 %
V_ATX_FRACTION = 0.05  # 11.4..12.6 V: within ATX's tolerance but at its edge: warn
FAN_MODEL = _floors.fan_model(None)  # the generic 4-wire PWM fan (device/floors.py)
FAN_MIN_SPIN_DUTY = FAN_MODEL[_floors.FM_MIN_SPIN]  # a duty that spins any such fan
FAN_CHECK_DUTY = FAN_MODEL[_floors.FM_RPM_CHECK_DUTY]  # RPM is judged from this duty up
FAN_FLOOR_RPM = _floors.rpm_floor(FAN_MODEL)  # a turning fan reads at least this at 100 %
ACTIVE_DUTY = C.DUTY_MAX  # the --active step: 100 % (a step up: never less cooling)
ACTIVE_STEP_S = 8  # module seconds (its uptime) the step may take to reach its RPM
# wall seconds at most (a module whose uptime does not move), times
# $MODBRIDGE_TIMEOUT_SCALE: a virtual module on a loaded machine runs slower than real time
ACTIVE_TIMEOUT_S = 30.0 * timeout_scale()
STEP_FROM_DUTY = C.DUTY_MAX * 8 // 10  # a fan below 80 % duty before the step must
STEP_RISE = 1.25  # read at least 25 % faster at 100 %
BOOT_SETTLE_S = 5  # module seconds after boot before its fan readings are judged

# --- L2 -------------------------------------------------------------------------------
FLASH_WRITES_WARN = 10_000  # STM32F4 flash sectors are rated 10,000 erase cycles
FLASH_WRITES_FAIL = 100_000
CONFIG_SCHEMA_VERSION = 1  # device/config.py SCHEMA_VERSION

_DUTY_FULL = C.DUTY_MAX


class DoctorError(ModbridgeError):
    """doctor could not run at all: bad options or config (exit 2)."""

    exit_code = EXIT_USAGE


class SimUnavailable(DoctorError):
    """--sim could not start its virtual module (exit 1: a runtime error)."""

    exit_code = EXIT_FAIL


@dataclass
class Check:
    """One finding: which layer and check, on what (a module id, a GPU UUID, a path),
    ``status`` (pass/warn/fail/skip), ``detail`` (one line) and ``hint`` (the next
    thing to try; empty on a pass). ``data`` holds the values behind it, in the units
    a person types (degC, V, %, RPM)."""

    layer: str
    name: str
    status: str
    detail: str
    hint: str = ""
    target: str = ""
    data: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.layer not in LAYERS:
            raise ValueError(f"layer must be one of {', '.join(LAYERS)}, got {self.layer!r}")
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def worst(checks) -> str:
    """The worst status of ``checks`` (a skip counts as a pass); ``pass`` for none."""
    out = PASS
    for c in checks:
        if _RANK[c.status] > _RANK[out]:
            out = c.status
    return out


def exit_code_for(checks, found_anything: bool = True) -> int:
    """0 every check passed (or was skipped), 4 warnings but no fail, 1 a fail,
    3 nothing to diagnose (no module answered and no GPU is visible)."""
    if not found_anything:
        return EXIT_NOT_FOUND
    return {PASS: EXIT_OK, WARN: EXIT_WARN, FAIL: EXIT_FAIL}[worst(checks)]


@dataclass
class Report:
    checks: list
    found_anything: bool = True

    @property
    def worst(self) -> str:
        return worst(self.checks)

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.checks, self.found_anything)

    def counts(self) -> dict:
        out = {s: 0 for s in STATUSES}
        for c in self.checks:
            out[c.status] += 1
        return out

    def as_dict(self) -> dict:
        return {
            "checks": [c.as_dict() for c in self.checks],
            "counts": self.counts(),
            "worst": self.worst,
            "exit_code": self.exit_code,
        }


# =============================================================================== facts


@dataclass
class ModuleView:
    """What doctor knows about one module, from its link (``source`` "link") or the
    running bridge's metrics ("metrics"); ``error`` and ``error_kind`` (``busy``,
    ``permission``, ``not_found``, ``no_hello``, ``incompatible``, ``error``) when it
    could not be read. ``telemetry`` holds wire values (m degC, mV, 1/65535)."""

    port: str
    source: str = "link"
    module_id: str | None = None
    fw_version: str | None = None
    proto_version: str | None = None  # "1.0"
    board: str | None = None
    fans: int = 2
    telemetry: dict = field(default_factory=dict)
    events: list = field(default_factory=list)  # {"reason", "active", "value", "seen"}
    resets: int = 0
    paired: bool | None = None
    key_error: str | None = None
    config_read: bool = False
    config_version: int | None = None
    config_error: str | None = None
    active: dict | None = None  # the --active fan step's facts (fan_step)
    error: str | None = None
    error_kind: str | None = None

    @property
    def answered(self) -> bool:
        return self.error is None and self.module_id is not None

    @property
    def label(self) -> str:
        return self.module_id or self.port

    @property
    def faults(self) -> int:
        return int(self.telemetry.get("faults", 0) or 0)

    def fault(self, name: str) -> bool:
        return bool(self.faults & (1 << C.FAULT_BITS.index(name)))

    def temp_c(self, channel: str) -> float | None:
        v = self.telemetry.get("temp_" + channel)
        return None if v is None else v / 1000.0


@dataclass
class GpuFact:
    uuid: str
    name: str = ""
    pci_bus_id: str = ""
    persistence: bool | None = None  # None: unknown / not applicable
    enforced_limit_w: float | None = None
    default_limit_w: float | None = None
    min_limit_w: float | None = None
    max_limit_w: float | None = None
    error: str | None = None


@dataclass
class GpuFacts:
    """L3: which backend loaded (``backend``: nvml, nvidia-smi, virtual, or None),
    why NVML did not (``nvml_error``), why none did (``error``), the driver version
    and the GPUs."""

    backend: str | None = None
    nvml_error: str | None = None
    error: str | None = None
    driver_version: str | None = None
    gpus: list = field(default_factory=list)
    wanted: list = field(default_factory=list)  # GPUs the config's [[module]] tables name


@dataclass
class Privileges:
    euid: int
    cap_sys_admin: bool

    @property
    def root(self) -> bool:
        return self.euid == 0


@dataclass
class JournalFact:
    """One journal file: ``kind`` limits or clocks, the entry's values or ``problem``."""

    uuid: str
    kind: str = "limits"
    original_w: float | None = None
    original: object = None  # clocks: None (unlocked) or [min, max]
    pid: int = 0
    time: float = 0.0
    problem: str | None = None


@dataclass
class AppFacts:
    """L4: the exporter, the event log, the state directory and its journal."""

    metrics_url: str | None = None  # None: the exporter is disabled in the config
    metrics_ok: bool | None = None  # None: not tried
    metrics_error: str | None = None
    metrics_text: str | None = None
    metrics_refused: bool = False
    metrics_note: str | None = None  # why the exporter is not looked at (--sim)
    event_log: str | None = None
    state_dir: str | None = None
    bridge_pids: list = field(default_factory=list)  # running modbridge pids owning GPUs
    journal: list = field(default_factory=list)  # JournalFact
    journal_error: str | None = None
    control_socket: str | None = None  # the first control socket path that exists
    control_ok: bool | None = None  # a bridge answered its ping (None: not tried)
    control_error: str | None = None
    control_error_kind: str | None = None  # stale, refused, error


# ============================================================================ L1 checks


def _no_reading(layer: str, name: str, view: ModuleView, what: str) -> Check:
    why = "it did not answer: see module_answers" if view.error else "no telemetry from it"
    return Check(layer, name, SKIP, f"{what}: not read ({why})", target=view.label)


def check_ntc(view: ModuleView) -> Check:
    """Each NTC channel present, in range and plausible against the others (none
    colder than ambient by more than COLD_MARGIN_C, ambient in a room's range)."""
    name = "ntc"
    if not view.telemetry:
        return _no_reading("L1", name, view, "NTC channels")
    temps, bad, odd = {}, [], []
    for i, ch in enumerate(C.CHANNELS):
        t = view.temp_c(ch)
        faulted = view.faults & (1 << i)
        if t is None or faulted:
            bad.append(f"{ch} {'faulted' if faulted else 'absent'}")
            continue
        temps[ch] = t
        if not NTC_MIN_C <= t <= NTC_MAX_C:
            bad.append(f"{ch} {t:.1f} degC out of {NTC_MIN_C:g}..{NTC_MAX_C:g}")
    data = {f"{ch}_c": round(t, 2) for ch, t in temps.items()}
    amb = temps.get("amb")
    if amb is not None:
        if not AMBIENT_MIN_C <= amb <= AMBIENT_MAX_C:
            odd.append(f"ambient {amb:.1f} degC is not a room's air "
                       f"({AMBIENT_MIN_C:g}..{AMBIENT_MAX_C:g})")  # fmt: skip
        for ch, t in temps.items():
            if ch != "amb" and t < amb - COLD_MARGIN_C:
                odd.append(f"{ch} {t:.1f} degC is {amb - t:.1f} degC colder than ambient")
    if view.fault("ntc_stuck"):
        odd.append("a channel is frozen while the load swings (ntc_stuck)")
    if view.fault("ntc_implausible"):
        odd.append("a channel disagrees with the others (ntc_implausible)")
    shown = ", ".join(f"{ch} {t:.1f}" for ch, t in temps.items())
    if bad:
        others = f" (others: {shown} degC)" if shown else ""
        return Check("L1", name, FAIL, "; ".join(bad) + others,
                     "check the NTC's connector and wiring: absent or out of range is an open "
                     "or shorted divider (measure the NTC: ~10 kohm at 25 degC); then "
                     "`modbridge calibrate`", target=view.label, data=data)  # fmt: skip
    if odd:
        return Check("L1", name, WARN, "; ".join(odd) + f" ({shown} degC)",
                     "a channel colder than the air around it is swapped, badly placed "
                     "or miscalibrated: check which NTC is on which input (docs/boards.md), "
                     "its thermal contact, then `modbridge calibrate`",
                     target=view.label, data=data)  # fmt: skip
    hot = [f for f in ("critical_temp", "over_temp") if view.fault(f)]
    if hot:
        status = FAIL if "critical_temp" in hot else WARN
        return Check("L1", name, status, f"{', '.join(hot)}: {shown} degC",
                     "the sensors agree and read hot: check airflow, fan direction, the "
                     "heatsink's mounting pressure and the room (seed 3.1)",
                     target=view.label, data=data)  # fmt: skip
    return Check("L1", name, PASS, f"{len(temps)} channels plausible: {shown} degC",
                 target=view.label, data=data)  # fmt: skip


def _pct(duty) -> float:
    return round(duty * 100.0 / _DUTY_FULL, 1)


def _fan_floor_rpm(duty: int, floor_rpm: float = FAN_FLOOR_RPM) -> float:
    return floor_rpm * duty / _DUTY_FULL


# Twin fans (the module's two fans are one model on one heatsink): at the same duty, one
# that turns at less than TWIN_FAIL of the other is stalled, blocked or failing (a
# stalled rotor's tach can still report a trickle), below TWIN_WARN it is worn.
TWIN_DUTY_PCT = 5.0  # duties within this many % are "the same duty"
TWIN_FAIL = 0.5
TWIN_WARN = 0.75


def board_fan_model(board: str | None):
    """The fan model a board's firmware uses (its module's ``FAN_MODEL``, read from the
    source without importing it: board modules import ``machine``), else the generic
    one. ``board`` comes from the module's hello: only a plain name is looked up."""
    import ast
    import re

    names = _floors.FAN_MODELS
    if board and re.fullmatch(r"[a-z0-9_]{1,32}", board):
        src = Path(_floors.__file__).resolve().parents[1] / "boards" / f"{board}.py"
        try:
            tree = ast.parse(src.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            tree = None
        for node in tree.body if tree else ():
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and getattr(node.targets[0], "id", None) == "FAN_MODEL"
                    and isinstance(node.value, ast.Constant)
                    and node.value.value in names):  # fmt: skip
                return node.value.value, names[node.value.value]
    return _floors.FAN_MODEL_DEFAULT, names[_floors.FAN_MODEL_DEFAULT]


def _twins(readings: dict) -> list[tuple[str, str]]:
    """``(fan, verdict)`` for fans that trail their twin at the same duty: verdict
    ``"fail"`` below :data:`TWIN_FAIL` of the faster one, ``"warn"`` below
    :data:`TWIN_WARN`. ``readings``: fan -> (duty %, rpm)."""
    out = []
    fans = sorted(readings)
    for a in fans:
        duty, rpm = readings[a]
        for b in fans:
            tduty, trpm = readings[b]
            if b == a or abs(duty - tduty) > TWIN_DUTY_PCT or trpm <= 0:
                continue
            if rpm < TWIN_FAIL * trpm:
                out.append((a, "fail", b))
            elif rpm < TWIN_WARN * trpm:
                out.append((a, "warn", b))
            break
    return out


def check_fans(view: ModuleView) -> Check:
    """Each fan spins when commanded: RPM against duty from telemetry (stall and tach
    fault bits, 0 RPM above the minimum spin duty, too slow for the duty against the
    board's fan model, and against its twin at the same duty)."""
    name = "fans"
    if not view.telemetry:
        return _no_reading("L1", name, view, "fans")
    model_name, model = board_fan_model(view.board)
    min_spin, check_duty = model[_floors.FM_MIN_SPIN], model[_floors.FM_RPM_CHECK_DUTY]
    floor_rpm = _floors.rpm_floor(model)
    bad, odd, shown, data = [], [], [], {"fan_model": model_name}
    readings, flagged = {}, set()
    for fan in range(1, (view.fans or 2) + 1):
        duty = view.telemetry.get(f"fan{fan}_duty")
        rpm = view.telemetry.get(f"fan{fan}_rpm")
        if duty is None or rpm is None:
            odd.append(f"fan {fan}: no duty/RPM in telemetry")
            continue
        data[f"fan{fan}_duty_pct"], data[f"fan{fan}_rpm"] = _pct(duty), rpm
        shown.append(f"fan {fan} {rpm} RPM at {_pct(duty):g} %")
        if duty >= min_spin:
            readings[fan] = (_pct(duty), rpm)
        if view.fault(f"fan{fan}_stall"):
            bad.append(f"fan {fan} stalled ({rpm} RPM at {_pct(duty):g} %)")
            flagged.add(fan)
        elif rpm == 0 and duty >= min_spin:
            bad.append(f"fan {fan} reads 0 RPM at {_pct(duty):g} %")
            flagged.add(fan)
        elif view.fault(f"fan{fan}_tach"):
            odd.append(f"fan {fan}'s tach does not fit its duty ({rpm} RPM at {_pct(duty):g} %)")
        elif duty >= check_duty and rpm < _fan_floor_rpm(duty, floor_rpm):
            least = _fan_floor_rpm(duty, floor_rpm)
            odd.append(f"fan {fan} slow: {rpm} RPM at {_pct(duty):g} % (a turning "
                       f"{model_name} fan reads >= {least:.0f})")  # fmt: skip
    for fan, verdict, twin in _twins(readings):
        if fan in flagged:  # already failed on its own
            continue
        (d, rpm), (_, trpm) = readings[fan], readings[twin]
        said = (f"fan {fan} turns at {rpm} RPM where fan {twin} turns at {trpm} RPM at the "
                f"same duty ({d:g} %)")  # fmt: skip
        if verdict == "fail":  # stronger than a slow reading: it replaces that warning
            odd[:] = [o for o in odd if not o.startswith(f"fan {fan} ")]
            bad.append(said)
        elif not any(o.startswith(f"fan {fan} ") for o in odd):
            odd.append(said)
    if bad:
        return Check("L1", name, FAIL, "; ".join(bad),
                     "check the fan's 4-pin connector, that nothing blocks the blades, and "
                     "the tach wire (pin 3) to the board's tach input; a fan that spins with "
                     "0 RPM has a broken tach line", target=view.label, data=data)  # fmt: skip
    if odd:
        return Check("L1", name, WARN, "; ".join(odd),
                     "a tach that reads slow: worn bearing, a fan of another model (set "
                     "the board's fan_model), or a missing tach pull-up; run "
                     "`modbridge doctor --active` to step the fans", target=view.label,
                     data=data)  # fmt: skip
    return Check("L1", name, PASS, "; ".join(shown) or "no fans", target=view.label, data=data)


def check_fans_active(view: ModuleView) -> Check:
    """The --active step (:func:`fan_step`): at 100 % every fan must reach the RPM a
    turning fan reads at full duty, and the module must be back in auto after."""
    name = "fans_active"
    step = view.active
    if step is None:
        return Check("L1", name, SKIP, "not run (add --active to step the fans to 100 % "
                     "and back to auto)", target=view.label)  # fmt: skip
    if step.get("error") and not step.get("after"):
        return Check("L1", name, FAIL if step.get("commanded") else WARN,
                     f"fan step not done: {step['error']}",
                     "pair the module (`modbridge pair PORT`) so doctor can sign fan_mode"
                     if "pair" in step["error"] else "see the error; the link check (L2) "
                     "says more", target=view.label)  # fmt: skip
    before, after = step.get("before", {}), step.get("after", {})
    data = {"before_rpm": before, "after_rpm": after, "restored": step.get("restored")}
    bad = []
    for fan, rpm in sorted(after.items()):
        was, duty = before.get(fan), step.get("before_duty", {}).get(fan)
        duty_word = f" at {duty:g} %" if duty is not None else ""
        if rpm < FAN_FLOOR_RPM:
            bad.append(f"fan {fan} {rpm} RPM at 100 % (was {was}{duty_word}; a turning fan "
                       f"reads >= {FAN_FLOOR_RPM})")  # fmt: skip
        elif not _step_ok(rpm, was, None if duty is None else duty * _DUTY_FULL / 100):
            bad.append(f"fan {fan} did not speed up: {was} RPM{duty_word} -> {rpm} RPM at 100 %")
    if not step.get("restored"):
        return Check("L1", name, FAIL, "the fans were stepped but auto mode could not be "
                     f"restored: {step.get('restore_error')}",
                     "the module stays in MANUAL (100 %, safe) until its 10-minute lease ends "
                     "or `modbridge set <module> mode auto`", target=view.label,
                     data=data)  # fmt: skip
    if bad:
        return Check("L1", name, FAIL, "; ".join(bad),
                     "a fan at 0 RPM at 100 % is stalled or its tach line is broken (the "
                     "connector, the blades, pin 3); one that does not speed up ignores its "
                     "PWM (pin 4, or a 3-pin fan)", target=view.label,
                     data=data)  # fmt: skip
    shown = ", ".join(f"fan {f} {before.get(f, '?')} -> {r} RPM" for f, r in sorted(after.items()))
    back = step.get("restore_mode", "auto")
    return Check("L1", name, PASS, f"100 % step: {shown}; back in {back}", target=view.label,
                 data=data)  # fmt: skip


def check_input_voltage(view: ModuleView, under_voltage_v: float = 11.4) -> Check:
    """The 12 V input (INA226 bus voltage) within tolerance: pass within +-3 %, warn
    within ATX's +-5 %, fail outside it or under the policy's ``under_voltage_v``."""
    name = "input_12v"
    if not view.telemetry:
        return _no_reading("L1", name, view, "12 V input")
    mv = view.telemetry.get("v_in")
    if mv is None or view.fault("power_monitor"):
        return Check("L1", name, FAIL, "no 12 V reading: the INA226 power monitor is "
                     "absent or not answering (power_monitor fault)",
                     "check the INA226's I2C wiring (SDA/SCL, 3.3 V, address 0x40) and that "
                     "its VBUS pin sees the 12 V rail (docs/boards.md)",
                     target=view.label)  # fmt: skip
    v = mv / 1000.0
    data = {"v_in_v": round(v, 3)}
    if view.telemetry.get("i_in") is not None:
        data["i_in_a"] = view.telemetry["i_in"] / 1000.0
    dev = (v - V_NOMINAL) / V_NOMINAL
    low_fail = max(V_NOMINAL * (1 - V_ATX_FRACTION), under_voltage_v)
    if v < low_fail or v > V_NOMINAL * (1 + V_ATX_FRACTION) or view.fault("under_voltage"):
        return Check("L1", name, FAIL, f"12 V input at {v:.2f} V ({dev:+.1%}), outside "
                     f"{low_fail:.2f}..{V_NOMINAL * (1 + V_ATX_FRACTION):.2f} V",
                     "measure the rail at the module's input under load: a sagging PSU, a "
                     "thin or long cable, a loose PCIe 6+2 connector (seed 3.1), or the "
                     "INA226's shunt value in the config", target=view.label,
                     data=data)  # fmt: skip
    if abs(dev) > V_PASS_FRACTION:
        return Check("L1", name, WARN, f"12 V input at {v:.2f} V ({dev:+.1%}): inside "
                     "ATX's +-5 % but near its edge",
                     "watch it under full GPU load (`modbridge monitor`); check the PSU's "
                     "12 V rail and the connectors", target=view.label, data=data)  # fmt: skip
    return Check("L1", name, PASS, f"12 V input at {v:.2f} V ({dev:+.1%})", target=view.label,
                 data=data)  # fmt: skip


# ============================================================================ L2 checks


_LINK_HINTS = {
    "busy": "another program holds the port: a running bridge (`systemctl status "
    "modbridge`; doctor then reads its metrics), mpremote, or a terminal",
    "permission": "add this user to the port's group (`modbridge` with the udev rule in "
    "packaging/udev, else `dialout`), log in again; or run doctor with sudo",
    "not_found": "plug the module in, check `ls /dev/modbridge/`, or give --port PATH",
    "not_serial": "that path is no serial port: give the module's tty (`modbridge list` "
    "shows them; /dev/modbridge/* with the udev rule in packaging/udev)",
    "no_hello": "the port opens but nothing speaks the protocol: is the firmware flashed "
    "(`modbridge flash`), is the module powered, is it the right port (`modbridge list`)?",
    "incompatible": "the module speaks another protocol major version: reflash it with "
    "this modbridge's firmware (`modbridge flash`)",
    "none": "plug a module in (CH340 adapters are found by USB id 1a86:7523), give "
    "--port PATH, or try --sim",
}


def check_module_answers(view: ModuleView) -> Check:
    """The module answers on its port with a hello (or the bridge's metrics show it)."""
    name = "module_answers"
    if view.answered:
        via = " (read from the running bridge's metrics)" if view.source == "metrics" else ""
        return Check("L2", name, PASS, f"module {view.module_id} on {view.port}, board "
                     f"{view.board}{via}", target=view.label)  # fmt: skip
    kind = view.error_kind or "error"
    status = WARN if kind == "busy" else FAIL
    return Check("L2", name, status, view.error or "no answer",
                 _LINK_HINTS.get(kind, "see the message; `modbridge list -v`"),
                 target=view.label)  # fmt: skip


def _bundled_fw_version() -> str | None:
    try:
        from device import FW_VERSION

        return FW_VERSION
    except ImportError:  # pragma: no cover - an install without the firmware sources
        return None


def check_versions(view: ModuleView, bundled_fw: str | None = None) -> Check:
    """Firmware and protocol versions against what this host speaks and ships."""
    name = "versions"
    if not view.answered:
        return _no_reading("L2", name, view, "versions")
    bundled = bundled_fw if bundled_fw is not None else _bundled_fw_version()
    data = {"fw_version": view.fw_version, "protocol": view.proto_version,
            "host_protocol": f"{VERSION_MAJOR}.{VERSION_MINOR}", "bundled_fw": bundled}  # fmt: skip
    try:
        major, minor = (int(x) for x in (view.proto_version or "").split(".", 1))
    except ValueError:
        return Check("L2", name, WARN, f"protocol version unknown ({view.proto_version!r})",
                     "read `modbridge list --json`", target=view.label, data=data)  # fmt: skip
    host = f"{VERSION_MAJOR}.{VERSION_MINOR}"
    text = f"firmware {view.fw_version}, protocol {major}.{minor} (host {host})"
    if major != VERSION_MAJOR:
        return Check("L2", name, FAIL, text + ": another major version",
                     _LINK_HINTS["incompatible"], target=view.label, data=data)  # fmt: skip
    if minor < VERSION_MINOR:
        return Check("L2", name, WARN, text + ": older firmware, newer fields are missing",
                     "reflash with `modbridge flash` to get this host's firmware",
                     target=view.label, data=data)  # fmt: skip
    if bundled and view.fw_version and view.fw_version != bundled:
        return Check("L2", name, WARN, text + f"; this modbridge ships firmware {bundled}",
                     "reflash with `modbridge flash --board <board> --port PORT` (or update "
                     "modbridge if the module's is newer)", target=view.label,
                     data=data)  # fmt: skip
    return Check("L2", name, PASS, text, target=view.label, data=data)


def _events(view: ModuleView, reason: str) -> list:
    return [e for e in view.events if e.get("reason") == reason and e.get("active", True)]


def check_reset_cause(view: ModuleView) -> Check:
    """The last reset's cause as far as it is known: a ``watchdog_reset`` event (sent
    at boot; doctor sees it when it is there at boot, the bridge's event log and
    metrics keep it), and resets seen while connected."""
    name = "reset_cause"
    if not view.answered:
        return _no_reading("L2", name, view, "reset cause")
    wd = _events(view, "watchdog_reset")
    uptime = view.telemetry.get("uptime_s")
    data = {"watchdog_resets": len(wd), "resets_seen": view.resets, "uptime_s": uptime}
    up = f", up {uptime} s" if uptime is not None else ""
    if wd:
        where = sorted({e.get("seen", "link") for e in wd})
        return Check("L2", name, WARN, f"{len(wd)} watchdog reset(s) ({', '.join(where)}){up}: "
                     "the control loop stopped feeding the watchdog",
                     "look at the event log around it (`grep watchdog_reset` in the event "
                     "log), check the 3.3 V supply for brown-outs, update the firmware; "
                     "the module cooled on its own meanwhile", target=view.label,
                     data=data)  # fmt: skip
    if view.resets:
        return Check("L2", name, WARN, f"{view.resets} module reset(s) while connected{up}",
                     "a reset without a watchdog event: power (brown-out, USB hub), the "
                     "reset button, or a `reboot` command; check the cable and supply",
                     target=view.label, data=data)  # fmt: skip
    return Check("L2", name, PASS, f"no watchdog reset seen{up}", target=view.label, data=data)


def check_config(view: ModuleView) -> Check:
    """The module's config is readable (``config_get``) at this schema version, and no
    ``config_corrupt`` / ``config_fallback`` event says it booted on another copy."""
    name = "config"
    if not view.answered:
        return _no_reading("L2", name, view, "config")
    corrupt = _events(view, "config_corrupt")
    fallback = _events(view, "config_fallback")
    if corrupt:
        return Check("L2", name, FAIL, "config_corrupt: the stored config was unreadable; "
                     "the module runs on factory defaults (or its last good copy)",
                     "check `modbridge config get`, set what you need and `modbridge config "
                     "save`; repeated corruption points at flash wear (see flash_writes)",
                     target=view.label)  # fmt: skip
    if fallback:
        which = "last good copy" if fallback[-1].get("value") == 1 else "factory defaults"
        return Check("L2", name, WARN, f"config_fallback: the saved config did not configure; "
                     f"the module runs on its {which}",
                     "read the config (`modbridge config get`), fix the value it refused "
                     "and save again", target=view.label)  # fmt: skip
    if view.source == "metrics":
        return Check("L2", name, SKIP, "no config_corrupt/config_fallback counted by the "
                     "bridge; the config itself is read only over the port, which the "
                     "bridge holds", target=view.label)  # fmt: skip
    if not view.config_read:
        return Check("L2", name, FAIL, f"config_get not answered: {view.config_error}",
                     "the firmware may be busy or too old: `modbridge config get`, reflash",
                     target=view.label)  # fmt: skip
    if view.config_version != CONFIG_SCHEMA_VERSION:
        return Check("L2", name, WARN, f"config schema version {view.config_version}, this "
                     f"host knows {CONFIG_SCHEMA_VERSION}",
                     "reflash so firmware and host agree (`modbridge flash`)",
                     target=view.label)  # fmt: skip
    return Check("L2", name, PASS, f"config readable (schema {view.config_version}), no "
                 "corruption or fallback reported", target=view.label)  # fmt: skip


def check_flash_writes(view: ModuleView) -> Check:
    """Config writes to the module's flash over its life (wear)."""
    name = "flash_writes"
    if not view.answered:
        return _no_reading("L2", name, view, "flash writes")
    n = view.telemetry.get("flash_writes")
    if n is None:
        why = "the bridge's metrics do not carry it" if view.source == "metrics" else \
            "the firmware does not report it"  # fmt: skip
        return Check("L2", name, SKIP, f"flash write count unknown ({why})", target=view.label)
    data = {"flash_writes": n}
    hint = ("something saves the config often (a script calling `config save` in a loop?): "
            "save only on change; past ~10,000 erase cycles a sector may fail")  # fmt: skip
    if n >= FLASH_WRITES_FAIL:
        return Check("L2", name, FAIL, f"{n} config writes to flash: far past the rated wear",
                     hint + "; plan to replace the board", target=view.label, data=data)
    if n >= FLASH_WRITES_WARN:
        return Check("L2", name, WARN, f"{n} config writes to flash (rated ~10,000 erase "
                     "cycles per sector)", hint, target=view.label, data=data)  # fmt: skip
    return Check("L2", name, PASS, f"{n} config writes to flash", target=view.label, data=data)


def check_pairing(view: ModuleView) -> Check:
    """The host has this module's signing key: without it no heartbeats reach it (it
    stays STANDALONE) and no command is accepted (docs/pairing.md)."""
    name = "pairing"
    if not view.answered:
        return _no_reading("L2", name, view, "pairing")
    if view.source == "metrics":
        return Check("L2", name, SKIP, "read by the running bridge: its status shows "
                     "last_error when a key is missing", target=view.label)  # fmt: skip
    if view.key_error:
        return Check("L2", name, WARN, view.key_error,
                     f"run `modbridge pair {view.port}` (power-cycle the module first if it "
                     "has no key: the pairing window is its first 60 s)",
                     target=view.label)  # fmt: skip
    if view.paired is None:
        return Check("L2", name, PASS, "the module does not verify signatures (firmware "
                     "before signing)", target=view.label)  # fmt: skip
    return Check("L2", name, PASS, "paired: this host signs its heartbeats and commands",
                 target=view.label)  # fmt: skip


# ============================================================================ L3 checks


def check_nvml(gpu: GpuFacts) -> Check:
    """NVML loads (nvidia-ml-py finds libnvidia-ml and the driver answers)."""
    name = "nvml"
    if gpu.backend in ("nvml", "virtual"):
        what = "virtual GPUs (--sim)" if gpu.backend == "virtual" else "NVML loaded"
        return Check("L3", name, PASS, what)
    if gpu.backend == "nvidia-smi":
        return Check("L3", name, WARN, f"NVML did not load ({gpu.nvml_error}); nvidia-smi "
                     "works and the bridge will use it (~2000x slower per read)",
                     "install nvidia-ml-py in modbridge's venv and check that "
                     "libnvidia-ml.so.1 is on the loader path (`ldconfig -p | grep nvidia-ml`)")
    return Check("L3", name, FAIL, gpu.error or gpu.nvml_error or "no GPU backend",
                 "install or load the NVIDIA driver (`nvidia-smi` must work; `dmesg | grep "
                 "NVRM`), or try --sim")  # fmt: skip


def check_driver_version(gpu: GpuFacts) -> Check:
    name = "driver_version"
    if gpu.backend is None:
        return Check("L3", name, SKIP, "no GPU backend: driver version unknown")
    if gpu.backend == "virtual":
        return Check("L3", name, PASS, "virtual GPUs: no driver")
    if not gpu.driver_version:
        return Check("L3", name, WARN, "the driver did not report its version",
                     "run `nvidia-smi` and compare with `cat /proc/driver/nvidia/version`: a "
                     "mismatch means a half-finished driver update (reboot)")  # fmt: skip
    return Check("L3", name, PASS, f"NVIDIA driver {gpu.driver_version}",
                 data={"driver_version": gpu.driver_version})


def check_gpus_visible(gpu: GpuFacts) -> Check:
    """At least one GPU is visible, and every GPU the config maps a module to is."""
    name = "gpus_visible"
    if gpu.backend is None:
        return Check("L3", name, SKIP, "no GPU backend")
    if not gpu.gpus:
        return Check("L3", name, FAIL, "the driver sees no GPU",
                     "check `lspci | grep -i nvidia`, the PCIe seating and power (seed 5.2), "
                     "and `dmesg | grep -i xid`")  # fmt: skip
    names = "; ".join(f"{g.uuid} ({g.name})" for g in gpu.gpus)
    from modbridge.config import match_gpu

    missing = [w for w in gpu.wanted
               if not any(match_gpu(w, g.uuid, g.pci_bus_id) for g in gpu.gpus)]  # fmt: skip
    if missing:
        return Check("L3", name, FAIL, f"configured GPU(s) not visible: {', '.join(missing)} "
                     f"(visible: {names})",
                     "a GPU fell off the bus (`dmesg | grep -i xid`) or the config names "
                     "the wrong UUID/bus id (`modbridge list`)", data={"gpus": len(gpu.gpus)})
    return Check("L3", name, PASS, f"{len(gpu.gpus)} GPU(s): {names}",
                 data={"gpus": len(gpu.gpus)})


def check_persistence(gpu: GpuFacts) -> Check:
    """Persistence mode on: without it the driver unloads between clients and forgets
    a power limit the bridge set."""
    name = "persistence_mode"
    if gpu.backend is None or not gpu.gpus:
        return Check("L3", name, SKIP, "no GPU to ask")
    if gpu.backend == "virtual":
        return Check("L3", name, PASS, "virtual GPUs: not applicable")
    off = [g.uuid for g in gpu.gpus if g.persistence is False]
    unknown = [g.uuid for g in gpu.gpus if g.persistence is None]
    if off:
        return Check("L3", name, WARN, f"persistence mode off on {', '.join(off)}",
                     "enable it: `sudo systemctl enable --now nvidia-persistenced` (or "
                     "`sudo nvidia-smi -pm 1`)")  # fmt: skip
    if unknown and len(unknown) == len(gpu.gpus):
        return Check("L3", name, SKIP, "the driver does not report persistence mode")
    return Check("L3", name, PASS, "persistence mode on")


def read_privileges(status_path="/proc/self/status") -> Privileges:
    """This process's effective uid and whether CAP_SYS_ADMIN is in its effective set."""
    cap = False
    try:
        with open(status_path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    cap = bool(int(line.split()[1], 16) & (1 << 21))  # CAP_SYS_ADMIN
    except (OSError, ValueError, IndexError):
        pass
    return Privileges(euid=os.geteuid(), cap_sys_admin=cap)


def check_power_limit_permission(gpu: GpuFacts, privs: Privileges) -> Check:
    """Whether power-limit writes would be allowed, judged without writing one: root
    or CAP_SYS_ADMIN (NVML's rule), and a GPU whose limit has a settable range."""
    name = "power_limit_permission"
    if gpu.backend is None or not gpu.gpus:
        return Check("L3", name, SKIP, "no GPU to judge")
    if gpu.backend == "virtual":
        return Check("L3", name, PASS, "virtual GPUs accept limit writes")
    fixed = [g.uuid for g in gpu.gpus
             if g.min_limit_w is None or g.max_limit_w is None or g.min_limit_w >= g.max_limit_w]
    data = {"euid": privs.euid, "cap_sys_admin": privs.cap_sys_admin}
    if not (privs.root or privs.cap_sys_admin):
        return Check("L3", name, WARN, f"this process (uid {privs.euid}) has neither root nor "
                     "CAP_SYS_ADMIN: power-limit writes would be refused (the bridge counts "
                     "them and keeps cooling); not verified by a write",
                     "run the bridge as the systemd service (root: packaging/systemd), or "
                     "run doctor with sudo to check the service's view", data=data)
    if fixed:
        return Check("L3", name, WARN, f"no settable power-limit range on {', '.join(fixed)} "
                     "(a consumer card?)",
                     "use `actuator = \"clocks\"` (or the default fallback) for that GPU: "
                     "docs/bridge.md, Locked clocks", data=data)  # fmt: skip
    who = "root" if privs.root else "CAP_SYS_ADMIN"
    ranges = "; ".join(f"{g.min_limit_w:g}..{g.max_limit_w:g} W" for g in gpu.gpus)
    return Check("L3", name, PASS, f"{who}: power-limit writes allowed by NVML's rule "
                 f"({ranges}); judged, not written", data=data)  # fmt: skip


# ============================================================================ L4 checks


def check_exporter(app: AppFacts) -> Check:
    """The running bridge's /metrics answers with modbridge's metrics."""
    name = "exporter"
    if app.metrics_url is None:
        return Check("L4", name, SKIP, app.metrics_note or "the exporter is disabled in "
                     "the config ([exporter] enabled = false)")  # fmt: skip
    if app.metrics_ok:
        return Check("L4", name, PASS, f"{app.metrics_url} answers with modbridge metrics",
                     target=app.metrics_url)  # fmt: skip
    running = bool(app.bridge_pids)
    if app.metrics_refused and not running:
        return Check("L4", name, SKIP, f"no bridge running: nothing listens on {app.metrics_url}",
                     "start the service (`systemctl start modbridge`) and run doctor again",
                     target=app.metrics_url)  # fmt: skip
    if app.metrics_ok is False and app.metrics_text is not None:
        return Check("L4", name, FAIL, f"{app.metrics_url} answers, but not with modbridge's "
                     "metrics: another exporter on that port?",
                     "pick another `[exporter] port` (9659 is modbridge's default)",
                     target=app.metrics_url)  # fmt: skip
    extra = f" while a bridge runs (pid {', '.join(map(str, app.bridge_pids))})" if running else ""
    return Check("L4", name, FAIL if running else WARN,
                 f"{app.metrics_url}: {app.metrics_error}{extra}",
                 "check `journalctl -u modbridge` for 'metrics on ...' or the error binding "
                 "the port; `[exporter] address`/`port` must match Prometheus' scrape config",
                 target=app.metrics_url)  # fmt: skip


def check_control_socket(app: AppFacts) -> Check:
    """The running bridge's control socket (``modbridge set/config/...`` go through
    it while the bridge holds the ports) answers a ping."""
    name = "control_socket"
    running = bool(app.bridge_pids)
    where = app.control_socket or ""
    if app.control_socket is None:
        if running:
            return Check("L4", name, WARN, "a bridge runs but no control socket exists: "
                         "`modbridge set/config/selftest` cannot reach its modules",
                         "look for the control socket's error in `journalctl -u modbridge`; "
                         "[bridge] control_socket, RuntimeDirectory=modbridge in the unit")
        return Check("L4", name, SKIP, "no bridge running, no control socket")
    if app.control_ok:
        return Check("L4", name, PASS, f"{where} answers", target=where)
    kind = app.control_error_kind
    if kind == "stale" and not running:
        return Check("L4", name, SKIP, f"{where}: left by a bridge that is not running "
                     "(harmless: the next start replaces it)", target=where)  # fmt: skip
    if kind == "refused":
        return Check("L4", name, WARN, app.control_error or "permission denied",
                     "add yourself to the socket's group ([bridge] control_group, e.g. "
                     "`modbridge`) and log in again, or use sudo", target=where)  # fmt: skip
    return Check("L4", name, FAIL if running else WARN, app.control_error or "no answer",
                 "`systemctl status modbridge`; a bridge that does not answer its socket "
                 "is stuck: its log says why", target=where)  # fmt: skip


def probe_control(app: AppFacts, cfg, client=None, state_dir=None) -> None:
    """Fill ``app``'s control-socket facts: ping the first socket a client would use
    (``state_dir``: the one ``--state-dir`` names first)."""
    from modbridge.ops import ctlsock

    paths = ctlsock.client_paths(cfg, state_dir=state_dir)
    if not paths:
        return
    app.control_socket = paths[0]
    try:
        app.control_ok = (client or ctlsock.Client)(paths[0], timeout_s=2.0).ping()
        if not app.control_ok:
            app.control_error, app.control_error_kind = "the bridge did not say ok", "error"
    except ctlsock.StaleSocket as e:
        app.control_ok, app.control_error, app.control_error_kind = False, str(e), "stale"
    except ctlsock.SocketRefused as e:
        app.control_ok, app.control_error, app.control_error_kind = False, str(e), "refused"
    except (ctlsock.SocketError, OSError) as e:
        app.control_ok, app.control_error, app.control_error_kind = False, str(e), "error"


def probe_writable_dir(path: Path) -> str | None:
    """None if a file can be created in ``path`` (a temporary one, removed at once),
    else why not."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".modbridge-doctor-", dir=path)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return None


def check_event_log(app: AppFacts) -> Check:
    """The event log's file can be appended to (a regular file, not a symbolic link)
    or created in its directory."""
    name = "event_log"
    if not app.event_log:
        return Check("L4", name, SKIP, "no event log configured ([bridge] event_log)",
                     "optional, but decisions and limit writes are worth keeping: "
                     "event_log = \"/var/log/modbridge/events.jsonl\"")  # fmt: skip
    p = Path(app.event_log)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return Check("L4", name, FAIL, f"{p}: {e.strerror}", target=str(p))
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            return Check("L4", name, FAIL, f"{p} is a symbolic link: the bridge refuses it "
                         "(O_NOFOLLOW)", "point event_log at the real file", target=str(p))
        if stat.S_ISDIR(st.st_mode):
            return Check("L4", name, FAIL, f"{p} is a directory", "give a file path",
                         target=str(p))  # fmt: skip
        if not os.access(p, os.W_OK):
            return Check("L4", name, _denied_status(), f"{p}: not writable by uid {os.geteuid()}",
                         _ROOT_HINT, target=str(p))  # fmt: skip
        return Check("L4", name, PASS, f"{p} writable ({st.st_size} bytes; it rotates at "
                     "10 MiB, 5 kept)", target=str(p))  # fmt: skip
    parent = p.parent
    if not parent.is_dir():
        return Check("L4", name, WARN, f"{parent} does not exist: the bridge cannot create "
                     f"{p.name}", "create it (`LogsDirectory=modbridge` in the unit does)",
                     target=str(p))  # fmt: skip
    why = probe_writable_dir(parent)
    if why:
        return Check("L4", name, _denied_status(), f"cannot create files in {parent}: {why}",
                     _ROOT_HINT, target=str(p))  # fmt: skip
    return Check("L4", name, PASS, f"{p} can be created in {parent}", target=str(p))


_ROOT_HINT = ("the service runs as root: run doctor as root (`sudo modbridge doctor`) to "
              "see what it sees, or fix the owner/mode")  # fmt: skip


def _denied_status() -> str:
    # a denial that only says this user is not the service's is a warning
    return FAIL if os.geteuid() == 0 else WARN


def check_state_dir(app: AppFacts) -> Check:
    """The state directory (journal, GPU locks, keys) exists or can be made, is
    writable, and is not open to other users."""
    name = "state_dir"
    if not app.state_dir:
        return Check("L4", name, SKIP, "no state directory")
    p = Path(app.state_dir)
    if not p.exists():
        parent = p.parent
        if parent.is_dir() and probe_writable_dir(parent) is None:
            return Check("L4", name, PASS, f"{p} does not exist yet; it can be created",
                         target=str(p))  # fmt: skip
        return Check("L4", name, WARN, f"{p} does not exist and {parent} is not writable "
                     "by this user", "the unit's StateDirectory=modbridge creates it; or "
                     "`sudo install -d -m 0700 " + str(p) + "`", target=str(p))  # fmt: skip
    if not p.is_dir():
        return Check("L4", name, FAIL, f"{p} is not a directory", "move it aside; the "
                     "bridge needs a directory (StateDirectory=modbridge)", target=str(p))
    why = probe_writable_dir(p)
    if why:
        return Check("L4", name, _denied_status(), f"cannot create files in {p}: {why}",
                     _ROOT_HINT, target=str(p))  # fmt: skip
    mode = stat.S_IMODE(os.stat(p).st_mode)
    if mode & 0o077:
        return Check("L4", name, WARN, f"{p} is mode {mode:04o}: other users can look in "
                     "(the signing keys live here)", f"`chmod 0700 {p}`", target=str(p),
                     data={"mode": f"{mode:04o}"})  # fmt: skip
    return Check("L4", name, PASS, f"{p} writable, mode {mode:04o}", target=str(p),
                 data={"mode": f"{mode:04o}"})  # fmt: skip


def check_journal(app: AppFacts, gpu: GpuFacts) -> Check:
    """The journal of original limits is readable and consistent: no unusable entry,
    no entry for a GPU that is gone, none left by a run that is not running any more
    (a crash: the GPU may sit below its original; ``modbridge restore``)."""
    name = "journal"
    if not app.state_dir:
        return Check("L4", name, SKIP, "no state directory")
    if app.journal_error:
        return Check("L4", name, _denied_status() if "ermission" in app.journal_error else FAIL,
                     f"cannot read the journal: {app.journal_error}", _ROOT_HINT,
                     target=app.state_dir)  # fmt: skip
    if not app.journal:
        return Check("L4", name, PASS, "empty: no GPU is held below its original",
                     target=app.state_dir)  # fmt: skip
    present = {g.uuid: g for g in gpu.gpus}
    bad, orphan, crashed, held = [], [], [], []
    for e in app.journal:
        what = f"{e.kind}/{e.uuid}"
        if e.problem:
            bad.append(f"{what}: {e.problem}")
        elif gpu.backend is not None and e.uuid not in present:
            orphan.append(what)
        elif e.pid and e.pid in app.bridge_pids:
            held.append(what)
        else:
            below = ""
            g = present.get(e.uuid)
            if (e.kind == "limits" and g is not None and g.enforced_limit_w is not None
                    and e.original_w is not None and g.enforced_limit_w < e.original_w - 1):
                below = f" (at {g.enforced_limit_w:g} W, original {e.original_w:g} W)"
            crashed.append(what + below)
    data = {"entries": len(app.journal), "held_by_running_bridge": len(held)}
    if bad:
        return Check("L4", name, FAIL, "unusable entries: " + "; ".join(bad),
                     "`modbridge restore` sets them aside (.bad) and restores what it can; "
                     "check the GPU's limit with `nvidia-smi -q -d POWER`",
                     target=app.state_dir, data=data)  # fmt: skip
    if crashed:
        status = FAIL if any("(at " in c for c in crashed) else WARN
        return Check("L4", name, status, "left by a run that is not running any more: "
                     + "; ".join(crashed),
                     "run `sudo modbridge restore` (or start the service: it restores at "
                     "start)", target=app.state_dir, data=data)  # fmt: skip
    if orphan:
        return Check("L4", name, WARN, "entries for GPUs that are not present: "
                     + "; ".join(orphan),
                     "kept for when the GPU is back; if it is gone for good, remove the "
                     "file under " + app.state_dir, target=app.state_dir, data=data)
    return Check("L4", name, PASS, f"{len(held)} entr{'y' if len(held) == 1 else 'ies'} "
                 "held by the running bridge", target=app.state_dir, data=data)  # fmt: skip


# =========================================================================== gathering


def _step_ok(rpm: int, before_rpm, before_duty) -> bool:
    """A fan stepped to 100 %: it reads what a turning fan reads at full duty and, if
    it ran well below full duty before, clearly faster than then."""
    if rpm < FAN_FLOOR_RPM:
        return False
    if before_duty is not None and before_duty < STEP_FROM_DUTY and before_rpm:
        return rpm >= before_rpm * STEP_RISE
    return True


def fan_step(link, timeout_s: float = ACTIVE_TIMEOUT_S, poll_s: float = 0.05,
             clock=time.monotonic, sleep=time.sleep,
             step_s: int = ACTIVE_STEP_S) -> dict:  # fmt: skip
    """The --active check's facts: both fans to 100 % (signed ``fan_mode`` manual),
    wait until telemetry shows the duty applied and each fan up to speed
    (:func:`_step_ok`), ``step_s`` of the module's uptime, or ``timeout_s`` of ours;
    then ``fan_mode`` auto again, always (or the manual duties it had, for a module
    that was in MANUAL).
    Returns ``before``/``after`` RPM and ``before_duty`` (%) by fan, ``restored``,
    ``commanded`` and the errors met."""
    from modbridge.link.session import LinkError

    tel = dict(link.status.telemetry or {})
    fans = range(1, (link.status.fans or 2) + 1)
    before = {f: tel.get(f"fan{f}_rpm") for f in fans}
    before_duty = {f: tel.get(f"fan{f}_duty") for f in fans}
    out = {"before": before, "before_duty": {f: None if d is None else _pct(d)
                                             for f, d in before_duty.items()},
           "after": {}, "commanded": False, "restored": False, "error": None,
           "restore_error": None}  # fmt: skip
    manual = C.FAN_MODES.index("manual")
    fields = {"mode": manual, "duty1": ACTIVE_DUTY, "duty2": ACTIVE_DUTY}
    # afterwards: auto, or the manual duties a person had set (MANUAL before)
    restore = {"mode": C.FAN_MODES.index("auto")}
    if tel.get("state") == C.STATE_MANUAL and all(d is not None for d in before_duty.values()):
        restore = {"mode": manual, **{f"duty{f}": d for f, d in before_duty.items() if f <= 2}}
    out["restore_mode"] = C.FAN_MODES[restore["mode"]]
    try:
        link.request("fan_mode", fields)
        out["commanded"] = True
        deadline = clock() + timeout_s
        start_up = tel.get("uptime_s")
        while True:
            tel = dict(link.status.telemetry or {})
            rpms = {f: tel.get(f"fan{f}_rpm") or 0 for f in fans}
            applied = all((tel.get(f"fan{f}_duty") or 0) >= ACTIVE_DUTY * 95 // 100 for f in fans)
            done = applied and all(_step_ok(rpms[f], before[f], before_duty[f]) for f in fans)
            # the module's own clock (a virtual module's runs faster or slower than ours)
            waited = start_up is not None and tel.get("uptime_s", start_up) - start_up >= step_s
            if done or waited or clock() >= deadline:
                out["after"] = rpms
                break
            sleep(poll_s)
    except LinkError as e:
        out["error"] = str(e)
    finally:
        if out["commanded"]:
            try:
                link.request("fan_mode", restore)
                out["restored"] = True
            except LinkError as e:
                out["restore_error"] = str(e)
        else:
            out["restored"] = True  # nothing was changed
    return out


def _settled(tel: dict) -> bool:
    if not tel:
        return False
    if "uptime_s" in tel:  # a fresh boot has no tach window yet, whatever the state
        return tel["uptime_s"] >= BOOT_SETTLE_S
    return tel.get("state") != C.STATE_BOOT


def _wait(pred, timeout_s: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def probe_module(port: str, keys=None, timeout_s: float = 5.0, active: bool = False,
                 heartbeat_period_s: float = 1.0, link_factory=None,
                 active_timeout_s: float = ACTIVE_TIMEOUT_S) -> ModuleView:  # fmt: skip
    """Open ``port``, read the hello, the first telemetry and ``config_get`` (section
    ``control``), keep the events that arrive meanwhile, and with ``active`` run
    :func:`fan_step`. Heartbeats (without GPU readings) keep the module HOSTED while
    doctor talks to it."""
    from modbridge.link import session as S
    from modbridge.link.port import NotASerialPort, check_port

    factory = link_factory or S.ModuleLink
    view = ModuleView(port=port)
    if link_factory is None:  # a real port: a path no module can be behind fails now
        try:
            check_port(port)
        except NotASerialPort as e:
            view.error, view.error_kind = str(e), "not_serial"
            return view
        except S.LinkError:
            pass  # missing or not openable: the link says so below, as before
    link = factory(port, keys=keys, heartbeat_period_s=heartbeat_period_s)
    try:
        try:
            link.start()
        except S.PortBusy as e:
            view.error, view.error_kind = str(e), "busy"
            return view
        except S.PortPermissionDenied as e:
            view.error, view.error_kind = str(e), "permission"
            return view
        except S.LinkError as e:
            view.error, view.error_kind = str(e), "error"
            return view
        if not link.wait_up(timeout_s):
            st = link.status
            if link.state == S.INCOMPATIBLE:
                view.error_kind = "incompatible"
            elif not os.path.exists(port):
                view.error_kind = "not_found"
            else:
                view.error_kind = "no_hello"
            why = st.last_error or f"no hello within {timeout_s:g} s"
            view.error = f"{port}: no module: {why}"
            return view
        st = link.status
        period = (link.telemetry_ms or 1000) / 1000.0
        _wait(lambda: bool(st.telemetry), min(timeout_s, 2.5 * period + 0.5))
        # a module that just started has its fans spinning up and no tach window yet:
        # judge the readings once it has run BOOT_SETTLE_S (bounded by timeout_s)
        _wait(lambda: _settled(st.telemetry), timeout_s)
        view.telemetry = dict(st.telemetry)
        try:
            msg = link.request("config_get", {"section": "control"})
            view.config_read = msg.name == "config"
            view.config_version = msg.fields.get("version")
        except S.LinkError as e:
            view.config_error = str(e)
        if active:
            view.active = fan_step(link, timeout_s=active_timeout_s)
        view.module_id, view.fw_version = st.module_id, st.fw_version
        view.proto_version, view.board = st.proto_version, st.board
        view.fans = st.fans or 2
        view.resets = st.module_resets
        view.paired, view.key_error = link.paired, link.key_error
        view.events = [{"reason": e.get("reason"), "active": e.get("active", True),
                        "value": e.get("value"), "seen": "link"}
                       for e in st.recent_events]  # fmt: skip
        return view
    finally:
        link.stop()


# ---- the running bridge's metrics


def parse_metrics(text: str) -> list[ModuleView]:
    """Module views from a bridge's /metrics text (docs/metrics.md): identity, the
    last telemetry (back in wire units), event counts and resets."""
    from prometheus_client.parser import text_string_to_metric_families

    views: dict[str, ModuleView] = {}

    def view(labels) -> ModuleView | None:
        mod = labels.get("module")
        if mod is None:
            return None
        if mod not in views:
            views[mod] = ModuleView(port=labels.get("port", ""), source="metrics",
                                    module_id=mod.split("@")[0])  # fmt: skip
        return views[mod]

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError):  # not the text format: nothing usable
        return []
    for fam in families:
        for s in fam.samples:
            v = view(s.labels)
            if v is None or (isinstance(s.value, float) and math.isnan(s.value)):
                continue
            lab, val, tel = s.labels, s.value, v.telemetry
            if s.name == "modbridge_module_info":
                v.port = lab.get("port", v.port)
                v.fw_version = lab.get("firmware") or None
                v.proto_version = lab.get("protocol") or None
                v.board = lab.get("board") or None
            elif s.name == "modbridge_module_up" and not val:
                v.error, v.error_kind = f"{v.port}: the bridge's link is down", "no_hello"
            elif s.name == "modbridge_module_temperature_celsius":
                tel["temp_" + lab.get("channel", "?")] = int(round(val * 1000))
            elif s.name == "modbridge_module_fan_speed_rpm":
                tel[f"fan{lab.get('fan')}_rpm"] = int(round(val))
            elif s.name == "modbridge_module_fan_duty_ratio":
                tel[f"fan{lab.get('fan')}_duty"] = int(round(val * _DUTY_FULL))
            elif s.name == "modbridge_module_input_volts":
                tel["v_in"] = int(round(val * 1000))
            elif s.name == "modbridge_module_input_amperes":
                tel["i_in"] = int(round(val * 1000))
            elif s.name == "modbridge_module_state" and val == 1:
                st = lab.get("state")
                if st in C.STATES:
                    tel["state"] = C.STATES.index(st)
            elif s.name == "modbridge_module_fault":
                f = lab.get("fault")
                tel.setdefault("faults", 0)
                if val == 1 and f in C.FAULT_BITS:
                    tel["faults"] |= 1 << C.FAULT_BITS.index(f)
            elif s.name in ("modbridge_module_events_total", "modbridge_module_events"):
                for _ in range(min(int(val), 16)):
                    v.events.append({"reason": lab.get("reason"), "active": True,
                                     "seen": "bridge metrics"})  # fmt: skip
            elif s.name in ("modbridge_module_resets_total", "modbridge_module_resets"):
                v.resets = int(val)
    for v in views.values():
        fans = [k for k in v.telemetry if k.startswith("fan") and k.endswith("_rpm")]
        v.fans = max(len(fans), 1) if fans else 2
    return list(views.values())


def fetch_metrics(url: str, timeout_s: float = 3.0) -> str:
    """GET ``url``; the body as text. Raises OSError (ConnectionRefusedError...)."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - a local URL
            return r.read(4 * 1024 * 1024).decode("utf-8", "replace")
    except urllib.error.URLError as e:
        reason = e.reason
        raise reason if isinstance(reason, OSError) else OSError(str(reason)) from e


def metrics_url(cfg) -> str | None:
    if not getattr(cfg, "exporter_enabled", True):
        return None
    addr = cfg.exporter_address or "127.0.0.1"
    if addr in ("0.0.0.0", ""):
        addr = "127.0.0.1"
    elif addr == "::":
        addr = "::1"
    if ":" in addr:
        addr = f"[{addr}]"
    return f"http://{addr}:{cfg.exporter_port}/metrics"


# ---- GPUs


def probe_gpus(kind: str = "auto", nvml_module=None, smi_run=None, sim_gpus=None,
               wanted=()) -> GpuFacts:  # fmt: skip
    """Open the GPU backend as the bridge would (``auto``: NVML, else nvidia-smi) and
    read the driver version, the GPUs, their persistence mode and limit constraints.
    Reads only."""
    from modbridge.gpu.base import GpuError

    facts = GpuFacts(wanted=list(wanted))
    if kind == "sim":
        from modbridge.gpu.virtual import VirtualBackend

        backend = VirtualBackend(sim_gpus or [])
        facts.backend = "virtual"
        _fill_gpus(facts, backend)
        return facts
    if kind in ("auto", "nvml"):
        from modbridge.gpu.nvml import NvmlBackend

        nv = nvml_module
        if nv is None:
            try:
                import pynvml as nv
            except ImportError:
                nv = None  # NvmlBackend says what to install
        try:
            backend = NvmlBackend(nvml=nv)
        except GpuError as e:
            facts.nvml_error = str(e)
        else:
            try:
                facts.backend = "nvml"
                with contextlib.suppress(Exception):
                    facts.driver_version = _text(nv.nvmlSystemGetDriverVersion())
                _fill_gpus(facts, backend, lambda info: _nvml_persistence(nv, info.index))
            finally:
                backend.close()
            return facts
        if kind == "nvml":
            facts.error = facts.nvml_error
            return facts
    return _probe_smi(facts, smi_run)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_persistence(nv, index: int) -> bool | None:
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        return bool(nv.nvmlDeviceGetPersistenceMode(handle))
    except Exception:  # noqa: BLE001 - NotSupported, an old binding: unknown
        return None


def _fill_gpus(facts: GpuFacts, backend, persistence=None) -> None:
    from modbridge.gpu.base import GpuError

    for info in backend.devices():
        g = GpuFact(uuid=info.uuid, name=info.name, pci_bus_id=info.pci_bus_id)
        try:
            s = backend.sample(info.uuid)
            g.enforced_limit_w, g.default_limit_w = s.enforced_limit_w, s.default_limit_w
            g.min_limit_w, g.max_limit_w = s.min_limit_w, s.max_limit_w
        except GpuError as e:
            g.error = str(e)
        if persistence is not None:
            g.persistence = persistence(info)
        facts.gpus.append(g)


def _default_smi_run(args: list[str]) -> str:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise OSError(errno.ENOENT, "nvidia-smi is not on PATH")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=15, check=False)
    if proc.returncode != 0:
        raise OSError(proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")
    return proc.stdout


def _probe_smi(facts: GpuFacts, smi_run=None) -> GpuFacts:
    """The nvidia-smi fallback: one query for uuid, name, bus id, driver version,
    persistence mode and the limit range."""
    run = smi_run or _default_smi_run
    fields = ("uuid", "name", "pci.bus_id", "driver_version", "persistence_mode",
              "enforced.power.limit", "power.default_limit", "power.min_limit",
              "power.max_limit")  # fmt: skip
    try:
        out = run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    except OSError as e:
        facts.error = (f"no GPU backend: NVML: {facts.nvml_error}; nvidia-smi: "
                       f"{e.strerror or e}")  # fmt: skip
        return facts
    facts.backend = "nvidia-smi"
    for line in out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < len(fields) or not cols[0].startswith("GPU-"):
            continue
        facts.driver_version = facts.driver_version or cols[3]

        def num(text):
            try:
                return float(text)
            except ValueError:
                return None

        facts.gpus.append(GpuFact(
            uuid=cols[0], name=cols[1], pci_bus_id=cols[2],
            persistence={"enabled": True, "disabled": False}.get(cols[4].lower()),
            enforced_limit_w=num(cols[5]), default_limit_w=num(cols[6]),
            min_limit_w=num(cols[7]), max_limit_w=num(cols[8]),
        ))  # fmt: skip
    return facts


# ---- the application


def running_bridge_pids(state_dir, proc_root="/proc") -> list[int]:
    """Pids named in ``locks/*.lock`` that are alive modbridge processes (the lock
    file's pid; its flock is not touched, so a starting bridge is never disturbed)."""
    pids = []
    locks = Path(state_dir) / "locks"
    try:
        names = sorted(os.listdir(locks))
    except OSError:
        return pids
    for n in names:
        if not n.endswith(".lock"):
            continue
        try:
            text = (locks / n).read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        if not text.isdigit() or int(text) in pids:
            continue
        try:
            cmd = Path(proc_root, text, "cmdline").read_bytes()
        except OSError:
            continue
        if b"modbridge" in cmd:
            pids.append(int(text))
    return pids


def read_journal(state_dir) -> tuple[list[JournalFact], str | None]:
    """Every entry of both journals, read without setting unusable ones aside."""
    from modbridge.actuator.journal import ClockJournal, JournalError, LimitJournal

    out = []
    try:
        for kind, j in (("limits", LimitJournal(state_dir)), ("clocks", ClockJournal(state_dir))):
            for uuid in j.uuids():
                try:
                    entry, problem = j.read(uuid, quarantine=False)
                except JournalError as e:  # a file name that is no GPU UUID
                    out.append(JournalFact(uuid=uuid, kind=kind, problem=str(e)))
                    continue
                if problem and problem.startswith("cannot read") and "ermission" in problem:
                    return out, problem
                f = JournalFact(uuid=uuid, kind=kind, problem=problem)
                if entry is not None:
                    f.pid, f.time = entry.pid, entry.time
                    f.original_w = getattr(entry, "original_w", None)
                    f.original = getattr(entry, "original", None)
                out.append(f)
    except JournalError as e:
        return out, str(e)
    return out, None


def probe_app(cfg, state_dir, fetch: Callable | None = None, url: str | None = None,
              use_config_url: bool = True) -> AppFacts:  # fmt: skip
    """L4 facts: GET the exporter, look at the event log and the state directory."""
    app = AppFacts(event_log=cfg.event_log, state_dir=str(state_dir) if state_dir else None)
    app.metrics_url = url or (metrics_url(cfg) if use_config_url else None)
    if state_dir:
        app.bridge_pids = running_bridge_pids(state_dir)
        app.journal, app.journal_error = read_journal(state_dir)
    if app.metrics_url:
        try:
            text = (fetch or fetch_metrics)(app.metrics_url)
        except ConnectionRefusedError:
            app.metrics_ok, app.metrics_refused = False, True
            app.metrics_error = "connection refused"
        except OSError as e:
            app.metrics_ok, app.metrics_error = False, str(e) or e.__class__.__name__
        else:
            app.metrics_text = text
            app.metrics_ok = "modbridge_build_info" in text
    return app


# =============================================================================== run


@dataclass
class DoctorOptions:
    ports: tuple = ()
    config_path: str | None = None
    backend: str | None = None
    sim: bool = False
    sim_world: str = "default"
    sim_faults: tuple = ()
    sim_speed: float = 10.0
    active: bool = False
    timeout_s: float = 5.0
    metrics_url: str | None = None
    state_dir: str | None = None
    keys_dir: str | None = None


@dataclass
class DoctorEnv:
    """What :func:`run_doctor` reaches the machine through (tests replace it)."""

    nvml: object = None  # a pynvml stand-in (gpu.fake_nvml.FakeNvml)
    smi_run: Callable | None = None
    fetch: Callable | None = None
    lister: Callable | None = None  # serial.tools.list_ports.comports stand-in
    link_factory: Callable | None = None
    privileges: Privileges | None = None
    control_client: Callable | None = None  # ctlsock.Client stand-in: (path, timeout_s)


def judge(views, gpu: GpuFacts, app: AppFacts, privs: Privileges,
          under_voltage_v: float = 11.4) -> list[Check]:  # fmt: skip
    """Every check over the gathered facts, L1 to L4."""
    checks: list[Check] = []
    if not views:
        none = ModuleView(port="-", error="no module port found", error_kind="none")
        views = [none]
    for v in views:
        checks += [check_ntc(v), check_fans(v), check_fans_active(v),
                   check_input_voltage(v, under_voltage_v)]  # fmt: skip
    for v in views:
        checks += [check_module_answers(v), check_versions(v), check_reset_cause(v),
                   check_config(v), check_flash_writes(v), check_pairing(v)]  # fmt: skip
    checks += [check_nvml(gpu), check_driver_version(gpu), check_gpus_visible(gpu),
               check_persistence(gpu), check_power_limit_permission(gpu, privs)]  # fmt: skip
    checks += [check_exporter(app), check_control_socket(app), check_event_log(app),
               check_state_dir(app), check_journal(app, gpu)]  # fmt: skip
    return checks


def _load_config(path):
    from modbridge import config as cfgmod

    try:
        return cfgmod.load_given_or_default(path) or cfgmod.BridgeConfig()
    except cfgmod.ConfigFileError as e:
        raise DoctorError(f"{e.path}: invalid config ({'; '.join(map(str, e.problems))}); "
                          "`modbridge config validate` lists the problems") from None


def _merge_bridge_view(view: ModuleView, from_metrics: list[ModuleView]) -> ModuleView:
    """A port the bridge holds: the bridge's view of the module on it, if any."""
    for m in from_metrics:
        if m.port and os.path.realpath(m.port) == os.path.realpath(view.port):
            return m
    if len(from_metrics) == 1 and not from_metrics[0].port:
        return from_metrics[0]
    return view


def _events_from_log(path: str | None, views, max_bytes: int = 1 << 20) -> None:
    """Add the module events the bridge logged (the tail of its event log) that the
    L2 checks judge: watchdog resets and config corruption or fallback."""
    if not path:
        return
    import json

    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return
    wanted = {"watchdog_reset", "config_corrupt", "config_fallback"}
    by_id = {v.module_id: v for v in views if v.module_id}
    for line in tail:
        if '"module_event"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("kind") != "module_event" or rec.get("reason") not in wanted:
            continue
        v = by_id.get(rec.get("module_id"))
        if v is None or v.source == "metrics":  # the bridge's counters have it already
            continue
        fields = rec.get("fields") or {}
        v.events.append({"reason": rec["reason"], "active": fields.get("active", True),
                         "value": fields.get("value"), "seen": "event log"})  # fmt: skip


def run_doctor(opts: DoctorOptions, env: DoctorEnv | None = None, emit=None) -> Report:
    """Gather every fact and judge it (module docstring). ``emit(text)`` gets a word
    on what is being looked at (for a terminal). Raises :class:`DoctorError` for
    unusable options or config."""
    env = env or DoctorEnv()
    say = emit or (lambda _text: None)
    cfg = _load_config(opts.config_path)
    if opts.sim and (opts.ports or opts.backend):
        raise DoctorError("--sim brings its own module and GPU: drop --port/--backend")
    if opts.sim_faults and not opts.sim:
        raise DoctorError("--sim-fault needs --sim")
    privs = env.privileges or read_privileges()
    if opts.sim:
        return _run_sim(opts, env, cfg, privs, say)
    kind = opts.backend or cfg.backend
    if kind == "sim":
        raise DoctorError('backend "sim" needs --sim')
    from modbridge.actuator.journal import default_state_dir
    from modbridge.link.discovery import find_modules
    from modbridge.link.keys import KeyStore

    state_dir = opts.state_dir or default_state_dir(cfg)
    say("L4: the exporter, event log and state directory")
    app = probe_app(cfg, state_dir, fetch=env.fetch, url=opts.metrics_url)
    probe_control(app, cfg, env.control_client, opts.state_dir)
    bridge_views = parse_metrics(app.metrics_text) if app.metrics_ok else []
    keys = KeyStore(opts.keys_dir) if opts.keys_dir else KeyStore.for_config(cfg)
    views = []
    for info in find_modules(list(opts.ports) + cfg.ports(), lister=env.lister):
        say(f"L1/L2: the module on {info.device}")
        v = probe_module(info.device, keys=keys, timeout_s=opts.timeout_s, active=opts.active,
                         link_factory=env.link_factory)  # fmt: skip
        if v.error_kind == "busy":
            v = _merge_bridge_view(v, bridge_views)
        views.append(v)
    if not views and bridge_views:
        views = bridge_views
    _events_from_log(cfg.event_log, views)
    say("L3: the GPU driver")
    wanted = [m.gpu for m in cfg.modules if m.gpu]
    gpu = probe_gpus(kind, nvml_module=env.nvml, smi_run=env.smi_run, wanted=wanted)
    checks = judge(views, gpu, app, privs, cfg.policy.under_voltage_v)
    found = any(v.answered for v in views) or bool(gpu.gpus)
    return Report(checks, found_anything=found)


def _run_sim(opts, env, cfg, privs, say) -> Report:
    """A virtual module cooling a virtual GPU (as ``status --sim``): the same checks,
    a temporary state directory, no exporter (no bridge runs)."""
    from modbridge import bridge as br
    from modbridge.sim.faults import FaultSpecError, parse_faults

    try:
        faults = parse_faults(opts.sim_faults)
    except FaultSpecError as e:
        raise DoctorError(str(e)) from None
    say("starting a virtual module (the real firmware in MicroPython)")
    try:
        fleet, _maps = br.open_sim(1, opts.sim_world, "demo", opts.sim_speed, faults=faults)
    except (ModbridgeError, ValueError, OSError) as e:
        raise SimUnavailable(f"cannot start the simulator: {e}") from None
    try:
        state_dir = opts.state_dir or fleet.state_dir / "bridge"
        say("L1/L2: the virtual module")
        hb = br.sim_heartbeat_period_s(cfg.heartbeat_period_s, opts.sim_speed)
        view = probe_module(fleet.ports[0], keys=fleet.keys, timeout_s=max(opts.timeout_s, 10.0),
                            active=opts.active, heartbeat_period_s=hb,
                            link_factory=env.link_factory)  # fmt: skip
        gpu = probe_gpus("sim", sim_gpus=fleet.gpus)
        app = probe_app(cfg, state_dir, fetch=env.fetch, url=opts.metrics_url,
                        use_config_url=False)  # fmt: skip
        app.event_log = None
        if opts.metrics_url is None:
            app.metrics_note = "--sim: no bridge runs, so there is no exporter to reach"
        checks = judge([view], gpu, app, privs, cfg.policy.under_voltage_v)
        return Report(checks, found_anything=view.answered or bool(gpu.gpus))
    finally:
        fleet.stop()
