"""Simulated physical world for the virtual module: thermal network, fans, 12 V rail,
NTC ADC codes and a virtual GPU. See docs/simulator.md.

    from modbridge.sim import World, Profile, load_params
    w = World(load_params("default"), seed=1, profile="bench")
"""

from modbridge.sim.gpu import GpuInvalidArgument, GpuLost, VirtualGPU, VirtualGpuError
from modbridge.sim.params import Params, ParamsError
from modbridge.sim.params import load as load_params
from modbridge.sim.profiles import Profile, ProfileError
from modbridge.sim.world import CHANNELS, World, WorldError

__all__ = [
    "CHANNELS",
    "GpuInvalidArgument",
    "GpuLost",
    "Params",
    "ParamsError",
    "Profile",
    "ProfileError",
    "VirtualGPU",
    "VirtualGpuError",
    "World",
    "WorldError",
    "load_params",
]
