"""A benchmark's child process that speaks JSON lines: every line it prints is kept
(an ``{"k": "eof"}`` line marks its end) and can be waited for; commands go to its
stdin. bench_bridge's fleet and bridge children and bench_flood's bridge and attacker
are each one of these."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class JsonLinesChild:
    """``argv`` started in the repository root; ``label`` names it when it exits."""

    def __init__(self, argv: list[str], label: str = "child", preexec=None):
        self.label = label
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1,
                                     preexec_fn=preexec)  # fmt: skip
        self.lines: list[dict] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                with self.cond:
                    self.lines.append(obj)
                    self.cond.notify_all()
        with self.cond:
            self.lines.append({"k": "eof"})
            self.cond.notify_all()

    def wait_for(self, pred, timeout: float, start: int = 0) -> dict | None:
        """The first line (from index ``start``) matching ``pred``; None on timeout;
        RuntimeError if the child exited first."""
        end = time.monotonic() + timeout
        with self.cond:
            i = start
            while True:
                while i < len(self.lines):
                    obj = self.lines[i]
                    i += 1
                    if obj.get("k") == "eof":
                        raise RuntimeError(f"{self.label} exited (rc {self.proc.poll()})")
                    if pred(obj):
                        return obj
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
