"""The chassis model's benchmark over every VAL chassis (``make soak``; the default set's
bench_model runs a subset of the days-long parts): keys ``model_long_*``.

    python -m bench.run model_long
"""

from __future__ import annotations

from bench import bench_model


def run() -> dict:
    res = bench_model.measure("val", bench_model.LONG_N, prefix="model_long_")
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items()}
