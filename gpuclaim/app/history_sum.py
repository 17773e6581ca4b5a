"""A kept sum of the event logs for ``history``: each reader keeps the claims' and bookings'
ends it has read so far, and where it stopped in each log, so a year of events is parsed once
and each later ``history`` reads only what was appended since.

The logs are append-only (``store/events.py``): a log that is shorter than where this reader
stopped, or whose byte before that point is not the end of a line, was replaced; the sum is
then read again from the start. The sum is this user's own file (it holds no more than the
logs, which the user can read anyway), written whole and renamed into place."""

from __future__ import annotations

import json
import os
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpuclaim.app.history import BOOKING_END_EVENTS, END_EVENTS, Interval, ended_interval
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.model import Event
from gpuclaim.store import Store

SUM_VERSION = 1
_WORDS = tuple(json.dumps(t).encode() for t in (*END_EVENTS, *BOOKING_END_EVENTS))


@dataclass
class HistorySum:
    """What ``history`` sums, from every log: one interval per ended claim (its first end),
    the bookings' end events, and how many lines did not parse."""

    intervals: dict[str, Interval] = field(default_factory=dict)
    bookings: list[dict[str, Any]] = field(default_factory=list)
    bad: int = 0
    offsets: dict[str, int] = field(default_factory=dict)  # by log: bytes read (whole lines)
    # logs that end in a line with no end yet: one being written, or torn by a crash. Not
    # kept (read again next time), but said: a torn one stays so, and is damage to report
    unfinished: int = 0

    def booking_events(self) -> list[Event]:
        """In time order, as ``read_events`` gives them (the first end of each is counted)."""
        return sorted((Event.from_dict(d) for d in self.bookings), key=lambda e: e.ts)


def sum_path(store: Store) -> Optional[Path]:
    from gpuclaim.core import paths

    store_id = store.store_id(stamp=False)
    if not store_id:
        return None  # a store without an ID: read whole each time, nothing kept
    return paths.data_dir() / "history" / f"{store_id}.json"


def read_sum(store: Store, path: Optional[Path]) -> HistorySum:
    """The kept sum brought up to date with every log (kept again when it grew)."""
    kept = _load(path) if path is not None else HistorySum()
    names = store.event_logs()
    if path is not None and set(kept.offsets) - set(names):
        return _rebuild(store, path)  # a log it summed is gone: sum what there is now
    grew = False
    for name in names:
        offset = kept.offsets.get(name, 0)
        try:
            text = store.read_event_log(name=name, offset=max(0, offset - 1))
        except (GpuclaimError, OSError):
            kept.unfinished += 1  # unreadable now (gone, no permission): said, read next time
            continue
        if offset and not text.startswith("\n"):  # replaced, not appended to: from the start
            return _rebuild(store, path) if path is not None else kept
        new = text[1:] if offset else text
        end = new.rfind("\n") + 1  # a last line still being written waits for the next read
        kept.unfinished += bool(new[end:].strip())
        if end:
            _fold(kept, new[:end].encode("latin-1"))
            kept.offsets[name] = offset + end
            grew = True
    if grew and path is not None:
        _save(path, kept)
    return kept


def _rebuild(store: Store, path: Path) -> HistorySum:
    try:
        path.unlink()
    except OSError:
        pass
    fresh = read_sum(store, None)
    _save(path, fresh)
    return fresh


def _fold(kept: HistorySum, data: bytes) -> None:
    for raw in data.splitlines():
        if not raw.strip():
            continue
        if not any(w in raw for w in _WORDS):  # no end of a claim or a booking: not parsed
            kept.bad += not raw.rstrip().endswith(b"}")  # torn: counted, as parsing would
            continue
        try:
            d = json.loads(raw.decode("utf-8"))
            event = Event.from_dict(d)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            kept.bad += 1
            continue
        if event.type in BOOKING_END_EVENTS:
            kept.bookings.append(d)
            continue
        interval = ended_interval(event) if event.type in END_EVENTS else None
        if interval is None:
            continue
        known = kept.intervals.get(interval.claim_id)
        if known is None or interval.end < known.end:  # a claim ends once: its first end
            kept.intervals[interval.claim_id] = interval  # (a second: a race in gc)


def _load(path: Path) -> HistorySum:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != SUM_VERSION:
            return HistorySum()
        intervals = {row[0]: Interval(*row) for row in data["intervals"]}
        return HistorySum(intervals, list(data["bookings"]), int(data["bad"]), data["offsets"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return HistorySum()  # none yet, or damaged: read the logs again


def _save(path: Path, kept: HistorySum) -> None:
    body = {
        "version": SUM_VERSION,
        "offsets": kept.offsets,
        "bad": kept.bad,
        "intervals": [astuple(iv) for iv in kept.intervals.values()],
        "bookings": kept.bookings,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body, separators=(",", ":")), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass  # a read-only home: history still works, it reads the logs each time
