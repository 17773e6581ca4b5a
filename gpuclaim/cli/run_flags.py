"""``run``'s flags: each declared once (typer's ``Annotated`` form), gathered in one
``RunFlags``, checked against each other, and turned into the engine's ``RunRequest``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.files import absolute_workdir, sync_request
from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import UsageError

if TYPE_CHECKING:
    from gpuclaim.app.project import ProjectDefaults
    from gpuclaim.cli.common import AppState
    from gpuclaim.engine.jobs import RunRequest

Command = Annotated[list[str], typer.Argument(metavar="-- CMD [ARG]...", show_default=False)]
Count = Annotated[
    Optional[int],
    typer.Option("-n", "--count", min=1, help="GPUs (per node) [default: 1, or the project's]."),
]
Nodes = Annotated[
    Optional[int], typer.Option("--nodes", min=1, help="Nodes, for a gang job (torchrun).")
]
Node = Annotated[
    Optional[str],
    typer.Option("--node", help="Run on this node.", autocompletion=completion.complete_nodes),
]
Gpu = Annotated[
    Optional[str],
    typer.Option(
        "--gpu",
        metavar="NODE:I[,J]",
        help="Exactly these GPUs of one node, e.g. node01:0,1 (instead of -n/--node).",
        autocompletion=completion.complete_nodes,
    ),
]
Name = Annotated[Optional[str], typer.Option("--name", help="Job name (unique among yours).")]
TimeLimit = Annotated[Optional[str], typer.Option("--time", "-t", help="Time limit: 30m, 8h, 2d.")]
Workdir = Annotated[
    Optional[str],
    typer.Option(
        "--workdir",
        "-C",
        help="Directory to run in (default: this one, if the node has it; else the home there).",
    ),
]
Venv = Annotated[
    Optional[str],
    typer.Option(
        "--venv", metavar="PATH", help="A Python venv on the node (relative: to the workdir)."
    ),
]
Conda = Annotated[
    Optional[str],
    typer.Option(
        "--conda", metavar="ENV", help="A conda env on the node (conda, mamba or micromamba)."
    ),
]
Sync = Annotated[
    Optional[bool],
    typer.Option(
        "--sync/--no-sync",
        help="Copy this directory to the job's nodes first, as .gitignore says; the job runs "
        "in its own copy. --no-sync: not even if the project file says sync = true.",
    ),
]
SyncDir = Annotated[
    Optional[str],
    typer.Option("--sync-dir", metavar="DIR", help="--sync, of DIR instead of this directory."),
]
Env = Annotated[Optional[list[str]], typer.Option("--env", "-e", metavar="K=V", help="Env var.")]
Uuids = Annotated[bool, typer.Option("--uuid", help="CUDA_VISIBLE_DEVICES as GPU UUIDs.")]
Queue = Annotated[bool, typer.Option("--queue", help="Queue it if the GPUs are busy; return.")]
Wait = Annotated[bool, typer.Option("--wait", help="Queue it and wait until it starts.")]
Follow = Annotated[
    bool,
    typer.Option(
        "-f", "--follow", help="Then print its output until it ends; exit with its exit code."
    ),
]
Array = Annotated[
    Optional[str],
    typer.Option(
        "--array",
        metavar="SPEC",
        help="One task per index, as SLURM writes it: 0-95, 1,3,5-7, 0-10:2; %K: at most K "
        "at once. Each task has GPUCLAIM_ARRAY_INDEX.",
    ),
]
Sweep = Annotated[
    Optional[Path],
    typer.Option(
        "--sweep",
        metavar="FILE",
        help="One task per line of FILE: its words (shell quoting) are added to the command.",
    ),
]
MaxRunning = Annotated[
    Optional[int],
    typer.Option("--max-running", min=1, metavar="K", help="An array or sweep: at most K at once."),
]
After = Annotated[
    Optional[list[str]],
    typer.Option(
        "--after",
        metavar="NAME",
        help="Start once job or array NAME succeeded (repeatable); if it fails, this is cancelled.",
        autocompletion=completion.complete_jobs,
    ),
]
AfterAny = Annotated[
    Optional[list[str]],
    typer.Option(
        "--after-any",
        metavar="NAME",
        help="Start once NAME ended, however it ended (repeatable).",
        autocompletion=completion.complete_jobs,
    ),
]
Reservation = Annotated[
    Optional[str],
    typer.Option(
        "--reservation",
        metavar="ID",
        help="On your booking's GPUs (all, or -n of them).",
        autocompletion=completion.complete_reservations,
    ),
]
Nice = Annotated[
    int,
    typer.Option(
        "--nice",
        min=0,
        metavar="N",
        help="Let others' queued jobs go first: N points off its priority (see 'jobs --explain').",
    ),
]
Begin = Annotated[
    Optional[str],
    typer.Option(
        "--begin",
        metavar="WHEN",
        help="Queue it until then: 22:00, tomorrow 09:00, Thu 18:00, +2h, 2026-12-24T08:00.",
    ),
]
Preemptible = Annotated[
    bool,
    typer.Option(
        "--preemptible",
        help="Scavenge idle GPUs: yield them (signal, grace, TERM) when anyone else needs them.",
    ),
]
Requeue = Annotated[
    bool,
    typer.Option(
        "--requeue", help="With --preemptible: when preempted, back to the queue to run again."
    ),
]
PreemptSignal = Annotated[
    Optional[str],
    typer.Option(
        "--preempt-signal",
        metavar="SIG",
        help="With --preemptible: the signal that asks it to save and yield (default USR1).",
        autocompletion=completion.complete_signals,
    ),
]
GpuMem = Annotated[
    Optional[str],
    typer.Option(
        "--gpu-mem",
        metavar="SIZE",
        help="Part of one GPU: this much of its memory (20G, 512M), beside others' parts.",
    ),
]
GpuShare = Annotated[
    Optional[str],
    typer.Option(
        "--gpu-share",
        metavar="PART",
        help="Part of one GPU: this part of its memory (0.25 or 25%), beside others' parts.",
    ),
]
Mig = Annotated[
    Optional[str],
    typer.Option(
        "--mig",
        metavar="PROFILE",
        help="MIG slices of this profile (3g.40gb; any: any slice) instead of whole GPUs.",
    ),
]
Ray = Annotated[
    bool,
    typer.Option(
        "--ray",
        help="Start a Ray cluster on the job's GPUs (head on rank 0), run the command on it.",
    ),
]
RayCpus = Annotated[
    Optional[int],
    typer.Option("--ray-cpus", metavar="N", help="CPUs each Ray node offers (default: Ray's)."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the job as JSON.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]


@dataclass(frozen=True)
class RunFlags:
    """What ``run`` was given, as typed: one value per flag."""

    command: list[str]
    count: Optional[int] = None
    nodes: Optional[int] = None
    node: Optional[str] = None
    gpu: Optional[str] = None
    name: Optional[str] = None
    time_: Optional[str] = None
    workdir: Optional[str] = None
    venv: Optional[str] = None
    conda: Optional[str] = None
    sync: Optional[bool] = None
    sync_dir: Optional[str] = None
    env: Optional[list[str]] = None
    uuids: bool = False
    queue: bool = False
    wait: bool = False
    follow: bool = False
    array: Optional[str] = None
    sweep: Optional[Path] = None
    max_running: Optional[int] = None
    after: Optional[list[str]] = None
    after_any: Optional[list[str]] = None
    reservation: Optional[str] = None
    nice: int = 0
    begin: Optional[str] = None
    preemptible: bool = False
    requeue: bool = False
    preempt_signal: Optional[str] = None
    gpu_mem: Optional[str] = None
    gpu_share: Optional[str] = None
    mig: Optional[str] = None
    ray: bool = False
    ray_cpus: Optional[int] = None
    as_json: bool = False
    quiet: bool = False

    @property
    def many(self) -> bool:
        """An array or a sweep: many tasks from one command."""
        return self.array is not None or self.sweep is not None

    def check(self) -> None:
        """Refuse flags that contradict each other, before anything is read or asked."""
        if self.follow and self.as_json:
            raise UsageError("--follow prints the job's output, not JSON: use one of them")
        if self.many and self.reservation:
            raise UsageError("--reservation is for one job: an array's tasks run wherever GPUs are")
        if self.many and (self.follow or self.wait):
            raise UsageError("an array's tasks start as GPUs free up: --follow/--wait one task")
        if self.max_running is not None and not self.many:
            raise UsageError("--max-running is for --array or --sweep")
        if (self.sync or self.sync_dir is not None) and self.workdir is not None:
            raise UsageError("--sync runs the job in its copy: --workdir cannot say otherwise")
        for flag, given in (("--requeue", self.requeue), ("--preempt-signal", self.preempt_signal)):
            if given and not self.preemptible:
                raise UsageError(f"{flag} is for --preemptible jobs")
        if self.preemptible and self.reservation:
            raise UsageError("--preemptible work needs no booking: it runs on whatever is idle")
        if self.gpu is not None:
            self._check_gpu()
        mig_asked(self.mig)
        if self.mig is not None and self.gpu is not None:
            raise UsageError("--gpu names the GPUs (a slice: NODE:0/1): not with --mig")
        mem, part = share_asked(self.gpu_mem, self.gpu_share)
        self._check_ray(bool(mem or part))
        if mem or part:
            from gpuclaim.core.share_policy import checked_share

            checked_share(mem, part, self.count or 1, self.nodes or 1)
            if self.reservation:
                raise UsageError("--gpu-mem/--gpu-share hold part of a GPU: not with --reservation")

    def _check_ray(self, shared: bool) -> None:
        if self.ray_cpus is not None and not self.ray:
            raise UsageError("--ray-cpus is for --ray jobs")
        if self.ray_cpus is not None and self.ray_cpus < 1:
            raise UsageError(f"--ray-cpus wants a number of CPUs of 1 or more, not {self.ray_cpus}")
        if self.ray and shared:
            raise UsageError("--ray gives Ray whole GPUs: not with --gpu-mem/--gpu-share")

    def _check_gpu(self) -> None:
        """``--gpu`` names the GPUs itself: a count or a node beside it must agree, and it
        starts now, on those (a queue, a booking or an array choose GPUs of their own)."""
        from gpuclaim.engine.claims import parse_gpu_spec

        node, indices = parse_gpu_spec(self.gpu or "")
        if self.node is not None and self.node != node:
            raise UsageError(f"--gpu {self.gpu} is on {node}, not on --node {self.node}")
        if self.count is not None and self.count != len(indices):
            raise UsageError(f"--gpu {self.gpu} names {len(indices)} GPUs, not -n {self.count}")
        for flag, given in (
            ("--nodes", (self.nodes or 1) > 1),
            ("--queue", self.queue or self.wait),
            ("--after", bool(self.after or self.after_any)),
            ("--begin", self.begin is not None),
            ("--reservation", self.reservation is not None),
            ("--array/--sweep", self.many),
        ):
            if given:
                raise UsageError(f"--gpu starts it now on those GPUs: not with {flag}")


def run_request(st: AppState, flags: RunFlags, project: ProjectDefaults, here: Path) -> RunRequest:
    """The engine's request: the flags first, then the project file, then the defaults."""
    from gpuclaim.engine.jobs import RunRequest

    flagged_env = parse_env(flags.env or [])
    venv, conda = non_empty(flags.venv, "--venv"), non_empty(flags.conda, "--conda")
    sync: dict[str, Any] = sync_request(
        flags.sync, flags.sync_dir, flags.workdir, project, here, st.config.sync_max_bytes
    )
    exact: tuple[str, ...] = ()
    from gpuclaim.app.hostlists import one_node

    node, count = one_node(flags.node), flags.count
    if flags.gpu is not None:
        from gpuclaim.engine.claims import parse_gpu_spec

        node, exact = parse_gpu_spec(flags.gpu)
        count = len(exact)
    mem, part = share_asked(flags.gpu_mem, flags.gpu_share)
    return RunRequest(
        user=st.user,
        argv=tuple(flags.command),
        name=flags.name,
        count=count or (0 if flags.reservation else project.gpus or 1),
        nodes=flags.nodes or project.nodes or 1,
        node=node,
        gpus=exact,
        time_s=parse_duration(flags.time_) if flags.time_ else project.time_s,
        workdir=absolute_workdir(flags.workdir),
        env=tuple(sorted({**dict(project.env), **dict(flagged_env)}.items())),
        visible_as="uuid" if flags.uuids else "index",
        queue=flags.queue or flags.wait,
        cwd=str(here),
        venv=venv or (None if conda else project.venv),
        conda=conda or (None if venv else project.conda),
        **sync,
        after=tuple(flags.after or ()),
        after_any=tuple(flags.after_any or ()),
        reservation=flags.reservation,
        nice=flags.nice,
        begin=begin_time(flags.begin),
        preemptible=flags.preemptible,
        requeue=flags.requeue,
        preempt_signal=signal_name(flags.preempt_signal or "USR1"),
        gpu_mem_mib=mem,
        gpu_share=part,
        mig=mig_asked(flags.mig),
        ray=flags.ray,
        ray_cpus=flags.ray_cpus,
    )


