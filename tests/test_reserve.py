"""Booking GPUs for a future window (``reserve``), end to end through the CLI on the sshd
testbed: others' claims kept off a booking, backfill before it, the owner's claim getting
exactly its GPUs, cancel, no-shows, racing bookings (also through sshfs), bad input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults import _sshfs
from test_slack import FakeSlack, _with_slack

from gpuclaim.core.when import format_when, iso_local


def _iso_epoch(value: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _wait_until(epoch: float) -> None:
    delay = epoch - time.time()
    if delay > 0:
        time.sleep(delay)


def _bookings_on_disk(c) -> list[str]:
    directory = Path(c.storage) / "reservations"
    return sorted(p.name for p in directory.glob("*.json")) if directory.is_dir() else []


def _race(runs: list[tuple[object, str, tuple[str, ...]]]) -> list[tuple[int, str, str]]:
    """Start every ``(cluster, user, args)`` at once; (exit code, stdout, stderr) of each."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpuclaim", *args],
            env=cl.env(user=user),  # type: ignore[attr-defined]
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cl, user, args in runs
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode in (0, 3), err  # won, or lost to someone: nothing else
        assert "Traceback" not in err
        results.append((p.returncode, out, err))
    return results


def _one_winner(results: list[tuple[int, str, str]]) -> dict:
    won = [json.loads(out) for code, out, _ in results if code == 0]
    assert len(won) == 1, [err for _, _, err in results]
    return won[0]


def test_a_booking_keeps_others_off_but_lets_shorter_claims_backfill(make_testbed, make_remote):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb)
    booked = c.json("reserve", "--gpu", "node01:0,1", "--start", "+40s", "--time", "60s")
    assert booked["user"] == "alice" and booked["node"] == "node01" and booked["gpus"] == [0, 1]
    start, end = _iso_epoch(booked["start"]), _iso_epoch(booked["end"])
    assert 35 < start - time.time() <= 41 and end - start == pytest.approx(60, abs=0.01)
    # another user's hour would overlap it: refused with who and from when
    hour = c.cli("claim", "--gpu", "node01:0", "--time", "1h", user="bob")
    assert hour.returncode == 3, hour.stderr
    assert re.search(r"reserved by alice from (today|tomorrow) \d\d:\d\d", hour.stderr), hour.stderr
    assert booked["id"] in hour.stderr and "--time" in hour.stderr  # the backfill hint
    anyone = c.cli("claim", "-n", "1", "--time", "1h", user="bob")
    assert anyone.returncode == 3 and "reserved by alice" in anyone.stderr, anyone.stderr
    # ... ten seconds end before it starts: allowed (backfill)
    short = c.json("claim", "-n", "1", "--time", "10s", user="bob")
    assert short["node"] == "node01"
    # an overlapping booking is refused, naming the one in the way
    clash = c.cli("reserve", "--gpu", "node01:1", "--start", "+70s", "--time", "1h", user="bob")
    assert clash.returncode == 3 and "reserved by alice" in clash.stderr, clash.stderr
    # one right after it is fine: windows are half open
    after = c.json(
        "reserve", "--gpu", "node01:1", "--start", booked["end"], "--time", "5m", user="bob"
    )
    assert after["start"] == booked["end"]
    listed = c.json("reserve", "--list", user="carol")
    assert [(b["id"], b["user"], b["node"], b["gpus"]) for b in listed] == [
        (booked["id"], "alice", "node01", [0, 1]),
        (after["id"], "bob", "node01", [1]),
    ]
    assert {"start", "end", "state"} <= set(listed[0]) and listed[0]["state"] == "upcoming"
    # status shows the coming booking on each GPU row
    rows = c.by_gpu(user="carol")
    assert rows[("node01", 0)]["reservation"] == {
        "id": booked["id"],
        "user": "alice",
        "start": booked["start"],
        "end": booked["end"],
    }
    assert "reserved by alice" in c.ok("status", user="carol")


