"""Shares of one GPU by memory (``--gpu-mem 20G`` / ``--gpu-share 0.25``): the sizes typed,
the share files in the store beside whole claims, where a share is placed, how limits and
accounting count it by its part."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuclaim.app.history import claim_intervals
from gpuclaim.core import errors
from gpuclaim.core.config import parse_config
from gpuclaim.core.events import claim_event, event_gpu_weight
from gpuclaim.core.model import Claim, ClaimedGpu, EventType
from gpuclaim.core.share_policy import (
    SharePolicy,
    checked_share,
    format_mib,
    gpu_count,
    holders_text,
    parse_gpu_mem,
    parse_gpu_share,
    parse_share_policy,
    share_mib,
)
from gpuclaim.core.states import GpuState
from gpuclaim.engine.claims import held_gpus
from gpuclaim.engine.placement import ClaimRequest
from gpuclaim.store import Snapshot, new_claim_id

from .fakes import HOUR, T0, make_cluster

H100 = 81559  # MiB an "80 GB" GPU reports: 85.5G in the units typed
G20 = 19074  # --gpu-mem 20G


def h100_cluster(tmp_path, count=2, **defaults):
    """One node of ``count`` idle GPUs of H100's memory size."""
    c = make_cluster(tmp_path, {"node01": count}, **defaults)
    c.nodes.gpus["node01"] = tuple(g.replace(memory_total_mib=H100) for g in c.nodes.gpus["node01"])
    return c


def uuid_of(c, index):
    return c.nodes.gpus["node01"][index].uuid


def share(uuid, mem, user="alice", total=H100, expires=T0 + HOUR, index=0, claim_id=None):
    """A share's claim as the engine writes it (placed on ``uuid`` of node01)."""
    return Claim(
        id=claim_id or new_claim_id(),
        user=user,
        node="node01",
        gpus=(ClaimedGpu(uuid, index),),
        since=T0,
        expires=expires,
        mem_mib=mem,
        mem_total_mib=total,
    )


def whole(uuid, user="bob", index=0):
    return Claim(
        id=new_claim_id(),
        user=user,
        node="node01",
        gpus=(ClaimedGpu(uuid, index),),
        since=T0,
        expires=T0 + HOUR,
    )


def share_req(user="alice", **more):
    return ClaimRequest(user=user, duration_s=HOUR, **more)


# -- the sizes people type ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("20G", 19074),  # 20 * 10^9 bytes, rounded up to whole MiB
        ("20g", 19074),
        ("20GB", 19074),
        ("20Gi", 20480),
        ("1.5Gi", 1536),
        ("512Mi", 512),
        ("20M", 20),  # 20 * 10^6 bytes = 19.07 MiB, rounded up
        ("900", 900),  # a bare number is MiB, as nvidia-smi counts
        (" 40 Gi ", 40960),
        ("1T", 953675),
    ],
)
def test_gpu_mem_reads_kubernetes_units_and_bare_mib(text, mib):
    assert parse_gpu_mem(text) == mib


@pytest.mark.parametrize("text", ["twenty", "20X", "-5G", "", "G", "0", "512K", "1e4"])
def test_gpu_mem_refuses_what_is_no_size_or_under_one_mib(text):
    with pytest.raises(errors.UsageError, match="--gpu-mem"):
        parse_gpu_mem(text)


@pytest.mark.parametrize(("text", "part"), [("0.25", 0.25), ("25%", 0.25), (" 0.5 ", 0.5)])
def test_gpu_share_reads_a_part_or_a_percent(text, part):
    assert parse_gpu_share(text) == pytest.approx(part)


@pytest.mark.parametrize("text", ["0", "1", "100%", "1.5", "-0.1", "0%", "nan", "abc", "%"])
def test_gpu_share_outside_zero_and_one_or_not_a_number_is_refused(text):
    with pytest.raises(errors.UsageError, match="--gpu-share"):
        parse_gpu_share(text)


def test_checked_share_refuses_both_options_and_more_than_one_gpu_or_node():
    checked_share(G20, 0.0, 1, 1)  # one option, one GPU of one node: fine
    checked_share(0, 0.0, 4, 2)  # no share at all: whole GPUs, any count
    with pytest.raises(errors.UsageError, match="not both"):
        checked_share(G20, 0.25, 1, 1)
    with pytest.raises(errors.UsageError, match="part of one GPU"):
        checked_share(G20, 0.0, 2, 1)
    with pytest.raises(errors.UsageError, match="part of one GPU"):
        checked_share(0, 0.25, 1, 2)


