"""Where a claim goes: the GPUs a user may take now (free, or inside their own booking, and
not inside anyone else's before the claim ends), best fit across nodes, or exactly the ones
named; and why nothing fits when nothing does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config, NodeConfig
from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    NeverFitsError,
    UnreachableError,
    UsageError,
)
from gpuclaim.core.states import GpuState
from gpuclaim.engine.bookings import backfill_hint, blocked_message, blocking
from gpuclaim.engine.cluster import ClusterView, GpuRow


@dataclass(frozen=True)
class ClaimRequest:
    """What a claim asks for: ``count`` GPUs (on ``node``, or exactly ``exact``), for whom,
    how long, and on what terms."""

    user: str
    count: int = 1  # with ``reservation``, 0: all of the booking's GPUs
    node: Optional[str] = None
    exact: tuple[tuple[str, tuple[str, ...]], ...] = ()  # ((node, ("0", "2")),) from --gpu
    duration_s: Optional[float] = None
    note: str = ""
    job: Optional[str] = None
    adopt: bool = False
    reservation: Optional[str] = None  # claim exactly the GPUs of one's own booking
    preemptible: bool = False  # a run --preemptible job's: yields to others, preempts nobody
    service: bool = False  # a service's (serve): max_service_time, not max_time
    keep_when_idle: bool = False  # ... that the idle policy never releases
    gpu_mem_mib: int = 0  # a share of one GPU (--gpu-mem): this much of its memory
    gpu_share: float = 0.0  # ... or this part of it (--gpu-share)
    mig: Optional[str] = None  # MIG slices of this profile (--mig 3g.40gb; "any": any slice)

    @property
    def shared(self) -> bool:
        return self.gpu_mem_mib > 0 or self.gpu_share > 0


def kind_fits(row: GpuRow, req: ClaimRequest) -> bool:
    """Whole GPUs for a plain request, MIG slices (of its profile) for ``--mig``: a 1g.10gb
    slice handed to ``-n 1`` would surprise, and a GPU in MIG mode is never whole."""
    if req.mig is None:
        return row.mig is None
    profile = row.gpu.mig_profile if row.gpu is not None else None
    return row.mig is not None and req.mig in ("any", profile)


def profiles_on(rows: Sequence[GpuRow]) -> list[str]:
    """The MIG profiles of these rows' slices, each once, as the node has them."""
    found: list[str] = []
    for r in rows:
        profile = r.gpu.mig_profile if r.gpu is not None else None
        if r.mig is not None and profile and profile not in found:
            found.append(profile)
    return found


def hold_until(row: GpuRow, req: ClaimRequest, now: float, until: float) -> float:
    """A claim inside one's own open booking without --time ends with the booking (as a SLURM
    job in a reservation does), so it never runs into the next one's window."""
    b = row.booking
    if b is not None and b.handover:
        return until  # a hand-over lasts only while preemptible jobs yield: no end of a claim
    if req.duration_s is None and b is not None and b.user == req.user and b.is_open(now):
        return min(until, b.end)
    return until


def bookings_against(req: ClaimRequest, bookings: Sequence[Booking]) -> list[Booking]:
    """The bookings that keep ``req`` off their GPUs: all, but for preemptible work only the
    ones whose owner came (or a hand-over): until then it may use them, and yields to them."""
    if not req.preemptible:
        return list(bookings)
    return [b for b in bookings if b.handover or b.used is not None]


def usable_rows(view: ClusterView, node: str, req: ClaimRequest, until: float) -> list[GpuRow]:
    """The node's GPUs ``req``'s user may claim until ``until``: free (or stale), or reserved
    for them, and not inside anyone else's booking before then. Their own booked ones first."""
    now = view.snapshot.now
    bookings = bookings_against(req, view.snapshot.bookings)
    rows = []
    for r in view.gpus_of(node):
        if not r.uuid or not kind_fits(r, req):
            continue
        if r.state == GpuState.RESERVED:
            b = r.booking
            if b is None or not (b.user == req.user or b not in bookings):
                continue
        elif r.state not in (GpuState.FREE, GpuState.STALE):
            continue
        if blocking(bookings, r.uuid, req.user, now, hold_until(r, req, now, until)) is None:
            rows.append(r)
    return sorted(
        rows, key=lambda r: (not mine_open(r, req.user, now), r.state != GpuState.FREE, r.order)
    )


