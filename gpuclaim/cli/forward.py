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
) -> None:
    """Forward a service's port to this machine until Ctrl-C (prints its local URL)."""
    from gpuclaim.node.runner import port_in_use

    st = state(ctx)
    job = _service_named(st, name)
    assert job.service is not None
    node = st.config.node(job.ranks[0].node)
    remote_port = job.service.port
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
