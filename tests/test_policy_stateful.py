"""The policy's safety rules under random sequences (hypothesis RuleBasedStateMachine).

A model module and GPU evolve by random rules -- fault bits on and off (stalls, NTC
open/stuck, tach, over/critical temperature, under-voltage), MANUAL at random duties,
frames stopping (silence), sequence number or uptime freezing (stale telemetry), the
module's NTC drifting off the GPU's temperature, GPU temperatures, the GPU lost, an
operator changing the original limit -- while time advances by random steps and one
:class:`PairPolicy` is evaluated after every step. The module's state and reason are
derived from its fault bits the way the firmware's supervisor does
(device/failsafe.py: critical > stall > tach > sensor > over temperature > MANUAL).

Invariants after every evaluation:

* never NORMAL while the module is FAILSAFE, and CRITICAL while it reports a critical
  temperature, every fan stalled, or is silent (no frame for ``module_silent_s``, or
  its uptime/sequence number frozen for ``stale_telemetry_s``; one step of slack, as
  the policy notices a change only when it evaluates). The one documented delay: a
  FAILSAFE for an implausible tach alone waits ``TACH_CONFIRM_S`` (the module runs
  both fans flat out meanwhile);
* a target limit is never at or above the original the actuator gave, never below the
  GPU's minimum; a level above NORMAL always cuts; a lost GPU is never written to;
* once everything is clear (no fault, fresh and advancing telemetry, temperatures
  below warn - hysteresis, automatic control, the GPU readable, and no
  ``sensor_disagree`` since) for ``sensor_clear_s`` + two holds, the policy is NORMAL
  and restores the original (target None).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from modbridge.gpu.base import GpuLost, GpuSample
from modbridge.model import ModuleStatus
from modbridge.policy.blindspots import TACH_CONFIRM_S
from modbridge.policy.engine import CRITICAL, NORMAL, WARN, PairPolicy, PolicyConfig
from protocol import catalog as C

CFG = PolicyConfig(min_hold_s=10.0, sensor_clear_s=5.0, module_silent_s=3.0,
                   module_grace_s=5.0, stale_telemetry_s=4.0)  # fmt: skip
MIN_W, DEFAULT_W = 200.0, 700.0
WARN_C, CRIT_C = 84.0, 86.0  # NVML 87/89/95 - nvml_margin_c
SETPOINT_C = 65.0
STEPS = (0.2, 0.5, 1.0, 2.0, 5.0)
MAX_STEP = max(STEPS)
BITS = {
    "fan1_stall": C.FAULT_FAN1_STALL,
    "fan2_stall": C.FAULT_FAN2_STALL,
    "fan1_tach": C.FAULT_FAN1_TACH,
    "ntc_gpu": C.FAULT_NTC_GPU,
    "ntc_vram": C.FAULT_NTC_VRAM,
    "ntc_stuck": C.FAULT_NTC_STUCK,
    "over_temp": C.FAULT_OVER_TEMP,
    "critical_temp": C.FAULT_CRITICAL_TEMP,
    "under_voltage": C.FAULT_UNDER_VOLTAGE,
}
STALLS = C.FAULT_FAN1_STALL | C.FAULT_FAN2_STALL
TACHS = C.FAULT_FAN1_TACH | C.FAULT_FAN2_TACH
NTCS = C.FAULT_NTC_GPU | C.FAULT_NTC_VRAM | C.FAULT_NTC_MOS


def firmware_state(faults: int, manual: bool) -> tuple[int, int]:
    """(state, reason) as device/failsafe.py derives them from the fault bits."""
    if faults & C.FAULT_CRITICAL_TEMP:
        return C.STATE_FAILSAFE, C.REASON_CRITICAL_TEMP
    if faults & STALLS:
        return C.STATE_FAILSAFE, C.REASON_FAN_STALL
    if faults & TACHS:
        return C.STATE_FAILSAFE, C.REASON_TACH_IMPLAUSIBLE
    if faults & NTCS:
        stuck = faults & C.FAULT_NTC_STUCK
        return C.STATE_FAILSAFE, C.REASON_SENSOR_STUCK if stuck else C.REASON_SENSOR_OPEN
    if faults & C.FAULT_OVER_TEMP:
        return C.STATE_FAILSAFE, C.REASON_OVER_TEMP
    if manual:
        return C.STATE_MANUAL, C.REASON_MANUAL_OVERRIDE
    return C.STATE_HOSTED, C.REASON_HOST_OK


class PolicyMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.policy = PairPolicy(CFG, "m1", "GPU-0")
        self.now = 0.0
        self.faults = 0
        self.manual, self.manual_duty = False, 0.3
        self.gpu_c, self.offset_c, self.drift_c = 60.0, -5.0, 0.0
        self.silent_since: float | None = None  # frames stopped at
        self.last_frame = 0.0
        self.uptime, self.seq = 0.0, 0
        self.uptime_frozen: float | None = None  # frozen since
        self.seq_frozen: float | None = None
        self.gpu_lost = False
        self.original = DEFAULT_W
        self.tach_since: float | None = None
        self.clear_since: float | None = 0.0

    # -- the world -------------------------------------------------------------------
    @rule(name=st.sampled_from(sorted(BITS)), on=st.booleans())
    def fault(self, name, on):
        bit = BITS[name]
        self.faults = self.faults | bit if on else self.faults & ~bit

    @rule(on=st.booleans(), duty=st.sampled_from([0.3, 0.5, 0.8, 1.0]))
    def manual_mode(self, on, duty):
        self.manual, self.manual_duty = on, duty

    @rule(t=st.floats(30.0, 100.0))
    def gpu_temperature(self, t):
        self.gpu_c = round(t, 1)

    @rule(d=st.floats(-15.0, 15.0))
    def ntc_drift(self, d):
        self.drift_c = round(d, 1)

    @rule(on=st.booleans())
    def frames(self, on):
        if not on and self.silent_since is None:
            self.silent_since = self.now
        elif on:
            self.silent_since = None

    @rule(which=st.sampled_from(["uptime", "seq"]), on=st.booleans())
    def freeze(self, which, on):
        attr = f"{which}_frozen"
        if on and getattr(self, attr) is None:
            setattr(self, attr, self.now)
        elif not on:
            setattr(self, attr, None)

    @rule(on=st.booleans())
    def gpu_lost_rule(self, on):
        self.gpu_lost = on

    @rule(w=st.sampled_from([700.0, 650.0, 400.0]))
    def operator_limit(self, w):
        self.original = w  # the actuator adopted an external change as the original

    @rule()
    def heal(self):
        """Everything back to healthy (so that restores get tested, not just faults)."""
        self.faults, self.manual, self.gpu_lost = 0, False, False
        self.silent_since = self.uptime_frozen = self.seq_frozen = None
        self.gpu_c, self.drift_c = 60.0, 0.0

    @rule(n=st.integers(1, 12))
    def wait(self, n):
        for _ in range(n):
            self.tick(MAX_STEP)

    # -- time and the policy ---------------------------------------------------------
    def telemetry(self) -> ModuleStatus:
        state, reason = firmware_state(self.faults, self.manual)
        ntc = self.gpu_c + self.offset_c + self.drift_c
        duty = 1.0 if state == C.STATE_FAILSAFE else (self.manual_duty if self.manual else 0.5)
        stalled = [bool(self.faults & C.FAULT_FAN1_STALL), bool(self.faults & C.FAULT_FAN2_STALL)]
        tel = {
            "state": state, "reason": reason, "faults": self.faults,
            "temp_gpu": round(ntc * 1000), "temp_vram": 55000, "temp_mos": 60000,
            "temp_amb": 30000, "target": round((ntc - SETPOINT_C) * 1000),
            "fan1_rpm": 0 if stalled[0] else 2000, "fan2_rpm": 0 if stalled[1] else 2000,
            "fan1_duty": round(duty * C.DUTY_MAX), "fan2_duty": round(duty * C.DUTY_MAX),
            "v_in": 11000 if self.faults & C.FAULT_UNDER_VOLTAGE else 12000,
            "p_in": 600000, "uptime_s": int(self.uptime),
        }  # fmt: skip
        return ModuleStatus(port="/dev/null", module_id="m1", link_up=True,
                            last_frame_at=self.last_frame, fans=2, telemetry=tel,
                            telemetry_seq=self.seq)  # fmt: skip

    def sample(self):
        if self.gpu_lost:
            return GpuLost("GPU-0: fell off the bus")
        return GpuSample(uuid="GPU-0", temperature_c=self.gpu_c, power_w=600.0,
                         enforced_limit_w=self.original, default_limit_w=DEFAULT_W,
                         min_limit_w=MIN_W, max_limit_w=DEFAULT_W, slowdown_temp_c=89.0,
                         shutdown_temp_c=95.0, max_operating_temp_c=87.0)  # fmt: skip

    @rule(dt=st.sampled_from(STEPS))
    def tick(self, dt):
        self.now += dt
        if self.uptime_frozen is None:
            self.uptime += dt
        if self.seq_frozen is None:
            self.seq = (self.seq + 1) & 0xFFFF
        if self.silent_since is None:
            self.last_frame = self.now
        if self.faults & TACHS and not self.faults & STALLS:
            self.tach_since = self.now if self.tach_since is None else self.tach_since
        else:
            self.tach_since = None
        d = self.policy.evaluate(self.now, self.telemetry(), self.sample(),
                                 original_limit_w=self.original)  # fmt: skip
        self.check(d)

    # -- the invariants --------------------------------------------------------------
    def silent(self) -> bool:
        """Silent beyond doubt (one step of slack for when the policy notices)."""
        if self.silent_since is not None and self.now - self.silent_since > CFG.module_silent_s:
            return True
        frozen = [t for t in (self.uptime_frozen, self.seq_frozen) if t is not None]
        # uptime_s counts whole seconds: its last change may be up to 1 s before freezing
        return any(self.now - t > CFG.stale_telemetry_s + MAX_STEP + 1.0 for t in frozen)

    def check(self, d):
        state, reason = firmware_state(self.faults, self.manual)
        critical = bool(self.faults & C.FAULT_CRITICAL_TEMP) or (self.faults & STALLS) == STALLS
        if self.silent():
            assert d.level == CRITICAL and "module_silent" in d.reasons, d
        elif critical:
            assert d.level == CRITICAL, (d.level, d.reasons, self.faults)
        elif state == C.STATE_FAILSAFE:
            waiting = reason == C.REASON_TACH_IMPLAUSIBLE and (
                self.now - self.tach_since < TACH_CONFIRM_S + 1e-9
            )
            assert d.level >= WARN or waiting, (d.level, d.reasons, reason)
        # limits: never raised, never below the minimum, a level always cuts
        if self.gpu_lost:
            assert not d.can_actuate and d.target_limit_w is None
        else:
            assert d.can_actuate
            if d.target_limit_w is not None:
                assert MIN_W <= d.target_limit_w < self.original, (d.target_limit_w, self.original)
            assert (d.level == NORMAL) == (d.target_limit_w is None), (d.level, d.target_limit_w)
        # restore once all clear and the hysteresis and holds have passed
        clear = (
            self.faults == 0 and not self.manual and not self.gpu_lost
            and self.silent_since is None and self.uptime_frozen is None
            and self.seq_frozen is None and "sensor_disagree" not in d.reasons
            and max(self.gpu_c, self.gpu_c + self.offset_c + self.drift_c)
            <= WARN_C - CFG.hysteresis_c - 0.5
        )  # fmt: skip
        if not clear:
            self.clear_since = None
        elif self.clear_since is None:
            self.clear_since = self.now
        elif self.now - self.clear_since >= CFG.sensor_clear_s + 2 * CFG.min_hold_s + MAX_STEP:
            assert d.level == NORMAL and d.target_limit_w is None, (d.level, d.reasons)


PolicyMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_policy_machine = PolicyMachine.TestCase
