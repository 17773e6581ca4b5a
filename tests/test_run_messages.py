"""What `run`, `logs -f` and `attach` tell a new user in the first hour, through the CLI on
real sshd nodes and real tmux: a name already in use, a missing or relative workdir, a job
that dies at once, the job's exit code for scripts, and the ssh config `attach` uses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_cli_conventions import one_line_error
from test_jobs import _job, _wait_state


@pytest.fixture
def c(make_testbed, make_remote):
    """One sshd node (node01) of two GPUs: enough for these, and quick to start."""
    return make_remote(make_testbed(1, 2), kill_grace="2s", heartbeat="1s")


# -- a name in use is not "nothing free" --------------------------------------------------------


def test_a_name_in_use_has_its_own_exit_code_and_3_stays_nothing_free(c):
    c.ok("run", "--name", "dup", "--", "sleep", "60")
    for extra in ([], ["--queue"]):
        proc = c.cli("run", *extra, "--name", "dup", "--", "true")
        one_line_error(proc, 5, "you already have a job named 'dup'", "pick another --name")
    # the other job of that name is untouched, and 3 still means exactly "nothing free"
    assert _job(c, "dup")["state"] == "running"
    c.ok("run", "--name", "second", "--", "sleep", "60")  # both GPUs of node01 are taken
    one_line_error(c.cli("run", "--name", "third", "--", "true"), 3)
    c.ok("kill", "dup")
    c.ok("kill", "second")
    c.ok("run", "--name", "dup", "--", "true")  # an ended job's name is free again


# -- --workdir ----------------------------------------------------------------------------------


def _run_in(c, cwd, *args):
    """``gpuclaim ARGS`` typed in the directory ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "gpuclaim", *args],
        cwd=cwd,
        env=c.env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


PRINT_CWD = "import os; print(os.getcwd())"


def test_a_missing_workdir_is_named_with_its_node(c, tmp_path):
    missing = tmp_path / "no" / "such dir"
    c.cli("run", "--name", "nowhere", "-C", str(missing), "--", "python3", "-c", PRINT_CWD)
    job = _wait_state(c, "nowhere", {"failed"})
    said = f"workdir {missing} does not exist on node01"
    assert job["reason"] == said, job
    assert c.ok("logs", "nowhere").strip().splitlines() == [f"gpuclaim: {said}"]
    afile = tmp_path / "afile"
    afile.write_text("")
    c.cli("run", "--name", "notadir", "-C", str(afile), "--", "true")
    assert _wait_state(c, "notadir", {"failed"})["reason"] == (
        f"workdir {afile} is not a directory on node01"
    )


def test_a_relative_workdir_is_the_directory_run_was_typed_in(c, tmp_path):
    here = tmp_path / "proj"
    (here / "sub").mkdir(parents=True)
    for name, cwd, workdir, expect in (
        ("dot", here, ".", here),
        ("rel", tmp_path, "proj/sub/..", here),
        ("sub", here, "sub", here / "sub"),
    ):
        proc = _run_in(
            c, cwd, "run", "--name", name, "-C", workdir, "--json", "--", "python3", "-c", PRINT_CWD
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["workdir"] == str(expect)  # absolute, from the laptop
        _wait_state(c, name, {"succeeded"})
        assert c.ok("logs", name).strip() == str(expect)
    # '~' is the node's home, as in ssh: left for the node to expand
    node_home = c.testbed.node_dir("node01") / "home"
    (node_home / "work").mkdir()
    c.ok("run", "--name", "tilde", "-C", "~/work", "--", "python3", "-c", PRINT_CWD)
    _wait_state(c, "tilde", {"succeeded"})
    assert c.ok("logs", "tilde").strip() == str(node_home / "work")
