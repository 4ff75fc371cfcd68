"""The safety layer: the one place that decides what reaches the fans.

Every control tick passes through :class:`Safety` after the control law and before
the PWM; it is the only caller of ``Fan.set_duty`` in the firmware. The invariants it
enforces (docs/safety.md explains each; tests/test_safety_props.py and
tests/test_safety_machine.py try to break them):

S1 **Floors are code.** Each fan gets at least its model's minimum spin duty, the
   floor of every active cause (boot, host lost, sensor fault, stall, over-temperature:
   ``device.floors``, raised but never lowered by ``safety.*`` config), the hot floor
   that rises with temperature, the die-margin floor that rises as the host's die
   nears the GPU's slowdown, and 100 % at critical. No command, config or mode
   goes below ``max`` of them.
S2 **Bounded calibration.** A channel's calibrated reading is clamped to the board's
   nominal NTC curve +- ``CAL_BAND_MC`` for control; protection (over-temperature,
   critical, hot floor) reads ``max(calibrated, nominal - CAL_BAND_MC)``. A nominal
   reading outside the nominal table's range is an open/short fault whatever the
   calibration says.
S3 **Monotone under transitions.** When a fault cause appears, the host is lost or the
   mode/state changes, each fan's duty is held at least at what it was commanding the
   tick before (``hold``); while a fault cause or host loss lasts the hold stays;
   otherwise (and after the cause clears) it ramps down at ``RAMP_DOWN_PER_S``.
   Leaving BOOT is the one transition without a hold: BOOT is not a fault, only the
   time before the first sensor verdicts, and the control law takes over from it.
S4 **Critical means 100 %.** Any channel above its critical limit, or a protection
   reading at the hot floor's full temperature, drives both fans to 100 %.

(S5, MANUAL is a lease, lives in the app's mode logic: ``MANUAL_LEASE_MS`` and the
end on host loss or any safety cause; see ``App._manual_lease``.)

Nothing here allocates after ``__init__``: ints < 2**30, preallocated arrays. What the
app and the configuring commands use are attributes (``prot_mc``, ``crit_mc``,
``floor``, the learned values, ...); the rest lives in one int array and is read by
name through ``__getattr__`` (``sf.hold``, ``sf.f_manual``, ``sf.causes``).
"""

from device import floors as F
from device.drivers.ntc import NTC, lut_interp_mc

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


# Cause bits (what the supervisor reports; the app passes them in every tick).
CAUSE_BOOT = const(1 << 0)
CAUSE_HOST_LOST = const(1 << 1)
CAUSE_SENSOR = const(1 << 2)  # a controlled NTC is open/short/stuck/implausible
CAUSE_STALL = const(1 << 3)  # a fan stalled or its tach is implausible
CAUSE_OVER = const(1 << 4)
CAUSE_CRIT = const(1 << 5)
# Causes under which the hold does not ramp down.
_HOLDING = const(0x3F)

_N_FAN = const(2)
_DUTY_FULL = const(65535)
_DT_MAX_MS = const(10000)
_INVALID = const(-0x3FFFFFFF)  # NTC.INVALID (checked in Safety.__init__)

# The int array ``_a``: scalars by name (``__getattr__``'s names, in this order), then
# the per-fan hold and applied duty, then the channels' nominal readings.
_N_CH = const(0)
_MIN_SPIN = const(1)
_F_BOOT = const(2)  # cause floors: compiled, raised by configure()
_F_HOST = const(3)
_F_SENSOR = const(4)
_F_STALL = const(5)
_F_OVER = const(6)
_F_MANUAL = const(7)
_NOM_BAD = const(8)  # channels whose code is outside the nominal table
_CLAMPED = const(9)  # channels whose calibrated reading was clamped this tick
_KEY = const(10)  # (causes, mode, state) of the previous tick
_CAUSES = const(11)
_HOT = const(12)  # hot floor of the last tick
_OFF_MS = const(13)  # time the offset seen has stayed below the learned one
_OFF_F = const(14)  # the offset seen, low-passed (a load step's lag is no offset)
_LO = const(15)  # the nominal table's valid codes, lo..hi, and the faults outside
_HI = const(16)
_FAULT_LO = const(17)
_FAULT_HI = const(18)
_STEP = const(19)
_HOLD = const(20)  # per fan
_APPLIED = const(22)  # per fan
_NOM = const(24)  # per channel (nominal_mc)

