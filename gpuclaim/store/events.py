"""The accounting history: one append-only log per writer host."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Optional

from gpuclaim.core.model import Event
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import FILE_MODE, _fix_mode, _safe, storage_error


class EventLogPart(StoreBase):
    def append_event(self, event: Event) -> None:
        """Append one JSON line to this host's log; only this host writes that file."""
        line = (json.dumps(event.to_dict(), sort_keys=True, ensure_ascii=True) + "\n").encode()
        # One file per host and user: one writer host per file (NFS appends from two hosts
        # interleave), and the lock that orders this host's writers stays in our home.
        name = f"{self.host}-{os.getuid()}"
        path = self._p("events", f"{name}.jsonl")
        with self._host_lock(f"events-{name}"):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
                try:
                    _fix_mode(fd)
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise storage_error(self.root, exc) from exc

    def read_events(self, types: Optional[Sequence[str]] = None) -> tuple[list[Event], int]:
        """All events of all hosts in time order, and the number of lines that did not parse.
        ``types``: only events of these types; a line that does not hold one of their names
        is not parsed (a year of job events costs a claims summary nothing)."""
        events: list[Event] = []
        bad = 0
        try:
            names = sorted(os.listdir(self._p("events")))
        except FileNotFoundError:
            return events, 0
        words = tuple(json.dumps(t).encode() for t in types) if types is not None else ()
        wanted = set(types) if types is not None else None
        for name in names:
            if not name.endswith(".jsonl"):
                continue
            try:
                data = self._p("events", name).read_bytes()
            except OSError:
                bad += 1
                continue
            for raw in data.splitlines():
                if not raw.strip():
                    continue
                if words and not any(w in raw for w in words):
                    bad += not raw.rstrip().endswith(b"}")  # torn: counted, as parsing would
                    continue
                try:
                    event = Event.from_dict(json.loads(raw.decode("utf-8")))
                except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                    bad += 1  # a torn last line after a crash, or garbage: skip, count
                    continue
                if wanted is None or event.type in wanted:
                    events.append(event)
        events.sort(key=lambda e: e.ts)
        return events, bad

    def event_logs(self) -> list[str]:
        """The per-host logs by name (``<host>-<uid>``), for readers that keep a cursor in
        each (Slack delivery)."""
        try:
            names = os.listdir(self._p("events"))
        except FileNotFoundError:
            return []
        return sorted(n[: -len(".jsonl")] for n in names if n.endswith(".jsonl"))

    def read_event_log(self, name: str, offset: int) -> str:
        """One log from byte ``offset`` on (a last line may still be being written), as text
        of one character per byte (latin-1: the lines are ASCII JSON, and a damaged byte still
        counts one), so that a reader's offsets stay byte offsets over the agent's JSON too."""
        with open(self._p("events", f"{_safe(name)}.jsonl"), "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("latin-1")
