"""Self-test, like the seed's burn-in: fans to full then stepped down with the tach
checked against duty, every channel sampled and range-checked, the INA226 read.

It runs inside the normal control tick (the safety floor still applies: a step below
the floor is run at the floor, and the check uses the duty actually applied), so the
GPU stays cooled while it runs. Result: a ``selftest_report`` with a pass/fail per part.
"""

from protocol import catalog as C

# 100 %, 75 %, 50 %, 25 %; built from a list: a constant tuple's ints above 0x1FFF
# freeze as big ints, whose arithmetic allocates on the MCU (tests/test_frozen_ints.py)
STEPS = tuple([65535, 49151, 32768, 16384])
STEP_MS = (3000, 2000, 2000, 2000)  # settle time per step (spin-down is slow)
MIN_RPM_FULL = 300  # a fan that does less than this at 100 % has failed
RPM_SLACK_PCT = 10  # a lower duty may read up to 10 % more RPM (tach jitter)
TEMP_MIN_MC = -20000
TEMP_MAX_MC = 120000
V_MIN_MV = 10800  # 12 V -10 %
V_MAX_MV = 13200  # 12 V +10 %


class SelfTest:
    def __init__(self, now_ms, ref, n_fans=2):
        self.ref = ref
        self.t0 = now_ms
        self.step = 0
        self.step_t0 = now_ms
        self.n_fans = n_fans
        self.rpm = [[0] * len(STEPS) for _ in range(n_fans)]
        self.applied = [[0] * len(STEPS) for _ in range(n_fans)]
        self.ch_ok = None
        self.pm_ok = False
        self.v_in = 0
        self.done = False

    def duty(self, now_ms):
        """Duty requested for this tick (-1 when finished)."""
        if self.done:
            return -1
        return STEPS[self.step]

    def update(self, now_ms, app):
        """Advance; returns True once, when the report is ready."""
        from device.ticks import ticks_diff

        if self.done:
            return False
        if ticks_diff(now_ms, self.step_t0) < STEP_MS[self.step]:
            return False
        for i in range(self.n_fans):
            self.rpm[i][self.step] = app.fans[i].rpm
            self.applied[i][self.step] = app.fans[i].duty
        if self.step == 0:
            bad = app.ntc_open | app.ntc_short
            self.ch_ok = []
            for i in range(len(app.temps)):
                t = app.temps[i]
                self.ch_ok.append(not bad & (1 << i) and TEMP_MIN_MC <= t <= TEMP_MAX_MC)
            self.pm_ok = (not app.pm_fault) and V_MIN_MV <= app.pm[0] <= V_MAX_MV
            self.v_in = app.pm[0]
        self.step += 1
        self.step_t0 = now_ms
        if self.step < len(STEPS):
            return False
        self.done = True
        app.events.push(
            C.REASON_SELFTEST,
            C.SEV_INFO if self.passed() else C.SEV_ALARM,
            True,
            -1,
            1 if self.passed() else 0,
            app.sup.state,
            app.sup.state,
        )
        return True

    def fan_ok(self, i):
        rpm = self.rpm[i]
        if rpm[0] < MIN_RPM_FULL:
            return False
        for s in range(1, len(STEPS)):
            # a step whose applied duty is lower must not spin meaningfully faster
            if self.applied[i][s] < self.applied[i][s - 1]:
                if rpm[s] * 100 > rpm[s - 1] * (100 + RPM_SLACK_PCT):
                    return False
        # the lowest step must be measurably slower than full, unless floored to full
        if self.applied[i][-1] < self.applied[i][0] and rpm[-1] >= rpm[0]:
            return False
        return True

    def passed(self):
        fans = all(self.fan_ok(i) for i in range(self.n_fans))
        return fans and all(self.ch_ok or [False]) and self.pm_ok

    def report(self):
        fans_ok = [self.fan_ok(i) for i in range(self.n_fans)]
        failed = []
        for i in range(self.n_fans):
            if not fans_ok[i]:
                failed.append("fan%d" % (i + 1))
        for i, ok in enumerate(self.ch_ok or []):
            if not ok:
                failed.append(C.CHANNELS[i])
        if not self.pm_ok:
            failed.append("ina226")
        return {
            "ref": self.ref,
            "passed": not failed,
            "fan1_rpm": self.rpm[0],
            "fan2_rpm": self.rpm[1] if self.n_fans > 1 else [],
            "fans_ok": fans_ok,
            "channels_ok": self.ch_ok or [],
            "power_monitor_ok": self.pm_ok,
            "v_in": self.v_in,
            "text": ("failed: " + ", ".join(failed)) if failed else "all parts passed",
        }
