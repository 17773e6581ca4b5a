"""A rank's end and a job's (engine/job_records.py) against a temporary store: the claim given
back, the last rank deciding the job's state and exit code, the one job-end event; and how
jobs are found, queued and shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuclaim.core.errors import GpuclaimError, IllegalTransition, StoreError
from gpuclaim.core.model import Job, JobRank
from gpuclaim.engine.job_records import (
    _job_outcome,
    find_job,
    finish_rank,
    load_jobs,
    observed_state,
    reload_job,
)
from gpuclaim.store import ClaimStatus, ClaimStore
from tests.unit.job_factory import add_job, hold, new_store


def _events(store: ClaimStore, kind: str) -> list:
    return [e for e in store.read_events()[0] if e.type == kind]


def test_the_only_rank_succeeding_ends_the_job_and_gives_its_gpu_back(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j1", claimed=True)
    claim_id = job.ranks[0].claim_id
    assert claim_id in store.snapshot().claims
    store.beat(claim_id=claim_id, interval=10)

    final = finish_rank(store, job, 0, "succeeded", 0, "why not", log_tail="last lines")

    assert final is not None
    assert (final.state, final.exit_code, final.reason) == ("succeeded", 0, "")
    assert final.ended is not None and final.ranks[0].ended == final.ended
    snap = store.snapshot()
    assert claim_id not in snap.claims and claim_id not in snap.beats
    [release] = _events(store, "release")
    assert release.claim_id == claim_id
    [end] = _events(store, "job-end")
    assert end.extra["job_id"] == "j1" and end.extra["state"] == "succeeded"
    assert "log_tail" not in end.extra  # a success posts no log


def test_a_failed_rank_keeps_its_exit_code_reason_and_log_tail(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j1", claimed=True)
    final = finish_rank(store, job, 0, "failed", 3, "exit code 3", log_tail="Traceback ...")
    assert final is not None
    assert (final.state, final.exit_code, final.reason) == ("failed", 3, "exit code 3")
    [end] = _events(store, "job-end")
    assert end.extra["log_tail"] == "Traceback ..." and end.extra["exit_code"] == 3
    assert reload_job(store, job).state == "failed"


def test_the_last_of_two_ranks_decides_and_the_first_only_frees_its_own_claim(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j2", ranks=2, claimed=True)
    first, second = (r.claim_id for r in job.ranks)

    assert finish_rank(store, job, 1, "succeeded", 0, "") is None
    after_one = reload_job(store, job)
    assert after_one.state == "running" and after_one.ranks[1].state == "succeeded"
    assert set(store.snapshot().claims) == {first}
    assert not _events(store, "job-end")

    final = finish_rank(store, after_one, 0, "succeeded", 0, "")
    assert final is not None and final.state == "succeeded"
    assert store.snapshot().claims == {}
    assert len(_events(store, "job-end")) == 1 and len(_events(store, "release")) == 2
    assert second not in store.snapshot().claims


@pytest.mark.parametrize("state", ["failed", "timeout"])
def test_a_rank_that_fails_asks_the_other_ranks_to_stop(tmp_path: Path, state: str) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j2", ranks=2)
    assert finish_rank(store, job, 1, state, 1, "") is None
    assert reload_job(store, job).stop_requested == f"rank 1 {state}"


def test_a_succeeding_rank_asks_nobody_to_stop_and_a_kill_is_not_overwritten(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j2", ranks=2)
    finish_rank(store, job, 1, "succeeded", 0, "")
    assert reload_job(store, job).stop_requested is None
    store.update_job(job_id="j2", changes={"stop_requested": "kill"})
    finish_rank(store, job, 0, "failed", 1, "")
    assert reload_job(store, job).stop_requested == "kill"


def test_a_job_made_final_meanwhile_is_not_ended_twice(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j1", claimed=True)
    store.update_job(job_id="j1", changes={"state": "killed", "exit_code": 143})
    assert finish_rank(store, job, 0, "killed", 143, "killed") is None
    record = reload_job(store, job)
    assert (record.state, record.exit_code) == ("killed", 143)
    assert not _events(store, "job-end")
    assert store.snapshot().claims == {}  # its claim is given back all the same


def test_a_claim_released_after_it_expired_is_accounted_until_its_expiry(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    now = store.now()
    claim = hold(store, "node0", [("GPU-x", 0)], job="j1", since=now - 7200, expires_in=3600)
    job = add_job(store, "j1")
    job = job.with_(ranks=(JobRank(0, "node0", (0,), ("GPU-x",), claim.id, "running"),))
    finish_rank(store, job, 0, "timeout", 124, "time limit")
    [release] = _events(store, "release")
    assert release.ts == pytest.approx(claim.expires, abs=0.01)


def _ranks(*ends: tuple[str, int | None]) -> tuple[JobRank, ...]:
    return tuple(JobRank(i, f"n{i}", state=s, exit_code=c) for i, (s, c) in enumerate(ends))


@pytest.mark.parametrize(
    "ends, stop, expected",
    [
        ([("succeeded", 0), ("succeeded", 0)], None, ("succeeded", 0)),
        ([("succeeded", 0), ("failed", 2)], "rank 1 failed", ("failed", 2)),
        ([("failed", 1), ("timeout", 124)], "rank 1 timeout", ("timeout", 124)),
        ([("timeout", 124), ("killed", 143)], "kill", ("timeout", 124)),  # timeout wins
        ([("killed", 143), ("succeeded", 0)], "kill", ("killed", 143)),
        ([("lost", None), ("failed", 1)], None, ("failed", 1)),  # failed before lost
        ([("killed", 143), ("lost", None)], "rank 1 lost", ("lost", None)),  # lost before killed
        ([("failed", 1), ("killed", 143)], "rank 0 failed", ("failed", 1)),
        ([("failed", 7), ("failed", 9)], None, ("failed", 7)),  # the lowest rank's code
        ([("succeeded", 0), ("killed", 137)], None, ("killed", 137)),
    ],
)
def test_the_jobs_outcome_from_its_ranks(
    ends: list[tuple[str, int | None]], stop: str | None, expected: tuple[str, int | None]
) -> None:
    job = Job("j", "j", "ann", ("x",), "running", 0.0, 60.0, ranks=_ranks(*ends))
    assert _job_outcome(job.with_(stop_requested=stop)) == expected


def test_observed_state_shows_a_running_job_with_a_lost_claim_as_lost(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j1", claimed=True)
    status = store.snapshot().claims[job.ranks[0].claim_id or ""]
    lost = ClaimStatus(status.claim, "stale", "job lost", status.present)
    expired = ClaimStatus(status.claim, "stale", "expired", status.present)
    assert observed_state(job, {status.claim.id: status}) == "running"
    assert observed_state(job, {status.claim.id: lost}) == "lost"
    assert observed_state(job, {status.claim.id: expired}) == "running"
    assert observed_state(job.with_(state="succeeded"), {status.claim.id: lost}) == "succeeded"


def test_find_job_by_name_prefers_the_active_one_then_the_newest(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    add_job(store, "old", name="train", state="failed", submitted=1000.0)
    add_job(store, "cur", name="train", state="running", submitted=2000.0)
    add_job(store, "new", name="train", state="succeeded", submitted=3000.0)
    add_job(store, "bob", name="train", user="bob", state="running", submitted=4000.0)
    assert find_job(store, "ann", "train").id == "cur"
    assert find_job(store, "ann", "train", active_only=False).id == "new"
    assert find_job(store, "ann", "old").id == "old"  # by id
    with pytest.raises(GpuclaimError) as caught:
        find_job(store, "carol", "train")
    assert "no job 'train' of carol" in str(caught.value)
    assert caught.value.hint == "see 'gpuclaim jobs'"


def test_load_jobs_orders_by_submission_and_skips_a_damaged_record(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    add_job(store, "b", submitted=2000.0)
    add_job(store, "a", submitted=1000.0)
    (store.root / "jobs" / "torn.json").write_text('{"id": "torn", "name": ')
    (store.root / "jobs" / "nosubmit.json").write_text('{"id": "x", "name": "x"}')
    assert [j.id for j in load_jobs(store)] == ["a", "b"]


def test_one_record_that_is_no_job_is_reported_damaged_not_taken_for_missing(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path)
    (store.root / "jobs" / "nosubmit.json").write_text('{"id": "x", "name": "x"}')
    (store.root / "jobs" / "torn.json").write_text('{"id": "torn", "name": ')
    for job_id in ("nosubmit", "torn"):
        with pytest.raises(StoreError, match=rf"job record .*{job_id}\.json is damaged"):
            store.load_job(job_id)
    with pytest.raises(StoreError, match=r"nosubmit\.json is damaged"):
        store.update_job(job_id="nosubmit", changes={"reason": "x"})
    assert store.load_job("gone") is None


def test_the_store_refuses_an_end_overwritten_and_keeps_the_record(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j1", state="succeeded")
    with pytest.raises(IllegalTransition, match="job j1: 'running' may not follow 'succeeded'"):
        store.update_job(job_id=job.id, changes={"state": "running"})
    kept = store.load_job(job_id=job.id)
    assert kept is not None and kept.state == "succeeded"
    with pytest.raises(IllegalTransition, match="rank 0: 'running' may not follow 'succeeded'"):
        store.update_job(job_id=job.id, changes={}, rank=0, rank_changes={"state": "running"})


def test_a_late_wrapper_does_not_rewrite_a_rank_judged_lost_but_gives_its_claim_back(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path)
    job = add_job(store, "j1", ranks=2, claimed=True)
    store.update_job(job_id=job.id, changes={}, rank=0, rank_changes={"state": "lost"})
    assert finish_rank(store, job, 0, "succeeded", 0, "") is None  # rank 1 still runs
    after = reload_job(store, job)
    assert after.ranks[0].state == "lost"  # the first end stands
    assert job.ranks[0].claim_id not in store.snapshot().claims
