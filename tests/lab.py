"""A lab with one Unix account per person: real accounts in one group, logging in to real sshd
nodes as themselves, one store directory the group shares, each running the CLI as
themselves (umask 022), with a laptop home of their own and no XDG_RUNTIME_DIR.

Needs root (CI runs the suite as root): the accounts are made once with useradd.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from testbed import Testbed

from gpuclaim.app.configfile import render_config

GROUP = "gclab"
ALICE, BOB = "gcalice", "gcbob"
ACCOUNTS = (ALICE, BOB)
REPO = Path(__file__).resolve().parent.parent


def ensure_accounts() -> None:
    if os.geteuid() != 0:
        pytest.fail("real accounts are needed: run the suite as root (CI does)", pytrace=False)
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
    for name in ACCOUNTS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-M", "-N", "-g", GROUP, "-s", "/bin/sh", name], check=True)
        # sshd (UsePAM no) refuses a locked account ("!" in shadow); "*": no password, not locked
        subprocess.run(["usermod", "-p", "*", name], check=True)


def interpreter_for_others() -> tuple[str, dict[str, str]]:
    """An interpreter the accounts can run, with the project importable: the venv's own, or
    (when it lives under a home they cannot enter) the system's of the same version."""
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{site}"}
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            proc = subprocess.run(
                [candidate, "-c", "import sys, gpuclaim.entry.main; print(sys.version_info[:2])"],
                env={**os.environ, **env},
                user=ALICE,
                group=GROUP,
                capture_output=True,
                text=True,
                cwd="/",
            )
        except OSError:
            continue
        if proc.returncode == 0 and proc.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate, env
    pytest.fail(
        f"no python{sys.version_info[0]}.{sys.version_info[1]} that {ALICE} may run imports "
        f"this checkout ({REPO}): put the checkout where other users can read it",
        pytrace=False,
    )


class Lab:
    """The lab's shared config and store over a testbed whose nodes know every account."""

    def __init__(self, root: Path, testbed: Testbed, extra_toml: str = "") -> None:
        self.root = root
        self.tb = testbed
        self.python, self.python_env = interpreter_for_others()
        gid = grp.getgrnam(GROUP).gr_gid
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        self.storage = root / "store"
        self.storage.mkdir()
        os.chown(self.storage, 0, gid)  # as an admin makes it: the group's, 2775
        self.storage.chmod(0o2775)
        self.project = root / "project"  # a group-shared project directory
        self.project.mkdir()
        os.chown(self.project, 0, gid)
        self.project.chmod(0o2775)
        self.config_path = root / "config.toml"
        text = render_config(
            cluster="lab",
            nodes=list(testbed.nodes),
            storage=str(self.storage),
            defaults={"connect_timeout": "3s", "deadline": "15s"},
        )
        self.config_path.write_text(text + extra_toml)
        self.config_path.chmod(0o644)
        for account in ACCOUNTS:
            home = self.laptop_home(account)
            home.mkdir(parents=True)
            entry = pwd.getpwnam(account)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            home.chmod(0o700)

    def laptop_home(self, account: str) -> Path:
        return self.root / "laptop" / account

    def uid(self, account: str) -> int:
        return pwd.getpwnam(account).pw_uid

    def env(self, account: str, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.laptop_home(account)),
            "GPUCLAIM_CONFIG": str(self.config_path),
            "NO_COLOR": "1",
            "LANG": "C.UTF-8",
            **self.tb.env(account=account),
            **self.python_env,
        }
        env.update(extra)
        return env

    def cli(
        self, account: str, *args: str, timeout: float = 60, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, "-m", "gpuclaim", *args],
            env=self.env(account),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            user=account,
            group=GROUP,
            extra_groups=[GROUP],
            umask=0o022,
            cwd=str(cwd or self.laptop_home(account)),
        )

    def ok(self, account: str, *args: str, cwd: Path | None = None) -> str:
        proc = self.cli(account, *args, cwd=cwd)
        assert proc.returncode == 0, (account, args, proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout

    def json(self, account: str, *args: str, expect: int = 0) -> Any:
        if "--" in args:
            cut = args.index("--")
            args = (*args[:cut], "--json", *args[cut:])
        else:
            args = (*args, "--json")
        proc = self.cli(account, *args)
        assert proc.returncode == expect, (account, args, proc.returncode, proc.stdout, proc.stderr)
        return json.loads(proc.stdout)

    def record(self, job_id: str) -> dict[str, Any]:
        """A job's record as the store holds it (read as root: no CLI in between)."""
        data: dict[str, Any] = json.loads((self.storage / "jobs" / f"{job_id}.json").read_text())
        return data

    def wait_record(
        self, job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self.record(job_id)
            except (OSError, ValueError):
                record = {}
            if record and done(record):
                return record
            assert time.monotonic() < deadline, record
            time.sleep(0.1)

    def processes_of(self, *accounts: str) -> list[int]:
        """The accounts' processes that belong to this lab (their environment names this
        testbed: laptop CLIs, agents, keepers, jobs), to end them by pid: other runs' and
        other people's processes of the same accounts are left alone."""
        uids = {self.uid(a) for a in accounts}
        marker = f"GPUCLAIM_TESTBED={self.tb.dir}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid not in uids:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if marker in fh.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return found
