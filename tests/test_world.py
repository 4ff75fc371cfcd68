"""The simulated world: determinism, energy balance, the H200 fit, fans, tach, NTC codes,
12 V rail, faults, parameter files and load profiles."""

import csv
import math
import sys
import time
from pathlib import Path

import pytest

from device import config as device_config
from device.drivers.ntc import NTC
from modbridge.sim import (
    CHANNELS,
    ParamsError,
    Profile,
    ProfileError,
    World,
    WorldError,
    load_params,
)
from modbridge.sim import params as sim_params

TRACE = Path(__file__).parent / "fixtures" / "nvidia-h200" / "h200_thermal_trace.csv"
HALF = 32768


def quiet(**changes):
    return load_params("default").override({"adc.noise_lsb": 0.0, **changes})


def settled(profile="idle", duty=HALF, params=None, **kw):
    w = World(params or load_params("default"), seed=0, profile=profile, **kw)
    w.set_duties(duty, duty)
    w.equilibrate()
    return w


# --------------------------------------------------------------------------- determinism


def _drive(w):
    """The same input script for any world; returns everything it observed."""
    seen = []
    for k in range(300):
        if k == 50:
            w.set_duties(20000, 50000)
        if k == 120:
            w.fan_stall(1)
            w.rail_dip(500, 700)
        if k == 200:
            w.fan_stall(1, False)
            w.ntc_open("mos")
        w.step(100)
        seen.append((w.adc_codes(8), w.ina226_inputs(), w.tach_pulses(), w.snapshot()))
    return seen


def test_same_seed_same_everything_different_seed_different_noise():
    a = _drive(World(seed=7, profile="bench"))
    b = _drive(World(seed=7, profile="bench"))
    assert a == b
    c = _drive(World(seed=8, profile="bench"))
    assert [s[3] for s in c] == [s[3] for s in a]  # physics has no randomness
    assert [s[0] for s in c] != [s[0] for s in a]  # ADC noise does
    assert [s[1] for s in c] != [s[1] for s in a]  # INA226 noise too


def test_state_does_not_depend_on_how_time_is_chunked():
    worlds = [settled("demo") for _ in range(3)]
    chunks = ([1000] * 60, [10] * 6000, [7] * 8571 + [3])
    for w, steps in zip(worlds, chunks, strict=False):
        for dt in steps:
            w.step(dt)
        assert w.now_ms == 60_000
    snaps = [w.snapshot() for w in worlds]
    assert snaps[0] == snaps[1] == snaps[2]


def test_cost_is_a_fixed_number_of_substeps_and_fast():
    w = settled("bench")
    before = w.substeps
    t0 = time.perf_counter()
    w.step(600_000)
    wall = time.perf_counter() - t0
    assert w.substeps - before == 60_000  # 10 min at 10 ms: the deterministic cost
    print(f"physics speed: {600 / wall:.0f}x real time")  # measured, not asserted


# --------------------------------------------------------------------------- energy


def test_steady_state_heat_in_equals_heat_out():
    w = settled(Profile.parse("hold 400W 2h"))
    w.step(3_600_000)  # an hour: many times the slowest time constant
    g_ha, g_ma, g_aa = w._conductances()
    air = w.snapshot()["air_c"]
    heat_out = g_aa * (air - w.ambient_c)
    heat_in = w.gpu.draw_w
    assert heat_in == 400.0
    assert heat_out == pytest.approx(heat_in, rel=0.01)
    # ...and the direct steady-state solution agrees with the long run.
    t_run = list(w.T)
    w.equilibrate()
    for a, b in zip(t_run, w.T, strict=False):
        assert a == pytest.approx(b, abs=0.05)


# --------------------------------------------------------------------------- H200 fit


def _trace():
    with TRACE.open() as f:
        rows = list(csv.DictReader(f))
    return [
        (
            round(float(r["t_s"]) * 1000),
            float(r["power_w"]),
            int(r["gpu_temp_c"]),
            int(r["mem_temp_c"]),
        )
        for r in rows
    ]


def replay_h200(shift_ms=700):
    """Replay the trace's power into the default world, fans fixed at 50 %.

    NVML's power reading lags the real power (a ~1 s average, reported late): the
    replayed power is advanced by 700 ms, the lag the fit found best. The ambient is
    chosen so the idle die matches the trace (34 degC): the network is linear, so this
    only shifts every temperature. Returns rows of
    ``(t_ms, die_trace, mem_trace, die_sim, mem_sim)``.
    """
    rows = _trace()
    samples = []
    for t, p, _, _ in rows:
        t = max(0, t - shift_ms)
        if samples and t <= samples[-1][0]:
            samples[-1] = (samples[-1][0], p)
        else:
            samples.append((t, p))
    w = settled(Profile.from_samples(samples, name="h200"))
    offset = rows[0][2] - w.T[0]
    w = settled(Profile.from_samples(samples, name="h200"), ambient_c=w.ambient_c + offset)
    out = []
    for t, _, die, mem in rows:
        w.step(t - w.now_ms)
        out.append((t, die, mem, w.T[0], w.T[1]))
    return out, w.ambient_c


