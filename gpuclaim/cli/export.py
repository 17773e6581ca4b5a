"""``export slurm`` and ``export sbatch``: the way on to SLURM."""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from gpuclaim.cli.common import err, out, state
from gpuclaim.core.errors import ExitCode, UsageError

app = typer.Typer(
    help="Write SLURM's configuration and job scripts, to move on to SLURM.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


class Accounting(str, enum.Enum):
    file = "file"
    slurmdbd = "slurmdbd"


SHARDS_HELP = "Each GPU is also K shards (gres/shard): what run --gpu-mem jobs ask for in SLURM"


@app.command("slurm", short_help="SLURM config files and MIGRATION.md for this cluster.")
def slurm(
    ctx: typer.Context,
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory to write the files to."),
    controller: Optional[str] = typer.Option(
        None, "--controller", help="Host for slurmctld and slurmdbd (default: the first node)."
    ),
    accounting: Accounting = typer.Option(
        Accounting.file,
        "--accounting",
        help="file: a job-completion log, no database (sacct -c); slurmdbd: full accounting "
        "and fair share, with slurmdbd.conf for a MariaDB.",
    ),
    shards: int = typer.Option(
        0, "--shards", min=0, max=1024, metavar="K", help=SHARDS_HELP + " (0: none)."
    ),
) -> None:
    """slurm.conf, gres.conf, cgroup.conf and MIGRATION.md for this cluster's nodes."""
    from gpuclaim.app import slurm as se

    st = state(ctx)
    nodes, skipped = se.gather_inventory(st.config, st.prober)
    if not nodes:
        reasons = "; ".join(f"{n}: {why}" for n, why in skipped.items())
        raise UsageError(f"no node answered, nothing written ({reasons})")
    opts = se.ExportOptions(
        cluster=st.config.cluster,
        controller=controller,
        default_time_s=st.config.limits.default_time_s,
        max_time_s=st.config.limits.max_time_s,
        skipped=tuple(skipped.items()),
        accounting=accounting.value,
        half_life_s=st.config.queue.half_life_s,
        max_age_s=st.config.queue.max_age_s,
        fairshare_weight=st.config.queue.fairshare_weight,
        age_weight=st.config.queue.age_weight,
        preempt_grace_s=st.config.queue.preempt_grace_s,
        kill_wait_s=st.config.limits.kill_grace_s,
        shards_per_gpu=shards,
    )
    snap = st.store.snapshot()
    reservations = se.render_reservations(snap.bookings, nodes, snap.now)
    files = {
        "slurm.conf": se.render_slurm_conf(nodes, opts),
        "gres.conf": se.render_gres_conf(nodes, shards),
        "cgroup.conf": se.render_cgroup_conf(),
        "MIGRATION.md": se.render_migration_md(
            nodes, opts, bookings=len([b for b in snap.bookings if b.end > snap.now])
        ),
    }
    if reservations:
        files["reservations.sh"] = reservations
    if accounting is Accounting.slurmdbd:
        files["slurmdbd.conf"] = se.render_slurmdbd_conf(nodes, opts)
    _write(out_dir, files, private=frozenset({"slurmdbd.conf"}))
    parts = ", ".join(p.name for p in se.plan_partitions(nodes))
    out().print(f"Wrote {', '.join(files)} to {out_dir} ({len(nodes)} nodes; partitions {parts}).")
    if accounting is Accounting.slurmdbd:
        out().print(
            f"slurmdbd.conf (mode 0600) needs the database password: {se.DB_PASSWORD_PLACEHOLDER}"
            " marks where."
        )
    out().print(f"Next: read {out_dir / 'MIGRATION.md'}.")
    if skipped:
        for name, why in skipped.items():
            err().print(f"warning: {name} is not in slurm.conf: {why}")
        raise typer.Exit(ExitCode.UNREACHABLE)


@app.command("sbatch", short_help="An sbatch script per past job: command, environment, GPUs.")
def sbatch(
    ctx: typer.Context,
    name: Optional[str] = typer.Argument(None, help="Job name or id (yours)."),
    history: Optional[int] = typer.Option(
        None, "--history", min=1, metavar="DAYS", help="Every job of the last DAYS days."
    ),
    all_users: bool = typer.Option(False, "--all-users", help="With --history: everyone's."),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Directory for NAME.sbatch files (default: print one)."
    ),
    shards: int = typer.Option(
        0,
        "--shards",
        min=0,
        max=1024,
        metavar="K",
        help="As export slurm --shards: --gpu-mem jobs ask for shards of K (0: a whole GPU).",
    ),
) -> None:
    """An sbatch script per job: its command, environment, directory, GPUs and time limit."""
    from gpuclaim.app.slurm import jobs_since
    from gpuclaim.engine.job_records import load_jobs

    st = state(ctx)
    if (name is None) == (history is None):
        raise UsageError("give a job NAME or --history DAYS")
    if history is not None and out_dir is None:
        raise UsageError("--history writes one file per job: add --out DIR")
    if name is not None:
        jobs = [_job_or_array(st, name)]
    else:
        since = st.store.now() - (history or 0) * 86400
        jobs = jobs_since(load_jobs(st.store, archived=True), since, None if all_users else st.user)
        if not jobs:
            out().print(f"No jobs {'' if all_users else 'of yours '}in the last {history} days.")
            return
    scripts, skipped = _scripts(st, jobs, all_users, shards)
    for job_name, why in skipped:
        err().print(f"skipped {job_name}: {why}")
    if out_dir is None:
        if not scripts:
            raise typer.Exit(ExitCode.ERROR)
        sys.stdout.write(next(iter(scripts.values()))[0])
        return
    order = [(file_name, job) for file_name, (_, job) in scripts.items()]
    files = {file_name: text for file_name, (text, _) in scripts.items()}
    if any(job.after for _, job in order):
        from gpuclaim.app.slurm import submit_all

        files["submit-all.sh"] = submit_all(order)
    _write(out_dir, files)
    out().print(f"Wrote {len(files)} file(s) to {out_dir}: {', '.join(files) or 'none'}.")
    if not scripts:
        raise typer.Exit(ExitCode.ERROR)


