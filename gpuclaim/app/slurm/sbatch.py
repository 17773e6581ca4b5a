"""Turning past gpuclaim jobs into sbatch scripts: which jobs to export, the GPU type each
ran on, quoting for ``#SBATCH`` lines, and the script itself, with gang jobs rewritten to
start torch.distributed.run (or the command, with gpuclaim's environment contract) once
per node under srun. A pure renderer.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from gpuclaim.app.slurm.syntax import comment
from gpuclaim.core.durations import format_slurm_time
from gpuclaim.core.errors import UsageError

if TYPE_CHECKING:
    from gpuclaim.app.slurm.spec import NodeSpec
    from gpuclaim.core.model import Job


_SAFE_WORD = re.compile(r"^[A-Za-z0-9_./%:=,+@-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
# torchrun options that decide topology and rendezvous: SLURM's allocation decides them now.
_TORCHRUN_REPLACED = {
    "nnodes",
    "nproc-per-node",
    "node-rank",
    "master-addr",
    "master-port",
    "standalone",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "use-env",
    "local-addr",
}
_TORCHRUN_FLAGS = {"standalone", "no-python", "run-path", "module", "use-env", "m"}
RDZV_PORT_BASE = 29500


def sbatch_quote(value: str) -> str:
    """A value as sbatch reads it on an ``#SBATCH`` line: its parser splits on blanks, takes
    quotes, treats ``\\`` as an escape everywhere and an unquoted ``#`` as a comment."""
    if "\n" in value or "\r" in value:
        raise UsageError(f"{value!r} cannot go on an #SBATCH line (it has a line break)")
    if _SAFE_WORD.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_sbatch(job: Job, gpu_type: str = "", partition: Optional[str] = None) -> str:
    """An sbatch script that runs ``job`` as gpuclaim ran it: same command (argv exactly),
    environment, directory, GPUs per node, nodes and time limit."""
    if job.kind != "batch":
        raise UsageError(
            f"{job.name} is an interactive {job.kind}: in SLURM that is "
            f"`srun --gres=gpu:{gpu_type + ':' if gpu_type else ''}{job.gpus_per_node} --pty bash`"
        )
    gres = f"gpu:{gpu_type}:{job.gpus_per_node}" if gpu_type else f"gpu:{job.gpus_per_node}"
    directives = [("job-name", job.name)]
    if partition:
        directives.append(("partition", partition))
    directives += [
        ("nodes", str(job.nodes_wanted)),
        ("ntasks-per-node", "1"),
        ("gres", gres),
        ("time", format_slurm_time(job.time_limit_s)),
        ("output", "logs/%j.out"),
    ]
    if job.workdir:
        directives.append(("chdir", job.workdir))
    out = ["#!/bin/bash"]
    out += [f"#SBATCH --{key}={sbatch_quote(value)}" for key, value in directives]
    where = comment(job.workdir) if job.workdir else "the directory you submit from"
    out += [
        "#",
        f"# gpuclaim job {comment(job.name)} ({comment(job.id)}) of {comment(job.user)},"
        " exported by `gpuclaim export sbatch`.",
        f"# Output: logs/JOBID.out in {where}; create logs/ there first.",
        "# SLURM sets CUDA_VISIBLE_DEVICES to the GPUs it gives the job.",
        "",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "export PYTHONUNBUFFERED=1",
    ]
    for key, value in job.env:
        if key == "CUDA_VISIBLE_DEVICES":
            continue  # SLURM's choice, not the one gpuclaim made back then
        if _ENV_NAME.match(key):
            out.append(f"export {key}={shlex.quote(value)}")
        else:
            out.append(f"# left out {comment(repr(key))}: not a name a shell can export")
    out.append("")
    out += _gang_lines(job) if job.nodes_wanted > 1 else [shlex.join(job.argv)]
    return "\n".join(out) + "\n"


def jobs_since(jobs: Sequence[Job], since: float, user: Optional[str]) -> list[Job]:
    """The jobs submitted since ``since`` (of ``user``, or everyone's), the newest run of
    each name only: ``jobs`` come oldest first, as load_jobs gives them."""
    newest: dict[tuple[str, str], Job] = {}
    for job in jobs:
        if job.submitted >= since and (user is None or job.user == user):
            newest[(job.user, job.name)] = job
    return list(newest.values())


