"""``jobs --explain NAME`` (and ``why NAME``): the whole judgement of a queued job — its place,
its priority and what makes it, why it waits, and when it is expected to start."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import AppState, out, print_json, state
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.states import JobState

if TYPE_CHECKING:
    from gpuclaim.core.model import Job
    from gpuclaim.core.priority import QueueEntry
    from gpuclaim.engine.dispatch import QueueReport, Verdict


def why(
    ctx: typer.Context,
    name: str = typer.Argument(
        ...,
        metavar="NAME",
        help="Job name (yours, or anyone's queued one), task (sweep[3]) or id.",
        autocompletion=completion.complete_jobs,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Why a queued job waits: its priority, its reason and its expected start."""
    explain_job(state(ctx, looking=True), name, as_json)


def explain_job(st: AppState, name: str, as_json: bool) -> None:
    from gpuclaim.engine.dispatch import Explained

    found = _queued_job(st, name)
    report = None
    if found.state == JobState.QUEUED:  # judged with every job ahead of it, no more
        report = st.dispatch_quietly(every=Explained(st.user, 0, through=found.id))
    job = st.store.load_job(job_id=found.id) or found  # the pass may have started it
    verdict = report.verdicts.get(job.id) if report is not None else None
    if job.state != JobState.QUEUED or report is None or verdict is None:
        where = f" on {', '.join(r.node for r in job.ranks)}" if job.ranks else ""
        raise GpuclaimError(f"{job.name} is not queued: it is {job.state}{where}")
    start = report.expected_start(job)
    facts = _facts(st, job, verdict, report, start)
    if as_json:
        print_json(facts)
        return
    _print(job, verdict, facts, start)


def _queued_job(st: AppState, name: str) -> Job:
    """The user's queued job of that name (its queued array's first waiting task), else the
    user's running one (it is not queued: said so), else anyone's queued job of that name;
    read from the queue's entries and the records they name, not from every record."""
    from gpuclaim.core.priority import parse_entry
    from gpuclaim.engine.job_records import find_job

    store = st.store
    entries = [e for e in map(parse_entry, store.queue_entries()) if e is not None]
    arrays = store.list_arrays()
    mine = _in_queue(st, name, [e for e in entries if e.user == st.user], arrays)
    if mine is not None:
        return mine
    holding = [c.claim.job for c in store.snapshot().claims.values() if c.claim.user == st.user]
    running = store.list_jobs(only_ids=sorted({j for j in holding if j}), named=name)
    if running:
        return running[-1]
    anyones = _in_queue(st, name, entries, arrays)
    # neither: the user's job of that name, to say what it is (or that there is none)
    return anyones if anyones is not None else find_job(store, st.user, name)


def _in_queue(
    st: AppState, name: str, entries: list[QueueEntry], arrays: list[Any]
) -> Optional[Job]:
    """The queued job among ``entries`` that ``name`` names: its id, a task (``sweep[3]``),
    an array (its first waiting task) or a plain job's name (one only)."""
    from gpuclaim.core.arrays import split_task_name
    from gpuclaim.engine.array_records import array_of_task, task_index

    ids = {e.job_id for e in entries}
    if name in ids:
        return st.store.load_job(job_id=name)
    task = split_task_name(name)
    base, index = task if task is not None else (name, None)
    for record in arrays:
        if record["name"] != base:
            continue
        # by index, the queued id: the task's own, or its rerun's ('a-1f2e-7r1')
        waiting: dict[int, str] = {}
        for job_id in ids:
            at = task_index(job_id) if array_of_task(job_id) == record["id"] else None
            if at is not None:
                waiting[at] = job_id
        wanted = index if index is not None else min(waiting, default=None)
        if wanted is not None and wanted in waiting:
            return st.store.load_job(job_id=waiting[wanted])
    plain = sorted(i for i in ids if array_of_task(i) is None)
    named = st.store.list_jobs(only_ids=plain, named=name)
    if len(named) > 1:
        users = ", ".join(sorted({j.user for j in named}))
        raise GpuclaimError(f"{name!r} names queued jobs of {users}: give its id")
    return named[0] if named else None


