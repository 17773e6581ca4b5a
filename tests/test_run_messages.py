"""What `run`, `logs -f` and `attach` tell a new user in the first hour, through the CLI on
real sshd nodes and real tmux: a name already in use, a missing or relative workdir, a job
that dies at once, the job's exit code for scripts, and the ssh config `attach` uses."""

from __future__ import annotations

import pytest
from test_cli_conventions import one_line_error
from test_jobs import _job


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
