"""Node side of jobs, as agent ops: start a rank's tmux session (the wrapper inside takes it
from there, see ``wrapper``), stop one, read a job's log, and facts about this node.
Standard library only, Python 3.9."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.errors import GpuclaimError, NameInUseError
from gpuclaim.node.home import agent_entry, jobs_home
from gpuclaim.node.processes import signal_tree
from gpuclaim.node.tmux import (
    SessionExistsError,
    kill_session,
    new_session,
    pane_pids,
    tmux_binary,
)

if TYPE_CHECKING:
    from gpuclaim.core.protocol import (
        LaunchResponse,
        NodeFactsResponse,
        RankSpec,
        ReadLogResponse,
        WrapperSpec,
    )


def launch_rank(spec: RankSpec) -> LaunchResponse:
    """Start the tmux session of one rank; the wrapper inside takes it from there."""
    job = spec["job"]
    rank = int(spec["rank"])
    session = str(spec["session"])
    tmux_binary()  # no tmux: say so before writing anything
    job_dir = jobs_home() / str(job["id"]) / f"rank{rank}"
    ours = not job_dir.exists()  # a service started again keeps its log: never remove it
    job_dir.mkdir(parents=True, exist_ok=True)
    spec_path = job_dir / "spec.json"
    log_path = job_dir / "output.log"
    ranks = job.get("ranks") or []
    node = str(ranks[rank]["node"]) if rank < len(ranks) else socket.gethostname()
    run_dir, note = resolve_workdir(job, node)
    wrapper_spec: WrapperSpec = {**spec, "log": str(log_path), "run_dir": run_dir}
    # The spec carries the config, and with it the Slack webhook (a secret): owner only.
    fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(wrapper_spec))
    with open(log_path, "ab") as log:
        if note:
            log.write(f"gpuclaim: {note}\n".encode())  # what a follower sees first
    command = "exec " + " ".join(shlex.quote(a) for a in [*agent_entry(), "wrap", str(spec_path)])
    try:
        new_session(session, command, Path.home())
    except SessionExistsError as exc:
        if ours:  # this rank's own files (a gang shares a home)
            shutil.rmtree(job_dir, ignore_errors=True)
        raise NameInUseError(exc.message) from None
    host = socket.gethostname()
    return {
        "session": session,
        "log": str(log_path),
        "host": host,
        "workdir": run_dir,
        "note": note,
    }


def resolve_workdir(job: dict[str, Any], node: str) -> tuple[str, str]:
    """Where a job runs on this node, and a note when that is not where it was asked: the
    workdir asked (``--workdir``; the wrapper says so if it is missing), else the directory
    ``run`` was typed in when this node has it (a shared home), else the home here."""
    asked = (job.get("requested") or {}).get("workdir")
    if asked is None and "requested" not in job:
        asked = job.get("workdir")  # a job record from before "requested"
    if asked:
        return str(Path(str(asked)).expanduser()), ""
    home = str(Path.home())
    typed_in = job.get("cwd")
    if not typed_in:
        return home, ""
    if Path(str(typed_in)).is_dir():
        return str(typed_in), ""
    return home, f"{typed_in} is not a directory on {node}: the job runs in {home}"


def stop_session(session: str) -> bool:
    """Kill a tmux session and every process in its panes (kill-session alone only sends
    SIGHUP, which a job may ignore)."""
    pids = pane_pids(session)
    if pids is None:
        return False
    for pid in pids:
        signal_tree(pid, signal.SIGTERM)
    time.sleep(0.5)
    kill_session(session)
    for pid in pids:
        signal_tree(pid, signal.SIGKILL)
    return True


MAX_LOG_WAIT_S = 30.0
LOG_POLL_S = 0.01  # a local stat: cheap (100 a second), and what a follower's latency is made of


def read_log(
    path: str,
    offset: int = 0,
    tail_lines: int = 0,
    limit: int = 1 << 20,
    wait_s: float = 0.0,
) -> ReadLogResponse:
    """A slice of a log: from ``offset``, or its last ``tail_lines`` lines. With ``wait_s``,
    waits that long for the log to grow past ``offset`` first (a follower's long poll: the
    next line reaches it within a few ms, not at its next round trip)."""
    p = Path(path)
    # Only our own job logs: this op must not become a way to read any file on the node.
    if not p.resolve().is_relative_to(jobs_home().resolve()):
        raise GpuclaimError(f"no job log at {path}")
    deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_LOG_WAIT_S)
    while not tail_lines and time.monotonic() < deadline:
        try:
            if p.stat().st_size > offset:
                break
        except OSError:
            pass  # not written yet: the job is starting
        time.sleep(LOG_POLL_S)
    if not p.is_file():
        raise GpuclaimError(f"no job log at {path}")
    size = p.stat().st_size
    with open(p, "rb") as fh:
        if tail_lines:
            start = max(0, size - limit)
            fh.seek(start)
            data = fh.read()
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail_lines:])
        else:
            fh.seek(min(offset, size))
            data = fh.read(limit)
    return {
        "data": data.decode("utf-8", "replace"),
        "offset": size if tail_lines else min(offset, size) + len(data),
        "size": size,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_facts(port: Optional[int] = None) -> NodeFactsResponse:
    return {
        "hostname": socket.gethostname(),
        "port": free_port(),
        "jupyter": shutil.which("jupyter"),
        "shell": os.environ.get("SHELL") or "/bin/bash",
        "port_in_use": port is not None and port_in_use(port),
    }


def port_in_use(port: int) -> bool:
    """Does a process listen on ``port`` here (on any address)? Binding says it: a port
    bound by anyone, even on one address only, refuses a bind to all of them (SO_REUSEADDR:
    a connection of a server that just stopped, in TIME_WAIT, is no listener)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False
