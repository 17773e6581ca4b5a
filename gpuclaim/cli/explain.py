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
    report = st.dispatch_quietly(every=True)
    job = _queued_job(st, name)
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
    """The user's job of that name (its queued array's first waiting task), else anyone's
    queued job of that name."""
    from gpuclaim.engine.job_records import find_job, load_jobs

    try:
        return find_job(st.store, st.user, name)
    except GpuclaimError:
        pass
    queued = [j for j in load_jobs(st.store) if j.state == JobState.QUEUED]
    for owners in ([j for j in queued if j.user == st.user], queued):
        tasks = [j for j in owners if j.array is not None and j.array.name == name]
        if tasks:
            return min(tasks, key=lambda j: j.array.index if j.array else 0)
        named = [j for j in owners if j.name == name]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            users = ", ".join(sorted({j.user for j in named}))
            raise GpuclaimError(f"{name!r} names queued jobs of {users}: give its id")
    raise GpuclaimError(f"no queued job {name!r}", hint="see 'gpuclaim jobs'")


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
