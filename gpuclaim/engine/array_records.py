"""An array's life as its tasks live it: the first task's start and the last task's end are
each told once (one Slack message each, never one per task), and the end leaves a summary
in the array's record (counts by state, the indices that did not succeed, GPU-hours), which
is also what a job waiting ``--after`` the array reads.

Below job records: a rank's end, a kill from the queue and a cancel all end tasks here."""

from __future__ import annotations

from typing import Any, Optional

from gpuclaim.core.arrays import ARRAY_ID_PREFIX
from gpuclaim.core.model import Event, EventType, Job, iso
from gpuclaim.core.records import ArrayRecord
from gpuclaim.core.states import JobState
from gpuclaim.store import Store

# The summary's flag that every task succeeded (what ``--after`` an array waits for).
ALL_SUCCEEDED = JobState.SUCCEEDED.value


def task_id(array_id: str, index: int) -> str:
    return f"{array_id}-{index}"


MAX_RESTARTS_FOLLOWED = 1000


def latest_run(store: Store, job: Job) -> Job:
    """The job's latest run: a preempted ``--requeue`` job's record names its next run's
    (an array's task is its index's latest run)."""
    for _ in range(MAX_RESTARTS_FOLLOWED):
        if not job.requeued_as:
            return job
        nxt = store.load_job(job_id=job.requeued_as)
        if nxt is None:  # archived a day after it ended
            nxt = next((j for j in store.archived_jobs() if j.id == job.requeued_as), None)
        if nxt is None:
            return job
        job = nxt
    return job


def array_of_task(job_id: str) -> Optional[str]:
    """The array a job id belongs to ('a-1f2e-7' -> 'a-1f2e'), None for a plain job."""
    if not job_id.startswith(ARRAY_ID_PREFIX) or job_id.count("-") < 2:
        return None
    return job_id.rsplit("-", 1)[0]


def task_index(job_id: str) -> Optional[int]:
    """The index of an array's task from its id ('a-1f2e-7' and its rerun 'a-1f2e-7r1' -> 7);
    None for a plain job."""
    if array_of_task(job_id) is None:
        return None
    index = job_id.rsplit("-", 1)[1].split("r", 1)[0]
    return int(index) if index.isdigit() else None


def note_task_start(store: Store, job: Job) -> None:
    """A task started: the array's first start is its one 'started' message."""
    array = job.array
    if array is None or not store.mark_once(key=f"array-start-{array.id}"):
        return
    record = store.load_array(array_id=array.id)
    store.append_event(
        Event(
            ts=store.now(),
            type=EventType.ARRAY_START,
            user=job.user,
            node=job.ranks[0].node if job.ranks else None,
            gpus=job.ranks[0].gpus if job.ranks else (),
            extra={
                "array_id": array.id,
                "job": array.name,
                "count": array.count,
                "spec": record.get("spec", "") if record is not None else "",
                "max_running": array.max_running,
            },
        )
    )


def note_task_end(store: Store, job: Job) -> Optional[dict[str, Any]]:
    """A task reached its final state: count it; the last one writes the array's summary
    and its one 'ended' message. Returns the summary when this call wrote it."""
    array = job.array
    if array is None:
        return None
    if store.task_ended(array_id=array.id, index=array.index) < array.count:
        return None
    if not store.mark_once(key=f"array-end-{array.id}"):
        return None
    summary = summarize(store, array.id)
    store.update_array(array_id=array.id, changes={"result": summary})
    store.append_event(
        Event(
            ts=store.now(),
            type=EventType.ARRAY_END,
            user=job.user,
            extra={"array_id": array.id, "job": array.name, **summary},
        )
    )
    return summary


def summarize(store: Store, array_id: str) -> dict[str, Any]:
    """Counts by state, the indices that did not succeed (by state), GPU-hours, the span."""
    record = store.load_array(array_id=array_id)
    indices = (record.get("indices") if record is not None else None) or []
    counts: dict[str, int] = {}
    unsuccessful: dict[str, list[int]] = {}
    gpu_s = 0.0
    first: Optional[float] = None
    last: Optional[float] = None
    for index in indices:
        task = store.load_job(job_id=task_id(array_id, int(index)))
        if task is None:
            continue
        task = latest_run(store, task)
        counts[task.state] = counts.get(task.state, 0) + 1
        if task.state != JobState.SUCCEEDED:
            unsuccessful.setdefault(task.state, []).append(int(index))
        if task.started is not None:
            end = task.ended if task.ended is not None else store.now()
            gpus = sum(len(r.gpus) for r in task.ranks) or task.gpus_per_node
            gpu_s += gpus * max(0.0, end - task.started)
            first = task.started if first is None else min(first, task.started)
            last = end if last is None else max(last, end)
    return {
        "count": len(indices),
        "states": counts,
        "unsuccessful": unsuccessful,
        "gpu_hours": round(gpu_s / 3600, 4),
        "first_start": iso(first),
        "last_end": iso(last),
        ALL_SUCCEEDED: counts.get(JobState.SUCCEEDED, 0) == len(indices),
    }


def array_tasks(store: Store, record: ArrayRecord) -> list[Job]:
    """Every task of an array record, in index order, live or archived (a missing record is
    skipped; the archive is read only when a task is not live)."""
    array_id = str(record["id"])
    wanted = [task_id(array_id, int(index)) for index in record.get("indices") or ()]
    found = {i: store.load_job(job_id=i) for i in wanted}
    if any(j is None for j in found.values()):
        archived = {j.id: j for j in store.archived_jobs()}
        found = {i: j if j is not None else archived.get(i) for i, j in found.items()}
    return [latest_run(store, j) for j in found.values() if j is not None]
