"""What a config turns into, and the commands: imported on demand, released after.

``device.app`` imports this module (and, where a command needs them, device.config's
parts in ``device.cfg``: the schema and validation, merge, storage) when it
configures: at boot and for a command other than a heartbeat, ``hello_request``,
``selftest``, ``reboot`` or ``repl``; when that is done it forgets them
(``device.app._release``), so their functions, classes and tables are RAM only while
a config is built or a command runs; their bytecode stays in flash (frozen) and the
next command imports them again. The control tick never needs them.

Every function takes the App. ``build`` checks a config by building every object it
configures on stand-in hardware, ``boot_config`` boots from the first stored config
that configures, ``apply_changes`` is the ``config_set`` transaction; ``run``
dispatches a command.
"""

from device import app as A
from device.drivers.fan import Fan
from device.drivers.ntc import NTC
from protocol import catalog as C
from protocol import cbor, frame, sign

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


_N_CH = const(4)  # as device.app's (module-private constants are not importable)
_N_FAN = const(2)


class _Shadow:
    """Stands in for ``machine.PWM``, a tach ``Pin`` and the I2C bus while a candidate
    config is configured: an INA226 that is always there, so that configuring against
    it checks the driver's arithmetic and arguments without touching the bus."""

    def freq(self, hz=None):
        return 25000

    def duty_u16(self, d=None):
        return 0

    def irq(self, handler=None, trigger=0, hard=False):
        return None

    def value(self, v=None):
        return 0

    def readfrom_mem_into(self, addr, reg, buf):
        v = 0x5449 if reg == 0xFE else (0x2260 if reg == 0xFF else 0)
        buf[0] = v >> 8
        buf[1] = v & 0xFF

    def writeto_mem(self, addr, reg, buf):
        pass


class _Built:
    """Everything a config turns into, built without touching the hardware."""

    pass


def boot_config(app):
    """Configure from the first stored config that really configures.

    The candidates are tried in order (the saved config, the last good one, the
    factory defaults) through the same ``_build`` that ``config_set`` uses, so
    whatever is in flash the module boots into a state that speaks the protocol.
    """
    from device.cfg.store import candidates

    cands, writes, problems = candidates(app.hal.fs_dir, factory=False)
    candidates = None
    # what decoding needed is not needed to build: forgotten, its RAM is free for that
    A._unload("device.cfg.store")
    A._unload("device.cfg.files")
    A._unload("protocol.jsonparse")
    app.flash_writes = writes
    why = ""
    detail_of_choice = None
    for source, cfg, detail in cands:
        if source == "factory":
            from device.cfg.schema import defaults

            cfg = defaults()  # made only when the stored configs did not configure
            built = app._build(cfg)  # must configure: a failure here is a bug or OOM
        else:
            try:
                built = app._build(cfg)
            except Exception as e:  # noqa: BLE001 - any failure: try the next one
                why = "%s config does not configure: %s" % (source, e)
                continue
        commit(app, built, cfg)
        app.cfg = cfg
        app.config_source = source
        if source == "current":
            app.config_status = "ok"
        elif source == "prev":
            app.config_status = "prev"
        else:
            app.config_status = "corrupt" if (why or problems) else "missing"
        detail_of_choice = detail
        break
    if problems:
        app.events.push(
            C.REASON_CONFIG_CORRUPT, C.SEV_WARNING, True, -1, 0, C.STATE_BOOT, C.STATE_BOOT
        )
    if app.config_source != "current" and (why or problems or len(cands) > 1):
        app.events.push(
            C.REASON_CONFIG_FALLBACK,
            C.SEV_ALARM,
            True,
            -1,
            1 if app.config_source == "prev" else 0,
            C.STATE_BOOT,
            C.STATE_BOOT,
        )
    app.config_why = why or detail_of_choice  # for a person at the REPL


