"""Preemption in-process (engine/preempt.py and what it touches): which preemptible jobs a
claim makes yield, the hand-over booking that keeps racing claimers apart, the victims'
records and events, a preempted job's end and its requeue, the Slack line, fair share and
history leaving scavenged use apart, --preempt-signal, and hand-overs ending without a trace.

Victims are written into a real store as a started job with its claim (no node, no wrapper);
a victim "yields" when the test records its rank's end, as its wrapper would."""

from __future__ import annotations

import dataclasses
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from gpuclaim.app.history import claim_intervals, summarize
from gpuclaim.cli.run_flags import RunFlags, signal_name
from gpuclaim.core.booking import Booking
from gpuclaim.core.config import SlackConfig
from gpuclaim.core.errors import ConflictError, UsageError
from gpuclaim.core.model import Claim, ClaimedGpu, Event, EventType, Job, JobRank
from gpuclaim.engine import preempt
from gpuclaim.engine.arrays import ArrayRequest, submit_array
from gpuclaim.engine.bookings import new_booking_id, settle_bookings
from gpuclaim.engine.claims import claim_gpus, drain_node, release_claims
from gpuclaim.engine.fairshare import use_by_user
from gpuclaim.engine.job_records import finish_rank
from gpuclaim.engine.jobs import RunRequest, job_from_request, new_job_id
from gpuclaim.engine.notify import render_message, wanted
from gpuclaim.engine.placement import ClaimRequest
from gpuclaim.engine.preempt import (
    Handover,
    HandoverLost,
    begin_handover,
    end_handovers,
    find_handover,
    yielding_to,
)
from gpuclaim.store import new_claim_id

from .fakes import HOUR, Cluster, make_cluster

GRACE = 20.0  # [queue] preempt_grace in these tests


def cluster(tmp_path: Path, nodes: Optional[dict[str, int]] = None) -> Cluster:
    c = make_cluster(tmp_path, nodes or {"node01": 2})
    c.config = dataclasses.replace(
        c.config, queue=dataclasses.replace(c.config.queue, preempt_grace_s=GRACE)
    )
    return c


def scav(
    c: Cluster,
    user: str,
    name: str,
    node: str,
    indices: tuple[int, ...],
    ago: float = 0.0,
    preemptible: bool = True,
    **more: Any,
) -> tuple[Job, Claim]:
    """A job of ``user`` running on ``indices`` of ``node`` since ``ago`` seconds (under the
    two minutes a job's claim may go without a heartbeat), with its claim published."""
    since = c.clock.now - ago
    uuids = [c.nodes.gpus[node][i].uuid for i in indices]
    job_id = new_job_id()
    claim = Claim(
        id=new_claim_id(),
        user=user,
        node=node,
        gpus=tuple(ClaimedGpu(u, i) for u, i in zip(uuids, indices)),
        since=since,
        expires=since + HOUR,
        note=f"job {name}",
        job=job_id,
        preemptible=preemptible,
    )
    c.store.acquire(claim)
    rank = JobRank(0, node, indices, tuple(uuids), claim.id, state="running", started=since)
    req = RunRequest(user=user, argv=("python", "scav.py"), name=name, count=len(indices), **more)
    req = dataclasses.replace(req, preemptible=preemptible)
    job = job_from_request(req, job_id, name, HOUR, since - 1.0).with_(
        state="running", ranks=(rank,), started=since
    )
    c.store.create_job(job=job)
    return job, claim


def find(c: Cluster, user: str, count: int = 1, **more: Any) -> Optional[Handover]:
    req = ClaimRequest(user=user, count=count, duration_s=HOUR, **more)
    return find_handover(c.config, c.view(), req, HOUR)


def victims(h: Optional[Handover]) -> list[str]:
    assert h is not None, "no hand-over found"
    return sorted(v.id for v in h.victims)


def begin(c: Cluster, user: str, h: Optional[Handover]) -> tuple[Any, str]:
    assert h is not None
    return begin_handover(c.config, c.store, ClaimRequest(user=user, count=len(h.rows)), h)


def yield_gpus(c: Cluster, job: Job, exit_code: int = 75) -> Optional[Job]:
    """The victim's wrapper records its end (what it does once its job exited)."""
    current = c.job(job)
    return finish_rank(c.store, current, 0, "preempted", exit_code, "yielded its GPUs")


