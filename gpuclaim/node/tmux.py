"""The one seam to tmux: every tmux command gpuclaim runs on a node is built here.

Sessions are always named with ``=NAME``, which matches exactly; a bare name would match any
session it is a prefix of."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Optional

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.paths import which


def tmux_binary() -> str:
    path = which("tmux")
    if path is None:
        raise GpuclaimError("tmux is not installed on this node (apt-get install tmux)")
    return path


def new_session(session: str, command: str, cwd: Path) -> None:
    """A detached session running ``command`` (a shell line) in a 200×50 window; a session
    of that name running already is ``SessionExistsError`` (one tmux call, no check first)."""
    argv = [tmux_binary(), "new-session", "-d", "-s", session, "-x", "200", "-y", "50", command]
    env = _client_environment()
    for attempt in range(3):
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=20, cwd=str(cwd), env=env
        )
        # The server was exiting (its last session, another job's, had just ended) as we
        # connected to it: the next try starts a new server.
        if proc.returncode == 0 or SERVER_GONE not in proc.stderr:
            break
        time.sleep(0.1 * (attempt + 1))
    if proc.returncode != 0:
        if DUPLICATE in proc.stderr:
            raise SessionExistsError(f"a tmux session {session} is already running on this node")
        raise GpuclaimError(f"tmux could not start {session}: {proc.stderr.strip()}")


class SessionExistsError(GpuclaimError):
    pass


def _client_environment() -> dict[str, str]:
    """This process's environment for the tmux client (what tmux copies into the session),
    without an ``SSH_AUTH_SOCK`` that is gone: the warm agent outlives the SSH connection it
    came in on, and a job handed a dead agent socket fails later and less clearly."""
    env = dict(os.environ)
    sock = env.get("SSH_AUTH_SOCK")
    if sock and not Path(sock).exists():
        del env["SSH_AUTH_SOCK"]
    return env


DUPLICATE = "duplicate session"
SERVER_GONE = "server exited unexpectedly"


def pane_pids(session: str) -> Optional[list[int]]:
    """The processes of the session's panes; None when there is no such session (or no tmux)."""
    tmux = which("tmux")
    if tmux is None:
        return None
    panes = subprocess.run(
        [tmux, "list-panes", "-s", "-t", f"={session}", "-F", "#{pane_pid}"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if panes.returncode != 0:
        return None
    return [int(p) for p in panes.stdout.split() if p.isdigit()]


def kill_session(session: str) -> None:
    tmux = which("tmux")
    if tmux is not None:
        subprocess.run([tmux, "kill-session", "-t", f"={session}"], capture_output=True, timeout=10)


def attach_argv(session: str) -> list[str]:
    """What attaches a terminal to the session (run on the node, through ``ssh -t`` or not)."""
    return ["tmux", "attach-session", "-t", f"={session}"]
