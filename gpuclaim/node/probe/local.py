"""Probe the GPUs of the machine this code runs on: NVML first, else ``nvidia-smi``
(``probe.smi``, imported only then: a first look at a node pays every import, and NVML needs
no subprocess, csv or XML).

This is node-side code (the agent runs it on each node), so it needs only the standard
library and Python 3.9.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuclaim.core.errors import ProbeError
from gpuclaim.core.inventory import NodeInventory

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Optional

NO_DRIVER = "no NVIDIA driver: NVML does not load and nvidia-smi is not installed"


def probe_local(
    node: str,
    nvidia_smi: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 10.0,
    liveness: bool = False,
) -> NodeInventory:
    """This machine's GPUs as ``node``; never raises: failures become ``NodeInventory.error``.
    With ``liveness``, also which job wrappers run here (a look's way to see lost jobs)."""
    inv = _probe_gpus(node, nvidia_smi, env, timeout)
    if liveness:
        from gpuclaim.node.liveness import node_liveness

        inv = inv.replace(liveness=node_liveness())
    return inv


def _probe_gpus(
    node: str,
    nvidia_smi: Sequence[str],
    env: Optional[Mapping[str, str]],
    timeout: float,
) -> NodeInventory:
    if not nvidia_smi:
        try:
            from gpuclaim.node.probe.nvml import probe_nvml

            return probe_nvml(node)
        except ProbeError as exc:
            nvml_error = str(exc)
        import shutil

        smi_path = shutil.which("nvidia-smi")
        if smi_path is None:
            return NodeInventory(node=node, source="none", error=f"{NO_DRIVER} ({nvml_error})")
        nvidia_smi = (smi_path,)
    from gpuclaim.node.probe.smi import probe_nvidia_smi

    try:
        return probe_nvidia_smi(node, nvidia_smi, env, timeout)
    except ProbeError as exc:
        return NodeInventory(node=node, source="nvidia-smi", error=str(exc))
