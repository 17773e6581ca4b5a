"""The board as JSON for its web page (``board --web``): the same rows, words and states as
the terminal board (``board/cells.py`` over ``board/data.py``), as plain text."""

from __future__ import annotations

from typing import Any

from gpuclaim.board.cells import RowContext, gpu_cells, summary_text
from gpuclaim.board.data import BoardData, Filters, visible_rows
from gpuclaim.core.model import iso

COLUMNS = ("gpu", "model", "memory", "util", "state", "holder", "held", "left", "job", "note")


def board_payload(
    data: BoardData, me: str, cluster: str, refresh_s: float, filters: Filters
) -> dict[str, Any]:
    """Everything the page shows: the summary line, each node's GPUs, the services."""
    ctx = RowContext(data, me, data.read_at, refresh_s, "wide")
    nodes: dict[str, dict[str, Any]] = {}
    for name in data.node_names:
        if filters.nodes and name not in filters.nodes:
            continue
        inv = data.view.inventories.get(name)
        nodes[name] = {
            "name": name,
            "up": inv is not None and inv.reachable and not inv.error,
            "error": inv.error if inv is not None else "waiting for its first answer",
            "gpus": [],
        }
    rows = visible_rows(data, filters)
    for row in rows:
        if row.index is None or row.node not in nodes:
            continue
        cells = gpu_cells(row, ctx, 1, 2)  # not a group's first row: no node cell
        shown: dict[str, Any] = {key: cells[key].plain if key in cells else "" for key in COLUMNS}
        g = row.gpu
        shown.update(
            state=str(row.state),
            memory=_memory(g.memory_used_mib, g.memory_total_mib) if g is not None else "",
            util="" if g is None or g.utilization_pct is None else f"{g.utilization_pct}%",
            mine=(row.claim is not None and row.claim.user == me)
            or any(c.user == me for c in row.shares),
        )
        nodes[row.node]["gpus"].append(shown)
    return {
        "cluster": cluster,
        "summary": summary_text(data, filters).plain,
        "taken_at": iso(data.now),
        "refresh_s": refresh_s,
        "nodes": list(nodes.values()),
        "services": [s.to_dict(data.now) for s in data.services.values()],
    }


def _memory(used: Any, total: Any) -> str:
    if not total:
        return ""
    return f"{(used or 0) / 1024:.0f}/{total / 1024:.0f} GiB"