_MIG_PROFILE = r"^(?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)?$"


def mig_asked(text: Optional[str]) -> Optional[str]:
    """``--mig``: a MIG profile as nvidia-smi names it (3g.40gb, 1g.10gb+me), or any."""
    if text is None:
        return None
    import re

    profile = text.strip().lower()
    if profile != "any" and not re.match(_MIG_PROFILE, profile):
        raise UsageError(
            f"--mig wants a MIG profile as nvidia-smi -L names it, e.g. 3g.40gb, or any "
            f"(got {text!r})"
        )
    return profile


def share_asked(gpu_mem: Optional[str], gpu_share: Optional[str]) -> tuple[int, float]:
    """``--gpu-mem`` in MiB and ``--gpu-share`` as a part (0 for what was not given)."""
    from gpuclaim.core.share_policy import parse_gpu_mem, parse_gpu_share

    mem = parse_gpu_mem(gpu_mem) if gpu_mem is not None else 0
    part = parse_gpu_share(gpu_share) if gpu_share is not None else 0.0
    if mem and part:
        raise UsageError("give --gpu-mem or --gpu-share, not both")
    return mem, part


def signal_name(text: str) -> str:
    """``SIGUSR1``, ``usr1``, ``10`` -> ``USR1``; anything else is a usage error."""
    import signal

    from gpuclaim.core.model import PREEMPT_SIGNALS

    word = text.strip().upper()
    word = word[3:] if word.startswith("SIG") else word
    if word.isdigit():
        try:
            word = signal.Signals(int(word)).name[3:]
        except ValueError:
            word = ""
    if word not in PREEMPT_SIGNALS:
        raise UsageError(
            f"--preempt-signal {text!r}: use one of {', '.join(PREEMPT_SIGNALS)} "
            "(KILL and STOP cannot be caught)"
        )
    return word


def begin_time(text: Optional[str]) -> Optional[float]:
    """``--begin WHEN`` in the forms ``reserve --start`` reads."""
    if text is None:
        return None
    import time

    from gpuclaim.core.when import parse_when

    return parse_when(text, time.time())


def non_empty(value: Optional[str], flag: str) -> Optional[str]:
    if value is not None and not value.strip():
        raise UsageError(f"{flag} wants a name or a path, not an empty string")
    return value.strip() if value else None


def parse_env(items: list[str]) -> tuple[tuple[str, str], ...]:
    result = []
    for item in items:
        key, sep, value = item.partition("=")
        if (
            not sep
            or not key
            or not (key[0].isalpha() or key[0] == "_")
            or not all(ch.isalnum() or ch == "_" for ch in key)
        ):
            raise UsageError(f"--env wants NAME=VALUE with a valid variable name, got {item!r}")
        result.append((key, value))
    return tuple(result)
