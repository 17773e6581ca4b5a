"""The way out: SLURM's configuration and job scripts written from what gpuclaim knows.

Pure renderers (no I/O) for ``slurm.conf``, ``gres.conf``, ``cgroup.conf``, ``MIGRATION.md``
and sbatch scripts, the GPU type names they share, the advice of when SLURM starts to pay
for itself, and one function that asks the nodes what they are made of. Everything targets
Slurm 22.05 syntax (Debian 12), proven by tests/test_slurm_real.py against a real one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.durations import format_duration, format_slurm_time
from gpuclaim.core.errors import ConfigError, GpuclaimError, UsageError

if TYPE_CHECKING:
    from gpuclaim.core.config import Config, NodeConfig
    from gpuclaim.core.model import Job, NodeInventory
    from gpuclaim.engine.cluster import NodeProber

# -- GPU type names --------------------------------------------------------------------------
#
# slurmd's AutoDetect=nvml names a GPU type by its product name, lowercased, spaces as "_"
# ("NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3"), and accepts a configured Type only if
# it is a case-insensitive substring of that. So each type below is the text its pattern
# matched in that name: a substring by construction. First match wins. Some short names are
# also substrings of a longer model's name ("a10" of every "a100", "l40" of "l40s"), which no
# name shorter than the full one avoids; slurmd tries the longest configured type first and
# gives each configured GPU to one detected GPU, so a node with both still comes out right
# (tests/test_slurm_real.py runs one).
GPU_TYPE_PATTERNS: tuple[str, ...] = (
    r"rtx_pro_\d{4}",  # RTX PRO 6000 Blackwell (Server / Workstation Edition)
    r"quadro_rtx_\d{4}",  # Quadro RTX 6000: not the RTX 6000 Ada
    r"rtx_\d{4}(?:_sff)?_ada",  # RTX 6000 Ada Generation, RTX 4000 SFF Ada Generation
    r"rtx_a\d{3,4}",  # RTX A6000, A5000, A4000 ...
    r"titan_[a-z]+",  # TITAN RTX, TITAN V, TITAN Xp
    r"[rg]tx_\d{4}(?:_ti|_super|_d)*",  # GeForce RTX 4090, RTX 2080 SUPER, GTX 1080 Ti
    r"g[hb]\d{2,3}",  # Grace superchips GH200, GB200, and GB10 (DGX Spark)
    r"(?<![a-z])[abh]\d00",  # A100, A800, B200, H100, H200, H800
    r"(?<![a-z])h20(?!\d)",  # H20
    r"(?<![a-z])v100s?",  # V100, V100S
    r"(?<![a-z])[aklmpt]\d{1,2}[gs]?(?![0-9])",  # L40S, L40, L4, A40, A30, A10G, A10, T4, P40
)
_TYPE_RES = tuple(re.compile(p) for p in GPU_TYPE_PATTERNS)
_SAFE_TYPE = re.compile(r"^[a-z][a-z0-9_.-]{0,39}$")
_VENDOR_PREFIX = re.compile(r"^(?:nvidia_|tesla_|geforce_|quadro_)+")
_SPEC_SUFFIX = re.compile(r"[-_](?:\d+gb|pcie|sxm\d*|nvl|hbm\w*|laptop|mig|\(.*).*$")


def autodetect_type(product_name: str) -> str:
    """The GPU type slurmd's AutoDetect=nvml reports for this product name."""
    return product_name.lower().replace(" ", "_")


def slurm_type_name(product_name: str) -> str:
    """A short GPU type for slurm.conf and gres.conf that AutoDetect=nvml accepts: ``h100``,
    ``l40s``, ``rtx_4090``. Unknown models get their name without vendor prefix and memory
    suffix; "" (an untyped GPU, always safe) when nothing usable is left."""
    detected = autodetect_type(product_name.strip())
    for pattern in _TYPE_RES:
        m = pattern.search(detected)
        if m:
            return m.group(0)
    rest = _SPEC_SUFFIX.sub("", _VENDOR_PREFIX.sub("", detected))
    if _SAFE_TYPE.match(rest) and rest in detected:
        return rest
    return ""


# -- inventory --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as SLURM sees it: its model and its device file, /dev/nvidia<minor>."""

    index: int
    name: str
    minor: int
    mig: bool = False
    uuid: str = ""

    @property
    def type(self) -> str:
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
        if not addr or addr.lower() == self.hostname.lower() or _is_loopback(addr):
            return None
        return addr

    def gpus_by_type(self) -> dict[str, list[GpuSlot]]:
        by_type: dict[str, list[GpuSlot]] = {}
        for g in sorted(self.gpus, key=lambda g: g.index):
            by_type.setdefault(g.type, []).append(g)
        return by_type


_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_NODE_ADDR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")  # a name, an IPv4 or IPv6 address


def _is_loopback(addr: str) -> bool:
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
        if not _NODE_NAME.match(n.hostname) or _is_loopback(n.hostname):
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


