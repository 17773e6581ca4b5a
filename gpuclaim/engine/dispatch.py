"""The queue, dispatched without a daemon: whoever runs gpuclaim next (a CLI call, a job's
wrapper when it ends, a node's queue keeper) starts the queued jobs that now fit.

Standard library only: wrappers and keepers dispatch from the nodes."""

from __future__ import annotations

from typing import Optional

from gpuclaim.core.config import Config
from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    NeverFitsError,
    UnreachableError,
    UsageError,
)
from gpuclaim.core.events import job_event
from gpuclaim.core.model import Job, iso
from gpuclaim.engine.array_records import array_of_task, note_task_end
from gpuclaim.engine.claims import release_claims
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view
from gpuclaim.engine.depends import BROKEN, READY, WAITING, judge
from gpuclaim.engine.launch import NodeOps, place_and_claim, start_ranks
from gpuclaim.engine.reservations import my_open_bookings
from gpuclaim.store import Snapshot, Store


def dispatch_queue(
    config: Config,
    store: Store,
    prober: NodeProber,
    ops: Optional[NodeOps] = None,
    only_node: Optional[str] = None,
) -> list[Job]:
    """Start queued jobs that fit now, first come first served. A later job may start before
    a waiting one only on nodes where the waiting one can never run, so it never delays it.
    With ``only_node`` (a job wrapper on that node), only that node is used, locally."""
    if only_node is not None:
        config = config.seen_from(only_node)
    ops = ops or NodeOps(config, prober)
    entries = store.queue_entries()
    if not entries:
        return []
    view = build_view(config, store, prober=prober)
    started: list[Job] = []
    blocked_heads: list[Job] = []
    blocked = False  # nothing more can start: only cancellations are left to find
    # per array, for this pass: its tasks share their dependencies and their %K
    verdicts: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for entry in entries:
        job_id = entry.split("-", 1)[1]
        group = array_of_task(job_id)
        verdict = verdicts.get(group) if group else None
        if verdict in (WAITING, THROTTLED) or (blocked and verdict == READY):
            continue  # without reading its record: a pass over 1,000 tasks stays cheap
        data = store.load_job_dict(job_id=job_id)
        job = Job.from_dict(data) if data else None
        if job is None or job.state != "queued":
            store.finish_queue_entry(name=entry)
            continue
        if verdict is None:
            verdict, why = judge(store, job) if job.after else (READY, "")
            if group:
                verdicts[group], reasons[group] = verdict, why
        else:
            why = reasons.get(group or "", "")
        if verdict == WAITING:
            continue
        if verdict == BROKEN:
            cancel_queued(store, job, entry, f"never ran: {why}")
            continue
        if job.reservation and job.reservation not in {b.id for b in view.snapshot.bookings}:
            cancel_queued(store, job, entry, f"never ran: its reservation {job.reservation} ended")
            continue
        if blocked:
            continue
        allowed = _backfill_nodes(config, view, blocked_heads)
        if allowed is not None:
            # Its owner's open booking is theirs alone: using it delays no earlier job.
            allowed = sorted(set(allowed) | set(_booked_room(view, job)))
        if allowed is not None and not allowed:
            blocked = True
            continue
        limit = job.array.max_running if job.array else None
        if group and limit and running_tasks(view.snapshot, group) >= limit:
            verdicts[group] = THROTTLED
            continue
        if not store.take_queue_entry(name=entry):
            continue  # another dispatcher has it
        try:
            ranks = place_and_claim(config, store, job, prober, view, allowed)
        except (ConflictError, NeverFitsError, UnreachableError, UsageError):
            store.return_queue_entry(name=entry)
            blocked_heads.append(job)
            continue
        except GpuclaimError:
            store.return_queue_entry(name=entry)
            raise
        if group and limit and running_tasks(store.snapshot(), group) > limit:
            # Another dispatcher started one at the same moment: each claims, then counts,
            # so the later of two always sees both, and %K is never passed.
            for r in ranks:
                release_claims(config, store, job.user, claim_ids=[r.claim_id or ""], jobs_too=True)
            store.return_queue_entry(name=entry)
            verdicts[group] = THROTTLED
            continue
        moved = store.update_job(
            job_id=job.id,
            changes={
                "state": "starting",
                "ranks": [r.to_dict() for r in ranks],
                "from_queue": True,
            },
            only_from=["queued"],
        )
        store.finish_queue_entry(name=entry)
        if not moved["applied"]:  # killed while we placed it
            for r in ranks:
                release_claims(config, store, job.user, claim_ids=[r.claim_id or ""], jobs_too=True)
            continue
        job = Job.from_dict(moved["job"])
        try:
            started.append(start_ranks(config, store, job, ops))
        except GpuclaimError:
            continue  # start_ranks recorded the failure and gave the GPUs back
        view = build_view(config, store, prober=prober, inventories=view.inventories)
    return started


def _backfill_nodes(config: Config, view: ClusterView, heads: list[Job]) -> Optional[list[str]]:
    """None: anything goes. Else the nodes where no waiting earlier job could ever run."""
    if not heads:
        return None
    allowed = []
    for n in config.nodes:
        size = len(view.gpus_of(n.name))
        usable_by_a_head = any(
            (h.node is None or h.node == n.name) and size >= h.gpus_per_node for h in heads
        )
        gang_head = any(h.nodes_wanted > 1 for h in heads)
        if not usable_by_a_head and not gang_head:
            allowed.append(n.name)
    return allowed


def _booked_room(view: ClusterView, job: Job) -> list[str]:
    """Nodes where the job's owner has an open booking big enough for the job."""
    if job.nodes_wanted > 1:
        return []
    now = view.snapshot.now
    return [
        b.node
        for b in my_open_bookings(view.snapshot.bookings, job.user, now)
        if len(b.gpus) >= job.gpus_per_node and job.node in (None, b.node)
    ]


THROTTLED = "throttled"  # an array at its %K


def running_tasks(snapshot: Snapshot, array_id: str) -> int:
    """Tasks of the array holding GPUs now (from their claims: starting, running)."""
    prefix = f"{array_id}-"
    return len(
        {s.claim.job for s in snapshot.claims.values() if (s.claim.job or "").startswith(prefix)}
    )


def cancel_queued(store: Store, job: Job, entry: str, reason: str) -> Optional[Job]:
    """A queued job that will never run (what it waited for did not succeed): cancelled,
    out of the queue, told once (an array's tasks only in the array's summary)."""
    now = store.now()
    result = store.update_job(
        job_id=job.id,
        changes={"state": "cancelled", "ended": iso(now), "reason": reason},
        only_from=["queued"],
    )
    store.finish_queue_entry(name=entry)
    if not result["applied"]:
        return None
    final = Job.from_dict(result["job"])
    store.append_event(job_event("job-cancelled", final, now))
    note_task_end(store, final)
    return final
