"""The control benchmark's and the soak's machinery, on short profiles (seconds of wall).

Only what is deterministic is asserted: the runs are lockstepped with the simulated
world, so the same seed gives the same samples, and what a controller does at a
given sample follows from the samples before it. The numbers of the real benchmark
(docs/control-benchmark.md) are not checked here.
"""

from __future__ import annotations

import math

import pytest

from bench import bench_control as B
from bench import bench_soak
from boards import sim as board
from modbridge.sim import World, link
from modbridge.sim.profiles import Profile
from modbridge.sim.runner import VirtualModule

SHORT = Profile.parse("idle 10s\nhold 650W 80s\nidle 20s\n", name="short")
FULL = 65535


# --------------------------------------------------------------------------- metrics


def _trace(die, duty, err=None):
    n = len(die)
    return {
        "t_s": [float(i + 1) for i in range(n)],
        "die_c": die,
        "duty": duty,
        "err_c": err if err is not None else [None] * n,
        "slowdown": [False] * n,
    }


def test_metrics_windows_and_counts():
    die = [60.0] * 2 + [72.0, 75.0, 71.0, 69.0] + [50.0] * 2  # t = 1..8 s
    duty = [13107, 13107, 13107 + 600, 30000, 30000, 30000 + 700, 65535, 65535]
    err = [None, -5.0, 1.0, 2.5, 0.5, -1.0, -20.0, None]
    m = B.metrics(
        _trace(die, duty, err), setpoint_c=70, step_s=(2, 5), loaded_s=(2, 6), settled_s=(4, 6)
    )
    assert m["overshoot_c"] == 5.0  # max of t = 3..5 is 75
    assert m["max_c"] == 75.0
    assert math.isclose(m["rms_error_c"], math.sqrt((4 + 25 + 1 + 1) / 4))
    assert math.isclose(m["ss_error_c"], 0.0)  # (71 + 69) / 2 - 70
    assert math.isclose(m["mean_duty"], sum(duty) / 8 / 65535)
    # 600 and 700 are <= 1 % of 65535 (655); the other two jumps count
    assert math.isclose(m["duty_changes_per_min"], 3 / (8 / 60))
    assert m["ntc_overshoot_c"] == 2.5
    assert math.isclose(m["ntc_rms_error_c"], math.sqrt((1 + 6.25 + 0.25 + 1) / 4))
    assert math.isclose(m["ntc_ss_error_c"], -0.25)
    assert m["slowdown_s"] == 0


def test_benchmark_plant_is_the_documented_one():
    p = B.world_params()
    assert p["air"]["heat_capacity_j_per_k"] == 6000.0
    assert p["ntc.amb"]["sense_nodes"] == ["ambient"]
    assert p["fans"]["max_rpm"] == 12000.0  # h200_2u's 80 mm fans
    assert B.SETPOINT_C == 70.0
    assert B.CURVE_POINTS == [[40000, 13107], [80000, 65535]]


# --------------------------------------------------------------------------- short runs


def test_bangbang_follows_the_gpu_temperature_and_repeats(monkeypatch):
    monkeypatch.setattr(B, "TRIP_HIGH_C", 62)
    monkeypatch.setattr(B, "TRIP_LOW_C", 58)
    a = B.simulate("bangbang", 35, profile=SHORT)
    b = B.simulate("bangbang", 35, profile=SHORT)
    for key in ("die_c", "gpu_c", "duty", "err_c", "state"):
        assert a[key] == b[key], key
    assert a["sim_s"] == 110 and len(a["t_s"]) == 110
    gpu, duty = a["gpu_c"], a["duty"]
    high = False
    trips = 0
    for i in range(len(gpu) - 1):  # the host decides on sample i, the fans follow at i + 1
        if not high and gpu[i] >= 62:
            high = True
            trips += 1
        elif high and gpu[i] <= 58:
            high = False
        assert duty[i + 1] == (FULL if high else B.MIN_MANUAL_DUTY), (i, gpu[i], duty[i + 1])
    assert trips >= 1
    assert set(a["state"][5:]) == {4}  # MANUAL: host alive, manual mode


