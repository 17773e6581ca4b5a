"""[hardening-4] gangs and preemption on the sshd testbed (real tmux, real signals): a gang
that needs GPUs held by preemptible jobs makes them yield on every node it needs, all or
none; a preemptible gang yields as one job; a queued ``--reservation`` job makes the
preemptible work inside its booking yield, as a claim on it does."""

from __future__ import annotations

import json
import time
from pathlib import Path

from test_preempt import _grace
from test_reserve import _race
from test_sweeps import _stored_jobs, _wait_stored

# A checkpointing scavenger that says which rank of which job it was: on its signal it
# saves a record and exits at once; a rerun (restart 1) ends by itself after 2 s.
RANK_SCAV = (
    "import json, os, signal, sys, time; out = sys.argv[1];"
    " restart = int(os.environ['GPUCLAIM_RESTART_COUNT']);"
    " rec = {'job_id': os.environ['GPUCLAIM_JOB_ID'], 'job': os.environ['GPUCLAIM_JOB'],"
    " 'rank': os.environ.get('NODE_RANK', '0'), 'restart': restart};"
    "\ndef save(how):\n"
    "    rec.update(how=how)\n"
    "    name = f\"{rec['job_id']}-{rec['rank']}\"\n"
    "    open(os.path.join(out, name), 'w').write(json.dumps(rec))\n"
    "def on_signal(n, f):\n"
    "    save('signal'); sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, on_signal)\n"
    "time.sleep(300 if restart == 0 else 2.0); save('done')"
)


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.iterdir())]


def _scavenge(c, name: str, node: str, out: Path) -> None:
    c.ok(
        "run", "-n", "2", "--node", node, "--preemptible", "--name", name,
        "--", "python3", "-c", RANK_SCAV, str(out),
    )  # fmt: skip


def _handlers_set(c, names: list[str]) -> None:
    _wait_stored(c, lambda js: all(_state(js, n) == "running" for n in names), 30)
    time.sleep(0.7)  # python is up and its signal handler set


def _state(jobs: list[dict], name: str) -> str:
    return next((j["state"] for j in jobs if j["name"] == name), "missing")


def test_a_gang_makes_preemptible_jobs_on_both_its_nodes_yield_and_gets_their_gpus(
    make_testbed, make_remote, tmp_path
):
    tb = make_testbed(2, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(3))
    out = tmp_path / "out"
    out.mkdir()
    _scavenge(c, "scav1", "node01", out)
    _scavenge(c, "scav2", "node02", out)
    _handlers_set(c, ["scav1", "scav2"])
    t0 = time.monotonic()
    gang = c.cli(
        "run", "--nodes", "2", "-n", "2", "--name", "gang", "--json", "--", "sleep", "60",
        user="bob",
    )  # fmt: skip
    took = time.monotonic() - t0
    assert gang.returncode == 0, gang.stderr
    print(f"bob's gang over 2 preempted nodes started in {took:.1f} s (grace 3 s)")
    assert (
        "waiting up to 3s for alice's scav1, alice's scav2 to yield "
        "node01 GPU 0,1; node02 GPU 0,1" in gang.stderr
    ), gang.stderr
    job = json.loads(gang.stdout)
    assert sorted(r["node"] for r in job["ranks"]) == ["node01", "node02"]
    # both yielded on their signal, and are preempted in bob's favour
    assert sorted((r["job"], r["how"]) for r in _records(out)) == [
        ("scav1", "signal"),
        ("scav2", "signal"),
    ]
    jobs = {j["name"]: j for j in c.json("jobs", "--all", user="bob")}
    assert jobs["gang"]["state"] in ("starting", "running")
    for name in ("scav1", "scav2"):
        assert jobs[name]["state"] == "preempted" and jobs[name]["preempted_by"] == "bob"
    assert c.json("reserve", "--list", "--all", user="bob") == []  # the hand-overs are gone
    held = {(r["node"], r["claim"]["user"]) for r in c.json("status") if r["claim"]}
    assert held == {("node01", "bob"), ("node02", "bob")}
    c.ok("kill", "gang", user="bob")


