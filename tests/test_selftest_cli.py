"""`modbridge selftest`: it says what it is doing while it runs (it printed nothing
for 38 s), and Ctrl-C aborts the module's self-test (fans back to the controller)
with one line and exit 130, instead of click's `Aborted!` with the test left running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

MODBRIDGE = str(Path(sys.executable).parent / "modbridge")


def test_progress_then_ctrl_c_aborts_the_selftest():
    proc = subprocess.Popen([MODBRIDGE, "selftest", "--sim"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        first = proc.stderr.readline()  # the virtual module is up, the test sent
        assert first.startswith("modbridge selftest: self-test running"), first
        time.sleep(1.0)  # the module is stepping its fans
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "interrupted: self-test aborted, the fans are back" in err, err
    assert "Aborted!" not in err and "Traceback" not in err, err
