"""MicroPython side of bench/bench_firmware.py: the firmware App on the fake board.

Run by bench_firmware.py (not by pytest, not on CPython) as

    micropython [-X heapsize=N] -m mpy_firmware_bench MODE [ARG] [--romfs IMAGE]

(compiled to .mpy beside the fake board) with MICROPYPATH naming a directory with the
firmware (compiled .mpy files, or the sources) and one with the fake board
(tests/fakehal.py, tests/fakes.py, tests/mpcompat.py). ``--romfs IMAGE`` first reads
a ROMFS image into a bytearray and mounts it (``vfs.VfsRom``) ahead of sys.path, so
.mpy bytecode runs in place as from an MCU's ROMFS partition; heap numbers then
leave the image out ("image" in the output gives its size). Prints one JSON object
as its last line. Modes:

    heap            heap in use after import / fake board / App(hal) + boot(), and per
                    firmware module (gc.collect(); gc.mem_alloc() after each import);
                    "after_commands": firmware + App once warmed up and COMMANDS ran
    fit             boot, warm up, COMMANDS, 1,000 ticks; {"ok": 1} (a MemoryError
                    exits non-zero; ``fit_ticks``: the same without COMMANDS):
                    bench_firmware.py binary-searches -X heapsize with it
    alloc           bytes allocated per steady-state tick (gc disabled, mem_alloc
                    delta) and whether 1,000 ticks run under micropython.heap_lock(),
                    with the host frozen (no heartbeat arrives)
    alloc_hosted    the same with a signed heartbeat arriving every second (every 10th
                    tick), as the bridge sends them: the hosted tick
    speed MS        steady-state ticks per wall second, telemetry every MS ms

A tick is ``app.step()`` + ``hal.advance(100)``: with the default config (period 100
ms) every step runs one control tick (4 NTCs oversampled, INA226, 2 fans, supervisor,
PID, PWM, telemetry when due). The warm-up is what tests/test_app.py does before its
heap-locked run: boot, 1 s of fake time, a signed heartbeat, 2 s more; then either the
host is frozen (``hb_ms`` now, huge timeout: mode ``alloc``) or heartbeats keep
arriving at 1 Hz (mode ``alloc_hosted``; prepared before the run, since encoding and
signing them is the host's work).

The fake board's transmit buffer is shrunk from 64 KB to 1 KB (``fakehal._TX_SIZE``,
read at construction and on every write; bytes beyond it are counted and dropped),
and its receive ring from 16 KB to 1 KB (``fakehal._RX_SIZE``),
and it is emptied after every tick, so the heap numbers are the firmware's plus a
small board. The unix port is 64-bit: pointers, object headers and small-int-sized
array items ('l') are 8 bytes, so heap numbers are roughly 1.5-2x what the same code
needs on a 32-bit MCU.
"""

import gc
import sys
from time import ticks_diff, ticks_us  # MicroPython's; it has f-strings too

import micropython

TX_SIZE = 1024
STEADY_TICKS = 1000
TICK_MS = 100

# Firmware modules in dependency order (leaves first), for the per-module breakdown:
# what importing device.app loads. Not here, because the firmware imports them when
# it needs them: device.selftest and device.control.autotune (their commands);
# device.commands, device.config, protocol.jsonparse and device.calib (configuring:
# at boot and for commands, forgotten after each by device.app._release),
# device.nonce (App() only), device.control.filters (the NTC channels keep their
# filters' state in their own arrays: device.control) and protocol.jsonl (JSON lines:
# the first one imports it; _release forgets it unless the port speaks them). App()
# then leaves them out of the heap.
FIRMWARE_MODULES = (
    "device",
    "device.ticks",
    "protocol",
    "protocol.errors",
    "protocol.crc",
    "protocol.cobs",
    "protocol.catalog",
    "protocol.cbor",
    "protocol.sha256",
    "protocol.sign",
    "protocol.message",
    "protocol.frame",
    "protocol.telemetry",
    "device.floors",
    "device.control",
    "device.control.pid",
    "device.control.curve",
    "device.control.select",
    "device.control.estimator",
    "device.drivers",
    "device.drivers.ntc",
    "device.drivers.ina226",
    "device.drivers.fan",
    "device.safety",
    "device.plausibility",
    "device.failsafe",
    "device.app",
)


