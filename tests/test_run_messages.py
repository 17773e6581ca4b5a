"""What `run`, `logs -f` and `attach` tell a new user in the first hour, through the CLI on
real sshd nodes and real tmux: a name already in use, a missing or relative workdir, a job
that dies at once, the job's exit code for scripts, and the ssh config `attach` uses."""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli_conventions import one_line_error
from test_jobs import _job, _kill_where, _screen_of, _wait_state


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


# -- a job that dies at once is not "Started" ---------------------------------------------------


def test_a_job_that_dies_at_once_is_reported_with_its_code_and_log_not_started(c, tmp_path):
    script = tmp_path / "trian.py"  # a typo: train.py is what exists
    proc = c.cli("run", "--name", "typo", "--", "python3", str(script))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Started" not in proc.stdout and "Traceback" not in proc.stderr
    head, *log = proc.stderr.splitlines()
    assert head == (
        "gpuclaim: error: job typo failed at once on node01 (exit code 2); the end of its log:"
    )
    assert len(log) == 1 and log[0].startswith("  python3: can't open file"), log
    assert str(script) in log[0]
    # a command that is not there, with --json: the job on stdout, the one line on stderr
    proc = c.cli("run", "--json", "--name", "nocmd", "--", "no-such-command", "x")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["state"] == "failed"
    assert json.loads(proc.stdout)["exit_code"] == 127
    assert proc.stderr.splitlines() == [
        "gpuclaim: error: job nocmd failed at once on node01 (exit code 127): cannot start "
        "'no-such-command' on node01: No such file or directory (not on the PATH there)"
    ]
    # a missing workdir: one line that names it and its node, even with -q
    missing = tmp_path / "nope"
    proc = c.cli("run", "-q", "--name", "nowhere", "-C", str(missing), "--", "python3", "x.py")
    one_line_error(
        proc,
        1,
        f"job nowhere could not start: workdir {missing} does not exist on node01",
    )
    assert proc.stdout == ""
    # the GPUs are free again, and a healthy job is still "Started", seen running
    assert all(r["state"] == "free" for r in c.status())
    job = c.json("run", "--name", "healthy", "--", "sleep", "30")
    assert job["state"] == "running", job
    started = c.cli("run", "--name", "healthy2", "--", "sleep", "30")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("Started healthy2 on node01 GPU ")
    assert "(running)" in started.stdout
    c.ok("kill", "healthy")
    c.ok("kill", "healthy2")
    # one that is done at once says so, exit 0
    done = c.cli("run", "--name", "quick", "--", "true")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith("Ran quick on node01 GPU ") and "succeeded at once" in done.stdout


# -- run --follow and logs -f: the job's exit code, and one line of how it ended ---------------

ENDED = re.compile(r"^gpuclaim: job (\S+) (.*) after (\d+s|\d+m)$")


def _last_line(proc):
    line = proc.stderr.splitlines()[-1]
    assert ENDED.match(line), proc.stderr
    return line


def test_run_follow_and_logs_f_exit_with_the_jobs_own_code(c):
    script = "echo one; sleep 1; echo two >&2; exit 3"
    proc = c.cli("run", "--follow", "--name", "three", "--", "sh", "-c", script)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "one\ntwo\n"  # stdout is the job's output alone
    assert proc.stderr.startswith("Started three on node01 GPU ")  # gpuclaim's own: stderr
    assert _last_line(proc).startswith("gpuclaim: job three failed (exit code 3) after ")
    # logs -f of the ended job: the same code and line
    again = c.cli("logs", "three", "-f")
    assert (again.returncode, again.stdout) == (3, "one\ntwo\n")
    assert _last_line(again).startswith("gpuclaim: job three failed (exit code 3) after ")
    assert c.cli("logs", "three").returncode == 0  # without -f it only shows the log
    fine = c.cli("run", "-f", "--name", "fine", "--", "sh", "-c", "sleep 1; echo fine")
    assert (fine.returncode, fine.stdout) == (0, "fine\n"), fine.stderr
    assert _last_line(fine).startswith("gpuclaim: job fine succeeded after ")
    # one that never ran: its reason, exit 1
    nowhere = c.cli("run", "-f", "--name", "nowhere", "-C", "/no/such", "--", "true")
    assert nowhere.returncode == 1
    assert _last_line(nowhere) == (
        "gpuclaim: job nowhere failed (workdir /no/such does not exist on node01; exit code 1) "
        "after 0s"
    )
    one_line_error(c.cli("run", "-f", "--json", "--", "true"), 2, "--follow")