def build(app, cfg):
    """Check ``cfg`` by building every object it configures on stand-in hardware.

    Raises (ConfigError, ValueError, ...) without changing anything when some
    part refuses it: validated and configurable are the same predicate."""
    from device.cfg.schema import validate
    from device.floors import fan_model
    from device.control.curve import FanCurve
    from device.control.pid import PID
    from device.failsafe import Supervisor

    validate(cfg)
    hal = app.hal
    b = _Built()
    ctl = cfg["control"]
    b.period_ms = ctl["period_ms"]
    b.telemetry_ms = ctl["telemetry_ms"]
    b.host_timeout_ms = ctl["host_timeout_ms"]
    b.standalone_curve = ctl.get("standalone", "curve") == "curve"
    chans = cfg["channels"]
    luts = {}  # channels with the same curve and divider share one table, and
    if app.safety is not None:  # with the safety layer's nominal one (1 KB each)
        luts[app.safety.nominal_key] = app.safety.nominal_table
    for ntc in getattr(app, "ntcs", None) or ():  # and the running channels (read-only):
        if ntc.table is not None:  # a change builds only the tables it changes (a 514 B
            luts[ntc.table] = (ntc._lut, ntc._step)  # block is the first to fail)
    # a table this config needs and nobody has is built into the App's spare (free,
    # read by nobody: the running tables stay as they are until commit swaps them)
    spare = [app.lut_spare] if getattr(app, "lut_spare", None) is not None else None
    ntcs = []
    for i in range(_N_CH):
        ch = chans[i]
        if ch.get("filter") == "none":
            ch = dict(ch)
            ch["filter"] = None
        ntcs.append(NTC.from_config(hal.adc[i], ch, luts=luts, spare=spare))
    b.ntcs = ntcs
    b.luts = luts
    b.setpoints = [chans[i]["setpoint_mc"] for i in range(_N_CH)]
    ctl_mask = 0
    for i in range(_N_CH):
        if chans[i]["controlled"]:
            ctl_mask |= 1 << i
    b.controlled = ctl_mask
    fans = cfg["fans"]
    b.fan_model = fan_model(getattr(hal, "fan_model", None))
    for i in range(_N_FAN):  # the fan driver's own checks, on stand-ins
        Fan.from_config(_Shadow(), _Shadow(), hal.IRQ_FALLING, fans[i], model=b.fan_model)
    A._ina226(_Shadow(), cfg["ina226"])
    p = cfg["pid"]
    b.pid = PID(
        p["kp"],
        p["ki"],
        p["kd"],
        p["kff"],
        out_min=min(f["min_duty"] for f in fans),  # below it the fans do not move
        out_max=65535,
        slew_per_s=p["slew_pct_s"] * 65535 // 100,
        d_filter_ms=p["d_filter_ms"],
        slew_down_per_s=p["slew_down_pct_min"] * 65535 // 6000,
        deadband_mc=p["deadband_mc"],
        i_band_mc=p["i_band_mc"],
    )
    b.est = (p["env_window_s"], p["ff_tau_ms"])
    b.die_sp = p["die_sp_mc"]
    cv = cfg["curve"]
    b.curve = FanCurve(cv["points"], cv["hysteresis_mc"])
    mode = ctl["mode"]
    b.mode = A.MODE_AUTO
    if mode == "curve":
        b.mode = A.MODE_CURVE
    elif mode == "manual":
        b.mode = A.MODE_MANUAL
    b.sup = Supervisor(cfg, app.events)
    b.json = ctl["telemetry_format"] == "json"
    return b


