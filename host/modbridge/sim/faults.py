"""Scheduled faults for the virtual module: parsed from text, applied on a world clock.

``modbridge sim --fault SPEC`` and the Python API (``SimFleet(faults=...)``,
``FaultSchedule``) share this. A spec is::

    [m<module>:]<fault>[:<arg>]@<start>[-<end>]

    ntc_open:gpu@30s            NTC channel open from 30 s on (gpu, vram, mos, amb or 0..3)
    ntc_short:amb@10s-20s       NTC channel shorted from 10 s to 20 s
    fan_stall:2@60s-90s         fan 2 (as in telemetry's fan2_*; 1 or 2) stalled
    fan_weak:1@10s              fan 1 reaches only 30 % of the RPM its duty gives (a
                                worn bearing, a blocked or wrong fan); fan_weak:1/50%@10s
    tach_noise:2@10s            fan 2's tach is pure noise: its rotor's edges are lost
                                and edges at a random rate arrive instead (a broken tach
                                wire picking up interference); tach_noise:2/10%@10s: a working
                                tach with noise: each exchange's count off by up to 10 %
                                and, every 5 s, a spike of extra edges
    ina_absent@10s              the INA226 stops answering (NAKs its address)
    dip:900mV/500ms@45s         the 12 V source drops 900 mV (or 0.9V) for 500 ms
    host_silence@20s-40s        bytes from the host are dropped
    mcu_reset@50s               the MCU resets ("power"; mcu_reset:watchdog@50s, ...)
    gpu_lost@100s               the virtual GPU falls off the bus (NVML GPU_IS_LOST)
    telemetry_freeze@30s-60s    the host gets the last telemetry frame again, byte for
                                byte (frozen seq and uptime; the firmware runs on)
    m1:fan_stall:1@5s           only module 1 of a fleet (default: every module)

Times are simulated time from the start, with ``ms``, ``s``, ``min`` or ``h``
(a bare number is seconds). Without ``-<end>`` a fault stays on; ``dip`` has its own
duration and ``mcu_reset`` is an instant, so neither takes an end. ``parse_fault``
raises ``FaultSpecError`` (a ``ValueError``) naming the spec and what is wrong.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from modbridge.sim.link import RESET_CAUSES
from modbridge.sim.world import CHANNELS
from protocol import catalog as C
from protocol.frame import StreamDecoder

# fault name -> (argument kind, ranged?)
KINDS = {
    "ntc_open": ("channel", True),
    "ntc_short": ("channel", True),
    "fan_stall": ("fan", True),
    "fan_weak": ("fan_level", True),
    "tach_noise": ("fan_level", True),
    "ina_absent": (None, True),
    "dip": ("dip", False),
    "host_silence": (None, True),
    "mcu_reset": ("cause", False),
    "gpu_lost": (None, True),
    "telemetry_freeze": (None, True),
}
ALIASES = {"rail_dip": "dip", "ntc_opened": "ntc_open", "silence": "host_silence",
           "frozen_telemetry": "telemetry_freeze"}  # fmt: skip

EXAMPLES = (
    "ntc_open:gpu@30s, ntc_short:vram@10s-20s, fan_stall:2@60s-90s, fan_weak:1/30%@10s, "
    "tach_noise:2@10s, ina_absent@10s, "
    "dip:900mV/500ms@45s, host_silence@20s-40s, mcu_reset@50s, gpu_lost@100s, "
    "telemetry_freeze@30s-60s"
)

_UNITS_MS = {"ms": 1, "s": 1000, "min": 60000, "h": 3600000, "": 1000}
_TIME = re.compile(r"^([0-9]+(?:\.[0-9]*)?)(ms|s|min|h|)$")
_DEPTH = re.compile(r"^([0-9]+(?:\.[0-9]*)?)(mV|V)$")
_MODULE = re.compile(r"^m([0-9]+):(.*)$")
_PCT = re.compile(r"^([0-9]+(?:\.[0-9]*)?)%$")
WEAK_PCT = 30.0  # fan_weak without a level: 30 % of the RPM
NOISE_SPIKE_MS = 5000  # tach_noise with a level: one spike of edges this often
NOISE_SLOT_MS = 500  # pure tach noise: its edge rate changes this often
NOISE_RPM = (200.0, 9000.0)  # pure tach noise: the RPM its edge rate reads as


class FaultSpecError(ValueError):
    """A fault spec cannot be read; the message names the spec and the problem."""


@dataclass(frozen=True)
class Fault:
    """One scheduled fault.

    ``arg`` is what the world or runner method takes: the channel index (ntc_*), the
    fan index 0/1 (fan_stall, fan_weak, tach_noise; the spec says 1/2), the reset
    cause (mcu_reset), None otherwise. ``until_ms`` None: stays on (dip:
    ``duration_ms`` is its length). ``module`` None: every module of a fleet.
    ``pct``: fan_weak's share of the RPM (default 30), tach_noise's jitter (None:
    pure noise).
    """

    name: str
    at_ms: int
    until_ms: int | None = None
    arg: int | str | None = None
    depth_mv: int = 0
    duration_ms: int = 0
    module: int | None = None
    spec: str = ""
    pct: float | None = None

    def label(self) -> str:
        """Human wording of the fault, e.g. ``fan2 stall`` or ``12 V dip 900 mV/500 ms``."""
        n = self.name
        if n in ("ntc_open", "ntc_short"):
            return f"NTC {CHANNELS[self.arg]} {n[4:]}"
        if n == "fan_stall":
            return f"fan{self.arg + 1} stall"
        if n == "fan_weak":
            return f"fan{self.arg + 1} weak ({self.pct:g} % of its RPM)"
        if n == "tach_noise":
            what = "pure noise" if self.pct is None else f"{self.pct:g} % jitter and spikes"
            return f"fan{self.arg + 1} tach noise ({what})"
        if n == "dip":
            return f"12 V dip {self.depth_mv} mV/{self.duration_ms} ms"
        if n == "mcu_reset":
            return f"MCU reset ({self.arg})"
        return {"ina_absent": "INA226 absent", "gpu_lost": "GPU lost",
                "telemetry_freeze": "telemetry frozen"}.get(n, n.replace("_", " "))  # fmt: skip

    def apply(self, vm, on: bool = True) -> None:
        """Switch the fault on (or off) on a ``VirtualModule``."""
        n = self.name
        if n in ("ntc_open", "ntc_short", "fan_stall"):
            vm.world_fault(n, self.arg, on)
        elif n in ("fan_weak", "tach_noise"):
            with vm.lock:
                ff = fan_faults(vm.world)
                if n == "fan_weak":
                    ff.set_weak(self.arg, self.pct / 100.0 if on else None)
                else:
                    ff.set_noise(self.arg, on, None if self.pct is None else self.pct / 100.0)
                release_fan_faults(vm.world)
        elif n in ("ina_absent", "gpu_lost"):
            vm.world_fault(n, on)
        elif n == "dip":
            if on:
                vm.world_fault("rail_dip", self.depth_mv, self.duration_ms)
        elif n == "host_silence":
            vm.host_silence(on)
        elif n == "telemetry_freeze":
            freeze_telemetry(vm, on)
        elif n == "mcu_reset":
            if on:
                vm.mcu_reset(self.arg)
        else:  # pragma: no cover - parse_fault admits only KINDS
            raise FaultSpecError(f"unknown fault {n!r}")


class TelemetryFreeze:
    """What the module sends, with every telemetry frame replaced by the first one seen
    since the freeze began: byte-identical frames (same seq, same uptime), the other
    messages (hello, ack, events) as they are. Sits in front of the runner's
    ``_relay_tx`` (pty + tap), so the host and the tap see the same bytes.

    Frames end at a 0x00 delimiter; bytes of an unfinished frame wait for the rest.
    """

    def __init__(self, relay):
        self._relay = relay
        self._buf = b""
        self.frame: bytes | None = None  # the telemetry frame being repeated
        self.repeated = 0  # telemetry frames replaced by it

    def __call__(self, data: bytes) -> None:
        buf = self._buf + bytes(data)
        end = buf.rfind(b"\x00") + 1
        self._buf = buf[end:]
        out = []
        for chunk in buf[:end].split(b"\x00")[:-1]:
            frame = chunk + b"\x00"
            if _is_telemetry(frame):
                if self.frame is None:
                    self.frame = frame
                elif frame != self.frame:
                    frame = self.frame
                    self.repeated += 1
            out.append(frame)
        if out:
            self._relay(b"".join(out))

    def flush(self) -> None:
        if self._buf:
            self._relay(self._buf)
            self._buf = b""


def _is_telemetry(frame: bytes) -> bool:
    """Is this one frame (with its delimiter; a text line may precede it) telemetry?"""
    return any(m.ok and m.name == "telemetry" for m in StreamDecoder(accept=C.D2H).feed(frame))


def freeze_telemetry(vm, on: bool = True) -> TelemetryFreeze | None:
    """Switch the telemetry freeze on (or off) on a ``VirtualModule``; the freeze."""
    with vm.lock:
        freeze = vm.__dict__.get("_relay_tx")
        if on and not isinstance(freeze, TelemetryFreeze):
            freeze = vm._relay_tx = TelemetryFreeze(vm._relay_tx)
        elif not on and isinstance(freeze, TelemetryFreeze):
            del vm._relay_tx  # the runner's own method again
            freeze.flush()
        return freeze


class FanFaults:
    """``fan_weak`` and ``tach_noise`` on one world (``fan_faults(world)`` installs it).

    The world's fans and tachs stay the world's: this wraps, on that world object only,
    its ``_fan_target`` (a weak fan heads for ``share`` x the RPM its duty gives, so it
    also moves less air) and its ``tach_pulses`` (what the sim board counts). When no
    such fault is left on, ``fan_faults`` takes the wrappers off again.

    Noise is seeded from the world's seed (``<seed>:tach``): the same exchanges give
    the same edges. Pure noise: the rotor's edges are dropped; edges arrive at a rate
    drawn anew every ``NOISE_SLOT_MS`` of world time, log-uniform between the edge
    rates of ``NOISE_RPM`` (200..9,000 RPM at the world's pulses/rev: below any glitch
    filter, never silent), so one second's reading says nothing about the next. Jitter
    ``j``: each exchange's count times a factor in ``1 +- j`` (fractions carried
    over), and once every ``NOISE_SPIKE_MS`` three times the count extra.
    """

    def __init__(self, world):
        self.world = world
        self.weak: list[float | None] = [None, None]  # share of the RPM, None: healthy
        self.noise: list[float | None | bool] = [False, False]  # False off, None pure
        self._rng = random.Random(f"{getattr(world, 'seed', 0)}:tach")
        self._last_ms = world.now_ms
        self._slot_ms = [0, 0]  # pure noise: world ms left at the current rate
        self._rate = [0.0, 0.0]  # pure noise: edges per ms
        self._carry = [0.0, 0.0]  # jitter: fractional edges carried over
        self._spike = [0, 0]  # jitter: the NOISE_SPIKE_MS period of the last spike
        self._target = world._fan_target
        self._pulses = world.tach_pulses

    @property
    def active(self) -> bool:
        return any(w is not None for w in self.weak) or any(n is not False for n in self.noise)

    def set_weak(self, fan: int, share: float | None) -> None:
        self.weak[self.world._fan(fan)] = share

    def set_noise(self, fan: int, on: bool, jitter: float | None = None) -> None:
        fan = self.world._fan(fan)
        self.noise[fan] = jitter if on else False
        self._slot_ms[fan] = 0
        self._carry[fan] = 0.0
        self._spike[fan] = self.world.now_ms // NOISE_SPIKE_MS

    def fan_target(self, i, rpm=None):
        target = self._target(i, rpm)
        share = self.weak[i]
        return target if share is None else target * share

    def tach_pulses(self):
        out = self._pulses()
        now = self.world.now_ms
        dt = max(0, now - self._last_ms)
        self._last_ms = now
        rng = self._rng
        for i, mode in enumerate(self.noise):
            if mode is False:
                continue
            if mode is None:  # pure noise
                x = self._carry[i]
                left = dt
                while left > 0:
                    if self._slot_ms[i] <= 0:
                        self._slot_ms[i] = NOISE_SLOT_MS
                        lo, hi = (math.log(r * self.world._ppr / 60000.0) for r in NOISE_RPM)
                        self._rate[i] = math.exp(rng.uniform(lo, hi))
                    part = min(left, self._slot_ms[i])
                    x += self._rate[i] * part
                    self._slot_ms[i] -= part
                    left -= part
                out[i] = int(x)
                self._carry[i] = x - out[i]
                continue
            x = out[i] * (1.0 + rng.uniform(-mode, mode)) + self._carry[i]
            n = int(x)
            self._carry[i] = x - n
            period = now // NOISE_SPIKE_MS
            if period != self._spike[i]:
                self._spike[i] = period
                n += 3 * out[i]
            out[i] = max(0, n)
        return out


def fan_faults(world) -> FanFaults:
    """The ``FanFaults`` of ``world``, installed on first use (its wrappers are set as
    instance attributes of that world); call ``release_fan_faults`` to take them off."""
    ff = world.__dict__.get("_fan_faults")
    if ff is None:
        ff = world._fan_faults = FanFaults(world)
        world._fan_target = ff.fan_target
        world.tach_pulses = ff.tach_pulses
    return ff


def release_fan_faults(world) -> None:
    """Take the ``FanFaults`` wrappers off ``world`` if no fan_weak/tach_noise is on."""
    ff = world.__dict__.get("_fan_faults")
    if ff is not None and not ff.active:
        del world._fan_faults, world._fan_target, world.tach_pulses


def parse_time_ms(text: str, what: str = "time") -> int:
    """``30s``, ``500ms``, ``1.5min``, ``2h`` or a bare number of seconds -> whole ms."""
    m = _TIME.match(text.strip())
    if not m:
        raise FaultSpecError(f"{what} like 30s, 500ms, 2min or 45 (seconds), got {text!r}")
    ms = float(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms != int(ms):
        raise FaultSpecError(f"{what} must be a whole number of ms, got {text!r}")
    return int(ms)


def parse_fault(spec: str) -> Fault:
    """Read one spec (see the module docstring); raises ``FaultSpecError``."""
    if not isinstance(spec, str):
        raise FaultSpecError(f"a fault spec is text, got {spec!r}")
    text = spec.strip()
    try:
        return _parse(text)
    except FaultSpecError as e:
        raise FaultSpecError(f"fault {text!r}: {e}") from None


def _parse(text: str) -> Fault:
    if not text:
        raise FaultSpecError(f"empty; faults look like {EXAMPLES}")
    spec = text
    module = None
    m = _MODULE.match(text)
    if m:
        module, text = int(m.group(1)), m.group(2)
    what, at, when = text.partition("@")
    if not at:
        raise FaultSpecError("no start time: add @<time>, e.g. fan_stall:2@60s")
    name, colon, arg_text = what.partition(":")
    name = ALIASES.get(name.strip(), name.strip())
    if name not in KINDS:
        raise FaultSpecError(f"unknown fault {name!r}; faults are {', '.join(KINDS)}")
    kind, ranged = KINDS[name]
    arg_text = arg_text.strip()
    if colon and not arg_text:
        raise FaultSpecError(f"nothing after {name}:")

    start_text, dash, end_text = when.partition("-")
    at_ms = parse_time_ms(start_text, "start time")
    until_ms = None
    if dash:
        if not ranged:
            why = "it has its own duration" if name == "dip" else "it is an instant"
            raise FaultSpecError(f"{name} takes a start time only ({why}), got @{when}")
        until_ms = parse_time_ms(end_text, "end time")
        if until_ms <= at_ms:
            raise FaultSpecError(f"end {end_text} is not after start {start_text}")

    arg: int | str | None = None
    depth_mv = duration_ms = 0
    pct = None
    if kind is None:
        if arg_text:
            raise FaultSpecError(f"{name} takes no argument, got {name}:{arg_text}")
    elif kind == "channel":
        arg = _channel(name, arg_text)
    elif kind == "fan":
        if arg_text not in ("1", "2"):
            raise FaultSpecError(
                f"{name} needs the fan, 1 or 2 (fan1/fan2 in telemetry), "
                f"e.g. {name}:2@60s; got {arg_text or 'nothing'}"
            )
        arg = int(arg_text) - 1
    elif kind == "fan_level":
        fan_text, slash, pct_text = arg_text.partition("/")
        fan_text = fan_text.strip()
        if fan_text not in ("1", "2"):
            raise FaultSpecError(
                f"{name} needs the fan, 1 or 2 (fan1/fan2 in telemetry), "
                f"e.g. {name}:2@60s or {name}:2/20%@60s; got {fan_text or 'nothing'}"
            )
        arg = int(fan_text) - 1
        if slash:
            pm = _PCT.match(pct_text.strip())
            top = 100.0 if name == "fan_weak" else 90.0
            if not pm or not 0 < float(pm.group(1)) < top:
                raise FaultSpecError(
                    f"{name} level is a percentage above 0 and below {top:g}%, "
                    f"e.g. {name}:{fan_text}/20%; got {pct_text!r}"
                )
            pct = float(pm.group(1))
        elif name == "fan_weak":
            pct = WEAK_PCT
    elif kind == "cause":
        arg = arg_text or "power"
        if arg not in RESET_CAUSES:
            raise FaultSpecError(f"reset cause is one of {', '.join(RESET_CAUSES)}, got {arg!r}")
    else:  # dip
        depth_text, slash, dur_text = arg_text.partition("/")
        if not slash:
            raise FaultSpecError(
                f"dip needs <depth>/<duration>, e.g. dip:900mV/500ms@45s; got dip:{arg_text}"
            )
        dm = _DEPTH.match(depth_text.strip())
        if not dm:
            raise FaultSpecError(f"dip depth like 900mV or 0.9V, got {depth_text!r}")
        depth = float(dm.group(1)) * (1000 if dm.group(2) == "V" else 1)
        if depth != int(depth) or not 0 < depth <= 12000:
            raise FaultSpecError(f"dip depth must be 1..12000 whole mV, got {depth_text!r}")
        depth_mv = int(depth)
        duration_ms = parse_time_ms(dur_text, "dip duration")
        if duration_ms <= 0:
            raise FaultSpecError(f"dip duration must be > 0, got {dur_text!r}")
    return Fault(name, at_ms, until_ms, arg, depth_mv, duration_ms, module, spec, pct)


def _channel(name: str, arg_text: str) -> int:
    if arg_text in CHANNELS:
        return CHANNELS.index(arg_text)
    if arg_text in ("0", "1", "2", "3"):
        return int(arg_text)
    raise FaultSpecError(
        f"{name} needs the NTC channel, one of {', '.join(CHANNELS)} (or 0..3), "
        f"e.g. {name}:gpu@30s; got {arg_text or 'nothing'}"
    )


def parse_faults(specs) -> list[Fault]:
    """Parse each spec (``Fault`` objects pass through)."""
    return [s if isinstance(s, Fault) else parse_fault(s) for s in specs]


@dataclass(frozen=True)
class Action:
    """A fault switching on (``on``) or off at ``t_ms`` on one module (or all: None)."""

    t_ms: int
    fault: Fault
    on: bool

    def text(self) -> str:
        f = self.fault
        if f.name in ("dip", "mcu_reset"):
            return f.label()
        return f"{f.label()} {'on' if self.on else 'off'}"


class FaultSchedule:
    """Faults in time order, applied by whoever drives the clock.

    ``apply_due(modules, now_ms)`` switches on (and off) every fault due at or before
    ``now_ms`` on the modules it names and returns the ``Action`` s it took;
    ``next_ms`` is the time of the next one (None: nothing left), so a driver can end
    a step exactly there.
    """

    def __init__(self, faults=(), n_modules: int = 1):
        self.faults = parse_faults(faults)
        for f in self.faults:
            if f.module is not None and not 0 <= f.module < n_modules:
                raise FaultSpecError(
                    f"fault {f.spec!r}: no module {f.module} (modules are 0..{n_modules - 1})"
                )
        acts = []
        for f in self.faults:
            acts.append(Action(f.at_ms, f, True))
            if f.until_ms is not None:
                acts.append(Action(f.until_ms, f, False))
        # at equal times, offs before ons (a fault ending at 60 s and another starting)
        self._pending = sorted(acts, key=lambda a: (a.t_ms, a.on))
        self.done: list[tuple[Action, int | None]] = []

    def __bool__(self) -> bool:
        return bool(self.faults)

    @property
    def next_ms(self) -> int | None:
        return self._pending[0].t_ms if self._pending else None

    def apply_due(self, modules, now_ms: int) -> list[Action]:
        """Apply what is due by ``now_ms`` to ``modules`` (a list of VirtualModule)."""
        taken = []
        while self._pending and self._pending[0].t_ms <= now_ms:
            act = self._pending.pop(0)
            idx = range(len(modules)) if act.fault.module is None else (act.fault.module,)
            for i in idx:
                act.fault.apply(modules[i], act.on)
            self.done.append((act, act.fault.module))
            taken.append(act)
        return taken
