"""Turning past gpuclaim jobs into sbatch scripts: which jobs to export, the GPU type each
ran on, quoting for ``#SBATCH`` lines, and the script itself, with gang jobs rewritten to
start torch.distributed.run (or the command, with gpuclaim's environment contract) once
per node under srun. A pure renderer.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from gpuclaim.app.slurm.preemption import SCAVENGER, sbatch_directives, sbatch_env, sbatch_notes
from gpuclaim.app.slurm.syntax import comment
from gpuclaim.core.arrays import compact
from gpuclaim.core.durations import format_slurm_time
from gpuclaim.core.errors import UsageError
from gpuclaim.core.model import JobKind
from gpuclaim.core.states import JobState

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


def render_sbatch(
    job: Job,
    gpu_type: str = "",
    partition: Optional[str] = None,
    tasks: Sequence[Job] = (),
    preempt_grace_s: float = 60.0,
    shards_per_gpu: int = 0,
) -> str:
    """An sbatch script that runs ``job`` as gpuclaim ran it: same command (argv exactly),
    environment, directory, GPUs per node, nodes and time limit. ``tasks``: every task of
    the array ``job`` belongs to, as one ``--array`` job (a sweep's words per task index).
    A preemptible job asks for the scavenger partition and QOS, its --requeue and signal
    (see preemption.py); ``preempt_grace_s`` is the cluster's [queue] preempt_grace."""
    if job.kind != JobKind.BATCH:
        raise UsageError(
            f"{job.name} is an interactive {job.kind}: in SLURM that is "
            f"`srun --gres=gpu:{gpu_type + ':' if gpu_type else ''}{job.gpus_per_node} --pty bash`"
        )
    gres = _gres(job, gpu_type, shards_per_gpu)
    array = job.array
    directives = [("job-name", array.name if array else job.name)]
    if array is not None:
        indices = tuple(sorted(t.array.index for t in tasks if t.array)) or (array.index,)
        limit = f"%{array.max_running}" if array.max_running else ""
        directives.append(("array", compact(indices) + limit))
    partition = SCAVENGER if job.preemptible else partition
    if partition:
        directives.append(("partition", partition))
    if job.preemptible:
        directives.append(("qos", SCAVENGER))
    directives += [
        ("nodes", str(job.nodes_wanted)),
        ("ntasks-per-node", "1"),
        ("gres", gres),
        ("time", format_slurm_time(job.time_limit_s)),
        ("output", "logs/%A_%a.out" if array else "logs/%j.out"),
        *sbatch_directives(job),
    ]
    if job.workdir:
        directives.append(("chdir", job.workdir))
    out = ["#!/bin/bash", *(_directive(key, value) for key, value in directives)]
    where = comment(job.workdir) if job.workdir else "the directory you submit from"
    out += [
        "#",
        f"# gpuclaim job {comment(job.name)} ({comment(job.id)}) of {comment(job.user)},"
        " exported by `gpuclaim export sbatch`.",
        f"# Output: logs/JOBID.out in {where}; create logs/ there first.",
        "# SLURM sets CUDA_VISIBLE_DEVICES to the GPUs it gives the job.",
        *sbatch_notes(job, preempt_grace_s, _runs_torchrun(job)),
        *_share_notes(job, shards_per_gpu),
        "",
        *_dependency_lines(job),
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "export PYTHONUNBUFFERED=1",
        *sbatch_env(job, preempt_grace_s),
    ]
    if array is not None:
        out += [
            'export GPUCLAIM_ARRAY_INDEX="$SLURM_ARRAY_TASK_ID"',
            'export GPUCLAIM_ARRAY_JOB="$SLURM_ARRAY_JOB_ID"',
            f"export GPUCLAIM_ARRAY_NAME={shlex.quote(array.name)}",
            f"export GPUCLAIM_ARRAY_COUNT={len(tasks) or array.count}",
        ]
    for key, value in job.env:
        if key == "CUDA_VISIBLE_DEVICES" or (array and key.startswith("GPUCLAIM_ARRAY_")):
            continue  # SLURM's choice, not the one gpuclaim made back then
        if _ENV_NAME.match(key):
            out.append(f"export {key}={shlex.quote(value)}")
        else:
            out.append(f"# left out {comment(repr(key))}: not a name a shell can export")
    out.append("")
    out += _command_lines(job, tasks)
    return "\n".join(out) + "\n"


def _command_lines(job: Job, tasks: Sequence[Job]) -> list[str]:
    """What the script runs: a Ray job's cluster, an array's task, a gang, or the command."""
    # A preemptible job's command runs as a job step: SLURM signals every process of a step,
    # never the batch shell's children.
    launch = "srun " if job.preemptible else ""
    if job.ray:
        from gpuclaim.app.slurm.ray_script import ray_lines

        return ray_lines(job)
    if job.array is not None and tasks:
        return _array_command(tasks, launch)
    return _gang_lines(job) if job.nodes_wanted > 1 else [launch + shlex.join(job.argv)]


def _gres(job: Job, gpu_type: str, shards_per_gpu: int) -> str:
    """What the job asks for: its GPUs (of its type), or a share's shards of one."""
    if job.shared and shards_per_gpu:
        return f"shard:{shards_of(job, shards_per_gpu)}"
    return f"gpu:{gpu_type}:{job.gpus_per_node}" if gpu_type else f"gpu:{job.gpus_per_node}"


def job_share_part(job: Job) -> float:
    """The part of its GPU a share's job held: as asked, else as placed."""
    if job.gpu_share:
        return job.gpu_share
    rank = job.ranks[0] if job.ranks else None
    if rank is not None and rank.mem_mib and rank.mem_total_mib:
        return min(1.0, rank.mem_mib / rank.mem_total_mib)
    return 1.0


def shards_of(job: Job, shards_per_gpu: int) -> int:
    """Shards of a GPU of ``shards_per_gpu`` that hold at least the job's share."""
    return max(1, min(shards_per_gpu, math.ceil(job_share_part(job) * shards_per_gpu - 1e-9)))


def _share_notes(job: Job, shards_per_gpu: int) -> list[str]:
    if not job.shared:
        return []
    held = f"{job.gpu_mem_mib} MiB" if job.gpu_mem_mib else f"{job.gpu_share:g}"
    if not shards_per_gpu:
        return [
            f"# Under gpuclaim it held part of one GPU ({held}, run --gpu-mem/--gpu-share): here a"
            " whole GPU. `gpuclaim export slurm --shards K` and `export sbatch --shards K`",
            "# make it a shard request (gres/shard) instead.",
        ]
    return [
        f"# Under gpuclaim it held part of one GPU ({held}): {shards_of(job, shards_per_gpu)} of"
        f" a GPU's {shards_per_gpu} shards here.",
        "# A shard is a slot, not a memory limit: SLURM does not cap the job's memory either.",
    ]


def _directive(key: str, value: str) -> str:
    """``#SBATCH --key=value``; a flag (``--requeue``) where the value is empty."""
    return f"#SBATCH --{key}={sbatch_quote(value)}" if value else f"#SBATCH --{key}"


def _runs_torchrun(job: Job) -> bool:
    """Does the script start the command under torch.distributed.run (a gang job's)?"""
    return job.nodes_wanted > 1 and not job.array and _torch_launch(job.argv) is not None


def _dependency_lines(job: Job) -> list[str]:
    """``--after``: SLURM's job ids exist only once submitted, so the flag is said, and the
    chain is in submit-all.sh (``export sbatch --history --out``)."""
    lines = []
    for dep in job.after:
        kind = "afterany" if dep.any else "afterok"
        lines.append(
            f"# gpuclaim ran this after {comment(dep.name)} "
            f"{'ended' if dep.any else JobState.SUCCEEDED.value}: submit it with "
            f"sbatch --dependency={kind}:<the SLURM job id of {comment(dep.name)}>"
        )
    return [*lines, ""] if lines else []


def _array_command(tasks: Sequence[Job], launch: str = "") -> list[str]:
    """The command, once per task: the argv all tasks share, and a sweep's own words per
    index (each word quoted: nothing is expanded, as under gpuclaim)."""
    argvs = [t.argv for t in tasks]
    shared = list(argvs[0])
    for argv in argvs[1:]:
        keep = 0
        while keep < min(len(shared), len(argv)) and shared[keep] == argv[keep]:
            keep += 1
        shared = shared[:keep]
    if all(len(a) == len(shared) for a in argvs):
        return [launch + shlex.join(shared)]
    lines = ['case "$SLURM_ARRAY_TASK_ID" in']
    for task in tasks:
        words = " ".join(shlex.quote(w) for w in task.argv[len(shared) :])
        index = task.array.index if task.array else 0
        lines.append(f"  {index}) words=({words}) ;;")
    lines += ['  *) echo "no task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac"]
    return [*lines, launch + shlex.join(shared) + ' "${words[@]}"']


def submit_all(scripts: Sequence[tuple[str, Job]]) -> str:
    """``submit-all.sh``: every script in submit order, each ``--after`` as SLURM's
    ``--dependency`` on the id its dependency got a line earlier."""
    ids = {}
    lines = ["#!/bin/bash", "# Written by `gpuclaim export sbatch`: submits in order.", "set -e"]
    for index, (file_name, job) in enumerate(scripts):
        var = f"job{index}"
        ids[job.array.id if job.array else job.id] = var
        needs = [
            f"{'afterany' if d.any else 'afterok'}:${ids[d.id]}" for d in job.after if d.id in ids
        ]
        flag = f" --dependency={','.join(needs)}" if needs else ""
        lines.append(f"{var}=$(sbatch --parsable{flag} {shlex.quote(file_name)})")
        lines.append(f'{var}="${{{var}%%;*}}"  # "id;cluster" where SLURM names the cluster')
    return "\n".join(lines) + "\n"


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
    mine = [g for n in nodes if not on or n.name in on for g in n.gpus]
    if not types and job.mig:  # run --mig PROFILE: slices of that profile, as slurmd types them
        types = {g.type for g in mine if g.mig and g.mig_profile == job.mig} or {job.mig}
    if not types:
        types = {g.type for g in mine if not g.mig}
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
