"""The bridge's file descriptors (docs/bridge.md, "File descriptors").

A power-limit write needs descriptors of its own: the journal's temporary file and its
directory (``fsutil.atomic_write``), the event log's line, NVML's device nodes. Issue
23 was a bridge whose metrics endpoint took a thread and a descriptor per connection
with no bound: a local user's idle connections used up RLIMIT_NOFILE and the journal
write before a lowering failed with EMFILE, so the limit was not lowered. Now:

* every server in the bridge holds a bounded number of connections (the exporter's
  :class:`~modbridge.exporter.server.ServerLimits`, sized from the soft limit so that
  :data:`RESERVED_FDS` stay free for the rest; the control socket's ``MAX_CLIENTS``);
* ``modbridge run`` raises its soft limit to the hard one at start
  (:func:`raise_nofile`, at most :data:`NOFILE_CAP`): the unit sets ``LimitNOFILE=``,
  a shell's ``ulimit -n`` is often 1024 under a higher hard limit.
"""

from __future__ import annotations

import logging

try:
    import resource
except ImportError:  # not Unix
    resource = None

log = logging.getLogger(__name__)

#: the soft limit ``modbridge run`` asks for, at most (the hard limit may be lower)
NOFILE_CAP = 65536
#: Descriptors kept for the bridge itself, whatever its servers' clients hold: module
#: ports, NVML's device nodes, the GPU locks, the event log, selectors and wake-up
#: pipes, and a journal write (a temporary file and the directory, at once). The
#: exporter's limits take at most a quarter of what the soft limit leaves beyond it.
RESERVED_FDS = 128
#: below this soft limit a warning says the bridge is short of descriptors
LOW_NOFILE = 256


def nofile() -> tuple[int | None, int | None]:
    """(soft, hard) RLIMIT_NOFILE; None for unlimited (or not Unix)."""
    if resource is None:
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else soft), (None if hard == inf else hard)


def raise_nofile(cap: int = NOFILE_CAP) -> tuple[int | None, int | None]:
    """Raise the soft RLIMIT_NOFILE to ``min(hard, cap)``; never lowers it. Returns the
    soft limit (before, after); a refusal is logged and leaves it as it was."""
    if resource is None:
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    want = cap if hard == inf else min(hard, cap)
    before = None if soft == inf else soft
    if soft != inf and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, e)
            return before, before
        log.info("open-file limit raised from %d to %d (hard limit %s)", soft, want,
                 "unlimited" if hard == inf else hard)  # fmt: skip
    after = nofile()[0]
    if after is not None and after < LOW_NOFILE:
        log.warning("only %d file descriptors (RLIMIT_NOFILE, hard limit %s): the metrics "
                    "endpoint takes fewer connections; give the bridge LimitNOFILE= or "
                    "ulimit -n of %d or more", after, "unlimited" if hard == inf else hard,
                    LOW_NOFILE)  # fmt: skip
    return before, after
