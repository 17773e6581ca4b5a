"""Jobs: run a command on claimed GPUs in tmux, queue what does not fit, stop, list, finish.

Used by the CLI on the laptop and by the job wrapper on a node (which finishes its rank and
starts queued jobs that now fit there), so it needs only the standard library.
"""

from __future__ import annotations

import shlex
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from gpuclaim.claims import ClaimRequest, claim_gpus, release_claims
from gpuclaim.cluster import ClusterView, NodeProber, build_view
from gpuclaim.config import Config, NodeConfig
from gpuclaim.errors import (
    ConflictError,
    GpuclaimError,
    NameInUseError,
    NeverFitsError,
    UnreachableError,
    UsageError,
)
from gpuclaim.identity import validate_name
from gpuclaim.model import ACTIVE_JOB_STATES, Claim, Event, Job, JobRank, iso
from gpuclaim.remote.fanout import fan_out
from gpuclaim.store import Store

FINAL_STATES = ("succeeded", "failed", "killed", "timeout", "lost")
CLAIM_MARGIN_S = 120.0  # a job's claim outlives its time limit by the grace plus this

# What `run --follow` and `logs -f` exit with for a job that did not end by its own exit
# (README, "Exit codes"); a job that exits on its own gives its own code.
KILLED_EXIT = 128 + 15  # stopped (kill, the idle policy): as a shell says SIGTERM
TIMEOUT_EXIT = 124  # past its --time, as timeout(1) says it
LOST_EXIT = 255  # its node, tmux or wrapper went away: how it ended is unknown
# `run` watches a job's first moment, so that one that dies at once is not "Started":
SETTLE_S = 0.5  # running this long on every rank: past its first moment
FIRST_MOMENT_S = 2.0  # never waits longer than this (a node slow to start it)


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


class NodeOps:
    """Job operations on nodes: in-process for local nodes, through the agent over SSH."""

    def __init__(self, config: Config, prober: Optional[NodeProber] = None) -> None:
        self.config = config
        self.prober = prober or NodeProber(config)

    def _call(self, node: NodeConfig, op: str, **args: Any) -> Any:
        if node.transport == "local":
            from gpuclaim.agent import handle

            answer = handle({"op": op, **args})
            if "error" in answer:
                from gpuclaim import errors

                err = answer["error"]
                cls = getattr(errors, str(err.get("type")), GpuclaimError)
                raise cls(str(err.get("message")), hint=err.get("hint"))
            return answer["result"]
        return self.prober.agent.call(node.host, {"op": op, **args}, timeout=60)

    def launch(self, node: NodeConfig, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call(node, "launch", spec=spec))

    def keep_queue(self, node: NodeConfig, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call(node, "keep_queue", spec=spec))

    def stop_session(self, node: NodeConfig, session: str) -> bool:
        return bool(self._call(node, "stop_session", session=session))

    def read_log(self, node: NodeConfig, path: str, offset: int = 0, tail: int = 0) -> dict:
        return dict(self._call(node, "read_log", path=path, offset=offset, tail_lines=tail))

    def facts(self, node: NodeConfig) -> dict[str, Any]:
        return dict(self._call(node, "node_facts"))


def attach_command(config: Config, node_name: str, session: str) -> list[str]:
    """The argv that attaches a terminal to a job's tmux session (``ssh -t`` for SSH nodes),
    with the ssh config every other command uses."""
    node = config.node(node_name)
    tmux = ["tmux", "attach-session", "-t", f"={session}"]
    if node.transport == "local":
        return tmux
    from gpuclaim.remote.ssh import config_for_ssh_binary

    argv = [shutil.which("ssh") or "ssh", "-t"]
    config_file = config_for_ssh_binary(config.ssh_config_path)
    if config_file is not None:
        argv += ["-F", str(config_file)]
    return [*argv, node.host, " ".join(shlex.quote(a) for a in tmux)]


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


def load_jobs(store: Store) -> list[Job]:
    jobs = []
    for d in store.list_job_dicts():
        try:
            jobs.append(Job.from_dict(d))
        except (KeyError, ValueError, TypeError):
            continue
    return sorted(jobs, key=lambda j: j.submitted)


def find_job(store: Store, user: str, name: str, active_only: bool = True) -> Job:
    """A user's job by name (the newest one) or by id."""
    matches = [j for j in load_jobs(store) if (j.name == name and j.user == user) or j.id == name]
    if active_only:
        live = [j for j in matches if j.state in ACTIVE_JOB_STATES]
        matches = live or matches
    if not matches:
        raise GpuclaimError(f"no job {name!r} of {user}", hint="see 'gpuclaim jobs'")
    return matches[-1]