def commit(app, b, cfg):
    """Apply a built config; nothing here can refuse it any more."""
    from device.plausibility import NtcWatch
    from device.safety import Safety

    hal = app.hal
    app.period_ms = b.period_ms
    app.telemetry_ms = b.telemetry_ms
    app.host_timeout_ms = b.host_timeout_ms
    app.standalone_curve = b.standalone_curve
    old = getattr(app, "ntcs", None) or ()
    app.ntcs = b.ntcs
    for i in range(_N_CH):
        app.setpoints[i] = b.setpoints[i]
    if app.watch is None or app.controlled != b.controlled:
        app.watch = NtcWatch(_N_CH, b.controlled, 3)
    app.controlled = b.controlled
    fans = cfg["fans"]
    if app.fans is None:
        app.fans = [
            Fan.from_config(hal.pwm[i], hal.tach[i], hal.IRQ_FALLING, fans[i], model=b.fan_model)
            for i in range(_N_FAN)
        ]
        app.safety = Safety(hal, app.fans, _N_CH, luts=b.luts)
    else:
        for i in range(_N_FAN):
            app.fans[i].configure(fans[i])
    app.safety.configure(cfg)
    _recycle(app, old)
    app._rt[A.RT_CRIT0] = app.safety.crit_mc[0]  # the GPU channel's configured critical
    app.ina_cfg = cfg["ina226"]
    app._rt[A.RT_UV_MV] = app.ina_cfg["uv_mv"]
    app.ina = None
    app.open_ina()
    app.pid = b.pid
    app.est.configure(b.est[0], b.est[1], app.est.offset_tau_ms)
    _model(app, cfg["model"])
    app.die_sp = b.die_sp
    app.hosted = False
    app.curve = b.curve
    if b.mode != app.mode:
        if b.mode == A.MODE_MANUAL:  # entering manual mode starts its lease
            app.manual_ms = app.hal.ticks_ms()
        app.mode = b.mode
    if app.sup is not None:
        old = app.sup
        new = b.sup
        # keep the state across a reconfiguration; the next tick re-evaluates
        new.state = old.state
        new.reason = old.reason
        new.faults = old.faults
        new.causes = old.causes
        new.host_seen = old.host_seen
    app.sup = b.sup
    app.fmt = A.FMT_JSON if b.json else app.fmt


def _model(app, m):
    """The chassis model (config section ``model``) into ``app.safety.chassis``: ``(its
    array, device.control.chassis.update)`` while ``model.ok`` is 1, else None (the
    module is only imported for a model). Unchanged parameters keep its filter running.
    (On the safety layer, which it may only tighten: not one more name in the App's
    instance dict, whose table is full, every lookup that misses it probing it all.)"""
    sf = app.safety
    if not m["ok"]:
        sf.chassis = None
        return
    from device.control import chassis

    s = sf.chassis[0] if sf.chassis is not None else chassis.new()
    i = 0
    while i < chassis.SLOW + 1 and s[i] == m[chassis.KEYS[i]]:
        i += 1
    if i <= chassis.SLOW:
        chassis.load(s, m)
    sf.chassis = (s, chassis.update)


def load_secret(app):
    """The signing secret from ``secret.key`` (32 bytes), or None."""
    try:
        with open(secret_path(app), "rb") as fh:
            key = fh.read(sign.KEY_LEN + 1)
    except OSError:
        return None
    return key if len(key) == sign.KEY_LEN else None


def secret_path(app):
    return app.hal.fs_dir.rstrip("/") + "/" + A.SECRET_FILE


def to_repl(app):
    """Hand the port back to the REPL so ``mpremote`` can reflash.

    A started watchdog cannot be stopped on STM32 or RP2040, and nothing would feed
    it at the REPL: so with a watchdog running, leave a flag file and reset; the
    next boot sees the flag, removes it and stays at the REPL without starting the
    app or the watchdog (fans with a floating PWM input run at full speed). Without
    a watchdog (sim, tests) just stop the loop.
    """
    app.running = False
    if app.wdt is not None:
        try:
            f = open(app.hal.fs_dir.rstrip("/") + "/" + A.REPL_FLAG, "w")
            f.write("1")
            f.close()
        except OSError:
            return  # cannot leave the flag: keep running the app, stay safe
        app.hal.reset()


