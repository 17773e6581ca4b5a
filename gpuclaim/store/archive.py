"""Finished job records, moved out of ``jobs/`` in batches so that the store does not slow
down as history grows.

A batch is one new, immutable file ``jobs/archive/<utc time>-<nonce>.jsonl`` (one record per
line), published whole (staged, fsynced, renamed): nothing is ever appended to a shared file,
which NFS would interleave between hosts. Only then are the live records unlinked, so a
crash in between leaves a record in both places, never in neither; readers keep the live one.
A reader lists ``jobs/`` before the archive for the same reason: a record moved meanwhile is
then seen in the archive."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from gpuclaim.core.model import Job
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import _mkdir_shared, _nonce, _safe, _unlink_quiet, storage_error
from gpuclaim.store.records import parsed_jobs

ARCHIVE_DIR = "archive"  # under jobs/
ARCHIVE_LOCK = "jobs-archive"
CHUNK = 1000  # records per batch file: the lock is refreshed between them


class JobArchivePart(StoreBase):
    def archive_jobs(self, job_ids: list[str]) -> int:
        """Move these job records into the archive; the number moved. Another process
        archiving at the same moment: 0 at once (it is doing the same work)."""
        held = self.try_lock(ARCHIVE_LOCK)
        if held is None:
            return 0
        moved = 0
        with held:
            directory = self._p("jobs", ARCHIVE_DIR)
            try:
                _mkdir_shared(directory)
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
            for start in range(0, len(job_ids), CHUNK):
                moved += self._archive_chunk(job_ids[start : start + CHUNK])
                self.refresh_lock(ARCHIVE_LOCK)
        return moved

    def _archive_chunk(self, job_ids: list[str]) -> int:
        lines, paths = [], []
        for job_id in job_ids:
            path = self._p("jobs", f"{_safe(job_id)}.json")
            try:
                data = json.loads(path.read_bytes().decode("utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                continue  # moved by another archiver, or damaged: leave it where it is
            if not isinstance(data, dict):
                continue
            lines.append(json.dumps(data, sort_keys=True, ensure_ascii=True))
            paths.append(path)
        if not lines:
            return 0
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self._p("jobs", ARCHIVE_DIR, f"{stamp}-{_nonce()}.jsonl")
        self._publish(self._stage(("\n".join(lines) + "\n").encode()), target)
        for path in paths:
            try:
                _unlink_quiet(path)
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
        return len(paths)

    def archived_jobs(self) -> list[Job]:
        """Every archived job, oldest batch first (a torn or damaged line, or one that is no
        job, skipped)."""
        directory = self._p("jobs", ARCHIVE_DIR)
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
        except FileNotFoundError:
            return []
        found: list[dict[str, Any]] = []
        for name in names:
            try:
                raw = (directory / name).read_bytes()
            except OSError:
                continue
            for line in raw.splitlines():
                try:
                    data = json.loads(line.decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    continue
                if isinstance(data, dict):
                    found.append(data)
        return parsed_jobs(found)
