"""Choosing a GPU backend: NVML first, nvidia-smi as the fallback, the simulator on request."""

from __future__ import annotations

import logging

from modbridge.gpu.base import GpuBackend, GpuError

log = logging.getLogger(__name__)

KINDS = ("auto", "nvml", "nvidia-smi", "sim")


def open_backend(kind="auto", sim_gpus=None, nvml_module=None, smi_path=None) -> GpuBackend:
    """Open the GPU backend ``kind``: ``"nvml"``, ``"nvidia-smi"``, ``"sim"`` (the
    ``sim_gpus`` VirtualGPUs) or ``"auto"`` (NVML, else nvidia-smi; GpuError naming
    why each failed and what to do when neither works).

    ``nvml_module`` replaces ``pynvml`` (e.g. ``fake_nvml.FakeNvml()``); ``smi_path``
    the ``nvidia-smi`` found on PATH.
    """
    if kind == "sim":
        if not sim_gpus:
            raise GpuError("--sim needs a simulated world with at least one GPU")
        from modbridge.gpu.virtual import VirtualBackend

        return VirtualBackend(sim_gpus)
    if kind == "nvml":
        from modbridge.gpu.nvml import NvmlBackend

        return NvmlBackend(nvml=nvml_module)
    if kind == "nvidia-smi":
        from modbridge.gpu.smi import SmiBackend

        return SmiBackend(smi_path=smi_path)
    if kind != "auto":
        raise GpuError(f"unknown GPU backend {kind!r}: choose one of {', '.join(KINDS)}")

    from modbridge.gpu.nvml import NvmlBackend
    from modbridge.gpu.smi import SmiBackend

    try:
        return NvmlBackend(nvml=nvml_module)
    except GpuError as e:
        nvml_why = str(e)
    log.warning("NVML unavailable (%s); trying nvidia-smi (~2000x slower per read)", nvml_why)
    try:
        return SmiBackend(smi_path=smi_path)
    except GpuError as e:
        smi_why = str(e)
    raise GpuError(
        f"no NVIDIA GPU backend: NVML: {nvml_why}; nvidia-smi: {smi_why}. "
        "Install the NVIDIA driver, or run with --sim"
    )
