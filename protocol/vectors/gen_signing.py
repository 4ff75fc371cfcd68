"""Generate protocol/vectors/signing.json: golden vectors for signed commands.

    python protocol/vectors/gen_signing.py            # rewrite protocol/vectors/signing.json
    python protocol/vectors/gen_signing.py --out DIR  # write DIR/signing.json instead

Host-side tooling (CPython only). A fixed test key and nonce (never use them on a
module), a link id and a base timestamp; for a few host -> module messages the
unsigned frame, the signed frame and the signed JSON line, each complete on the wire
(COBS + 0x00, or the line with its LF). Vector ``i`` is signed with timestamp
``ts0 + i`` and the line with the same link and timestamp as the frame, so the two
carry the same 6-byte signature (``sig_hex``): the line's signature is its binary
twin's. Every signature is cross-checked against Python's ``hmac`` module before
anything is written. ``refused``: frames a fresh Verifier (key, nonce) must refuse
with ``expect_auth`` after it accepted every vector in order.

Same inputs, same bytes: sorted keys, ASCII, no floats.
"""

import argparse
import hashlib
import hmac
import json
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from protocol import VERSION_MAJOR, VERSION_MINOR, cobs, jsonl  # noqa: E402
from protocol import catalog as C  # noqa: E402
from protocol import sign  # noqa: E402
from protocol.frame import decode_frame, encode_frame  # noqa: E402

FILENAME = "signing.json"
HERE = os.path.dirname(os.path.abspath(__file__))

KEY = bytes(range(0x00, 0x20))  # a test key: 00 01 02 .. 1f
NONCE = bytes.fromhex("5eed0f0c0a0b1e55")
OLD_NONCE = bytes.fromhex("0123456789abcdef")  # "the previous boot"
LINK = 1
TS0 = sign.ts_from_unix(1748736000)  # 2025-06-01 00:00:00 UTC

GOOD = (
    (
        "heartbeat",
        "heartbeat",
        1000,
        {
            "gpu_temp": 71000,
            "gpu_power": 215500,
            "power_limit": 320000,
            "host_time": 1748736000,
            "gpu_mem_temp": 80000,
            "period_ms": 1000,
        },
    ),
    ("fan_mode_manual", "fan_mode", 20, {"mode": 1, "duty1": 32768, "duty2": 19661}),
    ("config_set", "config_set", 27, {"values": {"fan.min_duty": 9830, "hb.timeout_ms": 5000}}),
    ("config_save", "config_save", 28, {}),
)


class _Fixed:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self):
        return self.ts


def _signer(ts, nonce=NONCE):
    s = sign.Signer(KEY, LINK, clock=_Fixed(ts))
    s.nonce = nonce
    return s


def _unstuffed(frame):
    return bytes(cobs.decode(frame[:-1]))


def _restuffed(raw):
    return bytes(cobs.encode(raw)) + b"\x00"


def _check_sig(name, raw, nonce=NONCE):
    want = hmac.new(KEY, nonce + raw[:-6], hashlib.sha256).digest()[:6]
    if raw[-6:] != want:
        raise SystemExit("%s: signature differs from hmac's" % name)


def build():
    """The vector document as a dict."""
    vectors = []
    verifier = sign.Verifier(KEY)
    verifier.set_nonce(NONCE)
    for i, (name, message, seq, fields) in enumerate(GOOD):
        ts = TS0 + i
        unsigned = encode_frame(message, fields, seq)
        signed = encode_frame(message, fields, seq, signer=_signer(ts))
        line = jsonl.encode_line(message, fields, seq, signer=_signer(ts))
        raw = _unstuffed(signed)
        _check_sig(name, raw)
        if raw[-13] != LINK or int.from_bytes(raw[-12:-6], "big") != ts:
            raise SystemExit("%s: trailer does not hold link and ts" % name)
        sig = raw[-6:].hex()
        if ('"sig":"%s"' % sig) not in line.decode("ascii"):
            raise SystemExit("%s: the line's signature is not the frame's" % name)
        msg = decode_frame(signed, C.H2D, verifier)
        if msg.auth != sign.AUTH_OK or msg.fields != fields:
            raise SystemExit("%s: does not verify: %r auth %d" % (name, msg, msg.auth))
        check = sign.Verifier(KEY)
        check.set_nonce(NONCE)
        back = jsonl.decode_line(line[:-1], C.H2D, check)
        if back.auth != sign.AUTH_OK or back.fields != fields:
            raise SystemExit("%s: the line does not verify" % name)
        vectors.append(
            {
                "name": name,
                "message": message,
                "type": C.by_name(message)[C.M_TYPE],
                "seq": seq,
                "fields": fields,
                "link": LINK,
                "ts": ts,
                "sig_hex": sig,
                "unsigned_hex": unsigned.hex(),
                "signed_hex": signed.hex(),
                "json_line": line.decode("ascii"),
            }
        )
    first = GOOD[0]
    forged = bytearray(_unstuffed(bytes.fromhex(vectors[0]["signed_hex"])))
    forged[-1] ^= 0x01
    old = encode_frame(first[1], first[3], first[2], signer=_signer(TS0 + 100, OLD_NONCE))
    _check_sig("previous_boot", _unstuffed(old), OLD_NONCE)
    late = encode_frame(first[1], first[3], first[2] + 1, signer=_signer(TS0 + 100))
    refused = (
        ("replayed", bytes.fromhex(vectors[0]["signed_hex"]), sign.AUTH_REPLAY),
        ("forged_signature_bit", _restuffed(forged), sign.AUTH_BAD),
        ("previous_boot_nonce", old, sign.AUTH_BAD),
        ("unsigned", bytes.fromhex(vectors[0]["unsigned_hex"]), sign.AUTH_NONE),
        ("newer_timestamp", late, sign.AUTH_OK),
        ("newer_timestamp_again", late, sign.AUTH_REPLAY),
    )
    out = []
    for name, data, want in refused:
        got = decode_frame(data, C.H2D, verifier).auth
        if got != want:
            raise SystemExit("refused vector %s: auth %d, expected %d" % (name, got, want))
        out.append({"name": name, "hex": data.hex(), "expect_auth": sign.AUTH_NAMES[want]})
    return {
        "protocol": "%d.%d" % (VERSION_MAJOR, VERSION_MINOR),
        "generator": "protocol/vectors/gen_signing.py",
        "key_hex": KEY.hex(),
        "nonce_hex": NONCE.hex(),
        "link": LINK,
        "ts0": TS0,
        "ts_unit": "10 us since 2015-01-01 00:00:00 UTC",
        "vectors": vectors,
        "refused": out,
    }


def render(doc):
    """Deterministic text of the document."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=HERE, help="directory to write %s into" % FILENAME)
    args = parser.parse_args(argv)
    doc = build()
    path = os.path.join(args.out, FILENAME)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(render(doc))
    print("wrote %s: %d vectors, %d refused" % (path, len(doc["vectors"]), len(doc["refused"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
