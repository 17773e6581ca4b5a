"""The store's file-system level: modes, atomic create and publish, network file system codes
(ESTALE, EPERM from sshfs), and the names that may become file names."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, TypeVar

from gpuclaim.core.errors import StorageRefusesWrites, StoreError
from gpuclaim.core.liveness import this_process

FILE_MODE = 0o664
DIR_MODE = 0o2775
LAYOUT_VERSION = 1
STORE_ID_FILE = "ID"
INCOMPLETE_GRACE_S = 60.0  # an incomplete claim older than this is abandoned
LOCK_BREAK_S = 30.0  # a long-lived lock (try_lock: keepers, refreshed) older than this is broken
# A record's or GPU's lock is held for a read and a rename (milliseconds): one this old lost
# its holder (a node that crashed in between, seen from a host that cannot ask its pid), and
# a waiter breaks it before its own wait ends rather than fail for a dead holder.
HELD_LOCK_BREAK_S = 12.0
LOCK_WAIT_S = 20.0
JOB_START_GRACE_S = 120.0  # a job's claim with no heartbeat yet: the launch is under way
TAKEN_ENTRY_MAX_S = 300.0  # a queue entry taken for dispatch this long ago was abandoned
LAUNCH_GRACE_S = 15.0  # ... unless the `run` that made it died here: its wrapper beats by then
_SUBDIRS = (
    "gpus",
    "locks",
    "events",
    "drain",
    "tmp",
    "trash",
    "corrupt",
    "queue",
    "jobs",
    "beats",
    "notify",
    "usage",
    "reservations",
)


# Answers that mean "you may read this storage but not write it": read-only, full, over quota,
# or not ours (root squash, a directory another user made without group write).
_REFUSED = frozenset(
    code
    for code in (errno.EROFS, errno.ENOSPC, getattr(errno, "EDQUOT", 0), errno.EACCES, errno.EPERM)
    if code
)


def storage_error(root: Path, exc: OSError, doing: str = "write") -> StoreError:
    """The one-line error for an OSError on the store, by what the answer means."""
    reason = exc.strerror or str(exc)
    if doing == "write" and exc.errno in _REFUSED:
        return StorageRefusesWrites(f"storage {root} refuses writes: {reason}")
    if exc.errno == errno.EIO:
        return StoreError(f"cannot {doing} storage {root}: {reason} (is the file server up?)")
    if exc.errno == errno.ENOENT and not root.exists():
        return StoreError(f"storage {root} does not exist")
    return StoreError(f"cannot {doing} storage {root}: {reason}")


_T = TypeVar("_T")


def _again_if_stale(op: Callable[[], _T]) -> _T:
    """NFS answers ESTALE when a file was replaced between lookup and use (rename over it):
    a fresh lookup finds the new one, so once more is the right answer, not an error."""
    try:
        return op()
    except OSError as exc:
        if exc.errno != errno.ESTALE:
            raise
        return op()


def _read_with_stat(path: Path) -> tuple[os.stat_result, bytes]:
    with open(path, "rb") as fh:
        return os.fstat(fh.fileno()), fh.read(1 << 20)


def _read_stale_safe(path: Path) -> bytes:
    return _again_if_stale(lambda: _read_with_stat(path)[1])


def _listdir_stale_safe(path: Path) -> list[str]:
    return _again_if_stale(lambda: os.listdir(path))


@functools.cache
def _beater() -> dict[str, Any]:
    """Who beats: boot id, pid and start time of this process (see gpuclaim.core.liveness)."""
    return this_process()


def _safe(name: str) -> str:
    """Ids and names become file names: nothing that could climb out of the directory."""
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        raise StoreError(f"invalid id {name!r}")
    return name


def new_claim_id() -> str:
    return "c-" + os.urandom(5).hex()  # as random as uuid4's first 10 hex digits, no uuid import


def _link_exclusive(src: Path, dst: Path) -> bool:
    """link(2) src to dst; False if dst exists. On NFS a lost reply can make a successful link
    report EEXIST, so whether dst is now our inode decides (the classic NFS-safe lock test)."""
    try:
        os.link(src, dst)
        return True
    except FileExistsError:
        pass
    except OSError as exc:
        # SFTP (sshfs) has no "exists" answer for a hard link: a target made by another
        # host between sshfs's lookup and the link comes back as EPERM (seen: 1 racing
        # claimer in 24-82 failed so). Only a target that really is there means taken.
        if exc.errno not in (errno.EPERM, errno.EACCES) or not os.path.lexists(dst):
            raise
    try:
        return os.path.samefile(src, dst)
    except OSError:
        return False


def _break_lock(lock: Path) -> None:
    aside = lock.with_name(f"{lock.name}.broken.{_nonce()}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return
    _unlink_quiet(aside)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _encode(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, sort_keys=True, ensure_ascii=True, indent=1) + "\n").encode()


def _nonce() -> str:
    return os.urandom(6).hex()


def _mkdir_shared(path: Path) -> None:
    try:
        os.mkdir(path, DIR_MODE)
    except OSError:
        # EEXIST, or EPERM/EACCES from SFTP (sshfs) and root-squashed NFS for a directory that
        # is there: an existing directory is success, whatever the code says.
        if os.path.isdir(path):
            return
        raise
    with contextlib.suppress(OSError):
        os.chmod(path, DIR_MODE)  # mkdir's mode is cut by the umask


def _fix_mode(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.fchmod(fd, FILE_MODE)  # the umask would otherwise make it -rw-------/-rw-r--r--


def _discard(path: Path) -> None:
    """Remove our own staged file, if it is there: a leftover is swept later, so no failure
    here (EROFS is what unlink answers on a read-only mount, even for no file) matters."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ESTALE):
            raise
