"""The chassis model the bridge learned, evaluated on the module: an estimate of the
GPU die from the probes, for standalone control and alarms (issue 25).

    s = new()                          # the model's one array('i'), allocated once
    load(s, cfg["model"])              # configuring only (the config section ``model``)
    est_safe = update(s, g, a, p, d, dt)   # per tick, when s[0] (model.ok); no allocation

The bridge fits the parameters (host/modbridge, docs/control.md "The chassis model") and
sends them with ``config_set``; the firmware's schema bounds every one
(device/cfg/schema.py). The evaluation, exactly (``//`` and ``>>`` floor, as in Python):

    g_slow += (g - g_slow) * dt // (4000 + dt)          # a 4 s first-order filter
    g_lead  = g + lead_ms * (g - g_slow) // 4000          # probe-lag compensation
    est     = g_lead + (ga_q12 * (g_lead - a) >> 12)
                     + (rp_mcw + rpd_mcw * (65535 - d) // 65535) * p // 1000
                     + off_mc
    est_safe = est + unc_mc                              # what control and alarms use

``g`` the GPU NTC and ``a`` the ambient NTC (m degC), ``p`` the INA226's input power
(mW), ``d`` the higher fan duty (0..65535), ``dt`` the tick (ms). The first sample
after ``load`` or an invalid input starts the filter at ``g`` (no lead yet).

Ranges (every intermediate a small int on a 32-bit port, |x| < 2**30; tests/
test_chassis.py drives the extremes through tests/intcheck.py): ``g`` and ``a`` are
clamped to +-2**17 m degC (131 degC, past every critical limit), ``p`` to 0..2**22 mW,
``d`` to 0..65535, ``dt`` to 1..1000 ms; so |g - g_slow| < 2**18 and the filter's
product < 2**28. The two products that could pass 2**30 are split exactly:
``lead_ms * x // 4000`` as ``lead_ms * (x // 4000) + lead_ms * (x % 4000) // 4000``
(< 20000 * 66 and < 20000 * 4000), ``ga_q12 * y >> 12`` as ``ga_q12 * (y >> 12) +
(ga_q12 * (y & 4095) >> 12)`` (|y| < 2**21: < 8192 * 2**9 and 8192 * 2**12), and
``c * p // 1000`` as ``c * (p // 1000) + c * (p % 1000) // 1000`` (|c| <= 1000). The
estimate stays within +-2**23.

The model only ever adds protection (device/app.py): alarms and floors take the more
pessimistic of it and the raw-probe rules; with ``model.ok`` 0 it is not evaluated.
"""

try:
    from micropython import const
except ImportError:  # CPython
    const = lambda x: x  # noqa: E731

from array import array

from device.control import clamp as _clamp

INVALID = const(-0x3FFFFFFF)  # as NTC.INVALID and the die estimator's
# The config section ``model``'s keys, in the order of the array's first entries.
KEYS = ("ok", "lead_ms", "ga_q12", "rp_mcw", "rpd_mcw", "off_mc", "unc_mc", "slow_mc")
_OK = const(0)
_LEAD = const(1)
_GA = const(2)
_RP = const(3)
_RPD = const(4)
_OFF = const(5)
_UNC = const(6)
SLOW = const(7)  # the slowdown the model was fitted against (0: none)
_GS = const(8)  # g_slow, INVALID until the first valid sample (device/app.py resets it)
EST = const(9)  # the last est_safe (INVALID without one)
_N = const(10)
_T_LIM = const(131072)  # 2**17 m degC
_P_MAX = const(4194304)  # 2**22 mW
_TAU = const(4000)  # the filter's time constant and the lead's divisor (ms)


def new():
    """The model's array: parameters (``KEYS``), then its state; no model yet."""
    s = array("i", bytes(4 * _N))
    s[_GS] = INVALID
    s[EST] = INVALID
    return s


def load(s, model):
    """Take the config section ``model`` (a dict validated by the schema) into ``s``
    and restart the filter."""
    i = 0
    while i < _GS:
        s[i] = model[KEYS[i]]
        i += 1
    s[_GS] = INVALID
    s[EST] = INVALID


def update(s, g, a, p, d, dt):
    """One tick: ``est_safe`` (m degC), or INVALID when ``g`` or ``a`` is INVALID or
    ``p`` < 0 (the power monitor failed): then the filter starts again."""
    if g == INVALID or a == INVALID or p < 0:
        s[_GS] = INVALID
        s[EST] = INVALID
        return INVALID
    g = _clamp(g, -_T_LIM, _T_LIM)
    a = _clamp(a, -_T_LIM, _T_LIM)
    p = _clamp(p, 0, _P_MAX)
    d = _clamp(d, 0, 65535)
    dt = _clamp(dt, 1, 1000)
    gs = s[_GS]
    if gs == INVALID:
        gs = g
    else:
        gs += (g - gs) * dt // (_TAU + dt)
    s[_GS] = gs
    x = g - gs
    lead = s[_LEAD]
    gl = g + lead * (x // _TAU) + lead * (x % _TAU) // _TAU
    y = gl - a
    ga = s[_GA]
    est = gl + ga * (y >> 12) + ((ga * (y & 4095)) >> 12)
    c = s[_RP] + s[_RPD] * (65535 - d) // 65535
    est += c * (p // 1000) + c * (p % 1000) // 1000
    est += s[_OFF] + s[_UNC]
    s[EST] = est
    return est
