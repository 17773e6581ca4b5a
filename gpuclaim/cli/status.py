"""``gpuclaim status`` (alias ``ls``): every GPU, its state and its holder."""

from __future__ import annotations

from typing import Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import state
from gpuclaim.cli.status_show import show_status


def status(
    ctx: typer.Context,
    node: Optional[list[str]] = typer.Option(
        None,
        "--node",
        help="Only this node, or a range like node[01-02] (repeatable).",
        autocompletion=completion.complete_nodes,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table."),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="Print nothing but errors: a look for its side effects (a cron line that brings "
        "back the services of a rebooted node, starts queued jobs, applies the idle policy).",
    ),
) -> None:
    """Show every GPU: free, claimed, busy-unclaimed, stale or unreachable."""
    code = show_status(state(ctx, looking=True), node, as_json, quiet)
    if code:
        raise typer.Exit(code)
