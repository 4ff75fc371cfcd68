"""Issue 9, "Storms and silence": a refused restore (permission lost mid-run) was
retried every tick on b2cd58d, 86 alerts in 17 s.

Reproduction through the real bridge on a virtual module: the limit is lowered for a
stalled fan, then the driver starts refusing every write (``GpuNoPermission``, as
NVML says after a permission change), and the fan recovers. The restore is refused:
one alert for the episode, tries backed off exponentially (1, 2, 4 s ...) and each
one counted; when the permission is back the next try restores the original and a
``recovered`` event closes the episode.
"""

from __future__ import annotations

import math

from e2e_helpers import ORIGINAL_W, WARN_W, bridged, wait_for

from modbridge.actuator.power import BACKOFF_FIRST_S
from modbridge.gpu.base import GpuNoPermission
from modbridge.policy.engine import NORMAL

DENIED_S = 5.0  # wall seconds the permission stays lost


class LosingPermission:
    """The virtual backend; while ``denied`` every power-limit write is refused."""

    def __init__(self, inner):
        self._inner = inner
        self.name = inner.name
        self.denied = False
        self.refused = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def set_power_limit_w(self, uuid, watts):
        if self.denied:
            self.refused += 1
            raise GpuNoPermission(f"setting the power limit of {uuid}: Insufficient Permissions")
        return self._inner.set_power_limit_w(uuid, watts)


def test_a_refused_restore_is_one_alert_per_episode_backed_off_and_counted(tmp_path):
    with bridged(backend_wrap=LosingPermission, state_dir=tmp_path) as r:
        backend = r.bridge.backend
        r.vm.world_fault("fan_stall", 0)
        wait_for(lambda: r.gpu.power_limit_w() == WARN_W, 10, "the WARN cut")
        backend.denied = True
        r.vm.world_fault("fan_stall", 0, False)
        wait_for(lambda: r.pair().level == NORMAL, 15, "NORMAL (the restore is due)")
        wait_for(lambda: backend.refused >= 1, 5, "a refused restore")
        ticks = r.bridge.ticks
        wait_for(lambda: r.bridge.ticks >= ticks + DENIED_S / r.bridge.config.tick_s * 0.8,
                 DENIED_S * 3, "ticks while denied")  # fmt: skip
        spent = (r.bridge.ticks - ticks) * r.bridge.config.tick_s
        alerts = r.events("power_limit", action="refused")
        assert len(alerts) == 1 and alerts[0]["level"] == "alert", alerts  # one per episode
        assert alerts[0]["backoff_s"] == BACKOFF_FIRST_S
        # 1, 2, 4 s ... apart: at most 1 + log2(time) tries, not one per tick
        most = 2 + math.ceil(math.log2(spent / BACKOFF_FIRST_S + 1))
        assert 1 <= backend.refused <= most, (backend.refused, spent, most)
        assert r.bridge.ticks - ticks > 4 * most  # ... while the loop ticked on
        assert r.pair().limit_writes_refused == backend.refused  # each try counted
        assert r.gpu.power_limit_w() == WARN_W  # nothing else was written
        # permission back: the next try restores, and the episode ends
        backend.denied = False
        [ok] = wait_for(lambda: r.events("power_limit", action="recovered"), 20, "recovered")
        assert ok["refusals"] == backend.refused
        wait_for(lambda: r.gpu.power_limit_w() == ORIGINAL_W, 5, "the original limit")
        assert len(r.events("power_limit", action="refused")) == 1
        assert r.bridge.tick_errors == 0