def test_in_the_window_the_owner_gets_exactly_the_booked_gpus(make_testbed, make_remote):
    tb = make_testbed(1, gpus=3)
    c = make_remote(tb)
    booked = c.json("reserve", "--gpu", "node01:1,2", "--start", "+4s", "--time", "2m")
    _wait_until(_iso_epoch(booked["start"]) + 0.5)
    rows = c.by_gpu(user="bob")
    assert [rows[("node01", i)]["state"] for i in range(3)] == ["free", "reserved", "reserved"]
    assert rows[("node01", 1)]["reservation"]["user"] == "alice"
    # others cannot get them, in any way
    for args in (
        ("-n", "2"),
        ("--gpu", "node01:1"),
        ("-n", "1", "--time", "5s", "--node", "node01"),
    ):
        proc = c.cli("claim", *args, user="bob")
        if args[0] == "-n" and args[1] == "1":
            assert proc.returncode == 0, proc.stderr  # GPU 0 is not booked
            assert json.loads(c.ok("status", "--json", user="bob"))[0]["state"] == "claimed"
            c.ok("release", "--all", user="bob")
            continue
        assert proc.returncode == 3, (args, proc.stderr)
        assert "reserved by alice" in proc.stderr
    summary = c.ok("status", user="bob").splitlines()[0]
    assert "2 reserved" in summary, summary
    # the owner's plain claim gets exactly them, and ends with the booking
    mine = c.json("claim", "-n", "2")
    assert mine["gpus"] == [1, 2]
    assert mine["expires"] == booked["end"]
    listed = c.json("reserve", "--list")
    assert listed[0]["used"] is not None and listed[0]["state"] == "open"
    c.ok("release", mine["id"])
    # --reservation ID names them too
    again = c.json("claim", "--reservation", booked["id"])
    assert again["gpus"] == [1, 2]
    c.ok("release", again["id"])
    # another user's booking cannot be claimed by id, nor cancelled without --force
    theirs = c.cli("claim", "--reservation", booked["id"], user="bob")
    assert theirs.returncode == 3 and "belongs to alice" in theirs.stderr
    refused = c.cli("reserve", "--cancel", booked["id"], user="bob")
    assert refused.returncode == 3 and "--force" in refused.stderr
    # cancelling frees them
    c.ok("reserve", "--cancel", booked["id"])
    assert c.json("claim", "-n", "3", user="bob")["gpus"] == [0, 1, 2]
    assert c.json("reserve", "--list") == []
    ended = c.json("reserve", "--list", "--all")
    assert [(b["id"], b["state"]) for b in ended] == [(booked["id"], "cancelled")]


def test_a_no_show_is_released_after_the_grace_and_counted(make_testbed, make_remote):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb, reserve_grace="4s")
    slack = FakeSlack()
    try:
        _with_slack(c, slack.url, events=["reservation"])
        booked = c.json("reserve", "-n", "2", "--start", "+2s", "--time", "1h", "--note", "paper")
        slack.wait_for("booked node01 GPU 0,1")
        _wait_until(_iso_epoch(booked["start"]) + 0.5)
        assert {r["state"] for r in c.status(user="bob")} == {"reserved"}
        slack.wait_for("your booking of node01 GPU 0,1 is open")
        _wait_until(_iso_epoch(booked["start"]) + 5)
        # the first look after the grace releases it, once
        assert {r["state"] for r in c.status(user="bob")} == {"free"}
        assert c.json("reserve", "--list") == []
        ended = c.json("reserve", "--list", "--all")
        assert [(b["id"], b["state"], b["used"]) for b in ended] == [
            (booked["id"], "no-show", None)
        ]
        assert c.json("claim", "-n", "2", "--time", "1h", user="bob")["gpus"] == [0, 1]
        slack.wait_for("was released: nobody claimed it within 4s")
        slack.let_late_posts_land()
        assert len([t for t in slack.texts() if "was released" in t]) == 1
    finally:
        slack.close()
    history = {r["user"]: r for r in c.json("history")}
    assert history["alice"]["no_shows"] == 1
    # held for the grace (4-5 s) on 2 GPUs, none of it used
    assert 2 * 4 / 3600 <= history["alice"]["unused_gpu_hours"] <= 2 * 8 / 3600
    assert history["alice"]["unused_gpu_hours"] == history["alice"]["booked_gpu_hours"]
    assert "NO-SHOWS" in c.ok("history")


