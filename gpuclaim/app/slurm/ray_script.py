"""A ``run --ray`` job as an sbatch script: ``ray symmetric-run`` under srun, one task per node
(Ray 2.49 and later), which starts Ray on every node of the allocation, runs the command on
the first, and stops Ray when it ends: what gpuclaim's Ray job did. Pure renderer."""

from __future__ import annotations

import shlex

from gpuclaim.core.model import Job

RAY_PORT_BASE = 20000  # the head's port: one per SLURM job id, as the gang's rendezvous


def ray_lines(job: Job) -> list[str]:
    """The script's body for a Ray job: its head's address, then symmetric-run on each node."""
    start = [f"--num-gpus={job.gpus_per_node}"]
    if job.ray_cpus is not None:
        start.append(f"--num-cpus={job.ray_cpus}")
    return [
        "# A Ray cluster for this job alone: `ray symmetric-run` starts Ray on every node of",
        "# the allocation (the first is the head), runs the command there, and stops Ray when it",
        "# ends. SLURM pins each node's GPUs; Ray sees exactly those.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'head_addr=$(scontrol show node "$head_node" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        "head_addr=${head_addr:-$head_node}",
        f"ray_port=$(( {RAY_PORT_BASE} + SLURM_JOB_ID % 1000 ))",
        "",
        'srun --ntasks-per-node=1 ray symmetric-run --address "$head_addr:$ray_port" \\',
        f'    --min-nodes "$SLURM_JOB_NUM_NODES" {" ".join(start)} -- {shlex.join(job.argv)}',
    ]
