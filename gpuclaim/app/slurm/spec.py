"""The shared data types of the export and the decisions made from them: a node as
slurm.conf describes it (:class:`NodeSpec`, its GPUs as :class:`GpuSlot`), what the
administrator asked for (:class:`ExportOptions`), the partitions planned from the GPU types
(:class:`Partition`), the check that every node can be a NodeName, and which machine is
the controller. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from gpuclaim.app.slurm.gputypes import mig_type_name, slurm_type_name
from gpuclaim.app.slurm.syntax import conf_word
from gpuclaim.core.errors import ConfigError, UsageError


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as SLURM sees it: its model and its device file, /dev/nvidia<minor>; or one
    MIG slice of a GPU (``mig_profile`` set), which SLURM finds only through NVML."""

    index: int
    name: str
    minor: int
    mig: bool = False  # a MIG slice (its GPU, in MIG mode, is never a GRES of its own)
    uuid: str = ""
    mig_profile: str = ""  # a slice: its profile as nvidia-smi -L names it, "3g.40gb"
    memory_mib: int = 0  # a slice: its memory, from which slurmd names its type

    @property
    def type(self) -> str:
        """Its GRES type: the model's (``h100``), or a slice's profile (``3g.40gb``)."""
        if self.mig:
            return mig_type_name(self.name, self.mig_profile, self.memory_mib)
        return slurm_type_name(self.name)

    @property
    def model(self) -> str:
        """Its GPU's model as a type (``h100``), a slice's too: what partitions go by."""
        return slurm_type_name(self.name)


@dataclass(frozen=True)
class NodeSpec:
    """One node as slurm.conf describes it; topology is None where it does not multiply out."""

    name: str  # gpuclaim's name for it (its SSH alias)
    hostname: str  # what it reports as `hostname -s`: its NodeName, by which slurmd finds it
    cpus: int
    sockets: Optional[int] = None
    cores_per_socket: Optional[int] = None
    threads_per_core: Optional[int] = None
    real_memory_mib: Optional[int] = None
    gpus: tuple[GpuSlot, ...] = ()
    address: Optional[str] = None  # where gpuclaim reaches it over SSH; None: this machine

    @property
    def slurm_name(self) -> str:
        """The NodeName: the node's own short hostname. slurmd looks its line up by that
        (``hostname -s``), whatever gpuclaim calls the node."""
        return self.hostname

    @property
    def node_addr(self) -> Optional[str]:
        """NodeAddr, where the hostname alone may not lead to the node: the address gpuclaim
        reaches it at, unless that is the hostname itself or a loopback address (which on
        every other machine means that machine)."""
        addr = self.address
        if not addr or addr.lower() == self.hostname.lower() or is_loopback(addr):
            return None
        return addr

    def gpus_by_type(self, whole: bool = False) -> dict[str, list[GpuSlot]]:
        """Its GRES by type (slices by profile); ``whole``: only GPUs that are not slices."""
        by_type: dict[str, list[GpuSlot]] = {}
        for g in sorted(self.gpus, key=lambda g: g.index):
            if not (whole and g.mig):
                by_type.setdefault(g.type, []).append(g)
        return by_type

    def gpus_by_model(self) -> dict[str, list[GpuSlot]]:
        """Its GRES by their GPU's model: a MIG GPU's slices under its model, for partitions."""
        by_model: dict[str, list[GpuSlot]] = {}
        for g in sorted(self.gpus, key=lambda g: g.index):
            by_model.setdefault(g.model, []).append(g)
        return by_model

    @property
    def slices(self) -> tuple[GpuSlot, ...]:
        return tuple(g for g in self.gpus if g.mig)


