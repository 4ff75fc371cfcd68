"""The safety invariants of docs/safety.md under a seeded random walk (both interpreters).

The same harness and action catalogue as the hypothesis state machine
(tests/test_safety_machine.py), driven by a small PRNG so it runs under MicroPython
too: commands of every type (signed, unsigned, forged, replayed; CBOR and JSON),
garbage, temperatures, open/short sensors, power, stalled and noisy fans, host
presence and absence, reboots and time, with every invariant checked on every tick.
"""

from safety_harness import Harness, random_action

DUAL = True
MPY_TIMEOUT = 1200


class Rng:
    """Park-Miller minimal standard generator: the same sequence on both interpreters."""

    def __init__(self, seed):
        self.x = seed % 2147483647 or 1

    def __call__(self, n):
        self.x = self.x * 48271 % 2147483647
        return self.x % n


def walk(seed, steps):
    rnd = Rng(seed)
    h = Harness()
    for _ in range(steps):
        random_action(h, rnd)
    assert h.violations == 0
    assert h.ticks_checked > steps, (h.ticks_checked, steps)
    return h


def test_walk_seed_1():
    walk(1, 600)


def test_walk_seed_2():
    walk(2, 600)


def test_walk_seed_3():
    walk(20261201, 600)


def test_walk_seed_4():
    walk(77, 600)