def test_a_used_booking_is_no_no_show(make_testbed, make_remote):
    grace_s = 3
    tb = make_testbed(1, gpus=1)
    c = make_remote(tb, reserve_grace=f"{grace_s}s")
    booked = c.json("reserve", "-n", "1", "--start", "+2s", "--time", "1h")
    _wait_until(_iso_epoch(booked["start"]) + 0.3)
    mine = c.json("claim", "-n", "1", "--time", "1h")
    c.ok("release", mine["id"])  # came, and left at once
    # deliberately past the grace: the first look now releases a booking nobody used
    _wait_until(_iso_epoch(booked["start"]) + grace_s + 1)
    assert c.json("reserve", "--list")[0]["used"] is not None  # still booked: not a no-show
    rows = c.status(user="bob")
    assert rows[0]["state"] == "reserved", rows
    assert mine["gpus"] == [0]


def test_racing_bookings_of_one_slot_exactly_one_wins(make_testbed, make_remote):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb)
    for round_ in range(3):
        args = ("reserve", "--gpu", "node01:0,1", "--start", f"+{2 + round_}h", "--time", "30m")
        _one_winner(_race([(c, f"u{i}", (*args, "--json")) for i in range(6)]))
    assert len(_bookings_on_disk(c)) == 3


def test_a_booking_and_a_claim_racing_never_both_win(make_testbed, make_remote):
    tb = make_testbed(1, gpus=1)
    c = make_remote(tb)
    for _ in range(4):
        booking, claim = _race(
            [
                (c, "alice", ("reserve", "-n", "1", "--start", "+1h", "--time", "1h", "--json")),
                (c, "bob", ("claim", "-n", "1", "--time", "2h", "--json")),
            ]
        )
        assert not (booking[0] == 0 and claim[0] == 0), (booking, claim)
        if claim[0] == 0:
            c.ok("release", "--all", user="bob")
        if booking[0] == 0:
            c.ok("reserve", "--cancel", json.loads(booking[1])["id"])


def test_racing_bookings_through_two_sshfs_mounts(make_testbed, make_remote, tmp_path):
    if shutil.which("sshfs") is None:
        pytest.fail("sshfs is missing: apt-get install sshfs", pytrace=False)
    tb = make_testbed(2, gpus=2)
    real = tmp_path / "server-store"
    real.mkdir()
    mounts = []
    try:
        for node in tb.nodes:
            mounts.append(tmp_path / f"mnt-{node}")
            _sshfs(tb, node, real, mounts[-1])
        (mounts[0] / "store").mkdir()
        clusters = [make_remote(tb, nodes=["node01"], storage=str(m / "store")) for m in mounts]
        clusters[0].ok("status")
        for round_ in range(3):
            args = ("reserve", "--gpu", "node01:0", "--start", f"+{3 + round_}h", "--time", "1h")
            # 4 bookers through 2 mounts of one store
            runs = [(cl, f"u{i}", (*args, "--json")) for i, cl in enumerate(clusters + clusters)]
            _one_winner(_race(runs))
        on_server = sorted(p.name for p in (real / "store" / "reservations").glob("*.json"))
        assert len(on_server) == 3
    finally:
        for mnt in mounts:
            subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True)


def test_the_owners_queued_job_starts_in_its_booking_and_others_wait(make_testbed, make_remote):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb)
    blocker = c.json("claim", "-n", "2", "--time", "8s", user="bob")
    booked = c.json("reserve", "-n", "2", "--start", "+12s", "--time", "2m")
    assert booked["gpus"] == [0, 1]
    # carol queued first, for an hour: she would run into alice's booking
    carol = c.json(
        "run",
        "-n",
        "2",
        "--queue",
        "--time",
        "1h",
        "--name",
        "long",
        "--",
        "sleep",
        "60",
        user="carol",
    )
    assert carol["state"] == "queued"
    alice = c.json(
        "run", "-n", "2", "--queue", "--time", "20s", "--name", "paper", "--", "echo", "hi"
    )
    assert alice["state"] == "queued"
    _wait_until(_iso_epoch(blocker["expires"]) + 1)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        jobs = {j["name"]: j for j in c.json("jobs", "--all", user="carol")}
        if jobs["paper"]["state"] in ("running", "succeeded"):
            break
        time.sleep(1)
    jobs = {j["name"]: j for j in c.json("jobs", "--all", user="carol")}
    assert jobs["paper"]["state"] in ("running", "succeeded"), jobs["paper"]
    assert jobs["long"]["state"] == "queued", jobs["long"]
    c.ok("kill", "long", user="carol")


