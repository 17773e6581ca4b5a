"""One Unix account per person ([accounts]): a job runs only as the account that submitted it.

Two real accounts of one group log in to real sshd nodes with keys of their own and run the
CLI as themselves; the store is the group's (2775). Nothing here sets ``GPUCLAIM_USER``: who
someone is comes from the account alone. What is proven, through the CLI:

* a job queued behind another account's job starts by itself, as its owner, within 3 s of
  the other's end (from a private home and from a group-shared project directory);
* a record another account writes naming you is never run by any of your processes, and
  ``doctor`` reports it;
* after a node reboot another account's look never starts your service; your next look does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from lab import ACCOUNTS, ALICE, BOB, GROUP, Lab, ensure_accounts

from gpuclaim.sim.fake_nvidia_smi import sim_uuid

# One pytest worker runs every test that makes or uses this machine's real accounts
# (useradd locks /etc/passwd; the accounts' processes are ended per test).
pytestmark = [pytest.mark.ssh, pytest.mark.root, pytest.mark.xdist_group("real-accounts")]
pytest_plugins = ["testbed_fixtures"]


@pytest.fixture(params=["per-node homes", "shared homes"])
def lab(request: Any, make_testbed: Any, tmp_path_factory: Any) -> Iterator[Lab]:
    ensure_accounts()
    shared = request.param == "shared homes"
    tb = make_testbed(2, 2, accounts=ACCOUNTS, shared_homes=shared)
    root = tmp_path_factory.mktemp("lab")
    for parent in [root, *root.parents]:  # the accounts must reach the lab's directory
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o755)
    lab = Lab(root / "lab", tb, extra_toml='\n[queue]\npreempt_grace = "2s"\n')
    try:
        yield lab
    finally:
        # this lab's own processes of theirs (laptop CLIs, agents, keepers, jobs: they carry
        # this testbed's marker), by pid; never another run's processes of the same accounts
        for pid in lab.processes_of(*ACCOUNTS):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _log(lab: Lab, record: dict[str, Any]) -> str:
    return lab.ok(record["account"], "logs", record["id"])


WHO = ["sh", "-c", "echo account=$(id -un); echo dir=$(pwd)"]


@pytest.mark.parametrize("where", ["private home", "shared project"])
def test_a_queued_job_behind_another_accounts_starts_as_its_owner(lab: Lab, where: str) -> None:
    cwd = lab.laptop_home(ALICE) if where == "private home" else lab.project
    hold = lab.json(BOB, "run", "-n", "2", "--node", "node01", "--name", "hold", "--", "sleep", "4")
    assert hold["state"] in ("starting", "running"), hold
    queued = json.loads(
        lab.ok(
            ALICE, "run", "-n", "2", "--node", "node01", "--queue", "--name", "mine",
            "--json", "--", *WHO, cwd=cwd,
        )
    )  # fmt: skip
    assert queued["state"] == "queued" and queued["account"] == ALICE, queued
    assert queued["uid"] == lab.uid(ALICE)
    # meanwhile, bob's look says whose it is to start once it fits: nobody's but alice's
    ended = lab.wait_record(hold["id"], lambda r: r["state"] == "succeeded", 30)
    done = lab.wait_record(queued["id"], lambda r: r["state"] == "succeeded", 30)
    log = _log(lab, done)
    assert f"account={ALICE}" in log and f"dir={cwd}" in log, log
    handover = _ts(done["started"]) - _ts(ended["ended"])
    print(f"hand-over from {BOB}'s job to {ALICE}'s queued one: {handover:.2f} s")
    assert handover <= 3.0, (ended, done)
    assert done["account"] == ALICE and ended["account"] == BOB


def test_another_accounts_queued_job_waits_for_its_owner_and_says_so(lab: Lab) -> None:
    hold = lab.json(
        BOB, "run", "-n", "2", "--node", "node01", "--name", "hold", "--", "sleep", "60"
    )
    queued = lab.json(
        ALICE, "run", "-n", "2", "--node", "node01", "--queue", "--name", "q", "--", "true"
    )
    # alice's keeper dies (her laptop closed long ago, the node lost it): nobody starts it
    keepers = [p for p in lab.processes_of(ALICE) if b"keep-queue" in _cmdline(p)]
    assert keepers, "alice's queue keeper on node01 is not running"
    for pid in keepers:
        os.kill(pid, signal.SIGKILL)
    lab.ok(BOB, "kill", "hold")
    lab.wait_record(hold["id"], lambda r: r["state"] == "killed", 20)
    time.sleep(2.5)  # more than a keeper's poll: had anyone of bob's started it, it would run
    assert lab.record(queued["id"])["state"] == "queued"
    why = lab.ok(BOB, "why", "q")
    assert f"waits for {ALICE}'s keeper on node01" in why, why
    lab.ok(BOB, "why", "q")
    # told once (to Slack, from the event log), however many looks see it
    told = [e for e in _events(lab) if e["type"] == "owner-turn"]
    assert len(told) == 1 and told[0]["extra"]["job_id"] == queued["id"], told
    assert f"waits for {ALICE}'s keeper" in told[0]["reason"]
    # her next command starts it, as her
    lab.ok(ALICE, "jobs")
    done = lab.wait_record(queued["id"], lambda r: r["state"] == "succeeded", 30)
    assert done["account"] == ALICE


def _events(lab: Lab) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for log in (lab.storage / "events").glob("*.jsonl")
        for line in log.read_text().splitlines()
    ]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


FORGER = r"""
import sys, json
from pathlib import Path
from gpuclaim.core.model import Job
from gpuclaim.core.priority import entry_name
from gpuclaim.store import ClaimStore
root, victim_uid, victim, target = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
store = ClaimStore(Path(root))
job = Job("j-forged1", "forged", victim, ("touch", target), "queued", store.now(), 600.0,
          gpus_per_node=1, node="node01", account=victim, uid=victim_uid)
