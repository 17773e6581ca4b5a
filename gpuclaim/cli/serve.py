"""``serve``: a service next to the batch jobs, kept up by its wrapper with no daemon."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from gpuclaim.cli import run_flags as flags
from gpuclaim.cli.common import out, state
from gpuclaim.cli.files import typed_in
from gpuclaim.core.durations import format_duration, parse_duration
from gpuclaim.core.errors import GpuclaimError, UsageError
from gpuclaim.core.service import RestartPolicy, ServiceSpec

MAX_PORT = 65535


Name = Annotated[
    str, typer.Option("--name", help="The service's name (kill, logs, forward use it).")
]
Port = Annotated[
    str,
    typer.Option("--port", metavar="PORT|auto", help="Its port on the node: a number, or auto."),
]
Health = Annotated[
    Optional[str],
    typer.Option(
        "--health",
        metavar="PATH",
        help="Health check: GET http://127.0.0.1:PORT/PATH (default: a TCP connect).",
    ),
]
HealthInterval = Annotated[
    str, typer.Option("--health-interval", metavar="DUR", help="How often it is checked.")
]
HealthStart = Annotated[
    str,
    typer.Option("--health-start", metavar="DUR", help="How long it may take to answer first."),
]
Restart = Annotated[
    RestartPolicy, typer.Option("--restart", help="When it is started again after it exited.")
]
MaxRestarts = Annotated[
    int,
    typer.Option(
        "--max-restarts", min=1, metavar="K", help="Give up after K restarts in 10 minutes."
    ),
]
IdleRelease = Annotated[
    bool, typer.Option("--idle-release", help="Let the idle policy release it (never, by default).")
]


def serve(
    ctx: typer.Context,
    command: flags.Command,
    name: Name,
    count: flags.Count = None,
    node: flags.Node = None,
    gpu: flags.Gpu = None,
    port: Port = "auto",
    health: Health = None,
    health_interval: HealthInterval = "10s",
    health_start: HealthStart = "10m",
    restart: Restart = RestartPolicy.ON_FAILURE,
    max_restarts: MaxRestarts = 10,
    time_: flags.TimeLimit = None,
    idle_release: IdleRelease = False,
    workdir: flags.Workdir = None,
    venv: flags.Venv = None,
    conda: flags.Conda = None,
    sync: flags.Sync = None,
    sync_dir: flags.SyncDir = None,
    env: flags.Env = None,
    gpu_mem: flags.GpuMem = None,
    gpu_share: flags.GpuShare = None,
    mig: flags.Mig = None,
    ray: flags.Ray = False,
    ray_cpus: flags.RayCpus = None,
    as_json: flags.AsJson = False,
    quiet: flags.Quiet = False,
) -> None:
    """Serve: a command that stays up, restarted when it dies or stops answering, on
    claimed GPUs with a port (exit 3 if no GPUs are free, 5 if the port is taken)."""
    from dataclasses import replace

    from gpuclaim.app.project import find_project
    from gpuclaim.cli.jobs import _submit_and_report
    from gpuclaim.core.model import JobKind

    spec = ServiceSpec(
        port=_port(port),
        health_path=_health_path(health),
        health_interval_s=_positive(health_interval, "--health-interval"),
        health_start_s=_positive(health_start, "--health-start"),
        restart=restart.value,
        max_restarts=max_restarts,
        idle_release=idle_release,
    )
    given = flags.RunFlags(
        command=command,
        count=count,
        node=node,
        gpu=gpu,
        name=name,
        time_=time_,
        workdir=workdir,
        venv=venv,
        conda=conda,
        sync=sync,
        sync_dir=sync_dir,
        env=env,
        gpu_mem=gpu_mem,
        gpu_share=gpu_share,
        mig=mig,
        ray=ray,
        ray_cpus=ray_cpus,
        as_json=as_json,
        quiet=quiet,
    )
    given.check()
    here = typed_in()
    st = state(ctx)
    req = flags.run_request(st, given, find_project(here), here)
    req = replace(req, kind=JobKind.SERVICE.value, service=spec)
    job = _submit_and_report(st, req, wait=False, as_json=as_json, quiet=True)
    if not (as_json or quiet):
        _say_serving(job, spec)


def _say_serving(job: Any, spec: ServiceSpec) -> None:
    node_name = job.ranks[0].node if job.ranks else "?"
    check = f"GET {spec.health_path}" if spec.health_path else "a TCP connect"
    out().print(
        f"Serving {job.name} on {node_name} GPU {','.join(map(str, job.ranks[0].gpus))}: "
        f"{job.service.url(node_name)}\n"
        f"  health: {check} every {format_duration(spec.health_interval_s)}; restarts "
        f"{spec.restart}, at most {spec.max_restarts} in 10 minutes\n"
        f"  gpuclaim jobs --json · gpuclaim logs {job.name} -f · gpuclaim kill {job.name}",
        markup=False,
        highlight=False,
    )


def _port(text: str) -> int:
    if text.strip().lower() == "auto":
        return 0
    try:
        port = int(text)
    except ValueError:
        raise UsageError(f"--port wants a number or auto, not {text!r}") from None
    if not 1 <= port <= MAX_PORT:
        raise UsageError(f"--port must be from 1 to {MAX_PORT}, not {port}")
    return port


def _health_path(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    path = text.strip()
    if not path or any(ch.isspace() or not ch.isprintable() for ch in path):
        raise UsageError(f"--health wants a URL path like /health, not {text!r}")
    return path if path.startswith("/") else "/" + path


def _positive(text: str, flag: str) -> float:
    try:
        seconds = parse_duration(text)
    except GpuclaimError as exc:
        raise UsageError(f"{flag}: {exc.message}") from None
    if seconds <= 0:
        raise UsageError(f"{flag} must be longer than 0")
    return seconds
