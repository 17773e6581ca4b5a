"""``forward``: a service's port here, through the SSH master to its node."""

from __future__ import annotations

import shlex
import subprocess
from typing import Annotated, Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import out, state
from gpuclaim.core.errors import GpuclaimError, UsageError

MAX_PORT = 65535


def forward(
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(
            help="The service (yours, or anyone's of that name).",
            autocompletion=completion.complete_jobs,
        ),
    ],
    port: Annotated[
        Optional[int],
        typer.Option(
            "--port",
            min=1,
            max=MAX_PORT,
            metavar="LOCAL",
            help="The port here (default: the service's own, if free here).",
        ),
    ] = None,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the ssh command instead of running it.")
    ] = False,
    dashboard: Annotated[
        bool, typer.Option("--dashboard", help="A run --ray job's Ray dashboard instead.")
    ] = False,
) -> None:
    """Forward a service's port (or a Ray job's dashboard) to this machine until Ctrl-C
    (prints its local URL)."""
    from gpuclaim.node.runner import port_in_use

    st = state(ctx)
    if dashboard:
        job, node_name, remote_port = _ray_dashboard(st, name)
    else:
        job = _service_named(st, name)
        assert job.service is not None
        node_name, remote_port = job.ranks[0].node, job.service.port
    node = st.config.node(node_name)
    if node.transport == "local":  # this machine is the node: nothing to forward
        out().print(f"http://127.0.0.1:{remote_port}/", markup=False, highlight=False)
        return
    local = port if port is not None else remote_port
    if port is None and port_in_use(local):
        from gpuclaim.node.runner import free_port

        local = free_port()
    argv = _ssh_argv(st.config, node.host, local, remote_port)
    if print_only:
        out().print(shlex.join(argv), markup=False, highlight=False)
        return
    if port_in_use(local):
        raise GpuclaimError(f"port {local} is in use here", hint="pick another with --port")
    out().print(
        f"http://127.0.0.1:{local}/  ->  {job.name} on {node.name}:{remote_port} (Ctrl-C to stop)",
        markup=False,
        highlight=False,
    )
    try:
        code = subprocess.run(argv).returncode
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    if code != 0:
        raise GpuclaimError(f"the forward to {node.name} ended (ssh exit status {code})")


def _ray_dashboard(st: Any, name: str) -> tuple[Any, str, int]:
    """A running ``run --ray`` job's dashboard: the job, its head's node and port. Its token
    (the dashboard asks for it) is said on stderr to its owner, read from the head's spec."""
    from gpuclaim.cli.common import err
    from gpuclaim.core.states import started
    from gpuclaim.engine.job_records import find_job

    job = find_job(st.store, st.user, name)
    if not job.ray or not started(job.state):
        raise UsageError(f"{job.name} is not a running run --ray job: it has no Ray dashboard")
    head = job.ray_head or {}
    if not head.get("dashboard"):
        raise GpuclaimError(
            f"{job.name}'s Ray has no dashboard answering (yet)",
            hint="the minimal `pip install ray` has none: install ray[default] in its env",
        )
    token = _ray_token(st, job)
    if token:
        err().print(f"the dashboard asks for the job's Ray token: {token}", markup=False)
    return job, str(head["node"]), int(head["dashboard_port"])


def _ray_token(st: Any, job: Any) -> str:
    """The job's Ray token, from rank 0's owner-only spec on its node ("" where unread)."""
    import json
    from pathlib import PurePosixPath

    log = job.ranks[0].log if job.ranks else None
    if not log or job.user != st.user:
        return ""
    spec = str(PurePosixPath(log).parent / "spec.json")
    try:
        answer = st.ops.read_log(st.config.node(job.ranks[0].node), spec)
        return str(json.loads(answer["data"]).get("ray_token") or "")
    except (GpuclaimError, ValueError, AttributeError):
        return ""


def _service_named(st: Any, name: str) -> Any:
    """One's own running service of that name, else the one of anyone (a shared endpoint)."""
    from gpuclaim.core.states import started
    from gpuclaim.engine.job_records import load_jobs

    services = [j for j in load_jobs(st.store) if j.service is not None and started(j.state)]
    mine = [j for j in services if j.user == st.user and name in (j.name, j.id)]
    theirs = [j for j in services if name in (j.name, j.id)]
    found = mine or theirs
    if not found:
        raise GpuclaimError(
            f"no running service {name!r}", hint="see 'gpuclaim jobs' (gpuclaim serve starts one)"
        )
    if len(found) > 1:
        owners = ", ".join(sorted(j.user for j in found))
        raise UsageError(f"several users run a service {name!r} ({owners}): name it by its id")
    if not found[0].ranks:
        raise GpuclaimError(f"service {name!r} has not started on a node yet")
    return found[0]


def _ssh_argv(config: Any, host: str, local: int, remote: int) -> list[str]:
    """ssh -N -L through gpuclaim's ControlMaster for that node (made if there is none)."""
    from gpuclaim.remote.openssh import OpenSshPool
    from gpuclaim.remote.ssh import config_for_ssh_binary

    pool = OpenSshPool(config_for_ssh_binary(config.ssh_config_path))
    return [
        *pool.base,
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-L",
        f"127.0.0.1:{local}:127.0.0.1:{remote}",
        "--",
        host,
    ]
