"""[hardening-4] Two gpuclaim versions at once on a node: a lab upgrades one laptop at a time,
so two versions look at and run on the same node in turns. Neither's start or clean-up may
take the other's install files or its warm agent away: 20 looks and runs in turns, none
failed, both installs and both agents still there at the end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.ssh

ROOT = Path(__file__).resolve().parent.parent


def _version(env: dict[str, str], cwd: Path) -> str:
    code = "from gpuclaim.remote.bundle import agent_version; print(agent_version())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuclaim", *args],
        env=env,
        cwd=cwd,  # not the repository: its gpuclaim would come before PYTHONPATH's
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_two_versions_look_and_run_on_one_node_in_turns(
    make_testbed: Any, make_remote: Any, tmp_path: Path
) -> None:
    tb = make_testbed(1, gpus=2)
    c = make_remote(tb, kill_grace="2s", heartbeat="1s")
    # the other laptop's gpuclaim: this one with one node file changed (another bundle)
    other = tmp_path / "other"
    shutil.copytree(
        ROOT / "gpuclaim", other / "gpuclaim", ignore=shutil.ignore_patterns("__pycache__")
    )
    changed = other / "gpuclaim" / "node" / "server.py"
    changed.write_text(changed.read_text() + "\n# the other laptop's version\n")
    envs = [c.env(), {**c.env(), "PYTHONPATH": str(other)}]
    versions = [_version(env, c.home) for env in envs]
    assert versions[0] != versions[1], versions
    for turn in range(20):
        env = envs[turn % 2]
        look = _cli(env, c.home, "status", "--json")
        assert look.returncode == 0, (turn, look.stderr)
        assert len(json.loads(look.stdout)) == 2
        if turn % 4 < 2:  # and each version runs a job on it every other turn
            ran = _cli(env, c.home, "run", "--name", f"t{turn}", "--", "true")
            assert ran.returncode == 0, (turn, ran.stderr)
    jobs = [j for j in c.json("jobs", "--all") if j["name"].startswith("t")]
    assert len(jobs) == 10 and {j["state"] for j in jobs} == {"succeeded"}, jobs
    cache = tb.home_of("node01") / ".cache" / "gpuclaim"
    for version in versions:  # neither removed the other's install, nor stopped its agent
        assert list(cache.glob(f"agent-{version}*")), sorted(p.name for p in cache.iterdir())
        assert list(cache.glob(f"agent-{version}@*.where")), sorted(p.name for p in cache.iterdir())
