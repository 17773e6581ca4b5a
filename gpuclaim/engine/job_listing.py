"""What ``jobs`` shows by default, read without reading a busy day's every record: an ended
array comes from its summary, a queued array's tasks from their queue entries, and only the
first queued jobs of other people are read (the rest are counted)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from gpuclaim.core.errors import StoreError
from gpuclaim.core.model import Job, parse_iso
from gpuclaim.core.priority import QueueEntry
from gpuclaim.core.records import ArrayRecord
from gpuclaim.engine.array_records import array_of_task
from gpuclaim.engine.job_records import archive_daily, archive_finished
from gpuclaim.store import Store

# Other people's queued jobs shown by name, in the order they will start; the rest counted.
QUEUED_SHOWN = 30


@dataclass
class Listing:
    """The records ``jobs`` shows, and what it shows without their records."""

    jobs: list[Job]  # running, starting, the viewer's own of the day, the queued shown
    ended_arrays: list[ArrayRecord]  # the viewer's arrays that ended within the day
    # an array that has not ended: its queued tasks (job ids), by array id, unread
    queued_tasks: dict[str, list[str]] = field(default_factory=dict)
    hidden_queued: dict[str, int] = field(default_factory=dict)  # by user: not shown


def live_listing(store: Store, user: str, since: float, queue: list[QueueEntry]) -> Listing:
    """``queue``: the queue's entries in the order they will start."""
    arrays = {str(a["id"]): a for a in store.list_arrays()}
    ended = [i for i, a in arrays.items() if a.get("result") is not None]
    queued_tasks: dict[str, list[str]] = {}
    plain: list[QueueEntry] = []
    for entry in queue:
        group = array_of_task(entry.job_id)
        if group is not None and group in arrays:
            queued_tasks.setdefault(group, []).append(entry.job_id)
        else:
            plain.append(entry)
    shown, hidden = _first_queued(plain, user)
    unread = [e.job_id for e in queue]
    jobs = store.list_jobs(skip_arrays=ended, skip_ids=unread, active_or_of=user)
    archive_finished(store, jobs)  # a look moves what is a day old, as load_jobs does
    archive_daily(store)  # and once a day, what no look read
    jobs += _read(store, shown)
    return Listing(
        jobs=sorted(jobs, key=lambda j: (j.submitted, j.array.index if j.array else 0)),
        ended_arrays=[arrays[i] for i in ended if _ended_since(arrays[i], user, since)],
        queued_tasks=queued_tasks,
        hidden_queued=hidden,
    )


def _first_queued(plain: list[QueueEntry], user: str) -> tuple[list[str], dict[str, int]]:
    """The viewer's queued jobs, and the first QUEUED_SHOWN of everyone else's (by the user
    their entries name: no record read); how many of each other user's are not shown."""
    shown: list[str] = []
    hidden: dict[str, int] = {}
    others = 0
    for entry in plain:
        if entry.user == user or others < QUEUED_SHOWN or not entry.user:
            shown.append(entry.job_id)
            others += entry.user != user
        else:
            hidden[entry.user] = hidden.get(entry.user, 0) + 1
    return shown, hidden


def _read(store: Store, ids: list[str]) -> list[Job]:
    found = []
    for job_id in ids:
        try:
            job = store.load_job(job_id=job_id)
        except StoreError:
            continue  # a damaged record is skipped, as a listing skips it
        if job is not None:
            found.append(job)
    return found


def _ended_since(record: ArrayRecord, user: str, since: float) -> bool:
    result: dict[str, Any] = record.get("result") or {}
    end: Optional[float] = parse_iso(result.get("last_end")) or record.get("submitted")
    return record["user"] == user and end is not None and end >= since
