"""``gpuclaim status`` (alias ``ls``): every GPU, its state and its holder."""

from __future__ import annotations

from typing import Optional

import typer

from gpuclaim.cli.common import out, print_json, state
from gpuclaim.errors import ExitCode


def status(
    ctx: typer.Context,
    node: Optional[list[str]] = typer.Option(None, "--node", help="Only this node (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table."),
) -> None:
    """Show every GPU: free, claimed, busy-unclaimed, stale or unreachable."""
    from gpuclaim.cli.render import status_summary, status_table
    from gpuclaim.cluster import build_view

    st = state(ctx)
    st.dispatch_quietly()
    cfg = st.config
    nodes = [cfg.node(n) for n in node] if node else None
    view = build_view(cfg, st.store, nodes, prober=st.prober)
    if cfg.slack.webhook_url:
        from gpuclaim.notify import record_notices

        record_notices(view, st.store)
    if as_json:
        print_json([r.to_dict() for r in view.rows])
    else:
        console = out()
        console.print(f"[bold]{cfg.cluster}[/bold]: {status_summary(view)}")
        console.print(status_table(view, view.snapshot.now))
        for name in view.unreachable:
            console.print(f"[red]{name}: {view.inventories[name].error}[/red]")
    if view.unreachable:
        raise typer.Exit(ExitCode.UNREACHABLE)
