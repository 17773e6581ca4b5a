"""In-process stand-ins for the unit tier: a real store in a temporary directory on the
test's clock, and nodes that answer the agent's ops with recorded ``nvidia-smi`` output.

Nothing here starts a process: the engine runs as it does on a laptop, only its channels
answer from memory (``probe`` with a recording, ``launch``/``keep_queue`` as the agent
answers once the tmux session or the keeper is up)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Config, NodeConfig, parse_config
from gpuclaim.core.errors import GpuclaimError, UnreachableError
from gpuclaim.core.inventory import Gpu, NodeInventory
from gpuclaim.core.model import Claim, Dependency, Job
from gpuclaim.engine.bookings import BookingRequest, gpus_by_node, make_booking
from gpuclaim.engine.claims import claim_gpus
from gpuclaim.engine.cluster import ClusterView, NodeProber, build_view
from gpuclaim.engine.dispatch import dispatch_queue
from gpuclaim.engine.job_records import finish_rank, reload_job
from gpuclaim.engine.jobs import RunRequest, job_from_request, new_job_id
from gpuclaim.engine.placement import ClaimRequest
from gpuclaim.node.probe.smi_parse import parse_query_xml
from gpuclaim.store import ClaimStore

T0 = 1_780_000_000.0  # the storage clock at the start of every test (a Tuesday in 2026)
HOUR = 3600.0

# `nvidia-smi -q -x` of a real dual RTX A5000 node (tests/fixtures/nvidia-smi/SOURCES.md):
# llama-server (pid 100477) holds 22 GiB on GPU 0 and 17 GiB on GPU 1.
RECORDING = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "nvidia-smi"
    / "09_2x-rtx-a5000_drv590.44.01_q-x_v13_procs.xml"
)
_RECORDED: list[Gpu] = []


class Clock:
    """The storage clock, moved only by the test."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ClockedStore(ClaimStore):
    """The real store (files, links, locks) whose clock is the test's, not the file server's."""

    def __init__(self, root: Path, clock: Clock) -> None:
        super().__init__(root)
        self.clock = clock
        self.ensure(create=True)

    def now(self) -> float:
        return self.clock.now


def recorded_gpus(node: str, count: int = 2, busy: Sequence[int] = ()) -> tuple[Gpu, ...]:
    """``count`` GPUs of ``node`` as the recorded A5000 node reports them (its two GPUs in
    turn), each with a UUID of its own. GPUs in ``busy`` keep the recorded llama-server
    process; the others are the same GPUs once it ended (no process, nothing in use)."""
    if not _RECORDED:
        _RECORDED.extend(parse_query_xml(RECORDING.read_text(), "recorded")[0])
    gpus = []
    for i in range(count):
        g = _RECORDED[i % len(_RECORDED)]
        uuid = g.uuid[:-12] + hashlib.sha1(f"{node}:{i}".encode()).hexdigest()[:12]
        if i in busy:
            procs = tuple(p.replace(gpu_uuid=uuid) for p in g.processes)
            gpus.append(g.replace(node=node, index=i, uuid=uuid, processes=procs))
        else:
            gpus.append(
                g.replace(
                    node=node,
                    index=i,
                    uuid=uuid,
                    processes=(),
                    memory_used_mib=0,
                    utilization_pct=0,
                )
            )
    return tuple(gpus)


class FakeNodes:
    """The ``Channels`` of a cluster whose nodes answer from memory. ``down``: node -> the
    error its channel raises; ``broken_launch``: nodes whose tmux session cannot start;
    ``liveness``: node -> its boot id and living wrappers, as ``core.liveness`` says them."""

    def __init__(self, gpus: Mapping[str, tuple[Gpu, ...]]) -> None:
        self.gpus = dict(gpus)
        self.down: dict[str, str] = {}
        self.broken_launch: set[str] = set()
        self.liveness: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def to_node(self, node: NodeConfig) -> _FakeChannel:
        return _FakeChannel(self, node.name)

    def to_host(self, host: str) -> _FakeChannel:
        raise UnreachableError(f"{host}: the unit tier reaches no host")

    def launched(self) -> list[dict[str, Any]]:
        """The rank specs sent to ``launch``, in order."""
        return [args["spec"] for _, op, args in self.calls if op == "launch"]


@dataclass
class _FakeChannel:
    nodes: FakeNodes
    node: str

    def call(self, op: str, args: Mapping[str, Any], timeout: float) -> Any:
        self.nodes.calls.append((self.node, op, dict(args)))
        if self.node in self.nodes.down:
            raise UnreachableError(self.nodes.down[self.node])
        if op == "probe":
            gpus = self.nodes.gpus[self.node]
            return NodeInventory(
                node=self.node,
                gpus=gpus,
                source="nvidia-smi",
                driver_version="590.44.01",
                liveness=self.nodes.liveness.get(self.node),
            ).to_dict()
        if op == "launch":
            if self.node in self.nodes.broken_launch:
                raise GpuclaimError(f"tmux on {self.node}: server exited unexpectedly")
            session = args["spec"]["session"]
            return {"log": f"/home/u/.cache/gpuclaim/logs/{session}.log", "workdir": "/home/u"}
        if op == "keep_queue":
            return {"pid": 4242}
        if op == "stop_session":
            return True
        if op == "node_facts":
            return {"hostname": self.node, "port": 29500, "port_in_use": False}
        raise AssertionError(f"the unit tier does not fake agent op {op!r}")


