"""``run --sync``: the project's files copied to every node of a job before it starts, one
copy per job (editing code while a job runs never changes what it runs; a job that writes a
synced file in place changes no other job's copy), made incrementally: rsync updates in place
a spare tree that the node copied after the previous copy (see ``node.copies``), or, with no
spare, a new directory the node has filled with a copy of the previous copy. No two copies
share a file (no hard links; reflinks where the node's filesystem has them).

On each node the copies live in ``~/.cache/gpuclaim/sync/<project>/<job id>``; the job runs
there. What is copied is decided on the laptop (``app.sync_plan``); how it travels is the
channels' business (``TreeCopier``: rsync through the SSH master, or a tar stream).
"""

from __future__ import annotations

import hashlib
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gpuclaim.core.config import Config, NodeConfig
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.fanout import fan_out

SYNC_DIR = "~/.cache/gpuclaim/sync"


@dataclass(frozen=True)
class SyncPlan:
    """What ``--sync`` copies: ``files`` (relative POSIX paths) under ``root``, ``size``
    bytes in all; ``left_out``: the paths under ``root`` that cover everything else (rsync
    walks ``root`` without them)."""

    root: str
    files: tuple[str, ...]
    size: int
    left_out: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The project's directory name on the nodes: readable, and unique per laptop and
        path (two projects named ``exp`` never share copies)."""
        origin = f"{socket.gethostname()}:{self.root}"
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", self.root.rstrip("/").rsplit("/", 1)[-1])
        return (
            f"{base.strip('-.')[:40] or 'project'}-{hashlib.sha1(origin.encode()).hexdigest()[:10]}"
        )


@runtime_checkable
class TreeCopier(Protocol):
    """Copies files between this machine and a node (``remote.channels`` implements it)."""

    def push_tree(
        self,
        node: NodeConfig,
        root: str,
        files: Sequence[str],
        target: dict[str, Any],
        left_out: Sequence[str] = (),
    ) -> str:
        """Copy ``files`` under ``root`` into ``target["dest"]`` on ``node`` (rsync updates
        what the node put there); how it went ("rsync", "tar"). rsync walks ``root`` itself,
        leaving out ``left_out``."""
        ...

    def rsyncs_to(self, node: NodeConfig) -> bool:
        """Whether ``push_tree`` can rsync to ``node`` (when the node has rsync too): only
        then may a copy start from a spare tree (rsync updates it; tar only adds)."""
        ...

    def pull_tree(
        self, node: NodeConfig, directory: str, paths: Sequence[str], into: str, rsync: bool
    ) -> str:
        """Copy ``paths`` (relative to ``directory`` on ``node``) into ``into`` here."""
        ...


def job_copy_dir(plan: SyncPlan, job_id: str) -> str:
    """The job's copy on every node, ``~``-relative so that each node expands its own home."""
    return f"{SYNC_DIR}/{plan.key}/{job_id}"


def push_copies(
    config: Config, ops: Any, nodes: Sequence[NodeConfig], plan: SyncPlan, job_id: str
) -> tuple[str, dict[str, Any]]:
    """Copy the project to each of ``nodes``, all at once; the job's workdir (the same on
    all of them) and what the copy took (files, bytes, seconds, how, per node)."""
    copier = ops.copier
    if copier is None:
        raise GpuclaimError("--sync needs SSH or a local node to copy through")
    started = time.monotonic()

    def one(name: str) -> tuple[str, str, float]:
        node = config.node(name)
        reuse = copier.rsyncs_to(node)
        target = ops.sync_target(node, plan.key, job_id, plan.files if reuse else None, reuse)
        how = str(copier.push_tree(node, plan.root, plan.files, target, plan.left_out))
        copied = time.monotonic()
        if target.get("pending"):
            try:  # the node links the next copy's spare tree, after this one is whole
                ops.sync_ready(node, plan.key, job_id)
            except GpuclaimError:
                pass  # the next copy starts from scratch, as without a spare
        start = "spare" if target.get("spare") else "previous" if target.get("previous") else "none"
        return how, start, copied

    outcomes = fan_out([n.name for n in nodes], one, COPY_DEADLINE_S)
    done: dict[str, tuple[str, str, float]] = {}
    for name, outcome in outcomes.items():
        if not outcome.ok or outcome.value is None:
            raise GpuclaimError(f"--sync to {name} failed: {outcome.error}")
        done[name] = outcome.value
    stats = {
        "files": len(plan.files),
        "bytes": plan.size,
        "seconds": round(max(copied for _, _, copied in done.values()) - started, 3),
        "how": {name: how for name, (how, _, _) in done.items()},
        # what each node's copy started from: its spare tree, a copy of the previous one, or nothing
        "incremental": {name: start for name, (_, start, _) in done.items()},
    }
    return job_copy_dir(plan, job_id), stats


COPY_DEADLINE_S = 3600.0


def prune_copies(
    config: Config, ops: Any, jobs: Sequence[Any], user: str, now: float
) -> dict[str, int]:
    """``gc``: on every node, remove ``user``'s copies of jobs that ended more than
    ``[run] keep_copies`` ago (``pull`` works until then), and copies no job names. How many
    went, per node that answered."""
    copies: dict[str, list[Any]] = {}  # an array's tasks share one copy, named by the array
    for j in jobs:
        if j.user == user:
            copies.setdefault(j.array.id if j.array else j.id, []).append(j)
    keep = config.keep_copies_s
    old = [
        name
        for name, owners in copies.items()
        if all(j.ended is not None and now - j.ended > keep for j in owners)
    ]
    known = list(copies)
    outcomes = fan_out(
        [n.name for n in config.nodes],
        lambda name: ops.prune_copies(config.node(name), old, known),
        config.limits.deadline_s,
    )
    return {name: len(o.value or []) for name, o in outcomes.items() if o.ok}
