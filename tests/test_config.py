"""device/config.py: defaults, validation of every field, merge, flat keys, storage.

Runs under CPython and the real MicroPython (DUAL).
"""

import json
import os

from mpcompat import IS_MICROPYTHON, exists, raises, read_bytes, tmpdir, write_bytes

from device import config
from device.config import ConfigError
from protocol.crc import crc16

DUAL = True

SH_10K = [0.001129148, 0.000234125, 8.76741e-08]  # the classic 10 k NTC fit


# --- helpers ------------------------------------------------------------------------


def display(dotted):
    """'channels.2.crit_mc' -> 'channels[2].crit_mc' (how messages name a path)."""
    out = ""
    for p in dotted.split("."):
        if p.isdigit():
            out += "[" + p + "]"
        elif out:
            out += "." + p
        else:
            out = p
    return out


def _node_and_key(cfg, dotted):
    parts = dotted.split(".")
    node = cfg
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node[p]
    last = parts[-1]
    return node, (int(last) if last.isdigit() else last)


def set_at(cfg, dotted, value):
    node, key = _node_and_key(cfg, dotted)
    node[key] = value


def get_at(cfg, dotted):
    node, key = _node_and_key(cfg, dotted)
    return node[key]


def rejected(cfg, dotted, match=None):
    """Validate ``cfg``; it must fail naming ``dotted``. Returns the message."""
    with raises(ConfigError) as ctx:
        config.validate(cfg)
    msg = str(ctx.value)
    want = display(dotted) + ":"
    assert msg.startswith(want), (msg, want)
    assert ctx.value.path == dotted, (ctx.value.path, dotted)
    if match is not None:
        assert match in msg, (match, msg)
    return msg


def envelope(cfg, version=1, crc_delta=0):
    body = config.canonical(cfg)
    crc = crc16(body.encode()) + crc_delta
    return ('{"config":' + body + ',"crc":' + str(crc) + ',"version":' + str(version)
            + "}").encode()


def changed(dotted, value):
    cfg = config.defaults()
    set_at(cfg, dotted, value)
    return cfg


class FatFs:
    """os stand-in whose rename refuses an existing target, like FAT."""

    def __init__(self):
        self.renames = 0

    def rename(self, src, dst):
        if exists(dst):
            raise OSError(17)
        self.renames += 1
        os.rename(src, dst)

    def remove(self, path):
        os.remove(path)

    def stat(self, path):
        return os.stat(path)


class PowerCutFs(FatFs):
    """Every rename fails with EIO (power cuts proper: test_config_store.py)."""

    def rename(self, src, dst):
        raise OSError(5)


# --- defaults ----------------------------------------------------------------------------


def test_defaults_validate():
    config.validate(config.defaults())


def test_defaults_is_a_fresh_copy():
    a = config.defaults()
    a["pid"]["kp"] = 1
    a["channels"][0]["correction"].append(1.0)
    assert config.defaults()["pid"]["kp"] == 5000
    assert config.defaults()["channels"][0]["correction"] == []
    assert config.defaults() == config.defaults()
    assert config.defaults() is not config.defaults()
    assert config.defaults()["fans"][0] is not config.defaults()["fans"][1]


def test_the_schema_copies_agree_with_their_sources():
    """SCHEMA is one constant, in flash when frozen (device/config.py says why), so it
    writes out the values it shares with the catalog and the compiled floors."""
    from device import floors
    from protocol import catalog as C

    root = dict(config.SCHEMA[1])
    channels = root["channels"]
    assert channels[2] == channels[3] == len(C.CHANNELS)
    ch = dict(channels[1][1])
    assert ch["name"] == ("enum", C.CHANNELS)
    for key in ("setpoint_mc", "warn_mc", "crit_mc"):
        assert ch[key] == ("int", C.TEMP_MIN_MC, C.TEMP_MAX_MC), key
    ctl = dict(root["control"][1])
    assert ctl["mode"] == ("enum", C.FAN_MODES)
    assert ctl["host_timeout_ms"][2] == floors.HOST_TIMEOUT_MAX_MS
    assert dict(root["fans"][1][1])["stall_ms"][2] == floors.STALL_MAX_MS
    safety = [key for key, _ in root["safety"][1]]
    assert sorted(safety) == sorted(config.defaults()["safety"])
    assert sorted(root) == sorted(config.defaults())


def test_defaults_content():
    d = config.defaults()
    assert d["version"] == config.SCHEMA_VERSION == 1
    assert d["control"]["period_ms"] == 100
    assert [c["name"] for c in d["channels"]] == ["gpu", "vram", "mos", "amb"]
    assert [c["controlled"] for c in d["channels"]] == [True, True, True, False]
    for c in d["channels"]:
        assert c["setpoint_mc"] < c["warn_mc"] < c["crit_mc"], c
    assert d["safety"]["critical"] == 65535
    assert len(d["fans"]) == 2 and d["fans"][0]["ppr"] == 2
    assert d["ina226"]["addr"] == 0x40 and d["ina226"]["shunt_uohm"] == 1000
    assert d["watchdog_ms"] == 2000


def test_a_calibrated_channel_validates():
    cfg = config.defaults()
    cfg["channels"][0]["model"] = "sh"
    cfg["channels"][0]["sh"] = list(SH_10K)
    cfg["channels"][0]["correction"] = [-0.4, 0.002, 0, 1e-6]  # +3.3 degC at 150
    cfg["_comment"] = "rig 3, calibrated 2026-05-01"
    config.validate(cfg)


# --- every field rejects garbage -------------------------------------------------------

_INT_GARBAGE = ("x", "5", True, False, None, 1.5, [], {}, 10**9, -(10**9))
_BOOL_GARBAGE = (1, 0, "true", None, [], 1.0)
_STR_GARBAGE = ("nonsense", "", 1, None, True, ["gpu"], "AUTO ")
_SH_GARBAGE = ([1, 2], [0.1, 0.2, 0.3, 0.4], "x", 5, [True, 0.0, 0.0], ["a", "b", "c"],
               [float("inf"), 0.0, 0.0], {}, [2.0, 0.0, 0.0])