def node_spec(
    name: str, hardware: dict[str, Any], inventory: NodeInventory, address: Optional[str] = None
) -> NodeSpec:
    """Join a node's ``hardware`` answer (see gpuclaim.node.hardware) with its GPU probe."""
    from gpuclaim.node.hardware import normalize_bus_id

    minors = dict(hardware.get("gpu_minors") or {})
    slots = []
    for g in inventory.gpus:
        minor = minors.get(g.uuid)
        if minor is None and g.pci_bus_id:
            minor = minors.get(normalize_bus_id(g.pci_bus_id))
        minor = g.index if minor is None else minor
        slots.append(GpuSlot(g.index, g.name, minor, bool(g.mig_mode), g.uuid))
    return NodeSpec(
        name=name,
        hostname=str(hardware.get("hostname") or ""),
        cpus=int(hardware["cpus"]),
        sockets=hardware.get("sockets"),
        cores_per_socket=hardware.get("cores_per_socket"),
        threads_per_core=hardware.get("threads_per_core"),
        real_memory_mib=hardware.get("real_memory_mib"),
        gpus=tuple(slots),
        address=address,
    )


def ssh_address(config: Config, node: NodeConfig) -> Optional[str]:
    """The address gpuclaim reaches ``node`` at: the HostName its SSH config gives the alias
    (the alias itself without one); None for a node on this machine."""
    if node.transport == "local":
        return None
    host = node.host.rsplit("@", 1)[-1]
    from gpuclaim.remote.ssh import load_ssh_config

    try:
        found = load_ssh_config(config.ssh_config_path).lookup(host).get("hostname")
    except GpuclaimError:  # an unreadable ssh config: the node did not answer either
        return host
    return str(found or host)


def gather_inventory(config: Config, prober: NodeProber) -> tuple[list[NodeSpec], dict[str, str]]:
    """Ask every node for its GPUs and hardware (in parallel, through the agent over SSH);
    returns the nodes that answered and, for the others, why not."""
    from gpuclaim.core.fanout import fan_out

    inventories = prober.probe(config.nodes)
    by_name = {n.name: n for n in config.nodes}

    def hardware_of(name: str) -> dict[str, Any]:
        return dict(prober.channels.to_node(by_name[name]).call("hardware", {}, 20.0))

    answers = fan_out(list(by_name), hardware_of, config.limits.deadline_s)
    specs, skipped = [], {}
    for name in by_name:
        inv, hw = inventories[name], answers[name]
        if inv.error or not inv.reachable:
            skipped[name] = inv.error or "unreachable"
        elif not hw.ok or hw.value is None:
            skipped[name] = hw.error or "no hardware answer"
        else:
            specs.append(node_spec(name, hw.value, inv, ssh_address(config, by_name[name])))
    return specs, skipped


# -- slurm.conf, gres.conf, cgroup.conf --------------------------------------------------------


ACCOUNTING = ("file", "slurmdbd")
# Where Debian's packages keep SLURM's state and logs: they create these, owned by slurm.
STATE_DIR = "/var/lib/slurm/slurmctld"
SPOOL_DIR = "/var/lib/slurm/slurmd"
LOG_DIR = "/var/log/slurm"
JOBCOMP_LOG = f"{LOG_DIR}/jobcomp.log"
DB_PASSWORD_PLACEHOLDER = "REPLACE_WITH_THE_DATABASE_PASSWORD"


@dataclass(frozen=True)
class ExportOptions:
    cluster: str
    controller: Optional[str] = None  # SlurmctldHost (and slurmdbd's); default: the first node
    default_time_s: float = 4 * 3600
    max_time_s: float = 7 * 86400
    skipped: tuple[tuple[str, str], ...] = ()  # (node, why) that could not be asked
    # "file": no database, each finished job a line in a job-completion log (sacct -c);
    # "slurmdbd": full accounting and fair share, with slurmdbd.conf and a MariaDB.
    accounting: str = "file"


