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

from array import array

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


# A fan's settings and state: one array('i') (``Fan._a``), indexed by these. The first
# 17 are what ``__getattr__`` answers by name (its tuple's order).
_FREQ = const(0)  # freq_hz
_MIN = const(1)  # min_duty
_KICK_DUTY = const(2)
_KICK_MS = const(3)
_PPR = const(4)  # pulses_per_rev
_WIN_MS = const(5)  # rpm_window_ms
_STALL_MS = const(6)
_MAX_RPM = const(7)
_ALLOW_STOP = const(8)  # 0/1
_INVERT = const(9)  # 0/1
_RPM_FLOOR = const(10)  # the model's floor at 100 %
_SETTLE_MS = const(11)
_COMMANDED = const(12)  # the last request after clamping
_GLITCHES = const(13)
_SETTLED = const(14)  # settled_duty: a duty applied for >= settle_ms without a kick
_KIND = const(15)  # implausible_kind
_ICOUNT = const(16)  # implausible_count
_CHECK_DUTY = const(17)  # the model's rpm_check_duty
_TARGET = const(18)  # the duty to apply (after min-duty), once a kick ends
_KICK_START = const(19)
_STARTED = const(20)  # first update() seen
_WIN_START = const(21)  # the RPM window
_WIN_COUNT = const(22)
_TICK_COUNT = const(23)  # the pulse count at the last update()
_ALIVE_MS = const(24)  # last time the fan was known turning (or started)
_PEND = const(25)  # lowest duty since _PEND_MS: becomes settled_duty after settle_ms
_PEND_MS = const(26)
_OFF = const(27)  # applied duty 0 (stopped) at the last update
_OFF_MS = const(28)  # when it stopped
_BAD = const(29)  # the reading is off for the duty since _BAD_MS
_BAD_MS = const(30)
_N_STATE = const(31)


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

    What the tick and the IRQ touch most (``pulses``, ``rpm``, ``duty``, ``stalled``,
    ``kicking``, ``implausible``) are attributes; the settings and the rest of the
    state live in one ``array('i')``, the settings and counters read back by name
    through ``__getattr__`` (a 41-attribute instance dict was 392 B on a 32-bit port).
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
        self._a = array("i", bytes(4 * _N_STATE))
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

        self.pulses = 0  # incremented by the ISR only
        self.rpm = 0
        self.stalled = False
        self.kicking = False
        self.duty = -1  # forces the first write
        self.implausible = False  # plausibility (see the module docstring)
        a = self._a
        a[_COMMANDED] = initial_duty

        pwm.freq(freq_hz)
        a[_TARGET] = self._effective(initial_duty)
        self._apply(a[_TARGET])
        # Bound method created once: the IRQ must not allocate.
        self._isr = self._on_edge
        tach_pin.irq(handler=self._isr, trigger=irq_trigger)

    def __getattr__(self, name):
        """The settings and counters by name (read-only; the tick never asks here)."""
        names = (
            "freq_hz",
            "min_duty",
            "kick_duty",
            "kick_ms",
            "pulses_per_rev",
            "rpm_window_ms",
            "stall_ms",
            "max_rpm",
            "allow_stop",
            "invert",
            "rpm_floor",
            "settle_ms",
            "commanded",
            "glitches",
            "settled_duty",
            "implausible_kind",
            "implausible_count",
        )
        for i in range(len(names)):
            if names[i] == name:
                v = self._a[i]
                return v != 0 if i == _ALLOW_STOP or i == _INVERT else v
        raise AttributeError(name)

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
        a = self._a
        a[_FREQ] = freq_hz
        a[_MIN] = min_duty
        a[_KICK_DUTY] = kick_duty
        a[_KICK_MS] = kick_ms
        a[_PPR] = pulses_per_rev
        a[_WIN_MS] = rpm_window_ms
        a[_STALL_MS] = stall_ms
        a[_MAX_RPM] = max_rpm
        a[_ALLOW_STOP] = 1 if allow_stop else 0
        a[_INVERT] = 1 if invert else 0
        self.model = model
        a[_RPM_FLOOR] = _floors.rpm_floor(model)
        a[_CHECK_DUTY] = model[_floors.FM_RPM_CHECK_DUTY]
        a[_SETTLE_MS] = kick_ms if kick_ms > _SETTLE_MIN_MS else _SETTLE_MIN_MS

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
        a = self._a
        cur = {
            "freq_hz": a[_FREQ],
            "min_duty": a[_MIN],
            "kick_duty": a[_KICK_DUTY],
            "kick_ms": a[_KICK_MS],
            "pulses_per_rev": a[_PPR],
            "rpm_window_ms": a[_WIN_MS],
            "stall_ms": a[_STALL_MS],
            "max_rpm": a[_MAX_RPM],
            "allow_stop": a[_ALLOW_STOP] != 0,
            "invert": a[_INVERT] != 0,
            "model": self.model,
        }
        for key, arg in _CONFIG_KEYS:
            if key in cfg:
                cur[arg] = cfg[key]
        old_freq = a[_FREQ]
        old_invert = a[_INVERT]
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
        a[_BAD] = 0  # the model or the timing may have changed: judge afresh
        if a[_KIND] == IMPLAUSIBLE_TURNING and not a[_ALLOW_STOP]:
            self._clear_implausible()  # the fan is no longer told to stop
        if a[_FREQ] != old_freq:
            self.pwm.freq(a[_FREQ])
        if a[_INVERT] != old_invert:
            self.duty = -1  # the PWM level means the opposite now: rewrite it
        a[_TARGET] = self._effective(a[_COMMANDED])
        if self.kicking:
            if a[_TARGET] == 0:
                self.kicking = False
                self._apply(0)
            else:
                self._apply(self.duty if self.duty >= 0 else a[_KICK_DUTY])
        else:
            self._apply(a[_TARGET])

    def force_full(self):
        """Drive 100 % cooling straight to the PWM (honours ``invert``); never raises
        for a sane PWM object. For error paths: the next ``set_duty`` takes over again."""
        self.kicking = False
        self.duty = _DUTY_MAX
        self.pwm.duty_u16(0 if self._a[_INVERT] else _DUTY_MAX)

    def _clear_implausible(self):
        self.implausible = False
        self._a[_KIND] = IMPLAUSIBLE_NONE

    def _on_edge(self, pin):
        self.pulses = (self.pulses + 1) & _COUNT_MASK

    def _apply(self, duty):
        if duty != self.duty:
            self.duty = duty
            self.pwm.duty_u16(_DUTY_MAX - duty if self._a[_INVERT] else duty)

    def _effective(self, duty):
        a = self._a
        if duty == 0 and a[_ALLOW_STOP]:
            return 0
        if duty < a[_MIN]:
            return a[_MIN]
        return duty

    def set_duty(self, duty_u16, now_ms):
        """Request a duty (0..65535, clamped); kicks first when starting from stop."""
        if not isinstance(duty_u16, int) or isinstance(duty_u16, bool):
            raise ValueError("duty_u16 must be an int")
        if duty_u16 < 0:
            duty_u16 = 0
        elif duty_u16 > _DUTY_MAX:
            duty_u16 = _DUTY_MAX
        a = self._a
        a[_COMMANDED] = duty_u16
        target = self._effective(duty_u16)
        a[_TARGET] = target
        if target == 0:
            self.kicking = False
            self.stalled = False
            self._apply(0)
            return
        if self.duty == 0:  # starting from stop
            a[_ALIVE_MS] = now_ms
            if a[_KICK_MS] > 0 and target < a[_KICK_DUTY]:
                self.kicking = True
                a[_KICK_START] = now_ms
                self._apply(a[_KICK_DUTY])
                return
        if not self.kicking:
            self._apply(target)

    def update(self, now_ms):
        """Per control tick: end a kick, measure RPM, detect a stall, judge the reading."""
        count = self.pulses
        a = self._a
        if not a[_STARTED]:
            a[_STARTED] = 1
            a[_WIN_START] = now_ms
            a[_WIN_COUNT] = count
            a[_TICK_COUNT] = count
            a[_ALIVE_MS] = now_ms
            a[_PEND_MS] = now_ms  # not settled before the first tick
            a[_OFF] = 1 if self.duty == 0 else 0
            a[_OFF_MS] = now_ms  # a stop seen at boot: the rotor may still coast
            return
        if self.kicking and _diff(now_ms, a[_KICK_START]) >= a[_KICK_MS]:
            self.kicking = False
            self._apply(a[_TARGET])

        # RPM window
        fresh = False
        elapsed = _diff(now_ms, a[_WIN_START])
        win = a[_WIN_MS]
        if elapsed >= win:
            n = (count - a[_WIN_COUNT]) & _COUNT_MASK
            if elapsed <= 2 * win:
                ppr = a[_PPR]
                limit = a[_MAX_RPM] * ppr * elapsed // _MS_PER_MIN
                if n > limit:
                    a[_GLITCHES] += 1
                else:
                    self.rpm = rpm_from_pulses(n, ppr, elapsed)
                    fresh = True
            a[_WIN_START] = now_ms
            a[_WIN_COUNT] = count
        elif elapsed < 0:  # clock went backwards: restart the window
            a[_WIN_START] = now_ms
            a[_WIN_COUNT] = count

        # Stall: running but no pulse for stall_ms. Once stalled, stray pulses (a
        # coasting rotor, a glitch) do not clear it: a full RPM window must show the
        # fan really turning again, so the fault does not flap.
        if count != a[_TICK_COUNT]:
            a[_TICK_COUNT] = count
            if not self.stalled or self.rpm >= _STALL_CLEAR_RPM:
                a[_ALIVE_MS] = now_ms
                self.stalled = False
        elif self.duty == 0:
            a[_ALIVE_MS] = now_ms
            self.stalled = False
        elif _diff(now_ms, a[_ALIVE_MS]) >= a[_STALL_MS]:
            self.stalled = True

        self._plausibility(now_ms, fresh)

    def _plausibility(self, now_ms, fresh):
        """Judge the reading against the settled duty; ``fresh``: a window just closed."""
        a = self._a
        d = 0 if self.kicking else self.duty
        # settled_duty = the lowest duty over at least settle_ms (lower duties at once)
        if d < a[_SETTLED]:
            a[_SETTLED] = d
            a[_PEND] = d
            a[_PEND_MS] = now_ms
        else:
            if d < a[_PEND]:
                a[_PEND] = d
            if _diff(now_ms, a[_PEND_MS]) >= a[_SETTLE_MS]:
                a[_SETTLED] = a[_PEND]
                a[_PEND] = d
                a[_PEND_MS] = now_ms
        if self.duty == 0:
            if not a[_OFF]:
                a[_OFF] = 1
                a[_OFF_MS] = now_ms
        else:
            a[_OFF] = 0

        kind = IMPLAUSIBLE_NONE  # what the reading would be, were it to last
        judged = False  # a check applies this tick
        settled = a[_SETTLED]
        floor = a[_RPM_FLOOR]
        if a[_OFF]:
            if _diff(now_ms, a[_OFF_MS]) >= _STOP_SPINDOWN_MS:
                judged = True
                if self.rpm >= _STOP_RPM:
                    kind = IMPLAUSIBLE_TURNING
        elif d > 0 and settled >= a[_CHECK_DUTY] and floor > 0:
            judged = True
            # rpm_floor <= _FLOOR_MAX and settled >> 6 <= 1023: below 2**30
            if self.rpm < floor * (settled >> 6) // 1024:
                kind = IMPLAUSIBLE_SLOW
        if kind != IMPLAUSIBLE_NONE:
            if not a[_BAD]:
                a[_BAD] = 1
                a[_BAD_MS] = now_ms
            elif (
                not self.implausible
                and not self.stalled
                and _diff(now_ms, a[_BAD_MS]) >= a[_STALL_MS]
            ):
                self.implausible = True
                a[_KIND] = kind
                a[_ICOUNT] += 1
            return
        a[_BAD] = 0
        if not (judged and fresh and self.implausible):
            return
        # A full window that fits clears the fault, if it answers the question the
        # fault raised: a slow reading by a running window, a turning one by a stop.
        if (a[_OFF] != 0) == (a[_KIND] == IMPLAUSIBLE_TURNING):
            self._clear_implausible()
