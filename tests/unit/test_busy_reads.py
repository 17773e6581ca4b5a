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
