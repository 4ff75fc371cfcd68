"""The consumer-card worlds (host/modbridge/sim/worlds/rtx3080*.toml): they load, and
their steady states are the ones docs/control-benchmark.md describes."""

from modbridge.sim import World, load_params
from modbridge.sim.profiles import Profile


def _steady(name, room_c, duty_pct, watts=320):
    w = World(load_params(name), profile=Profile.parse(f"hold {watts}W 1h"), ambient_c=room_c)
    d = duty_pct * 65535 // 100
    w.set_duties(d, d)
    w.equilibrate()
    return w


def test_consumer_card_parameters():
    p = load_params("rtx3080")
    assert p["gpu"]["default_limit_w"] == 320.0 and p["gpu"]["slowdown_c"] == 83.0
    assert p["ntc.gpu"]["tau_s"] == 12.0 and "mos" in p["ntc.gpu"]["sense_nodes"]
    default_hs = load_params("default")["heatsink"]["heat_capacity_j_per_k"]
    assert abs(p["heatsink"]["heat_capacity_j_per_k"] - 2 * default_hs) < 1.0  # 305 J/K
    assert p["gpu"]["memory_temperature_supported"] is False  # GeForce: no NVML memory temp
    d = load_params("rtx3080_dusty")
    assert d["fans"]["flow_m3_per_s"] == p["fans"]["flow_m3_per_s"] / 2
    assert d["heatsink"]["to_air_forced_w_per_k"] == p["heatsink"]["to_air_forced_w_per_k"] / 2


def test_closed_loop_has_work_in_every_room():
    ceiling = 80.0  # slowdown 83 - the suite's 3 degC margin
    # 40 degC room: the minimum duty is far too little, about half duty is enough
    assert _steady("rtx3080", 40, 20).T[0] > ceiling
    assert _steady("rtx3080", 40, 50).T[0] < ceiling - 5
    # 20 degC room: the fans' minimum keeps the die under the ceiling
    assert _steady("rtx3080", 20, 20).T[0] < ceiling - 5
    # dusty, 40 degC: only high duty is enough, but it is enough
    assert _steady("rtx3080_dusty", 40, 70).T[0] > ceiling
    assert _steady("rtx3080_dusty", 40, 100).T[0] < ceiling - 3
    # the NTC beside the MOSFETs reads well below the die at load
    w = _steady("rtx3080", 40, 50)
    assert 8.0 < w.T[0] - w.ntc_c[0] < 14.0


def test_chassis_air_at_40_degc_stays_under_the_ambient_warning():
    # the amb probe sits in the chassis air: at the duty the die needs, a 40 degC
    # room must not reach the firmware's ambient warning (60 degC, device/config.py)
    from device.config import DEFAULTS

    warn_c = DEFAULTS["channels"][3]["warn_mc"] / 1000
    assert _steady("rtx3080", 40, 50).ntc_c[3] < warn_c - 5
    assert _steady("rtx3080_dusty", 40, 100).ntc_c[3] < warn_c - 5
    assert _steady("h200_2u", 40, 50, watts=650).ntc_c[3] < warn_c
