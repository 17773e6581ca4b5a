"""``run --after`` / ``--after-any``: resolved once at submit, judged at each dispatch
(engine/depends.py), against a real store on the test's clock."""

from __future__ import annotations

import pytest

from gpuclaim.core.errors import UsageError
from gpuclaim.core.model import Dependency
from gpuclaim.engine.depends import BROKEN, READY, WAITING, judge, resolve_after

from .fakes import Cluster, make_cluster

FAILED_ARRAY = {"succeeded": False, "states": {"succeeded": 2, "failed": 3, "killed": 1}}


@pytest.fixture
def c(tmp_path) -> Cluster:
    return make_cluster(tmp_path)


def waiter(c: Cluster, *deps: Dependency):
    return c.queue("alice", "train", after=deps)


# -- resolving at submit ----------------------------------------------------------------------


def test_nothing_to_wait_for_resolves_to_nothing(c):
    assert resolve_after(c.store, "alice", (), (), "train") == ()


def test_a_name_resolves_to_the_users_newest_job_of_that_name(c):
    c.record("alice", "prep", "succeeded")
    newer = c.record("alice", "prep", "running")
    c.record("bob", "prep", "running")  # newer still, but bob's
    assert resolve_after(c.store, "alice", ["prep"], [], "train") == (
        Dependency(newer.id, "prep", array=False, any=False),
    )


def test_another_users_job_is_found_by_its_id_only(c):
    theirs = c.record("bob", "prep", "running")
    with pytest.raises(UsageError, match="no job or array named 'prep'"):
        resolve_after(c.store, "alice", ["prep"], [], "train")
    (dep,) = resolve_after(c.store, "alice", [theirs.id], [], "train")
    assert dep.id == theirs.id and dep.name == "prep"


def test_an_unknown_name_is_a_usage_error_with_the_hint(c):
    with pytest.raises(UsageError) as err:
        resolve_after(c.store, "alice", [], ["nothere"], "train")
    assert err.value.message.startswith("--after-any nothere:")
    assert "jobs --all" in (err.value.hint or "")


def test_waiting_for_itself_is_refused_as_a_cycle(c):
    c.record("alice", "train", "succeeded")  # even an old job of that name
    with pytest.raises(UsageError, match="cannot wait for itself"):
        resolve_after(c.store, "alice", ["train"], [], "train")


@pytest.mark.parametrize("state", ["failed", "killed", "timeout", "lost", "cancelled"])
def test_after_a_job_that_already_ended_badly_would_never_start(c, state):
    c.record("alice", "prep", state)
    with pytest.raises(UsageError, match=rf"it already ended \({state}\)") as err:
        resolve_after(c.store, "alice", ["prep"], [], "train")
    assert "--after-any" in (err.value.hint or "")
    (dep,) = resolve_after(c.store, "alice", [], ["prep"], "train")
    assert dep.any is True


def test_after_a_job_that_already_succeeded_is_accepted(c):
    done = c.record("alice", "prep", "succeeded")
    assert resolve_after(c.store, "alice", ["prep"], [], "train")[0].id == done.id


def test_a_name_given_twice_is_one_dependency(c):
    c.record("alice", "prep", "running")
    assert len(resolve_after(c.store, "alice", ["prep", "prep"], [], "train")) == 1


def test_a_name_that_is_an_array_resolves_to_the_array(c):
    array_id = c.array("alice", "pre", 4)
    assert resolve_after(c.store, "alice", ["pre"], [], "train") == (
        Dependency(array_id, "pre", array=True, any=False),
    )


def test_an_array_that_ended_badly_is_refused_naming_what_failed(c):
    c.array("alice", "pre", 6, result=FAILED_ARRAY)
    with pytest.raises(UsageError, match=r"already ended \(3 failed, 1 killed\)"):
        resolve_after(c.store, "alice", ["pre"], [], "train")


def test_the_newest_of_a_job_and_an_array_of_one_name_wins(c):
    c.record("alice", "pre", "running")
    array_id = c.array("alice", "pre", 2)
    assert resolve_after(c.store, "alice", ["pre"], [], "train")[0].id == array_id


