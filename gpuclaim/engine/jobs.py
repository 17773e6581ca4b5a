"""Jobs: run a command on claimed GPUs in tmux, queue what does not fit, stop, list, finish.

Used by the CLI on the laptop and by the job wrapper on a node (which finishes its rank and
starts queued jobs that now fit there), so it needs only the standard library.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.config import Config, NodeConfig, WorkEnv, parse_storage_url
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    NameInUseError,
    NeverFitsError,
    UnreachableError,
    UsageError,
)
from gpuclaim.core.events import job_event
from gpuclaim.core.fanout import fan_out
from gpuclaim.core.identity import validate_name
from gpuclaim.core.model import Claim, Job, JobRank, iso
from gpuclaim.core.states import ACTIVE_JOB_STATES, FINAL_STATES
from gpuclaim.engine.claims import ClaimRequest, claim_gpus, release_claims
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view
from gpuclaim.engine.job_records import find_job, finish_rank, load_jobs, reload_job
from gpuclaim.engine.sync import SyncPlan, TreeCopier, push_copies
from gpuclaim.store import Store

CLAIM_MARGIN_S = 120.0  # a job's claim outlives its time limit by the grace plus this


@dataclass(frozen=True)
class RunRequest:
    user: str
    argv: tuple[str, ...]
    name: Optional[str] = None
    count: int = 1  # GPUs per node
    nodes: int = 1  # > 1: a gang job over that many nodes
    node: Optional[str] = None
    time_s: Optional[float] = None
    workdir: Optional[str] = None
    env: tuple[tuple[str, str], ...] = ()
    kind: str = "batch"
    visible_as: str = "index"
    queue: bool = False
    cwd: Optional[str] = None  # where run was typed: the workdir when the node has it
    venv: Optional[str] = None
    conda: Optional[str] = None
    sync: Optional[SyncPlan] = None  # --sync: copy these files to the job's nodes first
    sync_subdir: str = ""  # ... and run in this directory of the copy (typed in below its root)


class NodeOps:
    """Job operations on nodes, through the prober's channels."""

    def __init__(self, config: Config, prober: NodeProber) -> None:
        self.config = config
        self.prober = prober

    def _call(self, node: NodeConfig, op: str, **args: Any) -> Any:
        return self.prober.channels.to_node(node).call(op, args, 60.0)

    def launch(self, node: NodeConfig, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call(node, "launch", spec=spec))

    def keep_queue(self, node: NodeConfig, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call(node, "keep_queue", spec=spec))

    def stop_session(self, node: NodeConfig, session: str) -> bool:
        return bool(self._call(node, "stop_session", session=session))

    def read_log(
        self, node: NodeConfig, path: str, offset: int = 0, tail: int = 0, wait_s: float = 0.0
    ) -> dict[str, Any]:
        """``wait_s``: the node waits that long for the log to grow past ``offset``."""
        return dict(
            self._call(node, "read_log", path=path, offset=offset, tail_lines=tail, wait_s=wait_s)
        )

    def facts(self, node: NodeConfig) -> dict[str, Any]:
        return dict(self._call(node, "node_facts"))

    def sync_target(self, node: NodeConfig, key: str, job_id: str) -> dict[str, Any]:
        return dict(self._call(node, "sync_target", key=key, job_id=job_id))

    def prune_copies(self, node: NodeConfig, remove: list[str], known: list[str]) -> list[str]:
        return list(self._call(node, "prune_copies", remove=remove, known=known)["removed"])

    def pull_source(self, node: NodeConfig, directory: str, paths: list[str]) -> dict[str, Any]:
        return dict(self._call(node, "pull_source", directory=directory, paths=paths))

    @property
    def copier(self) -> Optional[TreeCopier]:
        """How files travel to and from nodes (rsync or tar over SSH), if this process can."""
        channels = self.prober.channels
        return channels if isinstance(channels, TreeCopier) else None


def new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:10]


def default_name(argv: Sequence[str]) -> str:
    """``python train.py`` -> ``train-1a2b``, ``python -m pkg.mod`` -> ``mod-1a2b``."""
    stem = Path(argv[0]).name if argv else "job"
    if stem.startswith("python") and len(argv) > 1:
        if "-m" in argv[1:-1]:
            stem = argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
        else:
            scripts = [a for a in argv[1:] if a.endswith(".py")]
            stem = Path(scripts[0]).stem if scripts else stem
    base = "".join(ch if ch.isalnum() or ch in "_-" else "-" for ch in stem).strip("-_")[:24]
    return f"{base or 'job'}-{uuid.uuid4().hex[:4]}"


