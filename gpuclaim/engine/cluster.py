"""The cluster view: what every GPU is doing (probe) joined with who holds it (store)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config, Limits, NodeConfig
from gpuclaim.core.errors import UnreachableError
from gpuclaim.core.fanout import Outcome, fan_out
from gpuclaim.core.inventory import gpu_label
from gpuclaim.core.lazylog import get_logger
from gpuclaim.core.liveness import wrapper_gone
from gpuclaim.core.model import Claim, Gpu, GpuProcess, NodeInventory, iso
from gpuclaim.core.protocol import probe_request
from gpuclaim.core.records import Drain
from gpuclaim.core.share_policy import holders_text
from gpuclaim.core.states import SERVICE_DOWN, GpuState
from gpuclaim.engine.bookings import settle_bookings, shown_booking
from gpuclaim.store import ClaimStatus, Snapshot, Store

if TYPE_CHECKING:
    from gpuclaim.engine.channel import Channels

log = get_logger(__name__)  # logging imported on first use


@dataclass(frozen=True)
class GpuRow:
    """One line of ``status``: a GPU, its state and its claim. ``gpu`` is None when the node
    could not be probed and all we know comes from the store."""

    node: str
    index: Optional[int]
    uuid: Optional[str]
    state: str
    gpu: Optional[Gpu] = None
    claim: Optional[Claim] = None
    reason: str = ""  # why stale / unreachable / busy
    foreign: tuple[GpuProcess, ...] = ()  # processes that make an unclaimed GPU busy
    booking: Optional[Booking] = None  # the open booking, else the next within a day
    shares: tuple[Claim, ...] = ()  # the live shares of its memory (state shared)

    @property
    def mig(self) -> Optional[int]:
        """A MIG slice's number under GPU ``index`` (None: a whole GPU)."""
        if self.gpu is not None:
            return self.gpu.mig
        held = self.claim.gpus if self.claim is not None else ()
        return next((g.mig for g in held if g.uuid == self.uuid), None)

    @property
    def label(self) -> str:
        """``0``, or ``0/1`` for slice 1 of GPU 0; ``-`` for a node without GPUs known."""
        return "-" if self.index is None else gpu_label(self.index, self.mig)

    @property
    def order(self) -> tuple[int, int]:
        """Within a node: by index, a GPU's slices by number (a row without a GPU first)."""
        mig = self.mig
        return (-1 if self.index is None else self.index, -1 if mig is None else mig)

    @property
    def share_room_mib(self) -> int:
        """Memory a new share could take now: the GPU's less what its shares hold, and less
        what is in use on it (a share's job not yet allocated counts as using all of it)."""
        g = self.gpu
        if g is None or not g.memory_total_mib:
            return 0
        held = sum(c.mem_mib for c in self.shares)
        total = g.memory_total_mib
        return max(0, min(total - held, total - (g.memory_used_mib or 0)))

    @property
    def shares_text(self) -> str:
        """``alice 20G · bob 40G · 20G free``."""
        return holders_text([(c.user, c.mem_mib) for c in self.shares], self.share_room_mib)

    def to_dict(self) -> dict[str, Any]:
        g = self.gpu
        held = sum(c.mem_mib for c in self.shares)
        return {
            "node": self.node,
            "index": self.index,
            "uuid": self.uuid,
            "mig": self.mig,
            "mig_profile": g.mig_profile if g else None,
            "gpu": self.label,
            "name": g.name if g else None,
            "memory_used_mib": g.memory_used_mib if g else None,
            "memory_total_mib": g.memory_total_mib if g else None,
            "utilization_pct": g.utilization_pct if g else None,
            "state": self.state,
            "reason": self.reason or None,
            "claim": _claim_dict(self.claim),
            "reservation": self.booking.short_dict() if self.booking else None,
            "processes": [p.to_dict() for p in g.processes] if g else [],
            "shares": [_share_dict(c) for c in self.shares],
            "shared_mib": held,
        }


@dataclass
class ClusterView:
    """Every GPU's row, each node's answer, and the store as this look read it."""

    rows: list[GpuRow]
    inventories: dict[str, NodeInventory]
    snapshot: Snapshot
    drains: dict[str, Drain] = field(default_factory=dict)

    @property
    def unreachable(self) -> list[str]:
        return [n for n, inv in self.inventories.items() if inv.error or not inv.reachable]

    def gpus_of(self, node: str) -> list[GpuRow]:
        return [r for r in self.rows if r.node == node and r.gpu is not None]


