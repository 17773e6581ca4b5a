"""`gpuclaim run` and friends, end to end through the CLI against real sshd nodes and real tmux."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuclaim.core.model import parse_iso


def _job(c, name, user="alice"):
    rows = c.json("jobs", "--all", user=user)
    return next(r for r in rows if r["name"] == name)


def _wait_state(c, name, states, timeout=30.0, user="alice"):
    deadline = time.monotonic() + timeout
    while True:
        job = _job(c, name, user)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"{name} stuck in {job['state']}"
        time.sleep(0.3)


def _log(c, name, user="alice"):
    return c.ok("logs", name, "-n", "0", user=user)


@pytest.fixture
def jobs_cluster(testbed, make_remote):
    return make_remote(testbed, kill_grace="2s", heartbeat="1s")


PRINT_ENV = (
    "import os, sys, json; "
    "print(json.dumps({k: os.environ.get(k) for k in "
    "('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'GPUCLAIM_JOB', 'HOME')}))"
)


def test_job_sees_exactly_its_gpus_and_two_jobs_get_disjoint_ones(jobs_cluster, tmp_path):
    c = jobs_cluster
    # Each job holds its GPUs until both have started: a job that ended before the other was
    # placed would rightly hand the same GPUs on (a loaded CI machine did just that).
    gate = tmp_path / "both-started"
    held = (
        PRINT_ENV
        + "; import pathlib, time; "
        + f"[time.sleep(0.1) for _ in range(600) if not pathlib.Path({str(gate)!r}).exists()]"
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuclaim",
                "run",
                "-n",
                "2",
                "--node",
                "node02",
                "--name",
                name,
                "--json",
                "--",
                "python3",
                "-c",
                held,
            ],
            env=c.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("envA", "envB")
    ]
    started = []
    for p in procs:
        out, errtext = p.communicate(timeout=60)
        assert p.returncode == 0, errtext
        started.append(json.loads(out))
    gpus = [tuple(j["gpus"]) for j in started]
    assert set(gpus[0]).isdisjoint(gpus[1]), gpus
    assert {_job(c, j["name"])["state"] for j in started} <= {"starting", "running"}
    gate.touch()
    for job in started:
        done = _wait_state(c, job["name"], {"succeeded"})
        assert done["exit_code"] == 0
        seen = json.loads(_log(c, job["name"]).strip().splitlines()[-1])
        assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, job["gpus"]))
        assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert seen["GPUCLAIM_JOB"] == job["name"]
    rows = c.by_gpu()
    assert all(rows[("node02", i)]["state"] == "free" for i in range(4))


HOSTILE = [
    "it's",
    'say "hi"',
    "$(touch {marker})",
    "`touch {marker}`",
    "; touch {marker}",
    "a\nb",
    "tab\there",
    "ünïcødé ✓ 日本",
    "$HOME",
    "*",
    "",
    "-n",
    "--",
]


def test_hostile_arguments_arrive_byte_identical(jobs_cluster, tmp_path):
    c = jobs_cluster
    marker = tmp_path / "pwned"
    args = [a.format(marker=marker) for a in HOSTILE]
    script = "import sys, json; print(json.dumps(sys.argv[1:]))"
    c.ok("run", "--name", "hostile", "--", "python3", "-c", script, *args)
    _wait_state(c, "hostile", {"succeeded"})
    assert json.loads(_log(c, "hostile").strip().splitlines()[-1]) == args
    assert not marker.exists()


def test_exit_statuses_and_time_limit(jobs_cluster):
    c = jobs_cluster
    c.ok("run", "--name", "ok", "--", "true")
    died = c.cli("run", "--name", "three", "--", "sh", "-c", "exit 3")  # at once: not "Started"
    assert died.returncode == 1 and "failed at once on node01 (exit code 3)" in died.stderr
    c.ok("run", "--name", "slow", "--time", "3s", "--", "sleep", "60")
    assert _wait_state(c, "ok", {"succeeded"})["exit_code"] == 0
    failed = _wait_state(c, "three", {"failed"})
    assert failed["exit_code"] == 3
    t0 = time.monotonic()
    timed_out = _wait_state(c, "slow", {"timeout"}, timeout=20)
    assert time.monotonic() - t0 < 15
    assert "time limit" in timed_out["reason"]
    # every claim was released, and no gpuclaim CLI process is left behind on the laptop
    assert all(r["state"] == "free" for r in c.status())
    assert _processes_like(b"gpuclaim", "GPUCLAIM_CONFIG", str(c.config_path)) == []
    events = c.json("history", "--claims")
    assert len(events) == 3


def test_queue_starts_when_the_blocking_job_ends(jobs_cluster, tmp_path):
    c = jobs_cluster
    go = tmp_path / "go"
    blocker = f"while [ ! -e {go} ]; do sleep 0.2; done"
    c.ok("run", "-n", "4", "--node", "node01", "--name", "blocker", "--", "sh", "-c", blocker)
    for node in ("node02", "node03"):
        c.ok("run", "-n", "4", "--node", node, "--name", f"fill-{node}", "--", "sleep", "300")
    proc = c.cli("run", "-n", "4", "--name", "nope", "--", "true")
    assert proc.returncode == 3, proc.stderr
    queued = c.json(
        "run", "-n", "2", "--queue", "--name", "waiter", "--", "python3", "-c", PRINT_ENV
    )
    assert queued["state"] == "queued"
    assert _job(c, "waiter")["queue_position"] == 1
    # From here on nobody runs gpuclaim: the blocker's wrapper must start the queued job.
    go.touch()
    deadline = time.monotonic() + 20
    marker_log = None
    while time.monotonic() < deadline:
        record = json.loads(next((c.storage / "jobs").glob(f"{queued['id']}.json")).read_text())
        if record["state"] in ("running", "succeeded"):
            marker_log = record
            break
        time.sleep(0.3)
    assert marker_log is not None, "the queued job did not start by itself"
    done = _wait_state(c, "waiter", {"succeeded"})
    assert done["nodes"] == ["node01"]
    seen = json.loads(_log(c, "waiter").strip().splitlines()[-1])
    assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, done["gpus"]))
    c.ok("kill", "fill-node02")
    c.ok("kill", "fill-node03")


def test_queue_starts_within_seconds_of_an_expiry_with_no_gpuclaim_call(testbed, make_remote):
    # Plain claims (no job, no wrapper) fill node01; nobody runs gpuclaim after the queueing.
    c = make_remote(testbed, nodes=["node01"], heartbeat="1s")
    held = c.json("claim", "-n", "4", "--time", "6s", "--note", "short")
    expires = parse_iso(held["expires"])
    queued = c.json("run", "-n", "2", "--queue", "--name", "patient", "--", "sleep", "30")
    assert queued["state"] == "queued"
    record_path = c.storage / "jobs" / f"{queued['id']}.json"
    deadline = expires + 30
    while time.time() < deadline:
        record = json.loads(record_path.read_text())
        if record["state"] in ("starting", "running"):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the queued job never started after the claim expired")
    delay = time.time() - expires
    print(f"queue delay after expiry: {delay:.1f} s")
    assert delay < 10, delay
    running = _wait_state(c, "patient", {"running"})
    assert running["nodes"] == ["node01"]
    # with the queue empty, the keeper is gone: nothing keeps running
    deadline = time.monotonic() + 10
    while _processes_like(b"keep-queue", "GPUCLAIM_TESTBED", str(c.testbed.dir)):
        assert time.monotonic() < deadline, "the queue keeper outlived the queue"
        time.sleep(0.3)
    c.ok("kill", "patient")


def test_a_lost_queue_keeper_is_started_again_by_its_owners_next_command(testbed, make_remote):
    # the node "rebooted" under a queued job: its keeper is gone, so an expiry there would go
    # unnoticed with the laptop closed; the owner's next command (any) starts a keeper again
    c = make_remote(testbed, nodes=["node01"], heartbeat="1s")
    held = c.json("claim", "-n", "4", "--time", "12s", "--note", "short")
    queued = c.json("run", "-n", "2", "--queue", "--name", "patient", "--", "sleep", "30")
    mark = ("GPUCLAIM_TESTBED", str(c.testbed.dir))
    keepers = _processes_like(b"keep-queue", *mark)
    assert keepers, "no queue keeper for the queued job"
    for pid in keepers:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _processes_like(b"keep-queue", *mark):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    c.ok("jobs")  # any command of its owner
    assert _processes_like(b"keep-queue", *mark), "the owner's command started no keeper"
    # nobody runs gpuclaim now: the keeper alone sees the claim expire and starts the job
    expires = parse_iso(held["expires"])
    record_path = c.storage / "jobs" / f"{queued['id']}.json"
    while time.time() < expires + 20:
        if json.loads(record_path.read_text())["state"] in ("starting", "running"):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the queued job never started after the claim expired")
    c.ok("kill", "patient")


def _processes_like(part: bytes, key: str, value: str) -> list[int]:
    """This test's processes with ``part`` in their command line: those whose environment
    has ``key=value`` (other tests run beside this one, in other pytest workers)."""
    mark = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if part in (entry / "cmdline").read_bytes() and mark in (
                    (entry / "environ").read_bytes().split(b"\0")
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_release_never_frees_the_gpus_under_a_running_job(jobs_cluster):
    c = jobs_cluster
    job = c.json("run", "-n", "1", "--node", "node01", "--name", "busy", "--", "sleep", "300")
    _wait_state(c, "busy", {"running"})
    plain = c.json("claim", "-n", "1", "--node", "node01", "--note", "by hand")
    # --all releases the plain claim and keeps the job's, saying why and what to do
    proc = c.cli("release", "--all")
    assert proc.returncode == 0, proc.stderr
    assert f"claim {plain['id']}" in proc.stdout
    assert "Kept node01 GPU" in proc.stdout and "gpuclaim kill busy" in proc.stdout
    # naming the job's claim, or its GPU, is refused with the job's name and the kill hint
    claim_id = next(r["claim"]["id"] for r in c.status() if r["claim"])
    gpu = job["gpus"][0]
    for args in (["release", claim_id], ["release", "--gpu", f"node01:{gpu}"]):
        refused = c.cli(*args)
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        line = refused.stderr.strip()
        assert "running job busy" in line and "gpuclaim kill busy" in line, line
    assert c.cli("release", "--all").returncode == 1  # only the job's claim is left
    # the GPU stays the job's: nobody else can claim it
    row = next(r for r in c.status() if r["node"] == "node01" and r["index"] == gpu)
    assert row["state"] == "claimed" and row["claim"]["job"], row
    assert c.cli("claim", "--gpu", f"node01:{gpu}", user="bob").returncode == 3
    c.ok("kill", "busy")
    assert c.json("claim", "--gpu", f"node01:{gpu}", user="bob")["user"] == "bob"


def test_a_look_just_after_a_kill_shows_its_gpus_free(testbed, make_remote):
    """The warm agent answers looks from a recent GPU read (here up to 30 s old): the look
    before the kill leaves one that shows the job's process on its GPUs. The look after
    must not reuse it, or the GPUs would show busy with no claim (the claim is gone)."""
    c = make_remote(testbed, kill_grace="2s", heartbeat="1s", gpu_read_max_age="30s")
    c.ok("run", "-n", "2", "--node", "node02", "--name", "held", "--", "sleep", "300")
    _wait_state(c, "held", {"running"})
    before = [r for r in c.status() if r["node"] == "node02"]
    assert sorted(r["state"] for r in before) == ["claimed", "claimed", "free", "free"], before
    assert c.json("kill", "held")["state"] == "killed"
    after = [r for r in c.status() if r["node"] == "node02"]
    assert all(r["state"] == "free" for r in after), after


def test_kill_running_and_queued_jobs(jobs_cluster):
    c = jobs_cluster
    c.ok("run", "-n", "4", "--node", "node01", "--name", "long", "--", "sleep", "300")
    _wait_state(c, "long", {"running"})
    c.ok("run", "-n", "4", "--node", "node01", "--queue", "--name", "later", "--", "true")
    assert _job(c, "later")["state"] == "queued"
    assert c.json("kill", "later")["state"] == "killed"
    killed = c.json("kill", "long")
    assert killed["state"] == "killed"
    after = [r for r in c.status() if r["node"] == "node01"]
    assert all(r["state"] == "free" for r in after), after
    assert "long" not in _tmux_sessions(c, "node01")
    # bob cannot kill alice's job
    c.ok("run", "--name", "mine", "--", "sleep", "60")
    proc = c.cli("kill", "mine", user="bob")
    assert proc.returncode == 1 and "no job 'mine' of bob" in proc.stderr
    c.ok("kill", "mine")


def test_invalid_names_and_usage(jobs_cluster):
    c = jobs_cluster
    for bad in ("a.b", "a:b", "../x", "x y", "-x"):
        proc = c.cli("run", "--name", bad, "--", "true")
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "invalid job name" in proc.stderr
    proc = c.cli("run", "-n", "5", "--", "true")
    assert proc.returncode == 1 and "can never fit" in proc.stderr
    proc = c.cli("run", "--env", "1X=2", "--", "true")
    assert proc.returncode == 2
    c.ok("run", "--name", "dup", "--", "sleep", "30")
    proc = c.cli("run", "--name", "dup", "--", "true")
    assert proc.returncode == 5 and "already have a job named 'dup'" in proc.stderr
    c.ok("kill", "dup")


def test_a_tmux_session_of_the_jobs_name_made_by_hand_is_exit_5_and_frees_the_gpu(
    testbed, jobs_cluster
):
    c = jobs_cluster
    made = testbed.ssh("node01", "tmux new-session -d -s gc-alice-taken sleep 60")
    assert made.returncode == 0, made.stderr
    try:
        proc = c.cli("run", "--node", "node01", "--name", "taken", "--", "true")
        assert proc.returncode == 5, proc.stderr
        assert "a tmux session gc-alice-taken is already running" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not [r for r in c.json("status") if r["claim"]]  # the claim went with it
        specs = testbed.ssh("node01", "cat ~/.gpuclaim/jobs/*/rank*/spec.json 2>/dev/null")
        assert '"taken"' not in specs.stdout  # no half-started rank left behind
        assert (
            "sleep"
            in testbed.ssh("node01", "tmux list-panes -a -F '#{pane_current_command}'").stdout
        )
    finally:
        testbed.ssh("node01", "tmux kill-session -t =gc-alice-taken")


def test_gang_job_ranks_and_one_failure_stops_the_other(jobs_cluster):
    c = jobs_cluster
    script = (
        "import os, json, time; "
        "print(json.dumps({k: os.environ[k] for k in ('MASTER_ADDR', 'MASTER_PORT', 'NNODES', "
        "'NODE_RANK', 'NPROC_PER_NODE', 'CUDA_VISIBLE_DEVICES')}), flush=True); "
        "time.sleep(300)"
    )
    job = c.json("run", "--nodes", "2", "-n", "2", "--name", "gang", "--", "python3", "-c", script)
    assert len(job["nodes"]) == 2 and len(set(job["nodes"])) == 2
    _wait_state(c, "gang", {"running"})
    seen = []
    for rank in (0, 1):
        deadline = time.monotonic() + 20
        while True:
            text = c.ok("logs", "gang", "--rank", str(rank), "-n", "0")
            if text.strip():
                break
            assert time.monotonic() < deadline
            time.sleep(0.3)
        seen.append(json.loads(text.strip().splitlines()[0]))
    assert [s["NODE_RANK"] for s in seen] == ["0", "1"]
    for key in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NPROC_PER_NODE"):
        assert seen[0][key] == seen[1][key], key
    assert seen[0]["NNODES"] == "2" and seen[0]["NPROC_PER_NODE"] == "2"
    # rank 1's process dies with an error: the job fails and rank 0 is stopped too
    # (all testbed nodes share this machine: pick rank 1's process by its environment)
    assert _kill_where({"GPUCLAIM_JOB_ID": job["id"], "NODE_RANK": "1"}, b"time.sleep(300)") == 1
    done = _wait_state(c, "gang", {"failed"}, timeout=30)
    assert [r["state"] for r in done["ranks"]] == ["killed", "failed"]
    assert all(r["state"] == "free" for r in c.status())


def test_rebooted_node_leaves_a_stale_claim_that_is_reclaimable(jobs_cluster):
    c = jobs_cluster
    job = c.json("run", "-n", "4", "--node", "node03", "--name", "victim", "--", "sleep", "300")
    _wait_state(c, "victim", {"running"})
    # "reboot": the wrapper, the job and the tmux server vanish at once
    assert _kill_where({}, job["id"].encode()) >= 1  # the wrapper (and the tmux server)
    assert _kill_where({"GPUCLAIM_JOB_ID": job["id"]}, b"sleep") == 1
    c.testbed.ssh("node03", "tmux kill-server")
    deadline = time.monotonic() + 20
    while True:
        rows = [r for r in c.status() if r["node"] == "node03"]
        if all(r["state"] == "stale" for r in rows):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert rows[0]["reason"] == "job lost"
    assert _job(c, "victim")["state"] == "lost"
    claim = c.json("claim", "-n", "4", "--node", "node03", user="bob")
    assert claim["user"] == "bob"


def test_a_job_whose_tmux_session_is_killed_by_hand_says_so(jobs_cluster):
    # someone on the node ends the session with tmux: killed, and not "by gpuclaim kill"
    c = jobs_cluster
    job = c.json("run", "-n", "1", "--node", "node02", "--name", "byhand", "--", "sleep", "300")
    _wait_state(c, "byhand", {"running"})
    gone = c.testbed.ssh("node02", f"tmux kill-session -t ={job['session']}")
    assert gone.returncode == 0, gone.stderr
    done = _wait_state(c, "byhand", {"killed"}, timeout=20)
    assert done["reason"] == "its tmux session went away (SIGHUP)", done
    assert all(r["state"] == "free" for r in c.status() if r["node"] == "node02")


def test_a_look_at_a_rebooted_node_sees_the_job_lost_at_once(testbed, make_remote):
    # Heartbeats every 60 s would need 3 min to notice; a node that answers can tell now.
    c = make_remote(testbed, kill_grace="2s", heartbeat="60s")
    job = c.json("run", "-n", "4", "--node", "node03", "--name", "victim", "--", "sleep", "300")
    other = c.json(
        "run", "-n", "2", "--node", "node02", "--name", "bystander", "--", "sleep", "300"
    )
    _wait_state(c, "victim", {"running"})
    _wait_state(c, "bystander", {"running"})
    assert _kill_where({}, job["id"].encode()) >= 1  # the wrapper (and the tmux server)
    assert _kill_where({"GPUCLAIM_JOB_ID": job["id"]}, b"sleep") == 1
    c.testbed.ssh("node03", "tmux kill-server")
    t0 = time.monotonic()
    rows = c.status()
    seen_after = time.monotonic() - t0
    victim = [r for r in rows if r["node"] == "node03"]
    assert [(r["state"], r["reason"]) for r in victim] == [("stale", "job lost")] * 4, victim
    assert seen_after < 5  # the look itself, not a heartbeat timeout
    # the live job elsewhere is untouched by the same look
    assert {r["state"] for r in rows if r["node"] == "node02" and r["claim"]} == {"claimed"}
    claim = c.json("claim", "-n", "4", "--node", "node03", user="bob")
    assert claim["user"] == "bob"
    assert _job(c, "victim")["state"] == "lost"
    assert _job(c, "bystander")["state"] == "running"
    c.ok("kill", other["name"])


def test_gc_collects_a_rebooted_nodes_job_at_once(testbed, make_remote):
    c = make_remote(testbed, heartbeat="60s")
    job = c.json("run", "-n", "2", "--node", "node01", "--name", "gone", "--", "sleep", "300")
    _wait_state(c, "gone", {"running"})
    assert _kill_where({}, job["id"].encode()) >= 1
    assert _kill_where({"GPUCLAIM_JOB_ID": job["id"]}, b"sleep") == 1
    report = c.json("gc")
    assert report["lost_jobs"] == ["gone"], report
    assert _job(c, "gone")["state"] == "lost"


def test_a_job_being_started_is_never_taken_for_lost(jobs_cluster):
    # Looks racing a launch: the wrapper may start after a probe began; never "lost" for that.
    c = jobs_cluster
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", "run", "--name", "newborn", "--", "sleep", "20"],
        env=c.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    states = set()
    deadline = time.monotonic() + 20
    while launcher.poll() is None or time.monotonic() < deadline - 12:
        states |= {(r["state"], r["reason"]) for r in c.status() if r["claim"]}
        assert time.monotonic() < deadline
    assert launcher.returncode == 0, launcher.stderr.read()
    states |= {(r["state"], r["reason"]) for r in c.status() if r["claim"]}
    assert ("stale", "job lost") not in states, states
    assert _job(c, "newborn")["state"] == "running"
    c.ok("kill", "newborn")


def test_logs_follow_until_the_job_ends(jobs_cluster):
    c = jobs_cluster
    c.ok(
        "run",
        "--name",
        "talker",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3; do echo line $i; sleep 0.5; done",
    )
    proc = c.cli("logs", "talker", "-f", timeout=30)
    assert proc.returncode == 0
    assert [line for line in proc.stdout.splitlines() if line.startswith("line")] == [
        "line 1",
        "line 2",
        "line 3",
    ]
    assert c.ok("logs", "talker", "-n", "1").strip() == "line 3"


def test_job_start_and_end_are_in_the_event_log(jobs_cluster):
    c = jobs_cluster
    c.ok("run", "-n", "2", "--name", "acct", "--", "sleep", "1")
    _wait_state(c, "acct", {"succeeded"})
    events = []
    for f in (c.storage / "events").glob("*.jsonl"):
        events += [json.loads(line) for line in f.read_text().splitlines()]
    kinds = [e["type"] for e in events if (e.get("extra") or {}).get("job") == "acct"]
    assert kinds == ["job-start", "job-end"]
    end = next(e for e in events if e["type"] == "job-end")
    assert end["extra"]["state"] == "succeeded" and end["extra"]["exit_code"] == 0
    hist = c.json("history")
    assert hist[0]["claims"] == 1 and hist[0]["gpu_hours"] > 0


def _kill_where(env: dict, cmd_part: bytes) -> int:
    import signal

    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = dict(
                kv.split("=", 1)
                for kv in (entry / "environ").read_bytes().decode("utf-8", "replace").split("\0")
                if "=" in kv
            )
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmd_part in cmdline and all(environ.get(k) == v for k, v in env.items()):
            os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
    return killed


def _tmux_sessions(c, node):
    proc = c.testbed.ssh(node, "tmux ls -F '#{session_name}' 2>/dev/null || true")
    return proc.stdout


def test_no_gpuclaim_left_running_after_run(jobs_cluster):
    c = jobs_cluster
    before = set(os.listdir("/proc"))
    c.ok("run", "--name", "quick", "--", "true")
    _wait_state(c, "quick", {"succeeded"})
    new = set(os.listdir("/proc")) - before
    mine = f"GPUCLAIM_CONFIG={c.config_path}".encode()
    for pid in new:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mine in environ:  # other tests run beside this one
            assert b"-m gpuclaim" not in cmd, cmd


def test_wait_blocks_until_started_and_reports_its_position(jobs_cluster, tmp_path):
    c = jobs_cluster
    go = tmp_path / "go2"
    c.ok(
        "run",
        "-n",
        "4",
        "--node",
        "node02",
        "--name",
        "hold",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {go} ]; do sleep 0.2; done",
    )
    said = tmp_path / "waiter.err"  # its stderr, read while it waits
    with open(said, "w") as stderr:
        waiter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuclaim",
                "run",
                "-n",
                "4",
                "--node",
                "node02",
                "--wait",
                "--name",
                "patient",
                "--json",
                "--",
                "true",
            ],
            env=c.env(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    deadline = time.monotonic() + 30
    while "position 1" not in said.read_text():  # no spinner off a terminal: plain lines
        assert waiter.poll() is None, f"it did not wait: {said.read_text()}"
        assert time.monotonic() < deadline, f"it never said its position: {said.read_text()}"
        time.sleep(0.2)
    assert waiter.poll() is None  # still waiting
    go.touch()
    out, _ = waiter.communicate(timeout=60)
    errtext = said.read_text()
    assert waiter.returncode == 0, errtext
    assert "\x1b[" not in errtext
    assert json.loads(out)["state"] in ("starting", "running", "succeeded")
    _wait_state(c, "patient", {"succeeded"})


def test_shell_has_a_time_limit_and_notebook_needs_jupyter(jobs_cluster):
    c = jobs_cluster
    proc = c.cli("shell", "--time", "3s", "--name", "sh1")
    assert proc.returncode == 0, proc.stderr
    assert "tmux session gc-alice-sh1" in proc.stdout
    assert _wait_state(c, "sh1", {"timeout"}, timeout=20)["state"] == "timeout"
    proc = c.cli("notebook", "--name", "nb1")
    assert proc.returncode == 1
    assert "jupyter is not installed on this node" in proc.stderr
    assert all(r["state"] == "free" for r in c.status())


def test_attach_shows_the_job_in_a_terminal(jobs_cluster):
    c = jobs_cluster
    c.ok(
        "run",
        "--name",
        "watched",
        "--",
        "sh",
        "-c",
        "while true; do echo tick-from-job; sleep 0.3; done",
    )
    _wait_state(c, "watched", {"running"})
    screen = _screen_of(c.env(), [sys.executable, "-m", "gpuclaim", "attach", "watched"])
    assert "tick-from-job" in screen, screen
    c.ok("kill", "watched")


def _screen_of(env, argv, until="tick-from-job", timeout=20.0):
    """What ``argv`` shows in a real terminal (a tmux pane of a private tmux server, started
    with ``env``) once ``until`` appears on it, or when ``timeout`` has passed."""
    sock = f"gc-test-{os.getpid()}-{time.monotonic_ns()}"
    passed = [
        a
        for k in ("GPUCLAIM_CONFIG", "GPUCLAIM_HOME", "GPUCLAIM_USER", "HOME")
        if k in env
        for a in ("-e", f"{k}={env[k]}")
    ]
    # the pane stays after the command ends, with its exit status: a failure shows its message
    command = " ".join(shlex.quote(a) for a in argv) + "; echo exited $?; sleep 60"
    subprocess.run(
        ["tmux", "-L", sock, "new-session", "-d", "-x", "120", "-y", "30", *passed, command],
        check=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run(
                ["tmux", "-L", sock, "capture-pane", "-p"], capture_output=True, text=True
            ).stdout
            if until in screen:
                break
            time.sleep(0.3)
        return screen
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def test_a_followers_read_waits_on_the_node_for_the_next_line(tmp_path, monkeypatch):
    """logs -f / run --follow ask the node to wait for the log to grow (a long poll), so a
    line reaches the follower as it is written, not at the follower's next round trip."""
    import threading

    from gpuclaim.core.errors import GpuclaimError
    from gpuclaim.node.home import jobs_home
    from gpuclaim.node.runner import read_log

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GPUCLAIM_JOBS_DIR", raising=False)
    log = jobs_home() / "j-1" / "rank0" / "output.log"
    log.parent.mkdir(parents=True)
    log.write_text("first\n")
    assert read_log(str(log), 0, wait_s=10)["data"] == "first\n"  # data there: no wait
    writer = threading.Timer(0.3, lambda: log.open("a").write("second\n"))
    writer.start()
    t0 = time.monotonic()
    chunk = read_log(str(log), 6, wait_s=20)
    assert chunk == {"data": "second\n", "offset": 13, "size": 13}
    assert time.monotonic() - t0 < 10  # woke up on the write, long before its 20 s
    t0 = time.monotonic()
    assert read_log(str(log), 13, wait_s=0.3)["data"] == ""  # nothing new: ends on time
    assert 0.25 < time.monotonic() - t0 < 10
    with pytest.raises(GpuclaimError, match="no job log"):
        read_log(str(tmp_path / "elsewhere.log"), 0, wait_s=5)  # outside: refused at once
