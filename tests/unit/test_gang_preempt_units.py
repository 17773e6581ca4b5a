"""A gang's hand-over in-process (engine/preempt.py): where a gang fits once preemptible
jobs yield, and its bookings taken all or none before anybody is asked to yield."""

from __future__ import annotations

import dataclasses

import pytest

from gpuclaim.core.model import Claim, ClaimedGpu, EventType, Job, JobRank
from gpuclaim.engine.jobs import RunRequest, job_from_request, new_job_id
from gpuclaim.engine.placement import ClaimRequest
from gpuclaim.engine.preempt import (
    HandoverLost,
    begin_gang_handover,
    begin_handover,
    find_gang_handover,
    find_handover,
)
from gpuclaim.store import new_claim_id

from .fakes import HOUR
from .test_preempt_units import cluster, events, scav

NODES = {"node01": 2, "node02": 2, "node03": 2}


def gang(c, user: str, count: int = 2, nodes: int = 2):
    req = ClaimRequest(user=user, count=count, duration_s=HOUR)
    names = [n.name for n in c.config.nodes]
    return req, find_gang_handover(c.config, c.view(), req, nodes, names, HOUR)


def test_a_gang_takes_free_nodes_first_and_preempts_only_for_the_rest(tmp_path):
    c = cluster(tmp_path, NODES)
    scav(c, "alice", "s1", "node01", (0, 1), ago=5)
    scav(c, "alice", "s2", "node02", (0, 1), ago=9)
    _, handovers = gang(c, "bob")
    assert handovers is not None
    assert [(h.node, [v.user for v in h.victims]) for h in handovers] == [
        ("node03", []),  # free: booked all the same, so the gang starts whole
        ("node01", ["alice"]),  # of the two victims, one is enough: node01's
    ]


def test_a_gang_that_fits_free_or_not_at_all_preempts_nobody(tmp_path):
    c = cluster(tmp_path, NODES)
    assert gang(c, "bob")[1] is None  # three free nodes: nobody need yield
    c2 = cluster(tmp_path / "two", {"node01": 2, "node02": 2})
    scav(c2, "alice", "s1", "node01", (0, 1), ago=5)
    scav(c2, "carol", "plain", "node02", (0, 1), ago=5, preemptible=False)
    assert gang(c2, "bob")[1] is None  # node02's job is not preemptible: no gang fits


def preemptible_gang(c, user: str, name: str, nodes: tuple[str, ...]) -> Job:
    """A running preemptible gang of ``user``: a rank on both GPUs of each of ``nodes``."""
    job_id = new_job_id()
    since = c.clock.now - 5
    ranks = []
    for rank, node in enumerate(nodes):
        gpus = tuple(ClaimedGpu(c.nodes.gpus[node][i].uuid, i) for i in (0, 1))
        claim = Claim(
            id=new_claim_id(), user=user, node=node, gpus=gpus, since=since,
            expires=since + HOUR, note=f"job {name} rank {rank}", job=job_id, preemptible=True,
        )  # fmt: skip
        c.store.acquire(claim)
        uuids = tuple(g.uuid for g in gpus)
        ranks.append(JobRank(rank, node, (0, 1), uuids, claim.id, "running", started=since))
    req = RunRequest(user=user, argv=("python", "pg.py"), name=name, count=2, nodes=len(nodes))
    req = dataclasses.replace(req, preemptible=True)
    job = job_from_request(req, job_id, name, HOUR, since - 1.0).with_(
        state="running", ranks=tuple(ranks), started=since
    )
    c.store.create_job(job=job)
    return job


def test_a_preemptible_gangs_ranks_are_asked_once_as_their_one_job(tmp_path):
    c = cluster(tmp_path, {"node01": 2, "node02": 2})
    job = preemptible_gang(c, "alice", "pg", ("node01", "node02"))
    req, handovers = gang(c, "bob")
    assert handovers is not None
    _, who = begin_gang_handover(c.config, c.store, req, handovers)
    assert who == "alice's pg"
    assert len(events(c, EventType.PREEMPT)) == 1
    assert c.job(job).stop_requested == "preempt" and c.job(job).preempted_by == "bob"


def test_a_gang_losing_one_node_to_a_racing_claimer_books_nothing_and_asks_nobody(tmp_path):
    c = cluster(tmp_path, {"node01": 2, "node02": 2})
    first, _ = scav(c, "alice", "s1", "node01", (0, 1), ago=5)
    second, _ = scav(c, "alice", "s2", "node02", (0, 1), ago=9)
    req, handovers = gang(c, "bob")  # seen before carol's hand-over
    assert handovers is not None and [h.node for h in handovers] == ["node01", "node02"]
    theirs = find_handover(
        c.config, c.view(), ClaimRequest(user="carol", count=2, node="node02"), HOUR
    )
    assert theirs is not None
    begin_handover(c.config, c.store, ClaimRequest(user="carol", count=2), theirs)
    with pytest.raises(HandoverLost):
        begin_gang_handover(c.config, c.store, req, handovers)
    assert [(b.user, b.node) for b in c.store.bookings()] == [("carol", "node02")]
    assert c.job(first).stop_requested is None  # node01's job was never asked
    assert c.job(second).preempted_by == "carol"
    assert [e.extra["job"] for e in events(c, EventType.PREEMPT)] == ["s2"]
