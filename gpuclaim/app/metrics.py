"""``gpuclaim metrics``: who holds which GPU and what they do with it, as Prometheus series
(written by ``prometheus_client``, never by hand): GPUs per node and state, claimed and
idle-held GPUs per user, GPU-seconds held and busy, the queue, bookings, services, and how
each node answered. One look at the cluster makes one set of series (``Look``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from gpuclaim.app.history import claim_intervals, summarize
from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.fanout import fan_out
from gpuclaim.core.model import Job
from gpuclaim.core.priority import QueueEntry, parse_entry
from gpuclaim.core.states import ACTIVE_JOB_STATES, GpuState, ServiceHealth
from gpuclaim.core.usage import usage_view
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view, shown_max_age
from gpuclaim.engine.job_records import load_jobs
from gpuclaim.engine.launch import NodeOps
from gpuclaim.engine.observe import follow_up_look
from gpuclaim.engine.service_view import ServiceRow, service_rows
from gpuclaim.store import Store

TEXTFILE_NAME = "gpuclaim.prom"  # what node_exporter's textfile collector reads


@dataclass
class Look:
    """One look at the cluster: what the series are made from."""

    view: ClusterView
    idle: dict[str, bool]  # by claim id: the idle policy's verdict
    busy_pct: float  # utilisation at or above which a held GPU counts as busy
    jobs: list[Job]
    queue: list[QueueEntry]
    history: list[dict[str, Any]]  # GPU-hours held and busy by user, all of the kept history
    bookings: list[Booking]
    latency: dict[str, float] = field(default_factory=dict)  # node -> seconds its answer took
    taken_at: float = 0.0  # storage clock
    services: list[ServiceRow] = field(default_factory=list)


def take_look(config: Config, store: Store, prober: NodeProber, ops: NodeOps) -> Look:
    """Ask every node (each timed), read the store, and do what every look does (the idle
    policy, Slack notices, services of a rebooted node started again)."""
    outcomes = fan_out(
        [n.name for n in config.nodes],
        lambda name: prober.probe([config.node(name)], max_age_s=shown_max_age(config))[name],
        config.limits.deadline_s,
    )
    inventories = {n: o.value for n, o in outcomes.items() if o.value is not None}
    view = build_view(config, store, prober=prober, inventories=inventories or None)
    look = follow_up_look(config, store, view, ops)
    now = view.snapshot.now
    idle = {
        cid: bool(usage_view(s, now, config.idle.window_s)["idle"])
        for cid, s in look.summaries.items()
    }
    jobs = [j for j in load_jobs(store) if j.state in ACTIVE_JOB_STATES]
    events, _ = store.read_events()
    intervals = claim_intervals(events, view.snapshot)
    return Look(
        view=view,
        idle=idle,
        busy_pct=config.idle.threshold_pct,
        jobs=jobs,
        queue=[e for e in map(parse_entry, store.queue_entries()) if e is not None],
        history=summarize(intervals, by="user", usage=store.usage_summaries()),
        bookings=[b for b in view.snapshot.bookings if b.end > now],
        latency={n: o.seconds for n, o in outcomes.items()},
        taken_at=now,
        services=service_rows(jobs, view.snapshot.claims),
    )


def families(look: Look) -> Iterator[Metric]:
    """Every series of one look, by family."""
    yield from _gpus(look)
    yield from _users(look)
    yield from _queue(look)
    yield from _services(look)
    yield from _nodes(look)


def _gpus(look: Look) -> Iterator[Metric]:
    gpus = GaugeMetricFamily(
        "gpuclaim_gpus",
        "GPUs per node and state (free, claimed, shared, reserved, busy-unclaimed, stale, "
        "unreachable).",
        labels=["node", "state"],
    )
    counts: dict[tuple[str, str], int] = {}
    for row in look.view.rows:
        if row.index is not None:
            counts[(row.node, str(row.state))] = counts.get((row.node, str(row.state)), 0) + 1
    for (node, state), n in sorted(counts.items()):
        gpus.add_metric([node, state], n)
    yield gpus
    yield from _shares(look)


def _shares(look: Look) -> Iterator[Metric]:
    """A shared GPU's parts: the MiB each user holds of it, and the room left."""
    held = GaugeMetricFamily(
        "gpuclaim_gpu_share_mib",
        "MiB of a shared GPU's memory each user's shares hold (--gpu-mem).",
        labels=["node", "gpu", "user"],
    )
    room = GaugeMetricFamily(
        "gpuclaim_gpu_share_room_mib",
        "MiB a new share could still take on a shared GPU now.",
        labels=["node", "gpu"],
    )
    for row in look.view.rows:
        if not row.shares or row.index is None:
            continue
        by_user: dict[str, int] = {}
        for c in row.shares:
            by_user[c.user] = by_user.get(c.user, 0) + c.mem_mib
        for user, mib in sorted(by_user.items()):
            held.add_metric([row.node, str(row.index), user], mib)
        room.add_metric([row.node, str(row.index)], row.share_room_mib)
    yield held
    yield room


def _held(look: Look) -> list[tuple[str, str, bool, bool]]:
    """(user, node, idle, busy now) for every claimed GPU the look saw."""
    held = []
    for row in look.view.rows:
        if row.claim is None or row.state != GpuState.CLAIMED or row.index is None:
            continue
        util = row.gpu.utilization_pct if row.gpu is not None else None
        busy = util is not None and util >= look.busy_pct
        idle = look.idle.get(row.claim.id, False) and not row.claim.keep_when_idle
        held.append((row.claim.user, row.node, idle, busy))
    return held