def mine_open(row: GpuRow, user: str, now: float) -> bool:
    return row.booking is not None and row.booking.user == user and row.booking.is_open(now)


def candidate_nodes(config: Config, req: ClaimRequest) -> list[NodeConfig]:
    if req.exact:
        names = []
        for node, _ in req.exact:
            if node not in names:
                names.append(node)
        if len(names) > 1:
            raise UsageError("one claim holds GPUs of one node; use one --gpu NODE:I,J")
        return [config.node(names[0])]
    if req.node:
        return [config.node(req.node)]
    return list(config.nodes)


def pick_free(
    config: Config, view: ClusterView, req: ClaimRequest, duration: float
) -> tuple[str, list[GpuRow]]:
    reachable = [n.name for n in candidate_nodes(config, req) if n.name not in view.unreachable]
    if not reachable:
        raise UnreachableError(
            "no node could be asked about its GPUs: "
            + "; ".join(f"{n}: {view.inventories[n].error}" for n in view.unreachable)
        )
    sizes = {n: sum(kind_fits(r, req) for r in view.gpus_of(n)) for n in reachable}
    if req.count > max(sizes.values()):
        raise _never_fits(view, req, reachable, max(sizes.values()))
    until = view.snapshot.now + duration
    candidates: list[tuple[bool, int, int, str, list[GpuRow]]] = []
    for order, node in enumerate(reachable):
        if node in view.drains:
            continue
        free = usable_rows(view, node, req, until)
        if len(free) >= req.count:
            booked = sum(mine_open(r, req.user, view.snapshot.now) for r in free)
            candidates.append((booked < req.count, len(free), order, node, free))
    if not candidates:
        raise ConflictError(*_nothing_free_message(view, req, reachable, until))
    # One's own open booking first; then best fit: the node with the fewest free GPUs that
    # still fits, so big requests keep room.
    _, _, _, node, free = min(candidates, key=lambda c: (c[0], c[1], c[2]))
    return node, sorted(free[: req.count], key=lambda r: r.order)


def _never_fits(
    view: ClusterView, req: ClaimRequest, nodes: list[str], most: int
) -> NeverFitsError:
    """Too many GPUs for any node; or, with MIG slices about, the kind that is there."""
    profiles = profiles_on([r for n in nodes for r in view.gpus_of(n)])
    if req.mig is not None and most == 0:
        where = req.node or "any node"
        have = f" (there are {', '.join(profiles)})" if profiles else ""
        what = "MIG slices" if req.mig == "any" else f"MIG slices of {req.mig}"
        return NeverFitsError(f"no {what} on {where}{have}", hint="see 'gpuclaim status'")
    if req.mig is None and most == 0 and profiles:
        where = req.node or "the nodes"
        return NeverFitsError(
            f"{where}: every GPU is in MIG mode, none is handed out whole",
            hint=f"ask for a slice: --mig {profiles[0]} (slices there: {', '.join(profiles)})",
        )
    where = f"{req.node} has" if req.node else "the largest node has"
    kind = "GPUs" if req.mig is None else "slices"
    return NeverFitsError(
        f"{req.count} {kind} can never fit: {where} {most}",
        hint="ask for fewer GPUs (a claim holds GPUs of one node)",
    )


