"""The CBOR codec agrees with cbor2 *on MicroPython* (CPython-only test module).

About 1,000 nested values come from a seeded ``random.Random``; their cbor2 encodings
(half in cbor2's default form, half in its canonical form with shortest floats) go to
a file, one hex line each, together with hostile inputs. One ``micropython`` process
decodes every line with protocol.cbor.loads and re-encodes it with protocol.cbor.dumps.
Every output must equal cbor2's encoding of the value with canonically ordered maps,
and every hostile line must be refused, exactly as on CPython.
"""

import math
import os
import random
import struct
import subprocess
from pathlib import Path

import cbor2

from modbridge.tools.mpy import micropython_path
from protocol import cbor
from protocol.errors import ProtocolError

REPO_ROOT = Path(__file__).resolve().parent.parent
N_VALUES = 1000

MP_SCRIPT = """
import sys
from binascii import hexlify, unhexlify
from protocol import cbor
from protocol.errors import ProtocolError

with open(sys.argv[1]) as f:
    for line in f:
        line = line.strip()
        try:
            out = hexlify(cbor.dumps(cbor.loads(unhexlify(line)))).decode()
        except ProtocolError as e:
            out = "ERR " + e.kind
        print(out)
print("END")
"""

# Inputs that both interpreters must refuse, whatever their str()/struct quirks.
HOSTILE = (
    "62c080",  # overlong UTF-8 (MicroPython's str() accepts it)
    "63eda080",  # UTF-16 surrogate in UTF-8
    "64f4908080",  # code point past U+10FFFF
    "61ff",
    "5f4101ff",  # indefinite length
    "c001",  # tag
    "f7",  # undefined
    "f820",  # simple value
    "ff",  # break
    "1c",  # reserved additional information
    "9bffffffffffffffff",  # huge declared length
    "a2010201 03",  # duplicate key
    "a18001",  # array as a map key
    "a1f93c0001",  # float as a map key
    "0102",  # trailing bytes
    "1b00000000",  # truncated argument
    "81" * 9 + "01",  # deeper than max_depth
    "",  # nothing at all
)




def canonical_order(v):
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda kv: (len(cbor2.dumps(kv[0])), cbor2.dumps(kv[0])))
        return {k: canonical_order(x) for k, x in items}
    if isinstance(v, (list, tuple)):
        return [canonical_order(x) for x in v]
    return v


class ValueGen:
    """Random values of the subset, deterministic for a seed."""

    SPECIAL_FLOATS = (
        0.0,
        -0.0,
        1.0,
        -1.5,
        65504.0,
        1e300,
        -1e-300,
        5e-324,
        2.0**-24,
        float("inf"),
        float("-inf"),
        float("nan"),
        3.4028234663852886e38,
        0.1,
    )

    def __init__(self, seed):
        self.r = random.Random(seed)

    def integer(self):
        r = self.r
        bits = r.choice((4, 5, 8, 9, 16, 17, 32, 33, 63, 64))
        v = r.getrandbits(bits)
        if r.random() < 0.5:
            v = -1 - v  # reaches -2**64
        return v

    def floating(self):
        r = self.r
        k = r.random()
        if k < 0.3:
            return r.choice(self.SPECIAL_FLOATS)
        if k < 0.6:
            # any bit pattern: subnormals, huge, tiny, NaN payloads
            return struct.unpack(">d", r.getrandbits(64).to_bytes(8, "big"))[0]
        if k < 0.8:
            # values that cbor2's canonical form writes as float16/float32
            return math.ldexp(r.randint(-2048, 2048), r.randint(-30, 20))
        return r.uniform(-1e6, 1e6)

    def text(self):
        r = self.r
        out = []
        for _ in range(r.randint(0, 12)):
            k = r.random()
            if k < 0.5:
                cp = r.randint(0x20, 0x7E)
            elif k < 0.7:
                cp = r.randint(0, 0x7FF)
            elif k < 0.9:
                cp = r.randint(0x800, 0xFFFF)
                if 0xD800 <= cp < 0xE000:
                    cp = 0xFFFD
            else:
                cp = r.randint(0x10000, 0x10FFFF)
            out.append(chr(cp))
        return "".join(out)

    def key(self):
        k = self.r.random()
        if k < 0.4:
            return self.integer()
        if k < 0.8:
            return self.text()
        return self.r.randbytes(self.r.randint(0, 4))

    def value(self, depth=4):
        r = self.r
        k = r.random()
        if depth > 0 and k < 0.15:
            return [self.value(depth - 1) for _ in range(r.randint(0, 5))]
        if depth > 0 and k < 0.3:
            return {self.key(): self.value(depth - 1) for _ in range(r.randint(0, 5))}
        k = r.random()
        if k < 0.3:
            return self.integer()
        if k < 0.5:
            return self.floating()
        if k < 0.7:
            return self.text()
        if k < 0.85:
            return r.randbytes(r.randint(0, 30))
        return r.choice((None, True, False))


def _cases():
    gen = ValueGen(20240601)
    lines, want = [], []
    for i in range(N_VALUES):
        v = gen.value()
        enc = cbor2.dumps(v, canonical=bool(i % 2))
        lines.append(enc.hex())
        want.append(cbor2.dumps(canonical_order(v)).hex())
    for text in HOSTILE:
        lines.append(text.replace(" ", ""))
        want.append("ERR undecodable")
    return lines, want


def _run_in_process(lines):
    out = []
    for line in lines:
        try:
            out.append(cbor.dumps(cbor.loads(bytes.fromhex(line))).hex())
        except ProtocolError as e:
            out.append("ERR " + e.kind)
    return out


def test_cpython_codec_matches_cbor2():
    lines, want = _cases()
    got = _run_in_process(lines)
    bad = [(lines[i], got[i], want[i]) for i in range(len(want)) if got[i] != want[i]]
    assert not bad, bad[:5]


def test_micropython_codec_matches_cbor2(tmp_path):
    exe = micropython_path()  # raises MicroPythonMissing saying how to install it
    lines, want = _cases()
    data = tmp_path / "cases.hex"
    data.write_text("\n".join(lines) + "\n")
    script = tmp_path / "mp_cbor_roundtrip.py"
    script.write_text(MP_SCRIPT)
    env = dict(os.environ, MICROPYPATH=".frozen:" + str(REPO_ROOT))
    proc = subprocess.run(
        [exe, "-X", "heapsize=8M", str(script), str(data)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = proc.stdout.splitlines()
    assert got and got[-1] == "END", proc.stdout[-2000:] + proc.stderr[-2000:]
    got = got[:-1]
    assert len(got) == len(want)
    bad = [(lines[i], got[i], want[i]) for i in range(len(want)) if got[i] != want[i]]
    assert not bad, f"{len(bad)} of {len(want)} differ, first: {bad[:3]!r}"
    # the cases really cover the subset
    assert sum(1 for w in want if w.startswith(("a", "b"))) > 20  # maps
    assert sum(1 for line in lines if line.startswith(("f9", "fa"))) > 20  # short floats
