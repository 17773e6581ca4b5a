"""Claiming, releasing, extending and collecting GPUs: placement and policy over the store."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    UsageError,
)
from gpuclaim.core.events import claim_event
from gpuclaim.core.identity import this_host
from gpuclaim.core.inventory import gpu_label, label_order
from gpuclaim.core.model import Claim, ClaimedGpu, Event, EventType, Job
from gpuclaim.core.share_policy import gpu_count
from gpuclaim.core.states import ACTIVE_JOB_STATES, FINAL_STATES, GpuState, JobState, ended
from gpuclaim.engine.bookings import (
    blocked_message,
    blocking,
    booking_for,
    my_open_bookings,
    settle_bookings,
)
from gpuclaim.engine.cluster import ClusterView, GpuRow, NodeProber, build_view, mark_lost_jobs
from gpuclaim.engine.job_records import finish_rank, load_jobs
from gpuclaim.engine.placement import (
    ClaimRequest,
    bookings_against,
    candidate_nodes,
    hold_until,
    pick_adopt,
    pick_exact,
    pick_free,
    usable_rows,
)
from gpuclaim.engine.policy import lab_config
from gpuclaim.engine.preempt import (
    Handover,
    HandoverLost,
    Say,
    drop_bookings,
    find_handover,
    hand_over,
    yieldable,
)
from gpuclaim.engine.queue_repair import requeue_orphans
from gpuclaim.engine.share_placement import pick_share, share_claim_fields, share_wanted
from gpuclaim.store import ClaimStatus, Snapshot, Store, new_claim_id

RACE_RETRIES = 8
CLAIM_MARGIN_S = 120.0  # a job's claim outlives its time limit by the grace plus this


@dataclass
class GcReport:
    """What ``gc`` found and removed."""

    expired: list[Claim] = field(default_factory=list)
    incomplete: list[Claim] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    swept: int = 0  # leftover staged files and locks of killed processes
    lost_jobs: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)  # queued records the queue had lost


_LABEL = re.compile(r"^(\d+)(?:/(\d+))?$")


def parse_gpu_spec(spec: str) -> tuple[str, tuple[str, ...]]:
    """``node01:0,2`` -> ("node01", ("0", "2")); ``node01:0/1`` names slice 1 of GPU 0."""
    node, sep, rest = spec.partition(":")
    if not sep or not node or not rest:
        raise UsageError(f"--gpu wants NODE:INDEX[,INDEX...], e.g. node01:0,2 (got {spec!r})")
    listed = []
    for part in rest.split(","):
        m = _LABEL.match(part.strip())
        if m is None:
            raise UsageError(
                f"--gpu indices must be numbers (a MIG slice: GPU/SLICE, e.g. node01:0/1), "
                f"e.g. node01:0,2 (got {spec!r})"
            )
        listed.append(gpu_label(int(m[1]), None if m[2] is None else int(m[2])))
    twice = sorted({i for i in listed if listed.count(i) > 1})
    if twice:
        raise UsageError(f"--gpu {spec}: GPU {twice[0]} is listed twice")
    return node, tuple(sorted(listed, key=label_order))


def parse_gpu_specs(specs: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Several ``--gpu`` options; any GPU named twice, in one or across them, is bad input."""
    parsed = [parse_gpu_spec(s) for s in specs]
    seen: set[tuple[str, str]] = set()
    for node, indices in parsed:
        for i in indices:
            if (node, i) in seen:
                raise UsageError(f"--gpu: {node} GPU {i} is listed twice")
            seen.add((node, i))
    return parsed


