"""Housekeeping that must not be forgotten ([hardening-3]): ``gc`` drops ended bookings older
than ``[defaults] keep_reservations`` (90 days unless said), and ``doctor`` checks with
``ssh://`` storage that every node sees the store at that path (a job's wrapper reads and
writes it there), by the id stamped in it, as it does for path storage."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from test_storage_setup import split_testbed  # noqa: F401  (a fixture)

DAY = 86400.0


def _ended_dir(c: Any) -> Path:
    return Path(c.storage) / "reservations" / "ended"


def _ended_ago(c: Any, node: str, gpu: int, days: float) -> str:
    """A booking made and cancelled through the CLI, then aged: its file says it ended
    ``days`` ago, as it would after that long on the shelf."""
    booked = c.json("reserve", "--gpu", f"{node}:{gpu}", "--start", "+1h", "--time", "1h")
    c.ok("reserve", "--cancel", booked["id"])
    path = _ended_dir(c) / f"{booked['id']}.json"
    record = json.loads(path.read_text())
    record["ended"] = time.time() - days * DAY
    path.write_text(json.dumps(record))
    return str(booked["id"])


def _listed_ids(c: Any) -> list[str]:
    return sorted(b["id"] for b in c.json("reserve", "--list", "--all"))


def test_gc_drops_ended_bookings_older_than_90_days_by_default(make_cluster):
    c = make_cluster({"node01": 4}, fast=True)
    old = [_ended_ago(c, "node01", 0, 91), _ended_ago(c, "node01", 1, 400)]
    recent = _ended_ago(c, "node01", 2, 89)
    live = c.json("reserve", "--gpu", "node01:3", "--start", "+1h", "--time", "1h")["id"]
    assert _listed_ids(c) == sorted([*old, recent, live])
    # --list --all says how far back it can see
    listed = c.ok("reserve", "--list", "--all")
    said = (
        "Ended bookings are kept 90d ('gpuclaim gc' drops older ones; [defaults] keep_reservations)"
    )
    assert said in listed, listed
    assert "kept 90d" not in c.ok("reserve", "--list")  # the live ones alone: no such line
    collected = c.json("gc")
    assert collected["bookings_dropped"] == 2 and collected["damaged_bookings"] == []
    assert sorted(p.stem for p in _ended_dir(c).glob("*.json")) == [recent]
    assert _listed_ids(c) == sorted([recent, live])
    assert c.json("gc")["bookings_dropped"] == 0, "nothing dropped twice"
    # the line, singular and plural, like the other lines of gc
    one = _ended_ago(c, "node01", 0, 95)
    assert "Dropped 1 booking that ended over 90d ago" in c.ok("gc")
    assert not (_ended_dir(c) / f"{one}.json").exists()
    _ended_ago(c, "node01", 0, 95)
    _ended_ago(c, "node01", 1, 95)
    assert "Dropped 2 bookings that ended over 90d ago" in c.ok("gc")
    assert c.ok("gc").strip() == "Nothing to collect."


def test_keep_reservations_is_a_setting_and_a_bad_one_is_one_line(make_cluster):
    c = make_cluster({"node01": 2}, fast=True, keep_reservations="2d")
    kept = _ended_ago(c, "node01", 0, 1)
    _ended_ago(c, "node01", 1, 3)
    assert "Ended bookings are kept 2d" in c.ok("reserve", "--list", "--all")
    assert "Dropped 1 booking that ended over 2d ago" in c.ok("gc")
    assert _listed_ids(c) == [kept]
    text = c.config_path.read_text()
    c.config_path.write_text(text.replace('keep_reservations = "2d"', 'keep_reservations = "ever"'))
    proc = c.cli("gc")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "keep_reservations" in lines[0], proc.stderr
    assert [p.stem for p in _ended_dir(c).glob("*.json")] == [kept], "a bad config drops nothing"


def test_a_damaged_ended_booking_does_not_stop_gc(make_cluster):
    c = make_cluster({"node01": 2}, fast=True)
    old = _ended_ago(c, "node01", 0, 100)
    recent = _ended_ago(c, "node01", 1, 1)
    ended = _ended_dir(c)
    (ended / "r-torn0000.json").write_bytes(b'{"id": "r-torn0000", "user": "al')
    (ended / "r-nogpus00.json").write_text(json.dumps({"id": "r-nogpus00", "user": "bob"}))
    proc = c.cli("gc", "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    collected = json.loads(proc.stdout)
    assert collected["bookings_dropped"] == 1
    assert sorted(collected["damaged_bookings"]) == ["r-nogpus00.json", "r-torn0000.json"]
    # set aside for a person to look at, as a damaged claim file is, never deleted
    assert sorted(p.stem for p in ended.glob("*.json")) == [recent]
    aside = sorted(p.name for p in (Path(c.storage) / "corrupt").iterdir())
    assert len(aside) == 2 and all(n.startswith("booking-r-") for n in aside), aside
    assert old not in _listed_ids(c) and recent in _listed_ids(c)
    # said once, in one line each; the next gc finds nothing left to say
    (ended / "r-junk0000.json").write_text("not json")
    text = c.ok("gc")
    lines = [ln for ln in text.splitlines() if "r-junk0000" in ln]
    assert len(lines) == 1 and "Damaged ended booking file" in lines[0], text
    assert "moved to" in lines[0] and "corrupt" in lines[0], text
    assert c.ok("gc").strip() == "Nothing to collect."


def test_doctor_with_ssh_storage_checks_the_nodes_see_the_store(make_testbed, make_remote):
    tb = make_testbed(2, gpus=1)
    root = tb.dir / "srv-store"
    root.mkdir(mode=0o2775)
    c = make_remote(tb, storage=f"ssh://node01{root}")
    c.ok("status")  # makes the store on node01 and stamps its id
    report = {h["node"]: h for h in c.json("doctor")}
    assert report["node01"]["storage"] == "ok" and report["node02"]["storage"] == "ok", report
    assert "All nodes look good." in c.ok("doctor")
    # gc's pruning runs on the storage host too
    booked = c.json("reserve", "--gpu", "node02:0", "--start", "+1h", "--time", "1h")
    c.ok("reserve", "--cancel", booked["id"])
    path = root / "reservations" / "ended" / f"{booked['id']}.json"
    record = json.loads(path.read_text())
    record["ended"] = time.time() - 100 * DAY
    path.write_text(json.dumps(record))
    assert c.json("gc")["bookings_dropped"] == 1 and not path.exists()


def test_doctor_with_ssh_storage_finds_the_node_that_does_not_see_it(
    split_testbed,  # noqa: F811
    make_remote,
):
    tb, shared, own = split_testbed
    c = make_remote(tb, storage=f"ssh://node01{shared}")
    c.ok("status")  # the store, made on node01 (the storage host)
    report = {h["node"]: h for h in c.json("doctor", expect=1)}  # 1: a node has a problem
    assert report["node01"]["storage"] == "ok" and report["node03"]["storage"] == "ok", report
    assert "holds no gpuclaim store" in report["node02"]["storage"], report["node02"]
    assert list(own.iterdir()) == [], "doctor made a store where there was none"
    proc = c.cli("doctor")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert f"node02: storage: {shared} holds no gpuclaim store" in proc.stdout, proc.stdout
    assert f"mount node01's {shared} on the node at that same path" in proc.stdout, proc.stdout
    # a store of its own at that path: another claim pool, found by its id
    subprocess.run(["cp", "-a", f"{shared}/.", str(own)], check=True)
    (own / "ID").write_text("0123456789abcdef01234567\n")
    report = {h["node"]: h for h in c.json("doctor", expect=1)}
    problem = report["node02"]["storage"]
    assert "another store" in problem and "0123456789abcdef01234567" in problem, problem
    assert report["node01"]["storage"] == "ok"
