"""Protocol benchmark: frame sizes, codec speed, telemetry allocation, fuzzing.

Codec keys say which decoder they time: ``..._reference_cpython`` the MicroPython-clean
StreamDecoder (protocol/) under CPython, ``..._bridge`` the decoder the bridge's links
feed (HostDecoder, cbor2 fast path); ``fuzz_*_bridge*`` fuzz the latter beside the
former (:func:`modbridge.firmware_host.fuzz.differential`).

    python -m bench.run protocol
    python -c "import bench.bench_protocol as b; print(b.run())"

CPython numbers are measured in-process; MicroPython numbers come from the unix port
(``micropython`` from modbridge.tools.mpy: $MICROPYTHON, else next to sys.executable,
else PATH) run in a
subprocess with MICROPYPATH set to the repository root. Takes about half a minute.
"""

import json
import os
import subprocess
import time
from pathlib import Path

from modbridge.firmware_host import fuzz
from protocol import catalog as C
from protocol.frame import StreamDecoder, encode_frame
from protocol.telemetry import TelemetryEncoder, index

REPO_ROOT = Path(__file__).resolve().parent.parent
FUZZ_CASES_CPYTHON = 100_000
FUZZ_CASES_MPY = 10_000
FUZZ_CASES_BRIDGE = 100_000  # differential: the bridge's decoder beside the reference
FUZZ_SEED = 1
RUN_S = 1.0  # length of one timing run
RUNS = 3  # best of

# A full telemetry frame (all 16 fields) with realistic values, wire units.
TELEMETRY = {
    "uptime_s": 273_512,
    "state": C.STATE_HOSTED,
    "reason": C.REASON_HOST_OK,
    "faults": 0,
    "temp_gpu": 72_312,
    "temp_vram": 68_150,
    "temp_mos": 55_020,
    "temp_amb": 24_480,
    "fan1_rpm": 2_850,
    "fan2_rpm": 2_790,
    "fan1_duty": 32_768,
    "fan2_duty": 30_147,
    "v_in": 11_920,
    "i_in": 1_534,
    "p_in": 18_285,
    "target": -2_688,
}

# Runs under MicroPython; prints one JSON object.
_MPY_TELEMETRY = """
import gc, json, micropython, time
from protocol.telemetry import TelemetryEncoder, index
FIELDS = %r
enc = TelemetryEncoder()
for name in FIELDS:
    enc.set(index(name), FIELDS[name])
T = index("temp_gpu")
F = index("fan1_rpm")
I = index("i_in")
def burst(n, seq):
    # changing values and seq, no allocation: small ints only
    k = 0
    while k < n:
        enc.set(T, 60000 + (k & 0x3FFF))
        enc.set(F, 2000 + (k & 0x3FF))
        enc.set(I, -500 + (k & 0x7FF))
        enc.encode_cbor((seq + k) & 0xFFFF)
        k += 1
def burst_json(n):
    k = 0
    while k < n:
        enc.set(T, 60000 + (k & 0x3FFF))
        enc.encode_json(k & 0xFFFF)
        k += 1
burst(200, 0)
burst_json(200)
gc.collect()
before = gc.mem_alloc()
burst(1000, 7)
after = gc.mem_alloc()
alloc = (after - before) / 1000
locked = 1
try:
    micropython.heap_lock()
    try:
        burst(1000, 11)
    finally:
        micropython.heap_unlock()
except MemoryError:
    locked = 0
locked_json = 1
try:
    micropython.heap_lock()
    try:
        burst_json(1000)
    finally:
        micropython.heap_unlock()
except MemoryError:
    locked_json = 0
gc.collect()
best = 0
for _ in range(3):
    n = 0
    t0 = time.ticks_us()
    while True:
        burst(500, n)
        n += 500
        dt = time.ticks_diff(time.ticks_us(), t0)
        if dt >= 500000:
            break
    rate = n * 1000000 / dt
    if rate > best:
        best = rate
print(json.dumps({"alloc": alloc, "locked": locked, "locked_json": locked_json, "rate": best}))
"""

_MPY_FUZZ = """
import json
from modbridge.firmware_host import fuzz
r = fuzz.run(%d, %d)
print(json.dumps({"cases": r["cases"], "escaped": r["escaped"], "bugs": r["decoder_bugs"],
                  "lost": r["sentinels_lost"], "inconsistent": r["inconsistent"],
                  "missed": len(r["missed"]), "ms": r["elapsed_ms"]}))
"""


def find_micropython():
    from modbridge.tools.mpy import micropython_path

    return micropython_path()


