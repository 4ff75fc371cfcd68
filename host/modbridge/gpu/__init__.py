"""GPU backends behind one interface (:mod:`modbridge.gpu.base`): NVML, nvidia-smi, virtual."""
