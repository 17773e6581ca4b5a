"""Preemptible ("scavenger") jobs in SLURM: gpuclaim's ``run --preemptible [--requeue]
[--preempt-signal SIG]`` and ``[queue] preempt_grace`` as slurm.conf settings, a
``scavenger`` partition, a ``scavenger`` QOS (with slurmdbd, made by sacctmgr), the
directives of an exported sbatch script and MIGRATION.md's words. Pure renderers.

What Slurm 22.05 does, measured by tests/test_slurm_real.py and read in its source: a job
chosen for preemption gets its ``--signal`` at once where ``SlurmctldParameters`` has
``preempt_send_user_signal`` (else SIGCONT and SIGTERM), to its job steps only, never to the
batch script's shell unless ``--signal=B:``; then GraceTime, of its partition under
preempt/partition_prio or of its QOS under preempt/qos (slurmctld ends it at its time-limit
check, every 30 s, so it lasts up to 30 s longer); then SIGCONT, SIGTERM, KillWait and
SIGKILL to the steps and the script.
PreemptMode=REQUEUE requeues a job that may be requeued (``--requeue``, or JobRequeue=1) and
cancels the others: they end PREEMPTED. A ``--signal`` at ``@0`` is never sent before the
time limit. UsageFactor counts for the job's own QOS only, not a partition's.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuclaim.app.slurm.spec import ExportOptions, Partition
from gpuclaim.app.slurm.syntax import hostlist
from gpuclaim.core.durations import format_slurm_time
from gpuclaim.core.errors import UsageError

if TYPE_CHECKING:
    from gpuclaim.core.model import Job

SCAVENGER = "scavenger"  # the partition, and with slurmdbd the QOS, of preemptible jobs
# The signal names Slurm's --signal knows (sig_name2num); others go as their Linux number.
_SLURM_SIGNALS = ("HUP", "INT", "QUIT", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT")
_LINUX_NUMBERS = {"WINCH": 28}


def seconds(value: float) -> int:
    """A duration as the whole seconds GraceTime and KillWait take."""
    return max(0, round(value))


def preemption_lines(opts: ExportOptions, dbd: bool) -> list[str]:
    """slurm.conf's preemption settings: the scavenger partition's tier, or with slurmdbd
    the scavenger QOS, decides who yields; requeued only on request; the job's own signal."""
    grace = seconds(opts.preempt_grace_s)
    if dbd:
        how = [
            "# Preemption, as `gpuclaim run --preemptible`: a job of the scavenger QOS yields",
            "# its GPUs to any job of the normal QOS (MIGRATION.md creates the QOS with sacctmgr:",
            f"# Preempt=scavenger on normal; GraceTime={grace}, PreemptMode=requeue and",
            "# UsageFactor=0 on scavenger: its use does not count towards fair share).",
            "PreemptType=preempt/qos",
        ]
    else:
        how = [
            "# Preemption, as `gpuclaim run --preemptible`: a job in the scavenger partition",
            "# (below; PriorityTier=0) yields its GPUs to any job of the other partitions",
            f"# (PriorityTier=1, the default), after its GraceTime ({grace}s).",
            "PreemptType=preempt/partition_prio",
        ]
    return [
        *how,
        "# A preempted job goes back to the queue if it asked (sbatch --requeue), else it",
        "# ends PREEMPTED. JobRequeue=0: only if it asked, as under gpuclaim (where a job on a",
        "# node that failed was lost, not run again).",
        "PreemptMode=REQUEUE",
        "JobRequeue=0",
        "# When its grace begins, a job's steps get its own --signal (gpuclaim's",
        "# --preempt-signal) instead of SIGTERM; exported scripts say --signal=USR1@0 (@0:",
        "# not before the time limit). Later Slurm releases spell this",
        "# PreemptParameters=send_user_signal.",
        "SlurmctldParameters=preempt_send_user_signal",
    ]


