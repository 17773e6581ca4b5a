"""Files between here and the nodes: where ``run`` was typed (the default workdir), what
``run --sync`` copies, and ``pull``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import out, quiet_option, state, waiting
from gpuclaim.core.errors import GpuclaimError, UsageError


def absolute_workdir(workdir: Optional[str]) -> Optional[str]:
    """A relative --workdir means the directory ``run`` was typed in, here on the laptop, so
    the job gets it as an absolute path. ``~`` stays for the node to expand: its home, as in
    ssh."""
    if workdir is None or workdir.startswith("~") or Path(workdir).is_absolute():
        return workdir
    if not workdir:
        raise UsageError("--workdir wants a directory, e.g. --workdir . for this one")
    return os.path.normpath(typed_in() / workdir)


def typed_in() -> Path:
    """The directory the command was typed in, as the shell's ``$PWD`` spells it (symlinks
    kept, when that is this directory): the path a shared home has on the nodes too."""
    here = Path.cwd()
    pwd = os.environ.get("PWD")
    if pwd and Path(pwd).is_absolute():
        try:
            if Path(pwd).samefile(here):
                return Path(pwd)
        except OSError:
            pass
    return here


def sync_request(
    sync: Optional[bool],
    sync_dir: Optional[str],
    workdir: Optional[str],
    project: Any,
    here: Path,
    max_bytes: int,
) -> dict[str, Any]:
    """``RunRequest``'s sync fields: what ``--sync`` (this directory), ``--sync-dir DIR`` or
    the project file's ``sync = true`` (the project's directory, the job then running in the
    copy of the subdirectory ``run`` was typed in) copies. ``max_bytes``: the config's
    ``[run] sync_max``; a project file's ``sync_max`` wins for its own directory."""
    from gpuclaim.app.sync_plan import plan_sync

    own = project.sync_max or max_bytes
    if sync_dir is not None:
        if not sync_dir.strip():
            raise UsageError("--sync-dir wants a directory, e.g. --sync-dir src")
        return {"sync": plan_sync(Path(absolute_workdir(sync_dir) or sync_dir), max_bytes)}
    if sync:
        mine = project.root == here
        exclude = project.sync_exclude if mine else ()
        return {"sync": plan_sync(here, own if mine else max_bytes, exclude=exclude)}
    if sync is None and project.sync and workdir is None:
        inside = here.relative_to(project.root).as_posix() if here != project.root else ""
        plan = plan_sync(project.root, own, exclude=project.sync_exclude)
        return {"sync": plan, "sync_subdir": inside}
    return {}


def pull(
    ctx: typer.Context,
    name: str = typer.Argument(
        ..., metavar="NAME", help="Job name or id.", autocompletion=completion.complete_jobs
    ),
    paths: list[str] = typer.Argument(
        ..., metavar="PATH...", help="Files or directories, relative to the job's directory."
    ),
    rank: int = typer.Option(0, "--rank", min=0, help="Which node of a gang job."),
    as_json: bool = typer.Option(False, "--json", help="Print what was copied as JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Copy files or directories from a job's directory on its node into this one, keeping
    their relative paths (its --sync copy, or wherever it ran)."""
    from gpuclaim.engine.job_records import find_job

    st = state(ctx, looking=True)
    job = find_job(st.store, st.user, name)
    if rank >= len(job.ranks):
        raise GpuclaimError(f"job {job.name} has no rank {rank} ({job.state})")
    r = job.ranks[rank]
    directory = r.workdir or job.workdir or "~"
    for p in paths:
        if not p or p.startswith("/") or ".." in p.split("/"):
            raise UsageError(f"pull takes paths inside the job's directory, not {p!r}")
    node = st.config.node(r.node)
    source = st.ops.pull_source(node, directory, [p.rstrip("/") for p in paths])
    copier = st.ops.copier
    if copier is None:
        raise GpuclaimError("pull needs SSH or a local node to copy through")
    here = typed_in()
    with waiting(f"copying from {node.name}", quiet):
        copier.pull_tree(
            node,
            source["directory"],
            [p.rstrip("/") for p in paths],
            str(here),
            bool(source["rsync"]),
        )
    if not quiet:
        out().print(
            f"Pulled {', '.join(paths)} from {job.name} on {node.name} into {here}",
            markup=False,
            highlight=False,
        )