def test_share_mib_is_the_size_asked_or_the_part_of_the_gpus_total():
    assert share_mib(H100, G20, 0.0) == G20
    assert share_mib(H100, 0, 0.25) == 20389  # int(81559 * 0.25)
    assert share_mib(0, 0, 0.25) == 1  # a GPU of unknown size: never a share of nothing


def test_sizes_and_counts_are_shown_in_the_units_typed():
    assert format_mib(G20) == "20G"
    assert format_mib(H100) == "85.5G"
    assert format_mib(512) == "537M"
    assert gpu_count(3) == "3"
    assert gpu_count(0.25) == "0.25"
    assert gpu_count(1 / 3) == "0.33"
    holders = [("alice", G20), ("bob", 2 * G20)]
    assert holders_text(holders, G20) == "alice 20G · bob 40G · 20G free"
    assert holders_text(holders, None) == "alice 20G · bob 40G"
    assert holders_text([], -5) == "0M free"  # never a negative room


def test_share_table_defaults_to_flag_and_refuses_bad_modes_paths_and_keys(tmp_path):
    assert parse_share_policy({}) == SharePolicy(enforce="flag", preload=None)
    lib = "/opt/hami/libvgpu.so"
    assert parse_share_policy({"enforce": "kill", "preload": lib}) == SharePolicy("kill", lib)
    with pytest.raises(errors.ConfigError, match=r"share\.enforce"):
        parse_share_policy({"enforce": "stop"})
    with pytest.raises(errors.ConfigError, match="absolute path"):
        parse_share_policy({"preload": "libvgpu.so"})
    with pytest.raises(errors.ConfigError, match="unknown key 'cap'"):
        parse_share_policy({"cap": True})
    raw = {"nodes": ["node01"], "storage": str(tmp_path), "share": {"enforce": "kill"}}
    assert parse_config(raw).share.enforce == "kill"


# -- the claim record ---------------------------------------------------------------------------


