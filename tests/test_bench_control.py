"""The control suite's and the soak's machinery, on short cases (seconds of wall).

Only what is deterministic is asserted: the runs are lockstepped with the simulated
world, so the same seed gives the same samples, and what a controller does at a
given sample follows from the samples before it. The suite's numbers are not
re-measured here; the docs' tables are checked to be generated from
bench/results.json and docs/control-benchmark/cases.json, and the suite keys to
summarize the per-case file.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import pytest

from bench import bench_control as B
from bench import bench_soak
from boards import sim as board
from modbridge.sim import World, link, load_params
from modbridge.sim.runner import VirtualModule

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- metrics


def _trace(die, duty, ntc=None):
    n = len(die)
    return {
        "t_s": [float(i + 1) for i in range(n)],
        "die_c": die,
        "duty": duty,
        "ntc_c": ntc if ntc is not None else [None] * n,
        "rpm": [1000.0] * n,
        "slowdown": [False] * n,
    }


def test_metrics_of_a_step():
    # 60 s idle, a rise to 80 with a peak of 83 at 100 s, settled at 80 from 150 s
    die = [40.0] * 60 + [40.0 + i for i in range(40)] + [83.0] + [81.5] * 49 + [80.0] * 250
    duty = [13107] * 100 + [30000] * 100 + [30000 + 600] * 200  # one jump > 1 %
    ntc = [None] * 200 + [70.0, 71.5] * 100
    m = B.metrics(_trace(die, duty, ntc), "step", ceiling=82.0, slowdown=83.0)
    assert m["peak_c"] == 83.0
    assert m["steady_c"] == 80.0
    assert m["overshoot_c"] == 3.0  # the peak over the settled peaks
    assert m["above_ceiling_s"] == 1 and m["above_slowdown_s"] == 1
    assert m["settle_s"] == 150 - 60  # within 1 degC of 80 from t = 150 s
    assert math.isclose(m["changes_per_min"], 1 / (400 / 60))
    assert math.isclose(m["ntc_band_c"], 1.5)
    assert math.isclose(m["mean_duty"], sum(duty) / 400 / 65535)
    assert math.isclose(m["duty2"], sum((d / 65535) ** 2 for d in duty) / 400)
    assert m["limit_cycle"] is False


def test_limit_cycle_detector():
    n = 240
    flat = [30000] * n
    assert not B.limit_cycle(flat, 1)
    # the load's own period (30 s on / 30 s off) is explained away
    forced = [30000 + (6000 if (i // 30) % 2 else 0) for i in range(n)]
    assert not B.limit_cycle(forced, 60)
    # a 58 s oscillation under a constant load is a limit cycle...
    hunt = [30000 + int(8000 * math.sin(2 * math.pi * i / 58)) for i in range(n)]
    assert B.limit_cycle(hunt, 1)
    # ... and one at 40 s under 10 s bursts too
    assert B.limit_cycle([30000 + int(8000 * math.sin(2 * math.pi * i / 40)) for i in range(n)], 10)
    # wiggles smaller than the hysteresis (2 %) are not
    assert not B.limit_cycle([30000 + (1000 if i & 1 else 0) for i in range(n)], 1)
    # a monotone ramp is not
    assert not B.limit_cycle([13107 + 200 * i for i in range(n)], 1)


def test_cases_worlds_and_ceilings():
    assert B.ceiling_c(load_params("rtx3080")) == 80.0  # 83 degC slowdown - 3
    assert B.ceiling_c(load_params("h200_2u")) == 84.0
    assert B.load_w(load_params("rtx3080")) == 320.0
    assert B.load_w(load_params("default")) == 650.0
    w = B.make_world("rtx3080_dusty", 40, "bursts6")
    assert w.ambient_c == 40
    assert w.profile.demand_w(61000) == 320.0 and w.profile.demand_w(67000) < 100.0
    assert B.make_world("h200_2u", 20, "steady").profile.demand_w(0) == 650.0
    with pytest.raises(ValueError, match="unknown load"):
        B.profile_text("sine", 100)


def test_fast_curve_is_monotone_in_t0():
    cool = B.fast_curve("rtx3080", 40, "step", B.curve_points(40, 20), case_s=120)
    warm = B.fast_curve("rtx3080", 40, "step", B.curve_points(60, 20), case_s=120)
    assert warm[0] > cool[0] + 1.0  # hotter die
    assert warm[1] < cool[1]  # less duty squared


# --------------------------------------------------------------------------- short runs


def test_pid_and_curve_on_the_firmware_are_deterministic_and_hosted():
    a = B.simulate("rtx3080", 40, "step", "pid", case_s=90)
    b = B.simulate("rtx3080", 40, "step", "pid", case_s=90)
    for key in ("die_c", "duty", "target_c", "state"):
        assert a[key] == b[key], key
    assert len(a["t_s"]) == 90
    assert set(a["state"][5:]) == {1}  # HOSTED throughout: no fault floor
    # hosted: the target is the die envelope against slowdown - 5 (78 degC) or an NTC error
    i = 80
    assert a["target_c"][i] >= max(a["die_c"][i - 60 : i + 1]) - 78.0 - 1.5
    pts = B.curve_points(45, 20)
    c = B.simulate("rtx3080", 40, "step", "curve", points=pts, case_s=90)
    assert set(c["state"][5:]) == {1}
    x = 70.0 + c["target_c"][i - 1]  # the worst channel on the GPU scale
    want = 13107 + (x - 45) / 20 * (65535 - 13107)
    assert abs(c["duty"][i] - want) < 0.05 * 65535, (x, want, c["duty"][i])


def test_the_heartbeat_is_the_real_bridges():
    # what modbridge.bridge sends, the GPU's slowdown temperature included
    w = B.make_world("rtx3080", 30, "step", case_s=70)

    class Vm:
        world = w
        sent = []

        def encode(self, name, fields, seq):
            self.sent.append((name, fields))
            return b""

        def host_write(self, data):
            pass

    vm = Vm()
    B.Host(vm).heartbeat()
    name, fields = vm.sent[0]
    assert name == "heartbeat"
    assert fields["gpu_slowdown"] == 83000  # the rtx3080 world's slowdown
    assert fields["gpu_temp"] == int(w.gpu.temperature_c()) * 1000
    assert fields["power_limit"] == 320000


def test_oracle_is_the_least_safe_constant_duty():
    # more duty after the onset: a cooler die and more duty squared
    lo = B.fast_constant("rtx3080_dusty", 40, "step", 26214, case_s=200)
    hi = B.fast_constant("rtx3080_dusty", 40, "step", 52428, case_s=200)
    assert hi[0] < lo[0] - 2 and hi[1] > lo[1]
    # at the fans' minimum before the onset: the duty^2 of the first 60 s is 0.04
    assert abs(B.fast_constant("default", 20, "step", B.MIN_DUTY, case_s=120)[1] - 0.04) < 1e-9


def test_suite_curve_is_the_quietest_width():
    tried = [
        {"width_c": 10, "t0_c": 60.0, "duty2_sum": 4.0},
        {"width_c": 20, "t0_c": 55.0, "duty2_sum": 3.5},
        {"width_c": 30, "t0_c": 50.0, "duty2_sum": 5.0},
    ]
    pick = B.pick_suite_curve(tried)
    assert (pick["width_c"], pick["t0_c"]) == (20, 55.0)
    assert pick["tried"] == [[10, 60.0, 4.0], [20, 55.0, 3.5], [30, 50.0, 5.0]]


def test_unknown_controller_is_refused():
    with pytest.raises(ValueError, match="unknown controller"):
        B.simulate("default", 25, "step", "fuzzy", case_s=70)


# --------------------------------------------------------------------------- docs


def test_docs_tables_are_generated_from_the_results():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    doc = json.loads(B.CASES_FILE.read_text())
    text = (ROOT / "docs" / "control-benchmark.md").read_text()
    assert B.render_docs(text, B.docs_sections(results, doc)) == text
    n = len(B.WORLDS) * len(B.ROOMS_C) * len(B.LOADS)
    assert len(doc["cases"]) == n * len(B.CONTROLLERS)
    # the suite keys agree with the per-case file they summarize
    assert set(doc["curves"]) == {"suite", *B.WORLDS}
    summary = B.summarize(doc["cases"], doc["curves"])
    for key, value in summary.items():
        assert results[key] == value, key
    for png in B.OUT_DIR.glob("*.png"):
        assert png.stat().st_size < 60_000, png


def test_png_writer(tmp_path):
    from bench.pngplot import Plot

    fig = Plot(120, 80, panels=2)
    fig.panel(0, (0, 10), (0, 100), y_ticks=(0, 50), x_ticks=(0, 5))
    fig.panel(1, (0, 10), (0, 1), y_ticks=(0, 1), x_ticks=(0, 5))
    fig.line(0, range(11), [i * 10 for i in range(11)], (255, 0, 0))
    fig.hline(1, 0.5, (0, 0, 0))
    path = tmp_path / "p.png"
    fig.save(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR" and data[16:24] == bytes([0, 0, 0, 120, 0, 0, 0, 80])
    raw = zlib.decompress(data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8])
    assert len(raw) == 80 * (120 + 1)
    assert raw.count(2) > 20  # the red line's palette index drew pixels


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
