"""Simulated physical world for the virtual module: thermal network, fans, 12 V rail,
NTC ADC codes and a virtual GPU. See docs/simulator.md.

    from modbridge.sim import World, Profile, load_params
    w = World(load_params("default"), seed=1, profile="bench")
"""

from .gpu import GpuInvalidArgument, GpuLost, VirtualGPU, VirtualGpuError
from .params import Params, ParamsError
from .params import load as load_params
from .profiles import Profile, ProfileError
from .world import CHANNELS, World, WorldError

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
