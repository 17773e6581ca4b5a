"""Housekeeping: ``gc``, ``drain`` and ``undrain``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import out, print_json, quiet_option, state, waiting
from gpuclaim.core.errors import ExitCode
from gpuclaim.core.states import FaceState

if TYPE_CHECKING:
    from gpuclaim.engine.bookings import EndedDropped

# drain/undrain --json: whether the node is drained (its free GPUs show that face).
DRAINED_FIELD = FaceState.DRAINED.value


def gc(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print what was collected as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Remove expired and abandoned claims; set damaged claim files aside."""
    from gpuclaim.engine.bookings import drop_old_bookings
    from gpuclaim.engine.claims import collect_garbage
    from gpuclaim.engine.job_records import archive_finished, load_jobs
    from gpuclaim.engine.sync import prune_copies

    st = state(ctx)
    report = collect_garbage(st.store, st.user, st.prober, st.config)
    st.dispatch_quietly()
    archived = archive_finished(st.store, load_jobs(st.store))  # every one a day old
    # your --sync copies on the nodes, once their jobs ended [run] keep_copies ago
    every_job = load_jobs(st.store, archived=True)
    copies = prune_copies(st.config, st.ops, every_job, st.user, st.store.now())
    bookings = drop_old_bookings(st.config, st.store)  # ended [defaults] keep_reservations ago
    if quiet:
        return
    if as_json:
        print_json(
            {
                "expired": [c.to_dict() for c in report.expired],
                "incomplete": [c.to_dict() for c in report.incomplete],
                "corrupt": report.corrupt,
                "lost_jobs": report.lost_jobs,
                "requeued": report.requeued,
                "sync_copies_removed": copies,
                "jobs_archived": archived,
                "bookings_dropped": bookings.dropped,
                "damaged_bookings": list(bookings.damaged),
                "bookings_left": [{"file": f, "why": why} for f, why in bookings.left],
            }
        )
        return
    console = out()
    for node_name, count in copies.items():
        if count:
            console.print(f"Removed {count} old --sync copies of yours on {node_name}")
    for c in report.expired:
        console.print(f"Expired: {c.node} GPU {','.join(c.labels)} of {c.user} ({c.id})")
    for c in report.incomplete:
        console.print(f"Abandoned half-made claim {c.id} of {c.user} on {c.node}: removed")
    for name in report.lost_jobs:
        console.print(f"Job {name}: its node or wrapper went away; recorded as lost")
    for name in report.requeued:
        console.print(f"Job {name}: queued but missing from the queue (its writer died); put back")
    if archived:
        records = "record that" if archived == 1 else "records that"
        console.print(f"Archived {archived} job {records} ended over a day ago")
    for u in report.corrupt:
        console.print(f"Damaged claim file for GPU {u}: moved to {st.store.root / 'corrupt'}")
    _print_bookings_dropped(console, bookings, st.config.limits.keep_reservations_s, st.store.root)
    if not (
        report.expired
        or report.incomplete
        or report.corrupt
        or report.lost_jobs
        or archived
        or bookings.dropped
        or bookings.damaged
        or bookings.left
    ):
        console.print("Nothing to collect.")


def _print_bookings_dropped(
    console: Any, bookings: EndedDropped, keep_s: float, root: Path
) -> None:
    from gpuclaim.core.durations import format_duration

    if bookings.dropped:
        plural = "booking that" if bookings.dropped == 1 else "bookings that"
        console.print(
            f"Dropped {bookings.dropped} {plural} ended over {format_duration(keep_s)} ago"
            " (keep_reservations)"
        )
    for name in bookings.damaged:
        where = f"reservations/ended/{name}"
        console.print(
            f"Damaged ended booking file {where}: moved to {root / 'corrupt'}", markup=False
        )
    for name, why in bookings.left:
        where = f"reservations/ended/{name}"
        console.print(f"Ended booking file {where} left as it is: {why}", markup=False)


def drain(
    ctx: typer.Context,
    node: str = typer.Argument(
        ...,
        metavar="NODE",
        help="The node to take out of service.",
        autocompletion=completion.complete_nodes,
    ),
    reason: str = typer.Option("", "--reason", help="Why (shown in status)."),
    as_json: bool = typer.Option(False, "--json", help="Print the node's drain state as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Stop new claims on NODE (existing claims stay until released)."""
    from gpuclaim.engine.claims import drain_node

    st = state(ctx)
    drain_node(st.config, st.store, st.user, node, reason)
    if quiet:
        return
    if as_json:
        print_json({"node": node, DRAINED_FIELD: True, "reason": reason, "user": st.user})
        return
    out().print(f"{node} drained: no new claims there until 'gpuclaim undrain {node}'.")


def undrain(
    ctx: typer.Context,
    node: str = typer.Argument(
        ..., metavar="NODE", help="The node.", autocompletion=completion.complete_nodes
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the node's drain state as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Allow new claims on NODE again."""
    from gpuclaim.engine.claims import undrain_node

    st = state(ctx)
    was_drained = undrain_node(st.config, st.store, st.user, node)
    if quiet:
        return
    if as_json:
        print_json({"node": node, DRAINED_FIELD: False, "was_drained": was_drained})
    elif was_drained:
        out().print(f"{node} is open for claims again.")
    else:
        out().print(f"{node} was not drained.")


def doctor(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
) -> None:
    """Check every node: SSH, python3, tmux, GPUs and driver, storage, clock, agent."""
    from gpuclaim.app.doctor import run_doctor, store_problems
    from gpuclaim.cli import render

    st = state(ctx, looking=True)
    with waiting(f"checking {len(st.config.nodes)} node(s)"):
        report = run_doctor(st.config, st.store, st.prober)
        stored = store_problems(st.store)
    slack: list[tuple[str, str]] = []
    if st.config.slack.webhook_url:
        from gpuclaim.engine.notify import slack_problems

        slack = slack_problems(st.store.notify_state())
    if as_json:
        print_json([h.to_dict() for h in report])
    else:
        console = out()
        console.print(render.doctor_table(report))
        for h in report:
            for problem, fix in h.problems:
                console.print(f"[red]{h.node}[/red]: {problem}\n    fix: {fix}")
        for problem, fix in slack:
            console.print(f"[red]slack[/red]: {problem}\n    fix: {fix}")
        for problem, fix in stored:
            from rich.markup import escape

            console.print(f"[red]store[/red]: {escape(problem)}\n    fix: {escape(fix)}")
        advice = _slurm_advice(st, report)
        if advice:
            console.print(advice)
        if not any(h.problems for h in report) and not stored:
            console.print("All nodes look good.")
    if any(not h.reachable for h in report):
        raise typer.Exit(ExitCode.UNREACHABLE)
    if any(h.problems for h in report) or slack or stored:
        raise typer.Exit(ExitCode.ERROR)


def _slurm_advice(st: Any, report: Any) -> Optional[str]:
    """Whether the team has outgrown gpuclaim: GPUs seen, users of the last 30 days, waits."""
    from gpuclaim.app.slurm import queue_waits, slurm_advice
    from gpuclaim.engine.job_records import load_jobs

    now = st.store.now()
    since = now - 30 * 86400
    events, _ = st.store.read_events()
    users = {e.user for e in events if e.ts >= since and e.user}
    gpus = sum(h.gpus for h in report)
    waits = queue_waits(load_jobs(st.store, archived=True), since=since, now=now)
    return slurm_advice(gpus=gpus, users=len(users), queue_waits_s=waits)
