"""4-wire PWM fan: 25 kHz PWM with minimum duty and spin-up kick, tach counted in IRQ.

``Fan(pwm, tach_pin, irq_trigger, ...)`` takes a ``machine.PWM``-like and a
``machine.Pin``-like object (bus injected, nothing built here). Time comes in as
``now_ms`` arguments (the HAL's ``ticks_ms()``); differences follow ``ticks_diff``
for a 2**30 period, as on 32-bit MicroPython ports.

Duty requests (``set_duty(duty_u16, now_ms)``):

- ints are clamped to 0..65535 (a control law may overshoot); anything that is not an
  int (float, None, str, bool) raises ValueError;
- a non-zero request below ``min_duty`` becomes ``min_duty``; 0 means "stop" only with
  ``allow_stop=True``, otherwise it also becomes ``min_duty``;
- starting from stopped (applied duty 0) drives ``kick_duty`` for ``kick_ms`` first;
  ``update()`` then applies the latest request. A stop cancels a kick.

``update(now_ms)`` runs once per control tick:

- RPM over a window of at least ``rpm_window_ms``:
  ``rpm = pulses * 60000 // (pulses_per_rev * elapsed_ms)`` (integer). The elapsed
  time is measured, so a late tick does not inflate the reading; a window longer
  than twice ``rpm_window_ms`` (the loop stalled) is discarded and the reading kept.
- Glitch filter: a window whose pulse count implies more than ``max_rpm`` (noise
  coupled onto the tach line) is discarded (``glitches`` counts them) and the previous
  reading kept. The check compares counts first, so nothing overflows.
- Stall: the fan is commanded to run (applied duty >= ``min_duty``, i.e. not stopped)
  but no tach pulse arrived for ``stall_ms``. Spin-up counts from the start command.
  ``stalled`` clears once a full RPM window reads at least 100 RPM again (a coasting
  rotor's last pulses do not clear it).
  (The design card says "above minimum"; a fan at exactly ``min_duty`` that does not
  turn is stalled too -- min_duty is by definition a duty that spins it -- and the
  fail-safe then raises the floor, which is the safe outcome.)

Tach plausibility (``model``: a fan model tuple of ``device.floors``, or its name;
default ``floors.FAN_MODEL_DEFAULT``). ``stalled`` only sees a tach that went silent;
noise coupled onto the line (a stopped rotor with 10 edges/s reads 300 RPM) or a
rotor coasting down keeps it quiet. ``implausible`` compares the reading with the duty:

- Settled duty: the floor is computed from ``settled_duty`` -- a duty the fan has been
  driven at or above for at least ``settle_ms = max(kick_ms, 3000)`` (a kick counts
  as 0: the fan is not settled while it kicks). A lower duty takes effect at once,
  a higher one after ``settle_ms`` to ``2 * settle_ms``; so a spin-up never meets
  the floor of its new duty before it had the time to get there.
- Running: with ``settled_duty >= rpm_check_duty``, a reading below
  ``rpm_floor(model) * settled_duty / 65535`` (``rpm_floor`` = ``rpm_nominal *
  rpm_floor_pct / 100``, the floor at 100 %) for ``stall_ms`` sets ``implausible``
  (``implausible_kind == IMPLAUSIBLE_SLOW``). It clears when an RPM window closes at
  or above the floor. The floor scales with duty: a fan's RPM curve runs at or above
  the line from 0 to its full speed (real curves have a positive intercept, so
  RPM(d) / d is largest at low duty), and so the margin between a healthy fan and the
  floor is smallest at 100 %, where the model's numbers set it.
- Stopped (``allow_stop`` and duty 0): once ``STOP_SPINDOWN_MS`` have passed since the
  stop, a reading at or above ``STOP_RPM`` for ``stall_ms`` sets it
  (``IMPLAUSIBLE_TURNING``): the rotor does not stop when told to, or the tach line
  carries noise that would hide a stall. It clears only when a stopped window reads
  below ``STOP_RPM`` again (or ``configure`` turns ``allow_stop`` off): a fan driven
  again cannot show that it stops, and clearing on a good running window would make
  the fault come back every minute.
- A silent tach while running is a stall, not this: ``implausible`` is not raised
  while ``stalled`` (it stays if it was already set, e.g. by a coasting rotor).
- ``implausible_count`` counts the times it was raised. No events: the supervisor
  raises them on the edges.

Read-only attributes: ``rpm``, ``duty`` (applied to the PWM, before ``invert``),
``commanded`` (the last request after clamping, before min-duty/kick), ``stalled``,
``kicking``, ``glitches``, ``pulses`` (tach edges seen, modulo 2**29), ``model``,
``rpm_floor`` (floor at 100 %), ``settle_ms``, ``settled_duty``, ``implausible``,
``implausible_kind``, ``implausible_count``.

``update()``, ``set_duty()`` and the tach ISR allocate nothing: ints within +-2**30,
the ISR is a bound method created once in ``__init__`` and only increments a counter
(safe as a hard IRQ). The constructor drives ``initial_duty`` (full speed by default:
until the control loop says otherwise, cooling is at its maximum).
"""

