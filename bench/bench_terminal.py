"""Terminal escapes: wire text that reaches the operator's terminal raw (issue 23 item 8).

A counterfeit module on a real pty (tests/test_terminal_escapes.py ``HostilePeer``)
answers every request with one string of a hostile corpus (OSC, CSI, DCS, C1
controls, bidi overrides and isolates, zero-width characters, CR/LF that forge a
``modbridge:`` line, BS, DEL, NUL; a boot banner with invalid UTF-8), and every
command that prints module text runs against it: ``config get``, ``set`` (fan, mode,
setpoint), ``config set``, ``reboot``, ``selftest``, ``status``, ``list``, ``doctor``,
``monitor``, ``pair``, ``console``. ``escapes_reaching_terminal`` counts the code
points a terminal or a log reader acts on, plus forged lines, over all of their
output (goal 0). GPU: a virtual one (never a real GPU).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def run() -> dict:
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import pytest
    import test_terminal_escapes as T

    mp = pytest.MonkeyPatch()
    t0 = time.monotonic()
    escapes = outputs = chars = 0
    try:
        T._virtual_gpu_backend(mp)
        for s in T.HOSTILE:
            with tempfile.TemporaryDirectory() as d:
                d = Path(d)
                os.makedirs(d / "state", mode=0o700)
                with T.HostilePeer(s, symlink=d / "mod0", telemetry_period_s=0.2) as peer:
                    outs = T._run_all(peer, d)
            for text in outs.values():
                escapes += T.escapes_in(text)
                outputs += 1
                chars += len(text)
    finally:
        mp.undo()
    return {
        "escapes_reaching_terminal": escapes,
        "terminal_corpus_strings": len(T.HOSTILE),
        "terminal_commands_checked": len(T.COMMANDS) + 1,  # + console
        "terminal_outputs_checked": outputs,
        "terminal_output_chars": chars,
        "terminal_escape_check_s": round(time.monotonic() - t0, 3),
    }
