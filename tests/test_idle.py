"""Idle claims on the sshd testbed: measured, shown, told once, released only by policy."""

from __future__ import annotations

import json
import time

from conftest import gpu
from test_slack import FakeSlack


def _claim_row(c, claim_id, user="alice"):
    rows = [r for r in c.status(user) if r["claim"] and r["claim"]["id"] == claim_id]
    assert rows, f"claim {claim_id} is gone"
    return rows[0]


def _events(c):
    out = []
    for f in (c.storage / "events").glob("*.jsonl"):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return out


IDLE = '\n[idle]\nwindow = "8s"\nthreshold_pct = 5\n'


def test_idle_claim_is_marked_and_its_holder_told_once(testbed, make_remote):
    slack = FakeSlack()
    try:
        testbed.set_gpus("node01", [gpu(utilization_pct=0) for _ in range(2)])
        testbed.set_gpus("node02", [gpu(utilization_pct=90) for _ in range(2)])
        c = make_remote(
            testbed,
            nodes=["node01", "node02"],
            # the rendered config ends in its [slack] table: its keys first, then [idle]
            extra_toml=f'webhook_url = "{slack.url}"\ntimeout = "1s"\n'
            'mentions = { alice = "U0ALICE" }\n' + IDLE,
        )
        t0 = time.monotonic()
        lazy = c.json("claim", "-n", "2", "--node", "node01")
        busy = c.json("claim", "-n", "2", "--node", "node02")
        first = _claim_row(c, lazy["id"])
        if time.monotonic() - t0 < 7:  # (a loaded machine may already be past the window)
            assert first["claim"]["idle"] is False
        deadline = time.monotonic() + 30
        while True:
            lazy_row = _claim_row(c, lazy["id"])
            if lazy_row["claim"]["idle"]:
                break
            assert time.monotonic() < deadline, lazy_row
            time.sleep(1)
        assert time.monotonic() - t0 >= 8  # not before the window
        assert lazy_row["claim"]["usage"]["idle_for_s"] >= 8
        assert lazy_row["state"] == "claimed"  # idle is a mark on the claim, not a new state
        assert _claim_row(c, busy["id"])["claim"]["idle"] is False  # a busy GPU never is
        table = c.ok("status")
        assert "claimed (idle" in table
        for _ in range(3):
            c.ok("status")
        hits = slack.wait_for("looks idle", 1)
        slack.let_late_posts_land()
        c.ok("status")
        assert len([t for t in slack.texts() if "looks idle" in t]) == 1
        assert "<@U0ALICE>" in hits[0] or "U0ALICE" in json.dumps(slack.received)
        assert all(r["state"] == "claimed" for r in c.status() if r["node"] == "node01")
    finally:
        slack.close()


def test_release_policy_frees_idle_claims_but_not_running_jobs(testbed, make_remote):
    testbed.set_gpus("node01", [gpu(utilization_pct=0) for _ in range(2)])
    policy = IDLE + 'release_after = "2s"\n'
    c = make_remote(testbed, nodes=["node01", "node02"], extra_toml=policy, heartbeat="1s")
    lazy = c.json("claim", "-n", "1", "--node", "node01")
    job = c.json("run", "-n", "2", "--node", "node02", "--name", "quiet", "--", "sleep", "60")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = c.status()
        if not any(r["claim"] and r["claim"]["id"] == lazy["id"] for r in rows):
            break
        time.sleep(0.7)
    else:
        raise AssertionError("the idle claim was never released")
    release = [e for e in _events(c) if e["type"] == "release" and e["claim_id"] == lazy["id"]]
    assert release and release[0]["by"] == "gpuclaim"
    assert release[0]["reason"].startswith("idle policy: under 5% for")
    # The job's GPUs show 0 % too (sleep does no GPU work) but a running job is never released
    # by the default policy.
    jobs = c.json("jobs")
    assert next(j for j in jobs if j["name"] == "quiet")["state"] == "running"
    assert job["id"]
    c.ok("kill", "quiet")


def test_history_shows_held_versus_busy_gpu_hours(testbed, make_remote):
    testbed.set_gpus("node01", [gpu(utilization_pct=100), gpu(utilization_pct=0)])
    c = make_remote(testbed, nodes=["node01"], extra_toml=IDLE)
    claim = c.json("claim", "-n", "2", "--node", "node01")
    for _ in range(6):  # deliberately spaced looks: each samples the GPUs' use while held
        c.ok("status")
        time.sleep(0.5)
    c.ok("release", claim["id"])
    rows = c.json("history")
    row = rows[0]
    assert row["user"] == "alice"
    # one GPU at 100 %, one at 0 %: half of the held GPU-time was busy
    assert 40 <= row["utilization_pct"] <= 60, row
    assert 0 < row["busy_gpu_hours"] < row["gpu_hours"]


def test_the_idle_policy_leaves_a_service_alone_even_where_it_stops_idle_jobs(testbed, make_remote):
    """An endpoint idles at night by design: at 0 % it is neither told nor released, while
    a 0 % batch job beside it is stopped by a policy that releases jobs' claims."""
    policy = IDLE + 'release_after = "2s"\nrelease_jobs = true\n'
    c = make_remote(testbed, nodes=["node01"], extra_toml=policy, heartbeat="1s")
    zero = ("--env", "GPUCLAIM_FAKE_UTIL_PCT=0")
    serve = "exec python3 -m http.server $GPUCLAIM_PORT"
    c.json("serve", "--name", "api", *zero, "--", "sh", "-c", serve)
    c.json("run", "--name", "quiet", *zero, "--", "sleep", "120")
    deadline = time.monotonic() + 40
    while True:
        c.status()  # a look applies the policy
        jobs = {j["name"]: j for j in c.json("jobs", "--all")}
        if jobs["quiet"]["state"] == "killed":
            break
        assert time.monotonic() < deadline, jobs["quiet"]
        time.sleep(1)
    assert jobs["api"]["state"] == "running"
    held = [r for r in c.status() if r["claim"] and r["claim"]["job"] == jobs["api"]["id"]]
    assert held and held[0]["utilization_pct"] == 0
    assert held[0]["claim"]["idle"] is False and held[0]["service"]["name"] == "api"
    assert not [
        e
        for e in _events(c)
        if e["type"] == "claim-idle"
        and e["node"] == "node01"
        and e["claim_id"] == held[0]["claim"]["id"]
    ]
    c.ok("kill", "api")