def events(c: Cluster, kind: str) -> list[Event]:
    return [e for e in c.store.read_events()[0] if e.type == kind]


# -- 1. whom a claim makes yield --------------------------------------------------------------


def test_one_two_gpu_victim_beats_two_one_gpu_victims_however_recent(tmp_path):
    c = cluster(tmp_path, {"node01": 4})
    _, big = scav(c, "alice", "big", "node01", (0, 1), ago=90)
    scav(c, "bob", "s1", "node01", (2,), ago=10)
    scav(c, "bob", "s2", "node01", (3,), ago=5)
    h = find(c, "carol", 2)
    assert victims(h) == [big.id]
    assert h is not None and (h.node, h.indices) == ("node01", (0, 1))


def test_among_equal_victims_the_most_recently_started_yield(tmp_path):
    c = cluster(tmp_path, {"node01": 3})
    scav(c, "alice", "old", "node01", (0,), ago=60)
    _, newest = scav(c, "alice", "newest", "node01", (1,), ago=5)
    _, middle = scav(c, "bob", "middle", "node01", (2,), ago=30)
    h1 = find(c, "carol", 1)
    assert victims(h1) == [newest.id] and h1 is not None and h1.indices == (1,)
    h2 = find(c, "carol", 2)
    assert victims(h2) == sorted([newest.id, middle.id])
    assert h2 is not None and h2.indices == (1, 2)


def test_one_gpu_wanted_preempts_the_newest_job_not_the_biggest(tmp_path):
    c = cluster(tmp_path, {"node01": 3})
    scav(c, "alice", "old-pair", "node01", (0, 1), ago=90)
    _, newest = scav(c, "alice", "newest", "node01", (2,), ago=5)
    assert victims(find(c, "carol", 1)) == [newest.id]


def test_among_as_few_and_as_new_victims_the_one_freeing_fewest_extra_gpus_yields(tmp_path):
    c = cluster(tmp_path, {"node01": 3})
    scav(c, "alice", "pair", "node01", (0, 1), ago=30)
    _, single = scav(c, "alice", "single", "node01", (2,), ago=30)
    assert victims(find(c, "carol", 1)) == [single.id]


def test_free_gpus_are_used_first_and_only_the_rest_preempted(tmp_path):
    c = cluster(tmp_path, {"node01": 3})
    _, newer = scav(c, "alice", "a", "node01", (1,), ago=5)
    scav(c, "alice", "b", "node01", (2,), ago=50)
    h = find(c, "carol", 2)
    assert victims(h) == [newer.id]
    assert h is not None and h.indices == (0, 1)


def test_the_node_needing_the_fewest_victims_is_chosen(tmp_path):
    c = cluster(tmp_path, {"node01": 2, "node02": 2})
    scav(c, "alice", "x", "node01", (0,), ago=20)
    scav(c, "alice", "y", "node01", (1,), ago=10)
    _, z = scav(c, "alice", "z", "node02", (1,), ago=30)
    h = find(c, "carol", 2)
    assert victims(h) == [z.id]
    assert h is not None and (h.node, h.indices) == ("node02", (0, 1))


def test_a_preemptible_request_preempts_nobody(tmp_path):
    c = cluster(tmp_path)
    scav(c, "alice", "s", "node01", (0, 1), ago=5)
    assert find(c, "carol", 1, preemptible=True) is None
    assert find(c, "carol", 1) is not None  # the same GPUs do yield to a plain claim


def test_plain_claims_and_jobs_never_yield(tmp_path):
    c = cluster(tmp_path, {"node01": 3})
    scav(c, "dave", "plain-job", "node01", (0,), ago=1, preemptible=False)
    c.claim("erin", exact=(("node01", (1,)),))
    _, s = scav(c, "alice", "s", "node01", (2,), ago=60)
    assert victims(find(c, "carol", 1)) == [s.id]
    assert find(c, "carol", 2) is None
    assert find(c, "carol", 1, exact=(("node01", (0,)),)) is None
    assert find(c, "carol", 1, exact=(("node01", (1,)),)) is None