def test_curve_pid_and_tuned_pid_differ_under_load():
    runs = {c: B.simulate(c, 35, profile=SHORT) for c in ("pid", "pidtuned", "curve")}
    for c, tr in runs.items():
        assert set(tr["state"][5:]) == {1}, c  # HOSTED throughout, no fault floor
    # at the end of the hold the NTC is still below its setpoint: the PID sits at the
    # fans' minimum duty, the curve (20 % at 40 degC .. 100 % at 80 degC) is well above
    end = 89
    assert runs["pid"]["duty"][end] == runs["pidtuned"]["duty"][end] == 13107
    gpu_scale_c = B.SETPOINT_C + runs["curve"]["err_c"][end - 1]
    want = 13107 + (gpu_scale_c - 40) / 40 * (65535 - 13107)
    assert abs(runs["curve"]["duty"][end] - want) < 0.03 * 65535, (gpu_scale_c, want)


def test_unknown_controller_is_refused():
    with pytest.raises(ValueError, match="unknown controller"):
        B.simulate("fuzzy", 25, profile=SHORT, duration_s=1)


# --------------------------------------------------------------------------- heap field


def test_link_heap_field_is_optional():
    plain = link.Request(link.REQ_SLEEP, 100, tx=b"ab")
    assert link.decode_request(link.encode_request(plain)).heap_used is None
    with_heap = link.Request(link.REQ_SLEEP, 100, tx=b"ab", heap_used=209280)
    data = link.encode_request(with_heap)
    assert len(data) == len(link.encode_request(plain)) + 4
    assert link.decode_request(data) == with_heap
    bad = bytearray(data + b"x")
    bad[3] += 1  # header length 1 more: neither 0 nor 4 bytes after tx
    with pytest.raises(link.LinkError, match="tx_n"):
        link.decode_request(bytes(bad))
    assert board.FLAG_HEAP == link.FLAG_HEAP and board.HEAP_FIELD_SIZE == link.HEAP_FIELD_SIZE


def test_board_reports_its_heap_once_when_asked():
    sent = []
    inbox = bytearray()

    def readinto(buf, n):
        m = min(n, len(inbox))
        buf[:m] = inbox[:m]
        del inbox[:m]
        return m

    def write(buf, n):
        sent.append(bytes(buf[:n]))

    adc = [[1000] * 4] * 4
    inbox += link.encode_reply(link.Step(0, adc=adc), link.Boot())
    hal = board.SimHal(readinto, write)
    inbox += link.encode_reply(link.Step(100, link.FLAG_HEAP, adc=adc))
    hal.sleep_ms(100)
    inbox += link.encode_reply(link.Step(200, adc=adc))
    hal.sleep_ms(100)
    inbox += link.encode_reply(link.Step(300, adc=adc))
    hal.sleep_ms(100)
    reqs = [link.decode_request(m) for m in sent]
    assert [r.heap_used for r in reqs] == [None, None, 0, None]  # CPython: 0, "unknown"


def test_virtual_module_reports_heap_and_counts_feeds(tmp_path):
    world = World(B.world_params(), seed=3, ambient_c=25)
    with VirtualModule(world, tmp_path, speed=0, seed=3) as vm:
        vm.run_for(3000)
        feeds, t0 = vm.wdt_feeds, world.now_ms
        assert vm.heap_used is None
        vm.request_heap()
        vm.run_for(2000)
        assert (world.now_ms - t0) // 100 == vm.wdt_feeds - feeds  # one feed per tick
        assert 100_000 < vm.heap_used < 1_000_000, vm.heap_used  # MicroPython bytes
        assert t0 < vm.heap_used_at_ms <= t0 + 200


def test_short_soak_counts_nothing_missing():
    r = bench_soak.soak(hours=0.2, progress=False)  # 12 min: 10 warm-up + 2 measured
    assert r["soak_sim_hours"] == 0.2
    assert r["soak_resets"] == 0 and r["soak_internal_errors"] == 0
    assert r["soak_missed_ticks"] == 0 and r["soak_telemetry_missing"] == 0
    assert r["soak_heap_after_warmup_bytes_mpy"] > 100_000
    assert r["soak_heap_max_bytes_mpy"] >= r["soak_heap_after_warmup_bytes_mpy"]


def test_soak_hours_from_the_environment(monkeypatch):
    monkeypatch.delenv(bench_soak.HOURS_ENV, raising=False)
    assert bench_soak.soak_hours() == 72.0
    monkeypatch.setenv(bench_soak.HOURS_ENV, "1.5")
    assert bench_soak.soak_hours() == 1.5
    monkeypatch.setenv(bench_soak.HOURS_ENV, "0")
    with pytest.raises(ValueError, match="MODBRIDGE_SOAK_HOURS"):
        bench_soak.soak_hours()
