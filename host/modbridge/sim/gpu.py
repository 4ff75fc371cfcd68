"""A virtual GPU with the interface the bridge's NVML backend has, backed by the world.

``VirtualGPU`` answers the way an NVIDIA H200 answers NVML (see
``tests/fixtures/nvidia-h200``): temperatures in whole degC, power in W with mW
resolution averaged over ~1 s, a power limit the GPU really enforces, clocks-event
reasons as NVML's bitmask, and ``None`` (NotSupported) for the fan speed. The world
(``world.World``) owns the thermal state and calls ``_advance`` every physics sub-step;
the GPU decides how much power it draws:

    demand  = the load profile's demanded board power (W)
    cap     = enforced power limit, minus slowdown_w_per_k * (die - slowdown_c) above
              slowdown_c (software thermal slowdown), times hw_slowdown_power_fraction
              above hw_slowdown_c (hardware slowdown, 2 degC hysteresis)
    clocks  = idle_w + (demand - idle_w) * (f_lock / f_max) ** CLOCK_POWER_EXPONENT
              while the graphics clock is locked at f_lock < f_max (the demand is what
              the workload draws at the full clock; dynamic power ~ f * V^2 with V
              rising with f; exponent 2 is the conservative end of what H100/H200
              measurements show), reported as the applications-clocks reason (0x2)
    power   = max(idle_w, min(demand, cap, clocks))   (0 W after a thermal shutdown)

Clocks answer like the recorded H200 (``nvidia_smi_q.xml``): 1980 MHz maximum,
supported graphics clocks 345..1980 MHz in 15 MHz steps, 345 MHz at idle. Unlike NVML,
the virtual GPU can say which lock is in force (``locked_clocks_mhz``), so tests can
check what the actuator left behind.

A lost GPU (``World.gpu_lost()`` or the die reaching ``shutdown_c``) raises
``GpuLost`` from every query until the fault is cleared.
"""

from __future__ import annotations

# NVML clocks-event reason bits (nvml_h200.json "clocks_event_reason_constants").
CLOCKS_EVENT_NONE = 0x0
CLOCKS_EVENT_GPU_IDLE = 0x1
CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING = 0x2
CLOCKS_EVENT_SW_POWER_CAP = 0x4
CLOCKS_EVENT_HW_SLOWDOWN = 0x8
CLOCKS_EVENT_SYNC_BOOST = 0x10
CLOCKS_EVENT_SW_THERMAL_SLOWDOWN = 0x20
CLOCKS_EVENT_HW_THERMAL_SLOWDOWN = 0x40
CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN = 0x80
CLOCKS_EVENT_DISPLAY_CLOCK_SETTING = 0x100

_HW_HYSTERESIS_C = 2.0

# Graphics clocks of the recorded H200 (fixtures/nvidia-h200/nvidia_smi_q.xml).
MAX_GRAPHICS_MHZ = 1980
MIN_GRAPHICS_MHZ = 345
GRAPHICS_STEP_MHZ = 15
SUPPORTED_GRAPHICS_MHZ = tuple(range(MIN_GRAPHICS_MHZ, MAX_GRAPHICS_MHZ + 1, GRAPHICS_STEP_MHZ))
CLOCK_POWER_EXPONENT = 2.0


def clock_power_w(idle_w, demand_w, lock_mhz, max_mhz=MAX_GRAPHICS_MHZ):
    """Board power of a workload demanding ``demand_w`` at the full clock when the
    graphics clock is held at ``lock_mhz`` (the module docstring's ``clocks``)."""
    if demand_w <= idle_w or lock_mhz >= max_mhz:
        return demand_w
    return idle_w + (demand_w - idle_w) * (lock_mhz / max_mhz) ** CLOCK_POWER_EXPONENT


class VirtualGpuError(Exception):
    """Base of the virtual GPU's errors (the bridge maps them like NVML's)."""


