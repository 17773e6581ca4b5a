"""Probing GPUs on a node: NVML, nvidia-smi output parsers."""
