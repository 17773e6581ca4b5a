"""The board's widgets: the header line, the GPU table, the detail bar and the log panel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from rich.text import Text
from textual.widgets import DataTable, Log, Static

from gpuclaim.board.cells import (
    Column,
    display_state,
    glyph_of,
    job_text,
    reason_style,
    short_model,
    shown_note,
    time_left,
)
from gpuclaim.board.data import BoardData
from gpuclaim.board.service_cells import service_detail
from gpuclaim.core.durations import format_duration
from gpuclaim.core.states import GpuState, style_of_face
from gpuclaim.engine.cluster import GpuRow

CellSig = tuple[str, str, tuple[object, ...]]


class BoardHeader(Static):
    """One line: the cluster, free/total GPUs, the queue, and how fresh the data is."""

    DEFAULT_CSS = """
    BoardHeader { dock: top; height: 1; background: $panel; padding: 0 1; }
    """

    _parts: Optional[tuple[str, Sequence[Text], str, Text]] = None

    def show(self, cluster: str, summaries: Sequence[Text], me: str, freshness: Text) -> None:
        self._parts = (cluster, summaries, me, freshness)
        self.refresh()

    def render(self) -> Text:
        # Fitted when drawn, to the width it is drawn at: a width read when shown could be
        # the one before the first layout or a resize (the picture then depended on timing).
        if self._parts is None:
            return Text("")
        return self._fit(*self._parts)

    def _fit(self, cluster: str, summaries: Sequence[Text], me: str, freshness: Text) -> Text:
        """The most that fits: the long summary, the user and freshness; else shorter."""
        width = self.size.width - 2
        rights = [Text.assemble((me, "bold cyan"), "  ", freshness), freshness]
        choices = [(s, r) for r in rights for s in summaries]
        for summary, right in choices:
            left = Text.assemble((f"{cluster} ", "bold"), summary)
            if left.cell_len + 1 + right.cell_len <= width:
                break
        room = max(0, width - right.cell_len - 1)
        if left.cell_len > room:
            left.truncate(room, overflow="ellipsis")
        gap = max(1, width - left.cell_len - right.cell_len)
        return Text.assemble(left, " " * gap, right)


class GpuTable(DataTable[Text]):
    """The grid of GPUs (or of nodes, compact). Refreshes change only the cells that
    changed, so an idle board costs little even with hundreds of GPUs."""

    DEFAULT_CSS = """
    GpuTable { height: 1fr; scrollbar-size-vertical: 1; }
    GpuTable > .datatable--header { text-style: bold; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)  # type: ignore[arg-type]
        self._columns: list[Column] = []
        self._keys: list[str] = []
        self._cells: dict[str, list[Text]] = {}

    @property
    def row_keys(self) -> list[str]:
        return list(self._keys)

    @property
    def selected_key(self) -> Optional[str]:
        if not self._keys or not 0 <= self.cursor_row < len(self._keys):
            return None
        return self._keys[self.cursor_row]

    def show(self, columns: Sequence[Column], rows: Sequence[tuple[str, list[Text]]]) -> None:
        """Show these rows: cell updates when only values changed, else a rebuild that
        keeps the cursor on the same GPU (or node)."""
        keys = [key for key, _ in rows]
        if list(columns) == self._columns and keys == self._keys:
            for key, cells in rows:
                old = self._cells.get(key)
                if cells is old:  # the memo's very list: nothing changed
                    continue
                for i, (cell, col) in enumerate(zip(cells, columns)):
                    if old is None or i >= len(old) or _sig(old[i]) != _sig(cell):
                        self.update_cell(key, col.key, _fit(cell, col))
                self._cells[key] = cells
            return
        selected = self.selected_key
        if list(columns) != self._columns:
            self.clear(columns=True)
            for col in columns:
                self.add_column(_fit(Text(col.label), col), width=col.width, key=col.key)
        else:
            self.clear()
        for key, cells in rows:
            self.add_row(*(_fit(c, col) for c, col in zip(cells, columns)), key=key)
        self._columns, self._keys = list(columns), keys
        self._cells = dict(rows)
        if selected in keys:
            self.move_cursor(row=keys.index(selected), animate=False)


def _fit(cell: Text, col: Column) -> Text:
    cell = cell.copy()
    cell.no_wrap = True
    cell.overflow = "ellipsis"
    if col.right and cell.cell_len < col.width:
        cell.pad_left(col.width - cell.cell_len)  # DataTable ignores Text.justify
    return cell


def _sig(cell: Text) -> CellSig:
    # rich's Text equality ignores the base style: compare it too, or colour changes are lost
    return (cell.plain, str(cell.style), tuple(cell.spans))