def claim_gpus(
    config: Config,
    store: Store,
    req: ClaimRequest,
    prober: NodeProber,
    say: Optional[Say] = None,
) -> Claim:
    """Claim what ``req`` asks for, all or nothing; raises ConflictError if it cannot now.
    With ``say`` (a caller that can wait), GPUs held by preemptible jobs count too: they are
    asked to yield, ``say`` tells for whom it waits, and the claim gets exactly their GPUs."""
    config = lab_config(config, store)
    duration = _checked_duration(config, req.duration_s, req.service)
    booked = None
    if req.reservation:
        booked = booking_for(
            settle_bookings(config, store, store.snapshot()), req.reservation, req.user
        )
        req = dataclasses.replace(req, node=booked.node)
    nodes = candidate_nodes(config, req)
    fits = req.count if not (req.exact or req.adopt or booked) else None
    view = build_view(config, store, nodes, prober=prober, fits=fits)
    if booked is not None:
        req = _within(view, req, booked, duration, preempting=say is not None)
    _check_share_terms(req)
    _check_user_limit(config, view, req)
    for attempt in range(RACE_RETRIES):
        try:
            node, rows = _pick(config, view, req, duration)
        except ConflictError:
            # a share preempts nobody: a preemptible whole job's GPU is not its to take
            handover = (
                find_handover(config, view, req, duration) if say and not req.shared else None
            )
            if handover is None or say is None:
                raise
            try:
                return _claim_handed_over(config, store, req, prober, handover, say)
            except HandoverLost:
                if attempt == RACE_RETRIES - 1:
                    raise
                view = build_view(config, store, nodes, view.inventories)  # the winner's too
                continue
        if req.shared:
            _check_user_limit(config, view, req, _share_part(rows[0], req))
        _reap_stale(store, view, rows, req.user)
        now = store.now()
        expires = min(hold_until(r, req, now, now + duration) for r in rows)
        claim = _new_claim(req, node, rows, now, expires)
        try:
            store.acquire(claim)
        except ConflictError:
            if req.exact or req.adopt or attempt == RACE_RETRIES - 1:
                raise
            # Someone won a race for one of these GPUs: re-read the store (cheap) and retry
            # with the same probe results.
            view = build_view(config, store, nodes, view.inventories)
            continue
        # Linked first, bookings read second: a booking made meanwhile is seen here (or it
        # saw this claim after its own write; store.bookings says why that is enough).
        clash = booked_meanwhile(store, claim, req)
        if clash is not None:
            _remove_own(store, claim)
            if req.exact or req.adopt or attempt == RACE_RETRIES - 1:
                raise ConflictError(blocked_message(clash, claim.labels, now, claim.expires))
            view = build_view(config, store, nodes, view.inventories)
            continue
        _mark_bookings_used(store, view.snapshot.bookings, claim, now)
        store.append_event(claim_event(EventType.CLAIM, claim, now))
        return claim
    raise ConflictError("could not claim: other claims kept winning the race; try again")


def _new_claim(
    req: ClaimRequest, node: str, rows: list[GpuRow], now: float, expires: float
) -> Claim:
    return Claim(
        id=new_claim_id(),
        user=req.user,
        node=node,
        gpus=tuple(ClaimedGpu(r.uuid or "", r.index or 0, r.mig) for r in rows),
        since=now,
        expires=expires,
        note=req.note,
        job=req.job,
        host=this_host(),
        pid=os.getpid(),
        adopted=req.adopt,
        preemptible=req.preemptible,
        keep_when_idle=req.keep_when_idle,
        service=req.service,
        **(share_claim_fields(rows[0], req) if req.shared else {}),
    )


def _pick(
    config: Config, view: ClusterView, req: ClaimRequest, duration: float
) -> tuple[str, list[GpuRow]]:
    if req.shared:
        return pick_share(config, view, req, view.snapshot.now + duration)
    if req.adopt:
        return pick_adopt(view, req)
    if req.exact:
        return pick_exact(view, req, duration)
    return pick_free(config, view, req, duration)


def _claim_handed_over(
    config: Config,
    store: Store,
    req: ClaimRequest,
    prober: NodeProber,
    handover: Handover,
    say: Say,
) -> Claim:
    """Once the preemptible jobs yielded: exactly their GPUs (and the free ones chosen with
    them), inside the hand-over booking that kept everyone else off them meanwhile."""
    booking = hand_over(config, store, req, handover, say)
    try:
        exact = dataclasses.replace(
            req, exact=((handover.node, handover.labels),), node=None, reservation=None
        )
        # asked again: the yielded jobs' processes are gone now (an earlier answer shows them)
        return claim_gpus(config, store, exact, prober.fresh())
    finally:
        drop_bookings(store, [booking])


def _within(
    view: ClusterView, req: ClaimRequest, booked: Booking, duration: float, preempting: bool
) -> ClaimRequest:
    """A claim on one's booking: exactly its GPUs (all, or ``req.count`` of them) that are
    free now (or, ``preempting``, held by preemptible work that used the window until its
    owner came); fewer than asked is exit 3, naming who holds the others."""
    need = req.count or len(booked.gpus)
    rows = [
        r
        for r in usable_rows(view, booked.node, req, view.snapshot.now + duration)
        if r.uuid in booked.uuids
    ]
    if preempting:
        rows += [
            r for r in view.gpus_of(booked.node) if r.uuid in booked.uuids and yieldable(r, req)
        ]
    if len(rows) < need:
        held = [
            f"GPU {r.label} {r.state}" + (f" by {r.claim.user}" if r.claim else "")
            for r in view.gpus_of(booked.node)
            if r.uuid in booked.uuids and r not in rows
        ]
        raise ConflictError(
            f"reservation {booked.id}: {len(rows)} of its {len(booked.gpus)} GPUs on "
            f"{booked.node} are free now, {need} wanted ({', '.join(held)})"
        )
    indices = tuple(r.label for r in sorted(rows[:need], key=lambda r: r.order))
    return dataclasses.replace(req, exact=((booked.node, indices),), node=None)


