"""Which queued job goes next (core/priority.py, engine/fairshare.py, engine/queue_plan.py,
engine/dispatch.py): queue entry names, decayed use, the priority formula and its [queue]
settings, the fair-share fold over the event log, the order of a real pass, and the plan
that keeps waiting jobs' expected starts (backfill).

Expected values are closed forms (H/ln2 * (1 - 1/2) ...) or sums written out here; the fold's
own results are compared with a computation from the whole log."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuclaim.core.config import Config, QueuePolicy, parse_config
from gpuclaim.core.errors import ConfigError
from gpuclaim.core.model import Claim, ClaimedGpu, Event, EventType, Job
from gpuclaim.core.priority import (
    QueueEntry,
    decay,
    decayed_gpu_seconds,
    entry_name,
    mean_use,
    parse_entry,
    priority,
    share_factor,
)
from gpuclaim.engine.arrays import ArrayRequest, submit_array
from gpuclaim.engine.dispatch import judge_queue
from gpuclaim.engine.fairshare import STATE_FILE, use_by_user
from gpuclaim.engine.jobs import RunRequest, enqueue, job_from_request, new_job_id
from gpuclaim.engine.queue_plan import NEVER, Plan

from .fakes import HOUR, T0, Clock, ClockedStore, Cluster, make_cluster

DAY = 86400.0


# -- queue entry names ----------------------------------------------------------------------------


def test_an_entry_name_parses_back_to_what_it_was_made_from() -> None:
    name = entry_name(T0 + 0.25, "j-abcdef0123", "alice", 5, T0 + 3600.4)
    assert name.startswith(f"{T0 + 0.25:017.6f}-j-abcdef0123+alice+"), name
    entry = parse_entry(name)
    assert entry is not None
    assert entry.name == name
    assert (entry.job_id, entry.user, entry.nice) == ("j-abcdef0123", "alice", 5)
    assert entry.submitted == T0 + 0.25
    assert entry.begin == math.ceil(T0 + 3600.4)  # a --begin is kept to the second, rounded up
    no_begin = parse_entry(entry_name(T0, "j-abcdef0123", "bob_2", 0, 0.0))
    assert no_begin is not None and (no_begin.user, no_begin.nice, no_begin.begin) == (
        "bob_2",
        0,
        0,
    )


def test_names_of_entries_made_earlier_sort_first_as_text() -> None:
    """queue_entries() lists names sorted: the zero-padded time keeps that submission order."""
    early = entry_name(999.5, "j-zzzzzzzzzz", "zed", 0, 0.0)
    late = entry_name(T0, "j-aaaaaaaaaa", "ann", 0, 0.0)
    assert sorted([late, early]) == [early, late]


def test_an_entry_from_before_fair_share_parses_without_a_user() -> None:
    entry = parse_entry("0001234567.123456-j-abcdef0123")
    assert entry is not None
    assert entry.job_id == "j-abcdef0123"
    assert entry.submitted == pytest.approx(1234567.123456)
    assert (entry.user, entry.nice, entry.begin) == (None, 0, 0.0)


@pytest.mark.parametrize(
    "name",
    [
        "junk",
        "j-abcdef0123",  # no time
        ".taken-0001234567.123456-j-abcdef0123",  # a taken entry (hidden)
        "0001234567.123456-j-abc+alice+x+0",  # nice is no number
        "0001234567.123456-j-abc+alice+1",  # a part missing
        "0001234567.123456-j-abc+al.ice+0+0",  # no dots in user names
        "0001234567.123456-",
    ],
)
def test_a_name_that_is_no_entry_gives_none(name: str) -> None:
    assert parse_entry(name) is None


def test_an_arrays_tasks_go_in_index_order_not_text_order() -> None:
    nine = QueueEntry("n9", "a-1f2e3d4c5b-9", submitted=T0)
    ten = QueueEntry("n10", "a-1f2e3d4c5b-10", submitted=T0)
    assert "a-1f2e3d4c5b-10" < "a-1f2e3d4c5b-9"  # what sorting the ids would get wrong
    assert nine.order < ten.order
    assert sorted([ten, nine], key=lambda e: e.order) == [nine, ten]
    earlier = QueueEntry("n", "a-1f2e3d4c5b-10", submitted=T0 - 1)
    assert earlier.order < nine.order  # the submission time still comes first


# -- decay ---------------------------------------------------------------------------------------


H = 7 * DAY


def test_one_gpu_held_for_a_half_life_ending_now_is_h_over_ln2_times_a_half() -> None:
    assert decayed_gpu_seconds(1, 0, H, H, H) == pytest.approx(H / math.log(2) * (1 - 0.5))
    assert decayed_gpu_seconds(3, 0, H, H, H) == pytest.approx(3 * H / math.log(2) * 0.5)


def test_a_hold_that_ended_a_half_life_ago_counts_half() -> None:
    now = T0
    just_ended = decayed_gpu_seconds(2, now - 600, now, now, H)
    long_ago = decayed_gpu_seconds(2, now - H - 600, now - H, now, H)
    assert just_ended == pytest.approx(2 * 600, rel=1e-3)  # short: almost undecayed
    assert long_ago == pytest.approx(just_ended / 2)


def test_a_hold_counts_only_until_now_and_nothing_when_empty() -> None:
    now = T0
    assert decayed_gpu_seconds(1, now - 10, now + 1000, now, H) == pytest.approx(
        decayed_gpu_seconds(1, now - 10, now, now, H)
    )
    assert decayed_gpu_seconds(1, now, now, now, H) == 0.0
    assert decayed_gpu_seconds(1, now + 5, now + 10, now, H) == 0.0  # starts after now


def test_decay_halves_a_value_every_half_life() -> None:
    assert decay(100.0, H, H) == pytest.approx(50.0)
    assert decay(100.0, 2 * H, H) == pytest.approx(25.0)
    assert decay(100.0, 0, H) == 100.0
    assert decay(100.0, -H, H) == 100.0  # a clock running behind adds nothing


# -- the formula ----------------------------------------------------------------------------------


def test_no_use_gets_the_whole_fairshare_weight_and_the_mean_half() -> None:
    policy = QueuePolicy(fairshare_weight=800.0, age_weight=300.0)
    assert priority(policy, 0.0, 5000.0, 0, 0).fairshare == pytest.approx(800.0)
    assert priority(policy, 5000.0, 5000.0, 0, 0).fairshare == pytest.approx(400.0)
    assert priority(policy, 10000.0, 5000.0, 0, 0).fairshare == pytest.approx(200.0)
    assert priority(policy, 0.0, 0.0, 0, 0).fairshare == pytest.approx(800.0)  # nobody used any
    assert share_factor(0.0, 0.0) == 1.0


def test_waiting_max_age_gets_the_whole_age_weight_and_no_more() -> None:
    policy = QueuePolicy(max_age_s=12 * HOUR, age_weight=300.0)
    assert priority(policy, 0.0, 0.0, 0, 0).age == 0.0
    assert priority(policy, 0.0, 0.0, 6 * HOUR, 0).age == pytest.approx(150.0)
    assert priority(policy, 0.0, 0.0, 12 * HOUR, 0).age == pytest.approx(300.0)
    assert priority(policy, 0.0, 0.0, 10 * DAY, 0).age == pytest.approx(300.0)
    assert priority(policy, 0.0, 0.0, -HOUR, 0).age == 0.0  # --begin still ahead


def test_nice_subtracts_its_points() -> None:
    policy = QueuePolicy()
    plain = priority(policy, 100.0, 200.0, HOUR, 0)
    nice = priority(policy, 100.0, 200.0, HOUR, 250)
    assert nice.value == pytest.approx(plain.value - 250)
    assert (nice.fairshare, nice.age, nice.nice) == (plain.fairshare, plain.age, 250)
    assert plain.value == pytest.approx(plain.fairshare + plain.age)
    assert (plain.use_gpu_hours, plain.mean_use_gpu_hours) == pytest.approx(
        (100 / 3600, 200 / 3600)
    )


def test_the_mean_is_over_queuing_users_and_everyone_with_use() -> None:
    uses = {"alice": 300.0, "carol": 0.0}
    assert mean_use(uses, {"bob"}) == pytest.approx(150.0)  # alice and bob; carol used nothing
    assert mean_use({}, set()) == 0.0
    assert mean_use({"alice": 300.0}, {"alice"}) == pytest.approx(300.0)


@pytest.mark.parametrize("others", [0, 3, 40])
def test_the_heaviest_users_job_waiting_a_day_passes_a_fresh_job_of_a_user_with_no_use(
    others: int,
) -> None:
    """README: with the default weights (1000/1000, max_age 1d), a job of the heaviest user
    waiting a day passes a fresh job of a user with no use: nobody starves."""
    policy = QueuePolicy()
    assert (policy.fairshare_weight, policy.age_weight, policy.max_age_s) == (1000, 1000, DAY)
    uses = {"heavy": 1e9, **{f"light{i}": 10.0 for i in range(others)}}
    mean = mean_use(uses, {"heavy", "fresh"})
    assert uses["heavy"] >= 2 * mean  # far above the mean (2x is the most with 2 users)
    heavy = priority(policy, uses["heavy"], mean, DAY, 0)
    fresh = priority(policy, 0.0, mean, 0.0, 0)
    assert fresh.value == pytest.approx(1000.0)
    assert heavy.value > fresh.value, (heavy, fresh)


# -- [queue] and max_queued_per_user in the config ------------------------------------------------


def _config(**tables: Any) -> Config:
    return parse_config({"nodes": ["node01"], "storage": "/shared/gpuclaim", **tables})


def test_queue_settings_parse() -> None:
    q = _config(
        queue={"half_life": "3d", "max_age": "12h", "fairshare_weight": 500, "age_weight": 2.5}
    ).queue
    assert q == QueuePolicy(
        half_life_s=3 * DAY, max_age_s=12 * HOUR, fairshare_weight=500.0, age_weight=2.5
    )
    assert _config().queue == QueuePolicy(7 * DAY, DAY, 1000.0, 1000.0)
    assert _config(queue={"age_weight": 0}).queue.age_weight == 0.0  # waiting counts for nothing
    assert _config(queue={"half_life": 90}).queue.half_life_s == 90 * 60  # bare: minutes


@pytest.mark.parametrize(
    "table, key",
    [
        ({"half_life": "0s"}, "queue.half_life"),
        ({"half_life": 0}, "queue.half_life"),
        ({"max_age": -5}, "queue.max_age"),
        ({"max_age": "soon"}, "queue.max_age"),
        ({"fairshare_weight": -1}, "queue.fairshare_weight"),
        ({"age_weight": "high"}, "queue.age_weight"),
        ({"age_weight": True}, "queue.age_weight"),
    ],
)
def test_a_bad_queue_value_is_an_error_naming_its_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(queue=table)
    assert f"'{key}'" in err.value.message


def test_an_unknown_queue_key_suggests_the_known_one() -> None:
    with pytest.raises(ConfigError) as err:
        _config(queue={"half_lfe": "3d"})
    assert "'half_lfe'" in err.value.message and "[queue]" in err.value.message
    assert "did you mean 'half_life'?" in err.value.message


def test_nan_is_no_queue_setting() -> None:
    """TOML reads ``nan`` as a float: "a number >= 0" / "longer than 0" must refuse it, or
    every priority is NaN (half_life, fairshare_weight) and the pass's sort falls back to
    submission order, or waiting counts in full from the first second (max_age)."""
    accepted = {}
    for key in ("half_life", "max_age", "fairshare_weight", "age_weight"):
        try:
            accepted[key] = _config(queue={key: math.nan}).queue
        except ConfigError as exc:
            assert f"'queue.{key}'" in exc.message
    assert not accepted, f"BUG: [queue] accepts nan for {sorted(accepted)}: {accepted}"


def test_max_queued_per_user_is_a_whole_number_from_zero() -> None:
    assert _config(defaults={"max_queued_per_user": 5}).limits.max_queued_per_user == 5
    assert _config().limits.max_queued_per_user == 0  # any number
    for bad in (-1, 2.5, "5"):
        with pytest.raises(ConfigError) as err:
            _config(defaults={"max_queued_per_user": bad})
        assert "'defaults.max_queued_per_user'" in err.value.message


# -- the fair-share fold over the event log -------------------------------------------------------


class Log:
    """A store on the test's clock, its config, and the ended claims it was told of."""

    def __init__(self, tmp_path: Path, half_life: str = "1d") -> None:
        self.tmp_path = tmp_path
        self.clock = Clock()
        self.store = ClockedStore(tmp_path / "store", self.clock)
        self.config = self.configured(half_life)
        self.ends: list[Event] = []

    def configured(self, half_life: str) -> Config:
        raw = {"nodes": ["node01"], "storage": str(self.tmp_path / "store")}
        return parse_config({**raw, "queue": {"half_life": half_life}})

    def ended(
        self,
        user: str,
        claim_id: Optional[str],
        gpus: int,
        since_ago: float,
        ended_ago: float,
        kind: EventType = EventType.RELEASE,
    ) -> Event:
        now = self.store.now()
        event = Event(
            ts=now - ended_ago,
            type=kind,
            user=user,
            claim_id=claim_id,
            node="node01",
            gpus=tuple(range(gpus)),
            since=now - since_ago,
        )
        self.store.append_event(event)
        self.ends.append(event)
        return event

    def use(self, config: Optional[Config] = None) -> dict[str, float]:
        return use_by_user(config or self.config, self.store, self.store.snapshot())

    def counted(self, event: Event, config: Optional[Config] = None) -> float:
        half_life = (config or self.config).queue.half_life_s
        return decayed_gpu_seconds(
            len(event.gpus), event.since or 0, event.ts, self.store.now(), half_life
        )

    def expected(self, events: list[Event], config: Optional[Config] = None) -> dict[str, float]:
        """The use a computation from the whole log gives (each claim once)."""
        use: dict[str, float] = {}
        for e in events:
            use[e.user] = use.get(e.user, 0.0) + self.counted(e, config)
        return use

    def path(self) -> Path:
        (name,) = self.store.event_logs()
        return self.store.root / "events" / f"{name}.jsonl"

    def forget(self) -> None:
        """No kept sum: the next fold counts from the whole log."""
        self.store.write_notify(name=STATE_FILE, data={})


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path)