def _scripts(
    st: Any, jobs: list[Any], all_users: bool, shards: int = 0
) -> tuple[dict[str, tuple[str, Any]], list[tuple[str, str]]]:
    """{file name: (script, job)}, and (job, why) for the jobs that have no batch form. An
    array's tasks are one script (``--array``)."""
    from gpuclaim.app import slurm as se
    from gpuclaim.core.errors import GpuclaimError
    from gpuclaim.engine.array_records import array_tasks

    nodes, _ = se.gather_inventory(st.config, st.prober)
    scripts: dict[str, tuple[str, Any]] = {}
    skipped = []
    arrays_done: set[str] = set()
    for job in jobs:
        tasks: list[Any] = []
        if job.array is not None:
            if job.array.id in arrays_done:
                continue
            arrays_done.add(job.array.id)
            record = st.store.load_array(array_id=job.array.id)
            tasks = array_tasks(st.store, record) if record else [job]
        node = job.ranks[0].node if job.ranks else job.node
        gpu_type = se.job_gpu_type(nodes, job)
        partition = se.partition_for(nodes, node, gpu_type) if nodes else None
        try:
            grace = st.config.queue.preempt_grace_s
            text = se.render_sbatch(
                job, gpu_type, partition, tasks, preempt_grace_s=grace, shards_per_gpu=shards
            )
        except GpuclaimError as exc:
            skipped.append((job.name, exc.message))
            continue
        name = job.array.name if job.array else job.name
        stem = f"{job.user}-{name}" if all_users else name
        scripts[f"{stem}.sbatch"] = (text, job)
    return scripts, skipped


def _job_or_array(st: Any, name: str) -> Any:
    """A job of the user's by name or id, or an array's first task (the array's script)."""
    from gpuclaim.core.errors import GpuclaimError
    from gpuclaim.engine.array_records import array_tasks
    from gpuclaim.engine.arrays import find_array
    from gpuclaim.engine.job_records import find_job

    try:
        return find_job(st.store, st.user, name, active_only=False)
    except GpuclaimError:
        record = find_array(st.store, st.user, name, active_only=False)
        tasks = array_tasks(st.store, record) if record else []
        if not tasks:
            raise
        return tasks[0]


def _write(out_dir: Path, files: dict[str, str], private: frozenset[str] = frozenset()) -> None:
    """Each file into ``out_dir``; the ``private`` ones (a password goes there) readable by
    their owner only, from the moment they exist."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for file_name, text in files.items():
        path = out_dir / file_name
        if file_name not in private:
            path.write_text(text, encoding="utf-8")
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)  # an older copy may have been readable
            f.write(text)
