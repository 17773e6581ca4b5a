"""Jobs as the store holds them: load and find them, record a rank's end (which releases its
claim; the last rank decides the job's state), queue positions, what a reader should see.

Below claims and the job lifecycle: both finish ranks, neither is needed to do it."""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

from gpuclaim.core.errors import GpuclaimError, IllegalTransition, StoreError
from gpuclaim.core.events import claim_event, job_event
from gpuclaim.core.model import EventType, Job, JobRank, iso
from gpuclaim.core.states import (
    ACTIVE_JOB_STATES,
    FINAL_STATES,
    SERVICE_DOWN,
    JobState,
    ServiceHealth,
    started,
)
from gpuclaim.engine.array_records import note_task_end
from gpuclaim.store import Store

ARCHIVE_AFTER_S = 86400.0  # a finished job leaves jobs/ a day after its end: by then
# `jobs` no longer shows it unless --all, which reads the archive too
ARCHIVE_BATCH = 200  # readers move old records only this many at a time (gc: any number)


RAY_HEAD_ENDED = "its Ray head ended"  # run --ray: why a job's other ranks were stopped


def new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:10]


def load_jobs(store: Store, archived: bool = False) -> list[Job]:
    """The job records, oldest first: the live ones (every job not ended a day ago), and
    with ``archived`` the archive's too. Moves a batch of old records to the archive when
    it has read that many (a look then stays as fast however long the history grows)."""
    live = store.list_jobs()  # live first: a record moved meanwhile is archived
    old = store.archived_jobs() if archived else []
    archive_finished(store, live, ARCHIVE_BATCH)
    by_id = {j.id: j for j in old}
    by_id.update((j.id, j) for j in live)  # a crash mid-move leaves both: the live one wins
    # an array's tasks share their submit time: then by index
    return sorted(by_id.values(), key=lambda j: (j.submitted, j.array.index if j.array else 0))


def load_archived(store: Store) -> list[Job]:
    """Only the archive's jobs, oldest first: for a name the live records did not have."""
    return sorted(store.archived_jobs(), key=lambda j: j.submitted)


def archive_daily(store: Store) -> int:
    """Once a day (UTC), the first look of anyone reads every live record and archives what
    ended a day ago: the looks that read only what they show (``jobs``, ``run``'s name check)
    leave most records unread, and the live directory must not grow with the history."""
    day = time.strftime("%Y-%m-%d", time.gmtime())
    try:
        if not store.mark_once(key=f"archive-{day}"):
            return 0
    except GpuclaimError:
        return 0  # a store that refuses writes: nothing is moved, the look goes on
    return archive_finished(store, store.list_jobs())


def archive_finished(store: Store, jobs: list[Job], minimum: int = 1) -> int:
    """Move the records of ``jobs`` that ended over ARCHIVE_AFTER_S ago to the archive, if
    there are at least ``minimum``; a task only once its array's summary is written (the
    summary reads the live records). How many moved; a store that refuses writes: 0."""
    cutoff = time.time() - ARCHIVE_AFTER_S  # a day's age: our clock is close enough
    old = [j for j in jobs if j.state in FINAL_STATES and j.ended is not None and j.ended < cutoff]
    if len(old) < minimum:
        return 0
    if any(j.array is not None for j in old):
        done = {str(a.get("id")) for a in store.list_arrays() if a.get("result") is not None}
        old = [j for j in old if j.array is None or j.array.id in done]
        if len(old) < minimum:
            return 0
    try:
        return store.archive_jobs(job_ids=[j.id for j in old])
    except GpuclaimError:
        return 0  # read-only or full storage: looking still works, the move waits


def find_job(store: Store, user: str, name: str, active_only: bool = True) -> Job:
    """A user's job by name (the newest one) or by id: only records of that name are parsed
    (a busy day's thousands of others are skipped by their bytes)."""
    live = [j for j in store.list_jobs(named=name) if j.user == user]
    try:
        by_id = store.load_job(job_id=name)
    except StoreError:
        by_id = None
    if by_id is not None and all(j.id != by_id.id for j in live):
        live.append(by_id)
    matches = sorted(live, key=lambda j: (j.submitted, j.array.index if j.array else 0))
    if not matches:  # only an old job has that name: look in the archive
        matches = _matching(load_archived(store), user, name)
    if active_only:
        live = [j for j in matches if j.state in ACTIVE_JOB_STATES]
        matches = live or matches
    if not matches:
        raise GpuclaimError(f"no job {name!r} of {user}", hint="see 'gpuclaim jobs'")
    return matches[-1]


def _matching(jobs: list[Job], user: str, name: str) -> list[Job]:
    return [j for j in jobs if (j.name == name and j.user == user) or j.id == name]


def load_job_anywhere(store: Store, job_id: str) -> Optional[Job]:
    """A job, live or archived (the archive is read only when it is not live)."""
    job = store.load_job(job_id=job_id)
    if job is None:
        job = next((j for j in store.archived_jobs() if j.id == job_id), None)
    return job


