"""The way out: SLURM's configuration and job scripts written from what gpuclaim knows.

Pure renderers (no I/O) for ``slurm.conf``, ``gres.conf``, ``cgroup.conf``, ``MIGRATION.md``
and sbatch scripts, the GPU type names they share, the advice of when SLURM starts to pay
for itself, and one function that asks the nodes what they are made of. Everything targets
Slurm 22.05 syntax (Debian 12), proven by tests/test_slurm_real.py against a real one. The
modules: ``gputypes`` (GPU type names), ``syntax`` (host lists and other spellings),
``spec`` (the shared data types and partition plan), ``inventory`` (asking the nodes),
``conf`` (the configuration files), ``migration`` (MIGRATION.md), ``reservations``
(bookings as SLURM reservations), ``sbatch`` (past jobs as sbatch scripts),
``preemption`` (``run --preemptible`` as SLURM's scavenger partition and QOS) and ``advice``
(when SLURM pays for itself); the names callers use are re-exported here.
"""

from __future__ import annotations

from gpuclaim.app.slurm.advice import (
    ADVICE_GPUS,
    ADVICE_USERS,
    LONG_WAIT_S,
    LONG_WAITS,
    queue_waits,
    slurm_advice,
)
from gpuclaim.app.slurm.conf import (
    DB_PASSWORD_PLACEHOLDER,
    JOBCOMP_LOG,
    LOG_DIR,
    SPOOL_DIR,
    STATE_DIR,
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
)
from gpuclaim.app.slurm.gputypes import GPU_TYPE_PATTERNS, autodetect_type, slurm_type_name
from gpuclaim.app.slurm.inventory import gather_inventory, node_spec, ssh_address
from gpuclaim.app.slurm.migration import HISTORY, render_migration_md
from gpuclaim.app.slurm.preemption import SCAVENGER, sacctmgr_qos_commands, slurm_signal
from gpuclaim.app.slurm.reservations import render_reservations, scontrol_line
from gpuclaim.app.slurm.sbatch import (
    RDZV_PORT_BASE,
    job_gpu_type,
    jobs_since,
    render_sbatch,
    sbatch_quote,
    submit_all,
)
from gpuclaim.app.slurm.spec import (
    ACCOUNTING,
    ExportOptions,
    GpuSlot,
    NodeSpec,
    Partition,
    check_nodes,
    partition_for,
    plan_partitions,
)
from gpuclaim.app.slurm.syntax import cluster_name, hostlist

__all__ = [
    "ACCOUNTING",
    "ADVICE_GPUS",
    "ADVICE_USERS",
    "DB_PASSWORD_PLACEHOLDER",
    "GPU_TYPE_PATTERNS",
    "HISTORY",
    "JOBCOMP_LOG",
    "LOG_DIR",
    "LONG_WAITS",
    "LONG_WAIT_S",
    "RDZV_PORT_BASE",
    "SCAVENGER",
    "SPOOL_DIR",
    "STATE_DIR",
    "ExportOptions",
    "GpuSlot",
    "NodeSpec",
    "Partition",
    "autodetect_type",
    "check_nodes",
    "cluster_name",
    "gather_inventory",
    "hostlist",
    "job_gpu_type",
    "jobs_since",
    "node_spec",
    "partition_for",
    "plan_partitions",
    "queue_waits",
    "render_cgroup_conf",
    "render_gres_conf",
    "render_migration_md",
    "render_reservations",
    "render_sbatch",
    "render_slurm_conf",
    "render_slurmdbd_conf",
    "sacctmgr_qos_commands",
    "sbatch_quote",
    "scontrol_line",
    "slurm_advice",
    "slurm_signal",
    "slurm_type_name",
    "ssh_address",
    "submit_all",
]
