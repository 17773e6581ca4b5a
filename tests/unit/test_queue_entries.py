"""Queue entries taken by a dispatch: read back right whatever the taker's host is called."""

from __future__ import annotations

from pathlib import Path

from gpuclaim.store import ClaimStore


def _dead_pid() -> int:
    return 2**22 + 7  # above Linux's largest pid_max: no process has it


def _store(tmp_path: Path, host: str) -> ClaimStore:
    store = ClaimStore(tmp_path / "store")
    store.ensure(create=True)
    store.host = host
    return store


def test_taken_entries_still_name_their_jobs(tmp_path):
    store = _store(tmp_path, "node01.lab.example")
    waiting = store.enqueue(job_id="j-wait", user="alice")
    taken = store.enqueue(job_id="j-taken", user="bob", nice=3, begin=5.0)
    old_style = store.enqueue(job_id="j-old")  # before fair share: no user in the name
    assert store.take_queue_entry(taken) and store.take_queue_entry(old_style)
    assert store.queue_entries() == [waiting]
    assert sorted(store.queued_job_ids()) == ["j-old", "j-taken", "j-wait"]


def test_entry_taken_by_a_dead_dispatcher_on_a_dotted_host_goes_back(tmp_path):
    store = _store(tmp_path, "node01.lab.example")
    name = store.enqueue(job_id="j1", user="alice")
    queue = store.root / "queue"
    (queue / name).rename(queue / f".taken.node01.lab.example.{_dead_pid()}.{name}")
    assert store.queue_entries() == []
    store.sweep()
    assert store.queue_entries() == [name]  # back at its place, under its own name


def test_an_entry_put_back_keeps_its_submission_time(tmp_path):
    store = _store(tmp_path, "node01")
    name = store.enqueue(job_id="j1", user="alice", submitted=1765000000.25)
    assert name.startswith("1765000000.250000-j1+alice+")
