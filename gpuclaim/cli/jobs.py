"""``run``, ``jobs``, ``logs``, ``attach``, ``kill``."""

from __future__ import annotations

import os
import shlex
import sys
import time
from typing import Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli import run_flags as flags
from gpuclaim.cli.common import (
    AppState,
    err,
    out,
    print_json,
    quiet_option,
    say_on_stderr,
    state,
    waiting,
)
from gpuclaim.cli.files import typed_in
from gpuclaim.cli.follow import FirstRead, flush_stdout, follow_log, write_out
from gpuclaim.core.errors import ExitCode, GpuclaimError, UsageError
from gpuclaim.core.model import JobKind
from gpuclaim.core.states import JobState, started


def run(
    ctx: typer.Context,
    command: flags.Command,
    count: flags.Count = None,
    nodes: flags.Nodes = None,
    node: flags.Node = None,
    gpu: flags.Gpu = None,
    name: flags.Name = None,
    time_: flags.TimeLimit = None,
    workdir: flags.Workdir = None,
    venv: flags.Venv = None,
    conda: flags.Conda = None,
    sync: flags.Sync = None,
    sync_dir: flags.SyncDir = None,
    env: flags.Env = None,
    uuids: flags.Uuids = False,
    queue: flags.Queue = False,
    wait: flags.Wait = False,
    follow: flags.Follow = False,
    array: flags.Array = None,
    sweep: flags.Sweep = None,
    max_running: flags.MaxRunning = None,
    after: flags.After = None,
    after_any: flags.AfterAny = None,
    reservation: flags.Reservation = None,
    nice: flags.Nice = 0,
    begin: flags.Begin = None,
    preemptible: flags.Preemptible = False,
    requeue: flags.Requeue = False,
    preempt_signal: flags.PreemptSignal = None,
    gpu_mem: flags.GpuMem = None,
    gpu_share: flags.GpuShare = None,
    mig: flags.Mig = None,
    ray: flags.Ray = False,
    ray_cpus: flags.RayCpus = None,
    as_json: flags.AsJson = False,
    quiet: flags.Quiet = False,
) -> None:
    """Run a command on claimed GPUs in a tmux session on a node (exit 3 if none are free,
    1 if it dies at once; with --follow, the job's own exit code)."""
    given = {key: value for key, value in locals().items() if key != "ctx"}
    _run(ctx, flags.RunFlags(**given))


def _run(ctx: typer.Context, given: flags.RunFlags) -> None:
    from gpuclaim.app.project import find_project

    given.check()
    here = typed_in()
    project = find_project(here)  # gpuclaim.toml or [tool.gpuclaim]: below the flags
    st = state(ctx)
    req = flags.run_request(st, given, project, here)
    if given.many:
        from gpuclaim.cli.arrays import array_request, submit_and_report

        request = array_request(req, given.array, given.sweep, given.max_running)
        submit_and_report(st, request, given.as_json, given.quiet)
        return
    first = FirstRead(st) if given.follow else None
    job = _submit_and_report(
        st, req, given.wait or given.follow, given.as_json, given.quiet, first=first
    )
    if first is not None:
        raise typer.Exit(follow_log(st, job, 0, 0, given.quiet, first))


def _submit_and_report(
    st: AppState,
    req: Any,
    wait: bool,
    as_json: bool,
    quiet: bool = False,
    first: Optional[FirstRead] = None,
) -> Any:
    """Start (or queue) the job and say so. A batch job is watched through its first moment
    (at most FIRST_MOMENT_S): one that dies at once is reported with its exit code and the
    end of its log, exit 1, not as started. With ``first`` the caller follows it instead,
    and its first read of the log starts before anything is said."""
    follow = first is not None
    from gpuclaim.engine.job_watch import ended_badly_at_once, watch_first_moment
    from gpuclaim.engine.jobs import submit_job

    with waiting("starting the job", quiet):
        job = submit_job(st.config, st.store, req, st.prober, st.ops, say=say_on_stderr(quiet))
    if first is not None:
        first.start(job)  # a job that started: its log is read while we say so
    if not quiet:
        _say_where_it_runs(job)
    completion.remember(st.config.path, add={"jobs": [completion.job_item(job.to_dict())]})
    if wait and job.state == JobState.QUEUED:
        job = _wait_until_started(st, job, quiet)
    if req.kind == JobKind.BATCH and started(job.state) and not follow:
        with waiting("starting the job", quiet):
            job = watch_first_moment(st.store, job)
    bad = ended_badly_at_once(job)  # failed, killed, ... or never ran: not "Started"
    if as_json:
        print_json(job.to_dict())
    elif not quiet and not bad:
        _print_job_started(job, hints=not follow)
    if bad:
        _say_early_end(st, job)
        raise typer.Exit(ExitCode.ERROR)
    return job


