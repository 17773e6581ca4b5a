"""Each account's own directory in the store: the proof of what its jobs run.

The store is group-writable, so a job record proves nothing about who asked for it. When a
job is created, the account that creates it also writes ``owners/<uid>/<job id>.json``: what
the job runs (``core.accounts.RUN_FIELDS``), in a directory only that account can write
(0755, its own). Before any process starts a job's command (a wrapper, a keeper's or a CLI's
dispatch) it checks that the job is its own account's and that this file, owned by it and
writable by nobody else, says the same. Anything else is refused and logged as forged.

Layout::

    <root>/owners/            2775: every account makes its own directory here
    <root>/owners/<uid>/      0755, owned by <uid>: its specs, written once per job
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

from gpuclaim.core.accounts import Account, account_name, first_difference, this_account, what_runs
from gpuclaim.core.errors import StoreError
from gpuclaim.core.model import Job
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import _discard, _encode, _mkdir_shared, _nonce, _safe, storage_error

OWNERS = "owners"
OWN_DIR_MODE = 0o755  # its account's alone: nobody else may add, replace or remove a spec
SPEC_MODE = 0o644
_FOREIGN_WRITE = 0o022  # group or others may write
_MISSING = "does not exist"


class OwnersPart(StoreBase):
    def whoami(self) -> dict[str, Any]:
        """The account this store's writes are made as (over ``ssh://``: on the storage host)."""
        return this_account().to_dict()

    def _own_spec(self, job: Job) -> Job:
        """The job stamped with this account, its spec written first (``create_job``). A job
        that names an account already (a requeue, or a record made by hand) is left as it
        is: only its owner's spec can make it run."""
        if job.uid is not None:
            return job
        me = this_account()
        job = job.with_(uid=me.uid, account=me.name)
        directory = self._own_dir(me)
        body = {"id": job.id, "uid": me.uid, "account": me.name, "run": what_runs(job)}
        tmp = directory / f".{_nonce()}.tmp"  # staged in the private directory, not tmp/
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, SPEC_MODE)
            try:
                os.fchmod(fd, SPEC_MODE)
                os.write(fd, _encode(body))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, directory / f"{_safe(job.id)}.json")
        except OSError as exc:
            _discard(tmp)
            raise storage_error(self.root, exc) from exc
        return job

    def _own_dir(self, me: Account) -> Path:
        top = self._p(OWNERS)
        directory = top / str(me.uid)
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            try:
                _mkdir_shared(top)
                os.mkdir(directory, OWN_DIR_MODE)
                os.chmod(directory, OWN_DIR_MODE)  # the umask, and the parent's setgid bit
            except FileExistsError:
                pass
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
            st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != me.uid or st.st_mode & _FOREIGN_WRITE:
            raise StoreError(
                f"{directory} is not {me.name}'s alone (owner {account_name(st.st_uid)}, "
                f"mode {stat.S_IMODE(st.st_mode):o}): gpuclaim cannot prove what {me.name} runs",
                hint=f"ask the store's owner to remove it: rm -r {directory}",
            )
        return directory

    def check_job(self, job: Job) -> str:
        """Why this account must not run the job ("" when it may): it is another account's,
        or its spec is missing, not its owner's alone, or says otherwise."""
        me = this_account()
        if job.uid is None:
            return "it names no account (written by hand, or by a gpuclaim before 0.9)"
        if job.uid != me.uid:
            return f"it is {job.account or f'uid{job.uid}'}'s job, and this is {me.name}"
        spec_id = job.spec or job.id
        directory = self._p(OWNERS, str(me.uid))
        why = _not_own(directory, me, stat.S_ISDIR)
        if why == _MISSING:
            return f"{me.name} never submitted it (no {directory})"
        if why:
            return f"{directory} {why}"
        path = directory / f"{_safe(spec_id)}.json"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return f"{me.name} never submitted it (no {path})"
        except OSError as exc:
            return f"{path} cannot be read: {exc.strerror}"
        try:
            why = _not_own_fd(fd, me)
            if why:
                return f"{path} {why}"
            with os.fdopen(os.dup(fd), "rb") as fh:
                spec = json.loads(fh.read().decode("utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            return f"{path} is damaged: {exc}"
        finally:
            os.close(fd)
        if not isinstance(spec, dict) or spec.get("id") != spec_id or spec.get("uid") != me.uid:
            return f"{path} is not the spec of job {spec_id}"
        run = spec.get("run")
        field = first_difference(run if isinstance(run, dict) else {}, job)
        if field is not None:
            return f"its {field} is not what {me.name} submitted ({path})"
        return ""

    def misowned_specs(self) -> list[str]:
        """``doctor``: what in ``owners/`` could not prove anything (another account's file
        in an account's directory, a directory others may write), one line each."""
        top = self._p(OWNERS)
        try:
            names = sorted(os.listdir(top))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            directory = top / name
            try:
                st = os.lstat(directory)
            except OSError:
                continue
            if not name.isdigit() or not stat.S_ISDIR(st.st_mode):
                found.append(f"{directory}: not an account's directory")
                continue
            owner = Account(int(name), account_name(int(name)))
            why = _why_not(st, owner, stat.S_ISDIR)
            if why:
                found.append(f"{directory} {why}")
                continue
            found += _misowned_in(directory, owner)
        return found


def _misowned_in(directory: Path, owner: Account) -> list[str]:
    found = []
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return []
    for entry in entries:
        if entry.startswith("."):
            continue
        try:
            why = _why_not(os.lstat(directory / entry), owner, stat.S_ISREG)
        except OSError:
            continue
        if why:
            found.append(f"{directory / entry} {why}")
    return found


def _not_own(path: Path, me: Account, kind: Callable[[int], bool]) -> str:
    try:
        return _why_not(os.lstat(path), me, kind)
    except FileNotFoundError:
        return _MISSING
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"


def _not_own_fd(fd: int, me: Account) -> str:
    return _why_not(os.fstat(fd), me, stat.S_ISREG)


def _why_not(st: os.stat_result, owner: Account, kind: Callable[[int], bool]) -> str:
    """Why this file or directory cannot be the owner's word ("" when it can)."""
    if not kind(st.st_mode):
        return "is not a plain file" if kind is stat.S_ISREG else "is not a directory"
    if st.st_uid != owner.uid:
        return f"belongs to {account_name(st.st_uid)}, not {owner.name}"
    if st.st_mode & _FOREIGN_WRITE:
        return f"may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""
