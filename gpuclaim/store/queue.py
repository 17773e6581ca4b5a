"""The queue of jobs that did not fit: entries taken for dispatch and given back."""

from __future__ import annotations

import os
import re
from typing import Optional

from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import TAKEN_ENTRY_MAX_S, _pid_alive, _safe, _unlink_quiet, storage_error

# .taken.HOST.PID.ENTRY, read from where the entry's time starts: a host may hold dots
_TAKEN = re.compile(r"^\.taken\.(?P<host>.+)\.(?P<pid>\d+)\.(?P<name>\d+\.\d{6}-.+)$")


class QueuePart(StoreBase):
    def enqueue(
        self,
        job_id: str,
        user: str = "",
        nice: int = 0,
        begin: float = 0.0,
        submitted: Optional[float] = None,
    ) -> str:
        """Append a job to the queue. Its name says what ordering it needs (submission time
        on the storage clock, user, nice, begin), so a dispatch pass reads no record for it.
        ``submitted``: an entry put back (``gc``) keeps the place its job was submitted at."""
        from gpuclaim.core.priority import entry_name  # here: every look lists the queue only

        when = self.now() if submitted is None else submitted
        name = entry_name(when, _safe(job_id), user, nice, begin) if user else ""
        name = name or f"{when:017.6f}-{_safe(job_id)}"
        self._publish(self._stage(b"{}\n"), self._p("queue", name))
        return name

    def queue_entries(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._p("queue")) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def queued_job_ids(self) -> list[str]:
        """The job of every entry, waiting or taken by a dispatch now: a queued record with
        none is one whose writer died between the record and its entry (``gc`` mends it)."""
        from gpuclaim.core.priority import parse_entry

        try:
            names = os.listdir(self._p("queue"))
        except FileNotFoundError:
            return []
        ids = []
        for name in names:
            taken = _TAKEN.match(name)
            entry = parse_entry(taken.group("name") if taken else name)
            if entry is not None:
                ids.append(entry.job_id)
        return ids

    def take_queue_entry(self, name: str) -> bool:
        """Take an entry for dispatch; rename is atomic, so one dispatcher wins. The taken
        name says who took it, so a dispatcher killed meanwhile can be detected (sweep)."""
        taken = self._p("queue", self._taken_name(name))
        try:
            os.rename(self._p("queue", _safe(name)), taken)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(self.root, exc) from exc
        try:
            os.utime(taken)  # taken now: the age a sweep judges by
        except OSError:
            pass
        return True

    def return_queue_entry(self, name: str) -> None:
        """Put a taken entry back at its place (its name keeps its position)."""
        try:
            os.rename(self._p("queue", self._taken_name(name)), self._p("queue", _safe(name)))
        except FileNotFoundError:
            pass

    def _taken_name(self, name: str) -> str:
        return f".taken.{self.host}.{os.getpid()}.{_safe(name)}"

    def _return_abandoned_entries(self, now: float) -> int:
        """Entries taken by a dispatcher that died (here), or long ago (elsewhere), go back."""
        returned = 0
        directory = self._p("queue")
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return 0
        for taken in names:
            parts = _TAKEN.match(taken)
            if parts is None:
                continue
            host, pid_text, name = parts.group("host", "pid", "name")
            path = directory / taken
            try:
                age = now - os.stat(path).st_mtime
            except FileNotFoundError:
                continue
            dead_here = host == self.host and pid_text.isdigit() and not _pid_alive(int(pid_text))
            if dead_here or age > TAKEN_ENTRY_MAX_S:
                try:
                    os.rename(path, directory / name)
                    returned += 1
                except OSError:
                    pass
        return returned

    def finish_queue_entry(self, name: str) -> None:
        _unlink_quiet(self._p("queue", self._taken_name(name)))
        _unlink_quiet(self._p("queue", _safe(name)))
