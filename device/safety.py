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

Nothing here allocates after ``__init__``: ints < 2**30, preallocated arrays.
"""

from array import array

from device import floors as F
from device.drivers.ntc import NTC

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
_INVALID = NTC.INVALID


class Safety:
    """Floors, bounded readings and the hold. ``fans``: the app's Fan objects.

    ``hal.fan_model`` (a name from ``device.floors.FAN_MODELS``) and
    ``hal.ntc_nominal`` (``(beta, r0_ohm, t0_mc, r_fixed_ohm, ntc_low)``) are the
    board's compiled facts; both are optional.
    """

    def __init__(self, hal, fans, n_ch=4, luts=None):
        self.fans = fans
        self.n_ch = n_ch
        model = F.fan_model(getattr(hal, "fan_model", None))
        self.model = model
        self.min_spin = model[F.FM_MIN_SPIN]
        nominal = getattr(hal, "ntc_nominal", None) or F.NTC_NOMINAL
        beta, r0, t0_mc, r_fixed, low = nominal
        cfg = {"model": "beta", "beta": beta, "r0": r0, "t0_mc": t0_mc}
        cfg["r_fixed"] = r_fixed
        cfg["ntc_low"] = low
        # ``luts`` (NTC.from_config's): an uncalibrated channel on the nominal curve
        # holds the same table, built and kept once (1 KB of RAM)
        # (no ADC: it converts the channels' codes, never reads one itself)
        self._nominal = NTC.from_config(None, cfg, luts=luts, oversample=1, filter=None)
        self.nominal_key = self._nominal.table  # shared with the channels' equal keys
        self.nominal_table = (self._nominal._lut, self._nominal._step)  # to share it
        # cause floors: compiled, raised by configure()
        self.f_boot = F.FLOOR_BOOT
        self.f_host = F.FLOOR_HOST_LOST
        self.f_sensor = F.FLOOR_SENSOR
        self.f_stall = F.FLOOR_STALL
        self.f_over = F.FLOOR_OVER_TEMP
        self.f_manual = F.FLOOR_MANUAL
        self.crit_mc = array("i", [F.HOT_FULL_MC[i] or 0x3FFFFFFF for i in range(n_ch)])
        self.hold = array("i", [0] * _N_FAN)
        # the Fan drivers start at 100 % (their initial duty): what "the tick before"
        # the first tick commanded
        self.applied = array("i", [_DUTY_FULL] * _N_FAN)
        self.floor = array("i", [_DUTY_FULL] * _N_FAN)  # the floor in effect, per fan
        self.nominal_mc = array("i", [_INVALID] * n_ch)
        self.prot_mc = array("i", [_INVALID] * n_ch)  # protection readings
        self.nominal_bad = 0  # channels whose code is outside the nominal table
        self.clamped = 0  # channels whose calibrated reading was clamped this tick
        # (causes, mode, state) of the previous tick; before the first one: BOOT, with
        # the fans at their initial 100 % (a fault already there holds that)
        self._key = CAUSE_BOOT
        self.causes = 0
        self.hot = 0  # hot floor of the last tick
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
        self._off_ms = 0  # time the offset seen has stayed below the learned one
        self._off_f = 0  # the offset seen, low-passed (a load step's lag is no offset)

    def configure(self, cfg):
        """Take the config's floors where they are higher than the compiled ones."""
        s = cfg["safety"]
        self.f_boot = _hi(F.FLOOR_BOOT, s["boot"])
        self.f_host = _hi(F.FLOOR_HOST_LOST, s["host_lost"])
        self.f_sensor = _hi(F.FLOOR_SENSOR, s["sensor_fault"])
        self.f_stall = _hi(F.FLOOR_STALL, s["fan_stall"])
        self.f_over = _hi(F.FLOOR_OVER_TEMP, s["over_temp"])
        self.f_manual = _hi(F.FLOOR_MANUAL, s["min_manual_duty"])
        chans = cfg["channels"]
        i = 0
        while i < self.n_ch:
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
        f = self._off_f
        f += (off - f) * dt // F.OFFSET_TAU_MS  # |.| < 15000 * 10000 < 2**30
        self._off_f = f
        if f >= self.learn_off_mc:
            self.learn_off_mc = f
            self._off_ms = 0
            return
        self._off_ms += dt
        if self._off_ms >= F.OFFSET_DOWN_MS:
            self._off_ms = 0
            v = self.learn_off_mc - F.OFFSET_DOWN_MC
            self.learn_off_mc = v if v > f else f

    # -- S2: bounded readings -----------------------------------------------------
    def bound(self, i, code, cal_mc):
        """Control reading of channel ``i`` from its averaged ADC ``code`` and its
        calibrated reading ``cal_mc`` (``NTC.INVALID`` when the driver saw a fault).

        Sets ``prot_mc[i]`` (the protection reading) and ``nominal_mc[i]``; returns
        the clamped reading, or ``NTC.INVALID`` when the nominal curve says the code
        is an open or short circuit."""
        nom = self._nominal.code_to_mc(code)
        self.nominal_mc[i] = nom
        bit = 1 << i
        if nom == _INVALID:
            self.nominal_bad |= bit
            self.prot_mc[i] = _INVALID
            return _INVALID
        self.nominal_bad &= ~bit
        if cal_mc == _INVALID:
            self.prot_mc[i] = _INVALID
            return _INVALID
        lo = nom - F.CAL_BAND_MC
        hi = nom + F.CAL_BAND_MC
        self.prot_mc[i] = cal_mc if cal_mc > lo else lo
        if cal_mc < lo:
            self.clamped |= bit
            return lo
        if cal_mc > hi:
            self.clamped |= bit
            return hi
        self.clamped &= ~bit
        return cal_mc

    def nominal_fault(self, code):
        """``NTC.FAULT_OPEN``/``FAULT_SHORT`` for a code outside the nominal table."""
        nom = self._nominal
        lo, hi = nom._lo, nom._hi
        if code < lo:
            return nom._fault_lo
        if code > hi:
            return nom._fault_hi
        return NTC.FAULT_NONE

    def critical(self, valid):
        """Bit mask of valid channels whose protection reading is at or above the
        critical level (``min(config crit, compiled hot-full)``)."""
        m = 0
        i = 0
        while i < self.n_ch:
            bit = 1 << i
            if valid & bit and self.prot_mc[i] >= self.crit_mc[i]:
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
        self.causes = causes
        # S3: latch the hold on any transition
        key = causes | (mode << 8) | (state << 12)
        hold = self.hold
        applied = self.applied
        if key != self._key:
            # leaving BOOT is not leaving a fault: the control law takes over at once;
            # a fault that appears (during BOOT too) holds what the fans were doing
            prev = self._key & 0xFF
            if causes & ~prev & ~CAUSE_BOOT or not prev & CAUSE_BOOT:
                if applied[0] > hold[0]:
                    hold[0] = applied[0]
                if applied[1] > hold[1]:
                    hold[1] = applied[1]
            self._key = key
        elif not causes & _HOLDING:
            if dt > _DT_MAX_MS:
                dt = _DT_MAX_MS
            if dt > 0:
                down = F.RAMP_DOWN_PER_S * dt // 1000
                hold[0] = hold[0] - down if hold[0] > down else 0
                hold[1] = hold[1] - down if hold[1] > down else 0
        # S1: cause floors
        fl = self.min_spin
        if causes & CAUSE_BOOT and self.f_boot > fl:
            fl = self.f_boot
        if causes & CAUSE_HOST_LOST and self.f_host > fl:
            fl = self.f_host
        if causes & CAUSE_SENSOR and self.f_sensor > fl:
            fl = self.f_sensor
        if causes & CAUSE_OVER and self.f_over > fl:
            fl = self.f_over
        if causes & CAUSE_STALL and self.f_stall > fl:
            fl = self.f_stall
        # S1: the hot floor, on protection readings
        hot = 0
        i = 0
        while i < self.n_ch:
            if valid & (1 << i):
                h = F.hot_floor(i, self.prot_mc[i], self.min_spin)
                if h > hot:
                    hot = h
            i += 1
        self.hot = hot
        # S1: the die-margin floor (a die near the GPU's slowdown: full cooling)
        h = F.die_floor(self.die_mc, self.slow_mc, self.min_spin)
        if h > hot:
            hot = h
        if hot > fl:
            fl = hot
        if causes & CAUSE_CRIT:
            fl = _DUTY_FULL
        f0 = hold[0] if hold[0] > fl else fl
        f1 = hold[1] if hold[1] > fl else fl
        self.floor[0] = f0
        self.floor[1] = f1
        d0 = req0 if req0 > f0 else f0
        d1 = req1 if req1 > f1 else f1
        if d0 > _DUTY_FULL:
            d0 = _DUTY_FULL
        if d1 > _DUTY_FULL:
            d1 = _DUTY_FULL
        applied[0] = d0
        applied[1] = d1
        fans = self.fans
        fans[0].set_duty(d0, now)
        fans[1].set_duty(d1, now)


def _hi(a, b):
    return a if a > b else b
