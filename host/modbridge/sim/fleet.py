"""Several virtual modules at once, each with its own world, GPU and pty.

``modbridge run --sim``, the end-to-end tests and the bridge benchmarks use this: N
modules cooling N virtual GPUs, each reachable on a stable symlink
(``<dir>/module-<i>``) like a udev rule would give a CH340. Every module gets a
different seed (its noise and its MCU unique id differ) and its own flash directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .runner import VirtualModule
from .world import World


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
        **module_kw,
    ):
        if not 1 <= n <= 64:
            raise ValueError("a fleet has 1..64 modules")
        self._tmp = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="modbridge-sim-")
            state_dir = self._tmp.name
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.modules: list[VirtualModule] = []
        for i in range(n):
            w = World(world, seed=seed + i, profile=profile, ambient_c=ambient_c)
            if settle_duty is not None:
                # start from the steady state of a running machine, not a cold box
                w.set_duties(settle_duty, settle_duty)
                w.equilibrate()
            vm = VirtualModule(
                w,
                self.state_dir / f"module-{i}",
                speed=speed,
                seed=seed + i,
                port_symlink=self.state_dir / f"module-{i}.tty",
                instance=i,
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

    def start(self) -> SimFleet:
        """Power on every module and run them in the background, paced to ``speed``."""
        for vm in self.modules:
            vm.start()
        return self

    def stop(self) -> None:
        for vm in self.modules:
            vm.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
