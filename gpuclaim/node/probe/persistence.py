"""Which GPUs have persistence mode off (for ``doctor``): without it the driver tears the GPU
state down whenever no process holds it, and every nvidia-smi call or NVML init starts it
again (seconds per call on big nodes: 30 s -> 2 s once it is on, Azure aks-gpu #105)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Optional


def persistence_off(
    source: str, nvidia_smi: Sequence[str] = (), env: Optional[Mapping[str, str]] = None
) -> Optional[list[int]]:
    """Indices of the GPUs whose persistence mode is off; None when it cannot be told."""
    if source == "nvml":
        return _from_nvml()
    if source == "nvidia-smi":
        return _from_smi(nvidia_smi, env)
    return None


def _from_nvml() -> Optional[list[int]]:
    from gpuclaim.node.probe.nvml import bindings

    try:
        nv = bindings()
        nv.nvmlInit()
    except Exception:  # no bindings, no library, no driver: the probe says so already
        return None
    try:
        off = []
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                mode = nv.nvmlDeviceGetPersistenceMode(nv.nvmlDeviceGetHandleByIndex(index))
            except nv.NVMLError:  # not supported (Windows, some parts): nothing to advise
                continue
            if mode == 0:
                off.append(index)
        return off
    except Exception:
        return None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _from_smi(nvidia_smi: Sequence[str], env: Optional[Mapping[str, str]]) -> Optional[list[int]]:
    smi = list(nvidia_smi) or [shutil.which("nvidia-smi") or "nvidia-smi"]
    try:
        out = subprocess.run(
            [*smi, "--query-gpu=index,persistence_mode", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, **(env or {})},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    off = []
    for line in out.stdout.splitlines():
        index, _, mode = (cell.strip() for cell in line.partition(","))
        if index.isdigit() and mode == "Disabled":
            off.append(int(index))
    return off
