"""The domain, as frozen dataclasses with one JSON shape.

The same ``to_dict`` shape is printed by ``--json``, written to the claim files on shared
storage and sent back by the node agent, so it must stay importable on a node's Python 3.9
with nothing but the standard library.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any, Optional, TypeVar

# What a probe of a node returns: its own module, so that a node's first look at its GPUs
# does not pay for defining every other dataclass here. Re-exported: they are the domain too.
from gpuclaim.core.inventory import Gpu, GpuProcess, NodeInventory, opt_int
from gpuclaim.core.service import ServiceSpec
from gpuclaim.core.states import GpuState, JobState

__all__ = ["Gpu", "GpuProcess", "NodeInventory"]


class _Word(str, Enum):
    """A word of the records named in code: a member == its string, json-dumps and formats
    as it (``repr`` alone shows the member)."""

    def __str__(self) -> str:
        return str(self.value)


_W = TypeVar("_W", bound=_Word)


def _parsed(words: type[_W], value: str) -> Optional[_W]:
    try:
        return words(value)
    except ValueError:
        return None


class EventType(_Word):
    """What an event of the log records (``Event.type``). The values are what events.jsonl
    holds; a type this version does not know (a newer gpuclaim's) is read and kept as text."""

    CLAIM = "claim"
    RELEASE = "release"
    EXPIRE = "expire"
    FORCE_RELEASE = "force-release"
    EXTEND = "extend"
    REAP = "reap"  # an abandoned claim (a damaged or lost one) collected
    DRAIN = "drain"
    UNDRAIN = "undrain"
    BUSY_UNCLAIMED = GpuState.BUSY_UNCLAIMED.value  # a GPU in use without a claim
    NODE_UNREACHABLE = "node-unreachable"
    CLAIM_IDLE = "claim-idle"
    CLAIM_EXPIRING = "claim-expiring"
    JOB_QUEUED = "job-queued"
    JOB_START = "job-start"
    JOB_END = "job-end"
    JOB_CANCELLED = "job-cancelled"  # it never ran: what it waited for did not succeed
    FORCE_KILL = "force-kill"
    PREEMPT = "preempt"  # a preemptible job was asked to yield its GPUs to someone's claim
    SERVICE_DOWN = "service-down"  # a service exited or stopped answering: it restarts
    SERVICE_BACK = "service-back"  # ... and answers again
    ARRAY_QUEUED = "array-queued"
    ARRAY_START = "array-start"
    ARRAY_END = "array-end"
    RESERVE = "reserve"
    RESERVE_CANCEL = "reserve-cancel"
    RESERVE_OPEN = "reserve-open"
    RESERVE_NOSHOW = "reserve-noshow"
    RESERVE_END = "reserve-end"
    REFUSED = "refused"  # a job its owner's spec does not vouch for (forged?): never run
    OWNER_TURN = "owner-turn"  # a queued job fits, and only its owner's processes may start it


def event_type(value: str) -> Optional[EventType]:
    """The EventType a logged type names; None for one this version does not know."""
    return _parsed(EventType, value)


class JobKind(_Word):
    """What a job is (``Job.kind``): a command, or an interactive shell or notebook. A kind
    this version does not know (a newer gpuclaim's) is read and kept as text."""

    BATCH = "batch"
    SHELL = "shell"
    NOTEBOOK = "notebook"
    SERVICE = "service"  # gpuclaim serve: kept up, restarted, with a port


def job_kind(value: str) -> Optional[JobKind]:
    """The JobKind a record's kind names; None for one this version does not know."""
    return _parsed(JobKind, value)


def iso(ts: Optional[float]) -> Optional[str]:
    """Epoch seconds -> ISO 8601 in UTC with a Z, as used in every JSON shape."""
    if ts is None:
        return None
    when = dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: Any) -> Optional[float]:
    """ISO 8601 (or epoch number) -> epoch seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    when = dt.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


@dataclass(frozen=True)
class ClaimedGpu:
    """One GPU inside a claim: the UUID is the key, node and index are for people."""

    uuid: str
    index: int

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "index": self.index}


class HoldsGpus:
    """What a claim and a booking both are: some GPUs of one node (``self.gpus``)."""

    gpus: tuple[ClaimedGpu, ...]

    @property
    def indices(self) -> list[int]:
        return sorted(g.index for g in self.gpus)

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]


@dataclass(frozen=True)
class Claim(HoldsGpus):
    """A user's hold on one or more GPUs of one node, until ``expires`` (storage clock)."""

    id: str
    user: str
    node: str
    gpus: tuple[ClaimedGpu, ...]
    since: float
    expires: float
    note: str = ""
    job: Optional[str] = None
    host: str = ""  # where the claiming process ran
    pid: int = 0
    adopted: bool = False
    preemptible: bool = False  # a run --preemptible job's: it yields to anyone's claim
    keep_when_idle: bool = False  # a service's (serve): the idle policy never releases it
    service: bool = False  # a service's: kept while it should run, its node gone or not

    def with_expiry(self, expires: float) -> Claim:
        return replace(self, expires=expires)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "node": self.node,
            "gpus": self.indices,
            "gpu_uuids": [g.uuid for g in sorted(self.gpus, key=lambda g: g.index)],
            "since": iso(self.since),
            "expires": iso(self.expires),
            "note": self.note,
            "job": self.job,
            "host": self.host,
            "pid": self.pid,
            "adopted": self.adopted,
            "preemptible": self.preemptible,
            "keep_when_idle": self.keep_when_idle,
            "service": self.service,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        indices = [int(i) for i in d["gpus"]]
        uuids = [str(u) for u in d["gpu_uuids"]]
        if len(indices) != len(uuids) or not uuids:
            raise ValueError("gpus and gpu_uuids differ in length")
        since = parse_iso(d["since"])
        expires = parse_iso(d["expires"])
        if since is None or expires is None:
            raise ValueError("since and expires are required")
        return cls(
            id=str(d["id"]),
            user=str(d["user"]),
            node=str(d["node"]),
            gpus=tuple(ClaimedGpu(u, i) for u, i in zip(uuids, indices)),
            since=since,
            expires=expires,
            note=str(d.get("note") or ""),
            job=d.get("job"),
            host=str(d.get("host") or ""),
            pid=int(d.get("pid") or 0),
            adopted=bool(d.get("adopted", False)),
            preemptible=bool(d.get("preemptible", False)),
            keep_when_idle=bool(d.get("keep_when_idle", False)),
            service=bool(d.get("service", False)),
        )


