"""Which job wrappers are alive on this node, so a look sees at once that a job is gone.

A node that rebooted under a job (or whose tmux server was killed) leaves the job's claim
behind; heartbeats notice only after three missed beats. A node that answers can say at once:
every wrapper records in its heartbeat who it is (boot id, pid, and the process's start time,
which a reused pid does not share), and every probe lists the wrappers running now.

Standard library only, Python 3.9: nodes judge this too.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any, Optional

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> Optional[str]:
    try:
        with open(_BOOT_ID, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return start_in_stat(fh.read())
    except OSError:
        return None


def start_in_stat(stat: bytes) -> Optional[int]:
    """Field 22 of a /proc/PID/stat line (after the command name, which may hold anything)."""
    try:
        return int(stat.rsplit(b")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def this_process() -> dict[str, Any]:
    """Who a wrapper is, as its heartbeat says it."""
    pid = os.getpid()
    return {"boot_id": boot_id(), "pid": pid, "start": process_start(pid)}


def wrapper_gone(beat: Optional[dict[str, Any]], liveness: Optional[dict[str, Any]]) -> bool:
    """True when the node's answer proves the wrapper that beat for a claim is not running:
    the node booted since, or the wrapper (started before the look) is not among the living."""
    if not beat or not liveness or liveness.get("wrappers") is None:
        return False
    if not beat.get("boot_id") or beat.get("start") is None or beat.get("pid") is None:
        return False  # a heartbeat from before wrappers said who they are
    if beat["boot_id"] != liveness.get("boot_id"):
        return True
    if int(beat["start"]) >= int(liveness.get("checked_from") or 0):
        return False  # started after the look began: it could not have been seen
    return [int(beat["pid"]), int(beat["start"])] not in liveness["wrappers"]
