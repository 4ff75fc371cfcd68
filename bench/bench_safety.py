"""Safety benchmark: the invariants under a long random walk, a hostile corpus, auth.

    python -m bench.run safety
    MODBRIDGE_SAFETY_STEPS=20000 python -m bench.run safety    # a shorter walk

Keys (docs/safety.md):

``safety_invariant_steps``        actions of the random walk over the real App on the
                                  fake board (tests/safety_harness.py: commands of
                                  every type signed/unsigned/forged/replayed, garbage,
                                  sensor, fan, power and host faults, reboots, time),
                                  every invariant checked on every control tick;
                                  >= 100,000, split over the machine's cores
``safety_invariant_ticks``        control ticks checked during the walk
``safety_invariant_violations``   invariant violations found (must be 0)
``command_path_crashes``          items of the hostile corpus (bench.hostile) after
                                  which the App raised out of ``step()``, failed a
                                  tick, or answered ``nack internal`` (must be 0)
``hostile_corpus_items``          how many items the corpus has
``unsigned_commands_accepted``    state-changing commands acked although unsigned,
                                  signed with a wrong key, or replayed (must be 0)
``unsigned_commands_tried``       how many such commands were sent
``flash_writes_per_1000_unchanged_saves``  flash writes during 1,000 signed
                                  ``config_save`` of an unchanged config (must be 0)
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
STEPS = int(os.environ.get("MODBRIDGE_SAFETY_STEPS", "100000"))
CHUNK = 2000  # steps per harness (a fresh module every CHUNK actions)


def _path():
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


def _walk(seed_and_steps):
    """One worker: walks of CHUNK steps with consecutive seeds; returns counts."""
    _path()
    from safety_harness import Harness, InvariantError, random_action

    seed, steps = seed_and_steps
    done = 0
    ticks = 0
    violations = []
    while done < steps:
        x = [seed * 7919 + done + 1]

        def rnd(n, x=x):
            x[0] = x[0] * 48271 % 2147483647
            return x[0] % n

        h = Harness()
        n = min(CHUNK, steps - done)
        try:
            for _ in range(n):
                random_action(h, rnd)
        except InvariantError as e:
            violations.append(str(e))
        done += n
        ticks += h.ticks_checked
    return done, ticks, violations


def walk(steps=STEPS):
    workers = max(1, min(2, os.cpu_count() or 1))
    per = (steps + workers - 1) // workers
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(_walk, [(w + 1, per) for w in range(workers)]))
    done = sum(r[0] for r in results)
    ticks = sum(r[1] for r in results)
    violations = [v for r in results for v in r[2]]
    for v in violations[:5]:
        print("  violation:", v)
    return done, ticks, len(violations)


def hostile():
    """Feed the hostile corpus to a fresh module item by item; count crashes."""
    _path()
    from safety_harness import Harness

    from bench.hostile import corpus

    h = Harness()
    crashes = 0
    items = corpus(h)
    for data in items:
        app = h.app
        before = (app.failures, app.internal_errors)
        try:
            h.send_raw(data)
            h.advance(100)
        except Exception as e:  # noqa: BLE001 - this is what is counted
            if type(e).__name__ == "InvariantError" and "I5" not in str(e):
                raise
            crashes += 1
            h = Harness()
            continue
        if (app.failures, app.internal_errors) != before:
            crashes += 1
            h = Harness()
        h.hal.take()
    return crashes, len(items)


def unsigned():
    """Every state-changing command unsigned, forged and replayed: count acks."""
    _path()
    from safety_harness import COMMANDS, Harness

    h = Harness()
    tried = accepted = 0
    opened = ("hello_request", "config_get", "cal_read")
    for name, fields in COMMANDS:
        if name in opened:
            continue
        for how in ("unsigned", "forged"):
            for fmt in ("cbor", "json"):
                tried += 1
                try:
                    got = h.command(name, fields, how, fmt)
                except AssertionError:
                    got = "ack"  # the harness saw it accepted
                if got in ("ack", "reboot"):
                    accepted += 1
                    h = Harness()
    # replays of accepted signed commands
    for name, fields in (("pid_gains", {"kp": 6000}), ("fan_mode", {"mode": 0})):
        h.command(name, fields)
        for _ in range(3):
            tried += 1
            h.hal.take()
            h.send_replay(-1)
            h.advance(300)
            if [m for m in h.hal.take() if m.ok and m.name == "ack"]:
                accepted += 1
    return accepted, tried


def flash_writes():
    _path()
    from safety_harness import Harness

    from device import config

    h = Harness()
    h.command("config_set", {"values": {"pid.kp": 6000}})
    h.command("config_save", {})
    before = config.flash_writes(h.hal.fs_dir)
    for _ in range(1000):
        h.send_signed("config_save", {})
        h.advance(50)
    return config.flash_writes(h.hal.fs_dir) - before


def run() -> dict[str, float]:
    out: dict[str, float] = {}
    steps, ticks, violations = walk()
    out["safety_invariant_steps"] = steps
    out["safety_invariant_ticks"] = ticks
    out["safety_invariant_violations"] = violations
    crashes, n = hostile()
    out["command_path_crashes"] = crashes
    out["hostile_corpus_items"] = n
    accepted, tried = unsigned()
    out["unsigned_commands_accepted"] = accepted
    out["unsigned_commands_tried"] = tried
    out["flash_writes_per_1000_unchanged_saves"] = flash_writes()
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
