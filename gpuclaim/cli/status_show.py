"""What ``gpuclaim status`` does and prints, without typer: the typer command
(``cli.status``) and the typer-free start of ``entry.fast`` both call ``show_status``."""

from __future__ import annotations

from typing import Any, Optional

from gpuclaim.cli import completion
from gpuclaim.cli.app_state import AppState
from gpuclaim.cli.console import err, out, print_json, waiting
from gpuclaim.cli.revival_lines import say_revival
from gpuclaim.core.errors import ExitCode


def show_status(st: AppState, node: Optional[list[str]], as_json: bool, quiet: bool) -> int:
    """Look at the nodes (all, or ``node``), act on what the look found (services to start
    again, the idle policy, the queue), print the rows; the exit code (unreachable nodes)."""
    from gpuclaim.app.hostlists import node_names
    from gpuclaim.core.usage import usage_view
    from gpuclaim.engine.cluster import build_view, shown_max_age
    from gpuclaim.engine.observe import follow_up_look
    from gpuclaim.engine.services import services_down

    st.dispatch_quietly()
    cfg = st.config
    nodes = [cfg.node(n) for n in node_names(node)] if node else None
    with waiting(f"asking {len(nodes or cfg.nodes)} node(s)"):
        view = build_view(cfg, st.store, nodes, prober=st.prober, max_age_s=shown_max_age(cfg))
    if not node:  # the whole picture: what completion offers next time
        completion.remember_view(cfg.path, view)
    ops = st.ops if services_down(view) else None  # NodeOps (engine.launch): only to revive
    look = follow_up_look(cfg, st.store, view, ops)
    st.revived = True  # this look did it (or found none down)
    if look.refusal:
        st.refused(look.refusal)
    say_revival(look.revival, quiet)
    usage = {
        cid: usage_view(summary, view.snapshot.now, cfg.idle.window_s)
        for cid, summary in look.summaries.items()
    }
    services = services_held(st.store, view)
    if quiet:
        for name in view.unreachable:
            err().print(_unreachable_line(view, name), markup=False)
    elif as_json:
        rows = []
        for r in view.rows:
            d = r.to_dict()
            if d["claim"] is not None:
                d["claim"]["usage"] = usage.get(r.claim.id) if r.claim else None
                idle = bool(d["claim"]["usage"] and d["claim"]["usage"]["idle"])
                d["claim"]["idle"] = idle and not (r.claim and r.claim.keep_when_idle)
            service = services.get(r.claim.id) if r.claim else None
            d["service"] = service.to_dict(view.snapshot.now) if service else None
            rows.append(d)
        print_json(rows)
    else:
        from gpuclaim.cli.render import services_table, status_summary, status_table

        console = out()  # rich's tables: 60 ms, not spent for --json or -q
        console.print(f"[bold]{cfg.cluster}[/bold]: {status_summary(view)}")
        console.print(status_table(view, view.snapshot.now, usage, services))
        if services:
            console.print()
            console.print(services_table(services.values(), view.snapshot.now))
        for name in view.unreachable:
            console.print(_unreachable_line(view, name), style="red", markup=False)
        with st.side_work():
            _advise_slurm_once(view, st.store, console)
    return ExitCode.UNREACHABLE if view.unreachable else ExitCode.OK


def services_held(store: Any, view: Any) -> dict[str, Any]:
    """The services holding GPUs in the view, by claim id (their records read only then)."""
    found = {}
    for status in view.snapshot.claims.values():
        if status.claim.service and status.claim.job:
            from gpuclaim.engine.service_view import service_row  # here: only with services

            job = store.load_job(job_id=status.claim.job)
            row = service_row(job, view.snapshot.claims) if job is not None else None
            if row is not None:
                found[status.claim.id] = row
    return found


def _unreachable_line(view: Any, name: str) -> str:
    error = str(view.inventories[name].error)
    return error if error.startswith(f"{name}:") else f"{name}: {error}"


def _advise_slurm_once(view: Any, store: Any, console: Any) -> None:
    """Say once (ever, for the whole team) when SLURM would now pay for itself."""
    from gpuclaim.app.slurm import slurm_advice

    gpus = sum(1 for r in view.rows if r.gpu is not None)
    users = len({r.claim.user for r in view.rows if r.claim is not None})
    advice = slurm_advice(gpus=gpus, users=users)
    if advice and store.mark_notices(scope="advice", keys=["slurm"]):
        console.print(advice)
