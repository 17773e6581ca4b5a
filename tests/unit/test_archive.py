"""The archive (store/archive.py, engine/job_records.py): finished records leave ``jobs/`` a day
after their end, in batch files written whole, and every reader still finds them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuclaim.core.errors import StoreError
from gpuclaim.core.model import ArrayRef
from gpuclaim.engine import job_records
from gpuclaim.engine.job_records import (
    archive_finished,
    find_job,
    load_archived,
    load_job_anywhere,
    load_jobs,
)
from gpuclaim.store import ClaimStore, archive
from tests.unit.job_factory import DAY, add_job, new_store


def _live_ids(store: ClaimStore) -> set[str]:
    return {j.id for j in store.list_jobs()}


def _archived_ids(store: ClaimStore) -> list[str]:
    return [j.id for j in store.archived_jobs()]


def _batches(store: ClaimStore) -> list[Path]:
    return sorted((store.root / "jobs" / "archive").glob("*.jsonl"))


def _old(store: ClaimStore, job_id: str, **kw: object) -> None:
    add_job(store, job_id, state="succeeded", ended=time.time() - 2 * DAY, **kw)  # type: ignore[arg-type]


def test_archive_jobs_moves_records_into_one_batch_file(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    for job_id in ("a", "b", "c"):
        _old(store, job_id)
    assert store.archive_jobs(job_ids=["a", "b"]) == 2
    assert _live_ids(store) == {"c"}
    assert sorted(_archived_ids(store)) == ["a", "b"]
    [batch] = _batches(store)
    assert len(batch.read_text().splitlines()) == 2
    assert store.load_job("a") is None
    assert load_job_anywhere(store, "a") == next(j for j in store.archived_jobs() if j.id == "a")


def test_missing_or_damaged_records_are_left_where_they_are(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    _old(store, "a")
    damaged = store.root / "jobs" / "bad.json"
    damaged.write_text("{not json")
    assert store.archive_jobs(job_ids=["a", "gone", "bad"]) == 1
    assert damaged.exists() and _archived_ids(store) == ["a"]
    assert store.archive_jobs(job_ids=["gone", "bad"]) == 0
    assert len(_batches(store)) == 1  # nothing to move: no empty batch


def test_another_archiver_at_work_makes_it_a_no_op(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    _old(store, "a")
    held = store.try_lock("jobs-archive")
    assert held is not None
    with held:
        assert store.archive_jobs(job_ids=["a"]) == 0
        assert _live_ids(store) == {"a"}
    assert store.archive_jobs(job_ids=["a"]) == 1


def test_a_long_move_is_written_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = new_store(tmp_path)
    monkeypatch.setattr(archive, "CHUNK", 2)
    ids = [f"j{i}" for i in range(5)]
    for job_id in ids:
        _old(store, job_id)
    assert store.archive_jobs(job_ids=ids) == 5
    assert sorted(len(b.read_text().splitlines()) for b in _batches(store)) == [1, 2, 2]
    assert sorted(_archived_ids(store)) == ids


def test_a_torn_or_foreign_line_in_a_batch_is_skipped(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    assert store.archived_jobs() == []  # no archive yet
    folder = store.root / "jobs" / "archive"
    folder.mkdir()
    line = {i: json.dumps(add_job(store, i).to_dict()) for i in "abcd"}
    torn = line["b"][:-3]
    (folder / "20260101T000000Z-x.jsonl").write_text(f"{line['a']}\n[1, 2]\n\xff\n{torn}")
    (folder / "20260102T000000Z-y.jsonl").write_text(f'{{"id": "no job"}}\n{line["c"]}\n')
    (folder / "notes.txt").write_text(f"{line['d']}\n")
    assert _archived_ids(store) == ["a", "c"]


def test_only_jobs_that_ended_over_a_day_ago_are_moved(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    now = time.time()
    _old(store, "old")
    add_job(store, "recent", state="failed", ended=now - DAY + 600)
    add_job(store, "running")
    add_job(store, "queued", state="queued")
    assert archive_finished(store, load_jobs(store)) == 1
    assert _live_ids(store) == {"recent", "running", "queued"}
    assert _archived_ids(store) == ["old"]


def test_fewer_old_records_than_the_minimum_stay(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    _old(store, "a")
    _old(store, "b")
    assert archive_finished(store, load_jobs(store), minimum=3) == 0
    assert _live_ids(store) == {"a", "b"}


def test_a_look_moves_old_records_once_it_has_read_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(tmp_path)
    monkeypatch.setattr(job_records, "ARCHIVE_BATCH", 3)
    _old(store, "a")
    _old(store, "b")
    assert {j.id for j in load_jobs(store)} == {"a", "b"}
    assert _archived_ids(store) == []
    _old(store, "c")
    assert {j.id for j in load_jobs(store)} == {"a", "b", "c"}  # this look still shows them
    assert _live_ids(store) == set()
    assert load_jobs(store) == []
    assert {j.id for j in load_jobs(store, archived=True)} == {"a", "b", "c"}


def test_tasks_wait_for_their_arrays_summary(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    store.create_array({"id": "arr", "name": "sweep", "user": "ann", "indices": [0, 1]})
    for i in (0, 1):
        _old(store, f"arr-{i}", array=ArrayRef("arr", "sweep", i, 2))
    _old(store, "solo")
    assert archive_finished(store, load_jobs(store)) == 1
    assert _live_ids(store) == {"arr-0", "arr-1"}
    assert archive_finished(store, load_jobs(store), minimum=2) == 0
    store.update_array(array_id="arr", changes={"result": {"count": 2}})
    assert archive_finished(store, load_jobs(store)) == 2
    assert _live_ids(store) == set()


def test_a_store_that_refuses_the_move_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(tmp_path)
    _old(store, "a")

    def refuse(job_ids: list[str]) -> int:
        raise StoreError("storage /x is read-only")

    monkeypatch.setattr(store, "archive_jobs", refuse)
    assert archive_finished(store, load_jobs(store)) == 0
    assert [j.id for j in load_jobs(store)] == ["a"]


def test_a_record_in_both_places_is_listed_once_the_live_one(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    _old(store, "a", name="first")
    live = store.load_job("a")
    assert live is not None
    store.archive_jobs(job_ids=["a"])
    store.create_job(live.with_(name="renamed"))  # a crash between publish and unlink
    jobs = load_jobs(store, archived=True)
    assert [(j.id, j.name) for j in jobs] == [("a", "renamed")]
    assert load_job_anywhere(store, "a") == live.with_(name="renamed")


def test_names_of_archived_jobs_are_still_found_oldest_first(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    _old(store, "x2", name="prep", submitted=2000.0)
    _old(store, "x1", name="prep", submitted=1000.0)
    add_job(store, "y", name="train")
    store.archive_jobs(job_ids=["x1", "x2"])
    assert [j.id for j in load_archived(store)] == ["x1", "x2"]
    assert find_job(store, "ann", "prep").id == "x2"  # only the archive has it: the newest
    assert find_job(store, "ann", "train").id == "y"
    assert load_job_anywhere(store, "nothing") is None