def _rise_t90(series, t_start, t_end):
    """Rise (mean of the last 20 s before t_end minus idle) and time to 90 % of it."""
    idle = [v for t, v in series if t < t_start]
    late = [v for t, v in series if t_end - 20_000 <= t < t_end]
    base, top = sum(idle) / len(idle), sum(late) / len(late)
    target = base + 0.9 * (top - base)
    t90 = next(t for t, v in series if t >= t_start and v >= target) - t_start
    return top - base, t90 / 1000.0


def test_replaying_the_h200_trace_fits_its_rise_and_time_constants():
    rows, ambient = replay_h200()
    load_start, load_end = 20_400, 140_400
    die_tr = [(r[0], r[1]) for r in rows]
    die_sim = [(r[0], r[3]) for r in rows]
    mem_tr = [(r[0], r[2]) for r in rows]
    mem_sim = [(r[0], r[4]) for r in rows]
    rise_tr, t90_tr = _rise_t90(die_tr, load_start, load_end)
    rise_sim, t90_sim = _rise_t90(die_sim, load_start, load_end)
    assert 22.0 < rise_tr < 25.0 and 2.0 <= t90_tr <= 3.0  # the recording: 34 -> 58, ~2.6 s
    assert rise_sim == pytest.approx(rise_tr, abs=1.0)
    assert t90_sim == pytest.approx(t90_tr, abs=1.0)
    mrise_tr, _ = _rise_t90(mem_tr, load_start, load_end)
    mrise_sim, _ = _rise_t90(mem_sim, load_start, load_end)
    assert 14.0 < mrise_tr < 16.0  # 37 -> 52 over ~2 min
    assert mrise_sim == pytest.approx(mrise_tr, abs=1.5)

    # Memory is still drifting up long after the die has settled (minutes, not seconds).
    def drift(col):
        early = [r[col] for r in rows if 38_000 <= r[0] < 42_000]
        late = [r[col] for r in rows if 134_000 <= r[0] < 138_000]
        return sum(late) / len(late) - sum(early) / len(early)

    assert drift(2) > 2.0  # the recording: ~3 K between 40 s and 136 s
    assert drift(4) == pytest.approx(drift(2), abs=1.0)
    rms_die = math.sqrt(sum((r[3] - r[1]) ** 2 for r in rows) / len(rows))
    rms_mem = math.sqrt(sum((r[4] - r[2]) ** 2 for r in rows) / len(rows))
    print(
        f"H200 fit: die rise {rise_sim:.1f} vs {rise_tr:.1f} K, t90 {t90_sim:.1f} vs "
        f"{t90_tr:.1f} s; memory rise {mrise_sim:.1f} vs {mrise_tr:.1f} K, drift "
        f"{drift(4):.1f} vs {drift(2):.1f} K; "
        f"RMS die {rms_die:.2f} K, memory {rms_mem:.2f} K; inlet {ambient:.1f} degC"
    )
    assert rms_die < 1.0
    assert rms_mem < 1.5


# --------------------------------------------------------------------------- fans and tach


def test_fan_spin_up_and_down_follow_first_order_lags():
    w = settled(duty=0)
    f = w.params["fans"]
    assert w.rpm == [0.0, 0.0]
    w.set_duties(65535, 65535)
    w.step(round(f["spinup_tau_s"] * 1000))
    assert w.rpm[0] == pytest.approx(f["max_rpm"] * (1 - math.exp(-1)), rel=0.01)
    w.step(40_000)
    assert w.rpm[0] == f["max_rpm"]  # settled exactly (snaps within 0.001 RPM)
    w.set_duties(HALF, HALF)
    w.step(round(f["spindown_tau_s"] * 1000))
    half = f["max_rpm"] * HALF / 65535
    expect = half + (f["max_rpm"] - half) * math.exp(-1)
    assert w.rpm[0] == pytest.approx(expect, rel=0.01)


