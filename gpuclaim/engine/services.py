"""Services (``gpuclaim serve``) from the laptop's side: the port on the node they run on at
submit, refused when another service or another process has it; and a service whose node
rebooted started again by the next look there. Keeping one up is its wrapper's job
(``node/keep_up.py``, ``core/service.py``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional

from gpuclaim.core.accounts import Account, runs_as
from gpuclaim.core.config import Config
from gpuclaim.core.errors import GpuclaimError, NameInUseError
from gpuclaim.core.events import claim_event
from gpuclaim.core.identity import this_host
from gpuclaim.core.inventory import NodeInventory
from gpuclaim.core.liveness import wrapper_gone
from gpuclaim.core.model import Claim, Event, EventType, Job, JobKind
from gpuclaim.core.states import ACTIVE_JOB_STATES, SERVICE_DOWN, ServiceHealth, ended
from gpuclaim.engine.cluster import ClusterView
from gpuclaim.store import ClaimStatus, Store
from gpuclaim.store.files import JOB_START_GRACE_S

if TYPE_CHECKING:  # every look imports this module: launch, claims, job records where used
    from gpuclaim.engine.launch import NodeOps

AUTO_PORT = 0  # serve --port auto: a free port of the node, chosen at submit


def service_on(store: Store, node: str, port: int, other_than: str = "") -> Optional[Job]:
    """The live service that has ``port`` on ``node`` (running, or queued there)."""
    from gpuclaim.engine.job_records import load_jobs  # here: only serve asks

    for j in load_jobs(store):
        if j.id == other_than or j.state not in ACTIVE_JOB_STATES or j.service is None:
            continue
        where = j.ranks[0].node if j.ranks else j.node
        if where == node and j.service.port == port:
            return j
    return None


def settle_port(store: Store, ops: NodeOps, job: Job, node: str) -> Job:
    """The service's port on ``node``: a free one for ``auto``, else the one asked if nobody
    has it. NameInUseError (exit 5) names who has it."""
    spec = job.service
    if spec is None or job.kind != JobKind.SERVICE:
        return job
    node_cfg = ops.config.node(node)
    if spec.port == AUTO_PORT:
        for _ in range(5):  # a port a restarting service (not listening now) has: another
            port = int(ops.facts(node_cfg)["port"])
            if service_on(store, node, port, job.id) is None:
                break
    else:
        port = spec.port
        holder = service_on(store, node, port, job.id)
        if holder is not None:
            raise NameInUseError(
                f"port {port} on {node} is served by {holder.user}'s {holder.name} "
                "(gpuclaim serve)",
                hint="pick another --port, or --port auto",
            )
        if ops.facts(node_cfg, port=port)["port_in_use"]:
            raise NameInUseError(
                f"port {port} on {node} is in use by another process there",
                hint="pick another --port, or --port auto",
            )
    return job.with_(service=replace(spec, port=port), port=port)


REVIVE_TURN_S = 90.0  # one look starts a down service; if that start fails, a look after this


@dataclass
class Revival:
    """What a look did for the services it found down on nodes that answered."""

    started: list[tuple[Job, str]] = field(default_factory=list)  # and why it was down
    failed: list[tuple[Job, str]] = field(default_factory=list)  # and why it could not start
    # another account's, down: only its owner's processes start it (and why it is down)
    owners: list[tuple[Job, str]] = field(default_factory=list)


def services_down(view: ClusterView) -> bool:
    """Whether the look found a service down: only then has ``revive_services`` work (and a
    look needs the job operations it starts one with)."""
    return any(status.reason == SERVICE_DOWN for status in view.snapshot.claims.values())


def revive_services(config: Config, store: Store, view: ClusterView, ops: NodeOps) -> Revival:
    """Services whose node answers but whose wrapper is gone (the node rebooted, its tmux
    server was killed) start again on their own GPUs, one look per service winning the turn.
    One that should not run any more (killed, ended, its record gone) lets its GPUs go.
    Another account's service is left to its owner (``revival.owners``): no look takes the
    turn in the owner's stead, so the owner's next look starts it, as the owner."""
    revival = Revival()
    me: Optional[Account] = None
    for status in view.snapshot.claims.values():
        claim = status.claim
        inv = view.inventories.get(claim.node)
        if status.reason != SERVICE_DOWN or inv is None or inv.error or not claim.job:
            continue  # its node is away too: nothing to start it on yet
        job = store.load_job(job_id=claim.job)
        if job is None or job.service is None or job.stop_requested or ended(job.state):
            let_go(store, status, job)
            continue
        cause = _why_down(view, claim)
        if cause is None:
            continue  # only beats missed (the storage stalled?): not proof enough to start twice
        me = me or Account.from_dict(store.whoami())
        if not runs_as(job, me):
            revival.owners.append((job, cause))
            continue
        holder = f"{this_host()}:{os.getpid()}:{time.time():.6f}"
        if store.take_turn(f"revive-{claim.id}", holder, REVIVE_TURN_S):
            error = _start_again(config, store, ops, job, claim, inv, cause)
            if error:
                revival.failed.append((job, error))
            else:
                revival.started.append((job, cause))
    return revival


def _why_down(view: ClusterView, claim: Claim) -> Optional[str]:
    """What the node's answer proves: its wrapper is gone, and why; None when it cannot."""
    beat = view.snapshot.beats.get(claim.id)
    liveness = view.inventories[claim.node].liveness
    if beat is None:  # never beat: its launch died with the `serve` that made it
        return "it never started" if view.snapshot.now - claim.since > JOB_START_GRACE_S else None
    if not wrapper_gone(beat, liveness):
        return None
    if liveness and beat.get("boot_id") != liveness.get("boot_id"):
        return f"{claim.node} rebooted"
    return f"its tmux session on {claim.node} went away"


