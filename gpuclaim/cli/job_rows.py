"""The rows of ``jobs``: a job's record as a row, and the default table's rows read without a
busy day's every record (``engine/job_listing.py``)."""

from __future__ import annotations

from typing import Any, Optional

from gpuclaim.core.arrays import compact, task_name
from gpuclaim.core.model import Job
from gpuclaim.core.states import ACTIVE_JOB_STATES, JobState
from gpuclaim.engine.array_records import task_index
from gpuclaim.engine.dispatch import Verdict
from gpuclaim.engine.job_listing import Listing
from gpuclaim.store import Snapshot, Store


def job_row(job: Job, snap: Snapshot, verdicts: dict[str, Verdict]) -> dict[str, Any]:
    """A job as ``jobs`` shows it: its record, its state as the claims say, its queue place."""
    from gpuclaim.engine.job_records import observed_health, observed_state

    d = job.to_dict()
    d["state"] = observed_state(job, snap.claims)
    d["health"] = observed_health(job, snap.claims)
    verdict = verdicts.get(job.id) if job.state == JobState.QUEUED else None
    d["queue_position"] = verdict.position if verdict else None
    d["priority"] = round(verdict.priority.value, 1) if verdict else None
    if verdict is not None:
        d["reason"] = verdict.reason.line if verdict.reason else ""
    return d


def visible(job: Job, user: str, since: float) -> bool:
    """Shown by default: what is queued or runs, and the viewer's own of the last day."""
    return job.state in ACTIVE_JOB_STATES or (
        job.user == user and (job.ended or job.submitted) >= since
    )


def listing_rows(
    store: Store, listing: Listing, snap: Snapshot, verdicts: dict[str, Verdict], user: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of the records read, the queued tasks of arrays as rows made from their
    entries (each like a task of its array that was read), in the order ``jobs`` lists them;
    and the summary rows of the viewer's arrays that ended today."""
    since = snap.now - 86400
    rows = [job_row(j, snap, verdicts) for j in listing.jobs if visible(j, user, since)]
    for array_id, ids in listing.queued_tasks.items():
        like = _a_task_of(store, rows, array_id, ids)
        if like is None:
            continue
        # what every task of the array shares; nothing of one run (its restarts, its rerun)
        shared = {k: like.get(k) for k in _ARRAY_WIDE}
        for job_id in ids:
            index = task_index(job_id)
            if index is None:
                continue
            verdict = verdicts.get(job_id)
            rows.append(
                {
                    **shared,
                    "id": job_id,
                    "name": task_name(like["array"]["name"], index),
                    "array": {**like["array"], "index": index},
                    "state": JobState.QUEUED.value,
                    "nodes": [],
                    "gpus": [],
                    "started": None,
                    "ended": None,
                    "exit_code": None,
                    "queue_position": verdict.position if verdict else None,
                    "reason": verdict.reason.line if verdict and verdict.reason else "",
                }
            )
    rows.sort(key=lambda d: (d["queue_position"] is not None, d["queue_position"] or 0))
    return rows, [ended_array_row(a, _first_task(store, a)) for a in listing.ended_arrays]


# The fields of a task's row that every task of its array has alike (job.to_dict's keys).
_ARRAY_WIDE = (
    "user",
    "argv",
    "gpus_per_node",
    "nodes_wanted",
    "pinned_node",
    "time_limit_s",
    "submitted",
    "array",
    "preemptible",
    "nice",
    "kind",
)


def _a_task_of(
    store: Store, rows: list[dict[str, Any]], array_id: str, queued: list[str]
) -> Optional[dict[str, Any]]:
    """A task of the array as a row: one already read, else its first queued task's record
    (one read for the array, however many tasks wait)."""
    for d in rows:
        if (d.get("array") or {}).get("id") == array_id:
            return d
    from gpuclaim.core.errors import StoreError

    try:
        job = store.load_job(job_id=queued[0])
    except StoreError:
        return None
    return None if job is None else job.to_dict()


def _first_task(store: Store, record: Any) -> Optional[Job]:
    """Its first task's record, for what every task asks (GPUs per node): one read."""
    from gpuclaim.core.errors import StoreError
    from gpuclaim.engine.array_records import task_id

    indices = record.get("indices") or ()
    try:
        return (
            store.load_job(job_id=task_id(str(record["id"]), int(indices[0]))) if indices else None
        )
    except StoreError:
        return None


# The state an array's row shows: the first its tasks are in, the worst end first; else done.
def array_row_state(counts: dict[str, int]) -> str:
    from gpuclaim.core.states import UNSUCCESSFUL_STATES

    order = (JobState.RUNNING.value, JobState.STARTING.value, JobState.QUEUED.value)
    return next(
        (s for s in (*order, *UNSUCCESSFUL_STATES) if counts.get(s)), JobState.SUCCEEDED.value
    )


def state_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda c: -c[1]))


def ended_array_row(record: Any, first: Optional[Job] = None) -> dict[str, Any]:
    """An array that ended, as one row from its summary (its tasks' records are not read;
    ``first``, its first task's, says what each task asked for)."""
    result = record.get("result") or {}
    counts = {str(s): int(n) for s, n in (result.get("states") or {}).items()}
    indices = tuple(int(i) for i in record.get("indices") or ())
    return {
        "id": record["id"],
        "name": f"{record['name']}[{compact(indices)}]",
        "user": record["user"],
        "state": array_row_state(counts),
        "state_text": state_text(counts),
        "nodes": [],
        "gpus": [],
        "gpus_per_node": first.gpus_per_node if first is not None else "",
        "exit_code": None,
        "started": result.get("first_start"),
        "ended": result.get("last_end"),
        "ends": None,
        "queue_position": None,
        "reason": "",
        "argv": list(record.get("argv") or []),
    }


def hidden_line(hidden: dict[str, int]) -> str:
    """``… and 950 more queued: bob 600, carol 350 (gpuclaim jobs --json lists every one)``"""
    total = sum(hidden.values())
    who = ", ".join(f"{u} {n}" for u, n in sorted(hidden.items(), key=lambda c: -c[1]))
    return f"… and {total} more queued: {who} (gpuclaim jobs --json lists every one)"