def submit_job(
    config: Config,
    store: Store,
    req: RunRequest,
    prober: Optional[NodeProber] = None,
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
    time_s = req.time_s if req.time_s is not None else config.limits.default_time_s
    if time_s > config.limits.max_time_s:
        from gpuclaim.durations import format_duration

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
    )
    prober = prober or NodeProber(config)
    ops = ops or NodeOps(config, prober)
    view = build_view(config, store, _nodes_for(config, job), prober=prober)
    _check_fits(config, view, job)
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
    job = job.with_(state="starting", ranks=tuple(ranks))
    store.create_job(job=job.to_dict())
    return start_ranks(config, store, job, ops)


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
            store.update_job(
                job_id=job.id, changes={}, rank=r.rank, rank_changes={"log": answer.get("log")}
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
        from gpuclaim.remote.store_proxy import parse_storage_url

        return parse_storage_url(storage)[1]
    return str(config.storage_path)


def rank_spec(
    config: Config, store: Store, job: Job, rank: JobRank, node: NodeConfig, gang: dict
) -> dict[str, Any]:
    """All a node needs to run one rank on its own, laptop closed."""
    return {
        "job": job.to_dict(),
        "rank": rank.rank,
        "session": job.session,
        "store_root": _node_store_root(config),
        "config": config.raw,
        "node_env": dict(node.env),
        "nvidia_smi": list(node.nvidia_smi),
        "probe_timeout": config.limits.probe_timeout_s,
        "grace_s": config.limits.kill_grace_s,
        "beat_s": config.limits.heartbeat_s,
        "sample_s": max(config.limits.heartbeat_s, min(60.0, config.idle.window_s / 4)),
        "idle_threshold_pct": config.idle.threshold_pct,
        "gang": gang if len(job.ranks) > 1 else {},
    }


def finish_rank(
    store: Store,
    job: Job,
    rank: int,
    state: str,
    exit_code: Optional[int],
    reason: str,
    log_tail: str = "",
) -> Optional[Job]:
    """Record one rank's end, release its claim; the last rank to end decides the job's state.
    A failed rank asks the others to stop. Returns the job once final, else None."""
    now = store.now()
    me = job.ranks[rank]
    result = store.update_job(
        job_id=job.id,
        changes={},
        rank=rank,
        rank_changes={"state": state, "exit_code": exit_code, "ended": iso(now)},
    )
    current = Job.from_dict(result["job"])
    if me.claim_id:
        _release_rank_claim(store, current, me)
    if state in ("failed", "timeout") and len(current.ranks) > 1 and not current.stop_requested:
        store.update_job(job_id=job.id, changes={"stop_requested": f"rank {rank} {state}"})
    if any(r.state not in FINAL_STATES for r in current.ranks):
        return None
    final_state, final_code = _job_outcome(current)
    done = store.update_job(
        job_id=job.id,
        changes={
            "state": final_state,
            "exit_code": final_code,
            "ended": iso(now),
            "reason": reason if final_state != "succeeded" else "",
        },
        only_from=list(ACTIVE_JOB_STATES),
    )
    if not done["applied"]:
        return None
    final = Job.from_dict(done["job"])
    extra = {"log_tail": log_tail} if log_tail and final_state != "succeeded" else {}
    store.append_event(job_event("job-end", final, now, extra))
    return final


def _job_outcome(job: Job) -> tuple[str, Optional[int]]:
    """The job's end from its ranks': a timeout or a kill wins, then a failed or lost rank."""
    by_state = {r.state: r.exit_code for r in reversed(job.ranks)}
    if "timeout" in by_state:
        return "timeout", by_state["timeout"]
    if job.stop_requested == "kill":
        return "killed", by_state.get("killed")
    for state in ("failed", "lost", "killed"):
        if state in by_state:
            return state, by_state[state]
    return "succeeded", 0


def _release_rank_claim(store: Store, job: Job, rank: JobRank) -> None:
    snap = store.snapshot()
    status = snap.claims.get(rank.claim_id or "")
    if status is not None:
        removed = False
        for gpu_uuid in status.present:
            removed |= store.remove_gpu(gpu_uuid, status.claim.id)
        if removed:
            from gpuclaim.claims import claim_event

            end = min(snap.now, status.claim.expires)
            store.append_event(claim_event("release", status.claim, end))
    store.drop_beat(claim_id=rank.claim_id)


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
    prober: Optional[NodeProber] = None,
    ops: Optional[NodeOps] = None,
    only_node: Optional[str] = None,
) -> list[Job]:
    """Start queued jobs that fit now, first come first served. A later job may start before
    a waiting one only on nodes where the waiting one can never run, so it never delays it.
    With ``only_node`` (a job wrapper on that node), only that node is used, locally."""
    if only_node is not None:
        config = _local_only(config, only_node)
    prober = prober or NodeProber(config)
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


def queue_positions(store: Store) -> dict[str, int]:
    """{job id: 1-based position} for the jobs waiting in the queue."""
    ids = [e.split("-", 1)[1] for e in store.queue_entries()]
    return {job_id: i + 1 for i, job_id in enumerate(ids)}


