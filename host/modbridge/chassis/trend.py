"""The cooling trend: the learned airflow conductance at the same duty, over days.

Once a minute the learner hands :meth:`CoolingTrend.sample` the dynamic model's
airflow conductance at the reference duty (:data:`REF_DUTY`, the fans at their
current RPM per duty) and each fan's RPM per duty; every hour the medians become a
point of the persistent history (JSON, written atomically, :data:`KEEP_POINTS`
points). The first :data:`BASELINE_POINTS` hourly points make the baseline (a
healthy, clean chassis: the bridge's first half day with the module); the current
value is the median of the last :data:`CURRENT_POINTS`.

``cooling_degraded`` (:meth:`CoolingTrend.state`) is raised when

* the conductance ratio (current / baseline) falls to :data:`DEGRADED_RATIO` (a 25 %
  drop at the same duty), or
* one fan's RPM per duty falls to :data:`DEGRADED_RATIO` of its baseline,

and cleared when both are back above :data:`CLEAR_RATIO`. The cause: ``fan_wear``
naming the fan whose RPM per duty fell most if it fell below :data:`FAN_OK_RATIO`
(its RPM is what changed: a worn bearing, a failing fan), else ``dust`` (both fans
turn as they did, the air does not pass: a clogged filter or fin stack).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from modbridge.chassis.linalg import percentile

log = logging.getLogger(__name__)

REF_DUTY = 0.6 * 65535
HOUR_S = 3600.0
BASELINE_POINTS = 12
CURRENT_POINTS = 6
KEEP_POINTS = 24 * 60
DEGRADED_RATIO = 0.75
CLEAR_RATIO = 0.85
FAN_OK_RATIO = 0.85
MIN_SAMPLES_PER_POINT = 20  # minutes with a conductance in an hour
SLOPE_POINTS = 48
VERSION = 1


def _med(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return percentile(xs, 0.5) if xs else None


class CoolingTrend:
    """See the module docstring. ``path``: the JSON file (None: in memory only)."""

    def __init__(self, path=None, fans: int = 2):
        self.path = Path(path) if path is not None else None
        self.fans = fans
        self.points: list[list] = []  # [t_s, conductance, k_fan1, k_fan2]
        self.baseline: dict | None = None
        self.degraded = False
        self.cause: str | None = None
        self.fan: int | None = None  # 1-based, with fan_wear
        self.raised_at: float | None = None
        self._hour: float | None = None
        self._g: list[float] = []
        self._k: list[list[float]] = [[] for _ in range(fans)]
        self.load()

    # -- persistence ---------------------------------------------------------------
    def load(self) -> None:
        if self.path is None or not self.path.is_file():
            return
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            if doc.get("version") != VERSION:
                return
            pts = [
                [float(v) if v is not None else None for v in p]
                for p in doc.get("points", [])
                if isinstance(p, list) and len(p) == 2 + self.fans
            ]
            self.points = pts[-KEEP_POINTS:]
            base = doc.get("baseline")
            if isinstance(base, dict):
                self.baseline = {"g": base.get("g"), "k": list(base.get("k", []))}
        except (OSError, ValueError, TypeError, AttributeError):
            log.warning("cooling trend %s unreadable: starting afresh", self.path)
            self.points, self.baseline = [], None

    def save(self) -> None:
        if self.path is None:
            return
        doc = {"version": VERSION, "points": self.points, "baseline": self.baseline}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot write the cooling trend %s: %s", self.path, e)

    # -- data ----------------------------------------------------------------------
    def sample(self, t_s: float, conductance, fan_k) -> bool:
        """One minute's values; True when an hourly point was added."""
        if self._hour is None:
            self._hour = t_s
        added = False
        if t_s - self._hour >= HOUR_S:
            added = self._close(self._hour + HOUR_S)
            self._hour = t_s
        if conductance is not None and math.isfinite(conductance) and conductance > 0:
            self._g.append(conductance)
        for i in range(self.fans):
            k = fan_k[i] if i < len(fan_k) else None
            if k is not None and math.isfinite(k) and k > 0:
                self._k[i].append(k)
        return added

    def _close(self, t_s: float) -> bool:
        g = _med(self._g) if len(self._g) >= MIN_SAMPLES_PER_POINT else None
        ks = [_med(k) for k in self._k]
        self._g, self._k = [], [[] for _ in range(self.fans)]
        if g is None and all(k is None for k in ks):
            return False
        self.points.append([t_s, g, *ks])
        del self.points[:-KEEP_POINTS]
        if self.baseline is None:
            self._try_baseline()
        self._judge(t_s)
        self.save()
        return True

    def _try_baseline(self) -> None:
        gs = [p[1] for p in self.points if p[1] is not None]
        if len(gs) < BASELINE_POINTS:
            return
        first = gs[:BASELINE_POINTS]
        ks = [_med([p[2 + i] for p in self.points[:BASELINE_POINTS]]) for i in range(self.fans)]
        self.baseline = {"g": _med(first), "k": ks}

    # -- verdicts ------------------------------------------------------------------
    def ratio(self) -> float | None:
        """The conductance at the same duty, current over baseline."""
        if not self.baseline or not self.baseline.get("g"):
            return None
        cur = _med([p[1] for p in self.points[-CURRENT_POINTS:]])
        return None if cur is None else cur / self.baseline["g"]

    def fan_ratios(self) -> list:
        """Each fan's RPM per duty, current over baseline (None: unknown)."""
        out = []
        for i in range(self.fans):
            base = self.baseline["k"][i] if self.baseline and i < len(self.baseline["k"]) else None
            cur = _med([p[2 + i] for p in self.points[-CURRENT_POINTS:]])
            out.append(cur / base if base and cur is not None else None)
        return out

    def slope_per_day(self) -> float | None:
        """The conductance ratio's trend (per day) over the last SLOPE_POINTS points."""
        if not self.baseline or not self.baseline.get("g"):
            return None
        pts = [(p[0], p[1] / self.baseline["g"]) for p in self.points[-SLOPE_POINTS:]
               if p[1] is not None]  # fmt: skip
        if len(pts) < 12:
            return None
        n = len(pts)
        mt = sum(t for t, _ in pts) / n
        mr = sum(r for _, r in pts) / n
        stt = sum((t - mt) ** 2 for t, _ in pts)
        if stt <= 0:
            return None
        return sum((t - mt) * (r - mr) for t, r in pts) / stt * 86400.0

    def _judge(self, t_s: float) -> None:
        r = self.ratio()
        fr = self.fan_ratios()
        worst_fan = None
        worst = None
        for i, x in enumerate(fr):
            if x is not None and (worst is None or x < worst):
                worst, worst_fan = x, i + 1
        low_g = r is not None and r <= DEGRADED_RATIO
        low_fan = worst is not None and worst <= DEGRADED_RATIO
        if not self.degraded and (low_g or low_fan):
            self.degraded = True
            self.raised_at = t_s
        elif self.degraded:
            ok_g = r is None or r >= CLEAR_RATIO
            ok_fan = worst is None or worst >= CLEAR_RATIO
            if ok_g and ok_fan:
                self.degraded, self.raised_at = False, None
        if self.degraded:
            if worst is not None and worst < FAN_OK_RATIO:
                self.cause, self.fan = "fan_wear", worst_fan
            else:
                self.cause, self.fan = "dust", None
        else:
            self.cause, self.fan = None, None
