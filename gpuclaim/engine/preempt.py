"""Preemption: a claim that needs GPUs held by preemptible jobs (``run --preemptible``).

The claimer picks the fewest, most recently started preemptible jobs whose GPUs make its claim
fit, and *books* those GPUs (with any free ones it needs) for itself for the moment of the
hand-over: ``store.book`` makes one of two racing claimers the owner and refuses the other, and
a booking keeps every other claim, run and queued job off its GPUs meanwhile. Then it asks the
jobs to yield (their wrappers read the request within a second: the job's signal, the grace,
SIGTERM, ``kill_grace``, SIGKILL), waits for their claims to go, claims exactly those GPUs
inside its own booking, and drops the booking. A claimer that dies while waiting leaves a
booking that ends by itself moments later. A gang (``run --nodes K``) books every node it
needs first, all or none, and only then asks anyone to yield.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import ConflictError, GpuclaimError, StoreError
from gpuclaim.core.events import claim_event
from gpuclaim.core.identity import this_host
from gpuclaim.core.model import Claim, ClaimedGpu, EventType, Job, iso
from gpuclaim.core.states import GpuState, started
from gpuclaim.engine.bookings import blocking, new_booking_id
from gpuclaim.engine.cluster import ClusterView, GpuRow
from gpuclaim.engine.placement import (
    ClaimRequest,
    bookings_against,
    candidate_nodes,
    kind_fits,
    usable_rows,
)
from gpuclaim.store import Store

PREEMPT_REQUEST = "preempt"  # a job's stop_requested when it is asked to yield
YIELD_SLACK_S = 15.0  # past grace + kill_grace: the wrapper's poll, its end written, NFS
POLL_S = 0.25

Say = Callable[[str], None]


class HandoverLost(ConflictError):
    """Someone else's hand-over (or booking, or claim) took the GPUs first: look again."""


