"""GPU load profiles: the board power a workload would draw if nothing capped it.

A profile is a sequence of segments laid end to end, written one per line::

    # the control-quality benchmark
    idle 60s
    hold 650W 10min
    bursts 650W 30s/30s 10min
    idle 5min

Segments (durations take ``ms``, ``s``, ``min`` or ``h``; powers ``W``):

    idle <dur>                         demand 0 W (the GPU draws its idle floor)
    hold <P>W <dur>                    constant demand
    ramp <P0>W <P1>W <dur>             linear from P0 to P1
    bursts <P>W <on>/<off> <dur>       P for <on>, 0 W for <off>, repeated for <dur>
                                       (the last period may be cut short)
    dip <depth>mV <dur>                an event, no time of its own: a 12 V rail dip of
                                       <depth> mV lasting <dur> starts here

After the last segment the demand is 0 W (idle). ``demand_w(t_ms)`` answers in
O(log segments). The demand is the whole board power the workload wants, idle floor
included: ``VirtualGPU`` draws ``max(idle_w, min(demand, limit))``.

Built-ins (``BUILTIN``): ``idle``, ``step650``, ``bursts``, ``bench`` (the
control-quality benchmark profile, 26 min) and ``demo`` (2.5 min for the README).
``Profile.from_samples`` replays a recorded power trace (piecewise linear).
"""

from __future__ import annotations

import bisect
import re

BUILTIN = {
    "idle": "idle 1h\n",
    "step650": "idle 60s\nhold 650W 10min\nidle 5min\n",
    "bursts": "bursts 650W 30s/30s 1h\n",
    "bench": "idle 60s\nhold 650W 10min\nbursts 650W 30s/30s 10min\nidle 5min\n",
    "demo": (
        "# 2.5 minutes with something to look at\n"
        "idle 15s\n"
        "ramp 100W 650W 15s\n"
        "hold 650W 40s\n"
        "dip 900mV 300ms\n"
        "bursts 650W 10s/10s 40s\n"
        "hold 400W 20s\n"
        "idle 20s\n"
    ),
}

_UNITS_MS = {"ms": 1, "s": 1000, "min": 60000, "h": 3600000}
_DUR = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|min|h)$")
_POWER = re.compile(r"^([0-9]+(?:\.[0-9]+)?)W$")
_MV = re.compile(r"^([0-9]+)mV$")


class ProfileError(ValueError):
    """A profile text is wrong; the message names the line and what is expected."""


class Profile:
    """Demanded GPU board power vs time, plus scripted rail dips.

    ``segments``: list of ``(t0_ms, t1_ms, kind, args)`` with kind ``"linear"``
    (args ``(w0, w1)``) or ``"bursts"`` (args ``(w_on, on_ms, off_ms)``).
    ``dips``: list of ``(t_ms, depth_mv, duration_ms)``.
    """

    def __init__(self, segments, dips=(), name="custom"):
        self.name = name
        self.segments = list(segments)
        self.dips = sorted(dips)
        self._starts = [s[0] for s in self.segments]
        self.end_ms = self.segments[-1][1] if self.segments else 0

    def __repr__(self):
        return f"Profile({self.name!r}, {len(self.segments)} segments, {self.end_ms} ms)"

    def demand_w(self, t_ms):
        """Demanded board power in W at ``t_ms`` (0 before 0 and after the end)."""
        i = bisect.bisect_right(self._starts, t_ms) - 1
        if i < 0:
            return 0.0
        t0, t1, kind, args = self.segments[i]
        if t_ms >= t1:
            return 0.0
        if kind == "linear":
            w0, w1 = args
            if w0 == w1:
                return w0
            return w0 + (w1 - w0) * (t_ms - t0) / (t1 - t0)
        w_on, on_ms, off_ms = args
        return w_on if (t_ms - t0) % (on_ms + off_ms) < on_ms else 0.0

    # ----------------------------------------------------------------- constructors

    @classmethod
    def builtin(cls, name):
        if name not in BUILTIN:
            raise ProfileError(
                f"no built-in profile {name!r}; built-in: {', '.join(sorted(BUILTIN))}"
            )
        return cls.parse(BUILTIN[name], name=name)

    @classmethod
    def get(cls, spec):
        """A ``Profile`` from a Profile, a built-in name, a path, or None (idle)."""
        if spec is None:
            return cls([], name="idle")
        if isinstance(spec, Profile):
            return spec
        if spec in BUILTIN:
            return cls.builtin(spec)
        try:
            with open(spec, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ProfileError(
                f"profile {spec!r} is neither a built-in ({', '.join(sorted(BUILTIN))}) "
                f"nor a readable file: {e.strerror or e}"
            ) from None
        return cls.parse(text, name=str(spec))

    @classmethod
    def parse(cls, text, name="custom"):
        segments, dips, t = [], [], 0
        for n, raw in enumerate(text.splitlines(), 1):
            words = raw.split("#", 1)[0].split()
            if not words:
                continue
            where = f"profile {name} line {n}"
            kind, args = words[0], words[1:]
            if kind == "idle" and len(args) == 1:
                d = _dur(args[0], where)
                segments.append((t, t + d, "linear", (0.0, 0.0)))
            elif kind == "hold" and len(args) == 2:
                w, d = _watts(args[0], where), _dur(args[1], where)
                segments.append((t, t + d, "linear", (w, w)))
            elif kind == "ramp" and len(args) == 3:
                w0, w1, d = _watts(args[0], where), _watts(args[1], where), _dur(args[2], where)
                segments.append((t, t + d, "linear", (w0, w1)))
            elif kind == "bursts" and len(args) == 3:
                w = _watts(args[0], where)
                on, slash, off = args[1].partition("/")
                if not slash:
                    raise ProfileError(f"{where}: bursts need <on>/<off>, got {args[1]!r}")
                segments.append(
                    (t, t + _dur(args[2], where), "bursts", (w, _dur(on, where), _dur(off, where)))
                )
            elif kind == "dip" and len(args) == 2:
                m = _MV.match(args[0])
                if not m:
                    raise ProfileError(f"{where}: dip depth like 800mV, got {args[0]!r}")
                dips.append((t, int(m.group(1)), _dur(args[1], where)))
                continue
            else:
                raise ProfileError(
                    f"{where}: cannot read {raw.strip()!r}; segments are `idle <dur>`, "
                    "`hold <P>W <dur>`, `ramp <P0>W <P1>W <dur>`, "
                    "`bursts <P>W <on>/<off> <dur>`, `dip <depth>mV <dur>`"
                )
            t = segments[-1][1]
        return cls(segments, dips, name=name)

    @classmethod
    def from_samples(cls, samples, name="samples"):
        """Piecewise-linear replay of ``[(t_ms, watts), ...]`` (t increasing)."""
        segs = []
        for (t0, w0), (t1, w1) in zip(samples, samples[1:], strict=False):
            if t1 <= t0:
                raise ProfileError(f"profile {name}: sample times must increase ({t0} -> {t1})")
            segs.append((int(t0), int(t1), "linear", (float(w0), float(w1))))
        return cls(segs, name=name)


def _dur(s, where):
    m = _DUR.match(s)
    if not m:
        raise ProfileError(f"{where}: duration like 30s, 500ms, 10min or 1h, got {s!r}")
    ms = float(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms != int(ms) or ms <= 0:
        raise ProfileError(f"{where}: duration must be a positive whole ms, got {s!r}")
    return int(ms)


def _watts(s, where):
    m = _POWER.match(s)
    if not m:
        raise ProfileError(f"{where}: power like 650W, got {s!r}")
    return float(m.group(1))
