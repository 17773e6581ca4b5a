"""Placing a job and starting it: claim its GPUs (all or nothing, a gang's nodes best fit),
launch each rank's tmux session through the node's channel, keepers for what waits.

Below submitting and the queue (``jobs``, ``dispatch``): both place and start jobs this way.
Standard library only: job wrappers start queued jobs from the nodes."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Optional

from gpuclaim.core.config import Config, NodeConfig, WorkEnv
from gpuclaim.core.errors import AnswerLostError, ConflictError, GpuclaimError
from gpuclaim.core.fanout import fan_out
from gpuclaim.core.model import Claim, Job, JobRank
from gpuclaim.core.protocol import (
    KEEP_QUEUE,
    LAUNCH,
    NODE_FACTS,
    PRUNE_COPIES,
    PULL_SOURCE,
    RAY_CHECK,
    READ_LOG,
    STOP_SESSION,
    SYNC_READY,
    SYNC_TARGET,
    GangEnv,
    KeeperSpec,
    KeepQueueRequest,
    KeepQueueResponse,
    LaunchRequest,
    LaunchResponse,
    NodeFactsRequest,
    NodeFactsResponse,
    Op,
    PruneCopiesRequest,
    PullSourceRequest,
    PullSourceResponse,
    RankSpec,
    RayCheckRequest,
    RayCheckResponse,
    ReadLogRequest,
    ReadLogResponse,
    Req,
    Resp,
    StopSessionRequest,
    SyncReadyRequest,
    SyncTargetRequest,
    WorkEnvSpec,
)
from gpuclaim.core.states import JobState
from gpuclaim.engine.channel import ask
from gpuclaim.engine.claims import CLAIM_MARGIN_S as CLAIM_MARGIN_S  # where jobs read it
from gpuclaim.engine.claims import claim_gpus, release_claims
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view
from gpuclaim.engine.job_records import finish_rank, reload_job
from gpuclaim.engine.placement import ClaimRequest, usable_rows
from gpuclaim.engine.preempt import (
    Handover,
    Say,
    drop_bookings,
    find_gang_handover,
    gang_hand_over,
)
from gpuclaim.engine.sync import TreeCopier
from gpuclaim.store import Store


class NodeOps:
    """Job operations on nodes, through the prober's channels: one method per agent op, typed
    by its pair in ``core/protocol.py``."""

    # nodes this process asked to start a queue keeper on (the command's own end checks for
    # lost keepers: one started a moment ago may not hold its lock yet)
    keepers_started: ClassVar[set[str]] = set()

    def __init__(self, config: Config, prober: NodeProber) -> None:
        self.config = config
        self.prober = prober

    def _call(self, node: NodeConfig, op: Op[Req, Resp], request: Req) -> Resp:
        return ask(self.prober.channels.to_node(node), op, request, 60.0)

    def launch(self, node: NodeConfig, spec: RankSpec) -> LaunchResponse:
        return self._call(node, LAUNCH, LaunchRequest(spec=spec))

    def keep_queue(self, node: NodeConfig, spec: KeeperSpec) -> KeepQueueResponse:
        answer = self._call(node, KEEP_QUEUE, KeepQueueRequest(spec=spec))
        NodeOps.keepers_started.add(node.name)
        return answer

    def stop_session(self, node: NodeConfig, session: str) -> bool:
        return bool(self._call(node, STOP_SESSION, StopSessionRequest(session=session)))

    def read_log(
        self, node: NodeConfig, path: str, offset: int = 0, tail: int = 0, wait_s: float = 0.0
    ) -> ReadLogResponse:
        """``wait_s``: the node waits that long for the log to grow past ``offset``."""
        request = ReadLogRequest(path=path, offset=offset, tail_lines=tail, wait_s=wait_s)
        return self._call(node, READ_LOG, request)

    def facts(self, node: NodeConfig, port: Optional[int] = None) -> NodeFactsResponse:
        request = NodeFactsRequest() if port is None else NodeFactsRequest(port=port)
        return self._call(node, NODE_FACTS, request)

    def ray_check(
        self, node: NodeConfig, workenv: WorkEnvSpec, workdir: Optional[str]
    ) -> RayCheckResponse:
        return self._call(node, RAY_CHECK, RayCheckRequest(workenv=workenv, workdir=workdir))

    def sync_target(
        self,
        node: NodeConfig,
        key: str,
        job_id: str,
        files: Optional[Sequence[str]],
        reuse: bool,
    ) -> dict[str, Any]:
        """A ``SyncTargetResponse``, as a plain dict while its reader (engine/sync's
        ``TreeCopier.push_tree``) takes one."""
        request = SyncTargetRequest(key=key, job_id=job_id, files=files, reuse=reuse)
        answer = self._call(node, SYNC_TARGET, request)
        return dict(answer)

    def sync_ready(self, node: NodeConfig, key: str, job_id: str) -> None:
        self._call(node, SYNC_READY, SyncReadyRequest(key=key, job_id=job_id))

    def prune_copies(self, node: NodeConfig, remove: list[str], known: list[str]) -> list[str]:
        request = PruneCopiesRequest(remove=remove, known=known)
        return list(self._call(node, PRUNE_COPIES, request)["removed"])

    def pull_source(self, node: NodeConfig, directory: str, paths: list[str]) -> PullSourceResponse:
        return self._call(node, PULL_SOURCE, PullSourceRequest(directory=directory, paths=paths))

    @property
    def copier(self) -> Optional[TreeCopier]:
        """How files travel to and from nodes (rsync or tar over SSH), if this process can."""
        channels = self.prober.channels
        return channels if isinstance(channels, TreeCopier) else None


def nodes_for(config: Config, job: Job) -> list[NodeConfig]:
    """The nodes a job may run on: its pinned one, else any (a Ray job: those with Ray)."""
    if job.node:
        return [config.node(job.node)]
    if job.ray_nodes:
        return [n for n in config.nodes if n.name in job.ray_nodes]
    return list(config.nodes)


def place_and_claim(
    config: Config,
    store: Store,
    job: Job,
    prober: NodeProber,
    view: Optional[ClusterView] = None,
    allowed: Optional[Sequence[str]] = None,
    say: Optional[Say] = None,
) -> list[JobRank]:
    """Claim ``gpus_per_node`` GPUs on each of ``nodes_wanted`` nodes, all or nothing. With
    ``say`` a one-node job may wait for preemptible jobs to yield (engine.preempt)."""
    duration = job.time_limit_s + CLAIM_MARGIN_S
    candidates = [n.name for n in nodes_for(config, job) if allowed is None or n.name in allowed]
    if view is None:
        view = build_view(config, store, [config.node(n) for n in candidates], prober=prober)
    if job.nodes_wanted == 1:
        pinned = ((job.node or "", job.gpu_indices),) if job.gpu_indices else ()
        req = ClaimRequest(
            user=job.user,
            count=job.gpus_per_node,
            exact=pinned,
            node=candidates[0] if len(candidates) == 1 else None,
            duration_s=duration,
            note=f"job {job.name}",
            job=job.id,
            reservation=job.reservation,
            preemptible=job.preemptible,
            service=job.service is not None,
            keep_when_idle=job.service is not None and not job.service.idle_release,
            gpu_mem_mib=job.gpu_mem_mib,
            gpu_share=job.gpu_share,
            mig=job.mig,
        )
        sub = config if allowed is None else _only(config, candidates)
        claim = claim_gpus(sub, store, req, prober=_reuse(prober, view), say=say)
        return [_rank(0, claim)]
    # Gang: the nodes with room, fullest first (best fit), then exact GPUs on each.
    asking = ClaimRequest(
        user=job.user,
        count=job.gpus_per_node,
        duration_s=duration,
        preemptible=job.preemptible,
        mig=job.mig,
    )
    until = view.snapshot.now + duration
    free = {
        n: usable_rows(view, n, asking, until)
        for n in candidates
        if n not in view.unreachable and n not in view.drains
    }
    fitting = sorted(
        (n for n in free if len(free[n]) >= job.gpus_per_node),
        key=lambda n: (len(free[n]), candidates.index(n)),
    )
    if len(fitting) < job.nodes_wanted:
        if say is not None:
            handovers = find_gang_handover(
                config, view, asking, job.nodes_wanted, candidates, duration
            )
            if handovers is not None:
                return _gang_handed_over(config, store, job, prober, asking, handovers, say)
        raise ConflictError(
            f"{job.nodes_wanted} nodes with {job.gpus_per_node} free GPUs are not free now"
        )
    picks = []
    for node in fitting[: job.nodes_wanted]:
        rows = sorted(free[node], key=lambda r: r.order)[: job.gpus_per_node]
        picks.append((node, tuple(r.label for r in rows)))
    return _claim_ranks(config, store, job, picks, _reuse(prober, view))


def _claim_ranks(
    config: Config,
    store: Store,
    job: Job,
    picks: Sequence[tuple[str, tuple[str, ...]]],
    prober: NodeProber,
) -> list[JobRank]:
    """A gang's ranks: exactly these GPUs on each node (rank by rank), all or none."""
    duration = job.time_limit_s + CLAIM_MARGIN_S
    ranks: list[JobRank] = []
    try:
        for rank, (node, labels) in enumerate(picks):
            req = ClaimRequest(
                user=job.user,
                exact=((node, labels),),
                duration_s=duration,
                note=f"job {job.name} rank {rank}",
                job=job.id,
                preemptible=job.preemptible,
                mig=job.mig,
            )
            ranks.append(_rank(rank, claim_gpus(config, store, req, prober=prober)))
    except GpuclaimError:
        for r in ranks:
            release_claims(config, store, job.user, claim_ids=[r.claim_id or ""], jobs_too=True)
        raise
    return ranks


