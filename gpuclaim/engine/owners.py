"""A job runs only as the account that submitted it: what a dispatcher does with a job that
is not its account's (leaves it to the owner's keeper, and says so), and with one its
account's spec does not vouch for (refuses it, and logs that).

Standard library only: wrappers and keepers dispatch from the nodes."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from gpuclaim.core.accounts import Account, keeper_lock, owner_name, runs_as
from gpuclaim.core.errors import ConflictError
from gpuclaim.core.events import job_event
from gpuclaim.core.model import EventType, Job, iso
from gpuclaim.core.states import JobState, ReasonCode
from gpuclaim.engine.queue_reasons import Reason
from gpuclaim.store import Store


def store_account(store: Store) -> Account:
    """The account this process writes the store as: the one whose jobs it may start."""
    return Account.from_dict(store.whoami())


def check_own(store: Store, job: Job, action: str, hint: str = "") -> None:
    """A job another account owns cannot be acted on as one's own: a name is only shown
    (``GPUCLAIM_USER``), the account is who owns it. ConflictError (exit 3) otherwise."""
    if job.uid is not None and job.uid != store_account(store).uid:
        raise ConflictError(
            f"job {job.name} belongs to the account {owner_name(job)}; only it can {action} it",
            hint=hint,
        )


def keeper_nodes(store: Store, job: Job, nodes: list[str]) -> list[str]:
    """The nodes among ``nodes`` where the job's owner has a live queue keeper."""
    if job.uid is None:
        return []
    return [n for n in nodes if store.lock_held(name=keeper_lock(n, job.uid))]


def owners_turn(job: Job, nodes: list[str], keepers: list[str]) -> Reason:
    """Why a job that fits waits: only its owner's processes may start it."""
    who = owner_name(job)
    if keepers:
        return Reason(ReasonCode.OWNER, f"{who}'s keeper on {keepers[0]} starts it")
    where = nodes[0] if len(nodes) == 1 else "/".join(nodes[:3])
    return Reason(
        ReasonCode.OWNER,
        f"waits for {who}'s keeper on {where}; {who}'s next gpuclaim command starts it",
    )


def refuse(store: Store, job: Job, why: str, by: Account, entry: Optional[str] = None) -> bool:
    """A job this account must not run (its spec is missing, not its owner's alone, or says
    otherwise: forged?): it never runs, it ends failed with the reason, the event log and
    ``doctor`` say so. True when this call ended it."""
    now = store.now()
    result = store.update_job(
        job_id=job.id,
        changes={"state": JobState.FAILED, "ended": iso(now), "reason": f"refused: {why}"},
        only_from=[JobState.QUEUED, JobState.STARTING],
    )
    if entry is not None:
        store.finish_queue_entry(name=entry)
    if not result.applied:
        return False
    more = {"account": job.account, "uid": job.uid, "refused_by": by.name, "why": why}
    store.append_event(replace(job_event(EventType.REFUSED, result.job, now, more), by=by.name))
    return True


def not_ours(
    store: Store, job: Job, me: Account, entry: str, allowed: list[str]
) -> tuple[Optional[Reason], bool]:
    """A job that fits but that this account must not start (dispatch): another account's
    waits for its owner's keeper, its GPUs kept from later jobs (True) while that keeper
    lives; one of this account's that its spec does not vouch for is refused (no reason: it
    left the queue)."""
    if job.uid is not None and not runs_as(job, me):
        keepers = keeper_nodes(store, job, allowed)
        reason = owners_turn(job, allowed, keepers)
        if not keepers and store.mark_once(key=f"owner-turn-{job.id}"):
            # told once (Slack, the event log): nobody of the owner's will notice by itself
            event = job_event(EventType.OWNER_TURN, job, store.now())
            store.append_event(replace(event, reason=reason.text, node=allowed[0]))
        return reason, bool(keepers)
    why = store.check_job(job=job) or "it names no account"
    if store.take_queue_entry(name=entry):
        refuse(store, job, why, me, entry)
    return None, False