def test_gpus_inside_someone_elses_booking_window_are_not_taken(tmp_path):
    c = cluster(tmp_path)
    c.book("dave", start_in=1800, exact=(("node01", (0,)),))
    _, in_window = scav(c, "alice", "a", "node01", (0,), ago=5)  # the newest
    _, outside = scav(c, "alice", "b", "node01", (1,), ago=60)
    assert victims(find(c, "carol", 1)) == [outside.id]
    assert find(c, "carol", 2) is None
    assert find(c, "carol", 1, exact=(("node01", (0,)),)) is None
    assert victims(find(c, "dave", 1)) == [in_window.id]  # his own booking keeps nobody off


def test_drained_and_unreachable_nodes_are_skipped(tmp_path):
    c = cluster(tmp_path, {"node01": 2, "node02": 2})
    _, pair = scav(c, "alice", "pair", "node01", (0, 1), ago=5)
    _, p = scav(c, "alice", "p", "node02", (0,), ago=5)
    _, q = scav(c, "alice", "q", "node02", (1,), ago=5)
    assert victims(find(c, "carol", 2)) == [pair.id]
    drain_node(c.config, c.store, "admin", "node01", "new fans")
    assert victims(find(c, "carol", 2)) == sorted([p.id, q.id])
    c.nodes.down["node02"] = "ssh: connect to host node02: No route to host"
    assert find(c, "carol", 2) is None


def test_an_exact_request_preempts_the_holders_of_the_gpus_it_names(tmp_path):
    c = cluster(tmp_path, {"node01": 4})
    _, pair = scav(c, "alice", "pair", "node01", (1, 2), ago=5)
    scav(c, "dave", "plain", "node01", (3,), preemptible=False)
    h = find(c, "carol", 2, exact=(("node01", (0, 1)),))
    assert victims(h) == [pair.id]
    assert h is not None and (h.node, h.indices) == ("node01", (0, 1))
    assert find(c, "carol", 1, exact=(("node01", (0,)),)) is None  # free: nobody to preempt
    assert find(c, "carol", 2, exact=(("node01", (1, 3)),)) is None  # GPU 3 never yields
    drain_node(c.config, c.store, "admin", "node01", "")
    assert find(c, "carol", 2, exact=(("node01", (0, 1)),)) is None


# -- 2. racing hand-overs ---------------------------------------------------------------------


def test_of_two_hand_overs_of_the_same_gpus_one_books_the_other_is_lost(tmp_path):
    c = cluster(tmp_path)
    job, _ = scav(c, "alice", "s", "node01", (0, 1), ago=5)
    h = find(c, "bob", 2)
    booking, who = begin(c, "bob", h)
    assert who == "alice's s"
    with pytest.raises(HandoverLost):
        begin(c, "carol", h)
    assert [(b.id, b.user, b.handover) for b in c.store.bookings()] == [(booking.id, "bob", True)]
    assert c.job(job).preempted_by == "bob"
    assert len(events(c, EventType.PREEMPT)) == 1


def test_claimers_racing_in_threads_book_one_hand_over(tmp_path):
    c = cluster(tmp_path)
    job, _ = scav(c, "alice", "s", "node01", (0, 1), ago=5)
    h = find(c, "bob", 2)
    users = ["bob", "carol", "dave", "erin"]
    start = threading.Barrier(len(users))

    def race(user: str) -> str:
        start.wait()
        try:
            begin(c, user, h)
        except HandoverLost:
            return "lost"
        return "won"

    with ThreadPoolExecutor(len(users)) as pool:
        outcomes = dict(zip(users, pool.map(race, users)))
    assert sorted(outcomes.values()) == ["lost", "lost", "lost", "won"]
    [winner] = [u for u, o in outcomes.items() if o == "won"]
    assert [b.user for b in c.store.bookings()] == [winner]
    assert c.job(job).preempted_by == winner
    assert [e.by for e in events(c, EventType.PREEMPT)] == [winner]


def test_a_hand_over_keeps_others_off_the_yielded_gpus_but_not_its_owner(tmp_path):
    c = cluster(tmp_path)
    job, _ = scav(c, "alice", "s", "node01", (0, 1), ago=5)
    begin(c, "bob", find(c, "bob", 2))
    yield_gpus(c, job)
    for preemptible in (False, True):  # waiting would not help: nobody is left to yield
        req = ClaimRequest(user="carol", count=1, duration_s=HOUR, preemptible=preemptible)
        with pytest.raises(ConflictError):
            claim_gpus(c.config, c.store, req, c.prober, say=lambda line: None)
    with pytest.raises(ConflictError):
        c.claim("carol", exact=(("node01", (0,)),))
    mine = c.claim("bob", 2)
    assert (mine.node, list(mine.indices)) == ("node01", [0, 1])
    assert yielding_to(c.store.bookings(), "bob", ["node01"]) is not None
    end_handovers(c.store, "bob", mine.uuids)
    assert c.store.bookings() == []


