"""What the bridge knows about a module, in base units (degC, V, A, W, ratios).

One :class:`ModuleStatus` per module, updated by its link from hello, telemetry and
event frames; read (never written) by the policy, the exporter and the CLI. Telemetry
fields keep the wire's fixed-point integers in ``telemetry``; the properties convert.
A field the module did not send (a faulted sensor) is ``None``, never 0.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from protocol import catalog as C

# Link freshness (docs/bridge.md, "Silence and unplug"), decided once, here, for the
# link and the policy alike (:func:`grade`). Ages are counted in the bridge's running
# time: a stretch when the bridge's I/O did not run (SIGSTOP, a VM pause, swapping) is
# not held against the module. One missed frame is "late" (counted, no limit cut); the
# module is "silent" only once its last frame is SILENT_S old (and at least
# SILENT_MIN_PERIODS telemetry periods: two missed frames more), at most the policy's
# module_silent_s; a port that disappeared is silent UNPLUG_DEBOUNCE_S after the loss
# if that is sooner (a replug within it is not a silence).
LATE_PERIODS = 1.5  # no frame for 1.5 periods: one frame is missing -> late
SILENT_S = 1.75  # real silence is decided within 2 s of the last frame (5 Hz: 8 missed)
SILENT_MIN_PERIODS = 2.5  # slow telemetry: never silent before 2 frames are missed
UNPLUG_DEBOUNCE_S = 0.5
FRESH, LATE, SILENT = "fresh", "late", "silent"


def silence_timeout_s(telemetry_ms: int | None, max_s: float | None) -> float | None:
    """The silence timeout for a module announcing ``telemetry_ms`` in its hello:
    max(SILENT_S, SILENT_MIN_PERIODS periods), at most ``max_s``.

    >>> silence_timeout_s(200, 5.0), silence_timeout_s(1000, 5.0), silence_timeout_s(200, 1.0)
    (1.75, 2.5, 1.0)
    >>> silence_timeout_s(None, 5.0), silence_timeout_s(None, None) is None
    (5.0, True)
    """
    if not telemetry_ms:
        return max_s
    derived = max(SILENT_S, SILENT_MIN_PERIODS * telemetry_ms / 1000.0)
    return derived if max_s is None else min(derived, max_s)


@dataclass(frozen=True)
class LinkFreshness:
    """The one verdict on a module's frames (:func:`grade`): ``state`` fresh, late or
    silent; ``age_s`` the last frame's age in the bridge's running time (None: no frame
    yet); ``missed_frames`` telemetry periods gone by without a frame; ``paused_s`` the
    time the bridge itself did not run since that frame (not counted in ``age_s``);
    ``silent_after_s`` the threshold it was judged against; ``unplugged``: the port is
    gone (the verdict is the unplug's, not the clock's)."""

    state: str
    age_s: float | None
    missed_frames: int = 0
    paused_s: float = 0.0
    silent_after_s: float | None = None
    unplugged: bool = False

    @property
    def silent(self) -> bool:
        return self.state == SILENT


def grade(age_s: float | None, silent_after_s: float | None, period_s: float | None = None,
          paused_s: float = 0.0, unplugged_s: float | None = None) -> LinkFreshness:  # fmt: skip
    """Grade a link from the last frame's wall age ``age_s`` less ``paused_s`` (the
    bridge's own pauses since it): silent past ``silent_after_s`` (None: never by age),
    late past ``LATE_PERIODS`` telemetry periods (``period_s``; None: never late);
    ``unplugged_s``: seconds since the port was lost (silent past
    ``UNPLUG_DEBOUNCE_S``), None while it is there.

    >>> grade(0.35, 1.75, 0.2).state, grade(0.5, 1.75, 0.2).missed_frames
    ('late', 2)
    >>> grade(1.8, 1.75, 0.2).state, grade(30.1, 1.75, 0.2, paused_s=30.0).state
    ('silent', 'fresh')
    """
    if age_s is None:
        return LinkFreshness(FRESH, None, silent_after_s=silent_after_s)
    age = max(0.0, age_s - paused_s)
    missed = int(age / period_s + 0.5) - 1 if period_s else 0
    unplugged = unplugged_s is not None and unplugged_s > UNPLUG_DEBOUNCE_S
    if unplugged or (silent_after_s is not None and age > silent_after_s):
        state = SILENT
    elif period_s and age > LATE_PERIODS * period_s:
        state = LATE
    else:
        state = FRESH
    return LinkFreshness(state, age, max(missed, 0), paused_s, silent_after_s, unplugged)


_FAULT_NAMES: dict = {}  # fault bits -> their names (ModuleStatus.fault_names)


def _milli(v):
    return None if v is None else v / 1000.0


@dataclass
class ModuleStatus:
    port: str
    module_id: str | None = None  # MCU unique id (hex) from hello
    link_up: bool = False
    last_frame_at: float | None = None  # time.monotonic()
    connected_at: float | None = None
    fw_version: str | None = None
    proto_version: str | None = None  # "1.0"
    board: str | None = None
    channels: tuple[str, ...] = ()
    fans: int = 0
    telemetry: dict = field(default_factory=dict)  # wire values of the last telemetry
    telemetry_at: float | None = None
    telemetry_seq: int | None = None  # frame sequence number of the last telemetry
    events_total: Counter = field(default_factory=Counter)  # by reason name
    frame_errors: Counter = field(default_factory=Counter)  # by decoder error kind
    frames_total: int = 0
    reconnects: int = 0  # times the port was reopened after being lost
    module_resets: int = 0  # boot banners / unsolicited hellos while connected
    last_error: str | None = None
    recent_events: list = field(default_factory=list)  # last few event dicts
    silent_after_s: float | None = None  # silence timeout (silence_timeout_s), from hello
    telemetry_period_s: float | None = None  # the hello's telemetry_ms, in s
    lost_at: float | None = None  # when the port was lost (None: not lost since the hello)
    paused_s: float = 0.0  # the bridge's own pauses since the last frame (not the module's)
    freshness: LinkFreshness | None = None  # the link's verdict (grade), set by the link
    late_total: int = 0  # episodes of late frames (one missed or more, not silent)
    # set by the bridge: every port (this one too) whose module announces this id
    duplicate_ports: tuple[str, ...] = ()

    def key(self) -> str:
        """The name the bridge's pair, metrics and report use: the module id, the port
        until the hello, ``<id>@<port>`` while another module announces the same id."""
        if self.module_id is None:
            return self.port
        if self.duplicate_ports:
            return f"{self.module_id}@{self.port}"
        return self.module_id

    # -- derived, base units ---------------------------------------------------
    def last_frame_age_s(self, now: float | None = None) -> float | None:
        if self.last_frame_at is None:
            return None
        return (time.monotonic() if now is None else now) - self.last_frame_at

    def silence_deadline(self) -> float | None:
        """When this module counts as silent: ``last_frame_at + silent_after_s`` plus the
        bridge's own pauses since (``paused_s``), or ``lost_at + UNPLUG_DEBOUNCE_S`` if
        the port is lost and that is sooner; None without a frame or a timeout."""
        if self.last_frame_at is None or self.silent_after_s is None:
            return None
        due = self.last_frame_at + self.paused_s + self.silent_after_s
        if self.lost_at is not None and not self.link_up:
            due = min(due, max(self.lost_at, self.last_frame_at) + UNPLUG_DEBOUNCE_S)
        return due

    def late_deadline(self) -> float | None:
        """When this module's next frame is late (``LATE_PERIODS`` periods after the
        last one, plus the bridge's pauses since); None without a frame or a period."""
        if self.last_frame_at is None or not self.telemetry_period_s:
            return None
        return self.last_frame_at + self.paused_s + LATE_PERIODS * self.telemetry_period_s

    def grade(self, now: float) -> LinkFreshness:
        """:func:`grade` of this module at ``now`` (what the link publishes as
        ``freshness`` once it has drained the port)."""
        lost = None
        if self.lost_at is not None and not self.link_up and self.last_frame_at is not None:
            lost = now - max(self.lost_at, self.last_frame_at)
        return grade(self.last_frame_age_s(now), self.silent_after_s, self.telemetry_period_s,
                     self.paused_s, lost)  # fmt: skip

    @property
    def state(self) -> str | None:
        s = self.telemetry.get("state")
        if s is None:
            return None
        return C.STATES[s] if 0 <= s < len(C.STATES) else str(s)

    @property
    def reason(self) -> str | None:
        r = self.telemetry.get("reason")
        if r is None:
            return None
        return C.REASONS[r] if 0 <= r < len(C.REASONS) else str(r)

    @property
    def faults(self) -> int:
        return self.telemetry.get("faults", 0)

    def fault_names(self) -> list[str]:
        f = self.faults
        names = _FAULT_NAMES.get(f)
        if names is None:
            names = tuple(name for i, name in enumerate(C.FAULT_BITS) if f & (1 << i))
            if len(_FAULT_NAMES) < 4096:  # bits from the wire: bounded
                _FAULT_NAMES[f] = names
        return list(names)

    def temperature_c(self, channel: str) -> float | None:
        return _milli(self.telemetry.get("temp_" + channel))

    @property
    def target_error_c(self) -> float | None:
        """The control loop's error: worst controlled channel minus its setpoint (degC).

        Telemetry field ``target``; None when no controlled channel is valid."""
        return _milli(self.telemetry.get("target"))

    @property
    def temperatures_c(self) -> dict[str, float | None]:
        return {ch: self.temperature_c(ch) for ch in C.CHANNELS}

    def fan_rpm(self, fan: int) -> int | None:
        return self.telemetry.get(f"fan{fan}_rpm")

    def fan_duty_ratio(self, fan: int) -> float | None:
        d = self.telemetry.get(f"fan{fan}_duty")
        return None if d is None else d / C.DUTY_MAX

    @property
    def v_in_v(self) -> float | None:
        return _milli(self.telemetry.get("v_in"))

    @property
    def i_in_a(self) -> float | None:
        return _milli(self.telemetry.get("i_in"))

    @property
    def p_in_w(self) -> float | None:
        return _milli(self.telemetry.get("p_in"))

    def stalled_fans(self) -> int:
        f = self.faults
        return bool(f & C.FAULT_FAN1_STALL) + bool(f & C.FAULT_FAN2_STALL)

    def fan_duty_pct(self, fan: int) -> float | None:
        """Fan ``fan``'s commanded duty in percent (0..100, to 0.001 %)."""
        r = self.fan_duty_ratio(fan)
        return None if r is None else round(r * 100.0, 3)

    def fan_fields(self) -> dict:
        """``fan1_rpm``, ``fan1_duty_pct``, ``fan2_rpm``, ... (docs/vocabulary.md)."""
        out = {}
        for i in range(1, (self.fans or 2) + 1):
            out[f"fan{i}_rpm"] = self.fan_rpm(i)
            out[f"fan{i}_duty_pct"] = self.fan_duty_pct(i)
        return out

    def as_dict(self, now: float | None = None) -> dict:
        """JSON-ready view (CLI ``status --json``); the names are docs/vocabulary.md's:
        a quantity's key ends in its unit (``temp_gpu_c``, ``fan1_duty_pct``)."""
        return {
            "port": self.port,
            "module_id": self.module_id,
            "link_up": self.link_up,
            "last_frame_age_s": self.last_frame_age_s(now),
            "fw_version": self.fw_version,
            "protocol": self.proto_version,
            "board": self.board,
            "state": self.state,
            "reason": self.reason,
            "faults": self.fault_names(),
            **{f"temp_{ch}_c": t for ch, t in self.temperatures_c.items()},
            **self.fan_fields(),
            "v_in_v": self.v_in_v,
            "i_in_a": self.i_in_a,
            "p_in_w": self.p_in_w,
            "frame_errors": dict(self.frame_errors),
            "events_total": dict(self.events_total),
            "reconnects": self.reconnects,
            "module_resets": self.module_resets,
            "last_error": self.last_error,
            "duplicate_ports": list(self.duplicate_ports),
        }


@dataclass
class PairState:
    """A module and the GPU it cools, as the policy and the actuator see them."""

    module_id: str | None
    gpu_uuid: str | None
    level: int = 0  # policy level: 0 NORMAL, 1 WARN, 2 CRITICAL
    reasons: tuple[str, ...] = ()
    eta_s: float | None = None  # early warning: time to the warn threshold
    target_limit_w: float | None = None  # None: the original limit
    original_limit_w: float | None = None
    actions_total: Counter = field(default_factory=Counter)  # lower/restore/refused/dry_run
    limit_writes_refused: int = 0


@dataclass
class BridgeSnapshot:
    """Everything a scrape or ``status`` shows; built by the bridge, read-only after."""

    taken_at: float  # time.monotonic()
    modules: list[ModuleStatus] = field(default_factory=list)
    gpus: list = field(default_factory=list)  # GpuSample
    pairs: list[PairState] = field(default_factory=list)
    backend: str = ""
    # module key -> modbridge.chassis.ChassisReport (the learned chassis model)
    chassis: dict = field(default_factory=dict)
