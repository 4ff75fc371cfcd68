"""Every signal that would end the bridge restores the limits like SIGTERM (issue 23,
item 7): on 4092283 SIGUSR1 and SIGUSR2 killed it with the GPU left lowered (the
journal caught it only at the next start). End to end on the file GPU (a real Bridge
in a child process, tests/test_kill_restore.py's), and the set itself against the
signal(7) table."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from filegpu import FileGpu
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kill_restore import TRUE_ORIGINAL_W, finish, ready, spawn

from modbridge.actuator.power import SIGNALS, install_signal_handlers, signal_name

# signal(7): the signals whose default action is Term or Core.
_TERM_OR_CORE = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS",
                 "SIGFPE", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM",
                 "SIGSTKFLT", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR",
                 "SIGSYS")  # fmt: skip
# ...less the process's own faults (nothing can go on after them: the journal's job,
# as for SIGKILL) and those CPython ignores at start (the call fails instead).
_NOT_CATCHABLE_HERE = ("SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGSEGV",
                       "SIGSYS", "SIGPIPE", "SIGXFSZ")  # fmt: skip
ORACLE = sorted(
    {getattr(signal, n) for n in _TERM_OR_CORE if hasattr(signal, n)}
    - {getattr(signal, n) for n in _NOT_CATCHABLE_HERE if hasattr(signal, n)}
    | set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
)


def test_the_set_is_every_ending_signal_of_signal_7():
    assert sorted(int(s) for s in SIGNALS) == [int(s) for s in ORACLE]
    assert signal_name(signal.SIGRTMIN + 3) == "SIGRTMIN+3"


@pytest.mark.parametrize(
    "sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPWR, signal.SIGXCPU,
            signal.SIGRTMIN + 2],
    ids=signal_name)  # fmt: skip
def test_a_signal_that_ends_the_bridge_restores_the_limit_first(tmp_path, sig):
    gpu = FileGpu.create(tmp_path / "gpu.json", limit_w=TRUE_ORIGINAL_W)
    proc = spawn(tmp_path, seed=5)
    try:
        ready(proc)
        deadline = time.monotonic() + 60
        while gpu.read()["writes"] < 4 and time.monotonic() < deadline:  # lowered, held
            time.sleep(0.01)
        assert gpu.read()["writes"] >= 4
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        finish(proc)
    assert proc.returncode == 0, (proc.returncode, err)  # docs/bridge.md: 0, restored
    stopped = json.loads(out.split("stopped ", 1)[1])
    assert stopped == {"limit_w": TRUE_ORIGINAL_W, "lock": None, "ok": True}
    assert gpu.limit_w == TRUE_ORIGINAL_W
    assert not (tmp_path / "state" / "limits").exists() or not os.listdir(
        tmp_path / "state" / "limits")  # fmt: skip


class _Limiter:
    uuid = "GPU-x"

    def __init__(self):
        self.closed = []

    def close(self, reason):
        self.closed.append(reason)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(ORACLE))
def test_property_any_ending_signal_closes_every_limiter_then_exits_128_plus_n(sig):
    """power.install_signal_handlers (``modbridge restore``, the limiter's own users):
    a signal from the oracle's set closes (restores) every limiter, then the process
    exits 128 + n."""
    lims = [_Limiter(), _Limiter()]
    uninstall = install_signal_handlers(lims)
    try:
        with pytest.raises(SystemExit) as e:
            os.kill(os.getpid(), sig)
            for _ in range(1000):  # the handler runs at the next bytecode boundary
                time.sleep(0.001)
        assert e.value.code == 128 + sig
        assert [lim.closed for lim in lims] == [[f"signal {signal_name(sig)}"]] * 2
    finally:
        uninstall()