IMAGE = []  # the ROMFS image, kept referenced while mounted


def mount_romfs(path):
    import vfs

    with open(path, "rb") as f:
        n = f.seek(0, 2)
        f.seek(0)
        img = bytearray(n)
        f.readinto(img)
    IMAGE.append(img)
    vfs.mount(vfs.VfsRom(img), "/rom")
    sys.path.insert(0, "/rom")


def image_size():
    return len(IMAGE[0]) if IMAGE else 0


def used():
    gc.collect()
    return gc.mem_alloc()


def import_firmware(per_module=None):
    """Import the firmware (everything device.app needs) leaves first."""
    for name in FIRMWARE_MODULES:
        before = used() if per_module is not None else 0
        __import__(name)
        if per_module is not None:
            per_module[name] = used() - before


KEY = bytes(range(32))  # the fake board's signing secret
HB_FIELDS = {"gpu_temp": 60000, "gpu_power": 300000, "power_limit": 700000}


def make_board():
    import fakehal

    fakehal._TX_SIZE = TX_SIZE
    fakehal._RX_SIZE = TX_SIZE  # the receive ring too: a heartbeat is 57 bytes
    hal = fakehal.FakeHal()
    with open(hal.fs_dir.rstrip("/") + "/secret.key", "wb") as f:
        f.write(KEY)
    return fakehal, hal


def boot(fakehal, hal):
    from device.app import App

    app = App(hal)
    app.boot()
    app.wdt = hal.wdt_start(app.cfg["watchdog_ms"])
    return app


class Host:
    """Signed heartbeats, prepared before a measured run (encoding allocates)."""

    def __init__(self, app):
        try:  # the qemu test image freezes modbridge.firmware_host (firmware/qemu.py)
            from modbridge.firmware_host.sign_host import Signer
        except ImportError:  # a deployment (bench_firmware): the harness's copy, as no
            from sign_host import Signer  # board deploys the host side

        self.t = 1000
        self.signer = Signer(KEY, 1, self.clock)
        self.signer.nonce = app.nonce
        self.seq = 0

    def clock(self):
        self.t += 1
        return self.t

    def frames(self, n):
        from protocol import frame

        out = []
        for _ in range(n):
            self.seq += 1
            out.append(frame.encode_frame("heartbeat", HB_FIELDS, self.seq, signer=self.signer))
        return out


def warm_up(fakehal, hal, app, hosted=False):
    fakehal.run(app, hal, 1000)
    hal.tx_len = 0
    host = Host(app)
    hal.send(host.frames(1)[0])
    fakehal.run(app, hal, 2000)
    hal.tx_len = 0
    if not hosted:
        app.hb_ms = hal.ticks_ms()  # standalone-style run: freeze the host
        app.host_timeout_ms = 10**8
    if app.failures or not app.hb_seen:
        raise RuntimeError(f"warm-up failed: failures={app.failures} hb_seen={app.hb_seen}")
    return host


# The commands device.commands answers (it and device.config are imported for each,
# then forgotten), each once, with the answer each must get.
COMMANDS = (
    ("hello_request", {}, "hello"),
    ("config_get", {}, "config"),
    ("config_get", {"section": "pid"}, "config"),
    ("config_set", {"values": {"pid.kp": 6000}}, "ack"),
    ("setpoints", {"sp_gpu": 70000}, "ack"),
    ("pid_gains", {"kp": 5000}, "ack"),
    ("fan_mode", {"mode": 0}, "ack"),
    ("cal_read", {"channel": 0, "samples": 16}, "cal_raw"),
    ("config_save", {}, "ack"),
)