def _gang_handed_over(
    config: Config,
    store: Store,
    job: Job,
    prober: NodeProber,
    asking: ClaimRequest,
    handovers: list[Handover],
    say: Say,
) -> list[JobRank]:
    """A gang whose nodes' preemptible jobs yielded (engine.preempt): its ranks claim exactly
    the handed-over GPUs inside the bookings that kept everyone else off them meanwhile."""
    bookings = gang_hand_over(config, store, asking, handovers, say)
    try:
        picks = [(h.node, h.labels) for h in handovers]
        # asked again: the yielded jobs' processes are gone now (an earlier answer shows them)
        return _claim_ranks(config, store, job, picks, prober.fresh())
    finally:
        drop_bookings(store, bookings)


def start_ranks(config: Config, store: Store, job: Job, ops: NodeOps) -> Job:
    """Launch every rank's tmux session; if one cannot start, stop the others and give the
    GPUs back: a job runs whole or not at all."""
    gang: GangEnv = {}
    # run --ray: the token its Ray nodes and clients share (in each rank's owner-only spec)
    token = secrets.token_urlsafe(24) if job.ray else ""
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
            spec = rank_spec(config, store, job, r, node, {**gang, "NODE_RANK": r.rank})
            spec["ray_token"] = token
            answer = ops.launch(node, spec)
            workenv = spec["workenv"]
            store.update_job(
                job_id=job.id,
                changes={},
                rank=r.rank,
                rank_changes={
                    "log": answer["log"],
                    "workdir": answer["workdir"],
                    "venv": workenv["venv"],
                    "conda": workenv["conda"],
                },
            )
            launched.append(r)
    except AnswerLostError as exc:
        _answer_lost(config, store, job, r, exc)
        raise
    except GpuclaimError as exc:
        for r in launched:
            try:
                ops.stop_session(config.node(r.node), job.session_of(r.rank))
            except GpuclaimError:
                pass
        for r in job.ranks:
            finish_rank(
                store, job, r.rank, JobState.FAILED, None, f"could not start: {exc.message}"
            )
        raise
    return reload_job(store, job)