def test_a_booking_owner_may_hand_over_inside_the_booking_another_may_not(tmp_path):
    c = cluster(tmp_path)
    c.book("dave", start_in=0, exact=(("node01", (0, 1)),))
    job, _ = scav(c, "alice", "s", "node01", (0, 1), ago=5)  # used the window till he came
    h = find(c, "dave", 2)
    assert h is not None and h.indices == (0, 1)
    with pytest.raises(HandoverLost):
        begin(c, "carol", h)
    booking, _ = begin(c, "dave", h)
    assert booking.handover and booking.user == "dave"
    assert c.job(job).preempted_by == "dave"


def booking_of(c: Cluster, user: str, index: int, start_in: float = 600.0) -> Booking:
    now = c.clock.now
    gpu = c.nodes.gpus["node01"][index]
    return Booking(
        id=new_booking_id(),
        user=user,
        node="node01",
        gpus=(ClaimedGpu(gpu.uuid, index),),
        start=now + start_in,
        end=now + start_in + HOUR,
        created=now,
    )


def test_store_book_ignores_preemptible_claims_but_not_plain_ones(tmp_path):
    c = cluster(tmp_path)
    scav(c, "alice", "s", "node01", (0,), ago=5)
    scav(c, "erin", "plain", "node01", (1,), ago=5, preemptible=False)
    c.store.book(booking_of(c, "dave", 0))
    with pytest.raises(ConflictError, match="erin"):
        c.store.book(booking_of(c, "dave", 1))
    assert [b.indices for b in c.store.bookings()] == [[0]]


def test_reserve_books_gpus_that_preemptible_work_holds(tmp_path):
    c = cluster(tmp_path)
    scav(c, "alice", "s", "node01", (0,), ago=5)
    assert c.book("dave", start_in=600, exact=(("node01", (0,)),)).user == "dave"


def test_preemptible_work_uses_a_booking_window_until_its_owner_came(tmp_path):
    c = cluster(tmp_path, {"node01": 4})
    c.book("dave", start_in=0, count=3, exact=(("node01", (0, 1, 2)),))
    with pytest.raises(ConflictError):
        c.claim("erin", 2)  # only GPU 3 is hers to take
    assert len(c.claim("alice", 2, preemptible=True).gpus) == 2  # GPU 3 and one of dave's
    c.claim("dave", 1)  # he came: his booking is used
    with pytest.raises(ConflictError):
        c.claim("alice", 1, preemptible=True)


def test_a_queued_preemptible_job_may_start_inside_an_unused_booking_too(tmp_path):
    c = cluster(tmp_path)
    c.book("dave", start_in=0, count=2, exact=(("node01", (0, 1)),))
    assert len(c.claim("alice", 1, preemptible=True).gpus) == 1  # run --preemptible: yes
    c.queue("alice", "s", count=1, preemptible=True)
    assert c.dispatch() == ["s"]  # run --preemptible --queue (and every array task) too


# -- claim_gpus with `say`: the whole hand-over ------------------------------------------------


def test_a_claim_that_can_wait_gets_exactly_the_gpus_the_victim_yielded(tmp_path, monkeypatch):
    c = cluster(tmp_path, {"node01": 3})
    c.claim("erin", exact=(("node01", (0,)),))
    job, _ = scav(c, "alice", "scav", "node01", (1,), ago=5)
    scav(c, "alice", "older", "node01", (2,), ago=60)
    said: list[str] = []

    def wrapper_yields(_seconds: float) -> None:
        assert c.job(job).stop_requested == "preempt"
        if c.job(job).state == "running":
            yield_gpus(c, job)

    monkeypatch.setattr(preempt, "time", SimpleNamespace(sleep=wrapper_yields))
    req = ClaimRequest(user="bob", count=1, duration_s=HOUR)
    claim = claim_gpus(c.config, c.store, req, c.prober, say=said.append)
    assert (claim.user, claim.node, list(claim.indices)) == ("bob", "node01", [1])
    assert said == ["waiting up to 20s for alice's scav to yield node01 GPU 1"]
    assert c.job(job).state == "preempted"
    assert c.store.bookings() == []  # the hand-over is dropped once claimed