from device import floors as _floors

try:
    from micropython import const
except ImportError:
    const = lambda x: x

_STALL_CLEAR_RPM = const(100)  # a stalled fan is back when a window reads >= this
_DUTY_MAX = const(65535)
_COUNT_MASK = const(0x1FFFFFFF)  # ISR counter wraps before leaving small-int range
_HALF_PERIOD = const(0x20000000)  # half of the 2**30 tick period
_MS_PER_MIN = const(60000)
_SMALL_INT_LIMIT = const(0x3FFFFFFF)
_SETTLE_MIN_MS = const(3000)  # longer than any spin-up between two duties
_FLOOR_MAX = const(1048575)  # rpm_floor * (duty >> 6) stays below 2**30
_STOP_SPINDOWN_MS = const(30000)  # a 140 mm fan coasts from full speed to rest in < 30 s
_STOP_RPM = const(150)  # a stopped rotor reads 0; 5 edges/s at 2 ppr is 150

IMPLAUSIBLE_NONE = const(0)
IMPLAUSIBLE_SLOW = const(1)  # turning far slower than the settled duty allows
IMPLAUSIBLE_TURNING = const(2)  # reading RPM while stopped
STOP_SPINDOWN_MS = _STOP_SPINDOWN_MS
STOP_RPM = _STOP_RPM


def _diff(a, b):
    """ticks_diff(a, b) for a 2**30 tick period without leaving small-int range."""
    d = a - b
    if d >= _HALF_PERIOD:
        d = d - _HALF_PERIOD - _HALF_PERIOD
    elif d < -_HALF_PERIOD:
        d = d + _HALF_PERIOD + _HALF_PERIOD
    return d


def rpm_from_pulses(pulses, pulses_per_rev, elapsed_ms):
    """Revolutions per minute from tach pulses counted over ``elapsed_ms``.

    >>> rpm_from_pulses(50, 2, 1000)
    1500
    """
    return pulses * _MS_PER_MIN // (pulses_per_rev * elapsed_ms)


def _check_int(value, lo, hi, what):
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or value > hi:
        raise ValueError("%s must be an int %d..%d, got %r" % (what, lo, hi, value))


def _resolve_model(model):
    """The model tuple for ``model`` (None, a name in ``FAN_MODELS`` or a tuple)."""
    if model is None:
        return _floors.fan_model(None)
    if isinstance(model, str):
        return _floors.fan_model(model)  # ValueError for an unknown name
    if not isinstance(model, tuple) or len(model) <= _floors.FM_RPM_NOMINAL:
        raise ValueError("model must be a fan model name or tuple, got %r" % (model,))
    _check_int(model[_floors.FM_RPM_CHECK_DUTY], 0, _DUTY_MAX, "model rpm_check_duty")
    _check_int(model[_floors.FM_RPM_FLOOR_PCT], 0, 100, "model rpm_floor_pct")
    _check_int(model[_floors.FM_RPM_NOMINAL], 0, 1000000, "model rpm_nominal")
    if _floors.rpm_floor(model) > _FLOOR_MAX:
        raise ValueError("model rpm floor %d exceeds %d" % (_floors.rpm_floor(model), _FLOOR_MAX))
    return model


# config key -> constructor argument (device/config.py's "fans" entries use "ppr")
_CONFIG_KEYS = (
    ("freq_hz", "freq_hz"),
    ("min_duty", "min_duty"),
    ("kick_duty", "kick_duty"),
    ("kick_ms", "kick_ms"),
    ("ppr", "pulses_per_rev"),
    ("pulses_per_rev", "pulses_per_rev"),
    ("rpm_window_ms", "rpm_window_ms"),
    ("stall_ms", "stall_ms"),
    ("max_rpm", "max_rpm"),
    ("allow_stop", "allow_stop"),
    ("invert", "invert"),
    ("model", "model"),
)


