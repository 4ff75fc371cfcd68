"""Golden vectors (protocol/vectors/v1.json) on CPython and under MicroPython.

The same file must give the same bytes on both interpreters: encode, decode, JSON
lines, the firmware's telemetry encoder, and the stream decoder's verdict on bad input.
"""

import json

from mpcompat import read_repo_file

from protocol import catalog as C
from protocol import jsonl
from protocol.frame import StreamDecoder, decode_frame, encode_frame
from protocol.telemetry import N_FIELDS, TelemetryEncoder, index

DUAL = True

def _fields(v):
    """A vector's wire fields, byte strings ({"hex": ...} in the file) as bytes."""
    out = {}
    for k in v:
        x = v[k]
        out[k] = bytes.fromhex(x["hex"]) if isinstance(x, dict) and "hex" in x else x
    return out


DOC = json.loads(read_repo_file("protocol/vectors/v1.json"))
VECTORS = DOC["vectors"]
for _v in VECTORS:
    _v["fields"] = _fields(_v["fields"])
BAD = DOC["bad"]


def test_file_covers_every_message_type():
    have = set(v["message"] for v in VECTORS)
    want = set(m[C.M_NAME] for m in C.MESSAGES)
    assert have == want, (want - have, have - want)
    assert len([v for v in VECTORS if v["message"] == "telemetry"]) >= 4
    for v in VECTORS:
        assert C.by_name(v["message"])[C.M_TYPE] == v["type"], v["name"]
    kinds = set(b["expect_kind"] for b in BAD)
    for kind in ("crc", "framing", "version", "unknown_type", "undecodable", "invalid", "oversize"):
        assert kind in kinds, kind


def test_encode_frame_matches():
    for v in VECTORS:
        got = encode_frame(v["message"], v["fields"], v["seq"])
        assert got == bytes.fromhex(v["cbor_hex"]), (v["name"], got.hex(), v["cbor_hex"])


def test_decode_frame_matches():
    for v in VECTORS:
        msg = decode_frame(bytes.fromhex(v["cbor_hex"]))
        assert msg.name == v["message"], v["name"]
        assert msg.seq == v["seq"], (v["name"], msg.seq)
        assert msg.fields == v["fields"], (v["name"], msg.fields, v["fields"])


def test_encode_line_matches():
    for v in VECTORS:
        got = jsonl.encode_line(v["message"], v["fields"], v["seq"])
        assert got == v["json_line"].encode(), (v["name"], got, v["json_line"])


def test_decode_line_matches():
    for v in VECTORS:
        line = v["json_line"]
        assert line.endswith("\n")
        msg = jsonl.decode_line(line[:-1])
        assert msg.name == v["message"], v["name"]
        assert msg.seq == v["seq"], (v["name"], msg.seq)
        assert msg.fields == v["fields"], (v["name"], msg.fields, v["fields"])


def test_stream_decoder_reads_all_vectors_in_one_stream():
    dec = StreamDecoder()
    got = []
    for v in VECTORS:
        got.extend(dec.feed(bytes.fromhex(v["cbor_hex"])))
        got.extend(dec.feed(v["json_line"].encode()))
    assert len(got) == 2 * len(VECTORS), len(got)
    for i in range(len(VECTORS)):
        v = VECTORS[i]
        for msg in (got[2 * i], got[2 * i + 1]):
            assert msg.ok, (v["name"], msg)
            assert msg.seq == v["seq"] and msg.fields == v["fields"], (v["name"], msg)
    assert dec.error_total() == 0, dec.errors


def test_telemetry_encoder_matches():
    checked = 0
    for v in VECTORS:
        if v["message"] != "telemetry":
            continue
        enc = TelemetryEncoder()
        for name in v["fields"]:
            enc.set(index(name), v["fields"][name])
        n = enc.encode_cbor(v["seq"])
        assert enc.out[:n] == bytes.fromhex(v["cbor_hex"]), (v["name"], bytes(enc.out[:n]).hex())
        n = enc.encode_json(v["seq"])
        assert enc.out[:n] == v["json_line"].encode(), (v["name"], bytes(enc.out[:n]))
        assert enc.fields() == v["fields"]
        checked += 1
    assert checked >= 4
    assert N_FIELDS == 19


def test_bad_vectors_give_one_bad_frame_of_their_kind():
    for b in BAD:
        dec = StreamDecoder()
        got = dec.feed(bytes.fromhex(b["hex"]))
        assert len(got) == 1, (b["name"], got)
        assert not got[0].ok and got[0].kind == b["expect_kind"], (b["name"], got[0])
        assert dec.errors[b["expect_kind"]] == 1 and dec.error_total() == 1, (b["name"], dec.errors)
        assert dec.frames == 0


def test_bad_vectors_do_not_hurt_the_next_frame():
    dec = StreamDecoder()
    good = bytes.fromhex(VECTORS[0]["cbor_hex"])
    for b in BAD:
        got = dec.feed(bytes.fromhex(b["hex"]) + b"\x00" + good)
        assert got and got[-1].ok and got[-1].fields == VECTORS[0]["fields"], (b["name"], got)
