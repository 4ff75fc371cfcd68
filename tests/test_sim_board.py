"""The sim board (boards/sim.py) and its link codec (host/modbridge/sim/link.py).

DUAL: runs on CPython and under MicroPython, where the board really runs. Every
message kind crosses between the board's allocation-free end and link.py's codec in
both directions; a steady-state exchange, and the whole firmware loop on the sim
board, run under ``heap_lock``. Also: the one INA226 register model behind both the
fakes and the sim board, and ``App.run()``'s sleep bounded by ``hal.poll_ms``.
"""

import fakes
from fakehal import FakeHal, adc_code
from mpcompat import heap_locked, raises, tmpdir

from boards import sim
from boards.sim_ina226 import INA226Model

try:
    from modbridge.sim import link
except ImportError:  # MicroPython: the host package is not importable; link.py is dual
    import sys

    sys.path.append("host/modbridge/sim")
    import link

DUAL = True

ADDR = 0x40
TEMPS_C = (40.0, 42.0, 45.0, 25.0)


class Pipe:
    """A recording link: replies preloaded as one byte stream, requests kept whole."""

    def __init__(self, *replies):
        self.inbox = b"".join(replies)
        self.pos = 0
        self.sent = []

    def feed(self, data):
        self.inbox = self.inbox[self.pos :] + data
        self.pos = 0

    def readinto(self, buf, n):
        m = min(n, len(self.inbox) - self.pos)
        for i in range(m):
            buf[i] = self.inbox[self.pos + i]
        self.pos += m
        return m

    def write(self, buf, n):
        self.sent.append(bytes(buf[:n]))

    def requests(self):
        return [link.decode_request(m) for m in self.sent]


class LoopWorld:
    """Answers each sleep with one fixed step reply, its time moved on by the sleep.

    Allocation-free (preallocated messages, index loops), so the board can run under
    ``heap_lock`` against it.
    """

    def __init__(self, step, boot):
        self.msg = bytearray(link.encode_reply(step, boot))
        self.step_msg = bytearray(link.encode_reply(step))
        self.pos = 0
        self.ticks = step.ticks_ms
        self.requests = 0
        self.last_kind = -1
        self.tx_bytes = 0
        self.feeds = 0

    def write(self, buf, n):
        self.requests += 1
        kind = buf[2]
        self.last_kind = kind
        self.tx_bytes += buf[27] | (buf[28] << 8)
        self.feeds += buf[21] | (buf[22] << 8)
        if kind == link.REQ_SLEEP:
            ms = buf[5] | (buf[6] << 8) | (buf[7] << 16) | (buf[8] << 24)
            t = (self.ticks + ms) & 0x3FFFFFFF
            self.ticks = t
            m = self.step_msg
            m[5] = t & 0xFF
            m[6] = (t >> 8) & 0xFF
            m[7] = (t >> 16) & 0xFF
            m[8] = (t >> 24) & 0xFF
            self.msg = m
            self.pos = 0

    def readinto(self, buf, n):
        m = self.msg
        p = self.pos
        avail = len(m) - p
        if n > avail:
            n = avail
        i = 0
        while i < n:
            buf[i] = m[p + i]
            i += 1
        self.pos = p + n
        return n


def _adc(temps=TEMPS_C, n=8):
    return [[adc_code(t)] * n for t in temps]


def _step(ticks=1000, flags=0, pulses=(10, 10), rx=b"", n_adc=8, bus_mv=12000, current_ma=5000):
    return link.Step(ticks, flags, bus_mv, current_ma, pulses, _adc(n=n_adc), rx)


def _boot(**kw):
    args = {"reset_cause": "power", "poll_ms": 100, "uid": b"\x01\x02\x03", "fs_dir": "/tmp/x"}
    args.update(kw)
    return link.Boot(**args)


def _hal(*replies):
    pipe = Pipe(*replies)
    return sim.SimHal(pipe.readinto, pipe.write), pipe


# --------------------------------------------------------------------------- format


