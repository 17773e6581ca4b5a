"""Queued records the queue lost: their writer died between the record and its entry."""

from __future__ import annotations

from collections.abc import Iterable

from gpuclaim.core.model import Job
from gpuclaim.core.states import JobState
from gpuclaim.store import Store

# A record is written and its entry a moment later (one storage round trip, over ssh:// a
# few): a queued record older than this with no entry has lost it for good.
ORPHAN_AFTER_S = 10.0


def requeue_orphans(store: Store, jobs: Iterable[Job]) -> list[str]:
    """Put every queued job that no entry names (waiting or taken) back in line, at its place:
    its entry is named by its own submission time. Returns their names."""
    queued = [j for j in jobs if j.state == JobState.QUEUED]
    if not queued:
        return []
    now = store.now()
    in_queue = set(store.queued_job_ids())
    mended = []
    for job in queued:
        if job.id in in_queue or now - job.submitted < ORPHAN_AFTER_S:
            continue
        store.enqueue(
            job_id=job.id,
            user=job.user,
            nice=job.nice,
            begin=job.begin or 0.0,
            submitted=job.submitted,
        )
        mended.append(job.name)
    return mended
