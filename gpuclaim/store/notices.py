"""What Slack was told already: delivery state, cursors, notices marked once."""

from __future__ import annotations

import json
import os
import time
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

    def take_turn(self, name: str, holder: str, seconds: float) -> bool:
        """A turn at ``name`` (Slack delivery) for ``seconds``, for one holder at a time on
        every host and over ``ssh://`` storage alike: True when taken (or already ``holder``'s).
        A lock could not be held across the agent's requests; a turn that ran out is free,
        so a deliverer that died holds nothing for long."""
        lock = self.try_lock(f"turn-{_safe(name)}")
        if lock is None:
            return False  # someone is taking or giving back a turn this very moment
        with lock:
            turn = self.read_notify(f"turn-{name}.json")
            now = time.time()
            if turn.get("holder") not in (None, holder) and _until(turn) > now:
                return False
            self.write_notify(f"turn-{name}.json", {"holder": holder, "until": now + seconds})
            return True

    def end_turn(self, name: str, holder: str) -> None:
        """Give ``holder``'s turn back at once (another's is left alone; if the moment is
        busy, the turn simply runs out)."""
        for _ in range(20):
            lock = self.try_lock(f"turn-{_safe(name)}")
            if lock is not None:
                with lock:
                    if self.read_notify(f"turn-{name}.json").get("holder") == holder:
                        _unlink_quiet(self._p("notify", _safe(f"turn-{name}.json")))
                return
            time.sleep(0.01)

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


def _until(turn: dict[str, Any]) -> float:
    try:
        return float(turn.get("until", 0))
    except (TypeError, ValueError):
        return 0.0  # a damaged turn file holds nothing
