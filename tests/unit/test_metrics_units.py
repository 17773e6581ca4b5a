"""``gpuclaim metrics`` in process: the series one look makes (parsed back with
prometheus_client's own parser), and looks reused within --min-interval."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuclaim.app.metrics import CachedLooks, exposition, take_look
from gpuclaim.core.model import JobKind, iso
from gpuclaim.core.service import ServiceSpec
from gpuclaim.engine.jobs import RunRequest, submit_job
from gpuclaim.engine.launch import NodeOps
from tests.unit.fakes import HOUR, make_cluster, recorded_gpus


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_one_look_says_who_holds_what_queues_books_and_serves(tmp_path: Path) -> None:
    # ann claims node01's GPU 0 and node02's, which then works at 87 % (busy)
    c = make_cluster(tmp_path, {"node01": 2, "node02": 2})
    c.claim("ann", count=1, node="node01")
    c.claim("ann", exact=(("node02", (0,)),))
    first, second = recorded_gpus("node02", 2)
    c.nodes.gpus["node02"] = (first.replace(utilization_pct=87), second)
    req = RunRequest(
        user="bob", argv=("vllm", "serve"), name="llm", kind=JobKind.SERVICE.value,
        service=ServiceSpec(port=8000), node="node01",
    )  # fmt: skip
    job = submit_job(c.config, c.store, req, c.prober)
    running = {"state": "running", "started": iso(c.clock.now), "health": "healthy"}
    c.store.update_job(job_id=job.id, changes={**running, "restarts": 2})
    c.queue("cem", "later", count=2)
    c.book("dee", start_in=2 * HOUR, node="node02")
    look = take_look(c.config, c.store, c.prober, NodeOps(c.config, c.prober))
    seen = _series(exposition(look).decode())
    assert seen[("gpuclaim_claimed_gpus", (("node", "node01"), ("user", "ann")))] == 1
    assert seen[("gpuclaim_claimed_gpus", (("node", "node02"), ("user", "ann")))] == 1
    assert seen[("gpuclaim_held_gpus_busy_ratio", (("user", "ann"),))] == 0.5
    assert seen[("gpuclaim_gpus", (("node", "node01"), ("state", "claimed")))] == 2
    assert seen[("gpuclaim_queued_jobs", (("user", "cem"),))] == 1
    assert seen[("gpuclaim_bookings", (("user", "dee"),))] == 1
    llm = (("node", "node01"), ("service", "llm"), ("user", "bob"))

    def health(state: str) -> float:
        return seen[("gpuclaim_service_health", (("gpuclaim_service_health", state), *llm))]

    assert (health("healthy"), health("down"), health("starting")) == (1, 0, 0)
    assert seen[("gpuclaim_service_restarts_total", llm)] == 2
    assert seen[("gpuclaim_node_up", (("node", "node02"),))] == 1


def test_looks_are_reused_within_the_min_interval() -> None:
    taken: list[int] = []

    def take() -> object:
        taken.append(1)
        return len(taken)

    looks = CachedLooks(take, min_interval_s=60)  # type: ignore[arg-type]
    assert [looks(), looks(), looks()] == [1, 1, 1]
    looks.min_interval_s = 0
    assert looks() == 2
