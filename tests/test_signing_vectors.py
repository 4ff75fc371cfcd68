"""Golden vectors for signed commands (protocol/vectors/signing.json) on CPython and
under MicroPython: the same key, nonce and timestamps give the same bytes, and the
same Verifier accepts and refuses the same frames and lines."""

import json

from mpcompat import read_repo_file

from protocol import catalog as C
from protocol import cobs, jsonl
from protocol import frame as F
from protocol.sign import AUTH_NAMES, AUTH_OK, AUTH_REPLAY, Signer, Verifier

DUAL = True

DOC = json.loads(read_repo_file("protocol/vectors/signing.json"))
KEY = bytes.fromhex(DOC["key_hex"])
NONCE = bytes.fromhex(DOC["nonce_hex"])


class _Fixed:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self):
        return self.ts


def _signer(v):
    s = Signer(KEY, v["link"], clock=_Fixed(v["ts"]))
    s.nonce = NONCE
    return s


def _verifier():
    ver = Verifier(KEY)
    ver.set_nonce(NONCE)
    return ver


def test_vectors_cover_the_brief():
    names = [v["message"] for v in DOC["vectors"]]
    for m in ("heartbeat", "fan_mode", "config_set"):
        assert m in names, m
    assert len(KEY) == 32 and len(NONCE) == 8
    for v in DOC["vectors"]:
        assert C.by_name(v["message"])[C.M_TYPE] == v["type"]


def test_encoding_matches():
    for v in DOC["vectors"]:
        unsigned = F.encode_frame(v["message"], v["fields"], v["seq"])
        assert unsigned.hex() == v["unsigned_hex"], v["name"]
        signed = F.encode_frame(v["message"], v["fields"], v["seq"], signer=_signer(v))
        assert signed.hex() == v["signed_hex"], (v["name"], signed.hex())
        line = jsonl.encode_line(v["message"], v["fields"], v["seq"], signer=_signer(v))
        assert line == v["json_line"].encode(), (v["name"], line)


def test_trailer_and_line_carry_the_same_signature():
    for v in DOC["vectors"]:
        raw = bytes(cobs.decode(bytes.fromhex(v["signed_hex"])[:-1]))
        plain = bytes(cobs.decode(bytes.fromhex(v["unsigned_hex"])[:-1]))
        assert len(raw) == len(plain) + 13, v["name"]
        assert raw[1] == 0x80 | plain[1] and raw[-13] == v["link"]
        ts = 0
        for b in raw[-12:-6]:
            ts = (ts << 8) | b
        assert ts == v["ts"], v["name"]
        assert raw[-6:].hex() == v["sig_hex"]
        assert ('"sig":"' + v["sig_hex"] + '"') in v["json_line"]


def test_frames_and_lines_verify():
    frames = _verifier()
    for v in DOC["vectors"]:
        msg = F.decode_frame(bytes.fromhex(v["signed_hex"]), C.H2D, frames)
        assert msg.auth == AUTH_OK and msg.link == v["link"], (v["name"], msg.auth)
        assert msg.fields == v["fields"] and msg.seq == v["seq"], v["name"]
        lines = _verifier()
        back = jsonl.decode_line(v["json_line"][:-1], C.H2D, lines)
        assert back.auth == AUTH_OK and back.fields == v["fields"], (v["name"], back.auth)
        # the frame with the same link and ts is a replay for that verifier
        assert F.decode_frame(bytes.fromhex(v["signed_hex"]), C.H2D, lines).auth == AUTH_REPLAY


def test_refused_in_order():
    ver = _verifier()
    dec = F.StreamDecoder(accept=C.H2D, verifier=ver, heartbeat=F.HeartbeatState())
    for v in DOC["vectors"]:
        assert F.decode_frame(bytes.fromhex(v["signed_hex"]), C.H2D, ver).auth == AUTH_OK
    hb = dec.heartbeat
    for r in DOC["refused"]:
        hb.pending = False
        got = dec.feed(bytes.fromhex(r["hex"]))
        assert not got and hb.pending, (r["name"], got)  # heartbeats: the fast path
        assert AUTH_NAMES[hb.auth] == r["expect_auth"], (r["name"], hb.auth)
