"""The board app: ``make_app(services)`` is used by ``gpuclaim board`` and by the tests.

Nodes are probed in worker threads, one per node so a hung node never holds up the others,
over the prober's persistent SSH connections; the store is read in another worker. Workers
post small messages back, and the UI thread only renders: it never blocks on the network.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, Optional

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.events import Resize
from textual.pilot import Pilot
from textual.widgets import DataTable, Footer

from gpuclaim.board.cells import (
    CellMemo,
    RowContext,
    columns_for,
    layout_for,
    node_key,
    row_key,
    summary_text,
    table_rows,
)
from gpuclaim.board.commands import BoardCommands
from gpuclaim.board.data import BoardData, Filters, NodeSample, probe_node, read_board, visible_rows
from gpuclaim.board.dialogs import FilterDialog, HelpScreen
from gpuclaim.board.messages import BoardRead, NodeProbed, ReadFailed
from gpuclaim.board.services import BoardServices
from gpuclaim.board.widgets import BoardHeader, DetailBar, GpuTable, LogPanel
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.model import NodeInventory
from gpuclaim.engine.cluster import GpuRow

USAGE_EVERY_S = 30.0  # how often the board's look counts towards idle claims


class BoardApp(BoardCommands, App[int]):
    """Who holds which GPU, live. The keys that act on a GPU come from ``BoardCommands``."""

    TITLE = "gpuclaim board"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "claim", "Claim"),
        Binding("r", "release", "Release"),
        Binding("k", "kill", "Kill"),
        Binding("l", "log", "Log"),
        Binding("a", "attach", "Attach"),
        Binding("f", "filter", "Filter"),
        Binding("m", "mine", "Mine", show=False),
        Binding("v", "compact", "Compact"),
        Binding("ctrl+r", "refresh", "Refresh", show=False),
        Binding("escape", "clear", "Clear", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, services: BoardServices) -> None:
        super().__init__()
        self.services = services
        options = services.options
        self.filters = Filters(options.users, options.nodes)
        self.compact = options.compact
        self.data: Optional[BoardData] = None
        self.reads = 0  # completed store reads: tests wait for "the next refresh" with it
        self.read_error: Optional[str] = None
        self._samples: dict[str, NodeSample] = {}
        self._probing: set[str] = set()
        self._round: set[str] = set()
        self._reading = False
        self._read_again = False
        self._rows: dict[str, list[GpuRow]] = {}
        self._memo = CellMemo()
        self._folded_at: Optional[float] = None

    # -- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        # Kept as attributes: app.query_one() searches the top screen, a dialog while one is up.
        self.header = BoardHeader(id="header")
        self.table = GpuTable(id="table")
        self.log_panel = LogPanel(id="log", max_lines=5000)
        self.detail = DetailBar(id="detail")
        yield self.header
        yield self.table
        yield self.log_panel
        yield self.detail
        yield Footer(compact=True)

    def on_mount(self) -> None:
        # Made here, inside the app's event loop (an Event binds to a loop on Python 3.9).
        self.loaded = asyncio.Event()  # set once every node has answered once
        self.table.focus()
        self._render()
        self._tick()
        self.set_interval(self.services.options.refresh_s, self._tick)

    def on_resize(self, event: Resize) -> None:
        self._render()

    # -- refresh loop -------------------------------------------------------------------------
    def _tick(self) -> None:
        """Probe every node whose last probe has answered; then read the store."""
        idle = [n.name for n in self.services.config.nodes if n.name not in self._probing]
        self._round = set(idle)
        for name in idle:
            self._probing.add(name)
            self.run_worker(
                lambda name=name: self._probe(name),
                name=f"probe {name}",
                group=f"probe-{name}",
                thread=True,
                exclusive=True,
                exit_on_error=False,
            )
        if idle:
            # Slow nodes must not hold the others back: read anyway after a moment.
            self.set_timer(min(1.0, self.services.options.refresh_s / 2), self._round_overdue)
        else:
            self._request_read()
        self._show_header()
        self._follow_log()

    def _probe(self, name: str) -> None:
        previous = self._samples.get(name)
        try:
            sample = probe_node(self.services, name, previous)
        except Exception as exc:  # a probe must never take the board down
            inventory = NodeInventory(node=name, reachable=False, error=f"probe failed: {exc}")
            last_ok = previous.last_ok if previous else None
            sample = NodeSample(inventory, self.services.clock(), 0.0, last_ok)
        self.post_message(NodeProbed(name, sample))

    def on_node_probed(self, message: NodeProbed) -> None:
        self._samples[message.node] = message.sample
        self._probing.discard(message.node)
        if message.node in self._round:
            self._round.discard(message.node)
            if not self._round:
                self._request_read()

    def _round_overdue(self) -> None:
        if self._round:
            self._request_read()

    def _request_read(self) -> None:
        if self._reading:
            self._read_again = True
            return
        self._reading = True
        now = self.services.clock()
        # Idle accounting writes to the storage: every refresh of every open board would be
        # too often, once in a while is plenty (a sample stands for up to five minutes).
        fold = self._folded_at is None or now - self._folded_at >= USAGE_EVERY_S
        if fold and self._samples:
            self._folded_at = now
        self._read(dict(self._samples), fold)

    @work(thread=True, exclusive=True, group="read", exit_on_error=False)
    def _read(self, samples: dict[str, NodeSample], fold: bool) -> None:
        try:
            self.post_message(BoardRead(read_board(self.services, samples, fold)))
        except GpuclaimError as exc:
            self.post_message(ReadFailed(str(exc)))
        except Exception as exc:  # shown in the header, never a crash
            self.post_message(ReadFailed(f"{type(exc).__name__}: {exc}"))

    def on_board_read(self, message: BoardRead) -> None:
        self.data = message.data
        self.reads += 1
        self.read_error = None
        self._read_done()
        self._render()
        if not message.data.pending:
            self.loaded.set()

    def on_read_failed(self, message: ReadFailed) -> None:
        self.read_error = message.error
        self._read_done()
        self._show_header()

    def _read_done(self) -> None:
        self._reading = False
        if self._read_again:
            self._read_again = False
            self._request_read()

    # -- rendering ----------------------------------------------------------------------------
    def _render(self) -> None:
        table = self.table
        data = self.data
        if data is None:
            self._show_header()
            return
        width = self.size.width
        rows = visible_rows(data, self.filters)
        columns = columns_for(width, rows, self.compact, data.node_names)
        ctx = RowContext(
            data,
            self.services.user,
            self.services.clock(),
            self.services.options.refresh_s,
            layout_for(width),
        )
        self._rows = {}
        for row in rows:
            key = node_key(row.node) if self.compact else row_key(row)
            self._rows.setdefault(key, []).append(row)
        table.show(columns, table_rows(rows, ctx, columns, self.compact, self._memo))
        self._show_header()
        self._show_detail()

    def _show_header(self) -> None:
        header = self.header
        config = self.services.config
        if self.data is None:
            summaries = [Text(f"probing {len(config.nodes)} node(s)…", style="dim")]
        else:
            summaries = [summary_text(self.data, self.filters, short) for short in (False, True)]
        header.show(config.cluster, summaries, self.services.user, self._freshness())

    def _freshness(self) -> Text:
        if self.read_error:
            error = self.read_error if len(self.read_error) < 60 else self.read_error[:59] + "…"
            return Text(f"⚠ {error}", style="bold red")
        if self.data is None:
            return Text("connecting…", style="dim")
        refresh = self.services.options.refresh_s
        age = self.services.clock() - self.data.read_at
        if age >= max(3 * refresh, 5.0):
            return Text(f"⚠ data {format_duration(age)} old", style="bold yellow")
        return Text("● live", style="green")

    def _show_detail(self) -> None:
        rows = self._selected_rows()
        self.detail.show_row(rows[0] if rows else None, self.data, self.services.user)

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self) -> None:
        self._show_detail()

    def _selected_rows(self) -> list[GpuRow]:
        key = self.table.selected_key
        return self.rows_for(key) if key else []

    def rows_for(self, key: str) -> list[GpuRow]:
        """The GPU rows behind a table row (a node's rows in compact mode)."""
        return list(self._rows.get(key, []))

    # -- view keys ----------------------------------------------------------------------------
    def action_refresh(self) -> None:
        self._tick()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_compact(self) -> None:
        self.compact = not self.compact
        self._render()

    def action_mine(self) -> None:
        me = (self.services.user,)
        users = () if self.filters.users == me else me
        self.filters = Filters(users, self.filters.nodes)
        self._render()

    def action_filter(self) -> None:
        current = " ".join([*self.filters.users, *(f"node:{n}" for n in self.filters.nodes)])

        def apply(text: Optional[str]) -> None:
            if text is not None:
                self.filters = Filters.parse(text)
                self._render()

        self.push_screen(FilterDialog(current), apply)

    def action_clear(self) -> None:
        log = self.log_panel
        if log.has_class("-open"):
            log.remove_class("-open")
            log.job_id = None
        elif self.filters.active:
            self.filters = Filters()
            self._render()


def make_app(services: BoardServices) -> BoardApp:
    """The board for these services; the CLI runs it, the tests drive it with Pilot."""
    return BoardApp(services)


def export_svg(services: BoardServices, size: tuple[int, int], title: str = "") -> str:
    """Run the board headless until every node answered, and return its screenshot."""
    app = make_app(services)
    shots: list[str] = []

    async def shoot(pilot: Pilot[object]) -> None:
        # Every probe answers within the fan-out deadline, unreachable or not.
        deadline = services.config.limits.deadline_s + 30
        try:
            await asyncio.wait_for(app.loaded.wait(), deadline)
        except asyncio.TimeoutError:
            pass  # show what there is: nodes still to answer say so
        await pilot.pause()
        shots.append(app.export_screenshot(title=title or app.title))
        app.exit(0)

    app.run(headless=True, size=size, auto_pilot=shoot)
    if not shots:
        raise GpuclaimError("the board did not produce a screenshot")
    return shots[0]