def test_board_constants_match_the_link_description():
    pairs = (
        (sim.MAGIC_REQ, link.MAGIC_REQ),
        (sim.MAGIC_REP, link.MAGIC_REP),
        (sim.LINK_VERSION, link.VERSION),
        (sim.REQ_BOOT, link.REQ_BOOT),
        (sim.REQ_SLEEP, link.REQ_SLEEP),
        (sim.REQ_TX, link.REQ_TX),
        (sim.REQ_RESET, link.REQ_RESET),
        (sim.REQ_REPL, link.REQ_REPL),
        (sim.REP_BOOT, link.REP_BOOT),
        (sim.REP_STEP, link.REP_STEP),
        (sim.FLAG_STOP, link.FLAG_STOP),
        (sim.FLAG_INA_ABSENT, link.FLAG_INA_ABSENT),
        (sim.FLAG_STARVE_WDT, link.FLAG_STARVE_WDT),
        (sim.HEADER_SIZE, link.HEADER_SIZE),
        (sim.REQ_FIXED_SIZE, link.REQ_FIXED_SIZE),
        (sim.STEP_FIXED_SIZE, link.STEP_FIXED_SIZE),
        (sim.N_ADC, link.N_ADC_CHANNELS),
        (sim.MAX_TX, link.MAX_TX),
        (sim.MAX_RX, link.MAX_RX),
        (sim.MAX_ADC, link.MAX_ADC),
        (sim.RESET_CAUSES, link.RESET_CAUSES),
    )
    for board, desc in pairs:
        assert board == desc, (board, desc)
    assert sim.MAX_REPLY >= link.MAX_REPLY - link.HEADER_SIZE, (sim.MAX_REPLY, link.MAX_REPLY)


def test_link_codec_round_trips_on_its_own():
    req = link.Request(link.REQ_SLEEP, 100, (1, 65535), (25000, 24000), 3, 2000, b"\x00ab\x00")
    assert link.decode_request(link.encode_request(req)) == req
    step = _step(ticks=(1 << 30) - 1, flags=link.FLAG_INA_ABSENT, rx=b"hb", n_adc=16)
    step.bus_mv = -5
    kind, got, boot = link.decode_reply(link.encode_reply(step))
    assert kind == link.REP_STEP and boot is None
    assert got == step
    b = _boot(reset_cause="watchdog", uid=b"\xaa" * 12, fs_dir="/tmp/\u00e9")
    kind, got, boot = link.decode_reply(link.encode_reply(step, b))
    assert kind == link.REP_BOOT and boot == b and got == step


def test_link_rejects_what_is_not_its_format():
    good = link.encode_request(link.Request(link.REQ_SLEEP, 5))
    with raises(link.LinkError, match="magic"):
        link.decode_request(b"T" + good[1:])
    with raises(link.LinkError, match="version"):
        link.decode_request(good[:1] + b"\x09" + good[2:])
    with raises(link.LinkError, match="header says"):
        link.decode_request(good + b"x")
    with raises(link.LinkError, match="kind"):
        link.decode_request(good[:2] + b"\x09" + good[3:])
    with raises(link.LinkError, match="MAX_RX"):
        link.encode_reply(_step(rx=b"x" * (link.MAX_RX + 1)))
    with raises(link.LinkError, match="channels"):
        link.encode_reply(link.Step(adc=[[1]] * 3))


# --------------------------------------------------------------------------- board end


def test_boot_exchange_sets_identity_and_first_readings():
    b = _boot(reset_cause="watchdog", poll_ms=250, uid=b"\x30\x00\x41", fs_dir="/tmp/flash")
    hal, pipe = _hal(link.encode_reply(_step(ticks=77, pulses=(0, 0)), b))
    reqs = pipe.requests()
    assert len(reqs) == 1 and reqs[0].kind == link.REQ_BOOT, reqs
    assert reqs[0].duty == (65535, 65535)  # pins float until the app drives them
    assert hal.unique_id() == b"\x30\x00\x41"
    assert hal.reset_cause() == "watchdog"
    assert hal.fs_dir == "/tmp/flash"
    assert hal.poll_ms == 250
    assert hal.ticks_ms() == 77
    assert hal.adc[0].read_u16() == adc_code(TEMPS_C[0])
    assert hal.adc[3].read_u16() == adc_code(TEMPS_C[3])
    assert hal.name == "sim" and hal.IRQ_FALLING == sim.IRQ_FALLING


def test_sleep_request_carries_duties_feeds_and_tx():
    hal, pipe = _hal(
        link.encode_reply(_step(ticks=0), _boot()), link.encode_reply(_step(ticks=100))
    )
    hal.pwm[0].freq(25000)
    hal.pwm[0].duty_u16(13107)
    hal.pwm[1].duty_u16(40000)
    wdt = hal.wdt_start(99999)  # clamped to the board's maximum
    wdt.feed()
    wdt.feed()
    data = bytearray(b"MODULER\x00frame\x00")
    hal.port_write(data, 8)
    hal.port_write(data, len(data))
    hal.sleep_ms(100)
    req = pipe.requests()[1]
    assert req.kind == link.REQ_SLEEP and req.sleep_ms == 100, req
    assert req.duty == (13107, 40000) and req.freq == (25000, 0), req
    assert req.wdt_feeds == 2 and req.wdt_timeout_ms == sim.WDT_MAX_MS, req
    assert req.tx == bytes(data[:8]) + bytes(data), req.tx
    assert hal.ticks_ms() == 100


