"""What a module does not alarm on but the host must (docs/policy.md, "Blind spots").

Its control is degraded (a sensor fault, a tach it cannot trust) or held below what
automatic control would command (MANUAL, while hot). Each raises WARN with its own
reason and stays ``sensor_clear_s`` after its condition was last seen.
"""

from __future__ import annotations

from modbridge.model import ModuleStatus
from modbridge.policy.config import PolicyConfig
from modbridge.policy.hysteresis import Latches, Sticky
from modbridge.policy.levels import R_MANUAL_LOW_DUTY, R_SENSOR_FAULT, R_TACH_IMPLAUSIBLE
from modbridge.policy.thresholds import Thresholds
from protocol import catalog as C

# tach_implausible counts once it lasted this long: longer than the firmware's stall
# time (fans.stall_ms, 3 s), so a fan stopping is reported as one fan_stall, not as a
# WARN then a CRITICAL (two limit writes). The module floors the fans at once anyway.
TACH_CONFIRM_S = 5.0
# manual_low_duty: a MANUAL duty at or above this ratio is what automatic would command.
MANUAL_FULL_DUTY = 0.98
# return_to_auto: the fields of the signed request the bridge sends.
FAN_MODE_AUTO = {"mode": C.FAN_MODES.index("auto")}
# return_to_auto: retries double from return_to_auto_retry_s up to this.
RETURN_TO_AUTO_MAX_S = 300.0
SENSOR_REASONS = ("sensor_open", "sensor_short", "sensor_stale", "sensor_stuck",
                  "sensor_implausible")  # fmt: skip


def sensor_faults(module: ModuleStatus) -> list[str]:
    """A controlled channel's NTC fault bits (gpu, vram, mos) and a FAILSAFE for a
    sensor reason, then the kind (stuck, implausible); [] when none."""
    faults = module.faults
    bad = [ch for i, ch in enumerate(C.CHANNELS[:3]) if faults & (1 << i)]
    if module.state == "FAILSAFE" and module.reason in SENSOR_REASONS:
        bad.append(module.reason)
    if not bad:
        return []
    kinds = [n for bit, n in ((C.FAULT_NTC_STUCK, "stuck"), (C.FAULT_NTC_IMPLAUSIBLE,
             "implausible")) if faults & bit]  # fmt: skip
    return bad + kinds


def implausible_tachs(module: ModuleStatus) -> list[int]:
    """Fans (1, 2) whose tach fault bit is set; none while a fan is stalled (a stall is
    the stronger verdict)."""
    if module.stalled_fans():
        return []
    faults = module.faults
    return [i for i, bit in ((1, C.FAULT_FAN1_TACH), (2, C.FAULT_FAN2_TACH)) if faults & bit]


class BlindSpots:
    """``sensor_fault``, ``tach_implausible`` and ``manual_low_duty`` for one pair."""

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.sticky = Sticky(config.sensor_clear_s)
        self.latches = Latches()  # manual:hot, manual:err
        self._tach_since: float | None = None  # tach implausible without a break since

    def forget(self) -> None:
        """The module went silent: its reasons go (its telemetry is not trusted)."""
        self.sticky.clear()

    def evaluate(self, module: ModuleStatus, th: Thresholds, values, hit, now, gpu_c, ntc_c):
        bad = sensor_faults(module)
        if bad:
            values["sensor_fault"] = bad
        if self.sticky.holds(R_SENSOR_FAULT, bool(bad), now):
            hit(R_SENSOR_FAULT, "module")
        # implausible tach, confirmed for TACH_CONFIRM_S: a fan spinning down into a
        # stall reads implausible first, and a stall is fan_stall (the stronger verdict)
        tach = implausible_tachs(module)
        if module.stalled_fans():
            self.sticky.drop(R_TACH_IMPLAUSIBLE)
        if tach:
            values["tach_implausible_fans"] = tach
            if self._tach_since is None or now < self._tach_since:
                self._tach_since = now
        else:
            self._tach_since = None
        confirmed = bool(tach) and now - self._tach_since >= TACH_CONFIRM_S
        if self.sticky.holds(R_TACH_IMPLAUSIBLE, confirmed, now):
            hit(R_TACH_IMPLAUSIBLE, "module")
        if self.sticky.holds(R_MANUAL_LOW_DUTY, self._manual_low(module, th, values, gpu_c,
                                                                  ntc_c), now):  # fmt: skip
            hit(R_MANUAL_LOW_DUTY, "module")

    def _manual_low(self, module: ModuleStatus, th: Thresholds, values, gpu_c, ntc_c) -> bool:
        """MANUAL below what automatic control would command, while hot."""
        cfg = self.config
        if module.state != "MANUAL":
            self.latches.clear()
            return False
        hot_c = th.warn_c - cfg.manual_hot_margin_c
        t = gpu_c if gpu_c is not None else ntc_c
        hot = self.latches.above("manual:hot", t, hot_c, cfg.hysteresis_c)
        err = module.target_error_c
        duties = [d for d in (module.fan_duty_ratio(i) for i in (1, 2)) if d is not None]
        duty = min(duties) if duties else None
        # A positive error winds the PID's integrator up: automatic control would
        # command more than any duty below full. No error known: no valid sensor,
        # and automatic control runs the fans at full.
        wants_more = err is None or self.latches.above(
            "manual:err", err, cfg.manual_error_c, cfg.hysteresis_c
        )
        values["manual"] = {"duty_pct": None if duty is None else round(duty * 100.0, 3),
                            "target_error_c": err, "hot_c": hot_c}
        return hot and wants_more and duty is not None and duty < MANUAL_FULL_DUTY


class ReturnToAuto:
    """When to ask a module in MANUAL below automatic for ``fan_mode auto``.

    An episode lasts while the pair's ``manual_low_duty`` holds with the module in
    MANUAL. Its first request goes at once; while the module stays in MANUAL, one
    more after ``retry_s``, then after twice that, up to :data:`RETURN_TO_AUTO_MAX_S`.
    A new episode starts over.

    >>> r = ReturnToAuto(10.0)
    >>> [t for t in range(0, 80, 5) if r.want(float(t), True)]
    [0, 10, 30, 70]
    >>> r.want(80.0, False), r.want(85.0, True), r.episodes
    (False, True, 2)
    """

    def __init__(self, retry_s: float, max_s: float = RETURN_TO_AUTO_MAX_S):
        self.retry_s = retry_s
        self.max_s = max_s
        self.attempts = 0  # in this episode
        self.episodes = 0
        self.next_at: float | None = None  # None: no episode
        self._delay = retry_s

    def want(self, now: float, manual_low: bool) -> bool:
        """Is a request due at ``now``? ``manual_low``: the episode's condition holds."""
        if not manual_low:
            self.next_at, self.attempts, self._delay = None, 0, self.retry_s
            return False
        if self.next_at is None:
            self.episodes += 1
        elif now < self.next_at:
            return False
        self.attempts += 1
        self.next_at = now + self._delay
        self._delay = min(self._delay * 2, self.max_s)
        return True
