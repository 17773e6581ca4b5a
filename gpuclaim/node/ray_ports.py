"""A Ray node's ports and files of its own (``run --ray``), so two Ray jobs on one node, of one
person or two, never share a port, a socket or each other's cluster.

Each Ray node of a job takes a block of ``BLOCK`` consecutive ports, held by a lock file in
the node's temporary directory (made with O_EXCL, naming the holder's pid: a block whose
holder is gone is taken over when that file is its own; another account's is passed by),
and checked free by binding each port before Ray gets it. Every port a Ray node opens is
one of the block's (``ray start``'s flags); its ``--temp-dir`` is a short path of its own
(Ray's socket paths live under it and must stay within 107 bytes). Its processes carry the
job's mark in their environment, which finds them all when it ends (Ray's workers rename
themselves, so a command line is no proof). Standard library only, Python 3.9.
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
from pathlib import Path
from typing import Optional

from gpuclaim.node.runner import port_in_use

BLOCK = 256
PORT_LOW, PORT_HIGH = 20000, 60000
# where each port of a node is in its block; worker processes get the rest
GCS, NODE_MANAGER, OBJECT_MANAGER, DASHBOARD = 0, 1, 2, 3
AGENT_LISTEN, AGENT_GRPC, RUNTIME_ENV, METRICS, CLIENT = 4, 5, 6, 7, 8
FIRST_WORKER = 16
MARK = "GPUCLAIM_RAY_NODE"  # in every process of a Ray node that a job started: "<job>-<rank>"


class PortBlock:
    """A block of ports held for one Ray node until ``release``."""

    def __init__(self, base: int, lock: Path) -> None:
        self.base = base
        self.lock = lock

    def port(self, offset: int) -> int:
        return self.base + offset

    def release(self) -> None:
        try:
            self.lock.unlink()
        except OSError:
            pass


def take_block(rng: Optional[random.Random] = None) -> PortBlock:
    """A free block of ports, held: RuntimeError when none is (a node full of Ray jobs)."""
    rng = rng or random.SystemRandom()
    bases = list(range(PORT_LOW, PORT_HIGH - BLOCK + 1, BLOCK))
    rng.shuffle(bases)
    for base in bases:
        lock = Path(tempfile.gettempdir()) / f"gpuclaim-ray-ports-{base}"
        if not _hold(lock):
            continue
        if not any(port_in_use(base + i) for i in range(BLOCK)):
            return PortBlock(base, lock)
        lock.unlink()  # some other program has one of them: not this block
    raise RuntimeError(f"no block of {BLOCK} free ports between {PORT_LOW} and {PORT_HIGH}")


def _hold(lock: Path) -> bool:
    for _ in range(2):
        try:
            fd = os.open(str(lock), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _stale(lock):
                return False
            try:
                lock.unlink()  # its holder is gone (only its own account can remove it)
            except OSError:
                return False
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _stale(lock: Path) -> bool:
    try:
        pid = int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        return False  # being written, or unreadable: someone's
    return pid > 0 and not Path(f"/proc/{pid}").exists()


def temp_dir(job_id: str, rank: int) -> Path:
    """The Ray node's ``--temp-dir``: short, in the node's own temporary directory (not a
    home that NFS shares between nodes), its account's alone."""
    return Path(tempfile.gettempdir()) / f"gcray-{os.getuid()}-{job_id}-{rank}"


def marked(mark: str) -> list[int]:
    """This account's processes that carry ``MARK=mark`` (a Ray node's, whatever their
    name), this one excepted."""
    want = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if want in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue  # gone, or another account's
    return found


def kill_marked(mark: str) -> int:
    """SIGKILL every process of the Ray node ``mark``; how many there were."""
    pids = marked(mark)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)
