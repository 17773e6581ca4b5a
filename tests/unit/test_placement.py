"""Where a claim goes (engine/placement.py): best fit across nodes, exactly the GPUs named, or
the ones running one's processes; never onto busy, drained or someone else's booked GPUs,
but a hold that ends before a booking starts may backfill it."""

from __future__ import annotations

import pytest

from gpuclaim.core import errors
from gpuclaim.engine import placement
from gpuclaim.engine.claims import drain_node
from gpuclaim.engine.placement import ClaimRequest

from .fakes import HOUR, make_cluster


def where(c, user="bob", count=1, duration=HOUR, **more):
    """(node, indices) pick_free chooses now."""
    node, rows = placement.pick_free(
        c.config, c.view(), ClaimRequest(user, count, **more), duration
    )
    return node, [r.index for r in rows]


def exact(c, node, indices, user="bob", duration=HOUR):
    req = ClaimRequest(user, exact=((node, tuple(indices)),))
    node, rows = placement.pick_exact(c.view(), req, duration)
    return node, [r.index for r in rows]


@pytest.fixture
def small_big(tmp_path):
    return make_cluster(tmp_path, {"node01": 2, "node02": 4})


# -- best fit -----------------------------------------------------------------------------------


def test_best_fit_takes_the_node_with_the_fewest_free_gpus_that_still_fits(small_big):
    assert where(small_big, count=2) == ("node01", [0, 1])
    assert where(small_big, count=3) == ("node02", [0, 1, 2])


def test_a_partly_held_node_is_the_better_fit_for_a_small_request(small_big):
    small_big.claim("carol", 1, node="node02")
    assert where(small_big, count=3) == ("node02", [1, 2, 3])
    assert where(small_big, count=1) == ("node01", [0])  # 2 free beats 3 free


def test_equal_nodes_are_taken_in_config_order(tmp_path):
    c = make_cluster(tmp_path, {"node02": 2, "node01": 2})
    assert where(c)[0] == "node02"


def test_more_gpus_than_any_node_has_can_never_fit(small_big):
    with pytest.raises(errors.NeverFitsError, match="5 GPUs can never fit: the largest node has 4"):
        where(small_big, count=5)
    with pytest.raises(errors.NeverFitsError, match="3 GPUs can never fit: node01 has 2"):
        where(small_big, count=3, node="node01")


def test_a_gpu_running_a_process_no_claim_covers_is_never_placed_on(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2}, busy={"node01": [0]})
    row = c.view().gpus_of("node01")[0]
    assert row.state == "busy-unclaimed" and "llama-server (pid 100477)" in row.reason
    assert where(c) == ("node01", [1])
    with pytest.raises(
        errors.ConflictError, match=r"no node has 2 GPUs free now \(node01 1/2 free\)"
    ):
        where(c, count=2)


def test_an_expired_claims_gpu_is_taken_but_after_the_free_ones(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2})
    c.claim("carol", 1, time_s=600)
    c.clock.advance(601)
    view = c.view()
    assert [r.state for r in view.gpus_of("node01")] == ["stale", "free"]
    rows = placement.usable_rows(view, "node01", ClaimRequest("bob"), c.clock.now + HOUR)
    assert [r.index for r in rows] == [1, 0]
    assert where(c) == ("node01", [1])


def test_a_drained_node_gets_nothing_and_the_message_says_so(small_big):
    drain_node(small_big.config, small_big.store, "root", "node01", "new driver")
    assert where(small_big, count=2)[0] == "node02"
    small_big.claim("carol", 4, node="node02")
    with pytest.raises(errors.ConflictError, match=r"\(node01 drained, node02 0/4 free\)"):
        where(small_big)


def test_an_unreachable_node_is_skipped_and_none_reachable_says_why(small_big):
    small_big.nodes.down["node01"] = "ssh: connect to host node01 port 22: No route to host"
    assert where(small_big)[0] == "node02"
    small_big.nodes.down["node02"] = "ssh: connect to host node02 port 22: Connection refused"
    with pytest.raises(errors.UnreachableError, match=r"node01: ssh: connect.*No route to host"):
        where(small_big)


# -- exactly the GPUs named -------------------------------------------------------------------


def test_exact_gpus_free_are_given_in_index_order(small_big):
    assert exact(small_big, "node02", [3, 1]) == ("node02", [3, 1])


def test_an_exact_gpu_someone_holds_names_the_holder_and_the_claim(small_big):
    held = small_big.claim("carol", exact=(("node01", (1,)),))
    with pytest.raises(
        errors.ConflictError, match=f"node01 GPU 1 is held by carol \\({held.id}\\)"
    ):
        exact(small_big, "node01", [0, 1])


def test_an_exact_gpu_that_is_busy_says_with_what(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2}, busy={"node01": [1]})
    with pytest.raises(errors.ConflictError, match="node01 GPU 1 is busy: no claim: llama-server"):
        exact(c, "node01", [1])


