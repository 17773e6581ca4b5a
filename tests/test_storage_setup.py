"""Where the store is, and that a team never splits into two claim pools by accident.

Only ``init`` (and the demo, and the no-config default of a single machine) makes a store's
directory; every other command refuses a path that does not exist, makes a store only inside
an existing directory that is empty or a store already, and ``doctor`` checks that every
node sees the same store (by the id stamped in it) at the configured path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from testbed_fixtures import wrap_sshd


def _point_at(c, path: Path) -> None:
    text = c.config_path.read_text().replace(f'"{c.storage}"', f'"{path}"')
    c.config_path.write_text(text)
    c.storage = path


def _one_line(proc, code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_typo_in_storage_is_refused_and_creates_nothing(make_cluster, tmp_path):
    c = make_cluster({"node01": 2}, fast=True)
    typo = tmp_path / "srv" / "gpuclaim-typo"
    typo.parent.mkdir()
    _point_at(c, typo)
    for args in (["status"], ["claim", "-n", "1"], ["run", "--", "true"], ["doctor"]):
        line = _one_line(c.cli(*args), 1, f"storage {typo} does not exist")
        assert "typo" in line and f"mkdir -p {typo}" in line, line
    assert not typo.exists(), "a command made a private store out of a typo"
    assert list(typo.parent.iterdir()) == []


def test_a_store_is_made_only_in_an_empty_directory_and_stamped(make_cluster, tmp_path):
    c = make_cluster({"node01": 2}, fast=True)
    empty = tmp_path / "made-by-admin"
    empty.mkdir()
    _point_at(c, empty)
    c.ok("status")
    store_id = (empty / "ID").read_text().strip()
    assert len(store_id) == 24
    assert (empty / "VERSION").exists() and (empty / "gpus").is_dir()
    c.ok("claim", "-n", "1")
    assert (empty / "ID").read_text().strip() == store_id  # made once, never again
    # a directory that holds other things is not taken over
    busy = tmp_path / "home-of-someone"
    busy.mkdir()
    (busy / "thesis.tex").write_text("...")
    _point_at(c, busy)
    _one_line(c.cli("status"), 1, f"storage {busy} is not a gpuclaim store", "thesis.tex")
    assert sorted(p.name for p in busy.iterdir()) == ["thesis.tex"]


def test_a_remote_cluster_without_storage_is_a_config_error(make_cluster):
    c = make_cluster({"node01": 1}, fast=True)
    text = c.config_path.read_text()
    lines = [line for line in text.splitlines() if not line.startswith("storage")]
    lines = [line.replace('transport = "local"', 'transport = "ssh"') for line in lines]
    c.config_path.write_text("\n".join(lines) + "\n")
    _one_line(c.cli("status"), 1, "no 'storage' for a cluster with remote nodes (node01)")


def test_no_config_at_all_one_machine_keeps_working(tmp_path):
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUCLAIM_", "XDG_"))},
        "HOME": str(home),
        "GPUCLAIM_HOME": str(home / ".gpuclaim"),
        "GPUCLAIM_USER": "solo",
    }
    env.pop("GPUCLAIM_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "gpuclaim", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    stores = list(home.rglob("ID"))
    assert len(stores) == 1, "the default local store was not made"
    assert stat.S_IMODE(stores[0].parent.stat().st_mode) & 0o2070 == 0o2070


def test_init_makes_the_store_and_needs_storage_for_remote_nodes(make_cluster, tmp_path):
    c = make_cluster({"node01": 1}, fast=True)
    cfg = tmp_path / "new.toml"
    proc = c.cli("--config", str(cfg), "init", "--nodes", "node01,node02")
    _one_line(proc, 2, "--storage is needed with remote nodes", "ssh://node01/srv/gpuclaim")
    assert not cfg.exists()
    shared = tmp_path / "nfs" / "gpuclaim"
    proc = c.cli("--config", str(cfg), "init", "--nodes", "node01,node02", "--storage", str(shared))
    assert proc.returncode == 0, proc.stderr
    assert f"the store {shared}" in proc.stdout and "on every node" in proc.stdout
    assert stat.S_IMODE(shared.stat().st_mode) == 0o2775
    assert (shared / "ID").exists() and (shared / "VERSION").exists()


@pytest.fixture
def split_testbed(make_testbed, monkeypatch, tmp_path):
    """Three sshd nodes; node02 runs in a mount namespace of its own in which the store's path
    holds another directory: as a node that did not mount the lab's NFS share."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("a node with its own mounts needs root and unshare", pytrace=False)
    shared = tmp_path / "shared-store"
    shared.mkdir()
    own = tmp_path / "node02-disk"
    own.mkdir()
    # node02's sshd in a mount namespace where the store's path is a directory of its own
    remount = (
        "unshare --mount --propagation private"
        ' sh -c \'mount --bind "$0" "$1" && shift && exec "$@"\''
    )
    wrap_sshd(monkeypatch, tmp_path / "bin", {"node02": f"{remount} {own} {shared}"})
    tb = make_testbed(3, 2)
    (shared / "probe").write_text("x")
    assert tb.ssh("node01", f"ls {shared}").stdout.split() == ["probe"]
    assert tb.ssh("node02", f"ls {shared}").stdout.split() == []
    (shared / "probe").unlink()
    return tb, shared, own


