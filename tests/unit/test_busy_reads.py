"""The reads that keep a busy day fast skip records by their bytes or names: they must never
skip one that was asked for (a store written here, on a real filesystem)."""

from __future__ import annotations

import time

from gpuclaim.app.history import claim_intervals
from gpuclaim.app.history_sum import read_sum
from gpuclaim.core.events import claim_event
from gpuclaim.core.model import ArrayRef, EventType
from gpuclaim.core.priority import parse_entry
from gpuclaim.engine.dispatch import Explained

from .job_factory import add_job, hold, new_store


def _ids(jobs) -> list[str]:
    return sorted(j.id for j in jobs)


def test_list_jobs_active_or_of_keeps_every_active_record_and_the_users_own(tmp_path):
    store = new_store(tmp_path)
    add_job(store, "j-run", user="bob", state="running")
    add_job(store, "j-queued", user="bob", state="queued")
    add_job(store, "j-bob-done", user="bob", state="succeeded")
    add_job(store, "j-ann-done", user="ann", state="failed")
    # a word of an active state in another field does not make an ended record active
    add_job(store, "j-says-running", name="running", user="bob", state="killed")
    assert _ids(store.list_jobs(active_or_of="ann")) == ["j-ann-done", "j-queued", "j-run"]
    assert len(store.list_jobs()) == 5


def test_list_jobs_skips_arrays_by_name_and_ids_and_reads_only_those_asked(tmp_path):
    store = new_store(tmp_path)
    ref = ArrayRef("a-1f2e", "sweep", 0, 2, None)
    add_job(store, "a-1f2e-0", user="ann", state="succeeded", array=ref)
    add_job(store, "a-1f2e-1", user="ann", state="succeeded", array=ref)
    add_job(store, "a-1f2e9-0", user="ann", state="succeeded")  # another array's id prefix
    add_job(store, "j1", name="train", user="ann", state="running")
    add_job(store, "j2", name="train-2", user="bob", state="running")
    assert _ids(store.list_jobs(skip_arrays=["a-1f2e"])) == ["a-1f2e9-0", "j1", "j2"]
    assert _ids(store.list_jobs(skip_ids=["j1"], skip_arrays=["a-1f2e"])) == ["a-1f2e9-0", "j2"]
    assert _ids(store.list_jobs(only_ids=["j2", "no-such"])) == ["j2"]
    assert _ids(store.list_jobs(named="train")) == ["j1"]  # not train-2
    assert _ids(store.list_jobs(named="sweep[0]")) == []


def _entries(*specs: tuple[str, str]) -> list:
    now = time.time()
    names = [f"{now + i:017.6f}-{job}+{user}+0+0" for i, (job, user) in enumerate(specs)]
    return [parse_entry(n) for n in names]


def test_explained_names_the_users_jobs_each_arrays_first_and_the_first_others():
    order = _entries(
        ("j1", "bob"),
        ("a-aa-0", "bob"),
        ("a-aa-1", "bob"),
        ("j2", "bob"),
        ("j3", "carol"),
        ("mine", "ann"),
        ("a-bb-5", "carol"),
    )
    assert Explained("ann", 2).among(order) == {"j1", "a-aa-0", "j2", "mine", "a-bb-5"}
    assert Explained("ann", 0, through="j3").among(order) == {
        "j1",
        "a-aa-0",
        "a-aa-1",
        "j2",
        "j3",
    }


def _release(store, user: str, node: str, uuid: str, since: float, end: float) -> None:
    claim = hold(store, node, [(uuid, 0)], user=user, since=since)
    store.append_event(claim_event(EventType.RELEASE, claim, end))


def test_the_kept_history_sum_equals_reading_every_event_and_grows_by_appends(tmp_path):
    store = new_store(tmp_path)
    now = time.time()
    _release(store, "ann", "node0", "GPU-a", now - 7200, now - 3600)
    path = tmp_path / "sum.json"
    first = read_sum(store, path)
    assert len(first.intervals) == 1 and path.exists()
    _release(store, "bob", "node1", "GPU-b", now - 3600, now - 60)
    (log,) = (store.root / "events").glob("*.jsonl")
    with open(log, "ab") as fh:
        fh.write(b'{"type": "release", "claim_id"')  # torn: waits for its end of line
    kept = read_sum(store, path)
    events, _ = store.read_events()
    assert list(kept.intervals.values()) == claim_intervals(events)
    assert kept.bad == 0 and kept.unfinished == 1  # said, not kept: its end may still come
    with open(log, "ab") as fh:
        fh.write(b': "c-x"}\n')
    done = read_sum(store, path)
    assert done.bad == 1 and done.unfinished == 0  # its end came: no claim's end (no since)


def test_a_replaced_log_is_summed_again_from_its_start(tmp_path):
    store = new_store(tmp_path)
    now = time.time()
    _release(store, "ann", "node0", "GPU-a", now - 7200, now - 3600)
    _release(store, "ann", "node0", "GPU-b", now - 3500, now - 3400)
    path = tmp_path / "sum.json"
    assert len(read_sum(store, path).intervals) == 2
    (log,) = (store.root / "events").glob("*.jsonl")
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(lines[0])  # shorter than where the sum stopped: not an append
    assert len(read_sum(store, path).intervals) == 1


def test_read_events_of_some_types_equals_the_filtered_whole(tmp_path):
    store = new_store(tmp_path)
    now = time.time()
    claim = hold(store, "node0", [("GPU-a", 0)], user="ann", since=now - 60)
    store.append_event(claim_event(EventType.CLAIM, claim, now - 60))
    store.append_event(claim_event(EventType.RELEASE, claim, now))
    events, bad = store.read_events()
    some, bad_some = store.read_events(types=[EventType.RELEASE])
    assert some == [e for e in events if e.type == EventType.RELEASE] and len(some) == 1
    assert bad == bad_some == 0


