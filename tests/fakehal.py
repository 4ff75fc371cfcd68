"""A whole fake board for app tests: the HAL of device/README.md built from tests/fakes.py,
plus a tiny plant (fans spin in proportion to duty and pulse their tachs; NTC codes come
from temperatures through the real divider math). Importable on both interpreters, and
``step``/``advance`` do not allocate, so app ticks can run under ``heap_lock``.
"""

from fakes import IRQ_FALLING, FakeADC, FakeClock, FakeI2C, FakeINA226, FakePin, FakePWM
from mpcompat import tmpdir

from device import calib
from protocol import catalog as C
from protocol.frame import StreamDecoder

_TX_SIZE = 1 << 16
TEST_KEY = bytes([0xA5 ^ i for i in range(32)])  # the fake board's signing secret
_TS = [1000]  # one monotonic timestamp source for every test signer
_RX_SIZE = 1 << 14  # 16 KB; the firmware benchmark shrinks it like _TX_SIZE


def adc_code(temp_c, beta=3950, r0=10000, r_fixed=10000):
    """ADC code (read_u16 scale) an NTC at ``temp_c`` produces in the default divider."""
    r = calib.beta_resistance(temp_c + 273.15, beta, r0, 298.15)
    return int(calib.ohms_to_adc(r, r_fixed, True) + 0.5)


class FakeWDT:
    def __init__(self, timeout_ms):
        self.timeout_ms = timeout_ms
        self.feeds = 0

    def feed(self):
        self.feeds += 1


class FakeHal:
    name = "fake"
    IRQ_FALLING = IRQ_FALLING

    def __init__(
        self,
        temps_c=(45.0, 50.0, 55.0, 25.0),
        fs_dir=None,
        clock_start=0,
        bus_mv=12000,
        current_ma=5000,
        max_rpm=3000,
        reset_cause="power",
        secret=TEST_KEY,
    ):
        self.clock = FakeClock(clock_start)
        self.ticks_ms = self.clock.ticks_ms
        self.sleep_ms = self.clock.sleep_ms
        self.adc = [FakeADC(adc_code(t)) for t in temps_c]
        self.i2c = FakeI2C(log=False)
        self.ina = self.i2c.add(0x40, FakeINA226(shunt_ohm=0.001))  # the config default
        self.ina.set_bus_mv(bus_mv)
        self.ina.set_current_ma(current_ma)
        self.pwm = [FakePWM(), FakePWM()]
        self.tach = [FakePin(), FakePin()]
        self.fan_ok = [True, True]
        self.max_rpm = max_rpm
        self._frac = [0, 0]
        self.fs_dir = fs_dir or tmpdir()
        self.secret = secret
        self.signer = None  # set by signer_for(): test helpers sign with it
        if secret is not None:
            with open(self.fs_dir.rstrip("/") + "/secret.key", "wb") as f:
                f.write(secret)
        self._rx = bytearray(_RX_SIZE)  # a ring: receiving never allocates
        self._rx_head = 0
        self._rx_len = 0
        self.tx = bytearray(_TX_SIZE)
        self.tx_len = 0
        self.tx_dropped = 0
        self.wdt = None
        self.resets = 0
        self.repl_calls = 0
        self._reset_cause = reset_cause
        self.decoder = StreamDecoder(accept=C.D2H)

    # -- HAL -----------------------------------------------------------------------
    def port_readinto(self, buf):
        n = self._rx_len
        if not n:
            return 0
        if n > len(buf):
            n = len(buf)
        ring = self._rx
        h = self._rx_head
        i = 0
        while i < n:
            buf[i] = ring[h]
            h += 1
            if h == _RX_SIZE:
                h = 0
            i += 1
        self._rx_head = h
        self._rx_len -= n
        return n

    def port_write(self, buf, n):
        i = 0
        while i < n:
            if self.tx_len < _TX_SIZE:
                self.tx[self.tx_len] = buf[i]
                self.tx_len += 1
            else:
                self.tx_dropped += 1
            i += 1

    def wdt_start(self, timeout_ms):
        self.wdt = FakeWDT(timeout_ms)
        return self.wdt

    def unique_id(self):
        return b"\x30\x00\x41\x00\x0b\x51\x33\x35\x39\x38\x31\x37"

    def reset_cause(self):
        return self._reset_cause

    def reset(self):
        self.resets += 1

    def repl(self):
        self.repl_calls += 1

    # -- test controls -------------------------------------------------------------
    def set_temp(self, channel, temp_c):
        self.adc[channel].set(adc_code(temp_c))

    def set_code(self, channel, code):
        self.adc[channel].set(code)

    def send(self, data):
        """Bytes from the host (allocation-free: into the receive ring)."""
        ring = self._rx
        n = len(data)
        if self._rx_len + n > _RX_SIZE:
            raise ValueError("fake board receive ring full (%d bytes)" % _RX_SIZE)
        t = self._rx_head + self._rx_len
        i = 0
        while i < n:
            if t >= _RX_SIZE:
                t -= _RX_SIZE
            ring[t] = data[i]
            t += 1
            i += 1
        self._rx_len += n

    def rx_pending(self):
        return self._rx_len

    def take(self):
        """Everything the module wrote since the last call, decoded (Message/BadFrame)."""
        data = bytes(self.tx[: self.tx_len])
        self.tx_len = 0
        return self.decoder.feed(data)

    def take_raw(self):
        data = bytes(self.tx[: self.tx_len])
        self.tx_len = 0
        return data

    def advance(self, ms):
        """Move time; fans spin at max_rpm * duty and pulse their tachs (2 per rev)."""
        self.clock.advance(ms)
        i = 0
        while i < 2:
            if self.fan_ok[i]:
                duty = self.pwm[i].duty_u16()
                # pulses * 1000 = rpm * 2 * ms / 60 (thousandths carried over)
                rpm = self.max_rpm * duty // 65535
                acc = self._frac[i] + rpm * 2 * ms * 1000 // 60000
                n = acc // 1000
                self._frac[i] = acc - n * 1000
                if n:
                    self.tach[i].pulse(n)
            i += 1


def _ts():
    _TS[0] += 1
    return _TS[0]


def signer_for(hal, app, link=1):
    """A host signer with the board's secret and ``app``'s nonce, kept on ``hal``."""
    from protocol import sign

    s = sign.Signer(hal.secret if hal.secret is not None else bytes(32), link, _ts)
    s.nonce = app.nonce
    hal.signer = s
    return s


def run(app, hal, ms, step_ms=10):
    """Drive ``app.step()`` for ``ms`` of fake time."""
    t = 0
    while t < ms:
        app.step()
        hal.advance(step_ms)
        t += step_ms