def test_a_gang_racing_a_claimer_for_one_of_its_nodes_preempts_on_both_or_on_none(
    make_testbed, make_remote, tmp_path
):
    # carol wants node02's GPUs at the very moment bob's gang wants node01's and node02's:
    # whoever loses, no job yields for a gang that does not start
    tb = make_testbed(2, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(2))
    out = tmp_path / "out"
    out.mkdir()
    outcomes = []
    for round_ in range(3):
        one, two = f"s1-{round_}", f"s2-{round_}"
        _scavenge(c, one, "node01", out)
        _scavenge(c, two, "node02", out)
        _handlers_set(c, [one, two])
        gang_args = ("run", "--nodes", "2", "-n", "2", "--name", f"gang{round_}", "--json")
        results = _race(
            [
                (c, "bob", (*gang_args, "--", "sleep", "60")),
                (c, "carol", ("claim", "-n", "2", "--node", "node02", "--json")),
            ]
        )
        (gang_code, _, gang_err), (carol_code, _, carol_err) = results
        jobs = _stored_jobs(c)
        first = next(j for j in jobs if j["name"] == one)
        if gang_code == 0:
            # bob got both nodes: both yielded to him, and carol got nothing
            assert first["state"] == "preempted" and first["preempted_by"] == "bob", first
            assert carol_code == 3, carol_err
            gang = f"gang{round_}"
            _wait_stored(c, lambda js, gang=gang: _state(js, gang) == "running", 20)
            c.ok("kill", gang, user="bob")
        else:
            # node02 went to carol: node01's job was never asked to yield, and runs on
            assert gang_code == 3, gang_err
            assert first["state"] == "running" and not first.get("stop_requested"), first
            assert not any(r["job"] == one for r in _records(out)), _records(out)
            c.ok("kill", one)
            if _state(_stored_jobs(c), two) == "running":
                c.ok("kill", two)  # carol lost too (to the gang's booking, which then fell)
            if carol_code == 0:
                c.ok("release", "--all", user="carol")
        outcomes.append((gang_code, carol_code))
        _wait_stored(c, lambda js: all(j["state"] not in ("running", "starting") for j in js), 30)
        assert c.json("reserve", "--list", "--all", user="bob") == []
    print("gang vs carol, exit codes per round:", outcomes)
    assert all(code in (0, 3) for pair in outcomes for code in pair)


def test_a_preemptible_gang_yields_as_one_job_and_is_requeued_once(
    make_testbed, make_remote, tmp_path
):
    tb = make_testbed(2, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(3))
    out = tmp_path / "out"
    out.mkdir()
    c.ok(
        "run", "--nodes", "2", "-n", "2", "--preemptible", "--requeue", "--name", "pgang",
        "--", "python3", "-c", RANK_SCAV, str(out),
    )  # fmt: skip
    _handlers_set(c, ["pgang"])
    bob = c.cli("claim", "-n", "1", "--node", "node01", "--json", user="bob")
    assert bob.returncode == 0, bob.stderr
    assert "for alice's pgang to yield node01 GPU" in bob.stderr, bob.stderr
    # every rank got the signal, on both nodes: one job yields, not a rank of it
    _wait_stored(c, lambda js: any(j["state"] == "preempted" for j in js), 20)
    assert sorted((r["rank"], r["how"]) for r in _records(out)) == [
        ("0", "signal"),
        ("1", "signal"),
    ]
    runs = [j for j in _stored_jobs(c) if j["name"] == "pgang"]
    first = next(j for j in runs if j["restarts"] == 0)
    assert first["state"] == "preempted"
    assert [r["state"] for r in first["ranks"]] == ["preempted", "preempted"], first["ranks"]
    assert len([j for j in runs if j["restarts"] == 1]) == 1  # requeued once, not per rank
    assert first["requeued_as"]
    # its rerun needs both nodes whole: it starts once bob is done, and ends well
    c.ok("release", "--all", user="bob")
    c.ok("jobs")  # a gang is placed by a look (the nodes' keepers start one-node jobs)
    done = _wait_stored(
        c, lambda js: any(j["name"] == "pgang" and j["state"] == "succeeded" for j in js), 40
    )
    again = next(j for j in done if j["name"] == "pgang" and j["restarts"] == 1)
    assert again["id"] == first["requeued_as"]
    assert sorted(r["node"] for r in again["ranks"]) == ["node01", "node02"]


def test_a_queued_reservation_job_makes_preemptible_work_in_its_booking_yield(
    make_testbed, make_remote, tmp_path
):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(3))
    booked = c.json("reserve", "--gpu", "node01:0,1", "--start", "now", "--time", "1h", user="bob")
    out = tmp_path / "out"
    out.mkdir()
    _scavenge(c, "scav", "node01", out)  # preemptible work uses the booking until bob comes
    _handlers_set(c, ["scav"])
    t0 = time.monotonic()
    queued = c.json(
        "run", "--queue", "--reservation", booked["id"], "-n", "2", "--name", "eval",
        "--", "sleep", "60", user="bob",
    )  # fmt: skip
    assert queued["state"] == "queued"
    # it starts as soon as scav yielded (scav would run 300 s), by the queue alone
    jobs = _wait_stored(c, lambda js: _state(js, "eval") == "running", 20)
    print(f"bob's queued job in his booking started {time.monotonic() - t0:.1f} s after")
    scav = next(j for j in jobs if j["name"] == "scav")
    assert scav["state"] == "preempted" and scav["preempted_by"] == "bob"
    assert [r["how"] for r in _records(out)] == ["signal"]
    eval_ = next(j for j in jobs if j["name"] == "eval")
    assert sorted(eval_["ranks"][0]["gpus"]) == [0, 1]
    c.ok("kill", "eval", user="bob")