def _start_again(
    config: Config,
    store: Store,
    ops: NodeOps,
    job: Job,
    claim: Claim,
    inv: NodeInventory,
    cause: str,
) -> str:
    """Launch the service's wrapper again, counted as a restart; the error, or ""."""
    from gpuclaim.engine.launch import rank_spec  # here: only a service to start again

    rank = next((r for r in job.ranks if r.claim_id == claim.id), None)
    if rank is None:
        return "its record names no rank for its claim"
    node = config.node(claim.node)
    seen = {g.uuid: g.index for g in inv.gpus if g.uuid in rank.gpu_uuids}
    changes = {"restarts": job.restarts + 1, "health": ServiceHealth.STARTING.value}
    job = store.update_job(job_id=job.id, changes=changes).job
    try:
        ops.launch(node, rank_spec(config, store, job, rank, node, {}, seen=seen, revived=cause))
    except NameInUseError:
        return ""  # its session runs after all (another look started it a moment ago)
    except GpuclaimError as exc:
        store.update_job(job_id=job.id, changes={"health": ServiceHealth.DOWN.value})
        return exc.message
    store.append_event(
        Event(
            ts=store.now(),
            type=EventType.SERVICE_DOWN,
            user=job.user,
            node=claim.node,
            gpus=tuple(claim.indices),
            reason=cause,
            extra={"job": job.name, "job_id": job.id, "restarts": None},
        )
    )
    return ""


def let_go(store: Store, status: ClaimStatus, job: Optional[Job]) -> None:
    """A service's claim with nothing left to keep up: recorded as lost, its GPUs free."""
    if job is not None and not ended(job.state):
        from gpuclaim.engine.claims import finish_lost_claim  # here: only a claim to let go

        finish_lost_claim(store, status.claim)
        return
    for gpu_uuid in status.present:
        store.remove_gpu(gpu_uuid, status.claim.id)
    store.append_event(claim_event(EventType.REAP, status.claim, store.now(), reason="job lost"))
