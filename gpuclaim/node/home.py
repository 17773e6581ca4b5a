"""Where a node keeps its jobs' files, and how the node code starts itself again (the job
wrapper in tmux, the queue keeper)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from gpuclaim.core.protocol import KeeperSpec, KeepQueueResponse


def jobs_home() -> Path:
    return Path(os.environ.get("GPUCLAIM_JOBS_DIR") or Path.home() / ".gpuclaim" / "jobs")


# How a node starts the agent from its zip or dir: ``python3 -c BOOT ROOT ARGS...``. Not
# ``python3 ROOT``: that goes through runpy, whose imports cost a few ms on every start.
BOOT = (
    "import sys;p=sys.argv.pop(1);sys.path[0]=p\n"
    "from gpuclaim.node.main import main;sys.exit(main())"
)


def bundle_root() -> Optional[str]:
    """Where this node code was installed from the CLI: the agent zip (``agent-V.pyz``) or
    its unpacked dir; None when it runs from an installed gpuclaim package."""
    root = Path(__file__).absolute().parents[2]  # above gpuclaim/; no resolve: in a zip
    if root.is_file() or (root / "__main__.py").is_file():
        return str(root)
    return None


def agent_entry() -> list[str]:
    """How to start this same code again: from the agent zip or dir, or the installed package."""
    root = bundle_root()
    if root is not None:
        return [sys.executable, "-c", BOOT, root]
    return [sys.executable, "-m", "gpuclaim.node.main"]


def start_keeper(spec: KeeperSpec) -> KeepQueueResponse:
    """Start a keeper for ``spec["node"]`` detached from this session (it outlives the SSH
    command that started it); if one runs already, the new one exits at once."""
    import hashlib  # here: every job's wrapper imports this module (openssl: ~3 ms)

    node = str(spec["node"])
    directory = jobs_home() / "keepers"
    directory.mkdir(parents=True, exist_ok=True)
    # one per node and store: two clusters may name a node alike on one machine
    name = f"{node}-{hashlib.sha1(str(spec['store_root']).encode()).hexdigest()[:10]}"
    spec_path = directory / f"{name}.json"
    tmp = directory / f".{name}.{os.getpid()}.json"
    # The spec carries the config, and with it the Slack webhook (a secret): owner only.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(spec))
    tmp.replace(spec_path)
    log = open(directory / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        pid = spawn_detached([*agent_entry(), "keep-queue", str(spec_path)], log.fileno())
    finally:
        log.close()
    return {"pid": pid}


def spawn_detached(argv: list[str], output: Optional[int] = None) -> int:
    """Start ``argv`` in its own session (it outlives the SSH session or the agent that
    started it), stdin closed, its output to the fd ``output`` (else discarded); its pid.
    A thread waits for it: in the warm agent, which lives on, an ended child must not stay
    a zombie (a one-shot agent exits first, and the child is the init process's to reap)."""
    import threading

    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if output is None else output,
        stderr=subprocess.DEVNULL if output is None else output,
        start_new_session=True,
        cwd=str(Path.home()),
    )
    threading.Thread(target=proc.wait, daemon=True).start()
    return proc.pid
