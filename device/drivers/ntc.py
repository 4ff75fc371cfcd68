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

from device.control.filters import EMA, Median

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
        self._adc = adc
        self._lut = lut
        self._step = step
        self._n = oversample
        self._set_thresholds(open_code, short_code)
        if filter == "median5":
            self._filter = Median(_MEDIAN_N)
        elif filter == "ema":
            if not 1 <= ema_alpha <= 256:
                raise ValueError("ema_alpha must be 1..256 (1/256ths)")
            self._filter = EMA(ema_alpha)
        elif filter is None or hasattr(filter, "update"):
            self._filter = filter
        else:
            raise ValueError("filter must be 'median5', 'ema', None or have update()")
        self._reset = getattr(self._filter, "reset", None)  # bound once, not per read
        self.fault = _FAULT_NONE
        self.last_raw = 0  # averaged ADC code of the last read_mc()
        self.last_mc = _INVALID_MC  # last value read_mc() returned
        self.r_fixed_ohm = None  # set by from_config, used by ohms()
        self.table = None  # from_config's table key (table_key)
        self.ntc_low = True

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
        ntc.r_fixed_ohm = table[2]
        ntc.ntc_low = table[3]
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
        self._lo = first * self._step
        self._hi = min(last * self._step, 65535)
        self._fault_lo = _fault_of(lut[first - 1], LUT_OPEN) if first > 0 else _FAULT_NONE
        self._fault_hi = _fault_of(lut[last + 1], LUT_OPEN) if last + 1 < n else _FAULT_NONE
        if open_code is None and short_code is None:
            return
        if open_code is None or short_code is None:
            raise ValueError("give both open_code and short_code, or neither")
        if short_code < open_code:  # NTC on the low side
            self._lo, self._hi = max(self._lo, short_code), min(self._hi, open_code)
            self._fault_lo, self._fault_hi = _FAULT_SHORT, _FAULT_OPEN
        else:
            self._lo, self._hi = max(self._lo, open_code), min(self._hi, short_code)
            self._fault_lo, self._fault_hi = _FAULT_OPEN, _FAULT_SHORT

    @property
    def valid_codes(self):
        """``(lo, hi)``: averaged codes outside this range are faults."""
        return (self._lo, self._hi)

    def read_mc(self):
        """Filtered temperature in milli-degC, or ``INVALID_MC`` with ``fault`` set.

        The control-tick hot path: integers only, no allocation.
        """
        adc = self._adc
        n = self._n
        total = 0
        for _ in range(n):
            total += adc.read_u16()
        code = (total + (n >> 1)) // n
        self.last_raw = code
        if code < self._lo:
            fault = self._fault_lo
        elif code > self._hi:
            fault = self._fault_hi
        else:
            fault = _FAULT_NONE
        if fault != _FAULT_NONE:
            if self.fault == _FAULT_NONE and self._reset is not None:
                self._reset()  # restart the filter from the first good reading
            self.fault = fault
            self.last_mc = _INVALID_MC
            return _INVALID_MC
        self.fault = _FAULT_NONE
        t = lut_interp_mc(self._lut, self._step, code)
        if self._filter is not None:
            t = self._filter.update(t)
        self.last_mc = t
        return t

    def code_to_mc(self, code):
        """Unfiltered milli-degC at an averaged ``code``; ``INVALID_MC`` outside range."""
        if code < self._lo or code > self._hi:
            return _INVALID_MC
        return lut_interp_mc(self._lut, self._step, code)

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
