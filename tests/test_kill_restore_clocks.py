"""The crash ratchet for locked clocks, and why it cannot happen: a bridge with
``actuator = "clocks"`` SIGKILLed at random instants across lock / hold / unlock,
restarted each time, always ends at the true original lock.

The GPU is a file (tests/filegpu.py) that remembers its lock across the killed
processes. Two GPUs: one that reads its lock back (the virtual GPU's way; the true
original is an operator's ``-lgc 345,1800``, so a run that adopted a lowered lock as
the original would ratchet 1800 -> 1440 -> ...), and one that cannot (NVML's way; the
true original is "unlocked"). SIGHUP/SIGQUIT/SIGTERM unlock like a stop: see
test_kill_restore.py.
"""

from __future__ import annotations

import random
import signal
import time

import pytest
import test_kill_restore as base
from filegpu import FileGpu
from test_kill_restore import finish, ready

SEED = 11

def spawn(tmp_path, seed):
    return base.spawn(tmp_path, seed, actuator="clocks")


def as_lock(value):
    return None if value is None else tuple(value)


@pytest.mark.parametrize(
    "lock_known,original,iterations",
    [(True, (345, 1800), 100), (False, None, 50)],
    ids=["lock-readable", "nvml-like"],
)
def test_sigkill_at_random_instants_never_ratchets_the_clocks(
    tmp_path, lock_known, original, iterations
):
    gpu = FileGpu.create(tmp_path / "gpu.json", write_delay_s=0.001)
    gpu.update(lock=None if original is None else list(original), lock_known=lock_known)
    rng = random.Random(SEED)
    seen_low = 0  # kills that left the GPU locked below its original
    # On a loaded machine a process takes longer to reach its hold, and fewer of the
    # kills land in it: go on (up to 3x) until a quarter of the planned count did.
    i = -1
    while i + 1 < iterations or (seen_low < iterations // 4 and i + 1 < 3 * iterations):
        i += 1
        proc = spawn(tmp_path, seed=SEED * 1000 + i)
        try:
            if rng.random() < 0.15:
                time.sleep(rng.uniform(0.0, 0.25))  # possibly mid journal restore
            else:
                st = ready(proc)
                assert as_lock(st["lock"]) == original, (i, st)
                assert as_lock(st["original"]) == original, (i, st)
                assert st["holding"] is False and st["limit_w"] == 700.0, (i, st)
                time.sleep(rng.uniform(0.0, 0.06))
            proc.send_signal(signal.SIGKILL)
        finally:
            finish(proc)
        if gpu.lock != original:
            seen_low += 1
            assert gpu.lock is not None and gpu.lock[1] < (original or (0, 1980))[1]
    assert seen_low >= iterations // 4, seen_low  # the kills really landed mid-hold
    st, stopped = base.clean_run(tmp_path, actuator="clocks")
    assert as_lock(st["lock"]) == original and as_lock(stopped["lock"]) == original
    assert gpu.lock == original and gpu.limit_w == 700.0
    assert not list((tmp_path / "state" / "clocks").glob("*.json"))
