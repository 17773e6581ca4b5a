"""Where a share goes (``--gpu-mem 20G`` / ``--gpu-share 0.25``): a GPU whose unclaimed
memory fits it, packed onto GPUs already shared before a whole one is opened (best fit:
the least room left over), never one held whole or busy without a claim, and never past
the memory the GPU really has free now.

What "room" is: the GPU's memory less what its shares hold, and less what is in use on it
now (a share's job that has not allocated yet counts as holding all of its share).

Standard library only: wrappers and keepers dispatch from the nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from gpuclaim.core.config import Config
from gpuclaim.core.errors import ConflictError, NeverFitsError, UnreachableError
from gpuclaim.core.share_policy import format_mib, share_mib
from gpuclaim.core.states import GpuState
from gpuclaim.engine.bookings import blocking
from gpuclaim.engine.cluster import ClusterView, GpuRow
from gpuclaim.engine.placement import (
    ClaimRequest,
    bookings_against,
    candidate_nodes,
    kind_fits,
    usable_rows,
)


def share_room_mib(row: GpuRow) -> int:
    """Memory a new share could still take on this GPU now (0 without a probe)."""
    return row.share_room_mib


def share_wanted(row: GpuRow, req: ClaimRequest) -> int:
    total = row.gpu.memory_total_mib if row.gpu is not None else 0
    return share_mib(total or 0, req.gpu_mem_mib, req.gpu_share)


def share_rows(view: ClusterView, node: str, req: ClaimRequest, until: float) -> list[GpuRow]:
    """The node's GPUs a share of ``req`` fits on now, best fit first."""
    now = view.snapshot.now
    bookings = bookings_against(req, view.snapshot.bookings)
    rows = list(usable_rows(view, node, req, until))
    for r in view.gpus_of(node):
        free_of_bookings = blocking(bookings, r.uuid or "", req.user, now, until) is None
        if r.state == GpuState.SHARED and r.uuid and free_of_bookings and kind_fits(r, req):
            rows.append(r)
    fitting = [r for r in rows if share_room_mib(r) >= share_wanted(r, req) > 0]
    if req.exact:
        wanted = set(map(str, req.exact[0][1]))
        fitting = [r for r in fitting if r.label in wanted]
    return sorted(fitting, key=lambda r: _fit_key(r, req))


def _fit_key(row: GpuRow, req: ClaimRequest) -> tuple[bool, int, tuple[int, int]]:
    # shared ones first, then the least room left over, then the lower index
    return (
        row.state != GpuState.SHARED,
        share_room_mib(row) - share_wanted(row, req),
        row.order,
    )


def pick_share(
    config: Config, view: ClusterView, req: ClaimRequest, until: float
) -> tuple[str, list[GpuRow]]:
    """The best-fitting GPU across the candidate nodes, or why none fits."""
    nodes = [n.name for n in candidate_nodes(config, req)]
    reachable = [n for n in nodes if n not in view.unreachable]
    if not reachable:
        raise UnreachableError(
            "no node could be asked about its GPUs: "
            + "; ".join(f"{n}: {view.inventories[n].error}" for n in nodes)
        )
    biggest = max(
        (r.gpu.memory_total_mib or 0 for n in reachable for r in view.gpus_of(n) if r.gpu),
        default=0,
    )
    if req.gpu_mem_mib and req.gpu_mem_mib > biggest:
        raise NeverFitsError(
            f"--gpu-mem {format_mib(req.gpu_mem_mib)} can never fit: the largest GPU has "
            f"{format_mib(biggest)}",
            hint="ask for less, or for whole GPUs without --gpu-mem",
        )
    best: Optional[tuple[tuple[bool, int, int, tuple[int, int]], str, GpuRow]] = None
    for order, node in enumerate(reachable):
        if node in view.drains:
            continue
        for row in share_rows(view, node, req, until):
            shared, left, index = _fit_key(row, req)
            key = (shared, left, order, index)
            if best is None or key < best[0]:
                best = (key, node, row)
    if best is None:
        raise ConflictError(nothing_fits(view, req, reachable))
    return best[1], [best[2]]


def nothing_fits(view: ClusterView, req: ClaimRequest, nodes: Sequence[str]) -> str:
    want = format_mib(req.gpu_mem_mib) if req.gpu_mem_mib else f"{req.gpu_share:g} of a GPU"
    return f"no GPU has {want} unshared now ({'; '.join(gpu_lines(view, nodes, req)) or 'no GPUs'})"


def gpu_lines(view: ClusterView, nodes: Sequence[str], req: ClaimRequest) -> list[str]:
    """Each GPU in a few words, for the reasons a share waits or a whole GPU does."""
    lines = []
    for node in nodes:
        if node in view.drains:
            lines.append(f"{node} drained")
            continue
        for r in view.gpus_of(node):
            if not kind_fits(r, req):
                continue
            if r.state == GpuState.SHARED:
                lines.append(f"{node} GPU {r.label} shared: {shares_text(r)}")
            elif r.state == GpuState.CLAIMED and r.claim is not None:
                lines.append(f"{node} GPU {r.label} held whole by {r.claim.user}")
            elif r.state != GpuState.FREE:
                lines.append(f"{node} GPU {r.label} {r.state}")
            else:
                lines.append(f"{node} GPU {r.label} {format_mib(share_room_mib(r))} free")
    return lines


def shares_text(row: GpuRow) -> str:
    """``alice 20G · bob 40G · 20G free``."""
    return row.shares_text


def share_claim_fields(row: GpuRow, req: ClaimRequest) -> dict[str, int]:
    """What a share's Claim holds beside a whole claim's fields."""
    total = row.gpu.memory_total_mib if row.gpu is not None else 0
    return {"mem_mib": share_wanted(row, req), "mem_total_mib": total or 0}


def latest_share_end(row: GpuRow) -> float:
    """When the last of a shared GPU's shares ends at the latest (its time limit)."""
    return max((c.expires for c in row.shares), default=0.0)
