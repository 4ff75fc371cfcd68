"""Fail-safe supervisor: faults -> state, reason, duty floors and events.

Explicit state with a reason, in the manner of phosphor-pid-control's failsafe zones:

========== ===================================================================
BOOT       fixed safe duty until every sensor has produced its first verdict
HOSTED     host heartbeats arriving; regulating on local sensors + feed-forward
STANDALONE no heartbeat within the timeout: keep regulating on local sensors
FAILSAFE   sensor open/short/stuck/implausible, fan stall or implausible tach,
           over-temperature: a floor per cause (device.safety), the largest wins
MANUAL     host override of the duty, still floored by safety
========== ===================================================================

Priority: BOOT (until sensors are valid) > FAILSAFE > MANUAL > HOSTED > STANDALONE.
Above a channel's critical temperature both fans run at 100 % whatever was
commanded. One fan stalled: the other is driven at least at the ``fan_stall`` floor
(and the stalled one too, to restart it).

An event is queued on every change of a fault bit and on every state change, and only
then. :meth:`Supervisor.update` runs in the control tick: it does not allocate (int
masks, preallocated arrays, a fixed-size event ring).
"""

from device import floors as F
from device import safety as S
from protocol import catalog as C

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


_EV_FIELDS = const(6)  # code, severity, active, index, state, prev_state (+ value apart)
# The GPU channel's limits under the GPU's own slowdown temperature (heartbeat
# ``gpu_slowdown``): warning 8 degC and critical 3 degC below it. The NTC on the
# heatsink reads below the die (0.3 of the die-to-heatsink gap in the default world,
# ~9 degC at 700 W), so an NTC at slowdown - 3 means a die at or past its slowdown:
# full cooling; the warning's 80 % floor comes 5 degC earlier. docs/autotune.md.
SLOWDOWN_WARN_MARGIN_MC = const(8000)
SLOWDOWN_CRIT_MARGIN_MC = const(3000)
# Those margins assume an NTC that reads below the die (a guess at where it is glued).
# While the host's die temperature (heartbeat ``gpu_temp``) is fresh the die is
# measured: ``follow_slowdown(slowdown, -1)`` sets the GPU channel's limits to
# min(configured, slowdown - 3) and min(configured, slowdown) instead (an NTC on the
# die's heat path reads no higher than the die: one there means a die there), and the
# die counts on the channel DIE_OFFSET_MC lower: with the warning at slowdown - 3 it
# warns from slowdown - 2 degC (NVML's whole degrees: a reading of slowdown - 2) and is
# critical from slowdown + 1, whatever the NTC reads (issue 25: an NTC on the core
# passed slowdown - 8 with the die 7 degC under its slowdown, FAILSAFE for 91 s; an
# NTC beside the memory MOSFETs reads 12 degC below a throttling die: issue 11).
# (Before issue 25: the NTC margins above with DIE_OFFSET_MC 6000, the die warning
# from slowdown - 1 in whole degrees and critical from slowdown + 3.)
DIE_OFFSET_MC = const(999)

del const  # folded at compile time: a module name less (its table has 12 slots)


class EventQueue:
    """Fixed-size ring of pending events (ints only); the oldest is dropped when full."""

    def __init__(self, capacity=16):
        from array import array

        self.cap = capacity
        # the small fields (code, severity, active, index, state, prev_state) as
        # 16-bit items, ``value`` (an i32: a temperature, a count) apart: 18 bytes an
        # event instead of 32 in one "i" array
        self.buf = array("h", bytes(2 * capacity * _EV_FIELDS))
        self.values = array("i", bytes(4 * capacity))
        self.head = 0
        self.count = 0
        self.dropped = 0

    def push(self, code, severity, active, index, value, state, prev_state):
        if self.count == self.cap:
            self.head = (self.head + 1) % self.cap
            self.count -= 1
            self.dropped += 1
        slot = (self.head + self.count) % self.cap
        o = slot * _EV_FIELDS
        b = self.buf
        b[o] = code
        b[o + 1] = severity
        b[o + 2] = 1 if active else 0
        b[o + 3] = index
        b[o + 4] = state
        b[o + 5] = prev_state
        self.values[slot] = value
        self.count += 1

    def pop(self):
        """The oldest event as a field dict for protocol ``event`` (allocates), or None."""
        if not self.count:
            return None
        slot = self.head
        o = slot * _EV_FIELDS
        b = self.buf
        self.head = (self.head + 1) % self.cap
        self.count -= 1
        return {
            "code": b[o],
            "severity": b[o + 1],
            "active": bool(b[o + 2]),
            "index": b[o + 3],
            "value": self.values[slot],
            "state": b[o + 4],
            "prev_state": b[o + 5],
        }