del const  # folded at compile time: a module name less (its table has 12 slots)


class Safety:
    """Floors, bounded readings and the hold. ``fans``: the app's Fan objects.

    ``hal.fan_model`` (a name from ``device.floors.FAN_MODELS``) and
    ``hal.ntc_nominal`` (``(beta, r0_ohm, t0_mc, r_fixed_ohm, ntc_low)``) are the
    board's compiled facts; both are optional.
    """

    def __init__(self, hal, fans, n_ch=4, luts=None):
        if NTC.INVALID != _INVALID:
            raise ValueError("NTC.INVALID moved")
        from array import array
        self.fans = fans
        model = F.fan_model(getattr(hal, "fan_model", None))
        self.model = model
        nominal = getattr(hal, "ntc_nominal", None) or F.NTC_NOMINAL
        beta, r0, t0_mc, r_fixed, low = nominal
        cfg = {"model": "beta", "beta": beta, "r0": r0, "t0_mc": t0_mc}
        cfg["r_fixed"] = r_fixed
        cfg["ntc_low"] = low
        # ``luts`` (NTC.from_config's): an uncalibrated channel on the nominal curve
        # holds the same table, built and kept once (1 KB of RAM); the driver object is
        # not kept, only its table and thresholds (no ADC: it converts the channels'
        # codes, never reads one itself)
        nom = NTC.from_config(None, cfg, luts=luts, oversample=1, filter=None)
        self.nominal_key = nom.table  # shared with the channels' equal keys
        self.nominal_table = (nom._lut, nom._step)  # to share it
        a = array("i", bytes(4 * (_NOM + n_ch)))
        a[_N_CH] = n_ch
        a[_MIN_SPIN] = model[F.FM_MIN_SPIN]
        # the compiled cause floors (configure() may raise them), _F_BOOT.._F_MANUAL
        k = _F_BOOT
        for v in (
            F.FLOOR_BOOT,
            F.FLOOR_HOST_LOST,
            F.FLOOR_SENSOR,
            F.FLOOR_STALL,
            F.FLOOR_OVER_TEMP,
            F.FLOOR_MANUAL,
        ):
            a[k] = v
            k += 1
        # before the first tick: BOOT, with the fans at their initial 100 % (a fault
        # already there holds that)
        a[_KEY] = CAUSE_BOOT
        # the nominal table's thresholds, _LO.._STEP
        k = _LO
        for v in (nom._lo, nom._hi, nom._fault_lo, nom._fault_hi, nom._step):
            a[k] = v
            k += 1
        # the Fan drivers start at 100 % (their initial duty): what "the tick before"
        # the first tick commanded
        a[_APPLIED] = _DUTY_FULL
        a[_APPLIED + 1] = _DUTY_FULL
        i = 0
        while i < n_ch:
            a[_NOM + i] = _INVALID
            i += 1
        self._a = a
        self.crit_mc = array("i", [F.HOT_FULL_MC[i] or 0x3FFFFFFF for i in range(n_ch)])
        self.floor = array("i", [_DUTY_FULL] * _N_FAN)  # the floor in effect, per fan
        self.prot_mc = array("i", [_INVALID] * n_ch)  # protection readings
        # the die-margin floor's inputs, set by the app every tick: the host's fresh
        # die temperature and the GPU's slowdown (0 = no host, stale or not sent)
        self.die_mc = 0
        self.slow_mc = 0
        # learned from the host (the device.config "learned" record), for the limits
        # without one (device.failsafe ``follow_slowdown``): the last slowdown it sent
        # and the probe-to-die offset; 0 = never hosted. Kept here, not in the
        # supervisor, because a reconfiguration replaces the supervisor.
        self.learn_slow_mc = 0
        self.learn_off_mc = 0
        # the chassis model (config ``model``, device.commands._model): (its array,
        # device.control.chassis.update) while model.ok, else None. The app takes its
        # estimate only to tighten: alarms and the die-margin floor above.
        self.chassis = None

    def __getattr__(self, name):
        """The array's scalars by name (``sf.f_manual``, ``sf.causes``, ``sf.hot``);
        ``hold``, ``applied`` (per fan) and ``nominal_mc`` (per channel) as copies.
        Read-only: configuring and tests, never the tick."""
        a = self._a
        if name == "hold":
            return a[_HOLD : _HOLD + _N_FAN]
        if name == "applied":
            return a[_APPLIED : _APPLIED + _N_FAN]
        if name == "nominal_mc":
            return a[_NOM : _NOM + a[_N_CH]]
        names = (
            "n_ch",
            "min_spin",
            "f_boot",
            "f_host",
            "f_sensor",
            "f_stall",
            "f_over",
            "f_manual",
            "nominal_bad",
            "clamped",
            "_key",
            "causes",
            "hot",
            "_off_ms",
            "_off_f",
        )
        if name in names:
            return a[names.index(name)]
        raise AttributeError(name)

    def configure(self, cfg):
        """Take the config's floors where they are higher than the compiled ones."""
        s = cfg["safety"]
        a = self._a
        a[_F_BOOT] = max(F.FLOOR_BOOT, s["boot"])
        a[_F_HOST] = max(F.FLOOR_HOST_LOST, s["host_lost"])
        a[_F_SENSOR] = max(F.FLOOR_SENSOR, s["sensor_fault"])
        a[_F_STALL] = max(F.FLOOR_STALL, s["fan_stall"])
        a[_F_OVER] = max(F.FLOOR_OVER_TEMP, s["over_temp"])
        a[_F_MANUAL] = max(F.FLOOR_MANUAL, s["min_manual_duty"])
        chans = cfg["channels"]
        i = 0
        while i < a[_N_CH]:
            full = F.HOT_FULL_MC[i]
            crit = chans[i]["crit_mc"]
            self.crit_mc[i] = crit if full is None or crit < full else full
            i += 1

    def learn(self, slowdown_mc, die_mc, prot_mc, dt):
        """With a host: keep its slowdown and the offset of its fresh die over the GPU
        channel's protection reading ``prot_mc``, clamped to 0..``OFFSET_MAX_MC`` and
        low-passed over ``OFFSET_TAU_MS`` (the probe lags the die by seconds: a load
        step's transient gap is not the chassis' offset). The learned offset follows
        that filtered value up at once and down by ``OFFSET_DOWN_MC`` per
        ``OFFSET_DOWN_MS``. Ints only, no allocation."""
        if slowdown_mc > 0:
            self.learn_slow_mc = slowdown_mc
        off = die_mc - prot_mc
        if off < 0:
            off = 0
        elif off > F.OFFSET_MAX_MC:
            off = F.OFFSET_MAX_MC
        if dt > _DT_MAX_MS:
            dt = _DT_MAX_MS
        a = self._a
        f = a[_OFF_F]
        f += (off - f) * dt // F.OFFSET_TAU_MS  # |.| < 15000 * 10000 < 2**30
        a[_OFF_F] = f
        if f >= self.learn_off_mc:
            self.learn_off_mc = f
            a[_OFF_MS] = 0
            return
        a[_OFF_MS] += dt
        if a[_OFF_MS] >= F.OFFSET_DOWN_MS:
            a[_OFF_MS] = 0
            v = self.learn_off_mc - F.OFFSET_DOWN_MC
            self.learn_off_mc = v if v > f else f

    # -- S2: bounded readings -----------------------------------------------------
    def bound(self, i, code, cal_mc):
        """Control reading of channel ``i`` from its averaged ADC ``code`` and its
        calibrated reading ``cal_mc`` (``NTC.INVALID`` when the driver saw a fault).

        Sets ``prot_mc[i]`` (the protection reading) and ``nominal_mc[i]``; returns
        the clamped reading, or ``NTC.INVALID`` when the nominal curve says the code
        is an open or short circuit."""
        a = self._a
        bit = 1 << i
        if code < a[_LO] or code > a[_HI]:
            a[_NOM + i] = _INVALID
            a[_NOM_BAD] |= bit
            self.prot_mc[i] = _INVALID
            return _INVALID
        nom = lut_interp_mc(self.nominal_table[0], a[_STEP], code)
        a[_NOM + i] = nom
        a[_NOM_BAD] &= ~bit
        if cal_mc == _INVALID:
            self.prot_mc[i] = _INVALID
            return _INVALID
        lo = nom - F.CAL_BAND_MC
        hi = nom + F.CAL_BAND_MC
        self.prot_mc[i] = cal_mc if cal_mc > lo else lo
        if cal_mc < lo:
            a[_CLAMPED] |= bit
            return lo
        if cal_mc > hi:
            a[_CLAMPED] |= bit
            return hi
        a[_CLAMPED] &= ~bit
        return cal_mc

    def nominal_fault(self, code):
        """``NTC.FAULT_OPEN``/``FAULT_SHORT`` for a code outside the nominal table."""
        a = self._a
        if code < a[_LO]:
            return a[_FAULT_LO]
        if code > a[_HI]:
            return a[_FAULT_HI]
        return NTC.FAULT_NONE

    def critical(self, valid):
        """Bit mask of valid channels whose protection reading is at or above the
        critical level (``min(config crit, compiled hot-full)``)."""
        m = 0
        prot = self.prot_mc
        crit = self.crit_mc
        n = self._a[_N_CH]
        i = 0
        while i < n:
            bit = 1 << i
            if valid & bit and prot[i] >= crit[i]:
                m |= bit
            i += 1
        return m

    # -- S1, S3, S4: what reaches the fans ------------------------------------------
    def apply(self, req0, req1, causes, valid, mode, state, now, dt):
        """Drive the fans with ``max(request, floor)``; returns nothing.

        ``causes``: CAUSE_* bits active this tick; ``valid``: channels whose
        protection reading can be trusted; ``mode``/``state``: the app's mode and the
        supervisor's state (a change of either is a transition for the hold)."""
        if self.critical(valid):
            causes |= CAUSE_CRIT
        a = self._a
        a[_CAUSES] = causes
        # S3: latch the hold on any transition
        key = causes | (mode << 8) | (state << 12)
        h0 = a[_HOLD]
        h1 = a[_HOLD + 1]
        if key != a[_KEY]:
            # leaving BOOT is not leaving a fault: the control law takes over at once;
            # a fault that appears (during BOOT too) holds what the fans were doing
            prev = a[_KEY] & 0xFF
            if causes & ~prev & ~CAUSE_BOOT or not prev & CAUSE_BOOT:
                if a[_APPLIED] > h0:
                    h0 = a[_APPLIED]
                if a[_APPLIED + 1] > h1:
                    h1 = a[_APPLIED + 1]
            a[_KEY] = key
        elif not causes & _HOLDING:
            if dt > _DT_MAX_MS:
                dt = _DT_MAX_MS
            if dt > 0:
                down = F.RAMP_DOWN_PER_S * dt // 1000
                h0 = h0 - down if h0 > down else 0
                h1 = h1 - down if h1 > down else 0
        a[_HOLD] = h0
        a[_HOLD + 1] = h1
        # S1: cause floors
        spin = a[_MIN_SPIN]
        fl = spin
        if causes & CAUSE_BOOT and a[_F_BOOT] > fl:
            fl = a[_F_BOOT]
        if causes & CAUSE_HOST_LOST and a[_F_HOST] > fl:
            fl = a[_F_HOST]
        if causes & CAUSE_SENSOR and a[_F_SENSOR] > fl:
            fl = a[_F_SENSOR]
        if causes & CAUSE_OVER and a[_F_OVER] > fl:
            fl = a[_F_OVER]
        if causes & CAUSE_STALL and a[_F_STALL] > fl:
            fl = a[_F_STALL]
        # S1: the hot floor, on protection readings
        hot = 0
        prot = self.prot_mc
        n = a[_N_CH]
        i = 0
        while i < n:
            if valid & (1 << i):
                h = F.hot_floor(i, prot[i], spin)
                if h > hot:
                    hot = h
            i += 1
        a[_HOT] = hot
        # S1: the die-margin floor (a die near the GPU's slowdown: full cooling)
        h = F.die_floor(self.die_mc, self.slow_mc, spin)
        if h > hot:
            hot = h
        if hot > fl:
            fl = hot
        if causes & CAUSE_CRIT:
            fl = _DUTY_FULL
        f0 = h0 if h0 > fl else fl
        f1 = h1 if h1 > fl else fl
        floor = self.floor
        floor[0] = f0
        floor[1] = f1
        d0 = req0 if req0 > f0 else f0
        d1 = req1 if req1 > f1 else f1
        if d0 > _DUTY_FULL:
            d0 = _DUTY_FULL
        if d1 > _DUTY_FULL:
            d1 = _DUTY_FULL
        a[_APPLIED] = d0
        a[_APPLIED + 1] = d1
        fans = self.fans
        fans[0].set_duty(d0, now)
        fans[1].set_duty(d1, now)