class GpuLost(VirtualGpuError):
    """NVML's GpuIsLost: the GPU fell off the bus or shut down."""

    def __init__(self, why="the GPU is lost (fell off the bus)"):
        super().__init__(
            f"GPU lost: {why}; NVML returns GPU_IS_LOST until the GPU is reset "
            "(a real one needs a node reboot or a PCIe reset)"
        )


class GpuInvalidArgument(VirtualGpuError, ValueError):
    """NVML's InvalidArgument: e.g. a power limit outside the constraints."""


class VirtualGPU:
    """One GPU of the simulated world. ``gp`` is the world file's ``[gpu]`` section."""

    def __init__(self, gp, profile):
        self._gp = gp
        self.profile = profile
        self.name = gp["name"]
        self.uuid = gp["uuid"]
        self.pci_bus_id = gp["pci_bus_id"]
        self._idle_w = gp["idle_w"]
        self._limit_w = gp["default_limit_w"]
        self._lock_mhz = None  # (min, max) locked graphics clocks; None: unlocked
        self.clock_mhz = MIN_GRAPHICS_MHZ
        self.lock_writes = 0
        self._lost = False
        self._lost_why = ""
        self._shutdown = False
        self._hw_active = False
        self._die_c = 0.0
        self._vram_c = 0.0
        self.demand_w = 0.0
        self.draw_w = self._idle_w  # instantaneous board power (the heat source)
        self._reasons = CLOCKS_EVENT_GPU_IDLE
        self._energy_uj = 0
        self._ring = []  # per-substep board power in mW, for the ~1 s NVML average
        self._ring_i = 0
        self._ring_sum = 0

    # ------------------------------------------------------------------ world side

    def _setup(self, substep_ms):
        n = max(1, round(self._gp["power_average_s"] * 1000 / substep_ms))
        self._substep_ms = substep_ms
        self._ring = [0] * n
        self._fill(self.draw_w)

    def _fill(self, watts):
        mw = round(watts * 1000)
        self._ring = [mw] * len(self._ring)
        self._ring_sum = mw * len(self._ring)

    def _advance(self, t_ms, die_c, vram_c):
        """Board power in W for the sub-step starting at ``t_ms``; updates the readings."""
        gp = self._gp
        self._die_c = die_c
        self._vram_c = vram_c
        if die_c >= gp["shutdown_c"] and not self._shutdown:
            self._shutdown = True
            self._lost = True
            self._lost_why = f"thermal shutdown at {die_c:.1f} degC (>= {gp['shutdown_c']:g})"
        demand = self.profile.demand_w(t_ms)
        self.demand_w = demand
        reasons = 0
        if self._shutdown:
            power = 0.0
        elif self._lost:
            power = self._idle_w  # the workload died with the driver; the board idles
        else:
            cap = self._limit_w
            if demand > cap:
                reasons |= CLOCKS_EVENT_SW_POWER_CAP
            if die_c > gp["slowdown_c"]:
                cap -= gp["slowdown_w_per_k"] * (die_c - gp["slowdown_c"])
                if demand > cap:
                    reasons |= CLOCKS_EVENT_SW_THERMAL_SLOWDOWN
            if die_c >= gp["hw_slowdown_c"]:
                self._hw_active = True
            elif die_c < gp["hw_slowdown_c"] - _HW_HYSTERESIS_C:
                self._hw_active = False
            if self._hw_active:
                cap *= gp["hw_slowdown_power_fraction"]
                reasons |= CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_HW_THERMAL_SLOWDOWN
            power = demand if demand < cap else cap
            if self._lock_mhz is not None:
                clocked = clock_power_w(self._idle_w, demand, self._lock_mhz[1])
                if clocked < power:
                    power = clocked
                    reasons |= CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING
            if power <= self._idle_w:
                power = self._idle_w
                if demand <= self._idle_w:
                    reasons |= CLOCKS_EVENT_GPU_IDLE
        self._reasons = reasons
        self.draw_w = power
        self.clock_mhz = self._clock_for(demand, power)
        mw = round(power * 1000)
        i = self._ring_i
        self._ring_sum += mw - self._ring[i]
        self._ring[i] = mw
        self._ring_i = i + 1 if i + 1 < len(self._ring) else 0
        self._energy_uj += mw * self._substep_ms
        return power

    def _clock_for(self, demand, power):
        """The graphics clock that draws ``power`` of a ``demand`` (idle: the minimum)."""
        if self._shutdown or self._lost or demand <= self._idle_w:
            return MIN_GRAPHICS_MHZ
        share = max(0.0, min(1.0, (power - self._idle_w) / (demand - self._idle_w)))
        mhz = MAX_GRAPHICS_MHZ * share ** (1.0 / CLOCK_POWER_EXPONENT)
        if self._lock_mhz is not None:
            mhz = min(mhz, self._lock_mhz[1])
        steps = int((mhz - MIN_GRAPHICS_MHZ) // GRAPHICS_STEP_MHZ)
        return MIN_GRAPHICS_MHZ + max(0, steps) * GRAPHICS_STEP_MHZ

    def _draw_w(self, demand, die_c):
        """Power drawn for ``demand`` at ``die_c`` without the hardware slowdown's
        hysteresis (for steady states)."""
        gp = self._gp
        cap = self._limit_w
        if die_c > gp["slowdown_c"]:
            cap -= gp["slowdown_w_per_k"] * (die_c - gp["slowdown_c"])
        if die_c >= gp["hw_slowdown_c"]:
            cap *= gp["hw_slowdown_power_fraction"]
        if self._lock_mhz is not None:
            cap = min(cap, clock_power_w(self._idle_w, demand, self._lock_mhz[1]))
        return max(self._idle_w, min(demand, cap))

    def _set_lost(self, on, why="the GPU fell off the bus (injected fault)"):
        self._lost = bool(on)
        self._lost_why = why if on else ""
        if not on:
            self._shutdown = False

    def _check(self):
        if self._lost:
            raise GpuLost(self._lost_why)

    # ------------------------------------------------------------------ NVML-like API

    def temperature_c(self):
        """GPU (die) temperature in whole degC, like nvmlDeviceGetTemperature."""
        self._check()
        return int(round(self._die_c))

    def memory_temperature_c(self):
        """Memory (HBM/GDDR) temperature in whole degC; None where NotSupported."""
        self._check()
        if not self._gp["memory_temperature_supported"]:
            return None
        return int(round(self._vram_c))

    def power_w(self):
        """Board power in W (mW resolution), averaged over ``power_average_s``."""
        self._check()
        return round(self._ring_sum / len(self._ring)) / 1000.0

    def total_energy_j(self):
        """Energy since the world started, in J (nvmlDeviceGetTotalEnergyConsumption)."""
        self._check()
        return self._energy_uj / 1e6

    def power_limit_w(self):
        """The enforced power limit in W."""
        self._check()
        return self._limit_w

    def default_power_limit_w(self):
        self._check()
        return self._gp["default_limit_w"]

    def power_limit_constraints_w(self):
        """``(min_w, max_w)`` a limit may take, like GetPowerManagementLimitConstraints."""
        self._check()
        return (self._gp["min_limit_w"], self._gp["max_limit_w"])

    def set_power_limit_w(self, watts):
        """Set the power limit (rounded to mW). Outside the constraints: GpuInvalidArgument.

        Like nvmlDeviceSetPowerManagementLimit, nothing is clamped here; the bridge
        clamps to ``power_limit_constraints_w()`` before it writes.
        """
        self._check()
        if isinstance(watts, bool) or not isinstance(watts, (int, float)):
            raise GpuInvalidArgument(f"power limit must be a number of W, got {watts!r}")
        lo, hi = self._gp["min_limit_w"], self._gp["max_limit_w"]
        mw = round(watts * 1000)
        if not round(lo * 1000) <= mw <= round(hi * 1000):
            raise GpuInvalidArgument(
                f"power limit {watts:g} W is outside the constraints {lo:g}..{hi:g} W "
                "(NVML: Invalid Argument)"
            )
        self._limit_w = mw / 1000.0

    def max_graphics_clock_mhz(self):
        """nvmlDeviceGetMaxClockInfo(NVML_CLOCK_GRAPHICS)."""
        self._check()
        return MAX_GRAPHICS_MHZ

    def supported_graphics_clocks_mhz(self):
        """nvmlDeviceGetSupportedGraphicsClocks at the top memory clock, ascending."""
        self._check()
        return SUPPORTED_GRAPHICS_MHZ

    def graphics_clock_mhz(self):
        """nvmlDeviceGetClockInfo(NVML_CLOCK_GRAPHICS): the clock now."""
        self._check()
        return self.clock_mhz

    def locked_clocks_mhz(self):
        """The ``(min, max)`` lock in force, None when unlocked (NVML cannot say this)."""
        self._check()
        return self._lock_mhz

    def set_locked_clocks_mhz(self, min_mhz, max_mhz):
        """nvmlDeviceSetGpuLockedClocks: InvalidArgument unless min <= max and both are
        supported clocks (a real driver also takes values between them; the bridge
        always snaps to the supported list, and this makes it prove it)."""
        self._check()
        for v in (min_mhz, max_mhz):
            if isinstance(v, bool) or not isinstance(v, int):
                raise GpuInvalidArgument(f"clocks must be whole MHz, got {v!r}")
            if v not in SUPPORTED_GRAPHICS_MHZ:
                raise GpuInvalidArgument(
                    f"{v} MHz is not a supported graphics clock "
                    f"({MIN_GRAPHICS_MHZ}..{MAX_GRAPHICS_MHZ} in {GRAPHICS_STEP_MHZ} MHz steps)"
                )
        if min_mhz > max_mhz:
            raise GpuInvalidArgument(f"locked clocks {min_mhz}..{max_mhz} MHz: min above max")
        self._lock_mhz = (min_mhz, max_mhz)
        self.lock_writes += 1

    def reset_locked_clocks(self):
        """nvmlDeviceResetGpuLockedClocks: unlocked (the default)."""
        self._check()
        self._lock_mhz = None
        self.lock_writes += 1

    def temperature_thresholds_c(self):
        """NVML's temperature thresholds in degC, like nvmlDeviceGetTemperatureThreshold:
        ``slowdown`` (SLOWDOWN: the hardware slowdown), ``shutdown`` (SHUTDOWN) and
        ``max_operating`` (GPU_MAX: where the software thermal slowdown starts)."""
        self._check()
        gp = self._gp
        return {
            "slowdown": gp["hw_slowdown_c"],
            "shutdown": gp["shutdown_c"],
            "max_operating": gp["slowdown_c"],
        }

    def clocks_event_reasons(self):
        """NVML clocks-event reasons bitmask (CLOCKS_EVENT_* constants)."""
        self._check()
        return self._reasons

    def utilization(self):
        """GPU utilization 0..1: 1.0 while a workload runs (demand above idle), else 0."""
        self._check()
        return 1.0 if self.demand_w > self._idle_w else 0.0

    def fan_speed_pct(self):
        """None: NotSupported, like the fanless H200."""
        self._check()
        return None

    @property
    def lost(self):
        return self._lost

    def state(self):
        """Plain dict of the GPU's state for snapshots (never raises)."""
        return {
            "gpu_demand_w": self.demand_w,
            "gpu_draw_w": self.draw_w,
            "gpu_power_reading_w": round(self._ring_sum / len(self._ring)) / 1000.0,
            "gpu_limit_w": self._limit_w,
            "gpu_locked_max_mhz": None if self._lock_mhz is None else self._lock_mhz[1],
            "gpu_clock_mhz": self.clock_mhz,
            "gpu_reasons": self._reasons,
            "gpu_lost": self._lost,
            "gpu_shutdown": self._shutdown,
            "gpu_energy_j": self._energy_uj / 1e6,
        }
