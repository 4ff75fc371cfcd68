"""The policy's windowed computations are the textbook ones, bit for bit.

The cross-check (:class:`SensorCrossCheck`) and the early warning's slope
(:class:`EarlyWarning`) keep running state instead of walking their histories every
tick (a tick evaluates them for every pair): monotonic deques for a window's
extremes, exact integer sums of the readings rounded to micro-units (and times to
ns) for its means and its least-squares slope. These tests hold them equal, value
for value and float for float, to the straightforward form (kept here as the
reference: lists built from the history every evaluation, every range computed,
the means and the centred least-squares sums in exact :class:`~fractions.Fraction`
arithmetic over the same rounded readings, then rounded once), over random reading
sequences. :func:`lsq_slope` (float points of any size) is held to the textbook
float sums.
"""

from __future__ import annotations

import random
from collections import deque
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from modbridge.policy.config import PolicyConfig
from modbridge.policy.crosscheck import (
    CROSSCHECK_FROZEN_C,
    CROSSCHECK_GAP_S,
    CROSSCHECK_LOAD_CHANGE_W,
    CROSSCHECK_MAX_DT_S,
    CROSSCHECK_MOVING_C,
    CROSSCHECK_STEADY_C,
    CROSSCHECK_STEADY_FRACTION,
    CROSSCHECK_STEADY_W,
    SensorCrossCheck,
)
from modbridge.policy.early import MICRO, NS_PER_S, EarlyWarning, lsq_slope, time_to_threshold


def reference_slope(points):
    pts = list(points)
    n = len(pts)
    if n < 2:
        return None
    mt = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    stt = sum((p[0] - mt) ** 2 for p in pts)
    if stt <= 0.0:
        return None
    return sum((p[0] - mt) * (p[1] - my) for p in pts) / stt


