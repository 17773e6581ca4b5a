"""Clearing what crashed writers left behind: staged files, abandoned queue entries."""

from __future__ import annotations

import os
from pathlib import Path

from gpuclaim.store.files import _pid_alive, _unlink_quiet
from gpuclaim.store.queue import QueuePart


class SweepPart(QueuePart):
    def sweep(self, max_age_s: float = 3600.0) -> int:
        """Remove what killed processes left behind: staged files and abandoned locks."""
        removed = 0
        now = self.now()
        removed += self._return_abandoned_entries(now)
        for sub in ("tmp", "locks"):
            directory = self._p(sub)
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            for name in names:
                path = directory / name
                if sub == "locks":
                    dead = name.endswith(".lock") and self._lock_abandoned(path)
                    dead = dead or ".broken." in name
                else:
                    dead = self._staged_file_abandoned(name, path, now, max_age_s)
                if dead:
                    _unlink_quiet(path)
                    removed += 1
        return removed

    def _staged_file_abandoned(self, name: str, path: Path, now: float, max_age_s: float) -> bool:
        # host.pid.nonce, from the right: a host name may hold dots (node01.lab.example)
        parts = name.rsplit(".", 2)
        host, pid_text = (parts[0], parts[1]) if len(parts) == 3 else ("", "")
        if host == self.host and pid_text.isdigit() and not _pid_alive(int(pid_text)):
            return True
        try:
            return now - os.stat(path).st_mtime > max_age_s
        except FileNotFoundError:
            return False