@dataclass(frozen=True)
class Partition:
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
        types.extend(t for t in n.gpus_by_type() if t not in types)
    groups: list[tuple[str, Optional[str], list[NodeSpec]]] = []
    for t in types:
        name = "gpu" if len(types) == 1 or not t else _partition_name(t)
        groups.append((name, t, [n for n in nodes if t in n.gpus_by_type()]))
    cpu_only = [n for n in nodes if not n.gpus]
    if cpu_only:
        groups.append(("cpu", None, cpu_only))
    sizes = [
        sum(len(n.gpus_by_type().get(t, [])) for n in members) if t is not None else 0
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
    for p in plan_partitions(nodes):
        if p.gpu_type == gpu_type and (node is None or _slurm_name(nodes, node) in p.nodes):
            return p.name
    return None


def render_slurm_conf(nodes: Sequence[NodeSpec], opts: ExportOptions) -> str:
    """slurm.conf for these nodes: cons_tres, backfill, cgroups, and accounting as
    ``opts.accounting`` says (without a database, it starts on a fresh install as written)."""
    if not nodes:
        raise UsageError("no node answered: nothing to write a slurm.conf for")
    check_nodes(nodes)
    dbd = _accounting(opts) == "slurmdbd"
    host, addr = _controller(nodes, opts)
    out = [
        f"# slurm.conf for the {_comment(opts.cluster)} cluster, from what its nodes reported",
        "# to `gpuclaim export slurm`. The same file goes to /etc/slurm/ on every node and on",
        "# the controller, with gres.conf and cgroup.conf; MIGRATION.md says how.",
        f"ClusterName={cluster_name(opts.cluster)}",
        f"SlurmctldHost={host}" + (f"({addr})" if addr else ""),
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "MpiDefault=none",
        "# A node that rebooted comes back into service by itself.",
        "ReturnToService=2",
        "# Where Debian's packages keep state and logs (they create these directories).",
        f"StateSaveLocation={STATE_DIR}",
        f"SlurmdSpoolDir={SPOOL_DIR}",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        f"SlurmctldLogFile={LOG_DIR}/slurmctld.log",
        f"SlurmdLogFile={LOG_DIR}/slurmd.log",
        "",
        "# Isolation: cgroups hold each job to its CPUs, memory and GPUs (see cgroup.conf).",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "JobAcctGatherType=jobacct_gather/cgroup",
        "",
        "# Scheduling: backfill; cores, memory and GPUs are the resources jobs ask for.",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "# Refuse at submit time what exceeds a partition's limits (as gpuclaim does).",
        "EnforcePartLimits=ALL",
        "",
    ]
    out += _accounting_lines(nodes, host, addr) if dbd else _jobcomp_lines()
    out += [
        "",
        "# Nodes, as they reported themselves (`slurmd -C` on a node prints the same; RealMemory",
        "# stays a little under the total, so a node is not refused for a few missing MiB).",
        "# Each is named by its hostname: slurmd finds its line by `hostname -s`.",
    ]
    out.extend(_node_notes(nodes))
    for names, line in _compress([(n.slurm_name, _node_line(n)) for n in nodes]):
        out.append(f"NodeName={names} {line}")
    for name, why in opts.skipped:
        out.append(f"# {_comment(name)} is not here: it did not answer ({_comment(why)}).")
    parts = plan_partitions(nodes)
    out += [
        "",
        "# Partitions: one per GPU type when the nodes differ, so --partition picks the model.",
        "# A job without --time gets DefaultTime; one asking for more than MaxTime is refused.",
        "# Jobs get a node's CPUs and memory in proportion to their GPUs unless they ask.",
    ]
    for p in parts:
        words = [
            f"PartitionName={p.name}",
            f"Nodes={_hostlist(list(p.nodes))}",
            f"Default={'YES' if p.default else 'NO'}",
            f"DefaultTime={format_slurm_time(opts.default_time_s)}",
            f"MaxTime={format_slurm_time(opts.max_time_s)}",
        ]
        if p.gpu_type is not None:
            if p.cpus_per_gpu:
                words.append(f"DefCpuPerGPU={p.cpus_per_gpu}")
            if p.mem_per_gpu_mib:
                words.append(f"DefMemPerGPU={p.mem_per_gpu_mib}")
            if dbd:  # GPU billing needs the gres/gpu TRES, which needs slurmdbd
                words.append('TRESBillingWeights="GRES/gpu=1.0"')
        words.append("State=UP")
        out.append(" ".join(words))
    return "\n".join(out) + "\n"


def _jobcomp_lines() -> list[str]:
    # Measured on Slurm 22.05: without slurmdbd, PriorityWeightFairshare and PriorityWeightAge
    # are ignored ("can only be used with SlurmDBD"), a gres/gpu TRES is fatal ("slurmdbd is
    # required to run with TRES gres/gpu"), and with it GPU billing weights cannot parse.
    return [
        "# Priority: first come, first served; backfill starts smaller jobs in the gaps (fair",
        "# share needs slurmdbd, see below).",
        "PriorityType=priority/basic",
        "",
        "# Accounting without a database: each finished job is one line in JobCompLoc, which",
        "# `sacct -c` reads (user, name, partition, nodes, state, times), and `sstat` shows a",
        "# running job's CPU and memory use. slurmctld logs \"Job accounting information",
        '# gathered, but not stored" about this: expected. Plain sacct, sreport and fair share',
        "# need slurmdbd (`gpuclaim export slurm --accounting slurmdbd`).",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={JOBCOMP_LOG}",
    ]


def _accounting_lines(nodes: Sequence[NodeSpec], host: str, addr: Optional[str]) -> list[str]:
    types = sorted({t for n in nodes for t in n.gpus_by_type() if t})
    tres = ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in types)])
    return [
        "# Priority: fair share of GPU time, usage forgotten with a half-life of a week,",
        "# plus a little for time spent waiting.",
        "PriorityType=priority/multifactor",
        "PriorityDecayHalfLife=7-0",
        "PriorityUsageResetPeriod=NONE",
        "PriorityMaxAge=7-0",
        "PriorityWeightFairshare=10000",
        "PriorityWeightAge=1000",
        "",
        f"# Accounting (sacct, sreport, fair share) through slurmdbd on {host} (see",
        "# slurmdbd.conf; slurmctld does not start without it); GPU time per type.",
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={addr or host}",
        f"AccountingStorageTRES={tres}",
    ]