@dataclass
class Cluster:
    """A config, a store on the test's clock and fake nodes, with the calls tests repeat."""

    config: Config
    store: ClockedStore
    clock: Clock
    nodes: FakeNodes
    _ids: list[str] = field(default_factory=list)

    @property
    def prober(self) -> NodeProber:
        return NodeProber(self.config, self.nodes)  # type: ignore[arg-type]

    def view(self) -> ClusterView:
        return build_view(self.config, self.store, prober=self.prober)

    def states(self, node: str) -> list[str]:
        return [r.state for r in self.view().gpus_of(node)]

    def claim(self, user: str, count: int = 1, time_s: float = HOUR, **more: Any) -> Claim:
        req = ClaimRequest(user=user, count=count, duration_s=time_s, **more)
        return claim_gpus(self.config, self.store, req, self.prober)

    def book(
        self, user: str, start_in: float, length: float = HOUR, count: int = 1, **where: Any
    ) -> Booking:
        """``reserve`` as the CLI does it: probe the nodes it names, then book."""
        start = self.clock.now + start_in
        req = BookingRequest(user, start, start + length, count, **where)  # node=, exact=
        names = [n.name for n in self.config.nodes]
        if req.exact or req.node:
            names = [req.exact[0][0] if req.exact else str(req.node)]
        nodes = [self.config.node(n) for n in names]
        gpus_of = gpus_by_node(self.prober.probe(nodes), nodes)
        return make_booking(self.config, self.store, req, gpus_of)

    def queue(
        self,
        user: str,
        name: str,
        count: int = 1,
        time_s: float = HOUR,
        after: tuple[Dependency, ...] = (),
        **more: Any,
    ) -> Job:
        """A job put in the queue as ``run --queue`` does (a second after the one before)."""
        self.clock.advance(1.0)
        req = RunRequest(user=user, argv=("python", "train.py"), name=name, count=count, **more)
        job = job_from_request(req, new_job_id(), name, time_s, self.clock.now, after=after)
        self.store.create_job(job=job)
        self.store.enqueue(job_id=job.id)
        return job

    def record(self, user: str, name: str, state: str, **more: Any) -> Job:
        """A job's record in ``state`` (not queued): what ``--after`` finds and judges."""
        self.clock.advance(1.0)
        req = RunRequest(user=user, argv=("python", "prep.py"), name=name)
        job = job_from_request(req, new_job_id(), name, HOUR, self.clock.now).with_(
            state=state, **more
        )
        self.store.create_job(job=job)
        return job

    def array(
        self, user: str, name: str, count: int, result: Optional[dict[str, Any]] = None
    ) -> str:
        """An array's record (its tasks are not made); ``result``: the summary its last task
        wrote. Returns its id."""
        self.clock.advance(1.0)
        array_id = f"a-{hashlib.sha1(f'{user}:{name}:{self.clock.now}'.encode()).hexdigest()[:10]}"
        record = {"id": array_id, "name": name, "user": user, "indices": list(range(count))}
        record.update(count=count, submitted=self.clock.now, result=result)
        self.store.create_array(array=record)
        return array_id

    def dispatch(self, only_node: Optional[str] = None) -> list[str]:
        """Names of the jobs this pass started."""
        started = dispatch_queue(self.config, self.store, self.prober, only_node=only_node)
        return [j.name for j in started]

    def job(self, job: Job) -> Job:
        return reload_job(self.store, job)

    def end(self, job: Job, state: str = "succeeded", exit_code: Optional[int] = 0) -> Job:
        """Every rank of a started job ends (as its wrapper records it)."""
        current = self.job(job)
        for rank in current.ranks:
            finish_rank(self.store, current, rank.rank, state, exit_code, f"exit {exit_code}")
        return self.job(job)


def make_cluster(
    tmp_path: Path,
    nodes: Optional[Mapping[str, int]] = None,
    busy: Optional[Mapping[str, Sequence[int]]] = None,
    **defaults: Any,
) -> Cluster:
    """``nodes``: name -> GPU count (default one node of 2); ``defaults``: ``[defaults]`` keys."""
    nodes = dict(nodes or {"node01": 2})
    raw = {"nodes": list(nodes), "storage": str(tmp_path / "store"), "defaults": defaults}
    config = parse_config(raw)
    clock = Clock()
    store = ClockedStore(tmp_path / "store", clock)
    fake = FakeNodes({n: recorded_gpus(n, c, (busy or {}).get(n, ())) for n, c in nodes.items()})
    return Cluster(config, store, clock, fake)
