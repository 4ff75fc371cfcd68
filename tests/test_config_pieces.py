"""Config commands in small pieces: what config_get sends and what config_save writes
and compares, built without the whole text or every page in RAM (docs/firmware.md,
"Budget on ARM"), must be what the whole-text code gave, byte for byte.

DUAL: runs on CPython and under MicroPython (the unix port and qemu-arm).
"""

from fakehal import FakeHal, run, signer_for
from mpcompat import IS_MICROPYTHON, exists, raises, read_bytes, tmpdir, write_bytes

from device import commands, config
from device.app import App
from device.cfg import writer
from device.control import pid as pid_mod
from protocol import catalog as C
from protocol import frame, jsonparse
from protocol.crc import INIT, crc16
from protocol.errors import OversizeError
from protocol.message import FMT_CBOR

DUAL = True
MPY_TIMEOUT = 600


def _big_config():
    """A config whose pages do not fit one frame: calibrated channels (floats),
    corrections, 16 curve points, a comment."""
    cfg = config.defaults()
    for i in range(4):
        ch = cfg["channels"][i]
        ch["model"] = "sh"
        ch["sh"] = [0.0011279 + i * 1e-7, 0.00023429, 8.7298e-08]
        ch["correction"] = [0.5, -0.01, 0.00002 * (i + 1)]
    cfg["curve"]["points"] = [[20000 + 5000 * i, 13107 + 3276 * i] for i in range(16)]
    cfg["_comment"] = "rack 4, slot 2 \u00b0C"
    config.validate(cfg)
    return cfg


def _configs():
    return (config.defaults(), _big_config())


# --- the canonical text in pieces -------------------------------------------------


def test_pieces_join_to_the_canonical_text():
    for cfg in _configs():
        assert "".join(list(config._pieces(cfg))) == config.canonical(cfg)
    for v in ({}, [], [[]], {"a": {}}, [1, [2, {"b": None}]], "x", 1.5, None, True):
        assert "".join(list(config._pieces(v))) == config.canonical(v), v


def test_the_crc_starts_as_protocol_crcs():
    if not IS_MICROPYTHON:  # a const(): not a module attribute there
        assert config._CRC_INIT == INIT


def test_the_saved_file_is_encode_file_byte_for_byte():
    for cfg in _configs():
        d = tmpdir()
        assert config.save(cfg, d) is True
        assert read_bytes(d + "/config.json") == config.encode_file(cfg, 1).encode()
        cfg2 = config.merge(cfg, {"pid.kp": 4321})
        assert config.save(cfg2, d) is True
        assert read_bytes(d + "/config.json") == config.encode_file(cfg2, 2).encode()
        assert read_bytes(d + "/config.prev.json") == config.encode_file(cfg, 1).encode()


def test_a_short_write_buffer_writes_the_same_file():
    # written in parts of about 256 bytes
    class Sink:
        def __init__(self):
            self.parts = []

        def write(self, b):
            self.parts.append(bytes(b))

    for cfg in _configs():
        sink = Sink()
        config._write_file(sink, cfg, 7)
        assert b"".join(sink.parts) == config.encode_file(cfg, 7).encode()
        assert len(sink.parts) > 4 and max([len(p) for p in sink.parts]) < 512


# --- is_saved against the whole-file rule -------------------------------------------


def _holds_whole(data, cfg):
    """The rule as the whole-text code applied it: the file parses as a JSON object
    (config._parse), its text between '{"config":' and the last ',"crc":' is the
    canonical text of cfg, its version is the schema's and its crc that text's."""
    try:
        doc = config._parse(data)[1]
    except config.ConfigError:
        return False
    text = data.decode()
    body = config.canonical(cfg)
    head = '{"config":'
    end = text.rfind(',"crc":')
    if not text.startswith(head) or end < len(head):
        return False
    if doc.get("version") != config.SCHEMA_VERSION:
        return False
    return text[len(head) : end] == body and doc.get("crc") == crc16(body.encode())


