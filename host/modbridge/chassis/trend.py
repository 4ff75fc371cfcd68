"""The cooling trend: the airflow conductance at the same duty, over days.

The learner hands :meth:`CoolingTrend.steady` a measurement whenever the module has
been steady for :data:`STEADY_S` (power, duty and die flat): the die's rise over the
ambient probe per watt, ``R = (die - a) / P`` (K/W), at the fans' duty. A chassis's
resistance is a fixed part (die to heatsink, the spreading) plus an airflow part
that goes as 1 / flow; the flow is the fans' summed RPM, so ``R = r0 + r1 phi`` with
``phi = 1000 / RPM`` (:func:`modbridge.chassis.dynamic.phi_of`). The baseline
(:data:`BASELINE_H` hours and :data:`BASELINE_MIN` steady measurements of a healthy
chassis: the bridge's first day with the module, a whole daily cycle of the room)
fits ``r0, r1`` by least squares and keeps each fan's RPM per duty.

Each later measurement gives the airflow conductance at the same duty, as a ratio to
the baseline's::

    q = r1 phi_base(duty) / (R - r0)

``phi_base(duty)`` is what the baseline's fans gave at that duty: dust (the same
RPM, less air) raises ``R``; a worn fan (less RPM at the same duty) raises ``R``
too. Every hour the medians of ``q`` and of each fan's RPM per duty become a point
of the persistent history (JSON, written atomically; :data:`KEEP_POINTS` points);
the current value is the median of the last :data:`CURRENT_POINTS` points' ``q``.

``cooling_degraded`` is raised when the conductance ratio falls to
:data:`DEGRADED_RATIO` (a 25 % drop at the same duty) or one fan's RPM per duty to
:data:`DEGRADED_RATIO` of its baseline; it is cleared when both are back above
:data:`CLEAR_RATIO`. The cause: ``fan_wear`` naming the fan whose RPM per duty fell
most if it fell below :data:`FAN_OK_RATIO` (its RPM is what changed: a worn
bearing, a failing fan), else ``dust`` (both fans turn as they did, the air does not
pass: a clogged filter or fin stack).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from modbridge.chassis.dynamic import phi_of
from modbridge.chassis.linalg import percentile

log = logging.getLogger(__name__)

HOUR_S = 3600.0
STEADY_S = 180.0
BASELINE_H = 24.0
BASELINE_MIN = 20  # steady measurements
MIN_PHI_SPREAD = 0.15  # relative spread of phi the r0/r1 split needs (else r0 = 0)
CURRENT_POINTS = 12
MIN_STEADY_PER_POINT = 3  # an hour with fewer steady measurements gives no q
KEEP_POINTS = 24 * 60
DEGRADED_RATIO = 0.75
CLEAR_RATIO = 0.85
FAN_OK_RATIO = 0.85
SLOPE_POINTS = 48
VERSION = 2


def _med(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return percentile(xs, 0.5) if xs else None


def fit_baseline(samples) -> tuple[float, float] | None:
    """``(r0, r1)`` of ``R = r0 + r1 phi`` from ``[(R, phi), ...]``: least squares when
    phi varies enough, with ``0 <= r0 <= min(R) * 0.9`` and ``r1 > 0``; r0 = 0 (the
    whole resistance counted as airflow: a late but never a false alarm) otherwise."""
    pts = [(r, p) for r, p in samples if r > 0 and p > 0]
    if not pts:
        return None
    ps = sorted(p for _, p in pts)
    r_min = min(r for r, _ in pts)
    lo, hi = percentile(ps, 0.1), percentile(ps, 0.9)
    r0 = 0.0
    if hi - lo >= MIN_PHI_SPREAD * hi:
        n = len(pts)
        mp = sum(p for _, p in pts) / n
        mr = sum(r for r, _ in pts) / n
        spp = sum((p - mp) ** 2 for _, p in pts)
        if spp > 0:
            slope = sum((p - mp) * (r - mr) for r, p in pts) / spp
            r0 = min(max(mr - slope * mp, 0.0), 0.9 * r_min)
    r1 = _med([(r - r0) / p for r, p in pts])
    if r1 is None or r1 <= 0:
        return None
    return r0, r1


class CoolingTrend:
    """See the module docstring. ``path``: the JSON file (None: in memory only)."""

    def __init__(self, path=None, fans: int = 2):
        self.path = Path(path) if path is not None else None
        self.fans = fans
        self.points: list[list] = []  # [t_s, q, k_fan1, k_fan2]
        self.baseline: dict | None = None  # r0, r1, k (RPM per full duty per fan)
        self.degraded = False
        self.cause: str | None = None
        self.fan: int | None = None  # 1-based, with fan_wear
        self.raised_at: float | None = None
        self._t0: float | None = None
        self._hour: float | None = None
        self._base: list = []  # (R, phi) while the baseline is being learned
        self._base_k: list[list[float]] = [[] for _ in range(fans)]
        self._q: list[float] = []
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
            pts = []
            for p in doc.get("points", []):
                if isinstance(p, list) and len(p) == 2 + self.fans:
                    pts.append([None if v is None else float(v) for v in p])
            base = doc.get("baseline")
            if isinstance(base, dict):
                r0, r1 = float(base["r0"]), float(base["r1"])
                k = [None if v is None else float(v) for v in base["k"]][: self.fans]
                if math.isfinite(r0) and math.isfinite(r1) and r1 > 0 and r0 >= 0:
                    self.baseline = {"r0": r0, "r1": r1, "k": k + [None] * (self.fans - len(k))}
            self.points = pts[-KEEP_POINTS:]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            log.warning("cooling trend %s unreadable: starting afresh", self.path)
            self.points, self.baseline = [], None
        if self.baseline is not None:
            self._judge()

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
    def phi_base(self, duty: float) -> float | None:
        """phi the baseline's fans gave at ``duty`` (0..65535)."""
        ks = [k for k in (self.baseline or {}).get("k", []) if k]
        if not ks:
            return None
        return phi_of(sum(ks) * duty / 65535.0)

    def steady(self, t_s: float, r_kw: float, duty: float, rpm_sum: float, fan_k) -> None:
        """One steady measurement: ``r_kw`` = (die - a) / P at ``duty`` with the fans
        at ``rpm_sum`` (each fan's RPM per full duty ``fan_k``)."""
        for v in (t_s, r_kw, duty, rpm_sum):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return
        if r_kw <= 0 or not 0 < duty <= 65535:
            return
        if self._t0 is None:
            self._t0 = t_s
        if self.baseline is None:
            self._base.append((r_kw, phi_of(rpm_sum)))
            for i in range(self.fans):
                k = fan_k[i] if i < len(fan_k) else None
                if k:
                    self._base_k[i].append(k)
            if t_s - self._t0 >= BASELINE_H * HOUR_S and len(self._base) >= BASELINE_MIN:
                fit = fit_baseline(self._base)
                if fit is not None:
                    ks = [_med(k) for k in self._base_k]
                    self.baseline = {"r0": fit[0], "r1": fit[1], "k": ks}
                    self._hour = t_s
                    self.save()
            return
        phi = self.phi_base(duty)
        if phi is None or r_kw <= self.baseline["r0"]:
            return
        self._q.append(self.baseline["r1"] * phi / (r_kw - self.baseline["r0"]))

    def fans_sample(self, t_s: float, fan_k) -> None:
        """Once a minute: each fan's RPM per full duty (None: unknown); closes the hour."""
        if self.baseline is None:
            return
        for i in range(self.fans):
            k = fan_k[i] if i < len(fan_k) else None
            if k is not None and math.isfinite(k) and k > 0:
                self._k[i].append(k)
        if self._hour is None:
            self._hour = t_s
        if t_s - self._hour >= HOUR_S:
            self._hour = t_s
            self._close(t_s)

    def _close(self, t_s: float) -> None:
        q = _med(self._q) if len(self._q) >= MIN_STEADY_PER_POINT else None
        ks = [_med(k) for k in self._k]
        self._q, self._k = [], [[] for _ in range(self.fans)]
        if q is None and all(k is None for k in ks):
            return
        self.points.append([t_s, q, *ks])
        del self.points[:-KEEP_POINTS]
        self._judge()
        self.save()

    # -- verdicts ------------------------------------------------------------------
    def ratio(self) -> float | None:
        """The airflow conductance at the same duty, current over baseline."""
        if self.baseline is None:
            return None
        return _med([p[1] for p in self.points[-CURRENT_POINTS:]])

    def fan_ratios(self) -> list:
        """Each fan's RPM per duty, current over baseline (None: unknown)."""
        out = []
        for i in range(self.fans):
            base = self.baseline["k"][i] if self.baseline else None
            cur = _med([p[2 + i] for p in self.points[-CURRENT_POINTS:]])
            out.append(cur / base if base and cur is not None else None)
        return out

    def slope_per_day(self) -> float | None:
        """The conductance ratio's trend (per day) over the last SLOPE_POINTS points."""
        pts = [(p[0], p[1]) for p in self.points[-SLOPE_POINTS:] if p[1] is not None]
        if len(pts) < 12:
            return None
        n = len(pts)
        mt = sum(t for t, _ in pts) / n
        mr = sum(r for _, r in pts) / n
        stt = sum((t - mt) ** 2 for t, _ in pts)
        if stt <= 0:
            return None
        return sum((t - mt) * (r - mr) for t, r in pts) / stt * 86400.0

    def _judge(self) -> None:
        if len(self.points) < CURRENT_POINTS:
            return  # too few points since the baseline for a verdict
        r = self.ratio()
        worst_fan, worst = None, None
        for i, x in enumerate(self.fan_ratios()):
            if x is not None and (worst is None or x < worst):
                worst, worst_fan = x, i + 1
        low_g = r is not None and r <= DEGRADED_RATIO
        low_fan = worst is not None and worst <= DEGRADED_RATIO
        if not self.degraded and (low_g or low_fan):
            self.degraded = True
            self.raised_at = self.points[-1][0] if self.points else None
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
