"""What the board's keys do, through the same core calls as the CLI. Blocking: the app runs
each in a worker thread. Errors are the core's ``GpuclaimError``, shown as one line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from gpuclaim.board.data import BoardData
from gpuclaim.board.services import BoardServices
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.identity import clean_note as core_clean_note
from gpuclaim.core.model import Claim, Job
from gpuclaim.engine.claims import claim_gpus, release_claims
from gpuclaim.engine.cluster import GpuRow
from gpuclaim.engine.dispatch import dispatch_queue
from gpuclaim.engine.jobs import kill_job
from gpuclaim.engine.placement import ClaimRequest


@dataclass(frozen=True)
class ClaimForm:
    """What the claim dialog asks: how many, where, how long, what for."""

    count: int
    node: Optional[str]
    duration_s: float
    note: str


def clean_note(note: str) -> str:
    """The core's note rule, worded for the dialog."""
    return core_clean_note(note, "the note")


def claim(services: BoardServices, form: ClaimForm) -> Claim:
    """Claim GPUs exactly as ``gpuclaim claim -n N [--node] --time --note`` does."""
    request = ClaimRequest(
        user=services.user,
        count=form.count,
        node=form.node,
        duration_s=form.duration_s,
        note=clean_note(form.note),
    )
    return claim_gpus(services.config, services.store, request, services.prober)


def claim_message(claim: Claim) -> str:
    gpus = ",".join(claim.labels)
    length = format_duration(round((claim.expires - claim.since) / 60) * 60)
    return (
        f"Claimed {claim.node} GPU{'s' if len(claim.gpus) > 1 else ''} {gpus} for {length} "
        f"(claim {claim.id}).\nexport CUDA_VISIBLE_DEVICES={claim.visible}"
    )


def release(services: BoardServices, claim_ids: Sequence[str]) -> list[Claim]:
    """Release one's own claims, then start queued jobs the freed GPUs fit (as the CLI)."""
    released = release_claims(services.config, services.store, services.user, claim_ids)
    start_queued(services)
    return released


def kill(services: BoardServices, job: Job) -> Job:
    """Stop one's own job on all its nodes (TERM, then KILL), waiting like ``gpuclaim kill``."""
    wait_s = services.config.limits.kill_grace_s + 15
    stopped = kill_job(
        services.config, services.store, services.user, job.id, services.ops, wait_s=wait_s
    )
    start_queued(services)
    return stopped


def start_queued(services: BoardServices) -> None:
    """Any call that frees GPUs starts the queued jobs that now fit: no daemon needed."""
    if services.store.queue_entries():
        dispatch_queue(services.config, services.store, services.prober, services.ops)


def read_log(services: BoardServices, job: Job, offset: Optional[int]) -> tuple[str, int]:
    """A job's log (first rank): its last lines when ``offset`` is None, else what follows."""
    rank = job.ranks[0] if job.ranks else None
    if rank is None or not rank.log:
        raise GpuclaimError(f"job {job.name} has no log yet ({job.state})")
    node = services.config.node(rank.node)
    if offset is None:
        chunk = services.ops.read_log(node, rank.log, tail=services.options.log_lines)
    else:
        chunk = services.ops.read_log(node, rank.log, offset=offset)
    return str(chunk["data"]), int(chunk["offset"])


def own_claims(rows: Sequence[GpuRow], user: str) -> list[Claim]:
    """The distinct claims of ``user`` among ``rows``."""
    seen: dict[str, Claim] = {}
    for row in rows:
        if row.claim is not None and row.claim.user == user:
            seen.setdefault(row.claim.id, row.claim)
    return list(seen.values())


def job_of(data: BoardData, rows: Sequence[GpuRow]) -> Optional[Job]:
    """The active job running on these rows' claims, if any."""
    for row in rows:
        if row.claim is not None and row.claim.job and row.claim.job in data.jobs:
            return data.jobs[row.claim.job]
    return None
