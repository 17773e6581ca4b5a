"""Faults: skewed clocks, broken storage, nodes dying mid-run, a network filesystem between hosts.

Each one must end in a clear message and a true state: nothing lost, nobody misled.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testbed_fixtures import looks_until_warm

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _faketime_env(offset: str) -> dict[str, str]:
    if not Path(FAKETIME_LIB).exists():
        pytest.fail("libfaketime is missing: apt-get install faketime", pytrace=False)
    # NO_FAKE_STAT: a laptop whose clock is wrong still sees the file server's true mtimes.
    # (monotonic is faked too: with DONT_FAKE_MONOTONIC, Python's time.sleep gets EINVAL)
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": offset, "NO_FAKE_STAT": "1"}


@pytest.mark.parametrize("offset", ["+10m", "-10m"])
def test_laptop_clock_off_by_ten_minutes(make_cluster, offset):
    c = make_cluster({"node01": 2}, fast=True)
    skewed = _faketime_env(offset)
    # the skew is real for the CLI process
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **skewed},
        capture_output=True,
        text=True,
    )
    assert abs(float(probe.stdout) - time.time() - (600 if offset[0] == "+" else -600)) < 30
    proc = c.cli("claim", "-n", "1", "--time", "5m", "--json", **skewed)
    assert proc.returncode == 0, proc.stderr
    claim = json.loads(proc.stdout)
    # since/expires are on the storage's clock, not the skewed one
    from gpuclaim.core.model import parse_iso

    since = parse_iso(claim["since"])
    assert abs(since - time.time()) < 30
    # a skewed laptop neither expires it early nor shows a wrong time left
    for env in (skewed, {}):
        row = next(r for r in json.loads(c.cli("status", "--json", **env).stdout) if r["claim"])
        assert row["state"] == "claimed"
        text = c.cli("status", **env).stdout
        assert any(left in text for left in ("4m", "5m")), text
    # and a fresh claim by the skewed laptop does not take it over as "expired"
    other = c.cli("claim", "--gpu", f"node01:{claim['gpus'][0]}", "--json", **skewed)
    assert other.returncode == 3


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (root needed): {proc.stderr}", pytrace=False)


@pytest.fixture
def small_storage(make_cluster, tmp_path):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "256k")
    c = make_cluster({"node01": 2}, fast=True)
    text = c.config_path.read_text().replace(str(c.storage), str(mnt / "store"))
    c.config_path.write_text(text)
    c.storage = mnt / "store"
    c.storage.mkdir()
    yield c, mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


LOOKING = (
    ["status", "--json"],
    ["status"],
    ["jobs", "--json"],
    ["history"],
    ["board", "--once"],
)


def _assert_looks_still_work(c, claim_id: str, why: str) -> None:
    """Looking answers from what the store holds, with its normal exit code, and says once
    (one line on stderr) that the storage refuses writes, and why."""
    for args in LOOKING:
        proc = c.cli(*args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, (args, proc.stderr)
        assert "refuses writes" in lines[0] and why in lines[0], (args, lines)
        if args[0] == "status":
            assert claim_id in proc.stdout or "alice" in proc.stdout, proc.stdout
    rows = json.loads(c.cli("status", "--json").stdout)
    assert [r["claim"]["id"] for r in rows if r["claim"]] == [claim_id]
    doctor = c.cli("doctor")
    assert doctor.returncode == 1  # a storage that refuses writes is a problem to fix
    assert why in doctor.stdout and "Traceback" not in doctor.stderr


def _assert_acting_fails_cleanly(c, claim_id: str, why: str) -> None:
    for args in (
        ["claim", "-n", "1"],
        ["release", claim_id],
        ["release", "--all"],
        ["extend", claim_id, "--time", "1h"],
        ["run", "--", "true"],
    ):
        proc = c.cli(*args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "refuses writes" in lines[0] and why in lines[0], (args, lines)


def test_read_only_storage_looking_works_acting_fails_nothing_changes(small_storage):
    c, mnt = small_storage
    claim = c.json("claim", "-n", "1", "--note", "keep me")
    before = {p.name: p.read_bytes() for p in (c.storage / "gpus").iterdir()}
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    try:
        _assert_looks_still_work(c, claim["id"], "Read-only file system")
        _assert_acting_fails_cleanly(c, claim["id"], "Read-only file system")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
    assert {p.name: p.read_bytes() for p in (c.storage / "gpus").iterdir()} == before
    c.ok("release", claim["id"])


def test_read_only_storage_without_a_layout_yet_still_answers_status(small_storage):
    c, mnt = small_storage
    # the admin made the directory (the fixture did); nobody has used it yet
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    try:
        proc = c.cli("status", "--json")
        assert proc.returncode == 0, proc.stderr
        assert {r["state"] for r in json.loads(proc.stdout)} == {"free"}
        assert "refuses writes" in proc.stderr and len(proc.stderr.splitlines()) == 1
        claim = c.cli("claim", "-n", "1")
        assert claim.returncode == 1 and "refuses writes" in claim.stderr, claim.stderr
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)


def test_full_storage_looking_works_acting_fails_nothing_half_written(small_storage):
    c, mnt = small_storage
    claim = c.json("claim", "-n", "1")
    before = {p.name: p.read_bytes() for p in (c.storage / "gpus").iterdir()}
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    try:
        _assert_looks_still_work(c, claim["id"], "No space left on device")
        _assert_acting_fails_cleanly(c, claim["id"], "No space left on device")
        # no half claim left behind, the existing one intact
        assert {p.name: p.read_bytes() for p in (c.storage / "gpus").iterdir()} == before
    finally:
        filler.unlink()
    assert c.json("claim", "-n", "1")["gpus"] == [1]
    c.ok("release", "--all")


def _node_processes_with(tb, node: str, part: bytes) -> list[int]:
    """The processes of ``node`` with ``part`` in their command line."""
    found = []
    for pid in tb.node_processes(node):
        try:
            if part in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def _wait_for_node_command(tb, node: str, part: bytes, run, timeout: float = 20.0) -> None:
    """Until a process of ``node`` has ``part`` in its command line, while ``run`` (a
    Popen) goes on."""
    deadline = time.monotonic() + timeout
    while not _node_processes_with(tb, node, part):
        assert run.poll() is None, f"{run.args} ended before {part!r} ran on {node}"
        assert time.monotonic() < deadline, f"no {part!r} ran on {node} within {timeout}s"
        time.sleep(0.1)


def test_node_sshd_killed_mid_run(testbed, make_remote):
    c = make_remote(testbed, nodes=["node01"], kill_grace="2s", heartbeat="1s")
    c.ok("status")
    # sshd dies while `run` is in flight: stop it while run probes the node
    testbed.set_node("node01", delay_ms=1500)  # the probe is slow: time to pull the plug
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", "run", "--name", "cut", "--", "sleep", "30"],
        env=c.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_node_command(testbed, "node01", b"nvidia-smi", proc)
    testbed.stop_node("node01")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (1, 3, 4), (out, err)
    assert "Traceback" not in err
    testbed.start_node("node01")
    testbed.set_node("node01", delay_ms=None)
    # the job is not silently "running", and its GPU is not held
    jobs = [j for j in c.json("jobs", "--all") if j["name"] == "cut"]
    assert all(j["state"] in ("failed", "killed") for j in jobs), jobs
    assert all(r["state"] == "free" for r in c.status())


def test_a_launch_whose_answer_was_lost_never_runs_on_gpus_nobody_holds(
    testbed, make_remote, runtime
):
    """sshd dies between the claim and the launch's answer: the launch reached the node, and
    the node's warm agent carries it on (the wrapper starts late). `run` says the answer was
    lost (exit 4, one line) and keeps the job `starting` with its claim: the wrapper, once it
    beats, runs it on GPUs that are held; the job is never said failed while it runs."""
    c = make_remote(testbed, nodes=["node01"], kill_grace="2s", heartbeat="1s")
    # The launch must go through the warm agent: the first look installs it behind it, and
    # under CI load it came up after `run` had launched over plain ssh (whose session the
    # sshd kill takes with it: "ssh failed", the plain path's honest answer, CI stop 55).
    looks_until_warm(c, runtime, 1)
    shim = testbed.dir / "bin" / "tmux"  # the nodes' PATH: a tmux whose new-session is slow
    shim.write_text(
        f'#!/bin/sh\ncase "$*" in *new-session*) sleep 3;; esac\nexec {shutil.which("tmux")} "$@"\n'
    )
    shim.chmod(0o755)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuclaim", "run", "--name", "cut", "--", "sleep", "47"],
            env=c.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for_node_command(testbed, "node01", b"new-session", proc)  # claimed, launching
        testbed.stop_node("node01")
        out, err = proc.communicate(timeout=60)
    finally:
        shim.unlink()
    assert proc.returncode == 4 and len(err.splitlines()) == 1, (out, err)
    assert "its answer did not come back; job cut stays starting with its GPUs" in err, err
    (job,) = [j for j in c.json("jobs", "--all") if j["name"] == "cut"]
    assert job["state"] in ("starting", "running"), job  # not "failed": it may run
    testbed.start_node("node01")
    # the late start comes, on GPUs its claim still holds: honest, and held
    deadline = time.monotonic() + 20
    while True:
        (job,) = [j for j in c.json("jobs", "--all") if j["name"] == "cut"]
        if job["state"] == "running" and _node_processes_with(testbed, "node01", b"sleep\x0047"):
            break
        assert job["state"] in ("starting", "running") and time.monotonic() < deadline, job
        time.sleep(0.3)
    held = [r for r in c.status() if r["claim"] and r["claim"].get("job") == job["id"]]
    assert held and all(r["state"] == "claimed" for r in held), c.status()
    c.ok("kill", "cut")
    deadline = time.monotonic() + 10
    while _node_processes_with(testbed, "node01", b"sleep\x0047"):
        assert time.monotonic() < deadline, "the job outlived its kill"
        time.sleep(0.3)
    assert all(r["state"] == "free" for r in c.status())


def _sshfs(tb, node: str, real: Path, mnt: Path) -> None:
    mnt.mkdir()
    subprocess.run(
        [
            "sshfs",
            "-F",
            str(tb.ssh_config),
            f"{node}:{real}",
            str(mnt),
            "-o",
            "cache=no,attr_timeout=0,entry_timeout=0,negative_timeout=0",
        ],
        check=True,
        timeout=30,
    )


def test_a_held_gpu_through_sshfs_is_held_not_a_storage_error(make_testbed, make_remote, tmp_path):
    """Through sshfs a held GPU is 'held by alice' (exit 3), never a storage error. (When the
    claim file appears between sshfs's lookup and its SFTP link, SFTP can only answer a
    generic failure, which arrives as EPERM: the racing test below meets that case.)"""
    if shutil.which("sshfs") is None:
        pytest.fail("sshfs is missing: apt-get install sshfs", pytrace=False)
    tb = make_testbed(1, gpus=2)
    real = tmp_path / "server-store"
    real.mkdir()
    mnt = tmp_path / "mnt"
    _sshfs(tb, "node01", real, mnt)
    try:
        (mnt / "store").mkdir()
        c = make_remote(tb, storage=str(mnt / "store"))
        mine = c.json("claim", "--gpu", "node01:0")
        theirs = c.cli("claim", "--gpu", "node01:0", user="bob")
        assert theirs.returncode == 3, theirs.stderr
        assert "held by alice" in theirs.stderr, theirs.stderr
        assert c.json("claim", "-n", "1", user="bob")["gpus"] == [1]
        c.ok("release", mine["id"])
        c.ok("release", "--all", user="bob")
    finally:
        subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True)


def test_racing_claims_through_sshfs_mounts_from_several_nodes(make_testbed, make_remote, tmp_path):
    """One store, seen through separate network-filesystem (sshfs) mounts, one per 'host';
    claimers race through different mounts: still never two holders of one GPU."""
    if shutil.which("sshfs") is None:
        pytest.fail("sshfs is missing: apt-get install sshfs", pytrace=False)
    tb = make_testbed(3, gpus=4)
    real = tmp_path / "server-store"
    real.mkdir()
    mounts = []
    try:
        for node in tb.nodes:
            mnt = tmp_path / f"mnt-{node}"
            _sshfs(tb, node, real, mnt)
            mounts.append(mnt)
        (mounts[0] / "store").mkdir()  # the admin's mkdir, seen through every mount
        clusters = [make_remote(tb, nodes=["node01"], storage=str(m / "store")) for m in mounts]
        clusters[0].ok("status")
        for _ in range(4):
            procs = [
                subprocess.Popen(
                    [sys.executable, "-m", "gpuclaim", "claim", "-n", "1", "--json"],
                    env=c.env(user=f"u{i}"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for i, c in enumerate(clusters + clusters[:3])  # 6 claimers, 3 mounts
            ]
            won = []
            for p in procs:
                out, err = p.communicate(timeout=120)
                assert p.returncode in (0, 3), err
                if p.returncode == 0:
                    won.append(json.loads(out))
            uuids = [u for w in won for u in w["gpu_uuids"]]
            assert len(uuids) == len(set(uuids)), "two holders of one GPU through sshfs"
            assert len(won) == 4
            on_server = {
                json.loads(f.read_text())["id"] for f in (real / "store" / "gpus").iterdir()
            }
            assert on_server == {w["id"] for w in won}
            clusters[0].ok("release", "--force", *[w["id"] for w in won])
    finally:
        for mnt in mounts:
            subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True)