def render_slurmdbd_conf(nodes: Sequence[NodeSpec], opts: ExportOptions) -> str:
    """slurmdbd.conf for ``--accounting slurmdbd``: slurmdbd beside slurmctld, its records in
    a MariaDB on the same machine. The password is a placeholder for the administrator."""
    if not nodes:
        raise UsageError("no node answered: nothing to write a slurmdbd.conf for")
    check_nodes(nodes)
    host, _ = _controller(nodes, opts)
    lines = [
        f"# slurmdbd.conf for the {_comment(opts.cluster)} cluster: the accounting daemon,",
        f"# on {host} beside slurmctld. Only there, and only slurm may read it (slurmdbd",
        "# refuses to start otherwise):",
        "#   install -o slurm -g slurm -m 0600 slurmdbd.conf /etc/slurm/",
        "AuthType=auth/munge",
        f"DbdHost={host}",
        "SlurmUser=slurm",
        "DebugLevel=info",
        f"LogFile={LOG_DIR}/slurmdbd.log",
        "PidFile=/run/slurmdbd.pid",
        "",
        "# The records live in a MariaDB on this machine; MIGRATION.md says how to create",
        "# its user. Put that user's password here, in place of the placeholder (no '#').",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        "StorageUser=slurm",
        "StorageLoc=slurm_acct_db",
        f"StoragePass={DB_PASSWORD_PLACEHOLDER}",
    ]
    return "\n".join(lines) + "\n"


def _accounting(opts: ExportOptions) -> str:
    if opts.accounting not in ACCOUNTING:
        raise UsageError(f"no accounting {opts.accounting!r}: one of {', '.join(ACCOUNTING)}")
    return opts.accounting


def _controller(nodes: Sequence[NodeSpec], opts: ExportOptions) -> tuple[str, Optional[str]]:
    """SlurmctldHost's hostname and, where it needs one, its address: a node named by
    gpuclaim's name or its hostname, or another machine given by name."""
    if opts.controller is None:
        return nodes[0].slurm_name, nodes[0].node_addr
    for n in nodes:
        if opts.controller in (n.name, n.hostname):
            return n.slurm_name, n.node_addr
    return _conf_word(opts.controller), None


def render_gres_conf(nodes: Sequence[NodeSpec]) -> str:
    """gres.conf: AutoDetect=nvml checks the GPUs; the File= lines work without NVML too."""
    check_nodes(nodes)
    out = [
        "# gres.conf: the GPUs of each node. With AutoDetect=nvml, slurmd checks these lines",
        "# against what NVML finds (types match as substrings of the product name); the explicit",
        "# File= lines keep the GPUs usable where slurmd was built without NVML (Debian's is).",
        "AutoDetect=nvml",
    ]
    entries = []
    for n in nodes:
        lines = []
        for t, slots in n.gpus_by_type().items():
            typed = f" Type={t}" if t else ""
            files = _device_files(sorted(s.minor for s in slots))
            lines.append(f"Name=gpu{typed} File={files}")
        if lines:
            entries.append((n.slurm_name, "\n".join(lines)))
    for names, block in _compress(entries):
        out.extend(f"NodeName={names} {line}" for line in block.splitlines())
    for n in nodes:
        if any(s.mig for s in n.gpus):
            out.append(
                f"# {n.slurm_name} has GPUs in MIG mode: NVML then reports MIG instances, not"
                " whole GPUs. Disable MIG, or see https://slurm.schedmd.com/gres.html#MIG_Management"
            )
    return "\n".join(out) + "\n"


def render_cgroup_conf() -> str:
    """cgroup.conf: a job sees only the CPUs, memory and GPU devices it was given."""
    return (
        "# cgroup.conf: each job is held to the CPUs, memory and GPUs it was given. Under\n"
        "# gpuclaim, CUDA_VISIBLE_DEVICES was the only fence; here the other GPUs' device\n"
        "# files are out of reach (ConstrainDevices).\n"
        "CgroupPlugin=autodetect\n"
        "ConstrainCores=yes\n"
        "ConstrainRAMSpace=yes\n"
        "ConstrainDevices=yes\n"
    )


def _node_line(n: NodeSpec) -> str:
    parts = [f"CPUs={n.cpus}"]
    if n.sockets and n.cores_per_socket and n.threads_per_core:
        parts += [
            f"Sockets={n.sockets}",
            f"CoresPerSocket={n.cores_per_socket}",
            f"ThreadsPerCore={n.threads_per_core}",
        ]
    if n.real_memory_mib:
        parts.append(f"RealMemory={n.real_memory_mib}")
    gres = [f"gpu:{t}:{len(s)}" if t else f"gpu:{len(s)}" for t, s in n.gpus_by_type().items()]
    if gres:
        parts.append("Gres=" + ",".join(gres))
    if n.node_addr:
        if not _NODE_ADDR.match(n.node_addr):
            raise ConfigError(f"{n.name}'s address {n.node_addr!r} cannot be used in slurm.conf")
        parts.append(f"NodeAddr={n.node_addr}")
    parts.append("State=UNKNOWN")
    return " ".join(parts)


def _node_notes(nodes: Sequence[NodeSpec]) -> list[str]:
    """Comments for the administrator: gpuclaim's names for the nodes, and the addresses
    that could not become a NodeAddr."""
    notes = []
    renamed = [f"{n.name} is {n.slurm_name}" for n in nodes if n.name != n.slurm_name]
    if renamed:
        notes.append(f"# gpuclaim's names: {_comment(', '.join(renamed))}.")
    local = [n for n in nodes if n.address and n.node_addr is None and _is_loopback(n.address)]
    if local:
        where = ", ".join(f"{n.slurm_name} at {n.address}" for n in local)
        notes += [
            f"# gpuclaim reaches {_comment(where)}, a loopback address: to any other machine",
            "# that means itself, so no NodeAddr. SLURM looks these nodes up by name; add",
            "# NodeAddr= where a name does not resolve.",
        ]
    return notes


