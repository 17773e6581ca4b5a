"""[serve]: a service whose node rebooted, in process: its claim is held (never judged stale
while it should run), the next look that proves its wrapper gone starts it again on its own
GPUs (one look per service), and one that should not run any more lets its GPUs go."""

from __future__ import annotations

import os
from pathlib import Path

from gpuclaim.core.liveness import boot_id, process_start
from gpuclaim.core.model import Job, JobKind, iso
from gpuclaim.core.service import ServiceSpec
from gpuclaim.core.states import SERVICE_DOWN, GpuState
from gpuclaim.engine.job_records import observed_health, reload_job
from gpuclaim.engine.jobs import RunRequest, submit_job
from gpuclaim.engine.launch import NodeOps
from gpuclaim.engine.services import revive_services
from tests.unit.fakes import Cluster, make_cluster

REBOOTED = {"boot_id": "another-boot", "wrappers": [], "checked_from": 0}


def _running(c: Cluster, kind: str = JobKind.SERVICE.value) -> Job:
    """A job launched and running, its wrapper (this process) beating for its claim."""
    service = ServiceSpec(port=8000) if kind == JobKind.SERVICE.value else None
    req = RunRequest(user="ann", argv=("vllm", "serve"), name="llm", kind=kind, service=service)
    job = submit_job(c.config, c.store, req, c.prober)
    c.store.update_job(
        job_id=job.id,
        changes={"state": "running", "started": iso(c.clock.now)},
        rank=0,
        rank_changes={"state": "running"},
    )
    c.store.beat(claim_id=job.ranks[0].claim_id or "", interval=1.0)
    return reload_job(c.store, job)


def _revive(c: Cluster):
    return revive_services(c.config, c.store, c.view(), NodeOps(c.config, c.prober))


def test_a_rebooted_nodes_service_is_started_again_once_on_its_own_gpus(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    job = _running(c)
    c.nodes.liveness["node01"] = REBOOTED
    rows = [r for r in c.view().gpus_of("node01") if r.claim is not None]
    assert [(r.state, r.reason) for r in rows] == [(GpuState.CLAIMED, SERVICE_DOWN)]
    launches = len(c.nodes.launched())
    revival = _revive(c)
    assert [(j.name, cause) for j, cause in revival.started] == [("llm", "node01 rebooted")]
    spec = c.nodes.launched()[-1]
    assert len(c.nodes.launched()) == launches + 1 and spec["revived"] == "node01 rebooted"
    rank = job.ranks[0]
    assert spec["placed"]["indices"] == dict(zip(rank.gpu_uuids, rank.gpus))
    again = reload_job(c.store, job)
    assert again.restarts == 1 and again.health == "starting"
    assert again.ranks[0].claim_id == rank.claim_id  # the same claim, never given up
    down = [e for e in c.store.read_events()[0] if e.type == "service-down"]
    assert [(e.reason, e.extra["job"]) for e in down] == [("node01 rebooted", "llm")]
    # a second look meanwhile (the new wrapper has not beaten yet) does not start it twice
    assert _revive(c).started == [] and len(c.nodes.launched()) == launches + 1


def test_a_service_killed_while_down_lets_its_gpus_go(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    job = _running(c)
    c.store.update_job(job_id=job.id, changes={"stop_requested": "kill"})
    c.nodes.liveness["node01"] = REBOOTED
    launches = len(c.nodes.launched())
    assert _revive(c).started == [] and len(c.nodes.launched()) == launches
    assert reload_job(c.store, job).state == "killed"  # as asked, its node away or not
    assert c.states("node01") == [GpuState.FREE, GpuState.FREE]


def test_a_service_that_cannot_start_again_says_why_and_stays_held(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    job = _running(c)
    c.nodes.liveness["node01"] = REBOOTED
    c.nodes.broken_launch.add("node01")
    revival = _revive(c)
    assert [(j.name, "server exited" in why) for j, why in revival.failed] == [("llm", True)]
    assert reload_job(c.store, job).health == "down"
    assert GpuState.CLAIMED in c.states("node01")


def test_a_living_wrapper_or_missed_beats_alone_start_nothing(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    job = _running(c)
    me = [os.getpid(), process_start(os.getpid())]
    c.nodes.liveness["node01"] = {"boot_id": boot_id(), "wrappers": [me], "checked_from": 0}
    launches = len(c.nodes.launched())
    assert _revive(c).started == [] and len(c.nodes.launched()) == launches
    # its beats stop (a storage stall?) and the node cannot tell: held, shown down, not started
    beat = tmp_path / "store" / "beats" / (job.ranks[0].claim_id or "")
    os.utime(beat, (c.clock.now - 60, c.clock.now - 60))
    c.nodes.liveness.pop("node01")
    view = c.view()
    [row] = [r for r in view.gpus_of("node01") if r.claim is not None]
    assert (row.state, row.reason) == (GpuState.CLAIMED, SERVICE_DOWN)
    assert observed_health(reload_job(c.store, job), view.snapshot.claims) == "down"
    assert _revive(c).started == [] and len(c.nodes.launched()) == launches


def test_a_batch_jobs_claim_in_the_same_case_is_lost(tmp_path: Path) -> None:
    c = make_cluster(tmp_path)
    _running(c, kind=JobKind.BATCH.value)
    c.nodes.liveness["node01"] = REBOOTED
    rows = [r for r in c.view().gpus_of("node01") if r.claim is not None]
    assert [(r.state, r.reason) for r in rows] == [(GpuState.STALE, "job lost")]


def test_fair_share_counts_a_services_gpu_hours_down_or_up(tmp_path: Path) -> None:
    from gpuclaim.engine.fairshare import use_by_user

    c = make_cluster(tmp_path)
    _running(c)
    c.clock.advance(3600)
    up = use_by_user(c.config, c.store, c.store.snapshot()).get("ann", 0.0)
    assert up > 3000  # one GPU for an hour, barely decayed
    c.nodes.liveness["node01"] = REBOOTED  # down: its GPU is still held, so still counted
    assert use_by_user(c.config, c.store, c.view().snapshot).get("ann", 0.0) == up
