"""[sweeps]: finished job records leave ``jobs/`` for the archive a day after their end, so the
store does not slow down as history grows, and every command that names an old job still
finds it. Jobs run for real on the sshd testbed; "a day later" is the records as the wrappers
left them with every time moved back two days (nothing else of them is written by hand)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from gpuclaim.core.model import iso, parse_iso

TWO_DAYS = 2 * 86400


def _live(c) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (c.storage / "jobs").glob("*.json")}


def _archived_lines(c) -> list[dict]:
    folder = c.storage / "jobs" / "archive"
    return [
        json.loads(line)
        for batch in sorted(folder.glob("*.jsonl"))
        for line in batch.read_text().splitlines()
    ]


def _age(record: dict, seconds: float) -> dict:
    """The record as it would be read ``seconds`` later: every time it holds, moved back."""
    aged = dict(record)
    for key in ("submitted", "started", "ended"):
        if aged.get(key):
            aged[key] = iso(parse_iso(aged[key]) - seconds)
    aged["ranks"] = [
        {
            k: iso(parse_iso(v) - seconds) if k in ("started", "ended") and v else v
            for k, v in r.items()
        }
        for r in record.get("ranks") or []
    ]
    return aged


def _age_all(c, seconds: float = TWO_DAYS) -> None:
    for path in (c.storage / "jobs").glob("*.json"):
        path.write_text(json.dumps(_age(json.loads(path.read_text()), seconds)))


def _wait_final(c, names: set[str], timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = c.json("jobs", "--all")
        done = {r["name"] for r in rows if r["state"] in ("succeeded", "failed")}
        if names <= done:
            return rows
        assert time.monotonic() < deadline, [(r["name"], r["state"]) for r in rows]
        time.sleep(0.5)


def test_old_records_are_archived_and_every_command_still_finds_them(testbed, make_remote):
    c = make_remote(testbed, heartbeat="1s")
    c.ok("run", "--name", "prep", "--", "sh", "-c", "echo prepared")
    c.ok("run", "--array", "0-2", "--name", "sw", "--", "sh", "-c", "echo task")
    before = _wait_final(c, {"prep", "sw[0]", "sw[1]", "sw[2]"})
    ids = {r["id"] for r in before}
    _age_all(c)

    collected = c.json("gc")
    assert collected["jobs_archived"] == 4
    assert not _live(c), "every record a day old left jobs/"
    assert sorted(d["id"] for d in _archived_lines(c)) == sorted(ids)

    assert c.json("jobs") == [], "the default view shows a day's jobs: none of these"
    after = {r["id"]: r for r in c.json("jobs", "--all")}
    assert set(after) == ids
    for row in before:  # the same jobs, two days older
        moved = after[row["id"]]
        assert (moved["name"], moved["state"], moved["argv"]) == (
            row["name"],
            row["state"],
            row["argv"],
        )
        assert parse_iso(moved["ended"]) == parse_iso(row["ended"]) - TWO_DAYS

    assert "prepared" in c.ok("logs", "prep"), "logs NAME of an archived job"
    script = c.ok("export", "sbatch", "sw")
    assert "#SBATCH --array=0-2" in script
    # --after an archived job that succeeded: it starts (its dependency is read there)
    c.ok("run", "--after", "prep", "--name", "next", "--", "true")
    rows = _wait_final(c, {"next"})
    assert [r["state"] for r in rows if r["name"] == "next"] == ["succeeded"]
    assert c.json("gc")["jobs_archived"] == 0, "nothing archived twice"


def _template(c) -> dict:
    c.ok("run", "--name", "one", "--", "true")
    _wait_final(c, {"one"})
    (record,) = _live(c).values()
    return _age(record, TWO_DAYS)


def _write_copies(c, template: dict, count: int, first: int = 0) -> set[str]:
    ids = set()
    for i in range(first, first + count):
        record = dict(template, id=f"j-old{i:05d}", name=f"old-{i}")
        (c.storage / "jobs" / f"{record['id']}.json").write_text(json.dumps(record))
        ids.add(record["id"])
    return ids


def test_a_look_moves_a_batch_and_racing_lookers_move_each_record_once(testbed, make_remote):
    """Four `jobs` processes started at the same instant over 1,150 old records: each record
    ends up exactly once, in the archive or (a crash between the two steps) still live."""
    c = make_remote(testbed, heartbeat="1s")
    template = _template(c)
    (c.storage / "jobs" / f"{template['id']}.json").unlink()
    ids = _write_copies(c, template, 150)

    c.json("jobs")
    assert len(_live(c)) == 150, "fewer than a batch (200): a look moves none"
    ids |= _write_copies(c, template, 1000, first=150)
    script = (
        "import subprocess, sys, time; t = float(sys.argv[1]);"
        " time.sleep(max(0.0, t - time.time()));"
        " sys.exit(subprocess.run([sys.executable, '-m', 'gpuclaim', 'jobs', '--json'],"
        " stdout=subprocess.DEVNULL).returncode)"
    )
    at = str(time.time() + 1.5)
    racers = [
        subprocess.Popen([sys.executable, "-c", script, at], env=c.env(user=u))
        for u in ("alice", "bob", "carol", "dave")
    ]
    assert [p.wait(timeout=120) for p in racers] == [0, 0, 0, 0]

    archived = [d["id"] for d in _archived_lines(c)]
    assert len(archived) == len(set(archived)), "no record archived twice"
    assert set(archived) | set(_live(c)) == ids and not set(archived) & set(_live(c))
    assert len(archived) == 1150, "one look moves every old record it read"
    listed = [r["id"] for r in c.json("jobs", "--all")]
    assert sorted(listed) == sorted(ids)


def test_a_record_left_in_both_places_is_listed_once_the_live_one(testbed, make_remote):
    """A crash between publishing a batch and unlinking its records leaves both."""
    c = make_remote(testbed, heartbeat="1s")
    template = _template(c)
    (c.storage / "jobs" / f"{template['id']}.json").write_text(json.dumps(template))
    folder = c.storage / "jobs" / "archive"
    folder.mkdir()
    stale = dict(template, state="failed", reason="an older copy")
    (folder / "20261130T000000Z-crashed.jsonl").write_text(json.dumps(stale) + "\n{torn")
    (row,) = [r for r in c.json("jobs", "--all") if r["id"] == template["id"]]
    assert row["state"] == "succeeded"
    assert c.json("gc")["jobs_archived"] == 1
    (row,) = [r for r in c.json("jobs", "--all") if r["id"] == template["id"]]
    assert row["state"] == "succeeded", "the newer batch wins over the crashed one"


def test_tasks_of_an_array_without_its_summary_stay_live(testbed, make_remote):
    """The array's summary reads its tasks' live records: they move only once it is written."""
    c = make_remote(testbed, heartbeat="1s")
    c.ok("run", "--array", "0-1", "--name", "pair", "--", "true")
    _wait_final(c, {"pair[0]", "pair[1]"})
    _age_all(c)
    (array_file,) = (c.storage / "jobs").glob("*.array")
    summarized = json.loads(array_file.read_text())
    unsummarized = {k: v for k, v in summarized.items() if k != "result"}
    array_file.write_text(json.dumps(unsummarized))
    assert c.json("gc")["jobs_archived"] == 0
    array_file.write_text(json.dumps(summarized))
    assert c.json("gc")["jobs_archived"] == 2
