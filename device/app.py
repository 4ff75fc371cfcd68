"""The firmware application: scheduler, sensors -> control -> fans, protocol link.

``App(hal)`` builds everything from the stored config (factory defaults when it is
missing or corrupt); ``app.run()`` is the main loop; ``app.step()`` runs one
iteration and is what tests and the simulator drive. Each control tick:

    sample NTCs + INA226 + tachs -> supervisor (faults, state, floors)
    -> control law (PID on the worst channel + GPU-power feed-forward, curve, manual)
    -> max(request, safety floor) -> fans -> telemetry frame when due -> watchdog

In steady state none of that allocates (integers, preallocated buffers); commands and
events allocate, they happen on transitions only. The watchdog is fed only at the end
of a tick that completed; an unexpected exception drives both fans to 100 % and stops
feeding it, so the MCU resets.
"""

from array import array

from device import FW_VERSION
from device import floors as F
from device import failsafe as FS
from device import safety as S
from device.control.estimator import INVALID as _NO_EST
from device.control.estimator import DieEstimator
from device.control.select import worst_channel
from device.drivers.ina226 import INA226
from device.drivers.ntc import NTC
from device.failsafe import EventQueue
from device.ticks import ticks_add, ticks_diff
from protocol import catalog as C
from protocol import frame, sign
from protocol import telemetry as T
from protocol.message import FMT_CBOR, FMT_JSON

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


_N_CH = const(4)
_N_FAN = const(2)
_LUT_POINTS = const(257)  # NTC.from_config's table size (the spare table's)
_BOOT_TICKS = const(5)  # filter warm-up before sensor verdicts are trusted
_RX_SIZE = const(128)
_INA_RETRY_MS = const(5000)
_DIE_FRESH_MS = const(3000)  # a heartbeat die temperature older than this is stale
_DIE_SLOWDOWN_MARGIN_MC = const(5000)  # the die loop's setpoint: at most slowdown - this
_DIE_SP_NO_SLOWDOWN_MC = const(76500)  # ... or this without one (an RTX 30xx: 83 - 6.5)
# Standalone on the chassis model (device.control.chassis): its estimate ``est_safe``
# counts on the GPU channel so that it warns at slowdown - _EST_WARN_MC and is critical
# at slowdown + _EST_CRIT_MC at the latest (as the host's die does: device.failsafe);
# the slowdown is the lowest of the model's, the host's (or the learned) one, else
# _EST_SLOW_GUESS_MC (an RTX 30xx's).
_EST_WARN_MC = const(2000)
_EST_CRIT_MC = const(3000)
_EST_SLOW_GUESS_MC = const(83000)
# The hosted law with a fresh die (App._margin_law): a controlled channel counts from
# this far under its warning limit; the feed-forward guard's die rise over _RISE_S
# (at least _RISE_MIN_MC), extrapolated over _PROJ_S, and its band under the setpoint.
_COMP_MARGIN_MC = const(3000)
_DIE_MEASURED = const(-1)  # device.failsafe.Supervisor.follow_slowdown: the die counts
_RISE_S = const(10)  # device.control.estimator's RISE_S
_RISE_MIN_MC = const(2000)
_PROJ_S = const(45)
_PF_STEP_MW = const(20000)
_GUARD_MS = const(180000)
_GUARD_BAND_MC = const(4000)
# The learned slowdown and offset (device.safety.learn) reach the flash when they moved
# by _LEARNED_STEP_MC or more: when the host is lost (a transition), else at most once
# per LEARNED_SAVE_MS; a failed write is retried after _LEARNED_RETRY_MS at the soonest.
_LEARNED_STEP_MC = const(1000)
LEARNED_SAVE_MS = const(1800000)  # 30 min
_LEARNED_RETRY_MS = const(60000)
REPL_FLAG = "repl.flag"  # in fs_dir: the next boot stays in the REPL
MODE_AUTO = const(0)
MODE_MANUAL = const(1)
MODE_CURVE = const(2)
# Safety causes that end a MANUAL lease at once.
_LEASE_CAUSES = S.CAUSE_SENSOR | S.CAUSE_STALL | S.CAUSE_OVER | S.CAUSE_CRIT
# NACKs: a token bucket, at most _NACK_BURST at once and one more per _NACK_MS.
_NACK_BURST = const(8)
_NACK_MS = const(100)
# config_save flash writes: SAVE_BURST at once, one more per SAVE_MS (device.commands).
SAVE_BURST = const(3)
SAVE_MS = const(20000)
_UNAUTH_EVENT_MS = const(1000)  # at most one ``unauthorized`` event a second
_PAIR_WINDOW_MS = const(60000)  # after power-on, a module with no secret can be paired
SECRET_FILE = "secret.key"
# Reads stay open; everything else needs a valid signature (SPEC.md "Signed commands").
_OPEN_TYPES = (C.T_HELLO_REQUEST, C.T_CONFIG_GET, C.T_CAL_READ)
# Rejections answered with a NACK (SPEC section 11); crc/framing/oversize/noise are not.
_NACKED_KINDS = ("version", "unknown_type", "invalid", "undecodable")
_HB_DEF = C.by_type(C.T_HEARTBEAT)[C.M_FIELDS]
_N_HB = len(_HB_DEF)
_HB_TEMP = C.field_index(C.by_type(C.T_HEARTBEAT), "gpu_temp")
_HB_POWER = C.field_index(C.by_type(C.T_HEARTBEAT), "gpu_power")
_HB_SLOWDOWN = C.field_index(C.by_type(C.T_HEARTBEAT), "gpu_slowdown")

