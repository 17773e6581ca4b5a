"""Two real users of one group share a store under ``umask 077``, through the real CLI.

A lab's tool broke exactly here once (a ``drwx--S---`` directory made under a strict umask
locked the rest of the group out), so this is proven with real users, not reasoned about:
every directory and file the store, the job records and the Slack cursors can create comes
out group-shared (dirs 2775, files 0664) whatever the umask, and a file another user made
unreadable is still a held GPU, never taken for damage.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SimCluster, gpu
from test_slack import FakeSlack

GROUP = "gcshare"
# One pytest worker runs every test that makes or uses this machine's real accounts
# (useradd locks /etc/passwd; these tests end every process of their accounts).
pytestmark = pytest.mark.xdist_group("real-accounts")
USERS = ("gcann", "gcben")
REPO = Path(__file__).resolve().parent.parent


def _ensure_accounts() -> None:
    if os.geteuid() != 0:
        pytest.fail("two real users are needed: run the suite as root (CI does)", pytrace=False)
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-M", "-N", "-g", GROUP, "-s", "/bin/sh", name], check=True)


def _interpreter_for_others() -> tuple[str, dict[str, str]]:
    """An interpreter the other users can run, with the project importable. The venv's own
    python may live under a home they cannot enter (pyenv under /root): then the system
    python3 of the same version, given the venv's site-packages."""
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{site}"}
    probe = "import gpuclaim.entry.main, paramiko, textual"
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            proc = subprocess.run(
                [candidate, "-c", f"import sys; {probe}; print(sys.version_info[:2])"],
                env={**os.environ, **env},
                user=USERS[0],
                group=GROUP,
                capture_output=True,
                text=True,
                cwd="/",
            )
        except OSError:
            continue  # not theirs to run
        if proc.returncode == 0 and proc.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate, env
    pytest.fail(
        f"no python{sys.version_info[0]}.{sys.version_info[1]} that user {USERS[0]} may run "
        f"imports this checkout ({REPO}): put the checkout where other users can read it",
        pytrace=False,
    )


class GroupCluster(SimCluster):
    """A SimCluster whose CLI runs as one of two real users of one group, under umask 077."""

    python: str = sys.executable
    python_env: dict[str, str] = {}  # noqa: RUF012

    def env(self, user: str = "gcann", **extra: str) -> dict[str, str]:
        home = self.root / "homes" / user
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "GPUCLAIM_HOME": str(home / ".gpuclaim-home"),
            "GPUCLAIM_CONFIG": str(self.config_path),
            "NO_COLOR": "1",
            **self.python_env,
        }
        env.update(extra)
        return env

    def cli(
        self, *args: str, user: str = "gcann", timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, "-m", "gpuclaim", *args],
            env=self.env(user, **env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            user=user,
            group=GROUP,
            extra_groups=[GROUP],
            umask=0o077,
            cwd=str(self.root / "homes" / user),
        )

    def ok(self, *args: str, user: str = "gcann") -> str:
        proc = self.cli(*args, user=user)
        assert proc.returncode == 0, (args, user, proc.stdout, proc.stderr)
        return proc.stdout

    def json(self, *args: str, user: str = "gcann", expect: int = 0) -> Any:
        proc = self.cli(*args, "--json", user=user)
        assert proc.returncode == expect, (args, user, proc.stdout, proc.stderr)
        return json.loads(proc.stdout)


@pytest.fixture
def group_cluster() -> Iterator[GroupCluster]:
    _ensure_accounts()
    python, python_env = _interpreter_for_others()
    base = Path(tempfile.mkdtemp(prefix="gpuclaim-group-"))
    base.chmod(0o755)
    gid = grp.getgrnam(GROUP).gr_gid
    slack = FakeSlack()
    try:
        cluster = GroupCluster(base / "c", {"node01": [gpu(), gpu(), gpu()]}, {}, True)
        cluster.python, cluster.python_env = python, python_env
        for path in (base / "c", *(p for p in (base / "c").iterdir())):
            path.chmod(path.stat().st_mode | 0o755 if path.is_dir() else 0o644)
        # the store's directory, as an admin makes it: mkdir (SimCluster did), the group, 2775
        os.chown(cluster.storage, 0, gid)
        cluster.storage.chmod(0o2775)
        for name in USERS:
            home = cluster.root / "homes" / name
            home.mkdir(parents=True)
            os.chown(home, pwd.getpwnam(name).pw_uid, gid)
            home.chmod(0o700)
        text = cluster.config_path.read_text()
        cluster.config_path.write_text(
            text + f'webhook_url = "{slack.url}"\nevents = ["claim", "job_ended"]\n'
        )
        cluster.config_path.chmod(0o644)
        yield cluster
    finally:
        slack.close()
        for name in USERS:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _wait_job(c: GroupCluster, name: str, user: str, states: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        job = next(j for j in c.json("jobs", "--all", user=user) if j["name"] == name)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.3)


