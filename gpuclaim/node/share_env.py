"""What a share's job is told (and, where the node has HAMi-core, held to), and how much of
its GPU's memory its own processes use.

Cooperation, not isolation, unless HAMi-core is preloaded: the variables tell frameworks to
stay within the share (JAX's preallocation fraction, TensorFlow's memory growth) and tell the
job its size (``GPUCLAIM_GPU_MEM_MIB``, ``GPUCLAIM_GPU_MEM_FRACTION`` for PyTorch's
``torch.cuda.set_per_process_memory_fraction``). With ``[share] preload`` naming a
``libvgpu.so`` that exists on the node, it is preloaded with ``CUDA_DEVICE_MEMORY_LIMIT``,
so an allocation past the share fails inside the job. Standard library only, Python 3.9.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Optional

from gpuclaim.core.inventory import Gpu

HAMI_LOCK_DIR = "/tmp/vgpulock"  # HAMi-core's lock directory: it must exist


def share_environment(
    mem_mib: int,
    total_mib: int,
    job_id: str,
    preload: Optional[str],
    asked: Mapping[str, str],
) -> tuple[dict[str, str], list[str]]:
    """The variables for a share of ``mem_mib`` of a GPU of ``total_mib``, none that the
    job's own ``--env`` set, and what the log says about them."""
    fraction = mem_mib / total_mib if total_mib else 1.0
    env = {
        "GPUCLAIM_GPU_MEM_MIB": str(mem_mib),
        "GPUCLAIM_GPU_MEM_FRACTION": f"{fraction:.4f}",
        # JAX preallocates 75% of the GPU unless told: a share would take its neighbours' part
        "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction * 0.95:.4f}",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",  # TensorFlow otherwise maps the whole GPU
    }
    size = f"{mem_mib} MiB of {total_mib} MiB"
    notes = []
    if preload and Path(preload).is_file():
        env.update(
            {
                "LD_PRELOAD": " ".join(x for x in (preload, asked.get("LD_PRELOAD", "")) if x),
                "CUDA_DEVICE_MEMORY_LIMIT": f"{mem_mib}m",
                # one cache per job: processes that share a cache share one limit
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/tmp/gpuclaim-vgpu-{job_id}.cache",
            }
        )
        _lock_dir()
        notes.append(f"a share of {size}, capped by HAMi-core ({preload})")
    else:
        where = f" ({preload} is not on this node)" if preload else ""
        notes.append(
            f"a share of {size}: not capped{where}; keep within GPUCLAIM_GPU_MEM_MIB "
            "(others' work shares this GPU)"
        )
    return {k: v for k, v in env.items() if k not in asked or k == "LD_PRELOAD"}, notes


def _lock_dir() -> None:
    try:
        Path(HAMI_LOCK_DIR).mkdir(parents=True, exist_ok=True)
        Path(HAMI_LOCK_DIR).chmod(0o1777)  # every account's jobs lock there
    except OSError:
        pass  # another account made it: theirs to open up


def share_used_mib(gpus: Iterable[Gpu], uuids: Iterable[str], pids: Iterable[int]) -> int:
    """Memory the processes ``pids`` use on the GPUs ``uuids``, as nvidia-smi lists them."""
    wanted, mine = set(uuids), set(pids)
    return sum(
        p.used_memory_mib or 0
        for g in gpus
        if g.uuid in wanted
        for p in g.processes
        if p.pid in mine
    )


def job_pids(root: int) -> list[int]:
    """The job's process and every process below it."""
    from gpuclaim.node.processes import children_of

    return [root, *children_of(root)] if Path(f"/proc/{root}").exists() else []
