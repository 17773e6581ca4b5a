"""A fake ``nvidia-smi`` of a fixed, settable cost, for the benchmarks: what gpuclaim costs
is only seen next to a GPU read as fast as a real one (about 5 ms with persistence mode on a
small node; 50 ms; 2 s without persistence mode), not next to the simulator's Python start
(15-19 ms a call).

``install(tb, cost_ms)`` records, through SSH, what the testbed's simulator answers on each
node for the queries the benchmarks make (``-q -x``: gpuclaim's; the two CSV queries: the
plain tools'), then puts in its place a shell script that sleeps ``cost_ms`` and replays the
node's answer. Nodes then have no NVML either: gpuclaim must run it too."""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

GPU_QUERY = (
    "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"
)
APPS_QUERY = (
    "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv,noheader,nounits"
)
QUERIES = {"qx": "-q -x", "gpu": GPU_QUERY, "apps": APPS_QUERY}
# What the plain tools run on each node for a look: the GPUs and who is on them.
PLAIN_LOOK = f"nvidia-smi {GPU_QUERY}; nvidia-smi {APPS_QUERY}"


def install(tb: Any, cost_ms: float) -> None:
    """Record every node's answers, then swap the testbed's nvidia-smi for the fixed-cost one."""
    cache = tb.dir / "smi-cache"
    cache.mkdir(exist_ok=True)
    for node in tb.nodes:
        for key, args in QUERIES.items():
            out = subprocess.run(
                ["ssh", "-F", str(tb.ssh_config), node, f"nvidia-smi {args}"],
                capture_output=True,
                check=True,
            ).stdout
            (cache / f"{node}.{key}").write_bytes(out)
    cases = "\n".join(
        f'  {shlex.quote(args)}) exec cat "$d/$GPUCLAIM_NODE.{key}" ;;'
        for key, args in QUERIES.items()
    )
    script = tb.dir / "bin" / "nvidia-smi"
    tmp = script.with_suffix(".tmp")
    tmp.write_text(
        "#!/bin/sh\n"
        f"# bench: a GPU read of a fixed cost ({cost_ms:g} ms), replaying the simulator's answer\n"
        f"d={shlex.quote(str(cache))}\n"
        f"sleep {cost_ms / 1000:.3f}\n"
        'case "$*" in\n'
        f"{cases}\n"
        "esac\n"
        'echo "nvidia-smi (bench): unsupported arguments: $*" >&2\n'
        "exit 2\n"
    )
    tmp.chmod(0o755)
    tmp.replace(script)
