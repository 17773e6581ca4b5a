"""The agent's protocol, typed: what each op (``gpuclaim.node.agent``) is asked and answers,
and the specs a node keeps to run a rank or a queue keeper laptop closed.

Both sides name these types: the engine (``engine/launch.py``'s ``NodeOps``, through
``engine.channel.ask``) builds the requests and reads the answers, the node's ops and the
modules they call read the requests and specs through them, so mypy checks every key on
both sides. At runtime they are plain dicts: JSON on the wire, byte for byte what it was.

Adding an op: its request and response here (with its ``Op`` and its name in ``OpName``),
its handler in the agent's table, its method on ``NodeOps``. ``tests/unit/test_protocol.py``
holds the three to one list of names.

Standard library only, Python 3.9 (node side): ``total=False`` for optional keys, no
``NotRequired``. A request on the wire also carries ``"op"``: its name, added by the channel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, Literal, Optional, TypedDict, TypeVar

OpName = Literal[
    "probe",
    "doctor",
    "store",
    "launch",
    "keep_queue",
    "stop_session",
    "read_log",
    "node_facts",
    "hardware",
    "sync_target",
    "sync_ready",
    "pull_source",
    "prune_copies",
    "ping",
    "ray_check",
]

# -- the specs: what a node keeps to run a rank (``engine.launch.rank_spec``) or a keeper ----


class WorkEnvSpec(TypedDict):
    """How the rank's command starts (``core.config.WorkEnv`` as the node resolved it)."""

    login_shell: Optional[bool]  # None: the config did not say (no login shell)
    venv: Optional[str]
    conda: Optional[str]


class GangEnv(TypedDict, total=False):
    """What a rank of a multi-node job is told about its gang (its environment); empty for a
    job of one rank."""

    MASTER_ADDR: str
    MASTER_PORT: int
    NNODES: int
    NPROC_PER_NODE: int
    WORLD_SIZE: int
    NODE_RANK: int


class PlacedSpec(TypedDict):
    """What the placement probe saw: when (storage clock), and each claimed GPU's index by
    UUID, so a wrapper starting seconds later need not look again."""

    at: float
    indices: dict[str, int]


class RankSpec(TypedDict):
    """All a node needs to run one rank on its own (``engine.launch.rank_spec`` writes it)."""

    job: dict[str, Any]  # Job.to_dict()
    rank: int
    session: str
    store_root: str
    config: dict[str, Any]  # Config.raw: parsed again on the node (Slack, dispatch)
    node_env: dict[str, str]
    nvidia_smi: list[str]
    workenv: WorkEnvSpec
    probe_timeout: float
    grace_s: float
    preempt_grace_s: float  # [queue] preempt_grace: GPUCLAIM_PREEMPT_GRACE
    beat_s: float
    sample_s: float
    idle_threshold_pct: float
    gang: GangEnv
    placed: PlacedSpec
    revived: str  # a service started again after its node rebooted: why it was down; else ""
    ray_token: str  # run --ray: the job's Ray cluster's token (RAY_AUTH_TOKEN); else ""


class WrapperSpec(RankSpec):
    """The rank's spec as its wrapper reads it (``spec.json``): ``launch`` adds where it
    logs and where it runs (``node.runner.launch_rank``)."""

    log: str
    run_dir: str


class KeeperSpec(TypedDict):
    """A node's queue keeper (``engine.launch.keeper_spec``, ``node.queue_keeper``)."""

    node: str
    store_root: str
    config: dict[str, Any]  # Config.raw


# -- the ops: a request and a response each --------------------------------------------------


class _ProbeOptions(TypedDict, total=False):
    # A warm agent may answer from a read this recent (node.recent_reads); absent: read now
    max_age_s: float


class ProbeRequest(_ProbeOptions):
    node: str
    nvidia_smi: list[str]
    env: dict[str, str]
    timeout: float  # seconds the probe may take (nvidia-smi, NVML)


def probe_request(
    node: str,
    nvidia_smi: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    max_age_s: float = 0.0,
) -> ProbeRequest:
    """A look's request for one node (``engine.cluster``; ``remote.early`` builds the same
    one before the command runs, and a shell look's command is made from it)."""
    request: ProbeRequest = {
        "node": node,
        "nvidia_smi": list(nvidia_smi),
        "env": dict(env),
        "timeout": timeout,
    }
    if max_age_s > 0:
        request["max_age_s"] = max_age_s
    return request


# A node's inventory as it crosses the wire: ``NodeInventory.to_dict()`` writes it and
# ``NodeInventory.from_dict()`` reads it (core/inventory.py owns its keys).
ProbeResponse = dict[str, Any]


class DoctorRequest(ProbeRequest):
    storage: str  # the store's root as nodes see it


class _StorageSeen(TypedDict):
    path: str
    ok: bool


class StorageFacts(_StorageSeen, total=False):
    """The store as a node sees it (``doctor``): ``ok`` and the store's clock and id, or why
    not (``error``)."""

    error: str
    time: float
    id: Optional[str]


class _DoctorFacts(TypedDict):
    python: str
    agent_version: str
    protocol: int
    time: float  # the node's clock, read last
    hostname: str
    tmux: Optional[str]  # tmux -V, or None: not installed
    nvidia_smi: Optional[str]  # its path
    pynvml: bool
    inventory: Optional[ProbeResponse]  # None when the request named no node


