"""``extend``: more time for one's own claims, and for one's own jobs (a service's ``--time``
too): a job's time limit and its claims move together, or its wrapper would stop it at the
old limit while its GPUs stayed held."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import ConflictError, GpuclaimError, UsageError
from gpuclaim.core.events import claim_event
from gpuclaim.core.model import Claim, EventType, Job
from gpuclaim.core.states import GpuState, ended
from gpuclaim.engine.bookings import blocked_message, blocking
from gpuclaim.engine.claims import booked_meanwhile
from gpuclaim.engine.job_records import find_job
from gpuclaim.engine.owners import check_own
from gpuclaim.engine.policy import lab_config
from gpuclaim.store import ClaimStatus, Snapshot, Store


@dataclass
class Extension:
    """What ``extend`` gave more time: claims (a job's among them) and jobs, as they are now."""

    claims: list[Claim] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)


def extend_claims(
    config: Config,
    store: Store,
    user: str,
    targets: Sequence[str],
    extra_s: float,
    extend_all: bool = False,
) -> Extension:
    """Add ``extra_s`` to one's own live claims (or jobs, by name: a claim of a job extends
    the job), keeping each within the cluster's limit."""
    config = lab_config(config, store)
    snap = store.snapshot()
    if extend_all:
        chosen = [s for s in snap.claims.values() if s.claim.user == user]
        if not chosen:
            raise GpuclaimError(f"{user} holds no claims")
        targets = [s.claim.id for s in chosen]
    elif not targets:
        raise UsageError("name a claim id or a job to extend, or --all")
    result = Extension()
    for target in targets:
        status = snap.claims.get(target)
        job_id = status.claim.job if status is not None else None
        if status is None or job_id:
            job = _job_of(store, user, target, job_id)
            if all(j.id != job.id for j in result.jobs):
                result.claims += extend_job(config, store, user, job, extra_s, snap)
                result.jobs.append(store.load_job(job_id=job.id) or job)
            continue
        _check_extendable(status, user)
        _check_limit(config.limits.max_time_s, status.claim, status.claim.expires + extra_s, snap)
        result.claims.append(
            extend_claim(store, snap, status.claim, status.claim.expires + extra_s)
        )
    return result


def extend_job(
    config: Config, store: Store, user: str, job: Job, extra_s: float, snap: Snapshot
) -> list[Claim]:
    """A job's time limit plus ``extra_s``, and each of its claims with it (its wrapper reads
    the new limit within a second). All or nothing: a claim that cannot be extended (a
    booking follows it) leaves the others and the limit as they were."""
    if job.user != user:
        raise ConflictError(f"job {job.name} belongs to {job.user}; only they can extend it")
    check_own(store, job, "extend")
    if ended(job.state):
        raise ConflictError(f"job {job.name} has ended ({job.state}); it cannot be extended")
    service = job.service is not None
    longest = config.limits.max_service_time_s if service else config.limits.max_time_s
    limit = job.time_limit_s + extra_s
    ahead = (job.started + limit - snap.now) if job.started is not None else limit
    if ahead > longest:
        allowed = longest - (ahead - extra_s)
        what = "a service" if service else "a job"
        if allowed <= 60:  # a service without --time already runs until max_service_time
            raise UsageError(
                f"job {job.name} already has all the time this cluster allows for {what} "
                f"({format_duration(longest)}): it cannot be extended"
            )
        raise UsageError(
            f"that would give job {job.name} {format_duration(ahead)} from now; the limit is "
            f"{format_duration(longest)}"
            + (" for a service" if service else "")
            + (f" (you can add up to {format_duration(allowed)})" if allowed > 60 else "")
        )
    done: list[tuple[Claim, Claim]] = []
    try:
        for rank in job.ranks:
            status = snap.claims.get(rank.claim_id or "")
            if status is None:
                continue  # not claimed yet (queued) or given back: the limit is all there is
            _check_extendable(status, user)
            done.append(
                (
                    status.claim,
                    extend_claim(store, snap, status.claim, status.claim.expires + extra_s),
                )
            )
    except GpuclaimError:
        for old, new in done:
            store.rewrite(new, old)
        raise
    store.update_job(job_id=job.id, changes={"time_limit_s": limit})
    return [new for _, new in done]


def extend_claim(store: Store, snap: Snapshot, claim: Claim, new_expiry: float) -> Claim:
    """One claim until ``new_expiry``, unless a booking of another's starts before then."""
    _check_bookings_allow(snap.bookings, claim, snap.now, new_expiry)
    new = claim.with_expiry(new_expiry)
    store.rewrite(claim, new)
    clash = booked_meanwhile(store, new)
    if clash is not None:  # a booking made while we extended: it stands, we give way
        store.rewrite(new, claim)
        raise ConflictError(blocked_message(clash, claim.labels, snap.now, new_expiry))
    store.append_event(claim_event(EventType.EXTEND, new, store.now()))
    return new


def _job_of(store: Store, user: str, target: str, job_id: Optional[str]) -> Job:
    if job_id is not None:
        job = store.load_job(job_id=job_id)
        if job is None:
            raise GpuclaimError(f"claim {target} names job {job_id}, which has no record")
        return job
    try:
        return find_job(store, user, target)
    except GpuclaimError:
        raise GpuclaimError(
            f"no claim or job {target!r} of {user}", hint="see 'gpuclaim status' or 'gpuclaim jobs'"
        ) from None


def _check_extendable(status: ClaimStatus, user: str) -> None:
    claim = status.claim
    if claim.user != user:
        raise ConflictError(f"claim {claim.id} belongs to {claim.user}; only they can extend it")
    if status.state == GpuState.STALE:
        raise ConflictError(
            f"claim {claim.id} is {status.reason}; it can no longer be extended",
            hint="claim the GPUs again",
        )


def _check_limit(longest: float, claim: Claim, new_expiry: float, snap: Snapshot) -> None:
    ahead = new_expiry - snap.now
    if ahead > longest:
        allowed = longest - (claim.expires - snap.now)
        raise UsageError(
            f"that would hold claim {claim.id} for {format_duration(ahead)} from now; the "
            f"limit is {format_duration(longest)}"
            + (f" (you can add up to {format_duration(allowed)})" if allowed > 60 else "")
        )


def _check_bookings_allow(
    bookings: Sequence[Booking], claim: Claim, now: float, until: float
) -> None:
    for uuid in claim.uuids:
        b = blocking(bookings, uuid, claim.user, now, until)
        if b is not None:
            shared = [g.index for g in claim.gpus if g.uuid in b.uuids]
            room = b.start - claim.expires
            hint = f"you can add up to {format_duration(room)}" if room >= 60 else None
            raise ConflictError(
                f"claim {claim.id} cannot be extended: {blocked_message(b, shared, now, until)}",
                hint=hint,
            )
