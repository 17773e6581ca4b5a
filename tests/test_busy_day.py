"""A busy day stays fast: `jobs`, `why`, `history` and the board read no more than they show
(bench/busy_day.py measures it; these tests prove what each shows, through the CLI)."""

from __future__ import annotations

import shutil
import time

import pytest

pytestmark = pytest.mark.slow


def _wait_ended(cluster, count: int) -> list[dict]:
    deadline = time.monotonic() + 60
    while True:
        jobs = cluster.json("jobs", "--all")
        live = [j for j in jobs if j["state"] in ("queued", "starting", "running")]
        if len(jobs) >= count and not live:
            return jobs
        assert time.monotonic() < deadline, jobs
        time.sleep(0.5)


def test_an_ended_array_is_one_row_from_its_summary_and_its_tasks_are_not_read(make_cluster):
    cluster = make_cluster({"node01": 2}, fast=True)
    cluster.ok("run", "--array", "0-5", "--name", "sweep", "--", "sh", "-c", "exit 0")
    _wait_ended(cluster, 6)
    table = cluster.ok("jobs")
    (row,) = [line for line in table.splitlines() if line.startswith("sweep")]
    assert "sweep[0-5]" in row and "6 succeeded" in row, table
    # Its tasks' records are not what the row is made of: one made unreadable changes
    # nothing there, while the listing that does read every task skips it.
    task = next(p for p in (cluster.storage / "jobs").glob("a-*-3.json"))
    task.write_text("{ torn", encoding="utf-8")
    assert "6 succeeded" in cluster.ok("jobs")
    tasks = [j for j in cluster.json("jobs") if j.get("array")]
    assert len(tasks) == 5  # --json lists every task it can read


def test_others_queued_jobs_past_the_first_thirty_are_counted_not_listed(make_cluster):
    cluster = make_cluster({"node01": 2}, fast=True)
    cluster.ok("claim", "-n", "2", "--time", "1h", user="carol")  # nothing queued can start
    for i in range(35):
        cluster.ok("run", "--queue", "--name", f"b{i}", "--", "true", user="bob")
    for i in range(2):
        cluster.ok("run", "--queue", "--name", f"mine{i}", "--", "true")
    table = cluster.ok("jobs")
    # a row's first line starts at the left edge (a long reason wraps onto indented lines)
    listed = [line.split()[0] for line in table.splitlines()[1:] if line[:1].strip()]
    assert "mine0" in listed and "mine1" in listed  # your own, wherever they are
    assert [n for n in listed if n.startswith("b")] == [f"b{i}" for i in range(30)]
    assert "… and 5 more queued: bob 5 (gpuclaim jobs --json lists every one)" in table
    everything = cluster.json("jobs")
    assert sum(j["state"] == "queued" for j in everything) == 37
    # a hidden one is still explained, with its place among all of them
    why = cluster.json("why", "b33")
    assert why["queue_position"] == 34 and why["queue_length"] == 37, why
    assert "Resources" in why["reason"]


def test_history_kept_sum_agrees_with_reading_every_log_again(make_cluster):
    cluster = make_cluster({"node01": 2}, fast=True)
    for user in ("alice", "bob", "alice"):
        claim = cluster.json("claim", "-n", "1", "--time", "1h", user=user)
        time.sleep(0.2)
        cluster.ok("release", claim["id"], user=user)
    first = cluster.json("history")
    kept = list((cluster.home / "history").glob("*.json"))
    assert len(kept) == 1  # the sum this reader keeps
    claim = cluster.json("claim", "-n", "2", "--time", "1h", user="bob")
    cluster.ok("release", claim["id"], user="bob")
    with open(cluster.storage / "events" / "torn.jsonl", "w", encoding="utf-8") as fh:
        fh.write('{"type": "release", "claim_id": "c-torn"')  # a writer still at it
    after = cluster.json("history")
    shutil.rmtree(cluster.home / "history")
    again = cluster.json("history")  # every log read from its start
    rows = {r["user"]: r for r in after}
    assert rows == {r["user"]: r for r in again}
    assert rows["bob"]["claims"] == 2 and {r["user"]: r for r in first}["bob"]["claims"] == 1
    assert cluster.json("history", "--claims") == cluster.json("history", "--claims")
    assert len(cluster.json("history", "--claims")) == 4


def test_a_name_is_taken_while_its_job_or_array_runs_and_free_after(make_cluster):
    """run's name check reads only the records of that name and the arrays' records."""
    cluster = make_cluster({"node01": 1}, fast=True)
    cluster.ok("run", "--array", "0-1", "--name", "grid", "--", "sleep", "2")
    taken = cluster.cli("run", "--name", "grid", "--", "true")
    assert taken.returncode == 5 and "already have a job named 'grid'" in taken.stderr
    bob = cluster.cli("run", "--queue", "--name", "grid", "--", "true", user="bob")
    assert bob.returncode == 0, bob.stderr  # a name is taken for its own user only
    _wait_ended(cluster, 3)
    again = cluster.cli("run", "--name", "grid", "--", "true")
    assert again.returncode == 0, again.stderr
