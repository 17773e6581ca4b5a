"""[workenv] A project's own run defaults (gpuclaim.toml, or [tool.gpuclaim] in pyproject.toml),
through the CLI on the sshd testbed: `gpuclaim run -- python train.py` is the whole command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

TRAIN = (
    "import json, os, sys\n"
    "found = sorted(os.path.relpath(os.path.join(d, f), '..') for d, _, fs in os.walk('..') "
    "for f in fs)\n"
    "print(json.dumps({'cwd': os.getcwd(), 'python': sys.prefix, 'files': found,\n"
    "                  'mode': os.environ.get('MODE')}))\n"
)


def _job(c, name):
    return next(r for r in c.json("jobs", "--all") if r["name"] == name)


def _done(c, name, timeout=40.0):
    deadline = time.monotonic() + timeout
    while _job(c, name)["state"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, name
        time.sleep(0.3)
    job = _job(c, name)
    log = c.ok("logs", name, "-n", "0")
    assert job["state"] == "succeeded", (job, log)
    return job, json.loads(log.strip().splitlines()[-1])


@pytest.fixture
def c(testbed, make_remote):
    return make_remote(testbed, kill_grace="2s", heartbeat="1s")


def _project(root: Path, defaults: str) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "train.py").write_text(TRAIN)
    (root / "run.log").write_text("a log")
    (root / "wandb").mkdir()
    (root / "wandb" / "events").write_text("x")
    (root / "gpuclaim.toml").write_text(defaults)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    (root / ".gitignore").write_text(".venv/\n")
    return root


DEFAULTS = """\
gpus = 2
time = "30m"
venv = "~/venvs/proj"
sync = true
sync_exclude = ["*.log", "wandb/"]
env = { MODE = "offline" }
"""


def test_the_project_file_makes_run_the_whole_command(c, tmp_path):
    project = _project(tmp_path / "proj", DEFAULTS)
    venv = c.testbed.node_dir("node01") / "home" / "venvs" / "proj"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = c.cli(
        "run", "--node", "node01", "--name", "t", "--", "python", "train.py", cwd=project / "src"
    )
    assert proc.returncode == 0, proc.stderr
    job, seen = _done(c, "t")
    assert len(job["gpus"]) == 2 and job["time_limit_s"] == 1800
    assert job["synced_from"] == str(project) and job["venv"] == "~/venvs/proj"
    assert seen["cwd"].endswith("/src") and seen["python"] == str(venv)  # the copy's src/
    assert seen["mode"] == "offline"
    # the project's directory was copied, less .gitignore and sync_exclude
    assert seen["files"] == [".gitignore", "gpuclaim.toml", "src/train.py"]
    # flags win: one GPU, no sync (then it runs where it was typed: the node has that path)
    proc = c.cli(
        "run",
        "--node",
        "node01",
        "--name",
        "u",
        "-n",
        "1",
        "--no-sync",
        "-e",
        "MODE=online",
        "--",
        "python",
        "train.py",
        cwd=project / "src",
    )
    assert proc.returncode == 0, proc.stderr
    job, seen = _done(c, "u")
    assert len(job["gpus"]) == 1 and job["synced_from"] is None
    assert seen["cwd"] == str(project / "src") and seen["mode"] == "online"


def test_tool_gpuclaim_in_pyproject(c, tmp_path):
    project = tmp_path / "pp"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.gpuclaim]\ntime = "45m"\n'
    )
    proc = c.cli("run", "--name", "p", "--json", "--", "true", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["time_limit_s"] == 2700


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("gpus = 0\n", "'gpus' must be a whole number >= 1"),
        ('time = "soon"\n', "'time': "),
        ('sync = "yes"\n', "'sync' must be true or false"),
        ('venv = "a"\nconda = "b"\n', "sets both venv and conda"),
        ("gpu = 2\n", "unknown key 'gpu'"),
        ('sync_max = "lots"\n', "'sync_max': not a size: 'lots' (use e.g. 500M, 4GiB"),
        ("sync_max = 0\n", "'sync_max' must be more than zero"),
        ("gpus = [\n", "project file"),
    ],
)
def test_a_broken_project_file_is_one_line_and_nothing_runs(c, tmp_path, text, said):
    (tmp_path / "gpuclaim.toml").write_text(text)
    proc = c.cli("run", "--", "true", cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert said in proc.stderr and str(tmp_path / "gpuclaim.toml") in proc.stderr
    assert c.json("jobs", "--all") == []