_POLY_GARBAGE = ("x", None, [1] * 9, ["a"], [True], [float("inf")], [float("nan")], [1e7], {},
                 [[1]])
_POINTS_GARBAGE = ([[30000, 1]], "x", None, [], [[30000 + i, 1] for i in range(17)],
                   [[30000, 1, 2], [40000, 2]], [["a", 1], [40000, 2]],
                   [[30000, 70000], [40000, 70000]], [[30000, True], [40000, 1]],
                   [[30000.0, 1], [40000, 2]], [[-60000, 1], [40000, 2]], [1, 2], [[1], [2]])


def _garbage_for(dotted, default):
    if type(default) is bool:
        return _BOOL_GARBAGE
    if type(default) is int:
        return _INT_GARBAGE + (float(default),)
    if type(default) is str:
        return _STR_GARBAGE
    if dotted.endswith(".sh"):
        return _SH_GARBAGE
    if dotted.endswith(".correction"):
        return _POLY_GARBAGE
    if dotted == "curve.points":
        return _POINTS_GARBAGE
    raise AssertionError("no garbage for " + dotted)


def test_every_leaf_rejects_garbage():
    cfg = config.defaults()
    flat = config.flatten(config.defaults())
    assert len(flat) >= 100, len(flat)
    cases = 0
    for dotted in sorted(flat):
        original = get_at(cfg, dotted)
        for bad in _garbage_for(dotted, original):
            set_at(cfg, dotted, bad)
            with raises(ConfigError) as ctx:
                config.validate(cfg)
            msg = str(ctx.value)
            assert msg.startswith(display(dotted)), (dotted, bad, msg)
            assert ctx.value.path.startswith(dotted), (dotted, bad, ctx.value.path)
            cases += 1
        set_at(cfg, dotted, original)
        config.validate(cfg)  # restored
    assert cases > 900, cases


def test_every_section_rejects_wrong_type():
    for section in ("control", "pid", "curve", "safety", "ina226"):
        for bad in ("x", 5, None, [], True):
            rejected(changed(section, bad), section, "expected an object")
    for section, n in (("channels", 4), ("fans", 2)):
        for bad in ("x", 5, None, {}, [None] * n):
            cfg = changed(section, bad)
            with raises(ConfigError) as ctx:
                config.validate(cfg)
            assert str(ctx.value).startswith(section), str(ctx.value)
    for bad in ("x", None, [config.defaults()], 5):
        with raises(ConfigError, match="config: expected an object"):
            config.validate(bad)


def _dict_nodes():
    """Dotted paths of every dict in defaults() ("" = the root), in a stable order."""
    out = [""]
    for dotted in sorted(config.flatten(config.defaults())):
        parts = dotted.split(".")
        for n in range(1, len(parts)):
            node = ".".join(parts[:n])
            if node not in out and type(get_at(config.defaults(), node)) is dict:
                out.append(node)
    return out


def test_unknown_keys_rejected_everywhere():
    nodes = _dict_nodes()
    assert len(nodes) == 1 + 6 + 4 + 2, nodes  # root, 6 sections, 4 channels, 2 fans
    for node in nodes:
        for key in ("bogus", "Kp", "_comment"):
            if node == "" and key == "_comment":
                continue  # allowed at the top level only
            cfg = config.defaults()
            target = cfg if node == "" else get_at(cfg, node)
            target[key] = 1
            dotted = key if node == "" else node + "." + key
            rejected(cfg, dotted, "unknown key")


def test_typo_message_lists_the_keys():
    msg = rejected(changed("pid.kq", 3), "pid.kq")
    assert msg == ("pid.kq: unknown key (typo?); pid has kp, ki, kd, kff, slew_pct_s, "
                   "d_filter_ms, slew_down_pct_min, deadband_mc, i_band_mc, die_sp_mc, "
                   "env_window_s, ff_tau_ms"), msg


def test_comment_must_be_text():
    cfg = config.defaults()
    cfg["_comment"] = 5
    rejected(cfg, "_comment", "expected text")
    cfg["_comment"] = "x" * 257
    rejected(cfg, "_comment")


def test_missing_keys_rejected_everywhere():
    count = 0
    for node in _dict_nodes():
        keys = list(config.defaults() if node == "" else get_at(config.defaults(), node))
        for key in keys:
            cfg = config.defaults()
            target = cfg if node == "" else get_at(cfg, node)
            del target[key]
            dotted = key if node == "" else node + "." + key
            rejected(cfg, dotted, "missing")
            count += 1
    assert count == 123, count  # 10 top-level + 6 + 60 + 12 + 2 + 12 + 7 + 6 + 8


def test_list_lengths():
    cfg = config.defaults()
    cfg["channels"] = cfg["channels"][:3]
    rejected(cfg, "channels", "expected a list of 4 items, got 3 items")
    cfg = config.defaults()
    cfg["channels"].append(config.defaults()["channels"][3])
    rejected(cfg, "channels", "got 5 items")
    for n in (1, 3):
        cfg = config.defaults()
        cfg["fans"] = [config.defaults()["fans"][0] for _ in range(n)]
        rejected(cfg, "fans", "expected a list of 2 items")
    rejected(changed("curve.points", [[30000, 1]]), "curve.points", "2..16 items, got 1")
    rejected(changed("channels.1.sh", [0.001, 0.0002]), "channels.1.sh", "3 items, got 2")
    rejected(changed("channels.2.correction", [0.0] * 9), "channels.2.correction", "0..8")


