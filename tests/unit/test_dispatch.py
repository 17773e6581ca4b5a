"""The queue (engine/dispatch.py): what starts when GPUs free up, first come first served; a
later job only where the waiting one can never run (or in its owner's open booking); what
waits --after another waits, and never runs if that did not succeed; an array at its %K."""

from __future__ import annotations

import pytest

from gpuclaim.core.model import Dependency
from gpuclaim.engine.arrays import ArrayRequest, submit_array
from gpuclaim.engine.claims import release_claims
from gpuclaim.engine.dispatch import running_tasks
from gpuclaim.engine.jobs import RunRequest
from gpuclaim.engine.launch import CLAIM_MARGIN_S

from .fakes import HOUR, Cluster, make_cluster


@pytest.fixture
def c(tmp_path) -> Cluster:
    return make_cluster(tmp_path, {"node01": 2, "node02": 4})


def queued_ids(c):
    return [e.split("-", 1)[1] for e in c.store.queue_entries()]


def free_up(c, claim):
    release_claims(c.config, c.store, claim.user, claim_ids=[claim.id])


def array(c, user, name, count, limit=None, after=()):
    run = RunRequest(user=user, argv=("python", "eval.py"), name=name, after=after)
    areq = ArrayRequest(run, tuple(range(count)), f"0-{count - 1}", max_running=limit)
    return submit_array(c.config, c.store, areq, c.prober).record["id"]


def task_states(c, array_id):
    return sorted(j.state for j in c.store.list_jobs() if j.id.startswith(array_id + "-"))


# -- what starts, in what order ---------------------------------------------------------------


def test_an_empty_queue_asks_no_node(c):
    assert c.dispatch() == []
    assert c.nodes.calls == []


def test_jobs_that_fit_start_in_submission_order_on_their_own_claims(c):
    a = c.queue("alice", "a", count=2)
    b = c.queue("bob", "b", count=3)
    assert c.dispatch() == ["a", "b"]
    started = c.job(a)
    assert started.state == "starting" and started.from_queue
    assert [(r.node, r.gpus) for r in started.ranks] == [("node01", (0, 1))]
    assert [(r.node, r.gpus) for r in c.job(b).ranks] == [("node02", (0, 1, 2))]
    assert queued_ids(c) == []
    claim = c.store.snapshot().claims[started.ranks[0].claim_id]
    assert (claim.claim.user, claim.claim.job) == ("alice", a.id)
    assert claim.claim.expires == c.clock.now + HOUR + CLAIM_MARGIN_S
    assert [s["session"] for s in c.nodes.launched()] == ["gc-alice-a", "gc-bob-b"]


def test_a_job_that_does_not_fit_keeps_its_place_in_the_queue(c):
    c.claim("carol", 4, node="node02")
    big = c.queue("alice", "big", count=3)
    assert c.dispatch() == []
    assert c.job(big).state == "queued" and queued_ids(c) == [big.id]
    assert [n for n in (c.store.root / "queue").iterdir() if n.name.startswith(".")] == []


def test_a_later_job_never_jumps_the_waiting_one_where_it_could_run(tmp_path):
    c = make_cluster(tmp_path, {"node01": 4})
    held = c.claim("carol", 2)
    head = c.queue("alice", "head", count=4)
    small = c.queue("bob", "small", count=1)
    assert c.dispatch() == []  # 2 GPUs are free, but the head would wait longer
    assert queued_ids(c) == [head.id, small.id]
    free_up(c, held)
    assert c.dispatch() == ["head"]
    assert c.job(small).state == "queued"


def test_a_later_job_backfills_a_node_the_waiting_one_can_never_use(c):
    c.claim("carol", 2, node="node02")
    c.queue("alice", "head", count=4)  # only node02 is big enough
    small = c.queue("bob", "small", count=2)
    also = c.queue("dave", "also", count=1)
    assert c.dispatch() == ["small"]  # node01: too small for the head
    assert c.job(small).ranks[0].node == "node01"
    assert c.job(also).state == "queued"  # node01 is full; node02 is the head's