@dataclass(frozen=True)
class Event:
    """One line of the append-only event log (the accounting history)."""

    ts: float
    type: str  # an EventType; from the log, its text (a newer gpuclaim's type is kept)
    user: str
    claim_id: Optional[str] = None
    node: Optional[str] = None
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    since: Optional[float] = None
    expires: Optional[float] = None
    by: Optional[str] = None  # who did it, when not the holder (force, gc)
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": iso(self.ts),
            "type": self.type,
            "user": self.user,
            "claim_id": self.claim_id,
            "node": self.node,
            "gpus": list(self.gpus),
            "gpu_uuids": list(self.gpu_uuids),
            "since": iso(self.since),
            "expires": iso(self.expires),
            "by": self.by,
            "reason": self.reason,
            **({"extra": self.extra} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        ts = parse_iso(d["ts"])
        if ts is None:
            raise ValueError("event without ts")
        return cls(
            ts=ts,
            type=str(d["type"]),
            user=str(d.get("user", "")),
            claim_id=d.get("claim_id"),
            node=d.get("node"),
            gpus=tuple(int(i) for i in d.get("gpus") or ()),
            gpu_uuids=tuple(str(u) for u in d.get("gpu_uuids") or ()),
            since=parse_iso(d.get("since")),
            expires=parse_iso(d.get("expires")),
            by=d.get("by"),
            reason=str(d.get("reason") or ""),
            extra=dict(d.get("extra") or {}),
        )


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
    gpu_indices: tuple[int, ...] = ()  # run/serve --gpu: exactly these GPUs of ``node``
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

    @property
    def session(self) -> str:
        if self.array is not None:  # no brackets in tmux names: 'gc-ann-sweep-7'
            return f"gc-{self.user}-{self.array.name}-{self.array.index}"
        return f"gc-{self.user}-{self.name}"

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
            gpu_indices=tuple(int(i) for i in d.get("pinned_gpus") or ()),
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