def commands(fakehal, hal, app, host):
    """Send COMMANDS (signed) one at a time, 300 ms of fake time each; check answers."""
    from protocol import frame

    for name, fields, want in COMMANDS:
        host.seq += 1
        hal.tx_len = 0
        hal.decoder.reset()  # a frame cut at the end of the small tx buffer: forget it
        hal.send(frame.encode_frame(name, fields, host.seq, signer=host.signer))
        fakehal.run(app, hal, 300)
        got = [m for m in hal.take() if m.ok and m.fields.get("ref") == host.seq]
        # out of heap, as a failed tick is: also after a part of the answer was sent
        # (config_get's first pages, then a nack)
        text = " ".join([str(m.fields.get("text")) for m in got if m.name == "nack"])
        if "MemoryError" in text:
            raise MemoryError(f"{name}: {text}")
        if want not in [m.name for m in got]:
            raise RuntimeError(f"{name}: answered {[m.fields for m in got]}, not {want}")
    if app.failures or app.internal_errors:
        raise RuntimeError(f"commands: failures={app.failures} internal={app.internal_errors}")


def ticks(app, hal, n, hb=None):
    """n ticks; with ``hb`` (prepared heartbeat frames) one arrives every 10th tick,
    the bridge's 1 s period, through the fake UART."""
    k = 0
    j = 0
    while k < n:
        if hb is not None and k % 10 == 0:
            hal.send(hb[j])
            j += 1
        app.step()
        hal.advance(TICK_MS)
        hal.tx_len = 0
        k += 1


class _Last:
    exc = None


def _keep_failure(app):
    """Remember the exception of a failed tick (storing a reference allocates nothing)."""
    fail_hard = app.fail_hard

    def keep(exc):
        _Last.exc = exc
        fail_hard(exc)

    app.fail_hard = keep


def check(app, n_before, n):
    if app.failures or app.missed:
        if _Last.exc is not None:
            sys.print_exception(_Last.exc)
        raise RuntimeError(f"ticks failed: failures={app.failures} missed={app.missed}")
    if app.ticks - n_before != n:
        raise RuntimeError(f"{n} steps ran {app.ticks - n_before} control ticks")


def ready(with_commands=False):
    fakehal, hal = make_board()
    app = boot(fakehal, hal)
    host = warm_up(fakehal, hal, app)
    if with_commands:
        commands(fakehal, hal, app, host)
    return hal, app


def mode_heap():
    # every key present before ``start``: filling in the values allocates nothing, so
    # the benchmark's own table is not counted as firmware
    per_module = {name: 0 for name in FIRMWARE_MODULES}
    start = used()
    import_firmware(per_module)
    after_import = used()
    fakehal, hal = make_board()
    after_board = used()
    app = boot(fakehal, hal)
    after_boot = used()
    host = warm_up(fakehal, hal, app)
    commands(fakehal, hal, app, host)
    host = None  # the host's signer is not the module's
    hal.tx_len = 0
    after_commands = used()
    out = {}
    out["start"] = start
    out["firmware_imports"] = after_import - start
    out["fake_board"] = after_board - after_import
    out["app_objects"] = after_boot - after_board
    out["after_boot"] = after_boot - image_size()
    out["image"] = image_size()
    out["modules"] = per_module
    out["after_commands"] = after_commands - after_board + out["firmware_imports"]
    out["app_ticks"] = app.ticks  # keep app alive until here
    return out