def test_extending_a_claim_into_someone_elses_booking_is_refused(make_testbed, make_remote):
    tb = make_testbed(1, gpus=1)
    c = make_remote(tb)
    mine = c.json("claim", "-n", "1", "--time", "10m", user="bob")
    c.json("reserve", "-n", "1", "--start", "+20m", "--time", "1h")
    proc = c.cli("extend", mine["id"], "--time", "30m", user="bob")
    assert proc.returncode == 3 and "reserved by alice" in proc.stderr, proc.stderr
    assert "add up to" in proc.stderr
    c.ok("extend", mine["id"], "--time", "5m", user="bob")


def test_a_booking_over_a_claim_that_ends_too_late_is_refused(make_testbed, make_remote):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb)
    held = c.json("claim", "--gpu", "node01:1", "--time", "2h", user="bob")
    proc = c.cli("reserve", "--gpu", "node01:0,1", "--start", "+1h", "--time", "1h")
    assert proc.returncode == 3, proc.stderr
    assert f"claimed by bob (claim {held['id']})" in proc.stderr
    assert _bookings_on_disk(c) == []
    # -n finds the GPU that is free then
    assert c.json("reserve", "-n", "1", "--start", "+1h", "--time", "1h")["gpus"] == [0]


@pytest.mark.parametrize(
    "args, code, words",
    [
        (("-n", "1", "--start", "2020-01-01T09:00", "--time", "1h"), 2, "in the past"),
        (("-n", "1", "--start", "+2h", "--end", "+1h"), 2, "before it starts"),
        (("-n", "1", "--start", "next week", "--time", "1h"), 2, "not a time"),
        (("-n", "1", "--start", "+1h", "--time", "soon"), 2, "not a duration"),
        (("-n", "5", "--start", "+1h", "--time", "1h"), 1, "can never be booked"),
        (("--gpu", "node01:7", "--start", "+1h", "--time", "1h"), 1, "has no GPU 7"),
        (("-n", "1", "--start", "+1h", "--time", "3h"), 2, "max_reservation"),
        (("-n", "1", "--start", "+3d", "--time", "1h"), 2, "reserve_ahead"),
        (("-n", "2", "--start", "+1h", "--time", "2h"), 2, "max_reserved_gpu_hours"),
        (("-n", "1", "--start", "+1h"), 2, "--time"),
        (("--list", "--cancel", "r-1"), 2, "--list"),
        (("--cancel", "r-nothere"), 1, "no reservation"),
    ],
)
def test_bad_input_is_one_clear_line_and_nothing_is_written(
    make_testbed, make_remote, args, code, words
):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb, max_reservation="2h", reserve_ahead="2d", max_reserved_gpu_hours=3)
    proc = c.cli("reserve", *args)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert _bookings_on_disk(c) == []


def test_bookings_through_ssh_storage_and_a_forced_cancel_is_announced(make_testbed, make_remote):
    """With ``storage = "ssh://..."`` every booking operation runs on the storage host through
    its agent: the files live there, others are kept off, a forced cancel reaches Slack."""
    tb = make_testbed(2, gpus=2)
    root = tb.dir / "srv-store"
    root.mkdir()
    c = make_remote(tb, storage=f"ssh://node01{root}")
    slack = FakeSlack()
    try:
        _with_slack(c, slack.url, events=["reservation"])
        booked = c.json("reserve", "--gpu", "node02:0,1", "--start", "+1h", "--time", "1h")
        assert [p.name for p in (root / "reservations").glob("*.json")] == [f"{booked['id']}.json"]
        refused = c.cli("claim", "--gpu", "node02:1", "--time", "2h", user="bob")
        assert refused.returncode == 3 and "reserved by alice" in refused.stderr, refused.stderr
        assert c.json("claim", "-n", "2", "--time", "2h", user="bob")["node"] == "node01"
        c.ok("reserve", "--cancel", booked["id"], "--force", user="carol")
        slack.wait_for(f"was cancelled by carol (--force) ({booked['id']})")
        assert not list((root / "reservations").glob("*.json"))
        assert (root / "reservations" / "ended" / f"{booked['id']}.json").exists()
    finally:
        slack.close()


