"""End to end: ``modbridge tune`` on virtual modules (the real firmware in MicroPython on
a pty, its world's virtual GPU in the heartbeats), 40x real time. The command runs the
relay test, shows and writes the gains (signed pid_gains + config_save); with them the
closed loop settles in the default world and in the lagging consumer-card world (NTC
12 s behind the die) without a limit cycle."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from modbridge.cli import tune as T
from modbridge.cli.main import main
from modbridge.link.requests import timeout_scale
from protocol import catalog as C

FAST = ["--settle", "60", "--cycles", "2", "--speed", "40"]


def test_tune_sim_yes_json_runs_and_writes_the_gains():
    res = CliRunner().invoke(main, ["tune", "--sim", "--yes", "--json", *FAST])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["status"] == "done" and out["written"] is True, out
    assert out["cycles"] >= 2 and out["ku_pct_per_c"] > 0 and out["pu_s"] > 1, out
    g, w = out["gains"], out["gains_wire"]
    assert w["kp"] == round(out["ku_pct_per_c"] * 1000) * 5 // 16, (w, out["ku_pct_per_c"])
    assert abs(g["kp"] - w["kp"] / 1000) < 1e-9 and w["kd"] == 0
    assert out["ti_s"] is None or out["ti_s"] == pytest.approx(w["kp"] / w["ki"])
    assert [p["status"] for p in out["progress"]][-1] == C.TUNE_DONE


class _Samples:
    """(module s, fan1 duty, GPU NTC m degC) once per second of the module's uptime,
    from every telemetry frame (the link's I/O thread): each frame carries its own
    second, so a loaded machine that reads the pty late loses none of them."""

    def __init__(self):
        self.by_s: dict[int, tuple] = {}
        self.on = False

    def __call__(self, _status, msg):
        f = msg.fields
        if self.on and "fan1_duty" in f and "uptime_s" in f:
            self.by_s.setdefault(f["uptime_s"], (f["uptime_s"], f["fan1_duty"], f.get("temp_gpu")))

    def collect(self, target, seconds, speed):
        self.on = True
        T._settle(target, seconds, speed / SCALE)
        self.on = False
        return [self.by_s[s] for s in sorted(self.by_s)]


# world seconds after the gains are written: the PID takes over from the relay, then
# the fans are watched (issue 11's limit cycle had a 58 s period: several in the tail)
SETTLE_S, WATCH_S = 120, 360
SPEED = 40.0  # 6-7 ms of CPU per world second (module, world and link): ~25 % of a core
SCALE = timeout_scale()  # the wall deadlines of a loaded machine (conftest: 4)


@pytest.mark.parametrize("world", ["default", "rtx3080"])
def test_tuned_gains_hold_the_loop_without_a_limit_cycle(world):
    speed = SPEED
    target = T._SimTarget(world, None, speed, seed=1)
    samples = _Samples()
    link = T.link_class()(
        target.port,
        keys=target.keys,
        heartbeat_period_s=0.02,
        heartbeat_source=target.heartbeat,
        on_telemetry=samples,
    )
    try:
        link.start()
        assert link.wait_up(20 * SCALE)
        T.wait_hosted(link, 20 * SCALE)
        target.relax_host_timeout(link)
        T._settle(target, 60, speed / SCALE)
        params = T._params(20.0, 0.3, 8.0, 1800, 2)
        res = T.run_test(link, params, (1800 / speed + 60) * SCALE)
        assert res.done, (res.status, res.progress[-1:])
        T.write_gains(link, res.gains_wire)
        cfg = T.current_gains(link)
        assert cfg == res.gains_wire, (cfg, res.gains_wire)
        T._settle(target, SETTLE_S, speed / SCALE)  # the PID takes over from the relay
        got = samples.collect(target, WATCH_S, speed)
        die_c = target.fleet.gpus[0].temperature_c()
        slowdown_c = target.fleet.worlds[0].params["gpu"]["slowdown_c"]
    finally:
        link.stop()
        target.close()
    assert len(got) > WATCH_S * 5 // 6, len(got)
    duties = [d for _t, d, _n in got]
    # no limit cycle (issue 11's swung 20..100 % with a 58 s period): over the last
    # 3 minutes the fans stay within a 10 % band, and they change direction rarely
    tail = duties[len(duties) // 2 :]
    assert max(tail) - min(tail) <= 6554, (world, min(tail), max(tail), min(duties))
    flips = 0
    trend = 0
    for a, b in zip(duties, duties[1:], strict=False):
        step = (b > a) - (b < a)
        if step and step != trend:
            flips += trend != 0
            trend = step
    assert flips <= 12, (world, flips)
    assert die_c < slowdown_c, (world, die_c)