def test_fan_stop_and_start_duties():
    w = settled(duty=0)
    f = w.params["fans"]
    between = round(65535 * (f["stop_duty_pct"] + f["start_duty_pct"]) / 200)
    w.set_duties(between, between)
    w.step(10_000)
    assert w.rpm == [0.0, 0.0]  # too little to start from standstill
    w.set_duties(HALF, HALF)
    w.step(10_000)
    w.set_duties(between, between)
    w.step(60_000)
    assert w.rpm[0] == pytest.approx(f["max_rpm"] * between / 65535)  # keeps turning
    below = round(65535 * f["stop_duty_pct"] / 200)
    w.set_duties(below, below)
    w.step(60_000)
    assert w.rpm == [0.0, 0.0]


def test_fan_stall_decays_to_zero_and_recovers():
    w = settled()
    w.tach_pulses()
    w.fan_stall(0)
    assert w.faults()["fan_stall"] == [0]
    w.step(30_000)
    assert w.rpm[0] == 0.0
    assert w.rpm[1] > 1000
    w.tach_pulses()
    w.step(5000)
    p = w.tach_pulses()
    assert p[0] == 0 and p[1] > 0
    w.fan_stall(0, False)
    w.step(40_000)
    assert w.rpm[0] == pytest.approx(w.rpm[1])
    with pytest.raises(WorldError, match="fan must be 0 or 1"):
        w.fan_stall(2)


def test_tach_pulse_counts_are_exact_over_long_windows():
    w = settled(duty=40000)
    rpm = w.params["fans"]["max_rpm"] * 40000 / 65535
    ppr = w.params["fans"]["pulses_per_rev"]
    w.tach_pulses()
    start = w.snapshot()["fan_pulses"]
    total = [0, 0]
    for k in range(6000):  # 10 min at irregular intervals
        w.step(37 if k % 3 else 163)
        p = w.tach_pulses()
        total = [total[0] + p[0], total[1] + p[1]]
    seconds = w.now_ms / 1000
    end = w.snapshot()["fan_pulses"]
    assert total == [end[0] - start[0], end[1] - start[1]]  # nothing lost, nothing doubled
    expect = rpm * ppr / 60 * (w._phys_ms / 1000)
    for i in range(2):
        assert abs(end[i] - expect) <= 1, (end[i], expect, seconds)


# --------------------------------------------------------------------------- NTC codes


class _Replay:
    def __init__(self, codes):
        self.codes = list(codes)

    def read_u16(self):
        return self.codes.pop()


def test_ntc_codes_decode_through_the_firmware_lut_to_the_sensed_temperature():
    w = World(seed=3)  # default noise: 1 LSB
    cfgs = device_config.defaults()["channels"]
    for t_c in (0.0, 10.0, 25.0, 40.0, 55.0, 70.0, 85.0, 100.0, 115.0):
        w.ntc_c = [t_c, t_c + 1.5, t_c + 3.0, t_c + 4.5]
        codes = w.adc_codes(64)
        for ch in range(4):
            assert all(0 <= c <= 65535 for c in codes[ch])
            ntc = NTC.from_config(_Replay(codes[ch]), cfgs[ch], oversample=64, filter=None)
            got = ntc.read_mc() / 1000
            assert got == pytest.approx(w.ntc_c[ch], abs=0.3), (CHANNELS[ch], t_c)


def test_code_format_is_read_u16_of_a_12_bit_adc():
    w = World(quiet())
    for codes in w.adc_codes(4):
        for c in codes:
            raw = c >> 4
            assert c == raw << 4 | raw >> 8
    w.ntc_c = [25.0] * 4
    assert w.adc_codes(1)[0] == [2048 << 4 | 2048 >> 8]  # docs/calibration.md: 32776


def test_world_ntc_defaults_match_the_firmware_defaults():
    p = load_params("default")
    for ch, cfg in zip(CHANNELS, device_config.DEFAULTS["channels"], strict=False):
        n = p["ntc." + ch]
        assert cfg["name"] == ch
        assert (n["beta"], n["r0_ohm"], n["r_fixed_ohm"], n["ntc_low"]) == (
            cfg["beta"],
            cfg["r0"],
            cfg["r_fixed"],
            cfg["ntc_low"],
        )


def test_ntc_lags_its_node_and_gpu_channel_mixes_die_and_heatsink():
    w = settled(Profile.parse("idle 10s\nhold 650W 5min"), params=quiet())
    w.step(10_000)
    die0 = w.T[0]
    w.step(2000)
    s = w.snapshot()
    assert s["die_c"] - die0 > 10
    n = w.params["ntc.gpu"]
    mix = sum(
        wt * s[node + "_c"] for node, wt in zip(n["sense_nodes"], n["sense_weights"], strict=False)
    )
    assert s["ntc_gpu_c"] < mix  # lagging a rising target
    w.step(280_000)
    s = w.snapshot()
    mix = sum(
        wt * s[node + "_c"] for node, wt in zip(n["sense_nodes"], n["sense_weights"], strict=False)
    )
    assert s["ntc_gpu_c"] == pytest.approx(mix, abs=0.05)  # caught up (slow drift left)


