"""A hostile world for the real firmware ``App`` on the fake board, with an oracle.

Used by the hypothesis state machine (tests/test_safety_machine.py), the seeded random
walk that runs on both interpreters (tests/test_safety_walk.py) and the benchmark
(bench/bench_safety.py). Importable on CPython and MicroPython.

The harness performs *actions* (commands of every type, signed, unsigned, forged or
replayed, in CBOR or JSON; garbage; temperature, power, fan and sensor faults; host
presence; time; reboots) and checks, on every control tick, the invariants of
docs/safety.md against an oracle that knows only the raw hardware:

I1 each fan's PWM duty >= the floor computed from the raw ADC codes through the
   board's *nominal* NTC curve (no config, no calibration): the minimum spin duty,
   the hot floor of the reading minus the calibration band, 100 % at the compiled
   critical end, the sensor floor for an open/short controlled NTC, the stall floor
   for a stopped fan, the host-lost floor after the heartbeats stopped, the boot floor,
   the die-margin floor of the host's die against the GPU's slowdown (a heartbeat
   sent after noise without a delimiter is cut by it and never arrives: not counted);
   each counted only once the condition has lasted long enough to be detected. Every
   number comes from the oracle's own table (tests/oracle_floors.py, written from
   docs/safety.md), none from ``device.floors``: a wrong floor in the firmware is
   caught, not copied;
I2 while a fault cause the app reports persists, no fan is below what it was
   commanding the tick before the cause appeared;
I3 a refused (or unanswered) command leaves config, mode and duties unchanged;
I4 MANUAL only within its lease;
I5 no internal error, no failed tick (``App.failures``), boot always answers hello;
I6 an unauthenticated heartbeat changes nothing: the host-timeout clock restarts only
   after a signed heartbeat was sent, no value that only unsigned or forged heartbeats
   carried (``POISON_*``) reaches the module, and a signed heartbeat in a burst of
   unauthenticated ones is taken (SPEC section 14.1);
I7 no time at or above the GPU's slowdown - 2 degC without an over-temperature alarm
   (issue 25: the warning comes from the measured die, no later than slowdown - 2;
   before it, at the slowdown): once the module has ticked on a fresh heartbeat whose
   die is at or above its slowdown - 2 degC, with the GPU NTC inside the nominal
   table, it reports over-temperature or critical.

A violation raises ``InvariantError`` naming the invariant and the values.
"""

import oracle_floors as O
from fakehal import FakeHal, adc_code

from device import calib, config
from device import safety as S
from device.app import MODE_MANUAL, App
from protocol import catalog as C
from protocol import frame, jsonl, sign

KEY = bytes([0x5A ^ i for i in range(32)])
TICK_MS = 100
STEP_MS = 50
HB_MS = 1000
_DETECT_SENSOR = 1500  # ms
_DETECT_STALL_MS = 6000  # stall_ms 3 s + an RPM window + margin
_DETECT_HOST_MS = 6500  # host_timeout_ms 5 s + margin
_BOOT_MS = 100  # BOOT lasts 5 ticks: 100 ms at the shortest period (20 ms)
_NOMINAL = O.NTC_NOMINAL  # the oracle's own numbers (tests/oracle_floors.py)
_ADC_FS = 65535
POISON_POWER = 3999999  # mW: only unauthenticated heartbeats carry these (I6)
POISON_TEMP = 12345  # m degC


class InvariantError(AssertionError):
    pass


UNSURE = "unsure"  # a code at the edge of the nominal table: the oracle abstains


def nominal_mc(code):
    """Nominal NTC temperature (milli-degC) of an ADC code, None when it is certainly
    outside the nominal table (-55..200 degC: an open or short circuit), or UNSURE
    within 3 degC of the table's ends. The oracle's own float math, independent of
    the firmware's lookup table."""
    beta, r0, t0_mc, r_fixed, low = _NOMINAL
    if code <= 0 or code >= _ADC_FS:
        return None
    r = calib.adc_to_ohms(code, r_fixed, low)
    if r <= 0:
        return None
    t_k = calib.beta_temp_k(r, beta, r0, t0_mc / 1000.0 + 273.15)
    t_mc = (t_k - 273.15) * 1000
    if t_mc < -58000 or t_mc > 203000:
        return None
    if t_mc < -52000 or t_mc > 197000:
        return UNSURE
    return int(t_mc)