def exact_slope(points):
    """The least-squares slope (degC/s) of ``(t s, y degC)`` points rounded to ns and
    micro-degC, in exact arithmetic (centred sums), rounded once; None as lsq_slope."""
    pts = [(round(t * NS_PER_S), round(y * MICRO)) for t, y in points]
    n = len(pts)
    if n < 2:
        return None
    mt = Fraction(sum(t for t, _ in pts), n)
    my = Fraction(sum(y for _, y in pts), n)
    stt = sum((t - mt) ** 2 for t, _ in pts)
    if stt <= 0:
        return None
    return float(sum((t - mt) * (y - my) for t, y in pts) / stt * (NS_PER_S // MICRO))


def exact_mean(xs) -> float:
    """The mean of ``xs`` rounded to micro-units, exact, then rounded once."""
    xs = list(xs)
    return float(Fraction(sum(xs), len(xs) * MICRO))


def micro(x: float) -> int:
    return round(x * MICRO)


class ReferenceEarly:
    def __init__(self, window_s):
        self.window_s = window_s
        self.h = deque()

    def observe(self, now, gpu_c):
        h = self.h
        if h and now < h[-1][0]:
            h.clear()
        h.append((now, gpu_c))
        while h and h[0][0] < now - self.window_s:
            h.popleft()

    def estimate_eta(self, current_c, threshold_c):
        pts = self.h
        if len(pts) < 3 or pts[-1][0] - pts[0][0] < self.window_s / 2:
            return None, None
        slope = exact_slope(pts)
        return time_to_threshold(current_c, threshold_c, slope), slope


class ReferenceCrossCheck(SensorCrossCheck):
    """The cross-check's update as it was written first (lists every evaluation),
    its means in exact arithmetic over the readings rounded to micro-units."""

    def update(  # noqa: C901 - the reference, kept whole
        self, now: float, ntc_c: float | None, gpu_c: float | None, power_w: float | None, values
    ) -> str | None:
        cfg = self.config
        if ntc_c is None or gpu_c is None or power_w is None:
            self.reset()
            return None
        h = self._hist
        if self._last_t is not None and (
            now < self._last_t or now - self._last_t > CROSSCHECK_GAP_S
        ):
            self.reset()
        dt = 0.0 if self._last_t is None else min(now - self._last_t, CROSSCHECK_MAX_DT_S)
        self._last_t = now
        h.append((now, gpu_c, ntc_c, power_w))
        while h[0][0] < now - cfg.disagree_window_s:
            h.popleft()
        diff = ntc_c - gpu_c
        values["disagree_c"] = round(diff, 3)
        # gross: no model at all
        self._gross_s = self._gross_s + dt if abs(diff) > cfg.disagree_gross_c else 0.0
        full = now - h[0][0] >= 0.9 * cfg.disagree_window_s
        kind = None
        if full:
            gpus = [x[1] for x in h]
            ntcs = [x[2] for x in h]
            watts = [x[3] for x in h]
            r_gpu, r_ntc = max(gpus) - min(gpus), max(ntcs) - min(ntcs)
            # frozen: one still for the whole window, the other still moving in its
            # second half (a lagging sensor settling after a step has slowed by then)
            half = now - cfg.disagree_window_s / 2
            late = [x for x in h if x[0] >= half]
            m_gpu = max(x[1] for x in late) - min(x[1] for x in late)
            m_ntc = max(x[2] for x in late) - min(x[2] for x in late)
            if self._frozen == "ntc" and r_ntc >= CROSSCHECK_MOVING_C:
                self._frozen = None
            elif self._frozen == "gpu" and r_gpu >= CROSSCHECK_MOVING_C:
                self._frozen = None
            loaded = max(watts) - min(watts) >= CROSSCHECK_LOAD_CHANGE_W  # a cause to move
            if loaded and r_ntc < CROSSCHECK_FROZEN_C and m_gpu >= cfg.disagree_stuck_c:
                self._frozen = "ntc"
            elif loaded and r_gpu < CROSSCHECK_FROZEN_C and m_ntc >= cfg.disagree_stuck_c:
                self._frozen = "gpu"
            # steady: learn, and compare with what was learned
            mean_w = exact_mean(micro(w) for w in watts)
            steady = r_gpu <= CROSSCHECK_STEADY_C and max(watts) - min(watts) <= max(
                CROSSCHECK_STEADY_W, CROSSCHECK_STEADY_FRACTION * mean_w
            )
            values["disagree_steady"] = steady
            if steady:
                mean_d = exact_mean(micro(n) - micro(g) for _, g, n, _ in h)
                b = self._bins.setdefault(int(mean_w // cfg.disagree_bin_w), [mean_d, 0.0])
                trusted = b[1] >= cfg.disagree_learn_s
                residual = mean_d - b[0]
                if trusted:
                    values["disagree_expected_c"] = round(b[0], 3)
                    values["disagree_residual_c"] = round(residual, 3)
                    if abs(residual) > cfg.disagree_margin_c:
                        self._over_s += dt
                    elif abs(residual) <= cfg.disagree_margin_c / 2:
                        self._over_s = 0.0
                if self._over_s == 0.0 and (
                    not trusted or abs(residual) <= cfg.disagree_margin_c / 2
                ):
                    b[1] += dt
                    alpha = max(dt / cfg.disagree_learn_tau_s, dt / b[1]) if b[1] > 0 else 1.0
                    b[0] += min(alpha, 1.0) * (mean_d - b[0])
        if self._frozen is not None:
            kind = self._frozen + "_frozen"
        elif self._over_s >= cfg.disagree_time_s:
            kind = "offset"
        elif self._gross_s >= cfg.disagree_time_s:
            kind = "gross"
        if self._over_s:
            values["disagree_for_s"] = round(self._over_s, 3)
        elif self._gross_s:
            values["disagree_for_s"] = round(self._gross_s, 3)
        if kind is not None:
            values["disagree_kind"] = kind
        return kind


floats = st.floats(-1e6, 1e6, allow_nan=False)


def readings(seed: int, n: int):
    """``n`` (dt, ntc, gpu, watts) readings in regimes a pair goes through: steady
    at some power, a load step, one sensor frozen while the other moves, drifting,
    gaps, missing readings, time going back."""
    rng = random.Random(seed)
    ntc, gpu, w = 40.0, 45.0, 300.0
    regime, left = "steady", 0
    for _ in range(n):
        if left <= 0:
            regime = rng.choice(["steady", "steady", "step", "ntc_frozen", "gpu_frozen",
                                 "drift", "noise", "gap", "missing"])  # fmt: skip
            left = rng.randint(5, 200)
            if regime == "step":
                w = rng.choice([100.0, 250.0, 400.0, 650.0, rng.uniform(0, 800)])
        left -= 1
        dt = rng.choice([0.5, 0.5, 0.5, 0.25, 0.0, rng.uniform(0, 2)])
        if regime == "gap" and rng.random() < 0.05:
            dt = rng.choice([12.0, -1.0])
        rise = rng.uniform(-0.3, 0.3)
        if regime == "steady":
            gpu += rng.choice([0.0, 0.0, 0.125, -0.125])
            ntc = gpu - 5.0 + rng.choice([0.0, 0.0625])
        elif regime in ("step", "drift", "noise"):
            gpu += rise
            ntc += rise + (0.05 if regime == "drift" else rng.uniform(-0.5, 0.5))
            w += rng.uniform(-30, 30)
        elif regime == "ntc_frozen":
            gpu += abs(rise)
            w += 5.0
        elif regime == "gpu_frozen":
            ntc += abs(rise)
            w += 5.0
        if regime == "missing" and rng.random() < 0.2:
            yield dt, None if rng.random() < 0.5 else ntc, gpu, None
            continue
        yield dt, ntc, gpu, w


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.tuples(floats, floats), max_size=150))
def test_lsq_slope_is_the_textbook_sum(points):
    assert lsq_slope(points) == reference_slope(points) or (
        lsq_slope(points) != lsq_slope(points)  # nan == nan
    )


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(st.tuples(st.floats(-1.0, 3.0), st.floats(20.0, 100.0)), max_size=400),
    st.sampled_from([2.0, 20.0, 60.0]),
)
def test_early_warning_history_and_slope_as_the_reference(points, window_s):
    got, want = EarlyWarning(window_s, 300.0), ReferenceEarly(window_s)
    now = 1000.0
    for dt, c in points:
        now += dt
        got.observe(now, c)
        want.observe(now, c)
        assert got.estimate_eta(c, 83.0) == want.estimate_eta(c, 83.0)


@settings(max_examples=60, deadline=None, database=None)
@given(
    st.integers(0, 2**32),
    st.integers(50, 800),
    st.sampled_from([5.0, 20.0, 60.0]),
    st.sampled_from([1.0, 60.0]),
)
def test_crosscheck_as_the_reference(seed, n, window_s, learn_s):
    cfg = PolicyConfig(disagree_window_s=window_s, disagree_learn_s=learn_s,
                       disagree_time_s=5.0, disagree_stuck_c=1.0)  # fmt: skip
    got, want = SensorCrossCheck(cfg), ReferenceCrossCheck(cfg)
    now = 500.0
    for dt, ntc, gpu, w in readings(seed, n):
        now += dt
        v_got, v_want = {}, {}
        assert got.update(now, ntc, gpu, w, v_got) == want.update(now, ntc, gpu, w, v_want)
        assert v_got == v_want
        assert got._bins == want._bins
        assert (got._over_s, got._gross_s, got._frozen) == (
            want._over_s, want._gross_s, want._frozen)  # fmt: skip


def test_the_crosscheck_reference_cases_reach_every_rule():
    """The sequences above reach a full window, steady learning, a trusted bin, every
    kind that fires, and a frozen sensor clearing (else the equality says little)."""
    seen = set()
    for seed in range(40):
        cfg = PolicyConfig(disagree_window_s=20.0, disagree_learn_s=1.0, disagree_time_s=5.0,
                           disagree_stuck_c=1.0)  # fmt: skip
        cc, now, prev = SensorCrossCheck(cfg), 500.0, None
        for dt, ntc, gpu, w in readings(seed, 800):
            now += dt
            values = {}
            kind = cc.update(now, ntc, gpu, w, values)
            seen.add(kind)
            seen.update(k for k in ("disagree_steady", "disagree_expected_c") if values.get(k))
            if prev in ("ntc_frozen", "gpu_frozen") and kind != prev:
                seen.add("unfrozen")
            prev = kind
    assert {"ntc_frozen", "gpu_frozen", "offset", "gross", "unfrozen", "disagree_steady",
            "disagree_expected_c", None} <= seen, seen  # fmt: skip


@settings(max_examples=100, deadline=None, database=None)
@given(st.integers(0, 2**32), st.integers(3, 600), st.sampled_from([2.0, 20.0, 60.0]))
def test_early_warning_on_pair_like_histories(seed, n, window_s):
    got, want = EarlyWarning(window_s, 300.0), ReferenceEarly(window_s)
    now = 1000.0
    for dt, _ntc, gpu, _w in readings(seed, n):
        now += dt
        got.observe(now, gpu)
        want.observe(now, gpu)
        assert got.estimate_eta(gpu, 83.0) == want.estimate_eta(gpu, 83.0)