def _not_group_shared(root: Path) -> list[str]:
    """Every path not group-shared, except an account's own directory (``owners/<uid>``):
    that one must be its account's alone (0755, files 0644), or it proves nothing."""
    wrong = []
    for own in (root / "owners").glob("*"):
        uid = int(own.name)
        for path in (own, *own.iterdir()):
            st = path.stat()
            if st.st_uid != uid or st.st_mode & 0o022:
                wrong.append(f"{stat.filemode(st.st_mode)} uid {st.st_uid} {path}")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d).parent != root / "owners"]
        for d in dirnames:
            mode = os.stat(os.path.join(dirpath, d)).st_mode
            if mode & 0o2070 != 0o2070:
                wrong.append(f"{stat.filemode(mode)} {os.path.join(dirpath, d)}")
        for f in filenames:
            mode = os.stat(os.path.join(dirpath, f)).st_mode
            if mode & 0o060 != 0o060:
                wrong.append(f"{stat.filemode(mode)} {os.path.join(dirpath, f)}")
    return wrong


def test_two_users_of_one_group_share_every_path_under_umask_077(group_cluster):
    c = group_cluster
    ann, ben = USERS
    # ann, under umask 077, makes every kind of file the store has: claims, events, a job
    # (record, heartbeat), a queued job, usage samples, notices and Slack cursors, a drain.
    mine = c.json("claim", "-n", "1", "--note", "ann's", user=ann)
    c.ok("run", "--name", "annjob", "--", "true", user=ann)
    _wait_job(c, "annjob", ann, {"succeeded"})
    c.ok("run", "-n", "3", "--queue", "--name", "annq", "--", "true", user=ann)
    c.ok("status", user=ann)
    c.ok("release", mine["id"], user=ann)  # frees what the queued job waits for
    _wait_job(c, "annq", ann, {"succeeded"})
    c.ok("drain", "node01", "--reason", "maintenance", user=ann)

    wrong = _not_group_shared(c.storage)
    assert not wrong, "\n".join(wrong)
    assert {p.name for p in c.storage.iterdir()} >= {"gpus", "events", "jobs", "notify", "queue"}
    assert any((c.storage / "notify").glob("cursor-*.json")), "no Slack cursor was written"
    assert any((c.storage / "usage").iterdir()), "no usage sample was written"

    # ben, of the same group, can do everything with what ann made.
    c.ok("undrain", "node01", user=ben)
    theirs = c.json("claim", "-n", "2", "--note", "ben's", user=ben)
    assert len(theirs["gpus"]) == 2
    rows = c.json("status", user=ben)
    assert {r["claim"]["user"] for r in rows if r["claim"]} == {ben}
    c.ok("run", "--name", "benjob", "--", "true", user=ben)
    _wait_job(c, "benjob", ben, {"succeeded"})
    c.ok("release", "--all", user=ben)
    c.ok("gc", user=ben)
    history = c.ok("history", user=ben)
    assert ann in history and ben in history
    jobs = {j["name"]: j["state"] for j in c.json("jobs", "--all", user=ben)}
    assert jobs == {"annjob": "succeeded", "annq": "succeeded", "benjob": "succeeded"}
    wrong = _not_group_shared(c.storage)
    assert not wrong, "\n".join(wrong)


def test_a_claim_file_another_user_made_unreadable_is_still_held(group_cluster):
    c = group_cluster
    ann, ben = USERS
    claim = c.json("claim", "--gpu", "node01:1", user=ann)
    (path,) = (c.storage / "gpus").glob("*.claim")
    path.chmod(0o600)  # as an older gpuclaim under umask 077 would have left it
    row = next(r for r in c.json("status", user=ben) if r["index"] == 1)
    assert row["state"] == "claimed", row
    assert "unreadable" in row["reason"] and "Permission denied" in row["reason"], row
    c.ok("gc", user=ben)
    assert path.exists(), "gc took another user's unreadable claim for a damaged one"
    taken = c.cli("claim", "--gpu", "node01:1", user=ben)
    assert taken.returncode == 3, (taken.stdout, taken.stderr)
    assert c.json("claim", "-n", "1", user=ben)["gpus"] != [1]
    path.chmod(0o664)
    c.ok("release", claim["id"], user=ann)