def job_gpu_type(nodes: Sequence[NodeSpec], job: Job) -> str:
    """The type of the GPUs the job ran on; for a job that never ran, its node's (or the
    cluster's) type; "" (any GPU) where that is more than one type."""
    used = {u for r in job.ranks for u in r.gpu_uuids}
    on = {r.node for r in job.ranks} or ({job.node} if job.node else set())
    types = {g.type for n in nodes for g in n.gpus if g.uuid in used}
    if not types:
        types = {g.type for n in nodes if not on or n.name in on for g in n.gpus}
    return types.pop() if len(types) == 1 else ""


def _gang_lines(job: Job) -> list[str]:
    """A gang job: torch.distributed.run on every node (srun, one task per node), meeting at a
    c10d rendezvous on the job's first node, as PyTorch recommends under SLURM. Commands that
    are not Python get gpuclaim's own contract instead: once per node, with NODE_RANK etc."""
    head = [
        "# The job's first node hosts the rendezvous, at the address SLURM reaches it by.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'head_addr=$(scontrol show node "$head_node" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        "head_addr=${head_addr:-$head_node}",
        f"rdzv_port=$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % 1000 ))",
        "",
    ]
    launch = _torch_launch(job.argv)
    if launch is None:
        n = job.gpus_per_node
        return [
            *head,
            "# As under gpuclaim: the command runs once per node and finds its peers here.",
            'export MASTER_ADDR="$head_addr" MASTER_PORT="$rdzv_port"',
            f'export NNODES="$SLURM_JOB_NUM_NODES" NPROC_PER_NODE={n}',
            f"export WORLD_SIZE=$(( SLURM_JOB_NUM_NODES * {n} ))",
            "srun bash -c 'NODE_RANK=$SLURM_NODEID exec \"$@\"' bash " + shlex.join(job.argv),
        ]
    launcher, kept, rest, was_torchrun = launch
    lines = [*head]
    if not was_torchrun:
        lines += [
            "# gpuclaim ran the command once per node; torch.distributed.run starts it once",
            f"# per GPU ({job.gpus_per_node} per node) and sets RANK, LOCAL_RANK and WORLD_SIZE.",
            "# If it starts its own per-GPU processes, use --nproc_per_node=1.",
        ]
    flags = [
        '--nnodes="$SLURM_JOB_NUM_NODES"',
        f"--nproc_per_node={job.gpus_per_node}",
        '--rdzv_id="$SLURM_JOB_ID"',
        "--rdzv_backend=c10d",
        '--rdzv_endpoint="$head_addr:$rdzv_port"',
    ]
    body = [" ".join(launcher), " ".join(flags[:2]), " ".join(flags[2:])]
    if kept or rest:
        body.append(" ".join(shlex.quote(a) for a in [*kept, *rest]))
    return [*lines, "srun " + " \\\n    ".join(body)]


def _torch_launch(
    argv: Sequence[str],
) -> Optional[tuple[list[str], list[str], list[str], bool]]:
    """(launcher argv, its options to keep, the script and its args, was it torchrun) for
    ``python script.py``, ``python -m mod``, ``torchrun ...``; None for anything else."""
    if not argv:
        return None
    exe = argv[0].rsplit("/", 1)[-1]
    if exe == "torchrun":
        return _split_torchrun([shlex.quote(argv[0])], list(argv[1:]))
    if not _PYTHON.match(exe):
        return None
    rest = list(argv[1:])
    while rest and rest[0] == "-u":  # torch.distributed.run starts workers unbuffered anyway
        rest.pop(0)
    launcher = [shlex.quote(argv[0]), "-m", "torch.distributed.run"]
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] in _TORCH_LAUNCHERS:
        return _split_torchrun(launcher, rest[2:])
    if len(rest) >= 2 and rest[0] == "-m":
        return launcher, [], ["-m", *rest[1:]], False
    if rest and not rest[0].startswith("-"):
        return launcher, [], rest, False
    return None  # python -c, -O ... : run it as it is, once per node


def _split_torchrun(
    launcher: list[str], args: list[str]
) -> tuple[list[str], list[str], list[str], bool]:
    kept: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        opt = args[i]
        key = opt.lstrip("-").split("=", 1)[0].replace("_", "-")
        takes_value = "=" not in opt and key not in _TORCHRUN_FLAGS
        value = [args[i + 1]] if takes_value and i + 1 < len(args) else []
        if key not in _TORCHRUN_REPLACED:
            kept += [opt, *value]
        i += 1 + len(value)
    return launcher, kept, args[i:], True
