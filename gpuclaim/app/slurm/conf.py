"""Rendering SLURM's configuration files from the node descriptions: ``slurm.conf``
(nodes, partitions, scheduling, and accounting with or without slurmdbd),
``slurmdbd.conf``, ``gres.conf`` (each node's GPUs and device files) and ``cgroup.conf``.
Pure renderers, Slurm 22.05 syntax (Debian 12), run by tests/test_slurm_real.py against a
real SLURM.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional

from gpuclaim.app.slurm.preemption import preemption_lines, scavenger_partition, seconds
from gpuclaim.app.slurm.spec import (
    ExportOptions,
    NodeSpec,
    Partition,
    check_nodes,
    checked_accounting,
    controller_of,
    is_loopback,
    plan_partitions,
)
from gpuclaim.app.slurm.syntax import cluster_name, comment, compress, hostlist, ranges
from gpuclaim.core.durations import format_slurm_time
from gpuclaim.core.errors import ConfigError, UsageError

# Where Debian's packages keep SLURM's state and logs: they create these, owned by slurm.
STATE_DIR = "/var/lib/slurm/slurmctld"
SPOOL_DIR = "/var/lib/slurm/slurmd"
LOG_DIR = "/var/log/slurm"
JOBCOMP_LOG = f"{LOG_DIR}/jobcomp.log"
DB_PASSWORD_PLACEHOLDER = "REPLACE_WITH_THE_DATABASE_PASSWORD"
_NODE_ADDR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")  # a name, an IPv4 or IPv6 address


def render_slurm_conf(nodes: Sequence[NodeSpec], opts: ExportOptions) -> str:
    """slurm.conf for these nodes: cons_tres, backfill, cgroups, and accounting as
    ``opts.accounting`` says (without a database, it starts on a fresh install as written)."""
    if not nodes:
        raise UsageError("no node answered: nothing to write a slurm.conf for")
    check_nodes(nodes)
    dbd = checked_accounting(opts) == "slurmdbd"
    host, addr = controller_of(nodes, opts)
    out = [
        f"# slurm.conf for the {comment(opts.cluster)} cluster, from what its nodes reported",
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
        "GresTypes=gpu,shard" if opts.shards_per_gpu else "GresTypes=gpu",
        "# Refuse at submit time what exceeds a partition's limits (as gpuclaim does).",
        "EnforcePartLimits=ALL",
        "# A job being stopped gets SIGTERM, then this long, then SIGKILL (gpuclaim's",
        "# [limits] kill_grace).",
        f"KillWait={seconds(opts.kill_wait_s)}",
        "",
    ]
    out += _accounting_lines(nodes, host, addr, opts) if dbd else _jobcomp_lines()
    if any(n.gpus for n in nodes):
        out += ["", *preemption_lines(opts, dbd)]
    out += [
        "",
        "# Nodes, as they reported themselves (`slurmd -C` on a node prints the same; RealMemory",
        "# stays a little under the total, so a node is not refused for a few missing MiB).",
        "# Each is named by its hostname: slurmd finds its line by `hostname -s`.",
    ]
    out.extend(_node_notes(nodes))
    lines = [(n.slurm_name, _node_line(n, opts.shards_per_gpu)) for n in nodes]
    for names, line in compress(lines):
        out.append(f"NodeName={names} {line}")
    for name, why in opts.skipped:
        out.append(f"# {comment(name)} is not here: it did not answer ({comment(why)}).")
    out += ["", *_partition_lines(plan_partitions(nodes), opts, dbd)]
    return "\n".join(out) + "\n"


def _partition_lines(parts: Sequence[Partition], opts: ExportOptions, dbd: bool) -> list[str]:
    out = [
        "# Partitions: one per GPU type when the nodes differ, so --partition picks the model.",
        "# A job without --time gets DefaultTime; one asking for more than MaxTime is refused.",
        "# Jobs get a node's CPUs and memory in proportion to their GPUs unless they ask.",
    ]
    for p in parts:
        words = [
            f"PartitionName={p.name}",
            f"Nodes={hostlist(list(p.nodes))}",
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
    return out + scavenger_partition(parts, opts, dbd)


def _jobcomp_lines() -> list[str]:
    # Measured on Slurm 22.05: without slurmdbd, PriorityWeightFairshare and PriorityWeightAge
    # are ignored ("can only be used with SlurmDBD"), a gres/gpu TRES is fatal ("slurmdbd is
    # required to run with TRES gres/gpu"), and with it GPU billing weights cannot parse.
    return [
        "# Priority: first come, first served; backfill starts smaller jobs in the gaps.",
        "# gpuclaim's fair share ([queue]) needs slurmdbd here, see below.",
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


def _accounting_lines(
    nodes: Sequence[NodeSpec], host: str, addr: Optional[str], opts: ExportOptions
) -> list[str]:
    types = sorted({t for n in nodes for t in n.gpus_by_type() if t})
    tres = ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in types)])
    return [
        "# Priority: as gpuclaim's queue ([queue] in its config): fair share of GPU time,",
        "# use forgotten with the same half-life, plus points for time spent waiting.",
        "PriorityType=priority/multifactor",
        f"PriorityDecayHalfLife={format_slurm_time(opts.half_life_s)}",
        "PriorityUsageResetPeriod=NONE",
        f"PriorityMaxAge={format_slurm_time(opts.max_age_s)}",
        f"PriorityWeightFairshare={round(opts.fairshare_weight)}",
        f"PriorityWeightAge={round(opts.age_weight)}",
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
    host, _ = controller_of(nodes, opts)
    lines = [
        f"# slurmdbd.conf for the {comment(opts.cluster)} cluster: the accounting daemon,",
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


def render_gres_conf(nodes: Sequence[NodeSpec], shards_per_gpu: int = 0) -> str:
    """gres.conf: AutoDetect=nvml checks the GPUs; the File= lines work without NVML too.
    With ``shards_per_gpu``, each node's GPUs are also that many shards each."""
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
        whole = n.gpus_by_type(whole=True)
        for t, slots in whole.items():
            typed = f" Type={t}" if t else ""
            files = _device_files(sorted(s.minor for s in slots))
            lines.append(f"Name=gpu{typed} File={files}")
        if lines and shards_per_gpu:
            for t, slots in whole.items():
                typed = f" Type={t}" if t else ""
                files = _device_files(sorted(x.minor for x in slots))
                lines.append(f"Name=shard{typed} Count={shards_per_gpu * len(slots)} File={files}")
        if lines:
            entries.append((n.slurm_name, "\n".join(lines)))
    for names, block in compress(entries):
        out.extend(f"NodeName={names} {line}" for line in block.splitlines())
    for n in nodes:
        out.extend(_mig_notes(n))
    return "\n".join(out) + "\n"