def _users(look: Look) -> Iterator[Metric]:
    claimed = GaugeMetricFamily(
        "gpuclaim_claimed_gpus", "GPUs claimed now, per user and node.", labels=["user", "node"]
    )
    idle = GaugeMetricFamily(
        "gpuclaim_idle_held_gpus",
        "Claimed GPUs the idle policy judges idle (services never are), per user.",
        labels=["user"],
    )
    ratio = GaugeMetricFamily(
        "gpuclaim_held_gpus_busy_ratio",
        "Share of a user's claimed GPUs busy now (utilisation at or above the idle threshold).",
        labels=["user"],
    )
    per_node: dict[tuple[str, str], int] = {}
    per_user: dict[str, list[tuple[bool, bool]]] = {}
    for user, node, is_idle, is_busy in _held(look):
        per_node[(user, node)] = per_node.get((user, node), 0) + 1
        per_user.setdefault(user, []).append((is_idle, is_busy))
    for (user, node), n in sorted(per_node.items()):
        claimed.add_metric([user, node], n)
    for user, gpus in sorted(per_user.items()):
        idle.add_metric([user], sum(1 for i, _ in gpus if i))
        ratio.add_metric([user], sum(1 for _, b in gpus if b) / len(gpus))
    held = CounterMetricFamily(
        "gpuclaim_gpu_held_seconds",
        "GPU-seconds held per user, over the history gpuclaim keeps (claims and jobs).",
        labels=["user"],
    )
    busy = CounterMetricFamily(
        "gpuclaim_gpu_busy_seconds",
        "GPU-seconds held per user during which the GPUs were busy (where sampled).",
        labels=["user"],
    )
    for row in look.history:
        held.add_metric([row["user"]], row["gpu_hours"] * 3600)
        busy.add_metric([row["user"]], (row["busy_gpu_hours"] or 0.0) * 3600)
    bookings = GaugeMetricFamily(
        "gpuclaim_bookings", "Bookings open now or to come, per user.", labels=["user"]
    )
    by_user: dict[str, int] = {}
    for b in look.bookings:
        by_user[b.user] = by_user.get(b.user, 0) + 1
    for user, n in sorted(by_user.items()):
        bookings.add_metric([user], n)
    yield from (claimed, idle, ratio, held, busy, bookings)


def _queue(look: Look) -> Iterator[Metric]:
    queued = GaugeMetricFamily(
        "gpuclaim_queued_jobs", "Jobs waiting in the queue, per user.", labels=["user"]
    )
    users = {j.id: j.user for j in look.jobs}
    by_user: dict[str, int] = {}
    for e in look.queue:
        user = e.user or users.get(e.job_id, "?")
        by_user[user] = by_user.get(user, 0) + 1
    for user, n in sorted(by_user.items()):
        queued.add_metric([user], n)
    oldest = min((e.submitted for e in look.queue), default=None)
    wait = GaugeMetricFamily(
        "gpuclaim_queue_oldest_wait_seconds",
        "How long the job waiting longest has waited (0 when none waits).",
        value=0.0 if oldest is None else max(0.0, look.taken_at - oldest),
    )
    yield from (queued, wait)


def _services(look: Look) -> Iterator[Metric]:
    labels = ["service", "user", "node"]
    health = StateSetMetricFamily(
        "gpuclaim_service_health", "Each service's health (gpuclaim serve).", labels=labels
    )
    restarts = CounterMetricFamily(
        "gpuclaim_service_restarts", "Times each service was started again.", labels=labels
    )
    for s in look.services:
        key = [s.name, s.user, s.node]
        health.add_metric(key, {h.value: s.health == h.value for h in ServiceHealth})
        restarts.add_metric(key, s.restarts)
    yield from (health, restarts)


def _nodes(look: Look) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "gpuclaim_node_up", "1 when the node answered the last look.", labels=["node"]
    )
    seconds = GaugeMetricFamily(
        "gpuclaim_node_look_seconds", "How long the node took to answer.", labels=["node"]
    )
    for name, inv in sorted(look.view.inventories.items()):
        up.add_metric([name], 0 if inv.error or not inv.reachable else 1)
        if name in look.latency:
            seconds.add_metric([name], round(look.latency[name], 4))
    when = GaugeMetricFamily(
        "gpuclaim_look_timestamp_seconds",
        "When the look these series come from was taken (Unix time).",
        value=look.taken_at,
    )
    yield from (up, seconds, when)


class _LookCollector(Collector):
    def __init__(self, looks: Callable[[], Look]) -> None:
        self.looks = looks

    def collect(self) -> Iterator[Metric]:
        return families(self.looks())


def registry_of(looks: Callable[[], Look]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_LookCollector(looks))
    return registry


def exposition(look: Look) -> bytes:
    """The text exposition format of one look."""
    return generate_latest(registry_of(lambda: look))


def write_textfile(directory: Path, look: Look) -> Path:
    """``DIR/gpuclaim.prom``, replaced whole (prometheus_client writes a temporary file and
    renames it), so node_exporter never reads half of it."""
    path = directory / TEXTFILE_NAME
    if not directory.is_dir():
        raise GpuclaimError(f"--textfile: {directory} is not a directory")
    try:
        write_to_textfile(str(path), registry_of(lambda: look))
    except OSError as exc:
        raise GpuclaimError(f"cannot write {path}: {exc.strerror}") from exc
    return path


class CachedLooks:
    """Looks at most ``min_interval_s`` old: a scraper asking every second does not make
    every node answer every second. One look at a time, however many scrape at once."""

    def __init__(self, take: Callable[[], Look], min_interval_s: float) -> None:
        self.take = take
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._last: Optional[Look] = None
        self._at = 0.0

    def __call__(self) -> Look:
        with self._lock:
            if self._last is None or time.monotonic() - self._at >= self.min_interval_s:
                self._last = self.take()
                self._at = time.monotonic()
            return self._last
