"""Why a queued job has not started: one line that starts with a code (``squeue``'s
REASON), e.g. ``Resources: needs 2 GPUs on one node; node01 has 1 free, node02 0``.

Standard library only: wrappers dispatch from the nodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.model import Job
from gpuclaim.core.share_policy import gpu_count
from gpuclaim.core.states import GpuState, ReasonCode
from gpuclaim.core.when import format_when
from gpuclaim.engine.bookings import blocking
from gpuclaim.engine.cluster import ClusterView
from gpuclaim.engine.share_placement import shares_text


@dataclass(frozen=True)
class Reason:
    """Why a queued job waits: its REASON code, and the words that go with it."""

    code: ReasonCode
    text: str

    @property
    def line(self) -> str:
        return f"{self.code}: {self.text}"

    def to_dict(self) -> dict[str, Any]:
        return {"code": str(self.code), "text": self.text}


def begin_time(begin: float, now: float) -> Reason:
    return Reason(ReasonCode.BEGIN_TIME, format_when(begin, now))


def user_limit(limit: int, user: str, held: float) -> Reason:
    return Reason(
        ReasonCode.USER_LIMIT, f"max_gpus_per_user = {limit}, {user} holds {gpu_count(held)}"
    )


def array_limit(limit: int) -> Reason:
    return Reason(ReasonCode.ARRAY_LIMIT, f"%{limit} running")


def dependency(why: str) -> Reason:
    return Reason(ReasonCode.DEPENDENCY, why)


def nodes_out(view: ClusterView, job: Job, nodes: Sequence[str]) -> Optional[Reason]:
    """When every node it may use is drained or unreachable: which."""
    usable = [n for n in nodes if n not in view.drains and n not in view.unreachable]
    if usable:
        return None
    drained = [n for n in nodes if n in view.drains]
    if drained:
        return Reason(ReasonCode.DRAINED, ", ".join(drained))
    return Reason(ReasonCode.UNREACHABLE, ", ".join(nodes) + " cannot be reached")


def priority(ahead: int, first: Job) -> Reason:
    jobs = f"{ahead} job{'s' if ahead != 1 else ''} ahead"
    return Reason(ReasonCode.PRIORITY, f"{jobs} ({first.user}'s {first.name} first)")


def own_booking_closed(job: Job, bookings: Sequence[Booking], now: float) -> Optional[Reason]:
    """A job of ``--reservation ID`` waits for that booking to open."""
    for b in bookings:
        if b.id == job.reservation and not b.is_open(now):
            return Reason(
                ReasonCode.RESERVATION, f"its booking {b.id} opens {format_when(b.start, now)}"
            )
    return None


def resources(view: ClusterView, job: Job, free: dict[str, int], until: float) -> Reason:
    """Not enough GPUs where it may run (``free``: how many each usable node has for it), or
    the booking of someone else that holds the ones that would do."""
    now = view.snapshot.now
    counts: list[str] = []
    booked: dict[str, tuple[Booking, list[int]]] = {}
    for node, count in free.items():
        counts.append(f"{node} has {count} free" if not counts else f"{node} {count}")
        for row in view.gpus_of(node):
            if row.state not in (GpuState.FREE, GpuState.STALE, GpuState.RESERVED):
                continue
            b = blocking(view.snapshot.bookings, row.uuid or "", job.user, now, until)
            if b is not None:
                booked.setdefault(b.id, (b, []))[1].append(row.index or 0)
    if booked and _booking_decides(job, free, booked):
        b, gpus = min(booked.values(), key=lambda x: x[0].start)
        return Reason(
            ReasonCode.RESERVATION,
            f"{b.node} GPUs {','.join(map(str, sorted(gpus)))} booked by {b.user} "
            f"until {format_when(b.end, now)}",
        )
    kind = "GPU" if job.mig is None else ("MIG slice" if job.mig == "any" else f"{job.mig} slice")
    want = f"{job.gpus_per_node} {kind}{'s' if job.gpus_per_node != 1 else ''}"
    where = "on one node" if job.nodes_wanted == 1 else f"on each of {job.nodes_wanted} nodes"
    shared = [
        f"{node} GPU {r.label} is shared ({shares_text(r)})"
        for node in free
        for r in view.gpus_of(node)
        if r.state == GpuState.SHARED
    ]
    tail = f"; {', '.join(shared[:3])}" if shared else ""
    return Reason(ReasonCode.RESOURCES, f"needs {want} {where}; {', '.join(counts)}{tail}")


def _booking_decides(
    job: Job, free: dict[str, int], booked: dict[str, tuple[Booking, list[int]]]
) -> bool:
    """Would it fit if the bookings in its way were not there?"""
    fitting = 0
    for node, count in free.items():
        extra = sum(len(g) for b, g in booked.values() if b.node == node)
        fitting += count + extra >= job.gpus_per_node
    return fitting >= job.nodes_wanted