def scavenger_partition(parts: Sequence[Partition], opts: ExportOptions, dbd: bool) -> list[str]:
    """The scavenger partition over every GPU node: comments and its PartitionName line;
    nothing where no node has a GPU."""
    gpu_parts = [p for p in parts if p.gpu_type is not None]
    if not gpu_parts:
        return []
    nodes = sorted({n for p in gpu_parts for n in p.nodes})
    cpus = [p.cpus_per_gpu for p in gpu_parts if p.cpus_per_gpu]
    mem = [p.mem_per_gpu_mib for p in gpu_parts if p.mem_per_gpu_mib]
    words = [
        f"PartitionName={SCAVENGER}",
        f"Nodes={hostlist(nodes)}",
        "Default=NO",
        f"DefaultTime={format_slurm_time(opts.default_time_s)}",
        f"MaxTime={format_slurm_time(opts.max_time_s)}",
    ]
    words += [f"DefCpuPerGPU={min(cpus)}"] if cpus else []
    words += [f"DefMemPerGPU={min(mem)}"] if mem else []
    if dbd:
        words.append('TRESBillingWeights="GRES/gpu=1.0"')
    words.append("PriorityTier=0")
    if dbd:
        note = [
            "# Preemptible jobs' partition (sbatch --partition=scavenger --qos=scavenger): every",
            "# GPU node, with the fewest CPUs and least memory per GPU of any. Under preempt/qos",
            "# the QOS decides who yields; this partition keeps the same scripts working without",
            "# slurmdbd, and its jobs are scheduled after the others'.",
        ]
    else:
        grace = seconds(opts.preempt_grace_s)
        words += ["PreemptMode=REQUEUE", f"GraceTime={grace}"]
        note = [
            "# Preemptible jobs (sbatch --partition=scavenger): every GPU node, with the fewest",
            "# CPUs and least memory per GPU of any, and a lower tier: any other partition's job",
            "# preempts them.",
            "# GraceTime, from their signal to SIGTERM, is gpuclaim's preempt_grace. Their",
            "# --qos=scavenger is for slurmdbd's QOS: ignored here.",
        ]
    words.append("State=UP")
    return [*note, " ".join(words)]


def slurm_signal(name: str) -> str:
    """gpuclaim's --preempt-signal (``USR1``) as sbatch's --signal takes it: by name, or
    by its Linux number where Slurm has no name for it; UsageError for any other."""
    name = name.upper().removeprefix("SIG") if name else "USR1"
    if name in _SLURM_SIGNALS:
        return name
    if name in _LINUX_NUMBERS:
        return str(_LINUX_NUMBERS[name])
    raise UsageError(f"SLURM's --signal cannot send SIG{name} (a preempt signal gpuclaim has not)")


def sbatch_directives(job: Job) -> list[tuple[str, str]]:
    """A preemptible job's #SBATCH directives, after --output (nothing for another job)."""
    if not job.preemptible:
        return []
    out = [("requeue", ""), ("open-mode", "append")] if job.requeue else [("no-requeue", "")]
    return [*out, ("signal", f"{slurm_signal(job.preempt_signal)}@0")]


# What torch.distributed.run (torchelastic's agent) handles; any other signal ends it.
_TORCHRUN_HANDLES = ("TERM", "INT", "HUP", "QUIT")


def sbatch_notes(job: Job, preempt_grace_s: float, torchrun: bool = False) -> list[str]:
    """What a preemptible job's script does as gpuclaim did, and what it does not;
    ``torchrun``: its command runs under torch.distributed.run on each node."""
    if not job.preemptible:
        return []
    name = job.preempt_signal.upper().removeprefix("SIG") or "USR1"
    flags = "--preemptible" + (" --requeue" if job.requeue else "")
    items = [
        f"--partition/--qos={SCAVENGER}: a job of another partition (with slurmdbd: any job of"
        " the normal QOS) may take these GPUs.",
        f"Then the command gets SIG{name} at once (--signal={slurm_signal(name)}@0 with"
        " slurm.conf's preempt_send_user_signal; @0: never before the time limit, as under"
        f" gpuclaim), GraceTime ({seconds(preempt_grace_s)}s, gpuclaim's preempt_grace;"
        " slurmctld checks every 30s, so up to 30s more) to save its state, then SIGTERM,"
        " KillWait, SIGKILL.",
        "--requeue: then back to the queue, the same job id; SLURM_RESTART_COUNT counts the"
        " restarts (GPUCLAIM_RESTART_COUNT below); --open-mode=append keeps each run's output."
        if job.requeue
        else "--no-requeue: then it ends PREEMPTED.",
        "Not the same: SLURM signals job steps, not this script's shell, hence `srun` (every"
        " process of the command gets the signal, as under gpuclaim); no"
        " GPUCLAIM_PREEMPT_DEADLINE file: the signal is the notice.",
    ]
    if torchrun and name not in _TORCHRUN_HANDLES:
        items.append(
            "Caution: torch.distributed.run handles only SIGTERM, SIGINT, SIGHUP and SIGQUIT:"
            f" SIG{name} ends it at once, and SLURM then kills its workers; have them save on"
            " SIGTERM, or start them without it."
        )
    out = ["#", f"# Preemptible (gpuclaim: run {flags} --preempt-signal {name}):"]
    for item in items:
        lines = textwrap.wrap(item, 88, break_on_hyphens=False)
        out += [f"# - {lines[0]}", *(f"#   {line}" for line in lines[1:])]
    return out