def run_micropython(code, timeout=300):
    """Run ``code`` under MicroPython with the repo importable; return its JSON output."""
    env = dict(os.environ)
    env["MICROPYPATH"] = ":".join([".frozen", str(REPO_ROOT), str(REPO_ROOT / "host")])
    proc = subprocess.run(
        [find_micropython(), "-X", "heapsize=4M", "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError("micropython failed:\n" + proc.stdout + proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _best_rate(step, batch):
    """Best of RUNS runs of about RUN_S seconds: calls of ``step`` per second."""
    best = 0.0
    for _ in range(RUNS):
        n = 0
        start = time.perf_counter()
        while True:
            for _ in range(batch):
                step()
            n += batch
            elapsed = time.perf_counter() - start
            if elapsed >= RUN_S:
                break
        best = max(best, n / elapsed)
    return best


def telemetry_sizes():
    enc = TelemetryEncoder()
    for name, value in TELEMETRY.items():
        enc.set(index(name), value)
    n_cbor = enc.encode_cbor(4242)
    frame = encode_frame(C.T_TELEMETRY, TELEMETRY, 4242)
    assert bytes(enc.out[:n_cbor]) == frame, "TelemetryEncoder and encode_frame disagree"
    n_json = enc.encode_json(4242)
    return n_cbor, n_json


def bridge_decoder():
    """The decoder class the bridge's ModuleLink feeds (CPython fast path over cbor2,
    falling back to the reference), by its public name wherever the link keeps it."""
    try:
        from modbridge.link.codec import HostDecoder
    except ImportError:
        from modbridge.link.session import HostDecoder
    return HostDecoder


def codec_rates():
    """Full telemetry frames per second on CPython: encode (``encode_frame``, the one
    encoder of both the bridge and the reference), then decode with the reference
    StreamDecoder and with the bridge's decoder (module -> host frames, as a link
    gets them)."""
    seq = [0]

    def encode():
        seq[0] = (seq[0] + 1) & 0xFFFF
        return encode_frame(C.T_TELEMETRY, TELEMETRY, seq[0])

    frames = [encode_frame(C.T_TELEMETRY, TELEMETRY, s) for s in range(256)]
    rates = {"encode": _best_rate(encode, 100)}
    for name, dec in (("reference", StreamDecoder(accept=C.D2H)), ("bridge", bridge_decoder()())):
        pos = [0]

        def decode(dec=dec, pos=pos):
            pos[0] = (pos[0] + 1) & 0xFF
            return dec.feed(frames[pos[0]])

        got = dec.feed(encode())
        assert len(got) == 1 and got[0].ok and got[0].fields == TELEMETRY, (name, got)
        rates[name] = _best_rate(decode, 100)
        assert dec.error_total() == 0, (name, dec.errors)
        if name == "bridge":  # every good frame took the fast path, none fell back
            assert dec.fast_frames == dec.frames, (dec.fast_frames, dec.frames)
    return rates


def run():
    out = {}
    n_cbor, n_json = telemetry_sizes()
    out["telemetry_frame_bytes_cbor"] = n_cbor
    out["telemetry_frame_bytes_json"] = n_json

    rates = codec_rates()
    out["codec_encode_frames_per_s_cpython"] = round(rates["encode"])
    out["codec_decode_frames_per_s_reference_cpython"] = round(rates["reference"])
    out["codec_decode_frames_per_s_bridge"] = round(rates["bridge"])

    mpy = run_micropython(_MPY_TELEMETRY % (TELEMETRY,))
    out["telemetry_encode_per_s_mpy"] = round(mpy["rate"])
    out["telemetry_encode_alloc_bytes_mpy"] = float(mpy["alloc"])
    out["telemetry_encode_heap_locked_mpy"] = int(mpy["locked"])
    out["telemetry_encode_json_heap_locked_mpy"] = int(mpy["locked_json"])

    r = fuzz.run(FUZZ_CASES_CPYTHON, FUZZ_SEED)
    m = run_micropython(_MPY_FUZZ % (FUZZ_CASES_MPY, FUZZ_SEED), timeout=900)
    out["fuzz_frames_cpython"] = r["cases"]
    out["fuzz_frames_mpy"] = m["cases"]
    out["fuzz_escaped_exceptions"] = r["escaped"] + m["escaped"]
    out["fuzz_decoder_bugs"] = r["decoder_bugs"] + m["bugs"]
    out["fuzz_sentinels_lost"] = r["sentinels_lost"] + m["lost"]
    out["fuzz_inconsistent_counters"] = r["inconsistent"] + m["inconsistent"]
    out["fuzz_missed_aims"] = len(r["missed"]) + m["missed"]
    out["fuzz_frames_per_s_cpython"] = round(r["cases"] * 1000 / max(r["elapsed_ms"], 1))

    d = fuzz.differential(FUZZ_CASES_BRIDGE, FUZZ_SEED, bridge_decoder())
    out["fuzz_frames_bridge_decoder"] = d["cases"]
    out["fuzz_bridge_disagreements"] = d["disagreements"]
    out["fuzz_bridge_escaped_exceptions"] = d["escaped_other"]
    out["fuzz_bridge_fast_path_frames"] = d["fast_frames"]
    out["fuzz_bridge_missed_aims"] = len(d["missed"])
    out["fuzz_frames_per_s_mpy"] = round(m["cases"] * 1000 / max(m["ms"], 1))
    return out


if __name__ == "__main__":
    for key, value in sorted(run().items()):
        print(f"{key:<40} {value}")
