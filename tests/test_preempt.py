"""[fair], scavenger jobs that yield: ``run --preemptible`` jobs on the sshd testbed (real
tmux, real signals) give their GPUs to the claim, run or booking owner that needs them, and
to nobody else; ``--requeue`` runs them again; without it they end ``preempted``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_faults import _sshfs
from test_reserve import _race
from test_sweeps import _stored_jobs, _wait_stored

from gpuclaim.core.model import parse_iso

# A checkpointing scavenger: on its signal it saves (a record with the deadline it was given)
# and exits at once; a run after a restart is short. Every run leaves one record.
SCAV = (
    "import json, os, signal, sys, time; out = sys.argv[1]; t0 = time.time();"
    " restart = int(os.environ['GPUCLAIM_RESTART_COUNT']);"
    " rec = {'job_id': os.environ['GPUCLAIM_JOB_ID'], 'job': os.environ['GPUCLAIM_JOB'],"
    " 'restart': restart, 'gpus': os.environ.get('CUDA_VISIBLE_DEVICES'), 'start': t0};"
    "\ndef save(how):\n"
    "    rec.update(end=time.time(), how=how)\n"
    "    p = os.environ.get('GPUCLAIM_PREEMPT_DEADLINE')\n"
    "    if how == 'signal' and p: rec['deadline'] = float(open(p).read())\n"
    "    open(os.path.join(out, rec['job_id']), 'w').write(json.dumps(rec))\n"
    "def on_signal(n, f):\n"
    "    save('signal'); sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, on_signal)\n"
    "time.sleep(float(sys.argv[2]) if restart == 0 else 2.0); save('done')"
)
# One that ignores its signal (prints it) until SIGTERM ends it.
STUBBORN = (
    "import signal, sys, time; signal.signal(signal.SIGUSR2, lambda n, f: print('got USR2',"
    " flush=True)); print('working', flush=True); time.sleep(600)"
)


def _grace(seconds: int) -> str:
    return f'\n[queue]\npreempt_grace = "{seconds}s"\n'


def _stored(storage: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (storage / "jobs").glob("*.json")]


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.iterdir())]


def _running(c, count: int, timeout: float = 60) -> list[dict]:
    return _wait_stored(
        c, lambda js: sum(j["state"] == "running" for j in js) >= count, timeout=timeout
    )


def test_bobs_claim_gets_the_gpus_alices_scavenger_tasks_yield(testbed, make_remote, tmp_path):
    c = make_remote(
        testbed,
        nodes=["node01", "node02"],
        kill_grace="2s",
        heartbeat="1s",
        extra_toml=_grace(8),
    )
    out = tmp_path / "out"
    out.mkdir()
    c.ok(
        "run",
        "--array",
        "0-7",
        "--name",
        "scav",
        "--preemptible",
        "--requeue",
        "--",
        "python3",
        "-c",
        SCAV,
        str(out),
        "25",
    )
    _running(c, 8)
    status = c.json("status")
    assert all(r["state"] == "claimed" and r["claim"]["preemptible"] for r in status)
    assert "claimed (preemptible)" in c.ok("status")
    t0 = time.monotonic()
    proc = c.cli("claim", "-n", "2", "--node", "node01", "--time", "10m", "--json", user="bob")
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    bob = json.loads(proc.stdout)
    print(f"bob's claim of 2 preempted GPUs took {took:.1f} s (grace 8 s)")
    assert took <= 8 + 10, took
    assert "waiting up to 8s for alice's scav[" in proc.stderr, proc.stderr
    assert "to yield node01 GPU" in proc.stderr
    bob_since = parse_iso(bob["since"])
    # the two tasks that yielded saw SIGUSR1 first, with the deadline, and had his GPUs
    yielded = [r for r in _records(out) if r["how"] == "signal"]
    assert len(yielded) == 2, _records(out)
    stored = {j["id"]: j for j in _stored_jobs(c)}
    placed = [stored[r["job_id"]]["ranks"][0] for r in yielded]
    assert sorted(g for p in placed for g in p["gpus"]) == bob["gpus"]
    assert all(p["node"] == "node01" for p in placed)
    for r in yielded:
        assert 6 <= r["deadline"] - r["end"] <= 9, r  # the grace, less the moment to save
        assert stored[r["job_id"]]["state"] == "preempted"
        assert stored[r["job_id"]]["preempted_by"] == "bob"
    # every index ends done: the two preempted ones ran again (restart 1) elsewhere
    _wait_stored(
        c,
        lambda js: sum(j["state"] == "succeeded" for j in js) == 8,
        timeout=90,
    )
    done = [r for r in _records(out) if r["how"] == "done"]
    assert sorted(r["job"] for r in done) == [f"scav[{i}]" for i in range(8)]
    assert sorted(r["restart"] for r in done) == [0] * 6 + [1] * 2
    released_at = time.time()
    c.ok("release", "--all", user="bob")
    # none of alice's runs used bob's GPUs while he held them
    for j in _stored_jobs(c):
        rank = j["ranks"][0] if j["ranks"] else None
        if rank is None or rank["node"] != "node01" or not set(rank["gpus"]) & set(bob["gpus"]):
            continue
        start, end = parse_iso(j["started"]), parse_iso(j["ended"]) or released_at
        assert end <= bob_since + 0.5 or start >= released_at, (j["name"], j["state"])
    table = c.ok("jobs", "--all")
    assert "scav[0-7]" in table and "8 succeeded" in table, table  # the reruns are the tasks
    rows = c.json("jobs", "--all")
    again = [r for r in rows if r["restarts"] == 1]
    assert len(again) == 2 and all(r["preemptible"] and r["state"] == "succeeded" for r in again)
    assert sum(r["state"] == "preempted" for r in rows) == 2


def test_without_requeue_a_stubborn_job_gets_term_after_the_grace_and_ends_preempted(
    make_testbed, make_remote
):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(3))
    c.ok(
        "run",
        "-n",
        "2",
        "--name",
        "scav",
        "--preemptible",
        "--preempt-signal",
        "SIGUSR2",
        "--",
        "python3",
        "-c",
        STUBBORN,
    )
    _running(c, 1)
    time.sleep(0.5)  # its signal handler is set
    t0 = time.monotonic()
    bob = c.cli("run", "-n", "1", "--name", "eval", "--", "sleep", "30", user="bob")
    took = time.monotonic() - t0
    assert bob.returncode == 0, bob.stderr
    assert "waiting up to 3s for alice's scav to yield node01 GPU 0\n" in bob.stderr, bob.stderr
    assert 3 <= took <= 3 + 10, took
    jobs = {j["name"]: j for j in c.json("jobs", "--all", user="bob")}
    assert jobs["eval"]["state"] == "running" and jobs["eval"]["user"] == "bob"
    scav = jobs["scav"]
    assert scav["state"] == "preempted" and scav["reason"] == "yielded its GPUs to bob"
    assert scav["preemptible"] and scav["restarts"] == 0
    log = c.ok("logs", "scav")
    assert log.index("got USR2") < log.index("stopping (preempted): SIGTERM"), log
    follow = c.cli("logs", "-f", "scav")
    assert follow.returncode == 75, follow.stderr  # EX_TEMPFAIL: try again later
    assert "was preempted (yielded its GPUs to bob)" in follow.stderr
    c.ok("kill", "eval", user="bob")


def test_a_queued_job_makes_preemptible_work_yield_and_starts_when_it_did(
    make_testbed, make_remote, tmp_path
):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(4))
    out = tmp_path / "out"
    out.mkdir()
    c.ok(
        "run",
        "-n",
        "2",
        "--preemptible",
        "--name",
        "scav",
        "--",
        "python3",
        "-c",
        SCAV,
        str(out),
        "300",
    )
    _running(c, 1)
    time.sleep(0.5)  # its handler is set
    bob = c.json("run", "--queue", "--name", "eval", "--", "sleep", "60", user="bob")
    assert bob["state"] == "queued"  # nobody waits on the laptop: the queue hands it over
    t0 = time.monotonic()
    jobs = _wait_stored(
        c, lambda js: any(j["name"] == "eval" and j["state"] == "running" for j in js), 20
    )
    print(f"bob's queued job started {time.monotonic() - t0:.1f} s after it was queued")
    by_name = {j["name"]: j for j in jobs}
    assert by_name["scav"]["state"] == "preempted"
    assert [r["how"] for r in _records(out)] == ["signal"]
    assert c.json("reserve", "--list", "--all", user="bob") == []  # the hand-over is gone
    c.ok("kill", "eval", user="bob")


def test_a_job_after_a_requeued_one_waits_for_its_rerun(make_testbed, make_remote, tmp_path):
    tb = make_testbed(1, gpus=1)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(2))
    out = tmp_path / "out"
    out.mkdir()
    c.ok(
        "run",
        "--preemptible",
        "--requeue",
        "--name",
        "prep",
        "--",
        "python3",
        "-c",
        SCAV,
        str(out),
        "300",
    )
    _running(c, 1)
    time.sleep(0.5)  # its handler is set
    c.ok("run", "--queue", "--after", "prep", "--name", "next", "--", "true")
    c.ok("claim", "-n", "1", user="bob")
    rows = {r["name"]: r for r in c.json("jobs", "--all") if r["state"] == "queued"}
    assert rows["prep"]["restarts"] == 1  # requeued under its name, behind bob's claim
    assert rows["next"]["reason"] == "Dependency: after prep (queued)", rows["next"]
    why = c.ok("why", "prep")
    assert "1 (preempted, requeued: this is run 2)" in why and "preemptible" in why, why
    c.ok("release", "--all", user="bob")
    jobs = _wait_stored(
        c, lambda js: any(j["name"] == "next" and j["state"] == "succeeded" for j in js), 60
    )
    prep = sorted((j for j in jobs if j["name"] == "prep"), key=lambda j: j["restarts"])
    assert [j["state"] for j in prep] == ["preempted", "succeeded"]


def test_run_follow_of_a_requeued_job_follows_its_rerun_and_ends_with_its_code(
    make_testbed, make_remote
):
    import signal
    import sys

    tb = make_testbed(1, gpus=1)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(2))
    # the first run waits to be preempted (SIGUSR1 ends it), the rerun ends with status 7
    script = (
        'echo "run $GPUCLAIM_RESTART_COUNT"; '
        '[ "$GPUCLAIM_RESTART_COUNT" = 0 ] && exec sleep 300; exit 7'
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", "run", "--preemptible", "--requeue", "--follow",
         "--name", "scav", "--", "sh", "-c", script],
        env=c.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        _running(c, 1)
        c.ok("claim", "-n", "1", user="bob")  # it yields, and waits in the queue behind bob
        _wait_stored(c, lambda js: any(j["state"] == "preempted" for j in js), 30)
        c.ok("release", "--all", user="bob")  # its rerun starts, and ends with status 7
        out, said = follower.communicate(timeout=90)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 7, said
    runs = [line for line in out.splitlines() if line.startswith("run ")]
    assert runs == ["run 0", "run 1"], (out, said)
    assert "gpuclaim: preempted (its GPUs go to bob)" in out  # the first run's log, whole
    assert (
        "gpuclaim: job scav yielded its GPUs and went back to the queue; following its next run"
        in said
    )
    assert said.strip().splitlines()[-1].startswith("gpuclaim: job scav failed (exit code 7)"), said


def test_preemptible_work_uses_a_booking_until_its_owner_claims(make_testbed, make_remote):
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(2))
    booked = c.json("reserve", "--gpu", "node01:0", "--start", "now", "--time", "1h", user="carol")
    # a plain job may not touch carol's GPU; a preemptible one may, until she comes
    plain = c.cli("run", "-n", "2", "--name", "plain", "--", "sleep", "60")
    assert plain.returncode == 3 and "reserved by carol" in plain.stderr, plain.stderr
    c.ok("run", "-n", "2", "--preemptible", "--name", "scav", "--", "sleep", "300")
    _running(c, 1)
    mine = c.json("claim", "--reservation", booked["id"], "--json", user="carol")
    assert mine["gpus"] == [0] and mine["user"] == "carol"
    scav = {j["name"]: j for j in c.json("jobs", "--all")}["scav"]
    assert scav["state"] == "preempted", scav


def test_preemptible_work_preempts_nobody_and_claims_do_not_preempt_plain_jobs(
    make_testbed, make_remote
):
    tb = make_testbed(1, gpus=1)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s", extra_toml=_grace(2))
    c.ok("run", "--preemptible", "--name", "scav", "--", "sleep", "300")
    other = c.cli("run", "--preemptible", "--name", "scav2", "--", "true", user="bob")
    assert other.returncode == 3 and "waiting" not in other.stderr, other.stderr
    c.ok("kill", "scav")
    _wait_stored(c, lambda js: all(j["state"] != "running" for j in js), timeout=30)
    c.ok("run", "--name", "plain", "--", "sleep", "300")
    _running(c, 1)
    proc = c.cli("claim", "-n", "1", user="bob")
    assert proc.returncode == 3 and "waiting" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("through", ["one store", "two sshfs mounts"])
def test_four_claimers_racing_for_two_preemptible_gpus(
    make_testbed, make_remote, tmp_path, through
):
    tb = make_testbed(1, gpus=2)
    mounts: list[Path] = []
    extra = {"kill_grace": "2s", "heartbeat": "1s", "extra_toml": _grace(2)}
    try:
        if through == "one store":
            clusters = [make_remote(tb, **extra)]
        else:
            if shutil.which("sshfs") is None:
                pytest.fail("sshfs is missing: apt-get install sshfs", pytrace=False)
            real = tmp_path / "server-store"
            real.mkdir()
            for i in range(2):
                mounts.append(tmp_path / f"mnt-{i}")
                _sshfs(tb, "node01", real, mounts[-1])
            (mounts[0] / "store").mkdir()
            clusters = [make_remote(tb, storage=str(m / "store"), **extra) for m in mounts]
        c = clusters[0]
        store = mounts[0] / "store" if mounts else c.storage
        out = tmp_path / "out"
        out.mkdir()
        for i in range(2):
            c.ok(
                "run",
                "--preemptible",
                "--name",
                f"s{i}",
                "--",
                "python3",
                "-c",
                SCAV,
                str(out),
                "300",
            )
        deadline = time.monotonic() + 60
        while sum(j["state"] == "running" for j in _stored(store)) < 2:
            assert time.monotonic() < deadline, _stored(store)
            time.sleep(0.5)
        time.sleep(0.5)  # their handlers are set
        args = ("claim", "-n", "2", "--node", "node01", "--time", "10m", "--json")
        results = _race([(clusters[i % len(clusters)], f"u{i}", args) for i in range(4)])
        won = [json.loads(o) for code, o, _ in results if code == 0]
        assert len(won) == 1, [e for _, _, e in results]
        assert won[0]["gpus"] == [0, 1]
        holders = c.json("status")
        assert {r["claim"]["user"] for r in holders} == {won[0]["user"]}
        assert all(r["how"] == "signal" for r in _records(out))
        for code, _, err in results:
            if code == 3:
                assert "another claim got there first" in err or "nothing" in err or "GPU" in err
    finally:
        for mnt in mounts:
            subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True)


@pytest.mark.parametrize(
    "args, words",
    [
        (("run", "--requeue", "--", "true"), "--requeue is for --preemptible jobs"),
        (("run", "--preempt-signal", "USR2", "--", "true"), "--preempt-signal is for"),
        (("run", "--preemptible", "--preempt-signal", "KILL", "--", "true"), "cannot be caught"),
    ],
)
def test_bad_preemption_flags_are_one_line_exit_2(make_testbed, make_remote, args, words):
    c = make_remote(make_testbed(1, gpus=1))
    proc = c.cli(*args)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_preempt_grace_past_an_hour_is_a_config_error(make_testbed, make_remote):
    c = make_remote(make_testbed(1, gpus=1), extra_toml=_grace(7200))
    proc = c.cli("status")
    assert proc.returncode == 1 and "'queue.preempt_grace'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