def sbatch_env(job: Job, preempt_grace_s: float) -> list[str]:
    """gpuclaim's environment for a preemptible job, from SLURM's."""
    if not job.preemptible:
        return []
    return [
        'export GPUCLAIM_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"',
        f"export GPUCLAIM_PREEMPT_GRACE={seconds(preempt_grace_s)}",
    ]


def sacctmgr_qos_commands(opts: ExportOptions) -> list[str]:
    """The sacctmgr commands that make the scavenger QOS (with slurmdbd)."""
    grace = seconds(opts.preempt_grace_s)
    return [
        f"sacctmgr add qos {SCAVENGER} PreemptMode=requeue GraceTime={grace} UsageFactor=0",
        f"sacctmgr modify qos normal set Preempt={SCAVENGER}",
    ]


def migration_section(accounting: str, opts: ExportOptions) -> str:
    """MIGRATION.md's "Preemptible jobs": what each flag and setting becomes."""
    grace = seconds(opts.preempt_grace_s)
    dbd = accounting == "slurmdbd"
    if dbd:
        owner = f"the `{SCAVENGER}` QOS"
        intro = (
            f"A preemptible job runs with the `{SCAVENGER}` QOS (and in the `{SCAVENGER}`\n"
            "partition, which holds every GPU node): it uses GPUs nobody else asked for and\n"
            "yields them to any job of the normal QOS that needs them. Its GPU time does not\n"
            "count towards fair share (UsageFactor=0 of the QOS)."
        )
    else:
        owner = f"the `{SCAVENGER}` partition"
        intro = (
            f"A preemptible job runs in the `{SCAVENGER}` partition, which holds every GPU node:\n"
            "it uses GPUs nobody else asked for and yields them to any job of another partition\n"
            "that needs them. (Without slurmdbd, `--qos` is ignored, and there is no fair share\n"
            "to leave its GPU time out of.)"
        )
    rows = (
        (
            "`run --preemptible`",
            f"`--partition={SCAVENGER} --qos={SCAVENGER}`",
            "any job of the normal QOS may take its GPUs"
            if dbd
            else "any job of another partition may take its GPUs",
        ),
        (
            "`--requeue`",
            "`--requeue --open-mode=append`",
            "back to the queue, same job id; without it: `--no-requeue`, ends PREEMPTED",
        ),
        (
            "`--preempt-signal USR1`",
            "`--signal=USR1@0`, the command under `srun`",
            "sent at once (slurm.conf: preempt_send_user_signal); SLURM signals job steps,"
            " not the batch shell",
        ),
        (
            f"`[queue] preempt_grace` ({grace}s)",
            f"GraceTime={grace} of {owner}",
            "from the signal to SIGTERM; up to 30 s more (slurmctld checks every 30 s)",
        ),
        (
            "`[limits] kill_grace`",
            f"KillWait={seconds(opts.kill_wait_s)}",
            "from SIGTERM to SIGKILL, for every job",
        ),
    )
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    return f"""## Preemptible jobs

{intro}

| gpuclaim | SLURM | notes |
|---|---|---|
{table}

`gpuclaim export sbatch` writes all of this into a preemptible job's script. A requeued job
finds the number of its earlier runs in `SLURM_RESTART_COUNT` (the script passes it on as
`GPUCLAIM_RESTART_COUNT`). No `GPUCLAIM_PREEMPT_DEADLINE` file: the signal is the notice.

"""