def submit_job(
    config: Config,
    store: Store,
    req: RunRequest,
    prober: NodeProber,
    ops: Optional[NodeOps] = None,
) -> Job:
    """Start the job now (claiming its GPUs), or queue it with ``req.queue``.
    Without ``queue``, nothing free means ConflictError (exit 3) and no job is left behind; a
    name already used by a running or queued job of the user's is NameInUseError (exit 5)."""
    if not req.argv:
        raise UsageError("give the command to run after --, e.g. gpuclaim run -- python train.py")
    name = validate_name(req.name or default_name(req.argv), "job name")
    if any(
        j.user == req.user and j.name == name and j.state in ACTIVE_JOB_STATES
        for j in load_jobs(store)
    ):
        raise NameInUseError(f"you already have a job named {name!r}", hint="pick another --name")
    if req.nodes < 1 or req.count < 1:
        raise UsageError("-n and --nodes must be at least 1")
    if req.nodes > 1 and req.node:
        raise UsageError("--node pins a job to one node; a gang job (--nodes K) picks its nodes")
    if req.venv and req.conda:
        raise UsageError("--venv and --conda: a job runs in one of them")
    if req.sync and req.workdir:
        raise UsageError("--sync runs the job in its copy: --workdir cannot say otherwise")
    time_s = req.time_s if req.time_s is not None else config.limits.default_time_s
    if time_s > config.limits.max_time_s:
        raise UsageError(
            f"--time {format_duration(time_s)} is longer than this cluster's limit of "
            f"{format_duration(config.limits.max_time_s)}"
        )
    now = store.now()
    job = Job(
        id=new_job_id(),
        name=name,
        user=req.user,
        argv=tuple(req.argv),
        state="queued",
        submitted=now,
        time_limit_s=time_s,
        gpus_per_node=req.count,
        nodes_wanted=req.nodes,
        node=req.node,
        workdir=req.workdir,
        env=tuple(sorted(req.env)),
        kind=req.kind,
        visible_as=req.visible_as,
        cwd=req.cwd,
        venv=req.venv,
        conda=req.conda,
        synced_from=req.sync.root if req.sync else None,
    )
    ops = ops or NodeOps(config, prober)
    view = build_view(config, store, _nodes_for(config, job), prober=prober)
    _check_fits(config, view, job)
    if req.sync and req.queue:
        # the laptop may be closed when it starts: every node it could start on gets a copy
        nodes = [n for n in _nodes_for(config, job) if n.name not in view.unreachable]
        job = _with_copies(config, ops, job, req, nodes)
    if req.queue:
        store.create_job(job=job.to_dict())
        store.enqueue(job_id=job.id)
        store.append_event(job_event("job-queued", job, now))
        dispatch_queue(config, store, prober=prober, ops=ops)
        job = reload_job(store, job)
        if job.state == "queued":
            start_keepers(config, ops, job, view)
        return job
    ranks = place_and_claim(config, store, job, prober, view)
    if req.sync:
        try:
            job = _with_copies(config, ops, job, req, [config.node(r.node) for r in ranks])
        except GpuclaimError:
            for r in ranks:  # nothing half-started: the GPUs go back
                release_claims(config, store, job.user, claim_ids=[r.claim_id or ""], jobs_too=True)
            raise
    job = job.with_(state="starting", ranks=tuple(ranks))
    store.create_job(job=job.to_dict())
    return start_ranks(config, store, job, ops)


def _with_copies(
    config: Config, ops: NodeOps, job: Job, req: RunRequest, nodes: Sequence[NodeConfig]
) -> Job:
    """``job`` once ``req.sync`` is copied to ``nodes``: it runs in its copy (in the
    subdirectory ``run`` was typed in, below the project's root)."""
    assert req.sync is not None
    copy, copied = push_copies(config, ops, nodes, req.sync, job.id)
    workdir = f"{copy}/{req.sync_subdir}" if req.sync_subdir else copy
    return job.with_(workdir=workdir, synced=copied)


def _nodes_for(config: Config, job: Job) -> list[NodeConfig]:
    return [config.node(job.node)] if job.node else list(config.nodes)


