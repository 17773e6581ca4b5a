"""[hardening-3] A job that never ran (``cancelled``: what it waited for with ``--after`` did
not succeed) is never reported as started: ``run --wait``, ``run --queue --wait`` and
``run --follow`` end with its reason on stderr and exit 1, as ``logs -f`` does; ``jobs``
shows it cancelled. Through the real CLI on a one-node sshd testbed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

NEVER_RAN_EXIT = 1  # README, "Exit codes": never ran `1`


@pytest.fixture
def c(make_testbed, make_remote):
    """One sshd node (node01) of two GPUs: enough for these, and quick to start."""
    return make_remote(make_testbed(1, 2), kill_grace="2s", heartbeat="1s")


def _stored(c) -> dict[str, dict]:
    """The job records as the storage holds them, by name (reading them calls no gpuclaim)."""
    jobs = (json.loads(p.read_text()) for p in (c.storage / "jobs").glob("*.json"))
    return {j["name"]: j for j in jobs}


def _until(c, done, timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = _stored(c)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, {n: j["state"] for n, j in jobs.items()}
        time.sleep(0.2)


def _gpuclaim(c, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", *args],
        env=c.env(),
        cwd=c.home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_run_wait_and_follow_after_a_failed_job_exit_1_with_its_reason(c, tmp_path: Path):
    go = tmp_path / "go"
    # prep fails with code 3, once every dependant is queued behind it
    fail_later = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)\n"
    c.ok("run", "--name", "prep", "--", "python3", "-c", fail_later + "sys.exit(3)")
    waiting = {
        "waits": _gpuclaim(c, "run", "--wait", "--name", "waits", "--after", "prep", "--", "true"),
        "follows": _gpuclaim(
            c, "run", "--follow", "--name", "follows", "--after", "prep", "--", "echo", "ran"
        ),
        "queues": _gpuclaim(
            c,
            "run",
            "--queue",
            "--wait",
            "--json",
            "--name",
            "queues",
            "--after",
            "prep",
            "--",
            "true",
        ),
    }
    later = c.cli("run", "--name", "later", "--after", "prep", "--", "true")
    assert later.returncode == 0, later.stderr
    assert later.stdout.startswith("Queued later: it starts after prep"), later.stdout
    _until(c, lambda js: all(js.get(n, {}).get("state") == "queued" for n in waiting), 60)
    go.touch()

    said = {}
    for name, proc in waiting.items():
        stdout, stderr = proc.communicate(timeout=60)
        said[name] = stdout, stderr
        assert proc.returncode == NEVER_RAN_EXIT, (name, proc.returncode, stdout, stderr)
        assert "Started" not in stdout + stderr, (name, stdout, stderr)
        assert "Traceback" not in stderr and "internal error" not in stderr, stderr
        assert stderr.strip().splitlines()[-1] == (
            f"gpuclaim: error: job {name} never ran: prep failed"
        ), stderr
    assert said["follows"][0] == ""  # its stdout is the job's output: there is none
    printed = json.loads(said["queues"][0])  # --json: the job, then the exit code says it
    assert printed["name"] == "queues" and printed["state"] == "cancelled"
    assert printed["reason"] == "never ran: prep failed" and printed["started"] is None

    # the one run without waiting: cancelled by prep's wrapper, nobody calling gpuclaim
    jobs = _until(c, lambda js: js["later"]["state"] == "cancelled", 30)
    assert jobs["prep"]["state"] == "failed" and jobs["prep"]["exit_code"] == 3
    rows = {r["name"]: r for r in c.json("jobs")}
    assert rows["later"]["state"] == "cancelled"
    assert rows["later"]["reason"] == "never ran: prep failed"
    assert "cancelled" in c.ok("jobs")
    for args in (("logs", "later", "-f"), ("logs", "later")):
        proc = c.cli(*args)
        assert proc.returncode == NEVER_RAN_EXIT, (args, proc.stderr)
        assert proc.stdout == ""
        assert proc.stderr == "gpuclaim: error: job later never ran: prep failed\n", proc.stderr


def test_the_one_table_of_ends():
    """Every job state is active or final; the final ones split into succeeded and the
    unsuccessful, and a job that never ran is one of those."""
    from gpuclaim.core.states import (
        ACTIVE_JOB_STATES,
        FINAL_STATES,
        NEVER_RAN_STATES,
        UNSUCCESSFUL_STATES,
        JobState,
        ended,
        ended_badly,
        never_ran,
    )

    states = {s.value for s in JobState}
    assert set(ACTIVE_JOB_STATES) | set(FINAL_STATES) == states
    assert not set(ACTIVE_JOB_STATES) & set(FINAL_STATES)
    assert set(UNSUCCESSFUL_STATES) == set(FINAL_STATES) - {"succeeded"}
    assert set(NEVER_RAN_STATES) == {"cancelled"} <= set(UNSUCCESSFUL_STATES)
    assert [s for s in states if ended(s)] == [s for s in states if s in FINAL_STATES]
    assert {s for s in states if ended_badly(s)} == set(UNSUCCESSFUL_STATES)
    assert {s for s in states if never_ran(s)} == {"cancelled"}
    assert not ended("queued") and not ended_badly("succeeded") and not never_ran("failed")