def test_a_requeued_tasks_rerun_is_a_queued_row_of_its_array(tmp_path):
    """A preempted --requeue task waits as 'a-ID-1r1': the default table counts it under its
    array (and takes nothing of the preempted run, such as its requeued_as)."""
    from gpuclaim.cli.arrays import grouped_rows
    from gpuclaim.cli.job_rows import listing_rows
    from gpuclaim.engine.array_records import task_index
    from gpuclaim.engine.job_listing import live_listing

    assert (task_index("a-aa-1r1"), task_index("a-aa-12"), task_index("j-1")) == (1, 12, None)
    store = new_store(tmp_path)
    store.create_array(
        array={"id": "a-aa", "name": "sweep", "user": "ann", "indices": [0, 1], "count": 2}
    )
    ref = ArrayRef("a-aa", "sweep", 0, 2, None)
    add_job(store, "a-aa-0", name="sweep[0]", user="ann", state="running", array=ref)
    preempted = add_job(store, "a-aa-1", name="sweep[1]", user="ann", state="killed", array=ref)
    store.update_job(job_id=preempted.id, changes={"requeued_as": "a-aa-1r1"})
    rerun = ArrayRef("a-aa", "sweep", 1, 2, None)
    add_job(store, "a-aa-1r1", name="sweep[1]", user="ann", state="queued", array=rerun)
    store.enqueue(job_id="a-aa-1r1", user="ann")
    queue = [parse_entry(n) for n in store.queue_entries()]
    listing = live_listing(store, "ann", time.time() - 86400, queue)
    rows, ended = listing_rows(store, listing, store.snapshot(), {}, "ann")
    assert ended == []
    (synth,) = [r for r in rows if r["id"] == "a-aa-1r1"]
    assert synth["name"] == "sweep[1]" and synth["state"] == "queued"
    assert "requeued_as" not in synth
    (row,) = grouped_rows(rows)
    assert row["name"] == "sweep[0-1]" and row["state_text"] == "1 running, 1 queued", row


def test_the_kept_sum_reads_each_line_once_and_keeps_a_claims_first_end(tmp_path):
    store = new_store(tmp_path)
    now = time.time()
    claim = hold(store, "node0", [("GPU-a", 0)], user="ann", since=now - 600)
    store.append_event(claim_event(EventType.RELEASE, claim, now - 300))
    path = tmp_path / "sum.json"
    assert abs(read_sum(store, path).intervals[claim.id].end - (now - 300)) < 0.01
    (log,) = (store.root / "events").glob("*.jsonl")
    summed = log.read_bytes()
    # what was summed is not read again: a line damaged in place since changes nothing
    log.write_bytes(summed[:-2].replace(b'"release"', b'"reXease"') + b"}\n")
    assert read_sum(store, path).bad == 0
    # a second end of the same claim (a race in gc) later: the first end stays
    store.append_event(claim_event(EventType.REAP, claim, now - 100))
    assert abs(read_sum(store, path).intervals[claim.id].end - (now - 300)) < 0.01


def test_a_log_gone_from_the_store_leaves_the_sum(tmp_path):
    store = new_store(tmp_path)
    now = time.time()
    _release(store, "ann", "node0", "GPU-a", now - 7200, now - 3600)
    path = tmp_path / "sum.json"
    assert len(read_sum(store, path).intervals) == 1
    for log in (store.root / "events").glob("*.jsonl"):
        log.unlink()
    assert read_sum(store, path).intervals == {}


def test_why_finds_a_requeued_tasks_rerun_by_the_arrays_name_and_by_its_index(tmp_path):
    from types import SimpleNamespace

    from gpuclaim.cli.explain import _in_queue

    store = new_store(tmp_path)
    store.create_array(
        array={"id": "a-aa", "name": "sweep", "user": "ann", "indices": [0, 1], "count": 2}
    )
    add_job(store, "a-aa-1", name="sweep[1]", user="ann", state="killed")
    add_job(store, "a-aa-1r1", name="sweep[1]", user="ann", state="queued")
    store.enqueue(job_id="a-aa-1r1", user="ann")
    queue = [parse_entry(n) for n in store.queue_entries()]
    st = SimpleNamespace(store=store)
    arrays = store.list_arrays()
    assert _in_queue(st, "sweep", queue, arrays).id == "a-aa-1r1"
    assert _in_queue(st, "sweep[1]", queue, arrays).id == "a-aa-1r1"
    assert _in_queue(st, "sweep[0]", queue, arrays) is None


def test_the_first_look_of_a_day_archives_what_no_look_read(tmp_path):
    from gpuclaim.engine.job_records import archive_daily

    store = new_store(tmp_path)
    now = time.time()
    add_job(store, "j-old", user="bob", state="succeeded", ended=now - 3 * 86400)
    add_job(store, "j-new", user="bob", state="succeeded", ended=now - 60)
    add_job(store, "j-run", user="bob", state="running")
    assert archive_daily(store) == 1  # the day's first: every live record read
    assert _ids(store.list_jobs()) == ["j-new", "j-run"]
    assert [j.id for j in store.archived_jobs()] == ["j-old"]
    add_job(store, "j-old2", user="bob", state="failed", ended=now - 2 * 86400)
    assert archive_daily(store) == 0  # the same day again: nothing read, nothing moved
