"""The migration notes: ``MIGRATION.md``, a short guide from gpuclaim's commands to
SLURM's for people who never used SLURM, the GPU types and partitions, how to export past
jobs, and the administrator's numbered steps, in an order where gpuclaim and SLURM never
hand out the same GPU. A pure renderer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpuclaim.app.slurm.conf import DB_PASSWORD_PLACEHOLDER
from gpuclaim.app.slurm.preemption import SCAVENGER, migration_section, sacctmgr_qos_commands
from gpuclaim.app.slurm.spec import (
    ExportOptions,
    NodeSpec,
    Partition,
    check_nodes,
    checked_accounting,
    controller_of,
    plan_partitions,
)
from gpuclaim.app.slurm.syntax import cluster_name, comment, hostlist
from gpuclaim.core.durations import format_duration

HISTORY = {
    "file": "sacct -c -S now-7days -o JobID,User,JobName,Partition,NodeList,State,Elapsed",
    "slurmdbd": "sacct -X -S now-7days -o JobID,User,AllocTRES%40",
}


def render_migration_md(nodes: Sequence[NodeSpec], opts: ExportOptions, bookings: int = 0) -> str:
    """A short guide from gpuclaim's commands to SLURM's, for people who never used SLURM,
    and the administrator's steps, in an order where gpuclaim and SLURM never hand out the
    same GPU: gpuclaim is drained and its jobs have ended before any slurmd starts."""
    accounting = checked_accounting(opts)
    check_nodes(nodes)
    gpu_parts = [p for p in plan_partitions(nodes) if p.gpu_type is not None]
    gres = _first_gres(nodes)
    controller = controller_of(nodes, opts)[0] if nodes else "CONTROLLER"
    mapping = _command_mapping(gres, gpu_parts, accounting, opts)
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in mapping)
    types = "\n".join(
        f"| `{p.name}` | {hostlist(list(p.nodes))} | `{p.gpu_type or 'any'}` |"
        + (" yes |" if p.default else " |")
        for p in gpu_parts
    )
    renamed = [f"{n.name} is `{n.slurm_name}`" for n in nodes if n.name != n.slurm_name]
    names = (
        f"\nSLURM calls each node by its hostname: {comment(', '.join(renamed))}.\n"
        if renamed
        else ""
    )
    steps = "\n".join(
        _wrap_step(i, text) for i, text in enumerate(_admin_steps(nodes, opts, controller), 1)
    )
    preemptible = migration_section(accounting, opts) if gpu_parts else ""
    shares = _shares_paragraph(opts) if gpu_parts else ""
    shares += _mig_paragraph(nodes)
    return f"""# Moving {comment(opts.cluster)} from gpuclaim to SLURM

SLURM does what gpuclaim did by agreement, and enforces it: you ask for GPUs, your job waits
in a queue until they are free, runs on them alone (other GPUs are invisible to it), and is
stopped at its time limit. {_priority_sentence(accounting)}

## What you type now

| gpuclaim | SLURM | notes |
|---|---|---|
{table}

SLURM sets CUDA_VISIBLE_DEVICES to your job's GPUs, as gpuclaim did: do not set it yourself.

## GPU types and partitions

| partition | nodes | GPU type | default |
|---|---|---|---|
{types or "| (none) | | | |"}

Ask for a model with `--gres=gpu:TYPE:N` (e.g. `--gres={gres}`), or for any GPU of the
partition with `--gres=gpu:N`.
{names}
## Your jobs as sbatch scripts

    gpuclaim export sbatch NAME > NAME.sbatch         # one job you ran
    gpuclaim export sbatch --history 30 --out jobs/    # all your jobs of the last 30 days
    mkdir -p logs && sbatch NAME.sbatch                # SLURM prints the job id

