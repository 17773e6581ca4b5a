"""When GPUs will be free, from the time limits of what holds them: the promise a dispatch
pass keeps to each waiting job (its expected start, ``squeue --start``), and whether a later
job may start now without breaking one (backfill).

Each node has *slots*, one per GPU: when that GPU is free for the queue (now; the end of the
claim on it; a booking's end; never, for a GPU busy without a claim). A waiting job *holds*
GPUs of its nodes from its expected start for its time limit; a later job may start now on a
node only where, at every moment until its own end, what is free minus what is held still
leaves room for it (conservative backfill). A job whose start cannot be known (GPUs busy with
no end) keeps the nodes it could use whole, so it cannot be starved.

Standard library only: wrappers dispatch from the nodes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional

from gpuclaim.core.model import Job
from gpuclaim.core.states import GpuState
from gpuclaim.engine.cluster import ClusterView

NEVER = math.inf
Slots = dict[str, list[float]]  # node -> sorted times its GPUs are free


def slots_of(view: ClusterView, nodes: Iterable[str]) -> Slots:
    """The slots of the reachable, undrained ``nodes``."""
    now = view.snapshot.now
    result: Slots = {}
    for node in nodes:
        if node in view.unreachable or node in view.drains:
            continue
        times = []
        for row in view.gpus_of(node):
            if row.state in (GpuState.FREE, GpuState.STALE):
                times.append(now)
            elif row.state == GpuState.CLAIMED and row.claim is not None:
                times.append(max(now, row.claim.expires))
            elif row.state == GpuState.SHARED and row.shares:  # whole once every share ended
                times.append(max(now, max(c.expires for c in row.shares)))
            elif row.state == GpuState.RESERVED and row.booking is not None:
                times.append(max(now, row.booking.end))
            else:
                times.append(NEVER)  # busy without a claim: nobody knows when
        result[node] = sorted(times)
    return result


@dataclass(frozen=True)
class Hold:
    """``count`` GPUs of ``node`` promised to ``job`` from ``start`` to ``end``."""

    job: Job
    node: str
    count: int
    start: float
    end: float


@dataclass
class Plan:
    """The slots of what runs now, and what waiting jobs were promised."""

    now: float
    slots: Slots
    holds: list[Hold] = field(default_factory=list)
    kept: dict[str, Job] = field(default_factory=dict)  # node -> the job it is kept for
    starts: dict[str, float] = field(default_factory=dict)  # job id -> its expected start
    promised: int = 0  # waiting jobs promised something (a start, or nodes kept)

    def free_at(self, node: str, t: float) -> int:
        free = sum(1 for s in self.slots.get(node, ()) if s <= t)
        return free - sum(h.count for h in self.holds if h.node == node and h.start <= t < h.end)

    def fits(self, node: str, count: int, start: float, end: float) -> bool:
        """Room for ``count`` GPUs of ``node`` at every moment from ``start`` to ``end``."""
        if node not in self.slots or len(self.slots[node]) < count:
            return False
        moments = {start} | {s for s in self.slots[node] if start < s < end}
        moments |= {h.end for h in self.holds if h.node == node and start < h.end < end}
        moments |= {h.start for h in self.holds if h.node == node and start < h.start < end}
        return all(self.free_at(node, t) >= count for t in moments)

    def blocker(self, node: str, count: int, end: float) -> Optional[Job]:
        """Who a job of ``count`` GPUs on ``node`` until ``end`` would delay (None: nobody)."""
        if node in self.kept:
            return self.kept[node]
        if self.fits(node, count, self.now, end):
            return None
        holds = [h for h in self.holds if h.node == node and h.start < end]
        return min(holds, key=lambda h: h.start).job if holds else None

    def soonest(self, job: Job, nodes: Sequence[str]) -> tuple[float, tuple[str, ...]]:
        """When ``job`` could start at the soonest on ``nodes`` (a gang: on the
        ``nodes_wanted`` soonest), and where."""
        usable = [n for n in nodes if n not in self.kept and n in self.slots]
        moments = {self.now}
        for node in usable:
            moments |= {s for s in self.slots[node] if self.now < s < NEVER}
            moments |= {h.end for h in self.holds if h.node == node and h.end > self.now}
        for t in sorted(moments):  # the first moment enough nodes have room from, together
            end = t + job.time_limit_s
            room = [n for n in usable if self.fits(n, job.gpus_per_node, t, end)]
            if len(room) >= job.nodes_wanted:
                return t, tuple(room[: job.nodes_wanted])
        return NEVER, ()

    def promise(self, job: Job, nodes: Sequence[str], end_margin: float) -> float:
        """``job`` waits: hold its GPUs from its soonest start (or keep its nodes whole when
        that cannot be known). Returns its expected start (NEVER: unknown)."""
        self.promised += 1
        start, chosen = self.soonest(job, nodes)
        if start == NEVER:
            for node in nodes:
                if len(self.slots.get(node, ())) >= job.gpus_per_node:
                    self.kept.setdefault(node, job)
            return NEVER
        end = start + job.time_limit_s + end_margin
        for node in chosen:
            self.holds.append(Hold(job, node, job.gpus_per_node, start, end))
        self.starts[job.id] = start
        return start
