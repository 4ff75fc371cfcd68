"""NTC thermistor on a ratiometric ADC divider -> milli-degC, through a lookup table.

The table (``device.calib.build_lut``) is computed once at boot with floats; reading a
temperature afterwards is integer-only and allocation-free (``lut_interp_mc``, here;
device.calib is imported only to build a table, so the firmware can forget it once
configured):

    ntc = NTC.from_config(hal.adc[0], {"model": "beta", "beta": 3950, "r0": 10000,
                                       "t0_mc": 25000, "r_fixed": 10000, "ntc_low": True})
    t_mc = ntc.read_mc()          # milli-degC, or NTC.INVALID with ntc.fault set

``read_mc()`` sums ``oversample`` ``read_u16()`` samples, checks the averaged code
against the open/short thresholds, interpolates in the table and filters (median of
the last 5 by default, or an integer EMA, or an injected object with ``update(v)``).
A fault never produces a temperature: ``read_mc()`` returns ``INVALID_MC`` (far
outside -55..200 degC, so no range check can mistake it for a reading), sets
``fault`` to ``FAULT_OPEN`` or ``FAULT_SHORT`` and does not feed the filter; the
filter restarts from the first good reading after a fault.
"""

from array import array

from device.control import ema_update, filter_reset, median_update

try:
    from micropython import const
except ImportError:  # CPython
    const = lambda x: x

_FAULT_NONE = const(0)
_FAULT_OPEN = const(1)
_FAULT_SHORT = const(2)
_INVALID_MC = const(-0x3FFFFFFF)
# Public names (MicroPython cannot rebind a const name inside a class body, so the
# consts are private and these are plain aliases; NTC.FAULT_OPEN etc. too).
FAULT_NONE = _FAULT_NONE
FAULT_OPEN = _FAULT_OPEN  # open circuit (or NTC colder than the table's -55 degC)
FAULT_SHORT = _FAULT_SHORT  # short circuit (or NTC hotter than the table's 200 degC)
INVALID_MC = _INVALID_MC  # read_mc() result while faulted: a small int, not a temperature

_MAX_OVERSAMPLE = const(16384)  # 16384 * 65535 < 2**30: the sum stays a small int
_MEDIAN_N = const(5)
# A channel's state array (``NTC._s``): table step, oversample, the valid codes and the
# faults beyond them, the filter's kind, then the filter's own state (device.control:
# 3 + 2 * 5 entries for the median of 5, 3 for the EMA, none without a filter).
_STEP = const(0)
_N = const(1)
_LO = const(2)
_HI = const(3)
_FLO = const(4)
_FHI = const(5)
_KIND = const(6)
_F = const(7)
_K_NONE = const(0)
_K_MEDIAN = const(1)
_K_EMA = const(2)
_K_OBJ = const(3)  # an injected object with update() and reset()
_K_OBJ_NR = const(4)  # an injected object with update() only


def lut_interp_mc(lut, step, code):
    """Milli-degC at ``code`` by linear interpolation; integer-only, no allocation.

    The entries are in 1/128 degC (device.calib.LUT_PER_C; int16): each end is rounded
    to milli-degC first, then interpolated. The caller keeps ``code`` inside the valid
    range (between two non-sentinel entries); there ``|hi - lo| * (step - 1)`` in
    milli-degC stays below 2**30.
    """
    i = code // step
    frac = code - i * step
    lo = (lut[i] * 1000 + 64) >> 7
    if frac == 0:
        return lo
    return lo + ((((lut[i + 1] * 1000 + 64) >> 7) - lo) * frac + (step >> 1)) // step


