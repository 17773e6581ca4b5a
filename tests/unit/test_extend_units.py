"""``extend`` in process: a job's time limit and its claims move together (a service's
``--time`` within max_service_time), all or nothing; a plain claim as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuclaim.core.errors import ConflictError, UsageError
from gpuclaim.core.model import Job, JobKind, iso
from gpuclaim.core.service import ServiceSpec
from gpuclaim.engine.extend import extend_claims
from gpuclaim.engine.job_records import reload_job
from gpuclaim.engine.jobs import RunRequest, submit_job
from tests.unit.fakes import HOUR, Cluster, make_cluster


def _running(c: Cluster, user: str = "ann", time_s: float = HOUR) -> Job:
    req = RunRequest(user=user, argv=("python", "train.py"), name="train", time_s=time_s)
    job = submit_job(c.config, c.store, req, c.prober)
    c.store.update_job(job_id=job.id, changes={"state": "running", "started": iso(c.clock.now)})
    return reload_job(c.store, job)


def _claim_of(c: Cluster, job: Job):
    return c.store.snapshot().claims[job.ranks[0].claim_id or ""].claim


def test_a_jobs_claim_extends_the_job_and_a_name_does_too(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    job = _running(c)
    expires = _claim_of(c, job).expires
    done = extend_claims(c.config, c.store, "ann", [job.ranks[0].claim_id or ""], HOUR)
    assert [j.name for j in done.jobs] == ["train"] and done.jobs[0].time_limit_s == 2 * HOUR
    assert [cl.expires for cl in done.claims] == [expires + HOUR] == [_claim_of(c, job).expires]
    done = extend_claims(c.config, c.store, "ann", ["train"], HOUR)
    assert reload_job(c.store, job).time_limit_s == 3 * HOUR


def test_past_the_limit_says_how_much_may_be_added(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, max_time="4h")
    job = _running(c)
    with pytest.raises(UsageError, match=r"limit is 4h \(you can add up to 3h\)"):
        extend_claims(c.config, c.store, "ann", ["train"], 5 * HOUR)
    assert reload_job(c.store, job).time_limit_s == HOUR


def test_only_ones_own_live_job(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    job = _running(c)
    with pytest.raises(ConflictError, match="belongs to ann"):
        extend_claims(c.config, c.store, "bob", [job.ranks[0].claim_id or ""], HOUR)
    c.end(job)
    with pytest.raises(ConflictError, match="has ended"):
        extend_claims(c.config, c.store, "ann", [job.id], HOUR)


def test_a_booking_after_it_leaves_the_job_as_it_was(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, {"node01": 1})
    job = _running(c)
    c.book("bob", start_in=3 * HOUR, node="node01")
    expires = _claim_of(c, job).expires
    with pytest.raises(ConflictError, match="cannot be extended"):
        extend_claims(c.config, c.store, "ann", ["train"], 4 * HOUR)
    assert reload_job(c.store, job).time_limit_s == HOUR and _claim_of(c, job).expires == expires


def test_a_queued_job_gets_a_longer_limit_and_no_claim(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    job = c.queue("ann", "later")
    done = extend_claims(c.config, c.store, "ann", ["later"], HOUR)
    assert done.claims == [] and reload_job(c.store, job).time_limit_s == 2 * HOUR


def test_a_service_at_the_limit_already_says_so_in_one_line(tmp_path: Path) -> None:
    # serve without --time runs until max_service_time: there is nothing to add
    c = make_cluster(tmp_path)
    req = RunRequest(
        user="ann", argv=("vllm", "serve"), name="llm", kind=JobKind.SERVICE.value,
        service=ServiceSpec(port=8000),
    )  # fmt: skip
    job = submit_job(c.config, c.store, req, c.prober)
    c.store.update_job(job_id=job.id, changes={"state": "running", "started": iso(c.clock.now)})
    with pytest.raises(UsageError, match="already has all the time this cluster allows for a s"):
        extend_claims(c.config, c.store, "ann", ["llm"], HOUR)
