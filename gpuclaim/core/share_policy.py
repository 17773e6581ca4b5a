"""Shares of one GPU by memory (``--gpu-mem 20G`` / ``--gpu-share 0.25``): the sizes people
type, how much of a GPU a share is, and the lab's ``[share]`` settings.

Standard library only: the node's wrapper reads the same settings."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from gpuclaim.core.errors import ConfigError, UsageError

ENFORCE_MODES = ("flag", "kill")
# Sizes as Kubernetes and Docker spell them: G is 10^9 bytes, Gi 2^30 (a bare number is MiB,
# as nvidia-smi counts). So four --gpu-mem 20G fit an "80 GB" GPU, whose 81559 MiB are 85.5G.
_SIZE_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(I?)B?)?\s*$"
_POWER = {"K": 1, "M": 2, "G": 3, "T": 4}
MIB = 1 << 20


@dataclass(frozen=True)
class SharePolicy:
    """``[share]``: what happens to a job found using more than its share, and the memory
    cap preloaded where a node has one (HAMi-core's ``libvgpu.so``)."""

    enforce: str = "flag"  # "flag": said once (status, board, Slack); "kill": also stopped
    preload: Optional[str] = None  # a path on the nodes; a node without the file runs uncapped


def parse_share_policy(table: dict[str, Any]) -> SharePolicy:
    unknown = sorted(set(table) - {"enforce", "preload"})
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in [share]", hint="known: enforce, preload")
    enforce = table.get("enforce", "flag")
    if enforce not in ENFORCE_MODES:
        raise ConfigError(f'\'share.enforce\' must be "flag" or "kill", not {enforce!r}')
    preload = table.get("preload")
    if preload is not None and (not isinstance(preload, str) or not preload.startswith("/")):
        raise ConfigError("'share.preload' must be an absolute path to libvgpu.so on the nodes")
    return SharePolicy(enforce=str(enforce), preload=preload)


def parse_gpu_mem(text: str) -> int:
    """``20G`` (10^9 bytes) -> 19074 MiB, ``20Gi`` -> 20480, ``512Mi`` -> 512, ``900`` -> 900."""
    m = re.match(_SIZE_PATTERN, text, re.IGNORECASE)  # compiled on first use (re's cache)
    if not m:
        raise UsageError(f"--gpu-mem wants a size such as 20G, 20Gi or 512Mi (got {text!r})")
    number, unit, binary = float(m.group(1)), (m.group(2) or "").upper(), bool(m.group(3))
    mib = number * (1024 if binary else 1000) ** _POWER[unit] / MIB if unit else number
    if mib < 1:
        raise UsageError(f"--gpu-mem {text}: a share holds at least 1 MiB")
    return math.ceil(mib - 1e-9)


def parse_gpu_share(text: str) -> float:
    """``0.25`` or ``25%`` -> 0.25: a part of the GPU's memory, more than 0, less than 1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"--gpu-share wants a part such as 0.25 or 25% (got {text!r})") from None
    if not 0 < value < 1 or math.isnan(value):
        raise UsageError(
            f"--gpu-share {text}: a share is more than 0 and less than the whole GPU (1)",
            hint="for a whole GPU leave --gpu-share out",
        )
    return value


def checked_share(gpu_mem_mib: int, gpu_share: float, gpus: int, nodes: int) -> None:
    """A share is part of one GPU: with several GPUs or nodes, or both ways, bad input."""
    if gpu_mem_mib and gpu_share:
        raise UsageError("give --gpu-mem or --gpu-share, not both")
    if (gpu_mem_mib or gpu_share) and (gpus != 1 or nodes != 1):
        raise UsageError(
            "--gpu-mem/--gpu-share ask for part of one GPU: not with --gpus or --nodes above 1"
        )


def share_mib(total_mib: int, gpu_mem_mib: int, gpu_share: float) -> int:
    """What a share asks of a GPU of ``total_mib``: its MiB, or its part of the total."""
    if gpu_mem_mib:
        return gpu_mem_mib
    return max(1, int(total_mib * gpu_share))


def gpu_count(gpus: float) -> str:
    """3 -> '3', 0.25 -> '0.25': GPUs held, shares counted by their part."""
    return f"{round(gpus, 2):g}"


def format_mib(mib: float) -> str:
    """19074 -> '20G', 81559 -> '85.5G', 512 -> '537M': sizes in the units typed (10^9 bytes)."""
    decimal = mib * MIB / 1e9
    if abs(decimal) >= 1:
        return f"{decimal:.0f}G" if abs(decimal - round(decimal)) < 0.05 else f"{decimal:.1f}G"
    return f"{decimal * 1000:.0f}M"


def holders_text(holders: Iterable[tuple[str, int]], free_mib: Optional[float]) -> str:
    """``alice 20G · bob 40G · 20G free``: a shared GPU's holders, as status and the board say."""
    parts = [f"{user} {format_mib(mib)}" for user, mib in holders]
    if free_mib is not None:
        parts.append(f"{format_mib(max(0.0, free_mib))} free")
    return " · ".join(parts)