def test_a_waiting_job_pinned_to_a_node_leaves_the_other_nodes_to_later_jobs(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2, "node02": 2})
    c.claim("carol", 1, node="node01")
    c.queue("alice", "pinned", count=2, node="node01")
    later = c.queue("bob", "later", count=1)
    assert c.dispatch() == ["later"]
    assert c.job(later).ranks[0].node == "node02"


def test_a_waiting_gang_job_holds_up_every_later_job(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2, "node02": 2})
    held = c.claim("carol", 1, node="node02")
    c.queue("alice", "gang", count=2, nodes=2)
    c.queue("bob", "small", count=1)
    assert c.dispatch() == []
    free_up(c, held)
    assert c.dispatch() == ["gang"]
    gang = next(j for j in c.store.list_jobs() if j.name == "gang")
    assert [r.node for r in gang.ranks] == ["node01", "node02"]
    assert gang.state == "starting"


def test_a_job_killed_or_gone_while_queued_leaves_the_queue_unstarted(c):
    killed = c.queue("alice", "killed")
    c.store.update_job(job_id=killed.id, changes={"state": "killed"})
    c.store.enqueue(job_id="j-0000000000")  # a record that is gone
    kept = c.queue("bob", "kept")
    assert c.dispatch() == ["kept"]
    assert c.job(kept).state == "starting"
    assert c.job(killed).state == "killed" and c.job(killed).ranks == ()
    assert queued_ids(c) == []


def test_an_unreachable_node_holds_up_only_what_needs_it(c):
    c.nodes.down["node02"] = "ssh: connect to host node02 port 22: No route to host"
    pinned = c.queue("alice", "pinned", count=1, node="node02")
    anywhere = c.queue("bob", "anywhere", count=1)
    assert c.dispatch() == ["anywhere"]
    assert c.job(anywhere).ranks[0].node == "node01"
    assert c.job(pinned).state == "queued"


def test_a_job_whose_session_cannot_start_fails_and_gives_its_gpus_back(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2})
    c.nodes.broken_launch.add("node01")
    job = c.queue("alice", "broken", count=2)
    assert c.dispatch() == []
    failed = c.job(job)
    assert failed.state == "failed"
    assert "could not start: tmux on node01" in failed.reason
    assert c.states("node01") == ["free", "free"] and queued_ids(c) == []


def test_a_wrapper_dispatching_on_its_node_starts_only_what_fits_there(c):
    big = c.queue("alice", "big", count=3)  # fits node02 only
    c.queue("bob", "small", count=1)
    assert c.dispatch(only_node="node01") == ["small"]
    assert {node for node, _, _ in c.nodes.calls} == {"node01"}
    assert c.job(big).state == "queued"


# -- --after ------------------------------------------------------------------------------------


def test_a_dependant_waits_while_gpus_are_free_and_starts_after_success(c):
    prep = c.queue("alice", "prep")
    train = c.queue("alice", "train", after=(Dependency(prep.id, "prep"),))
    assert c.dispatch() == ["prep"]
    assert c.dispatch() == [] and c.job(train).state == "queued"
    c.end(prep, "succeeded", 0)
    assert c.dispatch() == ["train"]


def test_a_failed_dependency_cancels_its_dependants_and_theirs_in_one_pass(c):
    bad = c.queue("alice", "bad")
    never = c.queue("alice", "never", after=(Dependency(bad.id, "bad"),))
    also = c.queue("alice", "also", after=(Dependency(never.id, "never"),))
    anyway = c.queue("alice", "anyway", after=(Dependency(bad.id, "bad", any=True),))
    assert c.dispatch() == ["bad"]
    c.end(bad, "failed", 3)
    assert c.dispatch() == ["anyway"]
    assert c.job(anyway).state == "starting"
    cancelled = c.job(never)
    assert cancelled.state == "cancelled" and cancelled.ranks == ()
    assert cancelled.reason == "never ran: bad failed"
    assert c.job(also).reason == "never ran: never cancelled"
    told = [e for e in c.store.read_events()[0] if e.type == "job-cancelled"]
    assert len(told) == 2
    assert queued_ids(c) == []


