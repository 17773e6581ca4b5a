"""Bookings (engine/bookings.py): made all or nothing, never overlapping another or a claim
that lasts into them, within the cluster's limits; settled by whoever looks (used, over,
no-show after the grace); cancelled by their owner (or with --force)."""

from __future__ import annotations

import pytest

from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    NeverFitsError,
    UnreachableError,
    UsageError,
)
from gpuclaim.engine.bookings import (
    backfill_hint,
    blocking,
    booking_for,
    cancel_booking,
    drop_old_bookings,
    gpus_by_node,
    settle_bookings,
    shown_booking,
)
from gpuclaim.engine.claims import release_claims

from .fakes import HOUR, T0, make_cluster

DAY = 24 * HOUR


def live(c):
    return [b.id for b in c.store.bookings()]


def ended(c):
    return {e.booking.id: (e.why, e.booking.used) for e in c.store.ended_bookings()}


def events(c, kind):
    return [e for e in c.store.read_events()[0] if e.type == kind]


def settle(c):
    return settle_bookings(c.config, c.store, c.store.snapshot()).bookings


@pytest.fixture
def c(tmp_path):
    return make_cluster(tmp_path, {"node01": 2})


# -- making one ----------------------------------------------------------------------------------


def test_a_booking_is_written_with_its_event_and_whole_second_times(c):
    b = c.book("alice", start_in=HOUR + 0.4, length=2 * HOUR, count=2)
    assert (b.node, b.indices, b.start, b.end) == ("node01", [0, 1], T0 + HOUR, T0 + 3 * HOUR)
    assert live(c) == [b.id]
    (event,) = events(c, "reserve")
    assert event.user == "alice" and event.extra["reservation"] == b.id
    assert event.extra["gpu_hours"] == 4.0


def test_best_fit_books_the_node_with_the_fewest_gpus_free_then(tmp_path):
    c = make_cluster(tmp_path, {"node01": 4, "node02": 2})
    assert c.book("alice", HOUR, count=2).node == "node02"
    assert c.book("alice", HOUR, count=2).node == "node01"  # node02 is booked then


def test_an_overlapping_booking_is_refused_naming_the_one_in_the_way(c):
    first = c.book("alice", HOUR, length=HOUR, exact=(("node01", (0, 1)),))
    with pytest.raises(ConflictError) as err:
        c.book("bob", HOUR + 600, length=HOUR, exact=(("node01", (1,)),))
    assert "node01 GPU 1 is reserved by alice from " in err.value.message
    assert f"(reservation {first.id})" in err.value.message
    with pytest.raises(ConflictError, match=r"no node has 1 GPU free from .*node01 0/2 free then"):
        c.book("bob", HOUR + 600, length=HOUR)
    assert live(c) == [first.id]


def test_windows_are_half_open_one_may_start_when_another_ends(c):
    first = c.book("alice", HOUR, length=HOUR, count=2)
    second = c.book("bob", 2 * HOUR, length=HOUR, count=2)
    assert second.start == first.end
    assert sorted(live(c)) == sorted([first.id, second.id])


def test_a_claim_lasting_into_the_window_is_in_the_way_one_ending_before_is_not(c):
    held = c.claim("bob", exact=(("node01", (1,)),), time_s=2 * HOUR)
    with pytest.raises(ConflictError, match=f"GPU 1 is claimed by bob \\(claim {held.id}\\)"):
        c.book("alice", HOUR, exact=(("node01", (0, 1)),))
    assert live(c) == []
    assert c.book("alice", HOUR).indices == [0]  # -n finds the GPU free then
    assert c.book("alice", 2 * HOUR, exact=(("node01", (1,)),)).indices == [1]


def test_ones_own_claim_never_keeps_one_from_booking(c):
    c.claim("alice", 2, time_s=3 * HOUR)
    assert c.book("alice", HOUR, count=2).indices == [0, 1]


@pytest.mark.parametrize(
    "start_in, length, words",
    [
        (-2 * HOUR, HOUR, "is in the past"),
        (HOUR, 0, "before it starts"),
        (HOUR, 3 * HOUR, "longer than this cluster's limit of 2h (max_reservation)"),
        (3 * DAY, HOUR, "at most 2d ahead (reserve_ahead)"),
    ],
)
def test_windows_the_limits_refuse_are_usage_errors_and_nothing_is_written(
    tmp_path, start_in, length, words
):
    c = make_cluster(tmp_path, max_reservation="2h", reserve_ahead="2d")
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        c.book("alice", start_in, length)
    assert live(c) == [] and events(c, "reserve") == []