def test_exact_messages():
    msg = rejected(changed("pid.kp", "x"), "pid.kp")
    assert msg == "pid.kp: expected int 0..1000000, got 'x'", msg
    msg = rejected(changed("pid.kp", True), "pid.kp")
    assert msg == "pid.kp: expected int 0..1000000, got True", msg
    msg = rejected(changed("channels.2.crit_mc", 100000), "channels.2.crit_mc")
    assert msg == "channels[2].crit_mc: must be > warn_mc (110000), got 100000", msg
    msg = rejected(changed("control.mode", "fast"), "control.mode")
    assert msg == "control.mode: expected one of 'auto', 'manual', 'curve', got 'fast'", msg
    msg = rejected(changed("channels.0.ntc_low", 1), "channels.0.ntc_low")
    assert msg == "channels[0].ntc_low: expected true or false, got 1", msg
    msg = rejected(changed("curve.points", [[30000, 1], [40000, "x"]]), "curve.points.1.1")
    assert msg.startswith("curve.points[1][1]: expected int 0..65535"), msg


def test_range_boundaries():
    for dotted, lo, hi in (
        ("control.period_ms", 20, 1000),
        ("pid.kff", 0, 1000000),
        ("fans.1.ppr", 1, 4),
        ("ina226.addr", 0x40, 0x4F),
        ("curve.hysteresis_mc", 0, 20000),
        ("watchdog_ms", 1000, 8000),
    ):
        rejected(changed(dotted, lo - 1), dotted, "expected int")
        rejected(changed(dotted, hi + 1), dotted, "expected int")
    config.validate(changed("pid.kff", 0))
    config.validate(changed("pid.kff", 1000000))
    config.validate(changed("fans.1.ppr", 4))
    config.validate(changed("ina226.addr", 0x4F))


def test_int_enums():
    config.validate(changed("channels.0.oversample", 64))
    rejected(changed("channels.0.oversample", 3), "channels.0.oversample", "one of 1, 2, 4")
    config.validate(changed("ina226.avg", 1024))
    rejected(changed("ina226.avg", 2), "ina226.avg")
    rejected(changed("ina226.ct_us", 1000), "ina226.ct_us")


_CROSS = (
    # ((dotted, value), ...), path named, text in the message
    ((("control.telemetry_ms", 1050),), "control.telemetry_ms", "multiple of"),
    ((("control.telemetry_ms", 50),), "control.telemetry_ms", "multiple of"),
    ((("control.period_ms", 250), ("control.telemetry_ms", 1000), ("watchdog_ms", 1000)),
     "watchdog_ms", "5 x"),
    ((("channels.0.name", "vram"),), "channels.0.name", "order is fixed"),
    ((("channels.3.setpoint_mc", 60000),), "channels.3.warn_mc", "> setpoint_mc (60000)"),
    ((("channels.3.setpoint_mc", 70000),), "channels.3.setpoint_mc", "10000..60000 for amb"),
    ((("channels.0.setpoint_mc", 15000),), "channels.0.setpoint_mc", "for gpu"),
    ((("channels.0.warn_mc", 70000),), "channels.0.warn_mc", "> setpoint_mc (70000)"),
    ((("channels.1.crit_mc", 90000),), "channels.1.crit_mc", "> warn_mc (90000)"),
    ((("channels.0.crit_mc", 101000),), "channels.0.crit_mc", "hard ceiling for gpu"),
    ((("channels.3.crit_mc", 71000),), "channels.3.crit_mc", "hard ceiling for amb"),
    ((("channels.1.model", "sh"),), "channels.1.sh", "required"),
    ((("channels.1.sh", [-0.001, 0.0002, 0.0]),), "channels.1.sh", "not an NTC curve"),
    ((("channels.1.sh", [0.001129148, -0.000234125, 8.76741e-08]),), "channels.1.sh",
     "not an NTC curve"),
    ((("channels.0.controlled", False), ("channels.1.controlled", False),
      ("channels.2.controlled", False)), "channels", "at least one"),
    ((("curve.points", [[30000, 1000], [30000, 2000]]),), "curve.points.1.0", "ascend"),
    ((("curve.points", [[30000, 2000], [40000, 1000]]),), "curve.points.1.1", "must not fall"),
    ((("fans.1.kick_duty", 100),), "fans.1.kick_duty",
     "must be >= 45875 (compiled floor of fan model pwm4, 70 %), got 100"),
    ((("fans.1.min_duty", 60000), ("fans.1.kick_duty", 50000)), "fans.1.kick_duty",
     ">= min_duty (60000)"),
    ((("fans.0.stall_ms", 500),), "fans.0.stall_ms", "> kick_ms (500)"),
    ((("safety.critical", 65534),), "safety.critical", "cannot be lowered"),
    ((("safety.boot", 30000),), "safety.boot", ">= 45875 (compiled floor, 70 %), got 30000"),
    ((("safety.over_temp", 32767),), "safety.over_temp", ">= 52428 (compiled floor, 80 %)"),
    ((("safety.host_lost", 10000),), "safety.host_lost", ">= 26214 (compiled floor, 40 %)"),
    ((("fans.1.min_duty", 30000),), "safety.host_lost", "fans[1].min_duty (30000)"),
    ((("safety.min_manual_duty", 40000),), "control.manual_duty", "safety.min_manual_duty"),
    ((("ina226.shunt_uohm", 2000), ("ina226.max_current_ma", 50000)), "ina226.max_current_ma",
     "shunt range"),
    ((("ina226.shunt_uohm", 2000), ("ina226.max_current_ma", 1000)), "ina226.max_current_ma",
     "calibration value"),
)


def test_cross_field_rules():
    for changes, dotted, match in _CROSS:
        cfg = config.defaults()
        for key, value in changes:
            set_at(cfg, key, value)
        try:
            config.validate(cfg)
        except ConfigError:
            pass
        else:
            raise AssertionError("accepted: " + repr(changes))
        rejected(cfg, dotted, match)