def _check_fits(config: Config, view: ClusterView, job: Job) -> None:
    """Refuse at once what can never run here: more GPUs or nodes than the cluster has."""
    reachable = [n.name for n in _nodes_for(config, job) if n.name not in view.unreachable]
    if not reachable:
        raise UnreachableError("no node could be asked about its GPUs")
    big_enough = [n for n in reachable if len(view.gpus_of(n)) >= job.gpus_per_node]
    if len(big_enough) < job.nodes_wanted:
        sizes = ", ".join(f"{n} {len(view.gpus_of(n))}" for n in reachable)
        raise NeverFitsError(
            f"{job.nodes_wanted} node(s) with {job.gpus_per_node} GPUs can never fit "
            f"(GPUs per node: {sizes})"
        )


def place_and_claim(
    config: Config,
    store: Store,
    job: Job,
    prober: NodeProber,
    view: Optional[ClusterView] = None,
    allowed: Optional[Sequence[str]] = None,
) -> list[JobRank]:
    """Claim ``gpus_per_node`` GPUs on each of ``nodes_wanted`` nodes, all or nothing."""
    duration = job.time_limit_s + CLAIM_MARGIN_S
    candidates = [n.name for n in _nodes_for(config, job) if allowed is None or n.name in allowed]
    if view is None:
        view = build_view(config, store, [config.node(n) for n in candidates], prober=prober)
    if job.nodes_wanted == 1:
        req = ClaimRequest(
            user=job.user,
            count=job.gpus_per_node,
            node=candidates[0] if len(candidates) == 1 else None,
            duration_s=duration,
            note=f"job {job.name}",
            job=job.id,
        )
        sub = config if allowed is None else _only(config, candidates)
        claim = claim_gpus(sub, store, req, prober=_reuse(prober, view))
        return [_rank(0, claim)]
    # Gang: the nodes with room, fullest first (best fit), then exact GPUs on each.
    free = {
        n: [r for r in view.gpus_of(n) if r.state in ("free", "stale") and r.uuid]
        for n in candidates
        if n not in view.unreachable and n not in view.drains
    }
    fitting = sorted(
        (n for n in free if len(free[n]) >= job.gpus_per_node),
        key=lambda n: (len(free[n]), candidates.index(n)),
    )
    if len(fitting) < job.nodes_wanted:
        raise ConflictError(
            f"{job.nodes_wanted} nodes with {job.gpus_per_node} free GPUs are not free now"
        )
    ranks: list[JobRank] = []
    try:
        for rank, node in enumerate(fitting[: job.nodes_wanted]):
            indices = tuple(sorted(r.index or 0 for r in free[node])[: job.gpus_per_node])
            req = ClaimRequest(
                user=job.user,
                exact=((node, indices),),
                duration_s=duration,
                note=f"job {job.name} rank {rank}",
                job=job.id,
            )
            ranks.append(_rank(rank, claim_gpus(config, store, req, prober=_reuse(prober, view))))
    except GpuclaimError:
        for r in ranks:
            release_claims(config, store, job.user, claim_ids=[r.claim_id or ""], jobs_too=True)
        raise
    return ranks


def start_ranks(config: Config, store: Store, job: Job, ops: NodeOps) -> Job:
    """Launch every rank's tmux session; if one cannot start, stop the others and give the
    GPUs back: a job runs whole or not at all."""
    gang: dict[str, Any] = {}
    if len(job.ranks) > 1:
        facts = ops.facts(config.node(job.ranks[0].node))
        gang = {
            "MASTER_ADDR": facts["hostname"],
            "MASTER_PORT": facts["port"],
            "NNODES": len(job.ranks),
            "NPROC_PER_NODE": job.gpus_per_node,
            "WORLD_SIZE": len(job.ranks) * job.gpus_per_node,
        }
    launched: list[JobRank] = []
    try:
        for r in job.ranks:
            node = config.node(r.node)
            spec = rank_spec(config, store, job, r, node, dict(gang, NODE_RANK=r.rank))
            answer = ops.launch(node, spec)
            workenv = spec["workenv"]
            store.update_job(
                job_id=job.id,
                changes={},
                rank=r.rank,
                rank_changes={
                    "log": answer.get("log"),
                    "workdir": answer.get("workdir"),
                    "venv": workenv["venv"],
                    "conda": workenv["conda"],
                },
            )
            launched.append(r)
    except GpuclaimError as exc:
        for r in launched:
            try:
                ops.stop_session(config.node(r.node), job.session)
            except GpuclaimError:
                pass
        for r in job.ranks:
            finish_rank(store, job, r.rank, "failed", None, f"could not start: {exc.message}")
        raise
    return reload_job(store, job)