class Fan:
    """One 4-wire fan. See the module docstring for the behaviour.

    ``Fan.from_config(pwm, tach_pin, irq_trigger, cfg)`` builds one from a config dict
    (keys ``min_duty``, ``kick_duty``, ``kick_ms``, ``ppr``, ``stall_ms``, ``max_rpm``,
    optionally ``freq_hz``, ``rpm_window_ms``, ``allow_stop``, ``invert``, ``model``;
    unknown keys are ignored); its ``model=`` argument, when given, wins over the dict's
    (the board's compiled fan model). ``configure(cfg)`` applies such a dict to a
    running fan (missing keys keep their value; the tach IRQ and counters are kept).
    ``pwm`` is the PWM object; ``force_full()`` drives 100 % directly, for last-resort
    error paths.
    """

    def __init__(
        self,
        pwm,
        tach_pin,
        irq_trigger,
        freq_hz=25000,
        min_duty=13107,
        kick_duty=65535,
        kick_ms=500,
        pulses_per_rev=2,
        rpm_window_ms=1000,
        stall_ms=3000,
        max_rpm=20000,
        allow_stop=False,
        invert=False,
        initial_duty=65535,
        model=None,
    ):
        _check_int(initial_duty, 0, _DUTY_MAX, "initial_duty")
        self._set(
            freq_hz,
            min_duty,
            kick_duty,
            kick_ms,
            pulses_per_rev,
            rpm_window_ms,
            stall_ms,
            max_rpm,
            allow_stop,
            invert,
            model,
        )
        self.pwm = pwm
        self._pin = tach_pin

        self.pulses = 0  # incremented by the ISR only
        self.rpm = 0
        self.stalled = False
        self.kicking = False
        self.glitches = 0
        self.duty = -1  # forces the first write
        self.commanded = initial_duty
        self._target = 0
        self._kick_start = 0
        self._started = False  # first update() seen
        self._win_start = 0
        self._win_count = 0
        self._tick_count = 0
        self._alive_ms = 0  # last time the fan was known turning (or started)
        # plausibility (see the module docstring)
        self.implausible = False
        self.implausible_kind = IMPLAUSIBLE_NONE
        self.implausible_count = 0
        self.settled_duty = 0  # a duty applied for >= settle_ms without a kick
        self._pend = 0  # lowest duty since _pend_ms: becomes settled_duty after settle_ms
        self._pend_ms = 0
        self._off = False  # applied duty 0 (stopped) at the last update
        self._off_ms = 0  # when it stopped
        self._bad = False  # the reading is off for the duty since _bad_ms
        self._bad_ms = 0

        pwm.freq(freq_hz)
        self._target = self._effective(initial_duty)
        self._apply(self._target)
        # Bound method created once: the IRQ must not allocate.
        self._isr = self._on_edge
        tach_pin.irq(handler=self._isr, trigger=irq_trigger)

    def _set(
        self,
        freq_hz,
        min_duty,
        kick_duty,
        kick_ms,
        pulses_per_rev,
        rpm_window_ms,
        stall_ms,
        max_rpm,
        allow_stop,
        invert,
        model,
    ):
        """Validate every parameter, then assign them all (nothing changes on error)."""
        model = _resolve_model(model)
        _check_int(freq_hz, 1, 1000000, "freq_hz")
        _check_int(min_duty, 0, _DUTY_MAX, "min_duty")
        _check_int(kick_duty, 0, _DUTY_MAX, "kick_duty")
        _check_int(kick_ms, 0, 60000, "kick_ms")
        _check_int(pulses_per_rev, 1, 16, "pulses_per_rev")
        _check_int(rpm_window_ms, 50, 60000, "rpm_window_ms")
        _check_int(stall_ms, 1, 600000, "stall_ms")
        _check_int(max_rpm, 1, 1000000, "max_rpm")
        if kick_duty < min_duty:
            raise ValueError("kick_duty %d is below min_duty %d" % (kick_duty, min_duty))
        # glitch limit = max_rpm * ppr * elapsed (elapsed <= 2 windows) must stay small
        if max_rpm * pulses_per_rev * 2 * rpm_window_ms > _SMALL_INT_LIMIT:
            raise ValueError(
                "max_rpm * pulses_per_rev * 2 * rpm_window_ms exceeds 2**30; "
                "use a shorter window or a lower max_rpm"
            )
        self.freq_hz = freq_hz
        self.min_duty = min_duty
        self.kick_duty = kick_duty
        self.kick_ms = kick_ms
        self.pulses_per_rev = pulses_per_rev
        self.rpm_window_ms = rpm_window_ms
        self.stall_ms = stall_ms
        self.max_rpm = max_rpm
        self.allow_stop = bool(allow_stop)
        self.invert = bool(invert)
        self.model = model
        self.rpm_floor = _floors.rpm_floor(model)
        self._check_duty = model[_floors.FM_RPM_CHECK_DUTY]
        self.settle_ms = kick_ms if kick_ms > _SETTLE_MIN_MS else _SETTLE_MIN_MS

    @classmethod
    def from_config(cls, pwm, tach_pin, irq_trigger, cfg, model=None):
        kw = {}
        for key, arg in _CONFIG_KEYS:
            if key in cfg:
                kw[arg] = cfg[key]
        if model is not None:
            kw["model"] = model
        return cls(pwm, tach_pin, irq_trigger, **kw)

    def configure(self, cfg):
        """Apply a config dict to this running fan; the request is re-applied."""
        cur = {
            "freq_hz": self.freq_hz,
            "min_duty": self.min_duty,
            "kick_duty": self.kick_duty,
            "kick_ms": self.kick_ms,
            "pulses_per_rev": self.pulses_per_rev,
            "rpm_window_ms": self.rpm_window_ms,
            "stall_ms": self.stall_ms,
            "max_rpm": self.max_rpm,
            "allow_stop": self.allow_stop,
            "invert": self.invert,
            "model": self.model,
        }
        for key, arg in _CONFIG_KEYS:
            if key in cfg:
                cur[arg] = cfg[key]
        old_freq = self.freq_hz
        old_invert = self.invert
        self._set(
            cur["freq_hz"],
            cur["min_duty"],
            cur["kick_duty"],
            cur["kick_ms"],
            cur["pulses_per_rev"],
            cur["rpm_window_ms"],
            cur["stall_ms"],
            cur["max_rpm"],
            cur["allow_stop"],
            cur["invert"],
            cur["model"],
        )
        self._bad = False  # the model or the timing may have changed: judge afresh
        if self.implausible_kind == IMPLAUSIBLE_TURNING and not self.allow_stop:
            self._clear_implausible()  # the fan is no longer told to stop
        if self.freq_hz != old_freq:
            self.pwm.freq(self.freq_hz)
        if self.invert != old_invert:
            self.duty = -1  # the PWM level means the opposite now: rewrite it
        self._target = self._effective(self.commanded)
        if self.kicking:
            if self._target == 0:
                self.kicking = False
                self._apply(0)
            else:
                self._apply(self.duty if self.duty >= 0 else self.kick_duty)
        else:
            self._apply(self._target)

    def force_full(self):
        """Drive 100 % cooling straight to the PWM (honours ``invert``); never raises
        for a sane PWM object. For error paths: the next ``set_duty`` takes over again."""
        self.kicking = False
        self.duty = _DUTY_MAX
        self.pwm.duty_u16(0 if self.invert else _DUTY_MAX)

    def _clear_implausible(self):
        self.implausible = False
        self.implausible_kind = IMPLAUSIBLE_NONE

    def _on_edge(self, pin):
        self.pulses = (self.pulses + 1) & _COUNT_MASK

    def _apply(self, duty):
        if duty != self.duty:
            self.duty = duty
            self.pwm.duty_u16(_DUTY_MAX - duty if self.invert else duty)

    def _effective(self, duty):
        if duty == 0 and self.allow_stop:
            return 0
        if duty < self.min_duty:
            return self.min_duty
        return duty

    def set_duty(self, duty_u16, now_ms):
        """Request a duty (0..65535, clamped); kicks first when starting from stop."""
        if not isinstance(duty_u16, int) or isinstance(duty_u16, bool):
            raise ValueError("duty_u16 must be an int")
        if duty_u16 < 0:
            duty_u16 = 0
        elif duty_u16 > _DUTY_MAX:
            duty_u16 = _DUTY_MAX
        self.commanded = duty_u16
        target = self._effective(duty_u16)
        self._target = target
        if target == 0:
            self.kicking = False
            self.stalled = False
            self._apply(0)
            return
        if self.duty == 0:  # starting from stop
            self._alive_ms = now_ms
            if self.kick_ms > 0 and target < self.kick_duty:
                self.kicking = True
                self._kick_start = now_ms
                self._apply(self.kick_duty)
                return
        if not self.kicking:
            self._apply(target)

    def update(self, now_ms):
        """Per control tick: end a kick, measure RPM, detect a stall, judge the reading."""
        count = self.pulses
        if not self._started:
            self._started = True
            self._win_start = now_ms
            self._win_count = count
            self._tick_count = count
            self._alive_ms = now_ms
            self._pend_ms = now_ms  # not settled before the first tick
            self._off = self.duty == 0
            self._off_ms = now_ms  # a stop seen at boot: the rotor may still coast
            return
        if self.kicking and _diff(now_ms, self._kick_start) >= self.kick_ms:
            self.kicking = False
            self._apply(self._target)

        # RPM window
        fresh = False
        elapsed = _diff(now_ms, self._win_start)
        if elapsed >= self.rpm_window_ms:
            n = (count - self._win_count) & _COUNT_MASK
            if elapsed <= 2 * self.rpm_window_ms:
                limit = self.max_rpm * self.pulses_per_rev * elapsed // _MS_PER_MIN
                if n > limit:
                    self.glitches += 1
                else:
                    self.rpm = rpm_from_pulses(n, self.pulses_per_rev, elapsed)
                    fresh = True
            self._win_start = now_ms
            self._win_count = count
        elif elapsed < 0:  # clock went backwards: restart the window
            self._win_start = now_ms
            self._win_count = count

        # Stall: running but no pulse for stall_ms. Once stalled, stray pulses (a
        # coasting rotor, a glitch) do not clear it: a full RPM window must show the
        # fan really turning again, so the fault does not flap.
        if count != self._tick_count:
            self._tick_count = count
            if not self.stalled or self.rpm >= _STALL_CLEAR_RPM:
                self._alive_ms = now_ms
                self.stalled = False
        elif self.duty == 0:
            self._alive_ms = now_ms
            self.stalled = False
        elif _diff(now_ms, self._alive_ms) >= self.stall_ms:
            self.stalled = True

        self._plausibility(now_ms, fresh)

    def _plausibility(self, now_ms, fresh):
        """Judge the reading against the settled duty; ``fresh``: a window just closed."""
        d = 0 if self.kicking else self.duty
        # settled_duty = the lowest duty over at least settle_ms (lower duties at once)
        if d < self.settled_duty:
            self.settled_duty = d
            self._pend = d
            self._pend_ms = now_ms
        else:
            if d < self._pend:
                self._pend = d
            if _diff(now_ms, self._pend_ms) >= self.settle_ms:
                self.settled_duty = self._pend
                self._pend = d
                self._pend_ms = now_ms
        if self.duty == 0:
            if not self._off:
                self._off = True
                self._off_ms = now_ms
        else:
            self._off = False

        kind = IMPLAUSIBLE_NONE  # what the reading would be, were it to last
        judged = False  # a check applies this tick
        if self._off:
            if _diff(now_ms, self._off_ms) >= _STOP_SPINDOWN_MS:
                judged = True
                if self.rpm >= _STOP_RPM:
                    kind = IMPLAUSIBLE_TURNING
        elif d > 0 and self.settled_duty >= self._check_duty and self.rpm_floor > 0:
            judged = True
            # rpm_floor <= _FLOOR_MAX and settled >> 6 <= 1023: below 2**30
            if self.rpm < self.rpm_floor * (self.settled_duty >> 6) // 1024:
                kind = IMPLAUSIBLE_SLOW
        if kind != IMPLAUSIBLE_NONE:
            if not self._bad:
                self._bad = True
                self._bad_ms = now_ms
            elif (
                not self.implausible
                and not self.stalled
                and _diff(now_ms, self._bad_ms) >= self.stall_ms
            ):
                self.implausible = True
                self.implausible_kind = kind
                self.implausible_count += 1
            return
        self._bad = False
        if not (judged and fresh and self.implausible):
            return
        # A full window that fits clears the fault, if it answers the question the
        # fault raised: a slow reading by a running window, a turning one by a stop.
        if self._off == (self.implausible_kind == IMPLAUSIBLE_TURNING):
            self._clear_implausible()
