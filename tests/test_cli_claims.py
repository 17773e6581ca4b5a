"""Claiming, releasing, extending and status, end to end through the CLI."""

from __future__ import annotations

import json
import os
import stat
import time

from conftest import gpu
from test_reserve import _wait_until

from gpuclaim.core.model import parse_iso


def test_status_lists_every_gpu_free(cluster):
    rows = cluster.status()
    assert [(r["node"], r["index"]) for r in rows] == [
        ("node01", 0),
        ("node01", 1),
        ("node01", 2),
        ("node01", 3),
        ("node02", 0),
        ("node02", 1),
    ]
    for r in rows:
        assert r["state"] == "free"
        assert r["claim"] is None
        assert r["uuid"].startswith("GPU-")
        assert set(r) >= {
            "node",
            "index",
            "uuid",
            "name",
            "memory_used_mib",
            "memory_total_mib",
            "utilization_pct",
            "state",
            "claim",
        }
    assert rows[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert rows[0]["memory_total_mib"] == 81559
    assert rows[4]["name"] == "NVIDIA L40S"


def test_claim_release_roundtrip(cluster):
    claim = cluster.json("claim", "-n", "2", "--node", "node01", "--time", "90m", "--note", "bert")
    assert claim["node"] == "node01"
    assert claim["gpus"] == [0, 1]
    assert claim["id"].startswith("c-")
    assert claim["user"] == "alice"
    rows = cluster.by_gpu(user="bob")
    for i in (0, 1):
        row = rows[("node01", i)]
        assert row["state"] == "claimed"
        assert row["claim"]["user"] == "alice"
        assert row["claim"]["note"] == "bert"
        assert row["claim"]["id"] == claim["id"]
        assert row["claim"]["expires"] == claim["expires"]
    assert rows[("node01", 2)]["state"] == "free"
    # bob cannot release it without --force
    proc = cluster.cli("release", claim["id"], user="bob")
    assert proc.returncode == 3
    assert "belongs to alice" in proc.stderr
    released = cluster.json("release", claim["id"])
    assert [c["id"] for c in released] == [claim["id"]]
    assert all(r["state"] == "free" for r in cluster.status())


def test_claim_packs_onto_the_best_fitting_node(cluster):
    # node02 has 2 GPUs: a 2-GPU request fills it and leaves node01's 4 for a bigger job.
    assert cluster.json("claim", "-n", "2")["node"] == "node02"
    assert cluster.json("claim", "-n", "3")["node"] == "node01"


def test_short_output_for_cuda_visible_devices(cluster):
    proc = cluster.cli("claim", "-n", "2", "--node", "node01", "--short")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "0,1\n"


def test_exact_gpus_and_conflict_exit_3(cluster):
    mine = cluster.json("claim", "--gpu", "node01:1,3")
    assert mine["gpus"] == [1, 3]
    proc = cluster.cli("claim", "--gpu", "node01:3", user="bob")
    assert proc.returncode == 3
    assert "node01 GPU 3 is held by alice" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_nothing_free_exits_3_and_never_fits_exits_1(cluster):
    cluster.json("claim", "-n", "4", "--node", "node01")
    proc = cluster.cli("claim", "-n", "3", user="bob")
    assert proc.returncode == 3
    assert "no node has 3 GPUs free now" in proc.stderr
    proc = cluster.cli("claim", "-n", "5", user="bob")
    assert proc.returncode == 1
    assert "can never fit" in proc.stderr


def test_force_release_is_logged(cluster):
    claim = cluster.json("claim", "-n", "1")
    released = cluster.json("release", claim["id"], "--force", user="carol")
    assert released[0]["user"] == "alice"
    events = _events(cluster)
    forced = [e for e in events if e["type"] == "force-release"]
    assert forced and forced[0]["by"] == "carol" and forced[0]["user"] == "alice"


def test_release_all_and_by_gpu(cluster):
    cluster.json("claim", "--gpu", "node01:0")
    cluster.json("claim", "--gpu", "node01:2")
    cluster.json("claim", "--gpu", "node02:1")
    released = cluster.json("release", "--gpu", "node01:2")
    assert [c["gpus"] for c in released] == [[2]]
    assert len(cluster.json("release", "--all")) == 2
    assert all(r["state"] == "free" for r in cluster.status())


def test_extend_within_limit(make_cluster):
    c = make_cluster({"node01": 2}, max_time="3h")
    claim = c.json("claim", "-n", "1", "--time", "1h")
    extended = c.json("extend", claim["id"], "--time", "1h")
    assert extended[0]["expires"] > claim["expires"]
    proc = c.cli("extend", claim["id"], "--time", "2h")
    assert proc.returncode == 2
    assert "limit is 3h" in proc.stderr
    proc = c.cli("extend", claim["id"], "--time", "1h", user="bob")
    assert proc.returncode == 3
    proc = c.cli("claim", "-n", "1", "--time", "4h")
    assert proc.returncode == 2 and "longer than this cluster's limit of 3h" in proc.stderr


def test_max_gpus_per_user(make_cluster):
    c = make_cluster({"node01": 4}, max_gpus_per_user=2)
    c.json("claim", "-n", "2")
    proc = c.cli("claim", "-n", "1")
    assert proc.returncode == 3 and "limit of 2 per user" in proc.stderr
    c.json("claim", "-n", "1", user="bob")


def test_expired_claims_are_stale_then_reclaimed_by_gc_or_next_claim(cluster):
    first = cluster.json("claim", "--gpu", "node02:0", "--time", "1s")
    second = cluster.json("claim", "--gpu", "node02:1", "--time", "1s")
    _wait_until(parse_iso(second["expires"]) + 0.05)  # the later of the two has expired
    rows = cluster.by_gpu()
    assert rows[("node02", 0)]["state"] == "stale"
    assert rows[("node02", 0)]["reason"] == "expired"
    assert rows[("node02", 0)]["claim"]["id"] == first["id"]
    # The next claim takes over a stale GPU...
    taken = cluster.json("claim", "--gpu", "node02:0", user="bob")
    assert taken["user"] == "bob"
    # ...and gc collects the rest.
    report = cluster.json("gc")
    assert [c["id"] for c in report["expired"]] == [second["id"]]
    rows = cluster.by_gpu()
    assert rows[("node02", 1)]["state"] == "free"
    assert rows[("node02", 0)]["claim"]["user"] == "bob"
    expired = {e["claim_id"] for e in _events(cluster) if e["type"] == "expire"}
    assert expired == {first["id"], second["id"]}


def test_busy_unclaimed_from_foreign_processes(make_cluster):
    busy = gpu(processes=[{"pid": 4194401, "name": "/usr/bin/python3", "used_memory_mib": 9000}])
    xorg = gpu(processes=[{"pid": 4194402, "name": "/usr/lib/xorg/Xorg", "used_memory_mib": 300}])
    tiny = gpu(processes=[{"pid": 4194403, "name": "python", "used_memory_mib": 100}])
    c = make_cluster({"node01": [busy, xorg, tiny, gpu()]})
    states = [r["state"] for r in c.status()]
    assert states == ["busy-unclaimed", "free", "free", "free"]
    # A busy GPU is not handed out, even when explicitly asked for.
    proc = c.cli("claim", "--gpu", "node01:0")
    assert proc.returncode == 3 and "busy" in proc.stderr
    assert c.json("claim", "-n", "3")["gpus"] == [1, 2, 3]


def test_adopt_claims_gpus_of_my_running_process(make_cluster):
    import subprocess

    c = make_cluster({"node01": 4})
    env = {**os.environ, **c.node_env("node01"), "CUDA_VISIBLE_DEVICES": "2"}
    job = subprocess.Popen(["sleep", "60"], env=env)
    try:
        row = c.by_gpu()[("node01", 2)]
        assert row["state"] == "busy-unclaimed"
        claim = c.json("claim", "--adopt", user=_login())
        assert claim["gpus"] == [2] and claim["adopted"] is True
        assert c.by_gpu()[("node01", 2)]["state"] == "claimed"
        proc = c.cli("claim", "--adopt", user="bob")
        assert proc.returncode == 1 and "no unclaimed GPU runs a process of bob" in proc.stderr
    finally:
        job.kill()
        job.wait()


def test_drain_blocks_new_claims(cluster):
    cluster.ok("drain", "node02", "--reason", "driver update")
    claim = cluster.json("claim", "-n", "2")
    assert claim["node"] == "node01"
    proc = cluster.cli("claim", "--gpu", "node02:0")
    assert proc.returncode == 3 and "drained by alice: driver update" in proc.stderr
    cluster.ok("undrain", "node02")
    assert cluster.json("claim", "--gpu", "node02:0")["node"] == "node02"


HELD_S = 1.0  # how long test_history_gpu_hours holds its claim


def test_history_gpu_hours(cluster):
    a = cluster.json("claim", "-n", "2", "--node", "node01")
    time.sleep(HELD_S)  # deliberately held this long: the least GPU-hours it may count
    cluster.json("release", a["id"])
    cluster.json("claim", "-n", "1", "--node", "node02", user="bob")
    rows = {r["user"]: r for r in cluster.json("history")}
    assert rows["alice"]["claims"] == 1
    assert 2 * HELD_S / 3600 <= rows["alice"]["gpu_hours"] < 2 * 10 / 3600
    assert rows["bob"]["claims"] == 1  # still held: counted up to now
    by_node = {r["node"] for r in cluster.json("history", "--by", "node")}
    assert by_node == {"node01", "node02"}
    only_bob = cluster.json("history", "--user", "bob")
    assert [r["user"] for r in only_bob] == ["bob"]
    days = cluster.json("history", "--by", "day", "--since", "7d")
    assert len(days) == 1 and days[0]["claims"] == 2
    listed = cluster.json("history", "--claims")
    assert {r["claim_id"] for r in listed} >= {a["id"]}


def test_store_files_are_group_shared(cluster):
    old = os.umask(0o077)  # the CLI runs with the user's umask; ours is inherited
    try:
        cluster.json("claim", "-n", "1")
    finally:
        os.umask(old)
    gpus_dir = cluster.storage / "gpus"
    claim_file = next(gpus_dir.iterdir())
    assert stat.S_IMODE(claim_file.stat().st_mode) == 0o664
    assert stat.S_IMODE(gpus_dir.stat().st_mode) & 0o070 == 0o070
    events = next((cluster.storage / "events").iterdir())
    assert stat.S_IMODE(events.stat().st_mode) == 0o664


def test_pipe_output_has_no_escape_codes(cluster):
    cluster.json("claim", "-n", "1", "--note", "x" * 150)
    proc = cluster.cli("status", NO_COLOR="")
    assert proc.returncode == 0
    assert "\x1b[" not in proc.stdout
    assert all(len(line) < 240 for line in proc.stdout.splitlines())
    assert "x" * 150 in proc.stdout  # a whole row stays on one line in a pipe


def _events(cluster):
    lines = []
    for f in (cluster.storage / "events").glob("*.jsonl"):
        lines += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return lines


def _login():
    import getpass

    return getpass.getuser()


def test_status_says_once_when_slurm_would_pay_off(make_cluster):
    c = make_cluster({"n1": 6, "n2": 6, "n3": 6}, fast=True)  # 18 GPUs: past 16
    first = c.ok("status")
    assert "gpuclaim export slurm" in first
    assert "gpuclaim export slurm" not in c.ok("status")
    small = make_cluster({"n1": 2}, fast=True)
    assert "export slurm" not in small.ok("status")