def test_cross_field_edges_that_are_fine():
    for changes in (
        (("control.telemetry_ms", 100),),
        (("control.period_ms", 250), ("control.telemetry_ms", 1000), ("watchdog_ms", 1250)),
        (("control.mode", "manual"),),
        (("channels.3.controlled", True), ("channels.0.controlled", False)),
        # every floor exactly at its compiled minimum (device/floors.py)
        (("fans.0.kick_duty", 45875), ("fans.0.kick_ms", 300), ("fans.1.kick_duty", 45875)),
        (("safety.boot", 45875), ("safety.host_lost", 26214), ("safety.sensor_fault", 52428),
         ("safety.over_temp", 52428), ("safety.min_manual_duty", 19661),
         ("control.manual_duty", 19661)),
        # 2 mOhm: 40960 mA is 81920 uV, exactly the shunt full scale; 2561 mA: CAL 32755
        (("ina226.shunt_uohm", 2000), ("ina226.max_current_ma", 40960)),
        (("ina226.shunt_uohm", 2000), ("ina226.max_current_ma", 2561)),
        (("channels.1.model", "sh"), ("channels.1.sh", [0.001129148, 0.000234125, 0])),
    ):
        cfg = config.defaults()
        for key, value in changes:
            set_at(cfg, key, value)
        config.validate(cfg)
    # 2560 mA * 2000 uohm = 5.12 mV: CAL 32768, one past the 15-bit register
    cfg = changed("ina226.shunt_uohm", 2000)
    set_at(cfg, "ina226.max_current_ma", 2560)
    rejected(cfg, "ina226.max_current_ma", "calibration value 32768")


# --- merge (config_set) ---------------------------------------------------------------------


def test_merge_dotted_keys():
    base = config.defaults()
    new = config.merge(base, {"pid.kp": 4000, "channels.1.setpoint_mc": 75000,
                              "curve.points": [[40000, 20000], [80000, 65535]]})
    assert new["pid"]["kp"] == 4000
    assert new["channels"][1]["setpoint_mc"] == 75000
    assert new["curve"]["points"] == [[40000, 20000], [80000, 65535]]
    assert base == config.defaults()  # untouched
    assert new["pid"]["ki"] == base["pid"]["ki"]


def test_merge_nested():
    base = config.defaults()
    new = config.merge(base, {"pid": {"kp": 4000, "kd": 0},
                              "channels": {"2": {"warn_mc": 105000}},
                              "fans": {"1": {"min_duty": 15000}}})
    assert new["pid"]["kp"] == 4000 and new["pid"]["kd"] == 0
    assert new["pid"]["ki"] == 200  # partial: the rest kept
    assert new["channels"][2]["warn_mc"] == 105000
    assert new["fans"][1]["min_duty"] == 15000 and new["fans"][0]["min_duty"] == 13107
    assert base == config.defaults()


def test_merge_deeper_key_wins_and_lists_replace_whole():
    base = config.defaults()
    new = config.merge(base, {"pid": {"kp": 1}, "pid.kp": 2})
    assert new["pid"]["kp"] == 2
    sh = list(SH_10K)
    new = config.merge(base, {"channels.0.model": "sh", "channels.0.sh": sh})
    assert new["channels"][0]["sh"] == SH_10K
    sh[0] = 5.0  # the merged config does not share the caller's list
    assert new["channels"][0]["sh"] == SH_10K
    new = config.merge(new, {"channels.0": {"model": "beta", "sh": None}})
    assert new["channels"][0]["sh"] is None


def test_merge_accepts_comment():
    new = config.merge(config.defaults(), {"_comment": "lab rig 2"})
    assert new["_comment"] == "lab rig 2"


def test_merge_errors_leave_base_unchanged():
    base = config.defaults()
    before = config.canonical(base)
    for changes, where in (
        ({"pid.kp": -1}, "pid.kp:"),
        ({"pid.kq": 1}, "pid.kq: unknown key"),
        ({"pidx.kp": 1}, "pidx: unknown key"),
        ({"channels.7.beta": 3950}, "channels[7]: no such item"),
        ({"channels.x.beta": 3950}, "channels.x: no such item"),
        ({"pid.kp.x": 1}, "pid.kp: is a value"),
        ({"channels.2.crit_mc": 100000}, "channels[2].crit_mc: must be > warn_mc"),
        # the first change is fine, the second is not: neither is applied
        ({"pid.ki": 300, "safety.critical": 60000}, "safety.critical"),
        ({"channels": [config.defaults()["channels"][0]]}, "channels: expected a list of 4"),
        ({"": 1}, "non-empty"),
        ({5: 1}, "non-empty text"),
    ):
        with raises(ConfigError, match=where):
            config.merge(base, changes)
        assert config.canonical(base) == before, changes
    with raises(ConfigError, match="changes must be an object"):
        config.merge(base, [("pid.kp", 1)])


def test_merge_error_path_is_the_dotted_key():
    with raises(ConfigError) as ctx:
        config.merge(config.defaults(), {"channels.2.crit_mc": 100000})
    assert ctx.value.path == "channels.2.crit_mc", ctx.value.path


# --- flat keys and sections (config_get) ---------------------------------------------


def test_flatten_shape():
    flat = config.flatten(config.defaults())
    assert flat["pid.kp"] == 5000
    assert flat["channels.0.beta"] == 3950
    assert flat["channels.3.name"] == "amb"
    assert flat["channels.0.sh"] is None
    assert flat["channels.0.correction"] == []
    assert flat["curve.points"] == config.defaults()["curve"]["points"]
    assert flat["fans.1.ppr"] == 2
    assert flat["watchdog_ms"] == 2000
    for key in flat:
        assert len(key) <= 32, key  # fits the nack 'field'


def test_unflatten_round_trip():
    cfg = config.defaults()
    cfg["channels"][0]["sh"] = list(SH_10K)
    cfg["_comment"] = "x"
    assert config.unflatten(config.flatten(cfg)) == cfg
    # a config_set map built from flat keys merges back to the same config
    assert config.merge(config.defaults(), config.flatten(cfg)) == cfg


