"""``run --after NAME`` / ``--after-any NAME``: what a queued job waits for, resolved once at
submit (to a job's or an array's id, so a later job of the same name changes nothing: a
dependency can only point back in time, so no cycle can form), and judged at each dispatch.

Standard library only: wrappers dispatch from the nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from gpuclaim.core.errors import UsageError
from gpuclaim.core.model import Dependency, Job
from gpuclaim.core.records import ArrayRecord
from gpuclaim.core.states import JobState, ended, ended_badly
from gpuclaim.engine.array_records import ALL_SUCCEEDED, latest_run
from gpuclaim.engine.job_records import load_archived, load_job_anywhere, load_jobs
from gpuclaim.store import Store

WAITING, READY, BROKEN = "waiting", "ready", "broken"


def resolve_after(
    store: Store,
    user: str,
    after: Sequence[str],
    after_any: Sequence[str],
    own_name: Optional[str],
) -> tuple[Dependency, ...]:
    """Each NAME as the newest job or array of ``user`` with that name (or any one's id).
    Unknown, itself, or already ended so that it never could start: one UsageError."""
    wanted = [(n, False) for n in after] + [(n, True) for n in after_any]
    if not wanted:
        return ()
    jobs = load_jobs(store)
    arrays = store.list_arrays()
    found: list[Dependency] = []
    for name, any_end in wanted:
        flag = "--after-any" if any_end else "--after"
        if own_name is not None and name == own_name:
            raise UsageError(f"{flag} {name}: a job cannot wait for itself (a cycle)")
        dep, state = _lookup(jobs, arrays, user, name, any_end)
        if dep is None:  # a job that ended over a day ago is in the archive
            dep, state = _lookup(load_archived(store), arrays, user, name, any_end)
        if dep is None:
            raise UsageError(
                f"{flag} {name}: you have no job or array named {name!r}",
                hint="see 'gpuclaim jobs --all'",
            )
        # an array's end is its summary ('3 failed, 1 killed'), not one state
        if state is not None and state != JobState.SUCCEEDED and not any_end:
            raise UsageError(
                f"--after {name}: it already ended ({state}), so this would never start",
                hint="--after-any starts after an end in any state",
            )
        if dep not in found:
            found.append(dep)
    return tuple(found)


def _lookup(
    jobs: list[Job], arrays: list[ArrayRecord], user: str, name: str, any_end: bool
) -> tuple[Optional[Dependency], Optional[str]]:
    """(the dependency, its final state if it already ended) for the newest match."""
    candidates: list[tuple[float, Dependency, Optional[str]]] = []
    for job in jobs:
        if job.id == name or (job.name == name and job.user == user):
            end = job.state if ended(job.state) else None
            candidates.append((job.submitted, Dependency(job.id, job.name, False, any_end), end))
    for record in arrays:
        if record.get("id") == name or (record.get("name") == name and record.get("user") == user):
            result = record.get("result")
            end = None
            if isinstance(result, dict):
                end = JobState.SUCCEEDED if result.get(ALL_SUCCEEDED) else _worst(result)
            dep = Dependency(str(record["id"]), str(record["name"]), True, any_end)
            candidates.append((float(record.get("submitted") or 0), dep, end))
    if not candidates:
        return None, None
    _, dep, end = max(candidates, key=lambda c: c[0])
    return dep, end


def judge(store: Store, job: Job) -> tuple[str, str]:
    """(WAITING | READY | BROKEN, why) for a queued job's dependencies, now. One broken
    dependency decides, whatever the order they were given in: the job can never run, so it
    is cancelled now, not once the others have ended."""
    waiting: Optional[str] = None
    for dep in job.after:
        verdict, why = _judge_one(store, dep)
        if verdict == BROKEN:
            return BROKEN, why
        if verdict == WAITING and waiting is None:
            waiting = why
    return (WAITING, waiting) if waiting is not None else (READY, "")


def _judge_one(store: Store, dep: Dependency) -> tuple[str, str]:
    if dep.array:
        record = store.load_array(array_id=dep.id)
        if record is None:
            return BROKEN, f"array {dep.name} it waited for is gone"
        result = record.get("result")
        if not isinstance(result, dict):
            return WAITING, f"after array {dep.name} (not ended)"
        if not dep.any and not result.get(ALL_SUCCEEDED):
            return BROKEN, f"array {dep.name} did not succeed ({_worst(result)})"
        return READY, ""
    found = load_job_anywhere(store, dep.id)  # ended long ago: archived
    if found is None:
        return BROKEN, f"job {dep.name} it waited for is gone"
    found = latest_run(store, found)  # preempted and requeued: its rerun decides
    state = found.state
    if not ended(state):
        return WAITING, f"after {dep.name} ({state})"
    if not dep.any and ended_badly(state):
        return BROKEN, f"{dep.name} {state}"
    return READY, ""


def _worst(result: dict[str, Any]) -> str:
    """'3 failed, 1 killed' from an array's summary: what did not succeed."""
    states = result.get("states") or {}
    parts = [f"{n} {s}" for s, n in sorted(states.items()) if s != JobState.SUCCEEDED and n]
    return ", ".join(parts) or "no task ran"