def test_a_share_claim_counts_by_its_part_and_round_trips_while_old_records_stay_whole():
    s = share("GPU-a", H100 // 4)
    assert s.shared and s.fraction == pytest.approx(0.25, abs=1e-4)
    assert s.gpu_weight == pytest.approx(s.fraction)
    back = Claim.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.mem_mib == H100 // 4 and back.mem_total_mib == H100
    old = s.to_dict()
    del old["mem_mib"], old["mem_total_mib"]  # a record written before shares existed
    legacy = Claim.from_dict(old)
    assert not legacy.shared and legacy.fraction == 1.0 and legacy.gpu_weight == 1.0
    two = dataclasses.replace(whole("GPU-a"), gpus=(ClaimedGpu("GPU-a", 0), ClaimedGpu("GPU-b", 1)))
    assert two.gpu_weight == 2.0


# -- share files in the store -------------------------------------------------------------------


def test_a_share_is_its_own_file_under_the_gpus_shares_dir_and_the_snapshot_judges_it(tmp_path):
    c = h100_cluster(tmp_path)
    u = uuid_of(c, 0)
    s = share(u, G20)
    c.store.acquire(s)
    path = c.store.root / "gpus" / f"{u}.shares" / f"{s.id}.share"
    assert path.is_file()
    assert not (c.store.root / "gpus" / f"{u}.claim").exists()
    snap = c.store.snapshot()
    assert [f.claim for f in snap.shares[u]] == [s]
    assert u not in snap.files
    assert snap.claims[s.id].state == GpuState.CLAIMED
    assert [st.claim.id for st in snap.shares_of(u)] == [s.id]
    assert snap.damaged_shares(u) == [] and snap.corrupt() == []


def test_shares_past_the_gpus_memory_are_refused_naming_the_holders(tmp_path):
    c = h100_cluster(tmp_path)
    u = uuid_of(c, 0)
    for user in ("alice", "bob", "carol", "dave"):  # 4 x 20G = 76296 MiB of 81559
        c.store.acquire(share(u, G20, user=user))
    with pytest.raises(
        errors.ConflictError, match=r"has 5\.5G unshared, 20G wanted \(.*alice 20G.* 5\.5G free\)"
    ):
        c.store.acquire(share(u, G20, user="erin"))
    assert len(c.store.snapshot().shares[u]) == 4
    c.store.acquire(share(u, 5000, user="erin"))  # what is left still fits
    assert len(c.store.snapshot().shares[u]) == 5


def test_an_expired_share_no_longer_holds_memory_against_a_new_one(tmp_path):
    c = h100_cluster(tmp_path)
    u = uuid_of(c, 0)
    c.store.acquire(share(u, 60000, user="alice", expires=T0 + 600))
    with pytest.raises(errors.ConflictError, match="unshared"):
        c.store.acquire(share(u, 30000, user="bob"))
    c.clock.advance(601)
    c.store.acquire(share(u, 30000, user="bob", expires=T0 + 2 * HOUR))
    assert c.store.snapshot().claims  # both files are there, one of them expired
    assert sorted(st.state for st in c.store.snapshot().shares_of(u)) == ["claimed", "stale"]


def test_a_gpu_held_whole_takes_no_share_and_a_shared_one_no_whole_claim(tmp_path):
    c = h100_cluster(tmp_path)
    u0, u1 = uuid_of(c, 0), uuid_of(c, 1)
    c.store.acquire(whole(u0))
    with pytest.raises(errors.ConflictError, match="GPU 0 is held whole"):
        c.store.acquire(share(u0, G20))
    assert u0 not in c.store.snapshot().shares

    s = share(u1, G20, index=1)
    c.store.acquire(s)
    w = whole(u1, user="bob", index=1)
    with pytest.raises(errors.ConflictError, match=r"GPU 1 is shared \(alice 20G\)"):
        c.store.acquire(w)
    snap = c.store.snapshot()
    assert u1 not in snap.files and w.id not in snap.claims  # nothing left behind
    assert not (c.store.root / "gpus" / f"{u1}.claim").exists()
    assert [st.claim.id for st in snap.shares_of(u1)] == [s.id]


def test_a_damaged_share_file_blocks_new_shares_until_gc_quarantines_it(tmp_path):
    c = h100_cluster(tmp_path)
    u = uuid_of(c, 0)
    c.store.acquire(share(u, G20))  # makes gpus/<uuid>.shares
    bad = c.store.root / "gpus" / f"{u}.shares" / "c-broken0000.share"
    bad.write_text("{not json")
    snap = c.store.snapshot()
    damaged = snap.damaged_shares(u)
    assert [f.path for f in damaged] == [bad] and damaged[0].error.startswith("corrupt")
    assert snap.corrupt() == damaged
    with pytest.raises(errors.ConflictError, match="damaged share file"):
        c.store.acquire(share(u, 1000, user="bob"))
    with pytest.raises(errors.ConflictError, match="GPU 0 is shared"):
        c.store.acquire(whole(u))
    alone = c.store.root / "gpus" / f"{uuid_of(c, 1)}.shares" / "c-broken0001.share"
    alone.parent.mkdir()
    alone.write_text("")
    with pytest.raises(errors.ConflictError, match="GPU 1 holds a damaged share file"):
        c.store.acquire(whole(uuid_of(c, 1), index=1))  # a whole claim waits for it too
    assert not (c.store.root / "gpus" / f"{uuid_of(c, 1)}.claim").exists()
    assert c.store.quarantine_corrupt(damaged[0]) is True
    assert not bad.exists()
    assert [p.suffix for p in (c.store.root / "corrupt").iterdir()] == [".share"]
    assert [f.path for f in c.store.snapshot().corrupt()] == [alone]
    c.store.acquire(share(u, 1000, user="bob"))


def test_remove_gpu_and_rewrite_act_on_the_share_file_alone(tmp_path):
    c = h100_cluster(tmp_path)
    u = uuid_of(c, 0)
    a, b = share(u, G20, user="alice"), share(u, G20, user="bob")
    c.store.acquire(a)
    c.store.acquire(b)
    longer = a.with_expiry(T0 + 3 * HOUR)
    c.store.rewrite(a, longer)
    snap = c.store.snapshot()
    assert snap.claims[a.id].claim.expires == T0 + 3 * HOUR
    assert snap.claims[b.id].claim.expires == T0 + HOUR
    with pytest.raises(errors.ConflictError, match="changed while extending"):
        c.store.rewrite(share(u, G20, claim_id="c-notthere00"), longer)
    assert c.store.remove_gpu(u, a.id) is True
    assert c.store.remove_gpu(u, a.id) is False  # gone already
    assert [st.claim.id for st in c.store.snapshot().shares_of(u)] == [b.id]


def test_a_snapshot_sent_over_the_wire_keeps_its_shares(tmp_path):
    c = h100_cluster(tmp_path)
    u0, u1 = uuid_of(c, 0), uuid_of(c, 1)
    c.store.acquire(share(u0, G20, user="alice"))
    c.store.acquire(share(u0, 2 * G20, user="bob"))
    c.store.acquire(whole(u1, index=1))
    snap = c.store.snapshot()
    back = Snapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert back.shares == snap.shares
    assert set(back.claims) == set(snap.claims)
    assert sorted(st.claim.user for st in back.shares_of(u0)) == ["alice", "bob"]
    assert list(back.files) == [u1]


# -- where a share goes (engine) ----------------------------------------------------------------


def test_a_share_packs_onto_an_already_shared_gpu_before_an_empty_one(tmp_path):
    c = h100_cluster(tmp_path)
    c.claim("carol", exact=(("node01", (1,)),), gpu_mem_mib=40000)
    s = c.claim("alice", gpu_mem_mib=G20)
    assert s.indices == [1] and s.shared
    assert (s.mem_mib, s.mem_total_mib) == (G20, H100)


def test_among_shared_gpus_the_one_with_the_least_room_left_is_chosen(tmp_path):
    c = h100_cluster(tmp_path, count=3)
    c.claim("carol", exact=(("node01", (0,)),), gpu_mem_mib=20000)
    c.claim("dave", exact=(("node01", (1,)),), gpu_mem_mib=50000)
    assert c.claim("alice", gpu_mem_mib=G20).indices == [1]  # 31559 left beats 61559
    # GPU 1 has 12485 MiB left now: a 20G share goes to GPU 0, never opens GPU 2
    assert c.claim("bob", gpu_mem_mib=G20).indices == [0]


def test_a_share_by_part_holds_that_part_of_the_gpus_memory(tmp_path):
    c = h100_cluster(tmp_path)
    s = c.claim("alice", gpu_share=0.25)
    assert (s.mem_mib, s.mem_total_mib) == (20389, H100)
    assert s.fraction == pytest.approx(0.25, abs=1e-4)


def test_a_share_never_lands_on_a_whole_claimed_gpu_nor_a_whole_claim_on_a_shared_one(tmp_path):
    c = h100_cluster(tmp_path)
    c.claim("bob", exact=(("node01", (0,)),))
    assert c.claim("alice", gpu_mem_mib=G20).indices == [1]
    assert c.states("node01") == ["claimed", "shared"]
    with pytest.raises(errors.ConflictError, match=r"GPU 1 is shared \(alice 20G"):
        c.claim("carol", 1)
    with pytest.raises(errors.ConflictError):
        c.claim("carol", exact=(("node01", (1,)),))
    with pytest.raises(errors.ConflictError, match="unshared"):
        c.claim("dave", exact=(("node01", (0,)),), gpu_mem_mib=G20)


def test_no_gpu_with_room_is_a_conflict_and_more_than_the_largest_gpu_never_fits(tmp_path):
    c = h100_cluster(tmp_path, count=1)
    c.claim("alice", gpu_mem_mib=70000)
    with pytest.raises(errors.ConflictError, match=r"no GPU has 20G unshared now \(node01 GPU 0"):
        c.claim("bob", gpu_mem_mib=G20)
    with pytest.raises(errors.NeverFitsError, match=r"--gpu-mem 100G can never fit.*85\.5G"):
        c.claim("bob", gpu_mem_mib=parse_gpu_mem("100G"))


def test_a_share_of_two_gpus_or_with_adopt_or_a_reservation_is_bad_usage(tmp_path):
    c = h100_cluster(tmp_path)
    with pytest.raises(errors.UsageError, match="part of one GPU"):
        c.claim("alice", 2, gpu_mem_mib=G20)
    with pytest.raises(errors.UsageError, match="part of one GPU"):
        c.claim("alice", exact=(("node01", (0, 1)),), gpu_mem_mib=G20)
    with pytest.raises(errors.UsageError, match="--adopt"):
        c.claim("alice", adopt=True, gpu_share=0.5)
    booking = c.book("alice", 0, count=1)
    with pytest.raises(errors.UsageError, match="--reservation"):
        c.claim("alice", reservation=booking.id, gpu_mem_mib=G20)
    assert c.store.snapshot().claims == {}
    assert share_req(gpu_share=0.5).shared and not share_req().shared


def test_max_gpus_per_user_counts_a_share_by_its_part(tmp_path):
    c = h100_cluster(tmp_path, max_gpus_per_user=1)
    c.claim("alice", gpu_share=0.5)
    held = held_gpus(c.store.snapshot())
    assert isinstance(held["alice"], float) and held["alice"] == pytest.approx(0.5, abs=1e-3)
    with pytest.raises(errors.ConflictError, match=r"alice holds 0\.5 GPUs; 1 more would pass"):
        c.claim("alice", 1)
    c.claim("alice", gpu_share=0.25)  # 0.75 of the limit of 1
    with pytest.raises(errors.ConflictError, match=r"alice holds 0\.75 GPUs; 0\.5 more would pass"):
        c.claim("alice", gpu_share=0.5)
    c.claim("bob", 1)  # the limit is per user


def test_a_shared_gpu_row_lists_its_live_shares_and_room(tmp_path):
    c = h100_cluster(tmp_path)
    c.claim("alice", exact=(("node01", (0,)),), gpu_mem_mib=G20)
    c.clock.advance(10)
    c.claim("bob", exact=(("node01", (0,)),), gpu_mem_mib=2 * G20)
    row0, row1 = c.view().gpus_of("node01")
    assert (row0.state, row1.state) == (GpuState.SHARED, GpuState.FREE)
    assert row0.claim is None
    assert [s.user for s in row0.shares] == ["alice", "bob"]  # oldest first
    assert row0.share_room_mib == H100 - 3 * G20
    assert row0.shares_text == "alice 20G · bob 40G · 25.5G free"
    d = row0.to_dict()
    assert d["shared_mib"] == 3 * G20
    assert [(s["user"], s["mem_mib"]) for s in d["shares"]] == [("alice", G20), ("bob", 2 * G20)]
    assert row1.to_dict()["shares"] == [] and row1.to_dict()["shared_mib"] == 0


def test_a_gpu_whose_shares_all_expired_is_stale_and_a_whole_claim_reaps_them(tmp_path):
    c = h100_cluster(tmp_path, count=1)
    old = c.claim("alice", gpu_mem_mib=G20, time_s=600)
    c.clock.advance(601)
    row = c.view().gpus_of("node01")[0]
    assert row.state == GpuState.STALE and row.shares == ()
    w = c.claim("bob", 1)
    assert w.indices == [0] and not w.shared
    snap = c.store.snapshot()
    assert old.id not in snap.claims and snap.shares == {}
    events, _ = c.store.read_events()
    expired = [e for e in events if e.type == EventType.EXPIRE]
    assert [e.claim_id for e in expired] == [old.id]
    assert expired[0].extra["share"] == pytest.approx(G20 / H100, abs=1e-4)


# -- accounting ---------------------------------------------------------------------------------


def test_a_share_claims_events_and_gpu_hours_are_weighted_by_its_part():
    s = share("GPU-a", H100 // 4, expires=T0 + 2 * HOUR)
    ev = claim_event(EventType.RELEASE, s, T0 + 2 * HOUR)
    assert ev.extra["share"] == pytest.approx(0.25, abs=1e-4) and ev.extra["mem_mib"] == H100 // 4
    assert event_gpu_weight(ev) == pytest.approx(0.25, abs=1e-4)
    w = whole("GPU-b")
    wev = claim_event(EventType.RELEASE, w, T0 + 2 * HOUR)
    assert "share" not in wev.extra and event_gpu_weight(wev) == 1.0
    by_id = {iv.claim_id: iv for iv in claim_intervals([ev, wev])}
    assert by_id[s.id].gpu_hours == pytest.approx(0.5, abs=1e-3)  # 2 h x 0.25
    assert by_id[w.id].gpu_hours == pytest.approx(2.0)


def test_a_live_share_in_the_snapshot_is_accounted_by_its_part(tmp_path):
    c = h100_cluster(tmp_path)
    s = c.claim("alice", gpu_share=0.5, time_s=2 * HOUR)
    c.clock.advance(HOUR)
    (iv,) = claim_intervals([], c.store.snapshot())
    assert iv.claim_id == s.id and iv.open
    assert iv.gpu_hours == pytest.approx(0.5, abs=1e-3)  # 1 h x 0.5