@dataclass(frozen=True)
class Handover:
    """Where a claim fits once ``victims`` yield: ``rows`` are the GPUs it gets (free ones
    and the victims')."""

    node: str
    rows: tuple[GpuRow, ...]
    victims: tuple[Claim, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(sorted(r.index or 0 for r in self.rows))

    @property
    def labels(self) -> tuple[str, ...]:
        """Its GPUs' labels (``0``, ``0/1``), in order."""
        return tuple(r.label for r in sorted(self.rows, key=lambda r: r.order))


def yieldable(row: GpuRow, req: ClaimRequest) -> bool:
    """Held by a preemptible job that ``req`` may preempt (preemptible work preempts nobody)."""
    c = row.claim
    return (
        not req.preemptible
        and row.state == GpuState.CLAIMED
        and c is not None
        and c.preemptible
        and c.job is not None
    )


def find_handover(
    config: Config, view: ClusterView, req: ClaimRequest, duration: float
) -> Optional[Handover]:
    """The hand-over that makes ``req`` fit, preempting the fewest jobs (the most recently
    started first); None when even that would not (or ``req`` may preempt nobody)."""
    if req.preemptible or req.adopt:
        return None
    if req.exact:
        return _exact(view, req, duration)
    now = view.snapshot.now
    until = now + duration
    against = bookings_against(req, view.snapshot.bookings)
    best: Optional[tuple[tuple[int, int], Handover]] = None
    for order, node in enumerate(n.name for n in candidate_nodes(config, req)):
        if node in view.unreachable or node in view.drains:
            continue
        free = usable_rows(view, node, req, until)
        need = req.count - len(free)
        if need <= 0:
            continue
        held: dict[str, list[GpuRow]] = {}
        for r in view.gpus_of(node):
            if not kind_fits(r, req):
                continue
            if yieldable(r, req) and blocking(against, r.uuid or "", req.user, now, until) is None:
                assert r.claim is not None
                held.setdefault(r.claim.id, []).append(r)
        victims = _fewest_newest(list(held.values()), need)
        if victims is None:
            continue
        got = [r for rows in victims for r in sorted(rows, key=lambda r: r.order)]
        chosen = tuple(rows[0].claim for rows in victims if rows[0].claim is not None)
        handover = Handover(node, tuple(free) + tuple(got[:need]), chosen)
        key = (len(chosen), order)
        if best is None or key < best[0]:
            best = (key, handover)
    return best[1] if best else None


def _since(rows: list[GpuRow]) -> float:
    return rows[0].claim.since if rows[0].claim is not None else 0.0


MAX_COMBINATIONS = 5000  # victims on one node to weigh every set of; past it, a greedy pick


def _fewest_newest(held: list[list[GpuRow]], need: int) -> Optional[list[list[GpuRow]]]:
    """The victims (each a job's rows) that free ``need`` GPUs: the fewest jobs; among as
    few, the most recently started (the oldest of them as young as can be), then the fewest
    GPUs freed beyond the need. None if all of them together free too few."""
    if sum(len(rows) for rows in held) < need:
        return None
    newest_first = sorted(held, key=lambda rs: -_since(rs))
    for k in range(1, len(held) + 1):
        if math.comb(len(held), k) > MAX_COMBINATIONS:
            break
        fits = [c for c in itertools.combinations(newest_first, k) if _freed(c) >= need]
        if fits:
            return list(min(fits, key=lambda c: (-min(_since(rs) for rs in c), _freed(c))))
    chosen: list[list[GpuRow]] = []  # many small jobs: the newest first until enough
    for rows in newest_first:
        chosen.append(rows)
        if _freed(chosen) >= need:
            return chosen
    return None


def _freed(victims: Iterable[list[GpuRow]]) -> int:
    return sum(len(rows) for rows in victims)


def _exact(view: ClusterView, req: ClaimRequest, duration: float) -> Optional[Handover]:
    node, indices = req.exact[0]
    if node in view.unreachable or node in view.drains:
        return None
    now = view.snapshot.now
    until = now + duration
    against = bookings_against(req, view.snapshot.bookings)
    by_index = {r.label: r for r in view.gpus_of(node)}
    usable = {r.label for r in usable_rows(view, node, req, until)}
    rows: list[GpuRow] = []
    victims: dict[str, Claim] = {}
    for index in map(str, indices):
        row = by_index.get(index)
        if row is None:
            return None
        if yieldable(row, req):
            if blocking(against, row.uuid or "", req.user, now, until) is not None:
                return None
            assert row.claim is not None
            victims[row.claim.id] = row.claim
        elif index not in usable:
            return None
        rows.append(row)
    if not victims:
        return None
    return Handover(node, tuple(rows), tuple(victims.values()))


def find_gang_handover(
    config: Config,
    view: ClusterView,
    req: ClaimRequest,
    nodes_wanted: int,
    candidates: Sequence[str],
    duration: float,
) -> Optional[list[Handover]]:
    """Where a gang of ``nodes_wanted`` nodes with ``req.count`` GPUs each fits once
    preemptible jobs yield: one hand-over per node (nobody to yield where its GPUs are free,
    but booked all the same, so the gang starts whole), the fewest jobs preempted. None when
    even that would not fit, or when nobody need yield."""
    if req.preemptible or req.adopt or nodes_wanted < 2:
        return None
    until = view.snapshot.now + duration
    options: list[tuple[int, int, Handover]] = []
    for order, node in enumerate(candidates):
        if node in view.unreachable or node in view.drains:
            continue
        free = sorted(usable_rows(view, node, req, until), key=lambda r: r.order)
        if len(free) >= req.count:
            options.append((0, order, Handover(node, tuple(free[: req.count]), ())))
            continue
        one = find_handover(config, view, dataclasses.replace(req, node=node), duration)
        if one is not None and one.node == node:
            options.append((len(one.victims), order, one))
    if len(options) < nodes_wanted:
        return None
    chosen = [h for _, _, h in sorted(options, key=lambda o: o[:2])[:nodes_wanted]]
    return chosen if any(h.victims for h in chosen) else None


def hand_over(
    config: Config, store: Store, req: ClaimRequest, handover: Handover, say: Say
) -> Booking:
    """Book ``handover``'s GPUs for ``req.user``, ask its victims to yield and wait until their
    claims are gone; the booking is the caller's to drop once it claimed. ConflictError: the
    GPUs went to someone else first (HandoverLost), or the jobs did not yield in time."""
    return gang_hand_over(config, store, req, [handover], say)[0]


def gang_hand_over(
    config: Config, store: Store, req: ClaimRequest, handovers: Sequence[Handover], say: Say
) -> list[Booking]:
    """``hand_over`` on every node of a gang at once: all booked, then all asked, then
    waited for together; the bookings are the caller's to drop once it claimed."""
    bookings, who = begin_gang_handover(config, store, req, handovers)
    try:
        grace = format_duration(config.queue.preempt_grace_s)
        where = "; ".join(
            f"{h.node} GPU {','.join(_victim_indices(h))}" for h in handovers if h.victims
        )
        say(f"waiting up to {grace} for {who} to yield {where}")
        end = min(b.end for b in bookings)
        late = f"{who} did not yield within {end - bookings[0].start:.0f}s"
        _wait_until_gone(store, [c for h in handovers for c in h.victims], end, late)
    except BaseException:  # Ctrl-C too: the GPUs go back at once, not when the bookings end
        drop_bookings(store, bookings)
        raise
    return bookings


def begin_handover(
    config: Config, store: Store, req: ClaimRequest, handover: Handover
) -> tuple[Booking, str]:
    """Book ``handover``'s GPUs for ``req.user`` for as long as yielding may take, and ask
    its victims to yield; the booking and who yields ("alice's scav[3]"). HandoverLost: the
    GPUs went to someone else first."""
    bookings, who = begin_gang_handover(config, store, req, [handover])
    return bookings[0], who


def begin_gang_handover(
    config: Config, store: Store, req: ClaimRequest, handovers: Sequence[Handover]
) -> tuple[list[Booking], str]:
    """Book every hand-over's GPUs (a gang's nodes, free ones too) for ``req.user``, all or
    none, and only then ask the victims to yield: a claimer that takes one node's GPUs first
    makes this drop the bookings it took with nobody asked (no job yields for a gang that
    cannot start). The bookings and who yields. HandoverLost: someone else got there first."""
    budget = config.queue.preempt_grace_s + config.limits.kill_grace_s + YIELD_SLACK_S
    now = store.now()
    victims = [c for h in handovers for c in h.victims]
    jobs = {c.id: store.load_job(job_id=c.job or "") for c in victims}
    who = _names(victims, jobs)
    bookings: list[Booking] = []
    try:
        for handover in handovers:
            bookings.append(_book(store, req, handover, now, now + budget, who))
        deadline = now + config.queue.preempt_grace_s
        asked: set[str] = set()
        for claim in victims:
            if claim.job not in asked:  # a gang's ranks yield as their one job
                asked.add(claim.job or claim.id)
                _ask_to_yield(store, claim, jobs.get(claim.id), req.user, deadline, now)
    except BaseException:
        drop_bookings(store, bookings)
        raise
    return bookings, who


def _book(
    store: Store, req: ClaimRequest, handover: Handover, now: float, end: float, who: str
) -> Booking:
    booking = Booking(
        id=new_booking_id(),
        user=req.user,
        node=handover.node,
        gpus=tuple(ClaimedGpu(r.uuid or "", r.index or 0, r.mig) for r in handover.rows),
        start=now,
        end=end,
        note=f"hand-over: {who} yield to {req.user}",
        created=now,
        host=this_host(),
        used=now,  # its owner is here: never a no-show
        handover=True,
    )
    try:
        store.book(booking)
    except ConflictError as exc:
        raise HandoverLost(f"another claim got there first: {exc.message}") from None
    return booking


def drop_bookings(store: Store, bookings: Iterable[Booking]) -> None:
    """Hand-overs done with (claimed, or given up): their GPUs go back at once."""
    for booking in bookings:
        with contextlib.suppress(GpuclaimError):
            store.drop_booking(booking.id)


def yielding_to(bookings: Sequence[Booking], user: str, nodes: Sequence[str]) -> Optional[Booking]:
    """A hand-over under way for ``user`` on one of ``nodes`` (a queued job's, from a pass)."""
    return next((b for b in bookings if b.handover and b.user == user and b.node in nodes), None)


def end_handovers(store: Store, user: str, uuids: Sequence[str]) -> None:
    """``user`` now holds these GPUs: the hand-overs that kept them are done."""
    done = [b for b in store.bookings() if b.handover and b.user == user and b.shares_gpus(uuids)]
    drop_bookings(store, done)


def _names(victims: Sequence[Claim], jobs: dict[str, Optional[Job]]) -> str:
    names: list[str] = []
    for c in victims:
        job = jobs.get(c.id)
        name = f"{c.user}'s {job.name if job else c.job}"
        if name not in names:  # a gang's ranks on several nodes: one job
            names.append(name)
    return ", ".join(names)


def _victim_indices(handover: Handover) -> list[str]:
    ids = {c.id for c in handover.victims}
    held = [r for r in handover.rows if r.claim is not None and r.claim.id in ids]
    return [r.label for r in sorted(held, key=lambda r: r.order)]


def _ask_to_yield(
    store: Store, claim: Claim, job: Optional[Job], by: str, deadline: float, now: float
) -> None:
    """Tell the job's wrappers to yield by ``deadline`` (they read it within a second), and
    log it once: the Slack line, the accounting. A job already stopping is left to stop."""
    if job is None or job.stop_requested or not started(job.state):
        return
    store.update_job(
        job_id=job.id,
        changes={
            "stop_requested": PREEMPT_REQUEST,
            "preempted_by": by,
            "preempt_deadline": iso(deadline),
        },
        only_from=[job.state],
    )
    event = claim_event(EventType.PREEMPT, claim, now, by=by)
    extra = {"job": job.name, "job_id": job.id, "requeue": job.requeue}
    store.append_event(dataclasses.replace(event, extra=extra))


def _wait_until_gone(store: Store, victims: Sequence[Claim], until: float, late: str) -> None:
    ids = {c.id for c in victims}
    while True:
        try:
            snap = store.snapshot()
        except StoreError:
            snap = None  # a storage hiccup: look again
        if snap is not None:
            held = [
                cid
                for cid in ids
                if cid in snap.claims and snap.claims[cid].state == GpuState.CLAIMED
            ]
            if not held:
                return
            if snap.now > until:
                raise ConflictError(
                    late, hint="their wrappers may be gone: 'gpuclaim gc' collects lost jobs"
                )
        time.sleep(POLL_S)
