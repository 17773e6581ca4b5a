"""Which Unix account a process runs as, and what of a job its owner's account vouches for.

A job belongs to the account that submitted it (uid and login name where the store was
written), not to its ``user`` field: the store is group-writable, so anyone in the group can
write a record that names anyone. What runs is proven by a file only the owner can have
written (``store/owners.py``); this module says who "the owner" and "what runs" are.

Standard library only: wrappers and keepers ask it on the nodes.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from gpuclaim.core.model import Job


@dataclass(frozen=True)
class Account:
    """A Unix account: its uid (what file ownership proves) and its login name (shown)."""

    uid: int
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "name": self.name}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Account:
        return cls(int(d["uid"]), str(d["name"]))


@functools.cache  # a process's uid does not change under gpuclaim
def this_account() -> Account:
    uid = os.getuid()
    return Account(uid, account_name(uid))


def account_name(uid: int) -> str:
    import pwd  # here: a look asks no account

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (containers, NFS uids unknown here)
        return f"uid{uid}"


def owner_name(job: Job) -> str:
    """Who the job's account is, in words: its login name, else its uid, else its user."""
    if job.account:
        return job.account
    return f"uid{job.uid}" if job.uid is not None else job.user


def runs_as(job: Job, account: Account) -> bool:
    """May this account start, restart or requeue the job's command? Only its owner's."""
    return job.uid is not None and job.uid == account.uid


# What of a job decides the command that runs, as whom, where and with what environment: the
# fields its owner's spec file must match before any process of the owner runs it.
RUN_FIELDS = (
    "name",
    "user",
    "argv",
    "env",
    "kind",
    "workdir",
    "cwd",
    "venv",
    "conda",
    "visible_as",
    "synced_from",
    "preempt_signal",
    "service",
)


def what_runs(job: Job) -> dict[str, Any]:
    """The job's RUN_FIELDS as JSON values (a spec file holds exactly this)."""
    values: dict[str, Any] = {}
    for name in RUN_FIELDS:
        value = getattr(job, name)
        if name == "service":
            value = None if value is None else _service_run(value.to_dict())
        elif name == "env":
            value = dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        values[name] = value
    return values


def _service_run(service: dict[str, Any]) -> dict[str, Any]:
    """A service's spec less its port: ``auto`` becomes a number after the spec is written."""
    return {k: v for k, v in service.items() if k != "port"}


def first_difference(spec: dict[str, Any], job: Job) -> Optional[str]:
    """The first RUN_FIELD where the job differs from its owner's spec; None if none does."""
    runs = what_runs(job)
    for name in RUN_FIELDS:
        if spec.get(name) != runs[name]:
            return name
    return None


def keeper_lock(node: str, uid: int) -> str:
    """The store lock an account's queue keeper on a node holds while it lives: one keeper
    per node and account, since each account starts only its own jobs."""
    return f"queue-keeper-{node}-{uid}"