def _slurm_name(nodes: Sequence[NodeSpec], name: str) -> str:
    return next((n.slurm_name for n in nodes if n.name == name), name)


def _partition_name(gpu_type: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "_", gpu_type)


def _device_files(minors: list[int]) -> str:
    if len(minors) == 1:
        return f"/dev/nvidia{minors[0]}"
    return f"/dev/nvidia[{_ranges(minors)}]"


def _ranges(numbers: Sequence[int], width: int = 0) -> str:
    """[0, 1, 2, 5] -> ``0-2,5`` (zero-padded to ``width``)."""
    out, run = [], [numbers[0]]
    for x in numbers[1:]:
        if x == run[-1] + 1:
            run.append(x)
        else:
            out.append(run)
            run = [x]
    out.append(run)
    fmt = f"{{:0{width}d}}"
    return ",".join(
        fmt.format(r[0]) if len(r) == 1 else f"{fmt.format(r[0])}-{fmt.format(r[-1])}" for r in out
    )


def _hostlist(names: list[str]) -> str:
    """SLURM's compressed host list: node01, node02, node03, gpu -> ``gpu,node[01-03]``."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain = []
    for name in names:
        m = re.match(r"^(.*?)(\d+)$", name)
        if m:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
        else:
            plain.append(name)
    parts = list(plain)
    for (prefix, width), numbers in groups.items():
        numbers = sorted(set(numbers))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
        else:
            parts.append(f"{prefix}[{_ranges(numbers, width)}]")
    return ",".join(sorted(parts))


def _compress(entries: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Nodes whose lines are the same apart from the name share one line, ``node[01-04]``,
    in the order each line first appears."""
    merged: dict[str, list[str]] = {}
    for name, line in entries:
        merged.setdefault(line, []).append(name)
    return [(_hostlist(names), line) for line, names in merged.items()]


def cluster_name(name: str) -> str:
    """ClusterName: SLURM lowercases it, and sacctmgr wants it plain."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "cluster"


def _conf_word(value: str) -> str:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", value):
        raise UsageError(f"{value!r} cannot be used in slurm.conf (letters, digits, '.', '_', '-')")
    return value


def _comment(text: str) -> str:
    return " ".join(str(text).split())[:200]


# -- MIGRATION.md -----------------------------------------------------------------------------


HISTORY = {
    "file": "sacct -c -S now-7days -o JobID,User,JobName,Partition,NodeList,State,Elapsed",
    "slurmdbd": "sacct -X -S now-7days -o JobID,User,AllocTRES%40",
}


def render_migration_md(nodes: Sequence[NodeSpec], opts: ExportOptions) -> str:
    """A short guide from gpuclaim's commands to SLURM's, for people who never used SLURM,
    and the administrator's steps, in an order where gpuclaim and SLURM never hand out the
    same GPU: gpuclaim is drained and its jobs have ended before any slurmd starts."""
    accounting = _accounting(opts)
    check_nodes(nodes)
    gpu_parts = [p for p in plan_partitions(nodes) if p.gpu_type is not None]
    gres = _first_gres(nodes)
    part = f" --partition={gpu_parts[0].name}" if gpu_parts else ""
    controller = _controller(nodes, opts)[0] if nodes else "CONTROLLER"
    limits = f"default {format_duration(opts.default_time_s)}, at most"
    limits += f" {format_duration(opts.max_time_s)}; longer is refused"
    history_note = (
        "finished jobs, from the job-completion log"
        if accounting == "file"
        else "GPUs per job; `sreport` for totals"
    )
    mapping = (
        (
            "`gpuclaim claim -n 1 --time 2h`",
            f"`salloc --gres={gres} --time=2:00:00{part}`",
            "a shell that holds the GPU; `exit` gives it back",
        ),
        ("`gpuclaim shell`", f"`srun --gres={gres} --pty bash`", "a shell on a node"),
        (
            "`gpuclaim run -n 2 -- python train.py`",
            "`sbatch train.sbatch`",
            "`gpuclaim export sbatch NAME` writes the script",
        ),
        (
            "`gpuclaim run --nodes 2 ...`",
            "`sbatch`, `--nodes=2`, `srun`",
            "the exported script does it",
        ),
        (
            "`gpuclaim status`, `board`",
            "`squeue` (jobs), `sinfo` (nodes)",
            '`sinfo -o "%N %G %t"` shows GPUs',
        ),
        (
            "`gpuclaim jobs`, `logs NAME`",
            "`squeue --me`, `cat logs/JOBID.out`",
            "output goes where `--output` says",
        ),
        ("`gpuclaim kill NAME`", "`scancel JOBID`", ""),
        ("`gpuclaim history`", f"`{HISTORY[accounting]}`", history_note),
        ("`--time 8h`", "`--time=8:00:00`", limits),
        ("`run --queue`, `--wait`", "every job queues", "`squeue --start` says when yours starts"),
    )
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in mapping)
    types = "\n".join(
        f"| `{p.name}` | {_hostlist(list(p.nodes))} | `{p.gpu_type or 'any'}` |"
        + (" yes |" if p.default else " |")
        for p in gpu_parts
    )
    renamed = [f"{n.name} is `{n.slurm_name}`" for n in nodes if n.name != n.slurm_name]
    names = (
        f"\nSLURM calls each node by its hostname: {_comment(', '.join(renamed))}.\n"
        if renamed
        else ""
    )
    steps = "\n".join(
        _wrap_step(i, text) for i, text in enumerate(_admin_steps(nodes, opts, controller), 1)
    )
    return f"""# Moving {_comment(opts.cluster)} from gpuclaim to SLURM