def _bit_index(mask):
    i = 0
    while mask and not mask & 1:
        mask >>= 1
        i += 1
    return i


class Supervisor:
    """Holds the state machine; fed once per control tick by the app.

    It decides state, reason, the telemetry fault bits, events, and ``causes``: the
    ``device.safety.CAUSE_*`` bits active this tick. It sets no duty: the floors for
    those causes live in ``device.safety`` alone.
    """

    def __init__(self, cfg, events=None):
        from array import array

        chans = cfg["channels"]
        self.n = len(chans)
        self.warn_mc = array("i", [c["warn_mc"] for c in chans])
        # critical: the config's limit, never above the compiled hot-floor end
        self.crit_mc = array("i", [c["crit_mc"] for c in chans])
        hot = F.HOT_FULL_MC
        i = 0
        while i < self.n and i < len(hot):
            full = hot[i]
            if full is not None and self.crit_mc[i] >= full:
                self.crit_mc[i] = full
            i += 1
        # the configured GPU-channel limits; warn_mc[0]/crit_mc[0] follow the slowdown
        self.warn_cfg0 = self.warn_mc[0]
        self.crit_cfg0 = self.crit_mc[0]
        self.slowdown_mc = 0
        self.offset_mc = 0  # the probe-to-die offset the limits were set with
        controlled = 0
        i = 0
        while i < self.n:
            if chans[i]["controlled"]:
                controlled |= 1 << i
            i += 1
        self.controlled = controlled
        s = cfg["safety"]
        self.hyst_mc = s.get("hyst_mc", 2000)
        self.events = events if events is not None else EventQueue()
        self.state = C.STATE_BOOT
        self.reason = C.REASON_BOOT
        self.faults = 0  # telemetry bitmask C.FAULT_*
        self.causes = S.CAUSE_BOOT
        self.ntc_open = 0
        self.ntc_short = 0
        self.ntc_stuck = 0
        self.ntc_implausible = 0
        self.over = 0  # channels above warn (with hysteresis)
        self.crit = 0  # channels above crit (with hysteresis)
        self.stall = 0
        self.tach = 0
        self.host_seen = False

    def follow_slowdown(self, slowdown_mc, offset_mc=0):
        """Set the GPU channel's warning/critical limits to ``min(configured,
        slowdown_mc - margin, slowdown_mc - offset_mc - standalone margin)``;
        ``slowdown_mc`` 0 (never hosted) restores the configured ones. ``offset_mc``:
        how far the GPU channel may read below the die; -1 while the
        host's fresh die counts on the channel itself: then ``min(configured,
        slowdown_mc - 3)`` and ``min(configured, slowdown_mc)``, no guess at the
        NTC's placement (see DIE_OFFSET_MC). Never raises a limit above its
        configured value. Called every tick; allocates nothing."""
        if slowdown_mc == self.slowdown_mc and offset_mc == self.offset_mc:
            return
        self.slowdown_mc = slowdown_mc
        self.offset_mc = offset_mc
        w = self.warn_cfg0
        c = self.crit_cfg0
        if slowdown_mc > 0 and offset_mc < 0:  # the die is measured
            lw = slowdown_mc - F.STANDALONE_WARN_MARGIN_MC
            lc = slowdown_mc - F.STANDALONE_CRIT_MARGIN_MC
            if lw < w:
                w = lw
            if lc < c:
                c = lc
        elif slowdown_mc > 0:
            lw = slowdown_mc - SLOWDOWN_WARN_MARGIN_MC
            x = slowdown_mc - offset_mc - F.STANDALONE_WARN_MARGIN_MC
            if x < lw:
                lw = x
            lc = slowdown_mc - SLOWDOWN_CRIT_MARGIN_MC
            x = slowdown_mc - offset_mc - F.STANDALONE_CRIT_MARGIN_MC
            if x < lc:
                lc = x
            if lw < w:
                w = lw
            if lc < c:
                c = lc
        self.warn_mc[0] = w
        self.crit_mc[0] = c

    # -- the tick ------------------------------------------------------------
    def update(
        self,
        temps_mc,
        ntc_open,
        ntc_short,
        stall,
        pm_fault,
        uv,
        host_ok,
        manual,
        booted,
        v_in_mv=0,
        tach=0,
        stuck=0,
        implausible=0,
    ):
        """Evaluate one tick; returns True when the state changed.

        temps_mc: array of channel protection readings (ignored where faulted);
        ntc_open/ntc_short/stuck/implausible: bit masks by channel; stall/tach
        (implausible tach): bit masks by fan; pm_fault, uv, host_ok, manual, booted:
        bools.
        """
        ev = self.events
        st = self.state
        # sensor faults
        self._edges(self.ntc_open, ntc_open, C.REASON_SENSOR_OPEN, 0)
        self._edges(self.ntc_short, ntc_short, C.REASON_SENSOR_SHORT, 0)
        self._edges(self.ntc_stuck, stuck, C.REASON_SENSOR_STUCK, 0)
        self._edges(self.ntc_implausible, implausible, C.REASON_SENSOR_IMPLAUSIBLE, 0)
        self.ntc_open = ntc_open
        self.ntc_short = ntc_short
        self.ntc_stuck = stuck
        self.ntc_implausible = implausible
        bad = ntc_open | ntc_short | stuck | implausible
        # temperatures with hysteresis
        over = self.over
        crit = self.crit
        h = self.hyst_mc
        i = 0
        while i < self.n:
            bit = 1 << i
            if (ntc_open | ntc_short) & bit:
                over &= ~bit
                crit &= ~bit
            else:
                # a stuck or implausible channel still counts when it reads hot
                t = temps_mc[i]
                if t > self.warn_mc[i]:
                    over |= bit
                elif t < self.warn_mc[i] - h:
                    over &= ~bit
                if t >= self.crit_mc[i]:
                    crit |= bit
                elif t < self.crit_mc[i] - h:
                    crit &= ~bit
            i += 1
        self._edges(self.over, over, C.REASON_OVER_TEMP, 1, temps_mc)
        self._edges(self.crit, crit, C.REASON_CRITICAL_TEMP, 1, temps_mc)
        self.over = over
        self.crit = crit
        self._edges(self.stall, stall, C.REASON_FAN_STALL, 2)
        self._edges(self.tach, tach, C.REASON_TACH_IMPLAUSIBLE, 2)
        self.stall = stall
        self.tach = tach
        # fault bitmask for telemetry
        f = bad & 0xF
        if stall & 1:
            f |= C.FAULT_FAN1_STALL
        if stall & 2:
            f |= C.FAULT_FAN2_STALL
        if tach & 1:
            f |= C.FAULT_FAN1_TACH
        if tach & 2:
            f |= C.FAULT_FAN2_TACH
        if stuck:
            f |= C.FAULT_NTC_STUCK
        if implausible:
            f |= C.FAULT_NTC_IMPLAUSIBLE
        if pm_fault:
            f |= C.FAULT_POWER_MONITOR
        if uv:
            f |= C.FAULT_UNDER_VOLTAGE
        if over:
            f |= C.FAULT_OVER_TEMP
        if crit:
            f |= C.FAULT_CRITICAL_TEMP
        if host_ok:
            self.host_seen = True
        elif self.host_seen:
            f |= C.FAULT_HOST_TIMEOUT
        old = self.faults
        if (old ^ f) & C.FAULT_POWER_MONITOR:
            ev.push(
                C.REASON_POWER_MONITOR_FAULT,
                C.SEV_WARNING,
                f & C.FAULT_POWER_MONITOR,
                -1,
                0,
                st,
                st,
            )
        if (old ^ f) & C.FAULT_UNDER_VOLTAGE:
            ev.push(
                C.REASON_UNDER_VOLTAGE, C.SEV_ALARM, f & C.FAULT_UNDER_VOLTAGE, -1, v_in_mv, st, st
            )
        self.faults = f
        # state
        ctl_bad = bad & self.controlled
        if crit:
            new, reason = C.STATE_FAILSAFE, C.REASON_CRITICAL_TEMP
        elif not booted:
            new, reason = C.STATE_BOOT, C.REASON_BOOT
        elif stall:
            new, reason = C.STATE_FAILSAFE, C.REASON_FAN_STALL
        elif tach:
            new, reason = C.STATE_FAILSAFE, C.REASON_TACH_IMPLAUSIBLE
        elif ctl_bad & ntc_short:
            new, reason = C.STATE_FAILSAFE, C.REASON_SENSOR_SHORT
        elif ctl_bad & ntc_open:
            new, reason = C.STATE_FAILSAFE, C.REASON_SENSOR_OPEN
        elif ctl_bad & stuck:
            new, reason = C.STATE_FAILSAFE, C.REASON_SENSOR_STUCK
        elif ctl_bad:
            new, reason = C.STATE_FAILSAFE, C.REASON_SENSOR_IMPLAUSIBLE
        elif over:
            new, reason = C.STATE_FAILSAFE, C.REASON_OVER_TEMP
        elif manual and host_ok:
            new, reason = C.STATE_MANUAL, C.REASON_MANUAL_OVERRIDE
        elif host_ok:
            new, reason = C.STATE_HOSTED, C.REASON_HOST_OK
        else:
            new = C.STATE_STANDALONE
            reason = C.REASON_HOST_TIMEOUT if self.host_seen else C.REASON_BOOT
        # causes: device.safety turns them into floors (the maximum wins)
        causes = 0
        if new == C.STATE_BOOT:
            causes |= S.CAUSE_BOOT
        if self.host_seen and not host_ok:
            causes |= S.CAUSE_HOST_LOST
        if ctl_bad:
            causes |= S.CAUSE_SENSOR
        if over:
            causes |= S.CAUSE_OVER
        if stall or tach:
            causes |= S.CAUSE_STALL
        if crit:
            causes |= S.CAUSE_CRIT
        self.causes = causes
        if new != st or reason != self.reason:
            prev = st
            self.state = new
            self.reason = reason
            ev.push(reason, _severity(new, reason), True, -1, 0, new, prev)
            return True
        return False

    def _edges(self, old, new, code, kind, values=None):
        """Queue an event for every bit that changed between ``old`` and ``new``;
        ``values[i]`` (e.g. the temperature) goes in the event's value."""
        diff = old ^ new
        st = self.state
        while diff:
            low = diff & -diff
            i = _bit_index(low)
            active = bool(new & low)
            if kind == 2:  # fans
                sev = C.SEV_ALARM
            elif code == C.REASON_CRITICAL_TEMP:
                sev = C.SEV_CRITICAL
            elif (1 << i) & self.controlled:
                sev = C.SEV_ALARM
            else:
                sev = C.SEV_WARNING
            self.events.push(code, sev, active, i, values[i] if values is not None else 0, st, st)
            diff &= ~low


def _severity(state, reason):
    if reason == C.REASON_CRITICAL_TEMP:
        return C.SEV_CRITICAL
    if state == C.STATE_FAILSAFE:
        return C.SEV_ALARM
    if state == C.STATE_STANDALONE and reason == C.REASON_HOST_TIMEOUT:
        return C.SEV_WARNING
    return C.SEV_INFO
