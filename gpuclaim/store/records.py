"""Job records and their wrappers' heartbeats."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any, Optional

from gpuclaim.core.errors import ConflictError, StoreError
from gpuclaim.core.model import Job, JobUpdate
from gpuclaim.core.states import ACTIVE_JOB_STATES, JobState, check_transition
from gpuclaim.store.files import (
    _beater,
    _discard,
    _encode,
    _link_exclusive,
    _safe,
    _unlink_quiet,
    storage_error,
)
from gpuclaim.store.owners import OwnersPart


class JobRecordsPart(OwnersPart):
    def create_job(self, job: Job) -> Job:
        """Publish a new job record; its id must be new. A job that names no account yet
        becomes this account's, its spec written first (``store/owners.py``)."""
        job = self._own_spec(job)
        tmp = self._stage(_encode(job.to_dict()))
        try:
            if not _link_exclusive(tmp, self._p("jobs", f"{job.id}.json")):
                raise ConflictError(f"job {job.id} exists already")
        finally:
            _discard(tmp)
        return job

    def load_job(self, job_id: str) -> Optional[Job]:
        """The job's record; None if there is none. One that is there but unreadable, or
        no job, raises StoreError: a damaged record is never taken for a missing one."""
        data = self._job_record(job_id)
        return None if data is None else self._parsed(job_id, data)

    def _job_record(self, job_id: str) -> Optional[dict[str, Any]]:
        path = self._p("jobs", f"{_safe(job_id)}.json")
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"job record {path} is damaged: {exc}") from exc
        return data if isinstance(data, dict) else None

    def list_jobs(
        self,
        skip_arrays: Sequence[str] = (),
        skip_ids: Sequence[str] = (),
        active_or_of: Optional[str] = None,
        only_ids: Optional[Sequence[str]] = None,
        named: Optional[str] = None,
    ) -> list[Job]:
        """Every readable job record (a damaged one, or one that is no job, is skipped).
        ``skip_arrays``: no task of these arrays is read (by file name: ``a-ID-i.json``);
        ``skip_ids``: nor these jobs; ``only_ids``: only these. ``active_or_of``: only the
        records that are queued, starting or running, or that name this user; ``named``:
        only the jobs of this name. A listing then parses no other record."""
        result: list[dict[str, Any]] = []
        folder = str(self._p("jobs"))
        if only_ids is not None:
            names = [f"{_safe(i)}.json" for i in only_ids]
        else:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                return []
        prefixes = tuple(f"{_safe(a)}-" for a in skip_arrays)
        skipped = {f"{_safe(i)}.json" for i in skip_ids}
        wanted = _wanted_bytes(active_or_of)
        name_bytes = json.dumps(named, ensure_ascii=True).encode() if named is not None else b""
        for name in names:
            if not name.endswith(".json") or name in skipped or name.startswith(prefixes):
                continue
            try:  # plain paths: pathlib's own cost was a sixth of this at 10,000 records
                with open(os.path.join(folder, name), "rb") as fh:
                    raw = fh.read()
                # bytes first: a record that holds none of the words cannot be one asked for
                if (wanted and not wanted.search(raw)) or name_bytes not in raw:
                    continue
                data = json.loads(raw.decode("utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            if not isinstance(data, dict) or (named is not None and data.get("name") != named):
                continue
            if not wanted or _active_or_of(data, active_or_of):
                result.append(data)
        return parsed_jobs(result)

    def update_job(
        self,
        job_id: str,
        changes: dict[str, Any],
        only_from: Optional[list[str]] = None,
        rank: Optional[int] = None,
        rank_changes: Optional[dict[str, Any]] = None,
    ) -> JobUpdate:
        """Apply ``changes`` (top-level keys of the job's JSON) and ``rank_changes`` (keys of
        one rank) under the job's lock, only if its state is in ``only_from``."""
        lock_name = f"job-{_safe(job_id)}"
        with self.gpu_lock(lock_name):
            current = self._job_record(job_id)
            if current is None:
                raise StoreError(f"no job record {job_id}")
            if only_from is not None and current.get("state") not in only_from:
                return JobUpdate(self._parsed(job_id, current), False)
            _check_states(job_id, current, changes, rank, rank_changes)
            updated = dict(current, **changes)
            if rank is not None and rank_changes:
                updated["ranks"] = [
                    dict(r, **rank_changes) if r.get("rank") == rank else r
                    for r in updated.get("ranks") or []
                ]
            tmp = self._stage(_encode(updated))
            try:
                os.rename(tmp, self._p("jobs", f"{_safe(job_id)}.json"))
            except OSError as exc:
                _discard(tmp)
                raise storage_error(self.root, exc) from exc
            return JobUpdate(self._parsed(job_id, updated), True)

    def _parsed(self, job_id: str, data: dict[str, Any]) -> Job:
        try:
            return Job.from_dict(data)
        except UNPARSED as exc:
            path = self._p("jobs", f"{_safe(job_id)}.json")
            raise StoreError(f"job record {path} is damaged: {exc!r}") from exc

    def beat(self, claim_id: str, interval: float) -> None:
        """A job wrapper's sign of life for its claim (the file's mtime is the storage clock)."""
        path = self._p("beats", _safe(claim_id))
        body = {"interval": interval, "host": self.host, **_beater()}
        self._publish(self._stage(_encode(body), sync=False), path)

    def drop_beat(self, claim_id: str) -> None:
        _unlink_quiet(self._p("beats", _safe(claim_id)))


def _check_states(
    job_id: str,
    current: dict[str, Any],
    changes: dict[str, Any],
    rank: Optional[int],
    rank_changes: Optional[dict[str, Any]],
) -> None:
    """Every state change of a job or a rank goes through the table (core/states.py)."""
    if "state" in changes:
        check_transition(str(current.get("state")), str(changes["state"]), f"job {job_id}")
    if rank is not None and rank_changes and "state" in rank_changes:
        for r in current.get("ranks") or []:
            if r.get("rank") == rank:
                old = str(r.get("state", JobState.STARTING))
                check_transition(old, str(rank_changes["state"]), f"job {job_id} rank {rank}")


# What a job record that is JSON but no job raises when parsed (hand-edited, or a newer
# gpuclaim's that changed a field's shape).
UNPARSED = (KeyError, ValueError, TypeError)


def parsed_jobs(records: list[dict[str, Any]]) -> list[Job]:
    """The records that are jobs; the others are skipped (a listing is never refused)."""
    jobs = []
    for d in records:
        try:
            jobs.append(Job.from_dict(d))
        except UNPARSED:
            continue
    return jobs


def _wanted_bytes(user: Optional[str]) -> Optional[re.Pattern[bytes]]:
    """The JSON strings one of which a record asked for by ``active_or_of`` must hold, as one
    pattern (one search per record, in C)."""
    if user is None:
        return None
    words = [json.dumps(w, ensure_ascii=True).encode() for w in (*ACTIVE_JOB_STATES, user)]
    return re.compile(b"|".join(re.escape(w) for w in words))


def _active_or_of(data: dict[str, Any], user: Optional[str]) -> bool:
    return data.get("state") in ACTIVE_JOB_STATES or data.get("user") == user