class NodeProber:
    """Asks nodes about their GPUs through their channels (in-process or the agent over SSH),
    all in parallel under one deadline. The channels hold the SSH pool: keep one prober per
    process (the board). Without channels it reaches no node (inventories given instead)."""

    def __init__(self, config: Config, channels: Optional[Channels] = None) -> None:
        self.config = config
        self._channels = channels

    @property
    def channels(self) -> Channels:
        if self._channels is None:
            raise UnreachableError("no way to reach the nodes was given (a bug in gpuclaim)")
        return self._channels

    def fresh(self) -> NodeProber:
        """A prober that asks the nodes now (one that reuses earlier answers gives its own)."""
        return self

    def probe(
        self,
        nodes: Sequence[NodeConfig],
        enough: Optional[Callable[[dict[str, NodeInventory]], bool]] = None,
        max_age_s: float = 0.0,
    ) -> dict[str, NodeInventory]:
        """Every node answers with its inventory, or is marked unreachable with the reason.
        ``enough(answers so far)``: stop waiting for slow nodes once it holds (see fan_out).
        ``max_age_s``: a warm agent may answer from a GPU read this old (node.recent_reads):
        for looks shown to people only (``shown_max_age``); a decision reads now."""
        by_name = {n.name: n for n in nodes}

        def answered_enough(outcomes: dict[str, Outcome[NodeInventory]]) -> bool:
            assert enough is not None
            good = {n: o.value for n, o in outcomes.items() if o.ok and o.value is not None}
            return enough({n: v for n, v in good.items() if not v.error})

        outcomes = fan_out(
            list(by_name),
            lambda name: self._probe_one(by_name[name], max_age_s),
            self.config.limits.deadline_s,
            answered_enough if enough is not None else None,
        )
        result = {}
        for name, outcome in outcomes.items():
            if outcome.ok and outcome.value is not None:
                result[name] = outcome.value
            else:
                # --debug shows gpuclaim's own verdict too, not only the libraries' logs
                log.debug("%s unreachable: %s", name, outcome.error)
                result[name] = NodeInventory(node=name, reachable=False, error=outcome.error)
        return result

    def _probe_one(self, node: NodeConfig, max_age_s: float) -> NodeInventory:
        limits = self.config.limits
        args = probe_request(
            node.name, node.nvidia_smi, dict(node.env), limits.probe_timeout_s, max_age_s
        )
        answer = self.channels.to_node(node).call("probe", args, limits.probe_timeout_s + 5)
        return NodeInventory.from_dict(answer)


def shown_max_age(config: Config) -> float:
    """How old a GPU read a look shown to people may be answered from (``status``, the
    board, ``metrics``): ``defaults.gpu_read_max_age``. Claims, placement and the queue
    never pass it: what they decide on is read now."""
    return config.limits.gpu_read_max_age_s


def build_view(
    config: Config,
    store: Store,
    nodes: Optional[Sequence[NodeConfig]] = None,
    inventories: Optional[dict[str, NodeInventory]] = None,
    prober: Optional[NodeProber] = None,
    fits: Optional[int] = None,
    max_age_s: float = 0.0,
) -> ClusterView:
    """Probe (unless given inventories), read the store, and judge every GPU. With ``fits``,
    nodes still answering once one that answered has that many free GPUs are not waited for
    (a claim that fits elsewhere does not wait on a hanging node)."""
    selected = list(config.nodes) if nodes is None else list(nodes)
    if inventories is None:
        enough = None
        if fits is not None:
            read: list[Snapshot] = []  # read once, and only if a node is slow to answer

            def enough(answers: dict[str, NodeInventory]) -> bool:
                if not read:
                    read.append(store.snapshot())
                early = read[0]
                return any(
                    sum(
                        1
                        for g in inv.gpus
                        if g.mig is None
                        and not g.mig_parent
                        and g.uuid not in early.files
                        and g.uuid not in early.shares
                        and not is_busy(g, foreign_processes(g, config.limits), config.limits)
                    )
                    >= fits
                    for name, inv in answers.items()
                    if name not in early.drains
                )

        if prober is None:
            raise TypeError("build_view: probing the nodes needs a prober (or inventories)")
        inventories = prober.probe(selected, enough, max_age_s)
    snap = settle_bookings(config, store, mark_lost_jobs(store.snapshot(), inventories))
    rows: list[GpuRow] = []
    seen: set[str] = set()
    for node in selected:
        inv = inventories[node.name]
        if inv.error or not inv.reachable:
            rows.extend(_rows_without_probe(node.name, inv, snap, seen))
            continue
        for gpu in inv.gpus:
            if gpu.mig_parent:  # never handed out whole (a probe lists its slices instead)
                continue
            seen.add(gpu.uuid)
            row = judge_gpu(gpu, snap.claim_for(gpu.uuid), snap, config.limits)
            rows.append(with_booking(row, snap))
    # Claims on GPUs that no probe reported (GPU removed, UUID changed): still shown.
    names = {n.name for n in selected}
    for status in snap.claims.values():
        if status.claim.node not in names:
            continue
        for g in status.claim.gpus:
            if g.uuid not in seen and g.uuid in status.present:
                seen.add(g.uuid)
                reachable = inventories[status.claim.node].reachable
                state = status.state if reachable else GpuState.UNREACHABLE
                rows.append(
                    GpuRow(
                        status.claim.node,
                        g.index,
                        g.uuid,
                        state,
                        None,
                        status.claim,
                        status.reason or "GPU not seen by the probe",
                    )
                )
    rows.sort(key=lambda r: (_node_order(config, r.node), r.order))
    return ClusterView(rows=rows, inventories=inventories, snapshot=snap, drains=snap.drains)


