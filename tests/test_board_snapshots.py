"""Snapshots of the board (pytest-textual-snapshot), at 80×24 and 200×60, up to 32 nodes × 8
GPUs. Real store files, real build_view; only the inventories are synthetic (injected through
the prober) and the clocks are pinned, so every run draws the same picture.

Update after a deliberate change with ``pytest tests/test_board_snapshots.py --snapshot-update``
and look at the report before committing the new SVGs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuclaim.board.app import make_app
from gpuclaim.board.services import BoardOptions, BoardServices
from gpuclaim.core.config import Config, NodeConfig
from gpuclaim.core.model import Claim, ClaimedGpu, Gpu, GpuProcess, Job, JobRank, NodeInventory
from gpuclaim.core.service import ServiceSpec
from gpuclaim.engine.cluster import NodeProber
from gpuclaim.engine.launch import CLAIM_MARGIN_S, NodeOps
from gpuclaim.store import ClaimStore

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC: the storage clock and the board's, pinned


class PinnedStore(ClaimStore):
    """A real claim store whose storage clock is pinned (expiry is judged against it)."""

    def now(self) -> float:
        return T0


class FixedProber(NodeProber):
    """Answers probes with given inventories: the GPUs are the one thing faked."""

    def __init__(self, config: Config, inventories: dict[str, NodeInventory]) -> None:
        super().__init__(config)
        self.inventories = inventories

    def probe(
        self, nodes: Sequence[NodeConfig], enough: Any = None, max_age_s: float = 0.0
    ) -> dict[str, NodeInventory]:
        return {n.name: self.inventories[n.name] for n in nodes}


MODELS = (
    ("NVIDIA H100 80GB HBM3", 81559),
    ("NVIDIA A100-SXM4-80GB", 81920),
    ("NVIDIA L40S", 46068),
)
USERS = ("alice", "bob", "chen", "dana", "emre")


@dataclass
class Synthetic:
    config: Config
    store: ClaimStore
    prober: FixedProber


def synthetic_cluster(
    root: Path, nodes: int, gpus: int, unreachable: Sequence[int] = (), busy_every: int = 7
) -> Synthetic:
    """``nodes`` × ``gpus`` simulated GPUs with claims by five users, a busy-unclaimed GPU
    now and then, and the ``unreachable`` nodes (1-based) not answering."""
    root.mkdir(parents=True, exist_ok=True)
    names = [f"node{i:02d}" for i in range(1, nodes + 1)]
    config = Config(
        path=None,
        cluster="lab",
        nodes=tuple(NodeConfig(n, n) for n in names),
        storage=str(root / "store"),
    )
    store = PinnedStore(root / "store", root / "locks")
    store.ensure(create=True)
    inventories: dict[str, NodeInventory] = {}
    k = 0
    for i, name in enumerate(names, 1):
        if i in unreachable:
            inventories[name] = NodeInventory(
                node=name, reachable=False, error=f"{name}: connection refused (is sshd running?)"
            )
            continue
        model, mem = MODELS[(i - 1) % len(MODELS)]
        node_gpus = []
        for j in range(gpus):
            k += 1
            uuid = f"GPU-{i:04d}{j:04d}-0000-4000-8000-{k:012d}"
            busy = k % busy_every == 0
            used = 30_000 + (k * 997) % 40_000 if busy or k % 3 == 0 else 0
            used = min(used, mem - 1024)
            util = (k * 37) % 100 if used else 0
            procs = (GpuProcess(4_194_400 + k, "python", used, "frank"),) if busy else ()
            node_gpus.append(Gpu(name, j, uuid, model, mem, used, util, processes=procs))
            if not busy and k % 3 == 0:
                _claim(store, name, [(uuid, j)], USERS[k % len(USERS)], k)
        inventories[name] = NodeInventory(
            node=name, gpus=tuple(node_gpus), source="nvml", driver_version="550.54.15"
        )
    return Synthetic(config, store, FixedProber(config, inventories))


def _claim(store: ClaimStore, node: str, gpus: list[tuple[str, int]], user: str, k: int) -> None:
    store.acquire(
        Claim(
            id=f"c-{k:010d}",
            user=user,
            node=node,
            gpus=tuple(ClaimedGpu(u, i) for u, i in gpus),
            since=T0 - 600 * (k % 17 + 1),
            expires=T0 + 1200 * (k % 11 + 1) - 660,
            note=("bert sweep", "eval", "", "llama-7b finetune", "debug")[k % 5],
            host="elsewhere",
            pid=0,
        )
    )


def _job(
    cluster: Synthetic, node: str, index: int, user: str, name: str, ran_s: float, limit_s: float
) -> Job:
    """A running job on one GPU, as ``run`` leaves it: the job's record, its claim (noted
    ``job NAME``, expiring CLAIM_MARGIN_S after the job's limit) and its wrapper's heartbeat."""
    store = cluster.store
    gpu = cluster.prober.inventories[node].gpus[index]
    started = T0 - ran_s
    claim_id = f"c-job-{name}"
    rank = JobRank(0, node, (index,), (gpu.uuid,), claim_id, "running", started=started)
    job = Job(
        id=f"j-{name}",
        name=name,
        user=user,
        argv=("python", "train.py"),
        state="running",
        submitted=started - 1,
        time_limit_s=limit_s,
        ranks=(rank,),
        started=started,
    )
    store.create_job(job)
    store.acquire(
        Claim(
            claim_id,
            user,
            node,
            (ClaimedGpu(gpu.uuid, index),),
            started - 1,
            started - 1 + limit_s + CLAIM_MARGIN_S,
            note=f"job {name}",
            job=job.id,
            host="elsewhere",
        )
    )
    store.beat(claim_id, 10.0)
    for beat in (store.root / "beats").iterdir():
        os.utime(beat, (T0, T0))  # beating now, by the pinned storage clock
    return job


def _service(
    cluster: Synthetic,
    node: str,
    indices: Sequence[int],
    user: str,
    name: str,
    port: int,
    health: str,
    restarts: int = 0,
) -> Job:
    """A service as ``serve`` leaves it: its record (health, restarts, up 2 h), its claim
    (a service's) and its wrapper's heartbeat, beating now, or 10 minutes ago when down."""
    store = cluster.store
    gpus = [cluster.prober.inventories[node].gpus[i] for i in indices]
    started = T0 - 3 * 3600
    claim_id = f"c-svc-{name}"
    uuids = tuple(g.uuid for g in gpus)
    rank = JobRank(0, node, tuple(indices), uuids, claim_id, "running", started=started)
    job = Job(
        id=f"j-{name}",
        name=name,
        user=user,
        argv=("vllm", "serve"),
        state="running",
        submitted=started - 1,
        time_limit_s=30 * 86400,
        kind="service",
        ranks=(rank,),
        started=started,
        service=ServiceSpec(port=port, health_path="/health"),
        health=health,
        restarts=restarts,
        up_since=T0 - 2 * 3600,
    )
    store.create_job(job)
    claimed = tuple(ClaimedGpu(u, i) for u, i in zip(uuids, indices))
    limit = started - 1 + job.time_limit_s + CLAIM_MARGIN_S
    note = f"job {name}"
    store.acquire(
        Claim(claim_id, user, node, claimed, started - 1, limit, note=note, job=job.id,
              host="elsewhere", keep_when_idle=True, service=True)
    )  # fmt: skip
    store.beat(claim_id, 10.0)
    beat_at = T0 - 600 if health == "down" else T0
    os.utime(store.root / "beats" / claim_id, (beat_at, beat_at))
    return job


def services_cluster(root: Path) -> Synthetic:
    """Two nodes: alice's healthy vLLM endpoint on two GPUs of node01 (restarted once), a
    training job beside it, and bob's embedding service whose node stopped hearing from it
    (down: the next look starts it again)."""
    cluster = synthetic_cluster(root, 2, 4, busy_every=100)
    _service(cluster, "node01", (0, 1), "alice", "llm", 41234, "healthy", restarts=1)
    _job(cluster, "node01", 3, "bob", "resnet", ran_s=1800, limit_s=4 * 3600)
    _service(cluster, "node02", (3,), "bob", "embed", 8000, "down")
    return cluster


def services_for(cluster: Synthetic, **options: Any) -> BoardServices:
    return BoardServices(
        config=cluster.config,
        store=cluster.store,
        user="alice",
        prober=cluster.prober,
        ops=NodeOps(cluster.config, cluster.prober),
        options=BoardOptions(refresh_s=3600, **options),  # no refresh during the snapshot
        clock=lambda: T0,
    )


def small_cluster(root: Path) -> Synthetic:
    """Four nodes of four GPUs: every state, a multi-GPU claim of one's own, an expired claim
    (stale), someone's job using little memory, and an unreachable node that still shows the
    claim it holds."""
    cluster = synthetic_cluster(root, 4, 4, unreachable=(4,), busy_every=6)
    inv = cluster.prober.inventories["node03"]
    light = inv.gpus[1].replace(memory_used_mib=700, utilization_pct=96)  # under 1 GiB
    cluster.prober.inventories["node03"] = inv.replace(gpus=(inv.gpus[0], light, *inv.gpus[2:]))
    _job(cluster, "node03", 1, "bob", "resnet", ran_s=1800, limit_s=4 * 3600)
    inv = cluster.prober.inventories["node01"]
    _claim(cluster.store, "node01", [(inv.gpus[0].uuid, 0), (inv.gpus[1].uuid, 1)], "alice", 40)
    stale = cluster.prober.inventories["node02"].gpus[0]
    cluster.store.acquire(
        Claim("c-expired000", "bob", "node02", (ClaimedGpu(stale.uuid, 0),), T0 - 9000, T0 - 60)
    )
    cluster.store.acquire(
        Claim(
            "c-offline000",
            "chen",
            "node04",
            (ClaimedGpu("GPU-offline-0", 2),),
            T0 - 3600,
            T0 + 7200,
            note="long run",
        )
    )
    return cluster


async def _loaded(pilot: Any) -> None:
    await pilot.app.loaded.wait()
    await pilot.pause()


def _snap(
    snap_compare: Any, services: BoardServices, size: tuple[int, int], press: Sequence[str] = ()
) -> bool:
    return bool(
        snap_compare(make_app(services), press=press, terminal_size=size, run_before=_loaded)
    )


def test_board_small_80x24(snap_compare: Any, tmp_path: Path) -> None:
    assert _snap(snap_compare, services_for(small_cluster(tmp_path)), (80, 24))


def test_board_small_200x60(snap_compare: Any, tmp_path: Path) -> None:
    assert _snap(snap_compare, services_for(small_cluster(tmp_path)), (200, 60))


def test_board_services_120x24(snap_compare: Any, tmp_path: Path) -> None:
    # a service's row: its name and port, health, uptime, restarts and URL; the detail bar
    # (its first GPU selected) says how to reach it
    assert _snap(snap_compare, services_for(services_cluster(tmp_path)), (120, 24))


def test_board_32_nodes_200x60(snap_compare: Any, tmp_path: Path) -> None:
    cluster = synthetic_cluster(tmp_path, 32, 8, unreachable=(7, 20))
    assert _snap(snap_compare, services_for(cluster), (200, 60))


def test_board_32_nodes_compact_80x24(snap_compare: Any, tmp_path: Path) -> None:
    cluster = synthetic_cluster(tmp_path, 32, 8, unreachable=(7, 20))
    assert _snap(snap_compare, services_for(cluster, compact=True), (80, 24))


async def _claim_dialog(pilot: Any) -> None:
    from textual.widgets import Input

    await _loaded(pilot)
    await pilot.press("c")
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False  # a blinking cursor would make the picture flaky
    await pilot.pause()


def test_board_claim_dialog_80x24(snap_compare: Any, tmp_path: Path) -> None:
    app = make_app(services_for(small_cluster(tmp_path)))
    assert snap_compare(app, terminal_size=(80, 24), run_before=_claim_dialog)


def test_board_help_80x24(snap_compare: Any, tmp_path: Path) -> None:
    assert _snap(snap_compare, services_for(small_cluster(tmp_path)), (80, 24), press=["?"])
