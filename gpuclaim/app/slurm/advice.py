"""When SLURM starts to pay for itself: the one-sentence advice that ``gpuclaim status``
and the admin report give once the team has outgrown gpuclaim (many GPUs, many users, or
jobs that waited long in the queue), and the queue waits it is judged by.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from gpuclaim.core.states import JobState

if TYPE_CHECKING:
    from gpuclaim.core.model import Job


ADVICE_GPUS = 16
ADVICE_USERS = 8
LONG_WAIT_S = 3600.0
LONG_WAITS = 3


def slurm_advice(gpus: int, users: int, queue_waits_s: Sequence[float] = ()) -> Optional[str]:
    """One sentence when the team has outgrown gpuclaim (more than 16 GPUs or 8 users, or
    jobs that waited over an hour in the queue, 3 times or more), else None."""
    reasons = []
    if gpus > ADVICE_GPUS:
        reasons.append(f"{gpus} GPUs")
    if users > ADVICE_USERS:
        reasons.append(f"{users} users")
    long_waits = sum(1 for w in queue_waits_s if w >= LONG_WAIT_S)
    if long_waits >= LONG_WAITS:
        reasons.append(f"{long_waits} jobs that waited over an hour")
    if not reasons:
        return None
    return (
        f"With {' and '.join(reasons)}, SLURM now pays for itself: a real queue with fair "
        "share and enforced isolation. `gpuclaim export slurm --out slurm/` writes its "
        "configuration and a MIGRATION.md."
    )


def queue_waits(jobs: Sequence[Job], since: float, now: float) -> list[float]:
    """How long each job submitted since ``since`` waited to start (still waiting: so far)."""
    waits = []
    for j in jobs:
        if j.submitted < since:
            continue
        start = (
            j.started if j.started is not None else (now if j.state == JobState.QUEUED else None)
        )
        if start is not None:
            waits.append(max(0.0, start - j.submitted))
    return waits