def _say_where_it_runs(job: Any) -> None:
    """One line when the job does not run in the directory ``run`` was typed in because its
    node has no such directory (no shared home there; ``--sync`` copies it)."""
    if job.workdir or not job.cwd:
        return
    for r in job.ranks:
        if r.workdir and r.workdir != job.cwd:
            said = f"note: {job.cwd} is not a directory on {r.node}: the job runs in {r.workdir}"
            err().print(said, markup=False, highlight=False)


def _say_early_end(st: AppState, job: Any) -> None:
    """``gpuclaim: error: job X failed at once on node01 (exit code 2); the end of its log:``
    and those lines, indented: what a user needs instead of 'Started'. One that never ran:
    ``gpuclaim: error: job X never ran: prep failed``."""
    from gpuclaim.core.states import ended, never_ran
    from gpuclaim.engine.job_watch import exit_code_of, first_bad_rank, never_ran_line

    if never_ran(job.state):
        flush_stdout()  # after --json's job, in order
        sys.stderr.write(f"gpuclaim: error: {never_ran_line(job)}\n")
        return
    rank = first_bad_rank(job) or (job.ranks[0] if job.ranks else None)
    own = job.reason if job.reason and not job.reason.startswith("exit status") else ""
    if rank is None:  # it never got a node (taken out of the queue while we waited)
        said = f"job {job.name} was {job.state}" + (f": {own}" if own else "")
        sys.stderr.write(f"gpuclaim: error: {said}\n")
        return
    where = f" on {rank.node}" + (f" (rank {rank.rank})" if len(job.ranks) > 1 else "")
    code = exit_code_of(job) if ended(job.state) else (rank.exit_code or 1)
    if rank.state == JobState.FAILED and rank.exit_code is None:
        if f" on {rank.node}" in own and len(job.ranks) == 1:
            where = ""  # the reason names the node: 'workdir /x does not exist on node01'
        head = f"job {job.name} could not start{where}: {own or 'see its log'}"
    elif rank.state == JobState.FAILED:
        head = f"job {job.name} failed at once{where} (exit code {code})"
        head += f": {own}" if own else ""
    else:
        head = f"job {job.name} ended at once{where}: {rank.state} (exit code {code})"
    tail = [line for line in _log_tail(st, rank, 10) if line.strip() and line != f"gpuclaim: {own}"]
    flush_stdout()
    sys.stderr.write(f"gpuclaim: error: {head}" + ("; the end of its log:\n" if tail else "\n"))
    sys.stderr.write("".join(f"  {line}\n" for line in tail))
    sys.stderr.flush()


def _log_tail(st: AppState, rank: Any, lines: int) -> list[str]:
    if not rank.log:
        return []
    try:
        chunk = st.ops.read_log(st.config.node(rank.node), rank.log, tail=lines)
    except GpuclaimError:
        return []
    return str(chunk["data"]).splitlines()


def _wait_until_started(st: AppState, job: Any, quiet: bool = False) -> Any:
    from gpuclaim.engine.dispatch import judge_queue
    from gpuclaim.engine.job_records import find_job

    console = err()
    live = console.is_terminal and not quiet
    status_ctx = console.status("waiting in the queue") if live else None
    last_position = None
    try:
        if status_ctx is not None:
            status_ctx.__enter__()
        while True:
            report = judge_queue(st.config, st.store, st.prober, st.ops, every=True)
            job = find_job(st.store, job.user, job.id, active_only=False)
            if job.state != JobState.QUEUED:
                return job
            verdict = report.verdicts.get(job.id)
            position = (verdict.position, verdict.reason) if verdict else None
            if position != last_position and verdict is not None:
                text = f"{job.name}: waiting in the queue, position {verdict.position}"
                if verdict.reason is not None:
                    text += f" ({verdict.reason.line})"
                if status_ctx is not None:
                    status_ctx.update(text)
                elif not quiet:
                    console.print(text)
                last_position = position
            time.sleep(2.0)
    except KeyboardInterrupt:
        console.print(f"still queued: {job.name} (gpuclaim kill {job.name} to remove it)")
        raise typer.Exit(130) from None
    finally:
        if status_ctx is not None:
            status_ctx.__exit__(None, None, None)


