"""Job arrays: one record per array next to its tasks' job records, and the count of its
tasks that ended (one marker file each, made exclusively: two tasks ending at once both
count, and only one of them sees the last count). ``mark_once``: a thing done once, ever
(an array's start and end messages)."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, cast

from gpuclaim.core.errors import ConflictError, StoreError
from gpuclaim.core.records import ArrayChanges, ArrayRecord
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import (
    FILE_MODE,
    _discard,
    _encode,
    _fix_mode,
    _link_exclusive,
    _mkdir_shared,
    _safe,
    storage_error,
)

ARRAY_SUFFIX = ".array"  # not ".json": job listings never read it as a job


class ArraysPart(StoreBase):
    def create_array(self, array: ArrayRecord) -> None:
        """Publish a new array record (id, name, user, indices, ...); its id must be new."""
        tmp = self._stage(_encode(array))
        try:
            if not _link_exclusive(tmp, self._p("jobs", f"{_safe(array['id'])}{ARRAY_SUFFIX}")):
                raise ConflictError(f"array {array['id']} exists already")
        finally:
            _discard(tmp)

    def load_array(self, array_id: str) -> Optional[ArrayRecord]:
        path = self._p("jobs", f"{_safe(array_id)}{ARRAY_SUFFIX}")
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"array record {path} is damaged: {exc}") from exc
        return cast(ArrayRecord, data) if isinstance(data, dict) else None

    def list_arrays(self) -> list[ArrayRecord]:
        """Every readable array record (a damaged one is skipped)."""
        found: list[ArrayRecord] = []
        try:
            names = os.listdir(self._p("jobs"))
        except FileNotFoundError:
            return found
        for name in names:
            if name.endswith(ARRAY_SUFFIX):
                data = self.load_array(name[: -len(ARRAY_SUFFIX)]) if _readable(name) else None
                if data is not None:
                    found.append(data)
        return found

    def update_array(self, array_id: str, changes: ArrayChanges) -> ArrayRecord:
        """Merge ``changes`` into the record (its summary once it ended: one writer, the task
        that ended last)."""
        with self.gpu_lock(f"array-{_safe(array_id)}"):
            current = self.load_array(array_id)
            if current is None:
                raise StoreError(f"no array record {array_id}")
            updated: ArrayRecord = {**current, **changes}
            self._publish(
                self._stage(_encode(updated)),
                self._p("jobs", f"{_safe(array_id)}{ARRAY_SUFFIX}"),
            )
            return updated

    def task_ended(self, array_id: str, index: int) -> int:
        """Count task ``index`` of the array as ended (once); returns how many have ended."""
        directory = self._p("jobs", f"{_safe(array_id)}.ended")
        try:
            _mkdir_shared(directory)
            self._mark(directory / str(int(index)))
            return sum(1 for n in os.listdir(directory) if n.isdigit())
        except OSError as exc:
            raise storage_error(self.root, exc) from exc

    def tasks_ended(self, array_id: str) -> int:
        try:
            names = os.listdir(self._p("jobs", f"{_safe(array_id)}.ended"))
        except FileNotFoundError:
            return 0
        return sum(1 for n in names if n.isdigit())

    def mark_once(self, key: str) -> bool:
        """True for the one caller, ever, that marks ``key`` first (on NFS too)."""
        try:
            return self._mark(self._p("notify", "seen", f"once--{_safe(key)}"))
        except OSError as exc:
            raise storage_error(self.root, exc) from exc

    @staticmethod
    def _mark(path: Any) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
        except FileExistsError:
            return False
        _fix_mode(fd)
        os.close(fd)
        return True


def _readable(name: str) -> bool:
    return not name.startswith(".")