# protocol.telemetry's field indexes the tick sets: copies, folded by the compiler (on
# the MCU that module answers them through its __getattr__; tests/test_catalog_copies.py).
_TM_UPTIME_S = const(0)
_TM_STATE = const(1)
_TM_REASON = const(2)
_TM_FAULTS = const(3)
_TM_TEMP_GPU = const(4)
_TM_FAN1_RPM = const(8)
_TM_FAN2_RPM = const(9)
_TM_FAN1_DUTY = const(10)
_TM_FAN2_DUTY = const(11)
_TM_V_IN = const(12)
_TM_I_IN = const(13)
_TM_P_IN = const(14)
_TM_TARGET = const(15)
_TM_FLASH_WRITES = const(16)
_TM_AUTH_FAILURES = const(17)
_TM_INTERNAL_ERRORS = const(18)

BANNER = "MODULER READY v" + FW_VERSION

# App._rt: the App's rarely touched ints in one array (an instance dict of 84 names
# was a 97-slot table, one 776 B block at every boot; 73 names fit 73 slots, 584 B).
# The token buckets (tokens, then their clock): nacks, config_save flash writes.
_RT_NACK = const(0)  # [0] tokens, [1] since
_RT_SAVE = const(2)  # [2] tokens, [3] since
_RT_UNAUTH_MS = const(4)  # the last ``unauthorized`` event
_RT_SAVED_SLOW = const(5)  # the learned record as last written (device.cfg.files)
_RT_SAVED_OFF = const(6)
_RT_SAVED_MS = const(7)
_RT_INA_TRIED_MS = const(8)  # the last INA226 (re)connection attempt
RT_CRIT0 = const(9)  # the GPU channel's configured critical (device.commands.commit)
RT_UV_MV = const(10)  # the input's under-voltage threshold (ina226.uv_mv)
_RT_PF = const(11)  # the feed-forward power at its last rise (App._margin_law)
_RT_PF_MS = const(12)  # ... and when it rose
_RT_N = const(13)