class Harness:
    """The fake board, the firmware, a signing host and the oracle."""

    def __init__(self, rng=None):
        self.rng = rng
        self.hal = FakeHal()
        with open(self.hal.fs_dir.rstrip("/") + "/secret.key", "wb") as f:
            f.write(KEY)
        self.key = KEY
        self.now = 0
        self.host_on = False
        self.last_hb = -(10**9)
        self.host_seen_at = None
        self.hb_power = 300000
        self.hb_temp = 60000
        self.hb_slowdown = 0  # the GPU's slowdown the heartbeats carry, 0 = not sent
        # the last heartbeat for the die floor: [sent at, app.ticks once the module had
        # read it (None before), die, slowdown, sent on a clean line]
        self.die_hb = None
        # the line is at a frame boundary: nothing sent yet, or the last bytes sent
        # ended with a 0x00 (every decoder state ends there: SPEC section 4.3) or were
        # one of our whole JSON lines sent on a clean line. A frame sent after noise
        # without a delimiter is cut by it: it never reaches the module.
        self.line_clean = True
        self.fan_state = ["ok", "ok"]
        self.fan_since = [0, 0]
        self.noise_frac = [0, 0]
        self.code_hist = [[(0, self.hal.adc[i].read_u16())] for i in range(4)]
        self.steps = 0
        self.ticks_checked = 0
        self.violations = 0
        self.replay = []  # signed frames already sent (for replay attempts)
        self.seq = 0
        self.allow_internal = False  # a test that injects a handler bug sets it
        self.boot()

    # -- the module ---------------------------------------------------------------
    def boot(self):
        self.app = App(self.hal)
        self.app.boot()
        self.app.wdt = self.hal.wdt_start(self.app.cfg["watchdog_ms"])
        self.boot_at = self.now
        self.resets = self.hal.resets
        out = self.hal.take()
        hello = [m for m in out if m.ok and m.name == "hello"]
        if not hello:
            raise InvariantError("I5: boot did not send hello: %r" % (out[:4],))
        self.signer = sign.Signer(self.key, 1, self._clock)
        self.signer.nonce = hello[0].fields["nonce"]
        self.prev_duty = [self.hal.pwm[0].duty_u16(), self.hal.pwm[1].duty_u16()]
        self.held = {}  # I2: cause bit -> duties at the tick before it appeared
        self.hb_clock = self.app.hb_ms  # I6: the module's host clock, last seen
        self.signed_hb = False  # I6: a signed heartbeat was sent since it last moved

    def _clock(self):
        return 1000000 + self.now * 100  # 10 us units, monotonic with fake time

    # -- time ---------------------------------------------------------------------
    def advance(self, ms):
        end = self.now + ms
        while self.now < end:
            if self.host_on and self.now - self.last_hb >= HB_MS:
                self._send_heartbeat()
            self.app.step()
            self._check_tick()
            self.hal.advance(STEP_MS)
            self._tach_noise()
            self.now += STEP_MS
            if self.hal.resets != self.resets:  # reboot command or a reset
                self.boot()

    def _tach_noise(self):
        for i in range(2):
            if self.fan_state[i] == "noisy":  # stopped rotor, ~10 noise edges a second
                self.noise_frac[i] += STEP_MS
                while self.noise_frac[i] >= 100:
                    self.noise_frac[i] -= 100
                    self.hal.tach[i].pulse(1)

    def _send_heartbeat(self):
        self.last_hb = self.now
        if self.host_seen_at is None:
            self.host_seen_at = self.now
        fields = {"gpu_temp": self.hb_temp, "gpu_power": self.hb_power, "power_limit": 700000}
        if self.hb_slowdown:
            fields["gpu_slowdown"] = self.hb_slowdown
        self.die_hb = [self.now, None, self.hb_temp, self.hb_slowdown, self.line_clean]
        self.send_signed("heartbeat", fields)

    # -- the world ------------------------------------------------------------------
    def set_code(self, ch, code):
        self.hal.set_code(ch, code)
        self.code_hist[ch].append((self.now, code))
        if len(self.code_hist[ch]) > 8:
            self.code_hist[ch] = self.code_hist[ch][-8:]

    def set_temp(self, ch, temp_c):
        self.set_code(ch, adc_code(temp_c))

    def set_fan(self, i, state):
        """``ok`` (spins with duty), ``stalled`` (no pulses), ``noisy`` (stopped with
        noise edges on the tach)."""
        if state != self.fan_state[i]:
            self.fan_since[i] = self.now
        self.fan_state[i] = state
        self.hal.fan_ok[i] = state == "ok"

    def set_power(self, ma):
        self.hal.ina.set_current_ma(ma)

    def host(self, on):
        if not on:
            self.host_on = False
        elif not self.host_on:
            self.host_on = True
            self.last_hb = -(10**9)

    # -- the link -------------------------------------------------------------------
    def _put(self, data, line=False):
        """Put ``data`` on the line; ``line``: it is one whole JSON line of ours."""
        if data:
            if data[-1] == 0:
                self.line_clean = True
            elif not (line and self.line_clean and data[-1] == 0x0A):
                self.line_clean = False
        self.hal.send(data)

    def _next_seq(self):
        self.seq = (self.seq + 1) & 0xFFFF
        return self.seq

    def send_signed(self, name, fields, fmt="cbor"):
        seq = self._next_seq()
        if name == "heartbeat":
            self.signed_hb = True
        if fmt == "json":
            data = jsonl.encode_line(name, fields, seq, signer=self.signer)
        else:
            data = frame.encode_frame(name, fields, seq, signer=self.signer)
        if name != "heartbeat":
            self.replay.append(data)
            if len(self.replay) > 16:
                self.replay = self.replay[-16:]
        self._put(data, fmt == "json")
        return seq

    def send_unsigned(self, name, fields, fmt="cbor"):
        seq = self._next_seq()
        if fmt == "json":
            data = jsonl.encode_line(name, fields, seq)
        else:
            data = frame.encode_frame(name, fields, seq)
        self._put(data, fmt == "json")
        return seq

    def send_forged(self, name, fields):
        """Signed with the wrong key."""
        seq = self._next_seq()
        bad = sign.Signer(bytes(32), 1, self._clock)
        bad.nonce = self.signer.nonce
        self._put(frame.encode_frame(name, fields, seq, signer=bad))
        return seq

    def send_replay(self, k):
        if not self.replay:
            return
        self._put(self.replay[k % len(self.replay)], True)  # our frames and lines

    def send_raw(self, data):
        self._put(data)

    def heartbeat_burst(self, n, signed_at, forged):
        """One burst: a delimiter (ends any partial run), ``n`` unsigned (or forged)
        heartbeats carrying ``POISON_*`` values and, at position ``signed_at`` (none
        when > n), the host's signed heartbeat, which the module must take (I6)."""
        hb = {"gpu_power": POISON_POWER, "gpu_temp": POISON_TEMP}
        bad = None
        if forged:
            bad = sign.Signer(bytes(32), 1, self._clock)
            bad.nonce = self.signer.nonce
        queued = self.hal.rx_pending()
        before = (self.app.hb_seen, self.app.hb_ms)
        boots = self.resets
        data = b"\x00"
        k = 0
        while k <= n:
            if k == signed_at:  # the module reads the ring: one burst all the same
                self._put(data)
                queued += len(data) + 64
                data = b""
                self._send_heartbeat()
            if k < n:
                data += frame.encode_frame("heartbeat", hb, self._next_seq(), signer=bad)
            k += 1
        queued += len(data)
        self._put(data)
        self.advance(STEP_MS * (2 + queued // 128))  # the module reads 128 B a step
        taken = (self.app.hb_seen, self.app.hb_ms) != before
        if signed_at <= n and self.resets == boots and not taken:
            self._fail("I6: the signed heartbeat in a burst of %d unauthenticated was lost" % n)

    def _check_unauthenticated(self):
        """I6, on every tick (see the module docstring)."""
        app = self.app
        if app.hb_ms != self.hb_clock:
            if not self.signed_hb:
                self._fail("I6: the host clock restarted without a signed heartbeat")
            self.hb_clock = app.hb_ms
            self.signed_hb = False
        if app.gpu_power_mw == POISON_POWER or app.gpu_temp_mc == POISON_TEMP:
            self._fail(
                "I6: an unauthenticated heartbeat's value reached the module: %r mW, %r m degC"
                % (app.gpu_power_mw, app.gpu_temp_mc)
            )

    def snapshot(self):
        app = self.app
        return (
            config.canonical(app.cfg),
            app.mode,
            app.manual_duty[0],
            app.manual_duty[1],
            app.paired,
        )

    def command(self, name, fields, how="signed", fmt="cbor"):
        """Send one command, run until it is answered (or 300 ms), check I3.

        Returns "ack", "nack" or None (no answer)."""
        before = self.snapshot()
        self.hal.take()
        if how == "signed":
            seq = self.send_signed(name, fields, fmt)
        elif how == "unsigned":
            seq = self.send_unsigned(name, fields, fmt)
        else:
            seq = self.send_forged(name, fields)
        boots = self.resets
        window = name == "pair" and not self.app.paired  # the pairing window
        expiries = self.app.manual_expiries
        answer = None
        t = 0
        while t < 300 and answer is None:
            self.advance(STEP_MS)
            t += STEP_MS
            if self.resets != boots:
                return "reboot"
            for m in self.hal.take():
                if m.ok and m.name in ("ack", "nack") and m.fields["ref"] == seq:
                    answer = m
        refused = answer is None or answer.name == "nack"
        changing = name not in ("hello_request", "config_get", "cal_read", "heartbeat")
        if how != "signed" and changing and not refused and not window:
            raise InvariantError("I3: %s %s was accepted: %r" % (how, name, answer))
        after = self.snapshot()
        if self.app.manual_expiries != expiries:  # the lease ended meanwhile (S5)
            before = (before[0],) + before[2:]
            after = (after[0],) + after[2:]
        if refused and name != "heartbeat" and after != before and self.resets == boots:
            raise InvariantError(
                "I3: refused %s %r changed the module: %r -> %r"
                % (name, fields, before, self.snapshot())
            )
        if answer is None:
            return None
        return answer.name

    def reboot(self):
        """A power cycle: a new App on the same flash."""
        self.hal.resets += 1
        self.resets = self.hal.resets
        self.boot()

    # -- the oracle -----------------------------------------------------------------
    def _min_temp(self, ch, window_ms):
        """Lowest nominal temperature the channel's codes had in the window; None
        when a code in the window is outside the nominal table."""
        lo = None
        hist = self.code_hist[ch]
        for k in range(len(hist)):
            t0, code = hist[k]
            t1 = hist[k + 1][0] if k + 1 < len(hist) else self.now + 1
            if t1 <= self.now - window_ms:
                continue
            v = nominal_mc(code)
            if v is None or v is UNSURE:
                return v
            if lo is None or v < lo:
                lo = v
        return lo

    def _fault_since(self, ch):
        """How long the channel's code has been outside the nominal table (ms)."""
        hist = self.code_hist[ch]
        since = None
        for t0, code in hist:
            v = nominal_mc(code)
            if v is UNSURE:
                return 0
            if v is None:
                if since is None:
                    since = t0
            else:
                since = None
        return 0 if since is None else self.now - since

    def _fresh_die(self):
        """(die, slowdown) of the last heartbeat once the module has ticked on it, while
        it is certainly fresh and the host present (sent less than the shortest host
        timeout, 1 s, ago); None otherwise, when a heartbeat the harness did not
        record (a burst's) came after it, and when it was sent after noise without a
        delimiter (it may never have arrived: the decoder resynchronises only at the
        next 0x00, SPEC section 4.3; docs/safety.md, the die-margin floor)."""
        hb = self.die_hb
        if hb is None or not self.host_on or hb[0] != self.last_hb or hb[0] < self.boot_at:
            return None
        if not hb[4]:
            return None
        if self.now - hb[0] >= 900 or hb[1] is None or self.app.ticks <= hb[1]:
            return None
        return hb[2], hb[3]

    def _die_floor(self):
        """The die-margin floor (tests/oracle_floors.py) of a fresh die, else 0."""
        d = self._fresh_die()
        return 0 if d is None else O.die_floor(d[0], d[1])

    def _check_slowdown_alarm(self):
        """I7 (see the module docstring)."""
        d = self._fresh_die()
        if d is None or not d[1] or d[0] < d[1] - O.DIE_WARN_MARGIN_MC:
            return
        t = self._min_temp(0, 1000)
        if t is None or t is UNSURE:
            return  # an open/short GPU NTC: FAILSAFE(sensor), the die floor at 100 %
        if not self.app.sup.faults & (C.FAULT_OVER_TEMP | C.FAULT_CRITICAL_TEMP):
            self._fail("I7: die %d at or above slowdown %d - 2 degC without an alarm" % d)

    def oracle_floor(self):
        """The floor every fan must be at, from the raw ADC codes, the fans, the host's
        heartbeats and time, through the oracle's own table (tests/oracle_floors.py,
        written from docs/safety.md): no number here comes from device.floors."""
        fl = O.MIN_SPIN
        reasons = ["min_spin"]

        def up(v, why):
            nonlocal fl
            if v > fl:
                fl = v
                reasons.append(why)

        if self.now - self.boot_at < _BOOT_MS:
            up(O.BOOT, "boot")
        for ch in range(4):
            t = self._min_temp(ch, 1000)
            if t is UNSURE:
                continue
            if t is not None:
                prot = t - O.CAL_BAND_MC - 500  # the firmware's LUT interpolates
                up(O.hot_floor(ch, prot), "hot%d" % ch)
                full = O.hot_full(ch)
                if full is not None and prot >= full + 1000:
                    up(O.CRITICAL, "critical%d" % ch)
            elif ch < 3 and min(self._fault_since(ch), self.now - self.boot_at) >= _DETECT_SENSOR:
                up(O.SENSOR, "sensor%d" % ch)
        for i in range(2):
            # (a noisy tach is caught only at a duty where its reading is implausible:
            # tests/test_app_safety.py covers it; the oracle asks only for stalls)
            since = max(self.fan_since[i], self.boot_at)  # a new boot detects anew
            if self.fan_state[i] == "stalled" and self.now - since >= _DETECT_STALL_MS:
                up(O.STALL, "stall%d" % i)
        if (
            self.host_seen_at is not None
            and self.now - self.last_hb >= max(_DETECT_HOST_MS, self._host_timeout_ms() + 1500)
            and self.last_hb >= self.boot_at
        ):
            up(O.HOST_LOST, "host_lost")
        up(self._die_floor(), "die_margin")
        return fl, reasons

    def _host_timeout_ms(self):
        """The configured ``control.host_timeout_ms`` (the spec's host-lost delay: a
        command may raise it), 5 s when the App has none yet."""
        return getattr(self.app, "host_timeout_ms", 5000) if self.app is not None else 5000

    def _check_tick(self):
        app = self.app
        self.ticks_checked += 1
        hb = self.die_hb
        if hb is not None and hb[1] is None and not self.hal.rx_pending():
            hb[1] = app.ticks  # every byte sent was read: the next tick uses it
        d = [self.hal.pwm[0].duty_u16(), self.hal.pwm[1].duty_u16()]
        fl, why = self.oracle_floor()
        for i in range(2):
            if d[i] < fl:
                self._fail("I1: fan%d duty %d < floor %d (%s)" % (i + 1, d[i], fl, why))
        causes = app.sup.causes & 0x3F & ~S.CAUSE_BOOT
        held = self.held
        for bit in list(held):
            if not causes & bit:
                del held[bit]
        bit = 1
        while bit <= causes:
            if causes & bit and bit not in held:
                held[bit] = (self.prev_duty[0], self.prev_duty[1])
            bit <<= 1
        for bit in held:
            h = held[bit]
            for i in range(2):
                if d[i] < h[i]:
                    self._fail(
                        "I2: fan%d duty %d fell below %d while cause 0x%x lasts"
                        % (i + 1, d[i], h[i], bit)
                    )
        self.prev_duty = d
        if app.mode == MODE_MANUAL:
            age = self.hal.ticks_ms() - app.manual_ms
            if age > O.MANUAL_LEASE_MS + 2 * TICK_MS:
                self._fail("I4: MANUAL for %d ms" % age)
        if app.failures or (app.internal_errors and not self.allow_internal):
            self._fail(
                "I5: %d failed ticks, %d internal errors" % (app.failures, app.internal_errors)
            )
        self._check_unauthenticated()
        self._check_slowdown_alarm()

    def _fail(self, text):
        self.violations += 1
        raise InvariantError(text + " at t=%d ms" % self.now)


# --- the action catalogue (shared by the walk, the state machine and the bench) ------

def _deep(n, leaf=1):
    v = leaf
    for _ in range(n):
        v = [v]
    return v


def _deep_line(n):
    inner = "[" * n + "1" + "]" * n
    return ('{"type":"config_set","values":{"curve.points":' + inner + "}}\n").encode()


# config_set values: the attacks of issue 8 and ordinary changes
CONFIG_CHANGES = (
    {"fans.0.min_duty": 0},
    {"fans.1.kick_duty": 0},
    {"fans.0.kick_ms": 0},
    {"safety.min_manual_duty": 0},
    {"safety.host_lost": 0},
    {"safety.sensor_fault": 32768},
    {"channels.0.correction": [-40]},
    {"channels.1.correction": [1000000]},
    {"channels.0.correction": [-4.5]},
    {"channels.0.filter": "none"},
    {"channels.2.filter": "ema"},
    {"channels.0.setpoint_mc": 110000, "channels.0.warn_mc": 111000},
    {"channels.0.setpoint_mc": 84000},
    {"channels.0.crit_mc": 100000},
    {"pid.kp": 0, "pid.ki": 0, "pid.kd": 0, "pid.kff": 0},
    {"pid.kp": 6000},
    {"pid.slew_pct_s": 1},
    {"control.period_ms": 20},
    {"control.telemetry_format": "json"},
    {"control.telemetry_format": "cbor"},
    {"control.host_timeout_ms": 1000},
    {"control.mode": "manual"},
    {"control.mode": "curve"},
    {"control.mode": "auto"},
    {"ina226.shunt_uohm": 100},
    {"ina226.uv_mv": 0},
    {"watchdog_ms": 1000},
    {"curve.points": [[30000, 0], [90000, 0]]},
    {"curve.points": [[90000, 65535], [30000, 13107]]},
    {"channels.0.model": "sh", "channels.0.sh": [0.001, 0.0002, 0.0000001]},
    {"fans.0.stall_ms": 60000},
    {"version": 2},
    {"nonexistent.key": 1},
    {"channels.9.beta": 1},
    {"pid": {"kp": 7000}},
    {"curve.points": _deep(6)},
)

COMMANDS = (
    ("fan_mode", {"mode": 1, "duty1": 0, "duty2": 0}),
    ("fan_mode", {"mode": 1, "duty1": 13107}),
    ("fan_mode", {"mode": 1, "duty1": 19661, "duty2": 19661}),
    ("fan_mode", {"mode": 1, "duty1": 40000, "duty2": 65535}),
    ("fan_mode", {"mode": 0}),
    ("fan_mode", {"mode": 2}),
    ("setpoints", {"sp_gpu": 110000}),
    ("setpoints", {"sp_gpu": 60000, "sp_vram": 70000}),
    ("setpoints", {"sp_mos": 125000}),
    ("pid_gains", {"kp": 0, "ki": 0, "kd": 0, "kff": 0}),
    ("pid_gains", {"kp": 1000000, "ki": 1000000}),
    ("pid_gains", {"kp": 5000}),
    ("fan_curve", {"points": [[30000, 13107], [85000, 65535]]}),
    ("fan_curve", {"points": [[30000, 0], [90000, 0]]}),
    ("fan_curve", {"points": [[30000, 13107], [20000, 65535]]}),
    ("fan_curve", {"points": [[1, 2, 3], [4]]}),
    ("fan_curve", {"points": [["a", None], [True, 1.5]]}),
    ("config_save", {}),
    ("config_reset", {}),
    ("config_get", {}),
    ("config_get", {"section": "pid"}),
    ("config_get", {"section": "nope"}),
    ("cal_read", {"channel": 0}),
    ("cal_read", {"channel": 7}),
    ("cal_write", {"channel": 0, "model": 2, "coeffs": [-40]}),
    ("cal_write", {"channel": 1, "model": 2, "coeffs": [1.5, 0.01]}),
    ("cal_write", {"channel": 0, "model": 1, "coeffs": [3950, 10000, 25000]}),
    ("cal_write", {"channel": 2, "model": 1, "coeffs": [100, 1, 0]}),
    ("cal_write", {"channel": 0, "model": 0, "coeffs": [0.001, 0.0002, 0.0000001]}),
    ("cal_write", {"channel": 5, "model": 2, "coeffs": [0]}),
    ("selftest", {}),
    ("hello_request", {}),
    ("reboot", {}),
) + tuple([("config_set", {"values": v}) for v in CONFIG_CHANGES])

GARBAGE = (
    b"\x00\x00\x00",
    b"\xff" * 40 + b"\x00",
    b'{"type":"hello_request","type":"config_reset"}\n',
    b'{"type":"fan_mode","mode":"manual","duty1":0,"duty1":50}\n',
    b'{"type":"fan_mode","mode":"manual","duty1":NaN}\n',
    b'{"type":"config_set","values":{"pid.kp":1e999}}\n',
    b'{"type":"config_set","values":{"pid.kp":123456789012345678901234567890}}\n',
    b'{"type":"heartbeat","gpu_power":"\xc0\xaf"}\n',
    b'{"type":"heartbeat","gpu_temp":"\x01\x02"}\n',
    b'{"type":"config_set","values":{"a":1}\n',
    b"\x01\x02\x03\x04\x05\x06\x07\x08\x00",
    b"[" * 900 + b"\n",
    _deep_line(100),
    _deep_line(9),
    b"hello there\n",
    b"\x03\x03\x04\x00",
)


def random_action(h, rnd):
    """One random action on harness ``h``; ``rnd(n)`` returns an int in 0..n-1."""
    k = rnd(100)
    if k < 28:
        name, fields = COMMANDS[rnd(len(COMMANDS))]
        r = rnd(10)
        how = "signed" if r < 7 else ("unsigned" if r < 9 else "forged")
        fmt = "json" if rnd(3) == 0 else "cbor"
        if name == "reboot" and rnd(4):
            return  # rarer
        try:
            h.command(name, fields, how, fmt)
        except (ValueError, TypeError) as e:  # the host-side encoder refused it
            if "seq" in str(e):
                raise
    elif k < 33:
        h.send_replay(rnd(16))
        h.advance(200)
    elif k < 38:
        h.send_raw(GARBAGE[rnd(len(GARBAGE))])
        h.advance(200)
    elif k < 53:
        ch = rnd(4)
        r = rnd(10)
        if r < 6:
            h.set_temp(ch, (20, 35, 50, 65, 75, 82, 88, 92, 97, 105, 120)[rnd(11)])
        elif r < 8:
            h.set_code(ch, (0, 65535, 3, 65000, 30000)[rnd(5)])
        else:
            h.set_temp(ch, 25 + rnd(60))
    elif k < 58:
        h.set_power((0, 5000, 30000, 55000)[rnd(4)])
        h.hb_power = (0, 100000, 350000, 700000)[rnd(4)]
        h.hb_temp = (60000, 80000, 84500, 86000, 88000, 92000)[rnd(6)]
        h.hb_slowdown = (0, 83000, 87000, 89000)[rnd(4)]
    elif k < 64:
        h.set_fan(rnd(2), ("ok", "ok", "stalled", "noisy")[rnd(4)])
    elif k < 72:
        h.host(rnd(3) != 0)
    elif k < 73:
        h.reboot()
    elif k < 77:
        n = (1, 3, 8)[rnd(3)]
        h.heartbeat_burst(n, rnd(n + 2), rnd(3) == 0)
    else:
        h.advance((50, 200, 1000, 3000, 7000)[rnd(5)])
    h.steps += 1