def booked_meanwhile(
    store: Store, claim: Claim, req: Optional[ClaimRequest] = None
) -> Optional[Booking]:
    bookings = store.bookings() if req is None else bookings_against(req, store.bookings())
    for uuid in claim.uuids:
        b = blocking(bookings, uuid, claim.user, claim.since, claim.expires)
        if b is not None:
            return b
    return None


def _remove_own(store: Store, claim: Claim) -> None:
    for gpu_uuid in claim.uuids:
        store.remove_gpu(gpu_uuid, claim.id)


def _mark_bookings_used(
    store: Store, bookings: Sequence[Booking], claim: Claim, now: float
) -> None:
    """The owner came: their booking is no no-show, even if they release before anyone looks."""
    for b in my_open_bookings(bookings, claim.user, now):
        if b.used is None and b.shares_gpus(claim.uuids):
            store.update_booking(b.id, {"used": now})


def release_claims(
    config: Config,
    store: Store,
    user: str,
    claim_ids: Sequence[str] = (),
    gpus: Sequence[tuple[str, tuple[str, ...]]] = (),
    release_all: bool = False,
    force: bool = False,
    jobs_too: bool = False,
) -> list[Claim]:
    """Release the named claims (or all of one's own); another user's only with ``force``.
    A running job's claim is never released here (the job would keep running on GPUs shown
    free: one GPU, two users): the job's end or ``kill`` releases it. ``--all`` leaves such
    claims alone; naming one is an error with the kill hint. ``jobs_too`` is for the job
    machinery itself, giving back the claims of a job that could not start."""
    snap = store.snapshot()
    targets: dict[str, ClaimStatus] = {}
    if release_all:
        mine = {cid: s for cid, s in snap.claims.items() if s.claim.user == user}
        if not mine:
            raise GpuclaimError(f"{user} holds no claims")
        targets = {cid: s for cid, s in mine.items() if jobs_too or not _held_by_a_job(s)}
        if not targets:
            names = _job_names(store, mine)
            raise GpuclaimError(
                f"all of {user}'s claims belong to running jobs ({names}): "
                "they are released when the jobs end",
                hint=f"stop them with 'gpuclaim kill {names.split(', ')[0]}'",
            )
    for cid in claim_ids:
        if cid not in snap.claims:
            raise GpuclaimError(f"no claim {cid!r}", hint="see 'gpuclaim status'")
        targets[cid] = snap.claims[cid]
    for node, indices in gpus:
        config.node(node)
        for index in indices:
            status = next(
                (
                    s
                    for s in snap.claims.values()
                    if s.claim.node == node and index in s.claim.labels
                ),
                None,
            )
            if status is None:
                raise GpuclaimError(f"{node} GPU {index} is not claimed")
            targets[status.claim.id] = status
    if not targets:
        raise UsageError("name a claim id, --gpu NODE:INDEX, or --all")
    for status in targets.values():
        if not jobs_too and _held_by_a_job(status):
            name = _job_names(store, {status.claim.id: status})
            raise GpuclaimError(
                f"claim {status.claim.id} ({status.claim.node} GPU "
                f"{','.join(status.claim.labels)}) belongs to the running job "
                f"{name}: it is released when the job ends",
                hint=f"stop the job with 'gpuclaim kill {name}'",
            )
    for status in targets.values():
        if status.claim.user != user and not force:
            raise ConflictError(
                f"claim {status.claim.id} belongs to {status.claim.user}",
                hint="release it with --force if you must (it is logged)",
            )
    released = []
    for status in targets.values():
        if _remove_claim(store, status):
            now = store.now()
            if status.claim.user != user:
                kind, by = EventType.FORCE_RELEASE, user
            elif status.reason == "expired":
                kind, by = EventType.EXPIRE, None
            else:
                kind, by = EventType.RELEASE, None
            end = min(now, status.claim.expires)
            store.append_event(claim_event(kind, status.claim, end, by=by))
            released.append(status.claim)
    return released