def _answer_lost(
    config: Config, store: Store, job: Job, lost: JobRank, exc: AnswerLostError
) -> None:
    """The launch of rank ``lost`` reached its node and its answer did not come back: its
    wrapper may be starting there. That rank keeps its claim, ``starting``, until the wrapper
    beats (it runs, held) or the launch grace passes without a beat (judged lost, its claim
    freed; a wrapper later than that finds its end recorded and stops): never a command on
    GPUs nobody holds, nor a job said failed that runs. Ranks after it were never launched:
    they could not start, which stops the gang's others."""
    later = [r for r in job.ranks if r.rank > lost.rank]
    for r in later:
        finish_rank(store, job, r.rank, JobState.FAILED, None, f"could not start: {exc.message}")
    exc.message = (
        f"{exc.message}: the launch reached {lost.node}, its answer did not come back; job "
        f"{job.name} stays starting with its GPUs until its wrapper is heard from "
        "(gpuclaim jobs says which)"
    )


def start_keepers(config: Config, ops: NodeOps, job: Job, view: ClusterView) -> list[str]:
    """A queued job waits: a keeper on every node it could run on starts it there as soon as
    GPUs free up (an expiry included), laptop closed. Returns the nodes that have one; a node
    that cannot start one is left to the wrappers and the next gpuclaim call."""
    if job.nodes_wanted > 1:
        return []  # a gang needs several nodes at once: the laptop's dispatch places it
    nodes = [
        n
        for n in nodes_for(config, job)
        if len(view.gpus_of(n.name)) >= job.gpus_per_node and n.name not in view.unreachable
    ]
    outcomes = fan_out(
        [n.name for n in nodes],
        lambda name: ops.keep_queue(config.node(name), keeper_spec(config, name)),
        config.limits.deadline_s,
    )
    return [name for name, outcome in outcomes.items() if outcome.ok]