def start_keepers(config: Config, ops: NodeOps, job: Job, view: ClusterView) -> list[str]:
    """A queued job waits: a keeper on every node it could run on starts it there as soon as
    GPUs free up (an expiry included), laptop closed. Returns the nodes that have one; a node
    that cannot start one is left to the wrappers and the next gpuclaim call."""
    if job.nodes_wanted > 1:
        return []  # a gang needs several nodes at once: the laptop's dispatch places it
    nodes = [
        n
        for n in _nodes_for(config, job)
        if len(view.gpus_of(n.name)) >= job.gpus_per_node and n.name not in view.unreachable
    ]
    outcomes = fan_out(
        [n.name for n in nodes],
        lambda name: ops.keep_queue(config.node(name), keeper_spec(config, name)),
        config.limits.deadline_s,
    )
    return [name for name, outcome in outcomes.items() if outcome.ok]


def keeper_spec(config: Config, node: str) -> dict[str, Any]:
    return {"node": node, "store_root": _node_store_root(config), "config": config.raw}


def _node_store_root(config: Config) -> str:
    """The store as the nodes see it: ssh:// storage is at the same path on every node."""
    storage = config.storage
    if storage.startswith("ssh://"):
        return parse_storage_url(storage)[1]
    return str(config.storage_path)


def rank_spec(
    config: Config, store: Store, job: Job, rank: JobRank, node: NodeConfig, gang: dict[str, Any]
) -> dict[str, Any]:
    """All a node needs to run one rank on its own, laptop closed."""
    workenv = config.workenv_of(node, WorkEnv(venv=job.venv, conda=job.conda))
    return {
        "job": job.to_dict(),
        "rank": rank.rank,
        "session": job.session,
        "store_root": _node_store_root(config),
        "config": config.raw,
        "node_env": dict(node.env),
        "nvidia_smi": list(node.nvidia_smi),
        "workenv": {
            "login_shell": workenv.login_shell,
            "venv": workenv.venv,
            "conda": workenv.conda,
        },
        "probe_timeout": config.limits.probe_timeout_s,
        "grace_s": config.limits.kill_grace_s,
        "beat_s": config.limits.heartbeat_s,
        "sample_s": max(config.limits.heartbeat_s, min(60.0, config.idle.window_s / 4)),
        "idle_threshold_pct": config.idle.threshold_pct,
        "gang": gang if len(job.ranks) > 1 else {},
        # What the placement probe saw, so a wrapper starting seconds later need not look again
        "placed": {"at": store.now(), "indices": dict(zip(rank.gpu_uuids, rank.gpus))},
    }


def kill_job(
    config: Config,
    store: Store,
    user: str,
    name: str,
    ops: NodeOps,
    force: bool = False,
    wait_s: float = 0.0,
) -> Job:
    """Stop a job (all ranks) or take it out of the queue; only one's own without ``force``."""
    job = find_job(store, user, name) if not force else _find_any(store, name)
    if job.user != user and not force:
        raise ConflictError(f"job {job.name} belongs to {job.user}", hint="use --force (logged)")
    if job.state not in ACTIVE_JOB_STATES:
        raise GpuclaimError(f"job {job.name} already ended ({job.state})")
    if job.user != user:  # --force on someone else's job: on the record, and on Slack
        store.append_event(
            replace(job_event("force-kill", job, store.now()), by=user, reason=f"killed by {user}")
        )
    if job.state == "queued":
        for entry in store.queue_entries():
            if entry.endswith(f"-{job.id}") and store.take_queue_entry(name=entry):
                store.finish_queue_entry(name=entry)
        result = store.update_job(
            job_id=job.id,
            changes={"state": "killed", "ended": iso(store.now()), "reason": f"removed by {user}"},
            only_from=["queued"],
        )
        if result["applied"]:
            return Job.from_dict(result["job"])
        job = reload_job(store, job)  # it started meanwhile: stop it like a running one
    store.update_job(
        job_id=job.id, changes={"stop_requested": "kill"}, only_from=["starting", "running"]
    )

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        current = reload_job(store, job)
        if current.state in FINAL_STATES:
            return current
        time.sleep(0.5)
    current = reload_job(store, job)
    if current.state in FINAL_STATES or wait_s == 0:
        return current
    # The wrappers did not finish it: they are gone (node rebooted, tmux killed). Clean up.
    for r in current.ranks:
        if r.state in FINAL_STATES:
            continue
        try:
            ops.stop_session(config.node(r.node), current.session)
        except GpuclaimError:
            pass
        finish_rank(store, current, r.rank, "killed", None, "stopped; its wrapper was gone")
    return reload_job(store, current)


