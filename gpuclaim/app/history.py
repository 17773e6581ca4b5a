"""Accounting: GPU-hours per user, node or day, from the event log and the live claims."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from gpuclaim.core.events import event_gpu_weight
from gpuclaim.core.model import Event, EventType, iso
from gpuclaim.core.records import UsageSummary
from gpuclaim.store import Snapshot

END_EVENTS = (EventType.RELEASE, EventType.FORCE_RELEASE, EventType.EXPIRE, EventType.REAP)
GROUPINGS = ("user", "node", "day")


@dataclass(frozen=True)
class Interval:
    """One claim's hold on ``gpus`` GPUs from ``start`` to ``end`` (epoch seconds)."""

    claim_id: str
    user: str
    node: str
    gpus: int
    start: float
    end: float
    open: bool  # still held now
    note: str = ""
    job: str = ""  # the job's name, for a job's claim
    preemptible: bool = False  # a run --preemptible job's: scavenged, accounted apart
    share: float = 1.0  # a share's part of its GPU (--gpu-mem): GPU-hours weighted by it

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.share * max(0.0, self.end - self.start) / 3600.0


def claim_intervals(events: Iterable[Event], snap: Optional[Snapshot] = None) -> list[Interval]:
    """Each ended claim once (its end event carries since and end), plus the claims held now."""
    intervals: dict[str, Interval] = {}
    for ev in events:
        interval = ended_interval(ev)
        if interval is not None and interval.claim_id not in intervals:
            # a claim ends once; a second end record (a race in gc) is not double pay
            intervals[interval.claim_id] = interval
    return with_held(intervals, snap)


def ended_interval(ev: Event) -> Optional[Interval]:
    """The hold a claim's end event closes; None for any other event."""
    if ev.type not in END_EVENTS or not ev.claim_id or ev.since is None:
        return None
    note = str(ev.extra.get("note") or "")
    return Interval(
        ev.claim_id,
        ev.user,
        ev.node or "?",
        len(ev.gpus),
        ev.since,
        ev.ts,
        False,
        note,
        _job_of(note),
        bool(ev.extra.get("preemptible", False)),
        event_gpu_weight(ev) / max(1, len(ev.gpus)),
    )


def with_held(ended: dict[str, Interval], snap: Optional[Snapshot]) -> list[Interval]:
    """The ended holds and, from ``snap``, the claims held now, by start."""
    intervals = dict(ended)
    if snap is not None:
        for cid, status in snap.claims.items():
            if cid in intervals:
                continue
            c = status.claim
            end = min(snap.now, c.expires)
            intervals[cid] = Interval(
                cid,
                c.user,
                c.node,
                len(c.gpus),
                c.since,
                end,
                True,
                c.note,
                _job_of(c.note),
                c.preemptible,
                c.fraction,
            )
    return sorted(intervals.values(), key=lambda i: i.start)


def _job_of(note: str) -> str:
    """A job's claims carry the note 'job NAME' or 'job NAME rank K' (jobs.place_and_claim)."""
    return note[4:].split(" rank ", 1)[0] if note.startswith("job ") else ""


def summarize(
    intervals: Iterable[Interval],
    by: str = "user",
    since: Optional[float] = None,
    until: Optional[float] = None,
    user: Optional[str] = None,
    usage: Optional[dict[str, UsageSummary]] = None,
) -> list[dict[str, Any]]:
    """GPU-hours grouped ``by`` user, node or (UTC) day, clipped to [since, until], with the
    part of them the GPUs were actually busy where utilisation was sampled, and the part
    that preemptible jobs used (scavenged: idle GPUs that yielded to anyone who came)."""
    if by not in GROUPINGS:
        raise ValueError(f"group by one of {GROUPINGS}")
    totals: dict[str, dict[str, Any]] = {}
    for iv in intervals:
        if user and iv.user != user:
            continue
        start = max(iv.start, since) if since is not None else iv.start
        end = min(iv.end, until) if until is not None else iv.end
        if end <= start:
            continue
        for key, seg_start, seg_end in _segments(iv, by, start, end):
            row = totals.setdefault(
                key,
                {
                    by: key,
                    "gpu_hours": 0.0,
                    "claims": set(),
                    "busy": 0.0,
                    "measured": 0.0,
                    "preemptible": 0.0,
                },
            )
            hours = iv.gpus * (seg_end - seg_start) / 3600.0
            row["gpu_hours"] += hours
            if iv.preemptible:
                row["preemptible"] += hours
            row["claims"].add(iv.claim_id)
            fraction = _busy_fraction((usage or {}).get(iv.claim_id))
            if fraction is not None:
                row["busy"] += hours * fraction
                row["measured"] += hours
    result = []
    for key in sorted(totals):
        row = totals[key]
        result.append(
            {
                by: key,
                "gpu_hours": round(row["gpu_hours"], 3),
                "preemptible_gpu_hours": round(row["preemptible"], 3),
                "claims": len(row["claims"]),
                "busy_gpu_hours": round(row["busy"], 3) if row["measured"] else None,
                "utilization_pct": (
                    round(100 * row["busy"] / row["measured"], 1) if row["measured"] else None
                ),
            }
        )
    if by != "day":
        result.sort(key=lambda r: -r["gpu_hours"])
    return result