def test_reply_drives_adc_ina_tach_and_rx():
    hal, pipe = _hal(link.encode_reply(_step(ticks=0), _boot()))
    seen = []
    hal.tach[0].irq(handler=seen.append, trigger=hal.IRQ_FALLING)
    codes = [[100, 200, 300], [1, 2, 3], [4, 5, 6], [7, 8, 9]]
    pipe.feed(link.encode_reply(link.Step(100, 0, 12345, -2500, (5, 7), codes, b"\x00hello\x00")))
    hal.sleep_ms(100)
    assert len(seen) == 5 and seen[0] is hal.tach[0], seen
    got = [hal.adc[0].read_u16() for _ in range(7)]
    assert got == [100, 200, 300, 100, 200, 300, 100], got  # cyclic
    assert hal.adc[3].read_u16() == 7
    ina = INA226Model(shunt_ohm=sim.SHUNT_OHM)
    ina.set_bus_mv(12345)
    ina.set_current_ma(-2500)
    assert hal.ina.reg(0x02) == ina.reg(0x02) and hal.ina.reg(0x01) == ina.reg(0x01)
    buf = bytearray(4)
    assert hal.port_readinto(buf) == 4 and bytes(buf) == b"\x00hel"
    hal.sleep_ms(100)  # unread host bytes after a read that made progress: no exchange
    assert len(pipe.sent) == 2 and hal.ticks_ms() == 100
    assert hal.port_readinto(buf) == 3 and bytes(buf[:3]) == b"lo\x00"
    assert hal.port_readinto(buf) == 0


def test_pending_rx_does_not_stop_time_for_a_firmware_that_does_not_read():
    hal, pipe = _hal(
        link.encode_reply(_step(ticks=0, rx=b"abc"), _boot()),
        link.encode_reply(_step(ticks=50)),
    )
    hal.sleep_ms(50)  # nothing was read since the reply: time must move on
    assert hal.ticks_ms() == 50
    buf = bytearray(8)
    assert hal.port_readinto(buf) == 3 and bytes(buf[:3]) == b"abc"  # kept, not lost


def test_ina_absent_nacks_and_comes_back():
    hal, pipe = _hal(link.encode_reply(_step(ticks=0), _boot()))
    buf = bytearray(2)
    hal.i2c.readfrom_mem_into(ADDR, 0xFE, buf)
    assert buf == bytearray(b"\x54\x49")
    pipe.feed(link.encode_reply(_step(ticks=100, flags=link.FLAG_INA_ABSENT)))
    hal.sleep_ms(100)
    with raises(OSError) as e:
        hal.i2c.readfrom_mem_into(ADDR, 0xFE, buf)
    assert e.value.args[0] == fakes.ENODEV
    assert hal.i2c.scan() == []
    pipe.feed(link.encode_reply(_step(ticks=200)))
    hal.sleep_ms(100)
    hal.i2c.readfrom_mem_into(ADDR, 0x02, buf)
    assert (buf[0] << 8 | buf[1]) * 5 // 4 == 12000
    with raises(OSError):
        hal.i2c.readfrom_mem_into(0x41, 0xFE, buf)  # nothing at another address


def test_full_tx_buffer_is_relayed_without_time_passing():
    hal, pipe = _hal(link.encode_reply(_step(ticks=0), _boot()))
    data = bytearray(range(256))
    for _ in range(9):  # 2304 bytes > MAX_TX
        hal.port_write(data, len(data))
    reqs = pipe.requests()
    assert [r.kind for r in reqs] == [link.REQ_BOOT, link.REQ_TX], reqs
    assert len(reqs[1].tx) == link.MAX_TX and hal.ticks_ms() == 0
    assert hal.tx_n == 9 * 256 - link.MAX_TX


def test_starve_flag_drops_feeds():
    hal, pipe = _hal(link.encode_reply(_step(ticks=0), _boot()))
    wdt = hal.wdt_start(2000)
    pipe.feed(link.encode_reply(_step(ticks=100, flags=link.FLAG_STARVE_WDT)))
    hal.sleep_ms(100)
    wdt.feed()
    pipe.feed(link.encode_reply(_step(ticks=200)))
    hal.sleep_ms(100)
    reqs = pipe.requests()
    assert reqs[2].wdt_feeds == 0 and reqs[2].wdt_timeout_ms == 2000, reqs[2]