def test_get_section():
    cfg = config.defaults()
    pid = config.get_section(cfg, "pid")
    assert pid == {"pid.kp": 5000, "pid.ki": 200, "pid.kd": 0, "pid.kff": 100,
                   "pid.slew_pct_s": 20, "pid.d_filter_ms": 2000,
                   "pid.slew_down_pct_min": 54, "pid.deadband_mc": 1000,
                   "pid.i_band_mc": 8000, "pid.die_sp_mc": 100000, "pid.env_window_s": 90,
                   "pid.ff_tau_ms": 300000}, pid
    ch2 = config.get_section(cfg, "channels.2")
    assert ch2["channels.2.crit_mc"] == 125000 and len(ch2) == 15
    assert config.get_section(cfg, "watchdog_ms") == {"watchdog_ms": 2000}
    assert config.get_section(cfg, "pid.kp") == {"pid.kp": 5000}
    assert len(config.get_section(cfg, "channels")) == 60
    # every section's keys go straight back into config_set
    assert config.merge(cfg, config.get_section(cfg, "safety")) == cfg
    for bad in ("nope", "channels.4", "pid.kp.x", "", None):
        with raises(ConfigError):
            config.get_section(cfg, bad)
    with raises(ConfigError, match="nope: no such section; sections are version, control"):
        config.get_section(cfg, "nope")
    with raises(ConfigError, match="ask for channels.0 .. channels.3"):
        config.get_section(cfg, "channels", limit=20)
    assert len(config.get_section(cfg, "channels", limit=None)) == 60


def test_pages_cover_everything_and_fit():
    cfg = config.defaults()
    cfg["_comment"] = "hello"
    names = config.pages(cfg)
    assert names[0] == "version" and names[-1] == "_comment", names
    joined = {}
    for name in names:
        part = config.get_section(cfg, name)
        assert len(part) <= config.MAX_ENTRIES
        joined.update(part)
    assert joined == config.flatten(cfg)
    small = config.pages(cfg, limit=20)
    assert "channels.0" in small and "channels" not in small, small
    for name in small:
        assert len(config.get_section(cfg, name, limit=20)) <= 20, name


# --- canonical JSON ------------------------------------------------------------------------


def test_canonical_literal():
    value = {"b": [1, True, None], "a": {"z": "\u00e9\n\"", "y": -2}, "c": 0.5, "d": ""}
    text = config.canonical(value)
    assert text == '{"a":{"y":-2,"z":"\\u00e9\\n\\""},"b":[1,true,null],"c":0.5,"d":""}', text
    assert json.loads(text) == value
    text = config.canonical({"sh": SH_10K, "n": [-55000, 65535]})
    assert text == '{"n":[-55000,65535],"sh":[0.001129148,0.000234125,8.76741e-08]}', text


def test_file_text_is_the_canonical_envelope():
    cfg = config.defaults()
    text = config.encode_file(cfg)
    body = config.canonical(cfg)
    assert text == '{"config":' + body + ',"crc":' + str(crc16(body.encode())) + \
        ',"version":1,"writes":0}\n'
    assert config.encode_file(cfg, 7).endswith(',"version":1,"writes":7}\n')
    doc = json.loads(text)
    assert config.canonical(doc) + "\n" == text  # the whole file is canonical JSON
    assert doc["config"] == cfg
    assert crc16(b"123456789") == 0x29B1


# --- storage -------------------------------------------------------------------------------


def test_save_load_round_trip():
    d = tmpdir()
    cfg = config.merge(config.defaults(), {"pid.kp": 4321, "channels.0.model": "sh",
                                         "channels.0.sh": list(SH_10K),
                                         "channels.0.correction": [-0.25, 0.01, 3e-05],
                                         "_comment": "caf\u00e9"})
    assert config.save(cfg, d) is True
    assert read_bytes(d + "/config.json") == config.encode_file(cfg, 1).encode()
    assert not exists(d + "/config.json.tmp")
    got, status, detail = config.load(d)
    assert status == "ok", (status, detail)
    assert got == cfg
    assert got["channels"][0]["sh"] == SH_10K
    # saving again replaces the file (rename over an existing target)
    cfg2 = config.merge(got, {"pid.kp": 1234})
    config.save(cfg2, d)
    got, status, _ = config.load(d)
    assert status == "ok" and got["pid"]["kp"] == 1234
    assert sorted(os.listdir(d)) == ["config.json", "config.prev.json"]


def test_save_to_root_style_dir():
    d = tmpdir()
    config.save(config.defaults(), d + "/")  # e.g. fs_dir "/" on a Pico
    assert exists(d + "/config.json")


def test_save_refuses_invalid_and_writes_nothing():
    d = tmpdir()
    config.save(config.defaults(), d)
    before = read_bytes(d + "/config.json")
    bad = changed("safety.critical", 1000)
    with raises(ConfigError, match="safety.critical"):
        config.save(bad, d)
    assert read_bytes(d + "/config.json") == before
    assert sorted(os.listdir(d)) == ["config.json"]


def test_load_missing():
    d = tmpdir()
    cfg, status, detail = config.load(d)
    assert status == "missing", status
    assert cfg == config.defaults()
    assert "factory defaults" in detail
    cfg["pid"]["kp"] = 1  # a copy, not the factory config
    assert config.defaults()["pid"]["kp"] == 5000
    assert os.listdir(d) == []


def _invalid_cfg():
    cfg = config.defaults()
    cfg["pid"]["kp"] = -1
    return cfg