store.create_job(job)      # names alice: her uid, her login, no spec of hers
store.enqueue(job.id, victim)
# and one that points at a spec of alice's that says something else
other = job.with_(id="j-forged2", name="forged2", spec=sys.argv[5])
store.create_job(other)
store.enqueue(other.id, victim)
print("forged")
"""


def test_a_record_another_account_writes_naming_you_is_never_run(lab: Lab) -> None:
    target = lab.root / "pwned"
    mine = lab.json(ALICE, "run", "--node", "node01", "--name", "real", "--", "true")
    lab.wait_record(mine["id"], lambda r: r["state"] == "succeeded", 30)
    proc = subprocess.run(
        [lab.python, "-c", FORGER, str(lab.storage), str(lab.uid(ALICE)), ALICE, str(target),
         mine["id"]],
        env=lab.env(BOB), user=BOB, group=GROUP, umask=0o022, capture_output=True, text=True,
        cwd="/", timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # alice's next commands dispatch the queue: both forged jobs are refused, never run
    lab.ok(ALICE, "run", "--node", "node01", "--name", "next", "--", "true")
    lab.ok(ALICE, "jobs")
    for job_id in ("j-forged1", "j-forged2"):
        record = lab.wait_record(job_id, lambda r: r["state"] == "failed", 20)
        assert record["reason"].startswith("refused: "), record
    assert "never submitted it" in lab.record("j-forged1")["reason"]
    assert f"is not what {ALICE} submitted" in lab.record("j-forged2")["reason"]
    assert not target.exists()
    doctor = lab.cli(ALICE, "doctor")
    assert "refused" in doctor.stdout + doctor.stderr and "j-forged1" in doctor.stdout, doctor
    # bob's own processes refuse them too: they are alice's, not his
    lab.ok(BOB, "jobs")
    assert not target.exists()


def test_after_a_reboot_only_the_owners_look_starts_her_service(lab: Lab) -> None:
    served = lab.json(
        ALICE, "serve", "--node", "node01", "--name", "api", "--port", "auto",
        "--", "sh", "-c", "exec python3 -m http.server --bind 127.0.0.1 $GPUCLAIM_PORT",
    )  # fmt: skip
    lab.wait_record(served["id"], lambda r: r["state"] == "running", 30)
    lab.tb.reboot_node("node01")
    time.sleep(1)
    look = lab.cli(BOB, "status")
    assert look.returncode == 0, look.stderr
    assert f"started {ALICE}'s service" not in look.stderr, look.stderr
    assert f"only {ALICE}'s account starts it again" in look.stderr, look.stderr
    record = lab.record(served["id"])
    assert record["restarts"] == 0, record
    mine = lab.cli(ALICE, "status")
    assert f"started {ALICE}'s service api again on node01" in mine.stderr, mine.stderr
    back = lab.wait_record(served["id"], lambda r: r["restarts"] == 1, 10)
    assert back["account"] == ALICE


def test_kill_force_and_extend_across_accounts_take_effect_through_the_store(lab: Lab) -> None:
    job = lab.json(ALICE, "run", "--node", "node01", "--name", "long", "--", "sleep", "300")
    lab.wait_record(job["id"], lambda r: r["state"] == "running", 30)
    # a name is only shown: bob calling himself alice still is not alice's account
    spoof = subprocess.run(
        [lab.python, "-m", "gpuclaim", "kill", "long"],
        env=lab.env(BOB, GPUCLAIM_USER=ALICE), user=BOB, group=GROUP, umask=0o022,
        capture_output=True, text=True, cwd="/", timeout=60,
    )  # fmt: skip
    assert spoof.returncode == 3 and f"belongs to the account {ALICE}" in spoof.stderr, spoof
    lab.ok(ALICE, "extend", "long", "--time", "1h")
    assert lab.record(job["id"])["time_limit_s"] > 3600
    plain = lab.cli(BOB, "kill", "long")
    assert plain.returncode == 1 and f"no job 'long' of {BOB}" in plain.stderr, plain.stderr
    asked = time.monotonic()
    lab.ok(BOB, "kill", "--force", "long")
    done = lab.wait_record(job["id"], lambda r: r["state"] == "killed", 10)
    took = time.monotonic() - asked
    print(f"{BOB}'s kill --force of {ALICE}'s job took effect in {took:.2f} s")
    assert took <= 2.5, done  # the CLI's own start included
    forced = [
        e for e in _events(lab) if e["type"] == "force-kill" and e["extra"]["job_id"] == job["id"]
    ]
    assert forced and forced[0]["by"] == BOB, forced


def test_a_requeued_job_and_a_dependant_across_accounts_run_as_their_owners(lab: Lab) -> None:
    prep = lab.json(
        BOB, "run", "-n", "2", "--node", "node01", "--preemptible", "--requeue",
        "--name", "prep", "--", "sh", "-c", "echo account=$(id -un); sleep 6",
    )  # fmt: skip
    lab.wait_record(prep["id"], lambda r: r["state"] == "running", 30)
    after = lab.json(ALICE, "run", "--node", "node01", "--queue", "--after", prep["id"],
                     "--name", "next", "--", *WHO)  # fmt: skip
    # alice claims bob's GPUs: his scavenger yields and goes back to the queue, as his
    claim = lab.json(ALICE, "claim", "-n", "2", "--node", "node01")
    first = lab.wait_record(prep["id"], lambda r: r["state"] == "preempted", 30)
    rerun_id = first["requeued_as"]
    assert rerun_id and lab.record(rerun_id)["account"] == BOB
    lab.ok(ALICE, "release", claim["id"] if isinstance(claim, dict) else claim[0]["id"])
    rerun = lab.wait_record(rerun_id, lambda r: r["state"] == "succeeded", 40)
    assert f"account={BOB}" in _log(lab, rerun)
    done = lab.wait_record(after["id"], lambda r: r["state"] == "succeeded", 30)
    assert f"account={ALICE}" in _log(lab, done)


def _as_root(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    """The lab's admin: the account that owns the store's directory (root here)."""
    env = {**lab.env(ALICE), "HOME": str(lab.root)}
    return subprocess.run(
        [lab.python, "-m", "gpuclaim", *args], env=env, capture_output=True, text=True,
        cwd="/", timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_labs_policy_holds_in_every_process_whatever_each_config_says(lab: Lab) -> None:
    # bob's own config has no limit; the lab's policy, set by the store's owner, says 2
    loose = lab.root / "bob.toml"
    loose.write_text(
        lab.config_path.read_text().replace("[defaults]", "[defaults]\nmax_gpus_per_user = 0", 1)
    )
    loose.chmod(0o644)
    refused = lab.cli(ALICE, "policy", "set", "defaults.max_gpus_per_user", "8")
    assert refused.returncode != 0 and "sets the lab's policy" in refused.stderr, refused
    said = _as_root(lab, "policy", "set", "defaults.max_gpus_per_user", "2")
    assert said.returncode == 0, said.stderr
    bad = _as_root(lab, "policy", "set", "defaults.nonsense", "2")
    assert bad.returncode == 2 and "not a lab policy key" in bad.stderr, bad
    shown = lab.json(BOB, "policy", "show")
    assert shown["policy"] == {"defaults": {"max_gpus_per_user": 2}}, shown
    proc = subprocess.run(
        [lab.python, "-m", "gpuclaim", "run", "--array", "0-3", "--name", "sweep", "--json",
         "--", "sleep", "3"],
        env=lab.env(BOB, GPUCLAIM_CONFIG=str(loose)), user=BOB, group=GROUP, umask=0o022,
        capture_output=True, text=True, cwd="/", timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # bob's CLI, his wrappers and his keepers: never more than 2 of his GPUs at once
    most, deadline = 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        records = [
            json.loads(p.read_text())
            for p in (lab.storage / "jobs").glob("a-*.json")
            if p.name.count(".") == 1
        ]
        running = [r for r in records if r["state"] in ("starting", "running")]
        most = max(most, len(running))
        if len(records) == 4 and all(r["state"] == "succeeded" for r in records):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(records)
    assert most == 2, most


def test_every_node_answers_for_itself_whatever_the_homes(lab: Lab) -> None:
    # with one HOME on every node (NFS), each node's agent, socket and keeper is its own
    for _ in range(3):  # the first look installs, the next ones find warm agents
        rows = lab.json(ALICE, "status")
        seen = {(r["node"], r["uuid"]) for r in rows}
        assert seen == {(n, sim_uuid(n, i)) for n in lab.tb.nodes for i in range(2)}, rows
    jobs = [
        lab.json(ALICE, "run", "--node", n, "--name", f"on-{n}", "--", *WHO)
        for n in ("node01", "node02")
    ]
    for job in jobs:
        done = lab.wait_record(job["id"], lambda r: r["state"] == "succeeded", 30)
        assert done["ranks"][0]["node"] == job["node"]


def test_the_idle_policy_from_anyones_look_stops_only_an_idle_job(lab: Lab) -> None:
    # the lab's idle policy, applied by bob's looks to alice's jobs: bob's nvidia-smi sees her
    # processes and their load (the driver lists every account's, as a real one does)
    for key, value in (
        ("idle.window", "8s"),
        ("idle.threshold_pct", "5"),
        ("idle.release_after", "2s"),
        ("idle.release_jobs", "true"),
    ):
        said = _as_root(lab, "policy", "set", key, value)
        assert said.returncode == 0, said.stderr
    zero = ("--env", "GPUCLAIM_FAKE_UTIL_PCT=0")
    quiet = lab.json(
        ALICE, "run", "--node", "node01", "--name", "quiet", *zero, "--", "sleep", "120"
    )
    busy = lab.json(ALICE, "run", "--node", "node01", "--name", "busy", "--", "sleep", "120")
    lab.wait_record(busy["id"], lambda r: r["state"] == "running", 30)
    rows = {r["index"]: r for r in lab.json(BOB, "status") if r["node"] == "node01"}
    assert rows[busy["gpus"][0]]["utilization_pct"] == 100, rows
    deadline = time.monotonic() + 60
    while lab.record(quiet["id"])["state"] != "killed":
        assert time.monotonic() < deadline, lab.record(quiet["id"])
        lab.ok(BOB, "status")  # bob's look applies the lab's policy
        time.sleep(1)
    assert lab.record(busy["id"])["state"] == "running"
    lab.ok(ALICE, "kill", "busy")
