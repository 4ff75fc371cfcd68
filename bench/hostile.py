"""A hostile corpus for the module's command path (CPython; cbor2 builds what our own
encoder would refuse to).

``corpus(h)`` returns a list of byte strings, each one complete frame or line, for a
``tests/safety_harness.Harness`` ``h`` whose signer carries the module's key and
nonce, so that the signed items get past authentication and reach the handlers:

- for every host->module message type and every field: every wrong type (null, bool,
  negative, 2**64, -2**63, 1e308, NaN, text of 200 characters, bytes, a list, a map),
  nested 9, 100 and 1000 levels deep, in CBOR (signed and unsigned) and JSON;
- every JSON key duplicated, overlong UTF-8, raw control characters, NaN/Infinity,
  numbers of 400 digits, truncated lines;
- CBOR payloads with tags, indefinite lengths, duplicate keys, trailing bytes, a
  length that claims more than the frame;
- random bytes and random valid-looking frames.
"""

from __future__ import annotations

import random
import struct

import cbor2

from protocol import catalog as C
from protocol import cobs
from protocol.crc import crc16
from protocol.sign import FLAG_SIGNED

WRONG = (
    None,
    True,
    False,
    -1,
    2**64,
    -(2**63),
    1e308,
    float("nan"),
    float("inf"),
    "x" * 200,
    "",
    b"\xff\x00",
    [],
    {},
    [[1, 2], [3]],
    {"a": {"b": 1}},
)


def _deep(n):
    v = 1
    for _ in range(n):
        v = [v]
    return v


def _frame(type_id, payload: bytes, seq: int, signer=None, minor=0) -> bytes:
    head = bytes([1, minor | (FLAG_SIGNED if signer else 0), type_id, seq >> 8, seq & 0xFF])
    body = head + payload
    body += struct.pack(">H", crc16(body, 0, len(body)))
    if signer is not None:
        body += signer.trailer(body)
    out = bytearray(cobs.max_encoded_len(len(body)) + 1)
    end = cobs.encode_into(body, len(body), out, 0)
    out[end] = 0
    return bytes(out[: end + 1])


def _cbor(obj) -> bytes:
    try:
        return cbor2.dumps(obj)
    except (ValueError, OverflowError, cbor2.CBOREncodeError):
        return b""


def corpus(h, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    items: list[bytes] = []
    seq = [1000]

    def nxt():
        seq[0] = (seq[0] + 1) & 0xFFFF
        return seq[0]

    h2d = [m for m in C.MESSAGES if m[C.M_DIR] == C.H2D]
    for mdef in h2d:
        tid = mdef[C.M_TYPE]
        name = mdef[C.M_NAME]
        for fdef in mdef[C.M_FIELDS]:
            key = fdef[C.F_KEY]
            fname = fdef[C.F_NAME]
            for v in WRONG + (_deep(9), _deep(100), _deep(1000)):
                payload = _cbor({key: v})
                if payload:
                    items.append(_frame(tid, payload, nxt(), h.signer))
                    items.append(_frame(tid, payload, nxt()))
                try:
                    text = _json_value(v)
                except ValueError:
                    continue
                items.append(f'{{"type":"{name}","{fname}":{text}}}\n'.encode())
            # duplicated key, both orders
            items.append(f'{{"type":"{name}","{fname}":1,"{fname}":2}}\n'.encode())
        items.append(f'{{"type":"{name}","type":"config_reset"}}\n'.encode())
        items.append(f'{{"type":"{name}","seq":1,"seq":2}}\n'.encode())
        # CBOR structure attacks, signed so they reach the decoder's deeper checks
        for payload in (
            b"\xc1\xa0",  # a tag
            b"\xbf\x00\x01\xff",  # indefinite map
            b"\xa2\x00\x01\x00\x02",  # duplicate key
            b"\xa0\x00",  # trailing byte
            b"\xa1\x00\x7a\xff\xff\xff\xff",  # text longer than the frame
            b"\xa1\x00\x9b" + b"\xff" * 8,  # array of 2**64 items
            b"\xa1\x00\xfb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # NaN
        ):
            items.append(_frame(tid, payload, nxt(), h.signer))
    for line in (
        b'{"type":"config_set","values":{"pid.kp":' + b"9" * 400 + b"}}\n",
        b'{"type":"config_set","values":{"pid.kp":1e400}}\n',
        b'{"type":"config_set","values":{"\xc0\xaf":1}}\n',
        b'{"type":"config_set","values":{"\xed\xa0\x80":1}}\n',
        b'{"type":"config_set","values":{"a\x01b":1}}\n',
        b'{"type":"fan_mode","mode":"manual","duty1":NaN}\n',
        b'{"type":"fan_mode","mode":"manual","duty1":Infinity}\n',
        b'{"type":"fan_mode","mode":"manual","duty1":-Infinity}\n',
        b'{"type":"fan_mode","mode":"manual","duty1":01}\n',
        b'{"type":"fan_mode",',
        b'{"type":"fan_mode"\n',
        b"{" * 1000 + b"\n",
        b"[" * 1023 + b"\n",
        b'{"type":"\\ud800"}\n',
    ):
        items.append(line)
    for _ in range(300):
        n = rng.randrange(1, 120)
        items.append(bytes(rng.randrange(256) for _ in range(n)) + b"\x00")
    for _ in range(300):  # valid-looking frames with random payload bytes, signed
        mdef = rng.choice(h2d)
        payload = bytes([0xA1]) + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        items.append(_frame(mdef[C.M_TYPE], payload, nxt(), h.signer))
    return items


def _json_value(v) -> str:
    import json

    if isinstance(v, bytes):
        raise ValueError("no bytes in JSON")
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, list) and _depth(v) > 200:
        raise ValueError("too deep for json.dumps")
    return json.dumps(v)


def _depth(v) -> int:
    d = 0
    while isinstance(v, list) and v:
        v = v[0]
        d += 1
    return d
