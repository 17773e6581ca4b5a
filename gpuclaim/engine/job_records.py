"""Jobs as the store holds them: load and find them, record a rank's end (which releases its
claim; the last rank decides the job's state), queue positions, what a reader should see.

Below claims and the job lifecycle: both finish ranks, neither is needed to do it."""

from __future__ import annotations

from typing import Any, Optional

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.events import claim_event, job_event
from gpuclaim.core.model import Job, JobRank, iso
from gpuclaim.core.states import ACTIVE_JOB_STATES, FINAL_STATES
from gpuclaim.engine.array_records import note_task_end
from gpuclaim.store import Store


def load_jobs(store: Store) -> list[Job]:
    jobs = []
    for d in store.list_job_dicts():
        try:
            jobs.append(Job.from_dict(d))
        except (KeyError, ValueError, TypeError):
            continue
    # an array's tasks share their submit time: then by index
    return sorted(jobs, key=lambda j: (j.submitted, j.array.index if j.array else 0))


def find_job(store: Store, user: str, name: str, active_only: bool = True) -> Job:
    """A user's job by name (the newest one) or by id."""
    matches = [j for j in load_jobs(store) if (j.name == name and j.user == user) or j.id == name]
    if active_only:
        live = [j for j in matches if j.state in ACTIVE_JOB_STATES]
        matches = live or matches
    if not matches:
        raise GpuclaimError(f"no job {name!r} of {user}", hint="see 'gpuclaim jobs'")
    return matches[-1]


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
    result = store.update_job(
        job_id=job.id,
        changes={},
        rank=rank,
        rank_changes={"state": state, "exit_code": exit_code, "ended": iso(now)},
    )
    current = Job.from_dict(result["job"])
    if me.claim_id:
        _release_rank_claim(store, current, me)
    if state in ("failed", "timeout") and len(current.ranks) > 1 and not current.stop_requested:
        store.update_job(job_id=job.id, changes={"stop_requested": f"rank {rank} {state}"})
    if any(r.state not in FINAL_STATES for r in current.ranks):
        return None
    final_state, final_code = _job_outcome(current)
    done = store.update_job(
        job_id=job.id,
        changes={
            "state": final_state,
            "exit_code": final_code,
            "ended": iso(now),
            "reason": reason if final_state != "succeeded" else "",
        },
        only_from=list(ACTIVE_JOB_STATES),
    )
    if not done["applied"]:
        return None
    final = Job.from_dict(done["job"])
    extra = {"log_tail": log_tail} if log_tail and final_state != "succeeded" else {}
    store.append_event(job_event("job-end", final, now, extra))
    note_task_end(store, final)
    return final


def _job_outcome(job: Job) -> tuple[str, Optional[int]]:
    """The job's end from its ranks': a timeout or a kill wins, then a failed or lost rank."""
    by_state = {r.state: r.exit_code for r in reversed(job.ranks)}
    if "timeout" in by_state:
        return "timeout", by_state["timeout"]
    if job.stop_requested == "kill":
        return "killed", by_state.get("killed")
    for state in ("failed", "lost", "killed"):
        if state in by_state:
            return state, by_state[state]
    return "succeeded", 0


def _release_rank_claim(store: Store, job: Job, rank: JobRank) -> None:
    snap = store.snapshot()
    status = snap.claims.get(rank.claim_id or "")
    if status is not None:
        removed = False
        for gpu_uuid in status.present:
            removed |= store.remove_gpu(gpu_uuid, status.claim.id)
        if removed:
            end = min(snap.now, status.claim.expires)
            store.append_event(claim_event("release", status.claim, end))
    if rank.claim_id:
        store.drop_beat(claim_id=rank.claim_id)


def queue_positions(store: Store) -> dict[str, int]:
    """{job id: 1-based position} for the jobs waiting in the queue."""
    ids = [e.split("-", 1)[1] for e in store.queue_entries()]
    return {job_id: i + 1 for i, job_id in enumerate(ids)}


def observed_state(job: Job, claims: dict[str, Any]) -> str:
    """A running job whose claims were judged lost (no heartbeat) shows as ``lost``."""
    if job.state in ("running", "starting"):
        for r in job.ranks:
            status = claims.get(r.claim_id or "")
            if status is not None and status.reason == "job lost":
                return "lost"
    return job.state


def reload_job(store: Store, job: Job) -> Job:
    data = store.load_job_dict(job_id=job.id)
    return Job.from_dict(data) if data else job
