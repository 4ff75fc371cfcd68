"""The simulated physical world: thermal network, fans, 12 V rail, NTCs, virtual GPU.

The world is the source of time. Everything advances in fixed integer sub-steps
(``world.substep_ms``, 10 ms by default) inside ``step(dt_ms)``, so the state at a
given ``now_ms`` does not depend on how the steps were chunked, and two worlds with
the same parameters, seed and inputs are identical. The only randomness is sensor
noise (ADC, INA226), drawn from ``random.Random`` instances seeded from ``seed``.

    w = World(params.load("default"), seed=1, profile="step650")
    w.set_duties(32768, 32768)      # duty_u16 from the sim board's PWM
    w.step(100)                     # 100 ms
    codes = w.adc_codes(8)          # 4 lists of 8 read_u16() codes
    bus_mv, current_ma = w.ina226_inputs()
    pulses = w.tach_pulses()        # [fan1, fan2] since the last call
    w.gpu.set_power_limit_w(450)    # the bridge's side
    w.snapshot()                    # every node, fan, rail and GPU value

The model and its equations are in docs/simulator.md.
"""

from __future__ import annotations

import math
import random

from device import calib
from modbridge.sim import params as _params
from modbridge.sim.gpu import VirtualGPU
from modbridge.sim.profiles import Profile

CHANNELS = _params.CHANNELS  # ("gpu", "vram", "mos", "amb"), the firmware's order
FANS = 2
DUTY_FULL = 65535
ADC_FULL = 4095  # 12-bit ADC
T0_K = 25.0 + calib.KELVIN  # NTC r0 is the resistance at 25 degC

# Node order in the state vector.
DIE, VRAM, HS, MOS, AIR = range(5)
NODE_NAMES = ("die", "vram", "heatsink", "mos", "air")


class WorldError(ValueError):
    """A wrong argument to a world method (channel, fan, duty, time)."""


