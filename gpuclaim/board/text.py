"""``gpuclaim board --once``: the board as plain text, for scripts and READMEs."""

from __future__ import annotations

from typing import Optional

from rich.text import Text

from gpuclaim.board.cells import (
    PADDING,
    Column,
    RowContext,
    columns_for,
    layout_for,
    summary_text,
    table_rows,
)
from gpuclaim.board.data import BoardData, Filters, visible_rows
from gpuclaim.core.states import GpuState


def render_text(
    data: BoardData,
    me: str,
    cluster: str = "",
    width: int = 120,
    compact: bool = False,
    filters: Optional[Filters] = None,
) -> str:
    """The board as lines of plain text, ``width`` columns wide, no colour, no I/O."""
    filters = filters or Filters()
    rows = visible_rows(data, filters)
    columns = columns_for(width, rows, compact, data.node_names)
    ctx = RowContext(data, me, data.read_at, 0.0, layout_for(width))
    title = f"{cluster}: " if cluster else ""
    lines = [title + summary_text(data, filters).plain]
    lines.append(_line([Text(c.label, style="bold") for c in columns], columns))
    for _key, cells in table_rows(rows, ctx, columns, compact):
        lines.append(_line(cells, columns))
    for node in data.view.unreachable:
        error = data.view.inventories[node].error or GpuState.UNREACHABLE.value
        lines.append(f"{node}: {error}")
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _line(cells: list[Text], columns: list[Column]) -> str:
    parts = []
    for cell, col in zip(cells, columns):
        plain = cell.plain
        if len(plain) > col.width:
            plain = plain[: max(0, col.width - 1)] + "…"
        parts.append(plain.rjust(col.width) if col.right else plain.ljust(col.width))
    pad = " " * PADDING
    return "".join(f"{pad}{p}{pad}" for p in parts)[PADDING:]
