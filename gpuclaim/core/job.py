"""Jobs: a command run in tmux on one or more nodes with pinned GPUs, its ranks, and what
``store.update_job`` answers. Split from ``model`` (which re-exports them) to keep each
module one concern; the same JSON rules hold: ``to_dict`` is ``--json`` and the file."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from gpuclaim.core.inventory import opt_int
from gpuclaim.core.service import ServiceSpec
from gpuclaim.core.states import JobState
from gpuclaim.core.words import JobKind, iso, parse_iso


@dataclass(frozen=True)
class JobRank:
    """One node's part of a job: its GPUs, its claim, its tmux session's outcome."""

    rank: int
    node: str
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    claim_id: Optional[str] = None
    state: str = JobState.STARTING
    exit_code: Optional[int] = None
    log: Optional[str] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    # Where and in what it runs on its node, as decided at launch (the node checks the
    # directory; the venv or conda env is the job's, else the node's, else [run]'s).
    workdir: Optional[str] = None
    venv: Optional[str] = None
    conda: Optional[str] = None
    # A share's (run --gpu-mem/--gpu-share): the MiB of its GPU it holds, of that GPU's total
    mem_mib: int = 0
    mem_total_mib: int = 0

    def to_dict(self) -> dict[str, Any]:
        # spelled out, not asdict(): its deep copy was most of `jobs --json` at 10,000 jobs
        return {
            "rank": self.rank,
            "node": self.node,
            "gpus": list(self.gpus),
            "gpu_uuids": list(self.gpu_uuids),
            "claim_id": self.claim_id,
            "state": self.state,
            "exit_code": self.exit_code,
            "log": self.log,
            "started": iso(self.started),
            "ended": iso(self.ended),
            "workdir": self.workdir,
            "venv": self.venv,
            "conda": self.conda,
            "mem_mib": self.mem_mib,
            "mem_total_mib": self.mem_total_mib,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobRank:
        return cls(
            rank=int(d["rank"]),
            node=str(d["node"]),
            gpus=tuple(int(i) for i in d.get("gpus") or ()),
            gpu_uuids=tuple(str(u) for u in d.get("gpu_uuids") or ()),
            claim_id=d.get("claim_id"),
            state=str(d.get("state", JobState.STARTING)),
            exit_code=opt_int(d.get("exit_code")),
            log=d.get("log"),
            started=parse_iso(d.get("started")),
            ended=parse_iso(d.get("ended")),
            workdir=d.get("workdir"),
            venv=d.get("venv"),
            conda=d.get("conda"),
            mem_mib=int(d.get("mem_mib") or 0),
            mem_total_mib=int(d.get("mem_total_mib") or 0),
        )


@dataclass(frozen=True)
class ArrayRef:
    """A job that is one task of an array (``run --array`` or ``--sweep``)."""

    id: str  # the array's id; its tasks' ids are ``<id>-<index>``
    name: str  # the array's name; the task is ``name[index]``
    index: int
    count: int  # tasks in the array
    max_running: Optional[int] = None  # %K: at most K tasks at once

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArrayRef:
        limit = d.get("max_running")
        return cls(
            id=str(d["id"]),
            name=str(d["name"]),
            index=int(d["index"]),
            count=int(d["count"]),
            max_running=int(limit) if limit is not None else None,
        )


@dataclass(frozen=True)
class Dependency:
    """``run --after NAME`` (``any``: ``--after-any``): a job or a whole array to wait for."""

    id: str  # a job's id, or an array's id (``array``)
    name: str
    array: bool = False
    any: bool = False  # start after it ends in any state, not only after it succeeded

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Dependency:
        return cls(
            id=str(d["id"]),
            name=str(d["name"]),
            array=bool(d.get("array", False)),
            any=bool(d.get("any", False)),
        )


# What a preemptible job may be asked to yield with (run --preempt-signal): the catchable
# signals every POSIX system has, named without SIG.
PREEMPT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "WINCH", "URG", "CONT")


@dataclass(frozen=True)
class Job:
    """A command run in tmux on one or more nodes with pinned GPUs (or waiting in the queue)."""

    id: str
    name: str
    user: str
    argv: tuple[str, ...]
    state: str
    submitted: float
    time_limit_s: float
    gpus_per_node: int = 1
    nodes_wanted: int = 1
    node: Optional[str] = None  # pinned with --node
    gpu_indices: tuple[str, ...] = ()  # run/serve --gpu: exactly these GPUs (labels: 0, 0/1)
    workdir: Optional[str] = None
    env: tuple[tuple[str, str], ...] = ()
    kind: str = JobKind.BATCH  # a JobKind; from a record, its text (a newer one is kept)
    visible_as: str = "index"  # or "uuid": what CUDA_VISIBLE_DEVICES lists
    ranks: tuple[JobRank, ...] = ()
    started: Optional[float] = None
    ended: Optional[float] = None
    exit_code: Optional[int] = None
    reason: str = ""
    stop_requested: Optional[str] = None  # "kill" or "timeout" once someone asked it to stop
    port: Optional[int] = None  # notebook port
    from_queue: bool = False
    cwd: Optional[str] = None  # where `run` was typed (the laptop's path): the default workdir
    venv: Optional[str] = None  # asked with --venv (else the node's or [run]'s, at launch)
    conda: Optional[str] = None
    synced_from: Optional[str] = None  # run --sync: the laptop's directory it runs a copy of
    synced: Optional[dict[str, Any]] = None  # ... and what copying it took (files, seconds)
    array: Optional[ArrayRef] = None  # a task of an array
    after: tuple[Dependency, ...] = ()  # it starts only once these ended (succeeded)
    reservation: Optional[str] = None  # run --reservation: only on that booking's GPUs
    nice: int = 0  # run --nice: points off its priority in the queue
    begin: Optional[float] = None  # run --begin: it stays queued until then
    preemptible: bool = False  # run --preemptible: yields its GPUs to anyone who needs them
    requeue: bool = False  # run --requeue: a preempted run goes back to the queue
    preempt_signal: str = "USR1"  # run --preempt-signal: what it gets first when preempted
    restarts: int = 0  # how many times it was preempted and requeued before this run
    preempted_by: Optional[str] = None  # who it yielded to, once asked
    preempt_deadline: Optional[float] = None  # when its grace ends (storage clock), once asked
    requeued_as: Optional[str] = None  # preempted with --requeue: the id of its next run
    service: Optional[ServiceSpec] = None  # gpuclaim serve: its port, health check, restarts
    health: Optional[str] = None  # a service's: a ServiceHealth, as its wrapper last saw it
    up_since: Optional[float] = None  # a service's: when its process last (re)started
    # The Unix account that submitted it (core/accounts.py): only its processes run it
    account: str = ""  # its login name where the store was written
    uid: Optional[int] = None  # ... and its uid, which the owner's spec file proves
    spec: Optional[str] = None  # the owner's spec it runs, when not its own id (a requeue)
    # A share of one GPU (run --gpu-mem / --gpu-share): MiB asked, or a part of the GPU's
    # memory; 0 for both: whole GPUs
    gpu_mem_mib: int = 0
    gpu_share: float = 0.0
    mig: Optional[str] = None  # run --mig PROFILE: on MIG slices of that profile
    # run --ray: a Ray cluster over its ranks for the command (node/ray_node.py)
    ray: bool = False
    ray_cpus: Optional[int] = None  # run --ray-cpus: CPUs each Ray node offers (None: Ray's)
    ray_head: Optional[dict[str, Any]] = None  # its head, once up: address, dashboard, node
    ray_nodes: tuple[str, ...] = ()  # the nodes whose job env had Ray at submit (): any)

    @property
    def shared(self) -> bool:
        return self.gpu_mem_mib > 0 or self.gpu_share > 0

    @property
    def session(self) -> str:
        if self.array is not None:  # no brackets in tmux names: 'gc-ann-sweep-7'
            return f"gc-{self.user}-{self.array.name}-{self.array.index}"
        return f"gc-{self.user}-{self.name}"

    def session_of(self, rank: int) -> str:
        """Rank 0's session is the job's; a gang's other ranks add their rank, so two ranks
        on one machine (the demo's local nodes share a tmux server) never take one name."""
        return self.session if rank == 0 else f"{self.session}-rank{rank}"

    @property
    def ends(self) -> Optional[float]:
        return None if self.started is None else self.started + self.time_limit_s

    def with_(self, **changes: Any) -> Job:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        first = self.ranks[0] if self.ranks else None
        launched = first if first is not None and first.workdir else None  # its launch decided
        return {
            "id": self.id,
            "name": self.name,
            "user": self.user,
            "node": first.node if first else self.node,
            "nodes": [r.node for r in self.ranks],
            "gpus": list(first.gpus) if first else [],
            "state": self.state,
            "exit_code": self.exit_code,
            "session": self.session,
            "log": first.log if first else None,
            "submitted": iso(self.submitted),
            "started": iso(self.started),
            "ends": iso(self.ends),
            "ended": iso(self.ended),
            "time_limit_s": self.time_limit_s,
            "argv": list(self.argv),
            # where and in what it runs, as its first node's launch decided (the workdir
            # asked, else the directory run was typed in if the node has it, else the home
            # there); before that, what was asked
            "workdir": launched.workdir if launched else self.workdir,
            "venv": launched.venv if launched else self.venv,
            "conda": launched.conda if launched else self.conda,
            "cwd": self.cwd,
            "synced_from": self.synced_from,
            "synced": self.synced,
            "requested": {"workdir": self.workdir, "venv": self.venv, "conda": self.conda},
            "env": dict(self.env),
            "kind": self.kind,
            "visible_as": self.visible_as,
            "gpus_per_node": self.gpus_per_node,
            "nodes_wanted": self.nodes_wanted,
            "pinned_node": self.node,
            "pinned_gpus": list(self.gpu_indices),
            "ranks": [r.to_dict() for r in self.ranks],
            "reason": self.reason,
            "stop_requested": self.stop_requested,
            "port": self.port,
            "from_queue": self.from_queue,
            "array": self.array.to_dict() if self.array else None,
            "after": [d.to_dict() for d in self.after],
            "reservation": self.reservation,
            "nice": self.nice,
            "begin": iso(self.begin),
            "preemptible": self.preemptible,
            "requeue": self.requeue,
            "preempt_signal": self.preempt_signal,
            "restarts": self.restarts,
            "preempted_by": self.preempted_by,
            "preempt_deadline": iso(self.preempt_deadline),
            "requeued_as": self.requeued_as,
            "service": self.service.to_dict() if self.service else None,
            "health": self.health,
            "up_since": iso(self.up_since),
            # where a service answers: its node's name as gpuclaim knows it (forward for a
            # tunnel from the laptop)
            "url": self.service.url(first.node) if self.service and first else None,
            "account": self.account,
            "uid": self.uid,
            "spec": self.spec,
            "gpu_mem_mib": self.gpu_mem_mib,
            "gpu_share": self.gpu_share,
            "mig": self.mig,
            "ray": self.ray,
            "ray_cpus": self.ray_cpus,
            "ray_head": self.ray_head,
            "ray_nodes": list(self.ray_nodes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        asked = d.get("requested") if isinstance(d.get("requested"), dict) else None
        submitted = parse_iso(d["submitted"])
        if submitted is None:
            raise ValueError("job without submitted time")
        return cls(
            id=str(d["id"]),
            name=str(d["name"]),
            user=str(d["user"]),
            argv=tuple(str(a) for a in d["argv"]),
            state=str(d["state"]),
            submitted=submitted,
            time_limit_s=float(d["time_limit_s"]),
            gpus_per_node=int(d.get("gpus_per_node", 1)),
            nodes_wanted=int(d.get("nodes_wanted", 1)),
            node=d.get("pinned_node"),
            gpu_indices=tuple(str(i) for i in d.get("pinned_gpus") or ()),
            # records from before "requested" held the asked workdir in "workdir"
            workdir=asked.get("workdir") if asked is not None else d.get("workdir"),
            env=tuple(sorted((str(k), str(v)) for k, v in (d.get("env") or {}).items())),
            kind=str(d.get("kind", JobKind.BATCH)),
            visible_as=str(d.get("visible_as", "index")),
            ranks=tuple(JobRank.from_dict(r) for r in d.get("ranks") or ()),
            started=parse_iso(d.get("started")),
            ended=parse_iso(d.get("ended")),
            exit_code=opt_int(d.get("exit_code")),
            reason=str(d.get("reason") or ""),
            stop_requested=d.get("stop_requested"),
            port=opt_int(d.get("port")),
            from_queue=bool(d.get("from_queue", False)),
            cwd=d.get("cwd"),
            synced_from=d.get("synced_from"),
            synced=d.get("synced") if isinstance(d.get("synced"), dict) else None,
            venv=asked.get("venv") if asked is not None else None,
            conda=asked.get("conda") if asked is not None else None,
            array=ArrayRef.from_dict(d["array"]) if isinstance(d.get("array"), dict) else None,
            after=tuple(Dependency.from_dict(x) for x in d.get("after") or ()),
            reservation=d.get("reservation"),
            nice=int(d.get("nice") or 0),
            begin=parse_iso(d.get("begin")),
            preemptible=bool(d.get("preemptible", False)),
            requeue=bool(d.get("requeue", False)),
            preempt_signal=str(d.get("preempt_signal") or "USR1"),
            restarts=int(d.get("restarts") or 0),
            preempted_by=d.get("preempted_by"),
            preempt_deadline=parse_iso(d.get("preempt_deadline")),
            requeued_as=d.get("requeued_as"),
            service=ServiceSpec.from_dict(d["service"])
            if isinstance(d.get("service"), dict)
            else None,
            health=d.get("health"),
            up_since=parse_iso(d.get("up_since")),
            account=str(d.get("account") or ""),
            uid=opt_int(d.get("uid")),
            spec=str(d["spec"]) if d.get("spec") else None,
            gpu_mem_mib=int(d.get("gpu_mem_mib") or 0),
            gpu_share=float(d.get("gpu_share") or 0.0),
            mig=str(d["mig"]) if d.get("mig") else None,
            ray=bool(d.get("ray", False)),
            ray_cpus=opt_int(d.get("ray_cpus")),
            ray_head=d["ray_head"] if isinstance(d.get("ray_head"), dict) else None,
            ray_nodes=tuple(str(n) for n in d.get("ray_nodes") or ()),
        )


@dataclass(frozen=True)
class JobUpdate:
    """What ``store.update_job`` did: the job after it, and whether the change was made
    (``False``: its state was not one of ``only_from``, and ``job`` is as it was)."""

    job: Job
    applied: bool

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job.to_dict(), "applied": self.applied}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobUpdate:
        return cls(Job.from_dict(d["job"]), bool(d["applied"]))