def job_event(kind: str, job: Job, ts: float, more: Optional[dict[str, Any]] = None) -> Event:
    return Event(
        ts=ts,
        type=kind,
        user=job.user,
        node=job.ranks[0].node if job.ranks else job.node,
        gpus=job.ranks[0].gpus if job.ranks else (),
        since=job.started,
        expires=job.ends,
        reason=job.reason,
        extra={
            "job_id": job.id,
            "job": job.name,
            "state": job.state,
            "exit_code": job.exit_code,
            "nodes": [r.node for r in job.ranks],
            "gpus_total": sum(len(r.gpus) for r in job.ranks) or job.gpus_per_node,
            "from_queue": job.from_queue,
            **(more or {}),
        },
    )


def observed_state(job: Job, claims: dict[str, Any]) -> str:
    """A running job whose claims were judged lost (no heartbeat) shows as ``lost``."""
    if job.state in ("running", "starting"):
        for r in job.ranks:
            status = claims.get(r.claim_id or "")
            if status is not None and status.reason == "job lost":
                return "lost"
    return job.state


def _rank(rank: int, claim: Claim) -> JobRank:
    return JobRank(
        rank=rank,
        node=claim.node,
        gpus=tuple(claim.indices),
        gpu_uuids=tuple(g.uuid for g in sorted(claim.gpus, key=lambda g: g.index)),
        claim_id=claim.id,
    )


def reload_job(store: Store, job: Job) -> Job:
    data = store.load_job_dict(job_id=job.id)
    return Job.from_dict(data) if data else job


def watch_first_moment(
    store: Store,
    job: Job,
    settle_s: float = SETTLE_S,
    bound_s: float = FIRST_MOMENT_S,
    poll_s: float = 0.1,
) -> Job:
    """The job once it is past its first moment: ended (a missing file, a bad argument, a
    missing workdir), or running on every rank for ``settle_s``, or as it is after ``bound_s``
    (a node slow to start it). Only reads its record."""
    deadline = time.monotonic() + bound_s
    running_since: Optional[float] = None
    while True:
        job = reload_job(store, job)
        now = time.monotonic()
        # A one-node job's end is recorded as the rank's, then the job's (with its reason):
        # wait for the job's. A gang's failed rank is news at once (its others still stop).
        if job.state in FINAL_STATES or (len(job.ranks) > 1 and first_bad_rank(job)):
            return job
        if job.ranks and all(r.state == "running" for r in job.ranks):
            running_since = running_since or now
            if now - running_since >= settle_s:
                return job
        if now >= deadline:
            return job
        time.sleep(poll_s)


def first_bad_rank(job: Job) -> Optional[JobRank]:
    """A rank that ended other than well (a gang job may still be stopping its others)."""
    return next((r for r in job.ranks if r.state in FINAL_STATES and r.state != "succeeded"), None)


def exit_code_of(job: Job) -> int:
    """What `run --follow` and `logs -f` exit with: the job's own exit code when it ended by
    itself, else the documented code of how it ended."""
    if job.state == "succeeded":
        return 0
    if job.state == "failed":
        return job.exit_code or 1  # no code: it never ran (a missing workdir, GPUs gone)
    return {"killed": KILLED_EXIT, "timeout": TIMEOUT_EXIT, "lost": LOST_EXIT}.get(job.state, 1)


def outcome_line(job: Job, now: float) -> str:
    """One line of how a job ended, with the exit code ``exit_code_of`` gives, for scripts:
    ``job train-1a2b failed (exit code 3) after 12s``."""
    from gpuclaim.durations import format_duration

    code = exit_code_of(job)
    took = format_duration(max(0.0, (job.ended or now) - (job.started or job.submitted)))
    if job.state == "succeeded":
        return f"job {job.name} succeeded after {took}"
    if job.state == "failed":
        why = f"{job.reason}; " if job.exit_code is None and job.reason else ""
        return f"job {job.name} failed ({why}exit code {code}) after {took}"
    if job.state == "timeout":
        limit = format_duration(job.time_limit_s)
        return f"job {job.name} reached its time limit of {limit} (exit code {code}) after {took}"
    if job.state == "lost":
        return (
            f"job {job.name} was lost: its node, tmux or wrapper went away "
            f"(exit code {code}) after {took}"
        )
    return f"job {job.name} was {job.state} (exit code {code}) after {took}"


def _only(config: Config, names: Sequence[str]) -> Config:
    return replace(config, nodes=tuple(n for n in config.nodes if n.name in names))


def _local_only(config: Config, node: str) -> Config:
    """The config as seen from ``node`` itself: that node alone, reached without SSH."""
    me = config.node(node)
    return replace(config, nodes=(replace(me, transport="local"),))


def _reuse(prober: NodeProber, view: ClusterView) -> NodeProber:
    """A prober that answers with the inventories already probed for this placement."""
    return _CachedProber(prober, view)


class _CachedProber(NodeProber):
    def __init__(self, inner: NodeProber, view: ClusterView) -> None:
        super().__init__(inner.config, inner._agent)
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
