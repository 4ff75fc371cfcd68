"""Self-test, like the seed's burn-in: fans to full then stepped down with the tach
checked against the fan model, every channel sampled and range-checked, the INA226 read.

It runs inside the normal control tick (the safety floor still applies: a step below
the floor is run at the floor, and the checks use the duty actually applied), so the
GPU stays cooled while it runs. Result: a ``selftest_report`` with a pass/fail per part.

Steps: 100, 75, 50, 25 %. Once per RPM window (``rpm_window_ms`` of the fans, the
slowest) each fan's reading is taken; a step is settled for a fan when 5 of its last 6
readings lie within ``band(median)`` = 3 tach pulses + 5 % of their median (one
reading in six may be a spike or a dropout; the sim's pure tach noise found 5 of 6
that agree in none of 1,500 steps, 3 of 4 in one step in seven), and its RPM is that
median. The step ends when every fan is settled, or after ``STEP_MAX_MS`` (or 10
windows, if longer): then it is recorded as unsettled. A reading taken while the
applied duty moved by more than ``_DUTY_BAND`` since the first of them (the safety
floor rose, or ramps down after a fault) starts the readings again; a step that ends
unsettled with fewer than 6 readings since such a move is not the fan's fault. The
whole test lasts at most 4 x ``STEP_MAX_MS`` (1 s windows: 60 s).

A fan's verdict (``judge``), first match wins, with the fan model of
``device.floors`` (``min_spin``, ``rpm_check_duty``, ``rpm_floor``):

- tach implausible (unsettled): a step did not settle at a steady duty (pure noise on
  the tach line);
- stalled: below 100 RPM at a settled step whose duty is at least ``min_duty``;
- weak: below the model's floor at the settled 100 % step (``rpm_floor`` x duty /
  100 %);
- untested (duty moved): a step did not settle because the safety floor kept moving
  its duty (not the fan's fault, but the test does not pass);
- tach implausible: faster at a lower duty by more than twice the band; below the
  line from 0 to the full-speed reading (less the band) at a duty >= ``rpm_check_duty``
  (the model: a healthy fan's curve lies on or above it); at the lowest step more than
  halfway from that line to full speed, plus twice the bands of both readings (a
  reading that does not follow the duty: real curves start at most at half their full
  speed). Twice: a slow fan's settled reading may still be up to 2 bands from where
  it heads (towards full from below, towards a lower duty from above).

A healthy fan whose readings are within 1 pulse + 2 % of its speed, with at most one
reading in any six off by anything, passes (tests/test_selftest_props.py). The text
names each failed part, a fan as ``fan2 stalled at 100%: 0 rpm`` (96 characters at
most).
Integers only; the object is made by the ``selftest`` command and dropped with its
report (``device.app`` forgets this module then).
"""

from device.ticks import ticks_add, ticks_diff
from protocol import catalog as C

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


# 100 %, 75 %, 50 %, 25 %; built from a list: a constant tuple's ints above 0x1FFF
# freeze as big ints, whose arithmetic allocates on the MCU (tests/test_frozen_ints.py)
STEPS = tuple([65535, 49151, 32768, 16384])
STEP_MAX_MS = const(15000)  # a step not settled by then (or 10 windows) is unsettled
_STALL_RPM = const(100)  # the fan driver's "turning again" threshold
_DUTY_BAND = const(1311)  # 2 %: an applied duty that moved more starts a step's readings again
_TEMP_MIN_MC = const(-20000)
_TEMP_MAX_MC = const(120000)
_V_MIN_MV = const(10800)  # 12 V -10 %
_V_MAX_MV = const(13200)  # 12 V +10 %
# judge's verdicts, by index
WHY = ("ok", "tach implausible (unsettled)", "untested (duty moved)", "stalled", "weak",
       "tach implausible")  # fmt: skip


def band(rpm, res):
    """Readings of a steady fan agree within this: 3 tach pulses (``res`` RPM each) + 5 %."""
    return 3 * res + rpm * 5 // 100


