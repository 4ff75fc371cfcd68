"""The module's probe -> die estimate, exactly as the firmware evaluates it.

The design of issue 25 fixes the formula (integer fixed point, per tick)::

    g_slow += (g - g_slow) * dt // (4000 + dt)            # a 4 s first-order filter
    g_lead  = g + lead_ms * (g - g_slow) // 4000          # probe lag compensation
    est     = g_lead + (ga_q12 * (g_lead - a) >> 12)
                     + (rp_mcw + rpd_mcw * (65535 - d) // 65535) * p // 1000
                     + off_mc
    est_safe = est + unc_mc

``g`` the GPU NTC and ``a`` the ambient NTC (m degC), ``p`` the INA226's input power
(mW), ``d`` the fan duty (0..65535, the higher fan). Python's ``//`` and ``>>`` floor
like MicroPython's small ints, so this copy gives the module's numbers bit for bit.
The parameters travel as the config section ``model`` (:data:`BOUNDS`); the bridge
clamps them (:func:`clamp`) before it sends them.
"""

from __future__ import annotations

import math

from device.cfg import schema as _schema

FILTER_MS = 4000  # g_slow's time constant
DUTY_FULL = 65535


def _model_bounds() -> dict:
    """key -> (low, high) of the config section ``model``, read from the firmware's
    schema (device/cfg/schema.py), with ``slow_mc``'s rule: 0 or at least
    ``_MODEL_SLOW_MIN_MC``."""
    root = dict(_schema.SCHEMA[1])
    out = {k: (spec[1], spec[2]) for k, spec in root["model"][1]}
    out["slow_mc"] = (_schema._MODEL_SLOW_MIN_MC, out["slow_mc"][1])  # or 0: not known
    return out


# key -> (low, high): the firmware's config schema for the section ``model``.
BOUNDS = _model_bounds()
KEYS = tuple(BOUNDS)
NONE = dict(_schema.defaults()["model"])  # the factory's: no model


def _int(v, default):
    """``v`` as an int (rounded), ``default`` for None, NaN, inf, bools and non-numbers."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return default
    if isinstance(v, float):
        if not math.isfinite(v):
            return default
        return int(round(v))
    return v


def clamp(params) -> dict:
    """Every key of :data:`BOUNDS` as an in-bounds int. Missing or unusable values take
    the "no model" value (:data:`NONE`); ``slow_mc`` out of 60000..100000 becomes 0."""
    src = params if isinstance(params, dict) else {}
    out = {}
    for key, (lo, hi) in BOUNDS.items():
        v = _int(src.get(key), NONE[key])
        if key == "slow_mc" and not lo <= v <= hi:
            v = 0
        out[key] = lo if v < lo and key != "slow_mc" else hi if v > hi else v
    return out


def config_fields(params) -> dict:
    """``{"model.<key>": int}``: what the bridge sends with ``config_set``."""
    return {"model." + k: v for k, v in clamp(params).items()}


def lead(g, g_slow, lead_ms):
    """``g_lead`` of the formula."""
    return g + lead_ms * (g - g_slow) // FILTER_MS


def estimate(params, g, g_slow, a, p, d) -> int:
    """``est`` (m degC) for clamped ``params`` and the filter state ``g_slow``."""
    gl = g + params["lead_ms"] * (g - g_slow) // FILTER_MS
    r = params["rp_mcw"] + params["rpd_mcw"] * (DUTY_FULL - d) // DUTY_FULL
    return gl + (params["ga_q12"] * (gl - a) >> 12) + r * p // 1000 + params["off_mc"]


class Evaluator:
    """The per-tick evaluation with its filter state: ``step(g, a, p, d, dt_ms)`` ->
    ``est_safe`` (m degC), or None without a model (``ok`` 0)."""

    def __init__(self, params):
        self.params = clamp(params)
        self.g_slow = None

    def step(self, g, a, p, d, dt_ms):
        if self.g_slow is None:
            self.g_slow = g
        else:
            self.g_slow += (g - self.g_slow) * dt_ms // (FILTER_MS + dt_ms)
        if not self.params["ok"]:
            return None
        return estimate(self.params, g, self.g_slow, a, p, d) + self.params["unc_mc"]
