"""``run``, ``jobs``, ``logs``, ``attach``, ``kill``."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import AppState, err, out, print_json, quiet_option, state, waiting
from gpuclaim.cli.files import absolute_workdir, sync_request, typed_in
from gpuclaim.cli.follow import FirstRead, flush_stdout, follow_log, write_out
from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import ExitCode, GpuclaimError, UsageError


def run(
    ctx: typer.Context,
    command: list[str] = typer.Argument(..., metavar="-- CMD [ARG]...", show_default=False),
    count: Optional[int] = typer.Option(
        None, "-n", "--count", min=1, help="GPUs (per node) [default: 1, or the project's]."
    ),
    nodes: Optional[int] = typer.Option(
        None, "--nodes", min=1, help="Nodes, for a gang job (torchrun)."
    ),
    node: Optional[str] = typer.Option(
        None, "--node", help="Run on this node.", autocompletion=completion.complete_nodes
    ),
    name: Optional[str] = typer.Option(None, "--name", help="Job name (unique among yours)."),
    time_: Optional[str] = typer.Option(None, "--time", "-t", help="Time limit: 30m, 8h, 2d."),
    workdir: Optional[str] = typer.Option(
        None,
        "--workdir",
        "-C",
        help="Directory to run in (default: this one, if the node has it; else the home there).",
    ),
    venv: Optional[str] = typer.Option(
        None, "--venv", metavar="PATH", help="A Python venv on the node (relative: to the workdir)."
    ),
    conda: Optional[str] = typer.Option(
        None, "--conda", metavar="ENV", help="A conda env on the node (conda, mamba or micromamba)."
    ),
    sync: Optional[bool] = typer.Option(
        None,
        "--sync/--no-sync",
        help="Copy this directory to the job's nodes first, as .gitignore says; the job runs "
        "in its own copy. --no-sync: not even if the project file says sync = true.",
    ),
    sync_dir: Optional[str] = typer.Option(
        None, "--sync-dir", metavar="DIR", help="--sync, of DIR instead of this directory."
    ),
    env: Optional[list[str]] = typer.Option(None, "--env", "-e", metavar="K=V", help="Env var."),
    uuids: bool = typer.Option(False, "--uuid", help="CUDA_VISIBLE_DEVICES as GPU UUIDs."),
    queue: bool = typer.Option(False, "--queue", help="Queue it if the GPUs are busy; return."),
    wait: bool = typer.Option(False, "--wait", help="Queue it and wait until it starts."),
    follow: bool = typer.Option(
        False,
        "-f",
        "--follow",
        help="Then print its output until it ends; exit with its exit code.",
    ),
    array: Optional[str] = typer.Option(
        None,
        "--array",
        metavar="SPEC",
        help="One task per index, as SLURM writes it: 0-95, 1,3,5-7, 0-10:2; %K: at most K "
        "at once. Each task has GPUCLAIM_ARRAY_INDEX.",
    ),
    sweep: Optional[Path] = typer.Option(
        None,
        "--sweep",
        metavar="FILE",
        help="One task per line of FILE: its words (shell quoting) are added to the command.",
    ),
    max_running: Optional[int] = typer.Option(
        None, "--max-running", min=1, metavar="K", help="An array or sweep: at most K at once."
    ),
    after: Optional[list[str]] = typer.Option(
        None,
        "--after",
        metavar="NAME",
        help="Start once job or array NAME succeeded (repeatable); if it fails, this is cancelled.",
        autocompletion=completion.complete_jobs,
    ),
    after_any: Optional[list[str]] = typer.Option(
        None,
        "--after-any",
        metavar="NAME",
        help="Start once NAME ended, however it ended (repeatable).",
        autocompletion=completion.complete_jobs,
    ),
    reservation: Optional[str] = typer.Option(
        None,
        "--reservation",
        metavar="ID",
        help="On your booking's GPUs (all, or -n of them).",
        autocompletion=completion.complete_reservations,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the job as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Run a command on claimed GPUs in a tmux session on a node (exit 3 if none are free,
    1 if it dies at once; with --follow, the job's own exit code)."""
    from gpuclaim.engine.jobs import RunRequest

    if follow and as_json:
        raise UsageError("--follow prints the job's output, not JSON: use one of them")
    many = array is not None or sweep is not None
    if many and reservation:
        raise UsageError("--reservation is for one job: an array's tasks run wherever GPUs are")
    if many and (follow or wait):
        raise UsageError("an array's tasks start as GPUs free up: --follow/--wait one task")
    if max_running is not None and not many:
        raise UsageError("--max-running is for --array or --sweep")
    if (sync or sync_dir is not None) and workdir is not None:
        raise UsageError("--sync runs the job in its copy: --workdir cannot say otherwise")
    from gpuclaim.app.project import find_project

    here = typed_in()
    project = find_project(here)  # gpuclaim.toml or [tool.gpuclaim]: below the flags
    flagged_env = _parse_env(env or [])
    named = _non_empty(venv, "--venv"), _non_empty(conda, "--conda")
    st = state(ctx)
    req = RunRequest(
        user=st.user,
        argv=tuple(command),
        name=name,
        count=count or (0 if reservation else project.gpus or 1),
        nodes=nodes or project.nodes or 1,
        node=node,
        time_s=parse_duration(time_) if time_ else project.time_s,
        workdir=absolute_workdir(workdir),
        env=tuple(sorted({**dict(project.env), **dict(flagged_env)}.items())),
        visible_as="uuid" if uuids else "index",
        queue=queue or wait,
        cwd=str(here),
        venv=named[0] or (None if named[1] else project.venv),
        conda=named[1] or (None if named[0] else project.conda),
        **sync_request(sync, sync_dir, workdir, project, here, st.config.sync_max_bytes),
        after=tuple(after or ()),
        after_any=tuple(after_any or ()),
        reservation=reservation,
    )
    if many:
        from gpuclaim.cli.arrays import array_request, submit_and_report

        submit_and_report(st, array_request(req, array, sweep, max_running), as_json, quiet)
        return
    first = FirstRead(st) if follow else None
    job = _submit_and_report(st, req, wait or follow, as_json, quiet, first=first)
    if first is not None:
        raise typer.Exit(follow_log(st, job, 0, 0, quiet, first))


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
        job = submit_job(st.config, st.store, req, st.prober, st.ops)
    if first is not None:
        first.start(job)  # a job that started: its log is read while we say so
    if not quiet:
        _say_where_it_runs(job)
    completion.remember(st.config.path, add={"jobs": [completion.job_item(job.to_dict())]})
    if wait and job.state == "queued":
        job = _wait_until_started(st, job, quiet)
    if req.kind == "batch" and job.state in ("starting", "running") and not follow:
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
    if rank.state == "failed" and rank.exit_code is None:
        if f" on {rank.node}" in own and len(job.ranks) == 1:
            where = ""  # the reason names the node: 'workdir /x does not exist on node01'
        head = f"job {job.name} could not start{where}: {own or 'see its log'}"
    elif rank.state == "failed":
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
    from gpuclaim.engine.dispatch import dispatch_queue
    from gpuclaim.engine.job_records import find_job, queue_positions

    console = err()
    live = console.is_terminal and not quiet
    status_ctx = console.status("waiting in the queue") if live else None
    last_position = None
    try:
        if status_ctx is not None:
            status_ctx.__enter__()
        while True:
            dispatch_queue(st.config, st.store, st.prober, st.ops)
            job = find_job(st.store, job.user, job.id, active_only=False)
            if job.state != "queued":
                return job
            position = queue_positions(st.store).get(job.id)
            if position != last_position:
                text = f"{job.name}: waiting in the queue, position {position}"
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
    if job.state == "queued" and job.after:
        names = ", ".join(d.name for d in job.after)
        console.print(f"Queued {job.name}: it starts after {names} (gpuclaim jobs).")
        return
    if job.state == "queued":
        console.print(f"Queued {job.name}: it starts when its GPUs are free (gpuclaim jobs).")
        return
    where = "; ".join(f"{r.node} GPU {','.join(map(str, r.gpus))}" for r in job.ranks)
    if job.state == "succeeded":  # it was done within its first moment
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
) -> None:
    """List jobs: running and queued ones of everyone, and your recent ones."""
    from gpuclaim.cli.render import jobs_table
    from gpuclaim.core.states import ACTIVE_JOB_STATES
    from gpuclaim.engine.job_records import load_jobs, observed_state, queue_positions

    st = state(ctx, looking=True)
    st.dispatch_quietly()
    store = st.store
    snap = store.snapshot()
    positions = queue_positions(store)
    day_ago = snap.now - 86400
    rows = []
    for job in load_jobs(store, archived=show_all):
        visible = (
            show_all
            or job.state in ACTIVE_JOB_STATES
            or (job.user == st.user and (job.ended or job.submitted) >= day_ago)
        )
        if not visible:
            continue
        d = job.to_dict()
        d["state"] = observed_state(job, snap.claims)
        d["queue_position"] = positions.get(job.id)
        rows.append(d)
    completion.remember(
        st.config.path,
        # the running and queued ones, and the newest others: enough to complete a name
        replace={"jobs": [completion.job_item(d) for d in _worth_completing(rows)]},
        add={"users": [(str(d["user"]), "") for d in rows]},
    )
    if as_json:
        print_json(rows)
    else:
        from gpuclaim.cli.arrays import grouped_rows

        out().print(jobs_table(rows if tasks else grouped_rows(rows), snap.now))


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
    if job.state not in ("running", "starting"):
        raise GpuclaimError(f"job {job.name} is {job.state}; nothing to attach to")
    if rank >= len(job.ranks):
        ranks = f"{len(job.ranks)} rank" + ("s" if len(job.ranks) != 1 else "")
        raise UsageError(f"job {job.name} has {ranks}: --rank 0 to {len(job.ranks) - 1}")
    argv = attach_command(st.config, job.ranks[rank].node, job.session)
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


def _non_empty(value: Optional[str], flag: str) -> Optional[str]:
    if value is not None and not value.strip():
        raise UsageError(f"{flag} wants a name or a path, not an empty string")
    return value.strip() if value else None


def _parse_env(items: list[str]) -> tuple[tuple[str, str], ...]:
    result = []
    for item in items:
        key, sep, value = item.partition("=")
        if (
            not sep
            or not key
            or not (key[0].isalpha() or key[0] == "_")
            or not all(ch.isalnum() or ch == "_" for ch in key)
        ):
            raise UsageError(f"--env wants NAME=VALUE with a valid variable name, got {item!r}")
        result.append((key, value))
    return tuple(result)


def _exec_outside_tmux(argv: list[str]) -> None:
    """Become the attaching client; from inside tmux, tmux refuses to nest unless TMUX is unset."""
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    os.execvpe(argv[0], argv, env)
