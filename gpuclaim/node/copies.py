"""Node side of ``run --sync`` and ``pull``: where a job's copy of its project goes, and what
``pull`` may take from a job's directory. Standard library only, Python 3.9.

A job's copy is its own tree, and no file of it shares an inode with another copy or the
spare: a job that writes a synced file in place (appends to a log, edits a config with
``r+``) changes its own copy only, and editing code while a job runs never changes it.
Copying a project costs many times rsync's incremental update (200 MB: 0.2-2 s on ext4), so
it is done ahead of time: after each copy, a detached builder copies that copy's files into a
*spare* tree (``.spare``: ``tree/`` and the ``list`` of what it holds), by
``copy_file_range`` (a reflink on btrfs and xfs: no data copied), leaving out any file that
changed while it was read or since the copy was whole (its job wrote it: rsync sends it
again). The next sync of the project takes the spare with one rename (of two racing syncs
exactly one gets it), deletes what the spare has that the new file list does not, and rsync
updates it in place. A sync that finds no spare waits for a builder still at work (it holds a
lock), else (two syncs at once) copies the newest earlier copy into its new directory first,
the same way, and rsync updates that.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from gpuclaim.core.errors import GpuclaimError

if TYPE_CHECKING:
    from gpuclaim.core.protocol import (
        PruneCopiesResponse,
        PullSourceResponse,
        SyncReadyResponse,
        SyncTargetResponse,
    )

_KEY = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


def sync_target(
    key: str, job_id: str, files: Optional[list[str]] = None, reuse: bool = False
) -> SyncTargetResponse:
    """The directory for ``job_id``'s copy of project ``key``: the spare tree when ``reuse``
    (rsync will update it in place) and one is there, else a new one holding a copy of the
    newest whole earlier copy's ``files`` (``previous``: its path), else an empty one;
    whether this node has rsync. With ``files`` (what the copy will hold), they are kept for
    the spare built after it."""
    _check_names(key, job_id)
    base = _sync_base() / key
    base.mkdir(parents=True, exist_ok=True)
    dest = base / job_id
    rsync = shutil.which("rsync") is not None
    pending = rsync and files is not None
    if pending:
        _write_list(base / f"{PENDING}{job_id}", files or [])
    reusing = reuse and rsync and files is not None and not dest.exists()
    deadline = time.monotonic() + LOCAL_COPY_S
    spare = reusing and _take_spare(base, dest, set(files or ()))
    if reusing and not spare and _wait_for_builders(base, deadline):
        spare = _take_spare(base, dest, set(files or ()))
    previous = None
    if not spare:
        newest = _newest_whole_copy(base, job_id)
        dest.mkdir(exist_ok=True)
        if reusing and newest is not None:
            # a local copy (no network), never hard links: the copies' jobs may write in place
            names = [n for n in files or () if _relative(n)]
            copy_files(newest, dest, names, deadline=deadline)
            os.utime(dest)  # the newest copy now
            previous = str(newest)
    return {
        "dest": str(dest),
        "previous": previous,
        "rsync": rsync,
        "spare": spare,
        "pending": pending,
    }


# Waiting for a builder and copying the previous copy stop after this long in all (the
# agent's call waits 60 s): rsync sends what the copy did not get to.
LOCAL_COPY_S = 40.0
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


def _newest_whole_copy(base: Path, job_id: str) -> Optional[Path]:
    """The newest copy of the project but ``job_id``'s that is whole: not one that a sync is
    making now (its file list still waits for the copy to be whole and its spare built)."""
    whole = [
        p
        for p in base.iterdir()
        if _is_copy(p) and p.name != job_id and not (base / f"{PENDING}{p.name}").exists()
    ]
    return max(whole, key=lambda p: p.stat().st_mtime, default=None)


def _wait_for_builders(base: Path, deadline: float) -> bool:
    """Wait while a live builder copies a spare of this project (it started before this
    sync: waiting costs less than copying again); whether a spare is there now."""
    while time.monotonic() < deadline and any(_building(p) for p in base.glob(".building-*")):
        time.sleep(0.02)
    return (base / SPARE).is_dir()


def _building(work: Path) -> bool:
    """Whether a builder holds ``work``'s lock (it goes when the builder ends, or dies)."""
    try:
        fd = os.open(work / "lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # no locks here (some NFS): nobody waits
    finally:
        os.close(fd)
    return False


def build_spare(key: str, job_id: str) -> Optional[str]:
    """Copy the files of ``job_id``'s copy (as its sync listed them) into the project's spare
    tree, replacing an older spare, each file a new inode of its own, without those changed
    since the copy was whole; the spare's path, or None when there was nothing to build (no
    list waiting, or another builder has it)."""
    _check_names(key, job_id)
    base = _sync_base() / key
    source, work = base / job_id, base / f".building-{job_id}"
    try:
        work.mkdir()
    except OSError:
        return None
    lock = os.open(work / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:  # held while building: a sync that finds no spare waits for this one
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass  # no locks here: a sync copies for itself instead
        return _build_in(base, job_id, source, work)
    finally:
        os.close(lock)


def _build_in(base: Path, job_id: str, source: Path, work: Path) -> Optional[str]:
    try:
        (base / f"{PENDING}{job_id}").rename(work / "list")
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        return None
    whole = (work / "list").stat().st_mtime_ns  # stamped by start_spare_builder
    (work / "tree").mkdir()
    copied = copy_files(source, work / "tree", _read_list(work / "list"), changed_after=whole)
    _write_list(work / "list", copied)
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


def copy_files(
    source: Path,
    tree: Path,
    names: list[str],
    changed_after: Optional[int] = None,
    deadline: Optional[float] = None,
) -> list[str]:
    """Copy ``names`` (files and symlinks) from ``source`` into ``tree`` with their modes and
    times, each a new inode; the names copied. Left out, for rsync to send: what is gone or
    a directory (a submodule), a file that changed while it was read or whose inode changed
    after ``changed_after`` (ns, the filesystem's clock), all after ``deadline``."""
    made: set[Path] = set()
    copied = []
    for rel in names:
        if deadline is not None and time.monotonic() > deadline:
            break
        dst = tree / rel
        try:
            if _copy_one(source / rel, dst, made, changed_after):
                copied.append(rel)
        except OSError:
            continue  # gone or changed under us: the next rsync sends it
    return copied


def _copy_one(src: Path, dst: Path, made: set[Path], changed_after: Optional[int]) -> bool:
    info = os.lstat(src)
    if changed_after is not None and info.st_ctime_ns > changed_after:
        return False  # written since the copy was whole: its job's, not the project's
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        return False
    if dst.parent not in made:
        dst.parent.mkdir(parents=True, exist_ok=True)
        made.add(dst.parent)
    if stat.S_ISLNK(info.st_mode):
        dst.symlink_to(src.readlink())
        os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
        return True
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        before = os.fstat(fd)
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _copy_bytes(fd, out, before.st_size)
            os.fchmod(out, stat.S_IMODE(before.st_mode))
            os.utime(out, ns=(before.st_atime_ns, before.st_mtime_ns))
        except OSError:
            dst.unlink()
            raise
        finally:
            os.close(out)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    same = (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns) == (
        after.st_ino,
        after.st_size,
        after.st_mtime_ns,
        after.st_ctime_ns,
    )
    late = changed_after is not None and before.st_ctime_ns > changed_after
    if not same or late:  # a write while it was read: what was copied may be torn
        dst.unlink()
        return False
    return True


def _copy_bytes(src: int, dst: int, size: int) -> None:
    """``size`` bytes of ``src`` to ``dst`` by ``copy_file_range`` (the kernel clones the
    extents where the filesystem can: btrfs, xfs), else by reads and writes."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < size:
                n = os.copy_file_range(src, dst, size - done)
                if n == 0:
                    return  # it shrank: the check after the copy sees it
                done += n
            return
        except OSError:
            if done:
                raise
    with open(src, "rb", closefd=False) as reader, open(dst, "wb", closefd=False) as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)


def start_spare_builder(key: str, job_id: str) -> SyncReadyResponse:
    """``build_spare`` in a detached process (it outlives this request), if a list waits;
    called once the copy is whole, before its job starts."""
    from gpuclaim.node.home import agent_entry, spawn_detached

    _check_names(key, job_id)
    listed = _sync_base() / key / f"{PENDING}{job_id}"
    try:
        # the moment the copy is whole, on the filesystem's clock: a file whose inode
        # changed later was written by the job, and is left out of the spare
        os.utime(listed)
    except OSError:
        return {"started": False}
    spawn_detached([*agent_entry(), "build-spare", key, job_id])
    return {"started": True}


def pull_source(directory: str, paths: list[str]) -> PullSourceResponse:
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


def prune_copies(remove: list[str], known: list[str]) -> PruneCopiesResponse:
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
