"""The cross-check of the module's GPU NTC against the GPU's own temperature.

A learned offset per power bin, not a fixed margin: see :class:`SensorCrossCheck` and
docs/policy.md, "Cross-check".
"""

from __future__ import annotations

from collections import deque

from modbridge.policy.config import PolicyConfig
from modbridge.policy.early import MICRO  # the window's sums: readings in micro-units

# Fixed parts of the cross-check (the tunable ones are PolicyConfig.disagree_*).
CROSSCHECK_GAP_S = 10.0  # a gap this long in the readings restarts the window
CROSSCHECK_STEADY_C = 2.0  # steady: the GPU temperature moved at most this over the window
CROSSCHECK_STEADY_W = 25.0  # ... and the power at most this (or 5 % of it, the larger)
CROSSCHECK_STEADY_FRACTION = 0.05
CROSSCHECK_FROZEN_C = 0.05  # "frozen": a reading that moved less than this over the window
CROSSCHECK_MOVING_C = 0.5  # a frozen reading counts again once it moves this much
CROSSCHECK_LOAD_CHANGE_W = 50.0  # "frozen" needs the power to have changed this much
CROSSCHECK_MAX_DT_S = 5.0  # one evaluation counts for at most this long


class SensorCrossCheck:
    """Does the module's GPU NTC agree with the GPU's own temperature? (docs/policy.md)

    The NTC sits on the package or heatsink base, not in the die: a healthy one reads
    below the GPU by an offset that grows with power (6.4 degC at 650 W in the default
    world). So the check learns that offset instead of assuming it:

    * **learned offset**: per bin of GPU power (``disagree_bin_w``), the mean of
      ``NTC - GPU`` over the window while the pair is *steady* (GPU temperature within
      2 degC and power within 25 W / 5 % over ``disagree_window_s``), a running mean
      for the first ``disagree_learn_s`` of steady time, then an EWMA with time
      constant ``disagree_learn_tau_s``. Learning pauses while the residual is above
      half the margin, so a drifting sensor is not learned away.
    * **offset**: steady, in a learned bin, ``|mean(NTC - GPU) - learned|`` above
      ``disagree_margin_c`` for ``disagree_time_s`` of steady time (transients pause
      the count, agreement within half the margin resets it).
    * **frozen**: over a full window one reading moved less than 0.05 degC while the
      other moved at least ``disagree_stuck_c`` within the window's second half and
      the power changed by 50 W or more (a cause for both to move): that sensor is
      frozen (at once; it clears when the frozen one moves 0.5 degC again).
    * **gross**: ``|NTC - GPU|`` above ``disagree_gross_c`` for ``disagree_time_s``,
      learned or not.

    :meth:`update` returns the kind that fires (``"offset"``, ``"ntc_frozen"``,
    ``"gpu_frozen"``, ``"gross"``) or None, and fills ``values``.
    """

    def __init__(self, config: PolicyConfig):
        self.config = config
        # the window: (t, gpu, ntc, W, W in micro-W, NTC - GPU in micro-degC)
        self._hist: deque[tuple[float, float, float, float, int, int]] = deque()
        # its extremes, each a monotonic deque of (t, value): the front is the max
        # (or min) of the window, appends drop what can no longer be one
        self._ext = tuple(deque() for _ in range(6))  # gpu, ntc, W: max, min
        self._sum_w = 0  # exact sums of the window's rounded watts and NTC - GPU
        self._sum_d = 0
        self._bins: dict[int, list[float]] = {}  # bin -> [offset (NTC - GPU), steady s]
        self._over_s = 0.0  # steady time with the residual above the margin
        self._gross_s = 0.0
        self._frozen: str | None = None  # "ntc" / "gpu" while one is latched frozen
        self._last_t: float | None = None

    def reset(self) -> None:
        """Forget the window (a reading is missing): the learned offsets stay."""
        self._hist.clear()
        for d in self._ext:
            d.clear()
        self._sum_w = self._sum_d = 0
        self._over_s = self._gross_s = 0.0
        self._frozen = None
        self._last_t = None

    def _push(self, now: float, gpu_c: float, ntc_c: float, power_w: float) -> None:
        """A reading into the window, the readings older than the window out."""
        wq = round(power_w * MICRO)
        dq = round(ntc_c * MICRO) - round(gpu_c * MICRO)
        self._hist.append((now, gpu_c, ntc_c, power_w, wq, dq))
        self._sum_w += wq
        self._sum_d += dq
        ext = self._ext
        _extremes_push(ext[0], ext[1], now, gpu_c)
        _extremes_push(ext[2], ext[3], now, ntc_c)
        _extremes_push(ext[4], ext[5], now, power_w)
        start = now - self.config.disagree_window_s
        h = self._hist
        while h[0][0] < start:
            x = h.popleft()
            self._sum_w -= x[4]
            self._sum_d -= x[5]
        for d in self._ext:
            while d[0][0] < start:
                d.popleft()

    def learned(self) -> dict[float, float]:
        """Trusted offsets (NTC - GPU, degC) by the lower edge of their power bin (W)."""
        w = self.config.disagree_bin_w
        lim = self.config.disagree_learn_s
        return {b * w: v for b, (v, s) in sorted(self._bins.items()) if s >= lim}

    def update(
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
        self._push(now, gpu_c, ntc_c, power_w)
        diff = ntc_c - gpu_c
        values["disagree_c"] = round(diff, 3)
        # gross: no model at all
        self._gross_s = self._gross_s + dt if abs(diff) > cfg.disagree_gross_c else 0.0
        full = now - h[0][0] >= 0.9 * cfg.disagree_window_s
        kind = None
        if full:
            ext = self._ext
            r_gpu = ext[0][0][1] - ext[1][0][1]
            r_ntc = ext[2][0][1] - ext[3][0][1]
            if self._frozen == "ntc" and r_ntc >= CROSSCHECK_MOVING_C:
                self._frozen = None
            elif self._frozen == "gpu" and r_gpu >= CROSSCHECK_MOVING_C:
                self._frozen = None
            r_w = ext[4][0][1] - ext[5][0][1]
            loaded = r_w >= CROSSCHECK_LOAD_CHANGE_W  # a cause to move
            # frozen: one still for the whole window, the other still moving in its
            # second half (a lagging sensor settling after a step has slowed by then);
            # that movement is looked at only when the rest of the rule holds
            if (
                loaded
                and r_ntc < CROSSCHECK_FROZEN_C
                and _late_range(h, now, cfg, 1) >= (cfg.disagree_stuck_c)
            ):
                self._frozen = "ntc"
            elif (
                loaded
                and r_gpu < CROSSCHECK_FROZEN_C
                and _late_range(h, now, cfg, 2) >= (cfg.disagree_stuck_c)
            ):
                self._frozen = "gpu"
            # steady: learn, and compare with what was learned
            n = len(h) * MICRO
            mean_w = self._sum_w / n
            steady = r_gpu <= CROSSCHECK_STEADY_C and r_w <= max(
                CROSSCHECK_STEADY_W, CROSSCHECK_STEADY_FRACTION * mean_w
            )
            values["disagree_steady"] = steady
            if steady:
                mean_d = self._sum_d / n
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


def _extremes_push(top: deque, bottom: deque, t: float, v: float) -> None:
    """Reading ``v`` at ``t`` into a window's monotonic max (``top``) and min
    (``bottom``) deques: what it makes unable to be an extreme any more is dropped."""
    while top and top[-1][1] <= v:
        top.pop()
    while bottom and bottom[-1][1] >= v:
        bottom.pop()
    x = (t, v)
    top.append(x)
    bottom.append(x)


def _late_range(h, now: float, cfg: PolicyConfig, i: int) -> float:
    """max - min of reading ``i`` (1: GPU, 2: NTC) over the second half of the window."""
    half = now - cfg.disagree_window_s / 2
    late = [x[i] for x in h if x[0] >= half]
    return max(late) - min(late)
