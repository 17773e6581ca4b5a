"""``run --ray`` from the laptop's side: before anything is claimed, is Ray in the job's
environment on the nodes it could run on? Nodes without it are left out of its placement;
too few with it is one line (UsageError, exit 2) naming them and why, nothing claimed.
The Ray cluster itself is the nodes' work (``node/ray_node.py``)."""

from __future__ import annotations

from dataclasses import replace

from gpuclaim.core.config import Config, WorkEnv
from gpuclaim.core.errors import UsageError
from gpuclaim.core.fanout import fan_out
from gpuclaim.core.model import Job
from gpuclaim.core.protocol import WorkEnvSpec
from gpuclaim.engine.cluster import ClusterView
from gpuclaim.engine.launch import NodeOps, nodes_for


def nodes_with_ray(config: Config, ops: NodeOps, job: Job, view: ClusterView) -> Config:
    """``config`` with only the nodes where the job's environment has Ray (asked of all its
    candidate nodes at once); UsageError when fewer than the job needs have it."""
    candidates = [n for n in nodes_for(config, job) if n.name not in view.unreachable]

    def check(name: str) -> str:
        node = config.node(name)
        env = config.workenv_of(node, WorkEnv(venv=job.venv, conda=job.conda))
        spec: WorkEnvSpec = {
            "login_shell": env.login_shell,
            "venv": env.venv,
            "conda": env.conda,
        }
        answer = ops.ray_check(node, spec, job.workdir or job.cwd)
        return "" if answer["version"] else answer["problem"] or "no ray"

    outcomes = fan_out([n.name for n in candidates], check, config.limits.deadline_s)
    problems = {name: (out.value if out.ok else out.error) or "" for name, out in outcomes.items()}
    ready = [name for name, problem in problems.items() if not problem]
    if len(ready) >= job.nodes_wanted and ready:
        return replace(config, nodes=tuple(n for n in config.nodes if n.name in ready))
    missing = "; ".join(f"{name}: {why}" for name, why in problems.items() if why)
    need = f"{job.nodes_wanted} nodes" if job.nodes_wanted > 1 else "a node"
    raise UsageError(
        f"run --ray needs Ray in the job's environment on {need}: {missing or 'no node answered'}",
        hint="install ray in the job's venv or conda env on those nodes (--venv/--conda)",
    )