def test_without_say_a_claim_preempts_nobody(tmp_path):
    c = cluster(tmp_path)
    job, _ = scav(c, "alice", "s", "node01", (0, 1), ago=5)
    with pytest.raises(ConflictError):
        c.claim("bob", 1)
    assert c.job(job).stop_requested is None
    assert events(c, EventType.PREEMPT) == [] and c.store.bookings() == []


def test_a_victim_that_never_yields_gives_the_gpus_back_at_once(tmp_path, monkeypatch):
    c = cluster(tmp_path)
    scav(c, "alice", "stubborn", "node01", (0, 1), ago=5)
    monkeypatch.setattr(preempt, "time", SimpleNamespace(sleep=lambda s: c.clock.advance(10)))
    req = ClaimRequest(user="bob", count=2, duration_s=HOUR)
    with pytest.raises(ConflictError, match="did not yield"):
        claim_gpus(c.config, c.store, req, c.prober, say=lambda line: None)
    assert c.store.bookings() == []


# -- 3. the victim's record --------------------------------------------------------------------


def test_a_victim_is_asked_to_yield_by_its_grace_with_one_preempt_event(tmp_path):
    c = cluster(tmp_path)
    job, claim = scav(c, "alice", "scav", "node01", (0, 1), ago=5, requeue=True)
    now = c.clock.now
    booking, _ = begin(c, "bob", find(c, "bob", 2))
    asked = c.job(job)
    assert (asked.state, asked.stop_requested, asked.preempted_by) == ("running", "preempt", "bob")
    assert asked.preempt_deadline == pytest.approx(now + GRACE, abs=0.01)
    assert booking.end == pytest.approx(now + GRACE + c.config.limits.kill_grace_s + 15)
    [ev] = events(c, EventType.PREEMPT)
    assert (ev.user, ev.by, ev.claim_id, ev.node) == ("alice", "bob", claim.id, "node01")
    assert tuple(ev.gpus) == (0, 1) and ev.since == pytest.approx(claim.since, abs=0.01)
    assert ev.extra == {"job": "scav", "job_id": job.id, "requeue": True}


def test_a_job_already_stopping_is_left_to_stop(tmp_path):
    c = cluster(tmp_path)
    job, _ = scav(c, "alice", "s", "node01", (0, 1), ago=5)
    c.store.update_job(job_id=job.id, changes={"stop_requested": "kill"})
    booking, _ = begin(c, "bob", find(c, "bob", 2))
    left = c.job(job)
    assert (left.stop_requested, left.preempted_by, left.preempt_deadline) == ("kill", None, None)
    assert events(c, EventType.PREEMPT) == []
    assert [b.id for b in c.store.bookings()] == [booking.id]  # its GPUs are still his next


# -- 4. a preempted job's end, and its requeue -------------------------------------------------


def test_a_job_that_yielded_ends_preempted_and_without_requeue_stays_ended(tmp_path):
    c = cluster(tmp_path)
    job, claim = scav(c, "alice", "s", "node01", (0, 1), ago=5)
    begin(c, "bob", find(c, "bob", 2))
    final = yield_gpus(c, job, exit_code=75)
    assert final is not None and (final.state, final.exit_code) == ("preempted", 75)
    assert claim.id not in c.store.snapshot().claims
    assert [j.id for j in c.store.list_jobs()] == [job.id]
    assert c.store.queue_entries() == []
    [end] = events(c, EventType.JOB_END)
    assert end.extra["state"] == "preempted" and "requeued_as" not in end.extra