def _mig_notes(n: NodeSpec) -> list[str]:
    """A node's MIG slices: AutoDetect=nvml finds them (each slice's device files are
    /dev/nvidia-caps entries made when the slice is), so gres.conf says what it will find."""
    if not n.slices:
        return []
    by_type: dict[str, int] = {}
    for g in n.slices:
        by_type[g.type] = by_type.get(g.type, 0) + 1
    found = ", ".join(f"{count} {t or 'untyped'}" for t, count in by_type.items())
    return [
        f"# {n.slurm_name}: MIG slices ({comment(found)}), GRES of their own that slurmd finds",
        "# with AutoDetect=nvml only: that needs a slurmd built with NVML (Debian's is not), and",
        "# the slices made before slurmd starts (it stops if MIG is on with none). Check with",
        f"# `slurmd -G` on {n.slurm_name}; see https://slurm.schedmd.com/gres.html#MIG_Management",
    ]


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


def _node_line(n: NodeSpec, shards_per_gpu: int = 0) -> str:
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
    if gres and shards_per_gpu:  # run --gpu-mem's parts of a GPU: slurmd types them as its GPUs
        for t, slots in n.gpus_by_type(whole=True).items():
            count = shards_per_gpu * len(slots)
            gres.append(f"shard:{t}:{count}" if t else f"shard:{count}")
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
        notes.append(f"# gpuclaim's names: {comment(', '.join(renamed))}.")
    local = [n for n in nodes if n.address and n.node_addr is None and is_loopback(n.address)]
    if local:
        where = ", ".join(f"{n.slurm_name} at {n.address}" for n in local)
        notes += [
            f"# gpuclaim reaches {comment(where)}, a loopback address: to any other machine",
            "# that means itself, so no NodeAddr. SLURM looks these nodes up by name; add",
            "# NodeAddr= where a name does not resolve.",
        ]
    return notes


def _device_files(minors: list[int]) -> str:
    if len(minors) == 1:
        return f"/dev/nvidia{minors[0]}"
    return f"/dev/nvidia[{ranges(minors)}]"