class DetailBar(Static):
    """Everything about the selected GPU that the table has no room for."""

    DEFAULT_CSS = """
    DetailBar { height: auto; max-height: 5; padding: 0 1; background: $boost;
                border-top: hkey $primary 40%; }
    """

    def show_row(self, row: Optional[GpuRow], data: Optional[BoardData], me: str) -> None:
        if row is None or data is None:
            self.update(Text("no GPU selected", style="dim"))
            return
        lines = detail_lines(row, data, me)
        width = max(10, self.size.width - 2)
        for line in lines:  # cut, never wrapped: the bar's height stays put
            if line.cell_len > width:
                line.truncate(width, overflow="ellipsis")
        self.update(Text("\n").join(lines))


def detail_lines(row: GpuRow, data: BoardData, me: str) -> list[Text]:
    """Up to four lines: the GPU, its claim and job, its processes, what you can do."""
    state = display_state(row, data)
    head = Text.assemble(
        (row.node, "bold"),
        f" GPU {row.label}" if row.index is not None else "",
        "  ",
        (f"{glyph_of(state)} {state}", style_of_face(state)),
    )
    g = row.gpu
    if g is not None:
        mem = "n/a"
        if g.memory_total_mib:
            mem = f"{(g.memory_used_mib or 0) / 1024:.1f}/{g.memory_total_mib / 1024:.0f} GiB"
        util = "n/a" if g.utilization_pct is None else f"{g.utilization_pct}%"
        model = short_model(g.name) + (f" MIG {g.mig_profile}" if g.mig_profile else "")
        head.append(f"  {model} · {mem} · util {util}", style="dim")
    inv = data.view.inventories.get(row.node)
    if inv is not None and inv.driver_version:
        head.append(f" · driver {inv.driver_version} ({inv.source})", style="dim")
    if row.uuid:
        head.append(f" · {row.uuid}", style="dim")
    lines = [head]
    claim = row.claim
    if claim is not None:
        mine = claim.user == me
        left = time_left(claim, data)
        line = Text.assemble(
            "held by ",
            (claim.user, "bold cyan" if mine else "bold"),
            " (you)" if mine else "",
            f" for {format_duration(max(0.0, data.now - claim.since))}",
            f", {format_duration(left)} left"
            if left > 0
            else (", job's time up" if claim.job else ", expired"),
            f" · claim {claim.id} (GPUs {','.join(claim.labels)})",
            " · preemptible: yields to any claim" if claim.preemptible else "",
        )
        if claim.job:
            line.append(" · job ")
            line.append_text(job_text(claim.job, data))
            job = data.jobs.get(claim.job)
            if job is not None:
                line.append(f" tmux {job.session}", style="dim")
        use = data.usage.get(claim.id)
        if use and use.get("idle") and not claim.keep_when_idle:
            line.append(f" · idle {format_duration(use.get('idle_for_s') or 0)}", "yellow")
        if use and use.get("mean_pct") is not None:
            line.append(f" · mean util {use['mean_pct']:.0f}%", style="dim")
        note = shown_note(claim, data)
        if note:
            line.append(f" · {note}", style="italic")
        lines.append(line)
    service = data.services.get(claim.job or "") if claim is not None else None
    if service is not None:  # its URL and health: more than its processes or its reason
        lines.append(service_detail(service, data.now))
    elif row.reason:
        lines.append(Text(row.reason, style=reason_style(row.state)))
    elif g is not None and g.processes:
        procs = ", ".join(
            f"{p.name.rsplit('/', 1)[-1]} ({p.pid}"
            + (f", {p.user}" if p.user else "")
            + (f", {p.used_memory_mib / 1024:.1f} GiB" if p.used_memory_mib is not None else "")
            + ")"
            for p in g.processes[:4]
        )
        lines.append(Text(f"processes: {procs}", style="dim"))
    lines.append(_hints(row, me, data))
    return lines


def _hints(row: GpuRow, me: str, data: BoardData) -> Text:
    claim = row.claim
    keys: list[tuple[str, str]] = []
    if row.state in (GpuState.FREE, GpuState.STALE) or claim is None:
        keys.append(("c", "claim"))
    if claim is not None and claim.user == me:
        keys.append(("r", "release"))
    job = data.jobs.get(claim.job) if claim is not None and claim.job else None
    if job is not None:
        if job.user == me:
            keys += [("k", "kill"), ("a", "attach")]
        keys.append(("l", "log"))
    text = Text()
    for key, what in keys:
        text.append(f" {key} ", style="reverse")
        text.append(f" {what}  ", style="dim")
    return text


class LogPanel(Log):
    """The tail of a job's log, following it while the panel is open."""

    DEFAULT_CSS = """
    LogPanel { display: none; height: 40%; border: round $primary; }
    LogPanel.-open { display: block; }
    """

    job_id: Optional[str] = None
    log_offset: Optional[int] = None  # where the next read starts; None: read the tail