class DoctorResponse(_DoctorFacts, total=False):
    persistence_off: Optional[list[int]]  # with an inventory: GPUs whose persistence is off
    storage: StorageFacts  # when the request named the store's root


class StoreRequest(TypedDict):
    """One method of ``store.interface.Store``, run on the storage host."""

    root: str
    method: str
    args: Any  # STORE_CODEC.encode(list of positional arguments)
    kwargs: Any  # STORE_CODEC.encode(dict of keyword arguments)


StoreResponse = Any  # the method's result through STORE_CODEC (core/wire.py): any JSON value


class LaunchRequest(TypedDict):
    spec: RankSpec


class LaunchResponse(TypedDict):
    session: str
    log: str
    host: str
    workdir: str
    note: str  # why it runs elsewhere than asked, or ""


class KeepQueueRequest(TypedDict):
    spec: KeeperSpec


class KeepQueueResponse(TypedDict):
    pid: int


class StopSessionRequest(TypedDict):
    session: str


StopSessionResponse = bool  # whether there was a session to stop


class ReadLogRequest(TypedDict):
    path: str
    offset: int
    tail_lines: int  # its last lines instead, when not 0
    wait_s: float  # how long to wait for the log to grow past ``offset``


class ReadLogResponse(TypedDict):
    data: str
    offset: int  # where the next read starts
    size: int


class NodeFactsRequest(TypedDict, total=False):
    """``port``: say whether a process listens on it (a service's port, at submit)."""

    port: int


class NodeFactsResponse(TypedDict):
    hostname: str
    port: int  # a free port: a gang's MASTER_PORT
    jupyter: Optional[str]
    shell: str
    port_in_use: bool  # the request's port: something listens on it (False if none asked)


class HardwareRequest(TypedDict):
    """Nothing to say."""


class HardwareResponse(TypedDict):
    """What ``export slurm`` writes for a node (``node.hardware.probe_hardware``)."""

    hostname: str
    cpus: int
    sockets: Optional[int]
    cores_per_socket: Optional[int]
    threads_per_core: Optional[int]
    mem_total_mib: Optional[int]
    real_memory_mib: Optional[int]
    gpu_minors: dict[str, int]


class SyncTargetRequest(TypedDict):
    key: str  # the project
    job_id: str
    files: Optional[Sequence[str]]  # what the copy will hold (kept for its spare), if known
    reuse: bool  # take the spare tree (rsync updates it in place)


class SyncTargetResponse(TypedDict):
    dest: str
    previous: Optional[str]
    rsync: bool
    spare: bool
    pending: bool  # a spare is to be built once the copy is whole (``sync_ready``)


class SyncReadyRequest(TypedDict):
    key: str
    job_id: str


class SyncReadyResponse(TypedDict):
    started: bool


class PullSourceRequest(TypedDict):
    directory: str
    paths: list[str]


class PullSourceResponse(TypedDict):
    directory: str
    rsync: bool


class PruneCopiesRequest(TypedDict):
    remove: list[str]
    known: list[str]


class PruneCopiesResponse(TypedDict):
    removed: list[str]


class PingRequest(TypedDict):
    """Nothing to say."""


class PingResponse(TypedDict):
    version: str
    time: float


class RayCheckRequest(TypedDict):
    """A ``run --ray`` job's environment: is Ray there, before anything is claimed?"""

    workenv: WorkEnvSpec
    workdir: Optional[str]  # the job's (asked, or where run was typed), else the home


class RayCheckResponse(TypedDict):
    version: Optional[str]  # Ray's version in that environment; None: not there
    problem: str  # why not, in words ("" when it is)


# -- each op with its pair, for typed calls (``engine.channel.ask``) -------------------------

Req = TypeVar("Req", bound=Mapping[str, object])
Resp = TypeVar("Resp")


class Op(Generic[Req, Resp]):
    """An agent op: its name on the wire, typed by its request and its response."""

    def __init__(self, name: OpName) -> None:
        self.name: OpName = name

    def __repr__(self) -> str:
        return f"Op({self.name!r})"


PROBE: Op[ProbeRequest, ProbeResponse] = Op("probe")
DOCTOR: Op[DoctorRequest, DoctorResponse] = Op("doctor")
STORE: Op[StoreRequest, StoreResponse] = Op("store")
LAUNCH: Op[LaunchRequest, LaunchResponse] = Op("launch")
KEEP_QUEUE: Op[KeepQueueRequest, KeepQueueResponse] = Op("keep_queue")
STOP_SESSION: Op[StopSessionRequest, StopSessionResponse] = Op("stop_session")
READ_LOG: Op[ReadLogRequest, ReadLogResponse] = Op("read_log")
NODE_FACTS: Op[NodeFactsRequest, NodeFactsResponse] = Op("node_facts")
HARDWARE: Op[HardwareRequest, HardwareResponse] = Op("hardware")
SYNC_TARGET: Op[SyncTargetRequest, SyncTargetResponse] = Op("sync_target")
SYNC_READY: Op[SyncReadyRequest, SyncReadyResponse] = Op("sync_ready")
PULL_SOURCE: Op[PullSourceRequest, PullSourceResponse] = Op("pull_source")
PRUNE_COPIES: Op[PruneCopiesRequest, PruneCopiesResponse] = Op("prune_copies")
PING: Op[PingRequest, PingResponse] = Op("ping")
RAY_CHECK: Op[RayCheckRequest, RayCheckResponse] = Op("ray_check")