def test_an_archived_job_is_still_found(c):
    old = c.record("alice", "prep", "succeeded")
    assert c.store.archive_jobs(job_ids=[old.id]) == 1
    assert c.store.load_job(job_id=old.id) is None
    assert resolve_after(c.store, "alice", ["prep"], [], "train")[0].id == old.id


# -- judging at dispatch ----------------------------------------------------------------------


def test_a_running_dependency_keeps_it_waiting(c):
    prep = c.record("alice", "prep", "running")
    assert judge(c.store, waiter(c, Dependency(prep.id, "prep"))) == (
        WAITING,
        "after prep (running)",
    )


def test_a_queued_dependency_keeps_it_waiting(c):
    prep = c.queue("alice", "prep")
    assert judge(c.store, waiter(c, Dependency(prep.id, "prep")))[0] == WAITING


def test_a_succeeded_dependency_makes_it_ready(c):
    prep = c.record("alice", "prep", "succeeded")
    assert judge(c.store, waiter(c, Dependency(prep.id, "prep"))) == (READY, "")


@pytest.mark.parametrize("state", ["failed", "killed", "timeout", "lost", "cancelled"])
def test_after_breaks_on_any_unsuccessful_end_and_after_any_does_not(c, state):
    prep = c.record("alice", "prep", state)
    assert judge(c.store, waiter(c, Dependency(prep.id, "prep"))) == (BROKEN, f"prep {state}")
    assert judge(c.store, waiter(c, Dependency(prep.id, "prep", any=True)))[0] == READY


def test_a_dependency_whose_record_is_gone_breaks_it(c):
    job = waiter(c, Dependency("j-0000000000", "prep"))
    assert judge(c.store, job) == (BROKEN, "job prep it waited for is gone")


def test_an_archived_dependency_is_judged_from_the_archive(c):
    prep = c.record("alice", "prep", "failed")
    c.store.archive_jobs(job_ids=[prep.id])
    assert judge(c.store, waiter(c, Dependency(prep.id, "prep"))) == (BROKEN, "prep failed")


def test_one_failed_dependency_breaks_it_while_an_earlier_one_still_runs(c):
    """--after A --after B with B failed and A running: it can never run, so it is
    cancelled now, not once A has ended (the order they were given in does not matter)."""
    a = c.record("alice", "a", "running")
    b = c.record("alice", "b", "failed")
    for deps in ((a, b), (b, a)):
        job = waiter(c, *(Dependency(d.id, d.name) for d in deps))
        assert judge(c.store, job) == (BROKEN, "b failed")


def test_it_is_ready_only_once_every_dependency_succeeded(c):
    a = c.record("alice", "a", "succeeded")
    b = c.record("alice", "b", "running")
    job = waiter(c, Dependency(a.id, "a"), Dependency(b.id, "b"))
    assert judge(c.store, job)[0] == WAITING
    c.store.update_job(job_id=b.id, changes={"state": "succeeded"})
    assert judge(c.store, job)[0] == READY


def test_an_array_still_running_keeps_it_waiting(c):
    array_id = c.array("alice", "pre", 3)
    job = waiter(c, Dependency(array_id, "pre", array=True))
    assert judge(c.store, job) == (WAITING, "after array pre (not ended)")


def test_an_array_that_succeeded_makes_it_ready(c):
    array_id = c.array("alice", "pre", 3, result={"succeeded": True, "states": {"succeeded": 3}})
    assert judge(c.store, waiter(c, Dependency(array_id, "pre", array=True)))[0] == READY


def test_an_array_with_any_task_unsuccessful_breaks_after_but_not_after_any(c):
    array_id = c.array("alice", "pre", 6, result=FAILED_ARRAY)
    assert judge(c.store, waiter(c, Dependency(array_id, "pre", array=True))) == (
        BROKEN,
        "array pre did not succeed (3 failed, 1 killed)",
    )
    assert judge(c.store, waiter(c, Dependency(array_id, "pre", True, any=True)))[0] == READY


def test_an_array_whose_record_is_gone_breaks_it(c):
    job = waiter(c, Dependency("a-0000000000", "pre", array=True))
    assert judge(c.store, job) == (BROKEN, "array pre it waited for is gone")