def _facts(
    st: AppState, job: Job, verdict: Verdict, report: QueueReport, start: Optional[float]
) -> dict[str, Any]:
    p = verdict.priority
    policy = st.config.queue
    return {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        "queue_position": verdict.position,
        "queue_length": len(report.verdicts),
        "reason": verdict.reason.line if verdict.reason else "",
        "priority": round(p.value, 1),
        "priority_parts": {
            "fairshare": round(p.fairshare, 1),
            "age": round(p.age, 1),
            "nice": p.nice,
            "use_gpu_hours": round(p.use_gpu_hours, 2),
            "mean_use_gpu_hours": round(p.mean_use_gpu_hours, 2),
            "half_life_s": policy.half_life_s,
            "max_age_s": policy.max_age_s,
            "fairshare_weight": policy.fairshare_weight,
            "age_weight": policy.age_weight,
        },
        "gpus_per_node": job.gpus_per_node,
        "nodes_wanted": job.nodes_wanted,
        "time_limit_s": job.time_limit_s,
        "expected_start": _iso(start),
        "preemptible": job.preemptible,
        "restarts": job.restarts,
    }


def _print(job: Job, verdict: Verdict, facts: dict[str, Any], start: Optional[float]) -> None:
    from gpuclaim.core.when import format_when

    now = time.time()
    p = verdict.priority
    parts = facts["priority_parts"]
    console = out()
    console.print(
        f"{job.name} ({job.user}): position {verdict.position} of {facts['queue_length']} "
        "in the queue",
        markup=False,
        highlight=False,
    )
    lines = [
        ("reason", facts["reason"] or "(not judged yet)"),
        (
            "priority",
            f"{p.value:.0f} = fair share {p.fairshare:.0f} + age {p.age:.0f} - nice {p.nice}",
        ),
        (
            "fair share",
            f"{job.user} used {p.use_gpu_hours:.3g} GPU-hours lately (half-life "
            f"{format_duration(parts['half_life_s'])}); the mean is "
            f"{p.mean_use_gpu_hours:.3g}: {parts['fairshare_weight']:.0f} x "
            f"2^(-{p.use_gpu_hours:.3g}/{p.mean_use_gpu_hours:.3g})"
            if p.mean_use_gpu_hours >= 0.005
            else f"nobody used GPUs lately: the whole {parts['fairshare_weight']:.0f}",
        ),
        (
            "age",
            f"waited {format_duration(now - max(job.submitted, job.begin or 0))} of "
            f"{format_duration(parts['max_age_s'])} for the whole {parts['age_weight']:.0f}",
        ),
        (
            "needs",
            _needs(job)
            + (" (preemptible: yields when anyone needs them)" if job.preemptible else ""),
        ),
        *(
            [("restarts", f"{job.restarts} (preempted, requeued: this is run {job.restarts + 1})")]
            if job.restarts
            else []
        ),
        (
            "expected start",
            format_when(start, now) if start is not None else "unknown (GPUs busy with no end)",
        ),
    ]
    for key, value in lines:
        console.print(f"  {key + ':':<16}{value}", markup=False, highlight=False)


def _needs(job: Job) -> str:
    gpus = f"{job.gpus_per_node} GPU{'s' if job.gpus_per_node != 1 else ''}"
    where = f"on {job.node}" if job.node else "on one node"
    if job.nodes_wanted > 1:
        where = f"on each of {job.nodes_wanted} nodes"
    return f"{gpus} {where}, for {format_duration(job.time_limit_s)}"


def _iso(ts: Optional[float]) -> Optional[str]:
    from gpuclaim.core.model import iso

    return iso(ts) if ts is not None else None