def test_a_killed_timed_out_or_lost_job_gives_its_documented_code(c, tmp_path):
    go = tmp_path / "go"
    # the job says "one", then "two" once told to: a follower shows "one" from its first read
    # of the log (or later), "two" only from its follow loop, where the Ctrl-C is to land
    wait_go = f"while [ ! -e {go} ]; do sleep 0.1; done"
    c.ok(
        "run",
        "--name",
        "victim",
        "--",
        "sh",
        "-c",
        f"echo one; {wait_go}; echo two; exec sleep 300",
    )
    follower = _follow_in_background(c, "victim")
    watcher = _follow_in_background(c, "victim")
    for each in (follower, watcher):
        _wait_printed(each, "one")
    go.touch()
    for each in (follower, watcher):
        _wait_printed(each, "two")
    watcher.send_signal(signal.SIGINT)  # Ctrl-C stops following, not the job
    said = _ended(watcher, 60)  # what it says, not how fast (a loaded CI: >30 s)
    assert watcher.returncode == 130, said
    assert said.strip().splitlines()[-1] == (
        "gpuclaim: stopped following; job victim goes on (gpuclaim kill victim stops it)"
    )
    assert _job(c, "victim")["state"] == "running"
    c.ok("kill", "victim")
    said = _ended(follower, 30)
    assert follower.returncode == 143, said  # 128 + SIGTERM, as a shell says it
    assert said.splitlines()[-1].startswith("gpuclaim: job victim was killed (exit code 143)")

    late = c.cli("run", "-f", "--time", "2s", "--name", "late", "--", "sleep", "60")
    assert late.returncode == 124, late.stderr  # as timeout(1)
    assert _last_line(late).startswith(
        "gpuclaim: job late reached its time limit of 2s (exit code 124) after "
    )

    job = c.json("run", "--name", "gone", "--", "sh", "-c", "echo one; exec sleep 300")
    follower = _follow_in_background(c, "gone")
    _wait_printed(follower, "one")  # it has read the log: it follows
    # the node "reboots": wrapper, job and tmux server vanish at once; nobody else looks
    assert _kill_where({}, job["id"].encode()) >= 1
    assert _kill_where({"GPUCLAIM_JOB_ID": job["id"]}, b"sleep") == 1
    c.testbed.ssh("node01", "tmux kill-server")
    t0 = time.monotonic()
    said = _ended(follower, 60)
    assert follower.returncode == 255, said
    assert "was lost: its node, tmux or wrapper went away (exit code 255)" in said
    assert time.monotonic() - t0 < 15  # three missed heartbeats of 1 s, and a look every 5 s


def _follow_in_background(c, name):
    return subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", "logs", name, "-f"],
        env={**c.env(), "PYTHONFAULTHANDLER": "1"},  # SIGABRT: where each thread is
        # as at a terminal: Ctrl-C reaches it. A suite started in the background (`.ci/run &`)
        # passes SIGINT down ignored, and Python keeps it so: the follower never saw it.
        preexec_fn=_default_sigint,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ended(proc, timeout: float) -> str:
    """``proc``'s stderr once it ended; one that hangs is aborted, and the test fails with
    where each of its threads was (Python's faulthandler prints them)."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        stuck = proc.communicate(timeout=10)[1]
        raise AssertionError(f"still running after {timeout:g}s:\n{stuck[-6000:]}") from None


def _wait_printed(follower, text: str, timeout: float = 20.0) -> None:
    """Until ``follower`` has printed ``text`` on its stdout (read raw: what comes after
    is left to its communicate())."""
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"logs -f never printed {text!r}, only {seen!r}"
        if select.select([follower.stdout], [], [], min(left, 0.2))[0]:
            chunk = os.read(follower.stdout.fileno(), 4096)
            assert chunk, f"logs -f ended before it printed {text!r}: {follower.stderr.read()}"
            seen += chunk