def cmd_pair(app, msg):
    import os

    key = bytes(msg.fields["key"])
    path = secret_path(app)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(key)
    try:
        os.rename(tmp, path)
    except OSError:
        os.remove(path)  # FAT: no rename over an existing file
        os.rename(tmp, path)
    app.verifier.set_key(key)
    app.paired = True
    st = app.sup.state
    app.events.push(C.REASON_PAIRED, C.SEV_INFO, True, -1, 0, st, st)
    app.ack(msg)


def cmd_config_save(app, msg):
    """Write the running config, only if it differs from what flash holds, and at
    most ``A.SAVE_BURST`` writes at once then one per ``A.SAVE_MS``."""
    from device.cfg import writer

    if writer.is_saved(app.cfg, app.hal.fs_dir):
        app.ack(msg)  # nothing changed: no flash write, no token (no RAM copy kept)
        return
    if not app._tokens(True):
        raise A.CommandError(
            "config_save rate-limited: one flash write per %d s" % (A.SAVE_MS // 1000),
            C.ERR_RATE_LIMITED,
        )
    if writer.save(app.cfg, app.hal.fs_dir):
        app.flash_writes += 1
        app.events.push(
            C.REASON_CONFIG_SAVED, C.SEV_INFO, True, -1, 0, app.sup.state, app.sup.state
        )
    app.ack(msg)


def apply_changes(app, changes):
    """A config change is a transaction: merge and validate a candidate, build
    every object it configures on stand-in hardware, and only then apply it. A
    refused change leaves no trace."""
    from device.cfg.edit import merge
    from device.cfg.schema import ConfigError

    try:
        cfg = merge(app.cfg, changes)
        built = app._build(cfg)
    except ConfigError as e:
        raise A.CommandError(str(e), C.ERR_OUT_OF_RANGE, getattr(e, "path", None)) from None
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise A.CommandError("does not configure: %s" % (e,), C.ERR_OUT_OF_RANGE, None) from None
    commit(app, built, cfg)
    app.cfg = cfg


def cmd_autotune(app, msg):
    """Start or abort a relay autotune (docs/autotune.md). It starts only HOSTED
    in auto mode, around the duty the fans run at, above every floor."""
    f = msg.fields
    from device.control import autotune as AT

    tune = app.tune
    if f["action"] == 1:
        tune.abort()
        app.ack(msg)
        return
    if tune.running or app.selftest is not None:
        raise A.CommandError("an autotune or app-test is already running", C.ERR_BUSY)
    if app.sup.state != C.STATE_HOSTED or app.mode != A.MODE_AUTO:
        raise A.CommandError(
            "autotune needs HOSTED in auto mode, not %s" % C.STATES[app.sup.state],
            C.ERR_BAD_STATE,
        )
    sf = app.safety
    floor = max(sf.floor[0], sf.floor[1], app.pid.out_min)
    tune.start(
        app.fans[0].duty,
        floor,
        amp=f.get("amplitude", AT.AMP_DEFAULT),
        hyst=f.get("hysteresis", AT.HYST_DEFAULT),
        max_rise=f.get("max_rise", AT.RISE_DEFAULT),
        timeout_s=f.get("timeout_s", AT.TIMEOUT_DEFAULT_S),
        cycles=f.get("cycles", AT.CYCLES_DEFAULT),
        ref=msg.seq,
        hold_ms=app.est.window_s * 1000 if app.hosted else 0,  # the envelope's hold
    )
    app.ack(msg)


def cmd_fan_mode(app, msg):
    f = msg.fields
    mode = f["mode"]
    if mode == 1:  # manual
        d1 = f.get("duty1", app.manual_duty[0])
        d2 = f.get("duty2", d1)
        floor = app.safety.f_manual
        for name, d in (("duty1", d1), ("duty2", d2)):
            if d < floor:
                raise A.CommandError(
                    "%s below the safety minimum %d" % (name, floor),
                    C.ERR_OUT_OF_RANGE,
                    name,
                )
        app.manual_duty[0] = d1
        app.manual_duty[1] = d2
        app.manual_ms = app.hal.ticks_ms()  # each manual command renews the lease
        app.mode = A.MODE_MANUAL
    elif mode == 0:
        if app.mode == A.MODE_MANUAL:
            app.pid.track(app.fans[0].duty, app.worst_out[1])  # bumpless
        app.mode = A.MODE_AUTO
    elif mode == 2:
        app.mode = A.MODE_CURVE
    else:
        raise A.CommandError("unknown fan mode %d" % mode, C.ERR_OUT_OF_RANGE, "mode")
    app.ack(msg)


def cmd_setpoints(app, msg):
    changes = {}
    for i in range(_N_CH):
        name = "sp_" + C.CHANNELS[i]
        if name in msg.fields:
            changes["channels.%d.setpoint_mc" % i] = msg.fields[name]
    if not changes:
        raise A.CommandError("no setpoint given", C.ERR_MISSING_FIELD)
    apply_changes(app, changes)
    app.ack(msg)


def cmd_pid(app, msg):
    changes = {}
    for name in ("kp", "ki", "kd", "kff"):
        if name in msg.fields:
            changes["pid." + name] = msg.fields[name]
    if not changes:
        raise A.CommandError("no gain given", C.ERR_MISSING_FIELD)
    apply_changes(app, changes)
    app.ack(msg)


def cmd_curve(app, msg):
    changes = {"curve.points": msg.fields["points"]}
    if "hysteresis" in msg.fields:
        changes["curve.hysteresis_mc"] = msg.fields["hysteresis"]
    apply_changes(app, changes)
    app.ack(msg)


def cmd_config_get(app, msg):
    """One ``config`` message for the section asked, or one per page for all; a page
    is built, sent and dropped before the next (at most one page in RAM)."""
    from device.cfg import edit

    section = msg.fields.get("section")
    names = [section] if section else edit.pages(app.cfg)
    for name in names:
        try:
            values = edit.get_section(app.cfg, name)
        except edit.ConfigError as e:
            raise A.CommandError(str(e), C.ERR_OUT_OF_RANGE, "section") from None
        _send_config(app, msg.seq, values)
        values = None  # the next page's map is built without this one


def _send_config(app, ref, values):
    """Send a page as ``config`` messages: one frame when it fits ``frame.MAX_FRAME``, else
    its keys (sorted) split in halves until each half fits, as the frame encoder's
    ``OversizeError`` would split them; the length is the sum of the entries' (each
    encoded alone), not a page encoded whole (a JSON line has no limit: one line)."""
    version = app.cfg["version"]
    if app.fmt == A.FMT_JSON:
        app.send("config", {"ref": ref, "values": values, "version": version})
        return
    keys = sorted(values)
    lens = [len(cbor.dumps(k)) + len(cbor.dumps(values[k])) for k in keys]
    # a frame: header, the CBOR map {0: ref, 1: values, 2: version}, CRC
    fixed = frame.HEADER_LEN + frame.CRC_LEN + 4 + cbor.int_len(ref) + cbor.int_len(version)
    _send_range(app, ref, version, values, keys, lens, fixed, 0, len(keys))


def _send_range(app, ref, version, values, keys, lens, fixed, lo, hi):
    n = hi - lo
    if n >= 2 and fixed + cbor.head_len(n) + sum(lens[lo:hi]) > frame.MAX_FRAME:
        half = lo + n // 2
        _send_range(app, ref, version, values, keys, lens, fixed, lo, half)
        _send_range(app, ref, version, values, keys, lens, fixed, half, hi)
        return
    # one entry too big for a frame: the encoder's OversizeError says so
    part = {k: values[k] for k in keys[lo:hi]}
    app.send("config", {"ref": ref, "values": part, "version": version})


def _recycle(app, old):
    """After a commit: the App's spare table is a table nobody reads any more (the
    spare itself if no new channel took it, else one the old channels let go), or
    None (device.app replenishes it after the command, outside the transaction)."""
    used = [n._lut for n in app.ntcs]
    used.append(app.safety.nominal_table[0])
    spare = app.lut_spare
    if spare is not None and not any(t is spare for t in used):
        return
    app.lut_spare = None
    for n in old:
        if not any(t is n._lut for t in used):
            app.lut_spare = n._lut
            return


def cmd_cal_read(app, msg):
    ch = msg.fields["channel"]
    if ch >= _N_CH:
        raise A.CommandError("channel must be 0..%d" % (_N_CH - 1), C.ERR_OUT_OF_RANGE, "channel")
    n = msg.fields.get("samples", 64)
    mean_x16, lo, hi = app.ntcs[ch].sample_raw(n)
    fields = {
        "ref": msg.seq,
        "channel": ch,
        "samples": n,
        "raw_mean_x16": mean_x16,
        "raw_min": lo,
        "raw_max": hi,
    }
    t = app.ntcs[ch].read_mc()
    if app.ntcs[ch].fault == NTC.FAULT_NONE:
        fields["temp"] = t
    app.send("cal_raw", fields)


def cmd_cal_write(app, msg):
    f = msg.fields
    ch = f["channel"]
    if ch >= _N_CH:
        raise A.CommandError("channel must be 0..%d" % (_N_CH - 1), C.ERR_OUT_OF_RANGE, "channel")
    model = f["model"]
    coeffs = f["coeffs"]
    key = "channels.%d." % ch
    changes = {}
    if model == 0:  # sh
        changes[key + "model"] = "sh"
        changes[key + "sh"] = coeffs
    elif model == 1:  # beta: [beta, r0_ohm, t0_mc]
        if len(coeffs) != 3:
            raise A.CommandError("beta needs [beta, r0_ohm, t0_mc]", C.ERR_OUT_OF_RANGE, "coeffs")
        changes[key + "model"] = "beta"
        changes[key + "beta"] = coeffs[0]
        changes[key + "r0"] = coeffs[1]
        changes[key + "t0_mc"] = coeffs[2]
    else:  # poly correction only
        changes[key + "correction"] = coeffs
    if "correction" in f:
        changes[key + "correction"] = f["correction"]
    apply_changes(app, changes)
    app.events.push(C.REASON_CALIBRATION, C.SEV_INFO, True, ch, 0, app.sup.state, app.sup.state)
    app.ack(msg)


def cmd_config_set(app, msg):
    apply_changes(app, msg.fields["values"])
    app.ack(msg)


def cmd_config_reset(app, msg):
    from device.cfg.schema import defaults
    from device.cfg.store import factory_reset

    cfg = defaults()
    commit(app, app._build(cfg), cfg)
    factory_reset(app.hal.fs_dir)
    app.cfg = cfg
    app.ack(msg)


# message type -> handler (a dict while this module is loaded, for one command)
_HANDLERS = {
    C.T_FAN_MODE: cmd_fan_mode,
    C.T_SETPOINTS: cmd_setpoints,
    C.T_PID_GAINS: cmd_pid,
    C.T_FAN_CURVE: cmd_curve,
    C.T_CONFIG_GET: cmd_config_get,
    C.T_CONFIG_SET: cmd_config_set,
    C.T_CONFIG_SAVE: cmd_config_save,
    C.T_CONFIG_RESET: cmd_config_reset,
    C.T_CAL_READ: cmd_cal_read,
    C.T_CAL_WRITE: cmd_cal_write,
    C.T_PAIR: cmd_pair,
    C.T_AUTOTUNE: cmd_autotune,
}


def run(app, msg):
    """Answer command ``msg`` (authenticated by the caller)."""
    handler = _HANDLERS.get(msg.type)
    if handler is None:
        raise A.CommandError("not supported by this firmware", C.ERR_UNSUPPORTED)
    handler(app, msg)