def _variants(cfg):
    good = config.encode_file(cfg, 3).encode()
    body = config.canonical(cfg).encode()
    crc = crc16(body)
    head = b'{"config":'
    tails = [
        t.replace("CRC", str(crc)).replace("BAD", str(crc ^ 1)).encode()
        for t in (
            ',"crc":CRC,"version":1,"writes":3}\n',
            ',"crc":CRC,"version":1}',
            ',"crc":CRC, "version": 1, "writes": 9}\n\n',
            ',"crc":CRC,"writes":3,"version":1}',
            ',"crc":CRC,"version":2,"writes":3}\n',
            ',"crc":BAD,"version":1,"writes":3}\n',
            ',"crc":CRC,"version":1,"x":{"a":1,"crc":2}}',
            ',"crc":CRC,"version":1,"config":1}',
            ',"crc":CRC,"version":1,"writes":3',
            ',"crc":CRC,"version":1,"writes":3}x',
            ',"crc":CRC,"version":1,"w":"\u00e9"}',
            ',"crc":CRC,"version":true}',
            ',"version":1}',
            "",
        )
    ]
    tails.append(tails[1][:-1] + b',"w":"\xff"}')
    out = [good, good[:-1], good[:20], b"", b" " + good, good.replace(b":", b": ", 1)]
    for t in tails:
        out.append(head + body + t)
    out.append(head + body[:-1] + b" }" + tails[0])
    out.append(head + body.replace(b"5000", b"5001", 1) + tails[0])
    return out


def test_is_saved_says_what_the_whole_file_rule_says():
    for cfg in _configs():
        for data in _variants(cfg):
            d = tmpdir()
            if data:
                write_bytes(d + "/config.json", data)
            want = bool(data) and _holds_whole(data, cfg)
            assert config.is_saved(cfg, d) == want, data[-60:]
    assert config.is_saved(config.defaults(), tmpdir()) is False  # nothing stored


def test_a_holding_file_is_not_rewritten_and_a_differing_one_is():
    cfg = _big_config()
    d = tmpdir()
    data = config.encode_file(cfg, 5).encode()
    write_bytes(d + "/config.json", data)
    assert config.save(cfg, d) is False
    assert read_bytes(d + "/config.json") == data
    other = config.merge(cfg, {"channels.3.correction": [0.5]})
    assert config.save(other, d) is True
    assert read_bytes(d + "/config.prev.json") == data
    assert read_bytes(d + "/config.json") == config.encode_file(other, 6).encode()


def test_a_non_ascii_file_still_decodes_and_bad_utf8_is_named():
    cfg = _big_config()  # its comment is escaped: the file is ASCII
    data = config.encode_file(cfg, 1).encode()
    assert max(data) < 0x80
    got, _ = config.decode_file(data.replace(b"\\u00b0", b"\xc2\xb0"))
    assert got["_comment"] == cfg["_comment"]
    with raises(config.ConfigError, match="not UTF-8"):
        config.decode_file(data.replace(b"\\u00b0", b"\xff"))


# --- config_get pages ---------------------------------------------------------------


def _reference_pages(cfg, ref, seq0):
    """The frames config_get sent before: encode each page, split it in halves by
    sorted key while the encoder says it is oversize."""
    out = []
    seq = [seq0]

    def send(fields):
        try:
            data = frame.encode_frame("config", fields, seq[0] + 1)
        except OversizeError:
            keys = sorted(fields["values"])
            half = len(keys) // 2
            for part in (keys[:half], keys[half:]):
                sub = dict(fields)
                sub["values"] = {k: fields["values"][k] for k in part}
                send(sub)
            return
        seq[0] += 1
        out.append(data)

    for name in config.pages(cfg):
        send({"ref": ref, "values": config.get_section(cfg, name), "version": 1})
    return out


class _Port:
    """Stands in for the App where _send_config writes."""

    def __init__(self, cfg, fmt):
        self.cfg = cfg
        self.fmt = fmt
        self.seq = 0
        self.sent = []

    def send(self, name, fields):
        self.seq += 1
        self.sent.append(frame.encode_frame(name, fields, self.seq))


def test_config_get_frames_are_the_encoders_split_byte_for_byte():
    for cfg in _configs():
        port = _Port(cfg, FMT_CBOR)  # a binary frame format
        msg = _Msg(77, {})
        commands.cmd_config_get(port, msg)
        want = _reference_pages(cfg, 77, 0)
        assert port.sent == want
        assert len(want) > len(config.pages(cfg))  # some pages were split