SLURM does what gpuclaim did by agreement, and enforces it: you ask for GPUs, your job waits
in a queue until they are free, runs on them alone (other GPUs are invisible to it), and is
stopped at its time limit. {_priority_sentence(accounting)}

## What you type now

| gpuclaim | SLURM | notes |
|---|---|---|
{table}

SLURM sets CUDA_VISIBLE_DEVICES to your job's GPUs, as gpuclaim did: do not set it yourself.

## GPU types and partitions

| partition | nodes | GPU type | default |
|---|---|---|---|
{types or "| (none) | | | |"}

Ask for a model with `--gres=gpu:TYPE:N` (e.g. `--gres={gres}`), or for any GPU of the
partition with `--gres=gpu:N`.
{names}
## Your jobs as sbatch scripts

    gpuclaim export sbatch NAME > NAME.sbatch         # one job you ran
    gpuclaim export sbatch --history 30 --out jobs/    # all your jobs of the last 30 days
    mkdir -p logs && sbatch NAME.sbatch                # SLURM prints the job id

Each script keeps the job's command exactly, its environment, directory, GPUs and time
limit. Its output goes to `logs/JOBID.out` in the job's directory: create `logs/` there.

## For the administrator: switching over

gpuclaim stops handing out GPUs first, and no slurmd starts before its last job has ended:
the two never give out the same GPU.

{steps}