def test_a_requeue_job_goes_back_to_the_queue_as_a_new_record(tmp_path):
    c = cluster(tmp_path)
    job, _ = scav(c, "alice", "s", "node01", (0, 1), ago=5, requeue=True)
    begin(c, "bob", find(c, "bob", 2))
    final = yield_gpus(c, job)
    assert final is not None and final.state == "preempted"
    [again] = [j for j in c.store.list_jobs() if j.id != job.id]
    assert (again.name, again.user, again.state, again.restarts) == ("s", "alice", "queued", 1)
    assert (again.preemptible, again.requeue, again.ranks) == (True, True, ())
    assert (again.stop_requested, again.preempted_by, again.preempt_deadline) == (None,) * 3
    assert [e.split("-", 1)[1].split("+")[0] for e in c.store.queue_entries()] == [again.id]
    assert c.job(job).requeued_as == again.id
    [end] = events(c, EventType.JOB_END)
    assert end.extra["requeued_as"] == again.id
    [queued] = [e for e in events(c, EventType.JOB_QUEUED) if e.extra.get("requeued_from")]
    assert queued.extra["job_id"] == again.id and queued.extra["requeued_from"] == job.id


def preemptible_array(c: Cluster, count: int, limit: Optional[int] = None) -> str:
    run = RunRequest(
        user="alice",
        argv=("python", "scav.py"),
        name="scav",
        preemptible=True,
        requeue=True,
    )
    areq = ArrayRequest(run, tuple(range(count)), f"0-{count - 1}", max_running=limit)
    return str(submit_array(c.config, c.store, areq, c.prober).record["id"])


def task(c: Cluster, array_id: str, index: int) -> Job:
    found = c.store.load_job(job_id=f"{array_id}-{index}")
    assert found is not None
    return found


def test_a_requeued_array_task_is_not_counted_as_ended(tmp_path):
    c = cluster(tmp_path)
    array_id = preemptible_array(c, 2)
    t0, t1 = task(c, array_id, 0), task(c, array_id, 1)
    assert (t0.state, t1.state) == ("starting", "starting")
    begin(c, "bob", find(c, "bob", 1))
    [victim] = [t for t in (t0, t1) if c.job(t).stop_requested == "preempt"]
    other = t1 if victim is t0 else t0
    yield_gpus(c, victim)
    assert c.store.tasks_ended(array_id=array_id) == 0
    c.end(other)
    assert c.store.tasks_ended(array_id=array_id) == 1
    assert c.store.load_array(array_id=array_id).get("result") is None  # one still to run


def test_an_array_whose_requeued_task_succeeded_all_succeeded(tmp_path):
    c = cluster(tmp_path)
    array_id = preemptible_array(c, 1)
    t0 = task(c, array_id, 0)
    begin(c, "bob", find(c, "bob", 2))
    yield_gpus(c, t0)
    [again] = [j for j in c.store.list_jobs() if j.state == "queued"]
    assert again.id == f"{array_id}-0r1"  # still its array's task 0
    c.store.drop_booking(c.store.bookings()[0].id)  # bob went away
    assert c.dispatch() == ["scav[0]"]
    c.end(again)
    result = c.store.load_array(array_id=array_id)["result"]
    assert result["states"] == {"succeeded": 1} and result["succeeded"] is True


def test_requeued_tasks_keep_to_the_arrays_max_running(tmp_path):
    c = cluster(tmp_path, {"node01": 2})
    array_id = preemptible_array(c, 2, limit=1)
    first = task(c, array_id, 0)
    assert (first.state, task(c, array_id, 1).state) == ("starting", "queued")
    booking, _ = begin(c, "bob", find(c, "bob", 2))
    yield_gpus(c, first)
    c.store.drop_booking(booking.id)  # bob went away: both GPUs are free
    assert len(c.dispatch()) == 1  # task 1 or the rerun of task 0, never both (%1)


# -- 5. what Slack says --------------------------------------------------------------------------


def test_a_preempt_event_is_one_line_naming_victim_job_gpus_and_claimer(tmp_path):
    c = cluster(tmp_path)
    scav(c, "alice", "scav", "node01", (0, 1), ago=5)
    begin(c, "bob", find(c, "bob", 2))
    [ev] = events(c, EventType.PREEMPT)
    slack = SlackConfig()
    assert wanted(ev, slack)
    text = render_message(ev, slack)["text"]
    assert "\n" not in text
    for part in ("alice's preemptible job scav", "node01 GPU 0,1", "to bob", "ends"):
        assert part in text, text
    requeued = dataclasses.replace(ev, extra={**ev.extra, "requeue": True})
    assert "goes back to the queue" in render_message(requeued, slack)["text"]


