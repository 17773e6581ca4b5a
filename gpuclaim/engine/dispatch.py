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
from gpuclaim.core.model import Job
from gpuclaim.engine.claims import release_claims
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view
from gpuclaim.engine.launch import NodeOps, place_and_claim, start_ranks
from gpuclaim.store import Store


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
    for entry in entries:
        job_id = entry.split("-", 1)[1]
        data = store.load_job_dict(job_id=job_id)
        job = Job.from_dict(data) if data else None
        if job is None or job.state != "queued":
            store.finish_queue_entry(name=entry)
            continue
        allowed = _backfill_nodes(config, view, blocked_heads)
        if allowed is not None and not allowed:
            break
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