def test_an_exact_gpu_the_node_does_not_have_lists_the_ones_it_has(small_big):
    with pytest.raises(errors.NeverFitsError, match=r"node01 has no GPU 7 \(it has 0, 1\)"):
        exact(small_big, "node01", [7])


def test_exact_gpus_on_a_drained_or_unreachable_node(small_big):
    drain_node(small_big.config, small_big.store, "root", "node01", "new driver")
    with pytest.raises(errors.ConflictError, match="node01 is drained by root: new driver"):
        exact(small_big, "node01", [0])
    small_big.nodes.down["node02"] = "ssh: timed out"
    with pytest.raises(errors.UnreachableError, match="node02 cannot be reached: ssh: timed out"):
        exact(small_big, "node02", [0])


def test_one_claim_holds_gpus_of_one_node(small_big):
    req = ClaimRequest("bob", exact=(("node01", (0,)), ("node02", (0,))))
    with pytest.raises(errors.UsageError, match="one claim holds GPUs of one node"):
        placement.candidate_nodes(small_big.config, req)
    assert [n.name for n in placement.candidate_nodes(small_big.config, ClaimRequest("bob"))] == [
        "node01",
        "node02",
    ]


# -- bookings: others kept off, the owner first, backfill before ----------------------------


def test_someone_elses_open_booking_is_reserved_for_them_alone(tmp_path):
    c = make_cluster(tmp_path, {"node01": 3})
    booking = c.book("alice", start_in=10, exact=(("node01", (1, 2)),))
    c.clock.advance(10)
    assert c.states("node01") == ["free", "reserved", "reserved"]
    assert where(c, user="bob") == ("node01", [0])
    with pytest.raises(
        errors.ConflictError, match=f"reserved by alice .*\\(reservation {booking.id}\\)"
    ):
        where(c, user="bob", count=2)
    with pytest.raises(errors.ConflictError, match="reserved by alice"):
        exact(c, "node01", [1], user="bob")


def test_the_owner_gets_their_booked_gpus_first_and_their_hold_ends_with_the_booking(tmp_path):
    c = make_cluster(tmp_path, {"node01": 3, "node02": 1})
    booking = c.book("alice", start_in=5, length=HOUR, exact=(("node01", (1, 2)),))
    c.clock.advance(5)
    # alice's booking beats best fit (node02's single GPU)
    assert where(c, user="alice", count=1) == ("node01", [1])
    assert where(c, user="alice", count=2) == ("node01", [1, 2])
    claim = c.claim("alice", 2, time_s=None)
    assert claim.indices == [1, 2] and claim.expires == booking.end


def test_hold_until_is_cut_at_the_owners_booking_end_only_without_a_duration(tmp_path):
    c = make_cluster(tmp_path, {"node01": 1})
    booking = c.book("alice", start_in=0, length=600)
    row = c.view().gpus_of("node01")[0]
    now, far = c.clock.now, c.clock.now + 4 * HOUR
    assert placement.hold_until(row, ClaimRequest("alice"), now, far) == booking.end
    assert placement.hold_until(row, ClaimRequest("alice", duration_s=4 * HOUR), now, far) == far
    assert placement.hold_until(row, ClaimRequest("bob"), now, far) == far


def test_a_hold_ending_before_a_booking_starts_backfills_it(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2})
    c.book("alice", start_in=HOUR, count=2)
    assert c.states("node01") == ["free", "free"]  # not open yet: free for now
    assert where(c, user="bob", count=2, duration=HOUR - 60) == ("node01", [0, 1])
    with pytest.raises(errors.ConflictError) as err:
        where(c, user="bob", count=1, duration=2 * HOUR)
    assert "reserved by alice" in err.value.message and "would overlap it" in err.value.message
    assert err.value.hint == "a claim that ends before then is allowed: --time 59m or less"


def test_a_hold_ending_exactly_when_the_booking_starts_is_allowed(tmp_path):
    c = make_cluster(tmp_path, {"node01": 1})
    c.book("alice", start_in=HOUR)
    rows = placement.usable_rows(c.view(), "node01", ClaimRequest("bob"), c.clock.now + HOUR)
    assert len(rows) == 1
    assert (
        placement.usable_rows(c.view(), "node01", ClaimRequest("bob"), c.clock.now + HOUR + 1) == []
    )


# -- adopting one's running processes ---------------------------------------------------------


def test_adopt_takes_the_unclaimed_gpus_running_the_users_processes(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2, "node02": 2}, busy={"node02": [0, 1]})
    # the node maps each pid to its owner: the recorded llama-server is alice's
    c.nodes.gpus["node02"] = tuple(
        g.replace(processes=tuple(p.replace(user="alice") for p in g.processes))
        for g in c.nodes.gpus["node02"]
    )
    node, rows = placement.pick_adopt(c.view(), ClaimRequest("alice", adopt=True))
    assert (node, [r.index for r in rows]) == ("node02", [0, 1])
    with pytest.raises(errors.GpuclaimError, match="no unclaimed GPU runs a process of bob"):
        placement.pick_adopt(c.view(), ClaimRequest("bob", adopt=True))
