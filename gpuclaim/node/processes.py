"""Processes below a tmux pane, found through /proc and signalled group by group."""

from __future__ import annotations

import os
from pathlib import Path


def signal_tree(pid: int, sig: int) -> None:
    """Signal a pane's process and every process group below it (jobs start their own)."""
    children = children_of(pid)
    for child in children:
        try:
            os.killpg(child, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(child, sig)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def children_of(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.append(child)
                frontier.append(child)
    return found
