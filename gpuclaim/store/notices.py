"""What Slack was told already: delivery state, cursors, notices marked once."""

from __future__ import annotations

import json
import os
from typing import Any

from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import FILE_MODE, _encode, _fix_mode, _safe, _unlink_quiet, storage_error


class NoticesPart(StoreBase):
    def notify_state(self) -> dict[str, Any]:
        """What Slack delivery last ran into (for doctor)."""
        return self.read_notify("state.json")

    def read_notify(self, name: str) -> dict[str, Any]:
        """One of Slack delivery's small state files (cursors, state.json); {} if none."""
        try:
            data = json.loads(self._p("notify", _safe(name)).read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write_notify(self, name: str, data: dict[str, Any]) -> None:
        """Replace one of those files whole, group-shared like every file of the store."""
        self._publish(self._stage(_encode(data), sync=False), self._p("notify", _safe(name)))

    def mark_notices(self, scope: str, keys: list[str]) -> list[str]:
        """Remember which conditions of ``scope`` hold now; return those that are new (each
        notice goes out once per episode: a GPU busy again later is news again)."""
        directory = self._p("notify", "seen")
        wanted = {f"{scope}--{_safe(k)}" for k in keys}
        new = []
        for name in sorted(wanted):
            try:
                fd = os.open(directory / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
            _fix_mode(fd)
            os.close(fd)
            new.append(name.split("--", 1)[1])
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return new
        for name in names:
            if name.startswith(f"{scope}--") and name not in wanted:
                _unlink_quiet(directory / name)
        return new
