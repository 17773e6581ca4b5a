"""Node side of ``run --sync`` and ``pull``: where a job's copy of its project goes (next to
the previous copy of that project, to hard-link against), and what ``pull`` may take from a
job's directory. Standard library only, Python 3.9."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

from gpuclaim.core.errors import GpuclaimError

_KEY = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


def sync_target(key: str, job_id: str) -> dict[str, Any]:
    """A new, empty directory for ``job_id``'s copy of project ``key``; the newest earlier
    copy of it (rsync ``--link-dest``), and whether this node has rsync."""
    if not _KEY.match(key) or not _KEY.match(job_id) or key.startswith("."):
        raise GpuclaimError(f"bad sync name {key!r}/{job_id!r}")
    base = Path.home() / ".cache" / "gpuclaim" / "sync" / key
    base.mkdir(parents=True, exist_ok=True)
    earlier = [p for p in base.iterdir() if p.is_dir() and p.name != job_id]
    previous = max(earlier, key=lambda p: p.stat().st_mtime, default=None)
    dest = base / job_id
    dest.mkdir(exist_ok=True)
    return {
        "dest": str(dest),
        "link_dest": str(previous) if previous else None,
        "rsync": shutil.which("rsync") is not None,
    }


def pull_source(directory: str, paths: list[str]) -> dict[str, Any]:
    """The job's directory here (``~`` expanded), after checking that each path is inside it
    and there; whether this node has rsync."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise GpuclaimError(f"the job's directory {directory} is gone")
    missing = []
    for rel in paths:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise GpuclaimError(f"pull takes paths inside the job's directory, not {rel!r}")
        if not (root / rel).exists():
            missing.append(rel)
    if missing:
        raise GpuclaimError(f"not in the job's directory {root}: {', '.join(missing)}")
    return {"directory": str(root), "rsync": shutil.which("rsync") is not None}


ORPHAN_AFTER_S = 86400.0  # a copy no job record names (its run failed, its record is gone)


def prune_copies(remove: list[str], known: list[str]) -> dict[str, Any]:
    """Remove the copies of the jobs in ``remove`` (ended long enough ago), and copies that
    no job of ``known`` names once they are a day old; the directories removed."""
    base = Path.home() / ".cache" / "gpuclaim" / "sync"
    gone, known_ids, now = [], set(known), time.time()
    for copy in sorted(base.glob("*/*")):
        if not copy.is_dir() or copy.is_symlink():
            continue
        orphan = copy.name not in known_ids and now - copy.stat().st_mtime > ORPHAN_AFTER_S
        if copy.name in remove or orphan:
            shutil.rmtree(copy, ignore_errors=True)
            gone.append(str(copy))
    for project in base.glob("*"):
        if project.is_dir() and not any(project.iterdir()):
            project.rmdir()
    return {"removed": gone}