def with_booking(row: GpuRow, snap: Snapshot) -> GpuRow:
    """A free GPU inside someone's booking window is ``reserved`` (for them alone)."""
    booking = shown_booking(snap.bookings, row.uuid or "", snap.now) if row.uuid else None
    if booking is None:
        return row
    if row.state == GpuState.FREE and booking.is_open(snap.now):
        reason = f"reserved by {booking.user} (reservation {booking.id})"
        return dataclasses.replace(row, state=GpuState.RESERVED, booking=booking, reason=reason)
    return dataclasses.replace(row, booking=booking)


def mark_lost_jobs(snap: Snapshot, inventories: dict[str, NodeInventory]) -> Snapshot:
    """Job claims whose node answered and proves their wrapper gone (the node rebooted, its
    tmux server was killed) are stale at once: ``job lost``, as missed heartbeats would say
    only minutes later. The store is read after the probe, so a wrapper that ended normally
    between the two has released its claim already."""
    lost = {}
    for claim_id, status in snap.claims.items():
        inv = inventories.get(status.claim.node)
        if status.reason == SERVICE_DOWN:
            continue  # judged down already (its beats stopped)
        if status.state != GpuState.CLAIMED or not status.claim.job or inv is None or inv.error:
            continue
        if wrapper_gone(snap.beats.get(claim_id), inv.liveness):
            if status.claim.service:  # its GPUs stay held: the look starts it again
                down = ClaimStatus(status.claim, GpuState.CLAIMED, SERVICE_DOWN, status.present)
                lost[claim_id] = down
            else:
                lost[claim_id] = ClaimStatus(
                    status.claim, GpuState.STALE, "job lost", status.present
                )
    if not lost:
        return snap
    return dataclasses.replace(snap, claims={**snap.claims, **lost})


def judge_gpu(gpu: Gpu, status: Optional[ClaimStatus], snap: Snapshot, limits: Limits) -> GpuRow:
    """free / claimed / busy-unclaimed / stale for one probed GPU."""
    cf = snap.files.get(gpu.uuid)
    if cf is not None and cf.unreadable:
        reason = f"claim file {cf.error}: held, by whom gpuclaim cannot tell"
        return GpuRow(gpu.node, gpu.index, gpu.uuid, GpuState.CLAIMED, gpu, None, reason)
    if cf is not None and cf.claim is None:
        why = f"claim file {cf.error}"
        return GpuRow(gpu.node, gpu.index, gpu.uuid, GpuState.STALE, gpu, None, why)
    foreign = foreign_processes(gpu, limits)
    if status is None and gpu.uuid in snap.shares:
        return _judge_shared(gpu, snap, foreign)
    if status is not None:
        return GpuRow(
            gpu.node, gpu.index, gpu.uuid, status.state, gpu, status.claim, status.reason, foreign
        )
    if is_busy(gpu, foreign, limits):
        reason = "no claim: " + ", ".join(_describe(p) for p in foreign[:3])
        if len(foreign) > 3:
            reason += f" and {len(foreign) - 3} more"
        if not foreign:
            reason = f"{gpu.memory_used_mib} MiB in use by processes we cannot see, and no claim"
        state = GpuState.BUSY_UNCLAIMED
        return GpuRow(gpu.node, gpu.index, gpu.uuid, state, gpu, None, reason, foreign)
    return GpuRow(gpu.node, gpu.index, gpu.uuid, GpuState.FREE, gpu, None, "", foreign)


