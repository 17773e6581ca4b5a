"""``shell`` and ``notebook``: interactive sessions on claimed GPUs, time-limited."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

import typer

from gpuclaim.app.hostlists import one_node
from gpuclaim.cli import completion
from gpuclaim.cli import run_flags as flags
from gpuclaim.cli.common import out, print_json, state
from gpuclaim.cli.jobs import _exec_outside_tmux, _submit_and_report
from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.model import JobKind
from gpuclaim.core.states import started


def shell(
    ctx: typer.Context,
    count: int = typer.Option(1, "-n", "--count", min=1, help="GPUs."),
    node: Optional[str] = typer.Option(
        None, "--node", help="On this node.", autocompletion=completion.complete_nodes
    ),
    time_: str = typer.Option("4h", "--time", "-t", help="Time limit (required to be finite)."),
    name: Optional[str] = typer.Option(None, "--name", help="Session name."),
    gpu_mem: flags.GpuMem = None,
    gpu_share: flags.GpuShare = None,
    mig: flags.Mig = None,
    as_json: bool = typer.Option(
        False, "--json", help="Print the job as JSON (and attach later: gpuclaim attach NAME)."
    ),
) -> None:
    """An interactive shell on a node with GPUs pinned; it ends at its time limit."""
    from gpuclaim.engine.jobs import RunRequest

    st = state(ctx)
    req = RunRequest(
        user=st.user,
        argv=("<shell>",),
        name=name or f"shell-{os.urandom(2).hex()}",
        count=count,
        node=one_node(node),
        time_s=parse_duration(time_),
        kind=JobKind.SHELL.value,
        **_share(gpu_mem, gpu_share),
        mig=flags.mig_asked(mig),
    )
    job = _submit_and_report(st, req, wait=False, as_json=as_json)
    if sys.stdin.isatty() and sys.stdout.isatty() and not as_json:
        from gpuclaim.remote.channels import attach_command

        argv = attach_command(st.config, job.ranks[0].node, job.session)
        _exec_outside_tmux(argv)


def notebook(
    ctx: typer.Context,
    count: int = typer.Option(1, "-n", "--count", min=1, help="GPUs."),
    node: Optional[str] = typer.Option(
        None, "--node", help="On this node.", autocompletion=completion.complete_nodes
    ),
    time_: str = typer.Option("4h", "--time", "-t", help="Time limit (required to be finite)."),
    name: Optional[str] = typer.Option(None, "--name", help="Job name."),
    gpu_mem: flags.GpuMem = None,
    gpu_share: flags.GpuShare = None,
    mig: flags.Mig = None,
    as_json: bool = typer.Option(
        False, "--json", help="Print the job, its port and the tunnel command as JSON."
    ),
) -> None:
    """Jupyter on a node with GPUs pinned, until its time limit; prints the ssh tunnel."""
    from gpuclaim.engine.job_records import find_job
    from gpuclaim.engine.jobs import RunRequest

    st = state(ctx)
    req = RunRequest(
        user=st.user,
        argv=("<notebook>",),
        name=name or f"notebook-{os.urandom(2).hex()}",
        count=count,
        node=one_node(node),
        time_s=parse_duration(time_),
        kind=JobKind.NOTEBOOK.value,
        **_share(gpu_mem, gpu_share),
        mig=flags.mig_asked(mig),
    )
    job = _submit_and_report(st, req, wait=False, as_json=False, quiet=as_json)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = find_job(st.store, st.user, job.id, active_only=False)
        if job.port or not started(job.state):
            break
        time.sleep(0.5)
    if not started(job.state):
        raise GpuclaimError(f"the notebook did not start: {job.reason or job.state}")
    import shlex

    from gpuclaim.remote.ssh import config_for_ssh_binary

    host = st.config.node(job.ranks[0].node).host
    config_file = config_for_ssh_binary(st.config.ssh_config_path)
    with_file = f"-F {shlex.quote(str(config_file))} " if config_file else ""
    tunnel = f"ssh {with_file}-N -L {job.port}:localhost:{job.port} {host}"
    if as_json:
        print_json({**job.to_dict(), "tunnel": tunnel})
        return
    out().print(
        f"Jupyter on {job.ranks[0].node}:{job.port}. Open a tunnel and browse:\n"
        f"  {tunnel}\n"
        f"  http://localhost:{job.port}/  (token: gpuclaim logs {job.name})"
    )


def _share(gpu_mem: Optional[str], gpu_share: Optional[str]) -> dict[str, Any]:
    """A session on part of one GPU (``--gpu-mem``/``--gpu-share``), as ``run`` takes it."""
    mem, part = flags.share_asked(gpu_mem, gpu_share)
    return {"gpu_mem_mib": mem, "gpu_share": part}