def agree(buf, n):
    """(spread, median) of the 5 closest of the first ``n`` readings in ``buf`` (n 1..6;
    fewer than 5: of them all)."""
    a = sorted(buf[:n])
    if n > 5:
        a = a[1:] if a[5] - a[1] < a[4] - a[0] else a[:5]
    return a[-1] - a[0], a[(len(a) - 1) // 2]


def _first(bits):
    """The lowest step whose bit is set (-1: none)."""
    for s in range(4):
        if bits >> s & 1:
            return s
    return -1


def judge(rpm, duty, flags, res, fan):
    """(verdict, step) of one fan, the verdict an index into ``WHY``: its settled
    ``rpm`` and applied ``duty`` per step, ``flags`` bit s: step s unsettled, bit 4 + s:
    it was because the duty moved (the safety floor); ``res`` RPM per tach pulse;
    ``fan`` gives ``min_duty``, ``rpm_floor`` and ``model`` (see the module docstring)."""
    u = flags & 15
    s = _first(u & ~(flags >> 4))
    if s >= 0:
        return 1, s
    r0 = rpm[0]
    d0 = duty[0] >> 6
    for s in range(4):  # a settled reading only
        if not u >> s & 1 and rpm[s] < _STALL_RPM and duty[s] >= fan.min_duty:
            return 3, s
    if not u & 1 and r0 < fan.rpm_floor * d0 // 1024:
        return 4, 0
    s = _first(u)
    if s >= 0:
        return 2, s
    for s in range(1, 4):
        r = rpm[s]
        d = duty[s]
        # faster at a lower duty; below the line from 0 to full (r0 <= max_rpm <= 10**6
        # times duty >> 6 <= 1023: a small int) from the model's rpm_check_duty up
        if d < duty[s - 1] and r > rpm[s - 1] + 2 * band(rpm[s - 1], res):
            return 5, s
        line = r0 * (d >> 6) // d0
        if fan.model[3] <= d < duty[0] and r + band(r, res) < line:
            return 5, s
    # the lowest step: at most halfway from the line to full speed (an intercept of
    # up to 50 %), more is a reading that does not follow the duty
    if d < duty[0] and r > (r0 + line) // 2 + 2 * (band(r, res) + band(r0, res)):
        return 5, 3
    return 0, 0


class SelfTest:
    def __init__(self, now_ms, ref, n_fans=2):
        self.ref = ref
        self.step = 0
        self.step_t0 = now_ms
        self.t_next = now_ms
        self.n_fans = n_fans
        self.n = 0  # readings of this step so far
        self.buf = [[0] * 6 for _ in range(n_fans)]  # the last 6 readings per fan
        self.rpm = [[0] * 4 for _ in range(n_fans)]
        self.applied = [[0] * 4 for _ in range(n_fans)]
        self.flags = [0] * n_fans  # judge's: unsettled and duty-moved steps
        self.moved = 0  # fans whose duty moved in this step, a bit each
        self.res = [0] * n_fans
        self.verdicts = None
        self.failed = None
        self.ch_ok = []
        self.pm_ok = False
        self.v_in = 0
        self.done = False

    def duty(self, now_ms):
        """Duty requested for this tick (-1 when finished)."""
        return -1 if self.done else STEPS[self.step]

    def update(self, now_ms, app):
        """Advance; returns True once, when the report is ready."""
        if self.done or ticks_diff(now_ms, self.t_next) < 0:
            return False
        fans = app.fans
        nf = self.n_fans
        s = self.step
        w = 0
        had = self.n
        for i in range(nf):
            f = fans[i]
            if f.rpm_window_ms > w:
                w = f.rpm_window_ms
            d = self.applied[i][s] - f.duty
            if d > _DUTY_BAND or d < -_DUTY_BAND:
                if had:
                    self.moved |= 1 << i
                self.n = 0  # the applied duty moved: readings from now on
        self.t_next = ticks_add(now_ms, w)
        k = self.n % 6
        self.n += 1
        n = self.n if self.n < 6 else 6
        moving = 0  # fans not settled, a bit each
        for i in range(nf):
            f = fans[i]
            if n == 1:
                self.applied[i][s] = f.duty
            self.res[i] = res = 60000 // (f.pulses_per_rev * w)  # RPM of one pulse
            self.buf[i][k] = f.rpm
            spread, r = agree(self.buf[i], n)
            self.rpm[i][s] = r
            if n < 5 or spread > band(r, res):
                moving |= 1 << i
        if moving and ticks_diff(now_ms, self.step_t0) < max(STEP_MAX_MS, 10 * w):
            return False
        for i in range(nf):
            if moving >> i & 1:
                # not settled; because the duty moved: fewer than 6 readings since
                self.flags[i] |= (17 if self.moved >> i & 1 and n < 6 else 1) << s
        self.moved = 0
        if s == 0:
            bad = app.ntc_open | app.ntc_short
            for i in range(len(app.temps)):
                t = app.temps[i]
                self.ch_ok.append(not bad >> i & 1 and _TEMP_MIN_MC <= t <= _TEMP_MAX_MC)
            self.v_in = v = app.pm[0]
            self.pm_ok = not app.pm_fault and _V_MIN_MV <= v <= _V_MAX_MV
        self.step = s + 1
        self.step_t0 = now_ms
        self.n = 0
        if s < 3:
            return False
        self.done = True
        self.verdicts = []
        self.failed = failed = []
        for i in range(nf):
            v, s = judge(self.rpm[i], self.applied[i], self.flags[i], self.res[i], fans[i])
            self.verdicts.append((v, s))
            if v:
                t = "fan%d %s at %d%%" % (
                    i + 1,
                    WHY[v],
                    (self.applied[i][s] * 100 + 32767) // 65535,
                )
                if v > 2:
                    t += ": %d rpm" % self.rpm[i][s]
                failed.append(t)
        for i in range(len(self.ch_ok)):
            if not self.ch_ok[i]:
                failed.append(C.CHANNELS[i])
        if not self.pm_ok:
            failed.append("ina226")
        st = app.sup.state
        ok = 0 if failed else 1
        app.events.push(C.REASON_SELFTEST, C.SEV_INFO if ok else C.SEV_ALARM, True, -1, ok, st, st)
        return True

    def report(self):
        f = self.failed
        return {
            "ref": self.ref,
            "passed": not f,
            "fan1_rpm": self.rpm[0],
            "fan2_rpm": self.rpm[1] if self.n_fans > 1 else [],
            "fans_ok": [v[0] == 0 for v in self.verdicts],
            "channels_ok": self.ch_ok,
            "power_monitor_ok": self.pm_ok,
            "v_in": self.v_in,
            "text": (("failed: " + ", ".join(f)) if f else "all parts passed")[:96],
        }