def _judge_shared(gpu: Gpu, snap: Snapshot, foreign: tuple[GpuProcess, ...]) -> GpuRow:
    """A GPU held in shares: ``shared`` while one lives; a damaged share file or only
    stale shares make it ``stale`` (reclaimable: the claimer reaps them first)."""
    statuses = snap.shares_of(gpu.uuid)
    live = tuple(
        sorted((s.claim for s in statuses if s.state == GpuState.CLAIMED), key=lambda c: c.since)
    )
    damaged = snap.damaged_shares(gpu.uuid)
    if damaged:
        why = f"share file {damaged[0].error}"
        return GpuRow(
            gpu.node, gpu.index, gpu.uuid, GpuState.STALE, gpu, None, why, foreign, shares=live
        )
    if live:
        return GpuRow(
            gpu.node, gpu.index, gpu.uuid, GpuState.SHARED, gpu, None, "", foreign, shares=live
        )
    if statuses:
        first = statuses[0]
        return GpuRow(
            gpu.node, gpu.index, gpu.uuid, GpuState.STALE, gpu, first.claim, first.reason, foreign
        )
    return GpuRow(gpu.node, gpu.index, gpu.uuid, GpuState.FREE, gpu, None, "", foreign)


def foreign_processes(gpu: Gpu, limits: Limits) -> tuple[GpuProcess, ...]:
    """Processes that count as use of the GPU: display servers and desktops do not."""
    ignored = set(limits.ignore_processes)
    return tuple(p for p in gpu.processes if _basename(p.name) not in ignored)


def is_busy(gpu: Gpu, foreign: Sequence[GpuProcess], limits: Limits) -> bool:
    """Busy when foreign processes hold at least the threshold of memory (or do not say how
    much); with no visible processes (other containers), when memory in use passes it."""
    if foreign:
        known = [p.used_memory_mib for p in foreign if p.used_memory_mib is not None]
        if len(known) < len(foreign):
            return True
        return sum(known) >= limits.busy_memory_mib
    if gpu.processes:  # only ignored ones (Xorg...)
        return False
    return (gpu.memory_used_mib or 0) >= limits.busy_memory_mib


def _rows_without_probe(
    node: str, inv: NodeInventory, snap: Snapshot, seen: set[str]
) -> list[GpuRow]:
    """An unprobed node is still a row (or one per GPU we know from its claims)."""
    reason = inv.error or GpuState.UNREACHABLE.value
    rows = []
    for status in snap.claims.values():
        if status.claim.node != node:
            continue
        for g in status.claim.gpus:
            if g.uuid in status.present and g.uuid not in seen:
                seen.add(g.uuid)
                rows.append(
                    GpuRow(node, g.index, g.uuid, GpuState.UNREACHABLE, None, status.claim, reason)
                )
    if not rows:
        rows.append(GpuRow(node, None, None, GpuState.UNREACHABLE, None, None, reason))
    return rows


def _describe(proc: GpuProcess) -> str:
    who = f"{proc.user}'s " if proc.user else ""
    mem = f" {proc.used_memory_mib / 1024:.1f} GiB" if proc.used_memory_mib is not None else ""
    return f"{who}{_basename(proc.name)} (pid {proc.pid}){mem}"


def _share_dict(claim: Claim) -> dict[str, Any]:
    return {**(_claim_dict(claim) or {}), "mem_mib": claim.mem_mib}


def _claim_dict(claim: Optional[Claim]) -> Optional[dict[str, Any]]:
    if claim is None:
        return None
    return {
        "id": claim.id,
        "user": claim.user,
        "job": claim.job,
        "since": iso(claim.since),
        "expires": iso(claim.expires),
        "note": claim.note,
        "preemptible": claim.preemptible,
    }


def _basename(name: str) -> str:
    return name.replace("\\", "/").rsplit("/", 1)[-1]


def _node_order(config: Config, node: str) -> int:
    for i, n in enumerate(config.nodes):
        if n.name == node:
            return i
    return len(config.nodes)