# --------------------------------------------------------------------------- 12 V rail


def test_rail_droops_with_gpu_power():
    w = settled(
        Profile.parse("idle 10s\nhold 650W 1min"),
        params=quiet(**{"rail.bus_noise_mv": 0.0, "rail.current_noise_ma": 0.0}),
    )
    r = w.params["rail"]
    mv_idle, ma_idle = w.ina226_inputs()
    w.step(20_000)
    mv_load, ma_load = w.ina226_inputs()
    assert ma_idle == round(80.0 / (mv_idle / 1000) * 1000)
    assert ma_load == pytest.approx(650.0 / (mv_load / 1000) * 1000, abs=1)
    droop = mv_idle - mv_load
    extra_a = ma_load / 1000 - ma_idle / 1000
    assert droop == pytest.approx(r["source_resistance_ohm"] * extra_a * 1000, rel=0.1)
    assert 11_700 < mv_load < mv_idle < 12_050


def test_rail_dips_scripted_and_from_profiles():
    p = quiet(**{"rail.bus_noise_mv": 0.0, "rail.current_noise_ma": 0.0})
    w = settled(params=p)
    v0, _ = w.ina226_inputs()
    w.rail_dip(800, 300)
    assert w.ina226_inputs()[0] == pytest.approx(v0 - 800, abs=2)
    w.dip(200, 100)  # overlapping dips add
    assert w.faults()["rail_dip_mv"] == 1000
    w.step(100)
    assert w.ina226_inputs()[0] == pytest.approx(v0 - 800, abs=2)
    w.step(200)
    assert w.ina226_inputs()[0] == v0
    assert w.faults()["rail_dip_mv"] == 0
    # The demo profile has a 900 mV, 300 ms dip 70 s in.
    w = settled("demo", params=p)
    w.step(69_990)
    assert w.faults()["rail_dip_mv"] == 0
    w.step(20)
    assert w.faults()["rail_dip_mv"] == 900
    w.step(300)
    assert w.faults()["rail_dip_mv"] == 0
    with pytest.raises(WorldError, match="depth_mv must be an int"):
        w.rail_dip(-1, 10)


# --------------------------------------------------------------------------- faults


def test_ntc_open_and_short_on_and_off():
    w = World(seed=1)
    normal = w.adc_codes(8)[2]
    assert all(5000 < c < 60000 for c in normal)
    w.ntc_open("mos")
    assert min(w.adc_codes(8)[2]) > 65024  # beyond the firmware's open threshold
    assert w.faults()["ntc_open"] == ["mos"]
    w.ntc_short(2)
    assert max(w.adc_codes(8)[2]) < 512  # a short wins over an open
    w.ntc_short(2, False)
    w.ntc_open(2, False)
    assert all(5000 < c < 60000 for c in w.adc_codes(8)[2])
    assert w.faults()["ntc_open"] == [] and w.faults()["ntc_short"] == []
    with pytest.raises(WorldError, match="NTC channel must be 0..3"):
        w.ntc_open("cpu")


def test_ina_absent_flag():
    w = World()
    assert w.ina_present
    w.ina_absent()
    assert not w.ina_present and w.faults()["ina_absent"]
    w.ina_absent(False)
    assert w.ina_present


def test_bad_inputs_are_refused():
    w = World()
    for bad in ((-1, 0), (0, 65536), (1.5, 0), (True, 0)):
        with pytest.raises(WorldError, match="duty must be an int 0..65535"):
            w.set_duties(*bad)
    for bad in (-1, 1.0, None):
        with pytest.raises(WorldError, match="step"):
            w.step(bad)
    with pytest.raises(WorldError):
        w.adc_codes(0)


# --------------------------------------------------------------------------- params


