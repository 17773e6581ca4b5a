"""The job wrappers running on this node now, listed with every probe (see
``gpuclaim.core.liveness`` for how a look judges a job gone from that list)."""

from __future__ import annotations

import os
import time

from gpuclaim.core.liveness import process_start, this_process

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any, Optional


def node_liveness() -> Optional[dict[str, Any]]:
    """This node's boot id and its running wrappers as [pid, start] pairs; ``checked_from`` is
    when the look began, so that a wrapper started after it is never taken for a missing one.
    None where other users' processes are hidden from us (/proc mounted with hidepid): then
    heartbeats alone decide."""
    me = this_process()
    if me["boot_id"] is None or me["start"] is None or _processes_hidden():
        return None
    # When this look began, in the ticks since boot that process start times use. Not this
    # process's own start: a warm agent started long before the jobs it is asked about.
    # CLOCK_MONOTONIC leaves out suspended time, so it is never later than a start time.
    looked_at = int(time.clock_gettime(time.CLOCK_MONOTONIC) * os.sysconf("SC_CLK_TCK"))
    wrappers = []
    try:
        names = os.listdir("/proc")  # noqa: PTH208 - names only, and many of them
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if _is_wrapper(pid):
            start = process_start(pid)
            if start is not None:
                wrappers.append([pid, start])
    return {"boot_id": me["boot_id"], "checked_from": looked_at, "wrappers": wrappers}


def _is_wrapper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return is_wrapper_argv(fh.read().split(b"\0"))
    except OSError:
        return False


def is_wrapper_argv(argv: list[bytes]) -> bool:
    """Whether a command line is a job wrapper's (also read by the laptop from a shell look)."""
    # `<python> <agent dir> wrap <job dir>/spec.json` or `<python> -m gpuclaim.node.main wrap ...`
    for i, arg in enumerate(argv[:-1]):
        if arg == b"wrap" and argv[i + 1].endswith(b"/spec.json"):
            return any(b"gpuclaim" in a for a in argv[:i])
    return False


def _processes_hidden() -> bool:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            return processes_hidden_in(fh.read())
    except OSError:
        return True


def processes_hidden_in(mountinfo: str) -> bool:
    """Whether /proc, as this mountinfo mounts it, hides other users' processes (hidepid)."""
    for line in mountinfo.splitlines():
        parts = line.split(" - ")
        if len(parts) == 2 and parts[1].startswith("proc ") and " /proc " in parts[0]:
            options = parts[1].split()[-1]
            return any(
                opt.startswith("hidepid=") and opt not in ("hidepid=0", "hidepid=off")
                for opt in options.split(",")
            )
    return False