class App:
    def __init__(self, hal):
        self.hal = hal
        self.events = EventQueue(16)
        self.fmt = FMT_CBOR
        self.seq = 0
        self.running = True
        self.rx = bytearray(_RX_SIZE)
        # signing: a fresh nonce every boot, the secret from flash (SPEC "Signed commands");
        # device/nonce.py says how it stays unique on chips without an RNG (F411)
        from device.nonce import boot_nonce  # boot only: _release() forgets it

        self.nonce, self.nonce_source = boot_nonce(sign.NONCE_LEN, hal.fs_dir, hal.unique_id())
        key = _commands().load_secret(self)
        self.paired = key is not None
        self.verifier = sign.Verifier(key)
        self.verifier.set_nonce(self.nonce)
        self.hb = frame.HeartbeatState()
        self._hb_vals = array("i", [0] * (_N_HB + 1))
        self.decoder = frame.StreamDecoder(accept=C.H2D, verifier=self.verifier, heartbeat=self.hb)
        self._on_item = self._sink  # bound once: naming a bound method allocates it
        self.enc = T.TelemetryEncoder(json=False)  # a line's buffer when one is sent
        self.temps = array("i", [0] * _N_CH)
        self.setpoints = array("i", [0] * _N_CH)
        self.pm = array("i", [0, 0, 0])  # mV, mA, mW
        self.duty = array("i", [0] * _N_FAN)
        self.manual_duty = array("i", [0] * _N_FAN)
        self.worst_out = array("i", [0, 0])
        self._prot = array("i", [0] * _N_CH)  # protection readings with the host's die
        self.est = DieEstimator()
        self.die_sp = 0
        self.hosted = False  # the PID regulates the die envelope (not the NTC)
        self.gpu_temp_ms = 0
        self.ntc_open = 0
        self.ntc_short = 0
        self.pm_fault = False
        self.uv = False
        self.ticks = 0
        self.missed = 0
        self.failures = 0
        self.internal_errors = 0
        self.auth_failures = 0
        self.nacks_suppressed = 0
        self.flash_writes = 0
        self.mode = MODE_AUTO
        self.manual_ms = 0
        self.manual_expiries = 0
        self.hb_ms = 0
        self.hb_seen = False
        self.gpu_power_mw = 0
        self.gpu_temp_mc = None
        self.gpu_slowdown_mc = 0  # the GPU's slowdown temperature (heartbeat), 0 = none
        self._tune = None  # the relay autotune, made by the first autotune command
        self.selftest = None
        self.wdt = None
        self.fans = None
        self.safety = None
        self.sup = None
        self.watch = None  # sensor plausibility (device.plausibility), set by _commit
        self.controlled = 0
        now = hal.ticks_ms()
        rt = self._rt = array("i", [0] * _RT_N)
        rt[_RT_NACK] = _NACK_BURST
        rt[_RT_NACK + 1] = now
        rt[_RT_SAVE] = SAVE_BURST
        rt[_RT_SAVE + 1] = now
        rt[_RT_UNAUTH_MS] = now - _UNAUTH_EVENT_MS
        self.config_source = "factory"
        self.lut_spare = None  # a free NTC table (device.commands._recycle)
        _commands().boot_config(self)
        self._load_learned()
        _release()  # configured: the config code's RAM is free again (device.commands)
        self._spare_lut()
        if hal.reset_cause() == "watchdog":
            self.events.push(
                C.REASON_WATCHDOG_RESET, C.SEV_ALARM, True, -1, 0, C.STATE_BOOT, C.STATE_BOOT
            )
        now = hal.ticks_ms()
        self.boot_ms = now
        self.last_tick = now
        self.next_tick = now
        self.next_tel = now

    # -- construction from config ------------------------------------------------
    def _build(self, cfg):
        """Check ``cfg`` by building every object it configures on stand-in hardware
        (device.commands.build); raises without changing anything when it does not."""
        return _commands().build(self, cfg)

    def apply_changes(self, changes):
        """The ``config_set`` transaction (device.commands.apply_changes)."""
        _commands().apply_changes(self, changes)
        _release(self.fmt == FMT_JSON)

    def open_ina(self):
        """(Re)connect the INA226; a missing or wrong chip is a power-monitor fault,
        retried every ``_INA_RETRY_MS`` from the tick (a loose cable at boot heals)."""
        self._rt[_RT_INA_TRIED_MS] = self.hal.ticks_ms()
        try:
            dev = _ina226(self.hal.i2c, self.ina_cfg)
        except OSError:
            self.ina = None
            self.pm_fault = True
            return False
        self.ina = dev
        self.pm_fault = False
        return True

    # -- what the module learned from its host (device.cfg.files' record) ---------------
    def _load_learned(self):
        from device.cfg.files import load_learned  # boot only: _release() forgets it

        sf = self.safety
        sf.learn_slow_mc, sf.learn_off_mc = load_learned(self.hal.fs_dir)
        rt = self._rt
        rt[_RT_SAVED_SLOW] = sf.learn_slow_mc
        rt[_RT_SAVED_OFF] = sf.learn_off_mc
        rt[_RT_SAVED_MS] = self.hal.ticks_ms()

    def _keep_learned(self, now, host_ok):
        """Write the learned record when it moved by a degree or more: at once when
        the host is lost, else at most every ``LEARNED_SAVE_MS`` (flash wear).
        Allocates only when it writes."""
        sf = self.safety
        rt = self._rt
        d = sf.learn_off_mc - rt[_RT_SAVED_OFF]
        if sf.learn_slow_mc == rt[_RT_SAVED_SLOW] and -_LEARNED_STEP_MC < d < _LEARNED_STEP_MC:
            return
        wait = LEARNED_SAVE_MS if host_ok else _LEARNED_RETRY_MS
        if ticks_diff(now, rt[_RT_SAVED_MS]) < wait:
            return
        rt[_RT_SAVED_MS] = now
        slow = sf.learn_slow_mc
        off = sf.learn_off_mc
        try:
            from device.cfg.files import save_learned

            save_learned(self.hal.fs_dir, slow, off)
        except (OSError, MemoryError):
            return  # retried later; the values in RAM still rule
        finally:
            _unload("device.cfg.files")
            _unload("device.cfg")
        rt[_RT_SAVED_SLOW] = slow
        rt[_RT_SAVED_OFF] = off

    # -- output ------------------------------------------------------------------
    def _next_seq(self):
        self.seq = (self.seq + 1) & 0xFFFF
        return self.seq

    def send(self, name, fields):
        """Encode one message in the current output format and write it."""
        if self.fmt == FMT_JSON:
            from protocol import jsonl  # imported for the first line (kept): not at boot

            data = jsonl.encode_line(name, fields, self._next_seq())
        else:
            data = frame.encode_frame(name, fields, self._next_seq())
        self.hal.port_write(data, len(data))

    def send_text(self, text):
        data = (text + "\n").encode()
        self.hal.port_write(data, len(data))

    def hello(self, ref=None):
        hal = self.hal
        fields = {
            "fw_version": FW_VERSION,
            "proto_minor": 0,
            "board": hal.name,
            "uid": _hex(hal.unique_id()),
            "channels": list(C.CHANNELS),
            "fans": _N_FAN,
            "max_frame": frame.MAX_FRAME,
            "telemetry_ms": self.telemetry_ms,
            "state": self.sup.state,
            "nonce": self.nonce,
            "paired": self.paired,
        }
        if ref is not None:
            fields["ref"] = ref
        self.send("hello", fields)

    def boot(self):
        """Banner and hello, as the first thing on the port."""
        self.send_text(BANNER)
        self.hello()

    def flush_events(self):
        """Send every queued event; True if one was an alarm or worse."""
        now_s = ticks_diff(self.last_tick, self.boot_ms) // 1000
        urgent = False
        while self.events.count:
            ev = self.events.pop()
            if ev["severity"] >= C.SEV_ALARM:
                urgent = True
            if ev["index"] < 0:
                del ev["index"]
            ev["uptime_s"] = now_s
            self.send("event", ev)
        return urgent

    def telemetry(self, now):
        enc = self.enc
        sup = self.sup
        enc.set(_TM_UPTIME_S, ticks_diff(now, self.boot_ms) // 1000)
        enc.set(_TM_STATE, sup.state)
        enc.set(_TM_REASON, sup.reason)
        enc.set(_TM_FAULTS, sup.faults)
        bad = self.ntc_open | self.ntc_short
        i = 0
        while i < _N_CH:
            if bad & (1 << i):
                enc.clear(_TM_TEMP_GPU + i)
            else:
                enc.set(_TM_TEMP_GPU + i, self.temps[i])
            i += 1
        enc.set(_TM_FAN1_RPM, self.fans[0].rpm)
        enc.set(_TM_FAN2_RPM, self.fans[1].rpm)
        enc.set(_TM_FAN1_DUTY, self.fans[0].duty)
        enc.set(_TM_FAN2_DUTY, self.fans[1].duty)
        if self.pm_fault:
            enc.clear(_TM_V_IN)
            enc.clear(_TM_I_IN)
            enc.clear(_TM_P_IN)
        else:
            enc.set(_TM_V_IN, self.pm[0])
            enc.set(_TM_I_IN, self.pm[1])
            enc.set(_TM_P_IN, self.pm[2])
        if self.worst_out[0] >= 0:
            enc.set(_TM_TARGET, self.worst_out[1])
        else:
            enc.clear(_TM_TARGET)
        enc.set(_TM_FLASH_WRITES, self.flash_writes)
        enc.set(_TM_AUTH_FAILURES, self.auth_failures)
        enc.set(_TM_INTERNAL_ERRORS, self.internal_errors)
        seq = self._next_seq()
        if self.fmt == FMT_JSON:
            n = enc.encode_json(seq)
        else:
            n = enc.encode_cbor(seq)
        self.hal.port_write(enc.out, n)

    @property
    def tune(self):
        """The relay autotune (device.control.autotune), imported and made on first use:
        a module that is never tuned keeps its RAM (about 1.3 KB) for the rest."""
        if self._tune is None:
            from device.control import autotune

            self._tune = autotune.RelayTune()
        return self._tune

    # -- the control tick --------------------------------------------------------
    def tick(self, now):
        dt = ticks_diff(now, self.last_tick)
        self.last_tick = now
        self.ticks += 1
        sf = self.safety
        # sample, through the bounded calibration (device.safety S2)
        open_m = 0
        short_m = 0
        i = 0
        while i < _N_CH:
            ntc = self.ntcs[i]
            t = ntc.read_mc()
            f = ntc.fault
            t = sf.bound(i, ntc.last_raw, t)
            if f == NTC.FAULT_NONE and t == NTC.INVALID:
                f = sf.nominal_fault(ntc.last_raw)
            if f == NTC.FAULT_OPEN:
                open_m |= 1 << i
            elif f == NTC.FAULT_SHORT:
                short_m |= 1 << i
            else:
                self.temps[i] = t
            i += 1
        self.ntc_open = open_m
        self.ntc_short = short_m
        if self.ina is not None:
            try:
                self.ina.read_into(self.pm)
                self.pm_fault = False
            except OSError:
                self.pm_fault = True
        elif ticks_diff(now, self._rt[_RT_INA_TRIED_MS]) >= _INA_RETRY_MS:
            self.open_ina()  # allocates, but only while the monitor is missing
        self.uv = (not self.pm_fault) and self.pm[0] < self._rt[RT_UV_MV]
        stall = 0
        tach = 0
        i = 0
        while i < _N_FAN:
            fan = self.fans[i]
            fan.update(now)
            if fan.stalled:
                stall |= 1 << i
            if fan.implausible and not fan.stalled:  # a stall is the stronger verdict
                tach |= 1 << i
            i += 1
        bad = open_m | short_m
        watch = self.watch
        if watch is not None:
            watch.update(self.temps, ~bad & 0xF, -1 if self.pm_fault else self.pm[2], now)
            stuck = watch.stuck & ~bad
            implaus = watch.implausible & ~bad
        else:
            stuck = 0
            implaus = 0
        host_ok = self.hb_seen and ticks_diff(now, self.hb_ms) < self.host_timeout_ms
        booted = self.ticks > _BOOT_TICKS
        sup = self.sup
        prot = sf.prot_mc
        # the host's die, when fresh: the die-margin floor (device.safety) and, with a
        # slowdown and a valid GPU channel, the offset learned for standalone limits
        fresh = host_ok and self.gpu_temp_mc is not None
        fresh = fresh and ticks_diff(now, self.gpu_temp_ms) < _DIE_FRESH_MS
        slow = self.gpu_slowdown_mc if host_ok else 0
        sf.slow_mc = slow if fresh else 0
        sf.die_mc = self.gpu_temp_mc if fresh else 0
        # the chassis model's estimate est_safe (device.control.chassis), while model.ok
        # and no fresh die: it only adds protection (alarms, the die floor; below). Not
        # evaluated on a fresh die (the hosted tick's cost): its filter starts again.
        m = sf.chassis  # the chassis model (device.commands._model)
        mest = _NO_EST
        if m is not None and fresh:
            m[0][8] = _NO_EST  # chassis' g_slow
        elif m is not None:
            b = bad | stuck | implaus
            d = self.fans[0].duty
            if self.fans[1].duty > d:
                d = self.fans[1].duty
            mest = m[1](
                m[0],
                _NO_EST if b & 1 else self.temps[0],
                _NO_EST if b & 8 else self.temps[3],
                -1 if self.pm_fault else self.pm[2],
                d,
                dt,
            )
        # the GPU channel's limits follow the GPU's slowdown, never raised: the host's
        # while its die counts on the channel (below), else the last one learned, less
        # the probe-to-die offset learned (device.failsafe.follow_slowdown)
        if fresh and slow and prot[0] != NTC.INVALID:
            sf.learn(slow, self.gpu_temp_mc, prot[0], dt)
            sup.follow_slowdown(slow, _DIE_MEASURED)
            # the host's die temperature counts on the GPU channel too, offset so
            # that it warns from slowdown - 2 degC and is critical from slowdown + 1
            # (device.failsafe.DIE_OFFSET_MC; the NTC may sit far below the die)
            p = self._prot
            i = 0
            while i < _N_CH:
                p[i] = prot[i]
                i += 1
            d = self.gpu_temp_mc - FS.DIE_OFFSET_MC
            if d > p[0]:
                p[0] = d
            prot = p
        else:
            sup.follow_slowdown(slow if slow else sf.learn_slow_mc, sf.learn_off_mc)
            if mest != _NO_EST:
                prot = self._model_alarms(mest, slow if slow else sf.learn_slow_mc, prot)
        c0 = sup.crit_mc[0]
        crit0 = self._rt[RT_CRIT0]
        sf.crit_mc[0] = c0 if c0 < crit0 else crit0
        if self.mode == MODE_MANUAL:
            self._manual_lease(now, host_ok, sup.causes)
        sup.update(
            prot,
            open_m,
            short_m,
            stall,
            self.pm_fault,
            self.uv,
            host_ok,
            self.mode == MODE_MANUAL,
            booted,
            self.pm[0],
            tach,
            stuck,
            implaus,
        )
        # control law
        valid = self.controlled & ~(bad | stuck | implaus)
        idx = worst_channel(self.temps, self.setpoints, valid, self.worst_out)
        # the die estimate's envelope (device.control.estimator), updated every tick
        # standalone with a model: its estimate is the die (est.update adds NVML's 0.5)
        sa = mest != _NO_EST and not host_ok
        env = self.est.update(
            self.temps[0] if valid & 1 else _NO_EST,
            self.gpu_temp_mc if fresh else (mest - 500 if sa else 0),
            fresh or sa,
            self.gpu_power_mw if host_ok else 0,
            dt,
        )
        state = sup.state
        if idx < 0:
            req0 = 65535  # no valid controlled sensor: nothing to regulate on
            req1 = 65535
        elif state == C.STATE_MANUAL:
            req0 = self.manual_duty[0]
            req1 = self.manual_duty[1]
            self.pid.track(req0 if req0 > req1 else req1, self.worst_out[1])
        else:
            err = self.worst_out[1]
            if self.mode == MODE_CURVE or (
                state == C.STATE_STANDALONE and self.standalone_curve and not sa
            ):
                req0 = self.curve.duty(self.setpoints[0] + err)
                self.pid.track(req0, err)
            else:
                hosted = (host_ok or sa) and self.die_sp > 0 and env != _NO_EST
                sp = self.die_sp
                slow = sf.slow_mc if sa else self.gpu_slowdown_mc
                lim = slow - _DIE_SLOWDOWN_MARGIN_MC if slow > 0 else _DIE_SP_NO_SLOWDOWN_MC
                if lim < sp:
                    sp = lim  # the GPU's own threshold less the margin (or a safe guess)
                keep = 0
                if hosted and (fresh or sa):  # a die measured, or a learned model's
                    keep = self._margin_law(env, sp, valid, now)
                    err = self.worst_out[1]
                elif hosted:
                    # no fresh die (an estimate from the NTC): the die envelope against
                    # its setpoint, never below what the NTC channels ask for against
                    # their own setpoints; the GPU's NTC through its envelope
                    if valid & 1:
                        e0 = self.est.ntc_env - self.setpoints[0]
                        if e0 > err:
                            err = e0
                    if env - sp > err:
                        err = env - sp
                if hosted:
                    self.worst_out[1] = err  # telemetry target: what is regulated
                if hosted != self.hosted:
                    self.hosted = hosted
                    self.pid.track(self.fans[0].duty, err)  # bumpless source switch
                ff = self.est.power_f if host_ok else 0
                req0 = self.pid.step(err, 0, dt, ff, keep)
            req1 = req0
        tune = self._tune
        if tune is not None and (tune.status == C.TUNE_RUNNING or tune.ended):  # or aborted
            d = self._autotune(dt, idx, state)
            if d >= 0:
                req0 = d
                req1 = d
        st = self.selftest
        if st is not None:
            d = st.duty(now)
            if d >= 0:
                req0 = d
                req1 = d
        # the safety layer: floors, hold, critical; the only path to the fans
        sf.apply(req0, req1, sup.causes, ~bad & 0xF, self.mode, state, now, dt)
        if st is not None and st.update(now, self):
            self.send("selftest_report", st.report())
            self.selftest = None
            _unload("device.selftest")  # imported for this test only: release its RAM
        if self.events.count and self.flush_events():
            self.next_tel = now  # an alarm: send the telemetry that shows it right away
        if ticks_diff(now, self.next_tel) >= 0:
            self.next_tel = ticks_add(self.next_tel, self.telemetry_ms)
            if ticks_diff(now, self.next_tel) >= 0:
                self.next_tel = ticks_add(now, self.telemetry_ms)
            self.telemetry(now)
        self._keep_learned(now, host_ok)

    def _model_alarms(self, est, slow, prot):
        """Standalone with a model: ``est`` (est_safe) against the lowest slowdown known
        (``slow`` the host's or the learned one, 0 = none). It counts on the GPU channel,
        shifted so that it warns at slowdown - ``_EST_WARN_MC`` and is critical at
        slowdown + ``_EST_CRIT_MC`` at the latest, never lowering the probe's reading
        (the limits stay the raw-probe rules'); and it drives the die-margin floor.
        Returns the protection readings for the supervisor. No allocation."""
        sf = self.safety
        sm = sf.chassis[0][7]  # chassis.SLOW
        if sm == 0 or 0 < slow < sm:
            sm = slow
        if sm == 0:
            sm = _EST_SLOW_GUESS_MC
        sup = self.sup
        sh = sm - _EST_WARN_MC - sup.warn_mc[0]
        x = sm + _EST_CRIT_MC - sup.crit_mc[0]
        if x < sh:
            sh = x
        sf.slow_mc = sm
        sf.die_mc = est
        p = self._prot
        i = 0
        while i < _N_CH:
            p[i] = prot[i]
            i += 1
        if est - sh > p[0]:
            p[0] = est - sh
        return p
    def _margin_law(self, env, sp, valid, now):
        """The hosted law with a fresh die: the error into ``worst_out[1]``; returns
        the feed-forward guard in 256ths (no tuple: a tuple allocates).

        The error is the die envelope's against ``sp`` (the GPU's slowdown less the
        margin); a controlled channel counts only within ``_COMP_MARGIN_MC`` of its
        own warning limit in effect (component protection; the GPU's NTC through its
        peak envelope), never at its setpoint. The guard keeps the power
        feed-forward from being cancelled by a negative P + I while the die is
        heading for its setpoint: the rise of the die over the last ``_RISE_S``
        seconds, extrapolated over ``_PROJ_S``, brings the error within
        ``_GUARD_BAND_MC`` of 0 (full at 0). Ints, no allocation."""
        err = env - sp
        warn = self.sup.warn_mc
        t = self.temps
        i = 0
        while i < _N_CH:
            if valid & (1 << i):
                e = (self.est.ntc_env if i == 0 else t[i]) - warn[i] + _COMP_MARGIN_MC
                if e > err:
                    err = e
            i += 1
        self.worst_out[1] = err
        # the guard's window: from _RISE_S to _GUARD_MS after the power envelope rose
        # by 1/8 and _PF_STEP_MW or more (the die's own jump at the step is over)
        rt = self._rt
        pf = self.est.power_f
        if pf > rt[_RT_PF] + _PF_STEP_MW and pf > rt[_RT_PF] + (rt[_RT_PF] >> 3):
            rt[_RT_PF] = pf
            rt[_RT_PF_MS] = now
        elif pf < rt[_RT_PF]:
            rt[_RT_PF] = pf
        age = ticks_diff(now, rt[_RT_PF_MS])
        if age < _RISE_S * 1000 or age > _GUARD_MS:
            return 0
        rise = self.est.rise_mc()
        if rise < _RISE_MIN_MC:
            return 0
        proj = err + rise * _PROJ_S // _RISE_S  # < 2**22: ints
        p = proj + _GUARD_BAND_MC
        if p <= 0:
            return 0
        if p >= _GUARD_BAND_MC:
            return 256
        return p * 256 // _GUARD_BAND_MC

    def _autotune(self, dt, idx, state):
        """The relay autotune's request, -1 when it does not run: it replaces the
        control law's (the safety layer still floors it); it stops on any safety
        cause and on leaving HOSTED/auto. Allocates only for its event and report."""
        sf = self.safety
        tune = self._tune
        err = self.worst_out[1]
        hosted = state == C.STATE_HOSTED and self.mode == MODE_AUTO and idx >= 0
        fl = sf.floor[0] if sf.floor[0] > sf.floor[1] else sf.floor[1]
        d = tune.update(dt, err, self.sup.causes | sf.causes, hosted, fl)
        if d >= 0:
            self.pid.track(d, err)  # the PID takes over bumplessly when it ends
        if tune.ended:
            tune.ended = False
            sev = C.SEV_INFO if tune.status == C.TUNE_DONE else C.SEV_WARNING
            self.events.push(C.REASON_AUTOTUNE, sev, False, -1, tune.status, state, state)
        if tune.report_pending:
            self.send("autotune_report", tune.report())
        return d

    def _manual_lease(self, now, host_ok, causes):
        """MANUAL is a lease (device.safety S5): it ends after ``MANUAL_LEASE_MS``,
        when the host goes away, or on any safety cause; then automatic control."""
        if ticks_diff(now, self.manual_ms) >= F.MANUAL_LEASE_MS:
            why = 0
        elif self.hb_seen and not host_ok:
            why = 1
        elif causes & _LEASE_CAUSES:
            why = 2
        else:
            return
        self.mode = MODE_CURVE if self.cfg["control"]["mode"] == "curve" else MODE_AUTO
        self.manual_expiries += 1
        self.pid.track(self.fans[0].duty, self.worst_out[1])  # bumpless
        st = self.sup.state
        self.events.push(C.REASON_MANUAL_EXPIRED, C.SEV_WARNING, True, -1, why, st, st)

    # -- the loop ----------------------------------------------------------------
    def step(self):
        """One loop iteration: read the port, run the tick when due, feed the dog."""
        hal = self.hal
        n = hal.port_readinto(self.rx)
        if n:
            self.receive(self.rx, n)
        now = hal.ticks_ms()
        if not n:  # the port is empty: a pause ends a cut binary run (SPEC section 8)
            self.decoder.idle(now)
        if ticks_diff(now, self.next_tick) >= 0:
            self.next_tick = ticks_add(self.next_tick, self.period_ms)
            if ticks_diff(now, self.next_tick) >= 0:  # fell behind: skip, count
                self.missed += 1
                self.next_tick = ticks_add(now, self.period_ms)
            try:
                self.tick(now)
            except Exception as e:  # noqa: BLE001 - cool hard, stop feeding the dog
                self.fail_hard(e)
                return
            if self.wdt is not None:
                self.wdt.feed()
        return ticks_diff(self.next_tick, hal.ticks_ms())

    def fail_hard(self, exc):
        self.failures += 1
        for fan in self.fans:
            try:
                fan.force_full()
            except Exception:  # noqa: BLE001
                pass
        try:
            self.send(
                "event",
                {
                    "code": C.REASON_INTERNAL_ERROR,
                    "severity": C.SEV_CRITICAL,
                    "text": ("internal error: %r" % (exc,))[:96],
                },
            )
        except Exception:  # noqa: BLE001
            pass

    def run(self):
        """Loop until a ``repl`` command: sleep until the next tick, at most ``poll_ms``.

        ``hal.poll_ms`` (default 1) bounds how long the port goes unread: an MCU board
        polls its UART every millisecond; the sim board, whose every sleep is one
        exchange with the simulated world, sets the control period.
        """
        hal = self.hal
        poll = getattr(hal, "poll_ms", 1)
        self.boot()
        self.wdt = hal.wdt_start(self.cfg["watchdog_ms"])
        while self.running:
            wait = self.step()
            if wait is not None and wait > 0:
                hal.sleep_ms(poll if wait > poll else wait)
        hal.repl()

    # -- commands ----------------------------------------------------------------
    def receive(self, buf, n):
        """Decode what arrived and act on it. Nothing a peer sends can raise out of
        here: the last-resort handler answers ``nack internal`` and the loop goes on."""
        try:
            self.decoder.feed(buf, n, self._on_item)
        except Exception as e:  # noqa: BLE001 - a decoder bug must not stop cooling
            self._internal(e, 0, 0)
        if self.hb.pending:
            self._heartbeat_fast(self.hb)

    def _sink(self, item):
        if self.hb.pending:  # the fast path's heartbeats first: stream order
            self._heartbeat_fast(self.hb)
        if not item.ok:
            if item.kind in _NACKED_KINDS:
                self.fmt = item.fmt
                self.nack(item.seq, item.type, item.code, item.field, item.detail)
            return
        self.fmt = item.fmt
        try:
            self.handle(item)
        except CommandError as e:
            self.nack(item.seq, item.type, e.code, e.field, str(e))
        except (ValueError, TypeError, KeyError, IndexError) as e:
            # a device.config.ConfigError (a ValueError) names the key at fault
            self.nack(item.seq, item.type, C.ERR_OUT_OF_RANGE, getattr(e, "path", None), str(e))
        except OSError as e:
            self.nack(item.seq, item.type, C.ERR_STORAGE, None, str(e))
        except Exception as e:  # noqa: BLE001 - last resort: answer, count, keep cooling
            self._internal(e, item.seq, item.type)
        _release(self.fmt == FMT_JSON)
        if self.lut_spare is None:  # a commit took it: replenish, the commands' RAM free
            self._spare_lut()

    def _spare_lut(self):
        """The spare NTC table a configuring command builds into (device.commands.build):
        allocated here, outside any command and transaction, never on the tick; a command
        that finds none allocates its table as before."""
        try:
            self.lut_spare = array("h", range(_LUT_POINTS))
        except MemoryError:
            self.lut_spare = None

    def _internal(self, exc, ref, ref_type):
        self.internal_errors += 1
        st = self.sup.state
        self.events.push(C.REASON_INTERNAL_ERROR, C.SEV_ALARM, True, -1, ref_type, st, st)
        try:
            self.nack(ref, ref_type, C.ERR_INTERNAL, None, "internal error: %r" % (exc,))
        except Exception:  # noqa: BLE001 - even the answer failed: the counter says it
            pass

    def _heartbeat_fast(self, hb):
        """Heartbeats taken by the decoder's allocation-free path since the last call.

        A read can hold several: the refused ones are counted (one NACK for the lot)
        and the latest signed one is used, in whatever order they came. An unsigned,
        forged or replayed heartbeat never cancels a signed one, nor refreshes
        anything (SPEC section 14.1)."""
        hb.pending = False
        if hb.bad:
            self._unauthorized(hb.bad_seq, C.T_HEARTBEAT, hb.bad_auth, hb.bad)
            hb.bad = 0
        if hb.fresh:
            hb.fresh = False
            self._heartbeat(hb.present, hb.values)

    def _heartbeat(self, present, values):
        """Signed heartbeat values: host presence and the GPU's temperature/power."""
        self.hb_ms = self.hal.ticks_ms()
        self.hb_seen = True
        self.gpu_power_mw = values[_HB_POWER] if present & (1 << _HB_POWER) else 0
        bit = 1 << _HB_SLOWDOWN
        self.gpu_slowdown_mc = values[_HB_SLOWDOWN] if present & bit else 0
        if present & (1 << _HB_TEMP):
            self.gpu_temp_mc = values[_HB_TEMP]
            self.gpu_temp_ms = self.hb_ms

    def _tokens(self, save):
        """Take a token from a bucket: config_save's flash writes (``save``: at most
        ``SAVE_BURST`` at once, one more per ``SAVE_MS``) or the nacks (``_NACK_BURST``,
        one more per ``_NACK_MS``). False when it is empty (ints in place, no
        allocation)."""
        rt = self._rt
        i = _RT_SAVE if save else _RT_NACK
        burst = SAVE_BURST if save else _NACK_BURST
        per_ms = SAVE_MS if save else _NACK_MS
        now = self.hal.ticks_ms()
        gained = ticks_diff(now, rt[i + 1]) // per_ms
        if gained > 0:
            rt[i] += gained
            rt[i + 1] = ticks_add(rt[i + 1], gained * per_ms)
            if rt[i] >= burst:
                rt[i] = burst
                rt[i + 1] = now
        if rt[i] <= 0:
            rt[i] = 0
            return False
        rt[i] -= 1
        return True

    def ack(self, msg):
        self.send("ack", {"ref": msg.seq, "ref_type": msg.type})

    def nack(self, ref, ref_type, code, field, text):
        """Answer a refusal, at most ``_NACK_BURST`` at once and ten a second after
        that (SPEC section 11): a noisy line never turns into a flood of replies."""
        if not self._tokens(False):
            self.nacks_suppressed += 1
            return
        fields = {"ref": ref & 0xFFFF, "ref_type": ref_type & 0xFF, "code": code}
        if field:
            fields["field"] = field[:32]
        if text:
            fields["text"] = text[:96]
        self.send("nack", fields)

    def _unauthorized(self, ref, ref_type, auth, count=1):
        self.auth_failures += count
        now = self.hal.ticks_ms()
        if ticks_diff(now, self._rt[_RT_UNAUTH_MS]) >= _UNAUTH_EVENT_MS:
            self._rt[_RT_UNAUTH_MS] = now
            st = self.sup.state
            self.events.push(C.REASON_UNAUTHORIZED, C.SEV_WARNING, True, auth, ref_type, st, st)
        field = None
        if auth == sign.AUTH_REPLAY:  # the host's clock went back: it must jump ahead
            field = "ts"
            why = "replayed: timestamp not newer than this link's last"
        elif auth == sign.AUTH_NONE:
            why = "needs a signature" if self.paired else "module not paired: run modbridge pair"
        else:
            why = "bad signature"
        self.nack(ref, ref_type, C.ERR_UNAUTHORIZED, field, why)

    def handle(self, msg):
        t = msg.type
        f = msg.fields
        if t not in _OPEN_TYPES and msg.auth != sign.AUTH_OK:
            if not (t == C.T_PAIR and msg.auth == sign.AUTH_NONE and self._pair_window()):
                self._unauthorized(msg.seq, t, msg.auth)
                return
        if t == C.T_HEARTBEAT:
            _hb_values(f, self._hb_vals)
            self._heartbeat(self._hb_vals[_N_HB], self._hb_vals)
            return  # heartbeats are not answered
        if t == C.T_HELLO_REQUEST:
            self.hello(msg.seq)
        elif t == C.T_SELFTEST:
            if f.get("abort"):  # the host gave up (Ctrl-C): the controller takes the fans
                st = self.selftest
                self.ack(msg)
                if st is not None:  # its report ends the host's wait: not passed, aborted
                    self.send("selftest_report",
                              {"ref": st.ref, "passed": False, "text": "aborted by the host"})
                    self.selftest = None
                    _unload("device.selftest")
                return
            if self.selftest is not None or (self._tune is not None and self._tune.running):
                raise CommandError("a self-test is already running", C.ERR_BUSY)
            from device.selftest import SelfTest  # on demand (_unload when it ends)

            self.selftest = SelfTest(self.hal.ticks_ms(), msg.seq)
            self.ack(msg)
        elif t == C.T_REBOOT:
            self.ack(msg)
            self.hal.reset()
        elif t == C.T_REPL:
            self.ack(msg)
            _commands().to_repl(self)
        else:
            _commands().run(self, msg)  # every other command: imported for it

    # -- pairing -----------------------------------------------------------------
    def _pair_window(self):
        """Unsigned ``pair`` is accepted only by a module with no secret, in the first
        ``_PAIR_WINDOW_MS`` after a power-on or reset-button start."""
        if self.paired or self.hal.reset_cause() not in ("power", "hard"):
            return False
        return ticks_diff(self.hal.ticks_ms(), self.boot_ms) < _PAIR_WINDOW_MS


def _ina226(i2c, ina):
    """The INA226 driver configured from the ``ina226`` config section (on the real
    bus, or on a stand-in one when a candidate config is checked)."""
    dev = INA226(
        i2c,
        ina["addr"],
        ina["shunt_uohm"],
        ina["max_current_ma"],
        ina["avg"],
        ina["ct_us"],
        ina["ct_us"],
    )
    dev.set_under_voltage_alert(ina["uv_mv"])
    return dev


def _hb_values(fields, out):
    """Heartbeat fields of a decoded message -> ``out`` (values by field index, the
    presence mask at ``out[_N_HB]``), the layout of the decoder's fast path."""
    present = 0
    i = 0
    while i < _N_HB:
        name = _HB_DEF[i][C.F_NAME]
        if name in fields:
            v = fields[name]
            out[i] = v if -0x3FFFFFFF <= v <= 0x3FFFFFFF else 0
            present |= 1 << i
        i += 1
    out[_N_HB] = present


class CommandError(ValueError):
    """A command is refused: answered with a NACK carrying ``code`` and ``field``."""

    def __init__(self, msg, code, field=None):
        super().__init__(msg)
        self.code = code
        self.field = field


# device.config's parts (device/config.py: the firmware imports each where needed, in
# one package: one name in device's dict) and the facade itself (host tools and tests)
_CONFIG_PARTS = const(
    (
        "device.config",
        "device.cfg.writer",
        "device.cfg.store",
        "device.cfg.edit",
        "device.cfg.schema",
        "device.cfg.files",
        "device.cfg",  # the package last: its parts are its attributes
    )
)


def _commands():
    """device.commands (configuring, the commands), imported for the call.

    The import (device.commands' and device.config's parts' module dicts) runs right
    after a collect: garbage left since the last one cuts the heap into holes too small
    for those blocks, and the collect gc_alloc makes when one fails comes mid-import,
    too late (bench/bench_arm_stress.py, garbage mode on the F411's pool: long seeds 1
    and 5 failed there, nack internal, and pass with it). A few ms per configuring
    command, never on the tick. MicroPython only: CPython's heap does not fragment that
    way, and its collector walks every object of the process (a test worker's, after a
    thousand tests: ~0.25 s a command, 187 s of one garbage test in a full run)."""
    import sys

    if "device.commands" not in sys.modules and sys.implementation.name == "micropython":
        import gc

        gc.collect()
    from device import commands

    return commands


def _release(json=False):
    """Forget what booting, configuring and commands import (device.commands, the
    parts of device/cfg/ and the JSON parser, which protocol.jsonl also imports for a
    line only; device.nonce; protocol.cbor's decoder; the INA226's setup) when done;
    protocol.jsonl too (the config's canonical JSON) unless the port speaks JSON lines
    (``json``: it stays for the next line)."""
    if not json:
        _unload("protocol.jsonl")
    _unload("device.commands")
    for name in _CONFIG_PARTS:
        _unload(name)
    _unload("protocol.jsonparse")
    _unload("protocol._cbor_rx")  # protocol.cbor's decoder: a command's payload
    _unload("device.calib")  # tables are built when configuring only
    _unload("device.drivers.ina226_setup")  # the INA226's construction and settings
    _unload("device.nonce")  # App() only


def _unload(name):
    """Forget module ``name``, imported on demand, so that the RAM of its functions and
    tables can be collected (its bytecode stays in flash); the next import reloads it."""
    import sys

    sys.modules.pop(name, None)
    parent, _, leaf = name.rpartition(".")
    pkg = sys.modules.get(parent)
    if pkg is not None and leaf in pkg.__dict__:
        delattr(pkg, leaf)


def _hex(b):
    return "".join(["%02x" % x for x in b])
