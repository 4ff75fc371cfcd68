"""CLI tests (CPython): click's CliRunner, output parsed, exit codes checked."""

import json

from click.testing import CliRunner

from modbridge.cli.main import main
from modbridge.tools import wiredemo
from protocol import frame


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_version():
    r = run("--version")
    assert r.exit_code == 0
    assert "modbridge" in r.output


def test_frame_encode_then_decode_round_trip():
    r = run("frame", "encode", '{"type":"fan_mode","mode":"manual","duty1":40,"seq":9}')
    assert r.exit_code == 0, r.output
    hexframe = r.output.strip()
    raw = bytes.fromhex(hexframe)
    assert raw.endswith(b"\x00") and b"\x00" not in raw[:-1]
    msg = frame.decode_frame(raw)
    assert msg.name == "fan_mode" and msg.seq == 9
    assert msg.fields == {"mode": 1, "duty1": 26214}  # 40 % of 65535

    r = run("frame", "decode", "--json", hexframe)
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output)
    assert obj == {
        "type": "fan_mode",
        "seq": 9,
        "format": "cbor",
        "fields": {"mode": 1, "duty1": 26214},
    }


def test_frame_decode_reads_stdin_and_reports_garbage():
    good = frame.encode_frame("heartbeat", {"gpu_temp": 65000}, 3)
    r = CliRunner().invoke(main, ["frame", "decode", "--json"], input=b"\x01\x02\x03\x00" + good)
    assert r.exit_code == 2  # something was rejected
    items = [json.loads(line) for line in r.output.splitlines()]
    assert items[0]["error"] in ("framing", "crc")
    assert items[1] == {
        "type": "heartbeat",
        "seq": 3,
        "format": "cbor",
        "fields": {"gpu_temp": 65000},
    }


def test_frame_decode_frame_without_delimiter():
    good = frame.encode_frame("hello_request", {}, 1)[:-1]
    r = run("frame", "decode", good.hex())
    assert r.exit_code == 0
    assert r.output.startswith("hello_request seq=1")


def test_frame_decode_rejects_non_hex():
    r = CliRunner().invoke(main, ["frame", "decode", "xyz"])
    assert r.exit_code == 2
    assert "not hex" in r.output


def test_frame_encode_explains_invalid_input():
    r = CliRunner().invoke(
        main, ["frame", "encode", '{"type":"fan_mode","mode":"manual","duty1":140}']
    )
    assert r.exit_code == 2
    assert "duty1" in r.output and "outside" in r.output
    r = CliRunner().invoke(main, ["frame", "encode", "not json"])
    assert r.exit_code == 2 and "not valid JSON" in r.output


def _key_file(tmp_path, mode=0o600, size=32):
    from protocol import sign

    p = tmp_path / "m.key"
    key = sign.new_key()[:size] if size <= 32 else b"k" * size
    p.write_bytes(key)
    p.chmod(mode)
    return p, key


def test_frame_encode_signed_frame_and_line_verify_on_the_module_side(tmp_path):
    from protocol import jsonl, sign

    path, key = _key_file(tmp_path)
    nonce = bytes(range(8))
    line = '{"type":"fan_mode","mode":"manual","duty1":40,"seq":9}'
    args = ["frame", "encode", line, "--sign-key", str(path), "--nonce", nonce.hex()]
    r = run(*args)
    assert r.exit_code == 0, r.output
    v = sign.Verifier(key)
    v.set_nonce(nonce)
    msg = frame.decode_frame(bytes.fromhex(r.output.strip()), verifier=v)
    assert msg.name == "fan_mode" and msg.seq == 9 and msg.auth == sign.AUTH_OK
    assert msg.link == 2  # a human's link (the bridge signs as 0)
    r = run(*args, "--jsonl", "--link", "5")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output)
    assert {"link", "ts", "sig"} <= set(obj) and obj["link"] == 5, obj
    msg = jsonl.decode_line(r.output.strip(), verifier=v)
    assert msg.auth == sign.AUTH_OK and msg.fields == {"mode": 1, "duty1": 26214}
    other = sign.Verifier(sign.new_key())  # another key: not accepted
    other.set_nonce(nonce)
    assert jsonl.decode_line(r.output.strip(), verifier=other).auth == sign.AUTH_BAD


def test_frame_encode_signing_garbage(tmp_path):
    line = '{"type":"reboot"}'
    good, _ = _key_file(tmp_path)
    r = run("frame", "encode", line, "--sign-key", str(good))
    assert r.exit_code == 2 and "--sign-key and --nonce go together" in r.output
    r = run("frame", "encode", line, "--sign-key", str(good), "--nonce", "abc")
    assert r.exit_code == 2 and "--nonce: 16 hex digits" in r.output
    short, _ = _key_file(tmp_path, size=31)
    r = run("frame", "encode", line, "--sign-key", str(short), "--nonce", "00" * 8)
    assert r.exit_code == 1 and "holds 31 bytes, a key is exactly 32" in r.output
    loose, _ = _key_file(tmp_path, mode=0o644)
    r = run("frame", "encode", line, "--sign-key", str(loose), "--nonce", "00" * 8)
    assert r.exit_code == 1 and "chmod 600" in r.output
    r = run("frame", "encode", line, "--sign-key", str(tmp_path / "none"), "--nonce", "00" * 8)
    assert r.exit_code == 2 and "no such file" in r.output


def test_wire_demo_streams_from_micropython():
    lines = []
    res = wiredemo.run(seconds=1.2, period_ms=20, json_every=10, noise_every=15, emit=lines.append)
    assert res.exit_code == 0, lines
    ticks = 60
    assert res.frames_cbor == ticks
    assert res.frames_json == ticks // 10
    # the injected noise bursts are rejected and counted, never fatal
    assert sum(res.errors.values()) == ticks // 15
    assert res.device_note == f"{ticks} ticks encoded with the heap locked"
    assert 40 < res.mean_cbor < 80 and res.mean_json > res.mean_cbor * 3
    assert any(" cbor " in line for line in lines)


def test_wire_demo_command_exit_code():
    r = run("wire-demo", "--seconds", "0.3", "--period-ms", "20")
    assert r.exit_code == 0, r.output
    assert "micropython exit code: 0" in r.output
