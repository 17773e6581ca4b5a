"""The events the accounting history records, built from a claim or a job in one place."""

from __future__ import annotations

from typing import Any, Optional

from gpuclaim.core.model import Claim, Event, EventType, Job


def claim_event(
    kind: EventType, claim: Claim, ts: float, by: Optional[str] = None, reason: str = ""
) -> Event:
    return Event(
        ts=ts,
        type=kind,
        user=claim.user,
        claim_id=claim.id,
        node=claim.node,
        gpus=tuple(claim.indices),
        gpu_uuids=tuple(claim.uuids),
        since=claim.since,
        expires=claim.expires,
        by=by,
        reason=reason,
        extra={
            **({"note": claim.note} if claim.note else {}),
            **({"preemptible": True} if claim.preemptible else {}),
            **(_share_extra(claim) if claim.shared else {}),
        },
    )


def _share_extra(claim: Claim) -> dict[str, Any]:
    return {"share": round(claim.fraction, 4), "mem_mib": claim.mem_mib}


def event_gpu_weight(event: Event) -> float:
    """GPUs a claim's event stands for: a share's by its part of its GPU (extra "share")."""
    try:
        part = float(event.extra.get("share", 1.0))
    except (TypeError, ValueError):
        part = 1.0
    return len(event.gpus) * min(1.0, max(0.0, part))


def job_event(kind: EventType, job: Job, ts: float, more: Optional[dict[str, Any]] = None) -> Event:
    return Event(
        ts=ts,
        type=kind,
        user=job.user,
        node=job.ranks[0].node if job.ranks else job.node,
        gpus=job.ranks[0].gpus if job.ranks else (),
        since=job.started,
        expires=job.ends,
        reason=job.reason,
        extra={
            "job_id": job.id,
            "job": job.name,
            "state": job.state,
            "exit_code": job.exit_code,
            "nodes": [r.node for r in job.ranks],
            "gpus_total": sum(len(r.gpus) for r in job.ranks) or job.gpus_per_node,
            "from_queue": job.from_queue,
            "array": job.array.to_dict() if job.array else None,
            **(more or {}),
        },
    )