def pick_exact(view: ClusterView, req: ClaimRequest, duration: float) -> tuple[str, list[GpuRow]]:
    node, indices = req.exact[0]
    if node in view.unreachable:
        raise UnreachableError(f"{node} cannot be reached: {view.inventories[node].error}")
    if node in view.drains:
        raise ConflictError(_drain_message(view, node))
    by_index = {r.label: r for r in view.gpus_of(node)}
    rows = []
    for index in map(str, indices):  # labels; an int from an API caller names a GPU too
        row = by_index.get(index)
        if row is None:
            raise NeverFitsError(
                f"{node} has no GPU {index} (it has {_index_list(list(by_index.values()))})"
            )
        if row.state == GpuState.CLAIMED and row.claim is not None:
            raise ConflictError(f"{node} GPU {index} is held by {row.claim.user} ({row.claim.id})")
        if row.state == GpuState.BUSY_UNCLAIMED:
            raise ConflictError(f"{node} GPU {index} is busy: {row.reason}")
        rows.append(row)
    now = view.snapshot.now
    against = bookings_against(req, view.snapshot.bookings)
    for row in rows:
        until = hold_until(row, req, now, now + duration)
        b = blocking(against, row.uuid or "", req.user, now, until)
        if b is not None:
            shared = [r.label for r in rows if r.uuid in b.uuids]
            raise ConflictError(blocked_message(b, shared, now, until), hint=backfill_hint(b, now))
    return node, rows


def pick_adopt(view: ClusterView, req: ClaimRequest) -> tuple[str, list[GpuRow]]:
    mine: dict[str, list[GpuRow]] = {}
    for row in view.rows:
        if row.gpu is None or row.state == GpuState.CLAIMED:
            continue
        if any(p.user == req.user for p in row.gpu.processes):
            mine.setdefault(row.node, []).append(row)
    if not mine:
        raise GpuclaimError(
            f"no unclaimed GPU runs a process of {req.user}",
            hint="start your job first, or claim with -n",
        )
    if len(mine) > 1:
        raise UsageError(
            "your processes use GPUs on several nodes: "
            + ", ".join(sorted(mine))
            + "; pick one with --node"
        )
    node, rows = next(iter(mine.items()))
    return node, sorted(rows, key=lambda r: r.order)


def _nothing_free_message(
    view: ClusterView, req: ClaimRequest, nodes: list[str], until: float
) -> tuple[str, Optional[str]]:
    """Why nothing fits, and a hint: the bookings in the way say who and from when."""
    parts = []
    now = view.snapshot.now
    in_way: dict[str, tuple[Booking, list[str]]] = {}
    for node in nodes:
        if node in view.drains:
            parts.append(f"{node} drained")
            continue
        rows = [r for r in view.gpus_of(node) if kind_fits(r, req)]
        free = len(usable_rows(view, node, req, until))
        parts.append(f"{node} {free}/{len(rows)} free")
        for r in rows:
            b = blocking(view.snapshot.bookings, r.uuid or "", req.user, now, until)
            if b is not None and r.state in (GpuState.FREE, GpuState.STALE, GpuState.RESERVED):
                in_way.setdefault(b.id, (b, []))[1].append(r.label)
        shared = [
            f"{node} GPU {r.label} is shared ({r.shares_text})"
            for r in rows
            if r.state == GpuState.SHARED
        ]
        if shared:
            parts[-1] += ": " + ", ".join(shared)
    want = f"{req.count} GPU{'s' if req.count != 1 else ''}"
    if req.mig is not None:
        kind = "MIG slice" if req.mig == "any" else f"{req.mig} slice"
        want = f"{req.count} {kind}{'s' if req.count != 1 else ''}"
    text = f"no node has {want} free now ({', '.join(parts)})"
    if not in_way:
        return text, None
    text += ": " + "; ".join(blocked_message(b, g, now, until) for b, g in in_way.values())
    soonest = min((b for b, _ in in_way.values()), key=lambda b: b.start)
    return text, backfill_hint(soonest, now)


def _drain_message(view: ClusterView, node: str) -> str:
    info = view.drains[node]
    reason = f": {info.get('reason')}" if info.get("reason") else ""
    return f"{node} is drained by {info.get('user', '?')}{reason}"


def _index_list(rows: list[GpuRow]) -> str:
    found = [r.label for r in sorted(rows, key=lambda r: r.order) if r.index is not None]
    return ", ".join(found) if found else "no GPUs"