def _find_any(store: Store, name: str) -> Job:
    live = [
        j
        for j in load_jobs(store)
        if (j.name == name or j.id == name) and j.state in ACTIVE_JOB_STATES
    ]
    if not live:
        raise GpuclaimError(f"no running or queued job {name!r}")
    if len(live) > 1:
        raise UsageError(f"several users have a job {name!r}: give its id ({live[0].id}, ...)")
    return live[0]


def dispatch_queue(
    config: Config,
    store: Store,
    prober: NodeProber,
    ops: Optional[NodeOps] = None,
    only_node: Optional[str] = None,
) -> list[Job]:
    """Start queued jobs that fit now, first come first served. A later job may start before
    a waiting one only on nodes where the waiting one can never run, so it never delays it.
    With ``only_node`` (a job wrapper on that node), only that node is used, locally."""
    if only_node is not None:
        config = config.seen_from(only_node)
    ops = ops or NodeOps(config, prober)
    entries = store.queue_entries()
    if not entries:
        return []
    view = build_view(config, store, prober=prober)
    started: list[Job] = []
    blocked_heads: list[Job] = []
    for entry in entries:
        job_id = entry.split("-", 1)[1]
        data = store.load_job_dict(job_id=job_id)
        job = Job.from_dict(data) if data else None
        if job is None or job.state != "queued":
            store.finish_queue_entry(name=entry)
            continue
        allowed = _backfill_nodes(config, view, blocked_heads)
        if allowed is not None and not allowed:
            break
        if not store.take_queue_entry(name=entry):
            continue  # another dispatcher has it
        try:
            ranks = place_and_claim(config, store, job, prober, view, allowed)
        except (ConflictError, NeverFitsError, UnreachableError, UsageError):
            store.return_queue_entry(name=entry)
            blocked_heads.append(job)
            continue
        except GpuclaimError:
            store.return_queue_entry(name=entry)
            raise
        moved = store.update_job(
            job_id=job.id,
            changes={
                "state": "starting",
                "ranks": [r.to_dict() for r in ranks],
                "from_queue": True,
            },
            only_from=["queued"],
        )
        store.finish_queue_entry(name=entry)
        if not moved["applied"]:  # killed while we placed it
            for r in ranks:
                release_claims(config, store, job.user, claim_ids=[r.claim_id or ""], jobs_too=True)
            continue
        job = Job.from_dict(moved["job"])
        try:
            started.append(start_ranks(config, store, job, ops))
        except GpuclaimError:
            continue  # start_ranks recorded the failure and gave the GPUs back
        view = build_view(config, store, prober=prober, inventories=view.inventories)
    return started


def _backfill_nodes(config: Config, view: ClusterView, heads: list[Job]) -> Optional[list[str]]:
    """None: anything goes. Else the nodes where no waiting earlier job could ever run."""
    if not heads:
        return None
    allowed = []
    for n in config.nodes:
        size = len(view.gpus_of(n.name))
        usable_by_a_head = any(
            (h.node is None or h.node == n.name) and size >= h.gpus_per_node for h in heads
        )
        gang_head = any(h.nodes_wanted > 1 for h in heads)
        if not usable_by_a_head and not gang_head:
            allowed.append(n.name)
    return allowed


def _only(config: Config, names: Sequence[str]) -> Config:
    return replace(config, nodes=tuple(n for n in config.nodes if n.name in names))


def _reuse(prober: NodeProber, view: ClusterView) -> NodeProber:
    """A prober that answers with the inventories already probed for this placement."""
    return _CachedProber(prober, view)


class _CachedProber(NodeProber):
    def __init__(self, inner: NodeProber, view: ClusterView) -> None:
        super().__init__(inner.config, inner._channels)
        self.inner = inner
        self.view = view

    def probe(
        self,
        nodes: Sequence[NodeConfig],
        enough: Optional[Callable[[dict[str, Any]], bool]] = None,
    ) -> dict[str, Any]:
        missing = [n for n in nodes if n.name not in self.view.inventories]
        result = {
            n.name: self.view.inventories[n.name] for n in nodes if n.name in self.view.inventories
        }
        if missing:
            cached = dict(result)  # ``enough`` judges the cached answers and the new ones
            judge = None if enough is None else (lambda answers: enough({**cached, **answers}))
            result.update(self.inner.probe(missing, judge))
        return result


def _rank(rank: int, claim: Claim) -> JobRank:
    return JobRank(
        rank=rank,
        node=claim.node,
        gpus=tuple(claim.indices),
        gpu_uuids=tuple(g.uuid for g in sorted(claim.gpus, key=lambda g: g.index)),
        claim_id=claim.id,
    )
