"""A booking (``gpuclaim reserve``): GPUs of one node held for one user over a future window."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Optional

from gpuclaim.core.model import ClaimedGpu, HoldsGpus, iso
from gpuclaim.core.states import JobState


class BookingEnd(str, Enum):
    """How a booking ended (its record's ``ended_why``; ``reserve --cancel --json``'s state)."""

    OVER = "over"  # its window ran out
    CANCELLED = JobState.CANCELLED.value  # reserve --cancel: the same word as a job's
    NO_SHOW = "no-show"  # nobody used it within the grace: released

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Booking(HoldsGpus):
    """``user`` has ``gpus`` of ``node`` from ``start`` to ``end`` (epoch seconds, storage
    clock). ``used`` is when the owner was first seen holding them in the window."""

    id: str
    user: str
    node: str
    gpus: tuple[ClaimedGpu, ...]
    start: float
    end: float
    note: str = ""
    created: float = 0.0
    host: str = ""
    used: Optional[float] = None
    # A hand-over: held for a moment by one claiming GPUs that preemptible jobs must yield
    # first, so that nobody else takes them meanwhile; dropped once claimed (or at its end).
    handover: bool = False

    @property
    def gpu_hours(self) -> float:
        return len(self.gpus) * (self.end - self.start) / 3600.0

    def overlaps(self, start: float, end: float) -> bool:
        """Half-open windows: one ending at 10:00 and one starting at 10:00 do not overlap."""
        return self.start < end and start < self.end

    def is_open(self, now: float) -> bool:
        return self.start <= now < self.end

    def shares_gpus(self, uuids: Any) -> bool:
        return bool(set(self.uuids) & set(uuids))

    def marked_used(self, ts: float) -> Booking:
        return replace(self, used=ts)

    def to_record(self) -> dict[str, Any]:
        """The file on the storage: epoch seconds, exact."""
        return {
            "id": self.id,
            "user": self.user,
            "node": self.node,
            "gpus": [g.to_dict() for g in sorted(self.gpus, key=lambda g: g.index)],
            "start": self.start,
            "end": self.end,
            "note": self.note,
            "created": self.created,
            "host": self.host,
            "used": self.used,
            "handover": self.handover,
        }

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> Booking:
        gpus = tuple(ClaimedGpu.from_dict(g) for g in d["gpus"])
        if not gpus:
            raise ValueError("a booking without GPUs")
        start, end = float(d["start"]), float(d["end"])
        if end <= start:
            raise ValueError("a booking that ends before it starts")
        used = d.get("used")
        return cls(
            id=str(d["id"]),
            user=str(d["user"]),
            node=str(d["node"]),
            gpus=gpus,
            start=start,
            end=end,
            note=str(d.get("note") or ""),
            created=float(d.get("created") or 0.0),
            host=str(d.get("host") or ""),
            used=None if used is None else float(used),
            handover=bool(d.get("handover", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` shape: ISO 8601 in UTC like every other time gpuclaim prints."""
        return {
            "id": self.id,
            "user": self.user,
            "node": self.node,
            "gpus": self.indices,
            "gpu_uuids": [g.uuid for g in sorted(self.gpus, key=lambda g: g.index)],
            "start": iso(self.start),
            "end": iso(self.end),
            "note": self.note,
            "created": iso(self.created) if self.created else None,
            "used": iso(self.used),
            "handover": self.handover,
        }

    def short_dict(self) -> dict[str, Any]:
        """What a GPU row of ``status --json`` carries."""
        return {"id": self.id, "user": self.user, "start": iso(self.start), "end": iso(self.end)}


@dataclass(frozen=True)
class EndedBooking:
    """A booking that ended (``reservations/ended/``): when, why (a ``BookingEnd``'s word;
    kept as written, a newer gpuclaim's too) and who cancelled it."""

    booking: Booking
    ended: Optional[float] = None
    why: str = ""
    by: Optional[str] = None

    def to_record(self) -> dict[str, Any]:
        return dict(self.booking.to_record(), ended=self.ended, ended_why=self.why, by=self.by)

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> EndedBooking:
        by = d.get("by")
        return cls(
            booking=Booking.from_record(d),
            ended=_number(d.get("ended")),
            why=str(d.get("ended_why") or ""),
            by=None if by is None else str(by),
        )


def _number(value: Any) -> Optional[float]:
    """A time as written, if it is one (only ``gc`` reads it, and falls back on the end)."""
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
