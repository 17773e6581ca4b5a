"""Node side of ``run --sync`` and ``pull``: where a job's copy of its project goes, and what
``pull`` may take from a job's directory. Standard library only, Python 3.9.

A job's copy is its own tree (editing code while a job runs never changes it). Making 2,000
hard links for a new tree costs more than rsync's whole incremental update, so it is done
ahead of time: after each copy, a detached builder links that copy's files into a *spare*
tree (``.spare``: ``tree/`` and the ``list`` of what it holds). The next sync of the project
takes the spare with one rename (of two racing syncs exactly one gets it; the other makes an
empty dir and rsyncs with ``--link-dest``), deletes what the spare has that the new file list
does not, and rsync updates it in place: changed files arrive as new files renamed over the
old names, so the hard links to other copies are broken, never written through.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.errors import GpuclaimError

_KEY = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


def sync_target(
    key: str, job_id: str, files: Optional[list[str]] = None, reuse: bool = False
) -> dict[str, Any]:
    """The directory for ``job_id``'s copy of project ``key``: the spare tree when ``reuse``
    (rsync will update it in place) and one is there, else a new empty one with the newest
    earlier copy to hard-link against (rsync ``--link-dest``); whether this node has rsync.
    With ``files`` (what the copy will hold), they are kept for the spare built after it."""
    _check_names(key, job_id)
    base = _sync_base() / key
    base.mkdir(parents=True, exist_ok=True)
    dest = base / job_id
    rsync = shutil.which("rsync") is not None
    pending = rsync and files is not None
    if pending:
        _write_list(base / f"{PENDING}{job_id}", files or [])
    reusing = reuse and rsync and files is not None and not dest.exists()
    spare = reusing and _take_spare(base, dest, set(files or ()))
    previous = None
    if not spare:
        earlier = [p for p in base.iterdir() if _is_copy(p) and p.name != job_id]
        previous = max(earlier, key=lambda p: p.stat().st_mtime, default=None)
        dest.mkdir(exist_ok=True)
    return {
        "dest": str(dest),
        "link_dest": str(previous) if previous else None,
        "rsync": rsync,
        "spare": spare,
        "pending": pending,
    }


SPARE = ".spare"  # the next copy, built ahead: tree/ and list
PENDING = ".pending-"  # + job id: the file list of a copy whose spare is not built yet


def _check_names(key: str, job_id: str) -> None:
    """A project key and a job id as the CLI makes them: one path component, not hidden."""
    if not _KEY.match(key) or not _KEY.match(job_id) or key.startswith("."):
        raise GpuclaimError(f"bad sync name {key!r}/{job_id!r}")


def _sync_base() -> Path:
    return Path.home() / ".cache" / "gpuclaim" / "sync"


def _is_copy(path: Path) -> bool:
    """A job's copy (not the spare or a builder's work)."""
    return not path.name.startswith(".") and path.is_dir() and not path.is_symlink()


def _write_list(path: Path, names: list[str]) -> None:
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    tmp.write_bytes("\0".join(names).encode("utf-8", "surrogateescape"))
    tmp.replace(path)


def _read_list(path: Path) -> list[str]:
    data = path.read_bytes().decode("utf-8", "surrogateescape")
    return [n for n in data.split("\0") if _relative(n)]


def _relative(name: str) -> bool:
    return bool(name) and not name.startswith("/") and ".." not in name.split("/")


def _take_spare(base: Path, dest: Path, files: set[str]) -> bool:
    """Make the spare tree ``dest``, without what ``files`` no longer has; False when there
    is no spare (or another sync took it first)."""
    taking = base / f".taking-{dest.name}"
    try:
        (base / SPARE).rename(taking)  # atomic: one taker wins
    except OSError:
        return False
    try:
        held = _read_list(taking / "list")
        (taking / "tree").rename(dest)
    except OSError:
        shutil.rmtree(taking, ignore_errors=True)
        return False
    shutil.rmtree(taking, ignore_errors=True)
    emptied: set[Path] = set()
    for rel in held:
        if rel in files:
            continue
        path = dest / rel
        try:
            if path.is_symlink() or not path.is_dir():
                path.unlink()
                emptied.add(path.parent)
        except OSError:
            pass
    for parent in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
        while parent != dest and dest in parent.parents:
            try:
                parent.rmdir()  # only if empty
            except OSError:
                break
            parent = parent.parent
    os.utime(dest)  # the newest copy, for a later --link-dest
    return True


def build_spare(key: str, job_id: str) -> Optional[str]:
    """Hard-link the files of ``job_id``'s copy (as its sync listed them) into the project's
    spare tree, replacing an older spare; the spare's path, or None when there was nothing
    to build (no list waiting, or another builder has it)."""
    _check_names(key, job_id)
    base = _sync_base() / key
    source, work = base / job_id, base / f".building-{job_id}"
    try:
        work.mkdir()
        (base / f"{PENDING}{job_id}").rename(work / "list")
    except OSError:
        if work.exists() and not (work / "list").exists():
            work.rmdir()
        return None
    tree, made, linked = work / "tree", set(), []
    tree.mkdir()
    for rel in _read_list(work / "list"):
        src, dst = source / rel, tree / rel
        try:
            if stat.S_ISDIR(os.lstat(src).st_mode):
                continue  # rsync fills it (a listed directory: a submodule)
            if dst.parent not in made:
                dst.parent.mkdir(parents=True, exist_ok=True)
                made.add(dst.parent)
            os.link(src, dst, follow_symlinks=False)
            linked.append(rel)
        except OSError:
            continue  # gone or changed under us: the next rsync sends it
    _write_list(work / "list", linked)
    old = base / f".old-{job_id}"
    try:
        (base / SPARE).rename(old)
    except OSError:
        pass
    shutil.rmtree(old, ignore_errors=True)
    try:
        work.rename(base / SPARE)
    except OSError:  # another builder installed one meanwhile: it is as good
        shutil.rmtree(work, ignore_errors=True)
        return None
    return str(base / SPARE)


def start_spare_builder(key: str, job_id: str) -> dict[str, Any]:
    """``build_spare`` in a detached process (it outlives this request), if a list waits."""
    from gpuclaim.node.home import agent_entry, spawn_detached

    _check_names(key, job_id)
    if not (_sync_base() / key / f"{PENDING}{job_id}").exists():
        return {"started": False}
    spawn_detached([*agent_entry(), "build-spare", key, job_id])
    return {"started": True}


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
    no job of ``known`` names once they are a day old; the directories removed. A project's
    spare goes with its last copy (it holds the same files), and a day-old builder's work
    or file list with it."""
    base = _sync_base()
    gone, known_ids, now = [], set(known), time.time()
    for copy in sorted(base.glob("*/*")):
        if copy.is_symlink():
            continue
        old = now - copy.lstat().st_mtime > ORPHAN_AFTER_S
        if copy.name.startswith("."):  # the spare, a builder's leftovers, a file list
            if old and copy.name != SPARE:
                _remove(copy)
            continue
        if copy.is_dir() and (copy.name in remove or (old and copy.name not in known_ids)):
            shutil.rmtree(copy, ignore_errors=True)
            gone.append(str(copy))
    for project in base.glob("*"):
        if not project.is_dir() or project.is_symlink():
            continue
        if not any(_is_copy(p) for p in project.iterdir()):
            _remove(project / SPARE)  # a sync starting now makes its own copy
            try:
                project.rmdir()  # only if nothing else is left
            except OSError:
                pass
    return {"removed": gone}


def _remove(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
