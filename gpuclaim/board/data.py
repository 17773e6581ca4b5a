"""The board's data: per-node probe samples, one read of the store joined with them, and the
filters. Blocking calls live here and run in worker threads; nothing here knows textual."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuclaim.board.services import BoardServices
from gpuclaim.core.errors import StorageRefusesWrites
from gpuclaim.core.model import Job, NodeInventory
from gpuclaim.core.states import ACTIVE_JOB_STATES, FaceState, GpuState
from gpuclaim.core.usage import usage_view
from gpuclaim.engine.cluster import ClusterView, GpuRow, build_view, shown_max_age
from gpuclaim.engine.job_records import observed_state
from gpuclaim.engine.observe import follow_up_look
from gpuclaim.engine.service_view import ServiceRow, service_rows


@dataclass(frozen=True)
class NodeSample:
    """One node's latest probe answer, when it came (board clock) and how long it took."""

    inventory: NodeInventory
    at: float
    seconds: float
    last_ok: Optional[float] = None  # when the node last answered with its GPUs

    @property
    def ok(self) -> bool:
        return self.inventory.reachable and not self.inventory.error


@dataclass(frozen=True)
class Filters:
    """Which rows to show: holders and nodes (empty = all)."""

    users: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.users or self.nodes)

    def describe(self) -> str:
        parts = [f"user={','.join(self.users)}"] if self.users else []
        if self.nodes:
            parts.append(f"node={','.join(self.nodes)}")
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str) -> Filters:
        """``user:alice node:node01 bob`` -> users (alice, bob), nodes (node01); a bare word
        is a user name."""
        users: list[str] = []
        nodes: list[str] = []
        for word in text.replace(",", " ").split():
            key, sep, value = word.partition(":")
            if not sep:
                key, sep, value = word.partition("=")
            if sep and key in ("node", "n"):
                nodes.append(value)
            elif sep and key in ("user", "u"):
                users.append(value)
            elif value or not sep:
                users.append(value or key)
        return cls(tuple(u for u in users if u), tuple(n for n in nodes if n))


@dataclass(frozen=True)
class BoardData:
    """Everything one refresh shows: the cluster view, active jobs and the queue."""

    view: ClusterView
    jobs: dict[str, Job]  # active jobs by id (claims name their job by id)
    job_states: dict[str, str]  # observed state by job id ("lost" when its heartbeat stopped)
    queue: int
    read_at: float  # board clock when the store was read
    samples: dict[str, NodeSample] = field(default_factory=dict)
    pending: tuple[str, ...] = ()  # nodes that have not answered their first probe yet
    node_names: tuple[str, ...] = ()  # every node, in config order
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)  # by claim id (idle marks)
    refusal: str = ""  # why this look recorded nothing: the storage refuses writes
    services: dict[str, ServiceRow] = field(default_factory=dict)  # started ones by job id

    @property
    def now(self) -> float:
        """The storage clock at the read: claims' time held and left are judged by it."""
        return self.view.snapshot.now


def probe_node(services: BoardServices, name: str, previous: Optional[NodeSample]) -> NodeSample:
    """Ask one node (never raises: a failure is an inventory with an error)."""
    node = services.config.node(name)
    start = time.monotonic()
    inventory = services.prober.probe([node], max_age_s=shown_max_age(services.config))[name]
    at = services.clock()
    sample = NodeSample(inventory, at, time.monotonic() - start)
    last_ok = at if sample.ok else (previous.last_ok if previous else None)
    return NodeSample(inventory, at, sample.seconds, last_ok)


def read_board(
    services: BoardServices, samples: dict[str, NodeSample], fold_usage: bool = True
) -> BoardData:
    """Read the store and judge every GPU against the nodes' latest answers. With
    ``fold_usage``, this look at the GPUs also counts towards idle claims, as ``status``'s
    does (sample, idle policy, Slack notices); else their summaries are only read."""
    config = services.config
    answered = [n for n in config.nodes if n.name in samples]
    inventories = {n.name: samples[n.name].inventory for n in answered}
    if answered:
        view = build_view(config, services.store, answered, inventories=inventories)
    else:  # build_view() with no nodes means all nodes: read the store alone instead
        snap = services.store.snapshot()
        view = ClusterView(rows=[], inventories={}, snapshot=snap, drains=snap.drains)
    usage, refusal = _usage(services, view, fold_usage and bool(answered))
    # the jobs holding GPUs (and the services among them): only their records are read
    holding = sorted({s.claim.job for s in view.snapshot.claims.values() if s.claim.job})
    jobs = {
        j.id: j for j in services.store.list_jobs(only_ids=holding) if j.state in ACTIVE_JOB_STATES
    }
    states = {jid: observed_state(j, view.snapshot.claims) for jid, j in jobs.items()}
    queue = len(services.store.queue_entries())
    pending = tuple(n.name for n in config.nodes if n.name not in samples)
    names = tuple(n.name for n in config.nodes)
    return BoardData(
        view,
        jobs,
        states,
        queue,
        services.clock(),
        dict(samples),
        pending,
        names,
        usage,
        str(refusal) if refusal else "",
        {r.job_id: r for r in service_rows(jobs.values(), view.snapshot.claims)},
    )


def read_once(services: BoardServices) -> BoardData:
    """Probe every node once, in parallel, and read the store."""
    inventories = services.prober.probe(
        services.config.nodes, max_age_s=shown_max_age(services.config)
    )
    now = services.clock()
    samples = {
        name: NodeSample(inv, now, 0.0, now if inv.reachable and not inv.error else None)
        for name, inv in inventories.items()
    }
    return read_board(services, samples)


def _usage(
    services: BoardServices, view: ClusterView, fold: bool
) -> tuple[dict[str, dict[str, Any]], Optional[StorageRefusesWrites]]:
    config, store = services.config, services.store
    refusal = None
    if fold:
        look = follow_up_look(config, store, view, services.ops)
        summaries, refusal = look.summaries, look.refusal
    else:
        held = sorted({r.claim.id for r in view.rows if r.claim and r.state == GpuState.CLAIMED})
        summaries = store.usage_summaries(ids=held) if held else {}
    now, window = view.snapshot.now, config.idle.window_s
    usage = {cid: usage_view(summary, now, window) for cid, summary in summaries.items()}
    return usage, refusal


def visible_rows(data: BoardData, filters: Filters) -> list[GpuRow]:
    """The rows the filters let through, placeholders for nodes still to answer included."""
    rows = list(data.view.rows)
    rows.extend(
        GpuRow(name, None, None, FaceState.PROBING.value, reason="waiting for the first answer")
        for name in data.pending
    )
    if filters.nodes:
        rows = [r for r in rows if r.node in filters.nodes]
    if filters.users:
        rows = [r for r in rows if r.claim is not None and r.claim.user in filters.users]
    order = {name: i for i, name in enumerate(data.node_names)}
    rows.sort(key=lambda r: (order.get(r.node, len(order)), r.order))
    return rows


def counts(rows: Iterable[GpuRow]) -> dict[str, int]:
    """GPUs per state (rows without a GPU index are node rows, not GPUs)."""
    result: dict[str, int] = {}
    for row in rows:
        if row.index is not None:
            result[row.state] = result.get(row.state, 0) + 1
    return result
