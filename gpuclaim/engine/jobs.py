"""Jobs: run a command on claimed GPUs in tmux, queue what does not fit, stop, list, finish.

Used by the CLI on the laptop and by the job wrapper on a node (which finishes its rank and
starts queued jobs that now fit there), so it needs only the standard library.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.config import Config, NodeConfig
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    NameInUseError,
    NeverFitsError,
    UnreachableError,
    UsageError,
)
from gpuclaim.core.events import job_event
from gpuclaim.core.identity import validate_name
from gpuclaim.core.model import EventType, Job, JobKind, iso
from gpuclaim.core.priority import MAX_NICE, parse_entry
from gpuclaim.core.records import ArrayRecord
from gpuclaim.core.service import ServiceSpec
from gpuclaim.core.share_policy import checked_share
from gpuclaim.core.states import ACTIVE_JOB_STATES, FINAL_STATES, JobState
from gpuclaim.engine.array_records import note_task_end
from gpuclaim.engine.bookings import booking_for, settle_bookings
from gpuclaim.engine.claims import release_claims
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view
from gpuclaim.engine.depends import resolve_after
from gpuclaim.engine.job_records import (
    archive_daily,
    find_job,
    finish_rank,
    load_jobs,
    new_job_id,
    reload_job,
)
from gpuclaim.engine.launch import (
    NodeOps,
    nodes_for,
    place_and_claim,
    start_keepers,
    start_ranks,
)
from gpuclaim.engine.owners import check_own
from gpuclaim.engine.policy import lab_config
from gpuclaim.engine.preempt import Say
from gpuclaim.engine.services import settle_port
from gpuclaim.engine.sync import SyncPlan, push_copies
from gpuclaim.store import Store


@dataclass(frozen=True)
class RunRequest:
    """What ``run`` asks for (``serve``, ``shell`` and ``notebook`` too): the command, its GPUs
    and nodes, and how, where and when it starts."""

    user: str
    argv: tuple[str, ...]
    name: Optional[str] = None
    count: int = 1  # GPUs per node
    nodes: int = 1  # > 1: a gang job over that many nodes
    node: Optional[str] = None
    gpus: tuple[str, ...] = ()  # --gpu NODE:I,J: exactly these GPUs of ``node`` (labels)
    time_s: Optional[float] = None
    workdir: Optional[str] = None
    env: tuple[tuple[str, str], ...] = ()
    kind: str = JobKind.BATCH
    visible_as: str = "index"
    queue: bool = False
    cwd: Optional[str] = None  # where run was typed: the workdir when the node has it
    venv: Optional[str] = None
    conda: Optional[str] = None
    sync: Optional[SyncPlan] = None  # --sync: copy these files to the job's nodes first
    sync_subdir: str = ""  # ... and run in this directory of the copy (typed in below its root)
    after: tuple[str, ...] = ()  # --after NAME: start once these succeeded
    after_any: tuple[str, ...] = ()  # --after-any NAME: once these ended, however
    reservation: Optional[str] = None  # --reservation ID: on that booking's GPUs (count 0: all)
    nice: int = 0  # --nice N: N points off its priority in the queue
    begin: Optional[float] = None  # --begin WHEN: queued until then
    preemptible: bool = False  # --preemptible: yields its GPUs to anyone who needs them
    requeue: bool = False  # --requeue: back to the queue when preempted
    preempt_signal: str = "USR1"  # --preempt-signal: what it gets first when preempted
    service: Optional[ServiceSpec] = None  # gpuclaim serve: port (0: auto), health, restarts
    gpu_mem_mib: int = 0  # --gpu-mem: a share of one GPU, this much of its memory
    gpu_share: float = 0.0  # --gpu-share: ... or this part of it
    mig: Optional[str] = None  # --mig PROFILE: MIG slices of that profile ("any": any slice)
    ray: bool = False  # --ray: a Ray cluster over its ranks, the command run against it
    ray_cpus: Optional[int] = None  # --ray-cpus: CPUs each of its Ray nodes offers


def default_name(argv: Sequence[str]) -> str:
    """``python train.py`` -> ``train-1a2b``, ``python -m pkg.mod`` -> ``mod-1a2b``."""
    stem = Path(argv[0]).name if argv else "job"
    if stem.startswith("python") and len(argv) > 1:
        if "-m" in argv[1:-1]:
            stem = argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
        else:
            scripts = [a for a in argv[1:] if a.endswith(".py")]
            stem = Path(scripts[0]).stem if scripts else stem
    base = "".join(ch if ch.isalnum() or ch in "_-" else "-" for ch in stem).strip("-_")[:24]
    return f"{base or 'job'}-{uuid.uuid4().hex[:4]}"


def _array_active(store: Store, record: ArrayRecord) -> bool:
    """An array not yet summed up, with a task (its latest run) still queued or running."""
    if record.get("result") is not None:
        return False
    from gpuclaim.engine.array_records import array_tasks, latest_run

    return any(latest_run(store, t).state in ACTIVE_JOB_STATES for t in array_tasks(store, record))


def checked_name(store: Store, req: RunRequest) -> str:
    """The job's (or array's) name: valid, and not one of the user's running or queued jobs
    or arrays (NameInUseError, exit 5)."""
    name = validate_name(req.name or default_name(req.argv), "job name")
    # the records of that name and the arrays' records: not a busy day's every record
    taken = any(
        j.user == req.user and j.state in ACTIVE_JOB_STATES for j in store.list_jobs(named=name)
    )
    taken = taken or any(
        a["user"] == req.user and a["name"] == name and _array_active(store, a)
        for a in store.list_arrays()
    )
    archive_daily(store)  # what load_jobs did here on the way, once a day now
    if taken:
        raise NameInUseError(f"you already have a job named {name!r}", hint="pick another --name")
    return name


def checked_time(config: Config, req: RunRequest) -> float:
    """Refuse what no job can be (one line each) and return its time limit."""
    if not req.argv:
        raise UsageError("give the command to run after --, e.g. gpuclaim run -- python train.py")
    if req.nodes < 1 or req.count < 1:
        raise UsageError("-n and --nodes must be at least 1")
    if req.nodes > 1 and req.node:
        raise UsageError("--node pins a job to one node; a gang job (--nodes K) picks its nodes")
    if req.venv and req.conda:
        raise UsageError("--venv and --conda: a job runs in one of them")
    if req.sync and req.workdir:
        raise UsageError("--sync runs the job in its copy: --workdir cannot say otherwise")
    checked_share(req.gpu_mem_mib, req.gpu_share, req.count, req.nodes)
    if (req.gpu_mem_mib or req.gpu_share) and req.reservation:
        raise UsageError("--gpu-mem/--gpu-share hold part of a GPU: not with --reservation")
    if not 0 <= req.nice <= MAX_NICE:
        raise UsageError(f"--nice must be from 0 to {MAX_NICE}, not {req.nice}")
    limit = config.limits.max_gpus_per_user
    if limit and req.count * req.nodes > limit:
        raise UsageError(
            f"{req.count * req.nodes} GPUs can never start: this cluster's limit is "
            f"{limit} GPUs per user (max_gpus_per_user)"
        )
    service = req.kind == JobKind.SERVICE
    longest = config.limits.max_service_time_s if service else config.limits.max_time_s
    default = longest if service else config.limits.default_time_s  # a service: till the limit
    time_s = req.time_s if req.time_s is not None else default
    if time_s > longest:
        raise UsageError(
            f"--time {format_duration(time_s)} is longer than this cluster's limit of "
            f"{format_duration(longest)}" + (" for a service (max_service_time)" if service else "")
        )
    return time_s


def job_from_request(
    req: RunRequest, job_id: str, name: str, time_s: float, now: float, **more: Any
) -> Job:
    """The queued job a request describes (an array's task: ``more`` says which)."""
    return Job(
        id=job_id,
        name=name,
        user=req.user,
        argv=tuple(req.argv),
        state=JobState.QUEUED,
        submitted=now,
        time_limit_s=time_s,
        gpus_per_node=req.count,
        nodes_wanted=req.nodes,
        node=req.node,
        gpu_indices=req.gpus,
        workdir=req.workdir,
        env=tuple(sorted(req.env)),
        kind=req.kind,
        visible_as=req.visible_as,
        cwd=req.cwd,
        venv=req.venv,
        conda=req.conda,
        synced_from=req.sync.root if req.sync else None,
        reservation=req.reservation,
        nice=req.nice,
        begin=req.begin,
        preemptible=req.preemptible,
        requeue=req.requeue,
        preempt_signal=req.preempt_signal,
        service=req.service,
        gpu_mem_mib=req.gpu_mem_mib,
        gpu_share=req.gpu_share,
        mig=req.mig,
        ray=req.ray,
        ray_cpus=req.ray_cpus,
        **more,
    )


def submit_job(
    config: Config,
    store: Store,
    req: RunRequest,
    prober: NodeProber,
    ops: Optional[NodeOps] = None,
    say: Optional[Say] = None,
) -> Job:
    """Start the job now (claiming its GPUs), or queue it with ``req.queue`` (or when it
    waits ``--after`` another). Without ``queue``, nothing free means ConflictError (exit 3)
    and no job is left behind; a name already used by a running or queued job of the user's
    is NameInUseError (exit 5). With ``say``, it may wait for preemptible jobs to yield."""
    config = lab_config(config, store)
    if req.reservation:
        req = in_booking(config, store, req)
    time_s = checked_time(config, req)
    name = checked_name(store, req)
    after = resolve_after(store, req.user, req.after, req.after_any, name)
    job = job_from_request(req, new_job_id(), name, time_s, store.now(), after=after)
    if after or req.begin is not None:
        req = replace(req, queue=True)  # it starts when they end, or then: from the queue
    ops = ops or NodeOps(config, prober)
    view = build_view(config, store, nodes_for(config, job), prober=prober)
    placing = config  # where it may go: for run --ray, only nodes with Ray (asked first)
    if job.ray:
        from gpuclaim.engine.ray_jobs import nodes_with_ray

        placing = nodes_with_ray(config, ops, job, view)
        # queued, it is placed later, by whoever dispatches: where Ray was found, too
        job = job.with_(ray_nodes=tuple(n.name for n in placing.nodes))
    check_fits(placing, view, job)
    if req.sync and req.queue:
        # the laptop may be closed when it starts: every node it could start on gets a copy
        nodes = [n for n in nodes_for(config, job) if n.name not in view.unreachable]
        job = _with_copies(config, ops, job, req, nodes)
    if req.queue:
        check_queue_room(config, store, req.user, 1)
        job = store.create_job(job=job)
        enqueue(store, job)
        store.append_event(job_event(EventType.JOB_QUEUED, job, job.submitted))
        from gpuclaim.engine.dispatch import dispatch_queue  # here: a job that starts needs none

        dispatch_queue(config, store, prober=prober, ops=ops)
        job = reload_job(store, job)
        if job.state == JobState.QUEUED:
            start_keepers(config, ops, job, view)
        return job
    ranks = place_and_claim(placing, store, job, prober, view, say=say)
    try:
        job = settle_port(store, ops, job, ranks[0].node)
        if req.sync:
            job = _with_copies(config, ops, job, req, [config.node(r.node) for r in ranks])
    except GpuclaimError:
        for r in ranks:  # nothing half-started: the GPUs go back
            release_claims(config, store, job.user, claim_ids=[r.claim_id or ""], jobs_too=True)
        raise
    job = job.with_(state=JobState.STARTING, ranks=tuple(ranks))
    job = store.create_job(job=job)
    return start_ranks(config, store, job, ops)


def enqueue(store: Store, job: Job) -> str:
    """Into the queue, with what orders it there (its user, nice and begin)."""
    return store.enqueue(job_id=job.id, user=job.user, nice=job.nice, begin=job.begin or 0.0)


def check_queue_room(config: Config, store: Store, user: str, adding: int) -> None:
    """``max_queued_per_user``: refused in one line, nothing queued (exit 3)."""
    limit = config.limits.max_queued_per_user
    if not limit:
        return
    entries = [e for e in map(parse_entry, store.queue_entries()) if e is not None]
    mine = sum(1 for e in entries if (e.user or _owner(store, e.job_id)) == user)
    if mine + adding > limit:
        raise ConflictError(
            f"{user} has {mine} queued job{'s' if mine != 1 else ''}; {adding} more would "
            f"pass this cluster's limit of {limit} (max_queued_per_user)",
            hint="wait for some to start, or kill queued ones (gpuclaim jobs)",
        )


def _owner(store: Store, job_id: str) -> str:
    job = store.load_job(job_id=job_id)
    return job.user if job is not None else ""


def in_booking(config: Config, store: Store, req: RunRequest) -> RunRequest:
    """A run on one's booking: its node, and all its GPUs unless -n asks for fewer."""
    snap = settle_bookings(config, store, store.snapshot())
    booking = booking_for(snap, req.reservation or "", req.user)
    if req.nodes > 1:
        raise UsageError("--reservation holds GPUs of one node: it does not go with --nodes")
    if req.node and req.node != booking.node:
        raise UsageError(f"--node {req.node}: reservation {booking.id} is on {booking.node}")
    count = req.count or len(booking.gpus)
    if count > len(booking.gpus):
        raise UsageError(
            f"reservation {booking.id} holds {len(booking.gpus)} GPU(s): -n {count} is more"
        )
    return replace(req, node=booking.node, count=count)


def _with_copies(
    config: Config, ops: NodeOps, job: Job, req: RunRequest, nodes: Sequence[NodeConfig]
) -> Job:
    """``job`` once ``req.sync`` is copied to ``nodes``: it runs in its copy (in the
    subdirectory ``run`` was typed in, below the project's root)."""
    assert req.sync is not None
    copy, copied = push_copies(config, ops, nodes, req.sync, job.id)
    workdir = f"{copy}/{req.sync_subdir}" if req.sync_subdir else copy
    return job.with_(workdir=workdir, synced=copied)


def check_fits(config: Config, view: ClusterView, job: Job) -> None:
    """Refuse at once what can never run here: more GPUs or nodes than the cluster has."""
    reachable = [n.name for n in nodes_for(config, job) if n.name not in view.unreachable]
    if not reachable:
        raise UnreachableError("no node could be asked about its GPUs")
    big_enough = [n for n in reachable if len(view.gpus_of(n)) >= job.gpus_per_node]
    if len(big_enough) < job.nodes_wanted:
        sizes = ", ".join(f"{n} {len(view.gpus_of(n))}" for n in reachable)
        raise NeverFitsError(
            f"{job.nodes_wanted} node(s) with {job.gpus_per_node} GPUs can never fit "
            f"(GPUs per node: {sizes})"
        )


def kill_job(
    config: Config,
    store: Store,
    user: str,
    name: str,
    ops: NodeOps,
    force: bool = False,
    wait_s: float = 0.0,
) -> Job:
    """Stop a job (all ranks) or take it out of the queue; only one's own without ``force``."""
    job = find_job(store, user, name) if not force else _find_any(store, name)
    if job.user != user and not force:
        raise ConflictError(f"job {job.name} belongs to {job.user}", hint="use --force (logged)")
    if not force:
        check_own(store, job, "kill", hint="use --force (logged)")
    if job.state not in ACTIVE_JOB_STATES:
        raise GpuclaimError(f"job {job.name} already ended ({job.state})")
    if job.user != user:  # --force on someone else's job: on the record, and on Slack
        store.append_event(
            replace(
                job_event(EventType.FORCE_KILL, job, store.now()),
                by=user,
                reason=f"killed by {user}",
            )
        )
    if job.state == JobState.QUEUED:
        removed = take_out_of_queue(store, job, user)
        if removed is not None:
            return removed
        job = reload_job(store, job)  # it started meanwhile: stop it like a running one
    return stop_and_wait(config, store, [job], ops, wait_s)[0]


def take_out_of_queue(
    store: Store, job: Job, user: str, entries: Optional[list[str]] = None
) -> Optional[Job]:
    """A queued job killed before it started (None: it started meanwhile)."""
    for entry in entries if entries is not None else store.queue_entries():
        parsed = parse_entry(entry)
        if parsed and parsed.job_id == job.id and store.take_queue_entry(name=entry):
            store.finish_queue_entry(name=entry)
    result = store.update_job(
        job_id=job.id,
        changes={
            "state": JobState.KILLED,
            "ended": iso(store.now()),
            "reason": f"removed by {user}",
        },
        only_from=[JobState.QUEUED],
    )
    if not result.applied:
        return None
    killed = result.job
    note_task_end(store, killed)
    return killed


def stop_and_wait(
    config: Config, store: Store, jobs: Sequence[Job], ops: NodeOps, wait_s: float
) -> list[Job]:
    """Ask every job's wrappers to stop (TERM, then KILL), all at once; wait up to ``wait_s``
    for them to record it; clean up after wrappers that are gone."""
    for job in jobs:
        store.update_job(
            job_id=job.id,
            changes={"stop_requested": "kill"},
            only_from=[JobState.STARTING, JobState.RUNNING],
        )
    deadline = time.monotonic() + wait_s
    current = [reload_job(store, j) for j in jobs]
    while time.monotonic() < deadline and any(j.state not in FINAL_STATES for j in current):
        time.sleep(0.5)
        current = [reload_job(store, j) for j in current]
    if wait_s == 0:
        return current
    # The wrappers did not finish these: they are gone (node rebooted, tmux killed). Clean up.
    done = []
    for job in current:
        for r in job.ranks:
            if job.state in FINAL_STATES or r.state in FINAL_STATES:
                continue
            try:
                ops.stop_session(config.node(r.node), job.session_of(r.rank))
            except GpuclaimError:
                pass
            finish_rank(store, job, r.rank, JobState.KILLED, None, "stopped; its wrapper was gone")
        done.append(reload_job(store, job))
    return done


def _find_any(store: Store, name: str) -> Job:
    live = [
        j
        for j in load_jobs(store)
        if (j.name == name or j.id == name) and j.state in ACTIVE_JOB_STATES
    ]
    if not live:
        raise GpuclaimError(f"no running or queued job {name!r}")
    if len(live) > 1:
        raise UsageError(f"several users have a job {name!r}: give its id ({live[0].id}, ...)")
    return live[0]