def _print_job_started(job: Any, hints: bool = True) -> None:
    """On stdout; with ``hints`` off (run --follow, whose stdout is the job's) on stderr."""
    console = out() if hints else err()
    if job.state == JobState.QUEUED and job.after:
        names = ", ".join(d.name for d in job.after)
        console.print(f"Queued {job.name}: it starts after {names} (gpuclaim jobs).")
        return
    if job.state == JobState.QUEUED and job.begin and job.begin > time.time():
        from gpuclaim.core.when import format_when

        when = format_when(job.begin, time.time())
        console.print(f"Queued {job.name}: it starts {when} or later, when GPUs are free.")
        return
    if job.state == JobState.QUEUED:
        console.print(f"Queued {job.name}: it starts when its GPUs are free (gpuclaim jobs).")
        return
    where = "; ".join(f"{r.node} GPU {','.join(map(str, r.gpus))}" for r in job.ranks)
    if job.state == JobState.SUCCEEDED:  # it was done within its first moment
        console.print(f"Ran {job.name} on {where}: it succeeded at once.")
        if hints:
            console.print(f"  logs:   gpuclaim logs {job.name}")
        return
    console.print(f"Started {job.name} on {where} ({job.state}), tmux session {job.session}.")
    if job.synced:
        from gpuclaim.core.durations import format_bytes

        copied = job.synced
        console.print(
            f"  copied: {copied['files']} files ({format_bytes(copied['bytes'])}) of "
            f"{job.synced_from} in {copied['seconds']:.1f}s, to {job.workdir}",
            markup=False,
            highlight=False,
        )
    if hints:
        console.print(f"  logs:   gpuclaim logs {job.name} -f")
        console.print(f"  attach: gpuclaim attach {job.name}")


def jobs(
    ctx: typer.Context,
    show_all: bool = typer.Option(False, "--all", help="Include ended jobs of everyone."),
    tasks: bool = typer.Option(False, "--tasks", help="Every task of an array, one per line."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every task of an array)."),
    explain: Optional[str] = typer.Option(
        None,
        "--explain",
        metavar="NAME",
        help="Why queued job NAME waits: its priority, reason and expected start.",
        autocompletion=completion.complete_jobs,
    ),
) -> None:
    """List jobs: running and queued ones of everyone (queued ones in the order they will
    start, with why they wait), and your recent ones."""
    from gpuclaim.cli.job_rows import job_row, visible
    from gpuclaim.cli.render import jobs_table
    from gpuclaim.engine.job_records import load_jobs

    st = state(ctx, looking=True)
    if explain is not None:
        from gpuclaim.cli.explain import explain_job

        explain_job(st, explain, as_json)
        return
    if not (show_all or as_json or tasks):
        _default_table(st)
        return
    report = st.dispatch_quietly(every=True)
    verdicts = report.verdicts if report is not None else {}
    store = st.store
    snap = store.snapshot()
    day_ago = snap.now - 86400
    rows = [
        job_row(j, snap, verdicts)
        for j in load_jobs(store, archived=show_all)
        if show_all or visible(j, st.user, day_ago)
    ]
    # the queued ones last, in the order they will start
    rows.sort(key=lambda d: (d["queue_position"] is not None, d["queue_position"] or 0))
    _remember(st, rows)
    if as_json:
        print_json(rows)
    else:
        from gpuclaim.cli.arrays import grouped_rows

        out().print(jobs_table(rows if tasks else grouped_rows(rows), snap.now))


def _default_table(st: AppState) -> None:
    """One row an array, the first queued jobs of others (a count for the rest): read from
    the records it shows, the queue's entries and the arrays' summaries."""
    from gpuclaim.cli.arrays import grouped_rows
    from gpuclaim.cli.job_rows import hidden_line, listing_rows
    from gpuclaim.cli.render import jobs_table
    from gpuclaim.core.priority import parse_entry
    from gpuclaim.engine.dispatch import Explained
    from gpuclaim.engine.job_listing import QUEUED_SHOWN, live_listing

    report = st.dispatch_quietly(every=Explained(st.user, QUEUED_SHOWN))
    verdicts = report.verdicts if report is not None else {}
    snap = st.store.snapshot()
    entries = [e for e in map(parse_entry, st.store.queue_entries()) if e is not None]
    entries = list({e.job_id: e for e in entries}.values())  # one per job (gc may add a second)
    if verdicts:  # in the order they will start; one started meanwhile is no longer queued
        entries = sorted(
            (e for e in entries if e.job_id in verdicts), key=lambda e: verdicts[e.job_id].position
        )
    listing = live_listing(st.store, st.user, snap.now - 86400, entries)
    rows, ended_arrays = listing_rows(st.store, listing, snap, verdicts, st.user)
    _remember(st, rows + ended_arrays)
    console = out()
    console.print(jobs_table(ended_arrays + grouped_rows(rows), snap.now))
    if listing.hidden_queued:
        console.print(hidden_line(listing.hidden_queued), style="dim", markup=False)


def _remember(st: AppState, rows: list[dict[str, Any]]) -> None:
    completion.remember(
        st.config.path,
        # the running and queued ones, and the newest others: enough to complete a name
        replace={"jobs": [completion.job_item(d) for d in _worth_completing(rows)]},
        add={"users": [(str(d["user"]), "") for d in rows]},
    )