class NTC:
    """One NTC channel. ``adc`` has ``read_u16()``; ``lut, step`` from ``build_lut``.

    ``filter``: ``"median5"`` (default), ``"ema"`` (alpha ``ema_alpha``/256), ``None``,
    or any object with ``update(value_mc) -> value_mc`` (and optionally ``reset()``).
    ``open_code`` / ``short_code`` override the fault thresholds that are otherwise
    taken from the table's sentinels (the first and last valid entries). The
    orientation follows from their order: ``short_code < open_code`` is an NTC on the
    low side (short reads low), the reverse an NTC on the high side.
    """

    INVALID = _INVALID_MC
    FAULT_NONE = _FAULT_NONE
    FAULT_OPEN = _FAULT_OPEN
    FAULT_SHORT = _FAULT_SHORT

    def __init__(
        self,
        adc,
        lut,
        step,
        oversample=8,
        filter="median5",
        open_code=None,
        short_code=None,
        ema_alpha=64,
    ):
        if not 1 <= oversample <= _MAX_OVERSAMPLE:
            raise ValueError("oversample must be 1..%d" % _MAX_OVERSAMPLE)
        # One state array and no filter object: 7 instance attributes (one 8-slot
        # table), 4 channels in ~190 B each (device.control's filters at _F).
        if filter == "median5":
            kind = _K_MEDIAN
            size = 3 + 2 * _MEDIAN_N
        elif filter == "ema":
            if not 1 <= ema_alpha <= 256:
                raise ValueError("ema_alpha must be 1..256 (1/256ths)")
            kind = _K_EMA
            size = 3
        elif filter is None:
            kind = _K_NONE
            size = 0
        elif hasattr(filter, "update"):
            kind = _K_OBJ if hasattr(filter, "reset") else _K_OBJ_NR
            size = 0
            self._filter = filter
        else:
            raise ValueError("filter must be 'median5', 'ema', None or have update()")
        self.table = None  # from_config's table key (table_key)
        self._adc = adc
        self._lut = lut
        s = array("i", bytes(4 * (_F + size)))
        self._s = s
        s[_STEP] = step
        s[_N] = oversample
        s[_KIND] = kind
        if kind == _K_MEDIAN:
            s[_F] = _MEDIAN_N
        elif kind == _K_EMA:
            s[_F] = ema_alpha
        self._set_thresholds(open_code, short_code)
        self.fault = _FAULT_NONE
        self.last_raw = 0  # averaged ADC code of the last read_mc()
        self.last_mc = _INVALID_MC  # last value read_mc() returned

    def __getattr__(self, name):
        """What were attributes: ``r_fixed_ohm`` and ``ntc_low`` (the divider, from the
        table key of ``from_config``; None and True without one), and the state
        array's ``_step``, ``_n``, ``_lo``, ``_hi``, ``_fault_lo``, ``_fault_hi`` (read
        when configuring, and by device.safety for the nominal table's faults). Only
        names an instance does not hold come here: never the tick's."""
        if name == "r_fixed_ohm":
            return None if self.table is None else self.table[2]
        if name == "ntc_low":
            return True if self.table is None else self.table[3]
        names = ("_step", "_n", "_lo", "_hi", "_fault_lo", "_fault_hi")
        for i in range(len(names)):
            if names[i] == name:
                return self._s[i]
        raise AttributeError(name)

    @classmethod
    def from_config(cls, adc, cfg, points=257, luts=None, spare=None, **kwargs):
        """Build the table from a channel config dict and return the driver.

        ``cfg``: ``{"model": "beta"|"sh", "beta": 3950, "r0": 10000, "t0_mc": 25000,
        "sh": [A, B, C], "correction": [c0, ...], "r_fixed": 10000, "ntc_low": True}``
        (``beta``/``r0``/``t0_mc`` for the beta model, ``sh`` for Steinhart-Hart).
        Optional keys ``oversample``, ``filter``, ``ema_alpha`` are passed to the
        constructor; keyword arguments override them. Raises
        ``device.calib.CalibrationError`` (a ValueError) on bad coefficients.

        ``luts``: a dict shared by the channels built together; a channel whose curve
        and divider equal an earlier one's reuses its table (read-only, 514 B each),
        so four identical NTCs hold one table and build it once.

        ``spare``: a list of free tables (``array('h')`` of ``points`` entries, read by
        nobody); a table that must be built is built into one popped from it, not into a
        new 514 B block (device.commands: the App's spare, swapped on commit).
        """
        table = cls.table_key(cfg, points)
        if luts is not None and table in luts:
            lut, step = luts[table]
            for key in luts:  # the equal key already held: channels share one tuple
                if key == table:
                    table = key
                    break
        else:
            from device.calib import build_lut

            model, params, r_fixed, low, correction, points = table
            out = spare.pop() if spare else None
            lut, step = build_lut(
                model, params, r_fixed, low, list(correction) or None, points, out=out
            )
            if luts is not None:
                luts[table] = (lut, step)
        for key in ("oversample", "filter", "ema_alpha"):
            if key in cfg and key not in kwargs:
                kwargs[key] = cfg[key]
        ntc = cls(adc, lut, step, **kwargs)
        ntc.table = table  # its ``luts`` key: a reconfiguration reuses the table
        return ntc

    @staticmethod
    def table_key(cfg, points=257):
        """Everything the table of a channel config depends on, as a hashable tuple
        ``(model, params, r_fixed, low, correction, points)``: the key of ``luts``."""
        from device.calib import KELVIN

        model = cfg.get("model", "beta")
        if model == "sh":
            params = tuple(float(x) for x in cfg["sh"])
        else:
            params = (
                float(cfg["beta"]),
                float(cfg["r0"]),
                cfg.get("t0_mc", 25000) / 1000.0 + KELVIN,
            )
        correction = tuple(cfg.get("correction") or ())
        return (
            model,
            params,
            float(cfg["r_fixed"]),
            bool(cfg.get("ntc_low", True)),
            correction,
            points,
        )

    def _set_thresholds(self, open_code, short_code):
        from device.calib import LUT_OPEN, LUT_SHORT

        lut = self._lut
        s = self._s
        step = s[_STEP]
        n = len(lut)
        first = 0
        while first < n and (lut[first] == LUT_OPEN or lut[first] == LUT_SHORT):
            first += 1
        if first == n:
            raise ValueError("the table has no valid entry")
        last = first
        while last + 1 < n and lut[last + 1] != LUT_OPEN and lut[last + 1] != LUT_SHORT:
            last += 1
        # Valid codes: [lo, hi]; what lies below lo / above hi is a fault of that kind.
        s[_LO] = first * step
        s[_HI] = min(last * step, 65535)
        s[_FLO] = _fault_of(lut[first - 1], LUT_OPEN) if first > 0 else _FAULT_NONE
        s[_FHI] = _fault_of(lut[last + 1], LUT_OPEN) if last + 1 < n else _FAULT_NONE
        if open_code is None and short_code is None:
            return
        if open_code is None or short_code is None:
            raise ValueError("give both open_code and short_code, or neither")
        if short_code < open_code:  # NTC on the low side
            s[_LO], s[_HI] = max(s[_LO], short_code), min(s[_HI], open_code)
            s[_FLO], s[_FHI] = _FAULT_SHORT, _FAULT_OPEN
        else:
            s[_LO], s[_HI] = max(s[_LO], open_code), min(s[_HI], short_code)
            s[_FLO], s[_FHI] = _FAULT_OPEN, _FAULT_SHORT

    @property
    def valid_codes(self):
        """``(lo, hi)``: averaged codes outside this range are faults."""
        return (self._s[_LO], self._s[_HI])

    def read_mc(self):
        """Filtered temperature in milli-degC, or ``INVALID_MC`` with ``fault`` set.

        The control-tick hot path: integers only, no allocation.
        """
        s = self._s
        adc = self._adc
        n = s[_N]
        total = 0
        for _ in range(n):
            total += adc.read_u16()
        code = (total + (n >> 1)) // n
        self.last_raw = code
        if code < s[_LO]:
            fault = s[_FLO]
        elif code > s[_HI]:
            fault = s[_FHI]
        else:
            fault = _FAULT_NONE
        if fault != _FAULT_NONE:
            if self.fault == _FAULT_NONE:  # restart the filter from the first good reading
                k = s[_KIND]
                if k == _K_MEDIAN or k == _K_EMA:
                    filter_reset(s, _F)
                elif k == _K_OBJ:
                    self._filter.reset()
            self.fault = fault
            self.last_mc = _INVALID_MC
            return _INVALID_MC
        self.fault = _FAULT_NONE
        t = lut_interp_mc(self._lut, s[_STEP], code)
        k = s[_KIND]
        if k == _K_MEDIAN:
            t = median_update(s, _F, t)
        elif k == _K_EMA:
            t = ema_update(s, _F, t)
        elif k != _K_NONE:
            t = self._filter.update(t)
        self.last_mc = t
        return t

    def code_to_mc(self, code):
        """Unfiltered milli-degC at an averaged ``code``; ``INVALID_MC`` outside range."""
        s = self._s
        if code < s[_LO] or code > s[_HI]:
            return _INVALID_MC
        return lut_interp_mc(self._lut, s[_STEP], code)

    def sample_raw(self, n=64):
        """For calibration: ``(mean_x16, min, max)`` of ``n`` single ``read_u16()``.

        ``mean_x16`` is the mean in 1/16 LSB (the ``cal_raw`` message's unit).
        Allocates (big sums); not for the control tick.
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        adc = self._adc
        total = 0
        lo = 65535
        hi = 0
        for _ in range(n):
            v = adc.read_u16()
            total += v
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        return ((total * 16 + n // 2) // n, lo, hi)

    def ohms(self, code):
        """NTC resistance at a (possibly fractional) code; needs ``from_config``."""
        if self.r_fixed_ohm is None:
            raise ValueError("divider unknown: build the NTC with from_config()")
        from device.calib import adc_to_ohms

        return adc_to_ohms(code, self.r_fixed_ohm, self.ntc_low)


def _fault_of(sentinel, lut_open):
    return _FAULT_OPEN if sentinel == lut_open else _FAULT_SHORT