def job_claims_of(store: Store, user: str) -> list[tuple[Claim, str]]:
    """The user's claims that running jobs hold, with the jobs' names (what --all keeps)."""
    snap = store.snapshot()
    held = {cid: s for cid, s in snap.claims.items() if s.claim.user == user and _held_by_a_job(s)}
    return [(s.claim, _job_names(store, {cid: s})) for cid, s in held.items()]


def _held_by_a_job(status: ClaimStatus) -> bool:
    """A job's claim that still holds (a lost job's stale claim may be cleaned up)."""
    return bool(status.claim.job) and status.state == GpuState.CLAIMED


def _job_names(store: Store, statuses: dict[str, ClaimStatus]) -> str:
    names = []
    for status in statuses.values():
        job = store.load_job(job_id=status.claim.job) if status.claim.job else None
        name = job.name if job else str(status.claim.job)
        if status.claim.job and name not in names:
            names.append(name)
    return ", ".join(names)


def collect_garbage(
    store: Store, user: str, prober: Optional[NodeProber] = None, config: Optional[Config] = None
) -> GcReport:
    """Remove expired and abandoned claims, set damaged claim files aside; log each. With a
    prober, the nodes that hold jobs' claims are asked first: a job whose wrapper is gone
    (node rebooted) is collected now, not three missed heartbeats later."""
    snap = store.snapshot()
    if prober is not None and config is not None:
        job_nodes = {s.claim.node for s in snap.claims.values() if s.claim.job}
        asked = [n for n in config.nodes if n.name in job_nodes]
        if asked:
            inventories = prober.probe(asked)
            snap = mark_lost_jobs(store.snapshot(), inventories)  # read after the probe
    report = GcReport()
    for status in snap.claims.values():
        if status.state != GpuState.STALE:
            continue
        if _remove_claim(store, status):
            kind = EventType.EXPIRE if status.reason == "expired" else EventType.REAP
            end = status.claim.expires if kind is EventType.EXPIRE else snap.now
            store.append_event(claim_event(kind, status.claim, end, by=user, reason=status.reason))
            (report.expired if kind is EventType.EXPIRE else report.incomplete).append(status.claim)
    for cf in snap.corrupt():
        if store.quarantine_corrupt(cf):
            report.corrupt.append(cf.uuid)
    report.swept = store.sweep()  # taken entries of dead dispatchers back first, then:
    in_queue = set(store.queued_job_ids())  # before the records (see requeue_orphans)
    jobs = load_jobs(store)
    report.requeued = requeue_orphans(store, jobs, in_queue)
    report.lost_jobs = _finish_lost_jobs(store, snap, jobs)
    return report


def _finish_lost_jobs(store: Store, snap: Snapshot, jobs: list[Job]) -> list[str]:
    """Jobs still marked running whose every claim is gone or lost: their node or wrapper went
    away. Record them as lost (their claims were just collected), so none stays 'running'."""
    lost = []
    for job in jobs:
        if job.state not in ACTIVE_JOB_STATES or job.state == JobState.QUEUED or not job.ranks:
            continue
        alive = [
            r
            for r in job.ranks
            if r.claim_id in snap.claims and snap.claims[r.claim_id].state == GpuState.CLAIMED
        ]
        if alive:
            continue
        for r in job.ranks:
            if not ended(r.state):
                finish_rank(
                    store, job, r.rank, JobState.LOST, None, "its node, tmux or wrapper went away"
                )
        lost.append(job.name)
    return lost


def drain_node(config: Config, store: Store, user: str, node: str, reason: str) -> None:
    config.node(node)
    now = store.now()
    store.set_drain(node, {"user": user, "reason": reason, "since": now})
    store.append_event(Event(ts=now, type=EventType.DRAIN, user=user, node=node, reason=reason))


def undrain_node(config: Config, store: Store, user: str, node: str) -> bool:
    config.node(node)
    if not store.clear_drain(node):
        return False
    store.append_event(Event(ts=store.now(), type=EventType.UNDRAIN, user=user, node=node))
    return True


