"""``claim``, ``release`` and ``extend``: one's own hold on GPUs."""

from __future__ import annotations

from typing import Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli import run_flags as flags
from gpuclaim.cli.common import out, print_json, quiet_option, say_on_stderr, state, waiting
from gpuclaim.core.durations import format_duration, parse_duration
from gpuclaim.core.errors import UsageError
from gpuclaim.core.identity import clean_note

SHORT_HELP = (
    "Print only the GPU indices, for CUDA_VISIBLE_DEVICES=$(...) on the node itself"
    " (NODE:I,J when the GPUs are on another machine)."
)


def claim(
    ctx: typer.Context,
    count: Optional[int] = typer.Option(None, "-n", "--count", min=1, help="How many GPUs."),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", metavar="NODE:I,J", help="Exactly these GPUs, e.g. node01:0,2."
    ),
    node: Optional[str] = typer.Option(
        None, "--node", help="Only on this node.", autocompletion=completion.complete_nodes
    ),
    time: Optional[str] = typer.Option(
        None, "--time", "-t", help="How long: 90m, 4h, 2d, 1-12:00:00 (default from config)."
    ),
    note: str = typer.Option("", "--note", help="What it is for, shown to everyone."),
    adopt: bool = typer.Option(
        False, "--adopt", help="Claim the GPUs your own already-running processes use."
    ),
    reservation: Optional[str] = typer.Option(
        None,
        "--reservation",
        metavar="ID",
        help="Exactly the GPUs of your booking ID.",
        autocompletion=completion.complete_reservations,
    ),
    gpu_mem: flags.GpuMem = None,
    gpu_share: flags.GpuShare = None,
    mig: flags.Mig = None,
    short: bool = typer.Option(False, "--short", help=SHORT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the claim as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Claim GPUs (exit 3 if nothing fits now). GPUs that preemptible jobs hold count as
    free: they are asked to yield, and the claim waits for them (at most the grace)."""
    from gpuclaim.cli.render import claim_lines
    from gpuclaim.engine.claims import claim_gpus, parse_gpu_spec
    from gpuclaim.engine.placement import ClaimRequest

    if sum(x is not None and x is not False for x in (count, gpu, adopt or None, reservation)) > 1:
        raise UsageError("use one of -n, --gpu, --adopt and --reservation")
    if reservation and node:
        raise UsageError("--reservation names its node already")
    from gpuclaim.app.hostlists import one_node

    node = one_node(node)
    st = state(ctx)
    exact = (parse_gpu_spec(gpu),) if gpu else ()
    if exact and node and exact[0][0] != node:
        raise UsageError("--node and --gpu name different nodes")
    mem, part = flags.share_asked(gpu_mem, gpu_share)
    if mig is not None and (gpu or adopt or reservation):
        raise UsageError("--mig picks slices: not with --gpu, --adopt or --reservation")
    req = ClaimRequest(
        user=st.user,
        count=count or (0 if reservation else 1),
        node=node,
        exact=exact,
        duration_s=parse_duration(time) if time else None,
        note=clean_note(note),
        adopt=adopt,
        reservation=reservation,
        gpu_mem_mib=mem,
        gpu_share=part,
        mig=flags.mig_asked(mig),
    )
    with waiting("looking for free GPUs", quiet):
        result = claim_gpus(st.config, st.store, req, st.prober, say=say_on_stderr(quiet))
    completion.remember(st.config.path, add={"claims": [completion.claim_item(result)]})
    if quiet:
        return
    if as_json:
        print_json(result.to_dict())
    elif short:  # CUDA_VISIBLE_DEVICES on the node itself; elsewhere NODE:GPUS, as --gpu
        here = st.config.node(result.node).is_this_machine()
        typer.echo(result.visible if here else f"{result.node}:{','.join(result.labels)}")
    else:
        for line in claim_lines(result):
            out().print(line)


def release(
    ctx: typer.Context,
    claim_ids: Optional[list[str]] = typer.Argument(
        None,
        metavar="[CLAIM_ID]...",
        show_default=False,
        autocompletion=completion.complete_claims,
    ),
    gpu: Optional[list[str]] = typer.Option(None, "--gpu", metavar="NODE:I,J", help="By GPU."),
    release_all: bool = typer.Option(False, "--all", help="All of your claims."),
    force: bool = typer.Option(False, "--force", help="Release another user's claim (logged)."),
    as_json: bool = typer.Option(False, "--json", help="Print the released claims as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Release claims: your own, or another user's with --force."""
    from gpuclaim.engine.claims import job_claims_of, parse_gpu_specs, release_claims

    st = state(ctx)
    specs = parse_gpu_specs(gpu or ())
    released = release_claims(
        st.config, st.store, st.user, claim_ids or (), specs, release_all, force
    )
    completion.remember(st.config.path, remove={"claims": [c.id for c in released]})
    st.dispatch_quietly()  # the freed GPUs may be what a queued job waits for
    if quiet:
        return
    if as_json:
        print_json([c.to_dict() for c in released])
        return
    for c in released:
        whose = "" if c.user == st.user else f" (held by {c.user})"
        out().print(f"Released {c.node} GPU {','.join(c.labels)}, claim {c.id}{whose}.")
    if release_all:
        for c, job in job_claims_of(st.store, st.user):
            out().print(
                f"Kept {c.node} GPU {','.join(c.labels)}: the running job {job} holds "
                f"it (it is released when the job ends; stop it with 'gpuclaim kill {job}')."
            )
    if not released:
        out().print("Nothing to release: those claims were already gone.")


def extend(
    ctx: typer.Context,
    targets: Optional[list[str]] = typer.Argument(
        None,
        metavar="[CLAIM_ID|JOB]...",
        show_default=False,
        autocompletion=completion.complete_claims,
    ),
    time: str = typer.Option(..., "--time", "-t", help="How much longer: 30m, 2h, 1d."),
    extend_all: bool = typer.Option(False, "--all", help="All of your claims (and their jobs)."),
    as_json: bool = typer.Option(False, "--json", help="Print the extended claims as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Give your own claim or job (a service's --time too) more time, within the cluster's
    limit: a job's claims move with its time limit."""
    from gpuclaim.engine.extend import extend_claims

    st = state(ctx)
    done = extend_claims(
        st.config, st.store, st.user, targets or (), parse_duration(time), extend_all
    )
    if quiet:
        return
    if as_json:
        print_json([c.to_dict() for c in done.claims])
        return
    now = st.store.now()
    for job in done.jobs:
        if job.ends is not None:
            out().print(f"Job {job.name} now ends in {format_duration(job.ends - now)}.")
        else:
            out().print(
                f"Job {job.name} now has {format_duration(job.time_limit_s)} when it starts."
            )
    for c in done.claims:
        if not c.job:
            out().print(f"Claim {c.id} now ends in {format_duration(c.expires - now)}.")