def test_one_entry_too_big_for_a_frame_is_refused_by_the_encoder():
    port = _Port(config.defaults(), FMT_CBOR)
    with raises(OversizeError):
        commands._send_config(port, 1, {"k": "x" * 600})
    assert port.sent == []


class _Msg:
    def __init__(self, seq, fields):
        self.seq = seq
        self.fields = fields
        self.type = C.T_CONFIG_GET


def _boot(cfg=None):
    hal = FakeHal()
    if cfg is not None:
        write_bytes(hal.fs_dir + "/config.json", config.encode_file(cfg, 1).encode())
    app = App(hal)
    app.boot()
    signer_for(hal, app)
    run(app, hal, 1000)
    return hal, app


def _cmd(hal, name, fields, seq):
    hal.send(frame.encode_frame(name, fields, seq, signer=hal.signer))


def test_a_client_reassembles_exactly_the_config_from_the_pages():
    for cfg in _configs():
        hal, app = _boot(cfg)
        assert app.cfg == cfg
        hal.take()
        _cmd(hal, "config_get", {}, 300)
        run(app, hal, 100)
        pages = [m for m in hal.take() if m.ok and m.name == "config" and m.fields["ref"] == 300]
        merged = {}
        for m in pages:
            for k in m.fields["values"]:
                assert k not in merged, k  # each key once
            merged.update(m.fields["values"])
        assert config.unflatten(merged) == cfg
        assert app.internal_errors == 0


# --- a MemoryError in a command -------------------------------------------------------


def test_a_memory_error_while_building_leaves_config_and_cooling_intact():
    hal, app = _boot()
    run(app, hal, 2000)
    cfg_before = config.canonical(app.cfg)
    pid_before = app.pid
    real = pid_mod.PID.__init__
    calls = [0]

    def oom(self, *a, **kw):
        calls[0] += 1
        raise MemoryError("injected")

    pid_mod.PID.__init__ = oom
    try:
        hal.take()
        _cmd(hal, "config_set", {"values": {"pid.kp": 7000}}, 400)
        run(app, hal, 300)
    finally:
        pid_mod.PID.__init__ = real
    got = [m for m in hal.take() if m.ok and m.fields.get("ref") == 400]
    assert calls[0] == 1
    assert [m.name for m in got] == ["nack"] and got[0].fields["code"] == C.ERR_INTERNAL
    assert config.canonical(app.cfg) == cfg_before and app.pid is pid_before
    assert app.failures == 0 and app.internal_errors == 1
    ticks = app.ticks
    run(app, hal, 1000)
    assert app.ticks > ticks and app.failures == 0
    assert app.fans[0].duty >= app.safety.floor[0]
    _cmd(hal, "config_set", {"values": {"pid.kp": 7000}}, 401)  # and it works after
    run(app, hal, 300)
    got = [m for m in hal.take() if m.ok and m.fields.get("ref") == 401]
    assert [m.name for m in got] == ["ack"] and app.cfg["pid"]["kp"] == 7000


def test_a_memory_error_while_saving_keeps_the_stored_config():
    cfg = config.defaults()
    d = tmpdir()
    config.save(cfg, d)
    before = read_bytes(d + "/config.json")
    real = writer._write_file

    def oom(f, c, w):
        f.write(b'{"config":{')
        raise MemoryError("injected")

    writer._write_file = oom
    try:
        with raises(MemoryError):
            config.save(config.merge(cfg, {"pid.kp": 1234}), d)
    finally:
        writer._write_file = real
    assert not exists(d + "/config.json.tmp")  # removed on the way out
    cands, writes, problems = config.candidates(d)
    assert cands[0][0] == "current" and cands[0][1] == cfg and problems == []
    assert read_bytes(d + "/config.json") == before


def test_the_config_parser_takes_the_file_bytes_without_a_copy():
    data = config.encode_file(config.defaults(), 1).encode()
    got, doc = config._parse(data)
    assert got is data and doc == jsonparse.loads(data, max_len=config.MAX_FILE_BYTES)
