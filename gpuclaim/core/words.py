"""The words of the records (event types, job kinds) and their timestamps' text: the
lowest layer of the domain, shared by claims, events and jobs."""

from __future__ import annotations

import datetime as dt
from enum import Enum
from typing import Any, Optional, TypeVar

from gpuclaim.core.states import GpuState


class _Word(str, Enum):
    """A word of the records named in code: a member == its string, json-dumps and formats
    as it (``repr`` alone shows the member)."""

    def __str__(self) -> str:
        return str(self.value)


_W = TypeVar("_W", bound=_Word)


def _parsed(words: type[_W], value: str) -> Optional[_W]:
    try:
        return words(value)
    except ValueError:
        return None


class EventType(_Word):
    """What an event of the log records (``Event.type``). The values are what events.jsonl
    holds; a type this version does not know (a newer gpuclaim's) is read and kept as text."""

    CLAIM = "claim"
    RELEASE = "release"
    EXPIRE = "expire"
    FORCE_RELEASE = "force-release"
    EXTEND = "extend"
    REAP = "reap"  # an abandoned claim (a damaged or lost one) collected
    DRAIN = "drain"
    UNDRAIN = "undrain"
    BUSY_UNCLAIMED = GpuState.BUSY_UNCLAIMED.value  # a GPU in use without a claim
    NODE_UNREACHABLE = "node-unreachable"
    CLAIM_IDLE = "claim-idle"
    CLAIM_EXPIRING = "claim-expiring"
    JOB_QUEUED = "job-queued"
    JOB_START = "job-start"
    JOB_END = "job-end"
    JOB_CANCELLED = "job-cancelled"  # it never ran: what it waited for did not succeed
    FORCE_KILL = "force-kill"
    PREEMPT = "preempt"  # a preemptible job was asked to yield its GPUs to someone's claim
    SERVICE_DOWN = "service-down"  # a service exited or stopped answering: it restarts
    SERVICE_BACK = "service-back"  # ... and answers again
    ARRAY_QUEUED = "array-queued"
    ARRAY_START = "array-start"
    ARRAY_END = "array-end"
    RESERVE = "reserve"
    RESERVE_CANCEL = "reserve-cancel"
    RESERVE_OPEN = "reserve-open"
    RESERVE_NOSHOW = "reserve-noshow"
    RESERVE_END = "reserve-end"
    REFUSED = "refused"  # a job its owner's spec does not vouch for (forged?): never run
    OWNER_TURN = "owner-turn"  # a queued job fits, and only its owner's processes may start it
    SHARE_EXCEEDED = "share-exceeded"  # a share's job used more of its GPU than its share


def event_type(value: str) -> Optional[EventType]:
    """The EventType a logged type names; None for one this version does not know."""
    return _parsed(EventType, value)


class JobKind(_Word):
    """What a job is (``Job.kind``): a command, or an interactive shell or notebook. A kind
    this version does not know (a newer gpuclaim's) is read and kept as text."""

    BATCH = "batch"
    SHELL = "shell"
    NOTEBOOK = "notebook"
    SERVICE = "service"  # gpuclaim serve: kept up, restarted, with a port


def job_kind(value: str) -> Optional[JobKind]:
    """The JobKind a record's kind names; None for one this version does not know."""
    return _parsed(JobKind, value)


def iso(ts: Optional[float]) -> Optional[str]:
    """Epoch seconds -> ISO 8601 in UTC with a Z, as used in every JSON shape."""
    if ts is None:
        return None
    when = dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: Any) -> Optional[float]:
    """ISO 8601 (or epoch number) -> epoch seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    when = dt.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()
