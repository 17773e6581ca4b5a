"""What `run`, `logs -f` and `attach` tell a new user in the first hour, through the CLI on
real sshd nodes and real tmux: a name already in use, a missing or relative workdir, a job
that dies at once, the job's exit code for scripts, and the ssh config `attach` uses."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_conventions import one_line_error
from test_jobs import _job, _screen_of, _wait_state


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


# -- attach reads the ssh config the other commands read ----------------------------------------

TICK = "while true; do echo tick-from-job; sleep 0.3; done"


def test_attach_uses_the_ssh_config_of_the_other_commands_and_prints_it(c, tmp_path):
    # No ssh_config in gpuclaim's config, and a $HOME that is not the passwd home: the node
    # aliases are only in $HOME/.ssh/config, which every other command reads.
    home = tmp_path / "laptop-home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copyfile(c.testbed.ssh_config, home / ".ssh" / "config")
    lines = c.config_path.read_text().splitlines(keepends=True)
    c.config_path.write_text("".join(x for x in lines if not x.startswith("ssh_config")))
    assert Path(pwd.getpwuid(os.getuid()).pw_dir).resolve() != home.resolve()
    env = c.env(HOME=str(home))
    proc = c.cli("run", "--name", "watched", "--", "sh", "-c", TICK, HOME=str(home))
    assert proc.returncode == 0, proc.stderr
    _wait_state(c, "watched", {"running"})
    screen = _screen_of(env, [sys.executable, "-m", "gpuclaim", "attach", "watched"])
    assert "tick-from-job" in screen, screen

    proc = c.cli("attach", "watched", "--print", HOME=str(home))
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.strip()
    remote = "tmux attach-session -t =gc-alice-watched"
    ssh = shutil.which("ssh") or "ssh"
    config = home / ".ssh" / "config"
    assert shlex.split(printed) == [ssh, "-t", "-F", str(config), "node01", remote], printed
    assert printed.count("\n") == 0 and shlex.quote(remote) in printed
    # and that exact line, typed in a terminal, attaches too
    assert "tick-from-job" in _screen_of(env, ["sh", "-c", printed])
    c.cli("kill", "watched", HOME=str(home))


def test_attach_print_with_the_configs_own_ssh_config_and_bad_input(c):
    c.ok("run", "--name", "watched", "--", "sh", "-c", TICK)
    _wait_state(c, "watched", {"running"})
    printed = shlex.split(c.ok("attach", "watched", "--print"))
    assert printed[1:4] == ["-t", "-F", str(c.testbed.ssh_config)], printed
    one_line_error(c.cli("attach", "watched", "--rank", "3"), 2, "job watched has 1 rank")
    one_line_error(c.cli("attach", "nosuch", "--print"), 1, "no job 'nosuch' of alice")
    c.ok("kill", "watched")
    one_line_error(c.cli("attach", "watched", "--print"), 1, "nothing to attach to")