def test_reset_repl_stop_and_a_closed_link():
    hal, pipe = _hal(link.encode_reply(_step(ticks=0), _boot()))
    hal.repl()
    assert pipe.requests()[-1].kind == link.REQ_REPL
    with raises(SystemExit):
        hal.reset()  # the runner kills the process; a closed link ends it here
    assert pipe.requests()[-1].kind == link.REQ_RESET
    pipe.feed(link.encode_reply(_step(ticks=5, flags=link.FLAG_STOP)))
    with raises(SystemExit):
        hal.sleep_ms(10)
    with raises(sim.LinkClosed):
        hal.sleep_ms(10)  # end of file
    pipe.feed(b"Traceback...")
    with raises(sim.LinkClosed):
        hal.sleep_ms(10)


def test_steady_exchange_allocates_nothing():
    world = LoopWorld(_step(ticks=0), _boot())
    hal = sim.SimHal(world.readinto, world.write)
    hal.tach[0].irq(handler=lambda pin: None, trigger=hal.IRQ_FALLING)
    wdt = hal.wdt_start(2000)
    data = bytearray(b"telemetry frame\x00")
    rx = bytearray(16)
    sleep = hal.sleep_ms

    def exchanges():
        i = 0
        while i < 200:
            hal.port_write(data, len(data))
            wdt.feed()
            hal.adc[0].read_u16()
            hal.port_readinto(rx)
            sleep(100)
            i += 1

    heap_locked(exchanges)
    assert world.requests == 201 and hal.ticks_ms() == 20000, (world.requests, hal.ticks_ms())
    assert world.tx_bytes == 200 * len(data) and world.feeds == 200


def test_firmware_loop_on_the_sim_board_allocates_nothing():
    from device.app import App
    from protocol import catalog as C

    world = LoopWorld(_step(ticks=0), _boot(fs_dir=tmpdir()))
    hal = sim.SimHal(world.readinto, world.write)
    app = App(hal)
    app.boot()
    app.wdt = hal.wdt_start(app.cfg["watchdog_ms"])
    poll = hal.poll_ms

    def loop(n):
        i = 0
        while i < n:
            wait = app.step()
            if wait is not None and wait > 0:
                hal.sleep_ms(poll if wait > poll else wait)
            i += 1

    loop(200)  # 20 s: boot, STANDALONE (no host), the events of those transitions
    assert app.sup.state == C.STATE_STANDALONE, app.sup.state
    before = world.requests
    heap_locked(lambda: loop(100))  # 10 s of ticks, telemetry and exchanges
    assert world.requests - before == 100, world.requests - before
    assert world.tx_bytes > 0 and app.fans[0].rpm == 3000, app.fans[0].rpm


# --------------------------------------------------------------------------- INA226 model


def test_one_ina226_register_model():
    assert fakes.FakeINA226 is INA226Model
    i2c = fakes.FakeI2C()
    chip = i2c.add(ADDR, fakes.FakeINA226())
    chip.set_bus_mv(12000)
    assert i2c.readfrom_mem(ADDR, 0x02, 2) == bytes((0x25, 0x80))  # 9600 x 1.25 mV


# --------------------------------------------------------------------------- App.run()


class _StopAfter:
    def __init__(self, hal, n):
        self.hal = hal
        self.n = n
        self.sleeps = []
        self.app = None
        hal.sleep_ms = self.sleep_ms

    def sleep_ms(self, ms):
        self.sleeps.append(ms)
        self.hal.clock.advance(ms)
        if len(self.sleeps) >= self.n:
            self.app.running = False


def _run_app(poll_ms):
    from device.app import App

    hal = FakeHal()
    if poll_ms is not None:
        hal.poll_ms = poll_ms
    stop = _StopAfter(hal, 30)
    app = App(hal)
    stop.app = app
    app.run()
    return app, stop.sleeps, hal


def test_run_sleeps_until_the_next_tick_at_most_poll_ms():
    app, sleeps, hal = _run_app(100)
    assert sleeps == [100] * 30, sleeps  # one sleep per 100 ms control period
    assert app.ticks == 30 and hal.repl_calls == 1, (app.ticks, hal.repl_calls)
    app, sleeps, hal = _run_app(30)
    assert sleeps[:4] == [30, 30, 30, 10], sleeps  # never past the next tick
    assert app.ticks == 8, app.ticks


def test_run_polls_every_millisecond_by_default():
    app, sleeps, hal = _run_app(None)
    assert sleeps == [1] * 30, sleeps
    assert app.ticks == 1, app.ticks