def mode_heap_board(board):
    """Boot heap as the board ships (``heap_board BOARD``): bench/fakemachine.py at the
    hardware boundary (its module's import left out: C in flash on a board), the
    firmware imports, device.main (main.py's import), ``device.main.make_hal(BOARD,
    machine)`` (``boards.<board>``, the HAL, the machine objects), ``App(hal)`` +
    ``boot()`` + the watchdog, with whatever the harness stored in the board's FS_DIR
    first (bench_arm.py: the factory config.json and secret.key, as ``modbridge
    flash`` writes them). "machine_objects": what the fake machine's objects of one
    more make_hal() take (included in "hal")."""
    import fakemachine

    per_module = {name: 0 for name in FIRMWARE_MODULES}
    start = used()
    import_firmware(per_module)
    after_import = used()
    from device import main as dmain

    after_main = used()
    hal = dmain.make_hal(board, fakemachine)
    dmain.repl_requested(hal.fs_dir)
    after_hal = used()
    from device.app import App

    app = App(hal)
    app.boot()
    app.wdt = hal.wdt_start(app.cfg["watchdog_ms"])
    after_boot = used()
    # the fake machine's share: its objects of a second HAL, kept alone
    made = fakemachine.MADE
    n = made[0]
    hal2 = dmain.make_hal(board, fakemachine)
    hal2 = None
    a = used()
    made[0] = n  # forget the second HAL's objects (their slots stay allocated)
    i = n + 1
    while i < len(made):
        made[i] = None
        i += 1
    machine_objects = a - used()
    return {
        "board": board,
        "firmware_imports": after_import - start,
        "main_module": after_main - after_import,
        "hal": after_hal - after_main,
        "app_objects": after_boot - after_hal,
        "after_boot": after_boot - start,
        "machine_objects": machine_objects,
        "config_source": app.config_source,
        "paired": app.paired,
        "modules": per_module,
        "app_ticks": app.ticks + (hal2 is None),  # keep app alive until here
    }


def mode_fit(with_commands=True):
    hal, app = ready(with_commands)
    n0 = app.ticks
    ticks(app, hal, STEADY_TICKS)
    check(app, n0, STEADY_TICKS)
    return {"ok": 1, "after_run": used() - image_size()}


def mode_alloc(hosted):
    """Bytes per tick; ``hosted``: a signed heartbeat arrives every second (10 ticks)
    and must keep the module HOSTED, else the host is frozen (standalone-like)."""
    fakehal, hal = make_board()
    app = boot(fakehal, hal)
    _keep_failure(app)
    host = warm_up(fakehal, hal, app, hosted)
    n_hb = STEADY_TICKS // 10 + 1
    ticks(app, hal, 10, host.frames(1) if hosted else None)
    hb = host.frames(n_hb) if hosted else None  # signed after the warm-up's: newer
    n0 = app.ticks
    gc.collect()
    gc.disable()
    try:
        before = gc.mem_alloc()
        ticks(app, hal, STEADY_TICKS, hb)
        after = gc.mem_alloc()
    finally:
        gc.enable()
    check(app, n0, STEADY_TICKS)
    locked = 1
    n0 = app.ticks
    hb = host.frames(n_hb) if hosted else None
    hb_before = app.hb.accepted if hosted else 0
    try:
        micropython.heap_lock()
        try:
            ticks(app, hal, STEADY_TICKS, hb)
        finally:
            micropython.heap_unlock()
    except MemoryError:
        locked = 0
    if locked:
        check(app, n0, STEADY_TICKS)
    out = {"alloc_per_tick": (after - before) / STEADY_TICKS, "heap_locked": locked}
    if hosted:
        out["heartbeats"] = app.hb.accepted - hb_before
        out["state"] = app.sup.state
    return out


def mode_speed(telemetry_ms):
    hal, app = ready()
    if telemetry_ms != app.telemetry_ms:
        app.apply_changes({"control.telemetry_ms": telemetry_ms})
        app.hb_ms = hal.ticks_ms()
        app.host_timeout_ms = 10**8
    ticks(app, hal, 20)
    best = 0.0
    for _ in range(5):  # best of 5 runs of 0.5 s
        n = 0
        gc.collect()
        t0 = ticks_us()
        while True:
            ticks(app, hal, 100)
            n += 100
            dt = ticks_diff(ticks_us(), t0)
            if dt >= 500000:
                break
        rate = n * 1000000 / dt
        if rate > best:
            best = rate
    check(app, app.ticks, 0)  # no failure, nothing missed
    return {"ticks_per_s": best, "telemetry_ms": app.telemetry_ms}


