"""Queued records the queue lost: their writer died between the record and its entry."""

from __future__ import annotations

from collections.abc import Iterable

from gpuclaim.core.model import Job
from gpuclaim.core.states import JobState
from gpuclaim.store import Store

# A record is written and its entry a moment later (one storage round trip, over ssh:// a
# few): a queued record older than this with no entry has lost it for good.
ORPHAN_AFTER_S = 10.0


def requeue_orphans(store: Store, jobs: Iterable[Job], in_queue: set[str]) -> list[str]:
    """Put every queued job that no entry names (waiting or taken) back in line, at its place:
    its entry is named by its own submission time. ``in_queue``: the jobs the queue named
    *before* ``jobs`` were read (one dispatched meanwhile had its entry then). Each one is
    looked at again just before: the queue listed anew, its record read anew. Returns their
    names. (A submitter caught between its record and its entry at that very moment gets a
    second entry: the pass that takes it finds the job started and drops it.)"""
    now = store.now()
    lost = [
        j
        for j in jobs
        if j.state == JobState.QUEUED
        and j.id not in in_queue
        and now - j.submitted >= ORPHAN_AFTER_S
    ]
    if not lost:
        return []
    in_queue = set(store.queued_job_ids())
    mended = []
    for job in lost:
        if job.id in in_queue:
            continue
        current = store.load_job(job_id=job.id)
        if current is None or current.state != JobState.QUEUED:
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
