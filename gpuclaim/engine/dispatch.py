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
from gpuclaim.core.model import EventType, Job, JobRank, iso
from gpuclaim.core.states import JobState
from gpuclaim.engine.array_records import array_of_task, note_task_end
from gpuclaim.engine.bookings import my_open_bookings
from gpuclaim.engine.claims import release_claims
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view
from gpuclaim.engine.depends import BROKEN, READY, WAITING, judge
from gpuclaim.engine.launch import NodeOps, place_and_claim, start_ranks
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
    entries = store.queue_entries()
    if not entries:
        return []
    one_pass = _Pass(config, store, prober, ops or NodeOps(config, prober))
    for entry in entries:
        one_pass.consider(entry)
    return one_pass.started


class _Pass:
    """One pass over the queue, in order: what it started, the earlier jobs that could not
    start (later ones must not delay them), and per array its verdict (its tasks share their
    dependencies and their %K)."""

    def __init__(self, config: Config, store: Store, prober: NodeProber, ops: NodeOps) -> None:
        self.config = config
        self.store = store
        self.prober = prober
        self.ops = ops
        self.view = build_view(config, store, prober=prober)
        self.started: list[Job] = []
        self.blocked_heads: list[Job] = []
        self.blocked = False  # nothing more can start: only cancellations are left to find
        self.verdicts: dict[str, str] = {}
        self.reasons: dict[str, str] = {}

    def consider(self, entry: str) -> None:
        job_id = entry.split("-", 1)[1]
        group = array_of_task(job_id)
        verdict = self.verdicts.get(group) if group else None
        if verdict in (WAITING, THROTTLED) or (self.blocked and verdict == READY):
            return  # without reading its record: a pass over 1,000 tasks stays cheap
        job = self.store.load_job(job_id=job_id)
        if job is None or job.state != JobState.QUEUED:
            self.store.finish_queue_entry(name=entry)
            return
        if not self._may_run(entry, job, group, verdict) or self.blocked:
            return
        allowed = _backfill_nodes(self.config, self.view, self.blocked_heads)
        if allowed is not None:
            # Its owner's open booking is theirs alone: using it delays no earlier job.
            allowed = sorted(set(allowed) | set(_booked_room(self.view, job)))
        if allowed is not None and not allowed:
            self.blocked = True
            return
        ranks = self._claim(entry, job, group, allowed)
        if ranks is not None:
            self._start(entry, job, ranks)

    def _may_run(self, entry: str, job: Job, group: Optional[str], verdict: Optional[str]) -> bool:
        """Whether its dependencies and booking let it run now; cancels it when they never
        will."""
        if verdict is None:
            verdict, why = judge(self.store, job) if job.after else (READY, "")
            if group:
                self.verdicts[group], self.reasons[group] = verdict, why
        else:
            why = self.reasons.get(group or "", "")
        if verdict == WAITING:
            return False
        if verdict == BROKEN:
            cancel_queued(self.store, job, entry, f"never ran: {why}")
            return False
        bookings = {b.id for b in self.view.snapshot.bookings}
        if job.reservation and job.reservation not in bookings:
            reason = f"never ran: its reservation {job.reservation} ended"
            cancel_queued(self.store, job, entry, reason)
            return False
        return True

    def _claim(
        self, entry: str, job: Job, group: Optional[str], allowed: Optional[list[str]]
    ) -> Optional[list[JobRank]]:
        """Its ranks' claims, taken; None when it cannot start now (its entry back in the
        queue, or another dispatcher's)."""
        store = self.store
        limit = job.array.max_running if job.array else None
        if group and limit and running_tasks(self.view.snapshot, group) >= limit:
            self.verdicts[group] = THROTTLED
            return None
        if not store.take_queue_entry(name=entry):
            return None  # another dispatcher has it
        try:
            ranks = place_and_claim(self.config, store, job, self.prober, self.view, allowed)
        except (ConflictError, NeverFitsError, UnreachableError, UsageError):
            store.return_queue_entry(name=entry)
            self.blocked_heads.append(job)
            return None
        except GpuclaimError:
            store.return_queue_entry(name=entry)
            raise
        if group and limit and running_tasks(store.snapshot(), group) > limit:
            # Another dispatcher started one at the same moment: each claims, then counts,
            # so the later of two always sees both, and %K is never passed.
            self._give_back(job, ranks)
            store.return_queue_entry(name=entry)
            self.verdicts[group] = THROTTLED
            return None
        return ranks

    def _start(self, entry: str, job: Job, ranks: list[JobRank]) -> None:
        moved = self.store.update_job(
            job_id=job.id,
            changes={
                "state": JobState.STARTING,
                "ranks": [r.to_dict() for r in ranks],
                "from_queue": True,
            },
            only_from=[JobState.QUEUED],
        )
        self.store.finish_queue_entry(name=entry)
        if not moved.applied:  # killed while we placed it
            self._give_back(job, ranks)
            return
        try:
            self.started.append(start_ranks(self.config, self.store, moved.job, self.ops))
        except GpuclaimError:
            return  # start_ranks recorded the failure and gave the GPUs back
        self.view = build_view(
            self.config, self.store, prober=self.prober, inventories=self.view.inventories
        )

    def _give_back(self, job: Job, ranks: list[JobRank]) -> None:
        for r in ranks:
            claim_ids = [r.claim_id or ""]
            release_claims(self.config, self.store, job.user, claim_ids=claim_ids, jobs_too=True)


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
        changes={"state": JobState.CANCELLED, "ended": iso(now), "reason": reason},
        only_from=[JobState.QUEUED],
    )
    store.finish_queue_entry(name=entry)
    if not result.applied:
        return None
    final = result.job
    store.append_event(job_event(EventType.JOB_CANCELLED, final, now))
    note_task_end(store, final)
    return final
