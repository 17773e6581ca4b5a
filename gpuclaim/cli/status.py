"""``gpuclaim status`` (alias ``ls``): every GPU, its state and its holder."""

from __future__ import annotations

from typing import Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import out, print_json, state, waiting
from gpuclaim.core.errors import ExitCode


def status(
    ctx: typer.Context,
    node: Optional[list[str]] = typer.Option(
        None,
        "--node",
        help="Only this node (repeatable).",
        autocompletion=completion.complete_nodes,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table."),
) -> None:
    """Show every GPU: free, claimed, busy-unclaimed, stale or unreachable."""
    from gpuclaim.core.usage import usage_view
    from gpuclaim.engine.cluster import build_view
    from gpuclaim.engine.observe import follow_up_look

    st = state(ctx, looking=True)
    st.dispatch_quietly()
    cfg = st.config
    nodes = [cfg.node(n) for n in node] if node else None
    with waiting(f"asking {len(nodes or cfg.nodes)} node(s)"):
        view = build_view(cfg, st.store, nodes, prober=st.prober)
    if not node:  # the whole picture: what completion offers next time
        completion.remember_view(cfg.path, view)
    summaries, refusal = follow_up_look(cfg, st.store, view)
    if refusal:
        st.refused(refusal)
    usage = {
        cid: usage_view(summary, view.snapshot.now, cfg.idle.window_s)
        for cid, summary in summaries.items()
    }
    if as_json:
        rows = []
        for r in view.rows:
            d = r.to_dict()
            if d["claim"] is not None:
                d["claim"]["usage"] = usage.get(r.claim.id) if r.claim else None
                d["claim"]["idle"] = bool(d["claim"]["usage"] and d["claim"]["usage"]["idle"])
            rows.append(d)
        print_json(rows)
    else:
        from gpuclaim.cli.render import status_summary, status_table  # rich's tables: 60 ms

        console = out()
        console.print(f"[bold]{cfg.cluster}[/bold]: {status_summary(view)}")
        console.print(status_table(view, view.snapshot.now, usage))
        for name in view.unreachable:
            error = str(view.inventories[name].error)
            said = error if error.startswith(f"{name}:") else f"{name}: {error}"
            console.print(said, style="red", markup=False)
        with st.side_work():
            _advise_slurm_once(view, st.store, console)
    if view.unreachable:
        raise typer.Exit(ExitCode.UNREACHABLE)


def _advise_slurm_once(view: Any, store: Any, console: Any) -> None:
    """Say once (ever, for the whole team) when SLURM would now pay for itself."""
    from gpuclaim.app.slurm import slurm_advice

    gpus = sum(1 for r in view.rows if r.gpu is not None)
    users = len({r.claim.user for r in view.rows if r.claim is not None})
    advice = slurm_advice(gpus=gpus, users=users)
    if advice and store.mark_notices(scope="advice", keys=["slurm"]):
        console.print(advice)