_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` means "this machine" (localhost, 127.x, ::1) wherever it is used."""
    import ipaddress

    if addr.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def check_nodes(nodes: Sequence[NodeSpec]) -> None:
    """Every node needs a hostname of its own that SLURM can use as a NodeName: slurmd finds
    its line by it. ConfigError naming the nodes otherwise (nothing is written)."""
    for n in nodes:
        if not _NODE_NAME.match(n.hostname) or is_loopback(n.hostname):
            raise ConfigError(
                f"{n.name} reports the hostname {n.hostname!r}, which cannot be its SLURM "
                "NodeName: give the machine a hostname of its own (hostnamectl set-hostname)"
            )
    by_host: dict[str, list[str]] = {}
    for n in nodes:
        by_host.setdefault(n.hostname.lower(), []).append(n.name)
    same = [(host, names) for host, names in by_host.items() if len(names) > 1]
    if same:
        what = "; ".join(f"{_and(names)} report the same hostname, {host}" for host, names in same)
        raise ConfigError(
            f"{what}: SLURM finds each node by its own hostname (one machine listed under "
            "two names in the config? machines cloned without a new hostname?)"
        )


def _and(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


ACCOUNTING = ("file", "slurmdbd")


@dataclass(frozen=True)
class ExportOptions:
    """What the administrator asked of the export (``gpuclaim export slurm``'s options)."""

    cluster: str
    controller: Optional[str] = None  # SlurmctldHost (and slurmdbd's); default: the first node
    default_time_s: float = 4 * 3600
    max_time_s: float = 7 * 86400
    skipped: tuple[tuple[str, str], ...] = ()  # (node, why) that could not be asked
    # "file": no database, each finished job a line in a job-completion log (sacct -c);
    # "slurmdbd": full accounting and fair share, with slurmdbd.conf and a MariaDB.
    accounting: str = "file"
    # gpuclaim's [queue] (fair share): what slurmdbd's priority/multifactor gets
    half_life_s: float = 7 * 86400
    max_age_s: float = 86400
    fairshare_weight: float = 1000.0
    age_weight: float = 1000.0
    # run --preemptible: [queue] preempt_grace (GraceTime) and [limits] kill_grace (KillWait)
    preempt_grace_s: float = 60.0
    kill_wait_s: float = 30.0
    # export slurm --shards K: each GPU is also K shards (gres/shard), what run --gpu-mem
    # jobs ask for there; 0: none, a share's job asks for a whole GPU
    shards_per_gpu: int = 0


@dataclass(frozen=True)
class Partition:
    """One planned SLURM partition: its nodes, its GPU type, its per-GPU defaults."""

    name: str
    nodes: tuple[str, ...]  # SLURM node names
    gpu_type: Optional[str]  # None: CPU-only nodes
    default: bool = False
    cpus_per_gpu: int = 0
    mem_per_gpu_mib: int = 0


def plan_partitions(nodes: Sequence[NodeSpec]) -> list[Partition]:
    """One partition per GPU type when the nodes differ, else one ``gpu`` partition;
    CPU-only nodes in ``cpu``. The partition with the most GPUs is the default."""
    types: list[str] = []
    for n in nodes:
        types.extend(t for t in n.gpus_by_model() if t not in types)
    groups: list[tuple[str, Optional[str], list[NodeSpec]]] = []
    for t in types:
        name = "gpu" if len(types) == 1 or not t else _partition_name(t)
        groups.append((name, t, [n for n in nodes if t in n.gpus_by_model()]))
    cpu_only = [n for n in nodes if not n.gpus]
    if cpu_only:
        groups.append(("cpu", None, cpu_only))
    sizes = [
        sum(len(n.gpus_by_model().get(t, [])) for n in members) if t is not None else 0
        for _, t, members in groups
    ]
    default = sizes.index(max(sizes)) if sizes else -1
    parts = []
    for i, (part_name, gpu_type, members) in enumerate(groups):
        per_gpu = [
            (n.cpus // len(n.gpus), (n.real_memory_mib or 0) // len(n.gpus))
            for n in members
            if n.gpus
        ]
        parts.append(
            Partition(
                name=part_name,
                nodes=tuple(n.slurm_name for n in members),
                gpu_type=gpu_type,
                default=i == default,
                cpus_per_gpu=min((c for c, _ in per_gpu), default=0),
                mem_per_gpu_mib=min((m for _, m in per_gpu), default=0),
            )
        )
    return parts


def partition_for(nodes: Sequence[NodeSpec], node: Optional[str], gpu_type: str) -> Optional[str]:
    """The partition an sbatch script for ``gpu_type`` (on ``node``, if known) should ask for."""
    # a slice's type (3g.40gb) is found in the partition of its GPU's model
    models = {g.model for n in nodes for g in n.gpus if g.mig and g.type == gpu_type}
    for p in plan_partitions(nodes):
        ours = p.gpu_type == gpu_type or p.gpu_type in models
        if ours and (node is None or _slurm_name(nodes, node) in p.nodes):
            return p.name
    return None


def checked_accounting(opts: ExportOptions) -> str:
    """``opts.accounting``, or UsageError where it is not one of ACCOUNTING."""
    if opts.accounting not in ACCOUNTING:
        raise UsageError(f"no accounting {opts.accounting!r}: one of {', '.join(ACCOUNTING)}")
    return opts.accounting


def controller_of(nodes: Sequence[NodeSpec], opts: ExportOptions) -> tuple[str, Optional[str]]:
    """SlurmctldHost's hostname and, where it needs one, its address: a node named by
    gpuclaim's name or its hostname, or another machine given by name."""
    if opts.controller is None:
        return nodes[0].slurm_name, nodes[0].node_addr
    for n in nodes:
        if opts.controller in (n.name, n.hostname):
            return n.slurm_name, n.node_addr
    return conf_word(opts.controller), None


def _slurm_name(nodes: Sequence[NodeSpec], name: str) -> str:
    return next((n.slurm_name for n in nodes if n.name == name), name)


def _partition_name(gpu_type: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "_", gpu_type)