def finish_rank(
    store: Store,
    job: Job,
    rank: int,
    state: str,
    exit_code: Optional[int],
    reason: str,
    log_tail: str = "",
) -> Optional[Job]:
    """Record one rank's end, release its claim; the last rank to end decides the job's state.
    A failed rank asks the others to stop. Returns the job once final, else None."""
    now = store.now()
    me = job.ranks[rank]
    try:
        current: Optional[Job] = store.update_job(
            job_id=job.id,
            changes={},
            rank=rank,
            rank_changes={"state": state, "exit_code": exit_code, "ended": iso(now)},
        ).job
    except IllegalTransition:
        # The rank's end was recorded first (gc judged it lost): the first end stands; its
        # claim is still given back below.
        current = store.load_job(job_id=job.id)
    if current is None:
        return None
    if me.claim_id:
        _release_rank_claim(store, current, me)
    if (
        state in (JobState.FAILED, JobState.TIMEOUT)
        and len(current.ranks) > 1
        and not current.stop_requested
    ):
        store.update_job(job_id=job.id, changes={"stop_requested": f"rank {rank} {state}"})
    elif current.ray and rank == 0 and len(current.ranks) > 1 and not current.stop_requested:
        # run --ray: the command ran on rank 0; the Ray nodes of the others stop with it
        store.update_job(job_id=job.id, changes={"stop_requested": RAY_HEAD_ENDED})
    if any(r.state not in FINAL_STATES for r in current.ranks):
        return None
    final_state, final_code = _job_outcome(current)
    done = store.update_job(
        job_id=job.id,
        changes={
            "state": final_state,
            "exit_code": final_code,
            "ended": iso(now),
            "reason": reason if final_state != JobState.SUCCEEDED else "",
        },
        only_from=list(ACTIVE_JOB_STATES),
    )
    if not done.applied:
        return None
    final = done.job
    extra: dict[str, Any] = (
        {"log_tail": log_tail} if log_tail and final_state != JobState.SUCCEEDED else {}
    )
    again = requeue(store, final, now) if final_state == JobState.PREEMPTED else None
    if again is not None:
        extra["requeued_as"] = again.id
    store.append_event(job_event(EventType.JOB_END, final, now, extra))
    if again is None:  # a requeued task is not over: its array waits for its next run
        note_task_end(store, final)
    return final


def requeue(store: Store, job: Job, now: float) -> Optional[Job]:
    """A preempted ``--requeue`` job goes back to the queue: the same command and name, a
    new record (the preempted run keeps its own), one restart more. None without --requeue."""
    if not job.requeue:
        return None
    # An array's task keeps its array's id in its own ('a-1f2e-7r1'): %K, the array's summary
    # and kill find the rerun as the task.
    base = job.id.split("r", 1)[0] if job.array is not None else ""
    again = job.with_(
        id=f"{base}r{job.restarts + 1}" if base else new_job_id(),
        state=JobState.QUEUED,
        submitted=now,
        ranks=(),
        started=None,
        ended=None,
        exit_code=None,
        reason="",
        stop_requested=None,
        preempted_by=None,
        preempt_deadline=None,
        port=None,
        restarts=job.restarts + 1,
        # the rerun runs what its owner submitted: the first run's spec, whoever requeues it
        spec=(job.spec or job.id) if job.uid is not None else None,
    )
    again = store.create_job(job=again)
    store.update_job(job_id=job.id, changes={"requeued_as": again.id})
    store.enqueue(job_id=again.id, user=again.user, nice=again.nice, begin=0.0)
    store.append_event(job_event(EventType.JOB_QUEUED, again, now, {"requeued_from": job.id}))
    return again


def _job_outcome(job: Job) -> tuple[JobState, Optional[int]]:
    """The job's end from its ranks': a timeout or a kill wins, then a failed or lost rank."""
    by_state = {r.state: r.exit_code for r in reversed(job.ranks)}
    if JobState.TIMEOUT in by_state:
        return JobState.TIMEOUT, by_state[JobState.TIMEOUT]
    if job.stop_requested == "kill":
        return JobState.KILLED, by_state.get(JobState.KILLED)
    if job.stop_requested == "preempt":  # engine.preempt's request: every rank yielded
        return JobState.PREEMPTED, by_state.get(JobState.PREEMPTED)
    if job.stop_requested == RAY_HEAD_ENDED:  # the others were stopped for it: rank 0's end
        head = job.ranks[0]
        return JobState(head.state), head.exit_code
    for state in (JobState.FAILED, JobState.LOST, JobState.KILLED):
        if state in by_state:
            return state, by_state[state]
    return JobState.SUCCEEDED, 0


def _release_rank_claim(store: Store, job: Job, rank: JobRank) -> None:
    snap = store.snapshot()
    status = snap.claims.get(rank.claim_id or "")
    if status is not None:
        removed = False
        for gpu_uuid in status.present:
            removed |= store.remove_gpu(gpu_uuid, status.claim.id)
        if removed:
            end = min(snap.now, status.claim.expires)
            store.append_event(claim_event(EventType.RELEASE, status.claim, end))
    if rank.claim_id:
        store.drop_beat(claim_id=rank.claim_id)


def observed_state(job: Job, claims: dict[str, Any]) -> str:
    """A running job whose claims were judged lost (no heartbeat) shows as ``lost``."""
    if started(job.state):
        for r in job.ranks:
            status = claims.get(r.claim_id or "")
            if status is not None and status.reason == "job lost":
                return JobState.LOST
    return job.state


def observed_health(job: Job, claims: dict[str, Any]) -> Optional[str]:
    """A service's health as its record says, or ``down`` while its claim is held with no
    wrapper beating for it (its node rebooted or is away: the next look starts it again)."""
    if job.service is None or not started(job.state):
        return job.health
    for r in job.ranks:
        status = claims.get(r.claim_id or "")
        if status is not None and status.reason == SERVICE_DOWN:
            return ServiceHealth.DOWN.value
    return job.health


def reload_job(store: Store, job: Job) -> Job:
    return store.load_job(job_id=job.id) or job
