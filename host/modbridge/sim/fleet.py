"""Several virtual modules at once, each with its own world, GPU and pty.

``modbridge run --sim``, the end-to-end tests and the bridge benchmarks use this: N
modules cooling N virtual GPUs, each reachable on a stable symlink
(``<dir>/module-<i>``) like a udev rule would give a CH340. Every module gets a
different seed (its noise and its MCU unique id differ) and its own flash directory.

Every module is provisioned with its own signing key (``secret.key`` in its flash
directory) and the fleet keeps the host copies in one :class:`~modbridge.link.keys.KeyStore`
(``keys_dir``, else ``<state_dir>/keys``: temporary unless ``state_dir`` is given),
attached for lookups while the fleet lives: a bridge in this process signs without
being told where the keys are; another process gets the directory (``keys_dir``).

Scheduled faults (``faults=["fan_stall:2@60s-90s", ...]``, see ``sim/faults.py``) need
one clock for the whole fleet: ``run_for`` drives every module in lockstep from the
caller's thread, in steps that end exactly where a fault is due, and paces the fleet
as a whole at ``speed``; ``start()`` with faults runs that same loop in one thread.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from modbridge.link.keys import KeyStore, attach_dir, detach_dir
from modbridge.sim.faults import FaultSchedule
from modbridge.sim.runner import VirtualModule
from modbridge.sim.world import World


class SimFleet:
    def __init__(
        self,
        n: int = 1,
        world: str = "default",
        profile=None,
        seed: int = 0,
        speed: float = 1.0,
        state_dir: str | Path | None = None,
        ambient_c: float | None = None,
        settle_duty: int | None = 19661,
        faults=(),
        keys_dir: str | Path | None = None,
        **module_kw,
    ):
        if not 1 <= n <= 64:
            raise ValueError("a fleet has 1..64 modules")
        self.schedule = FaultSchedule(faults, n)  # raises FaultSpecError before any spawn
        self.speed = 0.0 if speed in (0, "max", None) else float(speed)
        self.now_ms = 0  # the fleet's clock (run_for); each world may be a sleep ahead
        self._driver: threading.Thread | None = None
        self._stop_evt = threading.Event()
        self._tmp = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="modbridge-sim-")
            state_dir = self._tmp.name
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.keys = KeyStore(keys_dir if keys_dir is not None else self.state_dir / "keys")
        attach_dir(self.keys.dir)
        self.modules: list[VirtualModule] = []
        for i in range(n):
            w = World(world, seed=seed + i, profile=profile, ambient_c=ambient_c)
            if settle_duty is not None:
                # start from the steady state of a running machine, not a cold box
                w.set_duties(settle_duty, settle_duty)
                w.equilibrate()
            if n > 1:
                # one chassis, several GPUs: each needs its own identity, like real ones
                w.gpu.uuid = w.gpu.uuid[:-4] + f"{i:04x}"
                domain, bus, _dev = w.gpu.pci_bus_id.split(":")
                w.gpu.pci_bus_id = f"{domain}:{bus}:{(6 + i) & 0x1F:02x}.0"
            vm = VirtualModule(
                w,
                self.state_dir / f"module-{i}",
                speed=speed,
                seed=seed + i,
                port_symlink=self.state_dir / f"module-{i}.tty",
                instance=i,
                keys=self.keys,
                **module_kw,
            )
            self.modules.append(vm)

    @property
    def ports(self) -> list[str]:
        """The stable symlinks a host opens (they survive unplug/replug)."""
        return [str(vm.port_symlink) for vm in self.modules]

    @property
    def worlds(self) -> list[World]:
        return [vm.world for vm in self.modules]

    @property
    def gpus(self) -> list:
        return [vm.world.gpu for vm in self.modules]

    def run_for(self, sim_ms=None, *, step_ms: int = 100, on_step=None, stop=None) -> int:
        """Run every module ``sim_ms`` of world time (None: until ``stop``) in lockstep.

        In steps of at most ``step_ms`` ending on multiples of it and exactly at every
        scheduled fault, which is applied before the next step; ``on_step(now_ms,
        actions)`` after each step (``actions``: the faults applied at its start).
        Paced at the fleet's ``speed`` (0: flat out). ``stop`` (a ``threading.Event``)
        ends it at the next step. Returns the fleet clock.
        """
        speeds = [vm.speed for vm in self.modules]
        for vm in self.modules:
            vm.speed = 0.0  # the fleet paces, not each module in turn
        end = None if sim_ms is None else self.now_ms + int(sim_ms)
        wall0, sim0 = time.monotonic(), self.now_ms
        try:
            while end is None or self.now_ms < end:
                if stop is not None and stop.is_set():
                    break
                acts = self.schedule.apply_due(self.modules, self.now_ms)
                t = (self.now_ms // step_ms + 1) * step_ms
                nxt = self.schedule.next_ms
                if nxt is not None:
                    t = min(t, nxt)
                if end is not None:
                    t = min(t, end)
                for vm in self.modules:
                    if vm.world.now_ms < t:
                        vm.run_for(t - vm.world.now_ms)
                self.now_ms = t
                if on_step is not None:
                    on_step(t, acts)
                if self.speed > 0:
                    due = wall0 + (t - sim0) / 1000.0 / self.speed
                    delay = due - time.monotonic()
                    if delay < -1.0:  # far behind (slow host): do not race to catch up
                        wall0, sim0 = time.monotonic(), t
                    elif delay > 0:
                        (stop or self._stop_evt).wait(delay)
        finally:
            for vm, s in zip(self.modules, speeds, strict=True):
                vm.speed = s
        return self.now_ms

    def start(self) -> SimFleet:
        """Power on every module and run them in the background, paced to ``speed``.

        Without faults each module runs its own thread; with a fault schedule one
        thread drives them all through ``run_for`` (one clock for the schedule).
        """
        if self.schedule:
            if self._driver is None:
                for vm in self.modules:
                    vm.power_on()
                self._stop_evt.clear()
                self._driver = threading.Thread(
                    target=self.run_for,
                    kwargs={"stop": self._stop_evt},
                    name="virtual-fleet",
                    daemon=True,
                )
                self._driver.start()
            return self
        for vm in self.modules:
            vm.start()
        return self

    def stop(self) -> None:
        self._stop_evt.set()
        if self._driver is not None:
            self._driver.join(timeout=30)
            self._driver = None
        for vm in self.modules:
            vm.stop()
        detach_dir(self.keys.dir)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
