"""Which looks may be answered from a warm agent's earlier GPU read (node/recent_reads.py):
those shown to people (status, the board, metrics) up to ``gpu_read_max_age``; never the
looks claims, placement and the queue decide on."""

from __future__ import annotations

from pathlib import Path

from gpuclaim.engine.cluster import build_view, shown_max_age

from .fakes import make_cluster


def _probe_ages(cluster) -> list[object]:  # type: ignore[no-untyped-def]
    return [args.get("max_age_s") for _, op, args in cluster.nodes.calls if op == "probe"]


def test_a_look_shown_to_people_allows_the_configured_age(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, gpu_read_max_age="3s")
    assert shown_max_age(c.config) == 3.0
    build_view(c.config, c.store, prober=c.prober, max_age_s=shown_max_age(c.config))
    assert _probe_ages(c) == [3.0]


def test_the_default_is_one_second_and_zero_turns_it_off(tmp_path: Path) -> None:
    assert shown_max_age(make_cluster(tmp_path / "a").config) == 1.0
    off = make_cluster(tmp_path / "b", gpu_read_max_age=0)
    build_view(off.config, off.store, prober=off.prober, max_age_s=shown_max_age(off.config))
    assert _probe_ages(off) == [None]  # the request carries no age: read now


def test_claims_and_the_queue_decide_on_a_read_made_now(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, gpu_read_max_age="5s")
    c.claim("alice")
    c.queue("bob", "later", count=2)
    c.dispatch()
    ages = _probe_ages(c)
    assert ages and all(age is None for age in ages), ages
