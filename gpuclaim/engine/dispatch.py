"""The queue, dispatched without a daemon: whoever runs gpuclaim next (a CLI call, a job's
wrapper when it ends, a node's queue keeper) starts the queued jobs that now fit, in
priority order (fair share, waiting time, nice: ``core/priority.py``), and says of every
other one why it waits (``queue_reasons.py``).

A later job may start before a waiting one only if that does not delay the waiting one's
expected start (backfill, from the time limits of what holds the GPUs: ``queue_plan.py``).

Standard library only: wrappers and keepers dispatch from the nodes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Union

from gpuclaim.core.accounts import runs_as
from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config
from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    NeverFitsError,
    StoreError,
    UnreachableError,
    UsageError,
)
from gpuclaim.core.events import job_event
from gpuclaim.core.model import EventType, Job, JobRank, iso
from gpuclaim.core.priority import Priority, QueueEntry, mean_use, parse_entry, priority
from gpuclaim.core.states import GpuState, JobState, ReasonCode
from gpuclaim.engine import queue_reasons as reasons
from gpuclaim.engine.array_records import array_of_task, note_task_end
from gpuclaim.engine.bookings import my_open_bookings
from gpuclaim.engine.claims import held_gpus, release_claims
from gpuclaim.engine.cluster import ClusterView, GpuRow, NodeProber, build_view
from gpuclaim.engine.depends import BROKEN, WAITING, judge
from gpuclaim.engine.fairshare import use_by_user
from gpuclaim.engine.launch import CLAIM_MARGIN_S, NodeOps, place_and_claim, start_ranks
from gpuclaim.engine.owners import not_ours, store_account
from gpuclaim.engine.placement import ClaimRequest, usable_rows
from gpuclaim.engine.policy import lab_config
from gpuclaim.engine.preempt import (
    begin_gang_handover,
    end_handovers,
    find_gang_handover,
    find_handover,
    yieldable,
    yielding_to,
)
from gpuclaim.engine.queue_plan import NEVER, Plan, slots_of
from gpuclaim.engine.queue_reasons import Reason
from gpuclaim.engine.share_placement import (
    latest_share_end,
    nothing_fits,
    share_room_mib,
    share_rows,
)
from gpuclaim.store import Snapshot, Store

MAX_PROMISES = 32  # waiting jobs whose expected start a pass protects (the rest: their turn)


@dataclass(frozen=True)
class Verdict:
    """A queued job after a pass: its place in the queue, its priority, why it waits."""

    position: int
    priority: Priority
    reason: Optional[Reason]  # None: it was not judged (the pass stopped early)


@dataclass
class QueueReport:
    """What a pass over the queue did: the jobs it started, and for each one still queued why
    it waits and when it is expected to start."""

    started: list[Job] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # by job id, the queued ones
    starts: dict[str, float] = field(default_factory=dict)  # job id -> its expected start

    def expected_start(self, job: Job) -> Optional[float]:
        """When the job is expected to start (from the time limits of what runs and of the
        jobs ahead of it); None when that cannot be known."""
        start = self.starts.get(job.id)
        return None if start is None or start == NEVER else max(start, job.begin or 0.0)


def dispatch_queue(
    config: Config,
    store: Store,
    prober: NodeProber,
    ops: Optional[NodeOps] = None,
    only_node: Optional[str] = None,
) -> list[Job]:
    """Start the queued jobs that fit now. With ``only_node`` (a job wrapper or a queue
    keeper on that node), only that node is used, locally."""
    return judge_queue(config, store, prober, ops, only_node).started


def judge_queue(
    config: Config,
    store: Store,
    prober: NodeProber,
    ops: Optional[NodeOps] = None,
    only_node: Optional[str] = None,
    every: Union[bool, Explained] = False,
) -> QueueReport:
    """One pass over the queue in priority order: what started, and (with ``every``, else as
    far as the pass needed to look) why each other job waits; with an ``Explained``, why
    those it names wait (a listing that shows a few of a long queue reads no more)."""
    config = lab_config(config, store)
    if only_node is not None:
        config = config.seen_from(only_node)
    entries = [e for e in map(parse_entry, store.queue_entries()) if e is not None]
    if not entries:
        return QueueReport()
    one_pass = _Pass(config, store, prober, ops or NodeOps(config, prober), every is True)
    order = one_pass.ordered(entries)
    if isinstance(every, Explained):
        one_pass.explained = every.among(order)
    for entry in order:
        one_pass.consider(entry)
    return one_pass.report()


@dataclass(frozen=True)
class Explained:
    """The queued jobs a listing explains: ``user``'s, each array's first waiting task, and
    the first ``first`` of the others, in the order they will start; with ``through``, every
    job up to that one (its expected start counts the time of each job ahead of it)."""

    user: str
    first: int
    through: str = ""

    def among(self, order: list[QueueEntry]) -> frozenset[str]:
        if self.through:
            ids = [e.job_id for e in order]
            end = ids.index(self.through) + 1 if self.through in ids else len(ids)
            return frozenset(ids[:end])
        chosen: set[str] = set()
        groups: set[Optional[str]] = {None}
        others = 0
        for e in order:
            group = array_of_task(e.job_id)
            if (
                e.user == self.user
                or group not in groups
                or (group is None and others < self.first)
            ):
                chosen.add(e.job_id)
                others += e.user != self.user and group is None
                groups.add(group)
        return frozenset(chosen)


class _Pass:
    """One pass: the view it judges by, the waiting jobs whose start it protects, and per
    array its outcome so far (its tasks share their needs and their limits, in index order,
    so once one waits the later ones wait for the same reason, without reading them)."""

    def __init__(
        self, config: Config, store: Store, prober: NodeProber, ops: NodeOps, every: bool
    ) -> None:
        self.config = config
        self.store = store
        self.prober = prober
        self.ops = ops
        self.every, self.explained = every, frozenset[str]()
        self.me = store_account(store)  # the account whose jobs this pass may start
        self.view = build_view(config, store, prober=prober)
        self.now = self.view.snapshot.now
        self.started: list[Job] = []
        self.plan = Plan(self.now, slots_of(self.view, [n.name for n in config.nodes]))
        self.full = nothing_free(self.view)
        self.held = held_gpus(self.view.snapshot)  # by user, as the view says
        self.jobs: dict[str, Job] = {}
        self.order: list[QueueEntry] = []
        self.priorities: dict[str, Priority] = {}
        self.reasons: dict[str, Reason] = {}
        self.group_reason: dict[str, Reason] = {}

    # -- order ---------------------------------------------------------------------------

    def ordered(self, entries: list[QueueEntry]) -> list[QueueEntry]:
        users = {e.job_id: e.user or self._user_of(e) for e in entries}
        queuing = {u for u in users.values() if u}
        use = use_by_user(self.config, self.store, self.view.snapshot) if len(queuing) > 1 else {}
        mean = mean_use(use, queuing)
        for e in entries:
            user = users[e.job_id] or ""
            waited = self.now - max(e.submitted, e.begin)
            self.priorities[e.job_id] = priority(
                self.config.queue, use.get(user, 0.0), mean, waited, e.nice
            )
        self.order = sorted(entries, key=lambda e: (-self.priorities[e.job_id].value, e.order))
        return self.order

    def _user_of(self, entry: QueueEntry) -> str:
        """An entry from before fair share names no user: its record does."""
        try:
            job = self._job(entry)
        except StoreError:
            return ""
        return job.user if job is not None else ""

    def _job(self, entry: QueueEntry) -> Optional[Job]:
        if entry.job_id not in self.jobs:
            job = self.store.load_job(job_id=entry.job_id)
            if job is None:
                return None
            self.jobs[entry.job_id] = job
        return self.jobs[entry.job_id]

    # -- one entry -------------------------------------------------------------------------

    def consider(self, entry: QueueEntry) -> None:
        group = array_of_task(entry.job_id)
        known = self.group_reason.get(group) if group else None
        if known is not None:
            self.reasons[entry.job_id] = known
            return  # without reading its record: a pass over 1,000 tasks stays cheap
        reason = self._judge(entry)
        if reason is not None:
            self.reasons[entry.job_id] = reason
            if group:
                self.group_reason[group] = reason

    def _judge(self, entry: QueueEntry) -> Optional[Reason]:
        """Start it, or say why not (None: started, or gone from the queue)."""
        if entry.begin > self.now:
            return reasons.begin_time(entry.begin, self.now)
        limit = self.config.limits.max_gpus_per_user
        if limit and entry.user and self.held.get(entry.user, 0) >= limit:
            return reasons.user_limit(limit, entry.user, self.held.get(entry.user, 0))
        if self.full and not (self.every or entry.job_id in self.explained):
            return None  # nothing can start: the rest is not worth reading
        try:
            job = self._job(entry)
        except StoreError:
            return None  # a damaged record cannot run; the jobs behind it still may
        if job is None or job.state != JobState.QUEUED:
            self.store.finish_queue_entry(name=entry.name)
            return None
        return self._judge_job(entry, job)

    def _judge_job(self, entry: QueueEntry, job: Job) -> Optional[Reason]:
        waits = self._may_run(entry, job)
        if waits is not None:
            return waits
        nodes = [
            n.name
            for n in self.config.nodes
            if job.node in (None, n.name) and (not job.ray_nodes or n.name in job.ray_nodes)
        ]
        if not nodes:
            return None  # pinned to nodes this pass does not use (a wrapper's, elsewhere)
        out = reasons.nodes_out(self.view, job, nodes)
        if out is not None:
            return out
        until = self.now + job.time_limit_s + CLAIM_MARGIN_S
        req = ClaimRequest(
            user=job.user,
            count=job.gpus_per_node,
            preemptible=job.preemptible,
            gpu_mem_mib=job.gpu_mem_mib,
            gpu_share=job.gpu_share,
            mig=job.mig,
        )
        usable = [n for n in nodes if n not in self.view.drains and n not in self.view.unreachable]
        if job.shared:
            return self._judge_share(entry, job, req, nodes, usable, until)
        free = {n: len(_usable(self.view, job, n, req, until)) for n in usable}
        fit = [n for n, count in free.items() if count >= job.gpus_per_node]
        if len(fit) < job.nodes_wanted:
            short = preempt_for(self.config, self.store, self.view, job, nodes, until - self.now)
            return self._waits(job, nodes, short or reasons.resources(self.view, job, free, until))
        own = _booked_room(self.view, job)  # its owner's open booking delays nobody
        blockers = {n: self.plan.blocker(n, job.gpus_per_node, until) for n in fit}
        allowed = [n for n in fit if n in own or blockers[n] is None]
        if len(allowed) < job.nodes_wanted:
            first = next(b for b in blockers.values() if b is not None)
            return self._waits(job, nodes, reasons.priority(self._ahead_of(entry), first))
        return self._start_if_ours(entry, job, nodes, allowed)

    def _start_if_ours(
        self, entry: QueueEntry, job: Job, nodes: list[str], allowed: list[str]
    ) -> Optional[Reason]:
        if not runs_as(job, self.me) or self.store.check_job(job=job):
            reason, keep = not_ours(self.store, job, self.me, entry.name, allowed)
            return self._waits(job, nodes, reason) if reason and keep else reason
        failed = self._claim_and_start(entry, job, allowed)
        if failed is not None:
            return self._waits(job, nodes, failed)
        return None

    def _judge_share(
        self,
        entry: QueueEntry,
        job: Job,
        req: ClaimRequest,
        nodes: list[str],
        usable: list[str],
        until: float,
    ) -> Optional[Reason]:
        """A share of one GPU: where one fits now, placed where it delays no waiting job (on a
        GPU already shared at least as long, or where the plan has room for one GPU)."""
        fit = {n: share_rows(self.view, n, req, until) for n in usable}
        fit = {n: rows for n, rows in fit.items() if rows}
        if not fit:
            text = nothing_fits(self.view, req, usable)
            return self._waits(job, nodes, Reason(ReasonCode.RESOURCES, text))
        allowed = [
            n
            for n, rows in fit.items()
            if any(r.shares and latest_share_end(r) >= until for r in rows)
            or self.plan.blocker(n, 1, until) is None
        ]
        if not allowed:
            first = next(b for n in fit if (b := self.plan.blocker(n, 1, until)) is not None)
            return self._waits(job, nodes, reasons.priority(self._ahead_of(entry), first))
        return self._start_if_ours(entry, job, nodes, allowed)

    def _may_run(self, entry: QueueEntry, job: Job) -> Optional[Reason]:
        """Its dependencies, booking and limits; cancels it when it never can run."""
        if job.after:
            verdict, why = judge(self.store, job)
            if verdict == WAITING:
                return reasons.dependency(why)
            if verdict == BROKEN:
                cancel_queued(self.store, job, entry.name, f"never ran: {why}")
                return None
        bookings = self.view.snapshot.bookings
        if job.reservation and job.reservation not in {b.id for b in bookings}:
            reason = f"never ran: its reservation {job.reservation} ended"
            cancel_queued(self.store, job, entry.name, reason)
            return None
        if job.reservation:
            closed = reasons.own_booking_closed(job, bookings, self.now)
            if closed is not None:
                return closed
        group = array_of_task(job.id)
        cap = job.array.max_running if job.array else None
        if group and cap and running_tasks(self.view.snapshot, group) >= cap:
            return reasons.array_limit(cap)
        limit = self.config.limits.max_gpus_per_user
        need = job.gpu_share or (0.0 if job.shared else job.gpus_per_node * job.nodes_wanted)
        if limit and self.held.get(job.user, 0) + need > limit:
            return reasons.user_limit(limit, job.user, self.held.get(job.user, 0))
        return None

    def _waits(self, job: Job, nodes: list[str], reason: Reason) -> Reason:
        """It waits for GPUs: its expected start is kept from later jobs (a promise)."""
        if self.plan.promised < MAX_PROMISES:
            self.plan.promise(job, nodes, CLAIM_MARGIN_S)
        return reason

    # -- claiming --------------------------------------------------------------------------

    def _claim_and_start(self, entry: QueueEntry, job: Job, allowed: list[str]) -> Optional[Reason]:
        """Its ranks claimed and started; else why not (its entry back in the queue)."""
        store = self.store
        if not store.take_queue_entry(name=entry.name):
            return None  # another dispatcher has it
        try:
            ranks = place_and_claim(self.config, store, job, self.prober, self.view, allowed)
        except (ConflictError, NeverFitsError, UnreachableError, UsageError) as exc:
            store.return_queue_entry(name=entry.name)
            return Reason(ReasonCode.RESOURCES, exc.message)
        except GpuclaimError:
            store.return_queue_entry(name=entry.name)
            raise
        end_handovers(store, job.user, [u for r in ranks for u in r.gpu_uuids])
        over = self._over_a_limit(job)
        if over is not None:
            # Another dispatcher started one at the same moment: each claims, then counts,
            # so the later of two always sees both, and no limit is passed.
            self._give_back(job, ranks)
            store.return_queue_entry(name=entry.name)
            return over
        self._start(entry, job, ranks)
        return None

    def _over_a_limit(self, job: Job) -> Optional[Reason]:
        snap = self.store.snapshot()
        group = array_of_task(job.id)
        cap = job.array.max_running if job.array else None
        if group and cap and running_tasks(snap, group) > cap:
            return reasons.array_limit(cap)
        limit = self.config.limits.max_gpus_per_user
        held = held_gpus(snap).get(job.user, 0.0)
        if limit and held > limit + 1e-9:
            mine = sum(s.claim.gpu_weight for s in snap.claims.values() if s.claim.job == job.id)
            return reasons.user_limit(limit, job.user, held - mine)
        return None

    def _start(self, entry: QueueEntry, job: Job, ranks: list[JobRank]) -> None:
        moved = self.store.update_job(
            job_id=job.id,
            changes={
                "state": JobState.STARTING,
                "ranks": [r.to_dict() for r in ranks],
                "from_queue": True,
            },
            only_from=[JobState.QUEUED],
        )
        self.store.finish_queue_entry(name=entry.name)
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
        self.plan.slots = slots_of(self.view, [n.name for n in self.config.nodes])
        self.full = nothing_free(self.view)
        self.held = held_gpus(self.view.snapshot)

    def _give_back(self, job: Job, ranks: list[JobRank]) -> None:
        for r in ranks:
            claim_ids = [r.claim_id or ""]
            release_claims(self.config, self.store, job.user, claim_ids=claim_ids, jobs_too=True)

    # -- what the pass knows ------------------------------------------------------------------

    def _ahead_of(self, entry: QueueEntry) -> int:
        """Queued jobs before it in priority order (the started ones are not counted)."""
        started = {j.id for j in self.started}
        ahead = 0
        for e in self.order:
            if e is entry:
                return max(ahead, 1)
            ahead += e.job_id not in started
        return max(ahead, 1)

    def report(self) -> QueueReport:
        started = {j.id for j in self.started}
        verdicts: dict[str, Verdict] = {}
        for e in self.order:
            if e.job_id in started or e.job_id in verdicts:
                continue
            job = self.jobs.get(e.job_id)
            if job is not None and job.state != JobState.QUEUED:
                continue
            verdicts[e.job_id] = Verdict(
                len(verdicts) + 1, self.priorities[e.job_id], self.reasons.get(e.job_id)
            )
        return QueueReport(self.started, verdicts, dict(self.plan.starts))


def _usable(
    view: ClusterView, job: Job, node: str, req: ClaimRequest, until: float
) -> list[GpuRow]:
    """The GPUs the job could claim on ``node`` now: a ``--reservation`` job's, only those
    of its booking (the rest of the node is not its to wait for or preempt)."""
    rows = usable_rows(view, node, req, until)
    if not job.reservation:
        return rows
    booked = _booking_of(view, job)
    return [r for r in rows if booked is not None and r.uuid in booked.uuids]


def _booking_of(view: ClusterView, job: Job) -> Optional[Booking]:
    return next((b for b in view.snapshot.bookings if b.id == job.reservation), None)


def preempt_for(
    config: Config, store: Store, view: ClusterView, job: Job, nodes: list[str], duration: float
) -> Optional[Reason]:
    """GPUs that preemptible jobs hold make it fit: ask them to yield, with the GPUs
    booked for its owner meanwhile (a gang's on all its nodes, or none), and its dispatch
    starts it once they ended; why it waits then. None: preempting would not make it fit
    (or it preempts nobody)."""
    if job.preemptible:
        return None
    under_way = yielding_to(view.snapshot.bookings, job.user, nodes)
    if under_way is not None:
        gpus = ",".join(under_way.labels)
        return Reason(
            ReasonCode.RESOURCES,
            f"preemptible jobs yield {under_way.node} GPU {gpus} to {job.user}",
        )
    req = ClaimRequest(user=job.user, count=job.gpus_per_node, node=job.node, mig=job.mig)
    if job.nodes_wanted > 1:
        handovers = find_gang_handover(config, view, req, job.nodes_wanted, nodes, duration)
    else:
        if job.reservation:  # inside its booking only, as a claim on it preempts
            inside = in_booking_request(view, job, req, duration)
            if inside is None:
                return None
            req = inside
        one = find_handover(config, view, req, duration)
        handovers = [one] if one is not None else None
    if not handovers:
        return None
    try:
        _, who = begin_gang_handover(config, store, req, handovers)
    except GpuclaimError:
        return None  # another pass or claim got there first: judged again next time
    where = "; ".join(f"{h.node} GPU {','.join(h.labels)}" for h in handovers)
    return Reason(ReasonCode.RESOURCES, f"waiting for {who} to yield {where}")


def in_booking_request(
    view: ClusterView, job: Job, req: ClaimRequest, duration: float
) -> Optional[ClaimRequest]:
    """A queued ``--reservation`` job's claim: exactly GPUs of its booking, the free ones
    first, then those preemptible work holds; None if even all of them are too few."""
    booked = _booking_of(view, job)
    if booked is None:
        return None
    free = _usable(view, job, booked.node, req, view.snapshot.now + duration)
    held = [
        r
        for r in view.gpus_of(booked.node)
        if r.uuid in booked.uuids and r not in free and yieldable(r, req)
    ]
    rows = (sorted(free, key=lambda r: r.order) + sorted(held, key=lambda r: r.order))[
        : job.gpus_per_node
    ]
    if len(rows) < job.gpus_per_node:
        return None
    labels = tuple(r.label for r in sorted(rows, key=lambda r: r.order))
    return replace(req, exact=((booked.node, labels),), node=None, count=0)


def nothing_free(view: ClusterView) -> bool:
    """No GPU free on any node this pass may use: nothing more can start (a GPU that
    a preemptible job holds counts as free: a queued job may make it yield)."""
    return not any(
        r.state in (GpuState.FREE, GpuState.STALE, GpuState.RESERVED)
        or (r.state == GpuState.SHARED and share_room_mib(r) > 0)
        or (r.claim is not None and r.claim.preemptible and r.state == GpuState.CLAIMED)
        for r in view.rows
        if r.node not in view.drains
    )


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