If `slurmd -C` on a node prints fewer CPUs or less memory than slurm.conf says, lower the
numbers in slurm.conf: SLURM refuses a node smaller than its configuration. AutoDetect=nvml
needs a slurmd built with NVML (Debian 12's is not: it says so and uses the File= lines).
"""


def _priority_sentence(accounting: str) -> str:
    if accounting == "slurmdbd":
        return "Who goes first is decided by fair share: whoever used fewer\nGPU-hours lately."
    return (
        "Jobs start in the order they were submitted, and a smaller job\nstarts early where "
        "it fits in a gap (backfill)."
    )


def _admin_steps(nodes: Sequence[NodeSpec], opts: ExportOptions, controller: str) -> list[str]:
    dbd = opts.accounting == "slurmdbd"
    cluster = cluster_name(opts.cluster)
    server_pkgs = "slurmctld slurmdbd munge mariadb-server" if dbd else "slurmctld munge"
    steps = [
        "Stop new work in gpuclaim: `gpuclaim drain NODE --reason 'moving to SLURM'` for each"
        " node. Claims and jobs already running carry on to their end (at most"
        f" {format_duration(opts.max_time_s)}); do the next steps meanwhile.",
        f"On the controller ({controller}): `apt-get install {server_pkgs}`; on each GPU node:"
        " `apt-get install slurmd munge`, then `systemctl disable slurmd` (Debian enables it,"
        " and a node that reboots once slurm.conf is there would start it); where people log"
        " in: `slurm-client`.",
        "Copy one `/etc/munge/munge.key` to every machine (owner munge, mode 0400) and restart"
        " munge everywhere: `munge -n | ssh NODE unmunge` must say Success.",
        "Copy slurm.conf, gres.conf and cgroup.conf to `/etc/slurm/` on every machine.",
    ]
    if dbd:
        steps += [
            f"On {controller}, the database: choose a password (no `#`), then"
            " `mysql -e \"CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'PASSWORD';"
            " GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';\"` with it, put it in"
            f" slurmdbd.conf in place of {DB_PASSWORD_PLACEHOLDER}, and"
            " `install -o slurm -g slurm -m 0600 slurmdbd.conf /etc/slurm/` (slurmdbd refuses a"
            " file that others can read or that slurm does not own). `systemctl start slurmdbd`;"
            " `sacctmgr show cluster` answers once it is up.",
            f"`sacctmgr add cluster {cluster}`, `sacctmgr add account lab` and"
            " `sacctmgr add user NAME account=lab` for each person: fair share counts per user.",
        ]
    steps += [
        "Wait until gpuclaim is empty: `gpuclaim status` shows no claimed GPU and"
        " `gpuclaim jobs` no running job (ask the owners of what is left to release it).",
        "Only now start SLURM: `systemctl start slurmctld` on the controller"
        + (" (not before slurmdbd answers: the first time, it stops without it)" if dbd else "")
        + ", then `systemctl enable --now slurmd` on each node. `sinfo` shows every node"
        " `idle`; one that is `inval` or `drain` says why in `sinfo -R`.",
        f"A first job: `srun --gres={_first_gres(nodes)} nvidia-smi -L` prints the GPU SLURM"
        " gave it. Tell everyone to use SLURM from now on (the table above).",
    ]
    return steps


def _first_gres(nodes: Sequence[NodeSpec]) -> str:
    gpu_parts = [p for p in plan_partitions(nodes) if p.gpu_type is not None]
    first = gpu_parts[0] if gpu_parts else None
    return f"gpu:{first.gpu_type}:1" if first and first.gpu_type else "gpu:1"


def _wrap_step(number: int, text: str, width: int = 92) -> str:
    """``N. text``, wrapped with its continuation lines indented under the text; a `code`
    span stays on one line, so that what is pasted into a shell is the whole command."""
    import textwrap

    glue = "\x00"
    spans = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", glue), text)
    prefix = f"{number}. "
    wrapped = textwrap.fill(
        spans,
        width=width,
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix),
        break_long_words=False,
        break_on_hyphens=False,
    )
    return wrapped.replace(glue, " ")


# -- sbatch scripts ---------------------------------------------------------------------------

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_./%:=,+@-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
# torchrun options that decide topology and rendezvous: SLURM's allocation decides them now.
_TORCHRUN_REPLACED = {
    "nnodes",
    "nproc-per-node",
    "node-rank",
    "master-addr",
    "master-port",
    "standalone",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "use-env",
    "local-addr",
}
_TORCHRUN_FLAGS = {"standalone", "no-python", "run-path", "module", "use-env", "m"}
RDZV_PORT_BASE = 29500


def sbatch_quote(value: str) -> str:
    """A value as sbatch reads it on an ``#SBATCH`` line: its parser splits on blanks, takes
    quotes, treats ``\\`` as an escape everywhere and an unquoted ``#`` as a comment."""
    if "\n" in value or "\r" in value:
        raise UsageError(f"{value!r} cannot go on an #SBATCH line (it has a line break)")
    if _SAFE_WORD.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_sbatch(job: Job, gpu_type: str = "", partition: Optional[str] = None) -> str:
    """An sbatch script that runs ``job`` as gpuclaim ran it: same command (argv exactly),
    environment, directory, GPUs per node, nodes and time limit."""
    if job.kind != "batch":
        raise UsageError(
            f"{job.name} is an interactive {job.kind}: in SLURM that is "
            f"`srun --gres=gpu:{gpu_type + ':' if gpu_type else ''}{job.gpus_per_node} --pty bash`"
        )
    gres = f"gpu:{gpu_type}:{job.gpus_per_node}" if gpu_type else f"gpu:{job.gpus_per_node}"
    directives = [("job-name", job.name)]
    if partition:
        directives.append(("partition", partition))
    directives += [
        ("nodes", str(job.nodes_wanted)),
        ("ntasks-per-node", "1"),
        ("gres", gres),
        ("time", format_slurm_time(job.time_limit_s)),
        ("output", "logs/%j.out"),
    ]
    if job.workdir:
        directives.append(("chdir", job.workdir))
    out = ["#!/bin/bash"]
    out += [f"#SBATCH --{key}={sbatch_quote(value)}" for key, value in directives]
    where = _comment(job.workdir) if job.workdir else "the directory you submit from"
    out += [
        "#",
        f"# gpuclaim job {_comment(job.name)} ({_comment(job.id)}) of {_comment(job.user)},"
        " exported by `gpuclaim export sbatch`.",
        f"# Output: logs/JOBID.out in {where}; create logs/ there first.",
        "# SLURM sets CUDA_VISIBLE_DEVICES to the GPUs it gives the job.",
        "",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "export PYTHONUNBUFFERED=1",
    ]
    for key, value in job.env:
        if key == "CUDA_VISIBLE_DEVICES":
            continue  # SLURM's choice, not the one gpuclaim made back then
        if _ENV_NAME.match(key):
            out.append(f"export {key}={shlex.quote(value)}")
        else:
            out.append(f"# left out {_comment(repr(key))}: not a name a shell can export")
    out.append("")
    out += _gang_lines(job) if job.nodes_wanted > 1 else [shlex.join(job.argv)]
    return "\n".join(out) + "\n"


def jobs_since(jobs: Sequence[Job], since: float, user: Optional[str]) -> list[Job]:
    """The jobs submitted since ``since`` (of ``user``, or everyone's), the newest run of
    each name only: ``jobs`` come oldest first, as load_jobs gives them."""
    newest: dict[tuple[str, str], Job] = {}
    for job in jobs:
        if job.submitted >= since and (user is None or job.user == user):
            newest[(job.user, job.name)] = job
    return list(newest.values())


def job_gpu_type(nodes: Sequence[NodeSpec], job: Job) -> str:
    """The type of the GPUs the job ran on; for a job that never ran, its node's (or the
    cluster's) type; "" (any GPU) where that is more than one type."""
    used = {u for r in job.ranks for u in r.gpu_uuids}
    on = {r.node for r in job.ranks} or ({job.node} if job.node else set())
    types = {g.type for n in nodes for g in n.gpus if g.uuid in used}
    if not types:
        types = {g.type for n in nodes if not on or n.name in on for g in n.gpus}
    return types.pop() if len(types) == 1 else ""


def _gang_lines(job: Job) -> list[str]:
    """A gang job: torch.distributed.run on every node (srun, one task per node), meeting at a
    c10d rendezvous on the job's first node, as PyTorch recommends under SLURM. Commands that
    are not Python get gpuclaim's own contract instead: once per node, with NODE_RANK etc."""
    head = [
        "# The job's first node hosts the rendezvous, at the address SLURM reaches it by.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'head_addr=$(scontrol show node "$head_node" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        "head_addr=${head_addr:-$head_node}",
        f"rdzv_port=$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % 1000 ))",
        "",
    ]
    launch = _torch_launch(job.argv)
    if launch is None:
        n = job.gpus_per_node
        return [
            *head,
            "# As under gpuclaim: the command runs once per node and finds its peers here.",
            'export MASTER_ADDR="$head_addr" MASTER_PORT="$rdzv_port"',
            f'export NNODES="$SLURM_JOB_NUM_NODES" NPROC_PER_NODE={n}',
            f"export WORLD_SIZE=$(( SLURM_JOB_NUM_NODES * {n} ))",
            "srun bash -c 'NODE_RANK=$SLURM_NODEID exec \"$@\"' bash " + shlex.join(job.argv),
        ]
    launcher, kept, rest, was_torchrun = launch
    lines = [*head]
    if not was_torchrun:
        lines += [
            "# gpuclaim ran the command once per node; torch.distributed.run starts it once",
            f"# per GPU ({job.gpus_per_node} per node) and sets RANK, LOCAL_RANK and WORLD_SIZE.",
            "# If it starts its own per-GPU processes, use --nproc_per_node=1.",
        ]
    flags = [
        '--nnodes="$SLURM_JOB_NUM_NODES"',
        f"--nproc_per_node={job.gpus_per_node}",
        '--rdzv_id="$SLURM_JOB_ID"',
        "--rdzv_backend=c10d",
        '--rdzv_endpoint="$head_addr:$rdzv_port"',
    ]
    body = [" ".join(launcher), " ".join(flags[:2]), " ".join(flags[2:])]
    if kept or rest:
        body.append(" ".join(shlex.quote(a) for a in [*kept, *rest]))
    return [*lines, "srun " + " \\\n    ".join(body)]


def _torch_launch(
    argv: Sequence[str],
) -> Optional[tuple[list[str], list[str], list[str], bool]]:
    """(launcher argv, its options to keep, the script and its args, was it torchrun) for
    ``python script.py``, ``python -m mod``, ``torchrun ...``; None for anything else."""
    if not argv:
        return None
    exe = argv[0].rsplit("/", 1)[-1]
    if exe == "torchrun":
        return _split_torchrun([shlex.quote(argv[0])], list(argv[1:]))
    if not _PYTHON.match(exe):
        return None
    rest = list(argv[1:])
    while rest and rest[0] == "-u":  # torch.distributed.run starts workers unbuffered anyway
        rest.pop(0)
    launcher = [shlex.quote(argv[0]), "-m", "torch.distributed.run"]
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] in _TORCH_LAUNCHERS:
        return _split_torchrun(launcher, rest[2:])
    if len(rest) >= 2 and rest[0] == "-m":
        return launcher, [], ["-m", *rest[1:]], False
    if rest and not rest[0].startswith("-"):
        return launcher, [], rest, False
    return None  # python -c, -O ... : run it as it is, once per node