class World:
    """Deterministic physics for one GPU module. See the module docstring."""

    def __init__(self, params=None, seed=0, profile=None, ambient_c=None):
        if params is None:
            params = _params.default()
        elif not isinstance(params, _params.Params):
            params = _params.load(params)
        self.params = params
        self.seed = seed
        p = params
        self.substep_ms = p["world"]["substep_ms"]
        self.ambient_c = p["world"]["ambient_c"] if ambient_c is None else float(ambient_c)
        self.now_ms = 0
        self.substeps = 0  # physics sub-steps run so far: the deterministic cost
        self._phys_ms = 0  # time up to which the physics has run (<= now_ms)
        self._adc_rng = random.Random(f"{seed}:adc")
        self._ina_rng = random.Random(f"{seed}:ina226")

        self.profile = Profile.get(profile)
        self._dip_i = 0
        self.gpu = VirtualGPU(p["gpu"], self.profile)
        self.gpu._setup(self.substep_ms)

        f = p["fans"]
        self._max_rpm = f["max_rpm"]
        self._stop_frac = f["stop_duty_pct"] / 100.0
        self._start_frac = f["start_duty_pct"] / 100.0
        self._ppr = f["pulses_per_rev"]
        self.duties = [0, 0]
        self.rpm = [0.0, 0.0]
        self._stalled = [False, False]
        self._pulses_total = [0.0, 0.0]  # tach pulses since start (fractional)
        self._pulses_taken = [0, 0]  # pulses handed out by tach_pulses()

        # Faults.
        self._ntc_open = [False] * 4
        self._ntc_short = [False] * 4
        self._ina_absent = False
        self._dips = []  # (start_ms, end_ms, depth_mv)
        self.airflow_share = 1.0  # dust: the share of the clean chassis's airflow left

        # NTC channels.
        self._ntc = [p["ntc." + ch] for ch in CHANNELS]
        self._ntc_sense = [
            [
                (_NODE_INDEX[n], w)
                for n, w in zip(c["sense_nodes"], c["sense_weights"], strict=False)
            ]
            for c in self._ntc
        ]

        self._precompute()
        self.T = [self.ambient_c] * 5
        self.ntc_c = [self.ambient_c] * 4
        self.equilibrate()

    # ------------------------------------------------------------------ setup

    def _precompute(self):
        p = self.params
        dt = self.substep_ms / 1000.0
        self._dt_s = dt
        self._c_dt = [
            p["die"]["heat_capacity_j_per_k"] / dt,
            p["vram"]["heat_capacity_j_per_k"] / dt,
            p["heatsink"]["heat_capacity_j_per_k"] / dt,
            p["mos"]["heat_capacity_j_per_k"] / dt,
            p["air"]["heat_capacity_j_per_k"] / dt,
        ]
        f = p["fans"]
        self._a_up = _alpha(dt, f["spinup_tau_s"])
        self._a_down = _alpha(dt, f["spindown_tau_s"])
        self._pulse_k = self._ppr / 60.0 * dt  # pulses per substep per RPM
        self._a_ntc = [_alpha(dt, c["tau_s"]) for c in self._ntc]

    def equilibrate(self):
        """Jump to the steady state of the current inputs.

        Fans snap to the RPM their duties give, the GPU draws what the profile demands
        now, every node and NTC takes its steady temperature and the GPU's power
        average is filled with the result. Time does not move. With thermal slowdown
        the drawn power depends on the die temperature; ``P = draw(T_die(P))`` is found
        by bisection (the draw falls and T_die rises with P, so it is well posed; a
        steady state never shuts the GPU down). The constructor calls this (fans at
        rest, the profile's t = 0 demand).
        """
        for i in range(FANS):
            self.rpm[i] = self._fan_target(i)
        g = self.gpu
        gp = self.params["gpu"]
        saved = (g._energy_uj, g._lost, g._lost_why, g._shutdown)
        no_shutdown = gp["shutdown_c"] - 0.01
        demand = self.profile.demand_w(self._phys_ms)
        if g._shutdown:
            power = 0.0
        elif g._lost:
            power = gp["idle_w"]
        else:
            lo, hi = 0.0, max(demand, gp["idle_w"])
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                die = min(self._steady(mid)[DIE], no_shutdown)
                if g._draw_w(demand, die) > mid:
                    lo = mid
                else:
                    hi = mid
            power = hi
        self.T = self._steady(power)
        g._advance(self._phys_ms, min(self.T[DIE], no_shutdown), self.T[VRAM])
        g.draw_w = power
        # A steady state is not a history: no energy counted, no shutdown latched.
        g._energy_uj, g._lost, g._lost_why, g._shutdown = saved
        g._fill(power)
        self.ntc_c = [self._ntc_target(ch) for ch in range(4)]

    def _conductances(self):
        """Flow-dependent conductances ``(g_ha, g_ma, g_aa)`` in W/K for the fan RPMs."""
        p = self.params
        frac = (self.rpm[0] + self.rpm[1]) / (FANS * self._max_rpm) * self.airflow_share
        fx = frac ** p["heatsink"]["flow_exponent"] if frac > 0.0 else 0.0
        hs, mos, air = p["heatsink"], p["mos"], p["air"]
        g_ha = hs["to_air_natural_w_per_k"] + hs["to_air_forced_w_per_k"] * fx
        g_ma = mos["to_air_natural_w_per_k"] + mos["to_air_forced_w_per_k"] * fx
        flow = FANS * p["fans"]["flow_m3_per_s"] * frac
        g_aa = air["leak_w_per_k"] + air["volumetric_heat_capacity_j_per_m3_k"] * flow
        return g_ha, g_ma, g_aa

    def _heat_split(self, power):
        """Board power (W) -> heat into ``(die, vram, mos)``."""
        gp = self.params["gpu"]
        return _split(
            power,
            1.0 - gp["vrm_efficiency"],
            gp["memory_idle_w"],
            gp["memory_power_fraction"],
            gp["idle_w"],
        )

    def _steady(self, power):
        """Steady-state node temperatures for board power ``power`` and current fans."""
        p = self.params
        g_dh = p["die"]["to_heatsink_w_per_k"]
        g_dv = p["die"]["to_vram_w_per_k"]
        g_vh = p["vram"]["to_heatsink_w_per_k"]
        g_va = p["vram"]["to_air_w_per_k"]
        g_mh = p["mos"]["to_heatsink_w_per_k"]
        g_ha, g_ma, g_aa = self._conductances()
        p_die, p_mem, p_vrm = self._heat_split(power)
        links = (
            (DIE, HS, g_dh),
            (DIE, VRAM, g_dv),
            (VRAM, HS, g_vh),
            (VRAM, AIR, g_va),
            (MOS, HS, g_mh),
            (HS, AIR, g_ha),
            (MOS, AIR, g_ma),
        )
        a = [[0.0] * 5 for _ in range(5)]
        b = [p_die, p_mem, 0.0, p_vrm, 0.0]
        for i, j, g in links:
            a[i][i] += g
            a[j][j] += g
            a[i][j] -= g
            a[j][i] -= g
        a[AIR][AIR] += g_aa
        b[AIR] += g_aa * self.ambient_c
        return _solve(a, b)

    # ------------------------------------------------------------------ time

    def step(self, dt_ms):
        """Advance ``now_ms`` by ``dt_ms`` (an int >= 0), running whole physics sub-steps.

        A remainder shorter than a sub-step waits for the next call, so the physics
        depends only on ``now_ms``, not on how time was chunked. Inputs set between
        calls (duties, faults, limits) take effect at the next sub-step.
        """
        if not isinstance(dt_ms, int) or isinstance(dt_ms, bool) or dt_ms < 0:
            raise WorldError(f"step(dt_ms) takes an int >= 0, got {dt_ms!r}")
        self.now_ms += dt_ms
        sub = self.substep_ms
        n = (self.now_ms - self._phys_ms) // sub
        if n:
            self._run(n)

    def _run(self, n):
        """``n`` sub-steps; the hot loop (locals only, no allocation beyond floats)."""
        p = self.params
        sub = self.substep_ms
        gpu_advance = self.gpu._advance
        dips = self.profile.dips
        cd_die, cd_vram, cd_hs, cd_mos, cd_air = self._c_dt
        g_dh = p["die"]["to_heatsink_w_per_k"]
        g_dv = p["die"]["to_vram_w_per_k"]
        g_vh = p["vram"]["to_heatsink_w_per_k"]
        g_va = p["vram"]["to_air_w_per_k"]
        g_mh = p["mos"]["to_heatsink_w_per_k"]
        gp = p["gpu"]
        vrm_loss = 1.0 - gp["vrm_efficiency"]
        mem_frac = gp["memory_power_fraction"]
        mem_idle = gp["memory_idle_w"]
        idle_w = gp["idle_w"]
        amb = self.ambient_c
        t_die, t_vram, t_hs, t_mos, t_air = self.T
        rpm0, rpm1 = self.rpm
        tgt0, tgt1 = self._fan_target(0), self._fan_target(1)
        a_up, a_down, pulse_k = self._a_up, self._a_down, self._pulse_k
        pulses0, pulses1 = self._pulses_total
        ntc = self.ntc_c
        a_ntc = self._a_ntc
        sense = self._ntc_sense
        offsets = [c["offset_c"] for c in self._ntc]
        last_frac = -1.0
        g_ha = g_ma = g_aa = 0.0
        t = self._phys_ms
        for _ in range(n):
            if dips and self._dip_i < len(dips) and dips[self._dip_i][0] <= t:
                d_t, depth, dur = dips[self._dip_i]
                self._dips.append((d_t, d_t + dur, depth))
                self._dip_i += 1
            # Fans: first-order lag towards the duty's RPM; tach pulses accumulate.
            if rpm0 != tgt0:
                rpm0 += (tgt0 - rpm0) * (a_up if tgt0 > rpm0 else a_down)
                if -1e-3 < rpm0 - tgt0 < 1e-3:
                    rpm0 = tgt0
                elif tgt0 == 0.0 and rpm0 < 1.0:
                    rpm0 = 0.0
                    tgt0 = self._fan_target(0, 0.0)
            if rpm1 != tgt1:
                rpm1 += (tgt1 - rpm1) * (a_up if tgt1 > rpm1 else a_down)
                if -1e-3 < rpm1 - tgt1 < 1e-3:
                    rpm1 = tgt1
                elif tgt1 == 0.0 and rpm1 < 1.0:
                    rpm1 = 0.0
                    tgt1 = self._fan_target(1, 0.0)
            pulses0 += rpm0 * pulse_k
            pulses1 += rpm1 * pulse_k
            frac = rpm0 + rpm1
            if frac != last_frac:
                last_frac = frac
                self.rpm[0], self.rpm[1] = rpm0, rpm1
                g_ha, g_ma, g_aa = self._conductances()
            # GPU power -> heat.
            power = gpu_advance(t, t_die, t_vram)
            p_vrm = vrm_loss * power
            p_mem = mem_idle if power < idle_w else mem_idle + mem_frac * (power - idle_w)
            if p_mem > power - p_vrm:
                p_mem = power - p_vrm
            p_die = power - p_vrm - p_mem
            # Semi-implicit (one Gauss-Seidel sweep of backward Euler): every new
            # temperature is a positive-weighted mean, so any sub-step is stable.
            t_die = (cd_die * t_die + g_dh * t_hs + g_dv * t_vram + p_die) / (cd_die + g_dh + g_dv)
            t_vram = (cd_vram * t_vram + g_vh * t_hs + g_dv * t_die + g_va * t_air + p_mem) / (
                cd_vram + g_vh + g_dv + g_va
            )
            t_hs = (cd_hs * t_hs + g_dh * t_die + g_vh * t_vram + g_mh * t_mos + g_ha * t_air) / (
                cd_hs + g_dh + g_vh + g_mh + g_ha
            )
            t_mos = (cd_mos * t_mos + g_mh * t_hs + g_ma * t_air + p_vrm) / (cd_mos + g_mh + g_ma)
            t_air = (cd_air * t_air + g_ha * t_hs + g_ma * t_mos + g_va * t_vram + g_aa * amb) / (
                cd_air + g_ha + g_ma + g_va + g_aa
            )
            t += sub
            # NTC sensor lag (first order towards a weighted mix of nodes).
            temps = (t_die, t_vram, t_hs, t_mos, t_air, amb)
            for ch in range(4):
                target = offsets[ch]
                for node, w in sense[ch]:
                    target += w * temps[node]
                ntc[ch] += (target - ntc[ch]) * a_ntc[ch]
        self.T = [t_die, t_vram, t_hs, t_mos, t_air]
        self.rpm[0], self.rpm[1] = rpm0, rpm1
        self._pulses_total[0], self._pulses_total[1] = pulses0, pulses1
        self._phys_ms = t
        self.substeps += n

    # ------------------------------------------------------------------ inputs

    def set_duties(self, d1, d2):
        """PWM duties of fan 1 and 2 as ``duty_u16`` ints 0..65535."""
        for d in (d1, d2):
            if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= DUTY_FULL:
                raise WorldError(f"fan duty must be an int 0..65535, got {d!r}")
        self.duties[0], self.duties[1] = d1, d2

    def _fan_target(self, i, rpm=None):
        """RPM fan ``i`` heads for: 0 if stalled, below stop duty, or stopped and
        below start duty; otherwise proportional to duty."""
        if self._stalled[i]:
            return 0.0
        frac = self.duties[i] / DUTY_FULL
        if frac < self._stop_frac:
            return 0.0
        if (self.rpm[i] if rpm is None else rpm) <= 0.0 and frac < self._start_frac:
            return 0.0
        return self._max_rpm * frac

    # ------------------------------------------------------------------ outputs

    def tach_pulses(self):
        """Tach pulses per fan since the last call, ``[fan1, fan2]`` ints.

        ``pulses_per_rev`` per revolution; fractions carry over, so the sum of all
        answers is exactly ``floor`` of the accumulated pulse count.
        """
        out = []
        for i in range(FANS):
            whole = int(math.floor(self._pulses_total[i]))
            out.append(whole - self._pulses_taken[i])
            self._pulses_taken[i] = whole
        return out

    def rail_v(self):
        """Bus voltage at the module in V: nominal minus active dips minus droop."""
        r = self.params["rail"]
        v_src = r["nominal_v"] - self._dip_mv() / 1000.0
        load_w = self.gpu.draw_w + self._fans_w()
        # V = Vs - R * P / V  ->  V^2 - Vs V + R P = 0, the upper root.
        disc = v_src * v_src - 4.0 * r["source_resistance_ohm"] * load_w
        return 0.5 * (v_src + math.sqrt(disc)) if disc > 0.0 else 0.5 * v_src

    def _fans_w(self):
        pw = self.params["fans"]["power_w"]
        return sum(pw * (rpm / self._max_rpm) ** 3 for rpm in self.rpm)

    def _dip_mv(self):
        now = self.now_ms
        self._dips = [d for d in self._dips if d[1] > now]
        return sum(depth for start, end, depth in self._dips if start <= now)

    def ina226_inputs(self):
        """``(bus_mv, current_ma)`` ints the INA226 on the GPU's 12 V feed sees.

        current = ``measured_share`` x GPU board power / bus voltage, plus seeded
        Gaussian noise (``rail.bus_noise_mv``, ``rail.current_noise_ma``).
        """
        r = self.params["rail"]
        v = self.rail_v()
        i_ma = r["measured_share"] * self.gpu.draw_w / v * 1000.0
        bus_mv = v * 1000.0
        if r["bus_noise_mv"]:
            bus_mv += self._ina_rng.gauss(0.0, r["bus_noise_mv"])
        if r["current_noise_ma"]:
            i_ma += self._ina_rng.gauss(0.0, r["current_noise_ma"])
        return max(0, round(bus_mv)), round(i_ma)

    @property
    def ina_present(self):
        """False while the ``ina_absent`` fault is on: the sim board NAKs the address."""
        return not self._ina_absent

    def adc_codes(self, n):
        """``n`` ``read_u16()`` codes per NTC channel: 4 lists of ``n`` ints.

        temperature -> beta resistance -> divider ratio -> 12-bit code
        ``round(ratio * 4095 + noise)`` clamped to 0..4095 -> ``raw << 4 | raw >> 8``.
        Open reads as R = inf, short as R = 0.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise WorldError(f"adc_codes(n) takes an int >= 1, got {n!r}")
        sigma = self.params["adc"]["noise_lsb"]
        gauss = self._adc_rng.gauss
        out = []
        for ch in range(4):
            ideal = self.adc_ideal(ch)
            codes = []
            for _ in range(n):
                x = ideal + gauss(0.0, sigma) if sigma else ideal
                raw = int(math.floor(x + 0.5))
                raw = 0 if raw < 0 else ADC_FULL if raw > ADC_FULL else raw
                codes.append(raw << 4 | raw >> 8)
            out.append(codes)
        return out

    def adc_ideal(self, ch):
        """Noise-free 12-bit ADC value (a float, 0..4095) of channel ``ch``."""
        c = self._ntc[ch]
        if self._ntc_short[ch]:
            r_ohm = 0.0
        elif self._ntc_open[ch]:
            r_ohm = math.inf
        else:
            r_ohm = calib.beta_resistance(
                self.ntc_c[ch] + calib.KELVIN, c["beta"], c["r0_ohm"], T0_K
            )
        return calib.ohms_to_adc(r_ohm, c["r_fixed_ohm"], c["ntc_low"], ADC_FULL)

    def _ntc_target(self, ch):
        temps = (*self.T, self.ambient_c)
        return self._ntc[ch]["offset_c"] + sum(w * temps[i] for i, w in self._ntc_sense[ch])

    # ------------------------------------------------------------------ faults

    def _channel(self, ch):
        if isinstance(ch, str) and ch in CHANNELS:
            return CHANNELS.index(ch)
        if isinstance(ch, int) and not isinstance(ch, bool) and 0 <= ch < 4:
            return ch
        raise WorldError(f"NTC channel must be 0..3 or one of {', '.join(CHANNELS)}; got {ch!r}")

    def _fan(self, fan):
        if isinstance(fan, int) and not isinstance(fan, bool) and 0 <= fan < FANS:
            return fan
        raise WorldError(f"fan must be 0 or 1, got {fan!r}")

    def ntc_open(self, ch, on=True):
        """Open circuit on NTC channel ``ch`` (index or name): reads full scale."""
        self._ntc_open[self._channel(ch)] = bool(on)

    def ntc_short(self, ch, on=True):
        """Short circuit on NTC channel ``ch``: reads 0. Wins over an open."""
        self._ntc_short[self._channel(ch)] = bool(on)

    def fan_stall(self, fan, on=True):
        """Stall fan ``fan`` (0 or 1): its RPM decays to 0 whatever the duty."""
        self._stalled[self._fan(fan)] = bool(on)

    def ina_absent(self, on=True):
        """INA226 missing from the bus (``ina_present`` turns False)."""
        self._ina_absent = bool(on)

    def rail_dip(self, depth_mv, duration_ms):
        """Drop the 12 V source by ``depth_mv`` for ``duration_ms`` from now.

        Overlapping dips add up.
        """
        for name, v in (("depth_mv", depth_mv), ("duration_ms", duration_ms)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise WorldError(f"rail_dip {name} must be an int >= 0, got {v!r}")
        self._dips.append((self.now_ms, self.now_ms + duration_ms, depth_mv))

    dip = rail_dip

    def airflow_loss(self, loss):
        """Dust: a clogged filter or fin stack passes ``1 - loss`` of the airflow the
        fans' RPM gives (0 clean .. 1 blocked). The forced conductances follow the
        reduced flow (``h ~ flow ** flow_exponent``), the chassis air exchange too;
        the fans' RPM does not change. Takes effect at the next sub-step."""
        if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0.0 <= loss <= 1.0:
            raise WorldError(f"airflow loss must be a number 0..1, got {loss!r}")
        self.airflow_share = 1.0 - float(loss)

    def gpu_lost(self, on=True):
        """The GPU falls off the bus: every VirtualGPU query raises GpuLost.

        Clearing it also clears a thermal shutdown (like a reset of the GPU).
        """
        self.gpu._set_lost(on)

    def faults(self):
        """Active faults as a dict (for snapshots, the CLI and the runner)."""
        return {
            "ntc_open": [CHANNELS[i] for i in range(4) if self._ntc_open[i]],
            "ntc_short": [CHANNELS[i] for i in range(4) if self._ntc_short[i]],
            "fan_stall": [i for i in range(FANS) if self._stalled[i]],
            "ina_absent": self._ina_absent,
            "rail_dip_mv": self._dip_mv(),
            "gpu_lost": self.gpu.lost,
        }

    # ------------------------------------------------------------------ snapshot

    def snapshot(self):
        """Everything observable, as a plain dict (floats in degC, W, V, A, RPM)."""
        snap = {"t_ms": self.now_ms, "ambient_c": self.ambient_c}
        for name, value in zip(NODE_NAMES, self.T, strict=False):
            snap[name + "_c"] = value
        for name, value in zip(CHANNELS, self.ntc_c, strict=False):
            snap["ntc_" + name + "_c"] = value
        v = self.rail_v()
        snap.update(
            fan_duty=list(self.duties),
            fan_rpm=list(self.rpm),
            fan_pulses=[int(math.floor(x)) for x in self._pulses_total],
            rail_v=v,
            gpu_current_a=self.params["rail"]["measured_share"] * self.gpu.draw_w / v,
            fans_w=self._fans_w(),
        )
        snap.update(self.gpu.state())
        snap["faults"] = self.faults()
        return snap


_NODE_INDEX = {"die": DIE, "vram": VRAM, "heatsink": HS, "mos": MOS, "air": AIR, "ambient": 5}


def _split(power, vrm_loss, mem_idle_w, mem_frac, idle_w):
    """Board power (W) -> heat into ``(die, vram, mos)``; the hot loop inlines this.

    The VRM loses ``vrm_loss`` of the board power; memory takes ``mem_idle_w`` (HBM
    and GDDR burn refresh and I/O power even at idle) plus ``mem_frac`` of the power
    above idle; the die takes the rest.
    """
    p_vrm = vrm_loss * power
    p_mem = mem_idle_w if power < idle_w else mem_idle_w + mem_frac * (power - idle_w)
    p_mem = min(p_mem, power - p_vrm)
    return power - p_vrm - p_mem, p_mem, p_vrm


def _alpha(dt_s, tau_s):
    """Exact first-order lag factor for one sub-step (1 = no lag)."""
    return 1.0 if tau_s <= 0.0 else 1.0 - math.exp(-dt_s / tau_s)


def _solve(a, b):
    """Gaussian elimination with partial pivoting for the small steady-state system."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x