def test_doctor_finds_the_node_that_sees_another_store(split_testbed, make_remote):
    tb, shared, own = split_testbed
    c = make_remote(tb, storage=str(shared))
    c.ok("status")  # makes the store and stamps its id
    # node02 has an empty directory at the path: no store there, and doctor makes none
    report = {h["node"]: h for h in c.json("doctor", expect=1)}
    assert report["node01"]["storage"] == "ok" and report["node03"]["storage"] == "ok"
    assert "holds no gpuclaim store" in report["node02"]["storage"], report["node02"]
    assert list(own.iterdir()) == []
    # someone ran gpuclaim there once and made a store of its own at that path
    subprocess.run(["cp", "-a", f"{shared}/.", str(own)], check=True)
    (own / "ID").write_text("0123456789abcdef01234567\n")
    report = {h["node"]: h for h in c.json("doctor", expect=1)}
    assert report["node01"]["storage"] == "ok"
    problem = report["node02"]["storage"]
    assert "another store" in problem and "0123456789abcdef01234567" in problem, problem
    text = c.cli("doctor").stdout
    assert "two claim pools that never see each other" in text
    assert json.loads(c.cli("status", "--json").stdout)  # the laptop's store still answers


def test_the_demo_runs_its_tour_as_you_in_a_store_of_its_own(tmp_path):
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUCLAIM_")},
        "GPUCLAIM_HOME": str(home),
        "GPUCLAIM_USER": "newcomer",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "gpuclaim", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Released demo02 GPU 0,1" in proc.stdout
    assert " newcomer " in proc.stdout and " you " not in proc.stdout  # the tour's claims
    config = home / "demo" / "config.toml"
    assert f"export GPUCLAIM_CONFIG={config}" in proc.stdout
    assert (home / "demo" / "store" / "ID").exists()
    status = subprocess.run(
        [sys.executable, "-m", "gpuclaim", "status", "--json"],
        env={**env, "GPUCLAIM_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert {r["state"] for r in json.loads(status.stdout)} == {"free", "busy-unclaimed"}


def test_a_gang_runs_on_the_demos_two_local_nodes(tmp_path):
    """The demo's nodes are one machine with one tmux server: each rank needs a session
    name of its own (it once failed: 'a tmux session gc-USER-NAME is already running')."""
    home = tmp_path / "home"
    tmux_dir = tmp_path / "tmux"  # this test's own tmux server, ended below by its socket
    tmux_dir.mkdir(mode=0o700)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUCLAIM_", "TMUX"))},
        "GPUCLAIM_HOME": str(home),
        "GPUCLAIM_USER": "newcomer",
        "TMUX_TMPDIR": str(tmux_dir),
    }
    demo = subprocess.run(
        [sys.executable, "-m", "gpuclaim", "demo"], env=env, capture_output=True, timeout=120
    )
    assert demo.returncode == 0, demo.stderr
    env["GPUCLAIM_CONFIG"] = str(home / "demo" / "config.toml")
    try:
        job = ["sh", "-c", 'echo "rank $NODE_RANK of $WORLD_SIZE"; sleep 1']
        run = ["run", "--nodes", "2", "-n", "1", "--name", "pair", "--follow", "--", *job]
        proc = subprocess.run(
            [sys.executable, "-m", "gpuclaim", *run],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "rank 0 of 2" in proc.stdout, proc.stdout  # --follow follows rank 0
        rank1 = subprocess.run(
            [sys.executable, "-m", "gpuclaim", "logs", "pair", "--rank", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "rank 1 of 2" in rank1.stdout, rank1.stderr
        jobs = subprocess.run(
            [sys.executable, "-m", "gpuclaim", "jobs", "--all", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        (record,) = json.loads(jobs.stdout)
        assert record["state"] == "succeeded"
        assert sorted(r["node"] for r in record["ranks"]) == ["demo01", "demo02"]
    finally:
        for socket in tmux_dir.glob("tmux-*/*"):
            subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True)