def _corrupt_variants():
    good = config.encode_file(config.defaults()).encode()
    no_crc = config.canonical({"config": config.defaults(), "version": 1}).encode()
    return (
        ("truncated", good[: len(good) // 2], "not valid JSON"),
        ("truncated by one byte", good[:-2], "not valid JSON"),
        ("random bytes", bytes([0x8F, 0xFF, 0x00, 0x13, 0xC3, 0x28, 0xA0, 0xA1] * 8), "UTF-8"),
        ("binary but UTF-8", b"\x00\x01\x02 \x7f", "not valid JSON"),
        ("empty", b"", "empty"),
        ("whitespace", b" \n", "not valid JSON"),
        ("a list", b"[1, 2, 3]", "holds list"),
        ("a number", b"42", "holds int"),
        ("bad CRC", envelope(config.defaults(), crc_delta=1), "CRC mismatch"),
        ("flipped value", good.replace(b'"kp":5000', b'"kp":5001'), "CRC mismatch"),
        ("no crc", no_crc, "int version, int crc"),
        ("crc as text", b'{"config":{},"crc":"x","version":1}', "int version, int crc"),
        ("extra key", good.replace(b'"crc":', b'"_":0,"crc":'), "unknown key"),
        ("bare config", config.canonical(config.defaults()).encode(), "unknown key"),
        ("CRC ok, invalid values", envelope(_invalid_cfg()), "pid.kp"),
        ("newer schema", envelope(config.defaults(), version=2), "newer than this firmware"),
        ("no migration", envelope(config.defaults(), version=0), "no migration"),
        ("huge", b" " * (config.MAX_FILE_BYTES + 1), "bytes"),
    )


def test_load_corrupt_variants():
    for name, data, match in _corrupt_variants():
        d = tmpdir()
        write_bytes(d + "/config.json", data)
        cfg, status, detail = config.load(d)
        assert status == "corrupt", (name, status, detail)
        assert cfg == config.defaults(), name
        assert match in detail, (name, match, detail)
        assert "kept as config.json.bad" in detail, (name, detail)
        assert read_bytes(d + "/config.json.bad") == data, name
        assert not exists(d + "/config.json"), name
        # the next boot sees no file: defaults again, but no second corrupt event
        _, status, _ = config.load(d)
        assert status == "missing", (name, status)


def test_corrupt_replaces_an_older_bad_file():
    for fs in (os, FatFs()):
        d = tmpdir()
        write_bytes(d + "/config.json.bad", b"old")
        write_bytes(d + "/config.json", b"new garbage")
        _, status, _ = config.load(d, fs=fs)
        assert status == "corrupt"
        assert read_bytes(d + "/config.json.bad") == b"new garbage"


def test_load_accepts_a_reformatted_file_with_the_canonical_crc():
    d = tmpdir()
    cfg = config.merge(config.defaults(), {"pid.kp": 4000})
    body = config.canonical(cfg)
    # Key order and whitespace changed (a host tool, or a human with an editor).
    crc = str(crc16(body.encode()))
    text = '{\n  "version": 1,\n  "crc": ' + crc + ',\n  "config": ' + body.replace(",", ", ") \
        + "\n}\n"
    write_bytes(d + "/config.json", text.encode())
    got, status, detail = config.load(d)
    assert status == "ok", detail
    assert got == cfg


def test_interrupted_save_tmp_left_beside_a_good_file():
    for leftover in (b'{"config":{"chan', config.encode_file(changed("pid.kp", 9)).encode()):
        d = tmpdir()
        config.save(config.defaults(), d)
        write_bytes(d + "/config.json.tmp", leftover)
        cfg, status, _ = config.load(d)
        assert status == "ok"
        assert cfg == config.defaults()  # the unfinished save never took effect
        assert sorted(os.listdir(d)) == ["config.json"]


def test_interrupted_first_save_truncated_tmp_only():
    d = tmpdir()
    write_bytes(d + "/config.json.tmp", config.encode_file(config.defaults()).encode()[:100])
    cfg, status, detail = config.load(d)
    assert status == "missing", (status, detail)
    assert "unfinished" in detail
    assert cfg == config.defaults()
    assert os.listdir(d) == []


def test_fat_window_complete_tmp_only_is_recovered():
    d = tmpdir()
    want = changed("pid.kp", 777)
    write_bytes(d + "/config.json.tmp", config.encode_file(want).encode())
    cfg, status, detail = config.load(d)
    assert status == "ok", (status, detail)
    assert "recovered" in detail
    assert cfg == want
    assert sorted(os.listdir(d)) == ["config.json"]
    assert config.load(d)[0] == want


def test_save_on_a_fat_like_filesystem():
    d = tmpdir()
    fs = FatFs()
    config.save(config.defaults(), d, fs=fs)
    config.save(changed("pid.kp", 42), d, fs=fs)  # current -> prev, tmp -> current
    config.save(changed("pid.kp", 43), d, fs=fs)  # prev exists: remove, then rename
    assert fs.renames == 5
    cfg, status, _ = config.load(d, fs=fs)
    assert status == "ok" and cfg["pid"]["kp"] == 43
    assert sorted(os.listdir(d)) == ["config.json", "config.prev.json"]
    assert config.decode_file(read_bytes(d + "/config.prev.json"))[0]["pid"]["kp"] == 42


def test_rename_error_keeps_the_old_file():
    d = tmpdir()
    config.save(config.defaults(), d)
    with raises(OSError):
        config.save(changed("pid.kp", 42), d, fs=PowerCutFs())
    assert not exists(d + "/config.json.tmp")  # cleaned up; the caller nacks
    cfg, status, _ = config.load(d)
    assert status == "ok" and cfg == config.defaults()
    assert sorted(os.listdir(d)) == ["config.json"]


def test_migration_hook():
    d = tmpdir()
    old = config.defaults()
    old["version"] = 0
    del old["watchdog_ms"]  # pretend v0 had no watchdog setting
    write_bytes(d + "/config.json", envelope(old, version=0))

    def v0_to_v1(cfg):
        cfg["version"] = 1
        cfg["watchdog_ms"] = 3000
        return cfg

    config._MIGRATIONS[0] = v0_to_v1
    try:
        cfg, status, detail = config.load(d)
    finally:
        del config._MIGRATIONS[0]
    assert status == "ok", (status, detail)
    assert "migrated from schema version 0" in detail
    assert cfg["watchdog_ms"] == 3000 and cfg["version"] == 1


def test_factory_reset():
    d = tmpdir()
    config.save(changed("pid.kp", 42), d)
    config.save(changed("pid.kp", 43), d)
    assert exists(d + "/config.prev.json")
    write_bytes(d + "/config.json.tmp", b"x")
    write_bytes(d + "/config.json.bad", b"y")
    cfg = config.factory_reset(d)
    assert cfg == config.defaults()
    assert sorted(os.listdir(d)) == ["config.json.bad"]  # kept for diagnosis
    assert config.load(d)[1] == "missing"
    config.factory_reset(d)  # nothing to delete: fine


def test_os_rename_replaces_an_existing_file():
    # What save() relies on (littlefs and POSIX; the unix port is POSIX).
    d = tmpdir()
    write_bytes(d + "/a", b"new")
    write_bytes(d + "/b", b"old")
    os.rename(d + "/a", d + "/b")
    where = "micropython" if IS_MICROPYTHON else "cpython"
    assert read_bytes(d + "/b") == b"new", where
    assert not exists(d + "/a"), where


# --- compiled floors (device/floors.py): config may raise them, never lower them ------

from device import floors  # noqa: E402

_SAFETY_FLOOR = {}
for _key, _floor in floors.SAFETY_MINIMUMS:
    _SAFETY_FLOOR[_key] = _floor
_MODEL = floors.fan_model(None)
_FAN_FLOOR = (("min_duty", _MODEL[floors.FM_MIN_SPIN]), ("kick_duty", _MODEL[floors.FM_KICK]),
              ("kick_ms", _MODEL[floors.FM_KICK_MS]))


def test_defaults_meet_the_compiled_floors():
    d = config.defaults()
    assert sorted(_SAFETY_FLOOR) == sorted(d["safety"])
    for key in _SAFETY_FLOOR:
        assert d["safety"][key] >= _SAFETY_FLOOR[key], key
    for fan in d["fans"]:
        for key, floor in _FAN_FLOOR:
            assert fan[key] >= floor, key


def test_safety_floors_cannot_be_zeroed():
    # Reproduction: `safety.min_manual_duty 0` and `safety.host_lost 0` were accepted.
    msg = rejected(changed("safety.host_lost", 0), "safety.host_lost")
    assert msg == "safety.host_lost: must be >= 26214 (compiled floor, 40 %), got 0", msg
    msg = rejected(changed("safety.min_manual_duty", 0), "safety.min_manual_duty")
    assert msg == ("safety.min_manual_duty: must be >= 19661 (compiled floor, 30 %), "
                   "got 0"), msg
    for key in _SAFETY_FLOOR:
        floor = _SAFETY_FLOOR[key]
        for bad in (0, 1, floor // 2, floor - 1):
            if key == "critical":
                rejected(changed("safety." + key, bad), "safety." + key, "cannot be lowered")
                continue
            rejected(changed("safety." + key, bad), "safety." + key,
                     f"must be >= {floor} (compiled floor, ")
        # through config_set too: the base is untouched
        with raises(ConfigError, match="compiled floor"):
            config.merge(config.defaults(), {"safety." + key: 0} if key != "critical"
                         else {"safety.critical": 65535, "safety.boot": 0})


def test_fan_floors_cannot_be_zeroed():
    # Reproduction: `fans.*.min_duty 0`, `kick_duty 0` (and kick_ms 0) were accepted.
    msg = rejected(changed("fans.0.min_duty", 0), "fans.0.min_duty")
    assert msg == ("fans[0].min_duty: must be >= 13107 (compiled floor of fan model pwm4, "
                   "20 %), got 0"), msg
    msg = rejected(changed("fans.1.kick_duty", 0), "fans.1.kick_duty")
    assert msg == ("fans[1].kick_duty: must be >= 45875 (compiled floor of fan model pwm4, "
                   "70 %), got 0"), msg
    msg = rejected(changed("fans.1.kick_ms", 0), "fans.1.kick_ms")
    assert msg == "fans[1].kick_ms: must be >= 300 (compiled floor of fan model pwm4), got 0", msg
    for i in (0, 1):
        for key, floor in _FAN_FLOOR:
            dotted = f"fans.{i}.{key}"
            for bad in (0, floor - 1):
                rejected(changed(dotted, bad), dotted, f"must be >= {floor} (compiled floor")
            with raises(ConfigError, match="compiled floor"):
                config.merge(config.defaults(), {"fans": {str(i): {key: 0}}})


def test_config_may_raise_every_floor():
    cfg = config.defaults()
    for fan in cfg["fans"]:
        fan["min_duty"] = 30000
        fan["kick_duty"] = 65535
        fan["kick_ms"] = 2000
    for key in cfg["safety"]:
        cfg["safety"][key] = 65535
    cfg["control"]["manual_duty"] = 65535
    config.validate(cfg)
    # every duty from each floor up is accepted, everything below refused
    for key in _SAFETY_FLOOR:
        floor = _SAFETY_FLOOR[key]
        for v in range(0, 65536, 4369):
            cfg = changed("safety." + key, v)
            if key == "min_manual_duty":
                cfg["control"]["manual_duty"] = 65535
            ok = v >= floor and (key != "critical" or v == 65535)
            try:
                config.validate(cfg)
                accepted = True
            except ConfigError:
                accepted = False
            assert accepted == ok, (key, v)


def test_fault_floor_minimum_still_holds_if_the_compiled_floors_fall():
    saved = floors.SAFETY_MINIMUMS
    floors.SAFETY_MINIMUMS = (("boot", 0),)  # a board with lower floors: the second line
    try:
        rejected(changed("safety.boot", 30000), "safety.boot",
                 ">= 32768 (hard minimum of a fault floor), got 30000")
    finally:
        floors.SAFETY_MINIMUMS = saved
    rejected(changed("safety.boot", 30000), "safety.boot", "compiled floor")


# --- calibration band: a correction cannot hide a hot sensor -------------------------------


def test_correction_cannot_hide_a_hot_sensor():
    # Reproduction: `channels.N.correction [-40]` (40 degC colder) was accepted.
    for i in range(4):
        dotted = f"channels.{i}.correction"
        msg = rejected(changed(dotted, [-40]), dotted)
        assert msg == (display(dotted) + ": moves the reading by -40 degC at -20 degC, more "
                       "than the compiled calibration band of +-5 degC (checked every degC "
                       "from -20 to 150)"), msg
        with raises(ConfigError, match="calibration band"):
            config.merge(config.defaults(), {dotted: [-40]})


def test_correction_band_names_the_worst_temperature():
    for corr, text in (
        ([0, 0.1], "by 15 degC at 150 degC"),  # 10 % gain error: worst at the hot end
        ([-5.5, 0.01], "by -5.7 degC at -20 degC"),
        ([-7.5, 0.1], "by -9.5 degC at -20 degC"),
        ([5.001], "by 5.001 degC at -20 degC"),
        ([0.25, 0, -0.0004], "by -8.75 degC at 150 degC"),
        ([1000000], "by 1000000 degC at -20 degC"),  # 6. the schema allowed it
        ([0, 0, 0, 0, 0, 0, 0, 1000000], "by more than 1000000 degC at 150 degC"),
        ([0, 0, 0, 0, 0, 0, 0, -1000000], "by more than 1000000 degC at 150 degC"),
    ):
        rejected(changed("channels.0.correction", corr), "channels.0.correction", text)


def test_correction_inside_the_band_is_accepted():
    for corr in ([], [5.0], [-5.0], [5], [0.5, 0.01], [-0.4, 0.002, 0, 1e-6],
                 [2.0, 0.0, -0.0003]):  # +2 at 0 degC, -4.75 at 150
        config.validate(changed("channels.1.correction", corr))


def test_a_stored_file_with_a_hiding_correction_is_corrupt():
    d = tmpdir()
    write_bytes(d + "/config.json", envelope(changed("channels.0.correction", [-40])))
    cfg, status, detail = config.load(d)
    assert status == "corrupt" and cfg == config.defaults(), (status, detail)
    assert "calibration band" in detail, detail


def test_filter_choices_are_what_the_ntc_driver_takes():
    # 6. the schema's "none" is no filter: the app passes None to the driver.
    from device.drivers.ntc import NTC

    class Adc:
        def read_u16(self):
            return 30000

    spec = dict(dict(config.SCHEMA[1])["channels"][1][1])["filter"]
    assert spec == ("enum", ("median5", "ema", "none")), spec
    for choice in spec[1]:
        ch = changed("channels.0.filter", choice)["channels"][0]
        config.validate(changed("channels.0.filter", choice))
        ntc = NTC.from_config(Adc(), ch, filter=None if choice == "none" else choice)
        assert ntc.read_mc() != NTC.INVALID, choice


# --- deep nesting: no walk over an untrusted value recurses without bound -------------------


def nested_lists(n, leaf=1):
    v = leaf
    for _ in range(n):
        v = [v]
    return v


def nested_dicts(n, key="x"):
    v = 1
    for _ in range(n):
        v = {key: v}
    return v


def test_merge_refuses_deep_nesting():
    # Reproduction: 100 nested lists in a config_set crashed merge with RuntimeError
    # (maximum recursion depth) under MicroPython, 1000 under CPython.
    base = config.defaults()
    before = config.canonical(base)
    for n in (7, 100, 1000):
        for changes, path in (
            ({"pid.kp": nested_lists(n)}, "pid.kp"),
            ({"channels.0.correction": nested_lists(n)}, "channels.0.correction"),
            ({"pid": nested_dicts(n)}, "pid"),
            ({"channels": {"0": {"sh": nested_lists(n)}}}, "channels"),
            ({"fans": nested_dicts(n, "0")}, "fans"),
        ):
            with raises(ConfigError) as ctx:
                config.merge(base, changes)
            assert str(ctx.value) == display(path) + ": nested deeper than 6 levels", (
                n, str(ctx.value))
            assert ctx.value.path == path
    assert config.canonical(base) == before


def test_merge_accepts_the_nesting_the_schema_needs():
    new = config.merge(config.defaults(), {
        "channels": {"0": {"correction": [0.5], "sh": None}},
        "curve": {"points": [[30000, 13107], [85000, 65535]]},
    })
    assert new["channels"][0]["correction"] == [0.5]
    # 6 levels in the value is still only "wrong type", with the usual message
    rejected(changed("channels.0.correction", nested_lists(5, 0.0)),
             "channels.0.correction.0", "expected a finite number")
    with raises(ConfigError, match="pid.kp: expected int"):
        config.merge(config.defaults(), {"pid.kp": nested_lists(6)})


def test_validate_reports_deep_values_without_recursing():
    for n in (100, 1000):
        for dotted in ("pid.kp", "channels.0.correction", "curve.points.0.0",
                       "control.mode", "_comment"):
            cfg = changed(dotted, nested_lists(n)) if dotted != "_comment" else \
                config.defaults()
            if dotted == "_comment":
                cfg["_comment"] = nested_lists(n)
            with raises(ConfigError) as ctx:
                config.validate(cfg)
            assert "a list nested deeper than 6 levels" in str(ctx.value), str(ctx.value)
        cfg = config.defaults()
        cfg["pid"]["kp"] = nested_dicts(n)
        rejected(cfg, "pid.kp", "got a dict nested deeper than 6 levels")


def test_flatten_and_unflatten_are_depth_bounded():
    for n in (100, 1000):
        with raises(ConfigError, match="nested deeper than 6 levels"):
            config.flatten(nested_dicts(n))
        with raises(ConfigError, match="nested deeper than 6 levels"):
            config.unflatten({".".join(["a"] * n): 1})
        deep = nested_lists(n)
        assert config.flatten({"a": deep})["a"] is deep  # a list of values is one leaf
    assert config.unflatten({"a.b.c.d.e.f": 1})["a"]["b"]["c"]["d"]["e"]["f"] == 1