def _split_torchrun(
    launcher: list[str], args: list[str]
) -> tuple[list[str], list[str], list[str], bool]:
    kept: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        opt = args[i]
        key = opt.lstrip("-").split("=", 1)[0].replace("_", "-")
        takes_value = "=" not in opt and key not in _TORCHRUN_FLAGS
        value = [args[i + 1]] if takes_value and i + 1 < len(args) else []
        if key not in _TORCHRUN_REPLACED:
            kept += [opt, *value]
        i += 1 + len(value)
    return launcher, kept, args[i:], True


# -- when SLURM pays for itself ---------------------------------------------------------------

ADVICE_GPUS = 16
ADVICE_USERS = 8
LONG_WAIT_S = 3600.0
LONG_WAITS = 3


def slurm_advice(gpus: int, users: int, queue_waits_s: Sequence[float] = ()) -> Optional[str]:
    """One sentence when the team has outgrown gpuclaim (more than 16 GPUs or 8 users, or
    jobs that waited over an hour in the queue, 3 times or more), else None."""
    reasons = []
    if gpus > ADVICE_GPUS:
        reasons.append(f"{gpus} GPUs")
    if users > ADVICE_USERS:
        reasons.append(f"{users} users")
    long_waits = sum(1 for w in queue_waits_s if w >= LONG_WAIT_S)
    if long_waits >= LONG_WAITS:
        reasons.append(f"{long_waits} jobs that waited over an hour")
    if not reasons:
        return None
    return (
        f"With {' and '.join(reasons)}, SLURM now pays for itself: a real queue with fair "
        "share and enforced isolation. `gpuclaim export slurm --out slurm/` writes its "
        "configuration and a MIGRATION.md."
    )


def queue_waits(jobs: Sequence[Job], since: float, now: float) -> list[float]:
    """How long each job submitted since ``since`` waited to start (still waiting: so far)."""
    waits = []
    for j in jobs:
        if j.submitted < since:
            continue
        start = j.started if j.started is not None else (now if j.state == "queued" else None)
        if start is not None:
            waits.append(max(0.0, start - j.submitted))
    return waits
