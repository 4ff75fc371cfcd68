"""Failures counted in episodes, for the link's supervisors (one per link, one for the
I/O thread's own loop): the first failure of an episode is logged at ERROR with its
traceback, the rest at DEBUG; the restart back-off doubles from ``backoff_min_s`` to
``backoff_max_s``; ``healthy_s`` without a failure ends the episode (INFO)."""

from __future__ import annotations

import logging
import time

from modbridge.sanitize import sanitize


class Episodes:
    """``restarts`` (every failure), ``episodes``, ``failing`` (in one now), ``error``
    (the last failure, one line), ``backoff`` (the next restart's delay, s)."""

    def __init__(self, what: str, log: logging.Logger, backoff_min_s: float,
                 backoff_max_s: float, healthy_s: float, counted_in: str):  # fmt: skip
        self.what, self.log, self.counted_in = what, log, counted_in
        self.backoff_min_s, self.backoff_max_s, self.healthy_s = (
            backoff_min_s, backoff_max_s, healthy_s)  # fmt: skip
        self.restarts = 0
        self.episodes = 0
        self.failing = False
        self.error: str | None = None
        self.backoff = backoff_min_s
        self.failed_at = 0.0  # time.monotonic() of the last failure

    def failed(self, exc: BaseException) -> str:
        """Count and report one failure; returns the one-line message."""
        self.restarts += 1
        self.failed_at = time.monotonic()
        self.error = f"{type(exc).__name__}: {sanitize(exc)}"
        msg = f"{self.what} failed ({self.error}): restarting it"
        if not self.failing:
            self.failing = True
            self.episodes += 1
            self.backoff = self.backoff_min_s
            self.log.error("%s (logged once until it runs %g s without failing; restarts are "
                           "counted in %s)", msg, self.healthy_s, self.counted_in,
                           exc_info=exc)  # fmt: skip
        else:
            self.backoff = min(self.backoff * 2, self.backoff_max_s)
            self.log.debug("%s (restart %d)", msg, self.restarts)
        return msg

    def check_recovered(self) -> None:
        """End the episode once ``healthy_s`` passed without a failure."""
        if self.failing and time.monotonic() - self.failed_at >= self.healthy_s:
            self.failing = False
            self.backoff = self.backoff_min_s
            self.log.info("%s running again (%g s without failing; %d restarts so far)",
                          self.what, self.healthy_s, self.restarts)  # fmt: skip


def supervised(name: str) -> property:
    """A read-only attribute of the owner's ``supervision`` (:class:`Episodes`)."""
    return property(lambda self: getattr(self.supervision, name), doc=f"supervision.{name}")