def _busy_fraction(summary: Optional[UsageSummary]) -> Optional[float]:
    """Busy share of a claim's sampled GPU time, or None if it was never sampled."""
    if not summary:
        return None
    held = float(summary.get("held_gpu_s", 0.0))
    if held <= 0:
        return None
    return min(1.0, float(summary.get("busy_gpu_s", 0.0)) / held)


def _segments(iv: Interval, by: str, start: float, end: float) -> list[tuple[str, float, float]]:
    if by == "user":
        return [(iv.user, start, end)]
    if by == "node":
        return [(iv.node, start, end)]
    out = []
    cursor = start
    while cursor < end:
        day = dt.datetime.fromtimestamp(cursor, tz=dt.timezone.utc).date()
        next_midnight = dt.datetime.combine(
            day + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc
        ).timestamp()
        seg_end = min(end, next_midnight)
        out.append((day.isoformat(), cursor, seg_end))
        cursor = seg_end
    return out


def interval_dict(iv: Interval) -> dict[str, Any]:
    return {
        "claim_id": iv.claim_id,
        "user": iv.user,
        "node": iv.node,
        "gpus": iv.gpus,
        "start": iso(iv.start),
        "end": iso(iv.end),
        "open": iv.open,
        "gpu_hours": round(iv.gpu_hours, 3),
        "preemptible": iv.preemptible,
        "job": iv.job or None,
        "note": iv.note if iv.note and not iv.job else None,
    }


BOOKING_END_EVENTS = (EventType.RESERVE_END, EventType.RESERVE_NOSHOW, EventType.RESERVE_CANCEL)


def booking_usage(
    events: Iterable[Event],
    intervals: Iterable[Interval],
    since: Optional[float] = None,
    until: Optional[float] = None,
) -> dict[str, dict[str, Any]]:
    """Per user: GPU-hours booked (while each booking held its GPUs: to its end, its cancel
    or its release as a no-show) and the part of them the owner held no claim on that node,
    clipped to [since, until]; and how many bookings were no-shows."""
    claims_by: dict[tuple[str, str], list[Interval]] = {}
    for iv in intervals:
        claims_by.setdefault((iv.user, iv.node), []).append(iv)
    result: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for ev in events:
        rid = str(ev.extra.get("reservation") or "")
        if ev.type not in BOOKING_END_EVENTS or not rid or rid in seen or ev.since is None:
            continue
        seen.add(rid)
        start = ev.since if since is None else max(ev.since, since)
        end = min(ev.ts, ev.expires or ev.ts)
        end = end if until is None else min(end, until)
        row = result.setdefault(
            ev.user, {"booked_gpu_hours": 0.0, "unused_gpu_hours": 0.0, "no_shows": 0}
        )
        row["no_shows"] += ev.type == EventType.RESERVE_NOSHOW
        if end <= start:
            continue
        booked = len(ev.gpus)
        row["booked_gpu_hours"] += booked * (end - start) / 3600.0
        held = claims_by.get((ev.user, ev.node or "?"), [])
        row["unused_gpu_hours"] += _uncovered(booked, start, end, held) / 3600.0
    for row in result.values():
        row["booked_gpu_hours"] = round(row["booked_gpu_hours"], 3)
        row["unused_gpu_hours"] = round(row["unused_gpu_hours"], 3)
    return result


def _uncovered(booked: int, start: float, end: float, held: list[Interval]) -> float:
    """GPU-seconds of ``booked`` GPUs over [start, end) not matched by claims held then."""
    points = sorted(
        {start, end, *(t for iv in held for t in (iv.start, iv.end) if start < t < end)}
    )
    total = 0.0
    for a, b in zip(points, points[1:]):
        claimed = sum(iv.gpus for iv in held if iv.start <= a and iv.end >= b)
        total += max(0, booked - claimed) * (b - a)
    return total