def test_a_start_typed_a_moment_ago_is_not_in_the_past(c):
    assert c.book("alice", -30, HOUR).start == T0 - 30


def test_booked_gpu_hours_per_user_are_capped_counting_only_what_is_left(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2}, max_reserved_gpu_hours=3)
    c.book("alice", 0, length=2 * HOUR)  # 2 GPU-hours
    with pytest.raises(UsageError, match=r"alice has 2\.0 GPU-hours booked; 2\.0 more would pass"):
        c.book("alice", 2 * HOUR, length=HOUR, count=2)
    assert c.book("bob", 2 * HOUR, length=HOUR, count=2).user == "bob"  # per user
    c.clock.advance(600)
    c.claim("alice", 1, time_s=60)  # she came: no no-show
    with pytest.raises(UsageError, match=r"alice has 1\.8 GPU-hours booked"):
        c.book("alice", 4 * HOUR, length=HOUR, count=2)
    c.clock.advance(HOUR - 600)  # an hour of hers is behind her: 1 GPU-hour left
    assert len(c.book("alice", 4 * HOUR, length=HOUR, count=2).gpus) == 2


def test_more_gpus_than_a_node_has_or_a_gpu_it_lacks_can_never_be_booked(c):
    with pytest.raises(NeverFitsError, match="3 GPUs can never be booked together"):
        c.book("alice", HOUR, count=3)
    with pytest.raises(NeverFitsError, match=r"node01 has no GPU 7 \(it has 0, 1\)"):
        c.book("alice", HOUR, exact=(("node01", (7,)),))


def test_an_unreachable_node_is_left_out_and_none_answering_is_an_error(tmp_path):
    c = make_cluster(tmp_path, {"node01": 2, "node02": 2})
    c.nodes.down["node01"] = "ssh: connect to host node01 port 22: No route to host"
    assert c.book("alice", HOUR, count=2).node == "node02"
    inventories = c.prober.probe(c.config.nodes)
    assert set(gpus_by_node(inventories, c.config.nodes)) == {"node02"}
    with pytest.raises(UnreachableError, match="node01: ssh: connect"):
        c.book("alice", HOUR, exact=(("node01", (0,)),))


# -- settling: used, over, no-show --------------------------------------------------------


def test_a_no_show_is_released_after_the_grace_once_with_its_event(tmp_path):
    c = make_cluster(tmp_path, reserve_grace="30m")
    b = c.book("alice", 60, length=4 * HOUR, count=2)
    c.clock.advance(60 + 29 * 60)
    assert [x.id for x in settle(c)] == [b.id]
    assert c.states("node01") == ["reserved", "reserved"]
    c.clock.advance(60)
    assert settle(c) == [] and settle(c) == []
    assert ended(c) == {b.id: ("no-show", None)}
    (event,) = events(c, "reserve-noshow")
    assert event.extra["grace"] == "30m" and "nobody claimed" in event.reason
    assert c.states("node01") == ["free", "free"]
    assert c.claim("bob", 2).indices == [0, 1]


def test_a_booking_used_in_its_window_is_no_no_show_and_ends_over(tmp_path):
    c = make_cluster(tmp_path, reserve_grace="30m")
    b = c.book("alice", 60, length=2 * HOUR, count=1)
    c.clock.advance(120)
    mine = c.claim("alice", 1, time_s=600)
    release_claims(c.config, c.store, "alice", claim_ids=[mine.id])  # came, and left at once
    c.clock.advance(HOUR)
    (still,) = settle(c)
    assert still.used == T0 + 120
    assert c.states("node01") == ["reserved", "free"]
    c.clock.advance(HOUR)
    assert settle(c) == []
    assert ended(c) == {b.id: ("over", T0 + 120)}
    assert len(events(c, "reserve-end")) == 1 and events(c, "reserve-noshow") == []


def test_an_owner_holding_the_gpus_when_someone_looks_marks_it_used(tmp_path):
    c = make_cluster(tmp_path, reserve_grace="30m")
    c.claim("alice", 1, time_s=3 * HOUR)  # before the window: claimed, not booked yet
    b = c.book("alice", 60, length=HOUR, exact=(("node01", (0,)),))
    c.clock.advance(61)
    assert [x.used for x in settle(c)] == [T0 + 61]
    c.clock.advance(HOUR)
    assert ended(c) == {} and settle(c) == []
    assert ended(c)[b.id][0] == "over"


