"""Issue 9, "Storms and silence": a dead link thread was never restarted on b2cd58d.

Reproduction through the real bridge on a virtual module. The links now share one I/O
thread (:class:`~modbridge.link.io.LinkIO`, a selector over every port) with two
supervisors: the hub's loop, and each link's step. Neither exposes a public fault
switch, so the fault is injected the way ``tests/test_link.py`` does it, by making the
next call of the loop's (or the link's) own method raise. Public behaviour checked:
the thread is the same and alive, the failure is logged at ERROR once per episode and
counted, the bridge reports the link's reconnect as a ``link`` event, telemetry keeps
coming, and a fan stall after the restart is still acted on.
"""

from __future__ import annotations

import logging

from e2e_helpers import WARN_W, bridged, wait_for

from modbridge.policy.engine import WARN


def break_next(obj, name, failures, exc):
    """The next ``failures`` calls of ``obj.<name>`` raise ``exc``; returns the count."""
    real = getattr(obj, name)
    raised = []

    def broken(*a, **kw):
        if len(raised) < failures:
            raised.append(1)
            raise exc
        return real(*a, **kw)

    setattr(obj, name, broken)
    return raised


def errors(caplog, text):
    return [r for r in caplog.records if r.levelname == "ERROR" and text in r.getMessage()]


def test_the_io_thread_and_a_link_are_restarted_reported_and_still_protect(caplog):
    with bridged() as r, caplog.at_level(logging.INFO):
        io = r.bridge.io
        [link] = r.bridge.links.values()
        thread = io.thread
        # the hub's own loop dies (twice in a row: one episode)
        raised = break_next(io, "_sync", 2, RuntimeError("selector bug"))
        wait_for(lambda: len(raised) == 2 and io.restarts == 2, 10, "two hub restarts")
        assert io.thread is thread and thread.is_alive()
        assert (io.episodes, io.failing) == (1, True) and "selector bug" in io.error
        assert len(errors(caplog, "I/O thread failed")) == 1  # once per episode
        assert link.thread_restarts == 2 and "selector bug" in link.thread_error
        seen = r.vm.telemetry_count
        wait_for(lambda: r.module().telemetry.get("uptime_s", 0) >= 3 and
                 r.vm.telemetry_count > seen + 3, 10, "telemetry after the restart")  # fmt: skip
        # one link's step dies: that link is closed, backed off and reopened
        reconnects = link.status.reconnects
        raised = break_next(link, "_service", 1, RuntimeError("decoder bug"))
        wait_for(lambda: raised and link.status.reconnects > reconnects, 10, "a reconnect")
        wait_for(lambda: link.link_up, 10, "the link up again")
        assert len(errors(caplog, "link thread failed")) == 1
        assert "decoder bug" in link.thread_error and link.thread_restarts == 3
        wait_for(lambda: r.events("link", up=True, reconnects=link.status.reconnects), 10,
                 "the bridge reports the reconnect")  # fmt: skip
        # and it still protects: a fan stall after both restarts lowers the limit
        r.vm.world_fault("fan_stall", 0)
        wait_for(lambda: r.pair().level == WARN, 10, "WARN on a stalled fan")
        wait_for(lambda: r.gpu.power_limit_w() == WARN_W, 5, "the WARN cut")
        assert r.bridge.tick_errors == 0