def test_the_end_of_a_preempted_job_is_not_posted_again(tmp_path):
    c = cluster(tmp_path)
    job, _ = scav(c, "alice", "scav", "node01", (0, 1), ago=5)
    begin(c, "bob", find(c, "bob", 2))
    yield_gpus(c, job)
    [end] = events(c, EventType.JOB_END)
    assert not wanted(end, SlackConfig())
    failed = dataclasses.replace(end, extra={**end.extra, "state": "failed"})
    assert wanted(failed, SlackConfig())


# -- 6. fair share and history -----------------------------------------------------------------


def test_fair_share_does_not_count_preemptible_use_held_or_ended(tmp_path):
    c = cluster(tmp_path, {"node01": 3})
    job, _ = scav(c, "alice", "scav", "node01", (0, 1))
    bob = c.claim("bob", 1)
    c.clock.advance(100)
    held = use_by_user(c.config, c.store, c.store.snapshot())
    assert held.get("bob") == pytest.approx(100, rel=1e-3)
    assert held.get("alice", 0.0) == 0.0
    yield_gpus(c, job)
    release_claims(c.config, c.store, "bob", claim_ids=[bob.id])
    ended = use_by_user(c.config, c.store, c.store.snapshot())
    assert ended.get("bob") == pytest.approx(100, rel=1e-3)
    assert ended.get("alice", 0.0) == 0.0


def test_history_gives_preemptible_gpu_hours_apart(tmp_path):
    c = cluster(tmp_path, {"node01": 3})
    job, _ = scav(c, "alice", "scav", "node01", (0, 1))
    bob = c.claim("bob", 1)
    c.clock.advance(1800)
    yield_gpus(c, job)
    release_claims(c.config, c.store, "bob", claim_ids=[bob.id])
    intervals = claim_intervals(c.store.read_events()[0], c.store.snapshot())
    by_user = {r["user"]: r for r in summarize(intervals, by="user")}
    assert (by_user["alice"]["gpu_hours"], by_user["alice"]["preemptible_gpu_hours"]) == (1.0, 1.0)
    assert (by_user["bob"]["gpu_hours"], by_user["bob"]["preemptible_gpu_hours"]) == (0.5, 0.0)
    [node] = summarize(intervals, by="node")
    assert (node["gpu_hours"], node["preemptible_gpu_hours"]) == (1.5, 1.0)


# -- 7. --preempt-signal ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("SIGUSR1", "USR1"),
        ("usr2", "USR2"),
        (" sigterm ", "TERM"),
        (str(int(signal.SIGUSR1)), "USR1"),
        (str(int(signal.SIGUSR2)), "USR2"),
    ],
)
def test_signal_names_normalise(text, name):
    assert signal_name(text) == name


@pytest.mark.parametrize(
    "text", ["KILL", "SIGSTOP", "", "FOO", "SIG", str(int(signal.SIGKILL)), "999", "-10"]
)
def test_signals_that_cannot_be_caught_or_do_not_exist_are_usage_errors(text):
    with pytest.raises(UsageError):
        signal_name(text)


@pytest.mark.parametrize(
    "flags",
    [
        {"requeue": True},
        {"preempt_signal": "USR2"},
        {"preemptible": True, "reservation": "r-1"},
    ],
)
def test_preemption_flags_that_contradict_are_usage_errors(flags):
    with pytest.raises(UsageError):
        RunFlags(command=["python", "x.py"], **flags).check()
    RunFlags(command=["python", "x.py"], preemptible=True, requeue=True).check()


# -- 8. hand-overs end without a trace ------------------------------------------------------------


def test_an_expired_hand_over_is_dropped_without_an_ended_record_or_event(tmp_path):
    c = cluster(tmp_path)
    scav(c, "alice", "s", "node01", (0, 1), ago=5)
    booking, _ = begin(c, "bob", find(c, "bob", 2))
    before = len(c.store.read_events()[0])
    kept = settle_bookings(c.config, c.store, c.store.snapshot())
    assert [b.id for b in kept.bookings] == [booking.id]
    c.clock.now = booking.end
    settled = settle_bookings(c.config, c.store, c.store.snapshot())
    assert settled.bookings == [] and c.store.bookings() == []
    assert c.store.ended_bookings() == []
    assert len(c.store.read_events()[0]) == before