def test_the_board_shows_a_booking_on_its_gpus(make_cluster):
    c = make_cluster({"bd01": 2}, fast=True)
    soon = c.json("reserve", "--gpu", "bd01:1", "--start", "+2s", "--time", "1h", "--note", "x")
    # a booking later on (the board shows the next one within 24 h, whatever the time of
    # day the test runs at), on a whole minute, in the local form the board writes
    later = (time.time() // 60 + 5 * 60) * 60
    if time.localtime(later)[:3] != time.localtime(later + 3600)[:3]:
        later -= 3600  # an hour that crosses midnight is written with both days: not this one
    start = iso_local(later)
    c.json("reserve", "--gpu", "bd01:0", "--start", start, "--time", "1h", user="bob")
    _wait_until(_iso_epoch(soon["start"]) + 0.1)  # alice's booking has opened
    lines = c.ok("board", "--once", "--size", "160x12", user="carol").splitlines()
    row0 = next(ln for ln in lines if ln.lstrip().startswith("bd01"))
    row1 = lines[lines.index(row0) + 1]
    window = f"{format_when(later, time.time())}-{format_when(later + 3600, later)[-5:]}"
    assert re.match(r"(today|tomorrow) \d\d:\d\d-\d\d:\d\d$", window), window
    assert "● free" in row0 and f"📅 reserved by bob {window}" in row0, (window, lines)
    assert "◇ reserved" in row1 and "alice" in row1 and "📅 reserved by alice" in row1, lines


def _job(c, name: str) -> dict:
    return next(j for j in c.json("jobs", "--all") if j["name"] == name)


def _until_state(c, name: str, states: tuple[str, ...], timeout: float = 40) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(c, name)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.5)


def test_run_on_a_reservation_uses_exactly_its_gpus(make_testbed, make_remote):
    tb = make_testbed(1, gpus=3)
    c = make_remote(tb)
    booked = c.json("reserve", "--gpu", "node01:1,2", "--start", "+1s", "--time", "5m")
    probe = "import os; print('cvd=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    c.ok(
        "run",
        "--reservation",
        booked["id"],
        "-n",
        "1",
        "--name",
        "one",
        "--",
        "python3",
        "-c",
        probe,
    )
    one = _until_state(c, "one", ("succeeded",))
    assert one["ranks"][0]["gpus"] == [1]
    assert one["reservation"] == booked["id"]
    assert "cvd=1" in c.ok("logs", "one")
    # without -n: all of it, and it waits for the one alice holds herself right now
    mine = c.json("claim", "--gpu", "node01:2", "--time", "6s")
    queued = c.json(
        "run",
        "--reservation",
        booked["id"],
        "--queue",
        "--name",
        "both",
        "--",
        "python3",
        "-c",
        probe,
    )
    assert queued["state"] == "queued"
    both = _until_state(c, "both", ("succeeded",), timeout=60)
    assert both["ranks"][0]["gpus"] == [1, 2] and "cvd=1,2" in c.ok("logs", "both")
    assert mine["gpus"] == [2]
    # someone else's reservation, too many GPUs, another node: one line each
    other = c.cli("run", "--reservation", booked["id"], "--", "true", user="bob")
    assert other.returncode == 3 and "belongs to alice" in other.stderr
    many = c.cli("run", "--reservation", booked["id"], "-n", "3", "--", "true")
    assert many.returncode == 2 and "holds 2 GPU(s)" in many.stderr, many.stderr


def test_a_queued_run_on_a_cancelled_reservation_never_runs(make_testbed, make_remote):
    tb = make_testbed(1, gpus=1)
    c = make_remote(tb)
    booked = c.json("reserve", "-n", "1", "--start", "+1h", "--time", "1h")
    c.json("claim", "-n", "1", "--time", "30m")  # the GPU is busy (alice's own claim)
    job = c.json("run", "--reservation", booked["id"], "--queue", "--name", "late", "--", "true")
    assert job["state"] == "queued"
    c.ok("reserve", "--cancel", booked["id"])
    c.ok("status")  # a look dispatches: the job finds its booking gone
    late = _until_state(c, "late", ("cancelled",), timeout=20)
    assert booked["id"] in late["reason"], late


def test_a_booking_on_an_unreachable_node_is_one_line_and_nothing_written(
    make_testbed, make_remote
):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb)
    tb.stop_node("node01")
    proc = c.cli("reserve", "--gpu", "node01:0", "--start", "+1h", "--time", "1h")
    assert proc.returncode == 4, proc.stderr
    assert "could be asked" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert _bookings_on_disk(c) == []