def test_a_queued_run_on_an_ended_reservation_never_runs(c):
    booking = c.book("alice", HOUR, count=2, node="node01")
    job = c.queue("alice", "late", count=2, reservation=booking.id)
    c.store.end_booking(booking.id, {"ended": c.clock.now, "ended_why": "cancelled"})
    assert c.dispatch() == []
    late = c.job(job)
    assert late.state == "cancelled"
    assert late.reason == f"never ran: its reservation {booking.id} ended"


def test_the_owners_job_starts_in_their_open_booking_while_an_earlier_one_waits(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2})
    blocker = c.claim("bob", 2, time_s=8 * 60)
    c.book("alice", 12 * 60, length=2 * HOUR, count=2)
    long = c.queue("carol", "long", count=2, time_s=HOUR)  # would run into alice's booking
    paper = c.queue("alice", "paper", count=2, time_s=20 * 60)
    c.clock.advance(9 * 60)
    assert blocker.expires < c.clock.now
    assert c.dispatch() == []  # the booking is not open: alice's job waits behind carol's
    c.clock.advance(4 * 60)
    assert c.dispatch() == ["paper"]
    assert c.job(long).state == "queued"
    assert c.job(paper).ranks[0].gpus == (0, 1)


# -- arrays ---------------------------------------------------------------------------------------


def test_an_array_never_runs_more_than_its_k_tasks_at_once(tmp_path):
    c = make_cluster(tmp_path, {"node01": 4})
    array_id = array(c, "alice", "sweep", 5, limit=2)
    assert task_states(c, array_id) == ["queued"] * 3 + ["starting"] * 2
    assert running_tasks(c.store.snapshot(), array_id) == 2
    assert c.dispatch() == []  # two GPUs free, but %2
    first = next(j for j in c.store.list_jobs() if j.state == "starting")
    c.end(first)
    assert c.dispatch() == ["sweep[2]"]
    assert running_tasks(c.store.snapshot(), array_id) == 2


def test_an_array_waiting_on_a_failed_job_is_cancelled_whole_and_summarised(c):
    bad = c.queue("alice", "bad")
    assert c.dispatch() == ["bad"]
    array_id = array(c, "alice", "evals", 3, after=("bad",))
    assert task_states(c, array_id) == ["queued"] * 3
    c.end(bad, "failed", 1)
    assert c.dispatch() == []
    assert task_states(c, array_id) == ["cancelled"] * 3
    result = c.store.load_array(array_id=array_id)["result"]
    assert result["states"] == {"cancelled": 3} and result["succeeded"] is False


def test_a_wrappers_pass_leaves_a_job_pinned_to_another_node_waiting(c):
    # a wrapper on node01 dispatches node01 alone: a job that may only run on node02 is not
    # its to judge (it used to ask the config for node02 and fail the whole pass)
    held = c.claim("carol", 4, node="node02")
    pinned = c.queue("bob", "pinned", node="node02")
    other = c.queue("alice", "other")
    assert c.dispatch(only_node="node01") == ["other"]
    assert c.job(pinned).state == "queued" and c.job(other).state == "starting"
    free_up(c, held)
    assert c.dispatch(only_node="node02") == ["pinned"]


def test_a_damaged_job_record_in_the_queue_holds_nobody_else_back(c):
    c.claim("carol", 4, node="node02")  # node02 full: only node01 is left for them
    broken = c.queue("bob", "broken")
    fine = c.queue("alice", "fine")
    (c.store.root / "jobs" / f"{broken.id}.json").write_text("{not json")
    assert c.dispatch() == ["fine"]
    assert c.job(fine).state == "starting"
    assert len(c.store.queue_entries()) == 1  # its entry stays, for gc or a person to see