Each script keeps the job's command exactly, its environment, directory, GPUs and time
limit. Its output goes to `logs/JOBID.out` in the job's directory: create `logs/` there.
A `run --ray` job becomes `srun ray symmetric-run --address HEAD:PORT --min-nodes N -- CMD`
(Ray 2.49 or later in the job's environment): Ray on every node of the allocation, the
command on the first, Ray stopped when it ends.

{preemptible}{shares}{_bookings_paragraph(bookings)}## For the administrator: switching over

gpuclaim stops handing out GPUs first, and no slurmd starts before its last job has ended:
the two never give out the same GPU.

{steps}

If `slurmd -C` on a node prints fewer CPUs or less memory than slurm.conf says, lower the
numbers in slurm.conf: SLURM refuses a node smaller than its configuration. AutoDetect=nvml
needs a slurmd built with NVML (Debian 12's is not: it says so and uses the File= lines).
"""


def _command_mapping(
    gres: str, gpu_parts: Sequence[Partition], accounting: str, opts: ExportOptions
) -> tuple[tuple[str, str, str], ...]:
    """The table of what a user types now, what in SLURM, and notes."""
    part = f" --partition={gpu_parts[0].name}" if gpu_parts else ""
    limits = f"default {format_duration(opts.default_time_s)}, at most"
    limits += f" {format_duration(opts.max_time_s)}; longer is refused"
    history_note = (
        "finished jobs, from the job-completion log"
        if accounting == "file"
        else "GPUs per job; `sreport` for totals"
    )
    mapping = (
        (
            "`gpuclaim claim -n 1 --time 2h`",
            f"`salloc --gres={gres} --time=2:00:00{part}`",
            "a shell that holds the GPU; `exit` gives it back",
        ),
        ("`gpuclaim shell`", f"`srun --gres={gres} --pty bash`", "a shell on a node"),
        (
            "`gpuclaim run -n 2 -- python train.py`",
            "`sbatch train.sbatch`",
            "`gpuclaim export sbatch NAME` writes the script",
        ),
        (
            "`gpuclaim run --nodes 2 ...`",
            "`sbatch`, `--nodes=2`, `srun`",
            "the exported script does it",
        ),
        (
            "`gpuclaim status`, `board`",
            "`squeue` (jobs), `sinfo` (nodes)",
            '`sinfo -o "%N %G %t"` shows GPUs',
        ),
        (
            "`gpuclaim jobs`, `logs NAME`",
            "`squeue --me`, `cat logs/JOBID.out`",
            "output goes where `--output` says",
        ),
        ("`gpuclaim kill NAME`", "`scancel JOBID`", ""),
        ("`gpuclaim history`", f"`{HISTORY[accounting]}`", history_note),
        ("`--time 8h`", "`--time=8:00:00`", limits),
        ("`run --queue`, `--wait`", "every job queues", "`squeue --start` says when yours starts"),
        (
            "`run --preemptible --requeue`",
            f"`sbatch --partition={SCAVENGER} --qos={SCAVENGER} --requeue`",
            "see Preemptible jobs below",
        ),
        (
            "`gpuclaim serve --name llm -- CMD`",
            "no services in SLURM: a long `sbatch --requeue` job whose script restarts CMD in a"
            " loop, or a second system (Kubernetes) for endpoints",
            "health checks, the fixed port and `forward` have no SLURM counterpart",
        ),
        (
            "`gpuclaim reserve -n 4 --start thu 09:00 --time 8h`",
            "the administrator's `scontrol create reservation`; then `sbatch --reservation=NAME`",
            "users cannot reserve on their own; `scontrol show reservation` lists them",
        ),
    )
    return mapping


def _shares_paragraph(opts: ExportOptions) -> str:
    """run --gpu-mem's parts of a GPU: SLURM's shards (gres/shard), and what they are not."""
    k = opts.shards_per_gpu
    if k:
        how = (
            f"This export makes each GPU {k} shards (`GresTypes=gpu,shard`, `Name=shard` in "
            f"gres.conf): a job asks for its part with `--gres=shard:N` of {k}, and `gpuclaim "
            f"export sbatch --shards {k}` writes the scripts of past `--gpu-mem` jobs so."
        )
    else:
        how = (
            "This export has none (`gpuclaim export slurm --shards K` makes each GPU K shards, "
            "and `export sbatch --shards K` writes past `--gpu-mem` jobs as shard requests): "
            "their scripts ask for a whole GPU."
        )
    return f"""## Part of a GPU

Under gpuclaim, `--gpu-mem 20G` held part of one GPU's memory beside other jobs. SLURM's
counterpart is the *shard*: a GPU split into N slots, jobs on one GPU side by side. {how}
A shard is a slot, not a memory limit: as under gpuclaim without HAMi-core, nothing stops a
job from using more memory than its part, so keep the same habits (or preload HAMi-core in
a job's environment). CUDA MPS (`gres/mps`, with a percentage of the GPU) isolates better
but serves one Unix user per GPU at a time: other users' jobs wait. A GPU's shards and the
GPU itself are not handed out at once: a whole-GPU job waits for its shards to end.

"""


def _mig_paragraph(nodes: Sequence[NodeSpec]) -> str:
    """MIG slices: GRES of their own, typed by profile, found by AutoDetect=nvml alone."""
    found: dict[str, list[str]] = {}
    for n in nodes:
        for g in n.slices:
            where = found.setdefault(g.type or "untyped", [])
            if n.slurm_name not in where:
                where.append(n.slurm_name)
    if not found:
        return ""
    rows = "\n".join(f"| `{t}` | {hostlist(where)} |" for t, where in found.items())
    first = next(iter(found))
    return f"""## MIG slices

A slice is a GPU of its own in SLURM too, its type the slice's profile: `gpuclaim run --mig
{first}` becomes `--gres=gpu:{first}:1`, and SLURM sets CUDA_VISIBLE_DEVICES to the slice as
gpuclaim did. `export sbatch` writes past `--mig` jobs so.

| slice type | nodes |
|---|---|
{rows}

slurmd finds slices only through NVML (gres.conf's AutoDetect=nvml): these nodes need a
slurmd built with NVML (Debian 12's is not), and their slices made before slurmd starts.
`slurmd -G` on a node prints what it found; the types above must be among them.

"""


def _bookings_paragraph(bookings: int) -> str:
    if not bookings:
        return ""
    plural = "s are" if bookings != 1 else " is"
    return f"""## Bookings

{bookings} booking{plural} not over yet: `reservations.sh` makes each a SLURM reservation
(`scontrol create reservation`, run by root once slurmctld is up), named `gpuclaim-ID`; its
owner then submits with `sbatch --reservation=gpuclaim-ID`. A SLURM reservation holds whole
nodes: a booking of some of a node's GPUs is written commented out, to decide by hand.

"""


def _priority_sentence(accounting: str) -> str:
    if accounting == "slurmdbd":
        return "Who goes first is decided by fair share: whoever used fewer\nGPU-hours lately."
    return (
        "Jobs start in the order they were submitted, and a smaller job\nstarts early where "
        "it fits in a gap (backfill). gpuclaim's order by recent use\n(whoever used fewer "
        "GPU-hours lately goes first) needs slurmdbd in\nSLURM: export with `--accounting "
        "slurmdbd` to keep it."
    )


def _admin_steps(nodes: Sequence[NodeSpec], opts: ExportOptions, controller: str) -> list[str]:
    dbd = opts.accounting == "slurmdbd"
    cluster = cluster_name(opts.cluster)
    server_pkgs = "slurmctld slurmdbd munge mariadb-server" if dbd else "slurmctld munge"
    steps = [
        "Stop new work in gpuclaim: `gpuclaim drain NODE --reason 'moving to SLURM'` for each"
        " node. Claims and jobs already running carry on to their end (at most"
        f" {format_duration(opts.max_time_s)}); do the next steps meanwhile.",
        f"On the controller ({controller}): `apt-get install {server_pkgs}`; on each GPU node:"
        " `apt-get install slurmd munge`, then `systemctl disable slurmd` (Debian enables it,"
        " and a node that reboots once slurm.conf is there would start it); where people log"
        " in: `slurm-client`.",
        "Copy one `/etc/munge/munge.key` to every machine (owner munge, mode 0400) and restart"
        " munge everywhere: `munge -n | ssh NODE unmunge` must say Success.",
        "Copy slurm.conf, gres.conf and cgroup.conf to `/etc/slurm/` on every machine.",
    ]
    if dbd:
        steps += [
            f"On {controller}, the database: choose a password (no `#`), then"
            " `mysql -e \"CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'PASSWORD';"
            " GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';\"` with it, put it in"
            f" slurmdbd.conf in place of {DB_PASSWORD_PLACEHOLDER}, and"
            " `install -o slurm -g slurm -m 0600 slurmdbd.conf /etc/slurm/` (slurmdbd refuses a"
            " file that others can read or that slurm does not own). `systemctl start slurmdbd`;"
            " `sacctmgr show cluster` answers once it is up.",
            f"`sacctmgr add cluster {cluster}`; the QOS of preemptible jobs:"
            + "".join(f" `{c}`," for c in sacctmgr_qos_commands(opts))
            + f" then `sacctmgr add account lab QOS=normal,{SCAVENGER} DefaultQOS=normal`"
            " and `sacctmgr add user NAME account=lab` for each person: fair share counts per"
            " user.",
        ]
    steps += [
        "Wait until gpuclaim is empty: `gpuclaim status` shows no claimed GPU and"
        " `gpuclaim jobs` no running job (ask the owners of what is left to release it).",
        "Only now start SLURM: `systemctl start slurmctld` on the controller"
        + (" (not before slurmdbd answers: the first time, it stops without it)" if dbd else "")
        + ", then `systemctl enable --now slurmd` on each node. `sinfo` shows every node"
        " `idle`; one that is `inval` or `drain` says why in `sinfo -R`.",
        f"A first job: `srun --gres={_first_gres(nodes)} nvidia-smi -L` prints the GPU SLURM"
        " gave it. Tell everyone to use SLURM from now on (the table above).",
    ]
    return steps


def _first_gres(nodes: Sequence[NodeSpec]) -> str:
    gpu_parts = [p for p in plan_partitions(nodes) if p.gpu_type is not None]
    first = gpu_parts[0] if gpu_parts else None
    return f"gpu:{first.gpu_type}:1" if first and first.gpu_type else "gpu:1"


def _wrap_step(number: int, text: str, width: int = 92) -> str:
    """``N. text``, wrapped with its continuation lines indented under the text; a `code`
    span stays on one line, so that what is pasted into a shell is the whole command."""
    import textwrap

    glue = "\x00"
    spans = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", glue), text)
    prefix = f"{number}. "
    wrapped = textwrap.fill(
        spans,
        width=width,
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix),
        break_long_words=False,
        break_on_hyphens=False,
    )
    return wrapped.replace(glue, " ")
