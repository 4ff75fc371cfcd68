"""A paused bridge and a noisy line against the silence verdict (issue 23 item 2).

The bridge runs in a child process of this one (``python -m bench.bench_pause
--bridge``: the real :class:`~modbridge.bridge.Bridge` on one virtual module of
bench/bench_bridge.py's fleet child, itself a process of its own, in real time). This
process stops the bridge's process with SIGSTOP and resumes it with SIGCONT, the
module writing all along. Keys:

    false_silence_after_pause       module_silent decisions over the pauses (goal 0)
    pauses / pause_s_{min,max,total}, pauses_{short,mid,long}   the pause distribution:
                                    short 0.5-1 s, mid 2-5 s, long 30 s
    critical_cuts_from_single_lost_frame   CRITICAL decisions over the noise bursts (0)
    noise_bursts                    bursts of 16 bytes that each destroyed one frame
    silence_detect_s_{p50,max}      a hung module (no frame any more, still plugged):
                                    from its last frame to the module_silent decision
    unplug_detect_s_{p50,max}       an unplugged module: from the unplug to it
    silence_samples / unplug_samples

Run alone: ``python -m bench.run pause`` (about 6 minutes).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHORT, MID, LONG = 84, 14, 2  # >= 100 pauses
NOISE_BURSTS = 100
LATENCY_S = 40.0
if os.environ.get("BENCH_PAUSE_QUICK"):  # a smoke run of the bench itself
    SHORT, MID, LONG, NOISE_BURSTS, LATENCY_S = 3, 1, 0, 3, 8.0
GARBAGE = bytes(range(1, 17))  # 16 bytes, no 0x00: they land inside one frame


def _pauses(rng: random.Random) -> list[float]:
    p = [rng.uniform(0.5, 1.0) for _ in range(SHORT)] + [rng.uniform(2.0, 5.0) for _ in range(MID)]
    p += [30.0] * LONG
    rng.shuffle(p)
    return p


def run() -> dict:
    rng = random.Random(23)
    pauses = _pauses(rng)
    child = subprocess.Popen([sys.executable, "-m", "bench.bench_pause", "--bridge"],
                             cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, bufsize=1)  # fmt: skip
    try:
        line = child.stdout.readline()
        if json.loads(line).get("k") != "ready":
            raise RuntimeError(f"bridge child: {line!r}")
        for d in pauses:
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(d)
            os.kill(child.pid, signal.SIGCONT)
            time.sleep(0.4)  # frames read, a tick or two
        child.stdin.write("paused\n")
        child.stdin.flush()
        out = json.loads(child.stdout.readline())
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.stdin.close()
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
    out.update(
        pauses=len(pauses), pauses_short=SHORT, pauses_mid=MID, pauses_long=LONG,
        pause_s_min=round(min(pauses), 3), pause_s_max=round(max(pauses), 3),
        pause_s_total=round(sum(pauses), 1),
    )  # fmt: skip
    return out


def _silent(rec, uuid, t0):
    for t, d in rec.decisions[uuid]:
        if t >= t0 and d.get("level") == "CRITICAL" and "module_silent" in d["reasons"]:
            return t, d
    return None


def _bridge_child() -> None:
    from bench._bridge_cpu_child import bench_config, virtual_gpus
    from bench.bench_bridge import Recorder, _silent_worker, start_fleet
    from modbridge.bridge import Bridge
    from modbridge.gpu.virtual import VirtualBackend

    fleet, ports, keys_dir = start_fleet([None, None, None])  # the firmware's default period
    bridge = None
    try:
        gpus = virtual_gpus(3)
        backend = VirtualBackend(gpus)
        rec = Recorder()
        rec.wrap_backend(backend)
        cfg = bench_config(ports, gpus, exporter_enabled=False, keys_dir=keys_dir,
                           policy={"min_hold_s": 1.0})  # fmt: skip
        bridge = Bridge(cfg, backend, ports, event_log=rec.event_log()).start()
        threading.Thread(target=bridge.run, name="bridge-loop", daemon=True).start()
        links = list(bridge.links.values())
        end = time.monotonic() + 30
        while not all(lk.link_up and lk.status.freshness for lk in links):
            if time.monotonic() > end:
                raise RuntimeError("links not up")
            time.sleep(0.05)
        # 1. the pauses (module 0): SIGSTOP/SIGCONT from the parent
        t0 = time.monotonic()
        print(json.dumps({"k": "ready"}), flush=True)
        sys.stdin.readline()
        out = {"false_silence_after_pause": sum(
            1 for t, d in rec.decisions[gpus[0].uuid] if t >= t0 and "module_silent" in d["reasons"]
            and d.get("level") == "CRITICAL")}  # fmt: skip
        # 2. noise (module 0): 16 bytes inside one frame as the bridge reads it
        link, st = links[0], links[0].status
        real_read, armed = link._read, []

        def noisy_read():
            data = real_read()
            if armed and len(data) > 8:
                armed.clear()
                data = data[:3] + GARBAGE + data[3:]
            return data

        link._read = noisy_read
        t0, bursts = time.monotonic(), 0
        for _ in range(NOISE_BURSTS):
            errors = sum(st.frame_errors.values())
            armed.append(1)
            end = time.monotonic() + 5
            while sum(st.frame_errors.values()) == errors and time.monotonic() < end:
                time.sleep(0.02)
            bursts += sum(st.frame_errors.values()) > errors
            time.sleep(0.6)
        link._read = real_read
        out["noise_bursts"] = bursts
        out["critical_cuts_from_single_lost_frame"] = sum(
            1 for t, d in rec.decisions[gpus[0].uuid] if t >= t0 and d.get("level") == "CRITICAL")
        # 3. detection latencies: module 1 hangs, module 2 is unplugged, repeatedly
        hung, unplugged, errs = [], [], []
        stop_at = time.monotonic() + LATENCY_S
        workers = [threading.Thread(target=_silent_worker, daemon=True, args=(
            i, how, fleet, bridge, ports[i], rec, gpus[i].uuid, stop_at, o, errs,
            random.Random(i))) for i, how, o in ((1, "pause", hung), (2, "unplug", unplugged))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(LATENCY_S + 40)
        for name, got in (("silence", hung), ("unplug", unplugged)):
            s = sorted(t for t, _ in got)
            out[f"{name}_samples"] = len(s)
            if s:
                out[f"{name}_detect_s_p50"] = round(statistics.median(s), 3)
                out[f"{name}_detect_s_max"] = round(s[-1], 3)
        out["latency_errors"] = len(errs)
        print(json.dumps(out), flush=True)
    finally:
        if bridge is not None:
            bridge.stop("bench over")
        fleet.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--bridge"]:
        _bridge_child()
    else:
        print(json.dumps(run(), indent=1))