def _write(tmp_path, text, name="w.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_worlds_load_and_agree_with_tomllib():
    assert "default" in sim_params.builtin_names()
    for name in sim_params.builtin_names():
        p = load_params(name)
        assert p["world"]["substep_ms"] >= 1
    if sys.version_info < (3, 11):
        pytest.skip("tomllib arrived in Python 3.11")
    import tomllib

    for path in sim_params.WORLDS_DIR.glob("*.toml"):
        text = path.read_text()
        ours, _ = sim_params.parse_toml(text)
        theirs = tomllib.loads(text)
        flat = {}
        for key, value in theirs.items():
            if key == "ntc":
                for ch, sec in value.items():
                    flat["ntc." + ch] = sec
            else:
                flat[key] = value
        assert ours == flat


def test_params_errors_name_the_key(tmp_path):
    base = sim_params.WORLDS_DIR / "default.toml"
    text = base.read_text()
    unknown = _write(tmp_path, text.replace("[fans]", "[fans]\nmax_rmp = 3000.0"))
    with pytest.raises(ParamsError, match=r"line \d+: unknown key fans.max_rmp; \[fans\] takes"):
        load_params(unknown)
    wrong = _write(tmp_path, text.replace("max_rpm = 3000.0", 'max_rpm = "fast"'))
    with pytest.raises(ParamsError, match=r"line \d+: fans.max_rpm: must be a number"):
        load_params(wrong)
    missing = _write(tmp_path, text.replace("pulses_per_rev = 2\n", ""))
    with pytest.raises(ParamsError, match="missing key fans.pulses_per_rev"):
        load_params(missing)
    ranged = _write(tmp_path, text.replace("pulses_per_rev = 2", "pulses_per_rev = 9"))
    with pytest.raises(ParamsError, match="fans.pulses_per_rev: must be <= 4, got 9"):
        load_params(ranged)
    section = _write(tmp_path, text + "\n[fan]\nmax_rpm = 1.0\n")
    with pytest.raises(ParamsError, match=r"unknown section \[fan\]"):
        load_params(section)
    syntax = _write(tmp_path, "[world]\nname = default\n")
    with pytest.raises(ParamsError, match="line 2: cannot read value 'default'"):
        load_params(syntax)
    weights = _write(tmp_path, text.replace("sense_weights = [0.7, 0.3]", "sense_weights = [0.7]"))
    with pytest.raises(ParamsError, match="ntc.gpu.sense_nodes and sense_weights differ"):
        load_params(weights)
    with pytest.raises(ParamsError, match="no built-in world 'nope'"):
        load_params("nope")
    with pytest.raises(ParamsError, match="cannot read world file"):
        load_params(tmp_path / "absent.toml")
    with pytest.raises(ParamsError, match="override fans.speed: unknown key"):
        load_params("default").override({"fans.speed": 1})
    with pytest.raises(ParamsError, match="gpu.default_limit_w"):
        load_params("default").override({"gpu.default_limit_w": 900.0})


def test_inherit_states_only_the_differences(tmp_path):
    path = _write(tmp_path, 'inherit = "default"\n[world]\nname = "mine"\n[fans]\nmax_rpm = 2000\n')
    p = load_params(path)
    assert p["fans"]["max_rpm"] == 2000.0 and p["world"]["name"] == "mine"
    assert p["die"] == load_params("default")["die"]
    loop = _write(tmp_path, 'inherit = "loop.toml"\n', name="loop.toml")
    with pytest.raises(ParamsError, match="inherit loop"):
        load_params(loop)


# --------------------------------------------------------------------------- profiles


def test_builtin_profiles():
    bench = Profile.builtin("bench")
    assert bench.end_ms == (60 + 600 + 600 + 300) * 1000
    assert bench.demand_w(59_999) == 0.0
    assert bench.demand_w(60_000) == 650.0
    assert bench.demand_w(660_000) == 650.0  # first burst is on
    assert bench.demand_w(690_000) == 0.0  # ... then off for 30 s
    assert bench.demand_w(720_000) == 650.0
    assert bench.demand_w(1_500_000) == 0.0
    assert Profile.builtin("step650").demand_w(300_000) == 650.0
    demo = Profile.builtin("demo")
    assert 120_000 <= demo.end_ms <= 180_000
    assert demo.demand_w(22_500) == pytest.approx(375.0)  # mid-ramp
    assert Profile.get(None).demand_w(5) == 0.0


def test_profile_text_errors():
    for text, msg in (
        ("hold 650 10s", "power like 650W"),
        ("idle 10", "duration like 30s"),
        ("bursts 650W 30s 10min", "need <on>/<off>"),
        ("jump 5W", "cannot read 'jump 5W'"),
        ("dip 0.5V 10ms", "dip depth like 800mV"),
    ):
        with pytest.raises(ProfileError, match=msg):
            Profile.parse(text)
    with pytest.raises(ProfileError, match="no built-in profile"):
        Profile.builtin("nope")
    with pytest.raises(ProfileError, match="neither a built-in"):
        Profile.get("/nonexistent/profile.txt")
    with pytest.raises(ProfileError, match="must increase"):
        Profile.from_samples([(0, 1.0), (0, 2.0)])