def test_the_heavier_user_has_more_use_held_claims_included(log: Log) -> None:
    a = log.ended("alice", "c-a1", 2, since_ago=10 * HOUR, ended_ago=HOUR)
    b = log.ended("bob", "c-b1", 1, since_ago=2 * HOUR, ended_ago=HOUR)
    now = log.store.now()
    held = Claim(
        id="c-held1",
        user="bob",
        node="node01",
        gpus=(ClaimedGpu("GPU-held-0", 0),),
        since=now - 1800,
        expires=now + HOUR,
    )
    log.store.acquire(held)
    use = log.use()
    assert use["alice"] == pytest.approx(log.counted(a))
    assert use["alice"] == pytest.approx(
        2 * DAY / math.log(2) * (2 ** (-HOUR / DAY) - 2 ** (-10 * HOUR / DAY))
    )
    bob_held = decayed_gpu_seconds(1, now - 1800, now, now, DAY)
    assert use["bob"] == pytest.approx(log.counted(b) + bob_held)
    assert use["alice"] > use["bob"] > 0


def test_a_second_fold_adds_only_what_was_appended(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.ended("alice", "c-a1", 2, since_ago=10 * HOUR, ended_ago=HOUR)
    log.ended("bob", "c-b1", 1, since_ago=2 * HOUR, ended_ago=HOUR)
    first = log.use()
    size = log.path().stat().st_size
    reads: list[tuple[int, str]] = []
    read = log.store.read_event_log

    def spy(name: str, offset: int) -> str:
        text = read(name=name, offset=offset)
        reads.append((offset, text))
        return text

    monkeypatch.setattr(log.store, "read_event_log", spy)
    more = log.ended("alice", "c-a2", 1, since_ago=3 * HOUR, ended_ago=2 * HOUR)
    second = log.use()
    assert second["alice"] == pytest.approx(first["alice"] + log.counted(more))
    assert second["bob"] == pytest.approx(first["bob"])
    assert second == pytest.approx(log.expected(log.ends))
    # what the pass read: only the line appended since the last fold
    assert [offset for offset, _ in reads] == [size]
    assert reads[0][1].count("\n") == 1 and '"c-a2"' in reads[0][1]
    third = log.use()
    assert third == pytest.approx(second)  # nothing new: nothing counted again


def test_the_kept_sum_decays_with_the_clock_as_a_recount_would(log: Log) -> None:
    log.ended("alice", "c-a1", 2, since_ago=10 * HOUR, ended_ago=HOUR)
    log.use()
    log.clock.advance(DAY / 3)
    log.ended("alice", "c-a2", 1, since_ago=3 * HOUR, ended_ago=2 * HOUR)
    folded = log.use()
    log.forget()
    fresh = log.use()
    assert fresh == pytest.approx(log.expected(log.ends))
    assert folded == pytest.approx(fresh)


def test_a_claim_ended_twice_counts_once(log: Log) -> None:
    once = log.ended("alice", "c-a1", 2, since_ago=5 * HOUR, ended_ago=HOUR)
    log.ended("alice", "c-a1", 2, since_ago=5 * HOUR, ended_ago=0.5 * HOUR, kind=EventType.EXPIRE)
    use = log.use()
    assert use["alice"] == pytest.approx(log.counted(once))
    # a third end record in a later fold is not paid either
    log.ended("alice", "c-a1", 2, since_ago=5 * HOUR, ended_ago=0, kind=EventType.REAP)
    assert log.use()["alice"] == pytest.approx(log.counted(once))


def test_only_end_events_with_a_start_count(log: Log) -> None:
    counted = log.ended("alice", "c-a1", 1, since_ago=2 * HOUR, ended_ago=HOUR)
    for kind in (EventType.FORCE_RELEASE, EventType.EXPIRE, EventType.REAP):
        log.ended("bob", f"c-{kind}", 1, since_ago=2 * HOUR, ended_ago=HOUR, kind=kind)
    log.ended("carol", "c-c1", 4, since_ago=2 * HOUR, ended_ago=HOUR, kind=EventType.CLAIM)
    log.store.append_event(  # an end without since: nothing to count from
        Event(ts=log.store.now(), type=EventType.RELEASE, user="dave", claim_id="c-d1", gpus=(0,))
    )
    use = log.use()
    assert use["alice"] == pytest.approx(log.counted(counted))
    assert use["bob"] == pytest.approx(3 * log.counted(counted))
    assert "carol" not in use and "dave" not in use


def test_another_half_life_recounts_the_whole_log(log: Log) -> None:
    log.ended("alice", "c-a1", 2, since_ago=3 * DAY, ended_ago=2 * DAY)
    log.ended("bob", "c-b1", 1, since_ago=10 * HOUR, ended_ago=HOUR)
    one_day = log.use()
    assert one_day == pytest.approx(log.expected(log.ends))
    three_days = log.configured("3d")
    longer = log.use(three_days)
    assert longer == pytest.approx(log.expected(log.ends, three_days))
    assert longer["alice"] > 2 * one_day["alice"]  # not the kept sum carried over
    assert log.use() == pytest.approx(one_day)  # and back


def test_a_damaged_line_is_skipped_and_a_torn_last_line_waits(log: Log) -> None:
    log.ended("alice", "c-a1", 1, since_ago=2 * HOUR, ended_ago=HOUR)
    with log.path().open("ab") as fh:
        fh.write(b'{"ts": "not a time", "type": "release", "user": "mallory"}\n')
        fh.write(b"\xff\xfe\x00 garbage\n")
        fh.write(b"[1, 2, 3]\n")
        fh.write(b'{"type": "release"}\n')
    log.ended("bob", "c-b1", 1, since_ago=2 * HOUR, ended_ago=HOUR)
    assert log.use() == pytest.approx(log.expected(log.ends))
    # a line still being written is not counted yet, nor skipped for good
    now = log.store.now()
    torn = Event(now - 60, EventType.RELEASE, "carol", "c-c1", "node01", (0, 1), since=now - HOUR)
    line = json.dumps(torn.to_dict(), sort_keys=True, ensure_ascii=True).encode()
    with log.path().open("ab") as fh:
        fh.write(line[:20])
    assert "carol" not in log.use()
    with log.path().open("ab") as fh:
        fh.write(line[20:] + b"\n")
    assert log.use()["carol"] == pytest.approx(log.counted(torn))


# -- the order of a real pass ----------------------------------------------------------------------


def submit(c: Cluster, user: str, name: str, nice: int = 0) -> Job:
    """``run --queue`` as the engine queues it (the entry names user and nice), a second
    after the one before."""
    c.clock.advance(1.0)
    req = RunRequest(user=user, argv=("python", "train.py"), name=name, nice=nice)
    job = job_from_request(req, new_job_id(), name, HOUR, c.clock.now)
    c.store.create_job(job=job)
    enqueue(c.store, job)
    return job


@pytest.fixture
def busy(tmp_path: Path) -> Cluster:
    """One node of 2 GPUs, both held by carol; alice used 2 GPUs for 10 h until an hour ago."""
    c = make_cluster(tmp_path, {"node01": 2})
    c.claim("carol", 2)
    now = c.clock.now
    heavy = Event(
        ts=now - HOUR,
        type=EventType.RELEASE,
        user="alice",
        claim_id="c-alice00001",
        node="node01",
        gpus=(0, 1),
        since=now - 11 * HOUR,
    )
    c.store.append_event(heavy)
    return c


def positions(c: Cluster) -> dict[str, int]:
    report = judge_queue(c.config, c.store, c.prober)
    assert report.started == []  # every GPU is busy
    return {job_id: v.position for job_id, v in report.verdicts.items()}


def test_a_user_with_no_use_goes_ahead_of_the_heavy_users_earlier_jobs(busy: Cluster) -> None:
    a1 = submit(busy, "alice", "a1")
    a2 = submit(busy, "alice", "a2")
    b1 = submit(busy, "bob", "b1")
    report = judge_queue(busy.config, busy.store, busy.prober)
    pos = {job_id: v.position for job_id, v in report.verdicts.items()}
    assert pos == {b1.id: 1, a1.id: 2, a2.id: 3}
    bob, alice = report.verdicts[b1.id].priority, report.verdicts[a1.id].priority
    assert bob.fairshare == pytest.approx(1000.0) and bob.use_gpu_hours == 0
    assert alice.fairshare < 500 and alice.use_gpu_hours > 10  # far above the mean


def test_nice_enough_puts_the_light_users_job_behind(busy: Cluster) -> None:
    a1 = submit(busy, "alice", "a1")
    a2 = submit(busy, "alice", "a2")
    b1 = submit(busy, "bob", "b1", nice=1000)
    assert positions(busy) == {a1.id: 1, a2.id: 2, b1.id: 3}


def test_an_entry_from_before_fair_share_is_ordered_by_its_records_user(busy: Cluster) -> None:
    old = busy.queue("alice", "old")  # the fakes' queue(): an entry that names no user
    assert parse_entry(busy.store.queue_entries()[0]).user is None  # type: ignore[union-attr]
    b1 = submit(busy, "bob", "b1")
    assert positions(busy) == {b1.id: 1, old.id: 2}


def test_an_arrays_tasks_keep_their_index_order(busy: Cluster) -> None:
    run = RunRequest(user="alice", argv=("python", "eval.py"), name="sweep")
    areq = ArrayRequest(run, tuple(range(12)), "0-11")
    array_id = submit_array(busy.config, busy.store, areq, busy.prober).record["id"]
    b1 = submit(busy, "bob", "b1")
    pos = positions(busy)
    assert pos[b1.id] == 1
    tasks = sorted((p, job_id) for job_id, p in pos.items() if job_id != b1.id)
    assert [job_id for _, job_id in tasks] == [f"{array_id}-{i}" for i in range(12)]


# -- the plan: expected starts and backfill --------------------------------------------------------


def plan_job(job_id: str, gpus: int, time_s: float = HOUR, nodes: int = 1) -> Job:
    return Job(
        id=job_id,
        name=job_id,
        user="alice",
        argv=("python", "train.py"),
        state="queued",
        submitted=T0,
        time_limit_s=time_s,
        gpus_per_node=gpus,
        nodes_wanted=nodes,
    )


NOW = T0


def test_a_later_job_may_start_only_if_it_ends_before_the_waiting_jobs_start() -> None:
    plan = Plan(NOW, {"node01": [NOW, NOW + 100]})  # 1 GPU free now, the other at +100
    big = plan_job("j-big", 2)
    assert plan.promise(big, ["node01"], end_margin=0) == NOW + 100
    assert plan.starts == {"j-big": NOW + 100}
    assert plan.blocker("node01", 1, NOW + 50) is None  # done before the big one starts
    assert plan.blocker("node01", 1, NOW + 100) is None  # ends as it starts
    assert plan.blocker("node01", 1, NOW + 200) is big  # would delay it
    assert plan.fits("node01", 1, NOW + 100 + HOUR, NOW + 100 + 2 * HOUR)  # after it


def test_a_waiting_job_whose_start_cannot_be_known_keeps_its_node_whole() -> None:
    plan = Plan(NOW, {"node01": [NOW, NEVER], "node02": [NOW]})  # node01: one GPU busy forever
    big = plan_job("j-big", 2)
    assert plan.promise(big, ["node01"], end_margin=0) == NEVER
    assert plan.kept == {"node01": big} and plan.starts == {}
    assert plan.blocker("node01", 1, NOW + 1) is big  # even a one-second job would starve it
    assert plan.blocker("node02", 1, NOW + DAY) is None  # the other node is not its


def test_a_gang_is_promised_a_start_every_one_of_its_nodes_has_room_at() -> None:
    """node A: 1 GPU free now, 1 at +150, promised whole to ``x`` from +150 (to +650).
    node B: its one GPU free at +100. A 2-node gang of 1 GPU each for 100 s fits A at once
    and B from +100, but at +100 A is x's from +150: the gang's soonest is +650."""
    plan = Plan(NOW, {"A": [NOW, NOW + 150], "B": [NOW + 100]})
    x = plan_job("j-x", 2, time_s=500)
    assert plan.promise(x, ["A"], end_margin=0) == NOW + 150
    gang = plan_job("j-gang", 1, time_s=100, nodes=2)
    start = plan.promise(gang, ["A", "B"], end_margin=0)
    overbooked = [t for t in (NOW + 100, NOW + 150, NOW + 199) if plan.free_at("A", t) < 0]
    assert not overbooked, (
        f"BUG: the gang is promised {start - NOW:+.0f} s on A and B, but A is promised to "
        f"j-x from +150: A is overbooked at {[t - NOW for t in overbooked]} (soonest that "
        "fits on both nodes: +650)"
    )
    assert start == NOW + 650


@pytest.mark.parametrize(
    "damaged",
    [
        {"half_life": 86400.0, "ref": "yesterday", "users": {}, "cursors": {}, "seen": []},
        {"half_life": 86400.0, "ref": 1.0, "users": {"alice": "lots"}, "cursors": {}, "seen": []},
        {"half_life": 86400.0, "ref": 1.0, "users": {}, "cursors": ["x"], "seen": []},
        {"half_life": 86400.0},
    ],
)
def test_a_damaged_kept_sum_is_counted_again_not_an_error(log: Log, damaged: dict) -> None:
    log.ended("alice", "c-a1", 2, since_ago=3 * HOUR, ended_ago=HOUR)
    log.store.write_notify(name=STATE_FILE, data=damaged)
    assert log.use() == pytest.approx(log.expected(log.ends))
