"""Services (``gpuclaim serve``) at submit: the port on the node they run on, refused when
another service or another process has it. Keeping one up is its wrapper's job
(``node/wrapper.py``, ``core/service.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from gpuclaim.core.errors import NameInUseError
from gpuclaim.core.model import Job, JobKind
from gpuclaim.core.states import ACTIVE_JOB_STATES
from gpuclaim.engine.job_records import load_jobs
from gpuclaim.engine.launch import NodeOps
from gpuclaim.store import Store

AUTO_PORT = 0  # serve --port auto: a free port of the node, chosen at submit


def service_on(store: Store, node: str, port: int, other_than: str = "") -> Optional[Job]:
    """The live service that has ``port`` on ``node`` (running, or queued there)."""
    for j in load_jobs(store):
        if j.id == other_than or j.state not in ACTIVE_JOB_STATES or j.service is None:
            continue
        where = j.ranks[0].node if j.ranks else j.node
        if where == node and j.service.port == port:
            return j
    return None


def settle_port(store: Store, ops: NodeOps, job: Job, node: str) -> Job:
    """The service's port on ``node``: a free one for ``auto``, else the one asked if nobody
    has it. NameInUseError (exit 5) names who has it."""
    spec = job.service
    if spec is None or job.kind != JobKind.SERVICE:
        return job
    node_cfg = ops.config.node(node)
    if spec.port == AUTO_PORT:
        for _ in range(5):  # a port a restarting service (not listening now) has: another
            port = int(ops.facts(node_cfg)["port"])
            if service_on(store, node, port, job.id) is None:
                break
    else:
        port = spec.port
        holder = service_on(store, node, port, job.id)
        if holder is not None:
            raise NameInUseError(
                f"port {port} on {node} is served by {holder.user}'s {holder.name} "
                "(gpuclaim serve)",
                hint="pick another --port, or --port auto",
            )
        if ops.facts(node_cfg, port=port)["port_in_use"]:
            raise NameInUseError(
                f"port {port} on {node} is in use by another process there",
                hint="pick another --port, or --port auto",
            )
    return job.with_(service=replace(spec, port=port), port=port)
