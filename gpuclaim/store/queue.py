"""The queue of jobs that did not fit: entries taken for dispatch and given back."""

from __future__ import annotations

import os

from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import TAKEN_ENTRY_MAX_S, _pid_alive, _safe, _unlink_quiet, storage_error


class QueuePart(StoreBase):
    def enqueue(self, job_id: str, user: str = "", nice: int = 0, begin: float = 0.0) -> str:
        """Append a job to the queue. Its name says what ordering it needs (submission time
        on the storage clock, user, nice, begin), so a dispatch pass reads no record for it."""
        from gpuclaim.core.priority import entry_name  # here: every look lists the queue only

        name = entry_name(self.now(), _safe(job_id), user, nice, begin) if user else ""
        name = name or f"{self.now():017.6f}-{_safe(job_id)}"
        self._publish(self._stage(b"{}\n"), self._p("queue", name))
        return name

    def queue_entries(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._p("queue")) if not n.startswith("."))
        except FileNotFoundError:
            return []

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
            if not taken.startswith(".taken."):
                continue
            host, pid_text, name = taken[len(".taken.") :].split(".", 2)
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
