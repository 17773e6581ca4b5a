"""Job records and claims written into a temporary store, as launch would have left them, for
the tests of a rank's end, the archive and the idle policy (no node, no wrapper)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from gpuclaim.core.model import ArrayRef, Claim, ClaimedGpu, Job, JobRank
from gpuclaim.store import ClaimStore, new_claim_id

DAY = 86400.0


def new_store(tmp_path: Path) -> ClaimStore:
    """A store made in ``tmp_path`` (its host-local locks there too)."""
    store = ClaimStore(tmp_path / "store", tmp_path / "host-locks")
    store.ensure(create=True)
    return store


def hold(
    store: ClaimStore,
    node: str,
    gpus: list[tuple[str, int]],
    *,
    user: str = "ann",
    job: Optional[str] = None,
    since: Optional[float] = None,
    expires_in: float = 3600.0,
) -> Claim:
    """A claim on ``gpus`` ([(uuid, index)]) of ``node``, published in the store."""
    start = store.now() if since is None else since
    claim = Claim(
        id=new_claim_id(),
        user=user,
        node=node,
        gpus=tuple(ClaimedGpu(u, i) for u, i in gpus),
        since=start,
        expires=start + expires_in,
        job=job,
    )
    store.acquire(claim)
    return claim


def add_job(
    store: ClaimStore,
    job_id: str,
    *,
    name: Optional[str] = None,
    user: str = "ann",
    state: str = "running",
    ranks: int = 1,
    claimed: bool = False,
    submitted: Optional[float] = None,
    ended: Optional[float] = None,
    array: Optional[ArrayRef] = None,
) -> Job:
    """A job record with ``ranks`` ranks on node0, node1, ... (each with a claim when
    ``claimed``); a final ``state`` gets ``ended`` and its ranks the same end."""
    now = time.time()
    final = state not in ("queued", "starting", "running")
    end = (now - 30 if ended is None else ended) if final else None
    rank_list = []
    for r in range(ranks):
        node = f"node{r}"
        uuid = f"GPU-{job_id}-{r}"
        claim = hold(store, node, [(uuid, 0)], user=user, job=job_id) if claimed else None
        rank_list.append(
            JobRank(
                rank=r,
                node=node,
                gpus=(0,),
                gpu_uuids=(uuid,),
                claim_id=claim.id if claim else None,
                state=state if final else "running",
                exit_code=0 if state == "succeeded" else None,
                started=now - 60,
                ended=end,
            )
        )
    job = Job(
        id=job_id,
        name=name or job_id,
        user=user,
        argv=("python", "train.py"),
        state=state,
        submitted=now - 120 if submitted is None else submitted,
        time_limit_s=3600.0,
        ranks=tuple(rank_list),
        started=None if state == "queued" else now - 60,
        ended=end,
        exit_code=0 if state == "succeeded" else None,
        array=array,
    )
    store.create_job(job)
    return job
