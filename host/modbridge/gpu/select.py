"""Choosing a GPU backend: NVML first, nvidia-smi as the fallback, the simulator on request."""

from __future__ import annotations

import logging
import re

from modbridge.gpu.base import GpuBackend, GpuDriverNotLoaded, GpuError

log = logging.getLogger(__name__)

KINDS = ("auto", "nvml", "nvidia-smi", "sim", "sim-remote")


def open_backend(kind="auto", sim_gpus=None, nvml_module=None, smi_path=None,
                 sim_socket=None) -> GpuBackend:  # fmt: skip
    """Open the GPU backend ``kind``: ``"nvml"``, ``"nvidia-smi"``, ``"sim"`` (the
    ``sim_gpus`` VirtualGPUs), ``"sim-remote"`` (the GPUs a ``modbridge sim`` serves
    on ``sim_socket``: :mod:`modbridge.gpu.remote`) or ``"auto"`` (NVML, else
    nvidia-smi; GpuError naming why each failed and what to do when neither works).

    ``nvml_module`` replaces ``pynvml`` (e.g. ``fake_nvml.FakeNvml()``); ``smi_path``
    the ``nvidia-smi`` found on PATH.
    """
    if kind == "sim":
        if not sim_gpus:
            raise GpuError("--sim needs a simulated world with at least one GPU")
        from modbridge.gpu.virtual import VirtualBackend

        return VirtualBackend(sim_gpus)
    if kind == "sim-remote":
        from modbridge.gpu.remote import SimRemoteBackend

        return SimRemoteBackend(sim_socket)
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
        nvml_err = e
    try:
        smi = SmiBackend(smi_path=smi_path)
    except GpuError as e:
        smi_err = e
    else:  # said once, and only when the fallback is what runs
        log.warning("NVML unavailable (%s); using nvidia-smi (~2000x slower per read)",
                    _reason(nvml_err))  # fmt: skip
        return smi
    if _absent(nvml_err) and _absent(smi_err):
        raise GpuError(NO_DRIVER)  # a machine without a GPU: one short line
    raise GpuError(
        f"no NVIDIA GPU backend: NVML: {_reason(nvml_err)}; nvidia-smi: {_reason(smi_err)}. "
        "Install the NVIDIA driver, or run with --sim"
    )


NO_DRIVER = (
    "no NVIDIA driver here (neither libnvidia-ml.so.1 nor nvidia-smi): install it, "
    "or run with --sim"
)
# where a backend's message turns from what went wrong to what to do about it
_HINT = re.compile(r"(;|:|\.) (install|load it|use --)", re.I)


def _reason(err: Exception) -> str:
    """What went wrong, without the backend's own advice (said once, at the end)."""
    msg = str(err)
    m = _HINT.search(msg)
    return msg[: m.start()] if m else msg


def _absent(err: Exception) -> bool:
    """The backend's library or program is not installed at all (no driver)."""
    msg = str(err)
    return isinstance(err, GpuDriverNotLoaded) and (
        "libnvidia-ml.so.1 not found" in msg or "nvidia-smi not found" in msg
    )
