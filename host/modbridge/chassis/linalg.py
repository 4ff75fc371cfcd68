"""Small dense least squares for the chassis fits (pure Python: the bridge needs no
numpy). Normal equations with exponential forgetting and a ridge toward zero."""

from __future__ import annotations

import math


class NormalEq:
    """Accumulated ``sum w x x^T`` and ``sum w x y`` of a linear model ``y = theta . x``
    with forgetting: each :meth:`add` weighs the old data ``forget`` times less. (Kept
    as growing weights on the new data, renormalised now and then: an add costs the
    outer product only.)"""

    def __init__(self, n: int, forget: float = 1.0):
        self.n = n
        self.forget = forget
        self.a = [[0.0] * n for _ in range(n)]
        self.b = [0.0] * n
        self._yy = 0.0
        self._w = 0.0
        self._gain = 1.0  # the weight of the next sample, in the sums' units

    def add(self, x, y: float) -> None:
        g = self._gain = self._gain / self.forget
        a, b, n = self.a, self.b, self.n
        for i in range(n):
            xi = x[i]
            if xi:
                gx = g * xi
                row = a[i]
                for j in range(i, n):
                    row[j] += gx * x[j]
                b[i] += gx * y
        self._yy += g * y * y
        self._w += g
        if g > 1e6:
            self._rescale()

    def _rescale(self) -> None:
        k = 1.0 / self._gain
        for row in self.a:
            for j in range(len(row)):
                row[j] *= k
        self.b = [v * k for v in self.b]
        self._yy *= k
        self._w *= k
        self._gain = 1.0

    @property
    def w(self) -> float:
        """The data's total weight (a new sample weighs 1)."""
        return self._w / self._gain

    def solve(self, ridge: float = 1e-6, prior=None):
        """theta minimising the squared error + ``ridge`` x diag x |theta - prior|^2
        (``ridge`` relative to each regressor's own scale), or None if singular."""
        n = self.n
        m = [[self.a[min(i, j)][max(i, j)] for j in range(n)] + [self.b[i]] for i in range(n)]
        floor = 1e-9 * (self._w + self._gain)
        for i in range(n):
            d = ridge * (m[i][i] + floor)
            m[i][i] += d
            if prior is not None:
                m[i][n] += d * prior[i]
        return solve(m)

    def solve_nonneg(self, free=(), ridge: float = 1e-6, sweeps: int = 300, start=None):
        """theta minimising the squared error (+ the ridge) with ``theta_i >= 0`` for
        every ``i`` not in ``free``: coordinate descent on the normal equations (the
        problem is convex), from ``start`` (the last solution: a refit a minute later
        needs a few sweeps) or zero."""
        n = self.n
        a = [[self.a[min(i, j)][max(i, j)] for j in range(n)] for i in range(n)]
        floor = 1e-9 * (self._w + self._gain)
        for i in range(n):
            a[i][i] += ridge * (a[i][i] + floor)
        if any(a[i][i] <= 0 for i in range(n)):
            return None
        theta = list(start) if start is not None and len(start) == n else [0.0] * n
        for _ in range(sweeps):
            moved = 0.0
            for j in range(n):
                row = a[j]
                r = self.b[j] - sum(row[k] * theta[k] for k in range(n) if k != j)
                v = r / row[j]
                if j not in free and v < 0.0:
                    v = 0.0
                moved = max(moved, abs(v - theta[j]))
                theta[j] = v
            if moved < 1e-9 * (1.0 + max(abs(v) for v in theta)):
                break
        return theta if all(math.isfinite(v) for v in theta) else None

    def sse(self, theta) -> float:
        """The (forgotten) sum of squared errors of ``theta``, new samples weighing 1."""
        n = self.n
        s = self._yy
        for i in range(n):
            s -= 2.0 * theta[i] * self.b[i]
            for j in range(n):
                s += theta[i] * theta[j] * self.a[min(i, j)][max(i, j)]
        return max(0.0, s) / self._gain


def solve(m):
    """Solve the augmented system ``m`` (n rows of n + 1) in place; None if singular."""
    n = len(m)
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        for r in range(col + 1, n):
            f = m[r][col] / p
            if f:
                row, top = m[r], m[col]
                for c in range(col, n + 1):
                    row[c] -= f * top[c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        s = m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))
        x[r] = s / m[r][r]
    if not all(math.isfinite(v) for v in x):
        return None
    return x


def percentile(values, q: float):
    """The ``q`` (0..1) quantile by nearest rank; None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))
    return s[k]