def keeper_spec(config: Config, node: str) -> KeeperSpec:
    return {"node": node, "store_root": config.store_root_on_nodes, "config": config.raw}


def rank_spec(
    config: Config,
    store: Store,
    job: Job,
    rank: JobRank,
    node: NodeConfig,
    gang: GangEnv,
    seen: Optional[dict[str, int]] = None,
    revived: str = "",
) -> RankSpec:
    """All a node needs to run one rank on its own, laptop closed. ``seen``: the GPUs'
    indices by UUID as a probe just saw them (else as placed); ``revived``: see RankSpec."""
    workenv = config.workenv_of(node, WorkEnv(venv=job.venv, conda=job.conda))
    return {
        "job": job.to_dict(),
        "rank": rank.rank,
        "session": job.session_of(rank.rank),
        "store_root": config.store_root_on_nodes,
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
        "preempt_grace_s": config.queue.preempt_grace_s,
        "beat_s": config.limits.heartbeat_s,
        "sample_s": max(config.limits.heartbeat_s, min(60.0, config.idle.window_s / 4)),
        "idle_threshold_pct": config.idle.threshold_pct,
        "gang": gang if len(job.ranks) > 1 else {},
        # What the placement probe saw, so a wrapper starting seconds later need not look again
        "placed": {
            "at": store.now(),
            "indices": dict(zip(rank.gpu_uuids, rank.gpus)) if seen is None else seen,
        },
        "revived": revived,
        "ray_token": "",
    }


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

    def fresh(self) -> NodeProber:
        return self.inner.fresh()

    def probe(
        self,
        nodes: Sequence[NodeConfig],
        enough: Optional[Callable[[dict[str, Any]], bool]] = None,
        max_age_s: float = 0.0,
    ) -> dict[str, Any]:
        missing = [n for n in nodes if n.name not in self.view.inventories]
        result = {
            n.name: self.view.inventories[n.name] for n in nodes if n.name in self.view.inventories
        }
        if missing:
            cached = dict(result)  # ``enough`` judges the cached answers and the new ones
            judge = None if enough is None else (lambda answers: enough({**cached, **answers}))
            result.update(self.inner.probe(missing, judge, max_age_s))
        return result


def _rank(rank: int, claim: Claim) -> JobRank:
    return JobRank(
        rank=rank,
        node=claim.node,
        gpus=tuple(claim.indices),
        gpu_uuids=tuple(g.uuid for g in sorted(claim.gpus, key=lambda g: g.index)),
        claim_id=claim.id,
        mem_mib=claim.mem_mib,
        mem_total_mib=claim.mem_total_mib,
    )