def test_a_no_show_nobody_released_yet_books_nothing(tmp_path):
    c = make_cluster(tmp_path, {"node01": 1}, reserve_grace="10m")
    first = c.book("alice", 0, length=4 * HOUR)
    c.clock.advance(11 * 60)  # nobody looked since
    second = c.book("bob", 60, length=HOUR)
    assert second.indices == [0]
    assert ended(c) == {first.id: ("no-show", None)}


# -- cancelling ---------------------------------------------------------------------------------


def test_the_owner_cancels_and_it_ends_as_cancelled(c):
    b = c.book("alice", HOUR)
    cancel_booking(c.store, "alice", b.id)
    assert live(c) == [] and ended(c) == {b.id: ("cancelled", None)}
    (event,) = events(c, "reserve-cancel")
    assert event.by is None
    with pytest.raises(GpuclaimError, match="has already ended \\(cancelled\\)"):
        cancel_booking(c.store, "alice", b.id)


def test_someone_elses_booking_is_cancelled_only_with_force_and_says_by_whom(c):
    b = c.book("alice", HOUR)
    with pytest.raises(ConflictError, match="belongs to alice") as err:
        cancel_booking(c.store, "bob", b.id)
    assert "--force" in (err.value.hint or "")
    assert live(c) == [b.id]
    cancel_booking(c.store, "bob", b.id, force=True)
    assert events(c, "reserve-cancel")[0].by == "bob"


def test_cancelling_an_unknown_booking(c):
    with pytest.raises(GpuclaimError, match="no reservation 'r-nothere'"):
        cancel_booking(c.store, "alice", "r-nothere")


def test_ended_bookings_are_dropped_after_keep_reservations(tmp_path):
    c = make_cluster(tmp_path, keep_reservations="10d")
    old = c.book("alice", 60, length=HOUR)
    c.clock.advance(2 * DAY)
    recent = c.book("alice", 60, length=HOUR)
    c.clock.advance(9 * DAY)
    settle(c)
    assert set(ended(c)) == {old.id, recent.id}
    assert drop_old_bookings(c.config, c.store).dropped == 1
    assert set(ended(c)) == {recent.id}


# -- what bookings mean for a claim -----------------------------------------------------------


def test_blocking_is_another_users_overlapping_booking_the_earliest_first(tmp_path):
    c = make_cluster(tmp_path, {"node01": 1})
    late = c.book("alice", 3 * HOUR)
    early = c.book("carol", HOUR)
    uuid = early.uuids[0]
    bookings = c.store.snapshot().bookings
    now = c.clock.now
    assert blocking(bookings, uuid, "bob", now, now + 4 * HOUR) == early
    assert blocking(bookings, uuid, "bob", now, now + HOUR) is None  # ends as it starts
    assert blocking(bookings, uuid, "carol", now, now + 4 * HOUR) == late  # not one's own
    assert blocking(bookings, "GPU-other", "bob", now, now + 4 * HOUR) is None


def test_a_gpu_row_shows_the_open_booking_else_the_next_within_a_day(tmp_path):
    c = make_cluster(tmp_path, {"node01": 1})
    soon = c.book("alice", 23 * HOUR)
    c.book("bob", 2 * DAY)
    bookings, uuid = c.store.snapshot().bookings, soon.uuids[0]
    assert shown_booking(bookings, uuid, c.clock.now) == soon
    assert shown_booking(bookings, uuid, c.clock.now - 2 * HOUR) is None  # 25 h ahead
    assert shown_booking(bookings, uuid, soon.end).user == "bob"


def test_claiming_a_booking_by_id_is_for_its_owner_alone(c):
    b = c.book("alice", HOUR)
    snap = c.store.snapshot()
    assert booking_for(snap, b.id, "alice") == b
    with pytest.raises(ConflictError, match="belongs to alice"):
        booking_for(snap, b.id, "bob")
    with pytest.raises(GpuclaimError, match="no live reservation 'r-gone'"):
        booking_for(snap, "r-gone", "alice")


def test_the_backfill_hint_leaves_a_margin_and_is_silent_when_there_is_no_room(c):
    b = c.book("alice", 1800)
    assert backfill_hint(b, c.clock.now) == (
        "a claim that ends before then is allowed: --time 29m or less"
    )
    assert backfill_hint(b, b.start - 9) is None