def _reap_stale(store: Store, view: ClusterView, rows: list[GpuRow], user: str) -> None:
    """Chosen GPUs that hold a stale claim or a damaged file are taken over: reap first (a
    shared GPU's stale shares too, whatever its state: they hold memory in the store)."""
    for row in rows:
        _reap_stale_shares(store, view, row, user)
        if row.state != GpuState.STALE:
            continue
        if row.claim is None:
            cf = view.snapshot.files.get(row.uuid or "")
            if cf is not None:
                store.quarantine_corrupt(cf)
            continue
        status = view.snapshot.claims.get(row.claim.id)
        if status is not None and _remove_claim(store, status):
            kind = EventType.EXPIRE if status.reason == "expired" else EventType.REAP
            end = status.claim.expires if kind is EventType.EXPIRE else view.snapshot.now
            store.append_event(claim_event(kind, status.claim, end, by=user, reason=status.reason))
            if status.reason == "job lost":
                finish_lost_claim(store, status.claim)


def _reap_stale_shares(store: Store, view: ClusterView, row: GpuRow, user: str) -> None:
    snap = view.snapshot
    for cf in snap.damaged_shares(row.uuid or ""):
        if not cf.unreadable:
            store.quarantine_corrupt(cf)
    for status in snap.shares_of(row.uuid or ""):
        if status.state == GpuState.STALE and _remove_claim(store, status):
            kind = EventType.EXPIRE if status.reason == "expired" else EventType.REAP
            end = status.claim.expires if kind is EventType.EXPIRE else snap.now
            store.append_event(claim_event(kind, status.claim, end, by=user, reason=status.reason))
            if status.reason == "job lost":
                finish_lost_claim(store, status.claim)


def finish_lost_claim(store: Store, claim: Claim) -> None:
    """A job's claim judged lost (its wrapper is gone): record the rank as lost, which also
    releases the claim, so the job does not stay 'running' for ever."""
    job = store.load_job(job_id=claim.job) if claim.job else None
    if job is None:
        return
    for r in job.ranks:
        if r.claim_id == claim.id and r.state not in FINAL_STATES:
            finish_rank(
                store, job, r.rank, JobState.LOST, None, "its node, tmux or wrapper went away"
            )


def _remove_claim(store: Store, status: ClaimStatus) -> bool:
    removed = False
    for gpu_uuid in status.present:
        removed |= store.remove_gpu(gpu_uuid, status.claim.id)
    return removed


def _check_share_terms(req: ClaimRequest) -> None:
    if not req.shared:
        return
    if req.adopt or req.reservation:
        what = "--adopt" if req.adopt else "--reservation"
        raise UsageError(f"--gpu-mem/--gpu-share hold part of a GPU: not with {what}")
    if req.count != 1 or (req.exact and len(req.exact[0][1]) != 1):
        raise UsageError("--gpu-mem/--gpu-share hold part of one GPU: name one GPU at most")


def _share_part(row: GpuRow, req: ClaimRequest) -> float:
    total = row.gpu.memory_total_mib if row.gpu is not None else 0
    return min(1.0, share_wanted(row, req) / total) if total else 1.0


def _check_user_limit(
    config: Config, view: ClusterView, req: ClaimRequest, wanted: Optional[float] = None
) -> None:
    """max_gpus_per_user, a share counted by its part of its GPU (known once it is placed:
    ``wanted``; before that a share is checked as nothing more)."""
    limit = config.limits.max_gpus_per_user
    if not limit:
        return
    held = held_gpus(view.snapshot).get(req.user, 0.0)
    if wanted is None:
        wanted = (
            0.0
            if req.shared
            else float(sum(len(i) for _, i in req.exact) if req.exact else req.count)
        )
    if held + wanted > limit + 1e-9:
        raise ConflictError(
            f"{req.user} holds {gpu_count(held)} GPUs; {gpu_count(wanted)} more would pass "
            f"the limit of {limit} per user",
            hint="release a claim first",
        )


def held_gpus(snapshot: Snapshot) -> dict[str, float]:
    """GPUs each user holds now (claims and jobs'; a share by its part), for max_gpus_per_user."""
    held: dict[str, float] = {}
    for s in snapshot.claims.values():
        if s.state == GpuState.CLAIMED:
            held[s.claim.user] = held.get(s.claim.user, 0.0) + s.claim.gpu_weight
    return held


def _checked_duration(config: Config, duration_s: Optional[float], service: bool = False) -> float:
    duration = duration_s if duration_s is not None else config.limits.default_time_s
    limit = config.limits.max_service_time_s if service else config.limits.max_time_s
    if duration > limit + (CLAIM_MARGIN_S if service else 0.0):
        raise UsageError(
            f"--time {format_duration(duration)} is longer than this cluster's limit of "
            f"{format_duration(limit)}"
        )
    return duration