# The fragmentation stress (bench/bench_arm_stress.py): seeded random operations on
# the booted App with a stored config, each command signed and answered; a
# MemoryError anywhere (an answer's text, a failed tick, the harness) fails the seed.
STRESS_CMDS = (
    ("hello_request", None),
    ("config_get", None),
    ("config_get", "section"),
    ("config_set", "pid"),
    ("config_set", "telemetry"),
    ("config_save", None),
    ("config_save", None),
    ("setpoints", None),
    ("pid_gains", None),
    ("fan_mode", None),
    ("cal_read", None),
    ("cal_write", None),
    ("selftest", None),
    ("selftest", "abort"),
    ("autotune", None),
    ("autotune", "abort"),
    ("pair", None),
    ("reboot", None),
)
_SECTIONS = ("pid", "fans", "channels", "control", "ina226", "limits")


class _Rand:
    """xorshift32: the same sequence on every port for a seed."""

    def __init__(self, seed):
        self.x = (seed * 2654435761 + 12345) & 0xFFFFFFFF or 1

    def below(self, n):
        x = self.x
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self.x = x
        return x % n


def _stress_fields(name, variant, r):
    if name == "config_get":
        return {"section": _SECTIONS[r.below(len(_SECTIONS))]} if variant else {}
    if name == "config_set":
        if variant == "pid":
            return {"values": {"pid.kp": 3000 + r.below(4000)}}
        return {"values": {"control.telemetry_ms": (200, 500, 1000)[r.below(3)]}}
    if name == "setpoints":
        return {"sp_gpu": 65000 + r.below(10000)}
    if name == "pid_gains":
        return {"kp": 4000 + r.below(3000)}
    if name == "fan_mode":
        if r.below(2):
            return {"mode": 1, "duty1": 30000 + r.below(30000)}
        return {"mode": 0}
    if name == "cal_read":
        return {"channel": r.below(4), "samples": 1 + r.below(64)}
    if name == "cal_write":
        return {"channel": r.below(4), "model": 1, "coeffs": [3900 + r.below(100), 10000, 25000]}
    if name == "selftest":
        return {"abort": True} if variant else {}
    if name == "autotune":
        return {"action": 1 if variant else 0}
    if name == "pair":
        return {"key": KEY}
    return {}


def store_factory_config(hal):
    """config.json as ``modbridge flash`` writes it (flash.default_config: the
    envelope of ``device.config.DEFAULTS``), before the first boot."""
    from device import config

    text = config.encode_file(config.DEFAULTS)
    with open(hal.fs_dir.rstrip("/") + "/" + config.FILE_NAME, "wb") as f:
        f.write(text)
    from device.app import _release

    text = config = None
    _release()  # as App() leaves device.config: not imported
    gc.collect()