COMPLETED_JOBS = 200


def _worth_completing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from gpuclaim.core.states import ACTIVE_JOB_STATES

    live = [d for d in rows if d["state"] in ACTIVE_JOB_STATES]
    return live + [d for d in rows[-COMPLETED_JOBS:] if d["state"] not in ACTIVE_JOB_STATES]


def logs(
    ctx: typer.Context,
    name: str = typer.Argument(
        ..., metavar="NAME", help="Job name or id.", autocompletion=completion.complete_jobs
    ),
    follow: bool = typer.Option(
        False, "-f", "--follow", help="Keep printing until it ends; exit with its exit code."
    ),
    lines: int = typer.Option(50, "-n", "--lines", min=0, help="Last lines to show (0: all)."),
    rank: int = typer.Option(0, "--rank", min=0, help="Which node of a gang job."),
) -> None:
    """Show a job's output (from the log file on its node)."""

    from gpuclaim.core.states import never_ran
    from gpuclaim.engine.job_watch import never_ran_line

    st = state(ctx, looking=True)
    job = _find_one(st, name)
    if never_ran(job.state):  # no log, and never will be: why, exit 1 (as `run --wait` says)
        raise GpuclaimError(never_ran_line(job))
    if rank >= len(job.ranks) or not job.ranks[rank].log:
        raise GpuclaimError(f"job {job.name} has no log yet ({job.state})")
    r = job.ranks[rank]
    node = st.config.node(r.node)
    chunk = (
        st.ops.read_log(node, r.log or "", tail=lines)
        if lines
        else st.ops.read_log(node, r.log or "")
    )
    write_out(chunk["data"])
    if follow:
        raise typer.Exit(follow_log(st, job, rank, int(chunk["offset"])))


def attach(
    ctx: typer.Context,
    name: str = typer.Argument(
        ..., metavar="NAME", help="Job name or id.", autocompletion=completion.complete_jobs
    ),
    rank: int = typer.Option(0, "--rank", min=0, help="Which node of a gang job."),
    print_only: bool = typer.Option(
        False, "--print", help="Print the command it would run (one line) instead."
    ),
) -> None:
    """Attach to a job's tmux session (detach again with Ctrl-b d)."""
    from gpuclaim.remote.channels import attach_command

    st = state(ctx, looking=True)
    job = _find_one(st, name)
    if not started(job.state):
        raise GpuclaimError(f"job {job.name} is {job.state}; nothing to attach to")
    if rank >= len(job.ranks):
        ranks = f"{len(job.ranks)} rank" + ("s" if len(job.ranks) != 1 else "")
        raise UsageError(f"job {job.name} has {ranks}: --rank 0 to {len(job.ranks) - 1}")
    argv = attach_command(st.config, job.ranks[rank].node, job.session_of(rank))
    if print_only:
        # exactly what would run: from inside tmux, with TMUX unset (see _exec_outside_tmux)
        prefix = ["env", "-u", "TMUX"] if "TMUX" in os.environ else []
        out().print(shlex.join([*prefix, *argv]), markup=False, soft_wrap=True)
        return
    sys.stdout.flush()
    _exec_outside_tmux(argv)


def kill(
    ctx: typer.Context,
    name: str = typer.Argument(
        ..., metavar="NAME", help="Job name or id.", autocompletion=completion.complete_jobs
    ),
    force: bool = typer.Option(False, "--force", help="Another user's job (logged)."),
    as_json: bool = typer.Option(False, "--json", help="Print the job as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Stop a job on all its nodes (TERM, then KILL), or take it out of the queue."""
    from gpuclaim.cli.arrays import kill_array_by_name
    from gpuclaim.engine.jobs import kill_job

    st = state(ctx)
    if kill_array_by_name(st, name, force, as_json, quiet):
        return
    job = kill_job(
        st.config,
        st.store,
        st.user,
        name,
        st.ops,
        force=force,
        wait_s=st.config.limits.kill_grace_s + 15,
    )
    if quiet:
        return
    if as_json:
        print_json(job.to_dict())
    else:
        out().print(f"{job.name}: {job.state}.")


def _find_one(st: AppState, name: str) -> Any:
    """A job by name or id; an array's name says how to name one of its tasks."""
    from gpuclaim.cli.arrays import array_instead
    from gpuclaim.engine.job_records import find_job

    try:
        return find_job(st.store, st.user, name)
    except GpuclaimError as exc:
        raise array_instead(st, name, exc) from None


def _exec_outside_tmux(argv: list[str]) -> None:
    """Become the attaching client; from inside tmux, tmux refuses to nest unless TMUX is unset."""
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    os.execvpe(argv[0], argv, env)