class _Stress:
    def __init__(self, seed, collect):
        self.r = _Rand(seed)
        self.collect = collect
        self.fakehal, self.hal = make_board()
        store_factory_config(self.hal)
        self.app = boot(self.fakehal, self.hal)
        self.host = warm_up(self.fakehal, self.hal, self.app, True)
        self.k = 0  # ticks since the warm-up: a heartbeat every 10th (1 s)
        self.nacks = {}
        self.answered = 0
        self.reboots = 0
        self.low = gc.mem_free()

    def tick(self, keep=False):
        from protocol import frame

        hal = self.hal
        if self.k % 10 == 0:
            self.host.seq += 1
            hal.send(frame.encode_frame("heartbeat", HB_FIELDS, self.host.seq,
                                        signer=self.host.signer))
        self.app.step()
        hal.advance(TICK_MS)
        if not keep:  # what the module sent: kept only while a command is answered
            hal.tx_len = 0
        self.k += 1
        if hal.resets:  # the reboot command: a new App boots on the same filesystem
            hal.resets = 0
            self.reboot()

    def reboot(self):
        """What machine.reset() does to the heap: nothing of the old App survives.
        Every reference to it goes (the harness's, the last failure kept by
        _keep_failure, the tach pins' IRQ handlers, which a reset clears), the heap is
        collected, then a new App boots on the same filesystem. The firmware's modules
        stay imported where the first boot put them, packed at the bottom of the heap
        as a boot after a reset packs them (importing them again after the collect
        scatters them through the holes the run left: long seeds 2-5 then failed at a
        reboot's 1,028 B NTC table). The rest of the heap (the harness, the host's
        signer, the fake board, the interned names) stays where it was: more than a
        board holds after a reset, so a failure at a reboot may be the harness's."""
        hal = self.hal
        for pin in hal.tach:
            pin.irq(handler=None)
        self.app = None
        _Last.exc = None
        gc.collect()
        self.app = boot(self.fakehal, hal)
        _keep_failure(self.app)
        self.host.signer.nonce = self.app.nonce
        self.reboots += 1

    def command(self, name, fields):
        from protocol import frame

        hal = self.hal
        if self.collect:
            gc.collect()
        self.host.seq += 1
        seq = self.host.seq
        hal.tx_len = 0
        hal.decoder.reset()
        hal.send(frame.encode_frame(name, fields, seq, signer=self.host.signer))
        n = 0
        while n < 30:
            self.tick(True)
            # the host's side decodes what the module sent in place: fakehal.take()
            # copies it first (up to 1 KB a call), a block no board allocates
            got = [m for m in hal.decoder.feed(hal.tx, hal.tx_len)
                   if m.ok and m.fields.get("ref") == seq]
            hal.tx_len = 0
            for m in got:
                if m.name == "nack":
                    text = str(m.fields.get("text"))
                    if "MemoryError" in text:
                        raise MemoryError(text)
                    self.nacks[name] = self.nacks.get(name, 0) + 1
            if got or (name == "reboot" and self.reboots):
                self.answered += 1
                return
            n += 1

    def op(self):
        r = self.r
        if r.below(3):
            self.what = "ticks"
            for _ in range(1 + r.below(30)):
                self.tick()
            return
        name, variant = STRESS_CMDS[r.below(len(STRESS_CMDS))]
        self.what = name
        self.command(name, _stress_fields(name, variant, r))

    def check(self):
        app = self.app
        if app.failures or app.internal_errors:
            if _Last.exc is not None:
                sys.print_exception(_Last.exc)
            raise RuntimeError(f"failures={app.failures} internal={app.internal_errors}")


def mode_stress(seed, n_ops, collect):
    try:
        st = _Stress(seed, collect)
    except Exception as e:  # the first boot and warm-up: operation -1
        sys.print_exception(e)
        return {"ok": 0, "seed": seed, "op": -1, "what": "boot", "error": repr(e),
                "answered": 0, "reboots": 0, "low_free": gc.mem_free()}
    _keep_failure(st.app)
    st.what = "boot"
    st.i = -1
    try:
        while st.i + 1 < n_ops:
            st.i += 1
            st.op()
            st.check()
            free = gc.mem_free()
            if free < st.low:
                st.low = free
    except Exception as e:  # MemoryError or a failed tick: which seed, which operation
        sys.print_exception(e)
        return {"ok": 0, "seed": seed, "op": st.i, "what": st.what, "error": repr(e),
                "answered": st.answered, "reboots": st.reboots, "low_free": st.low}
    gc.collect()
    return {"ok": 1, "seed": seed, "ops": n_ops, "answered": st.answered,
            "reboots": st.reboots, "nacks": st.nacks, "low_free": st.low,
            "free_after": gc.mem_free()}


def main(argv):
    import json

    argv = list(argv)
    if "--romfs" in argv:
        i = argv.index("--romfs")
        mount_romfs(argv[i + 1])
        del argv[i : i + 2]
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "heap":
        out = mode_heap()
    elif mode == "heap_board":
        out = mode_heap_board(argv[2])
    elif mode == "fit":
        out = mode_fit()
    elif mode == "fit_ticks":
        out = mode_fit(False)
    elif mode == "alloc":
        out = mode_alloc(False)
    elif mode == "alloc_hosted":
        out = mode_alloc(True)
    elif mode == "speed":
        out = mode_speed(int(argv[2]))
    elif mode == "stress":
        out = mode_stress(int(argv[2]), int(argv[3]), int(argv[4]))
    else:
        raise SystemExit(
            "usage: mpy_firmware_bench.py heap|fit|fit_ticks|alloc|alloc_hosted|speed MS"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
